//! Memory regions over memory the RNIC does not own (`reg_mr_foreign`, issue 14 item 1): the
//! bytes of every operation land in (and come from) a buffer the test owns, and every check —
//! key, PD, access, bounds, address wrap — answers exactly as for a region the RNIC owns.
mod common;
use common::*;
use rocemu_emulator::dma::ForeignMem;
use rocemu_emulator::inproc::Side::{self, A, B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;

/// A buffer the test owns, 8-byte aligned. The RNIC holds raw pointers into it; the test reads
/// and writes it only through the same raw pointer, never through a reference while the RNIC
/// may run. Declared before the bed, so it outlives every region over it.
struct Mem {
    _words: Vec<u64>,
    ptr: *mut u8,
    len: usize,
}

impl Mem {
    fn new(len: usize) -> Mem {
        let mut words = vec![0u64; len.div_ceil(8)];
        let ptr = words.as_mut_ptr().cast::<u8>();
        Mem {
            _words: words,
            ptr,
            len,
        }
    }
    /// `len` bytes from `off`, as a region.
    fn foreign(&self, off: usize, len: usize) -> ForeignMem {
        assert!(off + len <= self.len);
        // SAFETY: the range lies in `_words`, which lives (unmoved: only the Vec header moves)
        // as long as `self`, and every test drops its bed (and so the region) first.
        unsafe { ForeignMem::new(self.ptr.add(off), len) }
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
    fn get(&self, off: usize, n: usize) -> Vec<u8> {
        assert!(off + n <= self.len);
        let mut v = vec![0u8; n];
        // SAFETY: in bounds; the RNIC runs on this thread (Pair), so nothing writes meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), n) };
        v
    }
    fn set(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: as in `get`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
    fn word(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.get(off, 8).try_into().unwrap())
    }
}

/// A foreign region over all of `m` on side `s`, in that side's PD, at iova = its address.
fn reg(t: &mut Bed, s: Side, m: &Mem, access: Access) -> MrInfo {
    let pd = t.end(s).pd;
    t.p.rnic(s)
        .reg_mr_foreign(pd, m.foreign(0, m.len), m.addr(), access)
        .unwrap()
}

fn at(mr: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.addr + off,
        length: len,
        lkey: mr.lkey,
    }
}

fn write_wr(id: u64, dst: &MrInfo, off: u64, src: Sge) -> SendWr {
    wr(
        id,
        WrOpcode::RdmaWrite {
            remote_addr: dst.addr.wrapping_add(off),
            rkey: dst.rkey,
        },
        vec![src],
    )
}

#[test]
fn write_read_send_and_atomics_move_the_test_s_own_bytes() {
    let (ma, mb) = (Mem::new(16384), Mem::new(16384));
    let mut t = Bed::rc();
    let a = reg(&mut t, A, &ma, Access::ALL);
    let b = reg(&mut t, B, &mb, Access::ALL);
    assert_eq!((a.addr, a.length), (ma.addr(), 16384));
    // WRITE of 3000 bytes (three packets at MTU 1024) from A's buffer into B's.
    let data = pattern(3000, 7);
    ma.set(0, &data);
    t.post_send(A, write_wr(1, &b, 100, at(&a, 0, 3000)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(mb.get(100, 3000), data);
    assert_eq!(mb.get(0, 100), vec![0; 100], "nothing before");
    assert_eq!(mb.get(3100, 100), vec![0; 100], "nothing after");
    // READ of 2500 bytes of B's buffer into A's.
    let back = pattern(2500, 9);
    mb.set(5000, &back);
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::RdmaRead {
                remote_addr: b.addr + 5000,
                rkey: b.rkey,
            },
            vec![at(&a, 8192, 2500)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!(ma.get(8192, 2500), back);
    // SEND of 1500 bytes into a receive of two SGEs in B's buffer.
    let msg = pattern(1500, 11);
    ma.set(4096, &msg);
    t.post_recv_sges(B, 9, vec![at(&b, 10000, 1000), at(&b, 12000, 1000)]);
    t.post_send(A, wr(3, WrOpcode::Send, vec![at(&a, 4096, 1500)]));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(3, WcStatus::Success)]);
    let wb = t.wait_wcs(B, 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (9, WcStatus::Success, 1500)
    );
    assert_eq!(mb.get(10000, 1000), msg[..1000]);
    assert_eq!(mb.get(12000, 500), msg[1000..]);
    // Fetch-and-add and compare-and-swap on a word of B's buffer; the original lands in A's.
    mb.set(64, &40u64.to_ne_bytes());
    t.post_send(
        A,
        wr(
            4,
            WrOpcode::AtomicFetchAdd {
                remote_addr: b.addr + 64,
                rkey: b.rkey,
                add: 2,
            },
            vec![at(&a, 128, 8)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(4, WcStatus::Success)]);
    assert_eq!((ma.word(128), mb.word(64)), (40, 42));
    for (id, compare, want_orig, want_now) in [(5, 1, 42, 42), (6, 42, 42, 7)] {
        t.post_send(
            A,
            wr(
                id,
                WrOpcode::AtomicCmpSwap {
                    remote_addr: b.addr + 64,
                    rkey: b.rkey,
                    compare,
                    swap: 7,
                },
                vec![at(&a, 136, 8)],
            ),
        );
        assert_eq!(st(&t.wait_wcs(A, 1)), vec![(id, WcStatus::Success)]);
        assert_eq!(
            (ma.word(136), mb.word(64)),
            (want_orig, want_now),
            "CAS {id}"
        );
    }
    // The core's copy verbs see the same bytes; the owned-only view has none.
    let mut out = [0u8; 8];
    t.p.b.mr_read(b.lkey, 64, &mut out).unwrap();
    assert_eq!(u64::from_ne_bytes(out), 7);
    assert!(t.p.b.mr_bytes(b.lkey).is_none());
    drop(t);
}

#[test]
fn an_iova_other_than_the_pointer_is_the_region_s_address_space() {
    // ibv_reg_mr_iova2: RETH addresses are in the iova's space, bytes land at pointer + offset.
    // The second region starts 4 bytes into the buffer at an 8-aligned iova: its atomics are
    // aligned for the wire (IBTA 9.4.5, unverified) but not in memory, and still compute right.
    let mb = Mem::new(8192);
    let ma = Mem::new(4096);
    let mut t = Bed::rc();
    let a = reg(&mut t, A, &ma, Access::ALL);
    let pd = t.b.pd;
    let iova = 0x5000_0000_0000u64;
    let b =
        t.p.b
            .reg_mr_foreign(pd, mb.foreign(0, 4096), iova, Access::ALL)
            .unwrap();
    let b2 =
        t.p.b
            .reg_mr_foreign(pd, mb.foreign(4100, 4092), 0x1000, Access::ALL)
            .unwrap();
    assert_eq!((b.addr, b2.addr, b2.length), (iova, 0x1000, 4092));
    ma.set(0, &[0xab; 64]);
    t.post_send(A, write_wr(1, &b, 200, at(&a, 0, 64)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(mb.get(200, 64), vec![0xab; 64]);
    mb.set(4100 + 8, &5u64.to_ne_bytes());
    t.post_send(
        A,
        wr(
            2,
            WrOpcode::AtomicFetchAdd {
                remote_addr: 0x1008,
                rkey: b2.rkey,
                add: 3,
            },
            vec![at(&a, 1024, 8)],
        ),
    );
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!((ma.word(1024), mb.word(4108)), (5, 8));
    drop(t);
}

/// How a remote access went: B's ACK/NAK syndromes, A's completions, and whether B's bytes
/// were untouched.
type Outcome = (Vec<u8>, Vec<(u64, WcStatus)>, bool);

/// The region B exposes in one scenario.
#[derive(Clone, Copy)]
struct Target {
    access: Access,
    /// In another PD than B's QP.
    other_pd: bool,
    iova: Option<u64>,
}

const LEN: usize = 4096;

/// Builds a scenario's work request from B's region and A's SGE.
type Op = Box<dyn Fn(&MrInfo, Sge) -> SendWr>;

/// Runs one operation from A against a region of `LEN` bytes on B (owned or foreign), filled
/// with 0x3c, as `target` describes; `op` builds the work request from the region.
fn scenario(foreign: bool, target: Target, op: impl Fn(&MrInfo, Sge) -> SendWr) -> Outcome {
    let mb = Mem::new(LEN);
    let ma = Mem::new(LEN);
    let mut t = Bed::rc();
    let a = reg(&mut t, A, &ma, Access::ALL);
    let pd = if target.other_pd {
        t.p.b.alloc_pd()
    } else {
        t.b.pd
    };
    let (b, owned) = if foreign {
        mb.set(0, &[0x3c; LEN]);
        let iova = target.iova.unwrap_or(mb.addr());
        let mr =
            t.p.b
                .reg_mr_foreign(pd, mb.foreign(0, LEN), iova, target.access)
                .unwrap();
        (mr, false)
    } else {
        let mr = match target.iova {
            Some(iova) => t.p.b.reg_mr_at(pd, iova, LEN, target.access),
            None => t.p.b.reg_mr(pd, LEN, target.access),
        }
        .unwrap();
        t.p.b.mr_bytes_mut(mr.lkey).unwrap().fill(0x3c);
        (mr, true)
    };
    ma.set(0, &[0x77; 64]);
    t.post_send(A, op(&b, at(&a, 0, 64)));
    let (wa, _) = t.settle();
    let syn = t.acks(Dir::BA).iter().map(|a| a.1).collect();
    let mut now = vec![0u8; LEN];
    t.p.b.mr_read(b.lkey, 0, &mut now).unwrap();
    if owned {
        assert_eq!(t.p.b.mr_bytes(b.lkey).unwrap(), &now[..]);
    } else {
        assert_eq!(mb.get(0, LEN), now, "mr_read reads the test's buffer");
    }
    let untouched = now.iter().all(|&x| x == 0x3c);
    drop(t);
    (syn, st(&wa), untouched)
}

fn write_at(off: u64, len: u32) -> impl Fn(&MrInfo, Sge) -> SendWr {
    move |b, mut s| {
        s.length = len;
        write_wr(1, b, off, s)
    }
}

const ALL: Target = Target {
    access: Access::ALL,
    other_pd: false,
    iova: None,
};

#[test]
fn every_remote_check_answers_as_for_an_owned_region() {
    let local = Access::LOCAL_WRITE;
    let read_only = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0);
    let cases: Vec<(&str, Target, Op, Outcome)> = vec![
        (
            "in bounds",
            ALL,
            Box::new(write_at(LEN as u64 - 64, 64)),
            (vec![ACK], vec![(1, WcStatus::Success)], false),
        ),
        (
            "one byte past the end",
            ALL,
            Box::new(write_at(LEN as u64 - 63, 64)),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "below the start",
            ALL,
            Box::new(write_at(u64::MAX, 8)), // addr + u64::MAX = addr - 1
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "address wraps",
            Target {
                iova: Some(u64::MAX - LEN as u64),
                ..ALL
            },
            Box::new(write_at(LEN as u64 - 4, 8)),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "another PD",
            Target {
                other_pd: true,
                ..ALL
            },
            Box::new(write_at(0, 8)),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "no remote write",
            Target {
                access: read_only,
                ..ALL
            },
            Box::new(write_at(0, 8)),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "no remote read",
            Target {
                access: local,
                ..ALL
            },
            Box::new(|b: &MrInfo, s| {
                let op = WrOpcode::RdmaRead {
                    remote_addr: b.addr,
                    rkey: b.rkey,
                };
                wr(1, op, vec![s])
            }),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "no remote atomic",
            Target {
                access: Access(Access::ALL.0 & !Access::REMOTE_ATOMIC.0),
                ..ALL
            },
            Box::new(|b: &MrInfo, mut s| {
                s.length = 8;
                let op = WrOpcode::AtomicFetchAdd {
                    remote_addr: b.addr,
                    rkey: b.rkey,
                    add: 1,
                };
                wr(1, op, vec![s])
            }),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "wrong R_Key",
            ALL,
            Box::new(|b: &MrInfo, s| {
                let op = WrOpcode::RdmaWrite {
                    remote_addr: b.addr,
                    rkey: b.rkey ^ 0x100,
                };
                wr(1, op, vec![s])
            }),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "the L_Key is not an R_Key",
            ALL,
            Box::new(|b: &MrInfo, s| {
                let op = WrOpcode::RdmaWrite {
                    remote_addr: b.addr,
                    rkey: b.lkey,
                };
                wr(1, op, vec![s])
            }),
            (vec![NAK_ACC], vec![(1, WcStatus::RemAccessErr)], true),
        ),
        (
            "misaligned atomic",
            ALL,
            Box::new(|b: &MrInfo, mut s| {
                s.length = 8;
                let op = WrOpcode::AtomicCmpSwap {
                    remote_addr: b.addr + 4,
                    rkey: b.rkey,
                    compare: 0,
                    swap: 1,
                };
                wr(1, op, vec![s])
            }),
            (vec![NAK_INV], vec![(1, WcStatus::RemInvReqErr)], true),
        ),
    ];
    for (name, target, op, want) in cases {
        let owned = scenario(false, target, &op);
        let foreign = scenario(true, target, &op);
        assert_eq!(owned, want, "{name}: owned region");
        assert_eq!(foreign, owned, "{name}: a foreign region answers otherwise");
    }
}

/// A bed with a foreign region over all of `ma` on A and of `mb` on B, and A's first WRITE
/// (work request 1: 64 bytes of `fill` from A's buffer to B's at 0) done and checked.
fn bed_written(ma: &Mem, mb: &Mem, fill: u8) -> (Bed, MrInfo, MrInfo) {
    let mut t = Bed::rc();
    let a = reg(&mut t, A, ma, Access::ALL);
    let b = reg(&mut t, B, mb, Access::ALL);
    ma.set(0, &[fill; 64]);
    t.post_send(A, write_wr(1, &b, 0, at(&a, 0, 64)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(mb.get(0, 64), vec![fill; 64]);
    (t, a, b)
}

/// A's WRITE `id` of 64 bytes from `a` at 0 into `b` at `off`, which B NAKs (remote access).
fn write_naked(t: &mut Bed, id: u64, a: &MrInfo, b: &MrInfo, off: u64, what: &str) {
    t.clear_log();
    t.post_send(A, write_wr(id, b, off, at(a, 0, 64)));
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(id, WcStatus::RemAccessErr)], "{what}");
    assert_eq!(
        t.acks(Dir::BA).iter().map(|a| a.1).collect::<Vec<_>>(),
        vec![NAK_ACC],
        "{what}"
    );
}

#[test]
fn after_dereg_the_buffer_is_never_touched_and_access_is_naked() {
    let (ma, mb) = (Mem::new(4096), Mem::new(4096));
    let (mut t, a, b) = bed_written(&ma, &mb, 1);
    t.p.b.dereg_mr(b.lkey).unwrap();
    assert!(matches!(
        t.p.b.dereg_mr(b.lkey),
        Err(VerbsError::NotFound(_))
    ));
    let mut out = [0u8; 1];
    assert!(t.p.b.mr_read(b.lkey, 0, &mut out).is_err());
    // B's program owns its buffer again: what it writes stays, what A writes never lands.
    mb.set(0, &[2; 64]);
    ma.set(0, &[3; 64]);
    write_naked(&mut t, 2, &a, &b, 0, "after dereg");
    assert_eq!(mb.get(0, 4096)[..64], [2; 64]);
    assert!(mb.get(64, 4032).iter().all(|&x| x == 0));
    drop(t);
}

#[test]
fn a_read_response_stops_once_its_foreign_region_is_deregistered() {
    // A READ accepted, its region deregistered before the response leaves: B answers with a
    // NAK instead of reading the buffer it no longer may (each packet is checked again).
    let (ma, mb) = (Mem::new(4096), Mem::new(4096));
    let mut t = Bed::rc();
    let a = reg(&mut t, A, &ma, Access::ALL);
    let b = reg(&mut t, B, &mb, Access::ALL);
    mb.set(0, &[9; 2048]);
    t.post_send(
        A,
        wr(
            1,
            WrOpcode::RdmaRead {
                remote_addr: b.addr,
                rkey: b.rkey,
            },
            vec![at(&a, 0, 2048)],
        ),
    );
    // Carry the request to B without letting B answer yet.
    let now = t.now();
    let mut buf = vec![0u8; 10_000];
    let n =
        t.p.a
            .poll_transmit(now, &mut buf)
            .expect("the READ request");
    t.p.b.handle_frame(now, &buf[..n]);
    t.p.b.dereg_mr(b.lkey).unwrap();
    let (wa, _) = t.settle();
    assert_eq!(st(&wa), vec![(1, WcStatus::RemAccessErr)]);
    assert!(
        ma.get(0, 2048).iter().all(|&x| x == 0),
        "no byte of the deregistered buffer reached A"
    );
    drop(t);
}

#[test]
fn registration_checks_and_the_copy_verbs() {
    let m = Mem::new(4096);
    let mut t = Bed::rc();
    let pd = t.a.pd;
    let r = &mut t.p.a;
    let wrap = r.reg_mr_foreign(pd, m.foreign(0, 4096), u64::MAX - 4095, Access::ALL);
    assert!(matches!(wrap, Err(VerbsError::Invalid(_))), "{wrap:?}");
    let edge = r
        .reg_mr_foreign(pd, m.foreign(0, 4096), u64::MAX - 4096, Access::ALL)
        .expect("iova + len = 2^64 - 1 does not wrap");
    r.dereg_mr(edge.lkey).unwrap();
    let bad_pd = r.reg_mr_foreign(PdId(77), m.foreign(0, 8), m.addr(), Access::ALL);
    assert!(matches!(bad_pd, Err(VerbsError::NotFound(_))), "{bad_pd:?}");
    let no_local = r.reg_mr_foreign(pd, m.foreign(0, 8), m.addr(), Access::REMOTE_WRITE);
    assert!(
        matches!(no_local, Err(VerbsError::Invalid(_))),
        "{no_local:?}"
    );
    let unknown = r.reg_mr_foreign(pd, m.foreign(0, 8), m.addr(), Access(1 << 30));
    assert!(
        matches!(unknown, Err(VerbsError::Invalid(_))),
        "{unknown:?}"
    );
    // mr_read / mr_write on both kinds; out of bounds is an error and writes nothing.
    let f = r
        .reg_mr_foreign(pd, m.foreign(8, 64), m.addr() + 8, Access::ALL)
        .unwrap();
    let o = r.reg_mr(pd, 64, Access::ALL).unwrap();
    for mr in [f, o] {
        r.mr_write(mr.lkey, 60, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        r.mr_read(mr.lkey, 60, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(r.mr_write(mr.lkey, 61, &[5; 4]).is_err());
        assert!(r.mr_write(mr.lkey, u64::MAX, &[5; 2]).is_err());
        assert!(r.mr_read(mr.lkey, 61, &mut out).is_err());
        r.mr_read(mr.lkey, 56, &mut out).unwrap();
        assert_eq!(out, [0; 4], "the failed writes wrote nothing");
    }
    assert!(r.mr_bytes(f.lkey).is_none() && r.mr_bytes_mut(f.lkey).is_none());
    assert_eq!(r.mr_bytes(o.lkey).unwrap()[60..], [1, 2, 3, 4]);
    assert_eq!(m.get(68, 4), [1, 2, 3, 4], "foreign bytes are the buffer's");
    assert_eq!(m.get(0, 8), [0; 8], "before the region: untouched");
    assert!(matches!(
        r.mr_read(0xdead, 0, &mut [0u8; 1]),
        Err(VerbsError::NotFound(_))
    ));
    drop(t);
}

#[test]
fn foreign_regions_under_the_real_time_engine() {
    // The engine thread writes the test's buffer while the test thread waits on the device.
    use rocemu_emulator::connect::{bring_up, ConnectOpts};
    use rocemu_emulator::inproc::{Loopback, IP_A, IP_B};
    let (ma, mb) = (Mem::new(65536), Mem::new(65536));
    let lo = Loopback::start(5, Default::default());
    let mk = |r: &mut Rnic, m: &Mem| {
        let e = end(r, QpType::Rc, false, BedCfg::new(QpType::Rc).cap);
        let mr = r
            .reg_mr_foreign(e.pd, m.foreign(0, m.len), m.addr(), Access::ALL)
            .unwrap();
        (e, mr)
    };
    let (ea, a) = lo.a.with(|r| mk(r, &ma));
    let (eb, b) = lo.b.with(|r| mk(r, &mb));
    let o = ConnectOpts::default();
    lo.a.with(|r| bring_up(r, ea.qp, eb.qp, IP_B, o.psn_a, o.psn_b, &o))
        .unwrap();
    lo.b.with(|r| bring_up(r, eb.qp, ea.qp, IP_A, o.psn_b, o.psn_a, &o))
        .unwrap();
    let data = pattern(65536, 3);
    ma.set(0, &data);
    lo.a.post_send(ea.qp, write_wr(1, &b, 0, at(&a, 0, 65536)))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let wc = rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(20), lo.a.next_wc(ea.cq))
            .await
            .expect("the WRITE completes")
            .unwrap()
    });
    assert_eq!(wc.status, WcStatus::Success);
    // The completion's lock hand-off orders the engine's writes before this read.
    assert_eq!(mb.get(0, 65536), data);
    let mut out = [0u8; 16];
    lo.b.read_mr(b.lkey, 100, &mut out).unwrap();
    assert_eq!(out[..], data[100..116]);
    drop(lo);
}

#[test]
fn a_region_under_the_keys_another_shard_gave_it_is_found_by_them() {
    // A device on several threads registers a program's region in every shard under the keys
    // shard 0 picked (`reg_mr_foreign_keyed`): a peer's WRITE with that R_Key, and a local
    // gather with that L_Key, find the region in this shard.
    let (ma, mb) = (Mem::new(4096), Mem::new(4096));
    let mut t = Bed::rc();
    let a = reg(&mut t, A, &ma, Access::ALL);
    let pd = t.b.pd;
    let keys = (0x1234_5601, 0x89ab_cd02);
    let b =
        t.p.b
            .reg_mr_foreign_keyed(pd, mb.foreign(0, 4096), mb.addr(), Access::ALL, keys)
            .unwrap();
    assert_eq!((b.lkey, b.rkey), keys);
    ma.set(0, &[0x5a; 100]);
    t.post_send(A, write_wr(1, &b, 40, at(&a, 0, 100)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(1, WcStatus::Success)]);
    assert_eq!(mb.get(40, 100), vec![0x5a; 100]);
    // Keys this shard already has, a zero key, or one key for both are refused; nothing is
    // registered by a refusal.
    let other = t.p.b.reg_mr(pd, 64, Access::ALL).unwrap();
    for bad in [
        (keys.0, 0x77),
        (0x77, keys.1),
        (other.rkey, 0x78),
        (0, 0x79),
        (0x7a, 0x7a),
    ] {
        let r =
            t.p.b
                .reg_mr_foreign_keyed(pd, mb.foreign(0, 64), mb.addr(), Access::ALL, bad);
        assert!(matches!(r, Err(VerbsError::Invalid(_))), "{bad:x?}: {r:?}");
    }
    for k in [0x77, 0x7a] {
        assert!(
            t.p.b.mr_read(k, 0, &mut [0u8; 1]).is_err(),
            "{k:#x} registered"
        );
    }
    // The checks of any registration apply: a PD that is not one.
    let r = t.p.b.reg_mr_foreign_keyed(
        PdId(9999),
        mb.foreign(0, 64),
        mb.addr(),
        Access::ALL,
        (0x55, 0x56),
    );
    assert!(matches!(r, Err(VerbsError::NotFound(_))), "{r:?}");
    t.p.b.dereg_mr(b.lkey).unwrap();
    drop(t);
}

/// `ibv_rereg_mr` with a new translation: the region's keys stay, its address space and bytes
/// are the new memory's (the old buffer is the program's again), and refused calls — an access
/// no registration may have, a PD that is gone, a key that names nothing — change nothing.
#[test]
fn rereg_moves_a_region_to_new_memory_under_its_keys() {
    let (ma, mb, mb2) = (Mem::new(4096), Mem::new(4096), Mem::new(2048));
    let (mut t, a, b) = bed_written(&ma, &mb, 1);
    // Refused: remote write without local write (IBTA 10.6.3.1, unverified), a PD that was
    // deallocated, an L_Key of nothing.
    let gone = t.p.b.alloc_pd();
    t.p.b.dealloc_pd(gone).unwrap();
    let bad_access = Access(Access::REMOTE_WRITE.0);
    assert!(matches!(
        t.p.b.rereg_mr(
            b.lkey,
            None,
            Some((mb2.foreign(0, 2048), mb2.addr())),
            Some(bad_access)
        ),
        Err(VerbsError::Invalid(_))
    ));
    assert!(matches!(
        t.p.b.rereg_mr(b.lkey, Some(gone), None, None),
        Err(VerbsError::NotFound(_))
    ));
    assert!(matches!(
        t.p.b.rereg_mr(b.lkey ^ 0x55aa, None, None, None),
        Err(VerbsError::NotFound(_))
    ));
    // Nothing changed: a WRITE at the old place still lands in the old buffer.
    ma.set(0, &[2; 64]);
    t.post_send(A, write_wr(2, &b, 64, at(&a, 0, 64)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(2, WcStatus::Success)]);
    assert_eq!(mb.get(64, 64), vec![2; 64]);
    // The new translation, under the same keys.
    let b2 =
        t.p.b
            .rereg_mr(b.lkey, None, Some((mb2.foreign(0, 2048), mb2.addr())), None)
            .unwrap();
    assert_eq!((b2.lkey, b2.rkey), (b.lkey, b.rkey));
    assert_eq!(
        (b2.addr, b2.length, b2.access),
        (mb2.addr(), 2048, Access::ALL)
    );
    ma.set(0, &[3; 64]);
    t.post_send(A, write_wr(3, &b2, 100, at(&a, 0, 64)));
    assert_eq!(st(&t.wait_wcs(A, 1)), vec![(3, WcStatus::Success)]);
    assert_eq!(mb2.get(100, 64), vec![3; 64]);
    assert!(mb2.get(0, 100).iter().all(|&x| x == 0), "nothing before");
    assert_eq!(mb.get(0, 128), [vec![1; 64], vec![2; 64]].concat());
    assert!(
        mb.get(128, 3968).iter().all(|&x| x == 0),
        "the old buffer untouched"
    );
    // The region ends where the new memory does: a WRITE past it is NAKed.
    write_naked(&mut t, 4, &a, &b2, 2000, "past the new length");
    assert!(mb2.get(2000, 48).iter().all(|&x| x == 0));
    drop(t);
}

/// `ibv_rereg_mr` of the access or the PD: the next request is judged by the new ones.
#[test]
fn rereg_of_access_or_pd_applies_to_the_next_request() {
    for change_pd in [false, true] {
        let (ma, mb) = (Mem::new(4096), Mem::new(4096));
        let (mut t, a, b) = bed_written(&ma, &mb, 5);
        let r = if change_pd {
            let pd2 = t.p.b.alloc_pd();
            let r = t.p.b.rereg_mr(b.lkey, Some(pd2), None, None).unwrap();
            assert_eq!(r.pd, pd2);
            // The new PD has a region now: it is busy.
            assert!(matches!(t.p.b.dealloc_pd(pd2), Err(VerbsError::Busy(_))));
            r
        } else {
            let local = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_READ.0);
            let r = t.p.b.rereg_mr(b.lkey, None, None, Some(local)).unwrap();
            assert_eq!(r.access, local);
            r
        };
        assert_eq!((r.lkey, r.rkey, r.addr), (b.lkey, b.rkey, b.addr));
        ma.set(0, &[6; 64]);
        write_naked(&mut t, 2, &a, &b, 0, &format!("pd {change_pd}"));
        assert_eq!(
            mb.get(0, 64),
            vec![5; 64],
            "pd {change_pd}: nothing written"
        );
        drop(t);
    }
}
