//! An AF_XDP socket with its UMEM and its four rings, memory-mapped from the kernel
//! (`Documentation/networking/af_xdp.rst`).
//!
//! The UMEM is one anonymous mapping of [`FRAME`]-byte chunks: the first [`RX_FRAMES`] go to
//! the fill ring (the kernel writes received frames into them and hands them back on the RX
//! ring; we give them back to the fill ring once the engine has read them), the rest are ours
//! to build frames in for the TX ring (the kernel hands them back on the completion ring once
//! sent).
//!
//! Each ring is single-producer single-consumer: a producer writes its entries, then publishes
//! its index with release ordering; a consumer reads the other side's index with acquire
//! ordering before it reads the entries, and publishes its own index with release ordering
//! once it is done with them (the barriers of libxdp's `xsk_ring_prod__submit` and
//! `xsk_ring_cons__release`). The indices are free-running 32-bit counters; a slot is the
//! index masked by the ring's size (a power of two).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

// <linux/if_xdp.h>.
const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
const XDP_COPY: u16 = 1 << 1;
const XDP_ZEROCOPY: u16 = 1 << 2;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;
/// What the kernel keeps in front of a received frame in its chunk (`XDP_PACKET_HEADROOM`).
pub(super) const HEADROOM: usize = 256;

/// The size of a UMEM chunk: one page, the kernel's aligned mode.
pub(super) const FRAME: usize = 4096;
/// Entries of each ring, and chunks for each direction.
pub(super) const RX_FRAMES: usize = 2048;
pub(super) const TX_FRAMES: usize = 2048;

#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// `struct xdp_desc`: a frame on the RX or TX ring.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

/// `struct xdp_statistics`.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub(super) struct XdpStats {
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    pub rx_ring_full: u64,
    pub rx_fill_ring_empty_descs: u64,
    pub tx_ring_empty_descs: u64,
}

/// One mapped ring; `T` is its entry (a UMEM address or a descriptor).
#[derive(Debug)]
struct Ring<T> {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut T,
    size: u32,
    /// Our own index (the producer's for fill and TX, the consumer's for RX and completion).
    local: u32,
}

// SAFETY: the ring is memory shared with the kernel only; the port that owns it moves between
// threads as a whole and is used by one at a time.
unsafe impl<T> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    fn map(fd: &OwnedFd, off: &RingOffset, size: u32, pgoff: libc::off_t) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: maps the kernel's ring of `fd` at its documented page offset, of the length
        // the kernel's offsets and our ring size give; checked before use.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = |o: u64| map.cast::<u8>().wrapping_add(o as usize);
        let mut r = Ring {
            map,
            map_len,
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            desc: at(off.desc).cast(),
            size,
            local: 0,
        };
        // Start where the kernel is (zero on a fresh socket).
        r.local = if pgoff == XDP_PGOFF_RX_RING || pgoff == XDP_UMEM_PGOFF_COMPLETION_RING {
            r.consumer().load(Ordering::Relaxed)
        } else {
            r.producer().load(Ordering::Relaxed)
        };
        Ok(r)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: the kernel's offsets place an aligned u32 inside the mapping, which lives as
        // long as `self`; the kernel changes it concurrently, hence the atomic.
        unsafe { &*self.producer }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: free slots.
    fn free(&self) -> u32 {
        self.size
            - self
                .local
                .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }
    /// Producer side: writes `v` at our next slot (not yet published; the caller checked
    /// [`free`](Self::free)).
    fn put(&mut self, v: T) {
        let i = (self.local & (self.size - 1)) as usize;
        // SAFETY: `i` < size, inside the mapped descriptor array; the slot is ours until the
        // producer index is published past it.
        unsafe { self.desc.add(i).write_volatile(v) };
        self.local = self.local.wrapping_add(1);
    }
    /// Producer side: publishes what [`put`](Self::put) wrote.
    fn submit(&self) {
        self.producer().store(self.local, Ordering::Release);
    }
    /// Producer side: entries published and not yet consumed by the kernel.
    fn outstanding(&self) -> u32 {
        self.local
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    /// Consumer side: entries ready.
    fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.local)
    }
    /// Consumer side: the entry `k` after our index (the caller checked [`ready`](Self::ready)).
    fn peek(&self, k: u32) -> T {
        let i = (self.local.wrapping_add(k) & (self.size - 1)) as usize;
        // SAFETY: `i` < size; the kernel published the slot (acquire in `ready`) and does not
        // touch it until we release it.
        unsafe { self.desc.add(i).read_volatile() }
    }
    /// Consumer side: gives `n` entries back to the kernel.
    fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        self.consumer().store(self.local, Ordering::Release);
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps our own mapping, whose pointers die with `self`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The socket, its UMEM and rings.
#[derive(Debug)]
pub(super) struct Xsk {
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<Desc>,
    tx: Ring<Desc>,
    umem: *mut u8,
    umem_len: usize,
    /// TX chunks of ours (not on the TX ring nor waiting for completion).
    tx_free: Vec<u64>,
    /// Bound in zero-copy mode (else copy).
    pub(super) zerocopy: bool,
    // Last: closed after the rings are unmapped.
    fd: OwnedFd,
}

// SAFETY: see `Ring`; the UMEM is ours and the kernel's only.
unsafe impl Send for Xsk {}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: our own anonymous mapping; the rings (and the socket that the kernel uses it
        // through) are gone or going, and nothing of ours points into it after `self`.
        // The kernel holds its own pin of the pages while the socket lives.
        unsafe { libc::munmap(self.umem.cast(), self.umem_len) };
    }
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` lives across the call and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt<T: Default>(fd: &OwnedFd, opt: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`, which lives across the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A step of the setup and what failed in it.
fn at(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Xsk {
    /// A socket on queue `queue` of interface `ifindex`: zero-copy where the driver can,
    /// else copy mode; the fill ring full of RX chunks.
    pub(super) fn open(ifindex: u32, queue: u32) -> io::Result<Xsk> {
        // SAFETY: plain system call; the result is checked before use.
        let raw = unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            let e = io::Error::last_os_error();
            let hint = match e.raw_os_error() {
                Some(libc::EAFNOSUPPORT) => " (a kernel without AF_XDP: CONFIG_XDP_SOCKETS)",
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    " (AF_XDP sockets need CAP_NET_RAW: run as root)"
                }
                _ => "",
            };
            return Err(io::Error::new(
                e.kind(),
                format!("socket(AF_XDP): {e}{hint}"),
            ));
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let umem_len = (RX_FRAMES + TX_FRAMES) * FRAME;
        // SAFETY: an anonymous private mapping of our own; checked before use.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(at("UMEM mmap")(io::Error::last_os_error()));
        }
        // Owned from here on, so that an error below unmaps it.
        struct Umem(*mut libc::c_void, usize);
        impl Drop for Umem {
            fn drop(&mut self) {
                // SAFETY: our own mapping, not handed out yet.
                unsafe { libc::munmap(self.0, self.1) };
            }
        }
        let guard = Umem(umem, umem_len);
        let reg = UmemReg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: FRAME as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(&fd, XDP_UMEM_REG, &reg).map_err(at("XDP_UMEM_REG"))?;
        let n = RX_FRAMES as u32;
        setsockopt(&fd, XDP_UMEM_FILL_RING, &n).map_err(at("XDP_UMEM_FILL_RING"))?;
        setsockopt(&fd, XDP_UMEM_COMPLETION_RING, &(TX_FRAMES as u32))
            .map_err(at("XDP_UMEM_COMPLETION_RING"))?;
        setsockopt(&fd, XDP_RX_RING, &n).map_err(at("XDP_RX_RING"))?;
        setsockopt(&fd, XDP_TX_RING, &(TX_FRAMES as u32)).map_err(at("XDP_TX_RING"))?;
        let off: MmapOffsets = getsockopt(&fd, XDP_MMAP_OFFSETS).map_err(at("XDP_MMAP_OFFSETS"))?;
        let mut fill = Ring::map(&fd, &off.fr, n, XDP_UMEM_PGOFF_FILL_RING)
            .map_err(at("mmap of the fill ring"))?;
        let comp = Ring::map(
            &fd,
            &off.cr,
            TX_FRAMES as u32,
            XDP_UMEM_PGOFF_COMPLETION_RING,
        )
        .map_err(at("mmap of the completion ring"))?;
        let rx =
            Ring::map(&fd, &off.rx, n, XDP_PGOFF_RX_RING).map_err(at("mmap of the RX ring"))?;
        let tx = Ring::map(&fd, &off.tx, TX_FRAMES as u32, XDP_PGOFF_TX_RING)
            .map_err(at("mmap of the TX ring"))?;
        for i in 0..RX_FRAMES {
            fill.put((i * FRAME) as u64);
        }
        fill.submit();

        let mut zerocopy = true;
        let mut r = Ok(());
        for mode in [XDP_ZEROCOPY, XDP_COPY] {
            let sa = SockaddrXdp {
                family: AF_XDP as u16,
                flags: mode | XDP_USE_NEED_WAKEUP,
                ifindex,
                queue_id: queue,
                shared_umem_fd: 0,
            };
            // SAFETY: `sa` is a valid sockaddr_xdp and its size is passed.
            let b = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&sa as *const SockaddrXdp).cast(),
                    std::mem::size_of::<SockaddrXdp>() as libc::socklen_t,
                )
            };
            r = if b == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
            if r.is_ok() {
                zerocopy = mode == XDP_ZEROCOPY;
                break;
            }
        }
        r.map_err(at("bind (copy mode)"))?;
        std::mem::forget(guard);
        Ok(Xsk {
            fill,
            comp,
            rx,
            tx,
            umem: umem.cast(),
            umem_len,
            tx_free: (RX_FRAMES..RX_FRAMES + TX_FRAMES)
                .map(|i| (i * FRAME) as u64)
                .collect(),
            zerocopy,
            fd,
        })
    }

    pub(super) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The kernel's counters of the socket.
    pub(super) fn kernel_stats(&self) -> XdpStats {
        getsockopt(&self.fd, XDP_STATISTICS).unwrap_or_default()
    }

    /// Hands up to `max` received frames to `f`, in their chunks, and gives the chunks back
    /// to the fill ring. Returns the frames and bytes read, and how many were malformed.
    pub(super) fn rx(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> (usize, u64, u64) {
        let n = self.rx.ready().min(max as u32);
        if n == 0 {
            if self.fill.needs_wakeup() {
                self.wake_rx();
            }
            return (0, 0, 0);
        }
        let (mut bytes, mut bad) = (0u64, 0u64);
        for k in 0..n {
            let d = self.rx.peek(k);
            let (addr, len) = (d.addr as usize, d.len as usize);
            if addr
                .checked_add(len)
                .is_some_and(|e| e <= RX_FRAMES * FRAME)
            {
                // SAFETY: the chunk is inside the UMEM's RX part (checked above), and the
                // kernel hands it to us alone until it is back on the fill ring.
                let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.add(addr), len) };
                f(frame);
                bytes += len as u64;
            } else {
                bad += 1;
            }
            // The fill ring has room: it holds every RX chunk, and this one is not on it.
            self.fill
                .put((addr & !(FRAME - 1)) as u64 % (RX_FRAMES * FRAME) as u64);
        }
        self.rx.release(n);
        self.fill.submit();
        (n as usize, bytes, bad)
    }

    fn wake_rx(&self) {
        // SAFETY: a zero-length receive only wakes the driver; no buffer is passed.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Takes back the chunks the kernel has sent.
    fn reclaim(&mut self) {
        let n = self.comp.ready();
        for k in 0..n {
            let a = self.comp.peek(k);
            self.tx_free.push(a & !(FRAME as u64 - 1));
        }
        if n > 0 {
            self.comp.release(n);
        }
    }

    /// Builds up to `max` frames of at most `cap` bytes with `fill` into TX chunks, puts them
    /// on the TX ring and tells the kernel. Returns the frames and bytes put on the ring.
    pub(super) fn tx(
        &mut self,
        max: usize,
        cap: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> (usize, u64) {
        self.reclaim();
        let room = (self.tx.free() as usize).min(self.tx_free.len()).min(max);
        let (mut n, mut bytes) = (0, 0u64);
        while n < room {
            let addr = self.tx_free.pop().expect("counted above");
            // SAFETY: a TX chunk of the UMEM (`cap` ≤ FRAME, checked at open) that is ours:
            // neither on the TX ring nor awaiting completion.
            let buf = unsafe { std::slice::from_raw_parts_mut(self.umem.add(addr as usize), cap) };
            let Some(len) = fill(buf) else {
                self.tx_free.push(addr);
                break;
            };
            let len = len.min(cap);
            self.tx.put(Desc {
                addr,
                len: len as u32,
                options: 0,
            });
            bytes += len as u64;
            n += 1;
        }
        if n > 0 {
            self.tx.submit();
        }
        self.push();
        (n, bytes)
    }

    /// Kicks while the kernel takes frames off the TX ring (copy mode takes at most 32 a
    /// call and says EAGAIN when more remain); stops when it is empty or a kick took nothing:
    /// the kernel refuses for now (a veth whose peer has not drained its queue), and
    /// [`Xsk::held`] says so until a later kick gets them through.
    fn push(&mut self) {
        let mut left = self.tx.outstanding();
        while left > 0 {
            self.kick();
            let now = self.tx.outstanding();
            if self.zerocopy || now >= left {
                break;
            }
            left = now;
        }
    }

    /// True while frames are on the TX ring that the kernel has not taken.
    pub(super) fn held(&self) -> bool {
        self.tx.outstanding() > 0
    }

    /// Asks the kernel to send what is on the TX ring (copy mode sends in the system call,
    /// 32 frames at a time; zero-copy only when the driver asked to be woken).
    fn kick(&self) {
        if self.zerocopy && !self.tx.needs_wakeup() {
            return;
        }
        // SAFETY: a zero-length send only wakes the kernel's transmit path; no buffer.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
    }

    /// Kicks the TX ring until the kernel has taken everything on it (a few tries); true when
    /// nothing remains.
    pub(super) fn flush(&mut self) -> bool {
        for _ in 0..64 {
            if self.tx.outstanding() == 0 {
                self.reclaim();
                return true;
            }
            self.kick();
        }
        self.reclaim();
        self.tx.outstanding() == 0
    }
}
