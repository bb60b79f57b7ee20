//! The QP state machine through the Rnic API (IBTA 10.3.1, unverified; the table itself is
//! unit-tested in rnic/state.rs): what may be posted in which state, ERR flushes, RESET clears,
//! invalid transitions and masks are refused and leave the QP as it was, SQD drains, SQE on UD/UC.
mod common;
use common::*;
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Side::A, Side::B, IP_A, IP_B};
use rocemu_emulator::rnic::*;
use rocemu_wire::{Psn, Qpn};

fn fresh_qp(r: &mut Rnic, t: QpType) -> (Qpn, CqId, PdId) {
    let pd = r.alloc_pd();
    let cq = r.create_cq(64).unwrap();
    let qp = r
        .create_qp(
            pd,
            QpInitAttr {
                qp_type: t,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                cap: QpCap::default(),
                sq_sig_all: false,
            },
        )
        .unwrap();
    (qp, cq, pd)
}

fn init_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::ALL,
        ..Default::default()
    }
}

const INIT_MASK: QpAttrMask = QpAttrMask(
    QpAttrMask::STATE.0
        | QpAttrMask::PKEY_INDEX.0
        | QpAttrMask::PORT.0
        | QpAttrMask::ACCESS_FLAGS.0,
);

fn rtr_attr() -> (QpAttr, QpAttrMask) {
    let a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::M1024,
        dest_qp_num: Qpn::new(0x42),
        rq_psn: Psn::new(5),
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr::to(IP_B, rocemu_emulator::inproc::MAC_B),
        ..Default::default()
    };
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    (a, m)
}

fn send(id: u64) -> SendWr {
    SendWr::new(id, WrOpcode::Send, vec![])
}

fn recv(id: u64) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: Default::default(),
    }
}

#[test]
fn post_send_needs_rts_post_recv_needs_init() {
    let mut t = Bed::rc();
    let r = &mut t.p.a;
    let (qp, cq, _) = fresh_qp(r, QpType::Rc);
    // RESET: neither (IBTA 10.3.1, unverified: work requests may not be posted in RESET).
    assert!(matches!(
        r.post_send(qp, send(1)),
        Err(VerbsError::Invalid(_))
    ));
    assert!(matches!(
        r.post_recv(qp, recv(1)),
        Err(VerbsError::Invalid(_))
    ));
    r.modify_qp(qp, &init_attr(), INIT_MASK).unwrap();
    // INIT: receives yes, sends no.
    assert!(matches!(
        r.post_send(qp, send(2)),
        Err(VerbsError::Invalid(_))
    ));
    r.post_recv(qp, recv(2)).unwrap();
    let (a, m) = rtr_attr();
    r.modify_qp(qp, &a, m).unwrap();
    assert_eq!(r.qp_state(qp).unwrap(), QpState::Rtr);
    // RTR: still no sends.
    assert!(matches!(
        r.post_send(qp, send(3)),
        Err(VerbsError::Invalid(_))
    ));
    r.post_recv(qp, recv(3)).unwrap();
    assert!(
        r.poll_cq(cq, 16).is_empty(),
        "refused WRs leave no completion"
    );
    assert_eq!(r.query_qp(qp).unwrap().rq_psn, Psn::new(5));
    assert_eq!(r.query_qp(qp).unwrap().dest_qp_num, Qpn::new(0x42));
}

#[test]
fn modify_to_err_flushes_sq_and_rq_signaled_or_not() {
    let mut t = Bed::rc();
    // Nothing reaches B: the sends stay outstanding.
    t.filter = drop_dir(Dir::AB);
    t.post_recv(A, 10, 0, 64);
    t.post_recv(A, 11, 64, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let mut u = wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    u.flags = SendFlags::default();
    t.post_send(A, u);
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.flush_now();
    assert_eq!(t.pkts(Dir::AB).len(), 3);
    let qa = t.a.qp;
    t.p.a
        .modify_qp(
            qa,
            &QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    // IBTA 10.3.1.5 / 11.4.2.2 (unverified): every outstanding WR completes with WR_FLUSH_ERR,
    // unsignaled ones included, sends in order, receives in order.
    let w = t.wcs(A);
    assert_eq!(
        st(&w),
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(w[0].opcode, WcOpcode::Send);
    assert_eq!(w[2].opcode, WcOpcode::RdmaRead);
    assert_eq!(w[3].opcode, WcOpcode::Recv);
    assert_eq!(t.state(A), QpState::Err);
    assert_eq!(t.p.a.poll_timeout(), None, "no timer left running");
    // Posting in ERR is allowed and completes at once with WR_FLUSH_ERR.
    t.post_send(A, wr(4, WrOpcode::Send, vec![]));
    let qa = t.a.qp;
    t.p.a.post_recv(qa, recv(12)).unwrap();
    assert_eq!(
        st(&t.wcs(A)),
        vec![(4, WcStatus::WrFlushErr), (12, WcStatus::WrFlushErr)]
    );
    t.flush_now();
    assert_eq!(t.pkts(Dir::AB).len(), 3, "nothing sent from ERR");
    // Frames to a QP in ERR are dropped.
    let before = t.p.a.counters().rx_drop_qp_state;
    t.filter = Box::new(|_| Verdict::Pass);
    t.post_recv(B, 1, 0, 64);
    t.post_send(B, wr(7, WrOpcode::Send, vec![t.sge(B, 0, 8)]));
    t.flush_now();
    assert_eq!(t.p.a.counters().rx_drop_qp_state, before + 1);
    assert!(t.acks(Dir::AB).is_empty());
}

#[test]
fn invalid_transitions_and_masks_are_refused_and_change_nothing() {
    let mut t = Bed::rc();
    let r = &mut t.p.a;
    let (qp, _, _) = fresh_qp(r, QpType::Rc);
    let to = |s| QpAttr {
        qp_state: s,
        ..init_attr()
    };
    // Skipping states.
    assert!(r
        .modify_qp(qp, &to(QpState::Rtr), QpAttrMask::STATE)
        .is_err());
    assert!(r
        .modify_qp(qp, &to(QpState::Rts), QpAttrMask::STATE)
        .is_err());
    assert!(r
        .modify_qp(qp, &to(QpState::Sqd), QpAttrMask::STATE)
        .is_err());
    // RC has no SQE.
    assert!(r
        .modify_qp(qp, &to(QpState::Sqe), QpAttrMask::STATE)
        .is_err());
    // RESET → INIT without ACCESS_FLAGS; with a Q_Key (a UD attribute).
    assert!(r
        .modify_qp(
            qp,
            &init_attr(),
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT
        )
        .is_err());
    assert!(r
        .modify_qp(qp, &init_attr(), INIT_MASK | QpAttrMask::QKEY)
        .is_err());
    assert_eq!(r.qp_state(qp).unwrap(), QpState::Reset);
    r.modify_qp(qp, &init_attr(), INIT_MASK).unwrap();
    // INIT → RTR without MIN_RNR_TIMER; with an attribute RTR does not take (SQ_PSN).
    let (a, m) = rtr_attr();
    assert!(r
        .modify_qp(qp, &a, m.minus(QpAttrMask::MIN_RNR_TIMER))
        .is_err());
    assert!(r.modify_qp(qp, &a, m | QpAttrMask::SQ_PSN).is_err());
    // Values out of range.
    let mut big = a;
    big.path_mtu = Mtu::M4096;
    let mut small_nic = Rnic::new(RnicConfig {
        eth_mtu: 1500,
        ..RnicConfig::new(rocemu_emulator::inproc::MAC_A, IP_A, 9)
    });
    let (q2, _, _) = fresh_qp(&mut small_nic, QpType::Rc);
    small_nic.modify_qp(q2, &init_attr(), INIT_MASK).unwrap();
    assert!(
        small_nic.modify_qp(q2, &big, m).is_err(),
        "path MTU above the active MTU (1024)"
    );
    assert_eq!(r.qp_state(qp).unwrap(), QpState::Init);
    assert_eq!(
        r.query_qp(qp).unwrap().rq_psn,
        Psn::new(0),
        "nothing applied"
    );
    r.modify_qp(qp, &a, m).unwrap();
    // RTR → RTS without the retry attributes.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: Psn::new(9),
        ..a
    };
    assert!(r
        .modify_qp(qp, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .is_err());
    let rts_mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    let mut bad = rts;
    bad.retry_cnt = 8;
    assert!(
        r.modify_qp(qp, &bad, rts_mask).is_err(),
        "retry_cnt above 7"
    );
    // cur_qp_state must match.
    let mut cur = rts;
    cur.cur_qp_state = QpState::Init;
    assert!(r
        .modify_qp(qp, &cur, rts_mask | QpAttrMask::CUR_STATE)
        .is_err());
    assert_eq!(r.qp_state(qp).unwrap(), QpState::Rtr);
    r.modify_qp(qp, &rts, rts_mask).unwrap();
    assert_eq!(r.query_qp(qp).unwrap().sq_psn, Psn::new(9));
    // Back to INIT or RTR from RTS: no such transitions.
    assert!(r
        .modify_qp(qp, &to(QpState::Init), QpAttrMask::STATE)
        .is_err());
    assert!(r
        .modify_qp(qp, &to(QpState::Rtr), QpAttrMask::STATE)
        .is_err());
    // ERR → anything but RESET/ERR: refused.
    r.modify_qp(qp, &to(QpState::Err), QpAttrMask::STATE)
        .unwrap();
    assert!(r
        .modify_qp(qp, &to(QpState::Rts), QpAttrMask::STATE)
        .is_err());
    assert!(r.modify_qp(qp, &init_attr(), INIT_MASK).is_err());
    assert_eq!(r.qp_state(qp).unwrap(), QpState::Err);
}

#[test]
fn reset_clears_the_qp_and_it_can_be_connected_again() {
    let mut t = Bed::rc();
    t.post_recv(B, 1, 0, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.wait_wcs(A, 1);
    assert_eq!(st(&t.wcs(B)), vec![(1, WcStatus::Success)]);
    t.post_recv(A, 50, 0, 64); // pending on A when it is reset
    let (qa, qb) = (t.a.qp, t.b.qp);
    for (r, q) in [(&mut t.p.a, qa), (&mut t.p.b, qb)] {
        r.modify_qp(
            q,
            &QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    }
    assert_eq!(t.state(A), QpState::Reset);
    let q = t.p.a.query_qp(qa).unwrap();
    assert_eq!(
        (q.sq_psn, q.rq_psn, q.dest_qp_num),
        (Psn::new(0), Psn::new(0), Qpn::new(0))
    );
    // IBTA 10.3.1.1 (unverified): RESET removes the queued WRs without completions.
    assert!(t.wcs(A).is_empty());
    // Connected again with other PSNs, it works, and the old receive is gone (RNR proves it).
    let o = ConnectOpts {
        psn_a: Psn::new(0x777),
        psn_b: Psn::new(0x888),
        min_rnr_timer: 1,
        ..Default::default()
    };
    bring_up(&mut t.p.a, qa, qb, IP_B, o.psn_a, o.psn_b, &o).unwrap();
    bring_up(&mut t.p.b, qb, qa, IP_A, o.psn_b, o.psn_a, &o).unwrap();
    t.clear_log();
    t.post_send(B, wr(2, WrOpcode::Send, vec![t.sge(B, 0, 8)]));
    t.flush_now();
    assert_eq!(
        t.acks(Dir::AB),
        vec![(0x888, rnr(1), 0)],
        "no receive left on A"
    );
    t.post_recv(A, 51, 0, 64);
    assert_eq!(st(&t.wait_wcs(B, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!(st(&t.wcs(A)), vec![(51, WcStatus::Success)]);
    assert_eq!(t.pkts(Dir::BA)[0].psn, 0x888);
}

#[test]
fn rtr_responds_but_does_not_send() {
    // A QP in RTR receives and acknowledges (IBTA 10.3.1.3, unverified) but its send queue is
    // closed.
    let mut p = rocemu_emulator::inproc::Pair::new(3, rocemu_emulator::inproc::Impairments::none());
    let cfg = BedCfg::new(QpType::Rc);
    let a = end(&mut p.a, QpType::Rc, false, cfg.cap);
    let b = end(&mut p.b, QpType::Rc, false, cfg.cap);
    let o = ConnectOpts::default();
    bring_up(&mut p.a, a.qp, b.qp, IP_B, o.psn_a, o.psn_b, &o).unwrap();
    // B only to RTR.
    p.b.modify_qp(b.qp, &init_attr(), INIT_MASK).unwrap();
    let (mut ra, m) = rtr_attr();
    ra.dest_qp_num = a.qp;
    ra.rq_psn = o.psn_a;
    ra.ah_attr = AhAttr::to(IP_A, rocemu_emulator::inproc::MAC_A);
    p.b.modify_qp(b.qp, &ra, m).unwrap();
    p.b.post_recv(
        b.qp,
        RecvWr {
            wr_id: 1,
            sg_list: Default::default(),
        },
    )
    .unwrap();
    p.a.post_send(a.qp, SendWr::new(1, WrOpcode::Send, vec![]))
        .unwrap();
    p.drive(10_000).unwrap();
    assert_eq!(st(&p.a.poll_cq(a.cq, 8)), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&p.b.poll_cq(b.cq, 8)), vec![(1, WcStatus::Success)]);
}

#[test]
fn sqd_drains_and_resumes() {
    let mut t = Bed::rc();
    for i in 0..3 {
        t.post_recv(B, i, 0, 64);
    }
    let qa = t.a.qp;
    t.p.a
        .modify_qp(
            qa,
            &QpAttr {
                qp_state: QpState::Sqd,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(t.state(A), QpState::Sqd);
    // Posting in SQD is allowed; nothing new starts until RTS again (IBTA 10.3.1.4, unverified).
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.flush_now();
    assert!(t.pkts(Dir::AB).is_empty());
    t.p.a
        .modify_qp(
            qa,
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
}

#[test]
fn ud_send_error_enters_sqe_and_rts_recovers() {
    // UD: a local error moves the QP to SQE, not ERR (IBTA 10.3.1.6, unverified); receives go on;
    // SQE → RTS resumes sending.
    let mut t = BedCfg::new(QpType::Ud).build();
    let dest = UdDest {
        ah: AhAttr::to(IP_B, rocemu_emulator::inproc::MAC_B),
        remote_qpn: t.b.qp,
        remote_qkey: rocemu_wire::QKey(0x1111_1111),
    };
    // A gather list with a wrong L_Key: LOC_PROT_ERR. (A message over the MTU is no error:
    // C10-93.1.1, see uc_ud.rs.)
    let mut bad_sge = t.sge(A, 0, 8);
    bad_sge.lkey ^= 0x0101_0101;
    let mut big = wr(1, WrOpcode::Send, vec![bad_sge]);
    big.ud = Some(dest);
    t.post_send(A, big);
    let mut next = wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
    next.ud = Some(dest);
    t.post_send(A, next.clone());
    t.flush_now();
    assert_eq!(
        st(&t.wcs(A)),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(t.state(A), QpState::Sqe);
    assert!(t.pkts(Dir::AB).is_empty());
    // Receives still work in SQE.
    t.post_recv(A, 9, 0, 100);
    let mut back = wr(3, WrOpcode::Send, vec![t.sge(B, 0, 8)]);
    back.ud = Some(UdDest {
        ah: AhAttr::to(IP_A, rocemu_emulator::inproc::MAC_A),
        remote_qpn: t.a.qp,
        remote_qkey: rocemu_wire::QKey(0x1111_1111),
    });
    t.post_send(B, back);
    t.flush_now();
    assert_eq!(st(&t.wcs(A)), vec![(9, WcStatus::Success)]);
    let qa = t.a.qp;
    t.p.a
        .modify_qp(
            qa,
            &QpAttr {
                qp_state: QpState::Rts,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    t.post_recv(B, 5, 0, 100);
    next.wr_id = 4;
    t.post_send(A, next);
    t.flush_now();
    assert_eq!(st(&t.wcs(A)), vec![(4, WcStatus::Success)]);
}
