//! Seeded impairments on any port: loss, reordering, duplication and corruption of frames in
//! both directions, on RoCEmu's side of a real datapath (the in-process link has its own). With
//! them, retransmission and the peer's recovery can be exercised against an implementation we did
//! not write (`rocemu perf --dev … --loss 0.02`).
//!
//! A reordered frame is held back for one to four bursts and then delivered ahead of newer
//! ones; a duplicate goes out again after the original; a corrupted frame has one bit flipped
//! past the Ethernet header (the receiver's ICRC check must catch it).
use super::{Port, PortStats};
use crate::inproc::Impairments;
use crate::rng::Rng;
use rocemu_wire::eth::Mac;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The [`Port`] methods a wrapper hands to its inner port (field `$inner`) unchanged: its MAC,
/// frame capacity, MTU, statistics and name.
macro_rules! inner_port_info {
    ($inner:ident) => {
        fn mac(&self) -> Mac {
            self.$inner.mac()
        }

        fn frame_capacity(&self) -> usize {
            self.$inner.frame_capacity()
        }

        fn mtu(&self) -> usize {
            self.$inner.mtu()
        }

        fn stats(&self) -> PortStats {
            self.$inner.stats()
        }

        fn name(&self) -> String {
            self.$inner.name()
        }

        fn tx_held(&self) -> bool {
            self.$inner.tx_held()
        }

        fn faults(&self) -> (u64, u64) {
            self.$inner.faults()
        }

        fn link_up(&self) -> Option<bool> {
            self.$inner.link_up()
        }
    };
}

/// What the impairments did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImpairStats {
    pub dropped: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

/// A port whose frames go through seeded impairments both ways.
pub struct ImpairedPort {
    inner: Box<dyn Port + Send>,
    imp: Impairments,
    rng: Rng,
    /// Frames held back, with the bursts left before they go.
    held_rx: VecDeque<(u32, Vec<u8>)>,
    held_tx: VecDeque<(u32, Vec<u8>)>,
    stats: ImpairStats,
}

impl std::fmt::Debug for ImpairedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImpairedPort")
            .field("inner", &self.inner.name())
            .field("imp", &self.imp)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

enum Verdict {
    Pass,
    Drop,
    Hold(u32),
    Twice,
}

impl ImpairedPort {
    pub fn new(inner: Box<dyn Port + Send>, imp: Impairments, seed: u64) -> ImpairedPort {
        ImpairedPort {
            inner,
            imp,
            rng: Rng::new(seed),
            held_rx: VecDeque::new(),
            held_tx: VecDeque::new(),
            stats: ImpairStats::default(),
        }
    }

    pub fn impair_stats(&self) -> ImpairStats {
        self.stats
    }

    /// Decides a frame's fate (and corrupts it in place if so drawn).
    fn judge(&mut self, frame: &mut [u8]) -> Verdict {
        if self.rng.chance(self.imp.loss) {
            self.stats.dropped += 1;
            return Verdict::Drop;
        }
        if frame.len() > 14 && self.rng.chance(self.imp.corrupt) {
            let i = 14 + self.rng.below(frame.len() as u64 - 14) as usize;
            frame[i] ^= 1 << self.rng.below(8);
            self.stats.corrupted += 1;
        }
        if self.rng.chance(self.imp.reorder) {
            self.stats.reordered += 1;
            return Verdict::Hold(1 + self.rng.below(4) as u32);
        }
        if self.rng.chance(self.imp.duplicate) {
            self.stats.duplicated += 1;
            return Verdict::Twice;
        }
        Verdict::Pass
    }

    fn due(q: &mut VecDeque<(u32, Vec<u8>)>) -> Option<Vec<u8>> {
        let i = q.iter().position(|(n, _)| *n == 0)?;
        q.remove(i).map(|(_, f)| f)
    }

    fn age(q: &mut VecDeque<(u32, Vec<u8>)>) {
        for (n, _) in q.iter_mut() {
            *n = n.saturating_sub(1);
        }
    }
}

impl Port for ImpairedPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        Self::age(&mut self.held_rx);
        let mut n = 0;
        while let Some(mut fr) = Self::due(&mut self.held_rx) {
            f(&mut fr);
            n += 1;
        }
        let mut held = std::mem::take(&mut self.held_rx);
        let mut inner = std::mem::replace(&mut self.inner, Box::new(NullPort));
        n += inner.rx_burst(max, &mut |fr| match self.judge(fr) {
            Verdict::Pass => f(fr),
            Verdict::Drop => {}
            Verdict::Hold(k) => held.push_back((k, fr.to_vec())),
            Verdict::Twice => {
                f(fr);
                f(fr);
            }
        });
        self.inner = inner;
        self.held_rx = held;
        n
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        Self::age(&mut self.held_tx);
        let mut held = std::mem::take(&mut self.held_tx);
        let mut inner = std::mem::replace(&mut self.inner, Box::new(NullPort));
        let sent = inner.tx_burst(max, &mut |buf| {
            // Frames whose turn has come go first.
            if let Some(i) = held.iter().position(|(k, _)| *k == 0) {
                let (_, f) = held.remove(i).expect("position is in range");
                let n = f.len().min(buf.len());
                buf[..n].copy_from_slice(&f[..n]);
                return Some(n);
            }
            loop {
                let n = fill(buf)?;
                match self.judge(&mut buf[..n]) {
                    Verdict::Pass => return Some(n),
                    Verdict::Drop => continue,
                    Verdict::Hold(k) => held.push_back((k, buf[..n].to_vec())),
                    Verdict::Twice => {
                        held.push_back((0, buf[..n].to_vec()));
                        return Some(n);
                    }
                }
            }
        });
        self.inner = inner;
        self.held_tx = held;
        sent
    }

    fn flush(&mut self) -> bool {
        for (k, _) in self.held_tx.iter_mut() {
            *k = 0;
        }
        while !self.held_tx.is_empty() {
            if self.tx_burst(super::BURST, &mut |_| None) == 0 {
                break;
            }
        }
        self.inner.flush()
    }

    inner_port_info!(inner);

    /// The inner port's, while nothing is held: held frames come due by turns, so an engine
    /// holding some must keep turning.
    fn wait_fds(&self) -> Option<[std::os::fd::RawFd; 2]> {
        if self.held_rx.is_empty() && self.held_tx.is_empty() {
            self.inner.wait_fds()
        } else {
            None
        }
    }

    fn impaired(&self) -> bool {
        !self.imp.is_none()
    }
}

/// Stands in for the inner port while its burst runs (the closures borrow the rest of `self`).
struct NullPort;

impl Port for NullPort {
    fn rx_burst(&mut self, _: usize, _: &mut dyn FnMut(&mut [u8])) -> usize {
        0
    }
    fn tx_burst(&mut self, _: usize, _: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        0
    }
    fn mac(&self) -> Mac {
        Mac([0; 6])
    }
    fn frame_capacity(&self) -> usize {
        0
    }
    fn stats(&self) -> PortStats {
        PortStats::default()
    }
    fn name(&self) -> String {
        String::new()
    }
}

/// A port that loses the first `n` frames it is asked to send that `pick` chooses, and nothing
/// else: the one lost READ response or DREP a test wants, where seeded random loss would need
/// luck. It says it is [`impaired`](Port::impaired), as a port with `--loss` does.
pub struct LoseFirst<P> {
    inner: P,
    pick: fn(&[u8]) -> bool,
    n: u32,
    lost: Arc<AtomicU32>,
}

impl<P: Port> std::fmt::Debug for LoseFirst<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoseFirst")
            .field("inner", &self.inner.name())
            .field("n", &self.n)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl<P: Port> LoseFirst<P> {
    pub fn new(inner: P, n: u32, pick: fn(&[u8]) -> bool) -> LoseFirst<P> {
        LoseFirst {
            inner,
            pick,
            n,
            lost: Arc::default(),
        }
    }

    /// How many it has lost so far, readable after the port has moved into an engine.
    pub fn lost(&self) -> Arc<AtomicU32> {
        self.lost.clone()
    }
}

impl<P: Port> Port for LoseFirst<P> {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        self.inner.rx_burst(max, f)
    }

    fn tx_burst(&mut self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> usize {
        let (pick, n, lost) = (self.pick, self.n, &self.lost);
        self.inner.tx_burst(max, &mut |buf| loop {
            let len = fill(buf)?;
            if lost.load(Ordering::Relaxed) < n && pick(&buf[..len]) {
                lost.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            return Some(len);
        })
    }

    fn flush(&mut self) -> bool {
        self.inner.flush()
    }

    inner_port_info!(inner);

    fn wait_fds(&self) -> Option<[std::os::fd::RawFd; 2]> {
        self.inner.wait_fds()
    }

    fn impaired(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::pipe::pipe;

    #[test]
    fn every_impairment_happens_and_nothing_else_is_lost() {
        let (a, mut b) = pipe(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]), 1500);
        let imp = Impairments {
            loss: 0.1,
            reorder: 0.1,
            duplicate: 0.1,
            corrupt: 0.1,
            ..Default::default()
        };
        let mut p = ImpairedPort::new(Box::new(a), imp, 7);
        let mut next = 0u32;
        for _ in 0..200 {
            p.tx_burst(8, &mut |buf| {
                next += 1;
                if next > 1000 {
                    return None;
                }
                buf[..64].fill(0);
                buf[14..18].copy_from_slice(&next.to_be_bytes());
                Some(64)
            });
        }
        p.flush();
        let mut got = Vec::new();
        b.rx_burst(usize::MAX, &mut |f| {
            got.push(u32::from_be_bytes([f[14], f[15], f[16], f[17]]))
        });
        let s = p.impair_stats();
        assert!(
            s.dropped > 50 && s.reordered > 50 && s.duplicated > 30 && s.corrupted > 50,
            "{s:?}"
        );
        assert_eq!(got.len() as u64, 1000 - s.dropped + s.duplicated);
        assert!(got.windows(2).any(|w| w[1] < w[0]), "something overtook");
        let mut sorted = got.clone();
        sorted.sort();
        sorted.dedup();
        // Every frame not dropped arrived (a corrupted counter aside).
        assert!(
            sorted.len() as u64 >= 1000 - s.dropped - s.corrupted,
            "{} {s:?}",
            sorted.len()
        );
    }

    #[test]
    fn lose_first_loses_exactly_the_first_n_picked_frames() {
        let (a, mut b) = pipe(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]), 1500);
        // Frames are one byte each, numbered 0..10; the odd ones are picked, two are lost.
        let mut p = LoseFirst::new(a, 2, |f| f[0] % 2 == 1);
        let lost = p.lost();
        let mut next = 0u8;
        p.tx_burst(16, &mut |buf| {
            (next < 10).then(|| {
                buf[0] = next;
                next += 1;
                1
            })
        });
        let mut got = Vec::new();
        b.rx_burst(16, &mut |f| got.push(f[0]));
        assert_eq!(got, [0, 2, 4, 5, 6, 7, 8, 9]);
        assert_eq!(lost.load(Ordering::Relaxed), 2);
        assert!(p.impaired());
    }
}
