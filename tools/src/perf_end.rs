//! The work of perftest's end on a datapath on its own RNIC: a run's resources and QPs
//! ([`perf_setup`]), their connection to the peer's ([`perf_connect`]), the runs on the perftest
//! engine with the [`Endpoint`] as its [`End`] (bandwidth: [`run_client`], a send-test server's
//! receives: [`serve_send`], latency: [`run_lat`]) and `--verify`. `remote.rs` drives these
//! through perftest's exchange.
//!
//! Invariants: a run's QPs are destroyed however it ends (by its caller, through
//! [`destroy_qps`]); a RoCEmu server's regions start with [`server_pattern`]'s bytes and are open
//! to every remote access, so that a verifying client can tell what the run did from the
//! region's address alone.
use crate::oob::PerftestDest;
use crate::perf::{measure_limit, Report};
use crate::perftest::{
    self, BwPlan, BwQp, End, PingOp, PingPong, ReadBack, Receiver, RunShape, RxQp, Transport,
};
use crate::remote::{gid_bytes, gid_ip, random_psn, verr, Endpoint, PerfOpts, RESOLVE};
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::pattern;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::{Psn, Qpn};
use std::time::{Duration, Instant};

/// Outstanding reads and atomics per QP that RoCEmu advertises (perftest's out_reads).
pub(crate) const OUT_READS: u16 = 16;
/// Receives a send-test server keeps posted per QP (perftest's rx depth).
pub(crate) const RX_DEPTH: usize = 512;

/// One QP's side of the test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerfQp {
    pub(crate) qpn: Qpn,
    pub(crate) psn: Psn,
    /// The QP's region in the MR: `mr.addr + off`.
    pub(crate) off: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct PerfSetup {
    pub(crate) cq: CqId,
    pub(crate) mr: MrInfo,
    pub(crate) qps: Vec<PerfQp>,
}

fn access_for(server: bool, lat: bool) -> Access {
    // A RoCEmu server opens its regions to every remote access so that a RoCEmu client's
    // --verify can read back what it did (perftest's own server grants only what its test needs).
    // In the latency tests both ends write into each other (ib_write_lat).
    if server || lat {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
    } else {
        Access::LOCAL_WRITE
    }
}

/// The bytes a RoCEmu server's region starts with: known to a verifying client from the
/// region's address alone.
fn server_pattern(vaddr: u64, n: usize) -> Vec<u8> {
    pattern(vaddr ^ 0x5eed, n)
}

pub(crate) fn perf_setup(r: &mut Rnic, o: &PerfOpts, server: bool) -> Result<PerfSetup, String> {
    let res = perf_resources(r, o, server)?;
    perf_qps(r, o, server, &res)
}

/// What a perf end keeps from one run to the next: the PD, the CQ and the MR (perftest makes
/// one of each per process).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PerfResources {
    pd: PdId,
    pub(crate) cq: CqId,
    mr: MrInfo,
}

pub(crate) fn perf_resources(
    r: &mut Rnic,
    o: &PerfOpts,
    server: bool,
) -> Result<PerfResources, String> {
    let pd = r.alloc_pd();
    let depth = if server { RX_DEPTH } else { o.tx_depth };
    let cq = r.create_cq((depth + 8) * o.qps).map_err(verr)?;
    let region = o.region();
    // Client: each QP's source / destination region, then a read-back area for --verify.
    // Latency: the region the peer writes into, then the one this end sends from.
    let len = region * o.qps * if server && !o.lat { 1 } else { 2 };
    let mr = r.reg_mr(pd, len, access_for(server, o.lat)).map_err(verr)?;
    Ok(PerfResources { pd, cq, mr })
}

/// One run's QPs on `res`, and the regions filled afresh.
pub(crate) fn perf_qps(
    r: &mut Rnic,
    o: &PerfOpts,
    server: bool,
    res: &PerfResources,
) -> Result<PerfSetup, String> {
    let PerfResources { pd, cq, mr } = *res;
    let region = o.region();
    let mut qps = Vec::with_capacity(o.qps);
    for i in 0..o.qps {
        let qpn = r
            .create_qp(
                pd,
                QpInitAttr {
                    qp_type: QpType::Rc,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap {
                        max_send_wr: o.tx_depth.max(8) as u32,
                        max_recv_wr: RX_DEPTH as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .map_err(verr);
        let qpn = match qpn {
            Ok(q) => q,
            Err(e) => {
                destroy_qps(r, &qps);
                return Err(e);
            }
        };
        qps.push(PerfQp {
            qpn,
            psn: random_psn(r),
            off: i * region,
        });
    }
    let bytes = r.mr_bytes_mut(mr.lkey).expect("just registered");
    for q in &qps {
        let v = mr.addr + q.off as u64;
        let fill = if o.lat {
            // ib_write_lat polls the last byte of its region for the peer's counter: zeros.
            vec![0u8; region]
        } else if server {
            server_pattern(v, region)
        } else {
            pattern(v, region)
        };
        bytes[q.off..q.off + region].copy_from_slice(&fill);
    }
    Ok(PerfSetup { cq, mr, qps })
}

/// The out_reads this end advertises: its own responder resources (`max_dest_rd_atomic`),
/// which the peer takes as its initiator depth (perftest: 1 in the write and send tests).
pub(crate) fn own_out_reads(ep: &Endpoint, o: &PerfOpts) -> u16 {
    match o.test {
        crate::perf::Test::Read | crate::perf::Test::Atomic { .. } => {
            let cap = ep.rnic.query_device().max_qp_rd_atom.min(u8::MAX as u32) as u16;
            o.out_reads.unwrap_or(OUT_READS).clamp(1, cap)
        }
        _ => 1,
    }
}

/// Destroys a run's QPs; a completion of theirs still in the CQ is drained by the next run.
pub(crate) fn destroy_qps(r: &mut Rnic, qps: &[PerfQp]) {
    for q in qps {
        let _ = r.destroy_qp(q.qpn);
    }
}

pub(crate) fn dests(ep: &Endpoint, o: &PerfOpts, s: &PerfSetup) -> Vec<PerftestDest> {
    let out_reads = own_out_reads(ep, o);
    s.qps
        .iter()
        .map(|q| PerftestDest {
            lid: 0,
            out_reads,
            qpn: q.qpn.value(),
            psn: q.psn.value(),
            rkey: s.mr.rkey,
            vaddr: s.mr.addr + q.off as u64,
            gid: gid_bytes(ep.rnic.ips()[0]),
            srqn: 0,
        })
        .collect()
}

pub(crate) fn perf_connect(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
) -> Result<(), String> {
    perf_connect_to(ep, o, s, rem, mtu, None)
}

/// [`perf_connect`]; with `peer_mac`, the peer's MAC as another shard of this device resolved
/// it (a later shard's ARP answers would reach shard 0, which answers for the device).
pub(crate) fn perf_connect_to(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
    peer_mac: Option<rocemu_wire::eth::Mac>,
) -> Result<(), String> {
    if rem.len() != s.qps.len() {
        return Err(format!(
            "the peer has {} QPs, this end {}: give both the same -q",
            rem.len(),
            s.qps.len()
        ));
    }
    let peer = gid_ip(&rem[0].gid, "the peer")?;
    match peer_mac {
        Some(m) => ep.rnic.set_neighbor(peer, m),
        None => {
            ep.engine.resolve(&mut ep.rnic, peer, RESOLVE)?;
        }
    }
    // As perftest: this end's responder resources are its own out_reads, the ones it
    // advertised; its reads in flight are bounded by the peer's (oob.rs). Taking the peer's for
    // both left a server facing a peer that advertises 1 with one responder resource, so a
    // retransmitted READ older than the latest found nothing to re-execute from.
    let own = own_out_reads(ep, o) as u8;
    let init_cap = ep
        .rnic
        .query_device()
        .max_qp_init_rd_atom
        .min(u8::MAX as u32) as u16;
    for (q, d) in s.qps.iter().zip(rem) {
        let c = ConnectOpts {
            mtu,
            timeout: o.qp_timeout,
            max_rd_atomic: d.out_reads.clamp(1, init_cap) as u8,
            max_dest_rd_atomic: own,
            ..Default::default()
        };
        bring_up(
            &mut ep.rnic,
            q.qpn,
            Qpn::new(d.qpn),
            peer,
            q.psn,
            Psn::new(d.psn),
            &c,
        )
        .map_err(|e| format!("modify QP {:#x}: {e}", q.qpn.value()))?;
    }
    Ok(())
}

pub(crate) fn post_server_recvs(
    r: &mut Rnic,
    o: &PerfOpts,
    s: &PerfSetup,
    qi: usize,
    n: usize,
) -> Result<(), String> {
    let q = s.qps[qi];
    let buf = Sge {
        addr: s.mr.addr + q.off as u64,
        length: o.size as u32,
        lkey: s.mr.lkey,
    };
    perftest::post_receives(r, qi, q.qpn, buf, n)
}

/// A send-test server: keeps receives posted (the [`RX_DEPTH`] posted before the run, then one
/// more per message until each QP has had its `iters`) until every QP got its `iters` messages.
pub(crate) fn serve_send(ep: &mut Endpoint, o: &PerfOpts, s: &PerfSetup) -> Result<u64, String> {
    let want = o.iters * o.qps as u64;
    let qps = s
        .qps
        .iter()
        .map(|q| RxQp {
            qpn: q.qpn,
            addr: s.mr.addr + q.off as u64,
            off: q.off,
            posted: RX_DEPTH as u64,
            done: 0,
        })
        .collect();
    let (len, ring) = (o.size as u32, RX_DEPTH as u64);
    let mut rx = Receiver::new(s.cq, s.mr.lkey, ring, Some(o.iters), len, 1, qps);
    let mut total = 0;
    let mut last = Instant::now();
    while total < want {
        let w = ep.progress();
        let n = rx.turn(&mut ep.rnic, 64, |wc, _, _, _| match wc.status {
            WcStatus::Success => Ok(()),
            st => Err(format!("receive completion {st:?}")),
        })?;
        if n == 0 {
            ep.idle(w);
            if last.elapsed() > Duration::from_secs(60) {
                return Err(format!("no message for 60 s after {total} of {want}"));
            }
            continue;
        }
        last = Instant::now();
        total += n as u64;
    }
    Ok(total)
}

/// The process's end of a run: its RNIC, turned by its engine; the peer is another process.
impl End for Endpoint {
    const PEAK_WINDOW: Duration = Duration::from_millis(100);
    const POLL_BATCH: usize = 64;
    const STOP_AT_FIRST_ERROR: bool = true;

    fn rnic(&mut self) -> &mut Rnic {
        &mut self.rnic
    }

    fn progress(&mut self) -> usize {
        self.engine.poll(&mut self.rnic)
    }

    fn idle(&mut self, work: usize) {
        self.engine.idle(work)
    }

    fn describe_error(&mut self, wc: &Wc) -> String {
        format!("{:?} on QP {:#x}", wc.status, wc.qp_num.value())
    }

    fn stalled(&mut self, completed: u64, total: u64) -> String {
        crate::explain(
            format!("no completion for 30 s after {completed} of {total}"),
            &[("", &self.rnic.counters())],
        )
    }
}

/// The client's bandwidth run, on the engine ([`perftest::bandwidth`]).
pub(crate) fn run_client(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
) -> Result<Report, String> {
    use crate::perf::Test;
    let c0 = ep.rnic.counters();
    let limit_gbps = measure_limit(o.size as u64 * o.iters * o.qps as u64, mtu.bytes());
    let len = match o.test {
        Test::Atomic { .. } => 8,
        _ => o.size as u32,
    };
    let mut qps: Vec<BwQp> = s
        .qps
        .iter()
        .zip(rem)
        .map(|(q, d)| {
            let local = Sge {
                addr: s.mr.addr + q.off as u64,
                length: len,
                lkey: s.mr.lkey,
            };
            BwQp::new(q.qpn, local, d.vaddr, d.rkey)
        })
        .collect();
    let plan = BwPlan {
        test: o.test,
        iters: o.iters,
        duration: o.duration,
        tx_depth: o.tx_depth,
        cq_mod: o.cq_mod,
        cq: s.cq,
        msg_bytes: o.size as u64,
        cas_chain: false,
    };
    let run = perftest::bandwidth(ep, &plan, &mut qps)?;
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: o.qps,
        mtu: mtu.bytes(),
        // A timed run did what it did.
        iters: match o.duration {
            Some(_) => run.messages,
            None => o.iters * o.qps as u64,
        },
        limit_gbps,
    };
    let t = Transport::since(&c0, &ep.rnic.counters());
    let mut r = perftest::bw_report(&shape, o.size as u64, run, t);
    r.counters = crate::failure_counters(&[("", &ep.rnic.counters())]);
    Ok(r)
}

/// [`run_client`], then [`verify`] when asked.
pub(crate) fn run_client_verified(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
) -> Result<Report, String> {
    let mut r = run_client(ep, o, s, rem, mtu)?;
    if o.verify {
        let (ok, detail) = verify(ep, o, s, rem)?;
        r.verified = Some(ok);
        r.verify_detail = detail;
    }
    Ok(r)
}

/// Checks the run through the wire by reading back the server's regions (a RoCEmu server
/// grants that; perftest's own does not, so --verify needs a RoCEmu server).
pub(crate) fn verify(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
) -> Result<(bool, String), String> {
    use crate::perf::Test;
    let region = o.region();
    let back = o.qps * region;
    let n = match o.test {
        Test::Atomic { .. } => 8,
        _ => o.size,
    };
    for (qi, d) in rem.iter().enumerate() {
        let q = s.qps[qi];
        let b = ReadBack {
            qpn: q.qpn,
            into: Sge {
                addr: s.mr.addr + (back + q.off) as u64,
                length: n as u32,
                lkey: s.mr.lkey,
            },
            remote_addr: d.vaddr,
            rkey: d.rkey,
        };
        let Some(st) = perftest::read_back(ep, s.cq, &[b], Duration::from_secs(30))? else {
            return Ok((false, format!("QP {qi}: the read-back did not complete")));
        };
        if st[0] != WcStatus::Success {
            return Ok((
                false,
                format!("QP {qi}: the read-back failed ({:?}; a perftest server does not grant remote reads)", st[0]),
            ));
        }
        let b = ep.rnic.mr_bytes(s.mr.lkey).expect("registered");
        let remote_now = &b[back + q.off..back + q.off + n];
        let mine = &b[q.off..q.off + n];
        let theirs0 = server_pattern(d.vaddr, n);
        let (ok, what) = match o.test {
            // What was written or sent is what the server's region holds.
            Test::Write | Test::Send => (
                remote_now == mine,
                "the server's region differs from what was sent",
            ),
            // What was read is what the server's region held (and still holds).
            Test::Read => (
                mine == &theirs0[..] && remote_now == &theirs0[..],
                "what was read differs from the server's data",
            ),
            Test::Atomic { cmp_swap } => {
                let initial = u64::from_le_bytes(theirs0[..8].try_into().expect("8 bytes"));
                let now = u64::from_le_bytes(remote_now.try_into().expect("8 bytes"));
                let expect = if cmp_swap {
                    if initial == 0 {
                        0
                    } else {
                        initial
                    }
                } else {
                    initial.wrapping_add(o.iters)
                };
                if now != expect {
                    return Ok((
                        false,
                        format!("QP {qi}: the final value is {now:#x}, expected {expect:#x} (initial {initial:#x} + {} adds)", o.iters),
                    ));
                }
                (true, "")
            }
        };
        if !ok {
            return Ok((false, format!("QP {qi}: {what}")));
        }
    }
    Ok((true, String::new()))
}

/// perftest's latency tests, on the engine. WRITE: each end writes its counter into the last
/// byte of the peer's region and waits for the peer's counter in its own (ib_write_lat), the
/// server first; SEND: a ping-pong of SENDs, the client first (ib_send_lat); READ and atomics:
/// the client times each operation alone, the server is passive (ib_read_lat, ib_atomic_lat).
/// The client measures; the server returns no figures.
pub(crate) fn run_lat(
    ep: &mut Endpoint,
    o: &PerfOpts,
    s: &PerfSetup,
    rem: &[PerftestDest],
    mtu: Mtu,
    server: bool,
) -> Result<Option<Report>, String> {
    use crate::perf::Test;
    let q = s.qps[0];
    let d = rem[0];
    let size = o.size as u32;
    let recv = Sge {
        addr: s.mr.addr + q.off as u64,
        length: size,
        lkey: s.mr.lkey,
    };
    let send = Sge {
        addr: s.mr.addr + (o.qps * o.region() + q.off) as u64,
        ..recv
    };
    let passive = server && matches!(o.test, Test::Read | Test::Atomic { .. });
    if passive {
        return Ok(None);
    }
    let c0 = ep.rnic.counters();
    let start = Instant::now();
    let lat = match o.test {
        Test::Write | Test::Send => {
            let (op, first) = match o.test {
                Test::Write => (PingOp::Write, server),
                _ => (PingOp::Send, !server),
            };
            let mut pp = PingPong::new(
                op,
                q.qpn,
                s.cq,
                s.mr.addr,
                recv,
                send,
                (d.vaddr, d.rkey),
                o.iters,
                first,
                !server,
            );
            perftest::ping_pong(ep, &mut pp)?;
            pp.lat
        }
        Test::Read | Test::Atomic { .. } => {
            let (remote_addr, rkey) = (d.vaddr, d.rkey);
            let (op, len) = match o.test {
                Test::Read => (WrOpcode::RdmaRead { remote_addr, rkey }, size),
                Test::Atomic { cmp_swap: false } => (
                    WrOpcode::AtomicFetchAdd {
                        remote_addr,
                        rkey,
                        add: 1,
                    },
                    8,
                ),
                _ => (
                    WrOpcode::AtomicCmpSwap {
                        remote_addr,
                        rkey,
                        compare: 0,
                        swap: 0,
                    },
                    8,
                ),
            };
            let local = Sge {
                length: len,
                ..recv
            };
            let stall = "read/atomic latency: no completion for 30 s";
            let wr = |_| SendWr::new(0, op, vec![local]);
            let (lat, _, first) = perftest::one_at_a_time(ep, q.qpn, s.cq, o.iters, wr, stall)?;
            if let Some(st) = first {
                return Err(format!("read/atomic latency: {st:?}"));
            }
            lat
        }
    };
    // Let the last ACK leave before the closing exchange.
    ep.engine
        .run_until(&mut ep.rnic, Duration::from_millis(20), |_| false);
    if server {
        return Ok(None);
    }
    let seconds = start.elapsed().as_secs_f64();
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: 1,
        mtu: mtu.bytes(),
        iters: o.iters,
        limit_gbps: 0.0,
    };
    let t = Transport::since(&c0, &ep.rnic.counters());
    let mut r = perftest::lat_report(&shape, o.size as u64, seconds, lat, t);
    r.counters = crate::failure_counters(&[("", &ep.rnic.counters())]);
    Ok(Some(r))
}
