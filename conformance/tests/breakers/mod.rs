//! What every failing-device test file shares (`broken.rs` and `broken_*.rs`): filters that break
//! the frames a RoCEmu device receives or sends, agents that misbehave on the control side, and
//! `fails`, which runs a scenario against such a device and checks that it fails.
#![allow(dead_code)]
use rocemu_conformance::agent::{Agent, AgentResult, Reply, Request};
use rocemu_conformance::dut::{SelfAgent, SharedDut};
use rocemu_conformance::runner::run_self_with;
use rocemu_conformance::scenarios::by_id;
use rocemu_wire::{parse_frame, FrameRepr, NakCode, SyndromeKind};

/// Re-emits a frame after `f` changed its headers or payload (pad bytes are dropped first and
/// re-added per `bth.pad`): lengths, the IPv4 checksum and the ICRC come out right.
pub fn rewrite(frame: Vec<u8>, f: impl FnOnce(&mut FrameRepr, &mut Vec<u8>)) -> Vec<u8> {
    let Ok(p) = parse_frame(&frame) else {
        return frame;
    };
    let mut repr = FrameRepr::from_parsed(&p);
    let mut payload = p.payload.to_vec();
    f(&mut repr, &mut payload);
    let mut buf = vec![0u8; repr.frame_len(payload.len()) + 64];
    match repr.emit_with_payload(&mut buf, &payload) {
        Ok(n) => {
            buf.truncate(n);
            buf
        }
        Err(_) => frame,
    }
}

pub type Edit = Box<dyn FnMut(&mut FrameRepr, &mut Vec<u8>)>;

/// Breaks the frames the RNIC receives.
pub fn rx(
    edit: impl FnMut(&mut FrameRepr, &mut Vec<u8>) + 'static,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let mut edit: Edit = Box::new(edit);
    move |dut, agent| {
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| vec![rewrite(f, &mut edit)]));
        Box::new(agent)
    }
}

/// Breaks the frames the RNIC sends.
pub fn tx(
    edit: impl FnMut(&mut FrameRepr, &mut Vec<u8>) + 'static,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    let mut edit: Edit = Box::new(edit);
    move |dut, agent| {
        dut.borrow_mut().tx_filter = Some(Box::new(move |f| vec![rewrite(f, &mut edit)]));
        Box::new(agent)
    }
}

/// What a misbehaving agent does with each request, given the real one.
pub type Misbehave = Box<dyn FnMut(&mut SelfAgent, Request) -> AgentResult<Reply>>;

/// An agent that lets `f` see (and change) every request and reply.
pub struct Wrapped {
    pub inner: SelfAgent,
    pub f: Misbehave,
}

impl Agent for Wrapped {
    fn call(&mut self, req: Request) -> AgentResult<Reply> {
        (self.f)(&mut self.inner, req)
    }
}

pub fn agent(
    f: impl FnMut(&mut SelfAgent, Request) -> AgentResult<Reply> + 'static,
) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    move |_, inner| {
        Box::new(Wrapped {
            inner,
            f: Box::new(f),
        })
    }
}

/// Runs `id` against the broken device and checks it fails; returns the reason.
pub fn fails(id: &str, breaker: impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent>) -> String {
    let sc = by_id(id).unwrap_or_else(|| panic!("no scenario {id}"));
    let run = run_self_with(&sc, breaker);
    assert!(
        !run.result.passed,
        "{id} passed against a device broken for it"
    );
    // "Unsupported" is no failure: the broken device must make the scenario run and fail.
    assert!(
        !run.result.unsupported,
        "{id} was unsupported against a device broken for it: {:?}",
        run.result.reason
    );
    let reason = run.result.reason.unwrap_or_default();
    eprintln!("{id} fails as it should: {reason}");
    reason
}

pub fn is_nak(r: &FrameRepr, code: NakCode) -> bool {
    r.ext
        .aeth
        .is_some_and(|a| a.syndrome.kind() == SyndromeKind::Nak(code))
}

/// A device that does not check `what`: the frame reaches the RNIC as if it were right.
pub fn ignores(what: fn(&mut FrameRepr)) -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    rx(move |r, _| what(r))
}

/// A device whose UC QPs are RC QPs: the agent creates RC QPs (with the RC attributes UC lacks),
/// and every UC request (READ and atomic opcodes 0x2c and 0x34 included, which no table parses,
/// so the opcode byte is edited in place) reaches them as its RC twin.
pub fn uc_as_rc() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    use rocemu_emulator::rnic::{QpState, QpType};
    move |dut: &SharedDut, inner: SelfAgent| {
        dut.borrow_mut().rx_filter = Some(Box::new(|f| {
            let Some(op) = bth_opcode_at(&f) else {
                return vec![f];
            };
            if !(0x20..0x40).contains(&f[op]) {
                return vec![f];
            }
            let mut g = f.clone();
            g[op] -= 0x20;
            vec![fix_icrc(g)]
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(|a, req| match req {
                Request::CreateQp(mut init) => {
                    if init.qp_type == QpType::Uc {
                        init.qp_type = QpType::Rc;
                    }
                    a.call(Request::CreateQp(init))
                }
                Request::ModifyQp { qpn, mut attr } => {
                    if attr.qp_state == Some(QpState::Rtr) && attr.dest_qp_num.is_some() {
                        attr.min_rnr_timer.get_or_insert(12);
                        attr.max_dest_rd_atomic.get_or_insert(16);
                    }
                    if attr.qp_state == Some(QpState::Rts) {
                        attr.timeout.get_or_insert(14);
                        attr.retry_cnt.get_or_insert(7);
                        attr.rnr_retry.get_or_insert(7);
                        attr.max_rd_atomic.get_or_insert(16);
                    }
                    a.call(Request::ModifyQp { qpn, attr })
                }
                r => a.call(r),
            }),
        })
    }
}

/// The offset of the BTH opcode in an untagged IPv4 RoCEv2 frame (the peer's).
pub fn bth_opcode_at(f: &[u8]) -> Option<usize> {
    let udp = f.get(12..14) == Some(&[0x08, 0x00]) && f.get(23) == Some(&17);
    let roce = f.get(36..38) == Some(&4791u16.to_be_bytes());
    (udp && roce && f.len() > 42 + 12 + 4).then_some(42)
}

/// Recomputes the ICRC of an untagged IPv4 RoCEv2 frame after its bytes were edited in place.
pub fn fix_icrc(mut f: Vec<u8>) -> Vec<u8> {
    let n = f.len() - 4;
    let icrc = rocemu_wire::icrc::compute(&f[14..n], 20, false);
    f[n..].copy_from_slice(&rocemu_wire::icrc::to_wire(icrc));
    f
}

/// Any QPN that is not one of the device's reaches its first QP (the agent side tells the
/// filter which QPs exist).
pub fn any_qpn_reaches_the_qp() -> impl FnOnce(&SharedDut, SelfAgent) -> Box<dyn Agent> {
    use rocemu_wire::Qpn;
    use std::{cell::RefCell, rc::Rc};
    let qps: Rc<RefCell<Vec<Qpn>>> = Rc::default();
    let seen = qps.clone();
    move |dut: &SharedDut, inner: SelfAgent| {
        dut.borrow_mut().rx_filter = Some(Box::new(move |f| {
            vec![rewrite(f, |r, _| {
                let q = qps.borrow();
                if !q.contains(&r.bth.dqpn) {
                    if let Some(first) = q.first() {
                        r.bth.dqpn = *first;
                    }
                }
            })]
        }));
        Box::new(Wrapped {
            inner,
            f: Box::new(move |a, req| {
                let r = a.call(req)?;
                if let Reply::Qp(q) = &r {
                    seen.borrow_mut().push(*q);
                }
                Ok(r)
            }),
        })
    }
}
