//! PSN handling (IBTA Vol. 1 9.7.1 unverified, 9.7.5.1.2 coalesced ACKs, C9-105 duplicates) and
//! opcode sequencing (9.7.4.1 in 1.5) at
//! the responder; the 2^24 wrap at both ends.
use crate::agent::{SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, psn_text, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::QpState;
use rocemu_wire::{NakCode, Opcode, Psn, Syndrome};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "psn.seq-error.nak-once",
        title: "Three SENDs past a gap get exactly one NAK PSN sequence error, at the expected PSN; the gap filled, traffic resumes",
        cites: &[cite::NAK_ONCE],
        run: seq_error_nak_once,
    },
    Scenario {
        id: "psn.dup.send-reacked-once-delivered",
        title: "A duplicate SEND is ACKed again but not delivered again (no second receive consumed)",
        cites: &[cite::DUP_C9_105, cite::COALESCED_ACK],
        run: dup_send,
    },
    Scenario {
        id: "psn.dup.write-reacked-not-reapplied",
        title: "A duplicate RDMA WRITE is ACKed but not written again over newer data",
        cites: &[cite::DUP_C9_105],
        run: dup_write,
    },
    Scenario {
        id: "psn.dup.read-reexecuted",
        title: "A duplicate RDMA READ is executed again: a response at its PSN with the memory's current bytes",
        cites: &[cite::DUP_READ],
        run: dup_read,
    },
    Scenario {
        id: "psn.dup.atomic-replayed-not-reapplied",
        title: "A duplicate FETCH_ADD returns the saved original value and is not applied twice",
        cites: &[cite::DUP_ATOMIC, cite::ATOMIC_ACK_ETH, cite::ATOMICS],
        run: dup_atomic,
    },
    Scenario {
        id: "psn.wrap.responder",
        title: "The responder follows the PSN across 2^24: 0xfffffe, 0xffffff, 0, 1 each ACKed and delivered",
        cites: &[cite::BTH, cite::PSN_MODULO],
        run: wrap_responder,
    },
    Scenario {
        id: "psn.wrap.requester",
        title: "A 2-packet WRITE from sq_psn 0xffffff goes out as FIRST 0xffffff, LAST 0x000000; the ACK of 0 completes it",
        cites: &[cite::BTH, cite::PSN_MODULO, cite::RESPONSE_PSNS],
        run: wrap_requester,
    },
    Scenario {
        id: "seq.middle-without-first-nak",
        title: "A SEND MIDDLE without a FIRST is NAKed invalid request and the QP goes to ERR",
        cites: &[cite::RESPONDER_CHECKS, cite::OPCODE_SEQUENCE, cite::ERROR_CLASSES],
        run: middle_without_first,
    },
    Scenario {
        id: "seq.write-inside-send-nak",
        title: "An RDMA WRITE ONLY between a SEND FIRST and its LAST is NAKed invalid request",
        cites: &[cite::RESPONDER_CHECKS, cite::OPCODE_SEQUENCE],
        run: write_inside_send,
    },
    Scenario {
        id: "seq.write-last-without-first-nak",
        title: "An RDMA WRITE LAST without a FIRST is NAKed invalid request",
        cites: &[cite::RESPONDER_CHECKS, cite::OPCODE_SEQUENCE],
        run: write_last_without_first,
    },
];

fn seq_error_nak_once(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 5,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    for k in 2..5 {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, e.add(k))
            .payload(&pattern(k as u8, 16))
            .ack_req(true);
        ctx.peer.send(&r)?;
    }
    let got = ctx.peer.collect(None);
    let naks = got
        .iter()
        .filter(|p| p.is_nak(NakCode::PsnSequenceError) && p.psn() == e)
        .count();
    if naks != 1 || got.len() != 1 {
        return Err(format!(
            "expected exactly one NAK PSN sequence error at PSN {} for three SENDs at {}..{}, got {} of them among: {}",
            psn_text(e),
            psn_text(e.add(2)),
            psn_text(e.add(4)),
            naks,
            describe(&got)
        ));
    }
    ctx.expect_no_wc(&c, "SENDs past a gap")?;
    for k in 0..2 {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, e.add(k))
            .payload(&pattern(k as u8, 16))
            .ack_req(true);
        ctx.peer.send(&r)?;
        ctx.peer
            .expect_ack(e.add(k), "the SENDs that fill the gap")?;
    }
    let w = ctx.wcs(&c, 2)?;
    if w.len() != 2 || !w.iter().all(|w| w.is_success()) {
        return Err(format!(
            "expected two successful receives, got {}",
            crate::scenario::wcs_text(&w)
        ));
    }
    Ok(())
}

fn dup_send(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 2,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, e)
        .payload(&pattern(1, 24))
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_ack(e, "a SEND_ONLY")?;
    let first = ctx.expect_wc(&c, "IBV_WC_SUCCESS", Some("IBV_WC_RECV"), "a SEND_ONLY")?;
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(e, "the same SEND_ONLY again (duplicate)")?;
    ctx.expect_no_wc(&c, "a duplicate SEND_ONLY")?;
    let r2 = ctx
        .req(&c, Opcode::RC_SEND_ONLY, e.add(1))
        .payload(&pattern(2, 24))
        .ack_req(true);
    ctx.peer.send(&r2)?;
    ctx.peer.expect_ack(e.add(1), "the next SEND_ONLY")?;
    let second = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "the next SEND_ONLY",
    )?;
    if second.wr_id == first.wr_id || second.wr_id != 1001 {
        return Err(format!(
            "the next SEND completed receive wr_id {} (the first took {}): the duplicate consumed a receive",
            second.wr_id, first.wr_id
        ));
    }
    Ok(())
}

fn dup_write(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let e = c.peer_psn;
    let (a, b) = (pattern(0xa0, 16), pattern(0xb0, 16));
    let w = |ctx: &Ctx<'_>, psn: Psn, data: &[u8]| {
        ctx.req(&c, Opcode::RC_RDMA_WRITE_ONLY, psn)
            .reth(c.mr.addr, c.mr.rkey, 16)
            .payload(data)
            .ack_req(true)
    };
    let first = w(ctx, e, &a);
    ctx.peer.send(&first)?;
    ctx.peer.expect_ack(e, "a WRITE_ONLY")?;
    ctx.peer.send(&w(ctx, e.add(1), &b))?;
    ctx.peer
        .expect_ack(e.add(1), "a second WRITE_ONLY to the same address")?;
    ctx.peer.send(&first)?;
    let got = ctx.peer.collect(None);
    // The re-ACK may carry the duplicate's PSN or the latest one; never more.
    if !got
        .iter()
        .any(|p| p.is_ack() && (p.psn() == e || p.psn() == e.add(1)))
        || got.iter().any(|p| !p.is_ack())
    {
        return Err(format!(
            "expected the duplicate WRITE_ONLY at {} re-ACKed (PSN {} or {}), got {}",
            psn_text(e),
            psn_text(e),
            psn_text(e.add(1)),
            describe(&got)
        ));
    }
    let mem = ctx.mr_bytes(&c, 0, 16)?;
    if mem != b {
        return Err(format!(
            "memory holds {mem:02x?} after the duplicate, expected the second WRITE's {b:02x?}"
        ));
    }
    Ok(())
}

fn dup_read(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let e = c.peer_psn;
    let (d1, d2) = (pattern(0x11, 32), pattern(0x22, 32));
    ctx.fill_mr(&c, 0, &d1)?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, e)
        .reth(c.mr.addr, c.mr.rkey, 32);
    ctx.peer.send(&r)?;
    let check = |got: Vec<crate::peer::Pkt>, want: &[u8], what: &str| -> Outcome {
        match got.as_slice() {
            [p] if p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY
                && p.psn() == e
                && p.syndrome().is_some_and(|s| s.is_ack())
                && p.payload == want => Ok(()),
            _ => Err(format!(
                "{what}: expected one RDMA_READ_RESPONSE_ONLY at PSN {} with the memory's 32 bytes, got {}",
                psn_text(e),
                describe(&got)
            )),
        }
    };
    check(ctx.peer.collect(None), &d1, "a 32-byte READ")?;
    ctx.fill_mr(&c, 0, &d2)?;
    ctx.peer.send(&r)?;
    check(
        ctx.peer.collect(None),
        &d2,
        "the same READ again (duplicate), memory changed meanwhile",
    )
}

fn dup_atomic(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let e = c.peer_psn;
    ctx.fill_mr(&c, 0, &10u64.to_le_bytes())?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, e)
        .atomic(c.mr.addr, c.mr.rkey, 5, 0);
    for what in [
        "a FETCH_ADD of 5 on 10",
        "the same FETCH_ADD again (duplicate)",
    ] {
        ctx.peer.send(&r)?;
        let got = ctx.peer.collect(None);
        match got.as_slice() {
            [p] if p.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE
                && p.psn() == e
                && p.ext.atomic_ack.map(|a| a.orig) == Some(10) => {}
            _ => {
                return Err(format!(
                    "{what}: expected one ATOMIC_ACKNOWLEDGE at PSN {} with orig=0xa, got {}",
                    psn_text(e),
                    describe(&got)
                ))
            }
        }
    }
    let mem = ctx.mr_bytes(&c, 0, 8)?;
    let v = u64::from_le_bytes(mem.try_into().unwrap_or_default());
    if v != 15 {
        return Err(format!(
            "memory holds {v} after a FETCH_ADD of 5 on 10 and its duplicate, expected 15"
        ));
    }
    Ok(())
}

fn wrap_responder(ctx: &mut Ctx<'_>) -> Outcome {
    let start = Psn::new(0xff_fffe);
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        peer_psn: Some(start),
        ..Default::default()
    })?;
    for k in 0..4 {
        let psn = start.add(k);
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, psn)
            .payload(&pattern(k as u8, 8))
            .ack_req(true);
        ctx.peer.send(&r)?;
        ctx.peer.expect_ack(psn, "SENDs across the PSN wrap")?;
    }
    let w = ctx.wcs(&c, 4)?;
    if w.len() != 4 || !w.iter().all(|w| w.is_success()) {
        return Err(format!(
            "expected four successful receives across the wrap, got {}",
            crate::scenario::wcs_text(&w)
        ));
    }
    Ok(())
}

fn wrap_requester(ctx: &mut Ctx<'_>) -> Outcome {
    let start = Psn::new(0xff_ffff);
    let c = ctx.connect(ConnOpts {
        dut_psn: Some(start),
        ..ConnOpts::requester()
    })?;
    let len = 2 * c.mtu;
    let (va, rkey) = (0x5000_0000u64, rocemu_wire::RKey(0x1234));
    let mut wr = SendWr::new(
        7,
        SendOpcode::RdmaWrite,
        vec![Sge {
            addr: c.mr.addr,
            length: len,
            lkey: c.mr.lkey,
        }],
    );
    wr.remote_addr = va;
    wr.rkey = rkey;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    let ok = got.len() == 2
        && got[0].opcode() == Opcode::RC_RDMA_WRITE_FIRST
        && got[0].psn() == start
        && got[0]
            .ext
            .reth
            .is_some_and(|r| r.va == va && r.rkey == rkey && r.dma_len == len)
        && got[1].opcode() == Opcode::RC_RDMA_WRITE_LAST
        && got[1].psn() == Psn::new(0)
        && got[1].bth.ack_req;
    if !ok {
        return Err(format!(
            "expected RDMA_WRITE_FIRST psn=0xffffff (RETH va=0x{va:x} len={len}) then RDMA_WRITE_LAST psn=0x000000 with AckReq, got {}",
            describe(&got)
        ));
    }
    let ack = ctx
        .peer
        .craft(Opcode::RC_ACKNOWLEDGE, c.qpn, Psn::new(0))
        .aeth(Syndrome::ack(Syndrome::CREDITS_INVALID), 1);
    ctx.peer.send(&ack)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RDMA_WRITE"),
        "the ACK of PSN 0",
    )?;
    if wc.wr_id != 7 {
        return Err(format!("completion for wr_id {}, expected 7", wc.wr_id));
    }
    Ok(())
}

/// A packet that breaks the opcode sequence: one NAK invalid request at its PSN, and the QP in
/// ERR (a class C error, 9.9.3.1, unverified).
fn sequence_nak(ctx: &mut Ctx<'_>, c: &crate::scenario::Conn, psn: Psn, what: &str) -> Outcome {
    let got = ctx.peer.collect(None);
    let naks = got
        .iter()
        .filter(|p| p.is_nak(NakCode::InvalidRequest) && p.psn() == psn)
        .count();
    if naks != 1 || got.iter().any(|p| !p.is_nak(NakCode::InvalidRequest)) {
        return Err(format!(
            "{what}: expected one NAK invalid request at PSN {}, got {}",
            psn_text(psn),
            describe(&got)
        ));
    }
    ctx.expect_state(c, QpState::Err, what)
}

fn middle_without_first(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_MIDDLE, c.peer_psn)
        .payload(&pattern(3, c.mtu as usize))
        .ack_req(true);
    ctx.peer.send(&r)?;
    sequence_nak(ctx, &c, c.peer_psn, "a SEND_MIDDLE with no SEND_FIRST")
}

fn write_inside_send(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let first = ctx
        .req(&c, Opcode::RC_SEND_FIRST, e)
        .payload(&pattern(4, c.mtu as usize));
    ctx.peer.send(&first)?;
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, e.add(1))
        .reth(c.mr.addr + 2048, c.mr.rkey, 8)
        .payload(&pattern(5, 8))
        .ack_req(true);
    ctx.peer.send(&w)?;
    sequence_nak(ctx, &c, e.add(1), "an RDMA_WRITE_ONLY after a SEND_FIRST")
}

fn write_last_without_first(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_LAST, c.peer_psn)
        .payload(&pattern(6, 64))
        .ack_req(true);
    ctx.peer.send(&r)?;
    sequence_nak(
        ctx,
        &c,
        c.peer_psn,
        "an RDMA_WRITE_LAST with no RDMA_WRITE_FIRST",
    )
}
