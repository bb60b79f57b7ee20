//! RC retries in virtual time: RNR NAKs and the RNR timer (IBTA 9.7.5.2.8 unverified, Table 45),
//! the local ACK timeout (9.7.6.1.3) and retry_cnt, duplicates at the responder (C9-105: SEND/WRITE
//! re-ACKed, READ re-executed, atomics replayed), a READ resumed mid-message, max_rd_atomic and
//! fences (10.8.3.3, unverified).
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::types::RNR_TIMER_MICROS;
use rocemu_wire::Opcode as O;

const PSN_A: u32 = 0x123;

fn rnr_bed(min_rnr_timer: u8, rnr_retry: u8) -> Bed {
    BedCfg::new(QpType::Rc)
        .both(|o| {
            o.min_rnr_timer = min_rnr_timer;
            o.rnr_retry = rnr_retry;
            o.mtu = Mtu::M256;
        })
        .build()
}

fn rnr_wait(code: u8) -> Nanos {
    Nanos::from_micros(RNR_TIMER_MICROS[code as usize] as u64)
}

// ---- RNR ----------------------------------------------------------------------------------

#[test]
fn rnr_nak_then_retry_after_the_table_delay_then_success() {
    // No receive posted: RNR NAK carrying B's min_rnr_timer (14 = 1.28 ms); A sends again exactly
    // that long after the NAK; by then a receive is posted and the SEND lands.
    let mut t = rnr_bed(14, 3);
    let data = pattern(600, 1);
    t.fill(A, 0, &data);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 600)]));
    t.flush_now();
    assert_eq!(t.now(), Nanos::ZERO);
    // FIRST is RNR-NAKed; MIDDLE and LAST are dropped silently (one NAK per error).
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::RC_SEND_FIRST, PSN_A),
            (O::RC_SEND_MIDDLE, PSN_A + 1),
            (O::RC_SEND_LAST, PSN_A + 2)
        ]
    );
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, rnr(14), 0)]);
    assert_eq!(
        t.p.a.poll_timeout(),
        Some(rnr_wait(14)),
        "the RNR timer, and nothing earlier"
    );
    t.post_recv(B, 9, 0, 1000);
    let w = t.wait_wcs(A, 1);
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    let again: Vec<_> = t
        .pkts(Dir::AB)
        .into_iter()
        .skip(3)
        .map(|p| (p.t, p.psn))
        .collect();
    let at = rnr_wait(14);
    assert_eq!(again, vec![(at, PSN_A), (at, PSN_A + 1), (at, PSN_A + 2)]);
    assert_eq!(
        t.acks(Dir::BA),
        vec![(PSN_A, rnr(14), 0), (PSN_A + 2, ACK, 1)]
    );
    let wb = t.wcs(B);
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (9, 600));
    assert_eq!(t.bytes(B, 0, 600), data);
    assert_eq!(t.p.a.counters().rcvd_rnr_err, 1);
    assert_eq!(t.p.b.counters().send_rnr_err, 1);
}

#[test]
fn rnr_timer_codes_follow_table_45() {
    for code in [1u8, 5, 12, 18, 31, 0] {
        let mut t = rnr_bed(code, 1);
        t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
        t.flush_now();
        assert_eq!(t.acks(Dir::BA), vec![(PSN_A, rnr(code), 0)]);
        t.post_recv(B, 1, 0, 64);
        t.wait_wcs(A, 1);
        let times: Vec<Nanos> = t.pkts(Dir::AB).iter().map(|p| p.t).collect();
        assert_eq!(times, vec![Nanos::ZERO, rnr_wait(code)], "code {code}");
    }
}

#[test]
fn rnr_retry_exhausted() {
    // rnr_retry = 2: the first try and two retries are RNR-NAKed; the third NAK fails the WR with
    // RNR_RETRY_EXC_ERR (IBTA 9.7.5.2.8, C9-143, 10.8.3, unverified) and A goes to ERR; B stays
    // RTS.
    let mut t = rnr_bed(3, 2);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(wb.is_empty());
    let d = rnr_wait(3);
    let sends: Vec<_> = t
        .pkts(Dir::AB)
        .iter()
        .filter(|p| p.psn == PSN_A)
        .map(|p| p.t)
        .collect();
    assert_eq!(sends, vec![Nanos::ZERO, d, Nanos(2 * d.0)]);
    assert_eq!(
        t.acks(Dir::BA),
        vec![(PSN_A, rnr(3), 0), (PSN_A, rnr(3), 0), (PSN_A, rnr(3), 0)]
    );
    assert_eq!(t.state(A), QpState::Err);
    assert_eq!(t.state(B), QpState::Rts);
}

#[test]
fn rnr_retry_7_retries_forever() {
    let mut t = rnr_bed(1, 7);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    // 200 rounds of 10 µs.
    t.run_to(Nanos::from_micros(10 * 200 + 5));
    assert!(t.wcs(A).is_empty());
    assert_eq!(t.state(A), QpState::Rts);
    let n = t.pkts(Dir::AB).len();
    assert_eq!(n, 201, "one try and 200 retries");
    assert_eq!(t.p.b.counters().send_rnr_err, 201);
    t.post_recv(B, 1, 0, 64);
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
}

#[test]
fn rnr_on_write_with_immediate_leaves_memory_untouched() {
    let mut t = rnr_bed(2, 7);
    t.fill(A, 0, &[0x55; 100]);
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 3,
            },
            vec![t.sge(A, 0, 100)],
        ),
    );
    t.flush_now();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, rnr(2), 0)]);
    assert_eq!(t.bytes(B, 0x1000, 100), vec![0; 100]);
    t.post_recv(B, 4, 0, 0);
    t.wait_wcs(A, 1);
    assert_eq!(t.bytes(B, 0x1000, 100), vec![0x55; 100]);
    let wb = t.wcs(B);
    assert_eq!(
        (wb[0].wr_id, wb[0].opcode, wb[0].imm_data),
        (4, WcOpcode::RecvRdmaWithImm, 3)
    );
}

#[test]
fn rnr_after_completed_messages_acknowledges_them() {
    // SEND 1 finds a receive, SEND 2 does not: the RNR NAK (PSN+1, MSN 1) completes SEND 1.
    let mut t = rnr_bed(6, 7);
    t.post_recv(B, 1, 0, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.flush_now();
    // Both SENDs arrive in one burst: the RNR NAK replaces SEND 1's ACK, queued and not sent
    // yet (coalesced, IBTA 9.7.5.1.2), and acknowledges it.
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A + 1, rnr(6), 1)]);
    assert_eq!(st(&t.wcs(A)), vec![(1, WcStatus::Success)]);
    t.post_recv(B, 2, 0, 64);
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    let last = t.pkts(Dir::AB).last().map(|p| (p.t, p.psn)).unwrap();
    assert_eq!(
        last,
        (rnr_wait(6), PSN_A + 1),
        "only the RNR-NAKed SEND is sent again"
    );
}

// ---- local ACK timeout -----------------------------------------------------------------------

fn timeout_bed(timeout: u8, retry_cnt: u8) -> Bed {
    BedCfg::new(QpType::Rc)
        .both(|o| {
            o.timeout = timeout;
            o.retry_cnt = retry_cnt;
        })
        .build()
}

#[test]
fn ack_timeout_retries_then_retry_exc_err() {
    // Everything A sends is lost. timeout 10 = 4.096 µs × 2^10; retry_cnt 3: four attempts at
    // 0, T, 2T, 3T, then at 4T RETRY_EXC_ERR and ERR (the retry counter; 10.8.3 unverified).
    let mut t = timeout_bed(10, 3);
    t.filter = drop_dir(Dir::AB);
    t.post_recv(B, 1, 0, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    let (wa, wb) = t.settle();
    let tt = ack_timeout(10);
    assert_eq!(tt, Nanos(4_194_304));
    let mut want = Vec::new();
    for k in 0..4u64 {
        want.push((Nanos(k * tt.0), PSN_A));
        want.push((Nanos(k * tt.0), PSN_A + 1));
    }
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.t, p.psn))
            .collect::<Vec<_>>(),
        want
    );
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        t.now(),
        Nanos(4 * tt.0),
        "the error comes at the fourth timeout"
    );
    assert!(wb.is_empty());
    assert_eq!(t.state(A), QpState::Err);
    assert_eq!(t.state(B), QpState::Rts, "the responder never knew");
    // Three timeouts retried (mlx5 counts those), the fourth exhausted retry_cnt.
    assert_eq!(t.p.a.counters().local_ack_timeout_err, 3);
    assert_eq!(t.p.a.counters().retry_exceeded_err, 1);
    assert_eq!(t.p.a.counters().completer_retry_err, 3);
    assert_eq!(t.p.a.counters().retransmitted_pkts, 6);
}

#[test]
fn ack_timeout_recovers_before_exhaustion() {
    // The first two tries are lost, the third gets through at 2T.
    let mut t = timeout_bed(8, 3);
    let mut n = 0;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB {
            n += 1;
            if n <= 2 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    t.post_recv(B, 1, 0, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let w = t.wait_wcs(A, 1);
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    let tt = ack_timeout(8);
    assert_eq!(
        t.pkts(Dir::AB).iter().map(|p| p.t).collect::<Vec<_>>(),
        vec![Nanos::ZERO, tt, Nanos(2 * tt.0)]
    );
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, ACK, 1)]);
    assert_eq!(t.wcs(B).len(), 1);
    // Progress refills the budget: three more losses in a row still recover.
    let mut n = 0;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB {
            n += 1;
            if n <= 3 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    t.post_recv(B, 2, 0, 64);
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!(t.state(A), QpState::Rts);
}

#[test]
fn lost_ack_is_answered_by_a_duplicate_ack_and_nothing_is_delivered_twice() {
    let mut t = timeout_bed(8, 3);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::BA && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_recv(B, 1, 0, 64);
    t.post_recv(B, 2, 64, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&wb), vec![(1, WcStatus::Success)], "delivered once");
    assert_eq!(
        t.ops(Dir::AB),
        vec![(O::RC_SEND_ONLY, PSN_A), (O::RC_SEND_ONLY, PSN_A)]
    );
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, ACK, 1), (PSN_A, ACK, 1)]);
    assert_eq!(t.p.b.counters().duplicate_request, 1);
}

#[test]
fn timeout_zero_means_no_timer() {
    // IBTA 9.7.6.1.3: a timeout of 0 disables the local ACK timer.
    let mut t = timeout_bed(0, 3);
    t.filter = drop_dir(Dir::AB);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.flush_now();
    assert_eq!(t.p.a.poll_timeout(), None);
    assert_eq!(t.pkts(Dir::AB).len(), 1);
}

// ---- duplicates ------------------------------------------------------------------------------

#[test]
fn duplicate_send_and_write_are_acked_not_executed() {
    let mut t = Bed::rc();
    t.post_recv(B, 1, 0, 64);
    t.post_recv(B, 2, 64, 64);
    t.fill(A, 0, b"original");
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.wait_wcs(A, 2);
    let send = t.pkts(Dir::AB)[0].frame.clone();
    let write = t.pkts(Dir::AB)[1].frame.clone();
    t.fill(B, 0x1000, b"changed!");
    t.clear_log();
    // C9-105 (rxe; C9-104 unverified): a duplicate SEND or WRITE is not executed again and is
    // acknowledged, with its own PSN (rxe uses the latest PSN it has seen, which may cover a
    // READ whose response was lost; rxe's requester then completes that READ without data).
    t.inject(B, &send);
    t.flush_now();
    t.inject(B, &write);
    t.flush_now();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, ACK, 2), (PSN_A + 1, ACK, 2)]);
    assert_eq!(
        st(&t.wcs(B)),
        vec![(1, WcStatus::Success)],
        "receive 2 untouched"
    );
    assert_eq!(t.bytes(B, 64, 8), [0; 8]);
    assert_eq!(t.bytes(B, 0x1000, 8), b"changed!");
    assert!(t.wcs(A).is_empty());
    assert_eq!((t.state(A), t.state(B)), (QpState::Rts, QpState::Rts));
}

#[test]
fn duplicate_read_is_executed_again() {
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    t.fill(B, 0x1000, &[1; 600]);
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 600)],
        ),
    );
    t.wait_wcs(A, 1);
    let req = t.pkts(Dir::AB)[0].frame.clone();
    t.fill(B, 0x1000, &[2; 600]);
    t.clear_log();
    // C9-106 (unverified): a duplicate READ is answered from memory as it is now.
    t.inject(B, &req);
    t.flush_now();
    let resp = t.pkts(Dir::BA);
    assert_eq!(
        resp.iter()
            .map(|p| (p.op, p.psn, p.payload.len(), p.msn()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_RDMA_READ_RESPONSE_FIRST, PSN_A, 256, Some(1)),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN_A + 1, 256, None),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN_A + 2, 88, Some(1)),
        ]
    );
    assert!(resp.iter().all(|p| p.payload.iter().all(|&b| b == 2)));
    assert_eq!(
        t.bytes(A, 0, 600),
        vec![1; 600],
        "A had completed: the stray responses are dropped"
    );
    assert!(t.wcs(A).is_empty());
}

#[test]
fn duplicate_atomic_is_replayed_not_applied_twice() {
    let mut t = Bed::rc();
    t.fill(B, 0x100, &10u64.to_le_bytes());
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 5,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.wait_wcs(A, 1);
    let req = t.pkts(Dir::AB)[0].frame.clone();
    t.clear_log();
    // C9-107 (unverified): the responder answers a duplicate atomic from its replay cache.
    t.inject(B, &req);
    t.flush_now();
    assert_eq!(
        t.pkts(Dir::BA)
            .iter()
            .map(|p| (p.op, p.psn, p.atomic_ack, p.msn()))
            .collect::<Vec<_>>(),
        vec![(O::RC_ATOMIC_ACKNOWLEDGE, PSN_A, Some(10), Some(1))]
    );
    assert_eq!(t.bytes(B, 0x100, 8), 15u64.to_le_bytes());
}

#[test]
fn lost_atomic_ack_retransmits_and_gets_the_cached_result() {
    let mut t = timeout_bed(8, 3);
    t.fill(B, 0x100, &10u64.to_le_bytes());
    let (ra, rk) = t.raddr(B, 0x100);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.op == O::RC_ATOMIC_ACKNOWLEDGE && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicCmpSwap {
                remote_addr: ra,
                rkey: rk,
                compare: 10,
                swap: 77,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    let w = t.wait_wcs(A, 1);
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(
        t.bytes(A, 0, 8),
        10u64.to_le_bytes(),
        "the original value, from the cache"
    );
    assert_eq!(t.bytes(B, 0x100, 8), 77u64.to_le_bytes());
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.t, p.op, p.psn))
            .collect::<Vec<_>>(),
        vec![
            (Nanos::ZERO, O::RC_COMPARE_SWAP, PSN_A),
            (ack_timeout(8), O::RC_COMPARE_SWAP, PSN_A)
        ]
    );
}

#[test]
fn duplicated_frames_on_the_wire_change_nothing() {
    // Every request delivered twice, back to back.
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    t.filter = Box::new(|p| {
        if p.dir == Dir::AB {
            Verdict::Dup
        } else {
            Verdict::Pass
        }
    });
    t.fill(B, 0x100, &1u64.to_le_bytes());
    t.fill(A, 0, &pattern(700, 3));
    t.post_recv(B, 1, 0x8000, 700);
    t.post_recv(B, 2, 0x9000, 700);
    let (ra, rk) = t.raddr(B, 0x100);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 700)]));
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            },
            vec![t.sge(A, 0x1000, 8)],
        ),
    );
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0x2000, 8)],
        ),
    );
    let (wa, wb) = t.settle();
    assert_eq!(
        st(&wa),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(st(&wb), vec![(1, WcStatus::Success)]);
    assert_eq!(t.bytes(B, 0x100, 8), 2u64.to_le_bytes());
    assert_eq!(t.bytes(A, 0x1000, 8), 1u64.to_le_bytes());
    assert_eq!(t.bytes(A, 0x2000, 8), 2u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x8000, 700), pattern(700, 3));
}

#[test]
fn lost_read_response_resumes_the_read_mid_message() {
    // A 5-packet READ; response 2 (a MIDDLE) is lost. Response 3 reveals the gap: A asks again
    // for the rest only, a new READ request at PSN+2 for va+512, 768 bytes (IBTA 9.4.4:
    // "Retried RDMA READ Requests need not start at the same address", as pib quotes it).
    let mut t = BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build();
    let data = pattern(1280, 5);
    t.fill(B, 0x1000, &data);
    let (ra, rk) = t.raddr(B, 0x1000);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::BA && p.psn == PSN_A + 2 && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 1280)],
        ),
    );
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 0)]));
    t.post_recv(B, 1, 0, 0);
    let w = t.wait_wcs(A, 2);
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(t.bytes(A, 0, 1280), data);
    let reqs = t.pkts(Dir::AB);
    let reads: Vec<_> = reqs
        .iter()
        .filter(|p| p.op == O::RC_RDMA_READ_REQUEST)
        .map(|p| {
            let r = p.reth.unwrap();
            (p.psn, r.va, r.rkey.0, r.dma_len)
        })
        .collect();
    assert_eq!(
        reads,
        vec![(PSN_A, ra, rk, 1280), (PSN_A + 2, ra + 512, rk, 768)]
    );
    // The resumed request's responses: a new response message of three packets.
    let resp: Vec<_> = t
        .pkts(Dir::BA)
        .into_iter()
        .filter(|p| p.op != O::RC_ACKNOWLEDGE)
        .map(|p| (p.op, p.psn))
        .collect();
    assert_eq!(
        resp,
        vec![
            (O::RC_RDMA_READ_RESPONSE_FIRST, PSN_A),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN_A + 1),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN_A + 2),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN_A + 3),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN_A + 4),
            (O::RC_RDMA_READ_RESPONSE_FIRST, PSN_A + 2),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN_A + 3),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN_A + 4),
        ]
    );
    assert_eq!(t.state(A), QpState::Rts);
}

#[test]
fn lost_read_request_times_out_and_is_sent_again() {
    let mut t = timeout_bed(9, 2);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.op == O::RC_RDMA_READ_REQUEST && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.fill(B, 0, b"abc");
    let (ra, rk) = t.raddr(B, 0);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 3)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(t.bytes(A, 0, 3), b"abc");
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.t, p.psn))
            .collect::<Vec<_>>(),
        vec![(Nanos::ZERO, PSN_A), (ack_timeout(9), PSN_A)]
    );
}

#[test]
fn lost_last_ack_before_a_read_is_implied_by_the_read_response() {
    // SEND's ACK is lost; the READ response that follows acknowledges it (IBTA 9.7.5.1.2, coalesced
    // ACKs: a response implies everything before it).
    let mut t = Bed::rc();
    t.filter = Box::new(|p| {
        if p.op == O::RC_ACKNOWLEDGE {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_recv(B, 1, 0, 64);
    let (ra, rk) = t.raddr(B, 0);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 8, 8)],
        ),
    );
    let w = t.wait_wcs(A, 2);
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(t.now(), Nanos::ZERO, "no timeout needed");
}

// ---- max_rd_atomic, fences -------------------------------------------------------------------

fn reads(t: &mut Bed, n: u64, fence_after: Option<u64>) {
    let (ra, rk) = t.raddr(B, 0);
    for i in 0..n {
        let mut w = wr(
            i,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 64 * i as usize, 64)],
        );
        if fence_after == Some(i) {
            w.flags = SendFlags::SIGNALED | SendFlags::FENCE;
        }
        t.post_send(A, w);
    }
}

#[test]
fn max_rd_atomic_1_keeps_one_read_on_the_wire() {
    // Guarded: a requester blocked by max_rd_atomic or a fence once made poll_transmit spin.
    within(5, || {
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| o.max_rd_atomic = 1)
            .build();
        reads(&mut t, 3, None);
        t.post_send(
            A,
            wr(
                3,
                WrOpcode::AtomicFetchAdd {
                    remote_addr: t.raddr(B, 0x800).0,
                    rkey: t.b.mr.rkey,
                    add: 1,
                },
                vec![t.sge(A, 0x800, 8)],
            ),
        );
        let w = t.wait_wcs(A, 4);
        assert_eq!(w.len(), 4);
        let order: Vec<_> = t.log.iter().map(|p| (p.dir, p.op, p.psn)).collect();
        assert_eq!(
            order,
            vec![
                (Dir::AB, O::RC_RDMA_READ_REQUEST, PSN_A),
                (Dir::BA, O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A),
                (Dir::AB, O::RC_RDMA_READ_REQUEST, PSN_A + 1),
                (Dir::BA, O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A + 1),
                (Dir::AB, O::RC_RDMA_READ_REQUEST, PSN_A + 2),
                (Dir::BA, O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A + 2),
                (Dir::AB, O::RC_FETCH_ADD, PSN_A + 3),
                (Dir::BA, O::RC_ATOMIC_ACKNOWLEDGE, PSN_A + 3),
            ]
        );
        // With 4 allowed, all go out at once.
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| o.max_rd_atomic = 4)
            .build();
        reads(&mut t, 3, None);
        t.wait_wcs(A, 3);
        let dirs: Vec<Dir> = t.log.iter().map(|p| p.dir).collect();
        assert_eq!(
            dirs,
            vec![Dir::AB, Dir::AB, Dir::AB, Dir::BA, Dir::BA, Dir::BA]
        );
    });
}

#[test]
fn max_rd_atomic_does_not_hold_back_sends_and_writes() {
    // Guarded: a requester blocked by max_rd_atomic or a fence once made poll_transmit spin.
    within(5, || {
        let mut t = BedCfg::new(QpType::Rc)
            .both(|o| o.max_rd_atomic = 1)
            .build();
        reads(&mut t, 2, None);
        t.post_recv(B, 1, 0x1000, 64);
        t.post_send(A, wr(9, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
        t.wait_wcs(A, 3);
        // READ 0 goes; READ 1 must wait; the SEND behind it waits too (in order, 10.8.3,
        // unverified).
        let ab: Vec<_> = t.pkts(Dir::AB).iter().map(|p| (p.op, p.psn)).collect();
        assert_eq!(
            ab,
            vec![
                (O::RC_RDMA_READ_REQUEST, PSN_A),
                (O::RC_RDMA_READ_REQUEST, PSN_A + 1),
                (O::RC_SEND_ONLY, PSN_A + 2)
            ]
        );
        assert_eq!(
            t.log[1].dir,
            Dir::BA,
            "the second READ went only after the first response"
        );
    });
}

#[test]
fn fence_waits_for_outstanding_reads() {
    // Guarded: a requester blocked by max_rd_atomic or a fence once made poll_transmit spin.
    within(5, || {
        // IBTA 10.8.3.3 (unverified; fence): a fenced WR starts only when every READ / atomic
        // before it is done.
        let mut t = Bed::rc();
        t.post_recv(B, 1, 0x1000, 64);
        reads(&mut t, 2, None);
        let mut s = wr(9, WrOpcode::Send, vec![t.sge(A, 0, 8)]);
        s.flags = SendFlags::SIGNALED | SendFlags::FENCE;
        t.post_send(A, s);
        t.wait_wcs(A, 3);
        let order: Vec<_> = t.log.iter().map(|p| (p.dir, p.op)).collect();
        assert_eq!(
            order,
            vec![
                (Dir::AB, O::RC_RDMA_READ_REQUEST),
                (Dir::AB, O::RC_RDMA_READ_REQUEST),
                (Dir::BA, O::RC_RDMA_READ_RESPONSE_ONLY),
                (Dir::BA, O::RC_RDMA_READ_RESPONSE_ONLY),
                (Dir::AB, O::RC_SEND_ONLY),
                (Dir::BA, O::RC_ACKNOWLEDGE),
            ]
        );
        // Without the fence the SEND goes with the reads.
        let mut t = Bed::rc();
        t.post_recv(B, 1, 0x1000, 64);
        reads(&mut t, 2, None);
        t.post_send(A, wr(9, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
        t.wait_wcs(A, 3);
        let dirs: Vec<Dir> = t.log.iter().map(|p| p.dir).collect();
        assert_eq!(&dirs[..3], &[Dir::AB, Dir::AB, Dir::AB]);
    });
}

#[test]
fn pair_drive_serves_a_retransmission_at_its_timer() {
    // inproc::Pair::step reports progress only when a frame moved; a timer that fires inside
    // it and queues a retransmission for `now` is then skipped over: `drive_until` jumps the
    // clock to the next deadline (here the 67 ms ACK timer instead of the 1.28 ms RNR wait).
    let mut t = rnr_bed(14, 3);
    let (qa, qb, cqa) = (t.a.qp, t.b.qp, t.a.cq);
    let sge_a = t.sge(A, 0, 8);
    let sge_b = t.sge(B, 0, 64);
    t.p.a
        .post_send(qa, wr(1, WrOpcode::Send, vec![sge_a]))
        .unwrap();
    let mut posted = false;
    let mut got = Vec::new();
    t.p.drive_until(100_000, |p| {
        if !posted && p.b.counters().send_rnr_err == 1 {
            posted = true;
            p.b.post_recv(
                qb,
                RecvWr {
                    wr_id: 1,
                    sg_list: [sge_b].into(),
                },
            )
            .unwrap();
        }
        p.a.poll_cq_into(cqa, 16, &mut got);
        !got.is_empty()
    })
    .unwrap();
    assert_eq!(st(&got), vec![(1, WcStatus::Success)]);
    assert_eq!(
        t.p.now,
        rnr_wait(14),
        "the SEND completes when the RNR wait ends"
    );
}
