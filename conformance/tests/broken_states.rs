mod breakers;
use breakers::*;

// The QP-state, CM and IBA 1.5 scenarios (`scenarios/states.rs`, `cm.rs`, `ext.rs`) fail
// against a RoCEmu broken the way each is about, and pass (or say "unsupported") when the
// breaker does nothing.
use rocemu_conformance::agent::{Agent, AgentResult, Reply, Request};
use rocemu_conformance::dut::{SelfAgent, SharedDut};
use rocemu_conformance::runner::run_self_with;
use rocemu_conformance::scenarios::by_id;
use rocemu_emulator::rnic::QpState;
use rocemu_wire::cm::{CmMadRepr, CmMessage, CommId};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;

/// Every scenario of these files.
const IDS: &[&str] = &[
    "qp.modify.init-needs-access-flags",
    "qp.modify.rts-needs-timeout",
    "qp.modify.init-rejects-sq-psn",
    "qp.modify.ud-init-rejects-access-flags",
    "qp.modify.rts-to-rtr-rejected",
    "qp.sqe.not-entered-by-modify",
    "qp.sqd.enter-and-leave",
    "qp.sqd.holds-new-sends",
    "qp.sqd.receives-still-work",
    "qp.sqe.ud-send-error-recovers",
    "verbs.sge.invalid-lkey-loc-prot-err",
    "verbs.cq.overflow-qp-error",
    "cm.rej.unknown-service-id",
    "cm.req.duplicate-one-connection",
    "ext.flush.responder-acks",
    "ext.atomic-write.responder-writes",
];

/// A breaker that breaks nothing: each scenario still passes (or is unsupported), so the
/// failures below come from the breakage, not from the wrapping.
#[test]
fn states_scenarios_pass_through_a_no_op_breaker() {
    for id in IDS {
        let sc = by_id(id).unwrap_or_else(|| panic!("no scenario {id}"));
        let r = run_self_with(&sc, agent(|a: &mut SelfAgent, req| a.call(req))).result;
        assert!(
            r.passed || r.unsupported,
            "{id} failed through a no-op breaker: {:?}",
            r.reason
        );
    }
    // Without the caps the IBA 1.5 scenarios are unsupported, not passed nor failed.
    for id in [
        "ext.flush.responder-acks",
        "ext.atomic-write.responder-writes",
    ] {
        let r = run_self_with(&by_id(id).unwrap(), |_, a| Box::new(a)).result;
        assert!(r.unsupported && !r.passed, "{id}: {:?}", r.reason);
    }
}

/// A device whose `modify_qp` never refuses: what it cannot do it leaves undone, silently.
fn modify_never_refused() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    agent(|a: &mut SelfAgent, req| {
        let is_modify = matches!(req, Request::ModifyQp { .. });
        match a.call(req) {
            Err(_) if is_modify => Ok(Reply::Done),
            r => r,
        }
    })
}

#[test]
fn modify_mask_scenarios_fail_when_modify_never_refuses() {
    for id in [
        "qp.modify.init-needs-access-flags",
        "qp.modify.rts-needs-timeout",
        "qp.modify.init-rejects-sq-psn",
        "qp.modify.ud-init-rejects-access-flags",
        "qp.modify.rts-to-rtr-rejected",
        "qp.sqe.not-entered-by-modify",
    ] {
        let why = fails(id, modify_never_refused());
        assert!(why.contains("was accepted"), "{id}: {why}");
    }
}

#[test]
fn init_needs_access_flags_fails_when_the_device_defaults_them() {
    // A device that fills in the access flags a RESET → INIT lacks.
    fails(
        "qp.modify.init-needs-access-flags",
        agent(|a: &mut SelfAgent, req| match req {
            Request::ModifyQp { qpn, mut attr } => {
                if attr.qp_state == Some(QpState::Init) && attr.qp_access_flags.is_none() {
                    attr.qp_access_flags = Some(rocemu_emulator::rnic::Access::LOCAL_WRITE);
                }
                a.call(Request::ModifyQp { qpn, attr })
            }
            r => a.call(r),
        }),
    );
}

#[test]
fn sqd_enter_and_leave_fails_without_sqd() {
    fails(
        "qp.sqd.enter-and-leave",
        agent(|a: &mut SelfAgent, req| match req {
            Request::ModifyQp { attr, .. } if attr.qp_state == Some(QpState::Sqd) => {
                Err("SQD not supported".into())
            }
            r => a.call(r),
        }),
    );
}

#[test]
fn sqd_holds_new_sends_fails_when_sqd_does_not_stop_the_send_queue() {
    // RTS → SQD is answered but not done: the QP keeps sending.
    fails(
        "qp.sqd.holds-new-sends",
        agent(|a: &mut SelfAgent, req| match req {
            Request::ModifyQp { attr, .. } if attr.qp_state == Some(QpState::Sqd) => {
                Ok(Reply::Done)
            }
            Request::ModifyQp { qpn, attr } if attr.qp_state == Some(QpState::Rts) => {
                match a.query_qp(qpn) {
                    Ok(q) if q.qp_state == QpState::Rts => Ok(Reply::Done),
                    _ => a.call(Request::ModifyQp { qpn, attr }),
                }
            }
            r => a.call(r),
        }),
    );
}

#[test]
fn sqd_receives_fail_when_sqd_stops_the_receive_queue() {
    // Once a QP is in SQD, every frame to the device is dropped.
    let drained = Rc::new(Cell::new(false));
    let d = drained.clone();
    fails(
        "qp.sqd.receives-still-work",
        move |dut: &SharedDut, inner: SelfAgent| -> Box<dyn Agent> {
            let d2 = d.clone();
            dut.borrow_mut().rx_filter =
                Some(Box::new(
                    move |f| {
                        if d2.get() {
                            Vec::new()
                        } else {
                            vec![f]
                        }
                    },
                ));
            Box::new(Wrapped {
                inner,
                f: Box::new(move |a: &mut SelfAgent, req| {
                    if let Request::ModifyQp { attr, .. } = &req {
                        if attr.qp_state == Some(QpState::Sqd) {
                            d.set(true);
                        }
                    }
                    a.call(req)
                }),
            })
        },
    );
    assert!(drained.get());
}

#[test]
fn sqe_fails_when_a_send_error_takes_the_qp_to_err() {
    // As rdma_rxe does: a UD send error moves the whole QP to ERR (here as soon as the error
    // completion is polled).
    fails(
        "qp.sqe.ud-send-error-recovers",
        agent(|a: &mut SelfAgent, req| {
            let r = a.call(req)?;
            if let Reply::Wcs(w) = &r {
                for wc in w.iter().filter(|w| w.status == "IBV_WC_LOC_PROT_ERR") {
                    a.modify_qp(
                        wc.qp_num,
                        rocemu_conformance::agent::ModifyQp {
                            qp_state: Some(QpState::Err),
                            ..Default::default()
                        },
                    )?;
                }
            }
            Ok(r)
        }),
    );
}

#[test]
fn invalid_lkey_fails_when_lkeys_are_not_checked() {
    // Every SGE's L_Key becomes the last registered one: a device that takes any L_Key.
    let lkey = Rc::new(Cell::new(0u32));
    fails(
        "verbs.sge.invalid-lkey-loc-prot-err",
        agent(move |a: &mut SelfAgent, req| match req {
            Request::PostSend { qpn, mut wr } => {
                for s in &mut wr.sg {
                    s.lkey = lkey.get();
                }
                a.call(Request::PostSend { qpn, wr })
            }
            r => {
                let reply = a.call(r)?;
                if let Reply::Mr(m) = &reply {
                    lkey.set(m.lkey);
                }
                Ok(reply)
            }
        }),
    );
}

#[test]
fn cq_overflow_fails_when_cqs_are_bigger_than_asked_for() {
    fails(
        "verbs.cq.overflow-qp-error",
        agent(|a: &mut SelfAgent, req| match req {
            Request::CreateCq { .. } => a.call(Request::CreateCq { cqe: 64 }),
            r => a.call(r),
        }),
    );
}

#[test]
fn cm_unknown_service_fails_when_every_port_is_served() {
    // The device accepts connections on the ports next to the one listened on as well.
    fails(
        "cm.rej.unknown-service-id",
        agent(|a: &mut SelfAgent, req| match req {
            Request::CmListen { port } => {
                let r = a.call(Request::CmListen { port })?;
                for p in [port.wrapping_add(1), port.wrapping_sub(1)] {
                    a.call(Request::CmListen { port: p })?;
                }
                Ok(r)
            }
            r => a.call(r),
        }),
    );
}

/// Changes the Local Communication ID of every REQ seen before: a device whose CM takes each
/// copy of a REQ for a new connection.
fn fresh_comm_ids() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let seen: Rc<RefCell<HashSet<u32>>> = Rc::default();
    let next = Cell::new(0x7000_0000u32);
    rx(move |_, payload| {
        let Ok(mut m) = CmMadRepr::parse(payload) else {
            return;
        };
        if let CmMessage::Req(r) = &mut m.msg {
            if !seen.borrow_mut().insert(r.local_comm_id.0) {
                next.set(next.get() + 1);
                r.local_comm_id = CommId(next.get());
                let _ = m.emit(payload);
            }
        }
    })
}

#[test]
fn cm_duplicate_req_fails_when_each_req_makes_a_connection() {
    fails("cm.req.duplicate-one-connection", fresh_comm_ids());
}

/// An agent that says the device has FLUSH and ATOMIC WRITE (RoCEmu has neither).
fn claims_iba15() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    agent(|a: &mut SelfAgent, req| -> AgentResult<Reply> {
        match a.call(req)? {
            Reply::Device(mut d) => {
                d.caps = vec!["flush".into(), "atomic_write".into()];
                Ok(Reply::Device(d))
            }
            r => Ok(r),
        }
    })
}

#[test]
fn flush_fails_on_a_device_that_claims_it_and_naks_it() {
    fails("ext.flush.responder-acks", claims_iba15());
}

#[test]
fn atomic_write_fails_on_a_device_that_claims_it_and_naks_it() {
    fails("ext.atomic-write.responder-writes", claims_iba15());
}
