//! Ports move whole Ethernet frames in bursts.
//!
//! * `af_packet`: any Linux interface, through a packet socket.
//! * `af_xdp`: any Linux interface, through an AF_XDP socket beside the kernel (an XDP program
//!   redirects RoCEv2 to RoCEmu's addresses and passes the rest to the kernel).
//! * [`pipe`]: two ports joined in memory (tests of the engine).
//! * [`impair`]: seeded impairments on any port, for `--loss` and friends over real datapaths.
//! * [`open`]: a port from its spec string (`af_packet:IFACE`, `af_xdp:IFACE`, `dpdk:'EAL ARGS'`).
//! * DPDK (any PMD) lives in the `rocemu-dpdk` crate (`dpdk-glue/`), behind the cargo feature `dpdk`.
//!
//! A port lends its own buffers: received frames are handed out in place (in the mbuf, in the
//! ring slot) and frames to send are built directly into the buffer that goes to the driver, so
//! the datapath copies nothing. The callbacks are `dyn` so that the CLI can choose a port at run
//! time; one indirect call per frame is noise next to a CRC pass over it.
pub mod af_packet;
pub mod af_xdp;
pub mod impair;
pub mod open;
pub mod pipe;
pub mod steered;

use rocemu_wire::eth::Mac;
use std::fmt;
use std::os::fd::RawFd;

/// Frames in a burst, as DPDK's applications use (`rte_eth_rx_burst` with 32).
pub const BURST: usize = 32;

/// A port's failure: what went wrong, in words a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortError(pub String);

impl fmt::Display for PortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PortError {}

/// Counters a port keeps of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames the port had to drop (a full ring, a driver that refused them after retries).
    pub tx_dropped: u64,
    pub rx_dropped: u64,
    /// Times the link was seen going down (AF_PACKET: the kernel's ENETDOWN on the socket,
    /// which it reports once per NETDEV_DOWN; other ports do not watch the link).
    pub link_downed: u64,
}

impl PortStats {
    /// Every port counter with its name (`rocemu stats`: `port_` and the field), in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("port_rx_frames", self.rx_frames),
            ("port_rx_bytes", self.rx_bytes),
            ("port_tx_frames", self.tx_frames),
            ("port_tx_bytes", self.tx_bytes),
            ("port_tx_dropped", self.tx_dropped),
            ("port_rx_dropped", self.rx_dropped),
            ("port_link_downed", self.link_downed),
        ]
    }
}

/// Something that moves Ethernet frames (without the FCS).
pub trait Port {
    /// Receives up to `max` frames and calls `f` on each, in the port's own buffer (mutable so
    /// that the ICRC can be checked in place); the buffer goes back to the port when `f`
    /// returns. Returns how many frames were received.
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize;

    /// Sends up to `max` frames. `fill` is called with a buffer of at least
    /// [`Port::frame_capacity`] bytes and returns the length of the frame it wrote at the front,
    /// or `None` when it has nothing more to send. Returns how many frames were handed to the
    /// driver. A frame `fill` produced is not lost because the driver was busy: the port keeps
    /// it and sends it first next time.
    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize;

    /// Hands over frames the port still holds (a driver that was busy); true when none remain.
    fn flush(&mut self) -> bool {
        true
    }

    /// True while the port holds frames its driver refused (see [`Port::tx_burst`]). The
    /// engine then offers a burst every turn, so that they go as soon as the driver takes
    /// them rather than with the RNIC's next frame: an ACK or a retransmission held until a
    /// retransmit timer fires would cost the peer that timeout.
    fn tx_held(&self) -> bool {
        false
    }

    /// The port's MAC address.
    fn mac(&self) -> Mac;

    /// The largest frame it sends or receives, Ethernet header included (MTU + 18).
    fn frame_capacity(&self) -> usize;

    /// The interface MTU (IP packet size).
    fn mtu(&self) -> usize {
        self.frame_capacity() - 18
    }

    fn stats(&self) -> PortStats;

    /// `tx_dropped` and `link_downed` as [`Port::stats`] counts them, for the engine, which
    /// reads them every turn (they become the RNIC's `send_err` and `link_downed`). A port
    /// whose `stats` asks the kernel (a system call) answers here from what it counted itself.
    fn faults(&self) -> (u64, u64) {
        let s = self.stats();
        (s.tx_dropped, s.link_downed)
    }

    /// A name for messages (`af_packet:veth0`, `dpdk:net_memif0`).
    fn name(&self) -> String;

    /// Whether the link is up, where the port knows (a DPDK driver does: a memif with no peer
    /// is down); `None` (the default) where it does not. For messages: an address that goes
    /// unresolved on a port whose link is down says so.
    fn link_up(&self) -> Option<bool> {
        None
    }

    /// The file descriptors that `poll(2)` reports readable when a frame is waiting for
    /// [`Port::rx_burst`], so that an idle engine can sleep until one comes: a packet socket's
    /// own descriptor; an AF_XDP socket's and, beside it, the packet socket that reads ARP and
    /// neighbour discovery (an unused second entry is -1). The first is the one a port that
    /// holds refused frames becomes writable on. `None` (the default): the port has no such
    /// thing (a DPDK poll-mode driver, an in-memory pipe, a port that delays frames by turns)
    /// and an idle engine must poll it.
    ///
    /// The descriptors themselves, not an epoll set over them: the engine polls them only while
    /// it sleeps, whereas a socket in an epoll set has a sleeper on its wait queue all the
    /// time, and then every frame the kernel queues to it, and every transmitted frame it
    /// frees, takes the wait queue's lock and runs the epoll callback (on a veth, on the
    /// *peer's* core: 15 % of an AF_XDP sender's core, `docs/performance.md`).
    fn wait_fds(&self) -> Option<[RawFd; 2]> {
        None
    }

    /// True when frames through this port are dropped, delayed or altered on purpose
    /// ([`impair::ImpairedPort`] with some impairment): a caller may then have to wait for
    /// retransmissions it would not otherwise count on (the CM's end of a connection).
    fn impaired(&self) -> bool {
        false
    }
}
