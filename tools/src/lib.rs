//! RoCEmu's tools: what a user runs as a program, and the out-of-band protocols they speak.
//!
//! * [`demo`]: `rocemu demo`, every verb between two RNICs in one process, then RC over a lossy
//!   in-process cable.
//! * `perftest` (crate-private): perftest's benchmarks written once — bandwidth with CQ
//!   moderation, one-at-a-time and ping-pong latency, the `--verify` read-back, a server's SEND
//!   receiver, the report and perftest's table lines — over an `End`: the RNIC to post to and
//!   poll, and one turn of its datapath.
//! * [`perf`]: `rocemu perf` in process: two RNICs driven by one thread, A the engine's end
//!   (its datapath turn moves frames to B and back), B's receiver its peer's loop.
//! * [`remote`]: one end per process over a datapath (an [`remote::Endpoint`]) and perftest's end
//!   on it, `rocemu perf --dev`, facing perftest's `ib_*_bw` / `ib_*_lat` (its work on the RNIC
//!   is in `perf_end.rs`); [`pingpong`]: `rocemu pingpong`, facing `ibv_*_pingpong`.
//! * [`rping`]: librdmacm's `rping` on RoCEmu; [`rdmacm`]: the rdma_cm steps the tools share
//!   (resolve, connect, accept over the IB CM); [`perftest_cm`]: perftest's `-R`.
//! * [`oob`]: the TCP exchanges of `ibv_rc_pingpong` ([`oob::rc_pingpong`]) and perftest
//!   ([`oob::perftest`]), byte for byte.
//! * [`forge_cm`]: forged CM MADs for the hidden `rocemu forge-cm` (the hostile-peer test).
//!
//! Invariants: the tools drive the emulator only through its public API (verbs, the engine, the
//! CM) and change no RNIC behaviour; every message they put on a TCP connection or a QP is the
//! one the real tool sends (the formats are documented where they are built); a tool fails with a
//! message, never by waiting forever (every exchange has a deadline, and [`poll_wcs`] turns a CQ
//! overflow into an error). The CLI (`src/`) parses arguments and prints; network namespaces and
//! the `rdma_rxe` lab are `rocemu-testbed`'s.
#![forbid(unsafe_code)]

pub mod analyze;
pub mod demo;
pub mod forge_cm;
pub mod oob;
pub mod perf;
pub(crate) mod perf_end;
pub mod perf_shards;
pub(crate) mod perftest;
pub mod perftest_cm;
pub mod pingpong;
pub mod rdmacm;
pub mod remote;
pub mod rping;

/// `ibv_poll_cq` for the tools' wait loops: appends up to `max` completions to `out`, and fails
/// with "CQ overflow: ..." once the CQ is in error (it was full when a completion came: what the
/// loop waits for will never arrive), so that a tool ends with that message instead of waiting
/// forever.
pub fn poll_wcs(
    r: &mut rocemu_emulator::Rnic,
    cq: rocemu_emulator::rnic::CqId,
    max: usize,
    out: &mut Vec<rocemu_emulator::rnic::Wc>,
) -> Result<usize, String> {
    r.try_poll_cq(cq, max, out).map_err(|e| e.to_string())
}

/// What a failing tool prints after its error, so that its user learns why: each RNIC's
/// counters that point at a problem ([`Counters::errors`](rocemu_emulator::rnic::Counters::errors),
/// the names `rocemu stats` uses), one `name value` line each under `RNIC LABEL counters:`,
/// for every RNIC that has any; empty when none has. A wrong GID index at the peer, for
/// example, shows as `rx_drop_wrong_src` on the RNIC that dropped the packets.
pub fn failure_counters(rnics: &[(&str, &rocemu_emulator::rnic::Counters)]) -> String {
    let mut out = String::new();
    for (label, c) in rnics {
        let lines = c.error_lines("  ");
        if !lines.is_empty() {
            let sep = if label.is_empty() { "" } else { " " };
            out += &format!("RNIC{sep}{label} counters:\n{lines}");
        }
    }
    out
}

/// `e`, then on the next lines [`failure_counters`] of `rnics` (nothing more when they have
/// none): the message a failing tool ends with.
pub fn explain(
    e: impl std::fmt::Display,
    rnics: &[(&str, &rocemu_emulator::rnic::Counters)],
) -> String {
    let f = failure_counters(rnics);
    if f.is_empty() {
        e.to_string()
    } else {
        format!("{e}\n{}", f.trim_end())
    }
}

#[cfg(test)]
mod tests {
    /// A failure's message names the counters that moved, per RNIC, and only those: the
    /// traffic counters and an RNIC with nothing wrong stay out of it.
    #[test]
    fn a_failure_ends_with_the_counters_that_explain_it() {
        use rocemu_emulator::rnic::Counters;
        let a = Counters {
            sent_pkts: 40,
            local_ack_timeout_err: 6,
            retry_exceeded_err: 1,
            ..Default::default()
        };
        let b = Counters {
            rcvd_pkts: 0,
            rx_drop_wrong_src: 12,
            ..Default::default()
        };
        let quiet = Counters {
            sent_pkts: 3,
            rcvd_pkts: 3,
            ..Default::default()
        };
        assert_eq!(
            super::failure_counters(&[("A", &a), ("B", &b), ("C", &quiet)]),
            "RNIC A counters:\n  local_ack_timeout_err 6\n  retry_exceeded_err 1\n\
             RNIC B counters:\n  rx_drop_wrong_src 12\n"
        );
        assert_eq!(
            super::explain("RETRY_EXC_ERR", &[("", &b)]),
            "RETRY_EXC_ERR\nRNIC counters:\n  rx_drop_wrong_src 12"
        );
        assert_eq!(super::explain("x", &[("", &quiet)]), "x");
    }

    use rocemu_emulator::connect::ConnectOpts;
    use rocemu_emulator::inproc::{Impairments, Pair};
    use rocemu_emulator::rnic::*;

    /// A wait loop on a CQ too small for its completions ends with "CQ overflow: ...", where it
    /// used to wait forever.
    #[test]
    fn a_tool_waiting_on_an_overflowed_cq_ends_with_a_clear_error() {
        let mut p = Pair::new(4, Impairments::none());
        let pda = p.a.alloc_pd();
        let pdb = p.b.alloc_pd();
        let cqa = p.a.create_cq(4).unwrap();
        let cqb = p.b.create_cq(4).unwrap();
        let qa =
            p.a.create_qp(pda, QpInitAttr::new(QpType::Rc, cqa))
                .unwrap();
        let qb =
            p.b.create_qp(pdb, QpInitAttr::new(QpType::Rc, cqb))
                .unwrap();
        let ma = p.a.reg_mr(pda, 4096, Access::ALL).unwrap();
        let mb = p.b.reg_mr(pdb, 4096, Access::ALL).unwrap();
        p.connect(qa, qb, &ConnectOpts::default()).unwrap();
        for i in 0..10 {
            let sge = Sge {
                addr: ma.addr,
                length: 8,
                lkey: ma.lkey,
            };
            let op = WrOpcode::RdmaWrite {
                remote_addr: mb.addr,
                rkey: mb.rkey,
            };
            p.a.post_send(qa, SendWr::new(i, op, vec![sge])).unwrap();
        }
        // The tools' loop: drive, poll, until 10 completions or an error.
        let mut wcs = Vec::new();
        let r = (|| -> Result<(), String> {
            for _ in 0..10_000 {
                p.step();
                if let Some(t) = p.next_event() {
                    p.now = p.now.max(t);
                }
                super::poll_wcs(&mut p.a, cqa, 16, &mut wcs)?;
                if wcs.len() >= 10 {
                    return Ok(());
                }
            }
            Err("still waiting".into())
        })();
        let e = r.unwrap_err();
        assert!(e.starts_with("CQ overflow: CQ "), "{e}");
        assert_eq!(wcs.len(), 4);
    }
}
