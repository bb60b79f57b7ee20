//! The RC responder, UC and UD beyond `rc.rs` and `ucud.rs` (issue 20, item 2): READs and atomics
//! to a QP with no responder resources, duplicate READs (forgotten, shortened, from the middle
//! of their response, with a bad R_Key) and a forgotten duplicate atomic, the pad count against
//! the RETH length, SEND with invalidate of a key the QP may not invalidate (unknown, another
//! PD's), the AETH credit field, the SE bit on the device's SENDs, WRITEs with immediate and UD
//! sends; READ and atomic opcodes on a UC QP; UD sends over the port MTU (C10-93.1.1) and what
//! the completion of a received datagram says of its sender. Citations: `crate::cite`.
use crate::agent::{Ah, SendOpcode, SendWr, Sge, UdDest, WorkCompletion};
use crate::cite;
use crate::peer::{describe, Pkt};
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::{NakCode, Opcode, Psn, QKey, Qpn, RKey, Syndrome};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "rdma.read.max-dest-rd-atomic-zero-nak",
        title: "An RDMA READ to a QP with max_dest_rd_atomic 0 (no responder resources) is NAKed invalid request, returns no data, and the QP goes to ERR",
        cites: &[cite::RESPONDER_CHECKS, cite::RD_ATOMIC_RESOURCES, cite::ERROR_CLASSES],
        run: read_no_resources,
    },
    Scenario {
        id: "rdma.atomic.max-dest-rd-atomic-zero-nak",
        title: "A FETCH_ADD to a QP with max_dest_rd_atomic 0 is NAKed invalid request; memory untouched",
        cites: &[cite::RESPONDER_CHECKS, cite::RD_ATOMIC_RESOURCES, cite::ATOMICS],
        run: atomic_no_resources,
    },
    Scenario {
        id: "psn.dup.read-outside-window-no-nak",
        title: "max_dest_rd_atomic 1, two READs: the first again, no longer remembered, is dropped or answered with the memory's bytes, never NAKed; the QP keeps working",
        cites: &[cite::DUP_READ, cite::READ_RETRY],
        run: dup_read_forgotten,
    },
    Scenario {
        id: "psn.dup.read-shorter-reexecuted",
        title: "A 2-packet READ retried at its PSN for its first 1024 bytes is answered with one READ RESPONSE ONLY of those bytes",
        cites: &[cite::READ_RETRY, cite::DUP_READ],
        run: dup_read_shorter,
    },
    Scenario {
        id: "psn.dup.read-mid-response-restarts",
        title: "A 3-packet READ retried from its second PSN (VA and length advanced) is answered from that PSN: two packets, the right bytes, AETH on the last",
        cites: &[cite::READ_RETRY, cite::DUP_READ, cite::READ_RESPONSES],
        run: dup_read_middle,
    },
    Scenario {
        id: "psn.dup.read-bad-rkey-no-data",
        title: "A duplicate READ whose R_Key no MR has returns no data (dropped, or NAKed remote access error)",
        cites: &[cite::RKEY_VALIDATION, cite::DUP_READ],
        run: dup_read_bad_rkey,
    },
    Scenario {
        id: "psn.dup.atomic-outside-window-not-reapplied",
        title: "max_dest_rd_atomic 1, two FETCH_ADDs: the first again, no longer remembered, is never applied a second time",
        cites: &[cite::DUP_ATOMIC, cite::ATOMIC_ACK_ETH],
        run: dup_atomic_forgotten,
    },
    Scenario {
        id: "seq.write.pad-short-of-reth-nak",
        title: "An RDMA WRITE ONLY with RETH length 8 whose 8 bytes on the wire carry pad count 3 (5 bytes of payload) is NAKed invalid request; memory untouched",
        cites: &[cite::BTH, cite::LENGTH_VALIDATION, cite::WRITE_LENGTH],
        run: write_pad_short,
    },
    Scenario {
        id: "rdma.write.pad-bytes-not-written",
        title: "An RDMA WRITE ONLY of 5 bytes (RETH length 5, pad count 3) writes exactly 5 bytes: the pad bytes reach no memory",
        cites: &[cite::BTH, cite::LENGTH_VALIDATION],
        run: write_pad_not_written,
    },
    Scenario {
        id: "rdma.send-inv.unknown-rkey-nak",
        title: "A SEND ONLY with invalidate naming an R_Key no MR has is NAKed invalid request, its receive does not complete successfully, and the QP goes to ERR",
        cites: &[cite::IETH, cite::SEND_INV_ERROR, cite::ERROR_CLASSES],
        run: send_inv_unknown,
    },
    Scenario {
        id: "ack.credits.receives-or-invalid",
        title: "Three receives posted, two SENDs: each ACK's credit field is the invalid code 31, or the count of receives left (rdmavt's encoding), and both agree",
        cites: &[cite::AETH, cite::E2E_CREDITS],
        run: ack_credits,
    },
    Scenario {
        id: "uc.read.opcode-dropped",
        title: "An RDMA READ request opcode on a UC QP (0x2c: UC has no READ) is dropped silently; the QP stays in RTS and takes the next SEND",
        cites: &[cite::UC_NO_READ_ATOMIC, cite::UC_ERROR_SILENT],
        run: uc_read_opcode,
    },
    Scenario {
        id: "uc.atomic.opcode-dropped",
        title: "A FETCH_ADD opcode on a UC QP (0x34: UC has no atomics) is dropped silently, memory untouched; the QP stays in RTS and takes the next SEND",
        cites: &[cite::UC_NO_READ_ATOMIC, cite::UC_ERROR_SILENT],
        run: uc_atomic_opcode,
    },
    Scenario {
        id: "ud.recv.src-qp-and-grh-flag",
        title: "Two datagrams from two source QPs: each completion carries its own DETH source QP as src_qp and the IBV_WC_GRH flag",
        cites: &[cite::POLL_CQ, cite::DETH, cite::A17_UD_GRH],
        run: ud_src_qp,
    },
    Scenario {
        id: "ud.send.over-mtu-not-emitted",
        title: "A UD send of the port MTU + 4 bytes emits no packet and completes without error; the next UD send goes out",
        cites: &[cite::UD_OVER_MTU],
        run: ud_over_mtu,
    },
    Scenario {
        id: "rdma.requester.solicited-se-on-last",
        title: "The device's 2-packet SEND posted with IBV_SEND_SOLICITED carries SE on its LAST packet only; a SEND posted without it carries none",
        cites: &[cite::BTH_SE, cite::BTH],
        run: solicited_se,
    },
    Scenario {
        id: "rdma.requester.solicited-write-imm-se",
        title: "The device's RDMA WRITE with immediate posted with IBV_SEND_SOLICITED carries SE on its one packet",
        cites: &[cite::BTH_SE, cite::IMMDT],
        run: solicited_write_imm,
    },
    Scenario {
        id: "ud.send.solicited-se",
        title: "The device's UD SEND posted with IBV_SEND_SOLICITED carries SE; one posted without it does not",
        cites: &[cite::BTH_SE, cite::UD_RULES],
        run: ud_solicited,
    },
    Scenario {
        id: "rdma.send-inv.other-pd-rkey-nak",
        title: "A SEND ONLY with invalidate naming the R_Key of an MR in another protection domain is NAKed invalid request, its receive does not complete successfully, and the QP goes to ERR",
        cites: &[cite::IETH, cite::SEND_INV_ERROR, cite::ERROR_CLASSES],
        run: send_inv_other_pd,
    },
    Scenario {
        id: "uc.send.no-receive-no-rnr-nak",
        title: "A UC SEND with no receive posted is dropped silently (no RNR NAK: UC has none); the QP stays in RTS and the next SEND, a receive posted, lands in it",
        cites: &[cite::UC_NO_ACK, cite::UC_ERROR_SILENT],
        run: uc_no_receive,
    },
    Scenario {
        id: "ud.recv.no-receive-dropped",
        title: "A datagram with no receive posted is dropped silently; a receive posted afterwards takes the next datagram, not that one",
        cites: &[cite::UD_RULES, cite::A17_UD_GRH],
        run: ud_no_receive,
    },
];

/// One NAK with `code` at `psn` and nothing else within the settle time.
fn one_nak(ctx: &mut Ctx<'_>, code: NakCode, psn: Psn, what: &str) -> Outcome {
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.is_nak(code) && p.psn() == psn => Ok(()),
        _ => Err(format!(
            "{what}: expected one NAK {code:?} at PSN {}, got {}",
            psn_text(psn),
            describe(&got)
        )),
    }
}

fn rd_atomic(n: u8) -> ConnOpts {
    ConnOpts {
        max_dest_rd_atomic: n,
        ..Default::default()
    }
}

fn read_no_resources(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(rd_atomic(0))?;
    ctx.fill_mr(&c, 0, &pattern(0x71, 64))?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, c.peer_psn)
        .reth(c.mr.addr, c.mr.rkey, 64);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        NakCode::InvalidRequest,
        c.peer_psn,
        "a 64-byte READ to a QP with max_dest_rd_atomic 0",
    )?;
    ctx.expect_state(&c, QpState::Err, "a READ to a QP with max_dest_rd_atomic 0")
}

fn atomic_no_resources(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(rd_atomic(0))?;
    ctx.fill_mr(&c, 0, &7u64.to_le_bytes())?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, c.peer_psn)
        .atomic(c.mr.addr, c.mr.rkey, 1, 0);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        NakCode::InvalidRequest,
        c.peer_psn,
        "a FETCH_ADD to a QP with max_dest_rd_atomic 0",
    )?;
    if ctx.mr_bytes(&c, 0, 8)? != 7u64.to_le_bytes() {
        return Err("a FETCH_ADD to a QP with max_dest_rd_atomic 0 changed memory".into());
    }
    Ok(())
}

/// The responses to a READ of `len` bytes from `va` at `psn`: every packet at its PSN, in
/// order, carrying `expect`, the last (and only the last and the first) with an ACK AETH.
/// `restart`: the response restarts in the middle of a message, so its first packet may be a
/// FIRST (a new response) or a MIDDLE (a continuation), and an ONLY or a LAST.
fn judge_read(
    got: &[Pkt],
    psn: Psn,
    expect: &[u8],
    mtu: usize,
    restart: bool,
) -> Result<(), String> {
    let n = expect.len().div_ceil(mtu).max(1);
    if got.len() != n {
        return Err(format!("expected {n} response packets, got {}", got.len()));
    }
    for (k, p) in got.iter().enumerate() {
        let first = k == 0;
        let last = k + 1 == n;
        let ok_op = match (first, last) {
            (true, true) => {
                p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY
                    || (restart && p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_LAST)
            }
            (true, false) => {
                p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_FIRST
                    || (restart && p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE)
            }
            (false, true) => p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_LAST,
            (false, false) => p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        };
        let want = &expect[k * mtu..((k + 1) * mtu).min(expect.len())];
        if !ok_op || p.psn() != psn.add(k as u32) || p.payload != want {
            return Err(format!(
                "packet {k}: expected a READ response at {} with {} bytes of the region, got {p}{}",
                psn_text(psn.add(k as u32)),
                want.len(),
                if p.payload != want && p.payload.len() == want.len() {
                    " (other bytes)"
                } else {
                    ""
                }
            ));
        }
        if last && !p.syndrome().is_some_and(|s| s.is_ack()) {
            return Err(format!("the last response packet lacks its ACK AETH: {p}"));
        }
    }
    Ok(())
}

/// A READ of `len` bytes at offset 0 of the MR, at `psn`, answered as [`judge_read`] says.
fn read_ok(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, off: u64, len: u32, what: &str) -> Outcome {
    let r = ctx
        .req(c, Opcode::RC_RDMA_READ_REQUEST, psn)
        .reth(c.mr.addr + off, c.mr.rkey, len);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let expect = ctx.mr_bytes(c, off, len as u64)?;
    judge_read(&got, psn, &expect, c.mtu as usize, false)
        .map_err(|e| format!("{what}: {e}: {}", describe(&got)))
}

/// After whatever came before, an 8-byte SEND at `psn` is ACKed and completes a receive.
fn send_goes_on(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, what: &str) -> Outcome {
    let s = ctx
        .req(c, Opcode::RC_SEND_ONLY, psn)
        .payload(&pattern(0x7e, 8))
        .ack_req(true);
    ctx.peer.send(&s)?;
    ctx.peer
        .expect_ack(psn, &format!("{what}, then a SEND at the next PSN"))?;
    let w = ctx.wcs(c, 1)?;
    match w.as_slice() {
        [x] if x.is_success() && x.byte_len == 8 => Ok(()),
        _ => Err(format!(
            "{what}, then an 8-byte SEND: expected its receive to complete, got {}",
            wcs_text(&w)
        )),
    }
}

fn dup_read_forgotten(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 64,
        ..rd_atomic(1)
    })?;
    ctx.fill_mr(&c, 1024, &pattern(0x72, 64))?;
    let e = c.peer_psn;
    read_ok(ctx, &c, e, 1024, 32, "the first 32-byte READ")?;
    read_ok(ctx, &c, e.add(1), 1024 + 32, 32, "the second 32-byte READ")?;
    // The first again: with one responder resource, the device no longer remembers it.
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, e)
        .reth(c.mr.addr + 1024, c.mr.rkey, 32);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let expect = ctx.mr_bytes(&c, 1024, 32)?;
    if !got.is_empty() {
        judge_read(&got, e, &expect, c.mtu as usize, false).map_err(|err| {
            format!(
                "the first READ again, with max_dest_rd_atomic 1 and a later READ done: expected nothing or its response, {err}: {}",
                describe(&got)
            )
        })?;
    }
    ctx.expect_state(&c, QpState::Rts, "a duplicate READ no longer remembered")?;
    send_goes_on(ctx, &c, e.add(2), "a duplicate READ no longer remembered")
}

fn dup_read_shorter(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let m = c.mtu as usize;
    ctx.fill_mr(&c, 0, &pattern(0x73, 2 * m))?;
    let e = c.peer_psn;
    read_ok(ctx, &c, e, 0, 2 * m as u32, "a 2-packet READ")?;
    read_ok(
        ctx,
        &c,
        e,
        0,
        m as u32,
        "the READ retried at its PSN for its first path MTU of bytes",
    )
}

fn dup_read_middle(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let m = c.mtu as usize;
    let len = 2 * m + 500;
    ctx.fill_mr(&c, 0, &pattern(0x74, len))?;
    let e = c.peer_psn;
    read_ok(ctx, &c, e, 0, len as u32, "a 3-packet READ")?;
    // The requester lost the FIRST's successors: it asks again from the second PSN.
    let r = ctx.req(&c, Opcode::RC_RDMA_READ_REQUEST, e.add(1)).reth(
        c.mr.addr + m as u64,
        c.mr.rkey,
        (len - m) as u32,
    );
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let expect = ctx.mr_bytes(&c, m as u64, (len - m) as u64)?;
    judge_read(&got, e.add(1), &expect, m, true).map_err(|err| {
        format!(
            "the READ retried from its second PSN {} for the {} bytes left: {err}: {}",
            psn_text(e.add(1)),
            len - m,
            describe(&got)
        )
    })?;
    // The next request takes the PSN after the whole READ.
    let w = ctx.wcs(&c, 0)?;
    if !w.is_empty() {
        return Err(format!("READs completed receives: {}", wcs_text(&w)));
    }
    ctx.post_recv(&c, 77, 3072, 64)?;
    send_goes_on(ctx, &c, e.add(3), "a READ retried from its middle")
}

fn dup_read_bad_rkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &pattern(0x75, 64))?;
    let e = c.peer_psn;
    read_ok(ctx, &c, e, 0, 64, "a 64-byte READ")?;
    let bad = RKey(c.mr.rkey.0 ^ 0x0100_0080);
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, e)
        .reth(c.mr.addr, bad, 64);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let data = got
        .iter()
        .any(|p| p.opcode().info().is_response() && !p.payload.is_empty());
    let other = got
        .iter()
        .any(|p| !(p.psn() == e && p.is_nak(NakCode::RemoteAccessError)));
    if data || other {
        return Err(format!(
            "the READ again at {} with an R_Key no MR has (0x{:08x}): expected no data (nothing, or a NAK remote access error at its PSN), got {}",
            psn_text(e),
            bad.0,
            describe(&got)
        ));
    }
    Ok(())
}

fn dup_atomic_forgotten(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(rd_atomic(1))?;
    ctx.fill_mr(&c, 0, &100u64.to_le_bytes())?;
    let e = c.peer_psn;
    for k in 0..2u32 {
        let r = ctx
            .req(&c, Opcode::RC_FETCH_ADD, e.add(k))
            .atomic(c.mr.addr, c.mr.rkey, 1, 0);
        ctx.peer.send(&r)?;
        let got = ctx.peer.collect(None);
        match got.as_slice() {
            [p] if p.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE
                && p.psn() == e.add(k)
                && p.ext.atomic_ack.is_some_and(|a| a.orig == 100 + k as u64) => {}
            _ => {
                return Err(format!(
                    "FETCH_ADD {} of 1 to 100: expected one ATOMIC_ACKNOWLEDGE at {} with original {}, got {}",
                    k + 1,
                    psn_text(e.add(k)),
                    100 + k,
                    describe(&got)
                ))
            }
        }
    }
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, e)
        .atomic(c.mr.addr, c.mr.rkey, 1, 0);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let v = u64::from_le_bytes(
        ctx.mr_bytes(&c, 0, 8)?
            .try_into()
            .map_err(|_| "read_mr returned other than 8 bytes".to_string())?,
    );
    if v != 102 {
        return Err(format!(
            "the first FETCH_ADD again, no longer remembered (max_dest_rd_atomic 1): the value is {v}, expected 102 (added once per new PSN); the device answered {}",
            describe(&got)
        ));
    }
    if let Some(p) = got
        .iter()
        .find(|p| p.ext.atomic_ack.is_some_and(|a| a.orig != 100))
    {
        return Err(format!(
            "the first FETCH_ADD again: a replay must carry its original value 100, got {p}"
        ));
    }
    Ok(())
}

fn write_pad_short(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 512, &[0x5a; 8])?;
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(c.mr.addr + 512, c.mr.rkey, 8)
        .payload(&pattern(0x76, 5))
        .pad(3)
        .ack_req(true);
    ctx.peer.send(&w)?;
    one_nak(
        ctx,
        NakCode::InvalidRequest,
        c.peer_psn,
        "an RDMA WRITE ONLY with RETH length 8 and 8 bytes with pad count 3 (5 of payload)",
    )?;
    if ctx.mr_bytes(&c, 512, 8)? != [0x5a; 8] {
        return Err(
            "a WRITE whose pad count leaves it short of its RETH length changed memory".into(),
        );
    }
    Ok(())
}

fn write_pad_not_written(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 512, &[0xaa; 8])?;
    let data = pattern(0x77, 5);
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(c.mr.addr + 512, c.mr.rkey, 5)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&w)?;
    ctx.peer
        .expect_ack(c.peer_psn, "a 5-byte RDMA WRITE ONLY with pad count 3")?;
    let b = ctx.mr_bytes(&c, 512, 8)?;
    if b[..5] != data[..] || b[5..] != [0xaa; 3] {
        return Err(format!(
            "a 5-byte WRITE with pad count 3: expected the 5 bytes then 3 untouched (aa aa aa), got {b:02x?}"
        ));
    }
    Ok(())
}

fn send_inv_unknown(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 64,
        ..Default::default()
    })?;
    let unknown = RKey(c.mr.rkey.0 ^ 0x0100_0080);
    let what = format!(
        "a SEND ONLY with invalidate of R_Key 0x{:08x}, which no MR has",
        unknown.0
    );
    send_inv_refused(ctx, &c, unknown, &what)
}

fn send_inv_other_pd(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 64,
        ..Default::default()
    })?;
    let pd = ctx.agent.alloc_pd()?;
    let other = ctx.agent.reg_mr(pd, 4096, Access::ALL)?;
    let what = format!(
        "a SEND ONLY with invalidate of R_Key 0x{:08x}, an MR's in another PD",
        other.rkey.0
    );
    send_inv_refused(ctx, &c, other.rkey, &what)
}

/// A SEND ONLY with invalidate of `key`, which this QP may not invalidate: one NAK invalid
/// request at its PSN, no successful receive, the QP in ERR.
fn send_inv_refused(ctx: &mut Ctx<'_>, c: &Conn, key: RKey, what: &str) -> Outcome {
    let mut s = ctx
        .req(c, Opcode::RC_SEND_ONLY_WITH_INVALIDATE, c.peer_psn)
        .payload(&pattern(0x78, 8))
        .ack_req(true);
    s.repr.ext.ieth = Some(key);
    ctx.peer.send(&s)?;
    // Everything is gathered before the verdict, so that a failure says all the device did.
    let got = ctx.peer.collect(None);
    let w = ctx.wcs(c, 1)?;
    let state = ctx.agent.query_qp(c.qpn)?.qp_state;
    let naked =
        matches!(got.as_slice(), [p] if p.is_nak(NakCode::InvalidRequest) && p.psn() == c.peer_psn);
    if naked && !w.iter().any(WorkCompletion::is_success) && state == QpState::Err {
        return Ok(());
    }
    Err(format!(
        "{what}: expected one NAK InvalidRequest at PSN {}, no successful receive and the QP in ERR; got {}, completions: {}, the QP in {}",
        psn_text(c.peer_psn),
        describe(&got),
        wcs_text(&w),
        crate::agent::qp_state_name(state).to_uppercase()
    ))
}

/// rdmavt's `credit_table` (Linux `drivers/infiniband/sw/rdmavt/rc.c`): the receive WQEs each
/// AETH credit code 0 … 30 stands for; 31 is the invalid code.
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// The code for `n` receive WQEs: the largest entry not above it.
fn credit_code(n: u32) -> u8 {
    CREDITS.iter().rposition(|c| *c <= n).unwrap_or(0) as u8
}

fn ack_credits(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 3,
        recv_len: 64,
        ..Default::default()
    })?;
    let mut codes = Vec::new();
    for k in 0..2u32 {
        let s = ctx
            .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn.add(k))
            .payload(&pattern(0x79, 8))
            .ack_req(true);
        ctx.peer.send(&s)?;
        let p = ctx.peer.expect_ack(c.peer_psn.add(k), "a SEND_ONLY")?;
        codes.push(p.syndrome().map_or(0, |s| s.0 & 0x1f));
    }
    let invalid = Syndrome::CREDITS_INVALID;
    if codes.iter().all(|c| *c == invalid) {
        return Ok(());
    }
    // Counted after the SEND took its receive (2, then 1 left) or before (3, then 2).
    let after = [credit_code(2), credit_code(1)];
    let before = [credit_code(3), credit_code(2)];
    if codes == after || codes == before {
        return Ok(());
    }
    Err(format!(
        "three receives posted, two SENDs: expected the credit codes {invalid} {invalid} (no end-to-end credits), {} {} or {} {} (the receives left), got {} {}",
        after[0], after[1], before[0], before[1], codes[0], codes[1]
    ))
}

fn uc(recvs: u32) -> ConnOpts {
    ConnOpts {
        qp_type: QpType::Uc,
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        recvs,
        recv_len: 64,
        ..Default::default()
    }
}

/// The frame `f` with BTH opcode `op` (one no RoCE opcode table holds for this service), its
/// ICRC made right again.
fn with_opcode_byte(f: &[u8], op: u8) -> Result<Vec<u8>, String> {
    let p =
        rocemu_wire::parse_frame(f).map_err(|e| format!("cannot parse a crafted frame: {e}"))?;
    let eth = f.len() - p.datagram().len();
    let ihl = if p.ip.is_v6() { 40 } else { 20 };
    let mut out = f.to_vec();
    out[eth + ihl + 8] = op;
    let n = out.len() - 4;
    let icrc = rocemu_wire::icrc::compute(&out[eth..n], ihl, p.ip.is_v6());
    out[n..].copy_from_slice(&rocemu_wire::icrc::to_wire(icrc));
    Ok(out)
}

/// An 8-byte UC SEND ONLY at `psn` after what came before: delivered, no answer, QP in RTS.
fn uc_send_goes_on(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, what: &str) -> Outcome {
    let data = pattern(0x7a, 8);
    let s = ctx.req(c, Opcode::UC_SEND_ONLY, psn).payload(&data);
    ctx.peer.send(&s)?;
    ctx.peer
        .expect_silence(&format!("{what}, then a UC SEND"))?;
    let w = ctx.wcs(c, 1)?;
    match w.as_slice() {
        [x] if x.is_success() && x.byte_len == 8 => {}
        _ => {
            return Err(format!(
                "{what}, then an 8-byte UC SEND at {}: expected its receive to complete, got {}",
                psn_text(psn),
                wcs_text(&w)
            ))
        }
    }
    ctx.expect_state(c, QpState::Rts, what)
}

fn uc_read_opcode(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..uc(1)
    })?;
    ctx.fill_mr(&c, 1024, &pattern(0x7b, 64))?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, c.peer_psn)
        .reth(c.mr.addr + 1024, c.mr.rkey, 64)
        .ack_req(true)
        .build()?;
    ctx.peer.send_raw(&with_opcode_byte(&r, 0x2c)?);
    let what = "an RDMA READ request opcode (0x2c) to a UC QP";
    ctx.peer.expect_silence(what)?;
    ctx.expect_no_wc(&c, what)?;
    uc_send_goes_on(ctx, &c, c.peer_psn.add(1), what)
}

fn uc_atomic_opcode(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        ..uc(1)
    })?;
    ctx.fill_mr(&c, 1024, &9u64.to_le_bytes())?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, c.peer_psn)
        .atomic(c.mr.addr + 1024, c.mr.rkey, 1, 0)
        .ack_req(true)
        .build()?;
    ctx.peer.send_raw(&with_opcode_byte(&r, 0x34)?);
    let what = "a FETCH_ADD opcode (0x34) to a UC QP";
    ctx.peer.expect_silence(what)?;
    ctx.expect_no_wc(&c, what)?;
    if ctx.mr_bytes(&c, 1024, 8)? != 9u64.to_le_bytes() {
        return Err(format!("{what} changed memory"));
    }
    uc_send_goes_on(ctx, &c, c.peer_psn.add(1), what)
}

fn ud(recvs: u32, recv_len: u32) -> ConnOpts {
    ConnOpts {
        qp_type: QpType::Ud,
        recvs,
        recv_len,
        ..Default::default()
    }
}

fn ud_src_qp(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(0, 256))?;
    ctx.post_recv(&c, 1, 0, 256)?;
    ctx.post_recv(&c, 2, 256, 256)?;
    let other = Qpn::new(c.peer_qpn.value() ^ 0x5a5a);
    for (k, src) in [c.peer_qpn, other].into_iter().enumerate() {
        let r = ctx
            .req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x70 + k as u32))
            .deth(c.qkey, src)
            .payload(&pattern(0x7c + k as u8, 16));
        ctx.peer.send(&r)?;
        let wc = ctx.expect_wc(
            &c,
            "IBV_WC_SUCCESS",
            Some("IBV_WC_RECV"),
            &format!("a UD SEND from source QP {src}"),
        )?;
        if wc.src_qp != src || wc.wc_flags & 1 == 0 || wc.wr_id != k as u64 + 1 {
            return Err(format!(
                "a datagram from source QP {src}: expected receive {} with src_qp {src} and IBV_WC_GRH, got {wc}, src_qp {}, wc_flags {:#x}",
                k + 1,
                wc.src_qp,
                wc.wc_flags
            ));
        }
    }
    Ok(())
}

/// The device sends an `n`-byte UD SEND (wr_id `id`) to the peer's QP.
fn ud_post(ctx: &mut Ctx<'_>, c: &Conn, id: u64, n: u32) -> Outcome {
    let mut wr = SendWr::new(
        id,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: n,
            lkey: c.mr.lkey,
        }],
    );
    wr.ud = Some(UdDest {
        ah: Ah {
            sgid_index: ctx.sgid_index(),
            ..Ah::to(ctx.peer.ip)
        },
        remote_qpn: c.peer_qpn,
        remote_qkey: QKey(0x1111_1111),
    });
    ctx.agent.post_send(c.qpn, wr)?;
    Ok(())
}

fn ud_over_mtu(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        mr_len: 8192,
        ..ud(0, 64)
    })?;
    let mtu = ctx.dev.active_mtu;
    ud_post(ctx, &c, 1, mtu + 4)?;
    let what = format!("a UD send of {} bytes, the port MTU ({mtu}) + 4", mtu + 4);
    ctx.peer.expect_silence(&what)?;
    let w = ctx.wcs(&c, 1)?;
    if w.len() != 1 || !w[0].is_success() || w[0].wr_id != 1 {
        return Err(format!(
            "{what}: expected it to complete without error (wr_id 1 IBV_WC_SUCCESS), got {}",
            wcs_text(&w)
        ));
    }
    ctx.expect_state(&c, QpState::Rts, &what)?;
    ud_post(ctx, &c, 2, 8)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::UD_SEND_ONLY && p.payload.len() == 8 => {}
        _ => {
            return Err(format!(
                "after {what}: an 8-byte UD send: expected one UD_SEND_ONLY of 8 bytes, got {}",
                describe(&got)
            ))
        }
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the 8-byte UD send",
    )?;
    Ok(())
}

fn solicited_se(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let m = c.mtu;
    let mut wr = SendWr::new(
        1,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: m + 100,
            lkey: c.mr.lkey,
        }],
    );
    wr.solicited = true;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    let se: Vec<bool> = got.iter().map(|p| p.bth.solicited).collect();
    match got.as_slice() {
        [f, l] if f.opcode() == Opcode::RC_SEND_FIRST
            && l.opcode() == Opcode::RC_SEND_LAST
            && se == [false, true] => {}
        _ => {
            return Err(format!(
                "a SEND of MTU + 100 bytes posted with IBV_SEND_SOLICITED: expected SEND_FIRST (SE 0) and SEND_LAST (SE 1), got {} with SE {se:?}",
                describe(&got)
            ))
        }
    }
    let a = ctx
        .req(&c, Opcode::RC_ACKNOWLEDGE, c.dut_psn.add(1))
        .aeth(Syndrome::ack(Syndrome::CREDITS_INVALID), 1);
    ctx.peer.send(&a)?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the solicited SEND",
    )?;
    let plain = SendWr::new(
        2,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 8,
            lkey: c.mr.lkey,
        }],
    );
    ctx.agent.post_send(c.qpn, plain)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_SEND_ONLY && !p.bth.solicited => Ok(()),
        _ => Err(format!(
            "an 8-byte SEND posted without IBV_SEND_SOLICITED: expected one SEND_ONLY with SE 0, got {} with SE {:?}",
            describe(&got),
            got.iter().map(|p| p.bth.solicited).collect::<Vec<_>>()
        )),
    }
}

fn solicited_write_imm(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let mut wr = SendWr::new(
        1,
        SendOpcode::RdmaWriteWithImm,
        vec![Sge {
            addr: c.mr.addr,
            length: 16,
            lkey: c.mr.lkey,
        }],
    );
    wr.remote_addr = 0x7100_0000;
    wr.rkey = RKey(0x1234);
    wr.imm_data = 0x5e5e_0001;
    wr.solicited = true;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE && p.bth.solicited => Ok(()),
        _ => Err(format!(
            "a 16-byte RDMA WRITE with immediate posted with IBV_SEND_SOLICITED: expected one RDMA_WRITE_ONLY_WITH_IMMEDIATE with SE 1, got {} with SE {:?}",
            describe(&got),
            got.iter().map(|p| p.bth.solicited).collect::<Vec<_>>()
        )),
    }
}

fn ud_solicited(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(0, 64))?;
    let mut se = Vec::new();
    for (id, solicited) in [(1u64, true), (2, false)] {
        let mut wr = SendWr::new(
            id,
            SendOpcode::Send,
            vec![Sge {
                addr: c.mr.addr,
                length: 8,
                lkey: c.mr.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            ah: Ah {
                sgid_index: ctx.sgid_index(),
                ..Ah::to(ctx.peer.ip)
            },
            remote_qpn: c.peer_qpn,
            remote_qkey: QKey(0x1111_1111),
        });
        wr.solicited = solicited;
        ctx.agent.post_send(c.qpn, wr)?;
        let got = ctx.peer.collect(None);
        match got.as_slice() {
            [p] if p.opcode() == Opcode::UD_SEND_ONLY => se.push(p.bth.solicited),
            _ => {
                return Err(format!(
                    "a UD send of 8 bytes: expected one UD_SEND_ONLY, got {}",
                    describe(&got)
                ))
            }
        }
    }
    if se != [true, false] {
        return Err(format!(
            "two UD sends, posted with IBV_SEND_SOLICITED and without: expected SE 1 then 0, got {se:?}"
        ));
    }
    Ok(())
}

fn uc_no_receive(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(uc(0))?;
    let s = ctx
        .req(&c, Opcode::UC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x7d, 8))
        .ack_req(true);
    ctx.peer.send(&s)?;
    let what = "a UC SEND with no receive posted";
    ctx.peer.expect_silence(what)?;
    ctx.expect_no_wc(&c, what)?;
    ctx.expect_state(&c, QpState::Rts, what)?;
    ctx.post_recv(&c, 1000, 0, 64)?;
    uc_send_goes_on(ctx, &c, c.peer_psn.add(1), what)?;
    if ctx.mr_bytes(&c, 0, 8)? != pattern(0x7a, 8) {
        return Err(format!(
            "{what}: the receive posted afterwards holds other bytes than the SEND after it"
        ));
    }
    Ok(())
}

fn ud_no_receive(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(0, 256))?;
    let first = ctx
        .req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x90))
        .deth(c.qkey, c.peer_qpn)
        .payload(&pattern(0x6a, 16));
    ctx.peer.send(&first)?;
    let what = "a datagram with no receive posted";
    ctx.peer.expect_silence(what)?;
    ctx.expect_no_wc(&c, what)?;
    ctx.post_recv(&c, 1, 0, 256)?;
    let next = pattern(0x6b, 16);
    let second = ctx
        .req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x91))
        .deth(c.qkey, c.peer_qpn)
        .payload(&next);
    ctx.peer.send(&second)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "the datagram after a receive was posted",
    )?;
    let got = ctx.mr_bytes(&c, 40, 16)?;
    if wc.byte_len != 56 || got != next {
        return Err(format!(
            "{what}, then a receive and another datagram: expected that one's 16 bytes after the GRH area (byte_len 56), got {wc} holding {}",
            if got == pattern(0x6a, 16) {
                "the dropped datagram's bytes"
            } else {
                "other bytes"
            }
        ));
    }
    ctx.expect_no_wc(&c, "after the second datagram")
}
