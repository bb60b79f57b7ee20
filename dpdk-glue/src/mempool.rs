//! Packet-buffer pools and the buffers themselves.
//!
//! Invariants: a [`Mempool`] is a shared handle (it and every [`Mbuf`] hold one, and each holds
//! the [`Eal`]), so neither the pool's memory nor the EAL's can go while a buffer lives. The
//! last handle frees the pool only when no buffer of it is in use anywhere (in a driver's ring,
//! in a ring between two ports, or forgotten); otherwise the pool is left to the EAL's cleanup,
//! so a driver never writes into freed memory. Pools use DPDK's default multi-producer,
//! multi-consumer operations, so buffers can be allocated and freed from any thread.
use crate::eal::Eal;
use crate::error::{rte_errno, Error, Result};
use rocemu_dpdk_sys as sys;
use std::ffi::CString;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes the EAL keeps in front of a frame in every mbuf (`RTE_PKTMBUF_HEADROOM`).
pub const HEADROOM: usize = sys::RTE_PKTMBUF_HEADROOM as usize;

/// The data room (headroom included) of DPDK's default mbuf: enough for a 1500-byte MTU.
pub const DEFAULT_DATA_ROOM: u16 = sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

struct Inner {
    ptr: NonNull<sys::rte_mempool>,
    name: String,
    size: u32,
    data_room: u16,
    _eal: Eal,
}

// SAFETY: a pktmbuf pool made by `rte_pktmbuf_pool_create` uses the platform's default
// multi-producer / multi-consumer mempool operations, so getting and putting objects is safe from
// any thread; the remaining fields are plain data.
unsafe impl Send for Inner {}
// SAFETY: as above; `&Inner` only reads immutable fields or calls thread-safe mempool functions.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the pool is valid until freed below; counting reads its ring and caches.
        let in_use = unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) };
        if in_use == 0 {
            // SAFETY: no handle to the pool is left and none of its objects is in use, so
            // nothing refers to its memory any more.
            unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
        }
        // else: buffers are still out (a driver ring, a forgotten Mbuf): keep the memory for
        // them; rte_eal_cleanup releases it with the rest of the EAL's heap.
    }
}

/// A pool of packet buffers (`rte_pktmbuf_pool_create`). Cheap to clone.
#[derive(Clone)]
pub struct Mempool(Arc<Inner>);

impl fmt::Debug for Mempool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.0.name)
            .field("size", &self.0.size)
            .field("data_room", &self.0.data_room)
            .field("available", &self.available())
            .finish()
    }
}

impl Mempool {
    /// Buffers in a pool unless told otherwise: `net_af_xdp` wants at least 4096, and rx and tx
    /// rings of 1024 descriptors each plus bursts in flight need a few thousand.
    pub const DEFAULT_SIZE: u32 = 8192;

    /// A pool of `size` mbufs with `data_room` bytes of data each, headroom included
    /// ([`DEFAULT_DATA_ROOM`] holds a 1500-byte MTU), on any NUMA socket.
    pub fn new(eal: &Eal, size: u32, data_room: u16) -> Result<Mempool> {
        Mempool::on_socket(eal, size, data_room, sys::SOCKET_ID_ANY)
    }

    /// A pool whose mbufs each hold a `frame_len`-byte frame in one segment, after the headroom
    /// (at least [`DEFAULT_DATA_ROOM`]).
    pub fn for_frames(eal: &Eal, size: u32, frame_len: usize) -> Result<Mempool> {
        let room = (frame_len + HEADROOM).max(usize::from(DEFAULT_DATA_ROOM));
        let room = u16::try_from(room).map_err(|_| {
            Error::other(
                "rte_pktmbuf_pool_create",
                format!(
                    "a {frame_len}-byte frame does not fit in one mbuf ({} bytes at most)",
                    usize::from(u16::MAX) - HEADROOM
                ),
            )
        })?;
        Mempool::new(eal, size, room)
    }

    /// [`Mempool::new`] on NUMA socket `socket` (`SOCKET_ID_ANY` = -1 for any).
    pub fn on_socket(eal: &Eal, size: u32, data_room: u16, socket: i32) -> Result<Mempool> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        if usize::from(data_room) <= HEADROOM {
            return Err(Error::other(
                "rte_pktmbuf_pool_create",
                format!("a data room of {data_room} bytes leaves nothing after the {HEADROOM}-byte headroom"),
            ));
        }
        // Names are unique per process (and short: RTE_MEMPOOL_NAMESIZE is 26 here).
        let name = format!("rocemu_mp{}", SEQ.fetch_add(1, Ordering::Relaxed));
        let c = CString::new(name.clone()).expect("no NUL in a formatted name");
        // A per-lcore cache, within DPDK's limits (at most 512, and n >= 1.5 × cache).
        let cache = (size / 2).min(256);
        // SAFETY: `c` is a valid C string that outlives the call (DPDK copies the name); the
        // other arguments are plain values that DPDK validates. The EAL is live (`eal`).
        let ptr =
            unsafe { sys::rte_pktmbuf_pool_create(c.as_ptr(), size, cache, 0, data_room, socket) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::dpdk(
                "rte_pktmbuf_pool_create",
                rte_errno(),
                format!(
                    "{size} mbufs of {data_room} bytes ≈ {} MiB: give the EAL more memory (-m) if \
                     that is the problem",
                    (u64::from(size) * (u64::from(data_room) + 256)) >> 20
                ),
            )
        })?;
        Ok(Mempool(Arc::new(Inner {
            ptr,
            name,
            size,
            data_room,
            _eal: eal.clone(),
        })))
    }

    /// A fresh, empty, single-segment mbuf, or `None` when the pool is exhausted.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is valid while `self` lives; allocation is thread-safe (see `Inner`).
        let m = unsafe { sys::rocemu_pktmbuf_alloc(self.as_ptr()) };
        // SAFETY: a non-NULL result is an mbuf now owned by us alone.
        NonNull::new(m).map(|m| unsafe { Mbuf::from_raw(m, self.clone()) })
    }

    /// The pool's name in DPDK.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// How many mbufs it holds in all.
    pub fn size(&self) -> u32 {
        self.0.size
    }

    /// Data room of each mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        self.0.data_room
    }

    /// The longest frame one mbuf holds after the headroom.
    pub fn frame_room(&self) -> usize {
        usize::from(self.0.data_room) - HEADROOM
    }

    /// Mbufs free in the pool (per-lcore caches included).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is valid while `self` lives; counting only reads.
        unsafe { sys::rte_mempool_avail_count(self.as_ptr()) }
    }

    /// Mbufs taken from the pool and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: as for `available`.
        unsafe { sys::rte_mempool_in_use_count(self.as_ptr()) }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.0.ptr.as_ptr()
    }
}

/// One packet buffer, owned: derefs to its data (the first segment's `data_len` bytes); `Drop`
/// gives it back to its pool. A frame sent with [`EthPort::tx_burst`](crate::EthPort::tx_burst)
/// belongs to the driver from then on.
pub struct Mbuf {
    ptr: NonNull<sys::rte_mbuf>,
    /// Keeps the memory alive (the mbuf's own pool, or the pool of the port it came in on, which
    /// holds the EAL: see the module's invariants).
    _keep: Mempool,
}

// SAFETY: an `Mbuf` is the only reference to its buffer; freeing it from another thread is safe
// because the pools this crate makes are multi-producer.
unsafe impl Send for Mbuf {}
// SAFETY: `&Mbuf` only reads the buffer.
unsafe impl Sync for Mbuf {}

impl Mbuf {
    /// # Safety
    /// `ptr` is a valid mbuf owned by nobody else, from a pool that lives at least as long as
    /// `keep` (the same pool, or one that outlives it by this module's invariants).
    pub(crate) unsafe fn from_raw(ptr: NonNull<sys::rte_mbuf>, keep: Mempool) -> Mbuf {
        Mbuf { ptr, _keep: keep }
    }

    /// The raw mbuf, still owned by `self`.
    pub(crate) fn as_raw(&self) -> *mut sys::rte_mbuf {
        self.ptr.as_ptr()
    }

    /// Gives up ownership: the caller (a driver) frees it. The pool handle is released; the
    /// pool itself stays while the mbuf is in use (see the module's invariants).
    pub(crate) fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped or used again, so the handle is moved out just once.
        drop(unsafe { std::ptr::read(&this._keep) });
        this.ptr
    }

    /// Length of the frame in the first segment (`data_len`).
    pub fn len(&self) -> usize {
        // SAFETY: the mbuf is valid and ours while `self` lives.
        usize::from(unsafe { sys::rocemu_pktmbuf_data_len(self.ptr.as_ptr()) })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Length of the whole packet, every segment (`pkt_len`).
    pub fn pkt_len(&self) -> usize {
        // SAFETY: as for `len`.
        unsafe { sys::rocemu_pktmbuf_pkt_len(self.ptr.as_ptr()) as usize }
    }

    /// Segments in the chain (1 for every mbuf this crate makes).
    pub fn nb_segs(&self) -> u16 {
        // SAFETY: as for `len`.
        unsafe { sys::rocemu_pktmbuf_nb_segs(self.ptr.as_ptr()) }
    }

    /// The longest the first segment can be made with [`Mbuf::set_len`].
    pub fn capacity(&self) -> usize {
        // SAFETY: as for `len`.
        let tail = unsafe { sys::rocemu_pktmbuf_tailroom(self.ptr.as_ptr()) };
        self.len() + usize::from(tail)
    }

    /// Makes the frame `len` bytes long (data_len and pkt_len). Bytes past the old length hold
    /// whatever the buffer held before. Only for single-segment mbufs.
    ///
    /// # Panics
    /// When `len` exceeds [`Mbuf::capacity`] or the mbuf has more than one segment.
    pub fn set_len(&mut self, len: usize) {
        assert_eq!(self.nb_segs(), 1, "set_len on a multi-segment mbuf");
        assert!(
            len <= self.capacity(),
            "mbuf length {len} exceeds its capacity {}",
            self.capacity()
        );
        // SAFETY: a single-segment mbuf we own, and len fits in its buffer (checked above).
        unsafe { sys::rocemu_pktmbuf_set_len(self.ptr.as_ptr(), len as u16) };
    }
}

impl Deref for Mbuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the first segment's data_len bytes at its data pointer lie inside the mbuf's
        // buffer, which we own and which lives while `self` does; DPDK's memory is initialised.
        unsafe {
            let data = sys::rocemu_pktmbuf_data(self.ptr.as_ptr()) as *const u8;
            std::slice::from_raw_parts(data, self.len())
        }
    }
}

impl DerefMut for Mbuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` makes the access exclusive.
        unsafe {
            let data = sys::rocemu_pktmbuf_data(self.ptr.as_ptr()) as *mut u8;
            std::slice::from_raw_parts_mut(data, self.len())
        }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf (chain), and its pool lives (`_keep`).
        unsafe { sys::rocemu_pktmbuf_free(self.ptr.as_ptr()) };
    }
}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mbuf")
            .field("len", &self.len())
            .field("nb_segs", &self.nb_segs())
            .finish()
    }
}
