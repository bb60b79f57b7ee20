//! RC over a clean wire: every opcode, multi-MTU, exact completions.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn send_multi_mtu_delivers_bytes_and_completions() {
    let mut t = Bed::rc();
    let data = pattern(5000, 7);
    t.fill(A, 0, &data);
    t.post_recv(B, 77, 0, 8192);
    let sge = t.sge(A, 0, 5000);
    t.post_send(A, wr(1, WrOpcode::Send, vec![sge]));
    let wa = t.wait_wcs(A, 1);
    assert_eq!(wa[0].wr_id, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wa[0].opcode, WcOpcode::Send);
    let wb = t.wait_wcs(B, 1);
    assert_eq!(wb[0].wr_id, 77);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[0].opcode, WcOpcode::Recv);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(t.bytes(B, 0, 5000), data);
}

#[test]
fn write_read_and_atomics() {
    let mut t = Bed::rc();
    let data = pattern(10_000, 3);
    t.fill(A, 0, &data);
    let (ra, rk) = t.raddr(B, 4096);
    let sge = t.sge(A, 0, 10_000);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge],
        ),
    );
    assert_eq!(t.wait_wcs(A, 1)[0].status, WcStatus::Success);
    assert_eq!(t.bytes(B, 4096, 10_000), data);
    // Read it back into another place.
    let sge = t.sge(A, 100_000, 10_000);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge],
        ),
    );
    let w = t.wait_wcs(A, 1);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].opcode, w[0].byte_len),
        (2, WcStatus::Success, WcOpcode::RdmaRead, 10_000)
    );
    assert_eq!(t.bytes(A, 100_000, 10_000), data);
    // Atomics on B's memory at 0x8000.
    t.fill(B, 0x8000, &5u64.to_le_bytes());
    let (aa, ak) = t.raddr(B, 0x8000);
    let sge = t.sge(A, 200_000, 8);
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::AtomicFetchAdd {
                remote_addr: aa,
                rkey: ak,
                add: 10,
            },
            vec![sge],
        ),
    );
    let w = t.wait_wcs(A, 1);
    assert_eq!(
        (w[0].status, w[0].opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(t.bytes(A, 200_000, 8), 5u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x8000, 8), 15u64.to_le_bytes());
    let sge = t.sge(A, 200_008, 8);
    t.post_send(
        A,
        wr(
            4,
            WrOpcode::AtomicCmpSwap {
                remote_addr: aa,
                rkey: ak,
                compare: 15,
                swap: 99,
            },
            vec![sge],
        ),
    );
    let w = t.wait_wcs(A, 1);
    assert_eq!(
        (w[0].status, w[0].opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    assert_eq!(t.bytes(A, 200_008, 8), 15u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x8000, 8), 99u64.to_le_bytes());
    // Compare fails: nothing changes, the original comes back.
    t.post_send(
        A,
        wr(
            5,
            WrOpcode::AtomicCmpSwap {
                remote_addr: aa,
                rkey: ak,
                compare: 1,
                swap: 7,
            },
            vec![sge],
        ),
    );
    t.wait_wcs(A, 1);
    assert_eq!(t.bytes(A, 200_008, 8), 99u64.to_le_bytes());
    assert_eq!(t.bytes(B, 0x8000, 8), 99u64.to_le_bytes());
}

#[test]
fn immediate_and_invalidate() {
    let mut t = Bed::rc();
    t.fill(A, 0, b"hello");
    t.post_recv(B, 10, 0, 64);
    t.post_recv(B, 11, 64, 64);
    t.post_recv(B, 12, 128, 64);
    let sge = t.sge(A, 0, 5);
    t.post_send(
        A,
        wr(1, WrOpcode::SendWithImm { imm: 0xdeadbeef }, vec![sge]),
    );
    let (ra, rk) = t.raddr(B, 4096);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 0x1234,
            },
            vec![sge],
        ),
    );
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::SendWithInv {
                invalidate_rkey: rk,
            },
            vec![sge],
        ),
    );
    let w = t.wait_wcs(B, 3);
    assert_eq!(
        (w[0].wr_id, w[0].opcode, w[0].imm_data, w[0].byte_len),
        (10, WcOpcode::Recv, 0xdeadbeef, 5)
    );
    assert!(w[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(
        (w[1].wr_id, w[1].opcode, w[1].imm_data, w[1].byte_len),
        (11, WcOpcode::RecvRdmaWithImm, 0x1234, 5)
    );
    assert_eq!(t.bytes(B, 4096, 5), b"hello");
    assert_eq!((w[2].wr_id, w[2].imm_data), (12, rk));
    assert!(w[2].wc_flags.contains(WcFlags::WITH_INV));
    // The R_Key is gone: a write through it now fails with a remote access error.
    t.post_send(
        A,
        wr(
            4,
            WrOpcode::RdmaWrite {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge],
        ),
    );
    let w = t.wait_wcs(A, 4);
    assert_eq!(w.last().unwrap().status, WcStatus::RemAccessErr);
    assert_eq!(t.state(A), QpState::Err);
}
