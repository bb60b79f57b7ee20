//! The in-process link: frames between two RNICs in one process, with a latency and seeded
//! impairments (loss, reorder, duplicate, corrupt), all deterministic from the seed. A [`Link`]
//! is one direction; a [`Cable`] is two, one per side. Used by the tests, the virtual-time
//! [`super::Pair`], [`super::Loopback`], `rocemu demo` and in-process `rocemu perf`.
//!
//! Invariants: frames leave a link in order of their delivery time (FIFO when nothing reorders);
//! a frame is never delivered before `now + delay`; the link applies `Impairments::judge` to
//! each frame in turn (STYLE.md: turmoil / s2n-quic) and acts on its verdict — pass, drop,
//! corrupt one bit, deliver twice, or hold back so that later frames overtake it — and counts
//! what it did in [`LinkStats`].
use super::impair::{Fate, Impairments};
use crate::rng::Rng;
use crate::time::Nanos;
use std::collections::{BinaryHeap, VecDeque};

/// What happened on a link, for the demo's table and the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    at: std::cmp::Reverse<(Nanos, u64)>,
    frame: Vec<u8>,
}

/// One direction.
#[derive(Debug)]
pub struct Link {
    pub imp: Impairments,
    pub stats: LinkStats,
    rng: Rng,
    /// Frames in order of delivery time; FIFO when nothing reorders.
    fifo: VecDeque<(Nanos, Vec<u8>)>,
    held: BinaryHeap<Held>,
    seq: u64,
    free: Vec<Vec<u8>>,
}

impl Link {
    pub fn new(imp: Impairments, seed: u64) -> Link {
        Link {
            imp,
            stats: LinkStats::default(),
            rng: Rng::new(seed),
            fifo: VecDeque::new(),
            held: BinaryHeap::new(),
            seq: 0,
            free: Vec::new(),
        }
    }

    /// A buffer to build a frame in (recycled).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_default()
    }

    /// Gives a delivered frame's buffer back.
    pub fn recycle(&mut self, mut b: Vec<u8>) {
        if self.free.len() < 4096 {
            b.clear();
            self.free.push(b);
        }
    }

    /// Puts a frame on the link at `now`.
    pub fn send(&mut self, now: Nanos, mut frame: Vec<u8>) {
        self.stats.sent += 1;
        let at = now + self.imp.delay;
        if self.imp.is_none() {
            self.fifo.push_back((at, frame));
            return;
        }
        let (duplicated, reordered) = match self.imp.judge(&mut self.rng, &mut frame) {
            Fate::Dropped => {
                self.stats.dropped += 1;
                self.recycle(frame);
                return;
            }
            Fate::Delivered {
                corrupted,
                duplicated,
                reordered,
            } => {
                self.stats.corrupted += u64::from(corrupted);
                (duplicated, reordered)
            }
        };
        if duplicated {
            self.stats.duplicated += 1;
            let mut copy = self.buffer();
            copy.extend_from_slice(&frame);
            self.push(at, copy);
        }
        if reordered {
            self.stats.reordered += 1;
            let hold = self.imp.hold();
            self.seq += 1;
            self.held.push(Held {
                at: std::cmp::Reverse((at + hold, self.seq)),
                frame,
            });
            return;
        }
        self.push(at, frame);
    }

    fn push(&mut self, at: Nanos, frame: Vec<u8>) {
        if self.held.is_empty() && self.fifo.back().is_none_or(|(t, _)| *t <= at) {
            self.fifo.push_back((at, frame));
        } else {
            self.seq += 1;
            self.held.push(Held {
                at: std::cmp::Reverse((at, self.seq)),
                frame,
            });
        }
    }

    /// The next frame due at or before `now`.
    pub fn recv(&mut self, now: Nanos) -> Option<Vec<u8>> {
        let f = self.fifo.front().map(|(t, _)| *t);
        let h = self.held.peek().map(|h| h.at.0 .0);
        let take_fifo = match (f, h) {
            (Some(a), Some(b)) => a <= b,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        if take_fifo {
            let (t, _) = self.fifo.front()?;
            if *t > now {
                return None;
            }
            self.stats.delivered += 1;
            self.fifo.pop_front().map(|(_, f)| f)
        } else {
            if self.held.peek()?.at.0 .0 > now {
                return None;
            }
            self.stats.delivered += 1;
            self.held.pop().map(|h| h.frame)
        }
    }

    /// When the next frame is due.
    pub fn next_due(&self) -> Option<Nanos> {
        let f = self.fifo.front().map(|(t, _)| *t);
        let h = self.held.peek().map(|h| h.at.0 .0);
        match (f, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.fifo.len() + self.held.len()
    }
}

/// Two sides joined: `ab` carries frames from side A to side B, `ba` back.
#[derive(Debug)]
pub struct Cable {
    pub ab: Link,
    pub ba: Link,
}

impl Cable {
    pub fn new(imp: Impairments, seed: u64) -> Cable {
        Cable {
            ab: Link::new(imp, seed ^ 0xa5a5),
            ba: Link::new(imp, seed ^ 0x5a5a_0000),
        }
    }
    pub fn next_due(&self) -> Option<Nanos> {
        match (self.ab.next_due(), self.ba.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_link_is_fifo_with_latency() {
        let mut l = Link::new(
            Impairments {
                delay: Nanos(100),
                ..Default::default()
            },
            1,
        );
        l.send(Nanos(0), vec![1]);
        l.send(Nanos(10), vec![2]);
        assert_eq!(l.recv(Nanos(99)), None);
        assert_eq!(l.recv(Nanos(100)), Some(vec![1]));
        assert_eq!(l.next_due(), Some(Nanos(110)));
        assert_eq!(l.recv(Nanos(200)), Some(vec![2]));
        assert_eq!(l.recv(Nanos(300)), None);
    }

    #[test]
    fn impairments_are_deterministic_and_roughly_as_asked() {
        let imp = Impairments {
            loss: 0.1,
            reorder: 0.1,
            duplicate: 0.1,
            corrupt: 0.1,
            ..Default::default()
        };
        let run = |seed| {
            let mut l = Link::new(imp, seed);
            let mut out = Vec::new();
            for i in 0..2000u32 {
                l.send(Nanos(i as u64 * 10), i.to_be_bytes().to_vec());
                while let Some(f) = l.recv(Nanos(i as u64 * 10)) {
                    out.push(f);
                }
            }
            while let Some(f) = l.recv(Nanos(u64::MAX / 2)) {
                out.push(f);
            }
            (out, l.stats)
        };
        let (a, sa) = run(7);
        let (b, _) = run(7);
        assert_eq!(a, b, "same seed, same story");
        for n in [sa.dropped, sa.reordered, sa.duplicated, sa.corrupted] {
            assert!((120..290).contains(&n), "{sa:?}");
        }
        assert_eq!(sa.delivered, 2000 - sa.dropped + sa.duplicated);
        let inversions = a.windows(2).filter(|w| w[0] > w[1]).count();
        assert!(inversions > 50, "reordering shows: {inversions}");
    }
}
