//! The agent between two agents in virtual time (connect, accept, disconnect, REJ, lost and
//! repeated messages, retries running out, the backlog, time-wait, floods, one history per
//! seed) and against rping's real REQ.
use super::*;
use rocemu_wire::cm::PortSpace;
use rocemu_wire::Psn;

fn pump(a: &mut CmAgent, b: &mut CmAgent, now: Nanos, drop_first: bool) -> usize {
    let (ia, ib) = (a.local_ip, b.local_ip);
    let mut n = 0;
    let mut dropped = !drop_first;
    loop {
        let mut moved = false;
        while let Some((to, m)) = a.poll_transmit() {
            assert_eq!(to, ib);
            if !dropped {
                dropped = true;
                continue;
            }
            b.handle_mad(now, ia, &m);
            moved = true;
            n += 1;
        }
        while let Some((to, m)) = b.poll_transmit() {
            assert_eq!(to, ia);
            a.handle_mad(now, ib, &m);
            moved = true;
            n += 1;
        }
        if !moved {
            return n;
        }
    }
}

fn two() -> (CmAgent, CmAgent, ServiceId) {
    let a = CmAgent::new("10.0.0.1".parse().unwrap(), 1, 1);
    let mut b = CmAgent::new("10.0.0.2".parse().unwrap(), 2, 2);
    let sid = ServiceId::rdma_cm(PortSpace::TCP, 7174);
    b.listen(sid);
    (a, b, sid)
}

fn params(qpn: u32, psn: u32) -> ConnParams {
    ConnParams {
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        ..ConnParams::default()
    }
}

/// A connects to B's service; B has seen the REQ. The two ends' ids.
fn requested(a: &mut CmAgent, b: &mut CmAgent, sid: ServiceId, t: Nanos) -> (CommId, CommId) {
    let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
    pump(a, b, t, false);
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    (ida, idb)
}

#[test]
fn dreq_for_an_unknown_connection_gets_a_drep() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    pump(&mut a, &mut b, t, false);
    // B forgets everything (a restart); A's DREQ still gets its DREP.
    let mut b2 = CmAgent::new(b.local_ip, 2, 3);
    a.disconnect(t, ida).unwrap();
    let (to, dreq) = a.poll_transmit().expect("a DREQ");
    assert_eq!(to, b2.local_ip);
    b2.handle_mad(t, a.local_ip, &dreq);
    let (back, drep) = b2
        .poll_transmit()
        .expect("a DREP for an unknown connection");
    assert_eq!(back, a.local_ip);
    assert!(matches!(
        CmMadRepr::parse(&drep).unwrap().msg,
        CmMessage::Drep(r) if r.remote_comm_id == ida
    ));
    a.handle_mad(t, b2.local_ip, &drep);
    assert!(std::iter::from_fn(|| a.poll_event())
        .any(|e| matches!(e, CmEvent::Disconnected { id } if id == ida)));
}

#[test]
fn connect_accept_establish_and_disconnect() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
    pump(&mut a, &mut b, t, false);
    let Some(CmEvent::ConnectRequest { id: idb, req, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    assert_eq!(
        (req.local_qpn, req.starting_psn),
        (Qpn::new(0x11), Psn::new(100))
    );
    let rep = ConnParams {
        responder_resources: 4,
        initiator_depth: 2,
        ..params(0x22, 200)
    };
    b.accept(t, idb, &rep).unwrap();
    pump(&mut a, &mut b, t, false);
    // The active side learns what the passive side accepts (its max_rd_atomic's bound).
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::Established {
            id: ida,
            remote_qpn: Qpn::new(0x22),
            remote_psn: Psn::new(200),
            rep_rd_atomic: Some((4, 2)),
            private_data: Box::new([0; 196]),
        })
    );
    assert_eq!(
        b.poll_event(),
        Some(CmEvent::Established {
            id: idb,
            remote_qpn: Qpn::new(0x11),
            remote_psn: Psn::new(100),
            rep_rd_atomic: None,
            private_data: Box::new([0; 196]),
        })
    );
    a.disconnect(t, ida).unwrap();
    pump(&mut a, &mut b, t, false);
    assert_eq!(b.poll_event(), Some(CmEvent::Disconnected { id: idb }));
    assert_eq!(a.poll_event(), Some(CmEvent::Disconnected { id: ida }));
    // Only time-wait's end is left.
    assert_eq!(a.poll_timeout(), Some(t + a.time_wait));
}

#[test]
fn close_says_goodbye_once_and_forgets() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    // Established: one DREQ, then nothing is left to retransmit.
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    pump(&mut a, &mut b, t, false);
    assert!(matches!(b.poll_event(), Some(CmEvent::Established { .. })));
    b.close(idb);
    assert_eq!(b.state(idb), None);
    assert_eq!(b.poll_timeout(), None);
    let (_, dreq) = b.poll_transmit().expect("a DREQ");
    assert!(matches!(
        CmMadRepr::parse(&dreq).unwrap().msg,
        CmMessage::Dreq(r) if r.remote_comm_id == ida && r.remote_qpn == Qpn::new(0x11)
    ));
    assert!(b.poll_transmit().is_none());
    // A answers the DREQ and is disconnected; B, having forgotten, drops the DREP quietly.
    a.handle_mad(t, b.local_ip, &dreq);
    assert!(std::iter::from_fn(|| a.poll_event())
        .any(|e| matches!(e, CmEvent::Disconnected { id } if id == ida)));
    pump(&mut a, &mut b, t, false);
    assert_eq!(b.poll_event(), None);
    // REP sent, no RTU yet: a REJ that names the REP.
    let (mut a, mut b, sid) = two();
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    let (_, _rep) = b.poll_transmit().expect("a REP");
    b.close(idb);
    assert_eq!(b.poll_timeout(), None);
    let (_, rej) = b.poll_transmit().expect("a REJ");
    assert!(matches!(
        CmMadRepr::parse(&rej).unwrap().msg,
        CmMessage::Rej(r) if r.remote_comm_id == ida
            && r.message_rejected == MsgKind::Rep
            && r.reason == RejReason::CONSUMER_DEFINED
    ));
}

#[test]
fn unknown_service_is_rejected_with_reason_8() {
    let (mut a, mut b, _) = two();
    let id = a.connect(
        Nanos(0),
        b.local_ip,
        ServiceId::rdma_cm(PortSpace::TCP, 1),
        &params(1, 1),
    );
    pump(&mut a, &mut b, Nanos(0), false);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::Rejected {
            id,
            reason: RejReason::INVALID_SERVICE_ID,
            private_data: Box::new([0; 148]),
        })
    );
}

#[test]
fn after_unlisten_reqs_are_rejected() {
    let (mut a, mut b, sid) = two();
    b.unlisten(sid);
    let id = a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
    pump(&mut a, &mut b, Nanos(0), false);
    assert_eq!(b.poll_event(), None);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::Rejected {
            id,
            reason: RejReason::INVALID_SERVICE_ID,
            private_data: Box::new([0; 148]),
        })
    );
}

#[test]
fn a_lost_req_is_sent_again_and_retries_run_out() {
    let (mut a, mut b, sid) = two();
    a.max_cm_retries = 2;
    let id = a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
    // The first REQ is lost; the retransmission after the timeout gets through.
    pump(&mut a, &mut b, Nanos(0), true);
    assert_eq!(b.poll_event(), None);
    let t1 = a.poll_timeout().unwrap();
    a.handle_timeout(t1);
    a.handle_timeout(t1);
    pump(&mut a, &mut b, t1, false);
    assert!(matches!(
        b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    // Nobody accepts: a repeated REQ gets no answer; a times out after its retries.
    let mut t = t1;
    let mut turns = 0;
    while let Some(d) = a.poll_timeout() {
        if a.state(id) != Some(CmState::ReqSent) {
            break;
        }
        t = d;
        a.handle_timeout(t);
        pump(&mut a, &mut b, t, false);
        turns += 1;
        assert!(turns < 10, "retries never run out");
    }
    // Two retries: the one that got through, one more, then the end.
    assert_eq!(turns, 2);
    assert_eq!(a.poll_event(), Some(CmEvent::Timeout { id }));
    assert!(t > t1);
    assert_eq!(b.poll_event(), None);
}

/// A REQ from `from` with comm id `cid` for `sid`, as a peer would send it.
fn req_mad(sid: ServiceId, cid: u32, from: IpAddr, to: IpAddr) -> [u8; MAD_LEN] {
    let mut a = CmAgent::new(from, 9, u64::from(cid));
    let _ = a.connect(Nanos(0), to, sid, &params(cid & 0xff_ffff, 1));
    let (_, m) = a.poll_transmit().unwrap();
    let mut r = CmMadRepr::parse(&m).unwrap();
    if let CmMessage::Req(q) = &mut r.msg {
        q.local_comm_id = CommId(cid);
    }
    let mut b = [0u8; MAD_LEN];
    r.emit(&mut b).unwrap();
    b
}

#[test]
fn a_req_flood_stays_bounded_and_a_real_client_still_connects() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    // 100,000 REQs from distinct (peer, comm id) that nobody ever answers.
    let template = req_mad(sid, 1, "10.1.0.1".parse().unwrap(), b.local_ip);
    for i in 0..100_000u32 {
        let mut m = template;
        m[24..28].copy_from_slice(&(i + 1).to_be_bytes()); // REQ local comm id
        let from = IpAddr::from((0x0b00_0000 + i).to_be_bytes());
        b.handle_mad(t, from, &m);
        while b.poll_transmit().is_some() {}
        while b.poll_event().is_some() {}
    }
    assert!(
        b.conns.len() <= b.max_half_open,
        "{} connections",
        b.conns.len()
    );
    // The half-open ones age out; then a real client gets through.
    let later = t + b.half_open_timeout + Nanos(1);
    b.handle_timeout(later);
    assert_eq!(b.conns.len(), 0);
    let c = b.counters();
    assert_eq!(c.reqs_received, 100_000);
    assert_eq!(c.reqs_rejected_backlog, 100_000 - b.max_half_open as u64);
    assert_eq!(c.half_open_expired, b.max_half_open as u64);
    let ida = a.connect(later, b.local_ip, sid, &params(0x11, 100));
    pump(&mut a, &mut b, later, false);
    // The application had taken the flood's REQs: it hears that each one went away.
    let mut gone = 0;
    let idb = loop {
        match b.poll_event() {
            Some(CmEvent::Timeout { .. }) => gone += 1,
            Some(CmEvent::ConnectRequest { id, .. }) => break id,
            e => panic!("the real REQ was not reported: {e:?}"),
        }
    };
    assert_eq!(gone, b.max_half_open);
    b.accept(later, idb, &params(0x22, 200)).unwrap();
    pump(&mut a, &mut b, later, false);
    assert!(matches!(a.poll_event(), Some(CmEvent::Established { id, .. }) if id == ida));
    assert!(matches!(b.poll_event(), Some(CmEvent::Established { id, .. }) if id == idb));
}

#[test]
fn a_full_backlog_rejects_with_consumer_defined() {
    let (mut a, mut b, sid) = two();
    b.max_half_open = 1;
    let _ = requested(&mut a, &mut b, sid, Nanos(0));
    let id2 = a.connect(Nanos(0), b.local_ip, sid, &params(0x12, 1));
    pump(&mut a, &mut b, Nanos(0), false);
    assert_eq!(b.poll_event(), None);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::Rejected {
            id: id2,
            reason: RejReason::CONSUMER_DEFINED,
            private_data: Box::new([0; 148]),
        })
    );
    assert_eq!(b.counters().reqs_rejected_backlog, 1);
}

#[test]
fn time_wait_is_reaped_after_its_time() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    pump(&mut a, &mut b, t, false);
    a.disconnect(t, ida).unwrap();
    pump(&mut a, &mut b, t, false);
    assert_eq!(a.state(ida), Some(CmState::TimeWait));
    assert_eq!(b.state(idb), Some(CmState::TimeWait));
    // Still there just before the end of time-wait, gone after it.
    let tw = a.time_wait;
    a.handle_timeout(t + tw - Nanos(1));
    assert_eq!(a.state(ida), Some(CmState::TimeWait));
    assert_eq!(a.poll_timeout(), Some(t + tw));
    a.handle_timeout(t + tw);
    b.handle_timeout(t + tw);
    assert_eq!(a.state(ida), None);
    assert_eq!(b.state(idb), None);
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.counters().time_wait_reaped, 1);
    assert_eq!(b.conns.len(), 0);
}

#[test]
fn a_repeated_req_is_answered_from_the_index() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
    let (_, req) = a.poll_transmit().unwrap();
    b.handle_mad(t, a.local_ip, &req);
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    // While the application decides: quiet. Once it accepted: the same REP again.
    b.handle_mad(t, a.local_ip, &req);
    assert!(b.poll_transmit().is_none());
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    let (_, rep) = b.poll_transmit().unwrap();
    b.handle_mad(t, a.local_ip, &req);
    assert_eq!(b.poll_transmit().map(|(_, m)| m), Some(rep));
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.conns.len(), 1);
    assert_eq!(b.counters().reqs_duplicate, 2);
    // The same comm id from another peer is another connection.
    b.handle_mad(t, "10.0.0.3".parse().unwrap(), &req);
    assert!(matches!(
        b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    let _ = ida;
}

#[test]
fn one_seed_one_history_even_when_deadlines_coincide() {
    // Two agents with the same seed, fed the same MADs at the same times, say the same
    // things in the same order, timeouts included (several deadlines fall at one instant).
    fn run() -> Vec<String> {
        let (_, mut b, sid) = two();
        let mut log = Vec::new();
        let mut ids = Vec::new();
        let t = Nanos(0);
        for i in 0..64u32 {
            let from = IpAddr::from((0x0c00_0000 + i).to_be_bytes());
            b.handle_mad(t, from, &req_mad(sid, 1000 + i, from, b.local_ip));
            if let Some(CmEvent::ConnectRequest { id, .. }) = b.poll_event() {
                ids.push(id);
            }
        }
        for id in &ids {
            b.accept(t, *id, &params(0x22, 200)).unwrap();
        }
        for _ in 0..40 {
            let Some(now) = b.poll_timeout() else { break };
            b.handle_timeout(now);
            while let Some((to, m)) = b.poll_transmit() {
                log.push(format!("{now} tx {to} {:?}", &m[..]));
            }
            while let Some(e) = b.poll_event() {
                log.push(format!("{now} {e:?}"));
            }
        }
        assert!(log.iter().any(|l| l.contains("Timeout")));
        log
    }
    assert_eq!(run(), run());
}

#[test]
fn answers_a_real_rping_req() {
    // The REQ rping sent in wire/tests/data/cm/rping.pcap (frame 1), from its UD payload.
    let mut r = rocemu_wire::capture::CaptureReader::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../wire/tests/data/cm/rping.pcap"
    ))
    .unwrap();
    let f = r.next_frame().unwrap().unwrap();
    let p = rocemu_wire::parse_frame(&f.data).unwrap();
    let mad = rocemu_wire::mad::gsi_payload(&p).unwrap();
    let mut b = CmAgent::new("10.99.0.11".parse().unwrap(), 2, 2);
    b.listen(ServiceId::rdma_cm(PortSpace::TCP, 7174));
    b.handle_mad(Nanos(0), p.ip.src(), mad);
    let Some(CmEvent::ConnectRequest { id, req, .. }) = b.poll_event() else {
        panic!("rping's REQ not reported");
    };
    assert_eq!(req.local_qpn, Qpn::new(0x11));
    b.accept(Nanos(0), id, &params(0x33, 5)).unwrap();
    let (to, rep) = b.poll_transmit().unwrap();
    assert_eq!(to, p.ip.src());
    let m = CmMadRepr::parse(&rep).unwrap();
    assert_eq!(m.mad.tid, CmMadRepr::parse(mad).unwrap().mad.tid);
    let CmMessage::Rep(rep) = m.msg else {
        panic!("not a REP")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(
        (rep.local_qpn, rep.starting_psn),
        (Qpn::new(0x33), Psn::new(5))
    );
}
