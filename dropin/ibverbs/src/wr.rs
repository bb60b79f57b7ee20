//! The `ibv_wr_*` post API (`struct ibv_qp_ex`'s ops), which perftest 4.5 uses unless told
//! `--use_old_post_send`: `ibv_wr_start`, then per work request an opcode op (which reads the
//! QP's `wr_id` and `wr_flags`) and its data op (`wr_set_sge`, `wr_set_sge_list`,
//! `wr_set_inline_data`, `wr_set_ud_addr`), then `ibv_wr_complete` posts them all (or
//! `ibv_wr_abort` drops them).
//!
//! Invariant: the requests of a batch live in the QP's `batch` until complete or abort; the
//! program serializes the calls on one QP (the verbs contract), the mutex makes a program that
//! does not merely wrong, not unsound.
use crate::abi::*;
use crate::ffi::{errno_of, guard};
use crate::verbs::{inline_bytes, sg_list, ud_dest, Batch, Qp};
use libc::{c_int, c_void, size_t, EINVAL};
use rocemu_emulator::rnic::{SendFlags, SendWr, SgList, WrOpcode};
use std::sync::MutexGuard;

pub fn set_ops(ex: &mut ibv_qp_ex) {
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
}

/// The QP and its batch.
///
/// # Safety
/// `qx` is a QP of ours (every `ibv_qp_ex` we hand out is the head of a `Qp`).
unsafe fn batch<'a>(qx: Qx) -> (&'a Qp, MutexGuard<'a, Batch>) {
    // SAFETY: per the contract.
    let q = unsafe { &*(qx as *const Qp) };
    (q, q.batch.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Starts a work request of `opcode` with the QP's current `wr_id` and `wr_flags`.
fn begin(qx: Qx, opcode: WrOpcode) {
    if qx.is_null() {
        return;
    }
    // SAFETY: a QP of ours.
    let (q, mut b) = unsafe { batch(qx) };
    let ex = &q.ex;
    b.wrs.push(SendWr {
        wr_id: ex.wr_id,
        opcode,
        sg_list: SgList::default(),
        flags: SendFlags(ex.wr_flags & 0xf),
        inline_data: Vec::new(),
        ud: None,
    });
}

/// Applies `f` to the work request being built (none: the batch fails at complete).
fn current(qx: Qx, f: impl FnOnce(&mut SendWr) -> Result<(), c_int>) {
    if qx.is_null() {
        return;
    }
    // SAFETY: a QP of ours.
    let (_q, mut b) = unsafe { batch(qx) };
    let b = &mut *b;
    let r = match b.wrs.last_mut() {
        Some(w) => f(w),
        None => Err(EINVAL),
    };
    if let Err(e) = r {
        b.bad = e;
    }
}

unsafe extern "C" fn wr_start(qx: Qx) {
    guard((), || {
        if qx.is_null() {
            return;
        }
        // SAFETY: a QP of ours.
        let (_q, mut b) = unsafe { batch(qx) };
        b.wrs.clear();
        b.bad = 0;
    })
}

unsafe extern "C" fn wr_abort(qx: Qx) {
    // SAFETY: same contract.
    unsafe { wr_start(qx) }
}

unsafe extern "C" fn wr_complete(qx: Qx) -> c_int {
    guard(EINVAL, || {
        if qx.is_null() {
            return EINVAL;
        }
        // SAFETY: a QP of ours.
        let (q, mut b) = unsafe { batch(qx) };
        let b = &mut *b;
        if b.bad != 0 {
            let e = b.bad;
            b.wrs.clear();
            b.bad = 0;
            return e;
        }
        let Ok(n) = crate::nic::nic() else {
            return libc::ENODEV;
        };
        let mut g = n.lock_qp(q.qpn);
        let mut r = 0;
        for w in b.wrs.drain(..) {
            if r == 0 {
                if let Err(e) = g.rnic.post_send(q.qpn, w) {
                    r = errno_of(&e);
                }
            }
        }
        r
    })
}

unsafe extern "C" fn wr_rdma_write(qx: Qx, rkey: u32, remote_addr: u64) {
    guard((), || begin(qx, WrOpcode::RdmaWrite { remote_addr, rkey }))
}

unsafe extern "C" fn wr_rdma_write_imm(qx: Qx, rkey: u32, remote_addr: u64, imm: u32) {
    guard((), || {
        begin(
            qx,
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: u32::from_be(imm),
            },
        )
    })
}

unsafe extern "C" fn wr_rdma_read(qx: Qx, rkey: u32, remote_addr: u64) {
    guard((), || begin(qx, WrOpcode::RdmaRead { remote_addr, rkey }))
}

unsafe extern "C" fn wr_send(qx: Qx) {
    guard((), || begin(qx, WrOpcode::Send))
}

unsafe extern "C" fn wr_send_imm(qx: Qx, imm: u32) {
    guard((), || {
        begin(
            qx,
            WrOpcode::SendWithImm {
                imm: u32::from_be(imm),
            },
        )
    })
}

unsafe extern "C" fn wr_send_inv(qx: Qx, invalidate_rkey: u32) {
    guard((), || begin(qx, WrOpcode::SendWithInv { invalidate_rkey }))
}

/// LOCAL_INV is not an opcode the core executes: the batch fails (EOPNOTSUPP) at complete.
unsafe extern "C" fn wr_local_inv(qx: Qx, _rkey: u32) {
    guard((), || {
        if qx.is_null() {
            return;
        }
        // SAFETY: a QP of ours.
        let (_q, mut b) = unsafe { batch(qx) };
        b.bad = libc::EOPNOTSUPP;
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qx: Qx,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    guard((), || {
        begin(
            qx,
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
        )
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(qx: Qx, rkey: u32, remote_addr: u64, add: u64) {
    guard((), || {
        begin(
            qx,
            WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
        )
    })
}

unsafe extern "C" fn wr_set_sge(qx: Qx, lkey: u32, addr: u64, length: u32) {
    guard((), || {
        current(qx, |w| {
            w.sg_list = sg_list(&[ibv_sge { addr, length, lkey }]);
            Ok(())
        })
    })
}

unsafe extern "C" fn wr_set_sge_list(qx: Qx, num: size_t, list: *const ibv_sge) {
    guard((), || {
        current(qx, |w| {
            if num > 0 && list.is_null() {
                return Err(EINVAL);
            }
            let s = if num == 0 {
                &[][..]
            } else {
                // SAFETY: the caller's list of `num` SGEs.
                unsafe { std::slice::from_raw_parts(list, num) }
            };
            w.sg_list = sg_list(s);
            Ok(())
        })
    })
}

unsafe extern "C" fn wr_set_inline_data(qx: Qx, addr: *mut c_void, length: size_t) {
    guard((), || {
        current(qx, |w| {
            let len = u32::try_from(length).map_err(|_| EINVAL)?;
            w.flags = SendFlags(w.flags.0 | SendFlags::INLINE.0);
            w.inline_data.clear();
            // SAFETY: an inline send names the program's readable memory.
            unsafe {
                inline_bytes(
                    &[ibv_sge {
                        addr: addr as u64,
                        length: len,
                        lkey: 0,
                    }],
                    &mut w.inline_data,
                )
            }
        })
    })
}

unsafe extern "C" fn wr_set_inline_data_list(qx: Qx, num: size_t, bufs: *const ibv_data_buf) {
    guard((), || {
        current(qx, |w| {
            if num > 0 && bufs.is_null() {
                return Err(EINVAL);
            }
            w.flags = SendFlags(w.flags.0 | SendFlags::INLINE.0);
            w.inline_data.clear();
            for i in 0..num {
                // SAFETY: the caller's list of `num` buffers.
                let b = unsafe { *bufs.add(i) };
                let len = u32::try_from(b.length).map_err(|_| EINVAL)?;
                // SAFETY: each buffer is the program's readable memory.
                unsafe {
                    inline_bytes(
                        &[ibv_sge {
                            addr: b.addr as u64,
                            length: len,
                            lkey: 0,
                        }],
                        &mut w.inline_data,
                    )?
                };
            }
            Ok(())
        })
    })
}

unsafe extern "C" fn wr_set_ud_addr(qx: Qx, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    guard((), || {
        current(qx, |w| {
            w.ud = Some(ud_dest(ah, remote_qpn, remote_qkey)?);
            Ok(())
        })
    })
}
