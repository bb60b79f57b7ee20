//! Whole messages at the responder: multi-packet SENDs, WRITE lengths, immediates, atomics, READ
//! response layout, the QP's access flags, and sequence errors after recovery.
use crate::cite;
use crate::peer::{describe, Pkt};
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState};
use rocemu_wire::{NakCode, Opcode, Psn};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "seq.send.multi-packet-delivered",
        title: "A SEND of 2 MTU + 100 bytes as FIRST, MIDDLE, LAST lands in one receive, in order, ACKed at the LAST",
        cites: &[cite::LENGTH_VALIDATION, cite::LENGTH_C9_92, cite::ACK_GENERATION],
        run: send_multi_packet,
    },
    Scenario {
        id: "seq.write.length-mismatch-nak",
        title: "An RDMA WRITE ONLY carrying 8 bytes with a RETH length of 16 is NAKed invalid request; memory untouched",
        cites: &[cite::LENGTH_VALIDATION, cite::WRITE_LENGTH],
        run: write_length_mismatch,
    },
    Scenario {
        id: "seq.send.longer-than-receive-nak",
        title: "A 64-byte SEND into a 32-byte receive is NAKed invalid request; the receive completes IBV_WC_LOC_LEN_ERR",
        cites: &[cite::RECV_TOO_SHORT, cite::LOCAL_LENGTH_ERROR],
        run: send_longer_than_receive,
    },
    Scenario {
        id: "seq.middle.short-nak",
        title: "A SEND MIDDLE of half the path MTU is NAKed invalid request",
        cites: &[cite::LENGTH_VALIDATION, cite::LENGTH_C9_92],
        run: middle_short,
    },
    Scenario {
        id: "psn.seq-error.nak-rearmed",
        title: "After a sequence error is recovered, a new gap gets a new NAK at the new expected PSN",
        cites: &[cite::NAK_ONCE],
        run: nak_rearmed,
    },
    Scenario {
        id: "rdma.write-imm.consumes-receive",
        title: "An RDMA WRITE ONLY with immediate writes memory and completes a receive IBV_WC_RECV_RDMA_WITH_IMM with the immediate",
        cites: &[cite::WRITE_NO_IMM_C10_87, cite::IMMDT, cite::POLL_CQ, cite::IMM_RECEIVE],
        run: write_imm,
    },
    Scenario {
        id: "rdma.send-imm.delivers-imm",
        title: "A SEND ONLY with immediate completes its receive with the immediate and IBV_WC_WITH_IMM",
        cites: &[cite::IMMDT, cite::POLL_CQ],
        run: send_imm,
    },
    Scenario {
        id: "rdma.atomic.cmp-swap",
        title: "CMP_SWAP swaps when the compare value matches and not otherwise; both return the original",
        cites: &[cite::ATOMIC_ETH, cite::ATOMIC_ACK_ETH, cite::ATOMICS],
        run: cmp_swap,
    },
    Scenario {
        id: "rdma.atomic.qp-without-remote-atomic-nak",
        title: "A FETCH_ADD to a QP whose access flags lack REMOTE_ATOMIC is NAKed; memory untouched",
        cites: &[cite::RESPONDER_CHECKS, cite::QP_ACCESS],
        run: atomic_no_qp_permission,
    },
    Scenario {
        id: "rdma.read.qp-without-remote-read-nak",
        title: "An RDMA READ to a QP whose access flags lack REMOTE_READ is NAKed; no data returned",
        cites: &[cite::RESPONDER_CHECKS, cite::QP_ACCESS],
        run: read_no_qp_permission,
    },
    Scenario {
        id: "rdma.read.multi-packet-responses",
        title: "A 2500-byte READ: FIRST (AETH), MIDDLE (none), LAST (AETH) at consecutive PSNs; the next request uses the PSN after",
        cites: &[cite::AETH, cite::READ_RESPONSES, cite::PSN_MODULO],
        run: read_multi_packet,
    },
];

fn send_multi_packet(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let m = c.mtu as usize;
    let data = pattern(0x13, 2 * m + 100);
    let e = c.peer_psn;
    let parts = [
        (Opcode::RC_SEND_FIRST, &data[..m]),
        (Opcode::RC_SEND_MIDDLE, &data[m..2 * m]),
        (Opcode::RC_SEND_LAST, &data[2 * m..]),
    ];
    for (k, (op, bytes)) in parts.iter().enumerate() {
        let r = ctx
            .req(&c, *op, e.add(k as u32))
            .payload(bytes)
            .ack_req(k == 2);
        ctx.peer.send(&r)?;
    }
    let got = ctx.peer.collect(None);
    let last_ok = got
        .last()
        .is_some_and(|p| p.is_ack() && p.psn() == e.add(2) && p.msn() == Some(1));
    if !last_ok || got.iter().any(|p| !p.is_ack()) {
        return Err(format!(
            "expected the LAST ACKed at {} with MSN 1, got {}",
            psn_text(e.add(2)),
            describe(&got)
        ));
    }
    let wc = ctx.expect_wc(&c, "IBV_WC_SUCCESS", Some("IBV_WC_RECV"), "a 3-packet SEND")?;
    if wc.byte_len as usize != data.len() {
        return Err(format!("byte_len {}, expected {}", wc.byte_len, data.len()));
    }
    if ctx.mr_bytes(&c, 0, data.len() as u64)? != data {
        return Err("the receive buffer does not hold the three packets' bytes in order".into());
    }
    Ok(())
}

/// One NAK with `code` at `psn` and nothing else.
fn one_nak(ctx: &mut Ctx<'_>, codes: &[NakCode], psn: Psn, what: &str) -> Outcome {
    let got = ctx.peer.collect(None);
    let ok = got.len() == 1 && got[0].psn() == psn && codes.iter().any(|k| got[0].is_nak(*k));
    if ok {
        return Ok(());
    }
    Err(format!(
        "{what}: expected one NAK ({}) at PSN {}, got {}",
        codes
            .iter()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(" or "),
        psn_text(psn),
        describe(&got)
    ))
}

fn write_length_mismatch(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &[0x5a; 16])?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(c.mr.addr, c.mr.rkey, 16)
        .payload(&[0xee; 8])
        .ack_req(true);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        &[NakCode::InvalidRequest],
        c.peer_psn,
        "an 8-byte WRITE_ONLY with RETH length 16",
    )?;
    if ctx.mr_bytes(&c, 0, 16)?.iter().any(|b| *b != 0x5a) {
        return Err("a WRITE whose length disagrees with its RETH reached memory".into());
    }
    Ok(())
}

fn send_longer_than_receive(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 32,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x14, 64))
        .ack_req(true);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        &[NakCode::InvalidRequest],
        c.peer_psn,
        "a 64-byte SEND into a 32-byte receive",
    )?;
    ctx.expect_wc(
        &c,
        "IBV_WC_LOC_LEN_ERR",
        None,
        "a 64-byte SEND into a 32-byte receive",
    )?;
    ctx.expect_state(&c, QpState::Err, "a receive too short for its SEND")
}

fn middle_short(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let first = ctx
        .req(&c, Opcode::RC_SEND_FIRST, e)
        .payload(&pattern(0x15, c.mtu as usize));
    let middle = ctx
        .req(&c, Opcode::RC_SEND_MIDDLE, e.add(1))
        .payload(&pattern(0x16, c.mtu as usize / 2))
        .ack_req(true);
    ctx.peer.send(&first)?;
    ctx.peer.send(&middle)?;
    one_nak(
        ctx,
        &[NakCode::InvalidRequest],
        e.add(1),
        "a SEND_MIDDLE of half the MTU",
    )
}

fn nak_rearmed(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let send = |ctx: &mut Ctx<'_>, k: u32| -> Outcome {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, e.add(k))
            .payload(&pattern(k as u8, 8))
            .ack_req(true);
        ctx.peer.send(&r)
    };
    send(ctx, 1)?;
    one_nak(ctx, &[NakCode::PsnSequenceError], e, "a SEND one PSN ahead")?;
    send(ctx, 0)?;
    ctx.peer.expect_ack(e, "the missing SEND")?;
    send(ctx, 2)?;
    one_nak(
        ctx,
        &[NakCode::PsnSequenceError],
        e.add(1),
        "after recovery, a SEND one PSN ahead again",
    )?;
    send(ctx, 1)?;
    ctx.peer
        .expect_ack(e.add(1), "the SEND that fills the second gap")?;
    Ok(())
}

fn write_imm(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 64,
        ..Default::default()
    })?;
    let data = pattern(0x17, 16);
    let r = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, c.peer_psn)
        .reth(c.mr.addr + 1024, c.mr.rkey, 16)
        .imm(0xcafe_0001)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "an RDMA_WRITE_ONLY_WITH_IMMEDIATE")?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV_RDMA_WITH_IMM"),
        "a WRITE with immediate",
    )?;
    if wc.imm_data != Some(0xcafe_0001) || wc.byte_len != 16 {
        return Err(format!(
            "expected imm_data 0xcafe0001 and byte_len 16, got {:?} and {}",
            wc.imm_data.map(|i| format!("0x{i:08x}")),
            wc.byte_len
        ));
    }
    if ctx.mr_bytes(&c, 1024, 16)? != data {
        return Err("a WRITE with immediate did not write its bytes at the RETH address".into());
    }
    Ok(())
}

fn send_imm(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, c.peer_psn)
        .imm(0x1234_5678)
        .payload(&pattern(0x18, 8))
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "a SEND_ONLY_WITH_IMMEDIATE")?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a SEND with immediate",
    )?;
    if wc.imm_data != Some(0x1234_5678) || wc.wc_flags & 2 == 0 || wc.byte_len != 8 {
        return Err(format!(
            "expected imm_data 0x12345678, IBV_WC_WITH_IMM and byte_len 8, got {:?}, wc_flags {:#x}, byte_len {}",
            wc.imm_data.map(|i| format!("0x{i:08x}")),
            wc.wc_flags,
            wc.byte_len
        ));
    }
    Ok(())
}

fn atomic_ack(ctx: &mut Ctx<'_>, what: &str, psn: Psn, orig: u64) -> Outcome {
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE
            && p.psn() == psn
            && p.ext.atomic_ack.map(|a| a.orig) == Some(orig) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{what}: expected one ATOMIC_ACKNOWLEDGE at PSN {} with orig=0x{orig:x}, got {}",
            psn_text(psn),
            describe(&got)
        )),
    }
}

fn read_u64(ctx: &mut Ctx<'_>, c: &Conn) -> Result<u64, String> {
    let b = ctx.mr_bytes(c, 0, 8)?;
    Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
}

fn cmp_swap(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let e = c.peer_psn;
    ctx.fill_mr(&c, 0, &7u64.to_le_bytes())?;
    let hit = ctx
        .req(&c, Opcode::RC_COMPARE_SWAP, e)
        .atomic(c.mr.addr, c.mr.rkey, 9, 7);
    ctx.peer.send(&hit)?;
    atomic_ack(ctx, "CMP_SWAP 7 → 9 on 7", e, 7)?;
    if read_u64(ctx, &c)? != 9 {
        return Err("a CMP_SWAP whose compare value matched did not swap".into());
    }
    let miss = ctx
        .req(&c, Opcode::RC_COMPARE_SWAP, e.add(1))
        .atomic(c.mr.addr, c.mr.rkey, 11, 7);
    ctx.peer.send(&miss)?;
    atomic_ack(ctx, "CMP_SWAP 7 → 11 on 9", e.add(1), 9)?;
    let v = read_u64(ctx, &c)?;
    if v != 9 {
        return Err(format!(
            "a CMP_SWAP whose compare value differed changed memory to {v}"
        ));
    }
    Ok(())
}

fn atomic_no_qp_permission(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..Default::default()
    })?;
    ctx.fill_mr(&c, 0, &[0; 8])?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, c.peer_psn)
        .atomic(c.mr.addr, c.mr.rkey, 1, 0);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        &[NakCode::InvalidRequest, NakCode::RemoteAccessError],
        c.peer_psn,
        "a FETCH_ADD to a QP without REMOTE_ATOMIC",
    )?;
    if read_u64(ctx, &c)? != 0 {
        return Err("a FETCH_ADD to a QP without REMOTE_ATOMIC changed memory".into());
    }
    Ok(())
}

fn read_no_qp_permission(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, c.peer_psn)
        .reth(c.mr.addr, c.mr.rkey, 16);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        &[NakCode::InvalidRequest, NakCode::RemoteAccessError],
        c.peer_psn,
        "a READ to a QP without REMOTE_READ",
    )
}

fn read_multi_packet(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let m = c.mtu as usize;
    let data = pattern(0x19, 2500);
    ctx.fill_mr(&c, 0, &data)?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, e)
        .reth(c.mr.addr, c.mr.rkey, 2500);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    let want = [
        (Opcode::RC_RDMA_READ_RESPONSE_FIRST, e, &data[..m], true),
        (
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            e.add(1),
            &data[m..2 * m],
            false,
        ),
        (
            Opcode::RC_RDMA_READ_RESPONSE_LAST,
            e.add(2),
            &data[2 * m..],
            true,
        ),
    ];
    let matches = |p: &Pkt, w: &(Opcode, Psn, &[u8], bool)| {
        p.opcode() == w.0 && p.psn() == w.1 && p.payload == w.2 && p.ext.aeth.is_some() == w.3
    };
    if got.len() != 3 || !got.iter().zip(want.iter()).all(|(p, w)| matches(p, w)) {
        return Err(format!(
            "a 2500-byte READ at {}: expected FIRST 1024B (AETH), MIDDLE 1024B, LAST 452B (AETH) at consecutive PSNs, got {}",
            psn_text(e),
            describe(&got)
        ));
    }
    let next = ctx
        .req(&c, Opcode::RC_SEND_ONLY, e.add(3))
        .payload(&pattern(0x1a, 8))
        .ack_req(true);
    ctx.peer.send(&next)?;
    ctx.peer
        .expect_ack(e.add(3), "a SEND at the PSN after the READ's three")?;
    let w = ctx.wcs(&c, 1)?;
    if w.len() != 1 || !w[0].is_success() {
        return Err(format!("expected one receive, got {}", wcs_text(&w)));
    }
    Ok(())
}
