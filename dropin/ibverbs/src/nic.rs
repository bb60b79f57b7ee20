//! The device and its RNIC: configuration from the environment, the `ibv_device` that
//! `ibv_get_device_list` lists, and the one RNIC per process, started at the first
//! `ibv_open_device` and shared by every context opened on it (with `ROCEMU_THREADS=N`, one
//! device of N shards: see below).
//!
//! Configuration: `ROCEMU_DEV` (`af_packet:IFACE`, `af_xdp:IFACE`, or `dpdk:'EAL ARGS'` with the feature `dpdk`),
//! `ROCEMU_IP` (the address: GID index 1), `ROCEMU_MAC` (default: the interface's),
//! `ROCEMU_NAME` (default `rocemu0`), and `ROCEMU_IDLE` for what the engine thread does when
//! idle: by default it sleeps until a frame, a verb's doorbell or a timer wakes it
//! ([`IdleStrategy::Wake`]; on a port with no descriptor to sleep on, DPDK's, it backs off);
//! `busy` spins, `backoff` polls with backoff (for comparison). `ROCEMU_LOSS`, `ROCEMU_REORDER`,
//! `ROCEMU_DUPLICATE`, `ROCEMU_CORRUPT` (probabilities, 0…1) wrap the datapath in seeded
//! impairments of every frame both ways (`ImpairedPort`), seeded by `ROCEMU_SEED` (default 1),
//! which also seeds the RNIC's keys, QPNs, PSNs and CM IDs (default: from the operating system;
//! see `impair.rs`). `rocemu exec` sets them. `ROCEMU_LOG` (or `RUST_LOG`) turns on the RNIC's
//! logs on stderr, filtered as `RUST_LOG` filters (`rocemu_emulator::logs`). Without `ROCEMU_DEV` the list is
//! empty and one line on stderr says how to configure; a bad value is one clear line and no
//! device. The device answers `rocemu stats` on a socket named after `ROCEMU_NAME` (see
//! `rocemu_emulator::stats`), removed when the program exits.
//!
//! `ROCEMU_THREADS=N` (`rocemu exec --threads N`) runs the device on N engine threads, as
//! `rocemu perf --threads N`: N shards, each an RNIC (`RnicConfig::shard`) with its own lock,
//! engine and port — AF_PACKET sockets in one fanout group, AF_XDP's socket of queue k, or DPDK's
//! rx/tx queue k (`open_datapath_shards`) — the program unchanged. A QP lives in one shard
//! (dealt out in turn, or the shard of its SRQ; its QPN says which, [`Nic::shard_of`]) and its
//! verbs take that shard's lock alone; PDs, MRs and CQs have a copy in every shard (an MR under
//! the keys shard 0 gave it; created, destroyed and armed under every shard's lock, taken in
//! shard order), so that `ibv_poll_cq` reads each shard's copy in turn and a completion channel
//! hears one event per `ibv_req_notify_cq` (`verbs::Cq::armed`). Shard 0 answers ARP and
//! neighbour discovery and runs rdma_cm's QP1; a device of one shard is what it always was.
//!
//! The engine thread turns the engine (`Engine::poll`) with the RNIC's lock held for one turn at
//! a time, and between turns answers what the verbs cannot do without the port: asking a
//! peer's MAC (ARP / neighbour discovery, for `modify_qp` to RTR and `create_ah`), and handing
//! completion and asynchronous events to their file descriptors. Verbs take the same lock; a
//! verb waiting for it makes the engine thread step aside before its next turn (`waiting`), so
//! that a thread polling a CQ is not starved by a spinning engine.
//!
//! Doorbell: every verb but `ibv_poll_cq` takes a shard's lock through [`Nic::lock_shard`] (or
//! [`Nic::lock`], shard 0's; [`Nic::lock_qp`]; [`Nic::lock_all`]), whose guard
//! rings the engine's [`Doorbell`] when it is released (one atomic load while the engine is
//! awake): what the verb gave the RNIC (a send or receive posted, a QP moved to RTS, a CQ
//! armed) is served at once rather than when the engine's nap ends.
//!
//! Invariant: a shard's RNIC is only touched with its `inner` locked; every object pointer kept
//! in a shard's `Inner` maps is a live object of ours (inserted at create, removed at destroy,
//! both under the lock); more than one shard's lock is taken only in shard order.
use crate::abi::*;
use crate::ffi::copy_cstr;
#[cfg(feature = "dpdk")]
use rocemu_dpdk::{open_boxed as open_dpdk, open_queues_boxed as open_dpdk_queues};
use rocemu_emulator::engine::{Doorbell, Engine, IdleStrategy};
use rocemu_emulator::port::impair::ImpairedPort;
use rocemu_emulator::port::open::{open_datapath, open_datapath_shards, OpenedPort, ShardPorts};
use rocemu_emulator::port::Port;
use rocemu_emulator::rng::Seed;
use rocemu_emulator::rnic::cc::{CcAlgo, CcConfig};
use rocemu_emulator::rnic::{
    AsyncEvent, CqId, Mac, QpnSteering, Rnic, RnicConfig, Shard, Wc, MAX_SHARDS,
};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// GIDs per port: 0 the link-local IPv6 address from the MAC, 1 the configured address.
pub const GID_TBL_LEN: u32 = 2;
/// How long a verb waits for a peer's MAC.
const RESOLVE: Duration = Duration::from_secs(5);
/// How long `ibv_destroy_qp` and the program's exit wait for queued responses to leave: a
/// burst's worth of frames leaves in microseconds; a QP whose responses cannot leave (no
/// route, the port refusing) holds its program no longer than this.
const DRAIN: Duration = Duration::from_millis(50);
/// At exit on a DPDK port: how long after the last frame sent the port stays up. A frame
/// handed to a process-bound virtual device (net_memif's shared ring) is gone with the process
/// unless the peer has read it: ibv_ud_pingpong's server sent its last reply, saw its
/// completion and exited, and the client waited for that reply until killed (one run in four of
/// the memif rows). The kernel keeps what AF_PACKET and AF_XDP hand it; a NIC sends what is on
/// its ring whatever its process does.
const LINGER: Duration = Duration::from_millis(50);
/// Vendor id: an OUI with the locally administered bit set (0x52 = 0101 0010b), which the IEEE
/// never assigns, so no table of known devices (perftest's) has it.
pub const VENDOR_ID: u32 = 0x52_4f_45;

/// What the environment says.
#[derive(Debug, Clone)]
pub struct Config {
    /// `ROCEMU_LOSS`, `ROCEMU_REORDER`, `ROCEMU_DUPLICATE`, `ROCEMU_CORRUPT`, `ROCEMU_SEED`.
    pub impair: crate::impair::Impair,
    pub name: String,
    pub dev: String,
    pub ip: IpAddr,
    pub mac: Option<Mac>,
    /// The MAC as far as it is known before the port opens (ROCEMU_MAC, or the interface's):
    /// for the node GUID of an unopened device.
    pub known_mac: Option<Mac>,
    /// `ROCEMU_ECN`, `ROCEMU_CC`, `ROCEMU_CC_PARAMS`, on the port's line rate.
    pub cc: CcConfig,
    /// `ROCEMU_THREADS`: the polling threads the device runs on (1 by default).
    pub threads: usize,
}

const HOW: &str = "rocemu: no device: set ROCEMU_DEV=af_packet:IFACE and ROCEMU_IP=ADDR, \
                   or run the program under `rocemu exec`";

fn read_config() -> Result<Config, String> {
    let dev = std::env::var("ROCEMU_DEV").map_err(|_| HOW.to_string())?;
    let ip_s = std::env::var("ROCEMU_IP").map_err(|_| {
        format!("rocemu: ROCEMU_DEV={dev} but no ROCEMU_IP: set ROCEMU_IP=ADDR (this end's address); no device")
    })?;
    let ip: IpAddr = ip_s
        .parse()
        .map_err(|_| format!("rocemu: ROCEMU_IP={ip_s}: not an IPv4 or IPv6 address; no device"))?;
    let mac = match std::env::var("ROCEMU_MAC") {
        Ok(m) => Some(
            m.parse::<Mac>()
                .map_err(|e| format!("rocemu: ROCEMU_MAC={m}: {e}; no device"))?,
        ),
        Err(_) => None,
    };
    if let Some(m) = mac {
        if m == Mac([0; 6]) || m.is_multicast() {
            return Err(format!(
                "rocemu: ROCEMU_MAC={m} cannot be a unicast source; no device"
            ));
        }
    }
    let name = std::env::var("ROCEMU_NAME").unwrap_or_else(|_| "rocemu0".into());
    if name.is_empty() || name.len() >= IBV_SYSFS_NAME_MAX || name.contains('/') {
        return Err(format!(
            "rocemu: ROCEMU_NAME={name}: a device name is 1 to 63 characters without '/'; no device"
        ));
    }
    let known_mac = if let Some(ifname) = rocemu_emulator::port::open::kernel_iface(&dev) {
        let sys = format!("/sys/class/net/{ifname}/address");
        let a = std::fs::read_to_string(&sys).map_err(|_| {
            format!("rocemu: ROCEMU_DEV={dev}: no network interface {ifname:?}; no device")
        })?;
        mac.or(a.trim().parse().ok())
    } else if dev.starts_with("dpdk:") {
        if cfg!(feature = "dpdk") {
            mac.or_else(|| vdev_mac(&dev))
        } else {
            return Err(format!(
                "rocemu: ROCEMU_DEV={dev}: this libibverbs was built without DPDK; no device"
            ));
        }
    } else {
        return Err(format!(
            "rocemu: ROCEMU_DEV={dev}: give af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'; no device"
        ));
    };
    let cc = cc_from_env(&dev, |k| std::env::var(k).ok())?;
    let impair = crate::impair::from_env()?;
    let threads = threads_from_env(std::env::var("ROCEMU_THREADS").ok(), &impair)?;
    Ok(Config {
        cc,
        threads,
        impair,
        name,
        dev,
        ip,
        mac,
        known_mac,
    })
}

/// `ROCEMU_THREADS=N`: the device on N polling threads (1 to [`MAX_SHARDS`]), as `rocemu
/// perf --threads N`; not with impairments (each thread's port would need its own).
fn threads_from_env(v: Option<String>, impair: &crate::impair::Impair) -> Result<usize, String> {
    let Some(v) = v.filter(|v| !v.is_empty()) else {
        return Ok(1);
    };
    let n = v
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_SHARDS).contains(n))
        .ok_or_else(|| {
            format!(
                "rocemu: ROCEMU_THREADS={v}: a number of threads from 1 to {MAX_SHARDS}; no device"
            )
        })?;
    if n > 1 && !impair.imp.is_none() {
        return Err(format!(
            "rocemu: ROCEMU_THREADS={v} with impairments: each thread's port would need its own; no device"
        ));
    }
    Ok(n)
}

/// Congestion control from the environment, as `rocemu exec` hands it on: `ROCEMU_ECN=1`
/// (ECT(0) on every packet), `ROCEMU_CC=dcqcn|timely|none` (dcqcn implies ECN) and
/// `ROCEMU_CC_PARAMS=name=value,...` (mlx5's DCQCN names, `timely_*`, `line_rate`,
/// `pacing_burst`). A bad value is a configuration error: no device.
fn cc_from_env(dev: &str, get: impl Fn(&str) -> Option<String>) -> Result<CcConfig, String> {
    let mut c = CcConfig::default();
    if let Some(l) = rocemu_emulator::port::open::line_rate_mbps(dev) {
        c.line_rate_mbps = l;
    }
    if let Some(v) = get("ROCEMU_CC").filter(|v| !v.is_empty()) {
        c.algo = v
            .parse()
            .map_err(|e| format!("rocemu: ROCEMU_CC={v}: {e}; no device"))?;
    }
    c.ecn = match get("ROCEMU_ECN").as_deref() {
        None | Some("") | Some("0") => false,
        Some("1") => true,
        Some(v) => return Err(format!("rocemu: ROCEMU_ECN={v}: 1 or 0; no device")),
    } || c.algo == CcAlgo::Dcqcn;
    if let Some(v) = get("ROCEMU_CC_PARAMS") {
        c.set_list(&v)
            .map_err(|e| format!("rocemu: ROCEMU_CC_PARAMS={v}: {e}; no device"))?;
    }
    Ok(c)
}

/// The MAC a DPDK virtual device is given in its arguments (`--vdev=net_memif0,…,mac=…`, as
/// net_memif and net_tap take it), if one is: known before the port opens. The last `mac=`
/// wins; one that is not a unicast MAC (net_tap's `mac=fixed`) is not known.
fn vdev_mac(eal_args: &str) -> Option<Mac> {
    eal_args
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|kv| kv.strip_prefix("mac="))
        .next_back()
        .and_then(|m| m.parse::<Mac>().ok())
        .filter(|m| *m != Mac([0; 6]) && !m.is_multicast())
}

/// The configuration, read once; `None` (said once on stderr) when there is none or it is bad.
pub fn config() -> Option<&'static Config> {
    static CFG: OnceLock<Option<Config>> = OnceLock::new();
    CFG.get_or_init(|| match read_config() {
        Ok(c) => Some(c),
        Err(msg) => {
            eprintln!("{msg}");
            None
        }
    })
    .as_ref()
}

/// Our `ibv_device`, with the `verbs_device` words after it that provider libraries read.
#[repr(C)]
pub struct Device {
    pub vd: verbs_device,
}

/// The device, made once (its address is what `ibv_get_device_list` hands out, for good).
pub fn device() -> Option<*mut ibv_device> {
    static DEV: OnceLock<Option<usize>> = OnceLock::new();
    let p = DEV.get_or_init(|| {
        let cfg = config()?;
        // SAFETY: verbs_device is plain data (integers, arrays, pointers): all zeroes is a
        // valid value of it.
        let mut d: Box<Device> = Box::new(unsafe { std::mem::zeroed() });
        d.vd.device.node_type = IBV_NODE_CA;
        d.vd.device.transport_type = IBV_TRANSPORT_IB;
        copy_cstr(&mut d.vd.device.name, &cfg.name);
        copy_cstr(&mut d.vd.device.dev_name, "uverbs0");
        copy_cstr(
            &mut d.vd.device.dev_path,
            "/sys/class/infiniband_verbs/uverbs0",
        );
        copy_cstr(
            &mut d.vd.device.ibdev_path,
            &format!("/sys/class/infiniband/{}", cfg.name),
        );
        Some(Box::into_raw(d) as usize)
    });
    p.map(|p| p as *mut ibv_device)
}

/// An asynchronous event as the program will see it: its type and the object's address.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub event_type: libc::c_int,
    pub element: usize,
}

/// What a shard's lock guards.
pub struct Inner {
    pub rnic: Rnic,
    /// `ibv_poll_cq`'s scratch: taken from the core, then written into the caller's array
    /// (kept, so that polling does not allocate).
    pub wcs: Vec<Wc>,
    /// Asynchronous events not yet read by `ibv_get_async_event`.
    pub events: VecDeque<Event>,
    /// Our objects by their core handles: CQ index → `*mut verbs::Cq`, QPN → `*mut verbs::Qp`.
    pub cqs: HashMap<u32, usize>,
    pub qps: HashMap<u32, usize>,
    /// SRQ handle → `*mut verbs::Srq`.
    pub srqs: HashMap<u32, usize>,
    /// Scratch for the CQ and asynchronous events the core hands out (kept: no allocation per
    /// turn).
    pub cq_events: Vec<CqId>,
    pub async_scratch: Vec<AsyncEvent>,
    /// rdma_cm: QP1, the CM agent, the ids and their events (made at the first rdma_cm call;
    /// shard 0's only).
    pub cm: Option<Box<crate::rdmacm::service::Service>>,
}

impl Inner {
    fn new(rnic: Rnic) -> Inner {
        Inner {
            rnic,
            wcs: Vec::with_capacity(4096),
            events: VecDeque::new(),
            cqs: HashMap::new(),
            qps: HashMap::new(),
            srqs: HashMap::new(),
            cq_events: Vec::with_capacity(64),
            async_scratch: Vec::with_capacity(64),
            cm: None,
        }
    }
}

/// One shard of the device: an RNIC, the engine thread that turns it, and their lock. A
/// device on one thread (the default) is one shard; with `ROCEMU_THREADS=N` there are N, each
/// with the QPs whose QPN it made ([`Rnic::shard_of_qpn`]) and a copy of every PD, MR and CQ.
struct ShardNic {
    inner: Mutex<Inner>,
    /// Verbs waiting for the lock: the engine thread lets them in before its next turn.
    waiting: AtomicUsize,
    /// Wakes the engine thread when it sleeps.
    bell: Arc<Doorbell>,
    /// At exit: nothing left to send, in the RNIC or the port (see [`drain_at_exit`]).
    flushed: std::sync::atomic::AtomicBool,
}

/// The process's RNIC.
pub struct Nic {
    /// Shard 0 first: it answers ARP and neighbour discovery and runs rdma_cm's QP1.
    shards: Vec<ShardNic>,
    /// Which shard made a QPN (the device's keys).
    steering: QpnSteering,
    /// The shard the next QP without an SRQ goes to (round robin).
    next_shard: AtomicUsize,
    /// Bumped after every engine turn that did work and by every verb but `ibv_poll_cq`:
    /// a CQ found empty at generation g is still empty while the generation is g, so a program
    /// spinning on an empty CQ does not take the lock (and starve the engine) at all.
    pub progress: AtomicU64,
    /// Addresses a verb waits to know the MAC of.
    want: Mutex<Vec<IpAddr>>,
    pub mac: Mac,
    /// GID index i is `ips[i]`.
    pub ips: Vec<IpAddr>,
    pub eth_mtu: usize,
    /// The eventfd (semaphore mode) counting unread asynchronous events; each context's
    /// `async_fd` is a duplicate of it.
    pub async_efd: libc::c_int,
    pub node_guid: u64,
    /// Set at exit ([`drain_at_exit`]): each engine thread then hands the port what it holds
    /// after every turn and says in its shard's `flushed` whether anything is left, in the
    /// port or to be sent by the RNIC (a QP with a queued response is on the transmit
    /// schedule).
    exiting: std::sync::atomic::AtomicBool,
    /// When an engine last sent a frame (nanoseconds since `epoch`).
    last_tx: AtomicU64,
    epoch: Instant,
    /// The port is DPDK's: frames on it may leave with the process (see [`LINGER`]).
    lingers: bool,
}

/// The link-local IPv6 address of `mac` (modified EUI-64), as Linux makes it.
pub fn link_local(mac: Mac) -> IpAddr {
    let m = mac.0;
    IpAddr::V6(Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 2,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ]))
}

/// The node GUID Linux gives rxe: the MAC as a modified EUI-64.
pub fn guid_of(mac: Mac) -> u64 {
    let m = mac.0;
    u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

/// The RNIC locked by a verb that may give it work: releasing it rings the engine's doorbell.
pub struct Locked<'a> {
    g: Option<MutexGuard<'a, Inner>>,
    bell: &'a Doorbell,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.g.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.g.as_mut().expect("held until drop")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Unlock first: the engine woken by the ring takes the lock next.
        drop(self.g.take());
        self.bell.ring();
    }
}

impl Nic {
    /// Shard 0's lock, for what concerns the device rather than a QP (its attributes, the
    /// neighbours, rdma_cm), ahead of the engine's next turn: the engine is woken when it is
    /// released.
    pub fn lock(&self) -> Locked<'_> {
        self.lock_shard(0)
    }

    /// Shard `k`'s lock, for a verb that may change what a CQ holds or give the RNIC work:
    /// its engine is woken when it is released.
    pub fn lock_shard(&self, k: usize) -> Locked<'_> {
        let g = self.lock_to_poll(k);
        self.progress.fetch_add(1, Ordering::SeqCst);
        Locked {
            g: Some(g),
            bell: &self.shards[k].bell,
        }
    }

    /// The lock of the shard that has QP `qpn`.
    pub fn lock_qp(&self, qpn: rocemu_wire::Qpn) -> Locked<'_> {
        self.lock_shard(self.shard_of(qpn))
    }

    /// Every shard's lock, in shard order (the one order in which more than one is taken),
    /// for a verb on an object every shard has a copy of (PD, MR, CQ).
    pub fn lock_all(&self) -> Vec<Locked<'_>> {
        (0..self.shards.len()).map(|k| self.lock_shard(k)).collect()
    }

    /// The lock of shard `k`, for `ibv_poll_cq` (which only takes from CQs: no new
    /// generation).
    pub fn lock_to_poll(&self, k: usize) -> MutexGuard<'_, Inner> {
        let s = &self.shards[k];
        s.waiting.fetch_add(1, Ordering::Relaxed);
        let g = s.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.waiting.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// How many shards (polling threads) the device has.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard that made `qpn` (and has its QP).
    pub fn shard_of(&self, qpn: rocemu_wire::Qpn) -> usize {
        if self.shards.len() == 1 {
            0
        } else {
            self.steering.shard_of(qpn.value()) as usize
        }
    }

    /// The shard for a new QP without an SRQ: each in turn.
    pub fn pick_shard(&self) -> usize {
        self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len()
    }

    /// Waits (up to [`DRAIN`]) until the responses that `qpn` has queued for the wire — ACKs,
    /// NAKs, read and atomic responses — are sent, the engine woken to send them. An RNIC acknowledges what it received whatever its program does next; here
    /// the engine sends in bursts, and a program that saw its last receive completion and
    /// destroyed the QP (or exited) at once took the ACK of that message with it: its peer
    /// retried into a QP that was gone and failed with "transport retry counter exceeded"
    /// (ibv_srq_pingpong on one core, one run in two).
    pub fn drain_responses(&self, qpn: rocemu_wire::Qpn) {
        let deadline = Instant::now() + DRAIN;
        let mut rung = false;
        loop {
            let left = self.lock_qp(qpn).rnic.queued_responses(qpn).unwrap_or(0);
            if left == 0 {
                return;
            }
            if Instant::now() >= deadline {
                // Its peer will retry into a QP that is gone. (The srq_pingpong failures
                // that remained, about 1 run in 30 pinned, were not this: on `lo` the packet
                // ring had 64 slots and dropped an ACK; see af_packet/ring.rs MAX_IP_PACKET.)
                eprintln!(
                    "rocemu: ibv_destroy_qp: QP {:#x}: {left} responses still queued after {} ms \
                     go with it",
                    qpn.value(),
                    DRAIN.as_millis()
                );
                return;
            }
            if !rung {
                self.shards[self.shard_of(qpn)].bell.ring();
                rung = true;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// The MAC of `ip`: known to the RNIC, or asked for by the engine thread (up to
    /// [`RESOLVE`]).
    pub fn resolve(&self, ip: IpAddr) -> Option<Mac> {
        let deadline = Instant::now() + RESOLVE;
        let mut asked = false;
        loop {
            if let Some(m) = self.lock().rnic.neighbor(ip) {
                return Some(m);
            }
            if Instant::now() >= deadline {
                return None;
            }
            if !asked {
                self.want.lock().unwrap_or_else(|p| p.into_inner()).push(ip);
                self.shards[0].bell.ring();
                asked = true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Signals `n` new asynchronous events on the eventfd.
    fn signal_async(&self, n: u64) {
        if n > 0 {
            eventfd_add(self.async_efd, n);
        }
    }
}

/// Adds `n` to an eventfd's counter.
pub fn eventfd_add(fd: libc::c_int, n: u64) {
    // SAFETY: writes 8 bytes from a local u64 to a file descriptor we own.
    let _ = unsafe { libc::write(fd, (&n as *const u64).cast(), 8) };
}

/// The RNIC, started at the first call; `Err(errno)` when there is no device or the datapath
/// would not open (said once on stderr).
pub fn nic() -> Result<&'static Nic, libc::c_int> {
    static NIC: OnceLock<Option<&'static Nic>> = OnceLock::new();
    NIC.get_or_init(|| match start() {
        Ok(n) => {
            let _ = STARTED.set(n);
            // SAFETY: registers a function of ours that takes no arguments.
            unsafe { libc::atexit(drain_at_exit) };
            Some(n)
        }
        Err(msg) => {
            eprintln!("rocemu: {msg}");
            None
        }
    })
    .ok_or(libc::ENODEV)
}

/// At `exit`: what every QP still has to send (the responses of [`Nic::drain_responses`]
/// among it) and what the port still holds (a PMD that refused part of a burst) leave first,
/// up to [`DRAIN`], as they would from an RNIC whose program exited without destroying its
/// QPs; then a DPDK port lingers (see [`LINGER`]).
extern "C" fn drain_at_exit() {
    let Some(n) = started() else { return };
    n.exiting.store(true, Ordering::SeqCst);
    for s in &n.shards {
        s.bell.ring();
    }
    let deadline = Instant::now() + DRAIN;
    while !n.shards.iter().all(|s| s.flushed.load(Ordering::SeqCst)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50));
    }
    if n.lingers {
        let sent = Duration::from_nanos(n.last_tx.load(Ordering::Relaxed));
        let until = n.epoch + sent + LINGER;
        let now = Instant::now();
        if sent > Duration::ZERO && until > now {
            std::thread::sleep(until - now);
        }
    }
}

/// The RNIC if it was started, without starting it.
pub fn started() -> Option<&'static Nic> {
    STARTED.get().copied()
}

static STARTED: OnceLock<&'static Nic> = OnceLock::new();

#[cfg(not(feature = "dpdk"))]
fn open_dpdk(args: &str) -> Result<Box<dyn Port + Send>, String> {
    Err(format!(
        "ROCEMU_DEV=dpdk:{args}: this libibverbs was built without DPDK"
    ))
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk_queues(args: &str, _n: usize) -> Result<Vec<Box<dyn Port + Send>>, String> {
    open_dpdk(args).map(|_| Vec::new())
}

/// Starts the engine thread, which opens the datapath and makes the RNIC; returns once the
/// datapath is open (or would not open).
///
/// The datapath opens on the engine thread, not on the program's: DPDK makes the thread that
/// initialises the EAL its main lcore, and only an lcore has a per-lcore mempool cache. A
/// plain thread (the engine, had the program's thread initialised the EAL) takes and returns
/// every mbuf through the pool's shared ring, with atomics (ib_write_bw -s 64 over memif:
/// `librte_mempool_ring` 7.5 % of the client's samples, none in `rocemu perf`'s client, whose
/// engine runs on the EAL's main thread).
fn start() -> Result<&'static Nic, String> {
    // Logs on stderr only when ROCEMU_LOG or RUST_LOG asks for them; a library installs nothing
    // otherwise. The subscriber is this library's own (its copy of `tracing` is linked inside
    // it): a Rust program's own subscriber is not touched, nor does it see these events.
    rocemu_emulator::logs::init_from_env();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("rocemu-engine".into())
        .spawn(move || match open_nic() {
            Ok((nic, engine, guard)) => {
                let _ = tx.send(Ok(nic));
                run(nic, 0, engine, guard)
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        })
        .map_err(|e| format!("cannot start the engine thread: {e}"))?;
    rx.recv()
        .unwrap_or_else(|_| Err("the engine thread ended before the datapath opened".into()))
}

type Opened = (
    &'static Nic,
    Engine,
    Option<rocemu_emulator::port::af_packet::KernelGuard>,
);

/// The datapath as it opened: one port, or a port per shard to come.
enum Datapath {
    One(OpenedPort),
    Shards(ShardPorts),
}

/// On the engine thread: the datapath, the RNIC and its engine; with `ROCEMU_THREADS=N`, the
/// RNIC of every shard, and the engine threads of shards 1 to N - 1, started.
fn open_nic() -> Result<Opened, String> {
    let cfg = config().ok_or("no device configured")?;
    let mut addrs = vec![cfg.ip];
    if let Some(m) = cfg.known_mac {
        addrs.insert(0, link_local(m));
    }
    // DPDK's EAL pins the thread that initialises it (the engine thread, here) to one core;
    // the program's threads inherit nothing from it. Keep the engine on the program's CPU set
    // as before, so that it is not confined to one core with a program thread
    // (ib_write_bw -s 64 over memif: 0.027 Mpps when it was).
    let cpus = affinity();
    let opened = if cfg.threads > 1 {
        open_datapath_shards(
            "ROCEMU_DEV",
            &format!("ROCEMU_THREADS={}", cfg.threads),
            &cfg.dev,
            &addrs,
            cfg.mac.is_some(),
            cfg.threads,
            &open_dpdk_queues,
        )
        .map(Datapath::Shards)
    } else {
        open_datapath(
            "ROCEMU_DEV",
            &cfg.dev,
            &addrs,
            cfg.mac.is_some(),
            &open_dpdk,
        )
        .map(Datapath::One)
    };
    if let Some(c) = cpus {
        set_affinity(&c);
    }
    let opened = opened?;
    let first: &dyn Port = match &opened {
        Datapath::One(o) => &*o.port,
        Datapath::Shards(s) => s.first(),
    };
    let (port_mac, eth_mtu, port_name) = (first.mac(), first.mtu(), first.name());
    let mac = cfg.mac.unwrap_or(port_mac);
    if mac == Mac([0; 6]) || mac.is_multicast() {
        return Err(format!(
            "{port_name} has MAC {mac}, which cannot be a unicast source: set ROCEMU_MAC"
        ));
    }
    let ips = vec![link_local(mac), cfg.ip];
    let mut rc = RnicConfig::new(mac, cfg.ip, 0);
    rc.ips = ips.clone();
    rc.seed = Seed::replay_or_os(cfg.impair.seed)?;
    rc.eth_mtu = eth_mtu;
    rc.cc = cfg.cc.clone();
    rc.shard = Shard {
        index: 0,
        count: cfg.threads as u32,
    };
    let mut rnics = vec![Rnic::new(rc.clone())];
    let steering = rnics[0].qpn_steering();
    for k in 1..cfg.threads {
        rc.shard.index = k as u32;
        rnics.push(Rnic::new(rc.clone()));
    }
    let (ports, guard, table) = match opened {
        Datapath::One(o) => {
            let port: Box<dyn Port + Send> = match cfg.impair {
                i if i.imp.is_none() => o.port,
                i => Box::new(ImpairedPort::new(o.port, i.imp, i.impair_seed())),
            };
            (vec![port], o.guard, None)
        }
        Datapath::Shards(mut s) => {
            let guard = s.guard.take();
            let (ports, table) = s.into_ports(steering)?;
            (ports, guard, table)
        }
    };
    // Sleep when idle unless told to spin: the program's own threads spin on their CQs (or on
    // memory, as ib_write_lat does, without calling us), and a spinning engine beside them on a
    // machine with fewer free cores than spinning threads starves them (ibv_rc_pingpong on two
    // shared cores: 155 µs per iteration with backoff, 5.7 ms spinning); a polling backoff
    // delays a frame that comes while it sleeps or has yielded its core (ib_write_lat: ~2 ms).
    // Woken by the port's descriptor and the verbs' doorbell, the engine runs exactly when
    // there is work. ROCEMU_IDLE=busy spins, as `rocemu perf` does, for one core per engine.
    let idle = match std::env::var("ROCEMU_IDLE").as_deref() {
        Ok("busy") => IdleStrategy::BusyPoll,
        Ok("backoff") => IdleStrategy::Backoff,
        _ => IdleStrategy::Wake,
    };
    let mut engines = Vec::with_capacity(ports.len());
    let mut bells = Vec::with_capacity(ports.len());
    for (k, port) in ports.into_iter().enumerate() {
        let mut engine = Engine::new(port);
        engine.set_idle_strategy(idle);
        let bell = engine
            .doorbell()
            .map_err(|e| format!("eventfd (the engine's doorbell): {e}"))?;
        // A frame another shard read for this one's QP rings this shard's engine awake.
        if let Some(t) = &table {
            t.set(k, bell.clone());
        }
        engines.push(engine);
        bells.push(bell);
    }
    // `rocemu stats` finds the program's device by its name (ROCEMU_NAME); without the socket
    // the device still works. A device on several threads answers as one: each shard its part.
    let id = rocemu_emulator::stats::Identity {
        name: cfg.name.clone(),
        datapath: engines[0].port().name(),
        address: cfg.ip.to_string(),
        mac: mac.to_string(),
    };
    match rocemu_emulator::stats::server::Server::bind(id) {
        Ok(s) => {
            for e in engines.iter_mut().skip(1) {
                e.serve_stats_shard(s.shard_tap());
            }
            engines[0].serve_stats(s)
        }
        Err(e) => eprintln!("rocemu: stats: {e}; `rocemu stats` will not list this device"),
    }
    // SAFETY: eventfd takes no pointers; the descriptor is ours for the life of the process.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if efd < 0 {
        return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    let shards = rnics
        .into_iter()
        .zip(bells)
        .map(|(rnic, bell)| ShardNic {
            inner: Mutex::new(Inner::new(rnic)),
            waiting: AtomicUsize::new(0),
            bell,
            flushed: std::sync::atomic::AtomicBool::new(false),
        })
        .collect();
    let nic: &'static Nic = Box::leak(Box::new(Nic {
        shards,
        steering,
        next_shard: AtomicUsize::new(0),
        progress: AtomicU64::new(1),
        want: Mutex::new(Vec::new()),
        mac,
        ips,
        eth_mtu,
        async_efd: efd,
        node_guid: guid_of(mac),
        exiting: std::sync::atomic::AtomicBool::new(false),
        last_tx: AtomicU64::new(0),
        epoch: Instant::now(),
        lingers: cfg.dev.starts_with("dpdk:"),
    }));
    let mut engines = engines.into_iter();
    let first = engines.next().expect("shard 0's engine");
    for (k, engine) in engines.enumerate() {
        let k = k + 1;
        std::thread::Builder::new()
            .name(format!("rocemu-engine{k}"))
            .spawn(move || run(nic, k, engine, None))
            .map_err(|e| format!("cannot start engine thread {k}: {e}"))?;
    }
    Ok((nic, first, guard))
}

/// The core's asynchronous events, as the program will see them, to the async eventfd.
fn deliver_async_events(nic: &Nic, g: &mut Inner) {
    g.async_scratch.clear();
    g.rnic.take_async_events(&mut g.async_scratch);
    let mut n = 0;
    for e in &g.async_scratch {
        let (event_type, map, key) = match *e {
            AsyncEvent::CqErr(cq) => (IBV_EVENT_CQ_ERR, &g.cqs, cq.0),
            AsyncEvent::QpFatal(q) => (IBV_EVENT_QP_FATAL, &g.qps, q.value()),
            AsyncEvent::SrqLimitReached(s) => (IBV_EVENT_SRQ_LIMIT_REACHED, &g.srqs, s.handle()),
            AsyncEvent::QpLastWqeReached(q) => (IBV_EVENT_QP_LAST_WQE_REACHED, &g.qps, q.value()),
        };
        // An event on an object the program already destroyed has no one to go to.
        let Some(&element) = map.get(&key) else {
            continue;
        };
        if g.events.len() < rocemu_emulator::rnic::ASYNC_EVENTS_MAX {
            g.events.push_back(Event {
                event_type,
                element,
            });
            n += 1;
        }
    }
    nic.signal_async(n);
}

/// The calling thread's CPU set.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is a plain bit array (zeroes: the empty set); sched_getaffinity writes
    // at most its size into it.
    unsafe {
        let mut c: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut c) == 0)
            .then_some(c)
    }
}

/// Sets the calling thread's CPU set.
fn set_affinity(c: &libc::cpu_set_t) {
    // SAFETY: reads the set we pass, of its own size.
    let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), c) };
}

/// An address being asked about.
struct Asking {
    ip: IpAddr,
    next: Instant,
    until: Instant,
}

/// Shard `k`'s engine thread: a turn of the engine per iteration, then (shard 0) the neighbour
/// requests and rdma_cm, and the events. Runs for the life of the process.
fn run(
    nic: &'static Nic,
    k: usize,
    mut engine: Engine,
    _guard: Option<rocemu_emulator::port::af_packet::KernelGuard>,
) {
    let mut asking: Vec<Asking> = Vec::new();
    let mut sent = if nic.lingers {
        engine.port_stats().tx_frames
    } else {
        0
    };
    loop {
        // Let a waiting verb in first: spin a little (not yield: that may hand the core to an
        // always-runnable program thread for a whole time slice), bounded so that a verb
        // thread descheduled between announcing itself and locking does not stop the engine.
        let mut spins = 0;
        let shard = &nic.shards[k];
        while shard.waiting.load(Ordering::Relaxed) > 0 && spins < 256 {
            std::hint::spin_loop();
            spins += 1;
        }
        let w = {
            let mut g = shard.inner.lock().unwrap_or_else(|p| p.into_inner());
            let g = &mut *g;
            let made = g.rnic.completions_made();
            let mut w = engine.poll(&mut g.rnic);
            if let Some(cm) = g.cm.as_mut() {
                w += crate::rdmacm::service::turn(cm, &mut g.rnic, &mut engine);
            }
            // Shard 0 answers ARP and neighbour discovery: it asks.
            let want = if k == 0 {
                nic.want.try_lock().ok()
            } else {
                None
            };
            if let Some(mut want) = want {
                let now = Instant::now();
                for ip in want.drain(..) {
                    if !asking.iter().any(|a| a.ip == ip) {
                        asking.push(Asking {
                            ip,
                            next: now,
                            until: now + RESOLVE,
                        });
                    }
                }
            }
            if !asking.is_empty() {
                let now = Instant::now();
                asking.retain_mut(|a| {
                    if engine.neighbor(&mut g.rnic, a.ip).is_some() {
                        return false;
                    }
                    if now >= a.until {
                        engine.forget_solicit(a.ip);
                        return false;
                    }
                    if now >= a.next {
                        let _ = engine.solicit(&mut g.rnic, a.ip);
                        a.next = now + Duration::from_millis(250);
                    }
                    true
                });
            }
            // Progress moves inside the lock and before a completion channel hears of it: a
            // program woken by the event must not poll the CQ's "still empty" shortcut with
            // the count of before the completion (it would see nothing, re-arm and wait for
            // an event that never comes). A turn that moved no frame may still have made a
            // completion (a work request failed as its payload was gathered): that is
            // progress too, or a program spinning on the shortcut never sees it.
            if w > 0 || g.rnic.completions_made() != made {
                nic.progress.fetch_add(1, Ordering::SeqCst);
            }
            deliver_async_events(nic, g);
            crate::verbs::deliver_cq_events(g);
            if nic.exiting.load(Ordering::Relaxed) {
                let clear = engine.flush() && !g.rnic.wants_transmit();
                shard.flushed.store(clear, Ordering::SeqCst);
            }
            w
        };
        // Only a port that lingers at exit needs the time of its last frame (a port's
        // statistics may cost a system call: AF_XDP's).
        if nic.lingers && w > 0 {
            let tx = engine.port_stats().tx_frames;
            if tx != sent {
                sent = tx;
                nic.last_tx
                    .fetch_max(nic.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        engine.idle(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vdevs_mac_argument_is_known_before_the_port_opens() {
        let a = "--no-huge -l 0 --vdev=net_memif0,role=server,mac=02:00:00:00:00:07,socket=/x";
        assert_eq!(vdev_mac(a), Some(Mac([2, 0, 0, 0, 0, 7])));
        assert_eq!(vdev_mac("--vdev=net_memif0,role=client"), None);
        assert_eq!(vdev_mac("--vdev=net_tap0,mac=fixed"), None);
        assert_eq!(vdev_mac("--vdev=net_memif0,mac=01:00:5e:00:00:01"), None);
    }

    #[test]
    fn threads_come_from_the_environment() {
        let none = crate::impair::Impair::default();
        assert_eq!(threads_from_env(None, &none), Ok(1));
        assert_eq!(threads_from_env(Some(String::new()), &none), Ok(1));
        assert_eq!(threads_from_env(Some("3".into()), &none), Ok(3));
        for bad in ["0", "65", "two", "-1"] {
            let e = threads_from_env(Some(bad.into()), &none).unwrap_err();
            assert!(
                e.contains("from 1 to 64") && e.ends_with("no device"),
                "{e}"
            );
        }
        let mut lossy = none;
        lossy.imp.loss = 0.1;
        assert_eq!(threads_from_env(Some("1".into()), &lossy), Ok(1));
        let e = threads_from_env(Some("2".into()), &lossy).unwrap_err();
        assert!(e.contains("with impairments"), "{e}");
    }

    #[test]
    fn congestion_control_comes_from_the_environment() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let dev = "dpdk:--no-pci";
        let c = cc_from_env(dev, env(&[])).unwrap();
        assert_eq!(c, CcConfig::default());
        assert!(!c.ecn && c.np && c.algo == CcAlgo::None);
        let c = cc_from_env(
            dev,
            env(&[
                ("ROCEMU_CC", "dcqcn"),
                (
                    "ROCEMU_CC_PARAMS",
                    "rpg_time_reset=55, min_time_between_cnps=9,line_rate=25000",
                ),
            ]),
        )
        .unwrap();
        assert!(c.ecn, "dcqcn implies ECN");
        assert_eq!(c.algo, CcAlgo::Dcqcn);
        assert_eq!(c.dcqcn.rpg_time_reset, 55);
        assert_eq!(c.dcqcn.min_time_between_cnps, 9);
        assert_eq!(c.line_rate_mbps, 25000);
        let c = cc_from_env(dev, env(&[("ROCEMU_CC", "timely"), ("ROCEMU_ECN", "1")])).unwrap();
        assert!(c.ecn && c.algo == CcAlgo::Timely);
        for (vars, says) in [
            (&[("ROCEMU_CC", "reno")][..], "ROCEMU_CC=reno"),
            (&[("ROCEMU_ECN", "yes")][..], "ROCEMU_ECN=yes: 1 or 0"),
            (
                &[("ROCEMU_CC_PARAMS", "dce_tcp_g=2000")][..],
                "between 0 and 1024",
            ),
            (
                &[("ROCEMU_CC_PARAMS", "nosuch=1")][..],
                "no such congestion-control parameter",
            ),
            (&[("ROCEMU_CC_PARAMS", "rpg_gd")][..], "NAME=VALUE"),
        ] {
            let vars: &'static [(&str, &str)] = Box::leak(vars.to_vec().into_boxed_slice());
            let e = cc_from_env(dev, env(vars)).unwrap_err();
            assert!(e.contains(says) && e.ends_with("no device"), "{e}");
        }
    }
}
