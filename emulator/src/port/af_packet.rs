//! A [`Port`] on any Linux interface through a packet socket (AF_PACKET, SOCK_RAW), with the
//! socket's memory-mapped rings (module `ring`: frames are read and written in place, and a
//! burst costs one system call, on transmit). Where the rings cannot be set up, or with
//! `ROCEMU_AF_PACKET=mmsg`, it moves bursts with `recvmmsg` / `sendmmsg` on buffers of its own.
//!
//! The kernel keeps its own view of the interface, and two of its habits matter to a RoCE
//! endpoint that shares the interface (and maybe its IP address) with it:
//!
//! * It sees the UDP datagrams to port 4791 too, and with nobody listening it would answer each
//!   with ICMP port unreachable. [`KernelGuard`] binds UDP sockets to port 4791 (with
//!   `SO_REUSEPORT`, so several RoCEmu processes coexist) whose tiny receive buffers overflow
//!   silently: the kernel then drops those datagrams without a word.
//! * It answers ARP and neighbour solicitations for addresses it owns; RoCEmu answers for its own
//!   addresses as well (the engine), with the same MAC when RoCEmu uses the interface's MAC.
//!
//! Our own transmissions are not looped back to us (`PACKET_IGNORE_OUTGOING`), and transmission
//! bypasses the qdisc layer (`PACKET_QDISC_BYPASS`), as a NIC driver's queue would.
//!
//! On a shared interface most frames are the kernel's (SSH, DNS, …). A classic BPF filter
//! ([`roce_filter`], `SO_ATTACH_FILTER`) lets through only what the RNIC and the engine read:
//! RoCEv2 (UDP 4791) to our addresses, ARP, and IPv6 neighbour solicitations and
//! advertisements. The socket is created with protocol 0, so it receives nothing until it is
//! bound, after the filter is attached; it is drained once after binding all the same.
#![allow(unsafe_code)]

use super::{Port, PortError, PortStats};
use rocemu_wire::eth::Mac;
use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

mod fanout;
mod ring;
pub(super) mod tcx;

pub use fanout::Fanout;

// From <linux/if_packet.h>; not all are in the libc crate.
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// Options for [`AfPacketPort::open`].
#[derive(Debug, Clone, Default)]
pub struct AfPacketOptions {
    /// Receive frames for every MAC (needed when RoCEmu uses a MAC other than the interface's).
    pub promiscuous: bool,
    /// The addresses whose RoCEv2 datagrams are read (UDP 4791 to one of them); empty: to any
    /// address (a test peer that watches everything a device sends).
    pub addrs: Vec<IpAddr>,
    /// One shard of a device on several threads: the socket's place in the device's fanout
    /// group ([`Fanout`]), which hands each frame to the shard that has its QP.
    pub fanout: Option<Fanout>,
}

// Classic BPF (<linux/bpf_common.h>, <linux/filter.h>).
const BPF_LD_W_ABS: u16 = 0x20; // ld  [k]         A = 32 bits at k
const BPF_LD_H_ABS: u16 = 0x28; // ldh [k]         A = 16 bits at k
const BPF_LD_B_ABS: u16 = 0x30; // ldb [k]         A = 8 bits at k
const BPF_LD_H_IND: u16 = 0x48; // ldh [x + k]     A = 16 bits at X + k
const BPF_LDX_B_MSH: u16 = 0xb1; // ldxb 4*([k]&0xf) X = the IPv4 header length at k
const BPF_JEQ_K: u16 = 0x15; // jeq #k          A == k ? jt : jf
const BPF_JSET_K: u16 = 0x45; // jset #k         A & k != 0 ? jt : jf
const BPF_RET_K: u16 = 0x06; // ret #k          keep k bytes of the frame (0: drop it)

/// Where a jump of the program goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum To {
    Next,
    L(String),
}

/// A classic BPF program with forward jumps to named labels, resolved by [`Bpf::finish`].
#[derive(Debug, Default)]
struct Bpf {
    ins: Vec<(u16, To, To, u32)>,
    labels: Vec<(String, usize)>,
}

impl Bpf {
    fn label(&mut self, name: &str) {
        self.labels.push((name.to_string(), self.ins.len()));
    }
    fn op(&mut self, code: u16, k: u32) {
        self.ins.push((code, To::Next, To::Next, k));
    }
    fn jump(&mut self, code: u16, k: u32, jt: To, jf: To) {
        self.ins.push((code, jt, jf, k));
    }
    fn finish(self) -> Result<Vec<libc::sock_filter>, String> {
        let at = |i: usize, t: &To| -> Result<u8, String> {
            let target = match t {
                To::Next => i + 1,
                To::L(l) => self
                    .labels
                    .iter()
                    .find(|(n, _)| n == l)
                    .map(|&(_, p)| p)
                    .ok_or_else(|| format!("BPF label {l} missing"))?,
            };
            target
                .checked_sub(i + 1)
                .and_then(|d| u8::try_from(d).ok())
                .ok_or_else(|| "too many addresses for the packet filter's jumps".to_string())
        };
        self.ins
            .iter()
            .enumerate()
            .map(|(i, (code, jt, jf, k))| {
                Ok(libc::sock_filter {
                    code: *code,
                    jt: at(i, jt)?,
                    jf: at(i, jf)?,
                    k: *k,
                })
            })
            .collect()
    }
}

/// The classic BPF program that keeps RoCEv2 to `addrs` (any address when empty), ARP and
/// IPv6 neighbour discovery, with or without one 802.1Q tag in the frame (the kernel usually
/// strips the tag before a packet socket sees the frame; one left in it is handled too), and
/// drops everything else. Loads past the end of a frame drop it (classic BPF's rule).
///
/// In tcpdump's terms, for one IPv4 address A and one IPv6 address B:
/// `arp or (udp dst port 4791 and (dst host A or dst host B) and not ip[6:2] & 0x1fff != 0)
///  or (ip6 and ip6[6] == 58 and (ip6[40] == 135 or ip6[40] == 136))`, and the same after
/// `vlan`; IPv6 only without extension headers (next header UDP or ICMPv6 directly).
pub fn roce_filter(addrs: &[IpAddr]) -> Result<Vec<libc::sock_filter>, String> {
    let l = |s: &str| To::L(s.to_string());
    let mut p = Bpf::default();
    p.op(BPF_LD_H_ABS, 12); // A = EtherType
    p.jump(BPF_JEQ_K, 0x8100, l("tagged"), To::Next); // an 802.1Q tag in the frame?
    body(&mut p, 14, addrs); // untagged: the network header at 14
    p.label("tagged");
    p.op(BPF_LD_H_ABS, 16); // A = the EtherType after the tag
    body(&mut p, 18, addrs); // tagged: the network header at 18
    p.label("accept");
    p.op(BPF_RET_K, 0x0004_0000); // keep the whole frame
    p.label("reject");
    p.op(BPF_RET_K, 0); // drop it
    p.finish()
}

/// The classic BPF program that keeps only ARP and IPv6 neighbour solicitations and
/// advertisements (untagged, no extension headers): the copies that the AF_XDP port reads
/// beside its XDP socket, which takes the RoCEv2 datagrams (`port::af_xdp`).
fn neighbour_filter() -> Result<Vec<libc::sock_filter>, String> {
    let (accept, reject) = (To::L("accept".into()), To::L("reject".into()));
    let mut p = Bpf::default();
    p.op(BPF_LD_H_ABS, 12); // A = EtherType
    p.jump(BPF_JEQ_K, 0x0806, accept.clone(), To::Next); // ARP
    p.jump(BPF_JEQ_K, 0x86dd, To::Next, reject.clone()); // IPv6, or nothing we read
    p.op(BPF_LD_B_ABS, 14 + 6); // A = IPv6 next header
    p.jump(BPF_JEQ_K, 58, To::Next, reject.clone()); // ICMPv6
    p.op(BPF_LD_B_ABS, 14 + 40); // A = ICMPv6 type
    p.jump(BPF_JEQ_K, 135, accept.clone(), To::Next); // neighbour solicitation
    p.jump(BPF_JEQ_K, 136, accept, reject); // neighbour advertisement, or not ND
    p.label("accept");
    p.op(BPF_RET_K, 0x0004_0000);
    p.label("reject");
    p.op(BPF_RET_K, 0);
    p.finish()
}

/// The checks after the EtherType (in A), for a network header at `base`.
fn body(p: &mut Bpf, base: u32, addrs: &[IpAddr]) {
    let here = |s: &str| format!("{s}{base}");
    let l = |s: &str| To::L(here(s));
    let (accept, reject) = (To::L("accept".into()), To::L("reject".into()));
    p.jump(BPF_JEQ_K, 0x0806, accept.clone(), To::Next); // ARP: the engine answers it
    p.jump(BPF_JEQ_K, 0x0800, l("v4"), To::Next); // IPv4
    p.jump(BPF_JEQ_K, 0x86dd, l("v6"), reject.clone()); // IPv6, or nothing we read

    p.label(&here("v4"));
    p.op(BPF_LD_B_ABS, base + 9); // A = IPv4 protocol
    p.jump(BPF_JEQ_K, 17, To::Next, reject.clone()); // UDP
    p.op(BPF_LD_H_ABS, base + 6); // A = flags and fragment offset
    p.jump(BPF_JSET_K, 0x1fff, reject.clone(), To::Next); // a later fragment: no UDP header
    p.op(BPF_LDX_B_MSH, base); // X = IPv4 header length (IHL × 4: options honoured)
    p.op(BPF_LD_H_IND, base + 2); // A = UDP destination port
    p.jump(BPF_JEQ_K, 4791, To::Next, reject.clone()); // RoCEv2
    let v4: Vec<u32> = addrs
        .iter()
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(u32::from(*a)),
            IpAddr::V6(_) => None,
        })
        .collect();
    if addrs.is_empty() {
        p.jump(BPF_JEQ_K, 0, reject.clone(), accept.clone()); // (A is 4791): to any address
    } else {
        p.op(BPF_LD_W_ABS, base + 16); // A = IPv4 destination
        for a in &v4 {
            p.jump(BPF_JEQ_K, *a, accept.clone(), To::Next); // one of ours
        }
        p.jump(BPF_JEQ_K, 0, reject.clone(), reject.clone()); // none of ours
    }

    p.label(&here("v6"));
    p.op(BPF_LD_B_ABS, base + 6); // A = IPv6 next header
    p.jump(BPF_JEQ_K, 58, l("icmp6"), To::Next); // ICMPv6
    p.jump(BPF_JEQ_K, 17, To::Next, reject.clone()); // UDP, directly after the fixed header
    p.op(BPF_LD_H_ABS, base + 40 + 2); // A = UDP destination port
    p.jump(BPF_JEQ_K, 4791, To::Next, reject.clone()); // RoCEv2
    let v6: Vec<[u8; 16]> = addrs
        .iter()
        .filter_map(|a| match a {
            IpAddr::V6(a) => Some(a.octets()),
            IpAddr::V4(_) => None,
        })
        .collect();
    if addrs.is_empty() {
        p.jump(BPF_JEQ_K, 0, reject.clone(), accept.clone()); // (A is 4791): to any address
    } else {
        for (i, a) in v6.iter().enumerate() {
            let next = here(&format!("v6addr{i}-"));
            for w in 0..4 {
                let word = u32::from_be_bytes(a[w * 4..w * 4 + 4].try_into().expect("4 bytes"));
                p.op(BPF_LD_W_ABS, base + 24 + 4 * w as u32); // A = destination word w
                let on = if w == 3 { accept.clone() } else { To::Next };
                p.jump(BPF_JEQ_K, word, on, To::L(next.clone())); // equal to ours?
            }
            p.label(&next);
        }
        p.jump(BPF_JEQ_K, 0, reject.clone(), reject.clone()); // none of ours
    }

    p.label(&here("icmp6"));
    p.op(BPF_LD_B_ABS, base + 40); // A = ICMPv6 type
    p.jump(BPF_JEQ_K, 135, accept.clone(), To::Next); // neighbour solicitation
    p.jump(BPF_JEQ_K, 136, accept, reject); // neighbour advertisement, or not ND
}

/// A packet socket bound to one interface.
#[derive(Debug)]
pub struct AfPacketPort {
    fd: OwnedFd,
    ifname: String,
    mac: Mac,
    /// The largest IP packet it carries: the interface's MTU, at most `ring::MAX_IP_PACKET`.
    mtu: usize,
    cap: usize,
    io: Io,
    /// Drops at the interface's ingress the datagrams the socket has read (module `tcx`).
    ingress: Option<tcx::IngressDrop>,
    /// The fanout group the socket is in, for a device on several threads.
    fanout_id: Option<u16>,
    stats: PortStats,
}

/// How frames move between the socket and us.
#[derive(Debug)]
enum Io {
    /// The memory-mapped rings (the default).
    Rings(ring::Rings),
    /// `recvmmsg` / `sendmmsg` on our own buffers: where the rings cannot be set up, or with
    /// `ROCEMU_AF_PACKET=mmsg` (to compare).
    Mmsg(Mmsg),
}

/// The buffers of the system-call path.
#[derive(Debug)]
struct Mmsg {
    /// Receive buffers, one per frame of a burst.
    rx_bufs: Vec<Vec<u8>>,
    /// Transmit buffers; `tx_len[i]` bytes of `tx_bufs[i]` are a frame.
    tx_bufs: Vec<Vec<u8>>,
    tx_len: Vec<usize>,
    /// Frames `tx_bufs[tx_head..tx_count]` are built but not yet accepted by the kernel.
    tx_head: usize,
    tx_count: usize,
}

/// Which path `ROCEMU_AF_PACKET` asks for: `mmsg`, or the rings (unset or `ring`).
fn want_rings() -> Result<bool, String> {
    match std::env::var("ROCEMU_AF_PACKET") {
        Err(_) => Ok(true),
        Ok(v) if v == "ring" || v.is_empty() => Ok(true),
        Ok(v) if v == "mmsg" => Ok(false),
        Ok(v) => Err(format!(
            "ROCEMU_AF_PACKET={v}: give ring (memory-mapped rings, the default) or mmsg"
        )),
    }
}

fn os_err(what: &str, ifname: &str) -> PortError {
    let e = io::Error::last_os_error();
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => " (packet sockets need root or CAP_NET_RAW)",
        Some(libc::ENODEV) => " (no such interface)",
        _ => "",
    };
    PortError(format!("af_packet:{ifname}: {what}: {e}{hint}"))
}

fn setsockopt_int(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> bool {
    setsockopt(fd, level, opt, &v).is_ok()
}

/// Sets option `opt` at `level` of the socket `fd` to `v`, a value of the type the option takes
/// (the kernel reads `size_of::<T>()` bytes of it, and checks the size).
fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `fd` is an open socket; `v` lives across the call and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
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

/// An `ifreq` naming `ifname`, for the SIOCGIF* ioctls.
fn ifreq_for(ifname: &str) -> Result<libc::ifreq, PortError> {
    let bytes = ifname.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(PortError(format!(
            "af_packet:{ifname}: not a valid interface name"
        )));
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(ifr)
}

/// Attaches the classic BPF program `prog` to the socket `fd` (the kernel checks it first).
fn attach_filter(fd: &OwnedFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // `fprog` points at `prog`, which outlives the call (the kernel copies it).
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// Reads and drops what is queued on `fd`: a frame that came in before the filter held (none
/// should, the socket being bound after the filter is attached). Bounded: a busy link cannot
/// keep it reading.
fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 64];
    let mut n = 0;
    // SAFETY: reads into `b` within its length; MSG_DONTWAIT never blocks, MSG_TRUNC drops
    // the rest of a longer frame.
    while unsafe {
        libc::recv(
            fd.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    } >= 0
        && n < 4096
    {
        n += 1;
    }
}

impl AfPacketPort {
    /// Opens a packet socket on `ifname` (which must exist and be up).
    pub fn open(ifname: &str, opts: &AfPacketOptions) -> Result<AfPacketPort, PortError> {
        Self::open_with(ifname, opts, false)
    }

    /// A packet socket that reads only ARP and IPv6 neighbour discovery (`neighbour_filter`),
    /// with no ingress program: the AF_XDP port's copy of what the kernel's stack also needs.
    pub(super) fn open_neighbour_copies(
        ifname: &str,
        promiscuous: bool,
    ) -> Result<AfPacketPort, PortError> {
        let opts = AfPacketOptions {
            promiscuous,
            addrs: Vec::new(),
            fanout: None,
        };
        Self::open_with(ifname, &opts, true)
    }

    fn open_with(
        ifname: &str,
        opts: &AfPacketOptions,
        neighbours_only: bool,
    ) -> Result<AfPacketPort, PortError> {
        let cname = CString::new(ifname)
            .map_err(|_| PortError(format!("af_packet:{ifname}: not a valid interface name")))?;
        // SAFETY: `cname` is a NUL-terminated string that outlives the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(os_err("if_nametoindex", ifname));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // Protocol 0: no frame is queued to the socket before `bind` names ETH_P_ALL, after
        // the filter is attached.
        // SAFETY: plain system call; the result is checked before use.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(os_err("socket(AF_PACKET)", ifname));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // Before bind, so that no frame of ours is ever queued back to us (kernel 4.20+; on an
        // older kernel the engine still ignores frames from its own MAC).
        setsockopt_int(&fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
        setsockopt_int(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1);
        // Room for bursts: 4 MiB each way (FORCE works as root beyond rmem_max).
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if !setsockopt_int(&fd, libc::SOL_SOCKET, force, 4 << 20) {
                setsockopt_int(&fd, libc::SOL_SOCKET, plain, 4 << 20);
            }
        }

        let prog = if neighbours_only {
            neighbour_filter()
        } else {
            roce_filter(&opts.addrs)
        }
        .map_err(|e| PortError(format!("af_packet:{ifname}: {e}")))?;
        if attach_filter(&fd, &prog).is_err() {
            return Err(os_err("SO_ATTACH_FILTER (the RoCE packet filter)", ifname));
        }

        // SAFETY: sockaddr_ll is plain old data; all zeroes is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and its size is passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(os_err("bind", ifname));
        }
        let fanout_id = match &opts.fanout {
            Some(f) => Some(
                fanout::join(&fd, f).map_err(|e| PortError(format!("af_packet:{ifname}: {e}")))?,
            ),
            None => None,
        };
        drain(&fd);

        // Multicast (IPv6 neighbour discovery), or everything.
        // SAFETY: packet_mreq is plain old data; all zeroes is a valid value.
        let mut mreq: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mreq.mr_ifindex = ifindex as i32;
        mreq.mr_type = if opts.promiscuous {
            libc::PACKET_MR_PROMISC
        } else {
            libc::PACKET_MR_ALLMULTI
        } as u16;
        if setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq).is_err() {
            return Err(os_err("PACKET_ADD_MEMBERSHIP", ifname));
        }

        let mut ifr = ifreq_for(ifname)?;
        // SAFETY: SIOCGIFHWADDR fills `ifr.ifr_ifru.ifru_hwaddr`; `ifr` is a valid ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut ifr) } != 0 {
            return Err(os_err("SIOCGIFHWADDR", ifname));
        }
        // SAFETY: the ioctl succeeded, so the hwaddr member is the one written.
        let hw = unsafe { ifr.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
            *d = *s as u8;
        }
        let mut ifr = ifreq_for(ifname)?;
        // SAFETY: SIOCGIFMTU fills `ifr.ifr_ifru.ifru_mtu`; `ifr` is a valid ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut ifr) } != 0 {
            return Err(os_err("SIOCGIFMTU", ifname));
        }
        // SAFETY: the ioctl succeeded, so the mtu member is the one written.
        let mtu = unsafe { ifr.ifr_ifru.ifru_mtu }.max(68) as usize;
        // The frames the RNIC sends and takes are RoCEv2 packets of at most a 4096-byte path
        // MTU: buffers and ring slots are sized for those even on an interface with a larger
        // MTU (`lo`: 65536), which would otherwise leave few slots (ring::MAX_IP_PACKET).
        let held = mtu.min(ring::MAX_IP_PACKET);
        // Ethernet header, an 802.1Q tag and slack for offloads that hand up a little more.
        let cap = held + 18;
        let rings = want_rings().map_err(PortError)?;
        let io = match rings.then(|| ring::Rings::setup(&fd, held)) {
            Some(Ok(r)) => {
                // What came in between the bind and the rings went to the socket's queue.
                drain(&fd);
                tracing::debug!(
                    port = ifname,
                    slots = ?r.slots(),
                    "af_packet: memory-mapped rings"
                );
                Io::Rings(r)
            }
            other => {
                if let Some(Err(e)) = other {
                    tracing::warn!(
                        port = ifname,
                        error = %e,
                        "af_packet: no memory-mapped rings; recvmmsg/sendmmsg instead"
                    );
                }
                let rx_cap = held + 64;
                Io::Mmsg(Mmsg {
                    rx_bufs: (0..super::BURST).map(|_| vec![0u8; rx_cap]).collect(),
                    tx_bufs: (0..super::BURST).map(|_| vec![0u8; cap]).collect(),
                    tx_len: vec![0; super::BURST],
                    tx_head: 0,
                    tx_count: 0,
                })
            }
        };
        // ROCEMU_AF_PACKET_TCX=0 leaves the kernel's IP stack to see every datagram (to
        // compare).
        // A device's later shards leave the ingress drop to its first.
        let ingress = if neighbours_only
            || matches!(opts.fanout, Some(Fanout::Join(_)))
            || std::env::var("ROCEMU_AF_PACKET_TCX").is_ok_and(|v| v == "0")
        {
            None
        } else {
            match tcx::attach(ifindex, &opts.addrs) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::debug!(
                        port = ifname,
                        error = %e,
                        "af_packet: no ingress drop; the kernel's IP stack sees RoCE datagrams too"
                    );
                    None
                }
            }
        };
        Ok(AfPacketPort {
            fd,
            ifname: ifname.to_string(),
            mac: Mac(mac),
            mtu: held,
            cap,
            io,
            ingress,
            fanout_id,
            stats: PortStats::default(),
        })
    }

    /// Puts the socket in a device's fanout group (see [`AfPacketOptions::fanout`]) after it was
    /// opened: shard 0's port, whose RNIC (and so the program's keys) needed the port's MAC
    /// and MTU first. Returns the group's id.
    pub fn join_fanout(&mut self, f: &Fanout) -> Result<u16, PortError> {
        if self.fanout_id.is_some() {
            return Err(PortError(format!(
                "af_packet:{}: already in a fanout group",
                self.ifname
            )));
        }
        let id = fanout::join(&self.fd, f)
            .map_err(|e| PortError(format!("af_packet:{}: {e}", self.ifname)))?;
        self.fanout_id = Some(id);
        Ok(id)
    }

    /// The id of the fanout group the socket is in (see [`AfPacketOptions::fanout`]): what the
    /// device's later shards join.
    pub fn fanout_group(&self) -> Option<u16> {
        self.fanout_id
    }

    /// True when the kernel's IP stack is spared the RoCEv2 datagrams to our addresses (an
    /// eBPF program on the interface's tcx ingress drops them after the socket read them).
    pub fn drops_at_ingress(&self) -> bool {
        self.ingress.is_some()
    }

    /// True when frames move through the memory-mapped rings (not `recvmmsg` / `sendmmsg`).
    pub fn uses_rings(&self) -> bool {
        matches!(self.io, Io::Rings(_))
    }
}

impl Mmsg {
    /// Hands frames `tx_head..tx_count` to the kernel; true when all were taken.
    fn send_pending(&mut self, fd: &OwnedFd, stats: &mut PortStats) -> bool {
        let mut tries = 0;
        while self.tx_head < self.tx_count {
            let n = self.tx_count - self.tx_head;
            let mut iov: [libc::iovec; super::BURST] =
                // SAFETY: iovec is plain old data; all zeroes is a valid value.
                unsafe { std::mem::zeroed() };
            // SAFETY: as above, for mmsghdr.
            let mut msgs: [libc::mmsghdr; super::BURST] = unsafe { std::mem::zeroed() };
            for i in 0..n {
                let b = &mut self.tx_bufs[self.tx_head + i];
                iov[i].iov_base = b.as_mut_ptr().cast();
                iov[i].iov_len = self.tx_len[self.tx_head + i];
                msgs[i].msg_hdr.msg_iov = &mut iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at live buffers of the stated
            // lengths; all outlive the call. The socket is bound, so no address is needed.
            let r = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for i in 0..r as usize {
                    stats.tx_frames += 1;
                    stats.tx_bytes += self.tx_len[self.tx_head + i] as u64;
                }
                self.tx_head += r as usize;
                tries = 0;
                continue;
            }
            let e = io::Error::last_os_error().raw_os_error();
            match e {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) if tries < 3 => {
                    tries += 1;
                    continue;
                }
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return false,
                _ => {
                    // The frame at the head is refused for good (too long for the interface,
                    // the interface went down): drop it, so that one bad frame cannot wedge
                    // the port.
                    stats.tx_dropped += 1;
                    self.tx_head += 1;
                }
            }
        }
        self.tx_head = 0;
        self.tx_count = 0;
        true
    }

    fn rx(
        &mut self,
        fd: &OwnedFd,
        max: usize,
        f: &mut dyn FnMut(&mut [u8]),
        stats: &mut PortStats,
    ) -> usize {
        let max = max.min(super::BURST);
        // SAFETY: iovec is plain old data; all zeroes is a valid value.
        let mut iov: [libc::iovec; super::BURST] = unsafe { std::mem::zeroed() };
        // SAFETY: as above, for mmsghdr.
        let mut msgs: [libc::mmsghdr; super::BURST] = unsafe { std::mem::zeroed() };
        for i in 0..max {
            iov[i].iov_base = self.rx_bufs[i].as_mut_ptr().cast();
            iov[i].iov_len = self.rx_bufs[i].len();
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..max]` point at `iov[..max]`, which point at our own receive buffers
        // of the stated lengths; all outlive the call. MSG_DONTWAIT: never blocks.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                max as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r <= 0 {
            // The kernel sets ENETDOWN on every packet socket bound to an interface that goes
            // down (packet_notifier, NETDEV_DOWN in net/packet/af_packet.c) and reports it to
            // the next call once.
            if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENETDOWN) {
                stats.link_downed += 1;
            }
            return 0;
        }
        let r = r as usize;
        for (i, m) in msgs.iter().enumerate().take(r) {
            let len = m.msg_len as usize;
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > self.rx_bufs[i].len() {
                stats.rx_dropped += 1;
                continue;
            }
            stats.rx_frames += 1;
            stats.rx_bytes += len as u64;
            f(&mut self.rx_bufs[i][..len]);
        }
        r
    }

    fn tx(
        &mut self,
        fd: &OwnedFd,
        cap: usize,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
        stats: &mut PortStats,
    ) -> usize {
        // Frames the kernel refused last time go first; nothing new is built until they are
        // gone, so a busy interface pushes back on the RNIC instead of losing frames.
        if !self.send_pending(fd, stats) {
            return 0;
        }
        let max = max.min(super::BURST);
        let mut n = 0;
        while n < max {
            let Some(len) = fill(&mut self.tx_bufs[n][..cap]) else {
                break;
            };
            self.tx_len[n] = len.min(cap);
            n += 1;
        }
        self.tx_head = 0;
        self.tx_count = n;
        let before = stats.tx_frames;
        self.send_pending(fd, stats);
        (stats.tx_frames - before) as usize
    }
}

impl Port for AfPacketPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        let max = max.min(super::BURST);
        match &mut self.io {
            Io::Rings(r) => r.rx(&self.fd, max, f, &mut self.stats),
            Io::Mmsg(m) => m.rx(&self.fd, max, f, &mut self.stats),
        }
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        let max = max.min(super::BURST);
        match &mut self.io {
            Io::Rings(r) => r.tx(&self.fd, max, fill, &mut self.stats),
            Io::Mmsg(m) => m.tx(&self.fd, self.cap, max, fill, &mut self.stats),
        }
    }

    fn flush(&mut self) -> bool {
        match &mut self.io {
            Io::Rings(r) => r.kick(&self.fd, &mut self.stats),
            Io::Mmsg(m) => m.send_pending(&self.fd, &mut self.stats),
        }
    }

    fn tx_held(&self) -> bool {
        match &self.io {
            Io::Rings(r) => r.held(),
            Io::Mmsg(m) => m.tx_head < m.tx_count,
        }
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

    fn stats(&self) -> PortStats {
        self.stats
    }

    fn name(&self) -> String {
        format!("af_packet:{}", self.ifname)
    }

    /// The socket itself: readable when a frame that passed the filter is queued.
    fn wait_fds(&self) -> Option<[std::os::fd::RawFd; 2]> {
        Some([self.fd.as_raw_fd(), -1])
    }
}

/// Keeps the kernel from answering RoCEv2 datagrams to its own addresses with ICMP port
/// unreachable, for as long as it lives (see the module docs).
#[derive(Debug)]
pub struct KernelGuard {
    _sockets: Vec<std::net::UdpSocket>,
}

impl KernelGuard {
    /// Binds UDP port 4791 on every address, IPv4 and IPv6, where it can. A port already bound
    /// by someone else (a kernel RDMA driver, another program) needs no guard.
    pub fn new() -> KernelGuard {
        let mut v = Vec::new();
        for (domain, addr) in [
            (libc::AF_INET, "0.0.0.0:4791"),
            (libc::AF_INET6, "[::]:4791"),
        ] {
            if let Some(s) = Self::bind(domain, addr.parse().expect("literal address")) {
                v.push(s);
            }
        }
        KernelGuard { _sockets: v }
    }

    fn bind(domain: libc::c_int, addr: std::net::SocketAddr) -> Option<std::net::UdpSocket> {
        // SAFETY: plain system call; the result is checked before use.
        let raw = unsafe { libc::socket(domain, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1);
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
        // The smallest buffer the kernel allows: it fills at once and the rest is dropped.
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 1);
        if domain == libc::AF_INET6 {
            setsockopt_int(&fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1);
        }
        let s = std::net::UdpSocket::from(fd);
        // std's bind would need a fresh socket; use the raw one through a sockaddr.
        let (sa, len) = sockaddr_of(addr);
        // SAFETY: `sa` holds a valid sockaddr of `len` bytes for the socket's family.
        let r = unsafe {
            libc::bind(
                s.as_raw_fd(),
                (&sa as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        (r == 0).then_some(s)
    }
}

impl Default for KernelGuard {
    fn default() -> Self {
        KernelGuard::new()
    }
}

fn sockaddr_of(a: std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        std::net::SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        std::net::SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as u16;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            (
                ss,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_socket() -> OwnedFd {
        // SAFETY: plain system call; checked before use.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(raw) }
    }

    /// The kernel's checker accepts the program, for every shape of address list (a UDP
    /// socket takes the same SO_ATTACH_FILTER as a packet socket, without root); a program it
    /// refuses is an error, not ignored.
    #[test]
    fn the_kernel_loads_the_filter_and_refuses_a_broken_one() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        for addrs in [
            vec![],
            vec![v4],
            vec![v6],
            vec![v4, v6, "10.0.0.2".parse().unwrap()],
        ] {
            let p = roce_filter(&addrs).unwrap();
            attach_filter(&udp_socket(), &p).unwrap_or_else(|e| panic!("{addrs:?}: {e}"));
        }
        attach_filter(&udp_socket(), &neighbour_filter().unwrap()).unwrap();
        let mut p = roce_filter(&[v4]).unwrap();
        p[1].jt = 250; // past the end of the program
        let e = attach_filter(&udp_socket(), &p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
    }
}
