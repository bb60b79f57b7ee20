//! The in-process agent's rdma_cm service (`cm_listen` …) against the peer's rdma_cm client, in
//! virtual time: what it accepts and how, what it refuses, and that tearing down leaves nothing
//! behind on the wire.
use rocemu_conformance::agent::{Agent, CmConnState};
use rocemu_conformance::cm_peer::{self, Offer, Patience};
use rocemu_conformance::dut::{self_target, SelfLink, PEER_IP, PEER_MAC};
use rocemu_conformance::peer::Peer;
use rocemu_wire::cm::{CmMadRepr, CmMessage, CommId, Guid, MsgKind, RejReason, ServiceType};
use rocemu_wire::mad::{Tid, MAD_LEN};
use rocemu_wire::{Psn, Qpn};
use std::time::Duration;

const PORT: u16 = 7471;

fn offer(n: u32) -> Offer {
    Offer {
        comm_id: CommId(0x1000 + n),
        guid: Guid(0x0252_4fff_fe43_4520),
        qpn: Qpn::new(0x4200 + n),
        psn: Psn::new(0x10_0000 + n),
        src_port: 40000 + n as u16,
        path_mtu: 3,
        tid: Tid(0x77 + n as u64),
    }
}

fn setup() -> (
    rocemu_conformance::dut::SharedDut,
    rocemu_conformance::dut::SelfAgent,
    Peer,
) {
    let (dut, mut agent, link): (_, _, SelfLink) = self_target(5);
    let dev = agent.query_device().unwrap();
    let peer = Peer::new(Box::new(link), (PEER_MAC, PEER_IP), (dev.mac, dev.gids[0]));
    (dut, agent, peer)
}

fn patience() -> Patience {
    Patience::for_settle(Duration::from_millis(50))
}

#[test]
fn a_connection_is_accepted_established_and_ended_by_the_peer() {
    let (_dut, mut agent, mut peer) = setup();
    agent.cm_listen(PORT).unwrap();
    let o = offer(1);
    let a = cm_peer::connect(&mut peer, PORT, &o, patience()).unwrap();
    let c = agent.cm_connections().unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].qpn, c[0].psn, c[0].sq_psn, c[0].remote_qpn, c[0].peer),
        (a.rep.local_qpn, a.rep.starting_psn, o.psn, o.qpn, PEER_IP)
    );
    assert_eq!(c[0].state, CmConnState::Connecting);
    // The QP is up with what the REQ and the REP said.
    let q = agent.query_qp(a.rep.local_qpn).unwrap();
    assert_eq!(
        (q.rq_psn, q.sq_psn, q.dest_qp_num),
        (a.rep.starting_psn, o.psn, o.qpn)
    );
    cm_peer::rtu(&mut peer, &a).unwrap();
    assert_eq!(
        agent.cm_connections().unwrap()[0].state,
        CmConnState::Established
    );
    cm_peer::disconnect(&mut peer, &a, Tid(9), patience()).unwrap();
    assert_eq!(
        agent.cm_connections().unwrap()[0].state,
        CmConnState::Disconnected
    );
    agent.cm_stop(PORT).unwrap();
    assert!(agent.cm_connections().unwrap().is_empty());
    // Nothing more from the device's CM, however long we wait.
    assert!(peer.recv_mad(Duration::from_secs(120)).is_none());
}

#[test]
fn what_cannot_be_accepted_is_rejected() {
    let (_dut, mut agent, mut peer) = setup();
    // Nobody listens there: reason 8.
    agent.cm_listen(PORT + 1).unwrap();
    let e = cm_peer::connect(&mut peer, PORT, &offer(1), patience()).unwrap_err();
    assert!(e.contains("invalid service ID"), "{e}");
    agent.cm_listen(PORT).unwrap();
    // A UC REQ: reason 9, and no connection is listed.
    let o = offer(2);
    let mut r = cm_peer::req(&peer, PORT, &o).unwrap();
    r.transport_service_type = ServiceType::Uc;
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(o.tid, CmMessage::Req(r))
        .emit(&mut b)
        .unwrap();
    peer.send(&peer.craft_mad(&b)).unwrap();
    let (_, m) = peer.recv_mad(Duration::from_secs(1)).expect("a REJ");
    assert!(
        matches!(m.msg, CmMessage::Rej(j) if j.reason == RejReason::INVALID_TRANSPORT_TYPE && j.remote_comm_id == o.comm_id),
        "{m:?}"
    );
    assert!(agent.cm_connections().unwrap().is_empty());
    // After a stop: reason 8 again.
    agent.cm_stop(PORT).unwrap();
    let e = cm_peer::connect(&mut peer, PORT, &offer(3), patience()).unwrap_err();
    assert!(e.contains("invalid service ID"), "{e}");
}

#[test]
fn garbage_on_qp1_is_dropped_and_the_cm_still_answers() {
    let (_dut, mut agent, mut peer) = setup();
    agent.cm_listen(PORT).unwrap();
    let mut junk = [0u8; MAD_LEN];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    peer.send(&peer.craft_mad(&junk)).unwrap();
    // A CM MAD of an unknown attribute, and one cut short.
    let mut b = [0u8; MAD_LEN];
    CmMadRepr::new(
        Tid(1),
        CmMessage::Req(cm_peer::req(&peer, PORT, &offer(1)).unwrap()),
    )
    .emit(&mut b)
    .unwrap();
    let mut odd = b;
    odd[16..18].copy_from_slice(&0x00ffu16.to_be_bytes());
    peer.send(&peer.craft_mad(&odd)).unwrap();
    let short = peer.craft_mad(&b).payload(&b[..100]);
    peer.send(&short).unwrap();
    assert!(peer.recv_mad(Duration::from_secs(1)).is_none());
    assert!(agent.cm_connections().unwrap().is_empty());
    cm_peer::connect(&mut peer, PORT, &offer(2), patience()).unwrap();
}

#[test]
fn a_repeated_req_gets_the_same_rep() {
    let (_dut, mut agent, mut peer) = setup();
    agent.cm_listen(PORT).unwrap();
    let o = offer(1);
    let a = cm_peer::connect(&mut peer, PORT, &o, patience()).unwrap();
    let b = cm_peer::connect(&mut peer, PORT, &o, patience()).unwrap();
    assert_eq!(a.rep, b.rep);
    assert_eq!(agent.cm_connections().unwrap().len(), 1);
}

#[test]
fn teardown_says_goodbye_once() {
    let (_dut, mut agent, mut peer) = setup();
    agent.cm_listen(PORT).unwrap();
    // One established, one still waiting for its RTU.
    let up = cm_peer::connect(&mut peer, PORT, &offer(1), patience()).unwrap();
    cm_peer::rtu(&mut peer, &up).unwrap();
    let half = cm_peer::connect(&mut peer, PORT, &offer(2), patience()).unwrap();
    agent.cm_disconnect(half.rep.local_qpn).unwrap();
    assert!(
        agent.query_qp(half.rep.local_qpn).is_err(),
        "its QP is gone"
    );
    let (_, m) = peer.recv_mad(Duration::from_secs(1)).expect("a REJ");
    assert!(
        matches!(m.msg, CmMessage::Rej(j) if j.remote_comm_id == half.offer.comm_id && j.message_rejected == MsgKind::Rep),
        "{m:?}"
    );
    agent.reset().unwrap();
    let (_, m) = peer.recv_mad(Duration::from_secs(1)).expect("a DREQ");
    assert!(
        matches!(m.msg, CmMessage::Dreq(d) if d.remote_comm_id == up.offer.comm_id && d.remote_qpn == up.offer.qpn),
        "{m:?}"
    );
    assert!(agent.cm_connections().unwrap().is_empty());
    // No retransmission of the DREQ, nor of the REP the REJ withdrew.
    assert!(peer.recv_mad(Duration::from_secs(120)).is_none());
}

#[test]
fn hostile_cm_mads_do_not_break_it() {
    // Valid CM messages with random bytes of their message data replaced: REQs for the port
    // with odd transport types, MTUs, IDs and private data; stray RTUs, DREQs, REPs, REJs, MRAs.
    let (_dut, mut agent, mut peer) = setup();
    agent.cm_listen(PORT).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let base = cm_peer::req(&peer, PORT, &offer(1)).unwrap();
    for i in 0..3000u32 {
        let mut r = base;
        r.local_comm_id = CommId(rnd() as u32);
        let msg = match i % 6 {
            0 | 1 => CmMessage::Req(r),
            2 => CmMessage::Rtu(rocemu_wire::cm::RtuRepr {
                local_comm_id: CommId(rnd() as u32),
                remote_comm_id: CommId(rnd() as u32),
                ..Default::default()
            }),
            3 => CmMessage::Dreq(rocemu_wire::cm::DreqRepr {
                local_comm_id: CommId(rnd() as u32),
                remote_comm_id: CommId(rnd() as u32),
                ..Default::default()
            }),
            4 => CmMessage::Rej(rocemu_wire::cm::RejRepr {
                remote_comm_id: CommId(rnd() as u32),
                ..Default::default()
            }),
            _ => CmMessage::Rep(rocemu_wire::cm::RepRepr {
                remote_comm_id: CommId(rnd() as u32),
                ..Default::default()
            }),
        };
        let mut b = [0u8; MAD_LEN];
        CmMadRepr::new(Tid(rnd()), msg).emit(&mut b).unwrap();
        // Keep the header (and so the attribute) most of the time; then any data byte goes.
        let from = if i % 10 == 0 { 0 } else { 24 };
        for _ in 0..(rnd() % 12) {
            let k = from + (rnd() as usize % (MAD_LEN - from));
            b[k] = rnd() as u8;
        }
        peer.send(&peer.craft_mad(&b)).unwrap();
        // Whatever comes back is drained; a REP is answered with an RTU now and then.
        while let Some((_, m)) = peer.recv_mad(Duration::ZERO) {
            if let (CmMessage::Rep(rep), true) = (m.msg, rnd() % 2 == 0) {
                let rtu = rocemu_wire::cm::RtuRepr {
                    local_comm_id: rep.remote_comm_id,
                    remote_comm_id: rep.local_comm_id,
                    ..Default::default()
                };
                let mut t = [0u8; MAD_LEN];
                CmMadRepr::new(m.mad.tid, CmMessage::Rtu(rtu))
                    .emit(&mut t)
                    .unwrap();
                peer.send(&peer.craft_mad(&t)).unwrap();
            }
        }
        if i % 500 == 0 {
            let c = agent.cm_connections().unwrap();
            assert!(c.len() <= rocemu_conformance::agent::cm::MAX_CONNECTIONS);
        }
    }
    eprintln!(
        "accepted {} connections",
        agent.cm_connections().unwrap().len()
    );
    // Still a CM: a clean connection goes through, and a reset ends everything.
    let a = cm_peer::connect(&mut peer, PORT, &offer(7), patience()).unwrap();
    assert!(agent
        .cm_connections()
        .unwrap()
        .iter()
        .any(|c| c.qpn == a.rep.local_qpn && c.psn == a.rep.starting_psn));
    agent.reset().unwrap();
    assert!(agent.cm_connections().unwrap().is_empty());
}
