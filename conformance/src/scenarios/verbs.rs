//! Work requests against the QP state machine (IBTA Vol. 1 10.3.1 and 11.4.1, unverified;
//! 11.2.4.2 Modify QP) and error recovery (ERR flushes, RESET starts over).
use crate::agent::{ModifyQp, SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, wcs_text, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::QpState;
use rocemu_wire::Opcode;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "verbs.post-send.before-rts-rejected",
        title: "post_send on a QP in RESET, INIT or RTR is refused at once, and nothing goes on the wire",
        cites: &[cite::POST_SEND, cite::QP_STATES],
        run: post_send_before_rts,
    },
    Scenario {
        id: "verbs.post-recv.reset-rejected",
        title: "post_recv on a QP in RESET is refused; in INIT it is accepted",
        cites: &[cite::POST_RECV],
        run: post_recv_reset,
    },
    Scenario {
        id: "verbs.modify.reset-to-rts-rejected",
        title: "modify_qp from RESET straight to RTS is refused and the QP stays in RESET",
        cites: &[cite::MODIFY_QP, cite::QP_STATES],
        run: reset_to_rts,
    },
    Scenario {
        id: "qp.err.flushes-work",
        title: "A QP moved to ERR flushes its posted receives, and a send posted in ERR, with IBV_WC_WR_FLUSH_ERR",
        cites: &[cite::QP_STATES, cite::POST_SEND, cite::COMPLETION_STATUS],
        run: err_flushes,
    },
    Scenario {
        id: "qp.err.reset-and-reconnect",
        title: "After a fatal NAK put the QP in ERR, RESET → INIT → RTR → RTS with new PSNs carries traffic again",
        cites: &[cite::MODIFY_QP, cite::QP_STATES, cite::ERROR_CLASSES],
        run: reset_and_reconnect,
    },
];

fn post_send_before_rts(ctx: &mut Ctx<'_>) -> Outcome {
    for state in [QpState::Reset, QpState::Init, QpState::Rtr] {
        let c = ctx.connect(ConnOpts {
            stop_at: state,
            ..Default::default()
        })?;
        let wr = SendWr::new(
            1,
            SendOpcode::Send,
            vec![Sge {
                addr: c.mr.addr,
                length: 8,
                lkey: c.mr.lkey,
            }],
        );
        if ctx.agent.post_send(c.qpn, wr).is_ok() {
            return Err(format!(
                "post_send on a QP in {} was accepted",
                crate::agent::qp_state_name(state).to_uppercase()
            ));
        }
        ctx.peer.expect_silence("a refused post_send")?;
    }
    Ok(())
}

fn post_recv_reset(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Reset,
        ..Default::default()
    })?;
    if ctx.post_recv(&c, 1, 0, 64).is_ok() {
        return Err("post_recv on a QP in RESET was accepted".into());
    }
    ctx.bring_up(
        &c,
        &ConnOpts {
            stop_at: QpState::Init,
            ..Default::default()
        },
    )?;
    ctx.post_recv(&c, 2, 0, 64)
        .map_err(|e| format!("post_recv on a QP in INIT was refused: {e}"))
}

fn reset_to_rts(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Reset,
        ..Default::default()
    })?;
    let r = ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(c.dut_psn),
            ..Default::default()
        },
    );
    if r.is_ok() {
        return Err("modify_qp RESET → RTS was accepted".into());
    }
    ctx.expect_state(&c, QpState::Reset, "a refused RESET → RTS")
}

fn err_flushes(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 2,
        ..Default::default()
    })?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Err),
            ..Default::default()
        },
    )?;
    let w = ctx.wcs(&c, 2)?;
    let flushed = |w: &[crate::agent::WorkCompletion], ids: &[u64]| {
        w.len() == ids.len()
            && w.iter().all(|x| x.status == "IBV_WC_WR_FLUSH_ERR")
            && ids.iter().all(|id| w.iter().any(|x| x.wr_id == *id))
    };
    if !flushed(&w, &[1000, 1001]) {
        return Err(format!(
            "expected receives 1000 and 1001 completed IBV_WC_WR_FLUSH_ERR, got {}",
            wcs_text(&w)
        ));
    }
    let wr = SendWr::new(
        5,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 8,
            lkey: c.mr.lkey,
        }],
    );
    ctx.agent.post_send(c.qpn, wr)?;
    let w = ctx.wcs(&c, 1)?;
    if !flushed(&w, &[5]) {
        return Err(format!(
            "expected the send posted in ERR completed IBV_WC_WR_FLUSH_ERR, got {}",
            wcs_text(&w)
        ));
    }
    ctx.peer.expect_silence("work posted in ERR")
}

fn reset_and_reconnect(ctx: &mut Ctx<'_>) -> Outcome {
    let o = ConnOpts::default();
    let mut c = ctx.connect(o)?;
    let bad = ctx
        .req(&c, Opcode::RC_SEND_MIDDLE, c.peer_psn)
        .payload(&pattern(1, c.mtu as usize))
        .ack_req(true);
    ctx.peer.send(&bad)?;
    ctx.peer.collect(None);
    ctx.expect_state(&c, QpState::Err, "a SEND_MIDDLE with no FIRST")?;
    ctx.wcs(&c, 0)?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Reset),
            ..Default::default()
        },
    )?;
    c.peer_psn = ctx.random_psn();
    c.dut_psn = ctx.random_psn();
    ctx.bring_up(&c, &ConnOpts { recvs: 1, ..o })?;
    ctx.expect_state(&c, QpState::Rts, "RESET → INIT → RTR → RTS")?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(2, 16))
        .ack_req(true);
    ctx.peer.send(&r)?;
    let got = ctx.peer.collect(None);
    if got.len() != 1 || !got[0].is_ack() || got[0].psn() != c.peer_psn {
        return Err(format!(
            "after the reconnect, a SEND at the new PSN: expected its ACK, got {}",
            describe(&got)
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a SEND after the reconnect",
    )?;
    Ok(())
}
