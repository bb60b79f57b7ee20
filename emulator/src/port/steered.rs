//! One port per polling thread of a device on several threads whose frames arrive on whichever
//! queue the interface chose (AF_XDP queues: a veth picks the sender's queue, a NIC its RSS
//! hash of the UDP ports), not on their QP's: [`steered`] wraps each shard's port so that a frame
//! read by the wrong shard goes to the right one through a ring (`crate::steer`: one copy, no
//! lock), as `Rnic::shard_of_frame` names it (the BTH's DestQP at fixed offsets; anything else is
//! shard 0's). The engine above sees a port that gives it its own shard's frames only.
//!
//! Invariants: every frame read is given to exactly one shard's engine, or counted in the
//! reading shard's `rx_dropped` when the owner's ring stayed full for [`PUSH_WAIT`]
//! (as a NIC's full queue drops; RC retransmits it); rings are bounded, so nothing grows with
//! a slow thread; a shard waiting for room takes in its own frames meanwhile, so two shards
//! cannot wait on each other.
use super::{Port, PortStats};
use crate::engine::Doorbell;
use crate::rnic::QpnSteering;
use crate::steer::{frame_ring, FrameRx, FrameTx};
use rocemu_wire::eth::Mac;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};

/// Each shard's engine's doorbell, once its engine has one ([`WakeTable::set`]): a shard that
/// hands frames to another rings it, so that an engine asleep in `ppoll` (the `wake` idle
/// strategy) takes them at once rather than at the end of its nap.
#[derive(Debug, Default)]
pub struct WakeTable(Vec<OnceLock<Arc<Doorbell>>>);

impl WakeTable {
    /// Shard `k`'s engine's doorbell (from `Engine::doorbell`); a second call is ignored.
    pub fn set(&self, k: usize, d: Arc<Doorbell>) {
        if let Some(slot) = self.0.get(k) {
            let _ = slot.set(d);
        }
    }

    /// Rings shard `k`'s engine's doorbell, if it has one yet.
    fn ring(&self, k: usize) {
        if let Some(d) = self.0.get(k).and_then(OnceLock::get) {
            d.ring();
        }
    }
}

/// Slots of each ring between two shards.
pub const STEER_SLOTS: usize = 1024;

/// How long a shard retries a full ring (yielding the CPU between tries) before it drops the
/// frame. A time, not a count of yields: on a loaded machine a yield can return at once many
/// thousand times while the reader waits for a core, and a count then drops frames that a
/// few milliseconds would have saved.
pub const PUSH_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A shard's port, steering the frames it reads to their shards.
pub struct SteeredPort {
    inner: Box<dyn Port + Send>,
    k: usize,
    steering: QpnSteering,
    /// To each other shard (none to this one).
    to: Vec<Option<FrameTx>>,
    /// From each other shard.
    from: Vec<FrameRx>,
    steered: u64,
    dropped: u64,
    wake: Arc<WakeTable>,
}

impl std::fmt::Debug for SteeredPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteeredPort")
            .field("shard", &self.k)
            .field("steered", &self.steered)
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

/// Wraps shard k's port `ports[k]` of a device whose QPNs `steering` places; the table is for
/// the shards' engines' doorbells.
pub fn steered(
    ports: Vec<Box<dyn Port + Send>>,
    steering: QpnSteering,
) -> (Vec<SteeredPort>, Arc<WakeTable>) {
    let n = ports.len();
    let wake = Arc::new(WakeTable((0..n).map(|_| OnceLock::new()).collect()));
    let slot = ports.iter().map(|p| p.frame_capacity()).max().unwrap_or(0);
    let mut to: Vec<Vec<Option<FrameTx>>> =
        (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    let mut from: Vec<Vec<FrameRx>> = (0..n).map(|_| Vec::new()).collect();
    for (i, row) in to.iter_mut().enumerate() {
        for (j, t) in row.iter_mut().enumerate() {
            if i != j {
                let (tx, rx) = frame_ring(STEER_SLOTS, slot);
                *t = Some(tx);
                from[j].push(rx);
            }
        }
    }
    let ports = ports
        .into_iter()
        .zip(to.into_iter().zip(from))
        .enumerate()
        .map(|(k, (inner, (to, from)))| SteeredPort {
            inner,
            k,
            steering,
            to,
            from,
            steered: 0,
            dropped: 0,
            wake: wake.clone(),
        })
        .collect();
    (ports, wake)
}

impl SteeredPort {
    /// Frames this shard read and handed to another.
    pub fn steered(&self) -> u64 {
        self.steered
    }
}

impl Port for SteeredPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        // What the others read for this shard first, then the queue's own frames.
        let mut n = 0;
        for rx in &mut self.from {
            while n < max && rx.pop_with(&mut *f).is_some() {
                n += 1;
            }
        }
        if n < max {
            let (k, st, wake) = (self.k, self.steering, &self.wake);
            let (to, from) = (&mut self.to, &mut self.from);
            let (steered, dropped) = (&mut self.steered, &mut self.dropped);
            // The shards handed frames in this burst (one bit each; at most 64 shards).
            let mut handed = 0u64;
            // Frames of ours taken in while waiting for room in another shard's ring.
            let mut taken = 0;
            n += self.inner.rx_burst(max - n, &mut |frame| {
                let s = match rocemu_wire::frame::dest_qpn(frame) {
                    Some(q) => st.shard_of(q.value()) as usize,
                    None => 0,
                };
                if s == k {
                    f(frame);
                    return;
                }
                let Some(t) = to[s].as_mut().filter(|t| frame.len() <= t.slot_bytes()) else {
                    *dropped += 1;
                    return;
                };
                let mut tries = 0u32;
                let mut since = None;
                while !t.push(frame) {
                    // Shard s is behind (on a machine with fewer cores than polling threads,
                    // descheduled). Wait for it, boundedly: wake it, take in what it and the
                    // others handed us (two shards full of each other's frames must not wait
                    // on each other) and give it the CPU.
                    // The clock is read once every 64 tries: a yield costs far less than that.
                    if tries.is_multiple_of(64) {
                        let now = std::time::Instant::now();
                        if now.duration_since(*since.get_or_insert(now)) >= PUSH_WAIT {
                            *dropped += 1;
                            return;
                        }
                    }
                    tries = tries.wrapping_add(1);
                    wake.ring(s);
                    for rx in from.iter_mut() {
                        while rx.pop_with(&mut *f).is_some() {
                            taken += 1;
                        }
                    }
                    std::thread::yield_now();
                }
                *steered += 1;
                handed |= 1 << (s % 64);
            });
            n += taken;
            while handed != 0 {
                let s = handed.trailing_zeros() as usize;
                handed &= handed - 1;
                self.wake.ring(s);
            }
        }
        n
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        self.inner.tx_burst(max, fill)
    }

    fn flush(&mut self) -> bool {
        self.inner.flush()
    }

    fn tx_held(&self) -> bool {
        self.inner.tx_held()
    }

    fn mac(&self) -> Mac {
        self.inner.mac()
    }

    fn frame_capacity(&self) -> usize {
        self.inner.frame_capacity()
    }

    fn mtu(&self) -> usize {
        self.inner.mtu()
    }

    /// The port's, with the frames dropped at another shard's full ring.
    fn stats(&self) -> PortStats {
        let mut s = self.inner.stats();
        s.rx_dropped += self.dropped;
        s
    }

    fn faults(&self) -> (u64, u64) {
        self.inner.faults()
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    /// The port's descriptors (a frame another shard steered here rings this shard's engine's
    /// doorbell instead: see [`WakeTable`]).
    fn wait_fds(&self) -> Option<[RawFd; 2]> {
        self.inner.wait_fds()
    }

    fn link_up(&self) -> Option<bool> {
        self.inner.link_up()
    }
}
