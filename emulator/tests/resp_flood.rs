//! Responses a peer can force (issue 12, item 4): duplicates, RNR NAKs and reads or atomics
//! beyond the responder's resources must not grow the responder's queue without bound when the
//! port does not drain it. ACKs and NAKs coalesce (any response acknowledges every request
//! before its PSN, IBTA 9.7.5.1.2 "Coalesced Acknowledge Messages", as quoted on linux-rdma), a
//! duplicate's answer already queued is not queued again, and what does not fit the QP's
//! response slots is dropped and counted.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;
use rocemu_wire::{Opcode as O, Psn};

const PSN_A: u32 = 0x123;
const FLOOD: usize = 100_000;

/// The response slots of a QP with max_dest_rd_atomic `rd`: one per read or atomic response
/// and the ACK/NAK that may follow each, and one ACK/NAK before them.
fn slots(rd: usize) -> usize {
    2 * rd + 1
}

fn frame_of(t: &Bed, op: O) -> Vec<u8> {
    t.pkts(Dir::AB)
        .iter()
        .find(|p| p.op == op)
        .unwrap_or_else(|| panic!("no {op:?} sent"))
        .frame
        .clone()
}

#[test]
fn duplicate_and_rnr_flood_stays_bounded_and_traffic_goes_on() {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    let qb = t.qpn(B);
    // An atomic (PSN_A), a three-packet READ (PSN_A+1..+3) and a SEND (PSN_A+4), answered.
    t.fill(B, 0x100, &10u64.to_le_bytes());
    t.fill(B, 0x1000, &[7; 600]);
    t.post_recv(B, 50, 0x8000, 64);
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0x1000, 600)],
        ),
    );
    t.post_send(A, wr(3, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    assert_eq!(
        st(&t.wait_wcs(A, 3)),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    t.wcs(B);
    let atomic = frame_of(&t, O::RC_FETCH_ADD);
    let read = frame_of(&t, O::RC_RDMA_READ_REQUEST);
    let send = frame_of(&t, O::RC_SEND_ONLY);
    // A SEND at the expected PSN with no receive posted: an RNR NAK each time.
    let rnr = rebuild(&send, |r| r.bth.psn = Psn::new(PSN_A + 5));
    let before = t.p.b.counters();
    let mut peak = 0;
    for _ in 0..FLOOD {
        t.inject(B, &atomic);
        t.inject(B, &send);
        t.inject(B, &rnr);
        t.inject(B, &read);
        peak = peak.max(t.p.b.queued_responses(qb).unwrap());
    }
    let c = t.p.b.counters();
    assert_eq!(
        c.duplicate_request - before.duplicate_request,
        3 * FLOOD as u64
    );
    assert!(
        peak <= slots(16),
        "{peak} responses queued: {}",
        t.p.b.debug_qp(qb)
    );
    assert!(
        c.resp_coalesced - before.resp_coalesced >= 4 * FLOOD as u64 - 8,
        "{c:?}"
    );
    assert_eq!(
        c.resp_dropped, 0,
        "duplicates coalesce: nothing needs dropping"
    );
    assert_eq!(t.bytes(B, 0x100, 8), 11u64.to_le_bytes(), "applied once");
    // What is queued goes out, and A (nothing outstanding) ignores it.
    t.flush_now();
    assert_eq!(t.p.b.queued_responses(qb).unwrap(), 0);
    assert!(t.pkts(Dir::BA).len() <= slots(16) + 2);
    assert_eq!((t.state(A), t.state(B)), (QpState::Rts, QpState::Rts));
    // Normal traffic after the flood.
    t.clear_log();
    t.post_recv(B, 51, 0x9000, 64);
    t.fill(A, 0x2000, b"after the flood!");
    t.post_send(A, wr(10, WrOpcode::Send, vec![t.sge(A, 0x2000, 16)]));
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(
        A,
        wr(
            11,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 5,
            },
            vec![t.sge(A, 0x3000, 8)],
        ),
    );
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            12,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0x4000, 600)],
        ),
    );
    assert_eq!(
        st(&t.wait_wcs(A, 3)),
        vec![
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success)
        ]
    );
    assert_eq!(st(&t.wcs(B)), vec![(51, WcStatus::Success)]);
    assert_eq!(t.bytes(B, 0x9000, 16), b"after the flood!");
    assert_eq!(t.bytes(A, 0x3000, 8), 11u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x100, 8), 16u64.to_le_bytes());
    assert_eq!(t.bytes(A, 0x4000, 600), vec![7; 600]);
}

#[test]
fn atomics_beyond_the_response_slots_are_dropped_and_counted() {
    // A peer that ignores max_rd_atomic sends 100,000 new atomics and never reads a response:
    // the responder answers what its slots hold and drops the rest unexecuted, as if lost (a
    // conforming requester would send them again). Its queue stays bounded.
    let mut t = BedCfg::new(QpType::Rc)
        .both(|o| {
            o.max_rd_atomic = 4;
            o.max_dest_rd_atomic = 4;
        })
        .build();
    let qb = t.qpn(B);
    t.fill(B, 0x100, &0u64.to_le_bytes());
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.wait_wcs(A, 1);
    let atomic = frame_of(&t, O::RC_FETCH_ADD);
    let mut peak = 0;
    for i in 0..FLOOD as u32 {
        // Each at the next expected PSN, so each is a new request (until one is dropped: the
        // ones after it are then out of sequence).
        let next = rebuild(&atomic, |r| r.bth.psn = Psn::new(PSN_A + 1 + i));
        t.inject(B, &next);
        peak = peak.max(t.p.b.queued_responses(qb).unwrap());
    }
    assert!(peak <= slots(4), "{peak}: {}", t.p.b.debug_qp(qb));
    let c = t.p.b.counters();
    // The first atomic beyond the slots is dropped unexecuted, and so is the sequence-error
    // NAK the next one causes (the queue is still full); the rest are out of sequence and
    // dropped silently (one NAK per sequence error).
    assert_eq!(c.resp_dropped, 2, "{c:?}");
    assert_eq!(c.out_of_sequence, FLOOD as u64 - slots(4) as u64 - 1);
    assert_eq!(
        c.out_of_seq_request, 1,
        "one sequence error, one NAK decided"
    );
    // Executed: the one answered before the flood and one per slot; no more.
    let v = u64::from_le_bytes(t.bytes(B, 0x100, 8).try_into().unwrap());
    assert_eq!(v as usize, 1 + slots(4));
    t.flush_now();
    assert_eq!(t.p.b.queued_responses(qb).unwrap(), 0);
    assert_eq!(t.state(B), QpState::Rts);
}
