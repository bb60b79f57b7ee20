//! The agent between two agents in virtual time (connect, accept, disconnect, REJ, lost and
//! repeated messages, retries running out, the backlog, time-wait, floods, one history per
//! seed) and against rping's real REQ.
use super::fuzz::params;
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
    // Held for a listener until the grace runs out, then refused.
    assert_eq!(a.poll_event(), None);
    assert_eq!(b.poll_timeout(), Some(CmAgent::DEFAULT_LISTEN_GRACE));
    b.handle_timeout(CmAgent::DEFAULT_LISTEN_GRACE);
    pump(&mut a, &mut b, CmAgent::DEFAULT_LISTEN_GRACE, false);
    assert_eq!(b.counters().reqs_no_listener, 1);
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
    b.listen_grace = Nanos::ZERO; // refused at once, as Linux's ib_cm
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

/// A server that makes its listener again between two connections (perftest -R) gets the REQ
/// that came a moment before its listen: held, not refused, and handed over at the listen; a
/// repeat of the held REQ is not held twice; the hold is bounded.
#[test]
fn a_req_just_before_the_listen_waits_for_it() {
    let (mut a, mut b, sid) = two();
    b.unlisten(sid);
    let id = a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
    pump(&mut a, &mut b, Nanos(0), false);
    assert_eq!((a.poll_event(), b.poll_event()), (None, None));
    b.handle_timeout(Nanos::from_millis(50)); // within the grace: nothing yet
    pump(&mut a, &mut b, Nanos::from_millis(50), false);
    assert_eq!(a.poll_event(), None);
    b.listen(sid);
    assert!(
        matches!(b.poll_event(), Some(CmEvent::ConnectRequest { .. })),
        "the held REQ goes to the new listener"
    );
    assert_eq!(b.counters().reqs_no_listener, 0);
    assert_eq!(b.counters().reqs_received, 1);
    assert_eq!(
        b.poll_timeout().map(|t| t > Nanos::from_millis(200)),
        Some(true)
    );
    let _ = id;
    // Bounded: beyond MAX_PARKED, REQs for nobody are refused at once.
    let (mut a, mut b, sid) = two();
    b.unlisten(sid);
    for _ in 0..CmAgent::MAX_PARKED + 3 {
        a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
    }
    pump(&mut a, &mut b, Nanos(0), false);
    assert_eq!(b.counters().reqs_no_listener, 3);
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

/// The message of a MAD the agent sent.
fn msg(m: &[u8; MAD_LEN]) -> CmMessage {
    CmMadRepr::parse(m).unwrap().msg
}

/// Everything `a` wants to send, in order.
fn drain(a: &mut CmAgent) -> Vec<(IpAddr, [u8; MAD_LEN])> {
    std::iter::from_fn(|| a.poll_transmit()).collect()
}

fn bytes<const N: usize>(seed: u8) -> [u8; N] {
    std::array::from_fn(|i| seed.wrapping_add(i as u8) | 1)
}

#[test]
fn private_data_travels_in_req_rep_rtu_and_rej() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let req_pd: [u8; 92] = bytes(3);
    let ida = a.connect(
        t,
        b.local_ip,
        sid,
        &ConnParams {
            private_data: req_pd,
            ..params(0x11, 100)
        },
    );
    pump(&mut a, &mut b, t, false);
    let Some(CmEvent::ConnectRequest { id: idb, req, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    assert_eq!(req.private_data, req_pd);
    let rep_pd: [u8; 196] = bytes(7);
    b.accept(
        t,
        idb,
        &ConnParams {
            rep_private_data: rep_pd,
            ..params(0x22, 200)
        },
    )
    .unwrap();
    // A's RTU carries private data of its own (forged here: the agent sends none).
    let (_, rep) = b.poll_transmit().unwrap();
    a.handle_mad(t, b.local_ip, &rep);
    let (_, rtu) = a.poll_transmit().unwrap();
    let mut r = CmMadRepr::parse(&rtu).unwrap();
    let CmMessage::Rtu(ref mut m) = r.msg else {
        panic!("not an RTU")
    };
    m.private_data = bytes(11);
    let mut rtu = [0u8; MAD_LEN];
    r.emit(&mut rtu).unwrap();
    b.handle_mad(t, a.local_ip, &rtu);
    match a.poll_event() {
        Some(CmEvent::Established {
            id, private_data, ..
        }) => assert_eq!((id, *private_data), (ida, rep_pd)),
        e => panic!("{e:?}"),
    }
    let rtu_pd: [u8; 224] = bytes(11);
    match b.poll_event() {
        Some(CmEvent::Established {
            id, private_data, ..
        }) => {
            assert_eq!(id, idb);
            assert_eq!(private_data[..], rtu_pd[..196]);
        }
        e => panic!("{e:?}"),
    }
    // REJ: the first 148 bytes of what the application gave, zero padded or cut.
    for len in [5usize, 148, 300] {
        let (mut a, mut b, sid) = two();
        let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
        let (_, req) = a.poll_transmit().unwrap();
        b.handle_mad(t, a.local_ip, &req);
        let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
            panic!("no REQ reported");
        };
        let pd: Vec<u8> = (0..len).map(|i| i as u8 | 0x80).collect();
        b.reject_with(idb, RejReason::CONSUMER_DEFINED, &pd);
        let (_, rej) = b.poll_transmit().unwrap();
        a.handle_mad(t, b.local_ip, &rej);
        let mut want = [0u8; 148];
        want[..len.min(148)].copy_from_slice(&pd[..len.min(148)]);
        assert_eq!(
            a.poll_event(),
            Some(CmEvent::Rejected {
                id: ida,
                reason: RejReason::CONSUMER_DEFINED,
                private_data: Box::new(want),
            }),
            "{len} bytes"
        );
        // The rejected REQ, repeated, gets the same REJ (not silence, not a new request).
        b.handle_mad(t, a.local_ip, &req);
        assert_eq!(b.poll_transmit().map(|x| x.1), Some(rej));
        assert_eq!(b.poll_event(), None);
    }
}

/// A connects with `defer_rtu`; B accepts; A has seen the REP. The two ends' ids.
fn rep_received(a: &mut CmAgent, b: &mut CmAgent, sid: ServiceId, t: Nanos) -> (CommId, CommId) {
    let ida = a.connect(
        t,
        b.local_ip,
        sid,
        &ConnParams {
            defer_rtu: true,
            ..params(0x11, 100)
        },
    );
    pump(a, b, t, false);
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    b.accept(
        t,
        idb,
        &ConnParams {
            responder_resources: 4,
            initiator_depth: 2,
            rep_private_data: bytes(5),
            ..params(0x22, 200)
        },
    )
    .unwrap();
    pump(a, b, t, false);
    (ida, idb)
}

#[test]
fn a_deferred_rtu_goes_only_with_establish() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let (ida, idb) = rep_received(&mut a, &mut b, sid, t);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::RepReceived {
            id: ida,
            remote_qpn: Qpn::new(0x22),
            remote_psn: Psn::new(200),
            rep_rd_atomic: (4, 2),
            private_data: Box::new(bytes(5)),
        })
    );
    assert_eq!(a.state(ida), Some(CmState::RepRcvd));
    assert_eq!(b.state(idb), Some(CmState::RepSent));
    assert_eq!(b.poll_event(), None, "no RTU before establish");
    // B's REP again (its timer): A still says nothing.
    let t1 = b.poll_timeout().unwrap();
    b.handle_timeout(t1);
    let reps = drain(&mut b);
    assert_eq!(reps.len(), 1);
    a.handle_mad(t1, b.local_ip, &reps[0].1);
    assert!(a.poll_transmit().is_none());
    assert_eq!(a.counters().unknown_connection, 0);
    // establish: the RTU, no event on A, Established on B.
    a.establish(t1, ida).unwrap();
    assert!(a.establish(t1, ida).is_err(), "only once");
    assert_eq!(a.state(ida), Some(CmState::Established));
    assert_eq!(a.poll_timeout(), None);
    pump(&mut a, &mut b, t1, false);
    assert_eq!(a.poll_event(), None);
    assert!(matches!(b.poll_event(), Some(CmEvent::Established { id, .. }) if id == idb));
    // A repeated REP after establish: the RTU again.
    a.handle_mad(t1, b.local_ip, &reps[0].1);
    let again = drain(&mut a);
    assert_eq!(again.len(), 1);
    assert!(
        matches!(msg(&again[0].1), CmMessage::Rtu(r) if r.local_comm_id == ida && r.remote_comm_id == idb)
    );
}

#[test]
fn a_deferred_rtu_never_sent_times_out_on_both_sides() {
    let (mut a, mut b, sid) = two();
    let (ida, idb) = rep_received(&mut a, &mut b, sid, Nanos(0));
    b.max_cm_retries = 2;
    assert!(matches!(a.poll_event(), Some(CmEvent::RepReceived { .. })));
    // B's REP runs out of retries while A's application sits on it.
    let mut turns = 0;
    while b.state(idb) == Some(CmState::RepSent) {
        let t = b.poll_timeout().unwrap();
        b.handle_timeout(t);
        pump(&mut a, &mut b, t, false);
        turns += 1;
        assert!(turns < 40, "B never gave up");
    }
    assert_eq!(b.poll_event(), Some(CmEvent::Timeout { id: idb }));
    assert_eq!(a.state(ida), Some(CmState::RepRcvd));
    // A forgets it after half_open_timeout, with a REJ for the REP, and says so.
    let d = a.poll_timeout().unwrap();
    assert_eq!(d, Nanos(0) + a.half_open_timeout);
    a.handle_timeout(d - Nanos(1));
    assert_eq!(a.state(ida), Some(CmState::RepRcvd));
    a.handle_timeout(d);
    assert_eq!(a.state(ida), None);
    assert_eq!(a.poll_timeout(), None);
    assert_eq!(a.poll_event(), Some(CmEvent::Timeout { id: ida }));
    let out = drain(&mut a);
    assert_eq!(out.len(), 1);
    assert!(matches!(msg(&out[0].1), CmMessage::Rej(r)
        if r.message_rejected == MsgKind::Rep && r.remote_comm_id == idb));
    assert_eq!(a.counters().establish_expired, 1);
    assert!(a.establish(d, ida).is_err());
}

#[test]
fn a_rej_for_the_rep_reaches_a_deferred_active_side() {
    // B takes its REP back (close in RepSent) while A holds its RTU.
    let (mut a, mut b, sid) = two();
    let (ida, idb) = rep_received(&mut a, &mut b, sid, Nanos(0));
    let _ = a.poll_event();
    b.close(idb);
    pump(&mut a, &mut b, Nanos(0), false);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::Rejected { id, reason, .. })
        if id == ida && reason == RejReason::CONSUMER_DEFINED)
    );
    assert_eq!(a.state(ida), Some(CmState::TimeWait));
}

#[test]
fn an_mra_stretches_the_wait_once_and_retries_still_end() {
    let (mut a, mut b, sid) = two();
    a.max_cm_retries = 1;
    b.mra_on_req = Some(22);
    let t0 = Nanos(0);
    let ida = a.connect(t0, b.local_ip, sid, &params(0x11, 100));
    let plain = a.poll_timeout().unwrap();
    let (_, req) = a.poll_transmit().unwrap();
    b.handle_mad(t0, a.local_ip, &req);
    let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
        panic!("no REQ reported");
    };
    // B answers at once with an MRA for the REQ, under the REQ's transaction.
    let out = drain(&mut b);
    assert_eq!(out.len(), 1);
    let m = CmMadRepr::parse(&out[0].1).unwrap();
    assert_eq!(m.mad.tid, CmMadRepr::parse(&req).unwrap().mad.tid);
    let CmMessage::Mra(mra) = m.msg else {
        panic!("not an MRA: {:?}", m.msg)
    };
    assert_eq!(
        (
            mra.local_comm_id,
            mra.remote_comm_id,
            mra.message_mraed,
            mra.service_timeout
        ),
        (idb, ida, MsgKind::Req, 22)
    );
    assert_eq!(b.counters().mras_sent, 1);
    // B keeps the REQ at least as long as it promised.
    assert_eq!(
        b.poll_timeout(),
        Some(t0 + b.half_open_timeout.max(Nanos(timeout_nanos(22))))
    );
    // A: no retransmission until the MRA's service timeout plus its own response timeout.
    a.handle_mad(t0, b.local_ip, &out[0].1);
    assert_eq!(a.counters().mras_received, 1);
    let stretched = t0 + Nanos(timeout_nanos(22)) + Nanos(timeout_nanos(a.cm_response_timeout));
    assert_eq!(a.poll_timeout(), Some(stretched));
    a.handle_timeout(plain);
    a.handle_timeout(stretched - Nanos(1));
    assert!(
        a.poll_transmit().is_none(),
        "retransmitted inside the MRA's time"
    );
    // Then the REQ again (its one retry); B answers the repeat with the same MRA.
    a.handle_timeout(stretched);
    let again = drain(&mut a);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, req);
    b.handle_mad(stretched, a.local_ip, &again[0].1);
    assert_eq!(
        drain(&mut b).iter().map(|x| x.1).collect::<Vec<_>>(),
        vec![out[0].1]
    );
    assert_eq!(b.counters().mras_sent, 2);
    assert_eq!(b.poll_event(), None, "a repeat is not a new request");
    // The second MRA does not stretch again: the usual wait, then the end.
    a.handle_mad(stretched, b.local_ip, &out[0].1);
    assert_eq!(a.counters().mras_received, 2);
    let last = a.poll_timeout().unwrap();
    assert_eq!(
        last,
        stretched + Nanos(timeout_nanos(a.cm_response_timeout))
    );
    a.handle_timeout(last);
    assert_eq!(a.poll_event(), Some(CmEvent::Timeout { id: ida }));
    assert!(a.poll_transmit().is_none());
    // B, once it accepts, answers a repeat with the REP instead of the MRA.
    b.accept(last, idb, &params(0x22, 200)).unwrap();
    let (_, rep) = b.poll_transmit().unwrap();
    b.handle_mad(last, a.local_ip, &req);
    assert_eq!(b.poll_transmit().map(|x| x.1), Some(rep));
}

#[test]
fn an_mra_for_our_rep_stretches_its_wait_and_a_stray_one_does_not() {
    let (mut a, mut b, sid) = two();
    let t = Nanos(0);
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(0x22, 200)).unwrap();
    let _ = drain(&mut b);
    let plain = b.poll_timeout().unwrap();
    let mra = |local, remote, kind| {
        let mut m = [0u8; MAD_LEN];
        CmMadRepr::new(
            Tid(5),
            CmMessage::Mra(MraRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_mraed: kind,
                service_timeout: 21,
                ..MraRepr::default()
            }),
        )
        .emit(&mut m)
        .unwrap();
        m
    };
    // Wrong message, wrong peer id: ignored.
    b.handle_mad(t, a.local_ip, &mra(ida, idb, MsgKind::Req));
    b.handle_mad(t, a.local_ip, &mra(CommId(ida.0 ^ 1), idb, MsgKind::Rep));
    assert_eq!(b.poll_timeout(), Some(plain));
    assert_eq!(b.counters().mras_received, 0);
    b.handle_mad(t, a.local_ip, &mra(ida, idb, MsgKind::Rep));
    assert_eq!(b.counters().mras_received, 1);
    let stretched = t + Nanos(timeout_nanos(21)) + Nanos(timeout_nanos(b.cm_response_timeout));
    assert_eq!(b.poll_timeout(), Some(stretched));
    b.handle_timeout(plain);
    assert!(b.poll_transmit().is_none());
}

fn udp_two() -> (CmAgent, CmAgent, ServiceId) {
    let (a, mut b, _) = two();
    let sid = ServiceId::rdma_cm(PortSpace::UDP, 7174);
    b.listen(sid);
    (a, b, sid)
}

#[test]
fn sidr_round_trip_and_repeats() {
    let (mut a, mut b, sid) = udp_two();
    let t = Nanos(0);
    let pd: Vec<u8> = (1..=216).collect();
    let ida = a.sidr_request(t, b.local_ip, sid, &pd);
    assert_eq!(a.state(ida), Some(CmState::SidrReqSent));
    let (_, sreq) = a.poll_transmit().unwrap();
    assert!(
        matches!(msg(&sreq), CmMessage::SidrReq(r) if r.request_id == ida && r.service_id == sid)
    );
    b.handle_mad(t, a.local_ip, &sreq);
    let Some(CmEvent::SidrRequest {
        id: idb,
        from,
        service,
        private_data,
    }) = b.poll_event()
    else {
        panic!("no SIDR_REQ reported");
    };
    assert_eq!((from, service), (a.local_ip, sid));
    assert_eq!(private_data[..], pd[..]);
    assert_eq!(b.state(idb), Some(CmState::SidrReqRcvd));
    // A repeat while B decides: quiet, not a second request.
    b.handle_mad(t, a.local_ip, &sreq);
    assert!(b.poll_transmit().is_none());
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.counters().sidr_reqs_duplicate, 1);
    // Too much private data is refused and changes nothing.
    assert!(b
        .sidr_reply(idb, SidrStatus::SUCCESS, Qpn::new(1), QKey(1), &[0; 137])
        .is_err());
    assert_eq!(b.state(idb), Some(CmState::SidrReqRcvd));
    let rpd: [u8; 136] = bytes(9);
    b.sidr_reply(
        idb,
        SidrStatus::SUCCESS,
        Qpn::new(0x4242),
        QKey(0x1234_5678),
        &rpd,
    )
    .unwrap();
    assert!(b
        .sidr_reply(idb, SidrStatus::SUCCESS, Qpn::new(1), QKey(1), &[])
        .is_err());
    let (to, srep) = b.poll_transmit().unwrap();
    assert_eq!(to, a.local_ip);
    // Where Linux's ibta_vol1_c12.h (Table 120) puts them, after the 24-byte MAD header:
    // status at 4, QPN at 8 (24 bits), Q_Key at 20, private data at 96.
    assert_eq!(srep[24 + 4], 0);
    assert_eq!(srep[24 + 8..24 + 11], [0x00, 0x42, 0x42]);
    assert_eq!(srep[24 + 20..24 + 24], 0x1234_5678u32.to_be_bytes());
    assert_eq!(srep[24 + 96..], rpd);
    assert_eq!(
        CmMadRepr::parse(&srep).unwrap().mad.tid,
        CmMadRepr::parse(&sreq).unwrap().mad.tid
    );
    a.handle_mad(t, b.local_ip, &srep);
    assert_eq!(
        a.poll_event(),
        Some(CmEvent::SidrReply {
            id: ida,
            status: SidrStatus::SUCCESS,
            qpn: Qpn::new(0x4242),
            qkey: QKey(0x1234_5678),
            private_data: Box::new(rpd),
        })
    );
    // A is done with it; a second SIDR_REP is a stray.
    assert_eq!(a.state(ida), None);
    assert_eq!(a.poll_timeout(), None);
    a.handle_mad(t, b.local_ip, &srep);
    assert_eq!(a.poll_event(), None);
    // B answers a repeat with the same SIDR_REP until its time-wait ends.
    b.handle_mad(t, a.local_ip, &sreq);
    assert_eq!(b.poll_transmit().map(|x| x.1), Some(srep));
    assert_eq!(b.state(idb), Some(CmState::TimeWait));
    b.handle_timeout(t + b.time_wait);
    assert_eq!(b.connections(), 0);
    // A SIDR_REP from somewhere else than the one asked is not the answer.
    let ida2 = a.sidr_request(t, b.local_ip, sid, &[]);
    let (_, sreq2) = a.poll_transmit().unwrap();
    b.handle_mad(t, a.local_ip, &sreq2);
    let Some(CmEvent::SidrRequest { id: idb2, .. }) = b.poll_event() else {
        panic!("no second SIDR_REQ reported");
    };
    b.sidr_reply(idb2, SidrStatus::NO_QP, Qpn::new(0), QKey(0), &[])
        .unwrap();
    let (_, srep2) = b.poll_transmit().unwrap();
    a.handle_mad(t, "10.0.0.9".parse().unwrap(), &srep2);
    assert_eq!(a.poll_event(), None);
    a.handle_mad(t, b.local_ip, &srep2);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::SidrReply { id, status, .. })
        if id == ida2 && status == SidrStatus::NO_QP)
    );
}

#[test]
fn sidr_for_a_service_nobody_listens_on_is_unsupported_at_once() {
    let (mut a, mut b, _) = udp_two();
    let t = Nanos(0);
    let id = a.sidr_request(
        t,
        b.local_ip,
        ServiceId::rdma_cm(PortSpace::UDP, 1),
        &[1, 2, 3],
    );
    pump(&mut a, &mut b, t, false);
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.connections(), 0);
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.counters().sidr_reqs_no_listener, 1);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::SidrReply { id: i, status, .. })
        if i == id && status == SidrStatus::UNSUPPORTED)
    );
    // A REQ's listener is not a SIDR listener's: the TCP service is not the UDP one.
    let (mut a, mut b, tcp) = two();
    let id = a.sidr_request(t, b.local_ip, tcp, &[]);
    b.unlisten(tcp);
    pump(&mut a, &mut b, t, false);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::SidrReply { id: i, status, .. })
        if i == id && status == SidrStatus::UNSUPPORTED)
    );
}

#[test]
fn sidr_is_retransmitted_and_times_out() {
    let (mut a, mut b, sid) = udp_two();
    a.max_cm_retries = 2;
    let t0 = Nanos(0);
    let id = a.sidr_request(t0, b.local_ip, sid, &[]);
    let first = drain(&mut a);
    assert_eq!(first.len(), 1);
    let mut sent = 1;
    let mut t = t0;
    while let Some(d) = a.poll_timeout() {
        assert_eq!(d, t + Nanos(timeout_nanos(a.cm_response_timeout)));
        t = d;
        a.handle_timeout(t);
        a.handle_timeout(t);
        for (_, m) in drain(&mut a) {
            assert_eq!(m, first[0].1, "the same SIDR_REQ again");
            sent += 1;
        }
        assert!(sent < 10);
    }
    assert_eq!(sent, 3, "the first and two retries");
    assert_eq!(a.poll_event(), Some(CmEvent::Timeout { id }));
    assert_eq!(a.state(id), None);
    assert_eq!(a.counters().timeouts, 1);
    // One that gets through late still works: B answers the retransmission.
    let id = a.sidr_request(t, b.local_ip, sid, &[]);
    pump(&mut a, &mut b, t, true);
    assert_eq!(b.poll_event(), None);
    let d = a.poll_timeout().unwrap();
    a.handle_timeout(d);
    pump(&mut a, &mut b, d, false);
    let Some(CmEvent::SidrRequest { id: idb, .. }) = b.poll_event() else {
        panic!("the retransmitted SIDR_REQ was not reported");
    };
    b.sidr_reply(idb, SidrStatus::SUCCESS, Qpn::new(7), QKey(7), &[])
        .unwrap();
    pump(&mut a, &mut b, d, false);
    assert!(matches!(a.poll_event(), Some(CmEvent::SidrReply { id: i, .. }) if i == id));
}

/// A SIDR_REQ from `from` with request id `rid` for `sid`.
fn sidr_req_mad(sid: ServiceId, rid: u32) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    CmMadRepr::new(
        Tid(u64::from(rid)),
        CmMessage::SidrReq(SidrReqRepr {
            request_id: CommId(rid),
            service_id: sid,
            ..SidrReqRepr::default()
        }),
    )
    .emit(&mut m)
    .unwrap();
    m
}

#[test]
fn a_sidr_flood_stays_bounded_and_shares_the_backlog() {
    let (mut a, mut b, sid) = udp_two();
    let t = Nanos(0);
    let mut seen = 0;
    for i in 0..10_000u32 {
        let from = IpAddr::from((0x0d00_0000 + i).to_be_bytes());
        b.handle_mad(t, from, &sidr_req_mad(sid, i + 1));
        for (to, m) in drain(&mut b) {
            assert_eq!(to, from);
            assert!(matches!(msg(&m), CmMessage::SidrRep(r) if r.status == SidrStatus::REJECT));
        }
        while let Some(e) = b.poll_event() {
            assert!(matches!(e, CmEvent::SidrRequest { .. }));
            seen += 1;
        }
        assert!(b.connections() <= b.max_half_open);
    }
    assert_eq!(seen, b.max_half_open);
    let c = b.counters();
    assert_eq!(c.sidr_reqs_received, 10_000);
    assert_eq!(
        c.sidr_reqs_rejected_backlog,
        10_000 - b.max_half_open as u64
    );
    // The backlog is shared: a REQ is refused too.
    let id = a.connect(
        t,
        b.local_ip,
        ServiceId::rdma_cm(PortSpace::TCP, 7174),
        &params(1, 1),
    );
    b.listen(ServiceId::rdma_cm(PortSpace::TCP, 7174));
    pump(&mut a, &mut b, t, false);
    assert!(
        matches!(a.poll_event(), Some(CmEvent::Rejected { id: i, reason, .. })
        if i == id && reason == RejReason::CONSUMER_DEFINED)
    );
    // They age out like REQs; the application hears that each went away.
    b.handle_timeout(t + b.half_open_timeout);
    assert_eq!(b.connections(), 0);
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.counters().half_open_expired, b.max_half_open as u64);
    let gone = std::iter::from_fn(|| b.poll_event())
        .filter(|e| matches!(e, CmEvent::Timeout { .. }))
        .count();
    assert_eq!(gone, b.max_half_open);
}

#[test]
fn close_and_abandon_leave_nothing_in_the_new_states() {
    let t = Nanos(0);
    let gone = |a: &mut CmAgent, id: CommId| {
        assert_eq!(a.state(id), None);
        assert_eq!(a.connections(), 0);
        assert_eq!(a.poll_timeout(), None);
        assert_eq!(a.poll_event(), None);
        a.handle_timeout(Nanos(u64::MAX));
        assert!(a.poll_transmit().is_none());
        assert_eq!(a.poll_event(), None);
    };
    for abandon in [false, true] {
        let end = |a: &mut CmAgent, id| {
            if abandon {
                a.abandon(id)
            } else {
                a.close(id)
            }
        };
        // RepRcvd, RepReceived not yet polled: a REJ for the REP (close), nothing (abandon).
        let (mut a, mut b, sid) = two();
        let (ida, idb) = rep_received(&mut a, &mut b, sid, t);
        end(&mut a, ida);
        let out = drain(&mut a);
        if abandon {
            assert!(out.is_empty());
        } else {
            assert_eq!(out.len(), 1);
            assert!(matches!(msg(&out[0].1), CmMessage::Rej(r)
                if r.message_rejected == MsgKind::Rep && r.remote_comm_id == idb
                    && r.reason == RejReason::CONSUMER_DEFINED));
        }
        gone(&mut a, ida);
        // SidrReqSent: nothing to say, and the retransmissions stop.
        let (mut a, mut b, sid) = udp_two();
        let ida = a.sidr_request(t, b.local_ip, sid, &[]);
        let (_, sreq) = a.poll_transmit().unwrap();
        end(&mut a, ida);
        assert!(a.poll_transmit().is_none());
        gone(&mut a, ida);
        // SidrReqRcvd: a SIDR_REP with status REJECT (close, as Linux's cm_destroy_id).
        b.handle_mad(t, a.local_ip, &sreq);
        let Some(CmEvent::SidrRequest { id: idb, .. }) = b.poll_event() else {
            panic!("no SIDR_REQ reported");
        };
        end(&mut b, idb);
        let out = drain(&mut b);
        if abandon {
            assert!(out.is_empty());
        } else {
            assert_eq!(out.len(), 1);
            assert!(matches!(msg(&out[0].1), CmMessage::SidrRep(r)
                if r.request_id == ida && r.status == SidrStatus::REJECT));
        }
        gone(&mut b, idb);
        // ReqRcvd with an MRA out: the repeats stop being answered.
        let (mut a, mut b, sid) = two();
        b.mra_on_req = Some(20);
        let (_, idb) = requested(&mut a, &mut b, sid, t);
        let _ = drain(&mut b);
        end(&mut b, idb);
        let _ = drain(&mut b);
        gone(&mut b, idb);
    }
}

#[test]
fn reject_on_a_sidr_request_sends_a_sidr_rep_reject() {
    let (mut a, mut b, sid) = udp_two();
    let t = Nanos(0);
    let ida = a.sidr_request(t, b.local_ip, sid, &[]);
    pump(&mut a, &mut b, t, false);
    let Some(CmEvent::SidrRequest { id: idb, .. }) = b.poll_event() else {
        panic!("no SIDR_REQ reported");
    };
    b.reject_with(idb, RejReason::CONSUMER_DEFINED, &[0xab; 200]);
    pump(&mut a, &mut b, t, false);
    match a.poll_event() {
        Some(CmEvent::SidrReply {
            id,
            status,
            private_data,
            ..
        }) => {
            assert_eq!((id, status), (ida, SidrStatus::REJECT));
            assert_eq!(*private_data, [0xab; 136]);
        }
        e => panic!("{e:?}"),
    }
    // Established connections are not rejected: nothing happens.
    let (mut a, mut b, sid) = two();
    let (ida, idb) = requested(&mut a, &mut b, sid, t);
    b.accept(t, idb, &params(2, 2)).unwrap();
    pump(&mut a, &mut b, t, false);
    b.reject(idb, RejReason::CONSUMER_DEFINED);
    assert!(b.poll_transmit().is_none());
    assert_eq!(b.state(idb), Some(CmState::Established));
    let _ = ida;
}

/// Every message kind the agent knows, with its fields aimed at `a`'s connections now and
/// then, and otherwise random: nothing panics and the state stays bounded.
mod hostile {
    use super::*;
    use proptest::prelude::*;

    // The agent with something in every state and the MAD builder of the `cm_agent` fuzz target,
    // whose body is this test's, coverage-guided.
    use crate::cm::fuzz::{busy, mad};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn random_mads_never_panic(
            msgs in proptest::collection::vec(
                (0u16..0x1c, any::<u64>(), any::<u8>(), any::<bool>(),
                 proptest::collection::vec(any::<u8>(), 0..232)),
                1..48),
            raw in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let (mut a, ids) = busy();
            let peer: IpAddr = "10.0.0.2".parse().unwrap();
            let mut t = Nanos(0);
            let mut n = 0;
            a.handle_mad(t, peer, &raw);
            for (attr, tid, pick, aim, mut body) in msgs {
                // Now and then one of our ids where a message names the receiver's (REQ has
                // none: its word 0 is the sender's; SIDR_REP's is the request id).
                if aim && body.len() >= 8 && !ids.is_empty() {
                    let id = ids[pick as usize % ids.len()].to_be_bytes();
                    let at = if attr == 0x18 { 0 } else { 4 };
                    body[at..at + 4].copy_from_slice(&id);
                }
                a.handle_mad(t, peer, &mad(attr, tid, &body));
                while a.poll_transmit().is_some() {}
                while let Some(e) = a.poll_event() {
                    // Answer what the application is asked, sometimes.
                    match e {
                        CmEvent::ConnectRequest { id, .. } if pick & 1 == 0 => {
                            let _ = a.accept(t, id, &params(5, 5));
                        }
                        CmEvent::SidrRequest { id, .. } if pick & 2 == 0 => {
                            let _ = a.sidr_reply(id, SidrStatus::SUCCESS, Qpn::new(5), QKey(5), &[]);
                        }
                        CmEvent::RepReceived { id, .. } => { let _ = a.establish(t, id); }
                        _ => {}
                    }
                }
                if pick % 5 == 0 {
                    if let Some(d) = a.poll_timeout() {
                        t = d;
                        a.handle_timeout(t);
                    }
                }
                n += 1;
                prop_assert!(a.book.half_open <= a.max_half_open);
                prop_assert!(a.connections() <= ids.len() + 2 + n);
            }
            // Everything ends: time runs out on all of it.
            for _ in 0..1000 {
                let Some(d) = a.poll_timeout() else { break };
                a.handle_timeout(d);
                while a.poll_transmit().is_some() {}
            }
            prop_assert_eq!(a.poll_timeout(), None);
            prop_assert_eq!(a.book.half_open, 0);
        }
    }
}

#[test]
fn an_mra_only_for_a_repeated_req_as_linux_sends_it() {
    let (mut a, mut b, sid) = two();
    b.mra_on_req = Some(24);
    b.mra_at_once = false;
    let t0 = Nanos(0);
    a.connect(t0, b.local_ip, sid, &params(0x11, 100));
    let (_, req) = a.poll_transmit().unwrap();
    b.handle_mad(t0, a.local_ip, &req);
    assert!(matches!(
        b.poll_event(),
        Some(CmEvent::ConnectRequest { .. })
    ));
    assert!(drain(&mut b).is_empty(), "nothing sent for the first REQ");
    assert_eq!(b.counters().mras_sent, 0);
    // The repeat gets the MRA.
    b.handle_mad(t0, a.local_ip, &req);
    let out = drain(&mut b);
    assert_eq!(out.len(), 1);
    let CmMessage::Mra(m) = CmMadRepr::parse(&out[0].1).unwrap().msg else {
        panic!("not an MRA")
    };
    assert_eq!((m.message_mraed, m.service_timeout), (MsgKind::Req, 24));
    assert_eq!(b.counters().mras_sent, 1);
}
