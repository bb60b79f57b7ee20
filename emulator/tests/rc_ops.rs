//! RC, every opcode end to end on a clean wire, asserting the exact packets on the wire (opcode,
//! PSN, AckReq, SE, pad, RETH / AtomicETH / ImmDt / IETH, AETH syndrome and MSN) and the exact
//! completions: zero-length messages, messages of k×MTU and k×MTU±1 at every path MTU, several
//! SGEs on both sides, inline data, unsignaled WRs and sq_sig_all.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;
use rocemu_wire::frame::pad_for;
use rocemu_wire::Opcode as O;

const MTUS: [Mtu; 5] = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];
const PSN_A: u32 = 0x123;

fn sizes(mtu: usize) -> Vec<usize> {
    vec![
        0,
        1,
        mtu - 1,
        mtu,
        mtu + 1,
        2 * mtu - 1,
        2 * mtu,
        2 * mtu + 1,
        3 * mtu,
    ]
}

fn bed_mtu(mtu: Mtu) -> Bed {
    BedCfg::new(QpType::Rc).both(|o| o.mtu = mtu).build()
}

/// The opcodes of a message of `n` packets (IBTA 9.4, table 35, unverified: FIRST / MIDDLE / LAST /
/// ONLY).
fn seq(n: usize, first: O, middle: O, last: O, only: O) -> Vec<O> {
    if n == 1 {
        return vec![only];
    }
    let mut v = vec![first];
    v.extend(std::iter::repeat_n(middle, n - 2));
    v.push(last);
    v
}

fn npkts(len: usize, mtu: usize) -> usize {
    len.div_ceil(mtu).max(1)
}

/// Payload lengths of a message of `len` bytes at `mtu`.
fn seg_lens(len: usize, mtu: usize) -> Vec<usize> {
    let n = npkts(len, mtu);
    (0..n)
        .map(|k| (len - (k * mtu).min(len)).min(mtu))
        .collect()
}

#[test]
fn send_every_mtu_and_boundary_size() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut t = bed_mtu(mtu);
        let mut next = PSN_A;
        for (i, len) in sizes(m).into_iter().enumerate() {
            t.clear_log();
            let data = pattern(len, i as u8);
            t.fill(A, 0, &data);
            t.fill(B, 0, &vec![0xee; 3 * m + 1]);
            t.post_recv(B, 100 + i as u64, 0, len);
            let sge = t.sge(A, 0, len);
            t.post_send(A, wr(i as u64, WrOpcode::Send, vec![sge]));
            let wa = t.wait_wcs(A, 1);
            assert_eq!(
                (wa[0].wr_id, wa[0].status, wa[0].opcode, wa[0].qp_num),
                (i as u64, WcStatus::Success, WcOpcode::Send, t.qpn(A)),
                "mtu {m} len {len}"
            );
            let wb = t.wcs(B);
            assert_eq!(wb.len(), 1, "mtu {m} len {len}");
            assert_eq!(
                (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
                (
                    100 + i as u64,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32
                ),
                "mtu {m} len {len}"
            );
            assert_eq!(wb[0].src_qp, t.qpn(A));
            assert_eq!(wb[0].wc_flags, WcFlags::default());
            assert_eq!(t.bytes(B, 0, len), data, "mtu {m} len {len}");
            assert_eq!(t.bytes(B, len, 1), [0xee], "no byte past the message");
            let n = npkts(len, m);
            let want = seq(
                n,
                O::RC_SEND_FIRST,
                O::RC_SEND_MIDDLE,
                O::RC_SEND_LAST,
                O::RC_SEND_ONLY,
            );
            let reqs = t.pkts(Dir::AB);
            assert_eq!(
                reqs.iter().map(|p| (p.op, p.psn)).collect::<Vec<_>>(),
                want.into_iter()
                    .zip(psns(next, n as u32))
                    .collect::<Vec<_>>(),
                "mtu {m} len {len}"
            );
            for (k, (p, l)) in reqs.iter().zip(seg_lens(len, m)).enumerate() {
                assert_eq!(p.payload.len(), l, "mtu {m} len {len} pkt {k}");
                assert_eq!(p.pad, pad_for(l), "pad");
                assert_eq!(p.ack_req, k + 1 == n, "AckReq on the last packet only");
                assert!(!p.se);
                assert_eq!(p.dqpn, t.qpn(B));
                assert!(p.reth.is_none() && p.imm.is_none() && p.ieth.is_none());
            }
            // One ACK for the message: its last PSN, MSN = messages so far (C9-148 as rxe numbers
            // it).
            let last = psn(next).add(n as u32 - 1).value();
            assert_eq!(
                t.acks(Dir::BA),
                vec![(last, ACK, i as u32 + 1)],
                "mtu {m} len {len}"
            );
            assert_eq!(t.pkts(Dir::BA).len(), 1);
            next = psn(next).add(n as u32).value();
        }
    }
}

#[test]
fn write_every_mtu_and_boundary_size() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut t = bed_mtu(mtu);
        let mut next = PSN_A;
        for (i, len) in sizes(m).into_iter().enumerate() {
            t.clear_log();
            let data = pattern(len, 50 + i as u8);
            t.fill(A, 0, &data);
            t.fill(B, 0x1000, &vec![0xee; 3 * m + 1]);
            let (ra, rk) = t.raddr(B, 0x1000);
            let sge = t.sge(A, 0, len);
            t.post_send(
                A,
                wr(
                    i as u64,
                    WrOpcode::RdmaWrite {
                        remote_addr: ra,
                        rkey: rk,
                    },
                    vec![sge],
                ),
            );
            let wa = t.wait_wcs(A, 1);
            assert_eq!(
                (wa[0].wr_id, wa[0].status, wa[0].opcode),
                (i as u64, WcStatus::Success, WcOpcode::RdmaWrite)
            );
            assert!(t.wcs(B).is_empty(), "a WRITE consumes no receive");
            assert_eq!(t.bytes(B, 0x1000, len), data, "mtu {m} len {len}");
            assert_eq!(t.bytes(B, 0x1000 + len, 1), [0xee]);
            let n = npkts(len, m);
            let want = seq(
                n,
                O::RC_RDMA_WRITE_FIRST,
                O::RC_RDMA_WRITE_MIDDLE,
                O::RC_RDMA_WRITE_LAST,
                O::RC_RDMA_WRITE_ONLY,
            );
            let reqs = t.pkts(Dir::AB);
            assert_eq!(
                reqs.iter().map(|p| (p.op, p.psn)).collect::<Vec<_>>(),
                want.into_iter()
                    .zip(psns(next, n as u32))
                    .collect::<Vec<_>>(),
                "mtu {m} len {len}"
            );
            for (k, (p, l)) in reqs.iter().zip(seg_lens(len, m)).enumerate() {
                assert_eq!(p.payload.len(), l);
                assert_eq!(p.ack_req, k + 1 == n);
                // The RETH rides on the first packet only and names the whole message (9.3.3).
                if k == 0 {
                    assert_eq!(
                        p.reth.map(|r| (r.va, r.rkey.0, r.dma_len)),
                        Some((ra, rk, len as u32))
                    );
                } else {
                    assert!(p.reth.is_none());
                }
            }
            let last = psn(next).add(n as u32 - 1).value();
            assert_eq!(t.acks(Dir::BA), vec![(last, ACK, i as u32 + 1)]);
            next = psn(next).add(n as u32).value();
        }
    }
}

#[test]
fn read_every_mtu_and_boundary_size() {
    for mtu in MTUS {
        let m = mtu.bytes();
        let mut t = bed_mtu(mtu);
        let mut next = PSN_A;
        for (i, len) in sizes(m).into_iter().enumerate() {
            t.clear_log();
            let data = pattern(len, 90 + i as u8);
            t.fill(B, 0x2000, &data);
            t.fill(A, 0x8000, &vec![0xee; 3 * m + 1]);
            let (ra, rk) = t.raddr(B, 0x2000);
            let sge = t.sge(A, 0x8000, len);
            t.post_send(
                A,
                wr(
                    i as u64,
                    WrOpcode::RdmaRead {
                        remote_addr: ra,
                        rkey: rk,
                    },
                    vec![sge],
                ),
            );
            let wa = t.wait_wcs(A, 1);
            assert_eq!(
                (wa[0].wr_id, wa[0].status, wa[0].opcode, wa[0].byte_len),
                (i as u64, WcStatus::Success, WcOpcode::RdmaRead, len as u32),
                "mtu {m} len {len}"
            );
            assert_eq!(t.bytes(A, 0x8000, len), data, "mtu {m} len {len}");
            assert_eq!(t.bytes(A, 0x8000 + len, 1), [0xee]);
            let n = npkts(len, m);
            // One request; it takes one PSN per response packet (IBTA 9.7.1, unverified).
            let reqs = t.pkts(Dir::AB);
            assert_eq!(reqs.len(), 1);
            assert_eq!((reqs[0].op, reqs[0].psn), (O::RC_RDMA_READ_REQUEST, next));
            assert!(reqs[0].ack_req);
            assert!(reqs[0].payload.is_empty());
            assert_eq!(
                reqs[0].reth.map(|r| (r.va, r.rkey.0, r.dma_len)),
                Some((ra, rk, len as u32))
            );
            let want = seq(
                n,
                O::RC_RDMA_READ_RESPONSE_FIRST,
                O::RC_RDMA_READ_RESPONSE_MIDDLE,
                O::RC_RDMA_READ_RESPONSE_LAST,
                O::RC_RDMA_READ_RESPONSE_ONLY,
            );
            let resp = t.pkts(Dir::BA);
            assert_eq!(
                resp.iter().map(|p| (p.op, p.psn)).collect::<Vec<_>>(),
                want.into_iter()
                    .zip(psns(next, n as u32))
                    .collect::<Vec<_>>(),
                "mtu {m} len {len}"
            );
            for (k, (p, l)) in resp.iter().zip(seg_lens(len, m)).enumerate() {
                assert_eq!(p.payload.len(), l);
                assert_eq!(p.pad, pad_for(l));
                // AETH on FIRST, LAST and ONLY, not on MIDDLE (IBTA table 35, unverified).
                let has_aeth = k == 0 || k + 1 == n;
                assert_eq!(p.aeth.is_some(), has_aeth, "mtu {m} len {len} pkt {k}");
                if has_aeth {
                    assert_eq!((p.syn(), p.msn()), (Some(ACK), Some(i as u32 + 1)));
                }
            }
            next = psn(next).add(n as u32).value();
        }
    }
}

#[test]
fn zero_length_rdma_checks_no_rkey() {
    // C9-88 (9.7.4.1.5 in 1.5): the R_Key of a zero-length RDMA is not validated.
    let mut t = Bed::rc();
    let wr_w = wr(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0xdead_beef,
        },
        vec![],
    );
    t.post_send(A, wr_w);
    let wr_r = wr(
        2,
        WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 0xdead_beef,
        },
        vec![],
    );
    t.post_send(A, wr_r);
    let w = t.wait_wcs(A, 2);
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(w[1].byte_len, 0);
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::RC_RDMA_WRITE_ONLY, PSN_A),
            (O::RC_RDMA_READ_REQUEST, PSN_A + 1)
        ]
    );
    assert_eq!(t.pkts(Dir::AB)[0].reth.unwrap().dma_len, 0);
    let resp = t.pkts(Dir::BA);
    assert_eq!(
        resp.iter()
            .map(|p| (p.op, p.psn, p.payload.len()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_ACKNOWLEDGE, PSN_A, 0),
            (O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A + 1, 0)
        ]
    );
    assert_eq!(resp[1].msn(), Some(2));
    assert_eq!(t.state(B), QpState::Rts);
}

#[test]
fn send_and_write_with_immediate_multi_packet() {
    let mut t = bed_mtu(Mtu::M256);
    let data = pattern(600, 1);
    t.fill(A, 0, &data);
    t.post_recv(B, 10, 0, 1000);
    t.post_recv(B, 11, 2000, 16);
    let sge = t.sge(A, 0, 600);
    t.post_send(
        A,
        wr(1, WrOpcode::SendWithImm { imm: 0x0102_0304 }, vec![sge]),
    );
    let (ra, rk) = t.raddr(B, 0x4000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 0xa0b0_c0d0,
            },
            vec![sge],
        ),
    );
    let wb = t.wait_wcs(B, 2);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags))
            .collect::<Vec<_>>(),
        vec![
            (
                10,
                WcStatus::Success,
                WcOpcode::Recv,
                600,
                0x0102_0304,
                WcFlags::WITH_IMM
            ),
            (
                11,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                600,
                0xa0b0_c0d0,
                WcFlags::WITH_IMM
            ),
        ]
    );
    assert_eq!(t.bytes(B, 0, 600), data);
    assert_eq!(t.bytes(B, 0x4000, 600), data);
    assert_eq!(
        t.bytes(B, 2000, 16),
        [0; 16],
        "WRITE with imm puts nothing in the receive buffer"
    );
    let w = t.wait_wcs(A, 2);
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    let reqs = t.pkts(Dir::AB);
    assert_eq!(
        reqs.iter()
            .map(|p| (p.op, p.psn, p.imm, p.reth.is_some()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_SEND_FIRST, PSN_A, None, false),
            (O::RC_SEND_MIDDLE, PSN_A + 1, None, false),
            (
                O::RC_SEND_LAST_WITH_IMMEDIATE,
                PSN_A + 2,
                Some(0x0102_0304),
                false
            ),
            (O::RC_RDMA_WRITE_FIRST, PSN_A + 3, None, true),
            (O::RC_RDMA_WRITE_MIDDLE, PSN_A + 4, None, false),
            (
                O::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                PSN_A + 5,
                Some(0xa0b0_c0d0),
                false
            ),
        ]
    );
    // Single-packet forms, and a zero-length WRITE with immediate (consumes a receive).
    t.clear_log();
    t.post_recv(B, 12, 0, 1000);
    t.post_recv(B, 13, 0, 1000);
    let small = t.sge(A, 0, 4);
    t.post_send(A, wr(3, WrOpcode::SendWithImm { imm: 7 }, vec![small]));
    t.post_send(
        A,
        wr(
            4,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 8,
            },
            vec![],
        ),
    );
    let wb = t.wait_wcs(B, 2);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm_data))
            .collect::<Vec<_>>(),
        vec![
            (12, WcOpcode::Recv, 4, 7),
            (13, WcOpcode::RecvRdmaWithImm, 0, 8)
        ]
    );
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::RC_SEND_ONLY_WITH_IMMEDIATE, PSN_A + 6),
            (O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, PSN_A + 7)
        ]
    );
    assert_eq!(t.pkts(Dir::AB)[1].reth.unwrap().dma_len, 0);
}

#[test]
fn send_with_invalidate_single_and_multi_packet() {
    let mut t = bed_mtu(Mtu::M256);
    let pd = t.b.pd;
    let extra =
        t.p.b
            .reg_mr(pd, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let data = pattern(600, 2);
    t.fill(A, 0, &data);
    t.post_recv(B, 20, 0, 1000);
    t.post_recv(B, 21, 1000, 1000);
    let sge = t.sge(A, 0, 600);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::SendWithInv {
                invalidate_rkey: extra.rkey,
            },
            vec![sge],
        ),
    );
    let rk_main = t.b.mr.rkey;
    let small = t.sge(A, 0, 3);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::SendWithInv {
                invalidate_rkey: rk_main,
            },
            vec![small],
        ),
    );
    let wb = t.wait_wcs(B, 2);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags))
            .collect::<Vec<_>>(),
        vec![
            (
                20,
                WcStatus::Success,
                WcOpcode::Recv,
                600,
                extra.rkey,
                WcFlags::WITH_INV
            ),
            (
                21,
                WcStatus::Success,
                WcOpcode::Recv,
                3,
                rk_main,
                WcFlags::WITH_INV
            ),
        ]
    );
    assert_eq!(t.bytes(B, 0, 600), data);
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.op, p.psn, p.ieth))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_SEND_FIRST, PSN_A, None),
            (O::RC_SEND_MIDDLE, PSN_A + 1, None),
            (O::RC_SEND_LAST_WITH_INVALIDATE, PSN_A + 2, Some(extra.rkey)),
            (O::RC_SEND_ONLY_WITH_INVALIDATE, PSN_A + 3, Some(rk_main)),
        ]
    );
    assert_eq!(
        st(&t.wait_wcs(A, 2)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn atomics_exact_packets() {
    let mut t = Bed::rc();
    t.fill(B, 0x100, &41u64.to_le_bytes());
    let (ra, rk) = t.raddr(B, 0x100);
    let s1 = t.sge(A, 0, 8);
    let s2 = t.sge(A, 8, 8);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::AtomicFetchAdd {
                remote_addr: ra,
                rkey: rk,
                add: 1,
            },
            vec![s1],
        ),
    );
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::AtomicCmpSwap {
                remote_addr: ra,
                rkey: rk,
                compare: 42,
                swap: 0x1122_3344_5566_7788,
            },
            vec![s2],
        ),
    );
    let w = t.wait_wcs(A, 2);
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::CompSwap, 8)
        ]
    );
    assert_eq!(t.bytes(A, 0, 8), 41u64.to_le_bytes());
    assert_eq!(t.bytes(A, 8, 8), 42u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x100, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    let reqs = t.pkts(Dir::AB);
    assert_eq!(
        reqs.iter()
            .map(|p| (p.op, p.psn, p.ack_req, p.payload.len()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_FETCH_ADD, PSN_A, true, 0),
            (O::RC_COMPARE_SWAP, PSN_A + 1, true, 0)
        ]
    );
    let a0 = reqs[0].atomic.unwrap();
    assert_eq!((a0.va, a0.rkey.0, a0.swap_add, a0.compare), (ra, rk, 1, 0));
    let a1 = reqs[1].atomic.unwrap();
    assert_eq!(
        (a1.va, a1.rkey.0, a1.swap_add, a1.compare),
        (ra, rk, 0x1122_3344_5566_7788, 42)
    );
    let resp = t.pkts(Dir::BA);
    assert_eq!(
        resp.iter()
            .map(|p| (p.op, p.psn, p.syn(), p.msn(), p.atomic_ack))
            .collect::<Vec<_>>(),
        vec![
            (
                O::RC_ATOMIC_ACKNOWLEDGE,
                PSN_A,
                Some(ACK),
                Some(1),
                Some(41)
            ),
            (
                O::RC_ATOMIC_ACKNOWLEDGE,
                PSN_A + 1,
                Some(ACK),
                Some(2),
                Some(42)
            ),
        ]
    );
}

#[test]
fn several_sges_on_both_sides() {
    let mut t = bed_mtu(Mtu::M256);
    let data = pattern(1100, 3);
    // Gather from three pieces of A's region: 100 + 300 + 700 bytes.
    t.fill(A, 0x100, &data[..100]);
    t.fill(A, 0x1000, &data[100..400]);
    t.fill(A, 0x3000, &data[400..]);
    let g = vec![
        t.sge(A, 0x100, 100),
        t.sge(A, 0x1000, 300),
        t.sge(A, 0x3000, 700),
    ];
    // Scatter into three pieces of B's: 500 + 100 + 600.
    let s = vec![
        t.sge(B, 0x9000, 500),
        t.sge(B, 0x100, 100),
        t.sge(B, 0x5000, 600),
    ];
    t.post_recv_sges(B, 9, s);
    t.post_send(A, wr(1, WrOpcode::Send, g.clone()));
    let wb = t.wait_wcs(B, 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (9, WcStatus::Success, 1100)
    );
    assert_eq!(t.bytes(B, 0x9000, 500), &data[..500]);
    assert_eq!(t.bytes(B, 0x100, 100), &data[500..600]);
    assert_eq!(t.bytes(B, 0x5000, 500), &data[600..1100]);
    assert_eq!(t.bytes(B, 0x5000 + 500, 100), [0; 100]);
    let on_wire: Vec<u8> = t
        .pkts(Dir::AB)
        .iter()
        .flat_map(|p| p.payload.clone())
        .collect();
    assert_eq!(on_wire, data);
    // WRITE gathered from the same three, READ back scattered into three others.
    let (ra, rk) = t.raddr(B, 0x20000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            g,
        ),
    );
    let back = vec![
        t.sge(A, 0x40000, 1),
        t.sge(A, 0x50000, 1000),
        t.sge(A, 0x60000, 99),
    ];
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            back,
        ),
    );
    let w = t.wait_wcs(A, 3);
    assert_eq!(
        st(&w),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(t.bytes(B, 0x20000, 1100), data);
    assert_eq!(t.bytes(A, 0x40000, 1), &data[..1]);
    assert_eq!(t.bytes(A, 0x50000, 1000), &data[1..1001]);
    assert_eq!(t.bytes(A, 0x60000, 99), &data[1001..]);
}

#[test]
fn inline_send_and_write() {
    let mut t = bed_mtu(Mtu::M256);
    t.post_recv(B, 1, 0, 512);
    let data = pattern(200, 4);
    let mut w = wr(1, WrOpcode::SendWithImm { imm: 5 }, vec![]);
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    w.inline_data = data.clone();
    t.post_send(A, w);
    let (ra, rk) = t.raddr(B, 0x3000);
    let mut w = wr(
        2,
        WrOpcode::RdmaWrite {
            remote_addr: ra,
            rkey: rk,
        },
        vec![],
    );
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    w.inline_data = data[..17].to_vec();
    t.post_send(A, w);
    assert_eq!(
        st(&t.wait_wcs(A, 2)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let wb = t.wcs(B);
    assert_eq!((wb[0].byte_len, wb[0].imm_data), (200, 5));
    assert_eq!(t.bytes(B, 0, 200), data);
    assert_eq!(t.bytes(B, 0x3000, 17), &data[..17]);
    let p = t.pkts(Dir::AB);
    assert_eq!(
        (p[0].op, p[0].payload.clone()),
        (O::RC_SEND_ONLY_WITH_IMMEDIATE, data.clone())
    );
    assert_eq!(
        (p[1].op, p[1].payload.len(), p[1].pad),
        (O::RC_RDMA_WRITE_ONLY, 17, 3)
    );
    // Above max_inline_data (256): refused at post time.
    let mut w = wr(3, WrOpcode::Send, vec![]);
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    w.inline_data = vec![0; 257];
    assert!(matches!(t.try_post_send(A, w), Err(VerbsError::Invalid(_))));
}

#[test]
fn unsignaled_wrs_complete_silently() {
    let mut t = Bed::rc();
    t.post_recv(B, 1, 0, 64);
    t.post_recv(B, 2, 64, 64);
    let sge = t.sge(A, 0, 8);
    let (ra, rk) = t.raddr(B, 0x1000);
    let mut w1 = wr(1, WrOpcode::Send, vec![sge]);
    w1.flags = SendFlags::default();
    let mut w2 = wr(
        2,
        WrOpcode::RdmaWrite {
            remote_addr: ra,
            rkey: rk,
        },
        vec![sge],
    );
    w2.flags = SendFlags::default();
    let mut w3 = wr(
        3,
        WrOpcode::RdmaRead {
            remote_addr: ra,
            rkey: rk,
        },
        vec![t.sge(A, 64, 8)],
    );
    w3.flags = SendFlags::default();
    t.post_send(A, w1);
    t.post_send(A, w2);
    t.post_send(A, w3);
    t.post_send(A, wr(4, WrOpcode::Send, vec![sge]));
    let (wa, wb) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(4, WcStatus::Success)],
        "only the signaled WR has a CQE"
    );
    assert_eq!(
        st(&wb),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // With sq_sig_all every WR has one, whatever its flags (IBTA 11.2.4.1, unverified).
    let mut c = BedCfg::new(QpType::Rc);
    c.sq_sig_all = true;
    let mut t = c.build();
    let sge = t.sge(A, 0, 8);
    let (ra, rk) = t.raddr(B, 0x1000);
    let mut w1 = wr(
        1,
        WrOpcode::RdmaWrite {
            remote_addr: ra,
            rkey: rk,
        },
        vec![sge],
    );
    w1.flags = SendFlags::default();
    t.post_send(A, w1);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge],
        ),
    );
    let (wa, _) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
}

#[test]
fn solicited_event_on_the_last_packet_only() {
    let mut t = bed_mtu(Mtu::M256);
    t.post_recv(B, 1, 0, 1000);
    let mut w = wr(1, WrOpcode::Send, vec![t.sge(A, 0, 600)]);
    w.flags = SendFlags::SIGNALED | SendFlags::SOLICITED;
    t.post_send(A, w);
    t.wait_wcs(B, 1);
    let se: Vec<bool> = t.pkts(Dir::AB).iter().map(|p| p.se).collect();
    assert_eq!(se, vec![false, false, true]);
}

#[test]
fn ack_coalescing_latest_psn_and_msn() {
    // Four SENDs, each with AckReq, in one burst: the responder answers once for all four, with
    // the latest PSN and the MSN of the fourth message (IBTA 9.7.5.1.2 allows coalescing).
    let mut t = Bed::rc();
    for i in 0..4 {
        t.post_recv(B, i, 0, 64);
    }
    let sge = t.sge(A, 0, 8);
    for i in 0..4 {
        t.post_send(A, wr(i, WrOpcode::Send, vec![sge]));
    }
    let w = t.wait_wcs(A, 4);
    assert_eq!(w.len(), 4);
    assert!(t.pkts(Dir::AB).iter().all(|p| p.ack_req));
    assert_eq!(t.acks(Dir::BA), vec![(PSN_A + 3, ACK, 4)]);
    // A READ between SENDs is answered in order: ACK, response, ACK (not merged across it).
    t.clear_log();
    for i in 0..2 {
        t.post_recv(B, 10 + i, 0, 64);
    }
    let (ra, rk) = t.raddr(B, 0);
    t.post_send(A, wr(5, WrOpcode::Send, vec![sge]));
    t.post_send(
        A,
        wr(
            6,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 8, 8)],
        ),
    );
    t.post_send(A, wr(7, WrOpcode::Send, vec![sge]));
    t.wait_wcs(A, 3);
    assert_eq!(
        t.pkts(Dir::BA)
            .iter()
            .map(|p| (p.op, p.psn, p.msn()))
            .collect::<Vec<_>>(),
        vec![
            (O::RC_ACKNOWLEDGE, PSN_A + 4, Some(5)),
            (O::RC_RDMA_READ_RESPONSE_ONLY, PSN_A + 5, Some(6)),
            (O::RC_ACKNOWLEDGE, PSN_A + 6, Some(7)),
        ]
    );
}

#[test]
fn long_message_asks_for_an_ack_every_64_packets() {
    // Without intermediate AckReq a long message would run on one ACK timer (rxe asks every
    // RXE_MAX_PKT_PER_ACK = 64 packets).
    let mut t = bed_mtu(Mtu::M256);
    let len = 256 * 130;
    t.post_recv(B, 1, 0, len);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, len)]));
    t.wait_wcs(B, 1);
    let ar: Vec<usize> = t
        .pkts(Dir::AB)
        .iter()
        .enumerate()
        .filter(|(_, p)| p.ack_req)
        .map(|(k, _)| k)
        .collect();
    assert_eq!(ar, vec![63, 127, 129]);
}
