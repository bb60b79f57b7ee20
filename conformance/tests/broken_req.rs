mod breakers;
use breakers::*;

// The RC requester scenarios of `scenarios/reqx.rs` (issue 20): each fails against a RoCEmu
// broken the way it is about, and passes when the same breaker is switched off (so that what
// makes it fail is the broken behaviour, not the wrapping).
use rocemu_conformance::agent::{Agent, AgentResult, Reply, Request};
use rocemu_conformance::dut::{SelfAgent, SharedDut};
use rocemu_conformance::runner::run_self_with;
use rocemu_conformance::scenarios::by_id;
use rocemu_emulator::rnic::QpState;
use rocemu_wire::{parse_frame, NakCode, Opcode, Psn, Syndrome, SyndromeKind};
use std::collections::HashSet;

/// What turns the device into a broken one: its agent and its link.
type Wrap = Box<dyn FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent>>;

/// A breaker with its switch: `on` breaks the device, `!on` wraps it the same way but changes
/// nothing.
type Breaker = fn(bool) -> Wrap;

/// `id` fails with the breaker on and passes with it off.
fn breaks(id: &str, b: Breaker) {
    fails(id, b(true));
    let sc = by_id(id).unwrap_or_else(|| panic!("no scenario {id}"));
    let run = run_self_with(&sc, b(false));
    assert!(
        run.result.passed,
        "{id} fails with its breaker switched off: {}",
        run.result.reason.unwrap_or_default()
    );
}

/// An agent that lets `f` change each request before the real agent runs it.
fn edit_requests(on: bool, f: impl Fn(Request) -> Request + 'static) -> Wrap {
    Box::new(agent(
        move |a: &mut SelfAgent, req: Request| -> AgentResult<Reply> {
            a.call(if on { f(req) } else { req })
        },
    ))
}

/// The QP attributes `f` rewrites in every modify_qp.
fn modify(on: bool, f: fn(&mut rocemu_conformance::agent::ModifyQp)) -> Wrap {
    edit_requests(on, move |req| match req {
        Request::ModifyQp { qpn, mut attr } => {
            f(&mut attr);
            Request::ModifyQp { qpn, attr }
        }
        r => r,
    })
}

/// Frames the RNIC sends pass through `keep` (when on).
fn tx_keep(
    on: bool,
    mut keep: impl FnMut(&rocemu_wire::frame::ParsedFrame<'_>) -> bool + 'static,
) -> Wrap {
    Box::new(move |dut: &SharedDut, a: SelfAgent| -> Box<dyn Agent> {
        dut.borrow_mut().tx_filter = Some(Box::new(move |f| {
            let pass = !on || parse_frame(&f).map_or(true, |p| keep(&p));
            if pass {
                vec![f]
            } else {
                vec![]
            }
        }));
        Box::new(a)
    })
}

/// Frames the peer sends pass through `keep` (when on).
fn rx_keep(
    on: bool,
    keep: impl Fn(&rocemu_wire::frame::ParsedFrame<'_>) -> bool + 'static,
) -> Wrap {
    Box::new(move |dut: &SharedDut, a: SelfAgent| -> Box<dyn Agent> {
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            let pass = !on || parse_frame(&f).map_or(true, |p| keep(&p));
            if pass {
                vec![f]
            } else {
                vec![]
            }
        }));
        Box::new(a)
    })
}

fn rx_edit(
    on: bool,
    edit: impl FnMut(&mut rocemu_wire::FrameRepr, &mut Vec<u8>) + 'static,
) -> Wrap {
    if on {
        Box::new(rx(edit))
    } else {
        Box::new(rx(|_, _| {}))
    }
}

fn tx_edit(
    on: bool,
    edit: impl FnMut(&mut rocemu_wire::FrameRepr, &mut Vec<u8>) + 'static,
) -> Wrap {
    if on {
        Box::new(tx(edit))
    } else {
        Box::new(tx(|_, _| {}))
    }
}

/// A device that never sends a READ or atomic request twice (no retransmission on an implied
/// NAK): repeats of a PSN already sent are dropped on the way out.
fn never_resends_reads(on: bool) -> Wrap {
    let mut seen = HashSet::new();
    tx_keep(on, move |p| {
        let op = p.bth.opcode;
        let rd = op == Opcode::RC_RDMA_READ_REQUEST
            || op == Opcode::RC_FETCH_ADD
            || op == Opcode::RC_COMPARE_SWAP;
        !rd || seen.insert(p.bth.psn.value())
    })
}

#[test]
fn implied_nak_scenarios_fail_when_reads_are_not_resent() {
    breaks("req.implied-nak.read-retransmitted", never_resends_reads);
    breaks("req.implied-nak.atomic-retransmitted", never_resends_reads);
}

#[test]
fn unexpected_opcode_scenarios_fail_when_any_response_is_taken_or_dropped() {
    // A READ response taken as an ACK, whatever WR is at its PSN.
    breaks(
        "req.unexpected-opcode.read-response-for-send-bad-resp",
        |on| {
            rx_edit(on, |r, payload| {
                if r.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY {
                    r.bth.opcode = Opcode::RC_ACKNOWLEDGE;
                    payload.clear();
                }
            })
        },
    );
    // A READ response of the wrong kind silently dropped.
    breaks(
        "req.unexpected-opcode.read-response-for-send-bad-resp",
        |on| rx_keep(on, |p| p.bth.opcode != Opcode::RC_RDMA_READ_RESPONSE_ONLY),
    );
    // An ATOMIC_ACKNOWLEDGE taken as the READ's response, its value as the data.
    breaks("req.unexpected-opcode.atomic-ack-for-read-bad-resp", |on| {
        rx_edit(on, |r, payload| {
            if let Some(a) = r.ext.atomic_ack.take() {
                r.bth.opcode = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
                *payload = a.orig.to_le_bytes().to_vec();
            }
        })
    });
    // … or silently dropped.
    breaks("req.unexpected-opcode.atomic-ack-for-read-bad-resp", |on| {
        rx_keep(on, |p| p.bth.opcode != Opcode::RC_ATOMIC_ACKNOWLEDGE)
    });
}

#[test]
fn read_nak_midway_scenarios_fail_when_the_nak_is_misread() {
    // The READ asked again from its start at the NAK's PSN (the RETH not advanced).
    breaks("req.read.nak-seq-mid-response-resumes", |on| {
        tx_edit(on, |r, _| {
            if r.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
                if let Some(x) = r.ext.reth.as_mut() {
                    x.va = 0x7000_0000;
                    x.dma_len = 3 * 1024;
                }
            }
        })
    });
    // The NAK's code misread.
    breaks("req.read.nak-rem-op-mid-response-fails", |on| {
        rx_edit(on, |r, _| {
            if is_nak(r, NakCode::RemoteOperationalError) {
                if let Some(a) = r.ext.aeth.as_mut() {
                    a.syndrome = Syndrome::nak(NakCode::RemoteAccessError);
                }
            }
        })
    });
}

#[test]
fn read_psn_wrap_fails_when_psn_0_is_not_followed() {
    // The response at PSN 0 does not reach the READ (a device that does not wrap its PSNs).
    breaks("req.read.psn-wrap", |on| {
        rx_keep(on, |p| {
            !(p.bth.opcode == Opcode::RC_RDMA_READ_RESPONSE_LAST && p.bth.psn == Psn::new(0))
        })
    });
}

#[test]
fn retry_counter_scenarios_fail_with_other_counts() {
    // rnr_retry 7 taken as 6 retries.
    breaks("rnr.requester.retry-7-forever", |on| {
        modify(on, |a| {
            if a.rnr_retry == Some(7) {
                a.rnr_retry = Some(6);
            }
        })
    });
    // retry_cnt 7 taken as six retries; retry_cnt 0 as one.
    breaks("ack.timeout.retry-cnt-7-finite", |on| {
        modify(on, |a| {
            if a.retry_cnt == Some(7) {
                a.retry_cnt = Some(6);
            }
        })
    });
    breaks("ack.timeout.retry-cnt-0-no-retry", |on| {
        modify(on, |a| {
            if a.retry_cnt == Some(0) {
                a.retry_cnt = Some(1);
            }
        })
    });
    // Timeout 0 taken as a finite timeout (code 12, 16.8 ms).
    breaks("ack.timeout.zero-never-retransmits", |on| {
        modify(on, |a| {
            if a.timeout == Some(0) {
                a.timeout = Some(12);
            }
        })
    });
}

#[test]
fn fence_scenarios_fail_when_the_fence_is_ignored() {
    fn no_fence(on: bool) -> Wrap {
        edit_requests(on, |req| match req {
            Request::PostSend { qpn, mut wr } => {
                wr.fence = false;
                Request::PostSend { qpn, wr }
            }
            r => r,
        })
    }
    breaks("req.fence.waits-for-read", no_fence);
    breaks("req.fence.waits-for-atomic", no_fence);
}

#[test]
fn initiator_depth_fails_when_max_rd_atomic_is_ignored() {
    breaks("req.initiator-depth.max-rd-atomic", |on| {
        modify(on, |a| {
            if a.max_rd_atomic.is_some() {
                a.max_rd_atomic = Some(16);
            }
        })
    });
}

#[test]
fn unsignaled_error_fails_when_signaling_is_wrong() {
    // Every WR signaled: the ACKed unsignaled SEND completes.
    breaks("req.unsignaled.error-completes", |on| {
        edit_requests(on, |req| match req {
            Request::PostSend { qpn, mut wr } => {
                wr.signaled = true;
                Request::PostSend { qpn, wr }
            }
            r => r,
        })
    });
    // An unsignaled WR in error completes silently: its completion never reaches the CQ.
    breaks("req.unsignaled.error-completes", |on| {
        Box::new(agent(move |a: &mut SelfAgent, req: Request| {
            let r = a.call(req)?;
            Ok(match r {
                Reply::Wcs(w) if on => {
                    Reply::Wcs(w.into_iter().filter(|c| c.is_success()).collect())
                }
                r => r,
            })
        }))
    });
}

#[test]
fn sqd_drain_fails_when_the_sq_is_not_held() {
    // The move to SQD taken as RTS → RTS: new WRs keep going out.
    breaks("req.sqd.drains-and-holds", |on| {
        modify(on, |a| {
            if a.qp_state == Some(QpState::Sqd) {
                a.qp_state = Some(QpState::Rts);
            }
        })
    });
}

#[test]
fn zero_credit_ack_fails_when_it_is_not_taken() {
    // An ACK advertising zero credits discarded as if it were no ACK.
    breaks("ack.aeth.zero-credits-completes", |on| {
        rx_keep(on, |p| {
            !p.ext
                .aeth
                .is_some_and(|a| a.syndrome.kind() == SyndromeKind::Ack { credits: 0 })
        })
    });
}
