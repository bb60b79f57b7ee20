//! Completion notification (`ibv_req_notify_cq`, issue 14): one event per arming, at the next
//! completion or the next solicited one (a receive completion of a message whose last packet
//! carried the BTH SE bit, or a completion in error), never without an arming, at most one
//! pending per CQ; and the SE bit the requester sets for `IBV_SEND_SOLICITED`.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{self, A, B};
use rocemu_emulator::inproc::{IP_B, MAC_B};
use rocemu_emulator::rnic::*;
use rocemu_wire::{Opcode as O, QKey};

fn events(t: &mut Bed, s: Side) -> Vec<CqId> {
    let mut v = Vec::new();
    t.p.rnic(s).take_cq_events(&mut v);
    v
}

fn arm(t: &mut Bed, s: Side, solicited_only: bool) {
    let cq = t.end(s).cq;
    t.p.rnic(s).req_notify_cq(cq, solicited_only).unwrap();
}

/// A SEND of `len` bytes from A to a receive posted on B; both complete before it returns.
fn send(t: &mut Bed, id: u64, len: usize, flags: SendFlags) {
    t.post_recv(B, id, 0, 8192);
    let mut w = wr(id, WrOpcode::Send, vec![t.sge(A, 0, len)]);
    w.flags = flags;
    t.post_send(A, w);
    assert_eq!(st(&t.wait_wcs(B, 1)), vec![(id, WcStatus::Success)]);
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(id, WcStatus::Success)]);
}

const SIG: SendFlags = SendFlags::SIGNALED;

#[test]
fn not_armed_no_event() {
    let mut t = Bed::rc();
    send(&mut t, 1, 100, SIG | SendFlags::SOLICITED);
    assert_eq!(events(&mut t, A), vec![]);
    assert_eq!(events(&mut t, B), vec![]);
}

#[test]
fn one_event_per_arming() {
    let mut t = Bed::rc();
    let (ca, cb) = (t.a.cq, t.b.cq);
    arm(&mut t, A, false);
    arm(&mut t, B, false);
    send(&mut t, 1, 100, SIG);
    assert_eq!(events(&mut t, A), vec![ca], "the send completion");
    assert_eq!(events(&mut t, B), vec![cb], "the receive completion");
    assert_eq!(events(&mut t, B), vec![], "taken once");
    // Disarmed by the event: the next completion fires nothing until the program re-arms.
    send(&mut t, 2, 100, SIG);
    assert_eq!(events(&mut t, B), vec![]);
    arm(&mut t, B, false);
    assert_eq!(events(&mut t, B), vec![], "arming alone fires nothing");
    send(&mut t, 3, 100, SIG);
    assert_eq!(events(&mut t, B), vec![cb]);
}

#[test]
fn at_most_one_event_pending_per_cq() {
    // Re-armed and fired again before the first event was taken: one event waits, not two.
    let mut t = Bed::rc();
    let cb = t.b.cq;
    for id in 1..=3 {
        arm(&mut t, B, false);
        send(&mut t, id, 10, SIG);
    }
    assert_eq!(events(&mut t, B), vec![cb]);
    assert_eq!(events(&mut t, B), vec![]);
    arm(&mut t, B, false);
    send(&mut t, 4, 10, SIG);
    assert_eq!(events(&mut t, B), vec![cb], "taking it freed the slot");
}

#[test]
fn solicited_only_fires_for_se_and_errors() {
    let mut t = Bed::rc();
    let (ca, cb) = (t.a.cq, t.b.cq);
    arm(&mut t, A, true);
    arm(&mut t, B, true);
    // An unsolicited SEND: completions on both sides, no event on either (a successful send
    // completion is never solicited).
    send(&mut t, 1, 3000, SIG);
    assert_eq!(events(&mut t, A), vec![]);
    assert_eq!(events(&mut t, B), vec![]);
    assert!(t.pkts(Dir::AB).iter().all(|p| !p.se));
    // A solicited one of three packets: SE on the last packet only, and B's event.
    t.clear_log();
    send(&mut t, 2, 3000, SIG | SendFlags::SOLICITED);
    let se: Vec<_> = t.pkts(Dir::AB).iter().map(|p| (p.op, p.se)).collect();
    assert_eq!(
        se,
        vec![
            (O::RC_SEND_FIRST, false),
            (O::RC_SEND_MIDDLE, false),
            (O::RC_SEND_LAST, true)
        ]
    );
    assert_eq!(events(&mut t, B), vec![cb]);
    assert_eq!(
        events(&mut t, A),
        vec![],
        "still not for the send completion"
    );
    // A WRITE with immediate, solicited: B's receive completion fires.
    arm(&mut t, B, true);
    t.post_recv(B, 3, 0, 0);
    let (ra, rk) = t.raddr(B, 0);
    let mut w = wr(
        3,
        WrOpcode::RdmaWriteWithImm {
            remote_addr: ra,
            rkey: rk,
            imm: 9,
        },
        vec![t.sge(A, 0, 64)],
    );
    w.flags = SIG | SendFlags::SOLICITED;
    t.post_send(A, w);
    assert_eq!(st(&t.wait_wcs(B, 1)), vec![(3, WcStatus::Success)]);
    t.wait_wcs(A, 1);
    assert_eq!(events(&mut t, B), vec![cb]);
    // A completion in error is solicited: A's WRITE to a bad R_Key.
    let mut w = wr(
        4,
        WrOpcode::RdmaWrite {
            remote_addr: ra,
            rkey: rk ^ 1,
        },
        vec![t.sge(A, 0, 64)],
    );
    w.flags = SIG | SendFlags::SOLICITED;
    t.post_send(A, w);
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(4, WcStatus::RemAccessErr)]);
    assert_eq!(events(&mut t, A), vec![ca]);
}

#[test]
fn arming_for_any_completion_wins_over_solicited_only() {
    let mut t = Bed::rc();
    let cb = t.b.cq;
    arm(&mut t, B, true);
    arm(&mut t, B, false);
    send(&mut t, 1, 10, SIG);
    assert_eq!(events(&mut t, B), vec![cb], "upgraded to any completion");
    arm(&mut t, B, false);
    arm(&mut t, B, true);
    send(&mut t, 2, 10, SIG);
    assert_eq!(
        events(&mut t, B),
        vec![cb],
        "solicited-only does not narrow an arming for any completion"
    );
}

#[test]
fn flushed_receives_are_errors_and_fire_a_solicited_arming() {
    let mut t = Bed::rc();
    let cb = t.b.cq;
    t.post_recv(B, 1, 0, 64);
    arm(&mut t, B, true);
    let qp = t.b.qp;
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    t.p.b.modify_qp(qp, &attr, QpAttrMask::STATE).unwrap();
    assert_eq!(st(&t.wcs(B)), vec![(1, WcStatus::WrFlushErr)]);
    assert_eq!(events(&mut t, B), vec![cb]);
}

#[test]
fn se_only_on_messages_that_make_a_receive_completion() {
    // IBV_SEND_SOLICITED on a WRITE or a READ sets no SE bit: they complete no receive.
    let mut t = Bed::rc();
    let (ra, rk) = t.raddr(B, 0);
    for (id, op) in [
        (
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
        ),
        (
            2,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
        ),
    ] {
        let mut w = wr(id, op, vec![t.sge(A, 0, 64)]);
        w.flags = SIG | SendFlags::SOLICITED;
        t.post_send(A, w);
        assert_eq!(st(&t.wait_wcs(A, 1)), vec![(id, WcStatus::Success)]);
    }
    let reqs: Vec<_> = t.pkts(Dir::AB).iter().map(|p| (p.op, p.se)).collect();
    assert_eq!(
        reqs,
        vec![
            (O::RC_RDMA_WRITE_ONLY, false),
            (O::RC_RDMA_READ_REQUEST, false)
        ]
    );
}

#[test]
fn ud_and_uc_receives_carry_the_se_bit_to_the_cq() {
    for qt in [QpType::Uc, QpType::Ud] {
        let mut t = BedCfg::new(qt).build();
        let cb = t.b.cq;
        arm(&mut t, B, true);
        let dest = (qt == QpType::Ud).then(|| UdDest {
            ah: AhAttr::to(IP_B, MAC_B),
            remote_qpn: t.b.qp,
            remote_qkey: QKey(0x1111_1111),
        });
        for (id, flags) in [(1, SIG), (2, SIG | SendFlags::SOLICITED)] {
            // A UD receive buffer holds the 40-byte GRH first.
            t.post_recv(B, id, 0, 4096);
            let mut w = wr(id, WrOpcode::Send, vec![t.sge(A, 0, 100)]);
            w.flags = flags;
            w.ud = dest;
            t.post_send(A, w);
            assert_eq!(
                st(&t.wait_wcs(B, 1)),
                vec![(id, WcStatus::Success)],
                "{qt:?}"
            );
            let fired = events(&mut t, B);
            if id == 1 {
                assert_eq!(fired, vec![], "{qt:?}: unsolicited");
            } else {
                assert_eq!(fired, vec![cb], "{qt:?}: solicited");
            }
        }
    }
}

#[test]
fn req_notify_cq_on_no_cq_is_not_found() {
    let mut t = Bed::rc();
    assert!(matches!(
        t.p.a.req_notify_cq(CqId(999), false),
        Err(VerbsError::NotFound(_))
    ));
}
