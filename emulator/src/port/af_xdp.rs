//! A [`Port`] on a Linux interface through an AF_XDP socket, beside the kernel: an XDP program
//! on the interface (module `prog`) redirects the RoCEv2 datagrams to RoCEmu's addresses to the
//! socket and passes everything else to the kernel's stack, so SSH, ping and the out-of-band
//! TCP exchange keep working on the same interface.
//!
//! * Module `xsk`: the socket, its UMEM and its fill, completion, RX and TX rings, mapped from
//!   the kernel; received frames are read in their UMEM chunk and frames to send are built in
//!   theirs, in bursts. Zero-copy where the driver can, else copy mode (veth), with
//!   `XDP_USE_NEED_WAKEUP`.
//! * Module `prog`: the XDP program and its XSKMAP, attached natively where the driver can
//!   (veth does), else generic; held by a bpf link, so it goes with the port or the process.
//! * ARP and IPv6 neighbour discovery: both the kernel and the engine need them (the engine
//!   answers for its addresses and learns its peers' MACs from their replies, and RoCEmu may
//!   share an address with the kernel). XDP cannot clone a frame, so the program passes them
//!   and the port reads a copy through a packet socket (`af_packet`, with a filter that keeps
//!   only ARP and ND, memory-mapped: a look at its ring costs no system call). The engine's
//!   answers go out through the AF_XDP socket.
//!
//! One socket, on queue 0. An interface with several receive queues spreads frames over them;
//! the program redirects only those that arrive on queue 0 (a frame on another queue finds no
//! socket in the map and goes to the kernel, whose [`super::af_packet::KernelGuard`] drops
//! it), so such an interface must be set to one queue (`ethtool -L IFACE combined 1`) or steer
//! RoCEv2 to queue 0; the port says so when it opens one. A veth has one queue unless created
//! with more.
//!
//! `ROCEMU_AF_XDP_QUEUE=N` binds queue N instead.
#![allow(unsafe_code)]

use super::af_packet::{AfPacketOptions, AfPacketPort};
use super::{Port, PortError, PortStats};
use rocemu_wire::eth::Mac;
use std::ffi::CString;
use std::os::fd::{AsRawFd, RawFd};

mod prog;
mod xsk;

pub use prog::XdpMode;

/// An AF_XDP socket on one queue of an interface, and what it needs.
#[derive(Debug)]
pub struct AfXdpPort {
    // Dropped first: the program stops redirecting before the socket goes. A device's later
    // shard has none: its socket is in shard 0's map.
    redirect: Option<prog::Redirect>,
    xsk: xsk::Xsk,
    /// ARP and neighbour discovery, copied (see the module docs); shard 0's only.
    neighbours: Option<AfPacketPort>,
    mac: Mac,
    mtu: usize,
    cap: usize,
    ifname: String,
    queue: u32,
    stats: PortStats,
    /// Neighbour frames read through the packet socket.
    neighbour_frames: u64,
}

fn port_err(ifname: &str, e: impl std::fmt::Display) -> PortError {
    PortError(format!("af_xdp:{ifname}: {e}"))
}

/// The number of receive queues of `ifname` (`/sys/class/net/IFACE/queues/rx-*`); 1 when it
/// cannot be read.
fn rx_queues(ifname: &str) -> usize {
    std::fs::read_dir(format!("/sys/class/net/{ifname}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count()
                .max(1)
        })
        .unwrap_or(1)
}

impl AfXdpPort {
    /// Opens an AF_XDP socket on `ifname` (which must exist and be up) for the RoCEv2
    /// datagrams to `opts.addrs` (at least one), and attaches the XDP program that redirects
    /// them. Needs CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW (root).
    pub fn open(ifname: &str, opts: &AfPacketOptions) -> Result<AfXdpPort, PortError> {
        Self::open_with(ifname, opts, 1)
    }

    /// [`open`](Self::open), with room in the program's map for queues 0 to `queues` - 1.
    fn open_with(
        ifname: &str,
        opts: &AfPacketOptions,
        queues_wanted: usize,
    ) -> Result<AfXdpPort, PortError> {
        let cname = CString::new(ifname).map_err(|_| port_err(ifname, "not an interface name"))?;
        if ifname.is_empty() {
            return Err(port_err(ifname, "not an interface name"));
        }
        // SAFETY: `cname` is a NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(port_err(ifname, "no such interface"));
        }
        if opts.addrs.is_empty() {
            return Err(port_err(
                ifname,
                "no address to redirect RoCEv2 datagrams for",
            ));
        }
        let queue = match std::env::var("ROCEMU_AF_XDP_QUEUE") {
            Err(_) => 0,
            Ok(v) => v.parse::<u32>().map_err(|_| {
                port_err(
                    ifname,
                    format!("ROCEMU_AF_XDP_QUEUE={v}: give a queue number"),
                )
            })?,
        };
        let queues = rx_queues(ifname);
        if queues > 1 {
            tracing::warn!(
                port = ifname,
                queues,
                queue,
                "af_xdp: the interface has several receive queues and RoCEmu reads one: \
                 RoCEv2 frames hashed to another queue go to the kernel; set one queue \
                 (ethtool -L {ifname} combined 1) or steer UDP 4791 to queue {queue}"
            );
        }
        // The packet socket first: it checks the interface (and says what is wrong with it in
        // the words of af_packet), and it gives the MAC and the MTU.
        let neighbours = AfPacketPort::open_neighbour_copies(ifname, opts.promiscuous)
            .map_err(|e| port_err(ifname, format!("the packet socket for ARP and ND: {e}")))?;
        let cap = neighbours.mtu() + 18;
        if cap > xsk::FRAME - xsk::HEADROOM {
            return Err(port_err(
                ifname,
                format!(
                    "MTU {} is too large for a {}-byte UMEM chunk (at most {})",
                    neighbours.mtu(),
                    xsk::FRAME,
                    xsk::FRAME - xsk::HEADROOM - 18
                ),
            ));
        }
        let xsk = xsk::Xsk::open(ifindex, queue).map_err(|e| port_err(ifname, e))?;
        let redirect = prog::attach(ifindex, &opts.addrs, xsk.fd(), queue, queues_wanted as u32)
            .map_err(|e| port_err(ifname, e))?;
        tracing::debug!(
            port = ifname,
            queue,
            zerocopy = xsk.zerocopy,
            mode = ?redirect.mode,
            "af_xdp: socket bound, XDP program attached"
        );
        Ok(AfXdpPort {
            redirect: Some(redirect),
            xsk,
            mac: neighbours.mac(),
            mtu: neighbours.mtu(),
            cap: neighbours.frame_capacity(),
            neighbours: Some(neighbours),
            ifname: ifname.to_string(),
            queue,
            stats: PortStats::default(),
            neighbour_frames: 0,
        })
    }

    /// A device on `n` threads: a socket on each of queues 0 to n - 1 of `ifname` (which must
    /// have as many receive queues), the first as [`open`](Self::open) makes it (the XDP
    /// program, ARP and neighbour discovery) and the others in its map. A frame is read by
    /// the socket of the queue it arrives on, whichever shard has its QP: steer them
    /// (`port::steered`).
    pub fn open_shards(
        ifname: &str,
        opts: &AfPacketOptions,
        n: usize,
    ) -> Result<Vec<AfXdpPort>, PortError> {
        // (/sys shows the namespace it was mounted in: a thread that entered another with
        // setns(2) without remounting finds no such interface there, and binding finds out.)
        let queues =
            std::fs::metadata(format!("/sys/class/net/{ifname}")).map_or(n, |_| rx_queues(ifname));
        if queues < n {
            return Err(port_err(
                ifname,
                format!(
                    "{queues} receive queue(s), and {n} threads need a queue each \
                     (ethtool -L {ifname} combined {n}; a veth: numrxqueues {n} numtxqueues {n})"
                ),
            ));
        }
        if std::env::var("ROCEMU_AF_XDP_QUEUE").is_ok() {
            return Err(port_err(
                ifname,
                "ROCEMU_AF_XDP_QUEUE: a device on several threads uses queues 0 to N - 1",
            ));
        }
        let first = AfXdpPort::open_with(ifname, opts, n)?;
        let ifindex = {
            let cname = CString::new(ifname).map_err(|_| port_err(ifname, "not a name"))?;
            // SAFETY: `cname` is a NUL-terminated string that outlives the call.
            unsafe { libc::if_nametoindex(cname.as_ptr()) }
        };
        let mut ports = Vec::with_capacity(n);
        for q in 1..n as u32 {
            let xsk = xsk::Xsk::open(ifindex, q).map_err(|e| {
                port_err(
                    ifname,
                    format!("queue {q} of the {n} the threads need: {e}"),
                )
            })?;
            first
                .redirect
                .as_ref()
                .expect("shard 0 attached the program")
                .add(q, xsk.fd())
                .map_err(|e| port_err(ifname, e))?;
            ports.push(AfXdpPort {
                redirect: None,
                xsk,
                neighbours: None,
                mac: first.mac,
                mtu: first.mtu,
                cap: first.cap,
                ifname: ifname.to_string(),
                queue: q,
                stats: PortStats::default(),
                neighbour_frames: 0,
            });
        }
        ports.insert(0, first);
        Ok(ports)
    }

    /// True when the socket is bound in zero-copy mode (copy mode otherwise: veth).
    pub fn zerocopy(&self) -> bool {
        self.xsk.zerocopy
    }

    /// How the XDP program is attached (a later shard's socket: as shard 0's; reported as
    /// native).
    pub fn xdp_mode(&self) -> XdpMode {
        self.redirect.as_ref().map_or(XdpMode::Native, |r| r.mode)
    }

    /// The queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Frames read through the packet socket beside (ARP and neighbour discovery only).
    pub fn neighbour_frames(&self) -> u64 {
        self.neighbour_frames
    }
}

impl Port for AfXdpPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        let max = max.min(super::BURST);
        let (n, bytes, bad) = self.xsk.rx(max, f);
        self.stats.rx_frames += (n as u64) - bad;
        self.stats.rx_bytes += bytes;
        self.stats.rx_dropped += bad;
        let mut m = 0;
        if let Some(nb) = self.neighbours.as_mut().filter(|_| n < max) {
            m = nb.rx_burst(max - n, f);
            self.neighbour_frames += m as u64;
        }
        n + m
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        let max = max.min(super::BURST);
        let (n, bytes) = self.xsk.tx(max, self.frame_capacity(), fill);
        self.stats.tx_frames += n as u64;
        self.stats.tx_bytes += bytes;
        n
    }

    fn flush(&mut self) -> bool {
        self.xsk.flush()
    }

    fn tx_held(&self) -> bool {
        self.xsk.held()
    }

    fn mac(&self) -> Mac {
        self.mac
    }

    fn frame_capacity(&self) -> usize {
        self.cap
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    /// Ours, with the kernel's drops of the socket (a full RX ring, no chunk on the fill ring)
    /// and the packet socket's.
    fn stats(&self) -> PortStats {
        let k = self.xsk.kernel_stats();
        let side = self
            .neighbours
            .as_ref()
            .map(|n| n.stats())
            .unwrap_or_default();
        let mut s = self.stats;
        s.rx_frames += side.rx_frames;
        s.rx_bytes += side.rx_bytes;
        s.rx_dropped += side.rx_dropped + k.rx_dropped + k.rx_ring_full;
        s.tx_dropped += k.tx_invalid_descs;
        s.link_downed += side.link_downed;
        s
    }

    /// Without the kernel's counters: `stats` reads them with a `getsockopt`, too dear for
    /// every turn of the engine, and the one of them counted here (descriptors the kernel found
    /// invalid on the TX ring) is never expected (the port writes every descriptor itself).
    fn faults(&self) -> (u64, u64) {
        (
            self.stats.tx_dropped,
            self.neighbours
                .as_ref()
                .map_or(0, |n| n.stats().link_downed),
        )
    }

    fn name(&self) -> String {
        format!("af_xdp:{}", self.ifname)
    }

    /// The AF_XDP socket and the packet socket beside it (a later shard's: its socket alone).
    /// Polled only while the engine sleeps: in an epoll set, the socket would have a sleeper on
    /// its wait queue all the time (see [`Port::wait_fds`]).
    fn wait_fds(&self) -> Option<[RawFd; 2]> {
        let side = self
            .neighbours
            .as_ref()
            .and_then(|n| n.wait_fds())
            .map_or(-1, |f| f[0]);
        Some([self.xsk.fd().as_raw_fd(), side])
    }
}
