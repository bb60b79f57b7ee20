//! RDMA access at the responder (IBTA Vol. 1 9.7.4.1.5 in 1.5, C9-88), the requester's side
//! of NAKs and read responses (9.7.5.2.4 in 1.5; 10.10.x unverified), RNR (Table 45), ACKs and
//! the MSN (9.7.5.1.2, C9-148), UD's Q_Key (10.2.4, unverified). Citations: `crate::cite`.
use crate::agent::{SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::{describe, Pkt};
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::types::RNR_TIMER_MICROS;
use rocemu_wire::{NakCode, Opcode, Psn, QKey, RKey, Syndrome};
use std::time::Duration;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "rdma.write.bad-rkey-nak",
        title: "An RDMA WRITE with an R_Key no MR has is NAKed remote access error; memory untouched; QP to ERR",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::RKEY_CHECKS, cite::ERROR_CLASSES],
        run: write_bad_rkey,
    },
    Scenario {
        id: "rdma.write.out-of-bounds-nak",
        title: "An RDMA WRITE that ends 4 bytes past the MR is NAKed remote access error",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::RKEY_CHECKS],
        run: write_oob,
    },
    Scenario {
        id: "rdma.write.mr-without-remote-write-nak",
        title: "An RDMA WRITE to an MR registered without REMOTE_WRITE is NAKed remote access error",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::MR_ACCESS],
        run: write_no_mr_permission,
    },
    Scenario {
        id: "rdma.read.bad-rkey-nak",
        title: "An RDMA READ with a wrong R_Key is NAKed remote access error, no data returned",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::RKEY_CHECKS],
        run: read_bad_rkey,
    },
    Scenario {
        id: "rdma.read.out-of-bounds-nak",
        title: "An RDMA READ running 8 bytes past the MR is NAKed remote access error",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::RKEY_CHECKS],
        run: read_oob,
    },
    Scenario {
        id: "rdma.write.zero-length-acked",
        title: "A zero-length RDMA WRITE with R_Key 0 and VA 0 is ACKed: nothing to check, nothing written",
        cites: &[cite::ZERO_LENGTH_C9_88],
        run: write_zero_length,
    },
    Scenario {
        id: "rdma.atomic.misaligned-nak",
        title: "A FETCH_ADD at an address that is not 8-byte aligned is NAKed invalid request; memory untouched",
        cites: &[cite::ATOMIC_ALIGN, cite::ATOMIC_ETH, cite::ATOMICS],
        run: atomic_misaligned,
    },
    Scenario {
        id: "rdma.requester.nak-rem-access-completes-error",
        title: "The device's WRITE NAKed remote access error completes IBV_WC_REM_ACCESS_ERR and moves its QP to ERR",
        cites: &[cite::REMOTE_ACCESS_NAK, cite::ERROR_CLASSES, cite::COMPLETION_STATUS],
        run: requester_rem_access,
    },
    Scenario {
        id: "rdma.read.requester-multi-packet",
        title: "The device's 2 KiB READ: one request for 2048 bytes; FIRST and LAST responses land in order and complete it",
        cites: &[cite::READ_RETRY, cite::RESPONSE_PSNS],
        run: read_requester,
    },
    Scenario {
        id: "rdma.read.partial-retry",
        title: "A READ response MIDDLE lost: the device asks again from the missing PSN with the VA and length advanced",
        cites: &[cite::READ_RETRY, cite::IMPLIED_NAK, cite::BAD_RESPONSE],
        run: read_partial_retry,
    },
    Scenario {
        id: "rnr.responder.nak-with-min-rnr-timer",
        title: "A SEND with no receive posted gets an RNR NAK carrying the QP's min_rnr_timer (14); posted, the retry is ACKed",
        cites: &[cite::RNR_TIMER_TABLE, cite::AETH, cite::RNR_NAK],
        run: rnr_responder,
    },
    Scenario {
        id: "rnr.requester.waits-timer",
        title: "RNR-NAKed, the device sends the SEND again no sooner than the timer asks (code 14: 1.28 ms)",
        cites: &[cite::RNR_TIMER_TABLE, cite::RNR_NAK],
        run: rnr_requester,
    },
    Scenario {
        id: "ack.msn.counts-messages",
        title: "Three SENDs, AckReq on the last: the ACK of the last PSN carries MSN 3; no ACK names a later PSN",
        cites: &[cite::COALESCED_ACK, cite::MSN_C9_148, cite::MSN_SECTION],
        run: ack_msn,
    },
    Scenario {
        id: "ud.qkey.mismatch-silent-drop",
        title: "A UD SEND with the wrong Q_Key is dropped silently; with the right one it is delivered with its source QP",
        cites: &[cite::DETH, cite::QKEY, cite::HDR_VALIDATION],
        run: ud_qkey,
    },
];

/// Exactly one NAK with `code` at `psn` among what comes within the settle time.
fn expect_one_nak(
    ctx: &mut Ctx<'_>,
    code: NakCode,
    psn: Psn,
    what: &str,
) -> Result<Vec<Pkt>, String> {
    let got = ctx.peer.collect(None);
    let hits = got
        .iter()
        .filter(|p| p.is_nak(code) && p.psn() == psn)
        .count();
    if hits != 1 || got.len() != 1 {
        return Err(format!(
            "{what}: expected exactly one NAK {code:?} at PSN {}, got {}",
            psn_text(psn),
            describe(&got)
        ));
    }
    Ok(got)
}

fn write_req(ctx: &Ctx<'_>, c: &Conn, va: u64, rkey: RKey, data: &[u8]) -> crate::peer::Craft {
    ctx.req(c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(va, rkey, data.len() as u32)
        .payload(data)
        .ack_req(true)
}

/// A WRITE the device must refuse with a remote access error, leaving memory as it was.
fn write_refused(ctx: &mut Ctx<'_>, c: &Conn, va: u64, rkey: RKey, what: &str) -> Outcome {
    ctx.fill_mr(c, 0, &[0x5a; 64])?;
    let data = pattern(0x77, 8);
    let r = write_req(ctx, c, va, rkey, &data);
    ctx.peer.send(&r)?;
    expect_one_nak(ctx, NakCode::RemoteAccessError, c.peer_psn, what)?;
    let mem = ctx.mr_bytes(c, 0, 64)?;
    if mem.iter().any(|b| *b != 0x5a) {
        return Err(format!("{what}: the MR's memory changed"));
    }
    ctx.expect_state(c, QpState::Err, what)
}

fn write_bad_rkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let bad = RKey(c.mr.rkey.0 ^ 0x0100_0080);
    write_refused(ctx, &c, c.mr.addr, bad, "a WRITE with an unknown R_Key")
}

fn write_oob(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let va = c.mr.addr + c.mr.length - 4;
    write_refused(
        ctx,
        &c,
        va,
        c.mr.rkey,
        "an 8-byte WRITE at the MR's last 4 bytes",
    )
}

fn write_no_mr_permission(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        mr_access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..Default::default()
    })?;
    write_refused(
        ctx,
        &c,
        c.mr.addr,
        c.mr.rkey,
        "a WRITE to an MR without REMOTE_WRITE",
    )
}

fn read_refused(ctx: &mut Ctx<'_>, c: &Conn, va: u64, rkey: RKey, len: u32, what: &str) -> Outcome {
    let r = ctx
        .req(c, Opcode::RC_RDMA_READ_REQUEST, c.peer_psn)
        .reth(va, rkey, len);
    ctx.peer.send(&r)?;
    expect_one_nak(ctx, NakCode::RemoteAccessError, c.peer_psn, what)?;
    Ok(())
}

fn read_bad_rkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let bad = RKey(c.mr.rkey.0 ^ 0x0100_0080);
    read_refused(ctx, &c, c.mr.addr, bad, 16, "a READ with an unknown R_Key")
}

fn read_oob(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let va = c.mr.addr + c.mr.length - 8;
    read_refused(
        ctx,
        &c,
        va,
        c.mr.rkey,
        16,
        "a 16-byte READ at the MR's last 8 bytes",
    )
}

fn write_zero_length(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let r = write_req(ctx, &c, 0, RKey(0), &[]);
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "a zero-length WRITE with R_Key 0")?;
    ctx.expect_state(&c, QpState::Rts, "a zero-length WRITE")
}

fn atomic_misaligned(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &[0; 16])?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, c.peer_psn)
        .atomic(c.mr.addr + 4, c.mr.rkey, 1, 0);
    ctx.peer.send(&r)?;
    expect_one_nak(
        ctx,
        NakCode::InvalidRequest,
        c.peer_psn,
        "a FETCH_ADD at VA+4",
    )?;
    if ctx.mr_bytes(&c, 0, 16)?.iter().any(|b| *b != 0) {
        return Err("a misaligned FETCH_ADD changed memory".into());
    }
    Ok(())
}

/// The device sends `wr` and the peer receives its packets.
fn device_sends(ctx: &mut Ctx<'_>, c: &Conn, wr: SendWr) -> Result<Vec<Pkt>, String> {
    ctx.agent.post_send(c.qpn, wr)?;
    Ok(ctx.peer.collect(None))
}

fn sge(c: &Conn, offset: u64, length: u32) -> Vec<Sge> {
    vec![Sge {
        addr: c.mr.addr + offset,
        length,
        lkey: c.mr.lkey,
    }]
}

fn requester_rem_access(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    ctx.fill_mr(&c, 0, &pattern(0x42, 16))?;
    let mut wr = SendWr::new(9, SendOpcode::RdmaWrite, sge(&c, 0, 16));
    wr.remote_addr = 0x7000_0000;
    wr.rkey = RKey(0xdead);
    let got = device_sends(ctx, &c, wr)?;
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_WRITE_ONLY
            && p.psn() == c.dut_psn
            && p.bth.dqpn == c.peer_qpn
            && p.ext.reth.is_some_and(|r| r.va == 0x7000_0000 && r.rkey == RKey(0xdead) && r.dma_len == 16)
            && p.payload == pattern(0x42, 16) => {}
        _ => {
            return Err(format!(
                "expected one RDMA_WRITE_ONLY psn={} to QP {} with RETH va=0x70000000 rkey=0xdead len=16 and the MR's bytes, got {}",
                psn_text(c.dut_psn),
                c.peer_qpn,
                describe(&got)
            ))
        }
    }
    let nak = ctx
        .peer
        .craft(Opcode::RC_ACKNOWLEDGE, c.qpn, c.dut_psn)
        .aeth(Syndrome::nak(NakCode::RemoteAccessError), 0);
    ctx.peer.send(&nak)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_REM_ACCESS_ERR",
        None,
        "a NAK remote access error of the WRITE",
    )?;
    if wc.wr_id != 9 {
        return Err(format!(
            "the error completion is for wr_id {}, expected 9",
            wc.wr_id
        ));
    }
    ctx.expect_state(&c, QpState::Err, "a NAK remote access error")
}

fn read_response(
    ctx: &Ctx<'_>,
    c: &Conn,
    op: Opcode,
    psn: Psn,
    data: &[u8],
    msn: Option<u32>,
) -> crate::peer::Craft {
    let r = ctx.peer.craft(op, c.qpn, psn).payload(data);
    match msn {
        Some(m) => r.aeth(Syndrome::ack(Syndrome::CREDITS_INVALID), m),
        None => r,
    }
}

fn read_requester(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let (va, rkey, len) = (0x6000_0000u64, RKey(0x77), 2 * c.mtu);
    let mut wr = SendWr::new(11, SendOpcode::RdmaRead, sge(&c, 0, len));
    wr.remote_addr = va;
    wr.rkey = rkey;
    let got = device_sends(ctx, &c, wr)?;
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_READ_REQUEST
            && p.psn() == c.dut_psn
            && p.ext
                .reth
                .is_some_and(|r| r.va == va && r.rkey == rkey && r.dma_len == len) => {}
        _ => {
            return Err(format!(
                "expected one RDMA_READ_REQUEST psn={} RETH va=0x{va:x} len={len}, got {}",
                psn_text(c.dut_psn),
                describe(&got)
            ))
        }
    }
    let data = pattern(0x99, len as usize);
    let m = c.mtu as usize;
    let first = read_response(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        c.dut_psn,
        &data[..m],
        Some(0),
    );
    let last = read_response(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        c.dut_psn.add(1),
        &data[m..],
        Some(1),
    );
    ctx.peer.send(&first)?;
    ctx.peer.send(&last)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RDMA_READ"),
        "READ responses FIRST and LAST",
    )?;
    if wc.wr_id != 11 {
        return Err(format!("completion for wr_id {}, expected 11", wc.wr_id));
    }
    if ctx.mr_bytes(&c, 0, len as u64)? != data {
        return Err(
            "the READ completed but the local buffer does not hold the response's bytes".into(),
        );
    }
    Ok(())
}

fn read_partial_retry(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let m = c.mtu;
    let (va, rkey, len) = (0x6100_0000u64, RKey(0x78), 3 * m);
    let mut wr = SendWr::new(12, SendOpcode::RdmaRead, sge(&c, 0, len));
    wr.remote_addr = va;
    wr.rkey = rkey;
    let got = device_sends(ctx, &c, wr)?;
    if got.len() != 1 || got[0].opcode() != Opcode::RC_RDMA_READ_REQUEST {
        return Err(format!(
            "expected one RDMA_READ_REQUEST, got {}",
            describe(&got)
        ));
    }
    let p = c.dut_psn;
    let data = pattern(0x3c, len as usize);
    let mu = m as usize;
    // FIRST arrives, MIDDLE is "lost", LAST arrives out of sequence.
    let first = read_response(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        p,
        &data[..mu],
        Some(0),
    );
    let last = read_response(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        p.add(2),
        &data[2 * mu..],
        Some(1),
    );
    ctx.peer.send(&first)?;
    ctx.peer.send(&last)?;
    // The retry may wait for the local ACK timeout (code 18: about 1.07 s): listen long enough.
    let mut got = Vec::new();
    while let Some(x) = ctx.peer.recv(Duration::from_millis(1500)) {
        let is_req = x.opcode() == Opcode::RC_RDMA_READ_REQUEST;
        got.push(x);
        if is_req || got.len() > 16 {
            break;
        }
    }
    let want_va = va + m as u64;
    let retry = got
        .last()
        .filter(|x| x.opcode() == Opcode::RC_RDMA_READ_REQUEST);
    match retry {
        Some(r)
            if r.psn() == p.add(1)
                && r.ext
                    .reth
                    .is_some_and(|e| e.va == want_va && e.rkey == rkey && e.dma_len == 2 * m) => {}
        _ => {
            return Err(format!(
                "expected a new RDMA_READ_REQUEST psn={} RETH va=0x{want_va:x} len={}, got {}",
                psn_text(p.add(1)),
                2 * m,
                describe(&got)
            ))
        }
    }
    let mid = read_response(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        p.add(1),
        &data[mu..2 * mu],
        Some(0),
    );
    ctx.peer.send(&mid)?;
    ctx.peer.send(&last)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RDMA_READ"),
        "the retried READ's responses",
    )?;
    if wc.wr_id != 12 {
        return Err(format!("completion for wr_id {}, expected 12", wc.wr_id));
    }
    if ctx.mr_bytes(&c, 0, len as u64)? != data {
        return Err(
            "the retried READ completed but the buffer does not hold the 3 KiB in order".into(),
        );
    }
    Ok(())
}

fn rnr_responder(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        min_rnr_timer: 14,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(8, 16))
        .ack_req(true);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.psn() == c.peer_psn && p.rnr_timer() == Some(14) => {}
        _ => {
            return Err(format!(
                "a SEND with no receive posted: expected one RNR NAK timer=14 at PSN {}, got {}",
                psn_text(c.peer_psn),
                describe(&got)
            ))
        }
    }
    ctx.expect_state(&c, QpState::Rts, "an RNR NAK (not an error)")?;
    ctx.post_recv(&c, 77, 0, 64)?;
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "the SEND again, a receive posted")?;
    ctx.expect_wc(&c, "IBV_WC_SUCCESS", Some("IBV_WC_RECV"), "the SEND again")?;
    Ok(())
}

fn rnr_requester(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let wr = SendWr::new(21, SendOpcode::Send, sge(&c, 0, 16));
    let got = device_sends(ctx, &c, wr)?;
    if got.len() != 1 || got[0].opcode() != Opcode::RC_SEND_ONLY || got[0].psn() != c.dut_psn {
        return Err(format!(
            "expected one RC_SEND_ONLY at PSN {}, got {}",
            psn_text(c.dut_psn),
            describe(&got)
        ));
    }
    let timer = 14u8;
    let nak = ctx
        .peer
        .craft(Opcode::RC_ACKNOWLEDGE, c.qpn, c.dut_psn)
        .aeth(Syndrome::rnr_nak(timer), 0);
    ctx.peer.send(&nak)?;
    let sent_at = ctx.peer.capture.last().map(|x| x.0).unwrap_or_default();
    let again = ctx.peer.recv(Duration::from_millis(200));
    let min = Duration::from_micros(RNR_TIMER_MICROS[timer as usize] as u64);
    match again {
        Some(p) if p.opcode() == Opcode::RC_SEND_ONLY && p.psn() == c.dut_psn => {
            if p.at.saturating_sub(sent_at) < min {
                return Err(format!(
                    "the SEND came again {} µs after the RNR NAK; timer {timer} asks for {} µs",
                    p.at.saturating_sub(sent_at).as_micros(),
                    min.as_micros()
                ));
            }
        }
        other => {
            return Err(format!(
                "expected the RC_SEND_ONLY at PSN {} again after the RNR NAK, got {}",
                psn_text(c.dut_psn),
                other
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "nothing within 200 ms".into())
            ))
        }
    }
    let ack = ctx
        .peer
        .craft(Opcode::RC_ACKNOWLEDGE, c.qpn, c.dut_psn)
        .aeth(Syndrome::ack(Syndrome::CREDITS_INVALID), 1);
    ctx.peer.send(&ack)?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the ACK of the retried SEND",
    )?;
    Ok(())
}

fn ack_msn(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 3,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    for k in 0..3 {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, e.add(k))
            .payload(&pattern(k as u8, 8))
            .ack_req(k == 2);
        ctx.peer.send(&r)?;
    }
    let got = ctx.peer.collect(None);
    let acks: Vec<&Pkt> = got.iter().filter(|p| p.is_ack()).collect();
    let last_ok = acks
        .last()
        .is_some_and(|p| p.psn() == e.add(2) && p.msn() == Some(3));
    // Any ACK the device adds of its own must be consistent: message k complete at PSN e+k.
    let each_ok = acks
        .iter()
        .all(|p| p.msn() == Some(p.psn().diff(e) as u32 + 1));
    if !last_ok || !each_ok || acks.len() != got.len() {
        return Err(format!(
            "three SENDs from {}: expected ACKs whose MSN counts the messages, the last at {} with MSN 3, got {}",
            psn_text(e),
            psn_text(e.add(2)),
            describe(&got)
        ));
    }
    let w = ctx.wcs(&c, 3)?;
    if w.len() != 3 {
        return Err(format!("expected three receives, got {}", wcs_text(&w)));
    }
    Ok(())
}

fn ud_qkey(ctx: &mut Ctx<'_>) -> Outcome {
    let qkey = QKey(0x1111_1111);
    let c = ctx.connect(ConnOpts {
        qp_type: QpType::Ud,
        qkey,
        recvs: 1,
        recv_len: 1024,
        ..Default::default()
    })?;
    let data = pattern(0x0d, 32);
    let send = |ctx: &Ctx<'_>, k: QKey| {
        ctx.req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x42))
            .deth(k, c.peer_qpn)
            .payload(&data)
    };
    ctx.peer.send(&send(ctx, QKey(0x2222_2222)))?;
    ctx.peer.expect_silence("a UD SEND with the wrong Q_Key")?;
    ctx.expect_no_wc(&c, "a UD SEND with the wrong Q_Key")?;
    ctx.peer.send(&send(ctx, qkey))?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a UD SEND with the right Q_Key",
    )?;
    // A UD receive starts with the 40-byte GRH area (IBTA 11.4.1.2, Annex A17.4.5.2).
    if wc.byte_len != 40 + 32 || wc.src_qp != c.peer_qpn {
        return Err(format!(
            "expected byte_len 72 (GRH + 32) from src_qp {}, got byte_len {} from src_qp {}",
            c.peer_qpn, wc.byte_len, wc.src_qp
        ));
    }
    Ok(())
}
