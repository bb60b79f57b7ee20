//! `ibv_create_cq_ex` (the `verbs_context.create_cq_ex` op the header's inline wrapper calls)
//! and the extended poll API of `struct ibv_cq_ex`: `start_poll` / `next_poll` / `end_poll`
//! and the `read_*` ops.
//!
//! An extended CQ is an ordinary CQ of ours (`verbs::Cq`, made by `ibv_create_cq`, which checks
//! `cqe`, `comp_vector` and counts the channel) whose `ex` part holds the ops: so
//! `ibv_cq_ex_to_cq` is a cast, and `ibv_poll_cq`, `ibv_req_notify_cq`, completion channels,
//! `ibv_get_cq_event` and `ibv_destroy_cq` work on it unchanged.
//!
//! Invariants:
//! - `start_poll` and `next_poll` take one completion from the core through the CQ's own
//!   `poll_cq` op (so both APIs see one queue, in order, and the same values: `read_*` return
//!   fields of the very `ibv_wc` that `ibv_poll_cq` would have returned), store it as the CQ's
//!   current completion and set `ibv_cq_ex.wr_id` / `status` from it.
//! - From a `start_poll` that returned 0 to `end_poll`, the polling thread holds the CQ's poll
//!   lock (`PollState::busy`), as rdma-core's providers hold their CQ lock: the current
//!   completion is written only by its holder, and read by it in `read_*`. A `start_poll` that
//!   fails (ENOENT when empty, an error) releases it before returning, and then `end_poll` must
//!   not be called (rdma-core's rule).
//! - Supported `wc_flags`: rdma-core's `IBV_WC_STANDARD_FLAGS` (byte_len, imm, qp_num, src_qp,
//!   slid, sl, dlid_path_bits) and `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`; the others (wallclock,
//!   cvlan, flow tag, tag matching) answer EOPNOTSUPP, rdma-core's answer for a flag a provider
//!   does not support. Every `read_*` op is set anyway (those of unsupported fields return 0):
//!   a program reading a field it did not ask for gets 0, not a call through NULL.
//! - The completion timestamp is `CLOCK_MONOTONIC` in ns, and the device clock is announced as
//!   1 GHz (`hca_core_clock` [`HCA_CORE_CLOCK_KHZ`] kHz, all 64 bits valid), so device-clock
//!   units are ns. The core keeps no time of its own (it is sans-IO), so the stamp is taken when
//!   the completion is handed to the program (`start_poll` / `next_poll` take it from the core):
//!   never before the CQE existed, later than a NIC's stamp by the time it sat in the CQ.
#![allow(clippy::missing_safety_doc, clippy::not_unsafe_ptr_arg_deref)]
use crate::abi::*;
use crate::ffi::{guard, set_errno};
use crate::verbs::{ibv_create_cq, poll_cq_op, Cq};
use libc::{c_int, c_uint, EINVAL, ENOENT, EOPNOTSUPP};
use std::cell::UnsafeCell;
use std::mem::{offset_of, zeroed};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

// Our CQ is an ibv_cq_ex: `ex` where the header has `comp_mask`.
const _: () = assert!(offset_of!(Cq, ibv) == offset_of!(ibv_cq_ex, cq));
const _: () = assert!(offset_of!(Cq, ex) == offset_of!(ibv_cq_ex, ex));

pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;
pub const IBV_WC_EX_WITH_SRC_QP: u64 = 1 << 3;
pub const IBV_WC_EX_WITH_SLID: u64 = 1 << 4;
pub const IBV_WC_EX_WITH_SL: u64 = 1 << 5;
pub const IBV_WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
pub const IBV_WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_WC_STANDARD_FLAGS` and the completion timestamp: what RoCEmu's extended CQs offer.
pub const SUPPORTED_WC_FLAGS: u64 = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS;

/// The device clock `ibv_query_device_ex` announces (`hca_core_clock`, kHz): 1 GHz, so a
/// completion timestamp is in ns.
pub const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;
/// `completion_timestamp_mask`: every bit of the timestamp is valid (it does not wrap).
pub const COMPLETION_TIMESTAMP_MASK: u64 = u64::MAX;

pub const IBV_CQ_INIT_ATTR_MASK_FLAGS: u32 = 1 << 0;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`: both accepted;
/// neither changes anything here (the poll lock is cheap when uncontended; an overrun still
/// reports EIO from `ibv_poll_cq` / `start_poll`).
const SUPPORTED_CREATE_FLAGS: u32 = (1 << 0) | (1 << 1);

/// The extended-poll state of a CQ (of every CQ; used only on those of `ibv_create_cq_ex`).
pub struct PollState {
    /// The poll lock: held from a successful `start_poll` to `end_poll`.
    busy: AtomicBool,
    /// The current completion, as `ibv_poll_cq` returns it, and when it was taken
    /// (CLOCK_MONOTONIC ns); written only by the lock holder.
    cur: UnsafeCell<(ibv_wc, u64)>,
}

impl Default for PollState {
    fn default() -> Self {
        PollState {
            busy: AtomicBool::new(false),
            // SAFETY: ibv_wc is plain integers: zeroes are valid.
            cur: UnsafeCell::new((unsafe { zeroed() }, 0)),
        }
    }
}

fn fail(e: c_int) -> *mut ibv_cq_ex {
    set_errno(e);
    null_mut()
}

pub unsafe extern "C" fn create_cq_ex_op(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(null_mut(), || {
        if ctx.is_null() || attr.is_null() {
            return fail(EINVAL);
        }
        // SAFETY: the caller's attributes, non-NULL.
        let a = unsafe { &*attr };
        if a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags & !SUPPORTED_CREATE_FLAGS != 0)
            || a.wc_flags & !SUPPORTED_WC_FLAGS != 0
        {
            return fail(EOPNOTSUPP);
        }
        // ibv_create_cq refuses 0, more than max_cqe and a comp_vector other than 0 (EINVAL).
        let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            return fail(EINVAL);
        };
        let cq = ibv_create_cq(ctx, cqe, a.cq_context, a.channel, vector);
        if cq.is_null() {
            return null_mut(); // errno set
        }
        let ops = ibv_cq_ex_ops {
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: Some(start_poll),
            next_poll: Some(next_poll),
            end_poll: Some(end_poll),
            read_opcode: Some(read_opcode),
            read_vendor_err: Some(read_vendor_err),
            read_byte_len: Some(read_byte_len),
            read_imm_data: Some(read_imm_data),
            read_qp_num: Some(read_qp_num),
            read_src_qp: Some(read_src_qp),
            read_wc_flags: Some(read_wc_flags),
            read_slid: Some(read_slid),
            read_sl: Some(read_sl),
            read_dlid_path_bits: Some(read_dlid_path_bits),
            read_completion_ts: Some(read_completion_ts),
            read_cvlan: Some(read_cvlan),
            read_flow_tag: Some(read_flow_tag),
            read_tm_info: Some(read_tm_info),
            read_completion_wallclock_ns: Some(read_zero_u64),
        };
        // SAFETY: a CQ ibv_create_cq just made, not yet given to the program; its `ex` is an
        // UnsafeCell, and nothing else reads it before the program has the pointer.
        unsafe { *(*(cq as *const Cq)).ex.get() = ops };
        cq.cast()
    })
}

/// Our CQ behind the program's `ibv_cq_ex` pointer.
///
/// # Safety
/// `cq` is a CQ of ours (the verbs contract: the pointer `ibv_create_cq_ex` returned).
unsafe fn cq_of<'a>(cq: Cx) -> &'a Cq {
    // SAFETY: the caller's promise; Cq is mutated only through atomics and UnsafeCells.
    unsafe { &*(cq as *const Cq) }
}

fn monotonic_ns() -> u64 {
    // SAFETY: plain data.
    let mut t: libc::timespec = unsafe { zeroed() };
    // SAFETY: writes the local timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// Takes the next completion: 0 and it is current (`wr_id`, `status` set), or an errno.
fn take_one(cq: Cx) -> c_int {
    // SAFETY: plain data.
    let mut wc: ibv_wc = unsafe { zeroed() };
    // SAFETY: cq is a CQ of ours; wc has room for the one entry asked for.
    let n = unsafe { poll_cq_op(cq.cast(), 1, &mut wc) };
    match n {
        1 => {
            let ts = monotonic_ns();
            // SAFETY: a CQ of ours, whose poll lock this thread holds (start_poll took it):
            // nobody else writes `cur` or `ex` meanwhile.
            unsafe {
                let c = cq_of(cq);
                *c.poll.cur.get() = (wc, ts);
                let ex = c.ex.get();
                (*ex).wr_id = wc.wr_id;
                (*ex).status = wc.status;
            }
            0
        }
        0 => ENOENT,
        e if e < 0 => -e,
        _ => libc::EIO,
    }
}

unsafe extern "C" fn start_poll(cq: Cx, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(EINVAL, || {
        // SAFETY: attr is the caller's (checked for NULL first).
        if cq.is_null() || attr.is_null() || unsafe { (*attr).comp_mask } != 0 {
            return EINVAL;
        }
        // SAFETY: a CQ of ours.
        let c = unsafe { cq_of(cq) };
        while c
            .poll
            .busy
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        let r = take_one(cq);
        if r != 0 {
            c.poll.busy.store(false, Ordering::Release);
        }
        r
    })
}

unsafe extern "C" fn next_poll(cq: Cx) -> c_int {
    guard(EINVAL, || {
        if cq.is_null() {
            return EINVAL;
        }
        take_one(cq)
    })
}

unsafe extern "C" fn end_poll(cq: Cx) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a CQ of ours.
    unsafe { cq_of(cq) }
        .poll
        .busy
        .store(false, Ordering::Release);
}

/// The current completion and its timestamp (a copy).
fn cur_ts(cq: Cx) -> (ibv_wc, u64) {
    if cq.is_null() {
        // SAFETY: plain data.
        return (unsafe { zeroed() }, 0);
    }
    // SAFETY: a CQ of ours; between start_poll and end_poll the caller holds the poll lock,
    // so `cur` is not being written.
    unsafe { *cq_of(cq).poll.cur.get() }
}

fn cur(cq: Cx) -> ibv_wc {
    cur_ts(cq).0
}

/// In device-clock units (ns: see HCA_CORE_CLOCK_KHZ).
unsafe extern "C" fn read_completion_ts(cq: Cx) -> u64 {
    cur_ts(cq).1
}

unsafe extern "C" fn read_opcode(cq: Cx) -> c_int {
    cur(cq).opcode
}

unsafe extern "C" fn read_vendor_err(cq: Cx) -> u32 {
    cur(cq).vendor_err
}

unsafe extern "C" fn read_byte_len(cq: Cx) -> u32 {
    cur(cq).byte_len
}

/// Network order, as `ibv_wc.imm_data` (and the invalidated R_Key with IBV_WC_WITH_INV).
unsafe extern "C" fn read_imm_data(cq: Cx) -> u32 {
    cur(cq).imm_data
}

unsafe extern "C" fn read_qp_num(cq: Cx) -> u32 {
    cur(cq).qp_num
}

unsafe extern "C" fn read_src_qp(cq: Cx) -> u32 {
    cur(cq).src_qp
}

unsafe extern "C" fn read_wc_flags(cq: Cx) -> c_uint {
    cur(cq).wc_flags
}

unsafe extern "C" fn read_slid(cq: Cx) -> u32 {
    cur(cq).slid as u32
}

unsafe extern "C" fn read_sl(cq: Cx) -> u8 {
    cur(cq).sl
}

unsafe extern "C" fn read_dlid_path_bits(cq: Cx) -> u8 {
    cur(cq).dlid_path_bits
}

/// No VLAN, flow tag, tag matching or wallclock on RoCEmu (their flags are refused).
unsafe extern "C" fn read_cvlan(_cq: Cx) -> u16 {
    0
}

unsafe extern "C" fn read_flow_tag(_cq: Cx) -> u32 {
    0
}

unsafe extern "C" fn read_tm_info(_cq: Cx, info: *mut ibv_wc_tm_info) {
    if !info.is_null() {
        // SAFETY: the caller's struct.
        unsafe {
            (*info).tag = 0;
            (*info).priv_ = 0;
        }
    }
}

unsafe extern "C" fn read_zero_u64(_cq: Cx) -> u64 {
    0
}
