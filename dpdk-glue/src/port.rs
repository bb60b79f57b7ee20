//! [`DpdkPort`]: a [`Port`] on any DPDK poll-mode driver.
//!
//! Invariants: frames are received and built in place in mbufs (no copy). An mbuf handed to
//! `rte_eth_tx_burst` and accepted belongs to the driver and is never touched again; one it
//! refused stays ours, in the backlog, and goes out first next time (`tx_burst`, `flush`, and
//! also `rx_burst`, so that a held frame does not wait for new traffic). While the backlog is not
//! empty no new frame is built: the sender's frames wait in its own queues instead, so the
//! backlog never holds more than one burst. A backlog the driver has refused for
//! [`DpdkConfig::tx_stall_timeout`] (a link down, a peer gone) is dropped and counted.
use crate::eal::Eal;
use crate::error::Result;
use crate::ethdev::{DevInfo, EthConfig, EthPort, FRAME_OVERHEAD};
use crate::mempool::Mempool;
use rocemu_dpdk_sys as sys;
use rocemu_emulator::port::{Port, PortStats, BURST};
use rocemu_wire::eth::Mac;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Immediate retries of `rte_eth_tx_burst` while the driver takes nothing, before frames wait in
/// the backlog.
const TX_RETRIES: u32 = 3;

/// How to open a [`DpdkPort`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpdkConfig {
    pub eth: EthConfig,
    /// Mbufs in the port's pool ([`Mempool::DEFAULT_SIZE`]).
    pub mbufs: u32,
    /// How long frames the driver keeps refusing are held before they are dropped.
    pub tx_stall_timeout: Duration,
}

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig {
            eth: EthConfig::default(),
            mbufs: Mempool::DEFAULT_SIZE,
            tx_stall_timeout: Duration::from_millis(100),
        }
    }
}

/// Up to one burst of raw mbufs, owned: `Drop` frees those still held.
struct Burst {
    pkts: [*mut sys::rte_mbuf; BURST],
    /// Frame lengths, recorded while we own the mbufs (after a send they may be gone).
    lens: [u16; BURST],
    len: usize,
}

impl Burst {
    fn new() -> Burst {
        Burst {
            pkts: [std::ptr::null_mut(); BURST],
            lens: [0; BURST],
            len: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Frees the mbufs from index `n` on.
    fn truncate(&mut self, n: usize) {
        if n < self.len {
            // SAFETY: pkts[n..len] are valid mbufs we own; freeing them ends that ownership and
            // `len` is lowered so that they are not used again.
            unsafe {
                sys::rte_pktmbuf_free_bulk(self.pkts[n..].as_mut_ptr(), (self.len - n) as u32)
            };
            self.len = n;
        }
    }

    /// Forgets the first `n` (the driver took them) and moves the rest to the front.
    fn consume_front(&mut self, n: usize) {
        self.pkts.copy_within(n..self.len, 0);
        self.lens.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Offers up to `limit` of the held frames, in order, to tx queue `queue` of `port`; returns
    /// how many the driver took and their bytes.
    fn send(&mut self, port: u16, queue: u16, limit: usize) -> (usize, u64) {
        let (mut sent, mut bytes, mut idle) = (0, 0u64, 0);
        while sent < limit && !self.is_empty() {
            let want = (limit - sent).min(self.len);
            // SAFETY: pkts[..want] are valid mbufs we own, built as single-segment frames; the
            // caller has tx queue `queue` exclusively (the DpdkPort given it, by `&mut`).
            let n = unsafe {
                sys::rocemu_eth_tx_burst(port, queue, self.pkts.as_mut_ptr(), want as u16)
            };
            let n = usize::from(n);
            bytes += self.lens[..n].iter().map(|&l| u64::from(l)).sum::<u64>();
            self.consume_front(n);
            sent += n;
            if n == 0 {
                idle += 1;
                if idle > TX_RETRIES {
                    break;
                }
            }
        }
        (sent, bytes)
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.truncate(0);
    }
}

/// A [`Port`] on a DPDK ethdev port: one rx and one tx queue (queue 0, or queue k of a port
/// opened with [`DpdkPort::open_queues`]), its mbuf pool sized for the MTU, frames handed out
/// and built in place in mbufs.
pub struct DpdkPort {
    // Fields drop in order: the backlog's mbufs go back to the pool, then the port is stopped
    // and closed (by the last queue's port), then the pool and the EAL handles go.
    backlog: Burst,
    eth: Arc<EthPort>,
    /// This port's rx and tx queue.
    queue: u16,
    pool: Mempool,
    eal: Eal,
    mac: Mac,
    frame_capacity: usize,
    name: String,
    stats: PortStats,
    /// When the backlog last stopped moving.
    stalled_since: Option<Instant>,
    tx_stall_timeout: Duration,
}

// SAFETY: the raw mbufs in the backlog are owned by the port alone and may be sent or freed from
// any thread (the pool is multi-producer); everything else is Send.
unsafe impl Send for DpdkPort {}

impl fmt::Debug for DpdkPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DpdkPort")
            .field("eth", &self.eth)
            .field("mac", &self.mac)
            .field("frame_capacity", &self.frame_capacity)
            .field("backlog", &self.backlog.len)
            .field("stats", &self.stats)
            .finish()
    }
}

/// [`DpdkPort::open`] as the emulator's `port::open` takes a DPDK opener (`OpenDpdk`): the port
/// boxed, the error as text. For `--dev dpdk:…` and `ROCEMU_DEV=dpdk:…`.
pub fn open_boxed(eal_args: &str) -> std::result::Result<Box<dyn Port + Send>, String> {
    let p = DpdkPort::open(eal_args).map_err(|e| e.to_string())?;
    Ok(Box::new(p))
}

/// [`DpdkPort::open_queues`] with the default configuration and `queues` queues, as the
/// emulator's `port::open::open_datapath_shards` takes it (`OpenDpdkQueues`): a boxed port per
/// queue, the error as text. For `--threads N` and `ROCEMU_THREADS=N`.
pub fn open_queues_boxed(
    eal_args: &str,
    queues: usize,
) -> std::result::Result<Vec<Box<dyn Port + Send>>, String> {
    let n = u16::try_from(queues).map_err(|_| format!("{queues} queues: too many"))?;
    let ps =
        DpdkPort::open_queues(eal_args, &DpdkConfig::default(), n).map_err(|e| e.to_string())?;
    Ok(ps
        .into_iter()
        .map(|p| Box::new(p) as Box<dyn Port + Send>)
        .collect())
}

impl DpdkPort {
    /// Initialises the EAL with `eal_args` (see [`Eal::init`]) and opens its first port with
    /// the default configuration.
    pub fn open(eal_args: &str) -> Result<DpdkPort> {
        DpdkPort::open_with(eal_args, &DpdkConfig::default())
    }

    /// [`DpdkPort::open`] with a configuration.
    pub fn open_with(eal_args: &str, config: &DpdkConfig) -> Result<DpdkPort> {
        let eal = Eal::init(eal_args)?;
        let id = eal.first_port()?;
        DpdkPort::open_port(&eal, id, config)
    }

    /// Opens port `port_id` of a live EAL (see [`Eal::ports`], [`Eal::port_by_name`]), with a
    /// pool of mbufs that each hold one frame of the MTU. The MTU is the configured one (an
    /// error if the driver cannot do it); else, for a driver on a kernel interface (`net_pcap`,
    /// `net_af_packet`, `net_tap`, …), that interface's MTU, as AF_PACKET takes it, capped at
    /// what the driver can do; else the port's current MTU.
    pub fn open_port(eal: &Eal, port_id: u16, config: &DpdkConfig) -> Result<DpdkPort> {
        let one = DpdkConfig {
            eth: EthConfig {
                queues: 1,
                ..config.eth
            },
            ..*config
        };
        let mut ports = DpdkPort::open_port_queues(eal, port_id, &one)?;
        Ok(ports.remove(0))
    }

    /// Initialises the EAL with `eal_args` and opens its first port with `queues` rx and tx
    /// queues: a [`DpdkPort`] per queue, in queue order, for a device on several polling
    /// threads (RSS on the IP and UDP fields where the driver has it; what arrives on a queue is
    /// the caller's to steer).
    pub fn open_queues(eal_args: &str, config: &DpdkConfig, queues: u16) -> Result<Vec<DpdkPort>> {
        let eal = Eal::init(eal_args)?;
        let id = eal.first_port()?;
        let config = DpdkConfig {
            eth: EthConfig {
                queues,
                ..config.eth
            },
            ..*config
        };
        DpdkPort::open_port_queues(&eal, id, &config)
    }

    /// [`DpdkPort::open_port`] with `config.eth.queues` queues: a port per queue, sharing the
    /// ethdev port (stopped and closed when the last goes) and a pool of `config.mbufs` mbufs
    /// per queue.
    pub fn open_port_queues(eal: &Eal, port_id: u16, config: &DpdkConfig) -> Result<Vec<DpdkPort>> {
        let info = DevInfo::get(port_id)?;
        let queues = config.eth.queues.max(1);
        // Before the pool, which is sized by the queues.
        info.check_queues(queues)?;
        let mtu = match config.eth.mtu {
            Some(m) => m,
            None => info.default_mtu(port_id)?,
        };
        let mbufs = config.mbufs.saturating_mul(u32::from(queues));
        let pool = Mempool::for_frames(eal, mbufs, usize::from(mtu) + FRAME_OVERHEAD)?;
        let eth_config = EthConfig {
            mtu: Some(mtu),
            queues,
            ..config.eth
        };
        let eth = Arc::new(EthPort::new(eal, port_id, &pool, &eth_config)?);
        let mtu = eth.mtu()?;
        let mac = eth.mac()?;
        // `fill` gets exactly this much of a fresh mbuf: never more than the pool's mbufs hold,
        // whatever MTU the driver settled on.
        let frame_capacity = (usize::from(mtu) + FRAME_OVERHEAD).min(pool.frame_room());
        Ok((0..queues)
            .map(|queue| DpdkPort {
                backlog: Burst::new(),
                name: if queue == 0 {
                    format!("dpdk:{}", eth.name())
                } else {
                    format!("dpdk:{} queue {queue}", eth.name())
                },
                eth: eth.clone(),
                queue,
                pool: pool.clone(),
                eal: eal.clone(),
                mac,
                frame_capacity,
                stats: PortStats::default(),
                stalled_since: None,
                tx_stall_timeout: config.tx_stall_timeout,
            })
            .collect())
    }

    /// The ethdev port underneath.
    pub fn eth(&self) -> &EthPort {
        &self.eth
    }

    /// The EAL it runs on (to open more ports).
    pub fn eal(&self) -> &Eal {
        &self.eal
    }

    /// Its mbuf pool.
    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    /// Frames the driver refused that wait to be sent.
    pub fn backlog(&self) -> usize {
        self.backlog.len
    }

    /// Offers the backlog (up to `limit` frames) to the driver; drops it when it has not moved
    /// for `tx_stall_timeout`. Returns how many frames went. The caller holds the gate.
    fn drain_backlog(&mut self, limit: usize) -> usize {
        if self.backlog.is_empty() || limit == 0 {
            return 0;
        }
        let (n, bytes) = self.backlog.send(self.eth.id(), self.queue, limit);
        self.stats.tx_frames += n as u64;
        self.stats.tx_bytes += bytes;
        if self.backlog.is_empty() {
            self.stalled_since = None;
        } else if n > 0 {
            self.stalled_since = Some(Instant::now());
        } else {
            let now = Instant::now();
            let since = *self.stalled_since.get_or_insert(now);
            if now.duration_since(since) >= self.tx_stall_timeout {
                self.stats.tx_dropped += self.backlog.len as u64;
                self.backlog.truncate(0);
                self.stalled_since = None;
            }
        }
        n
    }
}

impl Port for DpdkPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        // Held until the frames are freed (a zero-copy memif's lie in its shared region).
        let _gate = self.eth.gate();
        if !self.backlog.is_empty() {
            self.drain_backlog(BURST);
        }
        let (mut seen, mut delivered) = (0, 0);
        while seen < max {
            let want = (max - seen).min(BURST);
            let mut b = Burst::new();
            // SAFETY: `b.pkts` has room for `want` ≤ BURST pointers; rx queue `self.queue`
            // exists and is this port's alone, and `&mut self` makes this its only user.
            let n = unsafe {
                sys::rocemu_eth_rx_burst(
                    self.eth.id(),
                    self.queue,
                    b.pkts.as_mut_ptr(),
                    want as u16,
                )
            };
            // From here `b` owns the n mbufs and frees them when it goes, even if `f` panics.
            b.len = usize::from(n);
            for &m in &b.pkts[..b.len] {
                // SAFETY: `m` is a valid mbuf the driver handed us.
                let segs = unsafe { sys::rocemu_pktmbuf_nb_segs(m) };
                if segs != 1 {
                    // A chain is a frame longer than one mbuf, i.e. than the MTU (the pool is
                    // sized for it; this port never asks for scatter, but net_pcap chains a long
                    // frame by itself): dropped and counted, never read as its first segment.
                    self.stats.rx_dropped += 1;
                    continue;
                }
                // SAFETY: a single-segment mbuf we own: its data_len bytes at the data pointer
                // lie in its buffer and nothing else uses them until `b` frees it after `f`.
                let frame = unsafe {
                    let len = usize::from(sys::rocemu_pktmbuf_data_len(m));
                    let data = sys::rocemu_pktmbuf_data(m) as *mut u8;
                    std::slice::from_raw_parts_mut(data, len)
                };
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += frame.len() as u64;
                delivered += 1;
                f(frame);
            }
            seen += b.len;
            if b.len < want {
                break;
            }
        }
        delivered
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        let _gate = self.eth.gate();
        let mut sent = self.drain_backlog(max);
        if !self.backlog.is_empty() {
            return sent;
        }
        let cap = self.frame_capacity;
        while sent < max {
            let want = (max - sent).min(BURST);
            let mut b = Burst::new();
            // SAFETY: `b.pkts` has room for `want` pointers; the pool is valid.
            let ret = unsafe {
                sys::rocemu_pktmbuf_alloc_bulk(self.pool.as_ptr(), b.pkts.as_mut_ptr(), want as u32)
            };
            if ret == 0 {
                b.len = want;
            } else {
                // All or nothing failed: take what is left one by one.
                while b.len < want {
                    // SAFETY: the pool is valid.
                    let m = unsafe { sys::rocemu_pktmbuf_alloc(self.pool.as_ptr()) };
                    if m.is_null() {
                        break;
                    }
                    b.pkts[b.len] = m;
                    b.len += 1;
                }
                if b.is_empty() {
                    break; // the pool is empty: the frames wait with the sender
                }
            }
            let got = b.len;
            let mut filled = 0;
            while filled < got {
                let m = b.pkts[filled];
                // SAFETY: a fresh single-segment mbuf we own, whose tailroom (the pool's frame
                // room) is at least `cap` (`open_port` caps it so); nothing else sees it until
                // sent.
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(sys::rocemu_pktmbuf_data(m) as *mut u8, cap)
                };
                let Some(len) = fill(buf) else { break };
                assert!(
                    len <= cap,
                    "tx_burst: fill returned {len} bytes for a {cap}-byte buffer"
                );
                // SAFETY: as above; len ≤ cap fits in the buffer.
                unsafe { sys::rocemu_pktmbuf_set_len(m, len as u16) };
                b.lens[filled] = len as u16;
                filled += 1;
            }
            b.truncate(filled);
            if filled == 0 {
                break;
            }
            let (n, bytes) = b.send(self.eth.id(), self.queue, filled);
            self.stats.tx_frames += n as u64;
            self.stats.tx_bytes += bytes;
            sent += n;
            if !b.is_empty() {
                // The driver is busy: keep the rest (the backlog is empty here) for next time.
                std::mem::swap(&mut self.backlog, &mut b);
                self.stalled_since = Some(Instant::now());
                break;
            }
            if filled < got {
                break; // `fill` has nothing more
            }
        }
        sent
    }

    fn flush(&mut self) -> bool {
        let _gate = self.eth.gate();
        self.drain_backlog(BURST);
        self.backlog.is_empty()
    }

    fn mac(&self) -> Mac {
        self.mac
    }

    fn frame_capacity(&self) -> usize {
        self.frame_capacity
    }

    fn stats(&self) -> PortStats {
        self.stats
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn link_up(&self) -> Option<bool> {
        Some(self.eth.link_up())
    }
}
