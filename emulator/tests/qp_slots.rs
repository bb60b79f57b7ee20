//! A long-running process creates and destroys QPs for days: the RNIC's QP table and neighbour
//! table stay bounded, a reused slot gets a new QPN, and a packet for a destroyed QP's QPN never
//! reaches the QP created after it.
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{Impairments, Pair, Side, IP_A, IP_B, MAC_A};
use rocemu_emulator::rnic::*;
use rocemu_wire::Qpn;
use std::collections::HashSet;
use std::net::IpAddr;

fn rc(r: &mut Rnic, pd: PdId, cq: CqId) -> Qpn {
    r.create_qp(pd, QpInitAttr::new(QpType::Rc, cq)).unwrap()
}

#[test]
fn create_destroy_cycles_reuse_slots() {
    let mut r = Rnic::new(RnicConfig::new(MAC_A, IP_A, 7));
    let pd = r.alloc_pd();
    let cq = r.create_cq(16).unwrap();
    let keep: Vec<Qpn> = (0..10).map(|_| rc(&mut r, pd, cq)).collect();
    let mut seen = HashSet::new();
    for i in 0..300_000u32 {
        let q = r
            .create_qp(pd, QpInitAttr::new(QpType::Rc, cq))
            .unwrap_or_else(|e| panic!("creation {i}: {e}"));
        assert!(q.value() > 1 && q != Qpn::MULTICAST, "{q} is reserved");
        assert!(!keep.contains(&q));
        if i < 10_000 {
            // A tight create/destroy loop does not hand out a QPN again soon.
            assert!(seen.insert(q), "creation {i}: {q} again");
        }
        r.destroy_qp(q).unwrap();
    }
    // 300,010 creations; the table holds the 10 live QPs and a bounded reserve of free slots.
    assert!(r.qp_slots() <= 10 + 1024, "{} slots", r.qp_slots());
    for q in keep {
        assert_eq!(r.qp_state(q).unwrap(), QpState::Reset);
    }
}

#[test]
fn a_reused_slot_gets_a_new_qpn() {
    let mut r = Rnic::new(RnicConfig::new(MAC_A, IP_A, 9));
    let pd = r.alloc_pd();
    let cq = r.create_cq(16).unwrap();
    // Fill the free-slot reserve so that the next creations reuse one slot over and over.
    let first = rc(&mut r, pd, cq);
    r.destroy_qp(first).unwrap();
    let slots = r.qp_slots();
    let mut qpns = vec![first];
    for _ in 0..2000 {
        let q = rc(&mut r, pd, cq);
        qpns.push(q);
        r.destroy_qp(q).unwrap();
        // The stale QPN finds nothing.
        assert!(r.qp_state(q).is_err());
    }
    assert!(r.qp_slots() <= slots.max(1024));
    assert!(qpns.windows(2).all(|w| w[0] != w[1]), "{qpns:x?}");
}

/// B's UD QP is destroyed and another created (in its slot): a datagram to the old QPN is
/// counted `rx_no_qp` and completes nothing on the new QP; one to the new QPN arrives.
#[test]
fn a_stale_qpn_does_not_reach_the_new_qp() {
    let mut p = Pair::new(11, Impairments::none());
    let o = ConnectOpts::default();
    let (qa, cqa, mra) = {
        let a = p.rnic(Side::A);
        let pd = a.alloc_pd();
        let cq = a.create_cq(16).unwrap();
        let mr = a.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
        let q = a.create_qp(pd, QpInitAttr::new(QpType::Ud, cq)).unwrap();
        bring_up(a, q, Qpn::new(0), IP_B, o.psn_a, o.psn_b, &o).unwrap();
        (q, cq, mr)
    };
    let b = p.rnic(Side::B);
    let pd = b.alloc_pd();
    let cqb = b.create_cq(16).unwrap();
    let mrb = b.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let mut qb = None;
    let mut stale = Vec::new();
    // Create and destroy until a slot comes round again.
    for _ in 0..4096 {
        let q = b.create_qp(pd, QpInitAttr::new(QpType::Ud, cqb)).unwrap();
        bring_up(b, q, Qpn::new(0), IP_A, o.psn_b, o.psn_a, &o).unwrap();
        if b.qp_slots() <= stale.len() {
            qb = Some(q);
            break;
        }
        stale.push(q);
        b.destroy_qp(q).unwrap();
    }
    let qb = qb.expect("a slot is reused");
    assert!(!stale.contains(&qb));
    for i in 0..2 {
        b.post_recv(
            qb,
            RecvWr {
                wr_id: i,
                sg_list: [Sge {
                    addr: mrb.addr,
                    length: 40 + 64,
                    lkey: mrb.lkey,
                }]
                .into(),
            },
        )
        .unwrap();
    }
    let send = |p: &mut Pair, to: Qpn, id: u64| {
        let mut wr = SendWr::new(
            id,
            WrOpcode::Send,
            vec![Sge {
                addr: mra.addr,
                length: 16,
                lkey: mra.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            ah: AhAttr {
                dgid: Gid::from_ip(IP_B),
                hop_limit: 64,
                ..Default::default()
            },
            remote_qpn: to,
            remote_qkey: o.qkey,
        });
        p.a.post_send(qa, wr).unwrap();
        p.drive(10_000).unwrap();
        let w = p.a.poll_cq(cqa, 16);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].status, WcStatus::Success);
    };
    let before = p.b.counters().rx_drop_no_qp;
    for (i, &q) in stale.iter().enumerate() {
        send(&mut p, q, i as u64);
    }
    assert_eq!(p.b.counters().rx_drop_no_qp - before, stale.len() as u64);
    assert!(p.b.poll_cq(cqb, 16).is_empty(), "a stale QPN reached {qb}");
    send(&mut p, qb, 99);
    let w = p.b.poll_cq(cqb, 16);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].status, w[0].qp_num), (WcStatus::Success, qb));
}

/// The RNIC's neighbour table stays bounded under a flood of made-up neighbours, and a peer
/// that keeps being confirmed still resolves.
#[test]
fn the_neighbour_copy_is_bounded() {
    let mut r = Rnic::new(RnicConfig::new(MAC_A, IP_A, 13));
    let peer_mac = rocemu_wire::eth::Mac([2, 0, 0, 0, 0, 0x42]);
    r.set_neighbor(IP_B, peer_mac);
    for i in 0..100_000u32 {
        let ip = IpAddr::from((0x0a80_0000 + i).to_be_bytes());
        r.set_neighbor(ip, rocemu_wire::eth::Mac([2, 0, 0, 0, 1, i as u8]));
        if i % 1000 == 0 {
            // The engine confirms the live peer now and then.
            r.set_neighbor(IP_B, peer_mac);
        }
    }
    assert!(
        r.neighbor_count() <= rocemu_emulator::engine::Neighbors::CAPACITY,
        "{} entries",
        r.neighbor_count()
    );
    assert_eq!(r.neighbor(IP_B), Some(peer_mac));
}
