//! More of RC (issue 20, item 2): at the responder, zero-length messages (C9-88), a WRITE without
//! immediate (C10-87), the MR's atomic right, requests to QPs not ready for them, the RNR timer
//! code 0, the MSN of READs and duplicates (C9-148), an ONLY over the path MTU (C9-92); at the
//! requester, ghost ACKs and the NAK codes. Citations: `crate::cite`.
use crate::agent::{ModifyQp, SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState};
use rocemu_wire::{NakCode, Opcode, Psn, RKey, Syndrome};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "rdma.send.zero-length-delivered",
        title: "A SEND ONLY with no payload is ACKed and completes a receive IBV_WC_RECV with byte_len 0",
        cites: &[cite::SEND_ZERO, cite::POLL_CQ],
        run: send_zero_length,
    },
    Scenario {
        id: "rdma.read.zero-length-acked",
        title: "A zero-length RDMA READ with R_Key 0 and VA 0 gets a READ RESPONSE ONLY without payload: nothing to check",
        cites: &[cite::ZERO_LENGTH_C9_88, cite::READ_RESPONSES],
        run: read_zero_length,
    },
    Scenario {
        id: "rdma.write-imm.zero-length-completes",
        title: "A zero-length RDMA WRITE with immediate and R_Key 0 is ACKed and completes a receive with the immediate, byte_len 0",
        cites: &[cite::ZERO_LENGTH_C9_88, cite::WRITE_NO_IMM_C10_87, cite::IMMDT],
        run: write_imm_zero_length,
    },
    Scenario {
        id: "rdma.write.no-imm-consumes-no-receive",
        title: "An RDMA WRITE without immediate consumes no receive: the SEND after it lands in the first receive posted",
        cites: &[cite::WRITE_NO_IMM_C10_87],
        run: write_consumes_no_receive,
    },
    Scenario {
        id: "rdma.atomic.mr-without-remote-atomic-nak",
        title: "A FETCH_ADD to an MR registered without REMOTE_ATOMIC is NAKed remote access error; memory untouched",
        cites: &[cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK, cite::MR_ACCESS],
        run: atomic_no_mr_permission,
    },
    Scenario {
        id: "qp.state.reset-drops-requests",
        title: "A SEND to a QP in RESET is dropped silently; brought up later, the QP expects that PSN anew",
        cites: &[cite::QP_STATES],
        run: reset_drops,
    },
    Scenario {
        id: "qp.state.init-drops-requests",
        title: "A SEND to a QP in INIT is dropped silently, its receive untouched; brought up later, the QP expects that PSN anew",
        cites: &[cite::QP_STATES],
        run: init_drops,
    },
    Scenario {
        id: "qp.state.rtr-accepts-requests",
        title: "A QP in RTR (not yet RTS) takes a SEND: ACKed, delivered",
        cites: &[cite::QP_STATES, cite::MODIFY_QP],
        run: rtr_accepts,
    },
    Scenario {
        id: "qp.state.err-drops-requests",
        title: "A SEND to a QP moved to ERR gets no answer and delivers nothing",
        cites: &[cite::QP_STATES, cite::ERROR_CLASSES],
        run: err_drops,
    },
    Scenario {
        id: "rnr.responder.timer-code-0",
        title: "min_rnr_timer 0: a SEND with no receive posted gets an RNR NAK with timer code 0 (655.36 ms), not some other code",
        cites: &[cite::RNR_TIMER_TABLE, cite::AETH, cite::RNR_NAK],
        run: rnr_timer_zero,
    },
    Scenario {
        id: "ack.msn.read-counts",
        title: "A READ's response carries MSN 1; the SEND after it is ACKed with MSN 2",
        cites: &[cite::MSN_C9_148, cite::AETH, cite::MSN_SECTION],
        run: msn_read,
    },
    Scenario {
        id: "ack.msn.duplicate-not-counted",
        title: "Two SENDs (MSN 2), then the first again: its ACK carries MSN 2; the third SEND gets MSN 3",
        cites: &[cite::MSN_C9_148, cite::DUP_C9_105, cite::MSN_SECTION],
        run: msn_duplicate,
    },
    Scenario {
        id: "seq.send.only-over-mtu-nak",
        title: "A SEND ONLY of the path MTU + 4 bytes is NAKed invalid request and delivers nothing",
        cites: &[cite::LENGTH_VALIDATION, cite::LENGTH_C9_92],
        run: only_over_mtu,
    },
    Scenario {
        id: "rdma.requester.ghost-ack-ignored",
        title: "An ACK of an already acknowledged PSN, with a new SEND outstanding, completes nothing; the SEND's own ACK does",
        cites: &[cite::GHOST_RESPONSE, cite::COALESCED_ACK],
        run: ghost_ack_old,
    },
    Scenario {
        id: "rdma.requester.ack-ahead-ignored",
        title: "An ACK for a PSN 256 past anything sent completes nothing; the SEND's own ACK does",
        cites: &[cite::GHOST_RESPONSE, cite::PSN_MODULO],
        run: ghost_ack_ahead,
    },
    Scenario {
        id: "rdma.requester.nak-inv-req-completes-error",
        title: "The device's WRITE NAKed invalid request completes IBV_WC_REM_INV_REQ_ERR and moves its QP to ERR",
        cites: &[cite::AETH, cite::ERROR_CLASSES, cite::COMPLETION_STATUS],
        run: nak_inv_req,
    },
    Scenario {
        id: "rdma.requester.nak-rem-op-completes-error",
        title: "The device's WRITE NAKed remote operational error completes IBV_WC_REM_OP_ERR and moves its QP to ERR",
        cites: &[cite::AETH, cite::ERROR_CLASSES, cite::COMPLETION_STATUS],
        run: nak_rem_op,
    },
    Scenario {
        id: "rdma.requester.nak-reserved-code-completes-error",
        title: "A NAK with the reserved code 0x1f completes the WRITE with an error status (never success) and moves the QP to ERR",
        cites: &[cite::AETH, cite::ERROR_CLASSES],
        run: nak_reserved,
    },
];

fn send_zero_length(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let r = ctx.req(&c, Opcode::RC_SEND_ONLY, c.peer_psn).ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "a SEND_ONLY without payload")?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a zero-length SEND",
    )?;
    if wc.byte_len != 0 || wc.wr_id != 1000 {
        return Err(format!(
            "a zero-length SEND: expected receive 1000 with byte_len 0, got {wc}"
        ));
    }
    Ok(())
}

fn read_zero_length(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, c.peer_psn)
        .reth(0, RKey(0), 0);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY
            && p.psn() == c.peer_psn
            && p.payload.is_empty()
            && p.syndrome().is_some_and(|s| s.is_ack()) => {}
        _ => {
            return Err(format!(
                "a zero-length READ with R_Key 0: expected one RDMA_READ_RESPONSE_ONLY at {} without payload (AETH ACK), got {}",
                psn_text(c.peer_psn),
                describe(&got)
            ))
        }
    }
    ctx.expect_state(&c, QpState::Rts, "a zero-length READ")
}

fn write_imm_zero_length(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, c.peer_psn)
        .reth(0, RKey(0), 0)
        .imm(0xabcd_0001)
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_ack(
        c.peer_psn,
        "a zero-length RDMA_WRITE_ONLY_WITH_IMMEDIATE with R_Key 0",
    )?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV_RDMA_WITH_IMM"),
        "a zero-length WRITE with immediate",
    )?;
    if wc.imm_data != Some(0xabcd_0001) || wc.byte_len != 0 {
        return Err(format!(
            "expected imm_data 0xabcd0001 and byte_len 0, got {:?} and {}",
            wc.imm_data.map(|i| format!("0x{i:08x}")),
            wc.byte_len
        ));
    }
    Ok(())
}

fn write_consumes_no_receive(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 2,
        recv_len: 64,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, e)
        .reth(c.mr.addr + 1024, c.mr.rkey, 16)
        .payload(&pattern(0x21, 16))
        .ack_req(true);
    ctx.peer.send(&w)?;
    ctx.peer.expect_ack(e, "an RDMA_WRITE_ONLY")?;
    let s = ctx
        .req(&c, Opcode::RC_SEND_ONLY, e.add(1))
        .payload(&pattern(0x22, 8))
        .ack_req(true);
    ctx.peer.send(&s)?;
    ctx.peer
        .expect_ack(e.add(1), "the SEND_ONLY after the WRITE")?;
    let w = ctx.wcs(&c, 1)?;
    match w.as_slice() {
        [x] if x.is_success() && x.wr_id == 1000 && x.opcode == "IBV_WC_RECV" && x.byte_len == 8 => {
            Ok(())
        }
        _ => Err(format!(
            "a WRITE without immediate, then an 8-byte SEND: expected one completion, receive 1000 IBV_WC_RECV byte_len 8, got {}",
            wcs_text(&w)
        )),
    }
}

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

fn atomic_no_mr_permission(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        mr_access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        ..Default::default()
    })?;
    ctx.fill_mr(&c, 0, &5u64.to_le_bytes())?;
    let r = ctx
        .req(&c, Opcode::RC_FETCH_ADD, c.peer_psn)
        .atomic(c.mr.addr, c.mr.rkey, 1, 0);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        NakCode::RemoteAccessError,
        c.peer_psn,
        "a FETCH_ADD to an MR without REMOTE_ATOMIC",
    )?;
    if ctx.mr_bytes(&c, 0, 8)? != 5u64.to_le_bytes() {
        return Err("a FETCH_ADD to an MR without REMOTE_ATOMIC changed memory".into());
    }
    Ok(())
}

/// A SEND sent while the QP is in `state` gets no answer and no completion; brought up to RTS,
/// the QP still expects that PSN: another SEND there is ACKed and its bytes are delivered.
fn dropped_before_rtr(ctx: &mut Ctx<'_>, state: QpState) -> Outcome {
    let o = ConnOpts {
        recvs: 1,
        recv_len: 64,
        stop_at: state,
        ..Default::default()
    };
    let c = ctx.connect(o)?;
    let name = crate::agent::qp_state_name(state).to_uppercase();
    let early = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x31, 16))
        .ack_req(true);
    ctx.peer.send(&early)?;
    ctx.peer
        .expect_silence(&format!("a SEND to a QP in {name}"))?;
    ctx.expect_no_wc(&c, &format!("a SEND to a QP in {name}"))?;
    ctx.expect_state(&c, state, &format!("a SEND to a QP in {name}"))?;
    let up = ConnOpts {
        stop_at: QpState::Rts,
        ..o
    };
    if state == QpState::Reset {
        ctx.bring_up(&c, &up)?;
    } else {
        ctx.init_to(&c, &up)?;
    }
    let late = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x32, 16))
        .ack_req(true);
    ctx.peer.send(&late)?;
    ctx.peer.expect_ack(
        c.peer_psn,
        &format!("after RTS, a SEND at the PSN the one sent in {name} had"),
    )?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "the SEND after RTS",
    )?;
    if wc.byte_len != 16 || ctx.mr_bytes(&c, 0, 16)? != pattern(0x32, 16) {
        return Err(format!(
            "the receive holds something else than the SEND sent after RTS ({wc}): the one sent in {name} was kept"
        ));
    }
    Ok(())
}

fn reset_drops(ctx: &mut Ctx<'_>) -> Outcome {
    dropped_before_rtr(ctx, QpState::Reset)
}

fn init_drops(ctx: &mut Ctx<'_>) -> Outcome {
    dropped_before_rtr(ctx, QpState::Init)
}

fn rtr_accepts(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        stop_at: QpState::Rtr,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x33, 8))
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_ack(c.peer_psn, "a SEND to a QP in RTR")?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a SEND to a QP in RTR",
    )?;
    Ok(())
}

fn err_drops(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Err),
            ..Default::default()
        },
    )?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x34, 8))
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_silence("a SEND to a QP in ERR")?;
    ctx.expect_no_wc(&c, "a SEND to a QP in ERR")?;
    ctx.expect_state(&c, QpState::Err, "a SEND to a QP in ERR")
}

fn rnr_timer_zero(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        min_rnr_timer: 0,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x35, 8))
        .ack_req(true);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.psn() == c.peer_psn && p.rnr_timer() == Some(0) => Ok(()),
        _ => Err(format!(
            "min_rnr_timer 0, no receive posted: expected one RNR NAK timer=0 at PSN {}, got {}",
            psn_text(c.peer_psn),
            describe(&got)
        )),
    }
}

fn msn_read(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let r = ctx
        .req(&c, Opcode::RC_RDMA_READ_REQUEST, e)
        .reth(c.mr.addr, c.mr.rkey, 16);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY
            && p.psn() == e
            && p.msn() == Some(1) => {}
        _ => {
            return Err(format!(
                "a 16-byte READ as the first message: expected one RDMA_READ_RESPONSE_ONLY at {} with MSN 1, got {}",
                psn_text(e),
                describe(&got)
            ))
        }
    }
    let s = ctx
        .req(&c, Opcode::RC_SEND_ONLY, e.add(1))
        .payload(&pattern(0x36, 8))
        .ack_req(true);
    ctx.peer.send(&s)?;
    let p = ctx.peer.expect_ack(e.add(1), "the SEND after the READ")?;
    if p.msn() != Some(2) {
        return Err(format!(
            "the SEND after a READ: expected its ACK with MSN 2, got {p}"
        ));
    }
    Ok(())
}

fn msn_duplicate(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 3,
        ..Default::default()
    })?;
    let e = c.peer_psn;
    let send = |ctx: &Ctx<'_>, k: u32| {
        ctx.req(&c, Opcode::RC_SEND_ONLY, e.add(k))
            .payload(&pattern(0x40 + k as u8, 8))
            .ack_req(true)
    };
    for k in 0..2 {
        ctx.peer.send(&send(ctx, k))?;
        let p = ctx.peer.expect_ack(e.add(k), "a SEND_ONLY")?;
        if p.msn() != Some(k + 1) {
            return Err(format!(
                "SEND {} of the connection: expected MSN {}, got {p}",
                k + 1,
                k + 1
            ));
        }
    }
    ctx.peer.send(&send(ctx, 0))?;
    // The duplicate's ACK may name its own PSN or the latest (rxe ACKs the latest): either way
    // the MSN counts two messages.
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.is_ack() && (p.psn() == e || p.psn() == e.add(1)) && p.msn() == Some(2) => {}
        _ => {
            return Err(format!(
            "the first SEND again (a duplicate): expected one ACK at {} or {} with MSN 2, got {}",
            psn_text(e),
            psn_text(e.add(1)),
            describe(&got)
        ))
        }
    }
    ctx.peer.send(&send(ctx, 2))?;
    let p = ctx.peer.expect_ack(e.add(2), "the third SEND")?;
    if p.msn() != Some(3) {
        return Err(format!(
            "the third SEND after a duplicate: expected MSN 3, got {p}"
        ));
    }
    let w = ctx.wcs(&c, 3)?;
    if w.len() != 3 {
        return Err(format!("expected three receives, got {}", wcs_text(&w)));
    }
    Ok(())
}

fn only_over_mtu(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x37, c.mtu as usize + 4))
        .ack_req(true);
    ctx.peer.send(&r)?;
    one_nak(
        ctx,
        NakCode::InvalidRequest,
        c.peer_psn,
        "a SEND_ONLY of the path MTU + 4 bytes",
    )?;
    let w = ctx.wcs(&c, 0)?;
    if w.iter().any(|x| x.is_success()) {
        return Err(format!(
            "a SEND_ONLY longer than the path MTU was delivered: {}",
            wcs_text(&w)
        ));
    }
    Ok(())
}

fn sge(c: &Conn, offset: u64, length: u32) -> Vec<Sge> {
    vec![Sge {
        addr: c.mr.addr + offset,
        length,
        lkey: c.mr.lkey,
    }]
}

const ACK: Syndrome = Syndrome::ack(Syndrome::CREDITS_INVALID);

/// The device sends one 8-byte SEND (wr_id `id`), which must come at `psn`.
fn one_send(ctx: &mut Ctx<'_>, c: &Conn, id: u64, psn: Psn) -> Outcome {
    ctx.agent
        .post_send(c.qpn, SendWr::new(id, SendOpcode::Send, sge(c, 8 * id, 8)))?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_SEND_ONLY && p.psn() == psn => Ok(()),
        _ => Err(format!(
            "expected one RC_SEND_ONLY at {}, got {}",
            psn_text(psn),
            describe(&got)
        )),
    }
}

fn ack_at(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, msn: u32) -> Outcome {
    let a = ctx.req(c, Opcode::RC_ACKNOWLEDGE, psn).aeth(ACK, msn);
    ctx.peer.send(&a)
}

fn ghost_ack_old(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let p = c.dut_psn;
    one_send(ctx, &c, 1, p)?;
    ack_at(ctx, &c, p, 1)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the first SEND's ACK",
    )?;
    if wc.wr_id != 1 {
        return Err(format!("completion for wr_id {}, expected 1", wc.wr_id));
    }
    one_send(ctx, &c, 2, p.add(1))?;
    ack_at(ctx, &c, p, 1)?;
    ctx.expect_no_wc(
        &c,
        &format!(
            "the ACK of {} again, with the SEND at {} outstanding",
            psn_text(p),
            psn_text(p.add(1))
        ),
    )?;
    ack_at(ctx, &c, p.add(1), 2)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the second SEND's ACK",
    )?;
    if wc.wr_id != 2 {
        return Err(format!("completion for wr_id {}, expected 2", wc.wr_id));
    }
    Ok(())
}

fn ghost_ack_ahead(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let p = c.dut_psn;
    one_send(ctx, &c, 1, p)?;
    ack_at(ctx, &c, p.add(256), 1)?;
    ctx.expect_no_wc(
        &c,
        &format!(
            "an ACK of {}, 256 past the only PSN sent ({})",
            psn_text(p.add(256)),
            psn_text(p)
        ),
    )?;
    ack_at(ctx, &c, p, 1)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "the SEND's own ACK",
    )?;
    if wc.wr_id != 1 {
        return Err(format!("completion for wr_id {}, expected 1", wc.wr_id));
    }
    Ok(())
}

/// The device's 16-byte WRITE (wr_id 9), answered by `syndrome`: it must complete with `status`
/// (with any error status when `None`), and the QP must go to ERR.
fn write_naked(ctx: &mut Ctx<'_>, syndrome: Syndrome, status: Option<&str>, what: &str) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let mut wr = SendWr::new(9, SendOpcode::RdmaWrite, sge(&c, 0, 16));
    wr.remote_addr = 0x7100_0000;
    wr.rkey = RKey(0x1234);
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_RDMA_WRITE_ONLY && p.psn() == c.dut_psn => {}
        _ => {
            return Err(format!(
                "expected one RDMA_WRITE_ONLY at {}, got {}",
                psn_text(c.dut_psn),
                describe(&got)
            ))
        }
    }
    let nak = ctx
        .req(&c, Opcode::RC_ACKNOWLEDGE, c.dut_psn)
        .aeth(syndrome, 0);
    ctx.peer.send(&nak)?;
    let w = ctx.wcs(&c, 1)?;
    let ok = match (w.first(), status) {
        (Some(x), Some(s)) => x.wr_id == 9 && x.status == s,
        (Some(x), None) => x.wr_id == 9 && !x.is_success(),
        (None, _) => false,
    };
    if !ok {
        return Err(format!(
            "{what}: expected the WRITE (wr_id 9) completed {}, got {}",
            status.unwrap_or("with an error status"),
            wcs_text(&w)
        ));
    }
    ctx.expect_state(&c, QpState::Err, what)
}

fn nak_inv_req(ctx: &mut Ctx<'_>) -> Outcome {
    write_naked(
        ctx,
        Syndrome::nak(NakCode::InvalidRequest),
        Some("IBV_WC_REM_INV_REQ_ERR"),
        "a NAK invalid request",
    )
}

fn nak_rem_op(ctx: &mut Ctx<'_>) -> Outcome {
    write_naked(
        ctx,
        Syndrome::nak(NakCode::RemoteOperationalError),
        Some("IBV_WC_REM_OP_ERR"),
        "a NAK remote operational error",
    )
}

fn nak_reserved(ctx: &mut Ctx<'_>) -> Outcome {
    write_naked(
        ctx,
        Syndrome::nak(NakCode::Reserved(0x1f)),
        None,
        "a NAK with the reserved code 0x1f",
    )
}
