//! The discrete-event engine: hosts (a real [`Rnic`] each, driven through its sans-IO entry
//! points), links, and switches with a shared buffer, per-port per-priority queues, RED/ECN
//! marking at dequeue, PFC and its watchdog, and ECMP.
//!
//! Invariants: one clock, virtual (`now`); events are served in (time, sequence) order, so a run
//! is a function of its configuration and seed; every frame is in exactly one place (a link, a
//! queue, a host's hold) or freed; a switch's buffer never holds more than its size plus the
//! headroom it reserved; nothing here reads a wall clock except the speed figure.
use super::queue::Calendar;
use super::topo::{routes, NodeKind, Topology};
use super::traffic::FlowSpec;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::rnic::cc::CcConfig;
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::{
    Access, CqId, Mtu, PdId, QpCap, QpInitAttr, QpType, Rnic, RnicConfig, SendWr, Sge, Wc,
    WcStatus, WrOpcode,
};
use rocemu_emulator::time::Nanos;
use rocemu_wire::eth::Mac;
use rocemu_wire::pfc::{self, PfcRepr};
use rocemu_wire::{Psn, Qpn};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};

/// The priority RoCE data, ACKs and NAKs travel in (the lossless class when PFC is on).
pub const DATA_PRIO: u8 = 3;
/// Preamble, start delimiter and inter-frame gap (20) plus the FCS (4): what a frame costs on the
/// wire beyond the bytes the RNIC wrote.
pub const WIRE_OVERHEAD: u64 = 24;
/// The largest frame on the wire: 1024-byte MTU packets (1,090 bytes) fit in a 1500-byte
/// Ethernet MTU, as with rxe.
const ETH_MTU: usize = 1500;
const MAX_FRAME_WIRE: u64 = ETH_MTU as u64 + 18 + WIRE_OVERHEAD;
/// Bytes one WRITE work request carries (a flow is a train of them).
const CHUNK: u64 = 64 * 1024;
/// The most hosts a fabric has (each is a whole RNIC, about 250 kB).
pub const MAX_HOSTS: usize = 8192;
/// The most flows a run takes (each costs its state and, while it runs, a QP pair).
pub const MAX_FLOWS: usize = 2_000_000;
/// Work requests a flow keeps posted (8 MiB: the RNIC's own window, 8192 PSNs, is what limits a flow).
const WR_WINDOW: u64 = 128;

/// How the fabric is set up (the switches' and the transport's knobs).
#[derive(Debug, Clone)]
pub struct FabricConfig {
    pub seed: u64,
    /// Every host's congestion control (its line rate is set from its link).
    pub cc: CcConfig,
    /// PFC on the data priority.
    pub pfc: bool,
    /// RED/ECN at dequeue: no mark below `kmin`, always above `kmax`, probability rising to
    /// `pmax` between (HPCC's `switch-mmu.cc`).
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
    /// Each switch's shared buffer.
    pub buffer_bytes: u64,
    /// Headroom per ingress port for the lossless priority; `None`: the computed need of each
    /// port ([`headroom_need`]).
    pub headroom_bytes: Option<u64>,
    /// The dynamic PFC threshold is (free shared buffer) >> this (HPCC's `pfc_a_shift`).
    pub pfc_shift: u32,
    /// XON once the ingress bytes are this far under the threshold (HPCC's resume offset).
    pub resume_offset: u64,
    /// Pause time of an XOFF frame, quanta (refreshed at half of it while congested).
    pub pause_quanta: u16,
    /// The PFC watchdog: a queue paused this long while it holds frames is declared stormed
    /// (0: off); it then drops that queue's frames and ignores pauses for `watchdog_restore_ns`.
    pub watchdog_detect_ns: u64,
    pub watchdog_restore_ns: u64,
    /// Local ACK timeout exponent of every QP (4.096 µs · 2^t; 14, perftest's, is 67 ms).
    pub qp_timeout: u8,
    /// How often the series for the plot are sampled.
    pub series_ns: u64,
    /// Every host computes the ICRC of what it sends and checks it on what it receives, as on
    /// a wire (the default). Off, neither (`RnicConfig::emit_icrc` and `check_icrc` false):
    /// the simulated links corrupt nothing and switches never touch what the ICRC covers (ECN
    /// marking changes only masked fields), so no check can fail and no figure changes; only
    /// the simulator's speed (docs/congestion.md, "Speed").
    pub icrc: bool,
}

impl FabricConfig {
    /// HPCC's fat-tree settings at 100 Gb/s (see docs/congestion.md for their sources).
    pub fn new(seed: u64) -> FabricConfig {
        FabricConfig {
            seed,
            cc: CcConfig::default(),
            pfc: true,
            kmin_bytes: 100 * 1000,
            kmax_bytes: 400 * 1000,
            pmax: 0.2,
            buffer_bytes: 32 * 1000 * 1000,
            headroom_bytes: None,
            pfc_shift: 3,
            resume_offset: 3 * 1024,
            pause_quanta: 0xffff,
            watchdog_detect_ns: 10_000_000,
            watchdog_restore_ns: 10_000_000,
            qp_timeout: 14,
            series_ns: 100_000,
            icrc: true,
        }
    }
}

/// The headroom a port needs so that nothing it receives after deciding XOFF is lost: the
/// frame it is sending when it decides (the PFC frame waits for it), the PFC frame, the link's
/// round trip of bytes, and the frame the peer had begun when the PFC frame arrived.
pub fn headroom_need(bps: u64, delay_ns: u64) -> u64 {
    let bdp2 = (2 * delay_ns * bps).div_ceil(8_000_000_000);
    bdp2 + 2 * MAX_FRAME_WIRE + pfc::FRAME_LEN as u64 + WIRE_OVERHEAD
}

/// Nanoseconds `bytes` (as the RNIC wrote them) take on a link of `bps`.
pub fn wire_ns(bytes: u64, bps: u64) -> u64 {
    ((bytes.max(60) + WIRE_OVERHEAD) * 8_000_000_000).div_ceil(bps)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ev {
    Arrive { node: u32, port: u16, m: Meta },
    TxDone { node: u32, port: u16 },
    Wake { node: u32, port: u16 },
    HostTimer { node: u32 },
    FlowStart { flow: u32 },
    Refresh { node: u32, port: u16, prio: u8 },
    Watchdog { node: u32, port: u16, prio: u8 },
    Storm { node: u32 },
    Sample,
}

/// A transmitter's end at least this far ahead (the calendar's span) is always pushed.
const FAR_NS: u64 = super::queue::BUCKETS;
/// Bytes of each frame buffer (a frame is at most `ETH_MTU + 18`).
const FRAME_BUF: usize = ETH_MTU + 18;
/// Frame buffers lie this far apart in the arena.
const FRAME_STRIDE: usize = 1536;
const M_CTRL: u8 = 1;
const M_HDRM: u8 = 2;

/// A frame in flight as the fabric sees it, carried in its events and queue entries so that
/// a hop touches neither the frame's bytes nor a record of it: the buffer holding the bytes,
/// and what switches read, taken from the headers when the frame was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Meta {
    /// The frame's buffer in the arena.
    pkt: u32,
    /// The flow's ECMP entropy (addresses and UDP source port).
    entropy: u32,
    /// The destination host's index (`u16::MAX`: not IPv4 to a host of the fabric).
    dst: u16,
    len: u16,
    /// At a switch: the port it came in through.
    in_port: u16,
    prio: u8,
    /// `M_CTRL`: a MAC control frame; `M_HDRM`: admitted into its ingress port's headroom (not
    /// the shared buffer).
    flags: u8,
}

impl Meta {
    fn ctrl(&self) -> bool {
        self.flags & M_CTRL != 0
    }
    fn in_hdrm(&self) -> bool {
        self.flags & M_HDRM != 0
    }
}

/// The metadata of frame `pkt` (`len` bytes of `b`).
fn summarize(pkt: u32, b: &[u8], host_index: &[usize]) -> Meta {
    let mut m = Meta {
        pkt,
        len: b.len() as u16,
        dst: u16::MAX,
        ..Meta::default()
    };
    if b.len() >= 14 && b[12..14] == pfc::ETHERTYPE_MAC_CONTROL.to_be_bytes() {
        m.flags |= M_CTRL;
    }
    if b.len() >= 42 && b[12..14] == [0x08, 0x00] {
        if let Some(&hi) = node_of_ip(&b[30..34]).and_then(|d| host_index.get(d)) {
            if hi != usize::MAX {
                m.dst = hi as u16;
            }
        }
        let mut h: u32 = 0x811c_9dc5;
        for &x in &b[26..36] {
            h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
        }
        m.entropy = h;
    }
    m
}

/// One side of a link: the transmitter, what the peer's PFC frames told it, and (at a switch)
/// the egress queues and the ingress accounting of what arrived through it.
#[derive(Debug, Default)]
struct Port {
    peer: u32,
    peer_port: u16,
    /// The transmitter's end: the frame on the wire ends at `busy_until`, and its end event is
    /// served there as push number `done_seq`. That event is in the queue only when
    /// `done_queued`: a switch port with nothing more to send skips it (about three ends in
    /// four at 30 % load) and pushes it under the same number only when something comes to
    /// send before then (`Fabric::arm_done`), so that events are served in the same order.
    busy_until: u64,
    done_seq: u64,
    done_queued: bool,
    /// Bit p: `pq[p].queue` is not empty.
    nonempty: u8,
    bps: u64,
    delay_ns: u64,
    wake_at: u64,
    headroom: u64,
    // Time this transmitter was busy in the measured half of the run, ns, and its deepest
    // queue then.
    busy_ns_2nd: u64,
    queue_max: u64,
    ctrl: VecDeque<PfcRepr>,
    /// Per priority, together: what a hop reads of a priority is in one or two cache lines.
    pq: [PrioState; 8],
}

/// One priority of a port: its egress queue, what the peer's PFC frames told it, the watchdog,
/// and (PFC) the ingress accounting of what arrived through it.
#[derive(Debug, Default)]
struct PrioState {
    queue: VecDeque<Meta>,
    qbytes: u64,
    paused_until: u64,
    storm_until: u64,
    // PFC, as the ingress of what arrives here.
    ing: u64,
    hdrm: u64,
    // The watchdog, of the egress queue.
    stalled_since: Option<u64>,
    xoff: bool,
}

#[derive(Debug)]
struct Host {
    rnic: Rnic,
    pd: PdId,
    cq: CqId,
    mr: MrInfo,
    timer_at: u64,
    /// A frame the RNIC gave while its priority was paused.
    hold: Option<Meta>,
    storm: bool,
}

#[derive(Debug, Default)]
struct Switch {
    shared_used: u64,
    total_headroom: u64,
    rng: Option<ChaCha8Rng>,
}

/// A flow's progress.
#[derive(Debug, Clone)]
pub struct FlowState {
    pub spec: FlowSpec,
    qps: Option<(Qpn, Qpn)>,
    posted: u64,
    pub done: u64,
    wrs_out: u64,
    pub finish_ns: Option<u64>,
    /// Why the flow failed: its QPs could not be set up, or a work request completed in error.
    pub failed: Option<String>,
    pub done_at_half: u64,
    /// Bytes completed at each series sample.
    pub series: Vec<u64>,
}

/// What a run counted.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// XOFF frames sent by switches (refreshes included).
    pub pause_frames: u64,
    pub resume_frames: u64,
    pub drops: u64,
    pub ecn_marked: u64,
    pub hops: u64,
    pub watchdog: Vec<WatchdogEvent>,
    pub pause_series: Vec<u64>,
    pub queue_series: Vec<u64>,
    pub queue_samples_2nd: Vec<u64>,
    /// The first PFC frames switches sent, as on the wire (at most 64).
    pub pfc_frames: Vec<Vec<u8>>,
}

/// A PFC watchdog's detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchdogEvent {
    pub switch: usize,
    pub port: usize,
    pub prio: u8,
    /// When the queue began to be held by pauses, and when the watchdog fired.
    pub stalled_ns: u64,
    pub fired_ns: u64,
}

/// A fabric and the flows running on it.
#[derive(Debug)]
pub struct Fabric {
    pub cfg: FabricConfig,
    pub topo: Topology,
    ports: Vec<Vec<Port>>,
    hosts: Vec<Option<Box<Host>>>,
    switches: Vec<Switch>,
    routes: Vec<Vec<Vec<u16>>>,
    /// The routes flat: the next hops from node `u` to host index `h` are
    /// `hops[hop_at[u * H + h]..hop_at[u * H + h + 1]]` (H hosts).
    hop_at: Vec<u32>,
    hops: Vec<u16>,
    n_hosts: usize,
    host_index: Vec<usize>,
    pub flows: Vec<FlowState>,
    events: Calendar<Ev>,
    pub now: u64,
    /// The frame buffers, `FRAME_STRIDE` apart.
    frames: Vec<u8>,
    free: Vec<u32>,
    wcs: Vec<Wc>,
    pub totals: Totals,
    pub half_ns: u64,
    pub end_ns: u64,
    /// Finite flows neither finished nor failed.
    unfinished: usize,
    /// The flows' bytes at the second half's start are taken.
    half_taken: bool,
    /// The designated bottleneck as (switch, port), found once.
    bottleneck: Option<(usize, usize)>,
}

/// A host's addresses from its node id.
pub fn host_ip(node: usize) -> IpAddr {
    let n = node as u32 + 1;
    IpAddr::V4(Ipv4Addr::new(10, (n >> 16) as u8, (n >> 8) as u8, n as u8))
}
fn host_mac(node: usize) -> Mac {
    let n = node as u32;
    Mac([
        0x02,
        0,
        (n >> 24) as u8,
        (n >> 16) as u8,
        (n >> 8) as u8,
        n as u8,
    ])
}
fn node_of_ip(b: &[u8]) -> Option<usize> {
    if b[0] != 10 {
        return None;
    }
    let n = (u32::from(b[1]) << 16) | (u32::from(b[2]) << 8) | u32::from(b[3]);
    n.checked_sub(1).map(|n| n as usize)
}

impl Fabric {
    /// Builds the fabric: an RNIC per host, the routes, the switches' buffers.
    pub fn new(topo: Topology, cfg: FabricConfig) -> Result<Fabric, String> {
        topo.check()?;
        let n = topo.kinds.len();
        let n_hosts = topo.hosts().len();
        if n > 1 << 20 || n_hosts > MAX_HOSTS {
            // Each host is a whole RNIC (its tables, a CQ, an MR): bounded, as memory is.
            return Err(format!(
                "{n_hosts} hosts of {n} nodes: at most {MAX_HOSTS} hosts and 2^20 nodes"
            ));
        }
        let mut ports: Vec<Vec<Port>> = (0..n).map(|_| Vec::new()).collect();
        for l in &topo.links {
            let (pa, pb) = (ports[l.a].len() as u16, ports[l.b].len() as u16);
            for (me, peer, peer_port) in [(l.a, l.b, pb), (l.b, l.a, pa)] {
                ports[me].push(Port {
                    peer: peer as u32,
                    peer_port,
                    bps: l.bps,
                    delay_ns: l.delay_ns,
                    ..Port::default()
                });
            }
        }
        let routes = routes(&topo);
        let (mut hop_at, mut hops) = (vec![0u32], Vec::new());
        for r in &routes {
            for nh in r.iter().take(n_hosts) {
                hops.extend_from_slice(nh);
                hop_at.push(hops.len() as u32);
            }
            for _ in r.len()..n_hosts {
                hop_at.push(hops.len() as u32);
            }
        }
        let bottleneck = topo.bottleneck.and_then(|(a, b)| {
            let p = ports[a].iter().position(|p| p.peer as usize == b)?;
            Some((a, p))
        });
        let mut host_index = vec![usize::MAX; n];
        for (i, h) in topo.hosts().into_iter().enumerate() {
            host_index[h] = i;
        }
        let mut hosts: Vec<Option<Box<Host>>> = (0..n).map(|_| None).collect();
        let mut switches: Vec<Switch> = (0..n).map(|_| Switch::default()).collect();
        for u in 0..n {
            match topo.kinds[u] {
                NodeKind::Host => {
                    let mut rc = RnicConfig::new(
                        host_mac(u),
                        host_ip(u),
                        cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u as u64,
                    );
                    rc.eth_mtu = ETH_MTU;
                    rc.check_icrc = cfg.icrc;
                    rc.emit_icrc = cfg.icrc;
                    rc.cc = cfg.cc.clone();
                    rc.cc.line_rate_mbps =
                        (ports[u][0].bps / 1_000_000).min(u64::from(u32::MAX)) as u32;
                    let mut rnic = Rnic::new(rc);
                    let pd = rnic.alloc_pd();
                    let cq = rnic.create_cq(65_536).map_err(|e| format!("{e:?}"))?;
                    // No memory behind it: nothing here reads the bytes, and 320 hosts' buffers
                    // made every packet's two copies cache misses (`Rnic::reg_mr_null`).
                    let mr = rnic
                        .reg_mr_null(
                            pd,
                            CHUNK as usize,
                            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                        )
                        .map_err(|e| format!("{e:?}"))?;
                    hosts[u] = Some(Box::new(Host {
                        rnic,
                        pd,
                        cq,
                        mr,
                        timer_at: u64::MAX,
                        hold: None,
                        storm: false,
                    }));
                }
                NodeKind::Switch => {
                    let sw = &mut switches[u];
                    sw.rng = Some(ChaCha8Rng::seed_from_u64(
                        cfg.seed ^ (u as u64).wrapping_mul(0xa076_1d64_78bd_642f),
                    ));
                    for p in ports[u].iter_mut() {
                        p.headroom = cfg
                            .headroom_bytes
                            .unwrap_or_else(|| headroom_need(p.bps, p.delay_ns));
                        if cfg.pfc {
                            sw.total_headroom += p.headroom;
                        }
                    }
                    if sw.total_headroom >= cfg.buffer_bytes {
                        return Err(format!(
                            "switch {u}: its ports' headroom ({} B) leaves nothing of the {} B buffer",
                            sw.total_headroom, cfg.buffer_bytes
                        ));
                    }
                }
            }
        }
        Ok(Fabric {
            topo,
            cfg,
            ports,
            hosts,
            switches,
            routes,
            hop_at,
            hops,
            n_hosts,
            host_index,
            flows: Vec::new(),
            events: Calendar::default(),
            now: 0,
            frames: Vec::new(),
            free: Vec::new(),
            wcs: Vec::new(),
            totals: Totals::default(),
            half_ns: 0,
            end_ns: 0,
            unfinished: 0,
            half_taken: false,
            bottleneck,
        })
    }

    fn push(&mut self, t: u64, ev: Ev) {
        self.events.push(t, ev);
    }

    /// Adds a flow; it starts at its `start_ns`.
    pub fn add_flow(&mut self, spec: FlowSpec) -> Result<usize, String> {
        if self.flows.len() >= MAX_FLOWS {
            return Err(format!(
                "more than {MAX_FLOWS} flows: a shorter --duration or a lower --load"
            ));
        }
        for h in [spec.src, spec.dst] {
            if self.topo.kinds.get(h) != Some(&NodeKind::Host) {
                return Err(format!(
                    "flow {}→{}: node {h} is not a host",
                    spec.src, spec.dst
                ));
            }
        }
        if spec.src == spec.dst {
            return Err(format!("flow {}→{}: to itself", spec.src, spec.dst));
        }
        let id = self.flows.len();
        if spec.bytes.is_some() {
            self.unfinished += 1;
        }
        self.flows.push(FlowState {
            spec,
            qps: None,
            posted: 0,
            done: 0,
            wrs_out: 0,
            finish_ns: None,
            failed: None,
            done_at_half: 0,
            series: Vec::new(),
        });
        self.push(spec.start_ns, Ev::FlowStart { flow: id as u32 });
        Ok(id)
    }

    /// Makes host `node`'s NIC send XOFF frames for the data priority without end from
    /// `start_ns` (a NIC stuck in a pause storm, for the watchdog).
    pub fn pause_storm(&mut self, node: usize, start_ns: u64) {
        if let Some(h) = self.hosts[node].as_mut() {
            h.storm = true;
            self.push(start_ns, Ev::Storm { node: node as u32 });
        }
    }

    /// The RNIC of host `node`.
    pub fn rnic(&self, node: usize) -> Option<&Rnic> {
        self.hosts.get(node)?.as_ref().map(|h| &h.rnic)
    }

    /// The smallest headroom a switch port reserved, and that port's computed need (bytes).
    pub fn min_headroom(&self) -> (u64, u64) {
        self.ports
            .iter()
            .enumerate()
            .filter(|(u, _)| self.topo.kinds[*u] == NodeKind::Switch)
            .flat_map(|(_, ps)| ps.iter())
            .map(|p| (p.headroom, headroom_need(p.bps, p.delay_ns)))
            .min()
            .unwrap_or((0, 0))
    }

    /// Runs to `end_ns`; the second half (from `half_ns`) is what the figures measure. With
    /// `drain`, goes on past `end_ns` (up to `drain_limit_ns`) until every finite flow is done.
    /// `progress` is called now and then with the simulated time.
    pub fn run(
        &mut self,
        half_ns: u64,
        end_ns: u64,
        drain_limit_ns: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) {
        self.half_ns = half_ns;
        self.end_ns = end_ns;
        self.push(0, Ev::Sample);
        let mut served = 0u64;
        while let Some((t, ev)) = self.events.pop() {
            if t > end_ns && (t > drain_limit_ns || self.unfinished == 0) {
                self.now = t.min(drain_limit_ns.max(end_ns));
                break;
            }
            self.now = t;
            served += 1;
            if served.is_multiple_of(1 << 16) {
                progress(self.now, self.totals.hops);
            }
            match ev {
                Ev::Arrive { node, port, m } => self.arrive(node as usize, port as usize, m),
                Ev::TxDone { node, port } => {
                    self.ports[node as usize][port as usize].done_queued = false;
                    self.kick(node as usize, port as usize);
                }
                Ev::Wake { node, port } => {
                    let p = &mut self.ports[node as usize][port as usize];
                    if p.wake_at == t {
                        p.wake_at = 0;
                    }
                    self.kick(node as usize, port as usize);
                }
                Ev::HostTimer { node } => {
                    let u = node as usize;
                    let h = self.hosts[u].as_mut().expect("a host");
                    if h.timer_at != t {
                        continue;
                    }
                    h.timer_at = u64::MAX;
                    h.rnic.handle_timeout(Nanos(t));
                    self.host_after(u);
                }
                Ev::FlowStart { flow } => self.start_flow(flow as usize),
                Ev::Refresh { node, port, prio } => {
                    if self.ports[node as usize][port as usize].pq[prio as usize].xoff {
                        self.send_xoff(node as usize, port as usize, prio);
                    }
                }
                Ev::Watchdog { node, port, prio } => {
                    self.watchdog(node as usize, port as usize, prio)
                }
                Ev::Storm { node } => {
                    let u = node as usize;
                    let p = &mut self.ports[u][0];
                    p.ctrl
                        .push_back(PfcRepr::one(host_mac(u), DATA_PRIO, 0xffff));
                    let t = t + PfcRepr::pause_ns(0xffff, p.bps) / 4;
                    self.push(t, Ev::Storm { node });
                    self.kick(u, 0);
                }
                Ev::Sample => self.sample(t),
            }
        }
    }

    // ---- the transmitters --------------------------------------------------------------------

    fn alloc_pkt(&mut self) -> u32 {
        match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.frames.len() / FRAME_STRIDE;
                self.frames.resize((i + 1) * FRAME_STRIDE, 0);
                i as u32
            }
        }
    }

    fn free_pkt(&mut self, i: u32) {
        self.free.push(i);
    }

    /// The buffer of frame `i` (`FRAME_BUF` bytes).
    fn buf(frames: &mut [u8], i: u32) -> &mut [u8] {
        let at = i as usize * FRAME_STRIDE;
        &mut frames[at..at + FRAME_BUF]
    }

    /// Puts frame `m` on the wire of `node`'s `port` (which is free).
    fn transmit(&mut self, node: usize, port: usize, m: Meta) {
        let len = u64::from(m.len);
        let (half, end) = (self.half_ns, self.end_ns);
        let switch = self.topo.kinds[node] == NodeKind::Switch;
        let p = &mut self.ports[node][port];
        let d = wire_ns(len, p.bps);
        p.busy_until = self.now + d;
        let (s, e) = (self.now.max(half), (self.now + d).min(end));
        if e > s {
            p.busy_ns_2nd += e - s;
        }
        let (peer, peer_port, delay) = (p.peer, p.peer_port, p.delay_ns);
        self.totals.hops += 1;
        // A host's end always matters (its RNIC may have a frame by then); a switch port's
        // only when it has more queued now or gets some before then (`arm_done`). An end that
        // would be beyond the calendar's span is always pushed (`Calendar::push_reserved`).
        let more = p.nonempty != 0 || !p.ctrl.is_empty();
        if !switch || more || d >= FAR_NS {
            p.done_queued = true;
            self.push(
                self.now + d,
                Ev::TxDone {
                    node: node as u32,
                    port: port as u16,
                },
            );
        } else {
            p.done_queued = false;
            p.done_seq = self.events.reserve();
        }
        self.push(
            self.now + d + delay,
            Ev::Arrive {
                node: peer,
                port: peer_port,
                m,
            },
        );
    }

    fn send_ctrl(&mut self, node: usize, port: usize) -> bool {
        let Some(mut f) = self.ports[node][port].ctrl.pop_front() else {
            return false;
        };
        if self.topo.kinds[node] == NodeKind::Switch {
            // A switch port's own address, made from the node and port.
            f.src = Mac([
                0x06,
                0,
                (node >> 16) as u8,
                (node >> 8) as u8,
                node as u8,
                port as u8,
            ]);
        }
        let i = self.alloc_pkt();
        let buf = Self::buf(&mut self.frames, i);
        let n = f.emit(buf);
        let mut m = summarize(i, &buf[..n], &self.host_index);
        m.prio = 7;
        if self.topo.kinds[node] == NodeKind::Switch && self.totals.pfc_frames.len() < 64 {
            self.totals.pfc_frames.push(buf[..n].to_vec());
        }
        self.transmit(node, port, m);
        true
    }

    fn paused(&self, node: usize, port: usize, prio: u8) -> Option<u64> {
        let p = &self.ports[node][port];
        let until = p.pq[prio as usize].paused_until;
        (until > self.now && p.pq[prio as usize].storm_until <= self.now).then_some(until)
    }

    fn wake_at(&mut self, node: usize, port: usize, t: u64) {
        let p = &mut self.ports[node][port];
        if p.wake_at == 0 || t < p.wake_at {
            p.wake_at = t;
            self.push(
                t,
                Ev::Wake {
                    node: node as u32,
                    port: port as u16,
                },
            );
        }
    }

    /// True while `node`'s `port` is sending; then makes sure its end event is queued, to
    /// start what was just given it to send.
    fn arm_done(&mut self, node: usize, port: usize) -> bool {
        let p = &mut self.ports[node][port];
        if p.done_queued {
            return true;
        }
        // Before its end, in the order events are served: the end not yet served.
        if (self.now, self.events.last_seq()) >= (p.busy_until, p.done_seq) {
            return false;
        }
        p.done_queued = true;
        let (t, s) = (p.busy_until, p.done_seq);
        self.events.push_reserved(
            t,
            s,
            Ev::TxDone {
                node: node as u32,
                port: port as u16,
            },
        );
        true
    }

    /// Starts the next frame on `node`'s `port` when it is free.
    fn kick(&mut self, node: usize, port: usize) {
        if self.arm_done(node, port) {
            return;
        }
        if self.send_ctrl(node, port) {
            return;
        }
        match self.topo.kinds[node] {
            NodeKind::Switch => self.switch_tx(node, port),
            NodeKind::Host => self.host_tx(node),
        }
    }

    fn host_tx(&mut self, u: usize) {
        let now = self.now;
        let held = self.hosts[u].as_mut().and_then(|h| h.hold.take());
        let m = match held {
            Some(m) => m,
            None => {
                let i = self.alloc_pkt();
                let h = self.hosts[u].as_mut().expect("a host");
                let buf = Self::buf(&mut self.frames, i);
                match h.rnic.poll_transmit(Nanos(now), buf) {
                    Some(n) => {
                        let mut m = summarize(i, &buf[..n], &self.host_index);
                        // CNPs in their own priority (DSCP `cnp_dscp`), everything else in the
                        // data priority.
                        let d = &self.cfg.cc.dcqcn;
                        m.prio = if n > 15 && buf[15] >> 2 == d.cnp_dscp {
                            d.cnp_802p_prio & 7
                        } else {
                            DATA_PRIO
                        };
                        m
                    }
                    None => {
                        self.free_pkt(i);
                        self.host_timer(u);
                        return;
                    }
                }
            }
        };
        if let Some(until) = self.paused(u, 0, m.prio) {
            self.hosts[u].as_mut().expect("a host").hold = Some(m);
            self.wake_at(u, 0, until);
        } else {
            self.transmit(u, 0, m);
        }
        self.host_timer(u);
    }

    fn host_timer(&mut self, u: usize) {
        let h = self.hosts[u].as_mut().expect("a host");
        if let Some(t) = h.rnic.poll_timeout() {
            let t = t.0.max(self.now);
            if t < h.timer_at {
                h.timer_at = t;
                self.push(t, Ev::HostTimer { node: u as u32 });
            }
        }
    }

    fn switch_tx(&mut self, u: usize, port: usize) {
        let mut next_wake: Option<u64> = None;
        let mut chosen = None;
        let mut nonempty = self.ports[u][port].nonempty;
        // The non-empty queues, highest priority first.
        while nonempty != 0 {
            let prio = 7 - nonempty.leading_zeros() as u8;
            nonempty &= !(1 << prio);
            match self.paused(u, port, prio) {
                Some(until) => {
                    next_wake = Some(next_wake.map_or(until, |w: u64| w.min(until)));
                    self.note_stalled(u, port, prio);
                }
                None => {
                    chosen = Some(prio);
                    break;
                }
            }
        }
        let Some(prio) = chosen else {
            if let Some(t) = next_wake {
                self.wake_at(u, port, t);
            }
            return;
        };
        let p = &mut self.ports[u][port];
        p.pq[prio as usize].stalled_since = None;
        let q = &mut p.pq[prio as usize].queue;
        let m = q.pop_front().expect("a frame");
        if q.is_empty() {
            p.nonempty &= !(1 << prio);
        }
        let len = u64::from(m.len);
        p.pq[prio as usize].qbytes -= len;
        let qlen = p.pq[prio as usize].qbytes;
        self.release(u, &m);
        // RED/ECN at dequeue, on the queue the frame leaves (HPCC marks here too).
        if prio == DATA_PRIO && qlen > self.cfg.kmin_bytes {
            let buf = Self::buf(&mut self.frames, m.pkt);
            let ect = m.len > 34 && buf[12..14] == [0x08, 0x00] && buf[15] & 3 != 0;
            if ect && buf[15] & 3 != 3 {
                let mark = if qlen > self.cfg.kmax_bytes {
                    true
                } else {
                    let pr = self.cfg.pmax * (qlen - self.cfg.kmin_bytes) as f64
                        / (self.cfg.kmax_bytes - self.cfg.kmin_bytes).max(1) as f64;
                    let rng = self.switches[u].rng.as_mut().expect("a switch");
                    super::traffic::unit(rng) < pr
                };
                if mark {
                    buf[15] |= 3;
                    let c = rocemu_wire::ip::ipv4_checksum(&buf[14..34]);
                    buf[24..26].copy_from_slice(&c.to_be_bytes());
                    self.totals.ecn_marked += 1;
                }
            }
        }
        self.transmit(u, port, m);
    }

    /// A frame leaves switch `u`'s buffer: its ingress accounting, and XON when that ingress
    /// may resume.
    fn release(&mut self, u: usize, m: &Meta) {
        let (len, inp, prio, in_hdrm) = (
            u64::from(m.len),
            m.in_port as usize,
            m.prio as usize,
            m.in_hdrm(),
        );
        let sw = &mut self.switches[u];
        let ip = &mut self.ports[u][inp];
        if in_hdrm {
            ip.pq[prio].hdrm -= len;
        } else {
            ip.pq[prio].ing -= len;
            sw.shared_used -= len;
        }
        if self.cfg.pfc && ip.pq[prio].xoff {
            let thr = pfc_threshold(&self.cfg, sw);
            if ip.pq[prio].hdrm == 0
                && (ip.pq[prio].ing == 0 || ip.pq[prio].ing + self.cfg.resume_offset <= thr)
            {
                ip.pq[prio].xoff = false;
                ip.ctrl.push_back(PfcRepr::one(Mac([0; 6]), prio as u8, 0));
                self.arm_done(u, inp);
                self.totals.resume_frames += 1;
                // The ingress port's transmitter is another port: kick it from the queue of
                // events, not from inside this one's dequeue.
                let now = self.now;
                self.push(
                    now,
                    Ev::Wake {
                        node: u as u32,
                        port: inp as u16,
                    },
                );
            }
        }
    }

    /// Queues an XOFF for `prio` on switch `u`'s `port` and its refresh at half its pause
    /// time (the refresh sends again while the ingress stays XOFF).
    fn send_xoff(&mut self, u: usize, port: usize, prio: u8) {
        let p = &mut self.ports[u][port];
        p.ctrl
            .push_back(PfcRepr::one(Mac([0; 6]), prio, self.cfg.pause_quanta));
        self.totals.pause_frames += 1;
        let t = self.now + PfcRepr::pause_ns(self.cfg.pause_quanta, p.bps) / 2;
        self.push(
            t,
            Ev::Refresh {
                node: u as u32,
                port: port as u16,
                prio,
            },
        );
        self.kick(u, port);
    }

    fn note_stalled(&mut self, u: usize, port: usize, prio: u8) {
        if self.cfg.watchdog_detect_ns == 0 {
            return;
        }
        let p = &mut self.ports[u][port];
        if p.pq[prio as usize].stalled_since.is_none() {
            p.pq[prio as usize].stalled_since = Some(self.now);
            let t = self.now + self.cfg.watchdog_detect_ns;
            self.push(
                t,
                Ev::Watchdog {
                    node: u as u32,
                    port: port as u16,
                    prio,
                },
            );
        }
    }

    fn watchdog(&mut self, u: usize, port: usize, prio: u8) {
        let now = self.now;
        let detect = self.cfg.watchdog_detect_ns;
        let p = &mut self.ports[u][port];
        let Some(since) = p.pq[prio as usize].stalled_since else {
            return;
        };
        if now < since + detect {
            return;
        }
        if p.pq[prio as usize].paused_until <= now || p.pq[prio as usize].queue.is_empty() {
            p.pq[prio as usize].stalled_since = None;
            return;
        }
        // Stormed: the queue's frames are dropped, and pauses ignored until the restore time.
        p.pq[prio as usize].stalled_since = None;
        p.pq[prio as usize].storm_until = now + self.cfg.watchdog_restore_ns;
        self.totals.watchdog.push(WatchdogEvent {
            switch: u,
            port,
            prio,
            stalled_ns: since,
            fired_ns: now,
        });
        let q: Vec<Meta> = self.ports[u][port].pq[prio as usize]
            .queue
            .drain(..)
            .collect();
        self.ports[u][port].nonempty &= !(1 << prio);
        for m in q {
            self.ports[u][port].pq[prio as usize].qbytes -= u64::from(m.len);
            self.release(u, &m);
            self.totals.drops += 1;
            self.free_pkt(m.pkt);
        }
        self.kick(u, port);
    }

    // ---- arrivals ---------------------------------------------------------------------------

    fn arrive(&mut self, u: usize, port: usize, m: Meta) {
        let len = m.len as usize;
        if m.ctrl() {
            let buf = &Self::buf(&mut self.frames, m.pkt)[..len];
            if let Ok(Some(f)) = PfcRepr::parse(buf) {
                self.apply_pfc(u, port, &f);
            }
            self.free_pkt(m.pkt);
            return;
        }
        match self.topo.kinds[u] {
            NodeKind::Host => {
                let now = Nanos(self.now);
                let h = self.hosts[u].as_mut().expect("a host");
                let buf = Self::buf(&mut self.frames, m.pkt);
                h.rnic.handle_frame_mut(now, &mut buf[..len]);
                self.free_pkt(m.pkt);
                self.host_after(u);
            }
            NodeKind::Switch => self.switch_rx(u, port, m),
        }
    }

    fn apply_pfc(&mut self, u: usize, port: usize, f: &PfcRepr) {
        let now = self.now;
        let p = &mut self.ports[u][port];
        let mut resumed = false;
        for prio in 0..8 {
            if f.enable & (1 << prio) == 0 {
                continue;
            }
            if f.quanta[prio] == 0 {
                resumed |= p.pq[prio].paused_until > now;
                p.pq[prio].paused_until = now;
            } else {
                p.pq[prio].paused_until = now + PfcRepr::pause_ns(f.quanta[prio], p.bps);
            }
        }
        if resumed {
            self.kick(u, port);
        }
    }

    fn switch_rx(&mut self, u: usize, inp: usize, mut m: Meta) {
        let (len, prio, entropy, i) = (m.len, m.prio, m.entropy, m.pkt);
        if m.dst == u16::MAX {
            // Not IPv4 to one of the fabric's hosts.
            self.totals.drops += 1;
            self.free_pkt(i);
            return;
        }
        let k = u * self.n_hosts + m.dst as usize;
        let nh = &self.hops[self.hop_at[k] as usize..self.hop_at[k + 1] as usize];
        if nh.is_empty() {
            self.totals.drops += 1;
            self.free_pkt(i);
            return;
        }
        let out = if nh.len() == 1 {
            nh[0] as usize
        } else {
            // ECMP on the addresses and the UDP source port (the RoCEv2 flow's entropy),
            // mixed with the switch's id so that each stage spreads anew.
            let mut h = u64::from(entropy) ^ (u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h = (h ^ (h >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h ^= h >> 29;
            let n = nh.len() as u64;
            // (A mask where it is the same as the remainder: a division costs tens of cycles.)
            let j = if n.is_power_of_two() {
                h & (n - 1)
            } else {
                h % n
            };
            nh[j as usize] as usize
        };
        let len = len as u64;
        let sw = &mut self.switches[u];
        let lossless = self.cfg.pfc && prio == DATA_PRIO;
        let now = self.now;
        let op = &self.ports[u][out];
        if op.pq[prio as usize].storm_until > now {
            // The watchdog's drop action on a stormed queue.
            self.totals.drops += 1;
            self.free_pkt(i);
            return;
        }
        let mut in_hdrm = false;
        if lossless {
            let thr = pfc_threshold(&self.cfg, sw);
            let ip = &self.ports[u][inp];
            let over = ip.pq[prio as usize].ing + len > thr
                || sw.shared_used + len + sw.total_headroom > self.cfg.buffer_bytes;
            if over {
                if ip.pq[prio as usize].hdrm + len > ip.headroom {
                    self.totals.drops += 1;
                    self.free_pkt(i);
                    return;
                }
                in_hdrm = true;
            }
        } else {
            // Lossy: the dynamic threshold (alpha 1) of the free buffer per egress queue.
            let free = self
                .cfg
                .buffer_bytes
                .saturating_sub(sw.shared_used + sw.total_headroom);
            if len > free || op.pq[prio as usize].qbytes + len > free {
                self.totals.drops += 1;
                self.free_pkt(i);
                return;
            }
        }
        // (Set here for this switch: the flag the previous one set is its own.)
        m.in_port = inp as u16;
        m.flags &= !M_HDRM;
        if in_hdrm {
            m.flags |= M_HDRM;
        }
        let ip = &mut self.ports[u][inp];
        if in_hdrm {
            ip.pq[prio as usize].hdrm += len;
        } else {
            ip.pq[prio as usize].ing += len;
            sw.shared_used += len;
        }
        if lossless && !ip.pq[prio as usize].xoff {
            let thr = pfc_threshold(&self.cfg, sw);
            if ip.pq[prio as usize].hdrm > 0 || ip.pq[prio as usize].ing >= thr {
                ip.pq[prio as usize].xoff = true;
                self.send_xoff(u, inp, prio);
            }
        }
        let op = &mut self.ports[u][out];
        op.pq[prio as usize].queue.push_back(m);
        op.nonempty |= 1 << prio;
        op.pq[prio as usize].qbytes += len;
        if now >= self.half_ns {
            op.queue_max = op.queue_max.max(op.pq[prio as usize].qbytes);
        }
        self.kick(u, out);
    }

    // ---- hosts and flows --------------------------------------------------------------------

    /// After the RNIC of host `u` took a frame or served a timer: completions, more work, the
    /// transmitter, the next timer.
    fn host_after(&mut self, u: usize) {
        let h = self.hosts[u].as_mut().expect("a host");
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        h.rnic.poll_cq_into(h.cq, 256, &mut wcs);
        for wc in wcs.iter() {
            let f = wc.wr_id as usize;
            self.on_completion(f, wc.status);
        }
        self.wcs = wcs;
        self.kick(u, 0);
        self.host_timer(u);
    }

    fn start_flow(&mut self, f: usize) {
        let spec = self.flows[f].spec;
        let (s, d) = (spec.src, spec.dst);
        let (sip, dip) = (host_ip(s), host_ip(d));
        let o = ConnectOpts {
            mtu: Mtu::M1024,
            timeout: self.cfg.qp_timeout,
            ..ConnectOpts::default()
        };
        let mk = |h: &mut Host| -> Result<Qpn, String> {
            h.rnic
                .create_qp(
                    h.pd,
                    QpInitAttr {
                        qp_type: QpType::Rc,
                        send_cq: h.cq,
                        recv_cq: h.cq,
                        srq: None,
                        cap: QpCap {
                            max_send_wr: WR_WINDOW as u32 * 2,
                            max_recv_wr: 1,
                            max_send_sge: 1,
                            max_recv_sge: 1,
                            max_inline_data: 0,
                        },
                        sq_sig_all: false,
                    },
                )
                .map_err(|e| format!("{e:?}"))
        };
        let r = (|| -> Result<(Qpn, Qpn), String> {
            let [hs, hd] = self
                .hosts
                .get_disjoint_mut([s, d])
                .map_err(|e| format!("{e:?}"))?;
            let (hs, hd) = (hs.as_mut().ok_or("no host")?, hd.as_mut().ok_or("no host")?);
            let qs = mk(hs)?;
            let qd = mk(hd)?;
            let ps = Psn::new(hs.rnic.random_u64() as u32 & 0xff_ffff);
            let pd = Psn::new(hd.rnic.random_u64() as u32 & 0xff_ffff);
            hs.rnic.set_neighbor(dip, host_mac(d));
            hd.rnic.set_neighbor(sip, host_mac(s));
            bring_up(&mut hs.rnic, qs, qd, dip, ps, pd, &o).map_err(|e| format!("{e:?}"))?;
            bring_up(&mut hd.rnic, qd, qs, sip, pd, ps, &o).map_err(|e| format!("{e:?}"))?;
            Ok((qs, qd))
        })();
        match r {
            Ok(q) => {
                self.flows[f].qps = Some(q);
                self.post_more(f);
                self.kick(s, 0);
                self.host_timer(s);
            }
            Err(e) => {
                // A host out of QPs: the flow fails, the run goes on (reported).
                self.flows[f].failed = Some(format!("its QPs could not be set up: {e}"));
                if self.flows[f].spec.bytes.is_some() {
                    self.unfinished -= 1;
                }
            }
        }
    }

    fn post_more(&mut self, f: usize) {
        let fl = &self.flows[f];
        let Some((qs, _)) = fl.qps else { return };
        let (s, d) = (fl.spec.src, fl.spec.dst);
        let (dst_addr, dst_rkey) = {
            let hd = self.hosts[d].as_ref().expect("a host");
            (hd.mr.addr, hd.mr.rkey)
        };
        let hs = self.hosts[s].as_mut().expect("a host");
        let fl = &mut self.flows[f];
        let total = fl.spec.bytes.unwrap_or(u64::MAX);
        while fl.wrs_out < WR_WINDOW && fl.posted < total {
            let n = CHUNK.min(total - fl.posted);
            let wr = SendWr::new(
                f as u64,
                WrOpcode::RdmaWrite {
                    remote_addr: dst_addr,
                    rkey: dst_rkey,
                },
                vec![Sge {
                    addr: hs.mr.addr,
                    length: n as u32,
                    lkey: hs.mr.lkey,
                }],
            );
            if hs.rnic.post_send(qs, wr).is_err() {
                break;
            }
            fl.posted += n;
            fl.wrs_out += 1;
        }
    }

    fn on_completion(&mut self, f: usize, status: WcStatus) {
        let Some(fl) = self.flows.get_mut(f) else {
            return;
        };
        if fl.finish_ns.is_some() || fl.failed.is_some() {
            return;
        }
        if status != WcStatus::Success {
            fl.failed = Some(format!("a WRITE completed with {}", status.as_str()));
            if fl.spec.bytes.is_some() {
                self.unfinished -= 1;
            }
            self.end_flow(f);
            return;
        }
        let total = fl.spec.bytes.unwrap_or(u64::MAX);
        let n = CHUNK.min(total - fl.done);
        fl.done += n;
        fl.wrs_out -= 1;
        if fl.done >= total {
            fl.finish_ns = Some(self.now);
            self.unfinished -= 1;
            self.end_flow(f);
        } else {
            self.post_more(f);
        }
    }

    fn end_flow(&mut self, f: usize) {
        let fl = &mut self.flows[f];
        let Some((qs, qd)) = fl.qps.take() else {
            return;
        };
        let (s, d) = (fl.spec.src, fl.spec.dst);
        if let Some(h) = self.hosts[s].as_mut() {
            let _ = h.rnic.destroy_qp(qs);
        }
        if let Some(h) = self.hosts[d].as_mut() {
            let _ = h.rnic.destroy_qp(qd);
        }
    }

    // ---- samples ------------------------------------------------------------------------------

    /// The bottleneck queue (or the deepest switch queue), bytes.
    fn queue_now(&self) -> u64 {
        match self.bottleneck {
            Some((a, p)) => self.ports[a][p].pq.iter().map(|q| q.qbytes).sum(),
            None => self
                .ports
                .iter()
                .enumerate()
                .filter(|(u, _)| self.topo.kinds[*u] == NodeKind::Switch)
                .flat_map(|(_, ps)| {
                    ps.iter()
                        .map(|p| p.pq.iter().map(|q| q.qbytes).sum::<u64>())
                })
                .max()
                .unwrap_or(0),
        }
    }

    fn sample(&mut self, t: u64) {
        let q = self.queue_now();
        if t >= self.half_ns && t <= self.end_ns {
            self.totals.queue_samples_2nd.push(q);
        }
        if !self.half_taken && t >= self.half_ns {
            self.half_taken = true;
            for f in self.flows.iter_mut() {
                f.done_at_half = f.done;
            }
        }
        if t.is_multiple_of(self.cfg.series_ns.max(1)) {
            self.totals.queue_series.push(q);
            self.totals.pause_series.push(self.totals.pause_frames);
            if self.flows.len() <= 64 {
                for f in self.flows.iter_mut() {
                    f.series.push(f.done);
                }
            }
        }
        if t < self.end_ns {
            // Every µs (every 10 µs where every switch's queues are looked at): the queue
            // percentiles come from these samples.
            let step = if self.bottleneck.is_some() {
                1_000
            } else {
                10_000
            };
            let next = t + step;
            let next = if t < self.half_ns && next > self.half_ns {
                self.half_ns
            } else {
                next
            };
            self.push(next, Ev::Sample);
        }
    }

    /// The bottleneck's utilisation over the second half, and its queue's maximum: the
    /// designated bottleneck, or the busiest link and the deepest queue of any switch.
    pub fn bottleneck_figures(&self) -> (f64, u64) {
        let span = self.end_ns.saturating_sub(self.half_ns).max(1) as f64;
        match self.bottleneck {
            Some((a, p)) => {
                let p = &self.ports[a][p];
                (p.busy_ns_2nd as f64 / span, p.queue_max)
            }
            None => {
                let busiest = self
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| p.busy_ns_2nd)
                    .max()
                    .unwrap_or(0);
                let qmax = self
                    .ports
                    .iter()
                    .enumerate()
                    .filter(|(u, _)| self.topo.kinds[*u] == NodeKind::Switch)
                    .flat_map(|(_, ps)| ps.iter().map(|p| p.queue_max))
                    .max()
                    .unwrap_or(0);
                (busiest as f64 / span, qmax)
            }
        }
    }

    /// The sum of a counter over every host's RNIC.
    pub fn host_counter(&self, f: impl Fn(&rocemu_emulator::rnic::Counters) -> u64) -> u64 {
        self.hosts
            .iter()
            .flatten()
            .map(|h| f(&h.rnic.counters()))
            .sum()
    }

    /// One-way path from `src` to `dst` as (bps, delay) per link, along the first route.
    pub fn path(&self, src: usize, dst: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut u = src;
        let mut port = 0usize;
        let di = self.host_index[dst];
        for _ in 0..self.topo.kinds.len() {
            let p = &self.ports[u][port];
            out.push((p.bps, p.delay_ns));
            u = p.peer as usize;
            if u == dst {
                return out;
            }
            match self.routes[u].get(di).and_then(|r| r.first()) {
                Some(&n) => port = n as usize,
                None => return out,
            }
        }
        out
    }
}

fn pfc_threshold(cfg: &FabricConfig, sw: &Switch) -> u64 {
    cfg.buffer_bytes
        .saturating_sub(sw.total_headroom + sw.shared_used)
        >> cfg.pfc_shift
}
