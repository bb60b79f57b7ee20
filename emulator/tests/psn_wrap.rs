//! PSNs wrap at 2^24 (IBTA 9.2: PSNs are 24-bit; compared modulo 2^24, 9.7.1 unverified):
//! multi-packet messages, READs (which take one PSN per response), go-back-N, duplicates and ACKs
//! across the wrap, on RC and UC.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;
use rocemu_wire::Opcode as O;

const TOP: u32 = (1 << 24) - 2; // 0xfffffe

fn wrap_bed(t: QpType) -> Bed {
    BedCfg::new(t)
        .both(|o| {
            o.mtu = Mtu::M256;
            o.psn_a = psn(TOP);
            o.psn_b = psn((1 << 24) - 1);
        })
        .build()
}

#[test]
fn rc_send_write_read_atomic_across_the_wrap() {
    let mut t = wrap_bed(QpType::Rc);
    let data = pattern(1280, 11);
    t.fill(A, 0, &data);
    t.post_recv(B, 1, 0x10000, 1280);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
    let w = t.wait_wcs(A, 1);
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(t.bytes(B, 0x10000, 1280), data);
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::RC_SEND_FIRST, 0xfffffe),
            (O::RC_SEND_MIDDLE, 0xffffff),
            (O::RC_SEND_MIDDLE, 0),
            (O::RC_SEND_MIDDLE, 1),
            (O::RC_SEND_LAST, 2)
        ]
    );
    assert_eq!(t.acks(Dir::BA), vec![(2, ACK, 1)]);
    // Back below the wrap on the other side: B's requester starts at 0xffffff.
    t.clear_log();
    t.fill(B, 0x20000, &data);
    let (ra, rk) = t.raddr(A, 0x30000);
    t.post_send(
        B,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(B, 0x20000, 600)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(B, 2))[1], (2, WcStatus::Success));
    assert_eq!(
        t.ops(Dir::BA),
        vec![
            (O::RC_RDMA_WRITE_FIRST, 0xffffff),
            (O::RC_RDMA_WRITE_MIDDLE, 0),
            (O::RC_RDMA_WRITE_LAST, 1)
        ]
    );
    assert_eq!(t.bytes(A, 0x30000, 600), &data[..600]);
}

#[test]
fn rc_read_spanning_the_wrap_and_the_request_after_it() {
    let mut t = wrap_bed(QpType::Rc);
    let data = pattern(1000, 12);
    t.fill(B, 0x1000, &data);
    t.fill(B, 0x8000, &3u64.to_le_bytes());
    let (ra, rk) = t.raddr(B, 0x1000);
    let (aa, _) = t.raddr(B, 0x8000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![t.sge(A, 0, 1000)],
        ),
    );
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::AtomicFetchAdd {
                remote_addr: aa,
                rkey: rk,
                add: 4,
            },
            vec![t.sge(A, 0x2000, 8)],
        ),
    );
    let w = t.wait_wcs(A, 2);
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(t.bytes(A, 0, 1000), data);
    assert_eq!(t.bytes(A, 0x2000, 8), 3u64.to_le_bytes());
    // The READ takes PSNs 0xfffffe, 0xffffff, 0, 1; the atomic gets 2.
    assert_eq!(
        t.ops(Dir::AB),
        vec![(O::RC_RDMA_READ_REQUEST, 0xfffffe), (O::RC_FETCH_ADD, 2)]
    );
    assert_eq!(
        t.ops(Dir::BA),
        vec![
            (O::RC_RDMA_READ_RESPONSE_FIRST, 0xfffffe),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, 0xffffff),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, 0),
            (O::RC_RDMA_READ_RESPONSE_LAST, 1),
            (O::RC_ATOMIC_ACKNOWLEDGE, 2)
        ]
    );
}

#[test]
fn rc_go_back_n_across_the_wrap() {
    // PSN 0 (the third packet) is lost: one sequence NAK for PSN 0, resend from 0.
    let mut t = wrap_bed(QpType::Rc);
    let data = pattern(1280, 13);
    t.fill(A, 0, &data);
    t.post_recv(B, 1, 0x10000, 1280);
    let mut dropped = false;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::AB && p.psn == 0 && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1280)]));
    let (wa, wb) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::Success)]);
    assert_eq!(st(&wb), vec![(1, WcStatus::Success)]);
    assert_eq!(t.bytes(B, 0x10000, 1280), data);
    let p: Vec<u32> = t.pkts(Dir::AB).iter().map(|p| p.psn).collect();
    assert_eq!(p, vec![0xfffffe, 0xffffff, 0, 1, 2, 0, 1, 2]);
    assert_eq!(t.acks(Dir::BA), vec![(0, NAK_SEQ, 0), (2, ACK, 1)]);
}

#[test]
fn rc_duplicate_from_before_the_wrap_is_a_duplicate() {
    // After the wrap, a request at 0xffffff is 2 behind the expected PSN 1: a duplicate
    // (re-ACKed with its own PSN), not a far-future PSN (which would be NAKed).
    let mut t = wrap_bed(QpType::Rc);
    t.post_recv(B, 1, 0, 64);
    t.post_recv(B, 2, 64, 64);
    t.post_recv(B, 3, 128, 64);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(2, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.post_send(A, wr(3, WrOpcode::Send, vec![t.sge(A, 0, 8)]));
    t.wait_wcs(A, 3);
    let second = t.pkts(Dir::AB)[1].frame.clone();
    assert_eq!(t.pkts(Dir::AB)[1].psn, 0xffffff);
    t.clear_log();
    t.inject(B, &second);
    t.flush_now();
    assert_eq!(t.acks(Dir::BA), vec![(0xffffff, ACK, 3)]);
    assert_eq!(t.wcs(B).len(), 3);
    assert_eq!(t.p.b.counters().duplicate_request, 1);
}

#[test]
fn rc_ack_timeout_across_the_wrap() {
    let mut t = BedCfg::new(QpType::Rc)
        .both(|o| {
            o.mtu = Mtu::M256;
            o.psn_a = psn(0xffffff);
            o.timeout = 8;
            o.retry_cnt = 2;
        })
        .build();
    let mut n = 0;
    t.filter = Box::new(move |p| {
        if p.dir == Dir::BA {
            n += 1;
            if n == 1 {
                return Verdict::Drop; // the ACK for PSN 0
            }
        }
        Verdict::Pass
    });
    t.post_recv(B, 1, 0, 512);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 300)]));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(
        t.pkts(Dir::AB)
            .iter()
            .map(|p| (p.t, p.psn))
            .collect::<Vec<_>>(),
        vec![
            (rocemu_emulator::time::Nanos::ZERO, 0xffffff),
            (rocemu_emulator::time::Nanos::ZERO, 0),
            (ack_timeout(8), 0xffffff),
            (ack_timeout(8), 0)
        ]
    );
    assert_eq!(t.wcs(B).len(), 1);
}

#[test]
fn uc_send_and_write_across_the_wrap() {
    let mut t = wrap_bed(QpType::Uc);
    let data = pattern(1000, 14);
    t.fill(A, 0, &data);
    t.post_recv(B, 1, 0x10000, 1000);
    t.post_send(A, wr(1, WrOpcode::Send, vec![t.sge(A, 0, 1000)]));
    let (ra, rk) = t.raddr(B, 0x20000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 9,
            },
            vec![t.sge(A, 0, 600)],
        ),
    );
    t.post_recv(B, 2, 0x30000, 16);
    let (wa, wb) = t.settle();
    assert_eq!(
        st(&wa),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 1000), (2, WcStatus::Success, 600)]
    );
    assert_eq!(t.bytes(B, 0x10000, 1000), data);
    assert_eq!(t.bytes(B, 0x20000, 600), &data[..600]);
    assert_eq!(
        t.ops(Dir::AB),
        vec![
            (O::UC_SEND_FIRST, 0xfffffe),
            (O::UC_SEND_MIDDLE, 0xffffff),
            (O::UC_SEND_MIDDLE, 0),
            (O::UC_SEND_LAST, 1),
            (O::UC_RDMA_WRITE_FIRST, 2),
            (O::UC_RDMA_WRITE_MIDDLE, 3),
            (O::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE, 4)
        ]
    );
    assert!(t.pkts(Dir::BA).is_empty());
}
