//! Both sides of a CM connection over an in-memory pipe, through `Cm::connect_rc` and
//! `Cm::accept_rc` with sides the tools cannot make (responder resources and initiator depth
//! that differ).
use super::*;
use rocemu_emulator::engine::Engine;
use rocemu_emulator::port::impair::LoseFirst;
use rocemu_emulator::port::pipe::{pipe, PipePort};
use std::net::Ipv4Addr;

fn endpoint(port: PipePort, last: u8) -> Endpoint {
    let ip = IpAddr::V4(Ipv4Addr::new(10, 77, 0, last));
    let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 77, last]), ip, last as u64);
    cfg.eth_mtu = 1500;
    Endpoint {
        rnic: Rnic::new(cfg),
        engine: Engine::new(Box::new(port)),
    }
}

fn rc_qp(ep: &mut Endpoint) -> Qpn {
    let r = &mut ep.rnic;
    let pd = r.alloc_pd();
    let cq = r.create_cq(16).unwrap();
    r.create_qp(
        pd,
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: true,
        },
    )
    .unwrap()
}

fn side(qpn: Qpn, responder_resources: u8, initiator_depth: u8) -> RcSide {
    RcSide {
        qpn,
        psn: Psn::new(0x1234),
        path_mtu: 3,
        responder_resources,
        initiator_depth,
        timeout: 14,
    }
}

/// (max_rd_atomic, max_dest_rd_atomic) of a QP.
fn rd_atomic(ep: &Endpoint, qpn: Qpn) -> (u8, u8) {
    let a = ep.rnic.query_qp(qpn).unwrap();
    (a.max_rd_atomic, a.max_dest_rd_atomic)
}

#[test]
fn both_sides_keep_initiator_depth_and_responder_resources_apart() {
    // A client that keeps 16 reads in flight but answers only 1 itself (REQ: responder
    // resources 1, initiator depth 16), and a server that offers 8 and 4. The server's QP
    // may send at most 1 read (the REQ's responder resources) and answers 8 reads, min(its
    // 8, the REQ's 16); the REP says so, and the client may keep 8 in flight and answers
    // its 1. Giving one value to both (the smaller) left the server with one responder
    // resource, so that a client's retransmitted READ older than its newest was dropped.
    let (pa, pb) = pipe(Mac([2, 0, 0, 0, 77, 1]), Mac([2, 0, 0, 0, 77, 2]), 1500);
    let server = std::thread::spawn(move || {
        let mut ep = endpoint(pa, 1);
        let qpn = rc_qp(&mut ep);
        let mut cm = Cm::new(&mut ep).unwrap();
        cm.listen(7471);
        cm.accept_rc(&mut ep, &side(qpn, 8, 4), Duration::from_secs(20), |_| {
            Ok(())
        })
        .unwrap();
        // Answer the client's last frames before the port goes.
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            let w = ep.engine.poll(&mut ep.rnic);
            ep.engine.idle(w);
        }
        rd_atomic(&ep, qpn)
    });
    let mut ep = endpoint(pb, 2);
    let qpn = rc_qp(&mut ep);
    let mut cm = Cm::new(&mut ep).unwrap();
    let server_ip = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
    cm.connect_rc(&mut ep, server_ip, 7471, &side(qpn, 1, 16), 50)
        .unwrap();
    while !server.is_finished() {
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    assert_eq!(
        server.join().unwrap(),
        (1, 8),
        "server: (max_rd_atomic, max_dest_rd_atomic)"
    );
    assert_eq!(
        rd_atomic(&ep, qpn),
        (8, 1),
        "client: (max_rd_atomic, max_dest_rd_atomic)"
    );
}

fn is_drep(frame: &[u8]) -> bool {
    rocemu_wire::frame::parse_frame(frame).is_ok_and(|p| {
        matches!(
            rocemu_wire::cm::CmMadRepr::parse(p.payload),
            Ok(m) if matches!(m.msg, rocemu_wire::cm::CmMessage::Drep(_))
        )
    })
}

#[test]
fn a_lost_drep_is_answered_again_before_the_server_goes() {
    // The client disconnects; the server's DREP to it is lost on the server's (impaired) port.
    // The client resends its DREQ after the CM response timeout; the server, which has closed
    // its side and would otherwise be gone, is still there to answer it, so the client's
    // disconnect completes instead of waiting through every retry. (perftest's client, against
    // `rocemu perf --rdma-cm --loss`, sat in `rdma_get_cm_event` until killed.) Response
    // timeout 16 (268 ms) on both ends keeps the test short.
    let (pa, pb) = pipe(Mac([2, 0, 0, 0, 77, 1]), Mac([2, 0, 0, 0, 77, 2]), 1500);
    let port = LoseFirst::new(pa, 1, is_drep);
    let dropped = port.lost();
    let server = std::thread::spawn(move || {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
        let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 77, 1]), ip, 1);
        cfg.eth_mtu = 1500;
        let mut ep = Endpoint {
            rnic: Rnic::new(cfg),
            engine: Engine::new(Box::new(port)),
        };
        let qpn = rc_qp(&mut ep);
        let mut cm = Cm::new(&mut ep).unwrap();
        cm.agent.cm_response_timeout = 16;
        cm.listen(7472);
        let conn = cm
            .accept_rc(&mut ep, &side(qpn, 1, 1), Duration::from_secs(20), |_| {
                Ok(())
            })
            .unwrap();
        let t = Instant::now();
        cm.linger(&mut ep, &[conn.id], Duration::from_secs(10));
        (t.elapsed(), cm.agent.state(conn.id))
    });
    let mut ep = endpoint(pb, 2);
    let qpn = rc_qp(&mut ep);
    let mut cm = Cm::new(&mut ep).unwrap();
    cm.agent.cm_response_timeout = 16;
    let server_ip = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1));
    let conn = cm
        .connect_rc(&mut ep, server_ip, 7472, &side(qpn, 1, 1), 50)
        .unwrap();
    cm.disconnect_all(&mut ep, &[conn.id], Duration::from_secs(1));
    let client_state = cm.agent.state(conn.id);
    // Keep the client's port turning until the server is done.
    while !server.is_finished() {
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    let (server_lingered, server_state) = server.join().unwrap();
    assert_eq!(
        dropped.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one DREP was dropped"
    );
    assert!(
        !matches!(client_state, Some(CmState::Established | CmState::DreqSent)),
        "the client's DREQ was answered at its retry: {client_state:?}"
    );
    assert!(
        !matches!(server_state, Some(CmState::Established | CmState::DreqSent)),
        "the server closed: {server_state:?}"
    );
    // It stayed one response timeout (268 ms) and the margin, not just the 50 ms of an
    // unimpaired port.
    assert!(
        server_lingered >= Duration::from_millis(268),
        "the server stayed {server_lingered:?}"
    );
}
