//! Regions with no memory behind them (`reg_mr_null`, what the fabric simulator's hosts use):
//! a WRITE into one completes and leaves nothing, a READ or SEND out of one carries zeros, an
//! atomic on one returns 0, and every check (bounds, keys, access) answers as for an owned region.
mod common;
use common::*;
use rocemu_emulator::inproc::Side::{A, B};
use rocemu_emulator::rnic::*;

#[test]
fn a_null_region_takes_writes_gives_zeros_and_is_checked_as_any_other() {
    let mut t = Bed::rc();
    let (pd_a, pd_b) = (t.a.pd, t.b.pd);
    let na = t.p.a.reg_mr_null(pd_a, 8192, Access::ALL).unwrap();
    let nb = t.p.b.reg_mr_null(pd_b, 8192, Access::ALL).unwrap();
    assert_eq!(nb.length, 8192);
    assert!(t.p.b.mr_bytes(nb.lkey).is_none(), "no bytes to show");
    // A WRITE of 3000 bytes (three packets) from A's owned region into B's null one.
    t.fill(A, 0, &pattern(3000, 7));
    let src = t.sge(A, 0, 3000);
    let wr_to = |id, off: u64, len| {
        wr(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: nb.addr + off,
                rkey: nb.rkey,
            },
            vec![Sge { length: len, ..src }],
        )
    };
    t.post_send(A, wr_to(1, 0, 3000));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    // A READ of B's null region into A's owned one: zeros over the pattern.
    let raddr = nb.addr + 100;
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: raddr,
                rkey: nb.rkey,
            },
            vec![t.sge(A, 0, 2000)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!(t.bytes(A, 0, 2000), vec![0; 2000]);
    assert_eq!(
        t.bytes(A, 2000, 1000),
        pattern(3000, 7)[2000..],
        "nothing past the READ"
    );
    // A SEND out of A's null region lands as zeros in B's owned receive buffer.
    t.fill(B, 0, &[0xee; 512]);
    t.post_recv(B, 7, 0, 512);
    t.post_send(
        A,
        wr(
            3,
            WrOpcode::Send,
            vec![Sge {
                addr: na.addr + 4096,
                length: 256,
                lkey: na.lkey,
            }],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(3, WcStatus::Success)]);
    assert_eq!(st(&t.wait_wcs(B, 1)), vec![(7, WcStatus::Success)]);
    assert_eq!(t.bytes(B, 0, 256), vec![0; 256]);
    assert_eq!(t.bytes(B, 256, 256), vec![0xee; 256]);
    // A fetch-and-add on it returns 0 (and adds nowhere: the next one returns 0 too).
    for id in [4, 5] {
        t.post_send(
            A,
            wr(
                id,
                WrOpcode::AtomicFetchAdd {
                    remote_addr: nb.addr + 64,
                    rkey: nb.rkey,
                    add: 9,
                },
                vec![t.sge(A, 4000, 8)],
            ),
        );
        t.fill(A, 4000, &[0xff; 8]);
        assert_eq!(st(&t.wait_wcs(A, 1)), vec![(id, WcStatus::Success)]);
        assert_eq!(t.bytes(A, 4000, 8), vec![0; 8]);
    }
    // One byte past its end: the responder's access NAK, as for an owned region.
    t.post_send(A, wr_to(6, 8192 - 63, 64));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(6, WcStatus::RemAccessErr)]);
}

#[test]
fn a_null_region_s_keys_and_access_are_checked() {
    let mut t = Bed::rc();
    let pd_b = t.b.pd;
    let read_only = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0);
    let nb = t.p.b.reg_mr_null(pd_b, 4096, read_only).unwrap();
    let src = t.sge(A, 0, 64);
    let write = |id, rkey| {
        wr(
            id,
            WrOpcode::RdmaWrite {
                remote_addr: nb.addr,
                rkey,
            },
            vec![src],
        )
    };
    // No REMOTE_WRITE: refused.
    t.post_send(A, write(1, nb.rkey));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::RemAccessErr)]);
    // The verbs' own checks: REMOTE_WRITE without LOCAL_WRITE, beyond max_mr_size.
    let mut t = Bed::rc();
    let pd_b = t.b.pd;
    assert!(t.p.b.reg_mr_null(pd_b, 4096, Access::REMOTE_WRITE).is_err());
    assert!(t.p.b.reg_mr_null(pd_b, usize::MAX, Access::ALL).is_err());
    // A wrong rkey.
    let nb = t.p.b.reg_mr_null(pd_b, 4096, Access::ALL).unwrap();
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaWrite {
                remote_addr: nb.addr,
                rkey: nb.rkey ^ 0x100,
            },
            vec![t.sge(A, 0, 64)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::RemAccessErr)]);
}
