//! Unmaking objects: `destroy_cq` refused (EBUSY) while a QP sends or receives on the CQ,
//! `dealloc_pd` refused while an MR, a QP or an SRQ of the PD lives; the handles of destroyed
//! objects reach nothing (not the object that reuses the slot); a create/destroy loop keeps
//! the tables bounded.
use rocemu_emulator::inproc::{IP_A, MAC_A};
use rocemu_emulator::rnic::*;

fn nic() -> Rnic {
    Rnic::new(RnicConfig::new(MAC_A, IP_A, 41))
}

fn busy<T: std::fmt::Debug>(r: Result<T, VerbsError>) {
    assert!(matches!(r, Err(VerbsError::Busy(_))), "{r:?}");
}

fn not_found<T: std::fmt::Debug>(r: Result<T, VerbsError>) {
    assert!(matches!(r, Err(VerbsError::NotFound(_))), "{r:?}");
}

#[test]
fn destroy_cq_is_busy_while_a_qp_uses_it_as_send_or_recv_cq() {
    let mut r = nic();
    let pd = r.alloc_pd();
    let scq = r.create_cq(16).unwrap();
    let rcq = r.create_cq(16).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, scq);
    init.recv_cq = rcq;
    let qp = r.create_qp(pd, init).unwrap();
    busy(r.destroy_cq(scq));
    busy(r.destroy_cq(rcq));
    // Refused: the CQs are untouched.
    r.req_notify_cq(scq, false).unwrap();
    r.req_notify_cq(rcq, false).unwrap();
    r.destroy_qp(qp).unwrap();
    r.destroy_cq(scq).unwrap();
    r.destroy_cq(rcq).unwrap();
    not_found(r.destroy_cq(scq));
    not_found(r.req_notify_cq(rcq, false));
    not_found(r.destroy_cq(CqId(12345)));
    // A QP cannot be created on a destroyed CQ.
    not_found(r.create_qp(pd, QpInitAttr::new(QpType::Rc, scq)));
}

#[test]
fn a_destroyed_cqs_handle_does_not_reach_the_cq_in_its_reused_slot() {
    let mut r = nic();
    let pd = r.alloc_pd();
    let old = r.create_cq(4).unwrap();
    r.destroy_cq(old).unwrap();
    let new = r.create_cq(4).unwrap();
    assert_ne!(old, new);
    assert_eq!(r.cq_table_size(), (1, 1), "the slot was reused");
    not_found(r.req_notify_cq(old, false));
    not_found(r.try_poll_cq(old, 4, &mut Vec::new()));
    not_found(r.destroy_cq(old));
    not_found(r.create_qp(pd, QpInitAttr::new(QpType::Ud, old)));
    // The new CQ works: a QP on it, its flushed receive lands in it, not in the old handle.
    let qp = r.create_qp(pd, QpInitAttr::new(QpType::Ud, new)).unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    use QpAttrMask as M;
    r.modify_qp(qp, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    r.post_recv(
        qp,
        RecvWr {
            wr_id: 9,
            sg_list: Default::default(),
        },
    )
    .unwrap();
    a.qp_state = QpState::Err;
    r.modify_qp(qp, &a, M::STATE).unwrap();
    assert_eq!(r.poll_cq(old, 4), vec![]);
    let w = r.poll_cq(new, 4);
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].wr_id, w[0].status), (9, WcStatus::WrFlushErr));
}

#[test]
fn destroy_cq_drops_its_pending_event() {
    let mut r = nic();
    let pd = r.alloc_pd();
    let cq = r.create_cq(4).unwrap();
    let qp = r.create_qp(pd, QpInitAttr::new(QpType::Ud, cq)).unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    use QpAttrMask as M;
    r.modify_qp(qp, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    r.post_recv(
        qp,
        RecvWr {
            wr_id: 1,
            sg_list: Default::default(),
        },
    )
    .unwrap();
    r.req_notify_cq(cq, false).unwrap();
    a.qp_state = QpState::Err;
    r.modify_qp(qp, &a, M::STATE).unwrap();
    r.destroy_qp(qp).unwrap();
    r.destroy_cq(cq).unwrap();
    let mut ev = Vec::new();
    r.take_cq_events(&mut ev);
    assert_eq!(ev, vec![], "the destroyed CQ's event went with it");
}

#[test]
fn a_hundred_thousand_create_destroy_cq_cycles_keep_the_cq_table_bounded() {
    let mut r = nic();
    let keep = r.create_cq(8).unwrap();
    let mut last = None;
    for i in 0..100_000u32 {
        let cq = r.create_cq(1 + (i as usize % 64)).unwrap();
        assert_ne!(Some(cq), last, "a new handle each time");
        r.destroy_cq(cq).unwrap();
        last = Some(cq);
    }
    assert_eq!(r.cq_table_size(), (1, 2));
    r.req_notify_cq(keep, false).unwrap();
}

#[test]
fn create_cq_stops_at_max_cq() {
    let mut r = nic();
    let max = r.query_device().max_cq as usize;
    let mut cqs = Vec::with_capacity(max);
    for _ in 0..max {
        cqs.push(r.create_cq(1).unwrap());
    }
    assert!(matches!(r.create_cq(1), Err(VerbsError::NoSpace(_))));
    r.destroy_cq(cqs[max / 2]).unwrap();
    r.create_cq(1).unwrap();
    assert_eq!(r.cq_table_size(), (max, max));
}

#[test]
fn dealloc_pd_is_busy_while_an_mr_a_qp_or_an_srq_lives() {
    let mut r = nic();
    let pd = r.alloc_pd();
    let other = r.alloc_pd();
    let cq = r.create_cq(16).unwrap();

    let mr = r.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    busy(r.dealloc_pd(pd));
    r.dereg_mr(mr.lkey).unwrap();

    let qp = r.create_qp(pd, QpInitAttr::new(QpType::Rc, cq)).unwrap();
    busy(r.dealloc_pd(pd));
    r.destroy_qp(qp).unwrap();

    let srq = r
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    busy(r.dealloc_pd(pd));
    r.destroy_srq(srq).unwrap();

    // Another PD's objects do not hold this one.
    let mr2 = r.reg_mr(other, 4096, Access::LOCAL_WRITE).unwrap();
    r.dealloc_pd(pd).unwrap();
    not_found(r.dealloc_pd(pd));
    not_found(r.reg_mr(pd, 4096, Access::LOCAL_WRITE));
    not_found(r.create_qp(pd, QpInitAttr::new(QpType::Rc, cq)));
    busy(r.dealloc_pd(other));
    r.dereg_mr(mr2.lkey).unwrap();
    r.dealloc_pd(other).unwrap();
}

#[test]
fn a_deallocated_pds_handle_does_not_reach_the_pd_in_its_reused_slot() {
    let mut r = nic();
    let mut last = r.try_alloc_pd().unwrap();
    r.dealloc_pd(last).unwrap();
    for _ in 0..10_000 {
        let pd = r.try_alloc_pd().unwrap();
        assert_ne!(pd, last);
        not_found(r.reg_mr(last, 64, Access::LOCAL_WRITE));
        not_found(r.dealloc_pd(last));
        r.dealloc_pd(pd).unwrap();
        last = pd;
    }
}

#[test]
fn try_alloc_pd_stops_at_max_pd() {
    let mut r = nic();
    let max = r.query_device().max_pd as usize;
    let pds: Vec<PdId> = (0..max).map(|_| r.try_alloc_pd().unwrap()).collect();
    assert!(matches!(r.try_alloc_pd(), Err(VerbsError::NoSpace(_))));
    let beyond = r.alloc_pd();
    not_found(r.reg_mr(beyond, 64, Access::LOCAL_WRITE));
    r.dealloc_pd(pds[7]).unwrap();
    r.try_alloc_pd().unwrap();
}
