mod breakers;
use breakers::*;

// The RC responder, UC and UD scenarios of `scenarios/resp.rs` (issue 20) fail against a RoCEmu
// broken the way each is about, and pass when the same filters re-emit every frame unchanged.
use rocemu_conformance::agent::{Agent, Reply, Request};
use rocemu_conformance::dut::{SelfAgent, SharedDut};
use rocemu_conformance::runner::run_self_with;
use rocemu_conformance::scenarios::{by_id, resp};
use rocemu_wire::{NakCode, Opcode, Psn, Qpn, Syndrome};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A device blind to PSNs: every request reaches the RNIC renumbered as the next in sequence
/// (the agent side tells the filter each QP's rq_psn), so duplicates look new.
fn psn_blind() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let next: Rc<RefCell<HashMap<Qpn, Psn>>> = Rc::default();
    move |dut: &SharedDut, inner: SelfAgent| {
        let n = next.clone();
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            vec![rewrite(f, |r, _| {
                if !r.bth.opcode.info().is_request() {
                    return;
                }
                if let Some(p) = n.borrow_mut().get_mut(&r.bth.dqpn) {
                    r.bth.psn = *p;
                    let npkts = match r.ext.reth {
                        Some(e) if r.bth.opcode == Opcode::RC_RDMA_READ_REQUEST => {
                            e.dma_len.div_ceil(1024).max(1)
                        }
                        _ => 1,
                    };
                    *p = p.add(npkts);
                }
            })]
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(move |a, req| {
                if let Request::ModifyQp { qpn, attr } = &req {
                    if let Some(p) = attr.rq_psn {
                        next.borrow_mut().insert(*qpn, p);
                    }
                }
                a.call(req)
            }),
        })
    }
}

/// A device that ignores max_dest_rd_atomic 0: the QP gets 16 responder resources.
fn resources_anyway() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    agent(|a, req| match req {
        Request::ModifyQp { qpn, mut attr } => {
            if attr.max_dest_rd_atomic == Some(0) {
                attr.max_dest_rd_atomic = Some(16);
            }
            a.call(Request::ModifyQp { qpn, attr })
        }
        r => a.call(r),
    })
}

#[test]
fn no_responder_resources_fails_when_reads_and_atomics_are_taken_anyway() {
    fails("rdma.read.max-dest-rd-atomic-zero-nak", resources_anyway());
    fails(
        "rdma.atomic.max-dest-rd-atomic-zero-nak",
        resources_anyway(),
    );
}

/// The first RDMA READ request the peer sends (its PSN and RETH), and a rewrite of every later
/// READ request by `f` given it.
fn later_reads(
    f: impl Fn(&rocemu_wire::FrameRepr, &mut rocemu_wire::FrameRepr) + 'static,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let mut first: Option<rocemu_wire::FrameRepr> = None;
    rx(move |r, _| {
        if r.bth.opcode != Opcode::RC_RDMA_READ_REQUEST {
            return;
        }
        match &first {
            None => first = Some(*r),
            Some(o) => f(o, r),
        }
    })
}

#[test]
fn duplicate_read_scenarios_fail_when_duplicates_are_mishandled() {
    // A forgotten duplicate taken for a new READ (answered at the next PSN).
    fails("psn.dup.read-outside-window-no-nak", psn_blind());
    // A retried READ answered with the original's length.
    fails(
        "psn.dup.read-shorter-reexecuted",
        later_reads(|o, r| {
            if r.bth.psn == o.bth.psn {
                r.ext.reth = o.ext.reth;
            }
        }),
    );
    // A retry from the middle answered from the original's first PSN, as a whole.
    fails(
        "psn.dup.read-mid-response-restarts",
        later_reads(|o, r| {
            if r.bth.psn != o.bth.psn && r.bth.psn.diff(o.bth.psn) < 3 {
                r.bth.psn = o.bth.psn;
                r.ext.reth = o.ext.reth;
            }
        }),
    );
    // The R_Key of a duplicate not checked: it is served with the original's.
    fails(
        "psn.dup.read-bad-rkey-no-data",
        later_reads(|o, r| {
            if let (Some(e), Some(k)) = (r.ext.reth.as_mut(), o.ext.reth) {
                e.rkey = k.rkey;
            }
        }),
    );
    // A forgotten duplicate atomic executed again.
    fails("psn.dup.atomic-outside-window-not-reapplied", psn_blind());
}

/// The pad bytes taken for payload (and, with `reth`, counted in the RETH length too).
fn pad_as_payload(reth: bool) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    rx(move |r, p| {
        if r.bth.opcode == Opcode::RC_RDMA_WRITE_ONLY && r.bth.pad > 0 {
            let pad = r.bth.pad;
            p.extend(std::iter::repeat_n(0, pad as usize));
            r.bth.pad = 0;
            if let (true, Some(e)) = (reth, r.ext.reth.as_mut()) {
                e.dma_len += pad as u32;
            }
        }
    })
}

#[test]
fn pad_scenarios_fail_when_the_pad_count_is_ignored() {
    fails("seq.write.pad-short-of-reth-nak", pad_as_payload(false));
    fails("rdma.write.pad-bytes-not-written", pad_as_payload(true));
}

#[test]
fn send_with_invalidate_fails_when_the_ieth_is_ignored_or_the_nak_is_another() {
    fails(
        "rdma.send-inv.unknown-rkey-nak",
        rx(|r, _| {
            if r.bth.opcode == Opcode::RC_SEND_ONLY_WITH_INVALIDATE {
                r.bth.opcode = Opcode::RC_SEND_ONLY;
                r.ext.ieth = None;
            }
        }),
    );
    let why = fails(
        "rdma.send-inv.unknown-rkey-nak",
        tx(|r, _| {
            if is_nak(r, NakCode::InvalidRequest) {
                if let Some(a) = r.ext.aeth.as_mut() {
                    a.syndrome = Syndrome::nak(NakCode::RemoteAccessError);
                }
            }
        }),
    );
    assert!(why.contains("InvalidRequest"), "{why}");
    // A device that invalidates keys of any protection domain: the IETH reaches the RNIC naming
    // the QP's own MR (the last one registered before the other PD's), which it may invalidate.
    let own: Rc<RefCell<Vec<rocemu_wire::RKey>>> = Rc::default();
    let seen = own.clone();
    fails(
        "rdma.send-inv.other-pd-rkey-nak",
        move |dut: &SharedDut, inner: SelfAgent| {
            dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
                vec![rewrite(f, |r, _| {
                    if let (Some(k), Some(first)) = (r.ext.ieth.as_mut(), own.borrow().first()) {
                        *k = *first;
                    }
                })]
            }));
            Box::new(Wrapped {
                inner,
                f: Box::new(move |a, req| {
                    let r = a.call(req)?;
                    if let Reply::Mr(m) = &r {
                        seen.borrow_mut().push(m.rkey);
                    }
                    Ok(r)
                }),
            }) as Box<dyn Agent>
        },
    );
    fails(
        "rdma.send-inv.other-pd-rkey-nak",
        rx(|r, _| {
            if r.bth.opcode == Opcode::RC_SEND_ONLY_WITH_INVALIDATE {
                r.bth.opcode = Opcode::RC_SEND_ONLY;
                r.ext.ieth = None;
            }
        }),
    );
}

#[test]
fn credits_fail_when_the_credit_field_is_made_up() {
    // Credit code 10 (32 receives) with three posted.
    fails(
        "ack.credits.receives-or-invalid",
        tx(|r, _| {
            if let Some(a) = r.ext.aeth.as_mut() {
                if a.syndrome.is_ack() {
                    a.syndrome = Syndrome::ack(10);
                }
            }
        }),
    );
}

#[test]
fn uc_read_and_atomic_opcodes_fail_when_uc_executes_them() {
    fails("uc.read.opcode-dropped", uc_as_rc());
    fails("uc.atomic.opcode-dropped", uc_as_rc());
}

#[test]
fn ud_scenarios_fail_when_the_completion_or_the_mtu_rule_is_broken() {
    // Every receive completion names the first source QP it ever named.
    let mut first: Option<Qpn> = None;
    fails(
        "ud.recv.src-qp-and-grh-flag",
        agent(move |a, req| match a.call(req)? {
            Reply::Wcs(mut w) => {
                for c in &mut w {
                    if c.opcode == "IBV_WC_RECV" {
                        c.src_qp = *first.get_or_insert(c.src_qp);
                    }
                }
                Ok(Reply::Wcs(w))
            }
            r => Ok(r),
        }),
    );
    // The GRH flag left out.
    fails(
        "ud.recv.src-qp-and-grh-flag",
        agent(|a, req| match a.call(req)? {
            Reply::Wcs(mut w) => {
                for c in &mut w {
                    c.wc_flags &= !1;
                }
                Ok(Reply::Wcs(w))
            }
            r => Ok(r),
        }),
    );
    // A device that sends the first MTU of a datagram too long for it.
    fails(
        "ud.send.over-mtu-not-emitted",
        agent(|a, req| match req {
            Request::PostSend { qpn, mut wr } if wr.ud.is_some() => {
                for s in &mut wr.sg {
                    s.length = s.length.min(1024);
                }
                a.call(Request::PostSend { qpn, wr })
            }
            r => a.call(r),
        }),
    );
    // A device that fails it with a local length error.
    fails(
        "ud.send.over-mtu-not-emitted",
        agent(|a, req| match a.call(req)? {
            Reply::Wcs(mut w) => {
                for c in &mut w {
                    if c.wr_id == 1 && c.opcode == "IBV_WC_SEND" {
                        c.status = "IBV_WC_LOC_LEN_ERR".into();
                    }
                }
                Ok(Reply::Wcs(w))
            }
            r => Ok(r),
        }),
    );
}

#[test]
fn more_solicited_scenarios_fail_when_the_se_bit_is_lost_or_everywhere() {
    for id in [
        "rdma.requester.solicited-write-imm-se",
        "ud.send.solicited-se",
    ] {
        fails(id, tx(|r, _| r.bth.solicited = false));
    }
    fails(
        "ud.send.solicited-se",
        tx(|r, _| {
            if r.bth.opcode.info().is_request() {
                r.bth.solicited = true;
            }
        }),
    );
    // IBV_SEND_SOLICITED not passed on to the device.
    fails(
        "rdma.requester.solicited-write-imm-se",
        agent(|a, req| match req {
            Request::PostSend { qpn, mut wr } => {
                wr.solicited = false;
                a.call(Request::PostSend { qpn, wr })
            }
            r => a.call(r),
        }),
    );
}

#[test]
fn solicited_fails_when_the_se_bit_is_lost_or_everywhere() {
    fails(
        "rdma.requester.solicited-se-on-last",
        tx(|r, _| r.bth.solicited = false),
    );
    fails(
        "rdma.requester.solicited-se-on-last",
        tx(|r, _| {
            if r.bth.opcode.info().is_request() {
                r.bth.solicited = true;
            }
        }),
    );
}

/// Every scenario of `resp.rs` passes through filters that parse and re-emit every frame both
/// ways without changing it, and through an agent that passes every request on: what breaks
/// them above is the change, not the re-emission.
#[test]
fn resp_scenarios_fail_to_fail_with_no_op_breakers() {
    for sc in resp::SCENARIOS {
        let sc = by_id(sc.id).expect("registered in the catalogue");
        let run = run_self_with(&sc, |dut: &SharedDut, inner: SelfAgent| {
            let mut d = dut.borrow_mut();
            d.rx_filter = Some(Box::new(|f| vec![rewrite(f, |_, _| {})]));
            d.tx_filter = Some(Box::new(|f| vec![rewrite(f, |_, _| {})]));
            Box::new(Wrapped {
                inner,
                f: Box::new(|a, req| a.call(req)),
            }) as Box<dyn Agent>
        });
        assert!(
            run.result.passed,
            "{} fails with no-op breakers: {}",
            sc.id,
            run.result.reason.unwrap_or_default()
        );
    }
}

/// Request frames that find no receive are kept and handed to the RNIC again, first, with the
/// next frame after the agent posted a receive: a device that queues what it cannot take.
fn kept_for_a_receive() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let posted: Rc<RefCell<bool>> = Rc::default();
    move |dut: &SharedDut, inner: SelfAgent| {
        let p = posted.clone();
        let mut held: Vec<Vec<u8>> = Vec::new();
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            if !*p.borrow() {
                held.push(f);
                return vec![];
            }
            let mut out = std::mem::take(&mut held);
            out.push(f);
            out
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(move |a, req| {
                if matches!(req, Request::PostRecv { .. }) {
                    *posted.borrow_mut() = true;
                }
                a.call(req)
            }),
        })
    }
}

#[test]
fn no_receive_scenarios_fail_when_the_message_is_kept_or_rnr_naked() {
    fails("ud.recv.no-receive-dropped", kept_for_a_receive());
    fails("uc.send.no-receive-no-rnr-nak", kept_for_a_receive());
    fails("uc.send.no-receive-no-rnr-nak", uc_as_rc());
}
