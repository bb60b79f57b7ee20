//! RC responder NAKs (IBTA 9.7.4.1 in 1.5; 9.9.3 unverified), asserting the exact NAK on the wire
//! (PSN, syndrome, MSN), the requester's completion for it, the WR_FLUSH_ERR of everything else
//! outstanding, and both QPs' states afterwards: PSN sequence errors (class B: NAK once, go-back-N,
//! no state change), invalid request, remote access and remote operational errors (class C/D: the
//! responder QP goes to ERR as in rxe, the requester completes in error and goes to ERR).
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;
use rocemu_wire::{BthRepr, ExtHeaders, Opcode as O, Psn, RKey, RethRepr};

const PSN_A: u32 = 0x123;

fn bed256() -> Bed {
    BedCfg::new(QpType::Rc).both(|o| o.mtu = Mtu::M256).build()
}

/// Posts WR 1 (`op`) then WR 2 (a SEND) and WR 3 (a WRITE) behind it, and two receives on B;
/// runs to the end. Returns A's and B's completions.
fn fail_first(t: &mut Bed, op: WrOpcode, len: usize) -> (Vec<Wc>, Vec<Wc>) {
    t.post_recv(B, 100, 0x8000, 4096);
    t.post_recv(B, 101, 0x9000, 4096);
    let sge = t.sge(A, 0, len);
    t.post_send(A, wr(1, op, vec![sge]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (ra, rk) = t.raddr(B, 0x1000);
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    t.settle()
}

/// A class C/D error at the first WR: the NAK, A's completions, B's flushed receives, both QPs
/// in ERR.
fn assert_fatal(t: &mut Bed, wa: &[Wc], wb: &[Wc], syn: u8, status: WcStatus, nak_psn: u32) {
    let naks: Vec<_> = t.acks(Dir::BA).into_iter().filter(|a| a.1 != ACK).collect();
    assert_eq!(naks, vec![(nak_psn, syn, 0)], "one NAK, MSN unchanged");
    assert_eq!(
        st(wa),
        vec![
            (1, status),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        st(wb),
        vec![(100, WcStatus::WrFlushErr), (101, WcStatus::WrFlushErr)]
    );
    assert_eq!(t.state(A), QpState::Err);
    assert_eq!(t.state(B), QpState::Err);
}

#[test]
fn psn_sequence_error_nak_once_then_go_back_n() {
    // Five SEND packets; the first is lost. The responder sees four out-of-order packets and
    // NAKs once (C9-112, unverified: "only one NAK per sequence error"), the requester goes
    // back to the NAKed PSN (9.7.5.2.3, unverified) and the message arrives once.
    let mut t = bed256();
    let data = pattern(1280, 9);
    t.fill(A, 0, &data);
    t.post_recv(B, 7, 0x10000, 1280);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == PSN_A && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(7, WcStatus::Success, 1280)]
    );
    assert_eq!(t.bytes(B, 0x10000, 1280), data);
    let ops = |base: u32| {
        vec![
            (O::RC_SEND_FIRST, base),
            (O::RC_SEND_MIDDLE, base + 1),
            (O::RC_SEND_MIDDLE, base + 2),
            (O::RC_SEND_MIDDLE, base + 3),
            (O::RC_SEND_LAST, base + 4),
        ]
    };
    let mut want = ops(PSN_A);
    want.extend(ops(PSN_A));
    assert_eq!(
        t.ops(Dir::AB),
        want,
        "everything once, then everything again from the NAKed PSN"
    );
    assert_eq!(
        t.now(),
        rocemu_emulator::time::Nanos::ZERO,
        "recovery needs no timeout"
    );
    let acks = t.acks(Dir::BA);
    assert_eq!(
        acks.iter().filter(|a| a.1 != ACK).collect::<Vec<_>>(),
        vec![&(PSN_A, NAK_SEQ, 0)],
        "exactly one sequence NAK, for the expected PSN"
    );
    // (Intermediate ACKs are allowed: a window-limited retransmission asks for them.)
    assert_eq!(acks.last(), Some(&(PSN_A + 4, ACK, 1)));
    assert_eq!(t.state(A), QpState::Rts);
    assert_eq!(t.state(B), QpState::Rts);
    let (ca, cb) = (t.p.a.counters(), t.p.b.counters());
    assert_eq!((cb.nak_sent_seq_err, cb.nak_sent()), (1, 1));
    // Four packets came after the gap; the first made the NAK (rxe counts that one).
    assert_eq!((cb.out_of_sequence, cb.out_of_seq_request), (4, 1));
    assert_eq!((ca.nak_rcvd_seq_err, ca.nak_rcvd()), (1, 1));
    assert_eq!((ca.packet_seq_err, ca.completer_retry_err), (1, 1));
    assert_eq!(ca.retransmitted_pkts, 5);
}

#[test]
fn psn_sequence_error_mid_message_resumes_at_the_gap() {
    // The third packet of five is lost: the NAK names it, the requester resends from it.
    let mut t = bed256();
    let data = pattern(1280, 10);
    t.fill(A, 0, &data);
    t.post_recv(B, 7, 0x10000, 1280);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == PSN_A + 2 && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(wb.len(), 1);
    assert_eq!(t.bytes(B, 0x10000, 1280), data);
    let psns: Vec<u32> = t.pkts(Dir::AB).iter().map(|p| p.psn - PSN_A).collect();
    assert_eq!(psns, vec![0, 1, 2, 3, 4, 2, 3, 4]);
    assert_eq!(
        t.acks(Dir::BA),
        vec![(PSN_A + 2, NAK_SEQ, 0), (PSN_A + 4, ACK, 1)]
    );
}

#[test]
fn invalid_request_middle_without_first() {
    // IBTA 9.7.4.1 in 1.5 (C9-91, unverified): a SEND MIDDLE with no SEND FIRST before it is an
    // invalid request. The filter turns the FIRST of a two-packet SEND into a MIDDLE.
    let mut t = bed256();
    t.filter = Box::new(|p| {
        if p.dir == Dir::AB && p.op == O::RC_SEND_FIRST {
            Verdict::Replace(rebuild(&p.frame, |r| r.bth.opcode = O::RC_SEND_MIDDLE))
        } else {
            Verdict::Pass
        }
    });
    let (wa, wb) = fail_first(&mut t, WrOpcode::Send, 300);
    assert_fatal(&mut t, &wa, &wb, NAK_INV, WcStatus::RemInvReqErr, PSN_A);
}

#[test]
fn invalid_request_write_last_in_the_middle_of_a_send() {
    // SEND FIRST then an RDMA WRITE LAST: an opcode out of sequence (C9-91, unverified).
    let mut t = bed256();
    t.filter = Box::new(|p| {
        if p.dir == Dir::AB && p.op == O::RC_SEND_LAST {
            Verdict::Replace(rebuild(&p.frame, |r| r.bth.opcode = O::RC_RDMA_WRITE_LAST))
        } else {
            Verdict::Pass
        }
    });
    t.post_recv(B, 100, 0x8000, 4096);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 300)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A + 1, NAK_INV, 0)]);
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    // The receive the SEND had started is completed in error (IBTA 9.9.3.1.2, unverified, class C).
    assert_eq!(st(&wb), vec![(100, WcStatus::RemInvReqErr)]);
    assert_eq!((t.state(A), t.state(B)), (QpState::Err, QpState::Err));
}

#[test]
fn invalid_request_read_without_remote_read_access() {
    // The responder QP was not enabled for RDMA READ (qp_access_flags): invalid request
    // (IBTA 9.7.4.1 in 1.5 / rxe check_op_valid).
    let mut c = BedCfg::new(QpType::Rc);
    c.b.access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
    let mut t = c.build();
    let (ra, rk) = t.raddr(B, 0);
    let (wa, wb) = fail_first(
        &mut t,
        WrOpcode::RdmaRead {
            remote_addr: ra,
            rkey: rk,
        },
        64,
    );
    assert_fatal(&mut t, &wa, &wb, NAK_INV, WcStatus::RemInvReqErr, PSN_A);
    assert!(
        t.pkts(Dir::BA).iter().all(|p| p.op == O::RC_ACKNOWLEDGE),
        "no read response"
    );
}

#[test]
fn invalid_request_write_and_atomic_without_qp_access() {
    for (access, atomic) in [
        (
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            false,
        ),
        (
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            true,
        ),
    ] {
        let mut c = BedCfg::new(QpType::Rc);
        c.b.access = access;
        let mut t = c.build();
        t.fill(B, 0, &5u64.to_le_bytes());
        let (ra, rk) = t.raddr(B, 0);
        let op = if atomic {
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            }
        } else {
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            }
        };
        let (wa, wb) = fail_first(&mut t, op, 8);
        assert_fatal(&mut t, &wa, &wb, NAK_INV, WcStatus::RemInvReqErr, PSN_A);
        assert_eq!(t.bytes(B, 0, 8), 5u64.to_le_bytes(), "memory untouched");
    }
}

#[test]
fn invalid_request_misaligned_atomic() {
    // IBTA 9.4.5 (C9-68, unverified: atomics need an 8-byte aligned VA): invalid request NAK.
    let mut t = Bed::rc();
    let (ra, rk) = t.raddr(B, 0x104);
    let (wa, wb) = fail_first(
        &mut t,
        WrOpcode::AtomicCmpSwap {
            remote_addr: ra,
            rkey: rk,
            compare: 0,
            swap: 1,
        },
        8,
    );
    assert_fatal(&mut t, &wa, &wb, NAK_INV, WcStatus::RemInvReqErr, PSN_A);
    assert_eq!(t.bytes(B, 0x100, 16), [0; 16]);
}

#[test]
fn invalid_request_receive_buffer_too_small() {
    // A SEND longer than the receive WQE: invalid request NAK, the receive completes with a
    // local length error (IBTA 9.7.5.1.6, unverified; rxe: LOC_LEN_ERR).
    let mut t = bed256();
    t.post_recv(B, 100, 0x8000, 200);
    t.post_recv(B, 101, 0x9000, 4096);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 300)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    // The FIRST fits (256 ≤ 200? no): the FIRST itself overflows the 200-byte buffer.
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_INV, 0)]);
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        st(&wb),
        vec![(100, WcStatus::LocLenErr), (101, WcStatus::WrFlushErr)]
    );
    assert_eq!((t.state(A), t.state(B)), (QpState::Err, QpState::Err));
}

fn too_many_reads_bed() -> Bed {
    let mut c = BedCfg::new(QpType::Rc);
    c.a.max_rd_atomic = 4;
    c.b.max_dest_rd_atomic = 1;
    let mut t = c.build();
    t.fill(B, 0, &[0x3c; 64]);
    let (ra, rk) = t.raddr(B, 0);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 64)],
        ),
    );
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 64, 64)],
        ),
    );
    t
}

#[test]
fn invalid_request_too_many_reads_for_the_responder() {
    // A may have 4 reads outstanding, B accepts 1 (max_dest_rd_atomic): the second READ, which
    // arrives while the first is still owed, is an invalid request (C9-150, unverified; rxe
    // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). The first READ was accepted (MSN 1): its response
    // goes out before the NAK, as from rxe, which executes requests one at a time.
    let mut t = too_many_reads_bed();
    let (wa, _) = t.settle();
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::RC_RDMA_READ_REQUEST, PSN_A),
            (O::RC_RDMA_READ_REQUEST, PSN_A + 1)
        ]
    );
    assert_eq!(
        t.pkts(Dir::BA)
            .iter()
            .map(|p| (p.op, p.psn, p.syn(), p.msn()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A, Some(ACK), Some(1)),
            (O::RC_ACKNOWLEDGE, PSN_A + 1, Some(NAK_INV), Some(1))
        ]
    );
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::Success), (2, WcStatus::RemInvReqErr)]
    );
    assert_eq!(t.bytes(A, 0, 64), vec![0x3c; 64]);
    assert_eq!((t.state(A), t.state(B)), (QpState::Err, QpState::Err));
}

#[test]
fn a_responder_with_max_dest_rd_atomic_0_naks_every_read_and_atomic() {
    // max_dest_rd_atomic 0: no responder resources at all, so the first READ is already one
    // too many: NAK invalid request, the QP to ERR (rxe: check_resource() returns
    // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ for max_dest_rd_atomic 0; conformance scenario
    // rdma.read.max-dest-rd-atomic-zero-nak). RoCEmu took it as 1 before.
    for atomic in [false, true] {
        let mut c = BedCfg::new(QpType::Rc);
        c.b.max_dest_rd_atomic = 0;
        let mut t = c.build();
        t.fill(B, 0, &7u64.to_le_bytes());
        let (ra, rk) = t.raddr(B, 0);
        let op = if atomic {
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            }
        } else {
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            }
        };
        t.post_send(A, wr(1, op, vec![t.sge(A, 0, 8)]));
        let (wa, _) = t.settle();
        assert_eq!(
            t.pkts(Dir::BA)
                .iter()
                .map(|p| (p.op, p.psn, p.syn()))
                .collect::<Vec<_>>(),
            vec![(O::RC_ACKNOWLEDGE, PSN_A, Some(NAK_INV))],
            "atomic: {atomic}"
        );
        assert_eq!(st(&wa), vec![(1, WcStatus::RemInvReqErr)]);
        assert_eq!(t.bytes(B, 0, 8), 7u64.to_le_bytes().to_vec());
        assert_eq!(t.state(B), QpState::Err);
    }
}

#[test]
fn a_nak_after_a_read_does_not_complete_the_read_without_its_data() {
    // The READ's response is lost and the NAK for the request after it arrives: the NAK
    // acknowledges the READ's request, not its data (IBTA 9.7.5.2.2, unverified: only a response
    // completes a READ). The READ must not complete successfully with its buffer never written.
    let mut t = too_many_reads_bed();
    t.filter = Box::new(|p| {
        if p.op == O::RC_RDMA_READ_RESPONSE_ONLY {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let (wa, _) = t.settle();
    assert_eq!(wa.len(), 2);
    assert_eq!(wa[0].wr_id, 1);
    assert_ne!(
        wa[0].status,
        WcStatus::Success,
        "READ 1 completed successfully; its buffer: {:?}",
        &t.bytes(A, 0, 4)
    );
    assert_eq!(t.state(A), QpState::Err);
}

/// A remote access error case: WR 1 is `op` against `(va, rkey)`.
fn access_case(t: &mut Bed, op: WrOpcode) {
    let len = if op.is_atomic() { 8 } else { 64 };
    let (wa, wb) = fail_first(t, op, len);
    assert_fatal(t, &wa, &wb, NAK_ACC, WcStatus::RemAccessErr, PSN_A);
}

#[test]
fn remote_access_error_bad_rkey_bounds_permission_pd() {
    // IBTA 9.7.4.1.5 in 1.5: R_Key, PD, permission and bounds. Each on WRITE, READ and
    // ATOMIC; each makes the responder QP ERR (class C, as rxe does for RC).
    type Mk = fn(&mut Bed) -> (u64, u32);
    let cases: [(&str, Mk); 6] = [
        ("bad rkey", |t| {
            let (ra, rk) = t.raddr(B, 0);
            (ra, rk ^ 0x5a5a_0000)
        }),
        ("lkey as rkey", |t| (t.b.mr.addr, t.b.mr.lkey)),
        ("straddles the end", |t| t.raddr(B, MR_LEN - 32)),
        ("at the end", |t| t.raddr(B, MR_LEN)),
        ("below the start", |t| {
            let (ra, rk) = t.raddr(B, 0);
            (ra - 8, rk)
        }),
        ("other pd", |t| {
            let pd = t.p.b.alloc_pd();
            let mr = t.p.b.reg_mr(pd, 4096, Access::ALL).unwrap();
            (mr.addr, mr.rkey)
        }),
    ];
    for (name, mk) in cases {
        for kind in 0..3 {
            if name == "straddles the end" && kind == 2 {
                continue; // an 8-byte atomic 32 bytes before the end is in bounds
            }
            let mut t = Bed::rc();
            let (va, rkey) = mk(&mut t);
            let op = match kind {
                0 => WrOpcode::RdmaWrite {
                    remote_addr: va,
                    rkey,
                },
                1 => WrOpcode::RdmaRead {
                    remote_addr: va,
                    rkey,
                },
                _ => WrOpcode::AtomicFetchAdd {
                    remote_addr: va & !7,
                    rkey,
                    add: 1,
                },
            };
            let (wa, wb) = {
                let len = if kind == 2 { 8 } else { 64 };
                fail_first(&mut t, op, len)
            };
            let naks: Vec<_> = t.acks(Dir::BA).into_iter().filter(|a| a.1 != ACK).collect();
            assert_eq!(naks, vec![(PSN_A, NAK_ACC, 0)], "{name} kind {kind}");
            assert_eq!(
                st(&wa),
                vec![
                    (1, WcStatus::RemAccessErr),
                    (2, WcStatus::WrFlushErr),
                    (3, WcStatus::WrFlushErr)
                ],
                "{name} kind {kind}"
            );
            assert_eq!(wb.len(), 2, "{name} kind {kind}");
            assert_eq!(
                (t.state(A), t.state(B)),
                (QpState::Err, QpState::Err),
                "{name}"
            );
        }
    }
}

#[test]
fn remote_access_error_region_without_the_permission() {
    // A region registered without REMOTE_WRITE / REMOTE_READ / REMOTE_ATOMIC, on a QP that
    // allows all three: the MR's access rights decide.
    for (need, kind) in [
        (Access::REMOTE_WRITE, 0),
        (Access::REMOTE_READ, 1),
        (Access::REMOTE_ATOMIC, 2),
    ] {
        let mut t = Bed::rc();
        let pd = t.b.pd;
        let access = Access(Access::ALL.0 & !need.0);
        let mr = t.p.b.reg_mr(pd, 4096, access).unwrap();
        let op = match kind {
            0 => WrOpcode::RdmaWrite {
                remote_addr: mr.addr,
                rkey: mr.rkey,
            },
            1 => WrOpcode::RdmaRead {
                remote_addr: mr.addr,
                rkey: mr.rkey,
            },
            _ => WrOpcode::AtomicFetchAdd {
                remote_addr: mr.addr,
                rkey: mr.rkey,
                add: 1,
            },
        };
        access_case(&mut t, op);
    }
}

#[test]
fn remote_access_error_multi_packet_write_checks_the_whole_length_at_first() {
    // The RETH of a 3-packet WRITE names 600 bytes where only 512 remain: the FIRST is NAKed,
    // nothing is written.
    let mut t = bed256();
    t.fill(A, 0, &[0x77; 600]);
    let (ra, rk) = t.raddr(B, MR_LEN - 512);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 600)],
        ),
    );
    let (wa, _) = t.settle();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_ACC, 0)]);
    assert_eq!(st(&wa), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(t.bytes(B, MR_LEN - 512, 512), vec![0; 512]);
}

#[test]
fn remote_access_error_after_good_messages_carries_their_msn() {
    // Two good SENDs, then a WRITE with a bad R_Key: the NAK's MSN counts the two messages, the
    // two SENDs complete successfully (the NAK acknowledges what is before it, 9.7.5.1.2).
    let mut t = Bed::rc();
    t.post_recv(B, 100, 0, 64);
    t.post_recv(B, 101, 64, 64);
    t.post_recv(B, 102, 128, 64);
    let sge = t.sge(A, 0, 8);
    t.post_send(A, wr(1, WrOpcode::Send, vec![sge]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![sge]));
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaWrite {
                remote_addr: 0,
                rkey: 1,
            },
            vec![sge],
        ),
    );
    t.post_send(A, wr(4, WrOpcode::Send, vec![sge]));
    let (wa, wb) = t.settle();
    // The four requests arrive in one burst: the NAK replaces the ACK for the second SEND that
    // was queued and not sent yet (coalesced, 9.7.5.1.2); it acknowledges both SENDs.
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A + 2, NAK_ACC, 2)]);
    assert_eq!(
        st(&wa),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        st(&wb),
        vec![
            (100, WcStatus::Success),
            (101, WcStatus::Success),
            (102, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn remote_operational_error_bad_receive_buffer() {
    // The receive WQE names an L_Key that does not exist: the responder cannot place the data (IBTA
    // 9.7.5.1.7 / table 46, unverified: remote operational error), the receive completes in error.
    let mut t = Bed::rc();
    let mut bad = t.sge(B, 0, 64);
    bad.lkey ^= 0x0101_0101;
    t.post_recv_sges(B, 100, vec![bad]);
    t.post_recv(B, 101, 0x9000, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_OP, 0)]);
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::RemOpErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        st(&wb),
        vec![(100, WcStatus::LocProtErr), (101, WcStatus::WrFlushErr)]
    );
    assert_eq!((t.state(A), t.state(B)), (QpState::Err, QpState::Err));
}

#[test]
fn sges_whose_address_wraps_are_protection_errors_not_a_crash() {
    // An SGE whose address plus length wraps the 64-bit space lies outside every region: a local
    // protection error (IBTA 10.6.3, unverified; 11.4.2.1 Poll for Completion), never an index past
    // the region's bytes.
    let mut t = Bed::rc();
    let mut bad = t.sge(A, 0, 64);
    bad.addr = u64::MAX - 7;
    t.post_send(A, wr(1, WrOpcode::Send, vec![bad]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(t.state(A), QpState::Err);
    // The same on a receive: the responder cannot place the data.
    let mut t = Bed::rc();
    let mut bad = t.sge(B, 0, 64);
    bad.addr = u64::MAX - 7;
    t.post_recv_sges(B, 100, vec![bad]);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(st(&wb), vec![(100, WcStatus::LocProtErr)]);
}

#[test]
fn send_with_invalidate_of_a_foreign_rkey_is_an_invalid_request() {
    // IBTA 10.6.6.2 (unverified): an R_Key that is not this PD's cannot be invalidated.
    let mut t = Bed::rc();
    let pd = t.p.b.alloc_pd();
    let other = t.p.b.reg_mr(pd, 4096, Access::ALL).unwrap();
    let (wa, wb) = fail_first(
        &mut t,
        WrOpcode::SendWithInv {
            invalidate_rkey: other.rkey,
        },
        8,
    );
    let naks: Vec<_> = t.acks(Dir::BA).into_iter().filter(|a| a.1 != ACK).collect();
    assert_eq!(naks, vec![(PSN_A, NAK_INV, 0)]);
    assert_eq!(
        st(&wa),
        vec![
            (1, WcStatus::RemInvReqErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(wb[0].wr_id, 100);
    assert_ne!(wb[0].status, WcStatus::Success);
    assert_eq!((t.state(A), t.state(B)), (QpState::Err, QpState::Err));
}

#[test]
fn handmade_nak_codes_map_to_completion_statuses() {
    // The requester side of table 44 (unverified): a NAK crafted on the wire for an outstanding
    // WRITE maps to RemInvReqErr / RemAccessErr / RemOpErr (IBTA 9.7.5.2.5, 10.10.3, unverified).
    for (code, status) in [
        (1u8, WcStatus::RemInvReqErr),
        (2, WcStatus::RemAccessErr),
        (3, WcStatus::RemOpErr),
        (4, WcStatus::RemInvReqErr),
    ] {
        let mut t = Bed::rc();
        // Keep B from answering: drop everything A sends.
        t.filter = drop_dir(Dir::AB);
        let (ra, rk) = t.raddr(B, 0);
        t.post_send(
            A,
            wr(
                1,
                WrOpcode::RdmaWrite {
                    remote_addr: ra,
                    rkey: rk,
                },
                vec![t.sge(A, 0, 8)],
            ),
        );
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
        t.flush_now();
        assert_eq!(t.pkts(Dir::AB).len(), 2);
        let mut bth = BthRepr::new(O::RC_ACKNOWLEDGE, t.qpn(A), Psn::new(PSN_A));
        bth.ack_req = false;
        let ext = ExtHeaders {
            aeth: Some(rocemu_wire::AethRepr {
                syndrome: rocemu_wire::Syndrome(0x60 | code),
                msn: rocemu_wire::Msn::new(0),
            }),
            ..Default::default()
        };
        let f = craft(B, bth, ext, &[]);
        t.inject(A, &f);
        let w = t.wcs(A);
        assert_eq!(
            st(&w),
            vec![(1, status), (2, WcStatus::WrFlushErr)],
            "code {code}"
        );
        assert_eq!(t.state(A), QpState::Err);
    }
}

#[test]
fn handmade_write_middle_at_expected_psn_is_nakked() {
    // A hostile frame: RDMA WRITE MIDDLE at B's expected PSN, no message open (C9-91, unverified).
    let mut t = Bed::rc();
    t.post_recv(B, 100, 0, 64);
    let bth = BthRepr::new(O::RC_RDMA_WRITE_MIDDLE, t.qpn(B), Psn::new(PSN_A));
    let f = craft(A, bth, ExtHeaders::default(), &[0u8; 1024]);
    t.inject(B, &f);
    t.flush_now();
    // A ignores a NAK for a PSN it never sent (C9-117, unverified: it is not outstanding).
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_INV, 0)]);
    assert_eq!(t.state(B), QpState::Err);
    assert_eq!(st(&t.wcs(B)), vec![(100, WcStatus::WrFlushErr)]);
    assert_eq!(t.state(A), QpState::Rts);
    assert!(t.wcs(A).is_empty());
    // A WRITE ONLY whose RETH length disagrees with its payload: invalid request (C9-95,
    // unverified; 9.7.4.1.6 in 1.5).
    let mut t = Bed::rc();
    let (ra, rk) = t.raddr(B, 0);
    let mut bth = BthRepr::new(O::RC_RDMA_WRITE_ONLY, t.qpn(B), Psn::new(PSN_A));
    bth.ack_req = true;
    let ext = ExtHeaders {
        reth: Some(RethRepr {
            va: ra,
            rkey: RKey(rk),
            dma_len: 100,
        }),
        ..Default::default()
    };
    let f = craft(A, bth, ext, &[1u8; 64]);
    t.inject(B, &f);
    t.flush_now();
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A, NAK_INV, 0)]);
    assert_eq!(t.bytes(B, 0, 64), vec![0; 64]);
}

#[test]
fn a_response_of_the_wrong_opcode_is_a_bad_response() {
    // The ACK of a SEND arrives as an RDMA READ RESPONSE ONLY at the SEND's PSN: an unexpected
    // transport opcode from the responder, IBV_WC_BAD_RESP_ERR (rdma-core's ibv_poll_cq(3); rxe
    // fails the WQE too), the QP to ERR; not dropped, not taken as the ACK.
    let mut t = bed256();
    t.filter = Box::new(|p| {
        if p.dir == Dir::BA && p.op == O::RC_ACKNOWLEDGE {
            Verdict::Replace(rebuild(&p.frame, |r| {
                r.bth.opcode = O::RC_RDMA_READ_RESPONSE_ONLY
            }))
        } else {
            Verdict::Pass
        }
    });
    t.post_recv(B, 100, 0x8000, 4096);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::BadRespErr)]);
    assert_eq!(t.state(A), QpState::Err);
}

#[test]
fn an_atomic_acknowledge_for_a_read_is_a_bad_response() {
    // The READ's response arrives as an ATOMIC ACKNOWLEDGE: BAD_RESP_ERR, nothing written.
    let mut t = bed256();
    t.filter = Box::new(|p| {
        if p.dir == Dir::BA && p.op == O::RC_RDMA_READ_RESPONSE_ONLY {
            let f = rocemu_wire::parse_frame(&p.frame).unwrap();
            let mut r = rocemu_wire::FrameRepr::from_parsed(&f);
            r.bth.opcode = O::RC_ATOMIC_ACKNOWLEDGE;
            r.bth.pad = 0;
            r.ext.atomic_ack = Some(rocemu_wire::headers::AtomicAckEthRepr { orig: 0x77 });
            let mut b = vec![0; 4096];
            let n = r.emit_with_payload(&mut b, &[]).unwrap();
            b.truncate(n);
            Verdict::Replace(b)
        } else {
            Verdict::Pass
        }
    });
    t.fill(A, 0, &[0; 8]);
    let (va, rkey) = t.raddr(B, 0);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: va,
                rkey,
            },
            vec![t.sge(A, 0, 8)],
        ),
    );
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::BadRespErr)]);
    assert_eq!(t.bytes(A, 0, 8), vec![0; 8]);
    assert_eq!(t.state(A), QpState::Err);
}
