//! Posting receives does not allocate for short scatter/gather lists (an `SgList` holds up to
//! two SGEs inline, as a send's): counted by a global allocator that counts this thread's
//! allocations, over steady-state loops of `post_recv` (on a QP in ERR, where each receive is
//! flushed at once into a CQ polled into a reused vector) and `post_srq_recv` (into an SRQ
//! whose queue was sized at creation).
use rocemu_emulator::inproc::{IP_A, MAC_A};
use rocemu_emulator::rnic::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: p came from System.alloc with l (every allocation went through us).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.with(|a| a.set(a.get() + 1));
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|a| a.get())
}

fn sges(mr: &rocemu_emulator::rnic::mr::MrInfo, n: usize) -> Vec<Sge> {
    (0..n)
        .map(|i| Sge {
            addr: mr.addr + 64 * i as u64,
            length: 64,
            lkey: mr.lkey,
        })
        .collect()
}

#[test]
fn post_recv_and_post_srq_recv_do_not_allocate_for_two_sges() {
    let mut r = Rnic::new(RnicConfig::new(MAC_A, IP_A, 5));
    let pd = r.alloc_pd();
    let cq = r.create_cq(64).unwrap();
    let mr = r.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, cq);
    init.cap.max_recv_sge = 2;
    let qp = r.create_qp(pd, init).unwrap();
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    r.modify_qp(qp, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Err;
    r.modify_qp(qp, &a, M::STATE).unwrap();
    let two = sges(&mr, 2);
    let mut out = Vec::with_capacity(64);
    const N: u64 = 10_000;
    let before = allocs();
    for i in 0..N {
        let wr = RecvWr {
            wr_id: i,
            sg_list: SgList::from(&two[..(i % 3) as usize]),
        };
        r.post_recv(qp, wr).unwrap();
        out.clear();
        assert_eq!(r.poll_cq_into(cq, 4, &mut out), 1);
    }
    let n = allocs() - before;
    assert_eq!(out[0].status, WcStatus::WrFlushErr);
    assert_eq!(n, 0, "{n} allocations for {N} receives of 0 to 2 SGEs");

    let srq = r
        .create_srq(
            pd,
            SrqInitAttr {
                max_wr: 1000,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let before = allocs();
    for i in 0..1000 {
        let wr = RecvWr {
            wr_id: i,
            sg_list: SgList::from(&two[..]),
        };
        r.post_srq_recv(srq, wr).unwrap();
    }
    let n = allocs() - before;
    assert_eq!(n, 0, "{n} allocations for 1000 SRQ receives of 2 SGEs");

    // More SGEs than fit inline still work (on the heap).
    let mut init = QpInitAttr::new(QpType::Rc, cq);
    init.cap.max_recv_sge = 4;
    let qp4 = r.create_qp(pd, init).unwrap();
    a.qp_state = QpState::Init;
    r.modify_qp(
        qp4,
        &a,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    r.post_recv(
        qp4,
        RecvWr {
            wr_id: 7,
            sg_list: sges(&mr, 4).into(),
        },
    )
    .unwrap();
}
