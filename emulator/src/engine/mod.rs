//! The engine: the thin I/O shim that binds one [`Rnic`] to one [`Port`] on a polling thread
//! (DESIGN.md, "Ports and the engine"), run to completion in bursts of [`BURST`], like a DPDK
//! lcore.
//!
//! One [`Engine::poll`] is one turn of the loop: a receive burst (ARP and neighbour discovery
//! answered here, everything else to the RNIC), the RNIC's due timers, a transmit burst (ARP/ND
//! answers first, then the RNIC's frames, built straight into the port's buffers). The caller
//! owns the loop, so an application can post work and poll completions between turns on the
//! same thread (that is what `rocemu perf` does); [`Engine::spawn`] runs the loop on its own
//! thread for a shared [`Device`].
//!
//! Invariants:
//! * Nothing a frame holds stops the engine: the RNIC drops what it cannot use (it is fuzzed
//!   for that), ARP/ND parsing returns errors rather than panicking, the neighbour table is
//!   bounded and the queue of answers is bounded (excess answers are dropped and counted).
//! * The RNIC answers ARP and ND for its own addresses with its own MAC (with DPDK the kernel
//!   no longer sees the port, so nobody else will).
pub mod neighbors;
pub mod wake;

use crate::api::Device;
use crate::port::{Port, PortStats, BURST};
use crate::rnic::Rnic;
use crate::time::Nanos;
use neighbors::Learnt;
pub use neighbors::Neighbors;
use rocemu_wire::arp::{self, ArpRepr};
use rocemu_wire::capture::CaptureWriter;
use rocemu_wire::eth::{EthernetRepr, Mac, ETHERTYPE_ARP, ETHERTYPE_IPV6};
use rocemu_wire::ip::{Ipv6Repr, IPV6_HEADER_LEN};
use rocemu_wire::nd::{self, NdRepr};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use wake::Doorbell;

/// Answers (ARP / ND) waiting for the transmit burst; more than this in one go is a storm.
const CTL_QUEUE: usize = 256;
/// A control frame's largest size (an ND message in IPv6 in Ethernet).
const CTL_FRAME: usize = 96;

/// What to do when a turn found no work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Spin: lowest latency, one core at 100%.
    BusyPoll,
    /// Spin a little, then yield, then sleep 50 µs at a time.
    #[default]
    Backoff,
    /// Spin a little ([`WAKE_SPIN_TURNS`]), then block in `ppoll(2)` on the port's descriptor
    /// ([`Port::wait_fds`]) and the engine's [`Doorbell`] until a frame arrives, the doorbell
    /// rings or the RNIC's next timer is due (at most the current nap, [`WAKE_NAP_MIN`] doubling
    /// to [`WAKE_NAP_MAX`]). A port without a descriptor falls back to [`IdleStrategy::Backoff`].
    /// Work posted from another thread than the engine's must ring the doorbell
    /// ([`Engine::doorbell`]).
    Wake,
}

/// Empty turns an engine with [`IdleStrategy::Wake`] spins before it blocks: a reply that comes
/// within them costs no wake-up, and they are few, because on a machine with fewer free cores
/// than spinning threads every spinning turn is taken from a program's thread.
pub const WAKE_SPIN_TURNS: u32 = 16;
/// The first nap of a blocked [`IdleStrategy::Wake`] engine with no timer due sooner.
pub const WAKE_NAP_MIN: Duration = Duration::from_micros(50);
/// The longest: every source of work wakes the engine before, so this only bounds how late a
/// source that does not (a missed ring: a bug) is served, at up to 1000 empty turns a second.
pub const WAKE_NAP_MAX: Duration = Duration::from_millis(1);

/// The engine's own counters (the port and the RNIC keep theirs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub arp_requests_answered: u64,
    pub arp_requests_sent: u64,
    pub nd_solicits_answered: u64,
    pub nd_solicits_sent: u64,
    pub neighbours_learnt: u64,
    pub neighbours_refused: u64,
    /// ARP or ND frames that were malformed, or not for us.
    pub ctl_ignored: u64,
    /// Answers dropped because the queue was full (a storm).
    pub ctl_dropped: u64,
    /// Frames carrying our own source MAC (a looped-back copy of our own transmission).
    pub rx_own: u64,
    pub pcap_errors: u64,
}

impl EngineStats {
    /// Every engine counter with its name (`rocemu stats`), in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("arp_requests_answered", self.arp_requests_answered),
            ("arp_requests_sent", self.arp_requests_sent),
            ("nd_solicits_answered", self.nd_solicits_answered),
            ("nd_solicits_sent", self.nd_solicits_sent),
            ("neighbours_learnt", self.neighbours_learnt),
            ("neighbours_refused", self.neighbours_refused),
            ("ctl_ignored", self.ctl_ignored),
            ("ctl_dropped", self.ctl_dropped),
            ("rx_own", self.rx_own),
            ("pcap_errors", self.pcap_errors),
        ]
    }
}

/// Everything but the port, so that a receive burst can borrow both.
struct State {
    start: Instant,
    /// Unix time at `start`, for capture timestamps.
    epoch: Duration,
    neighbors: Neighbors,
    ctl: VecDeque<([u8; CTL_FRAME], usize)>,
    pcap: Option<CaptureWriter<std::io::BufWriter<std::fs::File>>>,
    stats: EngineStats,
    /// Addresses we asked about and have no answer for yet (few: one per resolve).
    asking: Vec<IpAddr>,
    idle: u32,
    strategy: IdleStrategy,
    /// The RNIC's next timer as of the end of the last turn.
    deadline: Option<Nanos>,
    /// Frames were left to send at the end of the last turn (the port refused them: a full
    /// socket buffer): an idle wait also ends when the port can take more.
    tx_backlog: bool,
    /// The port's `tx_dropped` and `link_downed` as last handed to the RNIC's `send_err` and
    /// `link_downed`.
    port_faults_seen: (u64, u64),
    /// The next blocking wait's longest ([`IdleStrategy::Wake`]), and its cap.
    nap: Duration,
    nap_max: Duration,
    doorbell: Option<Arc<Doorbell>>,
    /// Waits that blocked ([`IdleStrategy::Wake`]).
    sleeps: u64,
}

/// One RNIC bound to one port.
pub struct Engine {
    port: Box<dyn Port + Send>,
    st: State,
    /// The `rocemu stats` socket, answered between turns ([`Engine::serve_stats`]).
    stats: Option<crate::stats::server::Server>,
    /// A later shard's part of the device's stats socket (shard 0 has the socket).
    stats_tap: Option<crate::stats::server::ShardTap>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("port", &self.port.name())
            .field("stats", &self.st.stats)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub fn new(port: Box<dyn Port + Send>) -> Engine {
        let faults = port.faults();
        Engine {
            port,
            st: State {
                start: Instant::now(),
                epoch: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default(),
                neighbors: Neighbors::default(),
                ctl: VecDeque::new(),
                pcap: None,
                stats: EngineStats::default(),
                asking: Vec::new(),
                idle: 0,
                strategy: IdleStrategy::default(),
                deadline: None,
                tx_backlog: false,
                port_faults_seen: faults,
                nap: WAKE_NAP_MIN,
                nap_max: WAKE_NAP_MAX,
                doorbell: None,
                sleeps: 0,
            },
            stats: None,
            stats_tap: None,
        }
    }

    /// Records every frame sent and received (before the RNIC sees it) in a pcap file.
    pub fn record(&mut self, path: &Path) -> Result<(), String> {
        let w = CaptureWriter::create(path).map_err(|e| format!("--pcap: {e}"))?;
        self.st.pcap = Some(w);
        Ok(())
    }

    /// Flushes the pcap file (also done on drop).
    pub fn finish_recording(&mut self) -> Result<(), String> {
        if let Some(w) = self.st.pcap.take() {
            use std::io::Write;
            w.into_inner().flush().map_err(|e| format!("--pcap: {e}"))?;
        }
        Ok(())
    }

    pub fn set_idle_strategy(&mut self, s: IdleStrategy) {
        self.st.strategy = s;
    }

    /// The doorbell that wakes this engine from an [`IdleStrategy::Wake`] wait: ring it after
    /// giving the RNIC work from another thread (made at the first call, then shared).
    pub fn doorbell(&mut self) -> std::io::Result<Arc<Doorbell>> {
        if let Some(d) = &self.st.doorbell {
            return Ok(d.clone());
        }
        let d = Arc::new(Doorbell::new()?);
        self.st.doorbell = Some(d.clone());
        if let Some(s) = &self.stats {
            s.set_doorbell(d.clone());
        }
        Ok(d)
    }

    /// Answers `rocemu stats` on `server`'s socket from now on: a question is answered by
    /// the thread turning the engine, at the end of its next [`poll`](Self::poll) (a turn costs
    /// one more atomic load); the socket goes away with the engine.
    pub fn serve_stats(&mut self, server: crate::stats::server::Server) {
        if let Some(d) = &self.st.doorbell {
            server.set_doorbell(d.clone());
        }
        self.stats = Some(server);
    }

    /// Answers this shard's part of the device's `rocemu stats` questions (a device on several
    /// threads: shard 0's engine serves the socket, [`Server::shard_tap`] gives the others
    /// theirs).
    ///
    /// [`Server::shard_tap`]: crate::stats::server::Server::shard_tap
    pub fn serve_stats_shard(&mut self, tap: crate::stats::server::ShardTap) {
        self.stats_tap = Some(tap);
    }

    /// The stats socket's path, when [`serve_stats`](Self::serve_stats) gave one.
    pub fn stats_path(&self) -> Option<&Path> {
        self.stats.as_ref().map(|s| s.path())
    }

    /// Sets the longest idle wait of [`IdleStrategy::Wake`] (default [`WAKE_NAP_MAX`]). A test
    /// sets it long, so that a wake-up that did not happen shows as a stall.
    pub fn set_wake_nap_max(&mut self, d: Duration) {
        self.st.nap_max = d.max(WAKE_NAP_MIN);
    }

    /// How many idle waits blocked in `ppoll(2)` ([`IdleStrategy::Wake`]).
    pub fn sleeps(&self) -> u64 {
        self.st.sleeps
    }

    /// The engine's clock: monotonic nanoseconds since it was created.
    pub fn now(&self) -> Nanos {
        Nanos(self.st.start.elapsed().as_nanos() as u64)
    }

    pub fn port(&self) -> &dyn Port {
        &*self.port
    }

    pub fn port_stats(&self) -> PortStats {
        self.port.stats()
    }

    pub fn stats(&self) -> EngineStats {
        self.st.stats
    }

    pub fn neighbors(&self) -> &Neighbors {
        &self.st.neighbors
    }

    /// One turn: receive a burst, serve due timers, transmit a burst. Returns how many frames
    /// and timers it handled (0: idle).
    pub fn poll(&mut self, rnic: &mut Rnic) -> usize {
        let now = self.now();
        let st = &mut self.st;
        let mut work = self.port.rx_burst(BURST, &mut |f| st.receive(rnic, now, f));
        if rnic.poll_timeout().is_some_and(|t| t <= now) {
            rnic.handle_timeout(now);
            work += 1;
        }
        // Frames the driver refused before are offered again now (tx_burst sends them first),
        // not only when the RNIC has a new one.
        if !st.ctl.is_empty() || rnic.wants_transmit() || self.port.tx_held() {
            work += self
                .port
                .tx_burst(BURST, &mut |buf| st.transmit(rnic, now, buf));
        }
        // What the port refused or saw becomes the RNIC's send_err and link_downed, as rxe
        // counts them (`Port::faults`: no system call).
        let (tx_dropped, link_downed) = self.port.faults();
        let (dropped, downed) = st.port_faults_seen;
        if tx_dropped != dropped || link_downed != downed {
            rnic.count_port_faults(
                tx_dropped.saturating_sub(dropped),
                link_downed.saturating_sub(downed),
            );
            st.port_faults_seen = (tx_dropped, link_downed);
        }
        // After transmitting: what was sent may have armed a retransmit timer.
        st.deadline = rnic.poll_timeout();
        st.tx_backlog = !st.ctl.is_empty() || rnic.wants_transmit() || self.port.tx_held();
        if let Some(s) = &self.stats {
            if s.pending() {
                s.answer(rnic, &st.stats, &self.port.stats());
            }
        }
        if let Some(t) = &self.stats_tap {
            if t.pending() {
                t.answer(rnic, &st.stats, &self.port.stats());
            }
        }
        work
    }

    /// Turns until `done` holds (checked between turns) or `timeout` passes; true when done.
    pub fn run_until(
        &mut self,
        rnic: &mut Rnic,
        timeout: Duration,
        mut done: impl FnMut(&mut Rnic) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(rnic) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            let w = self.poll(rnic);
            self.idle(w);
        }
    }

    /// Applies the idle strategy after a turn that did `work` (the turn being the last
    /// [`Engine::poll`]: its view of the RNIC's timers is what a wait is bounded by).
    pub fn idle(&mut self, work: usize) {
        let st = &mut self.st;
        if work > 0 {
            st.idle = 0;
            st.nap = WAKE_NAP_MIN;
            if let Some(d) = &st.doorbell {
                if d.is_sleeping() {
                    d.set_sleeping(false);
                }
            }
            return;
        }
        st.idle = st.idle.saturating_add(1);
        match st.strategy {
            IdleStrategy::BusyPoll => {}
            IdleStrategy::Backoff => st.backoff(),
            IdleStrategy::Wake => match self.port.wait_fds() {
                Some(fds) => {
                    // Frames the port still holds (the kernel refused them) are sent only by
                    // a transmit burst: hand them over now, and wake when it can take them.
                    if !self.port.flush() {
                        st.tx_backlog = true;
                    }
                    let now = Nanos(st.start.elapsed().as_nanos() as u64);
                    st.wait(fds, now);
                }
                None => st.backoff(),
            },
        }
    }

    /// The MAC of `ip`: from the table, or by asking (ARP for IPv4, a neighbour solicitation
    /// for IPv6) every 250 ms until `timeout`. The answer is handed to the RNIC too.
    pub fn resolve(
        &mut self,
        rnic: &mut Rnic,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<Mac, String> {
        let deadline = Instant::now() + timeout;
        let mut next_ask = Instant::now();
        loop {
            let now = self.now();
            if let Some(m) = self.st.neighbors.get(ip, now) {
                rnic.set_neighbor(ip, m);
                self.st.asking.retain(|a| *a != ip);
                return Ok(m);
            }
            let t = Instant::now();
            if t >= deadline {
                self.st.asking.retain(|a| *a != ip);
                tracing::warn!(
                    %ip,
                    port = self.port.name(),
                    timeout_s = timeout.as_secs_f64(),
                    "address not resolved: no ARP/ND answer"
                );
                let why = if self.port.link_up() == Some(false) {
                    "; the port's link is down: is the other end of the link running?"
                } else {
                    "; is the peer up and on this link?"
                };
                return Err(format!(
                    "no answer from {ip} on {} within {:.1} s ({} asked{why})",
                    self.port.name(),
                    timeout.as_secs_f64(),
                    if ip.is_ipv4() {
                        "ARP"
                    } else {
                        "neighbour discovery"
                    }
                ));
            }
            if t >= next_ask {
                self.st.ask(rnic, ip)?;
                next_ask = t + Duration::from_millis(250);
            }
            let w = self.poll(rnic);
            self.idle(w);
        }
    }

    /// The MAC of `ip` if the table has it (handed to the RNIC too), without asking or waiting:
    /// for callers that must not block on a peer that may never answer (a MAD to the source of
    /// an unsolicited REQ). Pair it with [`solicit`](Self::solicit).
    pub fn neighbor(&mut self, rnic: &mut Rnic, ip: IpAddr) -> Option<Mac> {
        let m = self.st.neighbors.get(ip, self.now())?;
        rnic.set_neighbor(ip, m);
        self.st.asking.retain(|a| *a != ip);
        Some(m)
    }

    /// Asks once for `ip`'s MAC (ARP, or a neighbour solicitation) and returns: the answer is
    /// learnt by later turns (see [`neighbor`](Self::neighbor)). The caller paces the repeats
    /// and bounds how many addresses it asks about at once.
    pub fn solicit(&mut self, rnic: &mut Rnic, ip: IpAddr) -> Result<(), String> {
        self.st.ask(rnic, ip)
    }

    /// Stops treating `ip` as asked about (a [`solicit`](Self::solicit) given up on): a late
    /// answer is then learnt only as any other.
    pub fn forget_solicit(&mut self, ip: IpAddr) {
        self.st.asking.retain(|a| *a != ip);
    }

    /// Sends what the port still holds; true when nothing is left.
    pub fn flush(&mut self) -> bool {
        self.port.flush()
    }

    /// Runs the loop on its own thread for a shared [`Device`], until the handle is dropped.
    pub fn spawn(self, dev: Device) -> EngineHandle {
        self.spawn_with(dev, |_| {})
    }

    /// [`spawn`](Self::spawn), running `hook` on the RNIC after every turn, under the same lock
    /// (`dev.with`) as the turn itself: what the turn completed is there for it to see, and no
    /// verb runs in between. The drop-in libibverbs drains CQ events there
    /// ([`Rnic::take_cq_events`]) and wakes the completion channels. Keep it short: the engine
    /// holds the device while it runs.
    pub fn spawn_with(
        mut self,
        dev: Device,
        mut hook: impl FnMut(&mut Rnic) + Send + 'static,
    ) -> EngineHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        if self.st.strategy == IdleStrategy::Wake {
            if let Ok(b) = self.doorbell() {
                dev.set_doorbell(b);
            }
        }
        let thread = std::thread::Builder::new()
            .name("rocemu-engine".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let w = {
                        let mut r = dev.lock_quiet();
                        let w = self.poll(&mut r);
                        hook(&mut r);
                        w
                    };
                    if w > 0 {
                        dev.wake();
                    }
                    self.idle(w);
                }
                self.flush();
                let _ = self.finish_recording();
                self
            })
            .expect("spawn the engine thread");
        EngineHandle {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.finish_recording();
    }
}

/// The engine running on its own thread; dropping it (or [`EngineHandle::stop`]) stops it.
#[derive(Debug)]
pub struct EngineHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Engine>>,
}

impl EngineHandle {
    /// Stops the thread and gives the engine back.
    pub fn stop(mut self) -> Option<Engine> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl State {
    /// Spin 200 empty turns, yield for 1800, then sleep 50 µs at a time: for ports with no
    /// descriptor to wait on (a DPDK PMD polls a ring). The spin catches a quick reply for the
    /// price of a few hundred µs of one core; the sleep bounds what a frame arriving during it
    /// waits (50 µs plus the kernel's timer slack) while an idle engine turns at most ~10000
    /// times a second.
    fn backoff(&mut self) {
        if self.idle > 2000 {
            std::thread::sleep(Duration::from_micros(50));
        } else if self.idle > 200 {
            std::thread::yield_now();
        }
    }

    /// [`IdleStrategy::Wake`] after an empty turn, at `now`, on the port's descriptors `port`
    /// (-1: none).
    fn wait(&mut self, port: [std::os::fd::RawFd; 2], now: Nanos) {
        if self.idle <= WAKE_SPIN_TURNS {
            return;
        }
        let bell = self.doorbell.as_deref();
        if let Some(d) = bell {
            if !d.is_sleeping() {
                // Announce the sleep before one more turn: work posted after that turn's
                // look at the RNIC rings the bell (module `wake`).
                d.set_sleeping(true);
                return;
            }
        }
        let mut t = self.nap;
        if let Some(d) = self.deadline {
            t = t.min(Duration::from_nanos(d.0.saturating_sub(now.0)));
        }
        if t.is_zero() {
            return;
        }
        self.sleeps += 1;
        let fds = [port[0], port[1], bell.map_or(-1, Doorbell::fd)];
        if wake::wait_ready(&fds, self.tx_backlog, t) & 0b100 != 0 {
            if let Some(d) = bell {
                d.clear();
            }
        }
        self.nap = (self.nap * 2).min(self.nap_max);
    }

    fn capture(&mut self, now: Nanos, f: &[u8]) {
        if let Some(w) = self.pcap.as_mut() {
            if w.write(self.epoch + Duration::from_nanos(now.0), f)
                .is_err()
            {
                self.stats.pcap_errors += 1;
            }
        }
    }

    fn receive(&mut self, rnic: &mut Rnic, now: Nanos, f: &mut [u8]) {
        self.capture(now, f);
        let Ok((eth, off)) = EthernetRepr::parse(f) else {
            // The RNIC counts it as malformed.
            rnic.handle_frame_mut(now, f);
            return;
        };
        if eth.src == rnic.mac() {
            self.stats.rx_own += 1;
            return;
        }
        match eth.ethertype {
            ETHERTYPE_ARP => self.arp(rnic, now, &f[off..]),
            ETHERTYPE_IPV6 if f.len() > off + 6 && f[off + 6] == nd::PROTO_ICMPV6 => {
                self.nd(rnic, now, &f[off..])
            }
            _ => rnic.handle_frame_mut(now, f),
        }
    }

    fn learn(&mut self, rnic: &mut Rnic, ip: IpAddr, mac: Mac, now: Nanos) {
        if mac.is_multicast() || mac == Mac([0; 6]) {
            return;
        }
        let asked = self.asking.contains(&ip);
        match self.neighbors.learn(ip, mac, now, asked) {
            Learnt::New | Learnt::Changed => {
                self.stats.neighbours_learnt += 1;
                rnic.set_neighbor(ip, mac);
            }
            // The RNIC's copy forgets the neighbours confirmed longest ago when it is full:
            // a confirmation keeps a live peer in it.
            Learnt::Refreshed => rnic.set_neighbor(ip, mac),
            Learnt::Refused => self.stats.neighbours_refused += 1,
        }
    }

    fn queue(&mut self, frame: [u8; CTL_FRAME], len: usize) {
        if self.ctl.len() >= CTL_QUEUE {
            self.stats.ctl_dropped += 1;
        } else {
            self.ctl.push_back((frame, len));
        }
    }

    fn arp(&mut self, rnic: &mut Rnic, now: Nanos, payload: &[u8]) {
        let Ok(a) = ArpRepr::parse(payload) else {
            self.stats.ctl_ignored += 1;
            return;
        };
        let ours = rnic.ips().contains(&IpAddr::V4(a.target_ip));
        // RFC 826: update an entry we have; add one when the packet is for us.
        let known = self.neighbors.get(IpAddr::V4(a.sender_ip), now).is_some();
        if (ours || known) && !a.sender_ip.is_unspecified() {
            self.learn(rnic, IpAddr::V4(a.sender_ip), a.sender_mac, now);
        }
        if !ours {
            self.stats.ctl_ignored += 1;
            return;
        }
        if a.op == arp::OP_REQUEST {
            let reply = ArpRepr {
                op: arp::OP_REPLY,
                sender_mac: rnic.mac(),
                sender_ip: a.target_ip,
                target_mac: a.sender_mac,
                target_ip: a.sender_ip,
            };
            let mut b = [0u8; CTL_FRAME];
            let n = reply.emit_frame(a.sender_mac, &mut b);
            self.stats.arp_requests_answered += 1;
            self.queue(b, n);
        }
    }

    fn nd(&mut self, rnic: &mut Rnic, now: Nanos, packet: &[u8]) {
        let Ok((ip, dgram)) = Ipv6Repr::parse(packet) else {
            self.stats.ctl_ignored += 1;
            return;
        };
        let Ok(msg) = NdRepr::parse(&ip, &dgram[IPV6_HEADER_LEN..]) else {
            // Other ICMPv6 (router adverts, MLD…): not ours to handle.
            self.stats.ctl_ignored += 1;
            return;
        };
        match msg {
            NdRepr::Solicit { target, source_mac } => {
                if !rnic.ips().contains(&IpAddr::V6(target)) {
                    self.stats.ctl_ignored += 1;
                    return;
                }
                // Duplicate address detection comes from ::; the answer then goes to all nodes.
                let (dst, dst_mac, solicited) = if ip.src.is_unspecified() {
                    let all: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
                    (all, nd::multicast_mac(all), false)
                } else {
                    if let Some(m) = source_mac {
                        self.learn(rnic, IpAddr::V6(ip.src), m, now);
                    }
                    let Some(m) =
                        source_mac.or_else(|| self.neighbors.get(IpAddr::V6(ip.src), now))
                    else {
                        self.stats.ctl_ignored += 1;
                        return;
                    };
                    (ip.src, m, true)
                };
                let adv = NdRepr::Advert {
                    router: false,
                    solicited,
                    override_: true,
                    target,
                    target_mac: Some(rnic.mac()),
                };
                let mut b = [0u8; CTL_FRAME];
                let n = adv.emit_frame(rnic.mac(), dst_mac, target, dst, &mut b);
                self.stats.nd_solicits_answered += 1;
                self.queue(b, n);
            }
            NdRepr::Advert {
                target, target_mac, ..
            } => {
                let ip6 = IpAddr::V6(target);
                let asked =
                    self.neighbors.get(ip6, now).is_some() || rnic.ips().contains(&ip.dst.into());
                match target_mac {
                    Some(m) if asked => self.learn(rnic, ip6, m, now),
                    _ => self.stats.ctl_ignored += 1,
                }
            }
        }
    }

    /// Queues a request for `ip`'s MAC.
    fn ask(&mut self, rnic: &mut Rnic, ip: IpAddr) -> Result<(), String> {
        if !self.asking.contains(&ip) {
            self.asking.push(ip);
        }
        let mut b = [0u8; CTL_FRAME];
        let n = match ip {
            IpAddr::V4(t) => {
                let Some(IpAddr::V4(me)) = rnic.ips().iter().copied().find(IpAddr::is_ipv4) else {
                    rnic.count_gid_type_mismatch();
                    return Err(format!(
                        "cannot reach {ip}: this RNIC has no IPv4 address (gid_type_mismatch). {}",
                        crate::GID_INDEX_HINT
                    ));
                };
                self.stats.arp_requests_sent += 1;
                ArpRepr {
                    op: arp::OP_REQUEST,
                    sender_mac: rnic.mac(),
                    sender_ip: me,
                    target_mac: Mac([0; 6]),
                    target_ip: t,
                }
                .emit_frame(Mac::BROADCAST, &mut b)
            }
            IpAddr::V6(t) => {
                let Some(IpAddr::V6(me)) = rnic.ips().iter().copied().find(IpAddr::is_ipv6) else {
                    rnic.count_gid_type_mismatch();
                    return Err(format!(
                        "cannot reach {ip}: this RNIC has no IPv6 address (gid_type_mismatch). {}",
                        crate::GID_INDEX_HINT
                    ));
                };
                self.stats.nd_solicits_sent += 1;
                let dst = nd::solicited_node(t);
                NdRepr::Solicit {
                    target: t,
                    source_mac: Some(rnic.mac()),
                }
                .emit_frame(rnic.mac(), nd::multicast_mac(dst), me, dst, &mut b)
            }
        };
        self.queue(b, n);
        Ok(())
    }

    fn transmit(&mut self, rnic: &mut Rnic, now: Nanos, buf: &mut [u8]) -> Option<usize> {
        let n = if let Some((f, n)) = self.ctl.pop_front() {
            buf[..n].copy_from_slice(&f[..n]);
            n
        } else {
            rnic.poll_transmit(now, buf)?
        };
        self.capture(now, &buf[..n]);
        Some(n)
    }
}
