//! A CQ too small for its completions: as with rxe (`rxe_cq_post` raises `IB_EVENT_CQ_ERR` and
//! fails; the responder then moves its QP to ERR), the CQ goes to error, the asynchronous event
//! `IBV_EVENT_CQ_ERR` comes, the QPs on it go to ERR (`IBV_EVENT_QP_FATAL`), and polling it
//! reports the error instead of waiting forever.
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Impairments, Loopback, Pair, Side, IP_A, IP_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_wire::Qpn;
use std::time::Duration;

struct End {
    qp: Qpn,
    cq: CqId,
    mr: MrInfo,
}

fn open(r: &mut Rnic, depth: usize) -> End {
    let pd = r.alloc_pd();
    let cq = r.create_cq(depth).unwrap();
    let qp = r.create_qp(pd, QpInitAttr::new(QpType::Rc, cq)).unwrap();
    let mr = r.reg_mr(pd, 1 << 16, Access::ALL).unwrap();
    End { qp, cq, mr }
}

fn writes<'e>(a: &'e End, b: &'e End, n: u64) -> impl Iterator<Item = SendWr> + 'e {
    (0..n).map(move |i| {
        SendWr::new(
            i,
            WrOpcode::RdmaWrite {
                remote_addr: b.mr.addr + i * 64,
                rkey: b.mr.rkey,
            },
            vec![Sge {
                addr: a.mr.addr,
                length: 64,
                lkey: a.mr.lkey,
            }],
        )
    })
}

#[test]
fn a_full_cq_goes_to_error_and_takes_its_qps_with_it() {
    let mut p = Pair::new(21, Impairments::none());
    let a = open(p.rnic(Side::A), 4);
    let b = open(p.rnic(Side::B), 64);
    // A second QP on A's CQ, idle, goes to ERR too; one on another CQ does not.
    let pd = p.a.alloc_pd();
    let other_cq = p.a.create_cq(64).unwrap();
    let same =
        p.a.create_qp(pd, QpInitAttr::new(QpType::Rc, a.cq))
            .unwrap();
    let apart =
        p.a.create_qp(pd, QpInitAttr::new(QpType::Rc, other_cq))
            .unwrap();
    p.connect(a.qp, b.qp, &ConnectOpts::default()).unwrap();
    let o = ConnectOpts::default();
    for q in [same, apart] {
        bring_up(&mut p.a, q, b.qp, IP_B, o.psn_a, o.psn_b, &o).unwrap();
        // Work queued on the QP that shares the CQ: flushed, its completions lost with the CQ.
        p.a.post_recv(
            q,
            RecvWr {
                wr_id: 77,
                sg_list: Default::default(),
            },
        )
        .unwrap();
    }
    for wr in writes(&a, &b, 10).collect::<Vec<_>>() {
        p.a.post_send(a.qp, wr).unwrap();
    }
    p.drive(100_000).unwrap();
    assert_eq!(p.a.poll_async_event(), Some(AsyncEvent::CqErr(a.cq)));
    let mut fatal = vec![p.a.poll_async_event(), p.a.poll_async_event()];
    fatal.sort_by_key(|e| format!("{e:?}"));
    let mut want = vec![
        Some(AsyncEvent::QpFatal(a.qp)),
        Some(AsyncEvent::QpFatal(same)),
    ];
    want.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(fatal, want);
    assert_eq!(p.a.poll_async_event(), None);
    assert_eq!(p.a.qp_state(a.qp).unwrap(), QpState::Err);
    assert_eq!(p.a.qp_state(same).unwrap(), QpState::Err);
    assert_eq!(p.a.qp_state(apart).unwrap(), QpState::Rts);
    assert!(p.a.cq_overflowed(a.cq));
    assert!(p.a.counters().cq_overflow >= 1);
    // The four completions that made it are there; then the error.
    let mut wcs = Vec::new();
    assert_eq!(p.a.try_poll_cq(a.cq, 16, &mut wcs), Ok(4));
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let e = p.a.try_poll_cq(a.cq, 16, &mut wcs).unwrap_err();
    assert_eq!(e, VerbsError::CqOverrun { cq: a.cq, depth: 4 });
    assert!(e.to_string().starts_with("CQ overflow: "), "{e}");
    assert_eq!(p.a.cq_error(a.cq), Some(e));
    assert_eq!(p.a.cq_error(other_cq), None);
    // Later work on the QPs completes nowhere, and fails nothing else.
    p.a.post_send(a.qp, writes(&a, &b, 1).next().unwrap())
        .unwrap();
    p.drive(1000).unwrap();
    assert!(p.a.try_poll_cq(a.cq, 16, &mut wcs).is_err());
    assert_eq!(p.a.poll_cq(other_cq, 16), vec![]);
}

#[test]
fn wait_wcs_and_next_wc_return_the_error_instead_of_hanging() {
    let lo = Loopback::start(3, Default::default());
    let (a, b) = (lo.a.with(|r| open(r, 4)), lo.b.with(|r| open(r, 64)));
    let o = ConnectOpts::default();
    lo.a.with(|r| bring_up(r, a.qp, b.qp, IP_B, o.psn_a, o.psn_b, &o))
        .unwrap();
    lo.b.with(|r| bring_up(r, b.qp, a.qp, IP_A, o.psn_b, o.psn_a, &o))
        .unwrap();
    for wr in writes(&a, &b, 10).collect::<Vec<_>>() {
        lo.a.post_send(a.qp, wr).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = tokio::time::timeout(Duration::from_secs(20), lo.a.wait_wcs(a.cq, 10))
            .await
            .expect("wait_wcs hangs on an overflowed CQ");
        let e = r.unwrap_err();
        assert!(e.to_string().starts_with("CQ overflow: "), "{e}");
        let r = tokio::time::timeout(Duration::from_secs(20), lo.a.next_wc(a.cq))
            .await
            .expect("next_wc hangs on an overflowed CQ");
        assert!(r.is_err(), "{r:?}");
    });
    assert_eq!(
        lo.a.with(|r| r.poll_async_event()),
        Some(AsyncEvent::CqErr(a.cq))
    );
}

/// `ibv_resize_cq`: a CQ made bigger takes what would have overflowed it; one made smaller
/// must still hold what waits in it (EINVAL otherwise, as rxe's `rxe_cq_chk_attr`), and then
/// overflows at its new depth.
#[test]
fn resize_cq_moves_the_depth_the_overflow_is_judged_by() {
    let mut p = Pair::new(22, Impairments::none());
    let a = open(p.rnic(Side::A), 4);
    let b = open(p.rnic(Side::B), 64);
    p.connect(a.qp, b.qp, &ConnectOpts::default()).unwrap();
    p.a.resize_cq(a.cq, 16).unwrap();
    for wr in writes(&a, &b, 10).collect::<Vec<_>>() {
        p.a.post_send(a.qp, wr).unwrap();
    }
    p.drive(100_000).unwrap();
    assert_eq!(p.a.poll_async_event(), None);
    assert!(!p.a.cq_overflowed(a.cq));
    assert_eq!(p.a.cq_pending(a.cq), Ok(10));
    // Ten wait: nine is too few, ten is enough; zero and above max_cqe never are.
    let max = p.a.query_device().max_cqe as usize;
    for bad in [0, 9, max + 1] {
        let e = p.a.resize_cq(a.cq, bad).unwrap_err();
        assert!(matches!(e, VerbsError::Invalid(_)), "{bad}: {e:?}");
    }
    p.a.resize_cq(a.cq, 10).unwrap();
    let wcs = p.a.poll_cq(a.cq, 64);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..10).collect::<Vec<_>>(),
        "the completions kept, in order"
    );
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    // Now ten is the depth: the eleventh completion overflows it.
    for wr in writes(&a, &b, 11).collect::<Vec<_>>() {
        p.a.post_send(a.qp, wr).unwrap();
    }
    p.drive(100_000).unwrap();
    assert_eq!(p.a.poll_async_event(), Some(AsyncEvent::CqErr(a.cq)));
    let e = p.a.cq_error(a.cq).unwrap();
    assert_eq!(
        e,
        VerbsError::CqOverrun {
            cq: a.cq,
            depth: 10
        }
    );
    // A CQ that is gone is not found.
    let gone = p.a.create_cq(4).unwrap();
    p.a.destroy_cq(gone).unwrap();
    assert!(matches!(
        p.a.resize_cq(gone, 8),
        Err(VerbsError::NotFound(_))
    ));
    assert!(matches!(p.a.cq_pending(gone), Err(VerbsError::NotFound(_))));
}

/// A work request that fails as its payload is gathered (its SGE's region is of another PD:
/// LOC_PROT_ERR) sends no frame but makes a completion, and `completions_made` says so: it is
/// what a driver that keeps "this CQ is still empty" outside the RNIC's lock must watch.
#[test]
fn a_completion_without_a_frame_is_counted_as_made() {
    let mut p = Pair::new(23, Impairments::none());
    let a = open(p.rnic(Side::A), 16);
    let b = open(p.rnic(Side::B), 16);
    p.connect(a.qp, b.qp, &ConnectOpts::default()).unwrap();
    let pd2 = p.a.alloc_pd();
    let other = p.a.reg_mr(pd2, 4096, Access::ALL).unwrap();
    let made = p.a.completions_made();
    let mut wr = writes(&a, &b, 1).next().unwrap();
    wr.sg_list = vec![Sge {
        addr: other.addr,
        length: 64,
        lkey: other.lkey,
    }]
    .into();
    p.a.post_send(a.qp, wr).unwrap();
    let mut buf = vec![0u8; 9000];
    assert_eq!(p.a.poll_transmit(p.now, &mut buf), None, "nothing to send");
    assert_eq!(p.a.completions_made(), made + 1);
    let wcs = p.a.poll_cq(a.cq, 4);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    // Polling takes completions; it makes none.
    assert_eq!(p.a.completions_made(), made + 1);
}
