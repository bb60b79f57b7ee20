//! The public verbs: every default-version export of IBVERBS_1.0 … IBVERBS_1.14, and the ops
//! the header's inline functions dispatch through (`ibv_context.ops`: `poll_cq`,
//! `req_notify_cq`, `post_send`, `post_recv`, `post_srq_recv`; `verbs_context`: `query_port`,
//! `query_device_ex`, `create_qp_ex`, `create_cq_ex` (cq_ex.rs); `ibv_qp_ex`: the `ibv_wr_*`
//! post API).
//!
//! Our objects wrap the C struct a program sees as their first field (`#[repr(C)]`), so the
//! pointer a program holds is the pointer to ours. What the program gives us is checked before
//! it reaches the core: NULL pointers, negative counts and enum values out of range are EINVAL;
//! what the core refuses comes back as the errno rdma-core's providers return.
//!
//! Unsafe: these are C entry points; each dereferences pointers the program passes, which the
//! verbs contract says are ours (objects this library returned) or the program's own valid
//! memory of the header's type. The `// SAFETY:` notes say which.
#![allow(clippy::missing_safety_doc, clippy::not_unsafe_ptr_arg_deref)]
use crate::abi::*;
use crate::ffi::{errno_of, guard, set_errno};
use crate::nic::{self, Inner, Locked, Nic, GID_TBL_LEN, VENDOR_ID};
use crate::rdmacm::live;
use libc::{c_char, c_int, c_uint, c_void, size_t, EINVAL, ENOMEM, EOPNOTSUPP};
use rocemu_emulator::rnic::*;
use rocemu_wire::{Psn, QKey, Qpn};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::mem::{offset_of, size_of, zeroed};
use std::net::IpAddr;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

// ---- our objects ---------------------------------------------------------------------------

#[repr(C)]
pub struct Ctx {
    pub v: verbs_context,
}

#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
    /// Its id in each shard (shard k's k-th): every shard has a copy of every PD.
    pub ids: Vec<PdId>,
    /// Its live address handles (they live here, not in the core): `ibv_dealloc_pd` is EBUSY
    /// while there are any. Changed under the NIC lock.
    pub ahs: AtomicU32,
}

#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
}

#[repr(C)]
pub struct Channel {
    pub ibv: ibv_comp_channel,
    /// CQs with an event not yet read by `ibv_get_cq_event`, oldest first; the eventfd `ibv.fd`
    /// (semaphore mode) counts them.
    pub q: Mutex<VecDeque<usize>>,
}

/// Every CQ is laid out as an `ibv_cq_ex` (`ibv` then `ex`), whichever verb made it, so that
/// one type serves both and `ibv_destroy_cq` frees either; `ex` is zero (no ops) on a CQ of
/// `ibv_create_cq` and filled by `ibv_create_cq_ex` (cq_ex.rs).
#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    pub ex: std::cell::UnsafeCell<ibv_cq_ex_ops>,
    /// Its id in each shard (shard k's k-th): every shard has a copy of every CQ, where its
    /// QPs' completions go.
    pub ids: Vec<CqId>,
    /// The NIC's `progress` at which this CQ was last found empty (0: never).
    pub empty_at: AtomicU64,
    /// Armed by `ibv_req_notify_cq` and not fired since: on a device of several shards, every
    /// shard's copy of the CQ is armed, and the first to fire sends the one event.
    pub armed: AtomicBool,
    /// The shard whose copy `ibv_poll_cq` reads first.
    pub poll_next: AtomicUsize,
    pub poll: crate::cq_ex::PollState,
}

#[repr(C)]
pub struct Ah {
    pub ibv: ibv_ah,
    pub attr: AhAttr,
}

/// The work requests between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Default)]
pub struct Batch {
    pub wrs: Vec<SendWr>,
    /// A request of the batch was malformed (an unknown AH): `ibv_wr_complete` fails.
    pub bad: c_int,
}

#[repr(C)]
pub struct Qp {
    pub ex: ibv_qp_ex,
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub cap: ibv_qp_cap,
    pub sq_sig_all: c_int,
    pub batch: Mutex<Batch>,
}

fn ctx_of(p: *mut ibv_context) -> *mut Ctx {
    (p as *mut u8).wrapping_sub(offset_of!(verbs_context, context)) as *mut Ctx
}

/// The NIC, for a verb on an object that exists (so the NIC was started).
fn the_nic() -> Result<&'static Nic, c_int> {
    nic::nic()
}

/// NULL with `errno = e`: a failed verb that returns a pointer.
pub(crate) fn fail_ptr<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

macro_rules! try_errno {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

/// What every `ibv_destroy_*` / `ibv_dealloc_pd` / `ibv_dereg_mr` does around its own part:
/// EINVAL for NULL; `undo`, under the lock of every shard that has the object, takes it out of
/// the core and our tables, or refuses with an errno (EBUSY while in use) and changes nothing;
/// then, the locks released, the object's memory is given back.
///
/// # Safety
///
/// `obj` is NULL or a `Box<T>` this library handed to the program as the object, not given back
/// yet (the verbs' contract: a destroyed object is not used again).
unsafe fn destroy<T>(
    obj: *mut T,
    kind: usize,
    undo: impl FnOnce(&Nic, &T) -> Result<(), c_int>,
) -> c_int {
    guard(EINVAL, || {
        if obj.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a live object of ours (the caller's contract).
        if let Err(e) = undo(n, unsafe { &*obj }) {
            return e;
        }
        live::add(kind, -1);
        // SAFETY: a Box of ours, given back once: `undo` took it out of everything that
        // referred to it.
        drop(unsafe { Box::from_raw(obj) });
        0
    })
}

macro_rules! try_null {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return fail_ptr(e),
        }
    };
}

// ---- devices -------------------------------------------------------------------------------

pub extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        let dev = nic::device();
        // SAFETY: calloc of two pointers; checked for NULL.
        let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) } as *mut *mut ibv_device;
        if list.is_null() {
            return fail_ptr(ENOMEM);
        }
        let n = match dev {
            Some(d) => {
                // SAFETY: list has room for two entries.
                unsafe { *list = d };
                1
            }
            None => 0,
        };
        if !num.is_null() {
            // SAFETY: the caller's optional out-parameter, non-NULL.
            unsafe { *num = n };
        }
        list
    })
}

pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the list came from ibv_get_device_list's calloc (or is NULL).
    unsafe { libc::free(list.cast()) };
}

pub extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        set_errno(EINVAL);
        return null();
    }
    // SAFETY: a device from our list: its name is NUL-terminated.
    unsafe { (*dev).name.as_ptr() }
}

pub extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    guard(0, || {
        if dev.is_null() || Some(dev) != nic::device() {
            return 0;
        }
        let guid = match nic::started() {
            Some(n) => n.node_guid,
            None => match nic::config().and_then(|c| c.known_mac) {
                Some(m) => nic::guid_of(m),
                // A DPDK port's MAC is known once the port is open (net_memif draws one at
                // random unless given mac=): open it, as ibv_open_device would. If it will
                // not open, there is no GUID to give (and the open said why on stderr).
                None => nic::nic().map(|n| n.node_guid).unwrap_or(0),
            },
        };
        guid.to_be()
    })
}

pub extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if dev.is_null() || Some(dev) != nic::device() {
        return -1;
    }
    0
}

pub extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard(null_mut(), || {
        if dev.is_null() || Some(dev) != nic::device() {
            return fail_ptr(libc::ENODEV);
        }
        let nic = try_null!(nic::nic());
        // SAFETY: verbs_context is plain data (integers, pointers, optional function
        // pointers, a pthread mutex whose initializer is all zeroes on glibc): zeroes are valid.
        let mut c: Box<Ctx> = Box::new(unsafe { zeroed() });
        let v = &mut c.v;
        v.query_port = Some(query_port_op);
        v.query_device_ex = Some(query_device_ex_op);
        v.create_qp_ex = Some(create_qp_ex_op);
        v.create_cq_ex = Some(crate::cq_ex::create_cq_ex_op);
        v.sz = size_of::<verbs_context>();
        let ctx = &mut v.context;
        ctx.device = dev;
        ctx.ops.poll_cq = Some(poll_cq_op);
        ctx.ops.req_notify_cq = Some(req_notify_cq_op);
        ctx.ops.post_send = Some(post_send_op);
        ctx.ops.post_recv = Some(post_recv_op);
        ctx.ops.post_srq_recv = Some(post_srq_recv_op);
        ctx.cmd_fd = -1;
        // SAFETY: dup of the NIC's eventfd, which lives as long as the process.
        ctx.async_fd = unsafe { libc::fcntl(nic.async_efd, libc::F_DUPFD_CLOEXEC, 0) };
        if ctx.async_fd < 0 {
            return fail_ptr(libc::EMFILE);
        }
        ctx.num_comp_vectors = 1;
        ctx.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
        ctx.abi_compat = VERBS_ABI_IS_EXTENDED;
        let c = Box::into_raw(c);
        // SAFETY: c was just leaked from a Box: valid.
        unsafe { &mut (*c).v.context }
    })
}

pub extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard(EINVAL, || {
        if ctx.is_null() {
            return EINVAL;
        }
        let c = ctx_of(ctx);
        // SAFETY: a context from ibv_open_device: the Box it came from, given back once.
        let c = unsafe { Box::from_raw(c) };
        // SAFETY: closing the descriptor we duplicated for this context.
        unsafe { libc::close(c.v.context.async_fd) };
        0
    })
}

// ---- queries -------------------------------------------------------------------------------

fn device_attr(n: &Nic, a: &DeviceAttr) -> ibv_device_attr {
    // SAFETY: plain data; zeroes are valid.
    let mut d: ibv_device_attr = unsafe { zeroed() };
    crate::ffi::copy_cstr(&mut d.fw_ver, a.fw_ver);
    d.node_guid = n.node_guid.to_be();
    d.sys_image_guid = n.node_guid.to_be();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = 0xffff_f000;
    d.vendor_id = VENDOR_ID;
    d.vendor_part_id = a.vendor_part_id;
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    d.max_qp = i(a.max_qp);
    d.max_qp_wr = i(a.max_qp_wr);
    // IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT
    d.device_cap_flags = (1 << 12) | (1 << 10);
    d.max_sge = i(a.max_sge);
    d.max_sge_rd = i(a.max_sge);
    d.max_cq = i(a.max_cq);
    d.max_cqe = i(a.max_cqe);
    d.max_mr = i(a.max_mr);
    d.max_pd = i(a.max_pd);
    d.max_qp_rd_atom = i(a.max_qp_rd_atom);
    d.max_res_rd_atom = i(a.max_qp_rd_atom.saturating_mul(a.max_qp));
    d.max_qp_init_rd_atom = i(a.max_qp_init_rd_atom);
    d.atomic_cap = if a.atomic_cap_hca {
        IBV_ATOMIC_HCA
    } else {
        IBV_ATOMIC_NONE
    };
    d.max_ah = i(a.max_qp);
    d.max_srq = i(a.max_srq);
    d.max_srq_wr = i(a.max_srq_wr);
    d.max_srq_sge = if a.max_srq > 0 { i(a.max_sge) } else { 0 };
    d.max_pkeys = a.max_pkeys;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = 1;
    d
}

pub extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard(EINVAL, || {
        if ctx.is_null() || attr.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        let a = n.lock().rnic.query_device();
        // SAFETY: the caller's ibv_device_attr, non-NULL.
        unsafe { *attr = device_attr(n, &a) };
        0
    })
}

unsafe extern "C" fn query_device_ex_op(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    size: size_t,
) -> c_int {
    guard(EINVAL, || {
        // SAFETY: input is NULL or the caller's struct.
        if ctx.is_null()
            || attr.is_null()
            || (!input.is_null() && unsafe { (*input).comp_mask } != 0)
        {
            return EINVAL;
        }
        if size < size_of::<ibv_device_attr>() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        let a = n.lock().rnic.query_device();
        // SAFETY: plain data.
        let mut x: ibv_device_attr_ex = unsafe { zeroed() };
        x.orig_attr = device_attr(n, &a);
        x.phys_port_cnt_ex = 1;
        x.completion_timestamp_mask = crate::cq_ex::COMPLETION_TIMESTAMP_MASK;
        x.hca_core_clock = crate::cq_ex::HCA_CORE_CLOCK_KHZ;
        let len = size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct has `size` bytes; we write at most that many.
        unsafe { std::ptr::copy_nonoverlapping(&x as *const _ as *const u8, attr as *mut u8, len) };
        0
    })
}

fn port_attr(n: &Nic, mtu: Mtu) -> ibv_port_attr {
    // SAFETY: plain data.
    let mut p: ibv_port_attr = unsafe { zeroed() };
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = Mtu::M4096 as c_int;
    p.active_mtu = mtu as c_int;
    p.gid_tbl_len = GID_TBL_LEN as c_int;
    // IBV_PORT_CM_SUP (16) | IBV_PORT_IP_BASED_GIDS (26)
    p.port_cap_flags = (1 << 16) | (1 << 26);
    p.max_msg_sz = 1 << 31;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 2; // 4X
    p.active_speed = 32; // EDR: 4X EDR is 100 Gb/s
    p.phys_state = 5; // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    let _ = n.eth_mtu;
    p
}

fn query_port_into(ctx: *mut ibv_context, port: u8, attr: *mut u8, len: usize) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return EINVAL;
    }
    if port != 1 {
        return EINVAL;
    }
    let n = try_errno!(the_nic());
    let mtu = n.lock().rnic.active_mtu();
    let p = port_attr(n, mtu);
    let len = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct has `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping(&p as *const _ as *const u8, attr, len) };
    0
}

/// The exported `ibv_query_port` takes rdma-core's `_compat_ibv_port_attr`: the struct without
/// its last two fields (`flags`, `port_cap_flags2`).
pub extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    guard(EINVAL, || {
        query_port_into(ctx, port, attr.cast(), offset_of!(ibv_port_attr, flags))
    })
}

unsafe extern "C" fn query_port_op(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: size_t,
) -> c_int {
    guard(EINVAL, || query_port_into(ctx, port, attr.cast(), len))
}

fn gid_at(n: &Nic, index: u32) -> Option<[u8; 16]> {
    n.ips.get(index as usize).map(|ip| Gid::from_ip(*ip).0)
}

pub extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        if ctx.is_null() || gid.is_null() || port != 1 || index < 0 {
            set_errno(EINVAL);
            return -1;
        }
        let Ok(n) = the_nic() else { return -1 };
        match gid_at(n, index as u32) {
            Some(g) => {
                // SAFETY: the caller's ibv_gid, non-NULL.
                unsafe { (*gid).raw = g };
                0
            }
            None => {
                set_errno(EINVAL);
                -1
            }
        }
    })
}

fn ifindex() -> u32 {
    let Some(c) = nic::config() else { return 0 };
    let Some(ifname) = rocemu_emulator::port::open::kernel_iface(&c.dev) else {
        return 0;
    };
    let Ok(s) = std::ffi::CString::new(ifname) else {
        return 0;
    };
    // SAFETY: a NUL-terminated string of ours.
    unsafe { libc::if_nametoindex(s.as_ptr()) }
}

fn gid_entry(n: &Nic, index: u32) -> Option<ibv_gid_entry> {
    gid_at(n, index).map(|g| ibv_gid_entry {
        gid: ibv_gid { raw: g },
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex(),
    })
}

pub extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: size_t,
) -> c_int {
    guard(EINVAL, || {
        if ctx.is_null() || entry.is_null() || port != 1 || flags != 0 {
            return EINVAL;
        }
        if entry_size < size_of::<ibv_gid_entry>() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        match gid_entry(n, index) {
            Some(e) => {
                // SAFETY: the caller's entry of at least our size.
                unsafe { *entry = e };
                0
            }
            None => libc::ENODATA,
        }
    })
}

pub extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: size_t,
    flags: u32,
    entry_size: size_t,
) -> isize {
    guard(-(EINVAL as isize), || {
        if ctx.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(EINVAL as isize);
        }
        if entries.is_null() && max > 0 {
            return -(EINVAL as isize);
        }
        let n = match the_nic() {
            Ok(n) => n,
            Err(e) => return -(e as isize),
        };
        let count = (GID_TBL_LEN as usize).min(n.ips.len());
        if max < count {
            return -(EINVAL as isize);
        }
        for i in 0..count {
            if let Some(e) = gid_entry(n, i as u32) {
                // SAFETY: entries has `max` ≥ count entries of `entry_size` bytes each.
                unsafe {
                    let p = (entries as *mut u8).add(i * entry_size) as *mut ibv_gid_entry;
                    *p = e;
                }
            }
        }
        count as isize
    })
}

pub extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if ctx.is_null() || pkey.is_null() || port != 1 || index != 0 {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: the caller's u16, non-NULL.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

pub extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if ctx.is_null() || port != 1 {
        set_errno(EINVAL);
        return -1;
    }
    // The one entry is the default partition, full member; a limited-member key matches it
    // too (the membership bit aside).
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

// ---- PD, MR --------------------------------------------------------------------------------

pub extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard(null_mut(), || {
        if ctx.is_null() {
            return fail_ptr(EINVAL);
        }
        let n = try_null!(the_nic());
        let ids = try_null!(in_every_shard(
            &mut n.lock_all(),
            |g| g.rnic.try_alloc_pd().map_err(|e| errno_of(&e)),
            |g, id| {
                let _ = g.rnic.dealloc_pd(id);
            },
        ));
        let pd = Box::new(Pd {
            ibv: ibv_pd {
                context: ctx,
                handle: ids[0].0,
            },
            ids,
            ahs: AtomicU32::new(0),
        });
        live::add(live::PDS, 1);
        Box::into_raw(pd).cast()
    })
}

pub extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: a PD from ibv_alloc_pd (every ibv_pd we hand out is a Pd).
    unsafe {
        destroy(pd as *mut Pd, live::PDS, |n, p| {
            let mut gs = n.lock_all();
            // As the kernel: EBUSY while an object of the PD lives (its MRs, QPs and SRQs the
            // core knows, in any shard; its AHs we count).
            if p.ahs.load(Ordering::Relaxed) > 0 {
                return Err(libc::EBUSY);
            }
            for (g, &id) in gs.iter().zip(&p.ids) {
                g.rnic.pd_in_use(id).map_err(|e| errno_of(&e))?;
            }
            for (g, &id) in gs.iter_mut().zip(&p.ids) {
                g.rnic.dealloc_pd(id).map_err(|e| errno_of(&e))?;
            }
            Ok(())
        })
    }
}

const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
const ACCESS_ZERO_BASED: u32 = 1 << 5;
const ACCESS_ON_DEMAND: u32 = 1 << 6;

/// A region's access flags as the program gives them (`ibv_access_flags`), checked as the
/// kernel checks a registration's: the error number otherwise.
fn mr_access(access: u32) -> Result<Access, c_int> {
    // Relaxed ordering and the other optional flags are hints a device may ignore.
    let access = access & !ACCESS_OPTIONAL_RANGE;
    if access & ACCESS_ON_DEMAND != 0 {
        return Err(EOPNOTSUPP);
    }
    if access & ACCESS_ZERO_BASED != 0 || access & !0xff != 0 {
        return Err(EINVAL);
    }
    // Remote write or atomic access needs local write (IBTA 10.6.3.1 (unverified); rdma-core's
    // kernel checks it).
    if access & (2 | 8) != 0 && access & 1 == 0 {
        return Err(EINVAL);
    }
    Ok(Access(access & 0xf))
}

fn reg_mr_common(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: size_t,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    if pd.is_null() || len == 0 || (addr.is_null() && len > 0) {
        return fail_ptr(EINVAL);
    }
    let access = match mr_access(access) {
        Ok(a) => a,
        Err(e) => return fail_ptr(e),
    };
    if (addr as usize).checked_add(len).is_none() || iova.checked_add(len as u64).is_none() {
        return fail_ptr(EINVAL);
    }
    // SAFETY: a PD of ours.
    let p = unsafe { &*(pd as *mut Pd) };
    let n = try_null!(the_nic());
    // Shard 0 picks the keys; every other shard registers the same memory under them.
    let mut gs = n.lock_all();
    let (first, rest) = gs.split_first_mut().expect("shard 0");
    let mut r = crate::mem::register(
        &mut first.rnic,
        p.ids[0],
        addr.cast(),
        len,
        iova,
        access,
        None,
    );
    if let Ok(info) = &r {
        let keys = (info.lkey, info.rkey);
        for k in 0..rest.len() {
            let more = crate::mem::register(
                &mut rest[k].rnic,
                p.ids[k + 1],
                addr.cast(),
                len,
                iova,
                access,
                Some(keys),
            );
            if let Err(e) = more {
                for g in std::iter::once(&mut *first).chain(rest[..k].iter_mut()) {
                    let _ = g.rnic.dereg_mr(keys.0);
                }
                r = Err(e);
                break;
            }
        }
    }
    drop(gs);
    match r {
        Ok(info) => {
            let mr = Box::new(Mr {
                ibv: ibv_mr {
                    context: p.ibv.context,
                    pd,
                    addr,
                    length: len,
                    handle: info.lkey,
                    lkey: info.lkey,
                    rkey: info.rkey,
                },
            });
            live::add(live::MRS, 1);
            Box::into_raw(mr).cast()
        }
        Err(e) => fail_ptr(errno_of(&e)),
    }
}

pub extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: size_t,
    access: c_int,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        reg_mr_common(pd, addr, len, addr as u64, access as u32)
    })
}

pub extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: size_t,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        reg_mr_common(pd, addr, len, iova, access as u32)
    })
}

pub extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: size_t,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(null_mut(), || reg_mr_common(pd, addr, len, iova, access))
}

pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _len: size_t,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    fail_ptr(EOPNOTSUPP)
}

pub extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: an MR from reg_mr (every ibv_mr we hand out is an Mr beginning with it).
    unsafe {
        destroy(mr as *mut Mr, live::MRS, |n, m| {
            let mut r = Ok(());
            for g in n.lock_all().iter_mut() {
                r = r.and(g.rnic.dereg_mr(m.ibv.lkey).map_err(|e| errno_of(&e)));
            }
            r
        })
    }
}

/// `ibv_rereg_mr`'s flags (`IBV_REREG_MR_CHANGE_*`) and the two of its error codes it can give
/// here (`IBV_REREG_MR_ERR_INPUT`, `IBV_REREG_MR_ERR_CMD`).
const REREG_TRANSLATION: c_int = 1;
const REREG_PD: c_int = 2;
const REREG_ACCESS: c_int = 4;
const REREG_ERR_INPUT: c_int = -1;
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: the region moves to new memory (`IBV_REREG_MR_CHANGE_TRANSLATION`: `addr`,
/// `length`), a new PD and new access, each as `flags` says, under the same keys (as mlx5 and
/// rxe keep them). Returns 0, or one of rdma-core's codes with `errno` set: what libibverbs
/// checks itself (unknown flags, a translation without address or length, access given without
/// its flag) is `IBV_REREG_MR_ERR_INPUT`; what the kernel refuses (no flag at all, no PD, an
/// access no registration may have, memory that wraps) and what the RNIC refuses is
/// `IBV_REREG_MR_ERR_CMD` (libibverbs' `ibv_rereg_mr` and the kernel's `ib_uverbs_rereg_mr`).
/// A refused call changes nothing; on a device of several shards the region changes in every
/// shard or in none.
pub extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: size_t,
    access: c_int,
) -> c_int {
    guard(REREG_ERR_CMD, || {
        let fail = |code, e| {
            set_errno(e);
            code
        };
        let translate = flags & REREG_TRANSLATION != 0;
        if mr.is_null()
            || flags & !(REREG_TRANSLATION | REREG_PD | REREG_ACCESS) != 0
            || (translate && (len == 0 || addr.is_null()))
            || (access != 0 && flags & REREG_ACCESS == 0)
        {
            return fail(REREG_ERR_INPUT, EINVAL);
        }
        if flags == 0 || (flags & REREG_PD != 0 && pd.is_null()) {
            return fail(REREG_ERR_CMD, EINVAL);
        }
        let access = if flags & REREG_ACCESS != 0 {
            match mr_access(access as u32) {
                Ok(a) => Some(a),
                Err(e) => return fail(REREG_ERR_CMD, e),
            }
        } else {
            None
        };
        if translate && (addr as usize).checked_add(len).is_none() {
            return fail(REREG_ERR_CMD, EINVAL);
        }
        let n = match the_nic() {
            Ok(n) => n,
            Err(e) => return fail(REREG_ERR_CMD, e),
        };
        // SAFETY: an MR and (when given) a PD of ours.
        let lkey = unsafe { (*mr).lkey };
        let pds = (flags & REREG_PD != 0).then(|| unsafe { &*(pd as *const Pd) });
        let place = translate.then_some((addr as u64, len));
        let mut gs = n.lock_all();
        for (k, g) in gs.iter().enumerate() {
            if let Err(e) = g
                .rnic
                .check_rereg_mr(lkey, pds.map(|p| p.ids[k]), place, access)
            {
                return fail(REREG_ERR_CMD, errno_of(&e));
            }
        }
        for (k, g) in gs.iter_mut().enumerate() {
            let mem = translate.then_some((addr.cast::<u8>(), len));
            let pd = pds.map(|p| p.ids[k]);
            if let Err(e) = crate::mem::reregister(&mut g.rnic, lkey, pd, mem, access) {
                return fail(REREG_ERR_CMD, errno_of(&e));
            }
        }
        drop(gs);
        // What libibverbs updates after the provider's success.
        // SAFETY: the caller's MR.
        unsafe {
            if flags & REREG_PD != 0 {
                (*mr).pd = pd;
            }
            if translate {
                (*mr).addr = addr;
                (*mr).length = len;
            }
        }
        0
    })
}

// ---- completion channels and CQs -----------------------------------------------------------

fn new_eventfd() -> c_int {
    // SAFETY: no pointers.
    unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) }
}

pub extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        if ctx.is_null() {
            return fail_ptr(EINVAL);
        }
        let fd = new_eventfd();
        if fd < 0 {
            return fail_ptr(libc::EMFILE);
        }
        let ch = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: ctx,
                fd,
                refcnt: 0,
            },
            q: Mutex::new(VecDeque::new()),
        });
        live::add(live::COMP_CHANNELS, 1);
        Box::into_raw(ch).cast()
    })
}

pub extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(EINVAL, || {
        if ch.is_null() {
            return EINVAL;
        }
        // SAFETY: a channel of ours; refcnt is changed under the NIC lock.
        let busy = {
            let _g = nic::started().map(|n| n.lock());
            unsafe { (*ch).refcnt > 0 }
        };
        if busy {
            return libc::EBUSY;
        }
        // SAFETY: a channel from create_comp_channel, given back once.
        let ch = unsafe { Box::from_raw(ch as *mut Channel) };
        live::add(live::COMP_CHANNELS, -1);
        // SAFETY: our eventfd.
        unsafe { libc::close(ch.ibv.fd) };
        0
    })
}

pub extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        if ctx.is_null() || cqe < 1 || comp_vector != 0 {
            return fail_ptr(EINVAL);
        }
        let n = try_null!(the_nic());
        let mut gs = n.lock_all();
        if cqe as u32 > gs[0].rnic.query_device().max_cqe {
            return fail_ptr(EINVAL);
        }
        let ids = try_null!(in_every_shard(
            &mut gs,
            |g| g.rnic.create_cq(cqe as usize).map_err(|e| errno_of(&e)),
            |g, id| {
                let _ = g.rnic.destroy_cq(id);
            },
        ));
        let cq = Box::new(Cq {
            ibv: ibv_cq {
                context: ctx,
                channel,
                cq_context,
                handle: ids[0].0,
                cqe,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                comp_events_completed: 0,
                async_events_completed: 0,
            },
            // SAFETY: plain data (integers, optional function pointers): zeroes are valid.
            ex: unsafe { zeroed() },
            ids: ids.clone(),
            empty_at: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            poll_next: AtomicUsize::new(0),
            poll: Default::default(),
        });
        live::add(live::CQS, 1);
        let p = Box::into_raw(cq);
        for (g, id) in gs.iter_mut().zip(ids) {
            g.cqs.insert(id.0, p as usize);
        }
        if !channel.is_null() {
            // SAFETY: the caller's channel of ours; refcnt changes under the NIC lock.
            unsafe { (*channel).refcnt += 1 };
        }
        p.cast()
    })
}

pub extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: a CQ from create_cq or create_cq_ex (every ibv_cq we hand out is a Cq); the core's
    // CQ is gone once undone, and its handle reaches nothing, not the CQ that reuses its slot.
    unsafe {
        destroy(cq as *mut Cq, live::CQS, |n, c| {
            undo_cq(&mut n.lock_all(), c, cq)
        })
    }
}

/// `ibv_destroy_cq`'s part under every shard's lock: the core's CQ, our tables' entries, and
/// the CQ's place on its completion channel (its count of CQs, and events not yet read).
fn undo_cq(gs: &mut [Locked<'_>], c: &Cq, cq: *mut ibv_cq) -> Result<(), c_int> {
    // EBUSY while a QP (of any shard) uses it, as the kernel; then its completions and events
    // are gone.
    for (g, &id) in gs.iter().zip(&c.ids) {
        g.rnic.cq_in_use(id).map_err(|e| errno_of(&e))?;
    }
    for (g, &id) in gs.iter_mut().zip(&c.ids) {
        g.rnic.destroy_cq(id).map_err(|e| errno_of(&e))?;
        g.cqs.remove(&id.0);
    }
    if !c.ibv.channel.is_null() {
        // SAFETY: its channel, alive while it has CQs (destroy_comp_channel says EBUSY).
        let ch = unsafe { &mut *(c.ibv.channel as *mut Channel) };
        ch.ibv.refcnt -= 1;
        ch.q.lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&p| p != cq as usize);
    }
    Ok(())
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (exactly that many: rxe does not
/// round up either), if the ones waiting fit; `cq->cqe` says the new size. Returns 0 or the
/// error number (the ibv_resize_cq(3) man page): EINVAL for a size below 1, above `max_cqe` or
/// below the completions waiting. On a device of several shards every shard's copy of the CQ
/// is resized, and what waits is counted over all of them.
pub extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard(EINVAL, || {
        if cq.is_null() || cqe < 1 {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a CQ of ours.
        let c = unsafe { &*(cq as *const Cq) };
        let mut gs = n.lock_all();
        if cqe as u32 > gs[0].rnic.query_device().max_cqe {
            return EINVAL;
        }
        let mut waiting = 0;
        for (g, &id) in gs.iter().zip(&c.ids) {
            match g.rnic.cq_pending(id) {
                Ok(k) => waiting += k,
                Err(e) => return errno_of(&e),
            }
        }
        if (cqe as usize) < waiting {
            return EINVAL;
        }
        for (g, &id) in gs.iter_mut().zip(&c.ids) {
            // Cannot fail now: the size is in range and each copy holds at most `waiting`.
            if let Err(e) = g.rnic.resize_cq(id, cqe as usize) {
                return errno_of(&e);
            }
        }
        // SAFETY: the caller's CQ (the program reads `cqe` from it, as from rdma-core's);
        // written under every shard's lock, after the last use of `c`.
        unsafe { (*cq).cqe = cqe };
        0
    })
}

fn wc_status(s: WcStatus) -> c_int {
    match s {
        WcStatus::Success => 0,
        WcStatus::LocLenErr => 1,
        WcStatus::LocQpOpErr => 2,
        WcStatus::LocProtErr => 4,
        WcStatus::WrFlushErr => 5,
        WcStatus::MwBindErr => 6,
        WcStatus::BadRespErr => 7,
        WcStatus::LocAccessErr => 8,
        WcStatus::RemInvReqErr => 9,
        WcStatus::RemAccessErr => 10,
        WcStatus::RemOpErr => 11,
        WcStatus::RetryExcErr => 12,
        WcStatus::RnrRetryExcErr => 13,
        WcStatus::GeneralErr => 21,
    }
}

fn wc_opcode(o: WcOpcode) -> c_int {
    match o {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    }
}

fn to_ibv_wc(w: &Wc) -> ibv_wc {
    let imm = if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: wc_status(w.status),
        opcode: wc_opcode(w.opcode),
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: w.wc_flags.0,
        pkey_index: w.pkey_index,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

thread_local! {
    /// Empty polls in a row on this thread (for the occasional yield of `poll_cq_op`).
    static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

pub(crate) unsafe extern "C" fn poll_cq_op(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        if cq.is_null() || num < 0 || (wc.is_null() && num > 0) {
            return -EINVAL;
        }
        let Ok(n) = the_nic() else {
            return -libc::ENODEV;
        };
        // SAFETY: a CQ of ours.
        let c = unsafe { &*(cq as *mut Cq) };
        // Nothing happened since this CQ was found empty: it still is (no lock taken). A
        // program spinning on an empty CQ yields now and then: on a machine with fewer cores
        // than spinning threads, the engine thread that would fill the CQ needs this core (the
        // yield returns at once when nothing else wants it).
        let gen = n.progress.load(Ordering::SeqCst);
        if c.empty_at.load(Ordering::Relaxed) == gen {
            EMPTY_POLLS.with(|e| {
                let k = e.get().wrapping_add(1);
                e.set(k);
                if k % 64 == 0 {
                    std::thread::yield_now();
                }
            });
            return 0;
        }
        // Every shard's copy of the CQ in turn (a QP's completions are all in its shard's, in
        // order), starting after the shard that gave the last ones.
        let shards = n.shard_count();
        let first = c.poll_next.load(Ordering::Relaxed) % shards;
        let mut m = 0;
        let mut overflowed = false;
        for i in 0..shards {
            if m == num as usize {
                break;
            }
            let k = (first + i) % shards;
            let mut g = n.lock_to_poll(k);
            let g = &mut *g;
            g.wcs.clear();
            let id = c.ids[k];
            let got = g.rnic.poll_cq_into(id, num as usize - m, &mut g.wcs);
            overflowed |= got == 0 && g.rnic.cq_overflowed(id);
            for (j, w) in g.wcs[..got].iter().enumerate() {
                // SAFETY: wc has room for `num` ≥ m + got entries (the caller's array).
                unsafe { *wc.add(m + j) = to_ibv_wc(w) };
            }
            if got > 0 {
                c.poll_next.store(k + 1, Ordering::Relaxed);
            }
            m += got;
        }
        if m == 0 {
            if overflowed {
                return -libc::EIO;
            }
            c.empty_at.store(gen, Ordering::Relaxed);
        }
        m as c_int
    })
}

unsafe extern "C" fn req_notify_cq_op(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(EINVAL, || {
        if cq.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a CQ of ours.
        let c = unsafe { &*(cq as *mut Cq) };
        let mut gs = n.lock_all();
        c.armed.store(true, Ordering::Relaxed);
        for (g, &id) in gs.iter_mut().zip(&c.ids) {
            if let Err(e) = g.rnic.req_notify_cq(id, solicited_only != 0) {
                return errno_of(&e);
            }
        }
        0
    })
}

/// An engine thread, after each turn: the CQs whose armed notification fired get their event
/// on their completion channel (queue and eventfd): one per `ibv_req_notify_cq`, from the
/// first shard whose copy fired.
pub fn deliver_cq_events(g: &mut Inner) {
    g.cq_events.clear();
    g.rnic.take_cq_events(&mut g.cq_events);
    for id in &g.cq_events {
        let Some(&p) = g.cqs.get(&id.0) else { continue };
        // SAFETY: a live CQ of ours (in the map, changed only under the lock we hold).
        let c = unsafe { &*(p as *const Cq) };
        if c.ibv.channel.is_null() || !c.armed.swap(false, Ordering::Relaxed) {
            continue;
        }
        // SAFETY: the CQ's channel outlives it (destroy_comp_channel says EBUSY meanwhile).
        let ch = unsafe { &*(c.ibv.channel as *const Channel) };
        ch.q.lock().unwrap_or_else(|p| p.into_inner()).push_back(p);
        nic::eventfd_add(ch.ibv.fd, 1);
    }
}

pub extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if ch.is_null() || cq.is_null() || cq_context.is_null() {
            set_errno(EINVAL);
            return -1;
        }
        // SAFETY: a channel of ours.
        let ch = unsafe { &*(ch as *const Channel) };
        // One count per queued event; a destroyed CQ takes its events off the queue but not
        // their counts, so a count may find the queue empty: read the next one.
        let p = loop {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local; blocks unless the program made the fd
            // nonblocking (then EAGAIN, as rdma-core's).
            let r = unsafe { libc::read(ch.ibv.fd, (&mut v as *mut u64).cast(), 8) };
            if r != 8 {
                return -1;
            }
            if let Some(p) = ch.q.lock().unwrap_or_else(|p| p.into_inner()).pop_front() {
                break p;
            }
        };
        // SAFETY: the out-parameters are the caller's, non-NULL; p is a live CQ of ours (a
        // destroyed CQ's events are removed from the queue).
        unsafe {
            *cq = p as *mut ibv_cq;
            *cq_context = (*(p as *mut Cq)).ibv.cq_context;
        }
        0
    })
}

pub extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a CQ of ours; the counter is only touched atomically.
    let a = unsafe { AtomicU32::from_ptr(&mut (*cq).comp_events_completed) };
    a.fetch_add(nevents, Ordering::Relaxed);
}

// ---- asynchronous events -------------------------------------------------------------------

pub extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    guard(-1, || {
        if ctx.is_null() || event.is_null() {
            set_errno(EINVAL);
            return -1;
        }
        let Ok(n) = the_nic() else { return -1 };
        let mut v = 0u64;
        // SAFETY: a context of ours; reads 8 bytes into a local.
        let r = unsafe { libc::read((*ctx).async_fd, (&mut v as *mut u64).cast(), 8) };
        if r != 8 {
            return -1;
        }
        let Some(e) = (0..n.shard_count()).find_map(|k| n.lock_shard(k).events.pop_front()) else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // SAFETY: the caller's event, non-NULL.
        unsafe {
            (*event).element = ibv_async_event_element {
                cq: e.element as *mut ibv_cq,
            };
            (*event).event_type = e.event_type;
        }
        0
    })
}

pub extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}

// ---- QPs -----------------------------------------------------------------------------------

fn qp_type_of(t: c_int) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        _ => Err(EOPNOTSUPP),
    }
}

fn qp_type_c(t: QpType) -> c_int {
    match t {
        QpType::Rc => IBV_QPT_RC,
        QpType::Uc => IBV_QPT_UC,
        QpType::Ud => IBV_QPT_UD,
    }
}

struct CreateQp {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: ibv_qp_cap,
    qp_type: c_int,
    sq_sig_all: c_int,
}

/// The inline room a QP gets: what was asked, and at least the bytes of its send SGEs (16 per
/// SGE, as rdma_rxe sizes a WQE: `max(max_sge × sizeof(rxe_sge), max_inline_data)`), so that a
/// small inline send a program makes without asking (rdma_xclient's 16 bytes) fits, as it does
/// on rxe and mlx5; within the device's 256.
fn inline_cap(c: &ibv_qp_cap) -> u32 {
    c.max_inline_data
        .max(16 * c.max_send_sge.clamp(1, 16))
        .min(256.max(c.max_inline_data))
}

fn create_qp_common(a: &CreateQp) -> Result<*mut Qp, c_int> {
    if a.pd.is_null() || a.send_cq.is_null() || a.recv_cq.is_null() {
        return Err(EINVAL);
    }
    let qp_type = qp_type_of(a.qp_type)?;
    let n = the_nic()?;
    // A QP with an SRQ goes to the SRQ's shard; the others are dealt out in turn.
    let (srq, shard) = if a.srq.is_null() {
        (None, n.pick_shard())
    } else {
        // SAFETY: an SRQ of ours.
        let q = unsafe { &*(a.srq as *mut Srq) };
        (Some(q.id), q.shard)
    };
    // SAFETY: PD and CQs of ours.
    let (pd, scq, rcq) = unsafe {
        (
            (&*(a.pd as *mut Pd)).ids[shard],
            (&*(a.send_cq as *mut Cq)).ids[shard],
            (&*(a.recv_cq as *mut Cq)).ids[shard],
        )
    };
    let init = QpInitAttr {
        qp_type,
        send_cq: scq,
        recv_cq: rcq,
        srq,
        cap: QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: inline_cap(&a.cap),
        },
        sq_sig_all: a.sq_sig_all != 0,
    };
    let mut g = n.lock_shard(shard);
    let qpn = g.rnic.create_qp(pd, init).map_err(|e| errno_of(&e))?;
    // SAFETY: plain data (pointers, integers, optional function pointers, pthread objects
    // whose initializers are zeroes on glibc).
    let mut ex: ibv_qp_ex = unsafe { zeroed() };
    let b = &mut ex.qp_base;
    b.context = a.ctx;
    b.qp_context = a.qp_context;
    b.pd = a.pd;
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = qpn.value();
    b.qp_num = qpn.value();
    b.state = 0;
    b.qp_type = a.qp_type;
    b.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    b.cond = libc::PTHREAD_COND_INITIALIZER;
    crate::wr::set_ops(&mut ex);
    live::add(live::QPS, 1);
    let qp = Box::into_raw(Box::new(Qp {
        ex,
        qpn,
        qp_type,
        cap: ibv_qp_cap {
            max_inline_data: inline_cap(&a.cap),
            ..a.cap
        },
        sq_sig_all: a.sq_sig_all,
        batch: Mutex::new(Batch::default()),
    }));
    g.qps.insert(qpn.value(), qp as usize);
    Ok(qp)
}

pub extern "C" fn ibv_create_qp(pd: *mut ibv_pd, init: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard(null_mut(), || {
        if pd.is_null() || init.is_null() {
            return fail_ptr(EINVAL);
        }
        // SAFETY: the caller's init attributes and a PD of ours.
        let (i, ctx) = unsafe { (&*init, (*pd).context) };
        let qp = try_null!(create_qp_common(&CreateQp {
            ctx,
            pd,
            qp_context: i.qp_context,
            send_cq: i.send_cq,
            recv_cq: i.recv_cq,
            srq: i.srq,
            cap: i.cap,
            qp_type: i.qp_type,
            sq_sig_all: i.sq_sig_all,
        }));
        // As every provider: the caller's attributes say what the QP got.
        // SAFETY: the caller's init attributes (checked non-NULL above).
        unsafe { (*init).cap.max_inline_data = inline_cap(&(*init).cap) };
        qp.cast()
    })
}

/// The `ibv_wr_*` opcodes RoCEmu executes (`enum ibv_qp_create_send_ops_flags`): RDMA WRITE
/// (with immediate), SEND (with immediate, with invalidate), RDMA READ, the two atomics.
const SEND_OPS_SUPPORTED: u64 = 0x7f | (1 << 9);

unsafe extern "C" fn create_qp_ex_op(
    ctx: *mut ibv_context,
    a: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        if ctx.is_null() || a.is_null() {
            return fail_ptr(EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*a };
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return fail_ptr(EINVAL);
        }
        if a.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            return fail_ptr(EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !SEND_OPS_SUPPORTED != 0
        {
            return fail_ptr(EOPNOTSUPP);
        }
        let qp = try_null!(create_qp_common(&CreateQp {
            ctx,
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        }));
        qp.cast()
    })
}

pub extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // Every QP of ours is an ibv_qp_ex with the post ops set.
    qp.cast()
}

pub extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // What the QP owes its peer (the ACK of a message whose completion the program has seen)
    // leaves before the QP goes.
    if let (false, Some(n)) = (qp.is_null(), nic::started()) {
        // SAFETY: a live QP of ours (the verbs' contract, as `destroy` below relies on).
        n.drain_responses(unsafe { (*(qp as *mut Qp)).qpn });
    }
    // SAFETY: a QP from create_qp (every ibv_qp we hand out is a Qp).
    unsafe {
        destroy(qp as *mut Qp, live::QPS, |n, q| {
            let mut g = n.lock_qp(q.qpn);
            g.rnic.destroy_qp(q.qpn).map_err(|e| errno_of(&e))?;
            g.qps.remove(&q.qpn.value());
            Ok(())
        })
    }
}

fn state_of(s: c_int) -> Result<QpState, c_int> {
    Ok(match s {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return Err(EINVAL),
    })
}

fn state_c(s: QpState) -> c_int {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn mtu_of(m: c_int) -> Result<Mtu, c_int> {
    Ok(match m {
        1 => Mtu::M256,
        2 => Mtu::M512,
        3 => Mtu::M1024,
        4 => Mtu::M2048,
        5 => Mtu::M4096,
        _ => return Err(EINVAL),
    })
}

/// The core's address vector for a program's `ibv_ah_attr`, its MAC resolved: RoCE needs the
/// GRH (`is_global`), and the source GID index must be one of ours.
fn av_of(n: &Nic, a: &ibv_ah_attr) -> Result<AhAttr, c_int> {
    if a.is_global == 0 {
        return Err(EINVAL);
    }
    if a.grh.sgid_index as u32 >= GID_TBL_LEN {
        return Err(EINVAL);
    }
    // SAFETY: reading the raw bytes of a union of byte-compatible members.
    let dgid = Gid(unsafe { a.grh.dgid.raw });
    let ip = dgid.ip();
    let dmac = if n.ips.contains(&ip) {
        n.mac
    } else {
        n.resolve(ip).ok_or(libc::EHOSTUNREACH)?
    };
    Ok(AhAttr {
        dgid,
        sgid_index: a.grh.sgid_index,
        dmac: Some(dmac),
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label & 0xfffff,
        sl: a.sl,
    })
}

fn ah_attr_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// `ibv_qp_attr_mask` bits up to `IBV_QP_DEST_QPN`: the ones the core knows.
const QP_MASK_KNOWN: c_int = (1 << 21) - 1;

pub extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard(EINVAL, || {
        if qp.is_null() || attr.is_null() || mask & !QP_MASK_KNOWN != 0 {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a QP of ours, the caller's attributes.
        let (q, a) = unsafe { (&mut *(qp as *mut Qp), &*attr) };
        let m = QpAttrMask(mask as u32);
        let mut x = QpAttr::default();
        if m.contains(QpAttrMask::STATE) {
            x.qp_state = try_errno!(state_of(a.qp_state));
        }
        if m.contains(QpAttrMask::CUR_STATE) {
            x.cur_qp_state = try_errno!(state_of(a.cur_qp_state));
        }
        if m.contains(QpAttrMask::PATH_MTU) {
            x.path_mtu = try_errno!(mtu_of(a.path_mtu));
        }
        if m.contains(QpAttrMask::AV) {
            x.ah_attr = try_errno!(av_of(n, &a.ah_attr));
        }
        x.qkey = QKey(a.qkey);
        x.rq_psn = Psn::new(a.rq_psn & 0xff_ffff);
        x.sq_psn = Psn::new(a.sq_psn & 0xff_ffff);
        x.dest_qp_num = Qpn::new(a.dest_qp_num & 0xff_ffff);
        x.qp_access_flags = Access(a.qp_access_flags & 0xf);
        x.pkey_index = a.pkey_index;
        x.port_num = a.port_num;
        x.timeout = a.timeout;
        x.retry_cnt = a.retry_cnt;
        x.rnr_retry = a.rnr_retry;
        x.min_rnr_timer = a.min_rnr_timer;
        x.max_rd_atomic = a.max_rd_atomic;
        x.max_dest_rd_atomic = a.max_dest_rd_atomic;
        if m.contains(QpAttrMask::PORT) && a.port_num != 1 {
            return EINVAL;
        }
        let mut g = n.lock_qp(q.qpn);
        let mismatches = g.rnic.counters().gid_type_mismatch;
        let r = g.rnic.modify_qp(q.qpn, &x, m);
        let mismatched = g.rnic.counters().gid_type_mismatch != mismatches;
        drop(g);
        match r {
            Ok(()) => {
                if m.contains(QpAttrMask::STATE) {
                    q.ex.qp_base.state = a.qp_state;
                }
                0
            }
            Err(e) => {
                // The most common interop mistake gets a line of its own: the program itself
                // only learns EINVAL (perftest and ibv_*_pingpong say "Failed to modify QP to
                // RTR").
                if mismatched {
                    eprintln!("rocemu: ibv_modify_qp: {e}");
                }
                errno_of(&e)
            }
        }
    })
}

pub extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(EINVAL, || {
        if qp.is_null() || attr.is_null() || init.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a QP of ours.
        let q = unsafe { &*(qp as *mut Qp) };
        let x = match n.lock_qp(q.qpn).rnic.query_qp(q.qpn) {
            Ok(x) => x,
            Err(e) => return errno_of(&e),
        };
        // SAFETY: plain data.
        let mut a: ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = state_c(x.qp_state);
        a.cur_qp_state = state_c(x.qp_state);
        a.path_mtu = x.path_mtu as c_int;
        a.qkey = x.qkey.0;
        a.rq_psn = x.rq_psn.value();
        a.sq_psn = x.sq_psn.value();
        a.dest_qp_num = x.dest_qp_num.value();
        a.qp_access_flags = x.qp_access_flags.0;
        a.cap = q.cap;
        a.ah_attr = ah_attr_c(&x.ah_attr);
        a.pkey_index = x.pkey_index;
        a.max_rd_atomic = x.max_rd_atomic;
        a.max_dest_rd_atomic = x.max_dest_rd_atomic;
        a.min_rnr_timer = x.min_rnr_timer;
        a.port_num = x.port_num;
        a.timeout = x.timeout;
        a.retry_cnt = x.retry_cnt;
        a.rnr_retry = x.rnr_retry;
        let b = &q.ex.qp_base;
        // SAFETY: the caller's structs, non-NULL.
        unsafe {
            *attr = a;
            *init = ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: q.cap,
                qp_type: qp_type_c(q.qp_type),
                sq_sig_all: q.sq_sig_all,
            };
        }
        0
    })
}

pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
}

pub extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    EOPNOTSUPP
}

pub extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    EOPNOTSUPP
}

// ---- posting -------------------------------------------------------------------------------

/// The SGEs of a work request (checked: a count, and a list when it is not zero).
///
/// # Safety
/// `list` points at `num` SGEs of the caller's when `num > 0`.
unsafe fn sges<'a>(list: *const ibv_sge, num: c_int) -> Result<&'a [ibv_sge], c_int> {
    if num < 0 || (num > 0 && list.is_null()) {
        return Err(EINVAL);
    }
    if num == 0 {
        return Ok(&[]);
    }
    // SAFETY: per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(list, num as usize) })
}

pub fn sg_list(s: &[ibv_sge]) -> SgList {
    let c = |e: &ibv_sge| Sge {
        addr: e.addr,
        length: e.length,
        lkey: e.lkey,
    };
    match s {
        [] => SgList::default(),
        [a] => SgList::from([c(a)]),
        [a, b] => SgList::from([c(a), c(b)]),
        _ => SgList::Heap(s.iter().map(c).collect()),
    }
}

/// Copies the bytes of inline SGEs at post time (what `IBV_SEND_INLINE` means).
///
/// # Safety
/// Each SGE's `addr` points at `length` readable bytes of the program's.
pub unsafe fn inline_bytes(s: &[ibv_sge], out: &mut Vec<u8>) -> Result<(), c_int> {
    let total: u64 = s.iter().map(|e| e.length as u64).sum();
    if total > 1 << 20 {
        return Err(EINVAL);
    }
    out.reserve(total as usize);
    for e in s {
        if e.length == 0 {
            continue;
        }
        if e.addr == 0 {
            return Err(EINVAL);
        }
        // SAFETY: per the caller's contract (the verbs contract of an inline send: the program's
        // own readable memory, copied before the post returns).
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(e.addr as *const u8, e.length as usize)
        });
    }
    Ok(())
}

/// The AH of a UD send: the core's address vector.
pub fn ud_dest(ah: *mut ibv_ah, qpn: u32, qkey: u32) -> Result<UdDest, c_int> {
    if ah.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: an AH of ours.
    let a = unsafe { &*(ah as *mut Ah) };
    Ok(UdDest {
        ah: a.attr,
        remote_qpn: Qpn::new(qpn & 0xff_ffff),
        remote_qkey: QKey(qkey),
    })
}

fn send_wr(q: &Qp, w: &ibv_send_wr) -> Result<SendWr, c_int> {
    // SAFETY: the work request's SGE list (the caller's).
    let s = unsafe { sges(w.sg_list, w.num_sge)? };
    // SAFETY: the union member the opcode names.
    let opcode = unsafe {
        match w.opcode {
            IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
                imm: u32::from_be(w.imm_data),
            },
            IBV_WR_SEND => WrOpcode::Send,
            IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm {
                imm: u32::from_be(w.imm_data),
            },
            IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv {
                invalidate_rkey: w.imm_data,
            },
            IBV_WR_RDMA_READ => WrOpcode::RdmaRead {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpSwap {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                add: w.wr.atomic.compare_add,
            },
            IBV_WR_LOCAL_INV | IBV_WR_BIND_MW => return Err(EOPNOTSUPP),
            _ => return Err(EINVAL),
        }
    };
    let flags = SendFlags(w.send_flags & 0xf);
    let mut wr = SendWr {
        wr_id: w.wr_id,
        opcode,
        sg_list: SgList::default(),
        flags,
        inline_data: Vec::new(),
        ud: None,
    };
    if flags.contains(SendFlags::INLINE) {
        // SAFETY: an inline send's SGEs name the program's readable memory.
        unsafe { inline_bytes(s, &mut wr.inline_data)? };
    } else {
        wr.sg_list = sg_list(s);
    }
    if q.qp_type == QpType::Ud {
        // SAFETY: the ud member, for a UD QP.
        let ud = unsafe { w.wr.ud };
        wr.ud = Some(ud_dest(ud.ah, ud.remote_qpn, ud.remote_qkey)?);
    }
    Ok(wr)
}

unsafe extern "C" fn post_send_op(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(EINVAL, || {
        if qp.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a QP of ours.
        let q = unsafe { &*(qp as *mut Qp) };
        let mut g = n.lock_qp(q.qpn);
        let mut w = wr;
        while !w.is_null() {
            // SAFETY: the caller's work request chain.
            let r = send_wr(q, unsafe { &*w })
                .and_then(|x| g.rnic.post_send(q.qpn, x).map_err(|e| errno_of(&e)));
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out-parameter.
                    unsafe { *bad = w };
                }
                return e;
            }
            // SAFETY: as above.
            w = unsafe { (*w).next };
        }
        0
    })
}

fn recv_wr(w: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    // SAFETY: the work request's SGE list (the caller's).
    let s = unsafe { sges(w.sg_list, w.num_sge)? };
    Ok(RecvWr {
        wr_id: w.wr_id,
        sg_list: sg_list(s),
    })
}

unsafe extern "C" fn post_recv_op(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(EINVAL, || {
        if qp.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: a QP of ours.
        let q = unsafe { &*(qp as *mut Qp) };
        let mut g = n.lock_qp(q.qpn);
        let mut w = wr;
        while !w.is_null() {
            // SAFETY: the caller's work request chain.
            let r = recv_wr(unsafe { &*w })
                .and_then(|x| g.rnic.post_recv(q.qpn, x).map_err(|e| errno_of(&e)));
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out-parameter.
                    unsafe { *bad = w };
                }
                return e;
            }
            // SAFETY: as above.
            w = unsafe { (*w).next };
        }
        0
    })
}

// ---- SRQ -----------------------------------------------------------------------------------

#[repr(C)]
pub struct Srq {
    pub ibv: ibv_srq,
    pub id: SrqId,
    /// The shard that has it (and every QP that uses it).
    pub shard: usize,
}

unsafe extern "C" fn post_srq_recv_op(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(EINVAL, || {
        if srq.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: an SRQ of ours.
        let (id, shard) = unsafe { ((*(srq as *mut Srq)).id, (*(srq as *mut Srq)).shard) };
        let mut g = n.lock_shard(shard);
        let mut w = wr;
        while !w.is_null() {
            // SAFETY: the caller's work request chain.
            let r = recv_wr(unsafe { &*w })
                .and_then(|x| g.rnic.post_srq_recv(id, x).map_err(|e| errno_of(&e)));
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out-parameter.
                    unsafe { *bad = w };
                }
                return e;
            }
            // SAFETY: as above.
            w = unsafe { (*w).next };
        }
        0
    })
}

pub extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard(null_mut(), || {
        if pd.is_null() || init.is_null() {
            return fail_ptr(EINVAL);
        }
        let n = try_null!(the_nic());
        // SAFETY: a PD of ours and the caller's attributes.
        let (p, i) = unsafe { (&*(pd as *mut Pd), &*init) };
        let shard = n.pick_shard();
        let mut g = n.lock_shard(shard);
        let id = match g.rnic.create_srq(
            p.ids[shard],
            SrqInitAttr {
                max_wr: i.attr.max_wr,
                max_sge: i.attr.max_sge,
                srq_limit: i.attr.srq_limit,
            },
        ) {
            Ok(id) => id,
            Err(e) => return fail_ptr(errno_of(&e)),
        };
        live::add(live::SRQS, 1);
        let srq = Box::into_raw(Box::new(Srq {
            ibv: ibv_srq {
                context: p.ibv.context,
                srq_context: i.srq_context,
                pd,
                handle: id.handle(),
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                cond: libc::PTHREAD_COND_INITIALIZER,
                events_completed: 0,
            },
            id,
            shard,
        }));
        g.srqs.insert(id.handle(), srq as usize);
        srq.cast()
    })
}

const IBV_SRQ_MAX_WR: c_int = 1;
const IBV_SRQ_LIMIT: c_int = 2;

pub extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard(EINVAL, || {
        if srq.is_null() || attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: an SRQ of ours and the caller's attributes.
        let (q, a) = unsafe { (&*(srq as *mut Srq), &*attr) };
        let max_wr = (mask & IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
        match n.lock_shard(q.shard).rnic.modify_srq(q.id, max_wr, limit) {
            Ok(()) => 0,
            Err(e) => errno_of(&e),
        }
    })
}

pub extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(EINVAL, || {
        if srq.is_null() || attr.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: an SRQ of ours.
        let q = unsafe { &*(srq as *mut Srq) };
        match n.lock_shard(q.shard).rnic.query_srq(q.id) {
            Ok(a) => {
                // SAFETY: the caller's attributes, non-NULL.
                unsafe {
                    *attr = ibv_srq_attr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.srq_limit,
                    }
                };
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

pub extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: an SRQ from create_srq (every ibv_srq we hand out is an Srq).
    unsafe {
        destroy(srq as *mut Srq, live::SRQS, |n, q| {
            let mut g = n.lock_shard(q.shard);
            g.rnic.destroy_srq(q.id).map_err(|e| errno_of(&e))?;
            g.srqs.remove(&q.id.handle());
            Ok(())
        })
    }
}

// ---- AH ------------------------------------------------------------------------------------

pub extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(null_mut(), || {
        if pd.is_null() || attr.is_null() {
            return fail_ptr(EINVAL);
        }
        let n = try_null!(the_nic());
        // SAFETY: the caller's attributes and a PD of ours.
        let (a, ctx) = unsafe { (&*attr, (*pd).context) };
        let av = try_null!(av_of(n, a));
        let g = n.lock();
        // SAFETY: a PD of ours; its AH count changes under the NIC lock.
        let p = unsafe { &*(pd as *mut Pd) };
        p.ahs.fetch_add(1, Ordering::Relaxed);
        drop(g);
        let ah = Box::new(Ah {
            ibv: ibv_ah {
                context: ctx,
                pd,
                handle: 0,
            },
            attr: av,
        });
        live::add(live::AHS, 1);
        Box::into_raw(ah).cast()
    })
}

pub extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    let undo = |_: &Nic, a: &Ah| {
        // SAFETY: its PD outlives it (dealloc_pd is EBUSY while the PD has AHs).
        unsafe { &*(a.ibv.pd as *mut Pd) }
            .ahs
            .fetch_sub(1, Ordering::Relaxed);
        Ok(())
    };
    // SAFETY: an AH from create_ah (every ibv_ah we hand out is an Ah).
    unsafe { destroy(ah as *mut Ah, live::AHS, undo) }
}

/// The address vector back to the sender of a UD receive: its source address from the 40
/// bytes at the head of the receive buffer (the IPv6 header; for IPv4, 20 zero bytes and the
/// IPv4 header, rdma-core's RoCE v2 convention), and our GID it was sent to as source GID.
pub extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        if ctx.is_null() || wc.is_null() || grh.is_null() || attr.is_null() || port != 1 {
            set_errno(EINVAL);
            return -1;
        }
        let Ok(n) = the_nic() else { return -1 };
        // SAFETY: the caller's completion.
        let w = unsafe { &*wc };
        if w.wc_flags & IBV_WC_GRH == 0 {
            set_errno(EINVAL);
            return -1;
        }
        // SAFETY: the caller's 40-byte GRH area.
        let area = unsafe { std::slice::from_raw_parts(grh as *const u8, 40) };
        let Some(src) = grh_source(area) else {
            set_errno(EINVAL);
            return -1;
        };
        let dst: IpAddr = if src.is_ipv4() {
            IpAddr::from([area[36], area[37], area[38], area[39]])
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&area[24..40]);
            IpAddr::from(a)
        };
        let sgid_index = n.ips.iter().position(|ip| *ip == dst).unwrap_or(1) as u8;
        let tclass = if src.is_ipv4() {
            area[21]
        } else {
            ((u32::from_be_bytes([area[0], area[1], area[2], area[3]]) >> 20) & 0xff) as u8
        };
        let a = AhAttr {
            dgid: Gid::from_ip(src),
            sgid_index,
            dmac: None,
            hop_limit: 0xff,
            traffic_class: tclass,
            flow_label: 0,
            sl: 0,
        };
        // SAFETY: the caller's attributes, non-NULL.
        unsafe { *attr = ah_attr_c(&a) };
        0
    })
}

pub extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard(null_mut(), || {
        if pd.is_null() {
            return fail_ptr(EINVAL);
        }
        // SAFETY: plain data.
        let mut a: ibv_ah_attr = unsafe { zeroed() };
        // SAFETY: a PD of ours.
        let ctx = unsafe { (*pd).context };
        if ibv_init_ah_from_wc(ctx, port, wc, grh, &mut a) != 0 {
            return null_mut();
        }
        ibv_create_ah(pd, &mut a)
    })
}

pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    ctx: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    guard(EINVAL, || {
        if ctx.is_null() || attr.is_null() || eth_mac.is_null() {
            return EINVAL;
        }
        let n = try_errno!(the_nic());
        // SAFETY: the caller's attributes.
        let av = try_errno!(av_of(n, unsafe { &*attr }));
        let m = av.dmac.unwrap_or(n.mac).0;
        // SAFETY: the caller's 6-byte MAC buffer and optional VLAN id.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), eth_mac, 6);
            if !vid.is_null() {
                *vid = 0xffff;
            }
        }
        0
    })
}

// ---- multicast, fork, import, sysfs, kernel structs ---------------------------------------

pub extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    EOPNOTSUPP
}

pub extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    EOPNOTSUPP
}

/// Regions are not pinned pages of a kernel driver: fork needs nothing.
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED`.
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    fail_ptr(EOPNOTSUPP)
}

pub extern "C" fn ibv_import_pd(_ctx: *mut ibv_context, _handle: u32) -> *mut ibv_pd {
    fail_ptr(EOPNOTSUPP)
}

pub extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _handle: u32) -> *mut ibv_mr {
    fail_ptr(EOPNOTSUPP)
}

pub extern "C" fn ibv_import_dm(_ctx: *mut ibv_context, _handle: u32) -> *mut c_void {
    fail_ptr(EOPNOTSUPP)
}

pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}
pub extern "C" fn ibv_unimport_dm(_dm: *mut c_void) {}

pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// RoCEmu has no sysfs files.
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: size_t,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

/// Conversions from the kernel's uverbs structs: there is no kernel device, so no program on
/// RoCEmu has a kernel struct to convert; left as they are.
pub extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut ibv_qp_attr, _src: *const c_void) {}
pub extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut ibv_ah_attr, _src: *const c_void) {}
pub extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {}
pub extern "C" fn ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *const c_void) {}

// ---- strings and rates ---------------------------------------------------------------------

pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    let s: &CStr = match status {
        0 => c"success",
        1 => c"local length error",
        2 => c"local QP operation error",
        3 => c"local EE context operation error",
        4 => c"local protection error",
        5 => c"Work Request Flushed Error",
        6 => c"memory management operation error",
        7 => c"bad response error",
        8 => c"local access error",
        9 => c"remote invalid request error",
        10 => c"remote access error",
        11 => c"remote operation error",
        12 => c"transport retry counter exceeded",
        13 => c"RNR retry counter exceeded",
        14 => c"local RDD violation error",
        15 => c"remote invalid RD request",
        16 => c"aborted error",
        17 => c"invalid EE context number",
        18 => c"invalid EE context state",
        19 => c"fatal error",
        20 => c"response timeout error",
        21 => c"general error",
        22 => c"TM error",
        23 => c"TM software rendezvous",
        _ => c"unknown",
    };
    s.as_ptr()
}

pub extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    let s: &CStr = match e {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        4 => c"communication established",
        5 => c"send queue drained",
        6 => c"path migrated",
        7 => c"path migration request error",
        8 => c"local catastrophic error",
        9 => c"port active",
        10 => c"port error",
        11 => c"LID change",
        12 => c"P_Key change",
        13 => c"SM change",
        14 => c"SRQ catastrophic error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        17 => c"client reregistration",
        18 => c"GID table change",
        19 => c"WQ fatal",
        _ => c"unknown",
    };
    s.as_ptr()
}

pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    let s: &CStr = match t {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

pub extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    let s: &CStr = match s {
        0 => c"no state change (NOP)",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// `enum ibv_rate` → (multiple of 2.5 Gb/s or -1, Mb/s).
const RATES: [(c_int, c_int, c_int); 21] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 412500),
    (22, -1, 618750),
];

pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0)
}

pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// Makes an object in every shard (`make`): its id in each, shard 0's first. Should one shard
/// fail, the copies made are undone (`undo`) and the verb fails with its errno.
fn in_every_shard<T: Copy>(
    gs: &mut [Locked<'_>],
    make: impl Fn(&mut Inner) -> Result<T, c_int>,
    undo: impl Fn(&mut Inner, T),
) -> Result<Vec<T>, c_int> {
    let mut ids = Vec::with_capacity(gs.len());
    for k in 0..gs.len() {
        match make(&mut gs[k]) {
            Ok(id) => ids.push(id),
            Err(e) => {
                for (g, &id) in gs.iter_mut().zip(&ids) {
                    undo(g, id);
                }
                return Err(e);
            }
        }
    }
    Ok(ids)
}
