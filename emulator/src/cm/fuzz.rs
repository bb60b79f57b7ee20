//! The body of the `cm_agent` fuzz target (`fuzz/fuzz_targets/cm_agent.rs`), here so that it can
//! see the agent's book and so that its corpus also runs as a plain test
//! (`emulator/tests/fuzz_corpus.rs`); its busy agent and MAD builder also serve the CM's proptest
//! `random_mads_never_panic` (`tests.rs`), so the module is built for tests too. An agent with a
//! connection in every state takes arbitrary MADs from the network, its application answering
//! some of what it reports and time passing now and then. Panics are the findings; so are a
//! half-open count above its bound, connections that grow faster than the messages that could
//! make them, and a timer that never ends.
//!
//! The input is a sequence of records: a control byte, a transaction id byte, a length byte,
//! then that many bytes (at most 232) of a CM message's body. The control byte picks the
//! attribute (a CM attribute from 0x10 to 0x1b when its top bit is set, else any of 0x00–0x1f),
//! whether one of the agent's own communication ids goes where the message names the
//! receiver's, how the application answers and whether time moves to the next deadline. A
//! record whose length byte is 255 is a raw MAD instead (the next 256 bytes as they are).
use super::*;
use rocemu_wire::cm::{PortSpace, RtuRepr, SidrStatus};
use rocemu_wire::Psn;

pub(super) fn params(qpn: u32, psn: u32) -> ConnParams {
    ConnParams {
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        ..ConnParams::default()
    }
}

/// Carries MADs between two agents until neither has one to send.
fn pump(a: &mut CmAgent, b: &mut CmAgent, now: Nanos) {
    let (ia, ib) = (a.local_ip, b.local_ip);
    loop {
        let mut moved = false;
        while let Some((_, m)) = a.poll_transmit() {
            b.handle_mad(now, ia, &m);
            moved = true;
        }
        while let Some((_, m)) = b.poll_transmit() {
            a.handle_mad(now, ib, &m);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// Agent A with something in every state (listening; REQ sent, plain and with a deferred RTU;
/// REQ received; REP sent; established; SIDR both ways), and the ids it knows.
pub(super) fn busy() -> (CmAgent, Vec<u32>) {
    let mut a = CmAgent::new("10.0.0.1".parse().expect("an address"), 1, 1);
    let mut b = CmAgent::new("10.0.0.2".parse().expect("an address"), 2, 2);
    let sid = ServiceId::rdma_cm(PortSpace::TCP, 7174);
    let udp = ServiceId::rdma_cm(PortSpace::UDP, 7174);
    a.listen(sid);
    a.listen(udp);
    b.listen(sid);
    b.listen(udp);
    a.mra_on_req = Some(16);
    a.max_half_open = 8;
    let t = Nanos(0);
    let mut ids = Vec::new();
    // Established, and one waiting for its deferred RTU.
    ids.push(a.connect(t, b.local_ip, sid, &params(1, 1)).0);
    let deferred = ConnParams {
        defer_rtu: true,
        ..params(2, 2)
    };
    ids.push(a.connect(t, b.local_ip, sid, &deferred).0);
    pump(&mut a, &mut b, t);
    while let Some(e) = b.poll_event() {
        if let CmEvent::ConnectRequest { id, .. } = e {
            let _ = b.accept(t, id, &params(3, 3));
        }
    }
    pump(&mut a, &mut b, t);
    // A REQ sent that nobody has answered yet, and a SIDR_REQ.
    ids.push(a.connect(t, b.local_ip, sid, &params(4, 4)).0);
    ids.push(a.sidr_request(t, b.local_ip, udp, &[1]).0);
    while a.poll_transmit().is_some() {}
    // B's REQs and SIDR_REQ towards A: A holds them, one of them answered (REP sent).
    b.connect(t, a.local_ip, sid, &params(5, 5));
    b.connect(t, a.local_ip, sid, &params(6, 6));
    b.sidr_request(t, a.local_ip, udp, &[2]);
    while let Some((_, m)) = b.poll_transmit() {
        a.handle_mad(t, b.local_ip, &m);
    }
    let mut answered = false;
    while let Some(e) = a.poll_event() {
        if let CmEvent::ConnectRequest { id, .. } = e {
            if !answered {
                answered = a.accept(t, id, &params(7, 7)).is_ok();
            }
        }
        if e.id().0 != 0 {
            ids.push(e.id().0);
        }
    }
    while a.poll_transmit().is_some() {}
    (a, ids)
}

/// A MAD of attribute `attr` with transaction id `tid` and `body` after the MAD header (a
/// well-formed CM header: class, version, method; everything after it as given).
pub(super) fn mad(attr: u16, tid: u64, body: &[u8]) -> [u8; MAD_LEN] {
    let mut m = [0u8; MAD_LEN];
    CmMadRepr::new(Tid(tid), CmMessage::Rtu(RtuRepr::default()))
        .emit(&mut m)
        .expect("a MAD fits its buffer");
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    let n = body.len().min(MAD_LEN - 24);
    m[24..24 + n].copy_from_slice(&body[..n]);
    m
}

#[cfg(feature = "fuzzing")]
pub(crate) fn target(data: &[u8]) {
    let (mut a, ids) = busy();
    let peer: IpAddr = "10.0.0.2".parse().expect("an address");
    let mut t = Nanos(0);
    let mut n = 0usize;
    let mut rest = data;
    while let [ctl, tid, len, tail @ ..] = rest {
        let (ctl, tid, len) = (*ctl, *tid, *len as usize);
        if len == 255 {
            let (m, r) = tail.split_at(tail.len().min(MAD_LEN));
            a.handle_mad(t, peer, m);
            rest = r;
        } else {
            let (body, r) = tail.split_at(tail.len().min(len.min(MAD_LEN - 24)));
            rest = r;
            let attr = if ctl & 0x80 != 0 {
                0x10 + u16::from(ctl & 0x0f) % 12
            } else {
                u16::from(ctl & 0x1f)
            };
            let mut body = body.to_vec();
            // Now and then one of the agent's own ids where the message names the receiver's
            // (a REQ has none: its word 0 is the sender's; a SIDR_REP's is the request's id).
            if ctl & 0x40 != 0 && body.len() >= 8 && !ids.is_empty() {
                let id = ids[usize::from(tid) % ids.len()].to_be_bytes();
                let at = if attr == 0x18 { 0 } else { 4 };
                body[at..at + 4].copy_from_slice(&id);
            }
            a.handle_mad(
                t,
                peer,
                &mad(attr, u64::from(tid) << 8 | u64::from(ctl), &body),
            );
        }
        while a.poll_transmit().is_some() {}
        while let Some(e) = a.poll_event() {
            // The application answers some of what it is asked.
            match e {
                CmEvent::ConnectRequest { id, .. } if ctl & 1 == 0 => {
                    let _ = a.accept(t, id, &params(8, 8));
                }
                CmEvent::ConnectRequest { id, .. } if ctl & 2 == 0 => a.reject(id, RejReason(28)),
                CmEvent::SidrRequest { id, .. } if ctl & 2 == 0 => {
                    let _ = a.sidr_reply(id, SidrStatus::SUCCESS, Qpn::new(9), QKey(9), &[]);
                }
                CmEvent::RepReceived { id, .. } => {
                    let _ = a.establish(t, id);
                }
                CmEvent::Established { id, .. } if ctl & 4 != 0 => {
                    let _ = a.disconnect(t, id);
                }
                _ => {}
            }
        }
        if ctl & 0x20 != 0 {
            if let Some(d) = a.poll_timeout() {
                t = d;
                a.handle_timeout(t);
            }
        }
        n += 1;
        assert!(
            a.book.half_open <= a.max_half_open,
            "half-open above its bound"
        );
        assert!(
            a.connections() <= ids.len() + 2 + n,
            "{} connections after {n} messages",
            a.connections()
        );
    }
    // Everything ends: time runs out on all of it.
    for _ in 0..1000 {
        let Some(d) = a.poll_timeout() else { break };
        a.handle_timeout(d);
        while a.poll_transmit().is_some() {}
        while a.poll_event().is_some() {}
    }
    assert_eq!(a.poll_timeout(), None, "a timer that never ends");
    assert_eq!(a.book.half_open, 0);
}
