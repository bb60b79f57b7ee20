//! The packet socket's memory-mapped rings (PACKET_MMAP, `TPACKET_V2`): one receive ring and one
//! transmit ring shared with the kernel, so that a burst costs no system call on receive and one
//! on transmit (the kick), and no copy between the kernel's buffers and ours.
//!
//! Each ring is an array of fixed-size slots; a slot starts with a `tpacket2_hdr` whose
//! `tp_status` says who owns it:
//!
//! * receive: the kernel writes a frame and sets `TP_STATUS_USER`; we read it in place and hand
//!   the slot back with `TP_STATUS_KERNEL`.
//! * transmit: we write a frame at [`TX_DATA`] and set `TP_STATUS_SEND_REQUEST`; `send(2)` (the
//!   kick) makes the kernel send every requested slot in ring order, from its own head; when the
//!   frame has left (its skb is freed) the kernel sets `TP_STATUS_AVAILABLE` again.
//!
//! Both sides walk their ring in the same order, so we only ever look at our next slot.
//!
//! Why version 2 and not 3: `TPACKET_V3` hands frames to user space a block at a time, and a
//! block that is not full is handed over only when its timer (`tp_retire_blk_tov`, at least a
//! millisecond) expires: a ping-pong would wait a millisecond per message. libpcap's immediate
//! mode uses `TPACKET_V2` for that reason (snort3/libdaq's `modules/pcap/README.pcap.md`), Open
//! vSwitch removed its V3 path for its latency, and DPDK's `net_af_packet` uses V2 both ways.
#![allow(unsafe_code)]

use super::super::PortStats;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where a transmitted frame's virtio-net header starts in its slot (the frame follows it): the
/// header's aligned size (`TPACKET2_HDRLEN` less the `sockaddr_ll` that only the receive side
/// has), as `tpacket_snd` reads it without `PACKET_TX_HAS_OFF`.
const TX_DATA: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();

/// The virtio-net header before each frame (`struct virtio_net_hdr`, `PACKET_VNET_HDR`).
const VNET: usize = 10;

/// Where the kernel puts a received frame's network header: the header and its `sockaddr_ll`,
/// then at least 16 bytes for the link header, aligned, then the virtio-net header
/// (`tpacket_rcv`'s `netoff`). The frame itself starts 14 bytes (Ethernet) before it.
const RX_NET: usize = ((libc::TPACKET2_HDRLEN + 16 + 15) & !15) + VNET;

/// Bytes of each ring: the receive ring holds about 8 MiB of frames (the old socket buffer was
/// 4 MiB each way; a slot of a small frame takes a whole slot), the transmit ring 2 MiB.
const RX_RING_BYTES: usize = 8 << 20;
const TX_RING_BYTES: usize = 2 << 20;
/// A block is the unit the kernel allocates (contiguous pages); slots do not cross blocks.
const BLOCK: usize = 1 << 17;
/// The largest IP packet the rings' slots are sized for: a RoCEv2 packet of the largest path
/// MTU (4096 bytes of payload) with every header it can carry (IPv6, UDP, BTH, AtomicETH or
/// RETH, ImmDt, ICRC: under 120 bytes), with room to spare. The socket's filter passes only
/// RoCEv2 and neighbour traffic, so nothing longer is for the RNIC; a longer frame is dropped
/// and counted as a frame cut short. Sizing slots by a larger interface MTU left `lo` (MTU
/// 65536) 64 receive slots of 64 KiB: two drop-in processes pinned to one core overflowed the
/// ring with one round of `ibv_srq_pingpong`'s 16 QPs, and a lost final ACK with the peer gone
/// failed the run ("transport retry counter exceeded", about 1 run in 30).
pub(super) const MAX_IP_PACKET: usize = 4096 + 256;

/// Empty receive bursts between two reads of the socket's pending error (`SO_ERROR`): the
/// kernel reports a link going down there (ENETDOWN, once per NETDEV_DOWN) and `poll(2)` says
/// POLLERR until it is read. Frequent enough that a downed link is seen within a few turns,
/// rare enough to cost nothing while the ring is busy.
const ERR_CHECK_EVERY: u32 = 64;

/// One ring's shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Offset of the ring in the mapping.
    at: usize,
    frame: usize,
    block: usize,
    frames: usize,
}

impl Shape {
    /// Slots of `frame` bytes (at least `min_frame`, aligned to 16) in blocks, about `bytes` in
    /// all.
    fn new(at: usize, min_frame: usize, bytes: usize) -> Shape {
        let frame = (min_frame + 15) & !15;
        let block = BLOCK.max(frame.next_power_of_two());
        let blocks = (bytes / block).max(4);
        Shape {
            at,
            frame,
            block,
            frames: (block / frame) * blocks,
        }
    }
    fn blocks(&self) -> usize {
        self.frames / (self.block / self.frame)
    }
    fn bytes(&self) -> usize {
        self.blocks() * self.block
    }
    /// The offset of slot `i` in the mapping (slots never straddle a block).
    fn slot(&self, i: usize) -> usize {
        let per = self.block / self.frame;
        self.at + (i / per) * self.block + (i % per) * self.frame
    }
    fn req(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block as libc::c_uint,
            tp_block_nr: self.blocks() as libc::c_uint,
            tp_frame_size: self.frame as libc::c_uint,
            tp_frame_nr: self.frames as libc::c_uint,
        }
    }
}

/// The two rings of one packet socket, mapped.
#[derive(Debug)]
pub(super) struct Rings {
    map: *mut u8,
    map_len: usize,
    rx: Shape,
    tx: Shape,
    rx_next: usize,
    tx_next: usize,
    /// The largest frame a transmit slot holds (the interface's MTU + 18, as the socket path).
    tx_cap: usize,
    /// Slots requested but not yet taken by the kernel (a kick it refused for now).
    tx_waiting: bool,
    /// The kernel said it dropped frames (the receive ring was full): read its count.
    losing: bool,
    empty_turns: u32,
}

// SAFETY: the mapping belongs to this value alone (the socket's descriptor is owned by the port
// that owns it); moving it to another thread moves the only access to it.
unsafe impl Send for Rings {}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: `map` / `map_len` are the mapping made in `setup`, unmapped only here.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

fn set<T>(fd: &OwnedFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    super::setsockopt(fd, libc::SOL_PACKET, opt, v)
}

/// The `tp_status` word at the start of a slot, shared with the kernel.
///
/// # Safety
/// `slot` is the start of a slot of a live mapping (16-byte aligned).
unsafe fn status<'a>(slot: *mut u8) -> &'a AtomicU32 {
    // SAFETY: the caller's promise; tp_status is the header's first field, and the kernel
    // accesses it as a 32-bit word with barriers around it.
    unsafe { &*slot.cast::<AtomicU32>() }
}

impl Rings {
    /// Sets `TPACKET_V2`, both rings and maps them. `mtu` sizes the slots. On failure the
    /// socket is left as it was (no ring, no virtio-net header), for the system-call path.
    pub(super) fn setup(fd: &OwnedFd, mtu: usize) -> io::Result<Rings> {
        Self::try_setup(fd, mtu).inspect_err(|_| {
            // SAFETY: tpacket_req is plain old data; all zeroes asks the kernel to free a ring.
            let none: libc::tpacket_req = unsafe { std::mem::zeroed() };
            let _ = set(fd, libc::PACKET_TX_RING, &none);
            let _ = set(fd, libc::PACKET_RX_RING, &none);
            let _ = set(fd, libc::PACKET_VNET_HDR, &(0 as libc::c_int));
        })
    }

    fn try_setup(fd: &OwnedFd, mtu: usize) -> io::Result<Rings> {
        debug_assert!(
            mtu <= MAX_IP_PACKET,
            "the port clamps what it gives the rings"
        );
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        set(fd, libc::PACKET_VERSION, &version)?;
        // A malformed frame (longer than the interface takes) is dropped and its slot freed,
        // instead of stopping the ring at it (TP_STATUS_WRONG_FORMAT).
        set(fd, libc::PACKET_LOSS, &(1 as libc::c_int))?;
        // A virtio-net header before each frame both ways, so that each transmitted frame can
        // say "copy all of me into the packet's linear buffer" (its `hdr_len`). Without it the
        // kernel copies only the Ethernet header and attaches the rest of the slot as pages of
        // the ring, which any path that hands the packet on (a veth, a bridge, the kernel's own
        // receive) must then copy again, page by page (`skb_copy_ubufs`).
        set(fd, libc::PACKET_VNET_HDR, &(1 as libc::c_int))?;
        // Room for the Ethernet header, an 802.1Q tag and slack for offloads that hand up a
        // little more, as the socket path's receive buffers.
        let rx = Shape::new(0, RX_NET - 14 + mtu + 64, RX_RING_BYTES);
        let tx_cap = mtu + 18;
        let tx = Shape::new(rx.bytes(), TX_DATA + VNET + tx_cap, TX_RING_BYTES);
        set(fd, libc::PACKET_RX_RING, &rx.req())?;
        set(fd, libc::PACKET_TX_RING, &tx.req())?;
        let map_len = rx.bytes() + tx.bytes();
        // SAFETY: maps the socket's rings (receive first, then transmit, as the kernel lays
        // them out); the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        let map = if map == libc::MAP_FAILED {
            // MAP_LOCKED may exceed RLIMIT_MEMLOCK for a user with CAP_NET_RAW only.
            // SAFETY: as above, without locking the pages.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            m
        } else {
            map
        };
        Ok(Rings {
            map: map.cast(),
            map_len,
            rx,
            tx,
            rx_next: 0,
            tx_next: 0,
            tx_cap,
            tx_waiting: false,
            losing: false,
            empty_turns: 0,
        })
    }

    /// The slots of each ring (for messages and tests).
    pub(super) fn slots(&self) -> (usize, usize) {
        (self.rx.frames, self.tx.frames)
    }

    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.map_len);
        // SAFETY: `off` is a slot offset inside the mapping (Shape::slot of an index below
        // `frames`).
        unsafe { self.map.add(off) }
    }

    /// Up to `max` received frames, each handed to `f` in its slot and then given back.
    pub(super) fn rx(
        &mut self,
        fd: &OwnedFd,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]),
        stats: &mut PortStats,
    ) -> usize {
        let mut n = 0;
        while n < max {
            let slot = self.at(self.rx.slot(self.rx_next));
            // SAFETY: `slot` starts a receive slot.
            let st = unsafe { status(slot) };
            let s = st.load(Ordering::Acquire);
            if s & libc::TP_STATUS_USER == 0 {
                break;
            }
            if s & libc::TP_STATUS_LOSING != 0 {
                self.losing = true;
            }
            let h = slot.cast::<libc::tpacket2_hdr>();
            // SAFETY: the slot is ours until its status is given back (the Acquire load above
            // orders these reads after the kernel's writes); the header is plain integers.
            let (mac, snap, len) = unsafe {
                (
                    usize::from(std::ptr::addr_of!((*h).tp_mac).read()),
                    std::ptr::addr_of!((*h).tp_snaplen).read() as usize,
                    std::ptr::addr_of!((*h).tp_len).read() as usize,
                )
            };
            // A frame cut short by the slot (longer than any the interface should carry), or
            // a header that does not fit its slot, is dropped, never read past.
            if snap < len || mac < libc::TPACKET2_HDRLEN || mac + snap > self.rx.frame {
                stats.rx_dropped += 1;
            } else {
                stats.rx_frames += 1;
                stats.rx_bytes += len as u64;
                // SAFETY: `mac..mac + snap` lies within the slot (checked above), which is ours.
                f(unsafe { std::slice::from_raw_parts_mut(slot.add(mac), snap) });
            }
            st.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.rx_next = (self.rx_next + 1) % self.rx.frames;
            n += 1;
        }
        if n > 0 {
            self.empty_turns = 0;
        } else {
            self.empty_turns += 1;
            if self.empty_turns >= ERR_CHECK_EVERY {
                self.empty_turns = 0;
                if pending_error(fd) == Some(libc::ENETDOWN) {
                    stats.link_downed += 1;
                }
            }
        }
        if self.losing {
            self.losing = false;
            stats.rx_dropped += u64::from(kernel_drops(fd));
        }
        n
    }

    /// Builds up to `max` frames with `fill` in free transmit slots and kicks the kernel.
    /// Returns how many were queued: a full ring (frames still leaving) pushes back.
    pub(super) fn tx(
        &mut self,
        fd: &OwnedFd,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        stats: &mut PortStats,
    ) -> usize {
        let mut n = 0;
        while n < max {
            let slot = self.at(self.tx.slot(self.tx_next));
            // SAFETY: `slot` starts a transmit slot.
            let st = unsafe { status(slot) };
            if st.load(Ordering::Acquire) != libc::TP_STATUS_AVAILABLE {
                break;
            }
            // SAFETY: the slot is ours while AVAILABLE; TX_DATA + VNET + tx_cap fits it
            // (Shape::new).
            let buf =
                unsafe { std::slice::from_raw_parts_mut(slot.add(TX_DATA + VNET), self.tx_cap) };
            let Some(len) = fill(buf) else {
                break;
            };
            let len = len.min(self.tx_cap);
            if len > self.tx_cap - 4 && !vlan_tagged(&buf[..len]) {
                // Longer than the interface carries (MTU + 14 without a VLAN tag). With a
                // virtio-net header the kernel no longer checks that (it would take the frame
                // for a GSO packet), so the port refuses it, as the kernel does a `send` of it:
                // dropped and counted, the slot used for the next.
                stats.tx_dropped += 1;
                continue;
            }
            let h = slot.cast::<libc::tpacket2_hdr>();
            // The virtio-net header: flags 0, GSO none, `hdr_len` the whole frame (at most
            // what its 16 bits hold), the rest 0. Little-endian: a packet socket's virtio-net
            // header is the legacy layout in the machine's byte order, and every machine
            // RoCEmu builds for is little-endian.
            let mut vnet = [0u8; VNET];
            vnet[2..4].copy_from_slice(&(len.min(usize::from(u16::MAX)) as u16).to_le_bytes());
            // SAFETY: as above; the Release store below publishes both with the frame.
            unsafe {
                std::ptr::copy_nonoverlapping(vnet.as_ptr(), slot.add(TX_DATA), VNET);
                std::ptr::addr_of_mut!((*h).tp_len).write((VNET + len) as u32);
            }
            st.store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
            stats.tx_frames += 1;
            stats.tx_bytes += len as u64;
            self.tx_next = (self.tx_next + 1) % self.tx.frames;
            self.tx_waiting = true;
            n += 1;
        }
        if self.tx_waiting {
            self.kick(fd, stats);
        }
        n
    }

    /// True while slots are requested that the kernel has not sent (it refused the last kick).
    pub(super) fn held(&self) -> bool {
        self.tx_waiting
    }

    /// Asks the kernel to send the requested slots; true when none is left waiting.
    pub(super) fn kick(&mut self, fd: &OwnedFd, stats: &mut PortStats) -> bool {
        if !self.tx_waiting {
            return true;
        }
        loop {
            // SAFETY: a send without data: the kernel takes the frames from the ring.
            let r = unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r >= 0 {
                break;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // Socket buffer full or the driver busy: the slots stay requested and go with
                // the next kick.
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => break,
                _ => {
                    // Refused for good (the interface went down): the requested frames are
                    // dropped, so that a dead link cannot wedge the ring.
                    self.reclaim(stats);
                    break;
                }
            }
        }
        let last = self.at(self
            .tx
            .slot((self.tx_next + self.tx.frames - 1) % self.tx.frames));
        // SAFETY: `last` starts a transmit slot. The kernel sends in ring order, so the slot
        // before our next one is the last requested: when it is no longer waiting, none is.
        self.tx_waiting =
            unsafe { status(last) }.load(Ordering::Acquire) == libc::TP_STATUS_SEND_REQUEST;
        !self.tx_waiting
    }

    /// Takes back the slots still requested (the kernel has not looked at them: its head is the
    /// oldest of them), counting each as dropped, and rewinds to the oldest, where the kernel's
    /// head is.
    fn reclaim(&mut self, stats: &mut PortStats) {
        for _ in 0..self.tx.frames {
            let prev = (self.tx_next + self.tx.frames - 1) % self.tx.frames;
            let slot = self.at(self.tx.slot(prev));
            // SAFETY: `slot` starts a transmit slot.
            let st = unsafe { status(slot) };
            if st.load(Ordering::Acquire) != libc::TP_STATUS_SEND_REQUEST {
                break;
            }
            // SAFETY: a requested slot the kernel has not taken; its header is ours to read.
            let len =
                unsafe { std::ptr::addr_of!((*slot.cast::<libc::tpacket2_hdr>()).tp_len).read() };
            st.store(libc::TP_STATUS_AVAILABLE, Ordering::Release);
            stats.tx_frames -= 1;
            stats.tx_bytes -= u64::from(len) - VNET as u64;
            stats.tx_dropped += 1;
            self.tx_next = prev;
        }
        self.tx_waiting = false;
    }
}

/// True when `frame` carries an 802.1Q or 802.1ad tag (the kernel's `packet_extra_vlan_len_allowed`
/// lets such a frame be 4 bytes longer).
fn vlan_tagged(frame: &[u8]) -> bool {
    matches!(frame.get(12..14), Some([0x81, 0x00]) | Some([0x88, 0xa8]))
}

/// The socket's pending error, read and cleared (`SO_ERROR`).
fn pending_error(fd: &OwnedFd) -> Option<i32> {
    let mut e: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `e` and `len` are valid for the option's int.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut e as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0 && e != 0).then_some(e)
}

/// Frames the kernel dropped for a full receive ring since the last read (`PACKET_STATISTICS`
/// resets its counts when read).
fn kernel_drops(fd: &OwnedFd) -> u32 {
    let mut s = libc::tpacket_stats {
        tp_packets: 0,
        tp_drops: 0,
    };
    let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: `s` and `len` are valid for the option's struct.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut s as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if r == 0 {
        s.tp_drops
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots never straddle a block, the ring is a whole number of blocks, and a slot holds the
    /// largest frame: for the MTUs users run (1500, jumbo 9000, the 64 KiB of loopback), as the
    /// port clamps them ([`MAX_IP_PACKET`]); the receive ring keeps at least 1,500 slots.
    #[test]
    fn slots_fit_their_blocks_and_the_largest_frame() {
        for mtu in [68, 1500, 4200, 9000, 65535] {
            let mtu = mtu.min(MAX_IP_PACKET);
            let rx = Shape::new(0, RX_NET - 14 + mtu + 64, RX_RING_BYTES);
            let tx = Shape::new(rx.bytes(), TX_DATA + VNET + mtu + 18, TX_RING_BYTES);
            for s in [rx, tx] {
                assert_eq!(s.frame % 16, 0, "{mtu}");
                assert_eq!(s.block % 4096, 0, "{mtu}");
                assert!(s.block >= s.frame, "{mtu}");
                assert_eq!(s.frames % (s.block / s.frame), 0, "{mtu}");
                assert!(s.blocks() >= 4, "{mtu}");
                let last = s.slot(s.frames - 1);
                assert!(last + s.frame <= s.at + s.bytes(), "{mtu}");
                for i in 0..s.frames {
                    let o = s.slot(i) - s.at;
                    assert_eq!(o / s.block, (o + s.frame - 1) / s.block, "{mtu}: slot {i}");
                }
            }
            // The receive slot holds the frame the socket path held (MTU + 64) after the
            // kernel's offset; the transmit slot the MTU + 18 the port promises.
            assert!(rx.frame - (RX_NET - 14) >= mtu + 64, "{mtu}");
            assert!(tx.frame - TX_DATA - VNET >= mtu + 18, "{mtu}");
            assert_eq!(tx.at, rx.bytes());
            assert!(rx.frames >= 1500, "{mtu}: {} receive slots", rx.frames);
        }
        assert_eq!(TX_DATA, 32);
        assert_eq!(RX_NET, 90);
    }
}
