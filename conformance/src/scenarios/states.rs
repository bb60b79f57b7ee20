//! Verbs against the QP state machine (issue 20): the attribute masks `ibv_modify_qp` requires
//! and allows per transition (IBA 11.2.4.2 table 91 in 1.2.1, as Linux's `qp_state_table`
//! enforces it), the transitions that do not exist, SQD and SQE, an invalid L_Key in a posted
//! SGE, and a CQ overrun.
use crate::agent::{Ah, ModifyQp, QpInit, SendOpcode, SendWr, Sge, UdDest};
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::{Opcode, Psn, QKey};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "qp.modify.init-needs-access-flags",
        title: "modify_qp RESET → INIT of an RC QP with P_Key index and port but no access flags is refused; the QP stays in RESET",
        cites: &[cite::MODIFY_QP_MASKS],
        run: init_needs_access_flags,
    },
    Scenario {
        id: "qp.modify.rts-needs-timeout",
        title: "modify_qp RTR → RTS of an RC QP with everything but the local ACK timeout is refused; the QP stays in RTR",
        cites: &[cite::MODIFY_QP_MASKS],
        run: rts_needs_timeout,
    },
    Scenario {
        id: "qp.modify.init-rejects-sq-psn",
        title: "modify_qp RESET → INIT of an RC QP that also sets sq_psn (not allowed in that transition) is refused",
        cites: &[cite::MODIFY_QP_MASKS],
        run: init_rejects_sq_psn,
    },
    Scenario {
        id: "qp.modify.ud-init-rejects-access-flags",
        title: "modify_qp RESET → INIT of a UD QP with its Q_Key and also access flags (not allowed for UD) is refused",
        cites: &[cite::MODIFY_QP_MASKS],
        run: ud_init_rejects_access,
    },
    Scenario {
        id: "qp.modify.rts-to-rtr-rejected",
        title: "modify_qp RTS → RTR (no such transition) is refused and the QP stays in RTS",
        cites: &[cite::QP_TRANSITIONS, cite::MODIFY_QP_MASKS],
        run: rts_to_rtr,
    },
    Scenario {
        id: "qp.sqe.not-entered-by-modify",
        title: "modify_qp RTS → SQE of a UD QP is refused: SQE is entered only on a send error",
        cites: &[cite::QP_TRANSITIONS, cite::SQE_STATE],
        run: sqe_not_by_modify,
    },
    Scenario {
        id: "qp.sqd.enter-and-leave",
        title: "An RC QP goes RTS → SQD (query_qp says SQD) and SQD → RTS, and sends again afterwards",
        cites: &[cite::SQD_STATE, cite::QP_TRANSITIONS],
        run: sqd_enter_leave,
    },
    Scenario {
        id: "qp.sqd.holds-new-sends",
        title: "A send posted while the QP is in SQD does not go out until the QP is back in RTS",
        cites: &[cite::SQD_STATE],
        run: sqd_holds_sends,
    },
    Scenario {
        id: "qp.sqd.receives-still-work",
        title: "In SQD the receive queue works on: a SEND from the peer is ACKed and completes a receive",
        cites: &[cite::SQD_STATE],
        run: sqd_receives,
    },
    Scenario {
        id: "qp.sqe.ud-send-error-recovers",
        title: "A UD send with an invalid L_Key completes IBV_WC_LOC_PROT_ERR and puts the QP in SQE; receives still complete; SQE → RTS is allowed and sends work again",
        cites: &[cite::SQE_STATE, cite::LOCAL_PROTECTION, cite::MODIFY_QP_MASKS],
        run: sqe_recovers,
    },
    Scenario {
        id: "verbs.sge.invalid-lkey-loc-prot-err",
        title: "An RC SEND whose SGE names an invalid L_Key completes IBV_WC_LOC_PROT_ERR, nothing of it is sent, and the QP goes to ERR",
        cites: &[cite::LOCAL_PROTECTION, cite::COMPLETION_STATUS],
        run: invalid_lkey,
    },
    Scenario {
        id: "verbs.cq.overflow-qp-error",
        title: "Receives completing into a CQ of 2 entries that is never polled overrun it: the QP on it goes to ERR",
        cites: &[cite::CQ_OVERRUN],
        run: cq_overflow,
    },
];

fn refused(ctx: &mut Ctx<'_>, c: &Conn, attr: ModifyQp, what: &str, stays: QpState) -> Outcome {
    if ctx.agent.modify_qp(c.qpn, attr).is_ok() {
        return Err(format!("modify_qp {what} was accepted"));
    }
    ctx.expect_state(c, stays, &format!("a refused {what}"))
}

fn init_needs_access_flags(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Reset,
        ..Default::default()
    })?;
    let attr = ModifyQp {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        ..Default::default()
    };
    refused(
        ctx,
        &c,
        attr,
        "RESET → INIT (RC) without IBV_QP_ACCESS_FLAGS",
        QpState::Reset,
    )?;
    // The same call with the access flags is the one that works.
    ctx.agent
        .modify_qp(
            c.qpn,
            ModifyQp {
                qp_access_flags: Some(Access::LOCAL_WRITE),
                ..attr
            },
        )
        .map_err(|e| format!("RESET → INIT with P_Key index, port and access flags: {e}"))?;
    ctx.expect_state(
        &c,
        QpState::Init,
        "RESET → INIT with the required attributes",
    )
}

fn rts_attrs(c: &Conn) -> ModifyQp {
    ModifyQp {
        qp_state: Some(QpState::Rts),
        sq_psn: Some(c.dut_psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..Default::default()
    }
}

fn rts_needs_timeout(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Rtr,
        ..Default::default()
    })?;
    let attr = ModifyQp {
        timeout: None,
        ..rts_attrs(&c)
    };
    refused(
        ctx,
        &c,
        attr,
        "RTR → RTS (RC) without IBV_QP_TIMEOUT",
        QpState::Rtr,
    )?;
    ctx.agent
        .modify_qp(c.qpn, rts_attrs(&c))
        .map_err(|e| format!("RTR → RTS with every required attribute: {e}"))?;
    ctx.expect_state(&c, QpState::Rts, "RTR → RTS with the required attributes")
}

fn init_rejects_sq_psn(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Reset,
        ..Default::default()
    })?;
    let attr = ModifyQp {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qp_access_flags: Some(Access::LOCAL_WRITE),
        sq_psn: Some(c.dut_psn),
        ..Default::default()
    };
    refused(
        ctx,
        &c,
        attr,
        "RESET → INIT (RC) with IBV_QP_SQ_PSN",
        QpState::Reset,
    )
}

fn ud_init_rejects_access(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_type: QpType::Ud,
        stop_at: QpState::Reset,
        ..Default::default()
    })?;
    let attr = ModifyQp {
        qp_state: Some(QpState::Init),
        pkey_index: Some(0),
        port_num: Some(1),
        qkey: Some(c.qkey),
        qp_access_flags: Some(Access::LOCAL_WRITE),
        ..Default::default()
    };
    refused(
        ctx,
        &c,
        attr,
        "RESET → INIT (UD) with IBV_QP_ACCESS_FLAGS",
        QpState::Reset,
    )?;
    ctx.agent
        .modify_qp(
            c.qpn,
            ModifyQp {
                qp_access_flags: None,
                ..attr
            },
        )
        .map_err(|e| format!("RESET → INIT (UD) with P_Key index, port and Q_Key: {e}"))?;
    ctx.expect_state(
        &c,
        QpState::Init,
        "RESET → INIT (UD) with the required attributes",
    )
}

fn rts_to_rtr(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let attr = ModifyQp {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    };
    refused(ctx, &c, attr, "RTS → RTR", QpState::Rts)
}

fn sqe_not_by_modify(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    })?;
    let attr = ModifyQp {
        qp_state: Some(QpState::Sqe),
        ..Default::default()
    };
    refused(ctx, &c, attr, "RTS → SQE (UD)", QpState::Rts)
}

fn to_state(ctx: &mut Ctx<'_>, c: &Conn, s: QpState) -> Outcome {
    ctx.agent
        .modify_qp(
            c.qpn,
            ModifyQp {
                qp_state: Some(s),
                ..Default::default()
            },
        )
        .map_err(|e| {
            format!(
                "modify_qp to {}: {e}",
                crate::agent::qp_state_name(s).to_uppercase()
            )
        })
}

/// A SEND of 16 bytes from the device's QP, signaled, with `wr_id`.
fn device_send(ctx: &mut Ctx<'_>, c: &Conn, wr_id: u64) -> Outcome {
    ctx.fill_mr(c, 0, &pattern(0x31, 16))?;
    let wr = SendWr::new(
        wr_id,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 16,
            lkey: c.mr.lkey,
        }],
    );
    ctx.agent.post_send(c.qpn, wr)?;
    Ok(())
}

/// Waits for the device's SEND ONLY at `psn`, ACKs it, and checks its completion.
fn expect_device_send(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, wr_id: u64, why: &str) -> Outcome {
    let got = ctx.peer.collect(None);
    let Some(p) = got
        .iter()
        .find(|p| p.opcode() == Opcode::RC_SEND_ONLY && p.psn() == psn)
    else {
        return Err(format!(
            "{why}: expected the device's SEND ONLY at PSN {}, got {}",
            crate::scenario::psn_text(psn),
            describe(&got)
        ));
    };
    if p.payload != pattern(0x31, 16) {
        return Err(format!("{why}: the SEND carries other bytes"));
    }
    let ack = ctx.req(c, Opcode::RC_ACKNOWLEDGE, psn).aeth(
        rocemu_wire::Syndrome::ack(rocemu_wire::Syndrome::CREDITS_INVALID),
        1,
    );
    ctx.peer.send(&ack)?;
    let wc = ctx.expect_wc(c, "IBV_WC_SUCCESS", Some("IBV_WC_SEND"), why)?;
    if wc.wr_id != wr_id {
        return Err(format!("{why}: expected wr_id {wr_id}, got {wc}"));
    }
    Ok(())
}

fn sqd_enter_leave(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    to_state(ctx, &c, QpState::Sqd)?;
    ctx.expect_state(&c, QpState::Sqd, "RTS → SQD with an empty send queue")?;
    to_state(ctx, &c, QpState::Rts)?;
    ctx.expect_state(&c, QpState::Rts, "SQD → RTS")?;
    device_send(ctx, &c, 7)?;
    expect_device_send(ctx, &c, c.dut_psn, 7, "a send after SQD → RTS")
}

fn sqd_holds_sends(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    to_state(ctx, &c, QpState::Sqd)?;
    device_send(ctx, &c, 8).map_err(|e| format!("post_send in SQD: {e}"))?;
    ctx.peer.expect_silence("a send posted in SQD")?;
    to_state(ctx, &c, QpState::Rts)?;
    expect_device_send(
        ctx,
        &c,
        c.dut_psn,
        8,
        "a send posted in SQD, after SQD → RTS",
    )
}

fn sqd_receives(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    to_state(ctx, &c, QpState::Sqd)?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x32, 24))
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_ack(c.peer_psn, "a SEND to a QP in SQD")?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a SEND to a QP in SQD",
    )?;
    Ok(())
}

fn ud_send(ctx: &mut Ctx<'_>, c: &Conn, wr_id: u64, lkey: u32) -> Outcome {
    let mut wr = SendWr::new(
        wr_id,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 8,
            lkey,
        }],
    );
    wr.ud = Some(UdDest {
        ah: Ah {
            sgid_index: ctx.sgid_index(),
            ..Ah::to(ctx.peer.ip)
        },
        remote_qpn: c.peer_qpn,
        remote_qkey: c.qkey,
    });
    ctx.agent.post_send(c.qpn, wr)?;
    Ok(())
}

fn sqe_recovers(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_type: QpType::Ud,
        recvs: 1,
        recv_len: 1024,
        ..Default::default()
    })?;
    ud_send(ctx, &c, 21, c.mr.lkey ^ 0x5a5a_0000)
        .map_err(|e| format!("post_send with an invalid L_Key (to complete in error): {e}"))?;
    ctx.expect_wc(
        &c,
        "IBV_WC_LOC_PROT_ERR",
        None,
        "a UD send with an invalid L_Key",
    )?;
    ctx.peer.expect_silence("a UD send with an invalid L_Key")?;
    ctx.expect_state(&c, QpState::Sqe, "after a UD send error")?;
    let r = ctx
        .req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x33))
        .deth(c.qkey, c.peer_qpn)
        .payload(&pattern(0x34, 16));
    ctx.peer.send(&r)?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a UD SEND to a QP in SQE",
    )?;
    to_state(ctx, &c, QpState::Rts)?;
    ctx.expect_state(&c, QpState::Rts, "SQE → RTS")?;
    ctx.fill_mr(&c, 0, &pattern(0x35, 8))?;
    ud_send(ctx, &c, 22, c.mr.lkey)?;
    let got = ctx.peer.collect(None);
    if !got
        .iter()
        .any(|p| p.opcode() == Opcode::UD_SEND_ONLY && p.payload == pattern(0x35, 8))
    {
        return Err(format!(
            "a UD send after SQE → RTS: expected its SEND ONLY, got {}",
            describe(&got)
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_SEND"),
        "a UD send after SQE → RTS",
    )?;
    Ok(())
}

fn invalid_lkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let wr = SendWr::new(
        31,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 16,
            lkey: c.mr.lkey ^ 0x5a5a_0000,
        }],
    );
    // Refused at once is also what a device may do; then nothing may be sent either.
    if let Err(e) = ctx.agent.post_send(c.qpn, wr) {
        ctx.peer.expect_silence("a send refused for its L_Key")?;
        return Err(format!(
            "post_send with an invalid L_Key was refused at once ({e}): expected it to complete with IBV_WC_LOC_PROT_ERR"
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_LOC_PROT_ERR",
        None,
        "a SEND with an invalid L_Key",
    )?;
    let got = ctx.peer.collect(None);
    if got.iter().any(|p| p.opcode() == Opcode::RC_SEND_ONLY) {
        return Err(format!(
            "a SEND with an invalid L_Key went on the wire: {}",
            describe(&got)
        ));
    }
    ctx.expect_state(&c, QpState::Err, "after a local protection error")
}

fn cq_overflow(ctx: &mut Ctx<'_>) -> Outcome {
    const SENDS: u32 = 8;
    let pd = ctx.agent.alloc_pd()?;
    let cq = ctx.agent.create_cq(2)?;
    let mr = ctx.agent.reg_mr(pd, 4096, Access::ALL)?;
    let qpn = ctx.agent.create_qp(QpInit::new(pd, QpType::Rc, cq))?;
    let c = Conn {
        pd,
        cq,
        mr,
        qpn,
        peer_qpn: rocemu_wire::Qpn::new(0x100 + (ctx.random() % 0xff_0000) as u32),
        peer_psn: ctx.random_psn(),
        dut_psn: ctx.random_psn(),
        mtu: 1024,
        qkey: QKey(0x1111_1111),
    };
    let o = ConnOpts {
        recvs: SENDS,
        recv_len: 64,
        ..Default::default()
    };
    ctx.bring_up(&c, &o)?;
    let mut psn = c.peer_psn;
    for i in 0..SENDS {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, psn)
            .payload(&pattern(i as u8, 8))
            .ack_req(true);
        ctx.peer.send(&r)?;
        psn = psn.next();
    }
    ctx.peer.collect(None);
    let a = ctx.agent.query_qp(c.qpn)?;
    if a.qp_state != QpState::Err {
        let w = ctx.agent.poll_cq(c.cq, 16, 0, std::time::Duration::ZERO);
        return Err(format!(
            "{SENDS} receives completed into a CQ of 2 entries: expected the QP in ERR, it is in {} (the CQ then gave {})",
            crate::agent::qp_state_name(a.qp_state).to_uppercase(),
            match w {
                Ok(w) => wcs_text(&w),
                Err(e) => format!("an error: {e}"),
            }
        ));
    }
    Ok(())
}
