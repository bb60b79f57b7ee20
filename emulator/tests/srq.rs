//! Shared receive queues: RC, UC and UD responders taking their receive WQEs from an SRQ, two
//! QPs sharing one, the limit event (fires once, disarms), EBUSY while attached, the RNR NAK of
//! an empty SRQ, ERR leaving the SRQ's WQEs alone (and `QpLastWqeReached`), and the bounds.
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Impairments, Loopback, Pair, IP_A, IP_B, MAC_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::{QKey, Qpn};
use std::time::Duration;

const MR_LEN: usize = 1 << 16;
const SLOT: usize = 4096;

/// One side's objects: a PD, a CQ, a region.
struct Objs {
    pd: PdId,
    cq: CqId,
    mr: MrInfo,
}

fn side(r: &mut Rnic) -> Objs {
    let pd = r.alloc_pd();
    let cq = r.create_cq(1024).unwrap();
    let mr = r.reg_mr(pd, MR_LEN, Access::ALL).unwrap();
    Objs { pd, cq, mr }
}

fn srq_attr(max_wr: u32) -> SrqInitAttr {
    SrqInitAttr {
        max_wr,
        max_sge: 2,
        srq_limit: 0,
    }
}

fn qp_with(r: &mut Rnic, s: &Objs, t: QpType, srq: Option<SrqId>) -> Qpn {
    let mut init = QpInitAttr::new(t, s.cq);
    init.srq = srq;
    r.create_qp(s.pd, init).unwrap()
}

fn sge(mr: &MrInfo, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr + off as u64,
        length: len as u32,
        lkey: mr.lkey,
    }
}

/// Posts receive `i` into slot `i` of B's region.
fn post_srq(r: &mut Rnic, srq: SrqId, mr: &MrInfo, i: u64) {
    let wr = RecvWr {
        wr_id: 1000 + i,
        sg_list: [sge(mr, i as usize * SLOT, SLOT)].into(),
    };
    r.post_srq_recv(srq, wr).unwrap();
}

fn data(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// A SEND of `bytes` from A's region at `off`.
fn send(a: &Objs, id: u64, off: usize, len: usize) -> SendWr {
    SendWr::new(id, WrOpcode::Send, vec![sge(&a.mr, off, len)])
}

fn write_a(p: &mut Pair, a: &Objs, off: usize, d: &[u8]) {
    p.a.mr_bytes_mut(a.mr.lkey).unwrap()[off..off + d.len()].copy_from_slice(d);
}

fn events(r: &mut Rnic) -> Vec<AsyncEvent> {
    let mut v = Vec::new();
    r.take_async_events(&mut v);
    v
}

/// Two connected QP pairs of `t`; B's two QPs share one SRQ of `max_wr`.
struct Bed {
    p: Pair,
    a: Objs,
    b: Objs,
    srq: SrqId,
    qa: [Qpn; 2],
    qb: [Qpn; 2],
}

fn bed(t: QpType, max_wr: u32) -> Bed {
    let mut p = Pair::new(7, Impairments::none());
    let a = side(&mut p.a);
    let b = side(&mut p.b);
    let srq = p.b.create_srq(b.pd, srq_attr(max_wr)).unwrap();
    let qa = [0, 1].map(|_| qp_with(&mut p.a, &a, t, None));
    let qb = [0, 1].map(|_| qp_with(&mut p.b, &b, t, Some(srq)));
    for i in 0..2 {
        p.connect(qa[i], qb[i], &ConnectOpts::default()).unwrap();
    }
    Bed {
        p,
        a,
        b,
        srq,
        qa,
        qb,
    }
}

impl Bed {
    /// A SEND (UD: to B's QP `i`) from A's QP `i`.
    fn send(&mut self, i: usize, id: u64, off: usize, len: usize) {
        let mut wr = send(&self.a, id, off, len);
        if self.p.a.qp_type(self.qa[i]).unwrap() == QpType::Ud {
            wr.ud = Some(UdDest {
                ah: AhAttr::to(IP_B, MAC_B),
                remote_qpn: self.qb[i],
                remote_qkey: QKey(0x1111_1111),
            });
        }
        self.p.a.post_send(self.qa[i], wr).unwrap();
    }
    fn b_wcs(&mut self) -> Vec<Wc> {
        self.p.b.poll_cq(self.b.cq, 1 << 10)
    }
    fn b_bytes(&mut self, off: usize, len: usize) -> Vec<u8> {
        self.p.b.mr_bytes(self.b.mr.lkey).unwrap()[off..off + len].to_vec()
    }
}

/// Both of B's QPs receive through the one SRQ: each message lands in the next WQE of the SRQ,
/// whichever QP it came to, and its completion names the QP it came to.
fn two_qps_share_one_srq(t: QpType) {
    let mut b = bed(t, 16);
    for i in 0..3 {
        post_srq(&mut b.p.b, b.srq, &b.b.mr, i);
    }
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 3);
    let (m0, m1) = (data(1, 300), data(2, 500));
    write_a(&mut b.p, &b.a, 0, &m0);
    write_a(&mut b.p, &b.a, 1000, &m1);
    b.send(1, 1, 1000, m1.len());
    b.p.drive(100_000).unwrap();
    b.send(0, 2, 0, m0.len());
    b.p.drive(100_000).unwrap();
    let w = b.b_wcs();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    // UD receives carry the 40-byte GRH area first.
    let grh = if t == QpType::Ud { 40 } else { 0 };
    assert_eq!(
        (w[0].wr_id, w[0].qp_num, w[0].byte_len),
        (1000, b.qb[1], (grh + m1.len()) as u32)
    );
    assert_eq!(
        (w[1].wr_id, w[1].qp_num, w[1].byte_len),
        (1001, b.qb[0], (grh + m0.len()) as u32)
    );
    assert_eq!(b.b_bytes(grh, m1.len()), m1);
    assert_eq!(b.b_bytes(SLOT + grh, m0.len()), m0);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 1);
    let sent = b.p.a.poll_cq(b.a.cq, 16);
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
}

#[test]
fn rc_qps_share_one_srq() {
    two_qps_share_one_srq(QpType::Rc);
}

#[test]
fn uc_qps_share_one_srq() {
    two_qps_share_one_srq(QpType::Uc);
}

#[test]
fn ud_qps_share_one_srq() {
    two_qps_share_one_srq(QpType::Ud);
}

#[test]
fn a_multi_packet_send_fills_one_srq_wqe() {
    let mut b = bed(QpType::Rc, 4);
    post_srq(&mut b.p.b, b.srq, &b.b.mr, 0);
    post_srq(&mut b.p.b, b.srq, &b.b.mr, 1);
    let m = data(9, 3000); // three packets at a 1024-byte path MTU
    write_a(&mut b.p, &b.a, 0, &m);
    b.send(0, 1, 0, m.len());
    b.p.drive(100_000).unwrap();
    let w = b.b_wcs();
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1000, WcStatus::Success, 3000)]
    );
    assert_eq!(b.b_bytes(0, m.len()), m);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 1);
}

#[test]
fn the_limit_event_fires_once_and_disarms() {
    let mut b = bed(QpType::Rc, 16);
    for i in 0..6 {
        post_srq(&mut b.p.b, b.srq, &b.b.mr, i);
    }
    b.p.b.modify_srq(b.srq, None, Some(4)).unwrap();
    assert_eq!(b.p.b.query_srq(b.srq).unwrap().srq_limit, 4);
    write_a(&mut b.p, &b.a, 0, &data(3, 64));
    // 6 → 5 → 4: not below the limit yet.
    for id in 0..2 {
        b.send(0, id, 0, 64);
        b.p.drive(100_000).unwrap();
    }
    assert_eq!(events(&mut b.p.b), vec![]);
    assert_eq!(b.p.b.query_srq(b.srq).unwrap().srq_limit, 4);
    // 4 → 3: below it, once; the limit is 0 afterwards.
    b.send(1, 2, 0, 64);
    b.p.drive(100_000).unwrap();
    assert_eq!(events(&mut b.p.b), vec![AsyncEvent::SrqLimitReached(b.srq)]);
    assert_eq!(b.p.b.query_srq(b.srq).unwrap().srq_limit, 0);
    // 3 → 2: disarmed, no second event.
    b.send(0, 3, 0, 64);
    b.p.drive(100_000).unwrap();
    assert_eq!(events(&mut b.p.b), vec![]);
    // Armed again (limit 2, the SRQ holds 2): the next WQE taken fires it again.
    b.p.b.modify_srq(b.srq, None, Some(2)).unwrap();
    b.send(1, 4, 0, 64);
    b.p.drive(100_000).unwrap();
    assert_eq!(events(&mut b.p.b), vec![AsyncEvent::SrqLimitReached(b.srq)]);
    assert_eq!(b.b_wcs().len(), 5);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 1);
}

#[test]
fn destroy_while_attached_is_busy() {
    let mut p = Pair::new(1, Impairments::none());
    let b = side(&mut p.b);
    let srq = p.b.create_srq(b.pd, srq_attr(8)).unwrap();
    let q1 = qp_with(&mut p.b, &b, QpType::Rc, Some(srq));
    let q2 = qp_with(&mut p.b, &b, QpType::Ud, Some(srq));
    assert!(matches!(p.b.destroy_srq(srq), Err(VerbsError::Busy(_))));
    p.b.destroy_qp(q1).unwrap();
    assert!(matches!(p.b.destroy_srq(srq), Err(VerbsError::Busy(_))));
    p.b.destroy_qp(q2).unwrap();
    p.b.destroy_srq(srq).unwrap();
    assert!(matches!(p.b.query_srq(srq), Err(VerbsError::NotFound(_))));
    // A new SRQ in the freed slot: the old handle still reaches nothing.
    let again = p.b.create_srq(b.pd, srq_attr(8)).unwrap();
    assert_ne!(again, srq);
    assert!(p.b.query_srq(again).is_ok());
    assert!(matches!(
        p.b.post_srq_recv(
            srq,
            RecvWr {
                wr_id: 1,
                sg_list: Default::default()
            }
        ),
        Err(VerbsError::NotFound(_))
    ));
    assert!(matches!(p.b.destroy_srq(srq), Err(VerbsError::NotFound(_))));
    // A QP cannot be created on a destroyed SRQ.
    let mut init = QpInitAttr::new(QpType::Rc, b.cq);
    init.srq = Some(srq);
    assert!(matches!(
        p.b.create_qp(b.pd, init),
        Err(VerbsError::NotFound(_))
    ));
}

#[test]
fn post_recv_on_a_qp_with_an_srq_is_an_error() {
    let mut p = Pair::new(1, Impairments::none());
    let b = side(&mut p.b);
    let srq = p.b.create_srq(b.pd, srq_attr(8)).unwrap();
    let q = qp_with(&mut p.b, &b, QpType::Rc, Some(srq));
    let plain = qp_with(&mut p.b, &b, QpType::Rc, None);
    let o = ConnectOpts::default();
    for qp in [q, plain] {
        bring_up(&mut p.b, qp, Qpn::new(0x42), IP_A, o.psn_b, o.psn_a, &o).unwrap();
    }
    let wr = || RecvWr {
        wr_id: 5,
        sg_list: [sge(&b.mr, 0, 64)].into(),
    };
    assert!(matches!(
        p.b.post_recv(q, wr()),
        Err(VerbsError::Invalid(_))
    ));
    p.b.post_recv(plain, wr()).unwrap();
    assert_eq!(p.b.srq_len(srq).unwrap(), 0);
}

#[test]
fn an_empty_srq_rnr_naks_then_delivers_after_post_srq_recv() {
    let mut b = bed(QpType::Rc, 4);
    let m = data(5, 200);
    write_a(&mut b.p, &b.a, 0, &m);
    b.send(0, 1, 0, m.len());
    let naks = |p: &mut Pair| p.b.counters().send_rnr_err;
    b.p.drive_until(100_000, |p| naks(p) >= 1).unwrap();
    assert_eq!(b.b_wcs(), vec![]);
    // The requester keeps trying (rnr_retry 7: forever); a WQE on the SRQ ends it.
    b.p.drive_until(1_000_000, |p| p.a.counters().rcvd_rnr_err >= 2)
        .unwrap();
    post_srq(&mut b.p.b, b.srq, &b.b.mr, 0);
    b.p.drive(1_000_000).unwrap();
    let w = b.b_wcs();
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        vec![(1000, WcStatus::Success, b.qb[0])]
    );
    assert_eq!(b.b_bytes(0, m.len()), m);
    let sent = b.p.a.poll_cq(b.a.cq, 4);
    assert_eq!(
        sent.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
}

#[test]
fn err_leaves_the_srq_wqes_and_raises_last_wqe_reached() {
    let mut b = bed(QpType::Rc, 8);
    for i in 0..3 {
        post_srq(&mut b.p.b, b.srq, &b.b.mr, i);
    }
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    b.p.b.modify_qp(b.qb[0], &err, QpAttrMask::STATE).unwrap();
    // Nothing flushed: the WQEs are the SRQ's.
    assert_eq!(b.b_wcs(), vec![]);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 3);
    assert_eq!(
        events(&mut b.p.b),
        vec![AsyncEvent::QpLastWqeReached(b.qb[0])]
    );
    // ERR again: no second event.
    b.p.b.modify_qp(b.qb[0], &err, QpAttrMask::STATE).unwrap();
    assert_eq!(events(&mut b.p.b), vec![]);
    // The other QP goes on receiving from the SRQ.
    write_a(&mut b.p, &b.a, 0, &data(8, 100));
    b.send(1, 1, 0, 100);
    b.p.drive(100_000).unwrap();
    let w = b.b_wcs();
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        vec![(1000, WcStatus::Success, b.qb[1])]
    );
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 2);
    // RESET keeps the QP on its SRQ: post_recv is still refused, destroy_srq still busy.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    b.p.b.modify_qp(b.qb[0], &reset, QpAttrMask::STATE).unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let m =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    b.p.b.modify_qp(b.qb[0], &init, m).unwrap();
    let r = b.p.b.post_recv(
        b.qb[0],
        RecvWr {
            wr_id: 1,
            sg_list: Default::default(),
        },
    );
    assert!(matches!(r, Err(VerbsError::Invalid(_))), "{r:?}");
    assert!(matches!(b.p.b.destroy_srq(b.srq), Err(VerbsError::Busy(_))));
}

#[test]
fn a_message_cut_by_err_flushes_only_its_own_wqe() {
    let mut b = bed(QpType::Rc, 8);
    for i in 0..3 {
        post_srq(&mut b.p.b, b.srq, &b.b.mr, i);
    }
    write_a(&mut b.p, &b.a, 0, &data(4, 3000));
    b.send(0, 1, 0, 3000);
    // Let the SEND FIRST land, hold the rest back: B is filling one SRQ WQE.
    let mut buf = vec![0u8; 10_000];
    let n = b.p.a.poll_transmit(b.p.now, &mut buf).unwrap();
    let now = b.p.now;
    b.p.b.handle_frame(now, &buf[..n]);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 2);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    b.p.b.modify_qp(b.qb[0], &err, QpAttrMask::STATE).unwrap();
    let w = b.b_wcs();
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        vec![(1000, WcStatus::WrFlushErr, b.qb[0])]
    );
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 2);
}

#[test]
fn bounds() {
    let mut p = Pair::new(1, Impairments::none());
    let b = side(&mut p.b);
    let d = p.b.query_device();
    assert!(
        d.max_srq > 0 && d.max_srq_wr > 0 && d.max_srq_sge > 0,
        "{d:?}"
    );
    let bad = |r: Result<SrqId, VerbsError>| matches!(r, Err(VerbsError::Invalid(_)));
    let mk = |w, s| SrqInitAttr {
        max_wr: w,
        max_sge: s,
        srq_limit: 0,
    };
    assert!(bad(p.b.create_srq(b.pd, mk(0, 1))));
    assert!(bad(p.b.create_srq(b.pd, mk(d.max_srq_wr + 1, 1))));
    assert!(bad(p.b.create_srq(b.pd, mk(4, 0))));
    assert!(bad(p.b.create_srq(b.pd, mk(4, d.max_srq_sge + 1))));
    assert!(matches!(
        p.b.create_srq(PdId(999), mk(4, 1)),
        Err(VerbsError::NotFound(_))
    ));
    // The largest allowed sizes are allowed, and the limit given at creation is ignored.
    let big =
        p.b.create_srq(b.pd, mk(d.max_srq_wr, d.max_srq_sge))
            .unwrap();
    p.b.destroy_srq(big).unwrap();
    let srq =
        p.b.create_srq(
            b.pd,
            SrqInitAttr {
                max_wr: 2,
                max_sge: 1,
                srq_limit: 1,
            },
        )
        .unwrap();
    assert_eq!(
        p.b.query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 2,
            max_sge: 1,
            srq_limit: 0
        }
    );
    // Too many SGEs; then full.
    let two = RecvWr {
        wr_id: 1,
        sg_list: [sge(&b.mr, 0, 8), sge(&b.mr, 8, 8)].into(),
    };
    assert!(matches!(
        p.b.post_srq_recv(srq, two),
        Err(VerbsError::Invalid(_))
    ));
    for i in 0..2 {
        post_srq(&mut p.b, srq, &b.mr, i);
    }
    assert!(matches!(
        p.b.post_srq_recv(
            srq,
            RecvWr {
                wr_id: 9,
                sg_list: Default::default()
            }
        ),
        Err(VerbsError::NoSpace(_))
    ));
    // modify: a limit above max_wr, a size below what it holds, 0 or above the device's: refused,
    // and nothing changes (the limit of a refused call is not armed).
    let m = |p: &mut Pair, w, l| matches!(p.b.modify_srq(srq, w, l), Err(VerbsError::Invalid(_)));
    assert!(m(&mut p, None, Some(3)));
    assert!(m(&mut p, Some(1), Some(1)));
    assert!(m(&mut p, Some(0), None));
    assert!(m(&mut p, Some(d.max_srq_wr + 1), Some(1)));
    assert!(m(&mut p, Some(4), Some(5)));
    assert_eq!(
        p.b.query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 2,
            max_sge: 1,
            srq_limit: 0
        }
    );
    // Growing it makes room; the limit may then be as large as the new size.
    p.b.modify_srq(srq, Some(4), Some(4)).unwrap();
    assert_eq!(p.b.query_srq(srq).unwrap().srq_limit, 4);
    post_srq(&mut p.b, srq, &b.mr, 2);
    p.b.modify_srq(srq, None, Some(0)).unwrap();
    assert_eq!(p.b.query_srq(srq).unwrap().srq_limit, 0);
    // A QP on an SRQ of another PD is refused.
    let pd2 = p.b.alloc_pd();
    let mut init = QpInitAttr::new(QpType::Rc, b.cq);
    init.srq = Some(srq);
    assert!(matches!(
        p.b.create_qp(pd2, init),
        Err(VerbsError::Invalid(_))
    ));
    // The QP's own receive capacities do not matter with an SRQ (above max_qp_wr here).
    init.cap.max_recv_wr = u32::MAX;
    p.b.create_qp(b.pd, init).unwrap();
}

#[test]
fn the_async_event_queue_is_bounded_and_counts_what_it_drops() {
    let mut p = Pair::new(1, Impairments::none());
    let b = side(&mut p.b);
    let srq = p.b.create_srq(b.pd, srq_attr(8)).unwrap();
    let q = qp_with(&mut p.b, &b, QpType::Ud, Some(srq));
    let to = |s| QpAttr {
        qp_state: s,
        ..Default::default()
    };
    let extra = 10;
    for _ in 0..ASYNC_EVENTS_MAX + extra {
        p.b.modify_qp(q, &to(QpState::Err), QpAttrMask::STATE)
            .unwrap();
        p.b.modify_qp(q, &to(QpState::Reset), QpAttrMask::STATE)
            .unwrap();
    }
    let got = events(&mut p.b);
    assert_eq!(got.len(), ASYNC_EVENTS_MAX);
    assert!(got.iter().all(|e| *e == AsyncEvent::QpLastWqeReached(q)));
    assert_eq!(p.b.counters().async_events_dropped, extra as u64);
    assert_eq!(events(&mut p.b), vec![]);
}

/// The same through the threaded `Loopback` and `api::Device`, in real time.
#[test]
fn rc_send_through_an_srq_over_the_loopback() {
    let lo = Loopback::start(11, Impairments::none());
    let a = lo.a.with(side);
    let b = lo.b.with(side);
    let srq = lo.b.with(|r| r.create_srq(b.pd, srq_attr(8))).unwrap();
    let qa = lo.a.with(|r| qp_with(r, &a, QpType::Rc, None));
    let qb = lo.b.with(|r| qp_with(r, &b, QpType::Rc, Some(srq)));
    let o = ConnectOpts::default();
    lo.a.with(|r| bring_up(r, qa, qb, IP_B, o.psn_a, o.psn_b, &o))
        .unwrap();
    lo.b.with(|r| bring_up(r, qb, qa, IP_A, o.psn_b, o.psn_a, &o))
        .unwrap();
    lo.b.with(|r| post_srq(r, srq, &b.mr, 0));
    let m = data(6, 700);
    lo.a.write_mr(a.mr.lkey, 0, &m).unwrap();
    lo.a.post_send(qa, send(&a, 1, 0, m.len())).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let w = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), lo.b.wait_wcs(b.cq, 1))
            .await
            .expect("no receive completion within 20 s")
            .unwrap()
    });
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].qp_num, w[0].byte_len),
        (1000, WcStatus::Success, qb, 700)
    );
    let mut got = vec![0u8; m.len()];
    lo.b.read_mr(b.mr.lkey, 0, &mut got).unwrap();
    assert_eq!(got, m);
}

#[test]
fn a_uc_message_cut_by_a_gap_gives_its_wqe_back_to_the_srq() {
    let mut b = bed(QpType::Uc, 4);
    post_srq(&mut b.p.b, b.srq, &b.b.mr, 0);
    write_a(&mut b.p, &b.a, 0, &data(1, 3000));
    b.send(0, 1, 0, 3000);
    // FIRST, MIDDLE, LAST: the MIDDLE is lost.
    let mut frames = Vec::new();
    let mut buf = vec![0u8; 10_000];
    while let Some(n) = b.p.a.poll_transmit(b.p.now, &mut buf) {
        frames.push(buf[..n].to_vec());
    }
    assert_eq!(frames.len(), 3);
    let now = b.p.now;
    b.p.b.handle_frame(now, &frames[0]);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 0);
    b.p.b.handle_frame(now, &frames[2]);
    assert_eq!(b.b_wcs(), vec![]);
    assert_eq!(b.p.b.srq_len(b.srq).unwrap(), 1);
    // The next message takes that WQE.
    let m = data(2, 100);
    write_a(&mut b.p, &b.a, 0, &m);
    b.send(1, 2, 0, m.len());
    b.p.drive(100_000).unwrap();
    let w = b.b_wcs();
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len, w.qp_num))
            .collect::<Vec<_>>(),
        vec![(1000, WcStatus::Success, 100, b.qb[1])]
    );
    assert_eq!(b.b_bytes(0, m.len()), m);
}
