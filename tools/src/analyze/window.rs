//! Bounded per-QP state: the set of PSNs seen as a sliding bitmap, a series that thins itself
//! out, and time buckets that widen themselves, so that a hostile or endless capture keeps
//! each QP's memory fixed.
use rocemu_wire::Psn;

/// How many PSNs below the highest one seen a [`PsnWindow`] remembers (4 KiB of bits).
/// A requester has far fewer packets outstanding than this; a PSN further back, or further
/// ahead, than the window is a jump (a new connection on the same QPN, a capture that missed a
/// stretch, or garbage), not a retransmission.
pub const PSN_WINDOW: u32 = 1 << 15;

/// What [`PsnWindow::mark`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Not seen before; `missing` PSNs between the highest one seen and this one were skipped.
    New { missing: u32 },
    /// Seen before (within the window).
    Seen,
    /// More than the window away from the highest PSN seen: the window starts afresh there.
    Jump,
}

/// The PSNs seen on one QP: a ring of [`PSN_WINDOW`] bits ending at `high` (one past the
/// highest PSN seen), in 24-bit serial order, so the PSN wrap needs no special case.
#[derive(Debug, Clone, Default)]
pub struct PsnWindow {
    high: Option<Psn>,
    bits: Vec<u64>,
}

impl PsnWindow {
    fn slot(p: Psn) -> usize {
        (p.value() % PSN_WINDOW) as usize
    }

    fn set(&mut self, p: Psn) {
        let i = Self::slot(p);
        self.bits[i / 64] |= 1 << (i % 64);
    }

    fn get(&self, p: Psn) -> bool {
        let i = Self::slot(p);
        self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Clears `len` slots starting at `from` (word by word: at most the window's 512 words).
    fn clear(&mut self, from: Psn, len: u32) {
        if len >= PSN_WINDOW {
            self.bits.iter_mut().for_each(|w| *w = 0);
            return;
        }
        let mut i = Self::slot(from);
        let mut left = len as usize;
        while left > 0 {
            let off = i % 64;
            let n = (64 - off).min(left).min(PSN_WINDOW as usize - i);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << off
            };
            self.bits[i / 64] &= !mask;
            left -= n;
            i = (i + n) % PSN_WINDOW as usize;
        }
    }

    /// One past the highest PSN seen.
    pub fn high(&self) -> Option<Psn> {
        self.high
    }

    /// True when `p` was seen and is still inside the window.
    pub fn contains(&self, p: Psn) -> bool {
        match self.high {
            None => false,
            Some(h) => {
                let behind = h.distance_from(p);
                (1..=PSN_WINDOW).contains(&behind) && self.get(p)
            }
        }
    }

    /// Records `p` and says whether it was new.
    pub fn mark(&mut self, p: Psn) -> Mark {
        if self.bits.is_empty() {
            self.bits = vec![0; (PSN_WINDOW / 64) as usize];
        }
        let Some(h) = self.high else {
            self.high = Some(p.next());
            self.set(p);
            return Mark::New { missing: 0 };
        };
        let d = p.diff(h);
        if d >= 0 {
            let ahead = d as u32;
            if ahead >= PSN_WINDOW {
                self.clear(p, PSN_WINDOW);
                self.high = Some(p.next());
                self.set(p);
                return Mark::Jump;
            }
            self.clear(h, ahead + 1);
            self.set(p);
            self.high = Some(p.next());
            Mark::New { missing: ahead }
        } else if d.unsigned_abs() <= PSN_WINDOW {
            if self.get(p) {
                Mark::Seen
            } else {
                self.set(p);
                Mark::New { missing: 0 }
            }
        } else {
            self.clear(p, PSN_WINDOW);
            self.high = Some(p.next());
            self.set(p);
            Mark::Jump
        }
    }
}

/// At most `cap` points of a series: when full, every other point goes and only every
/// `stride`-th new one is kept (the stride doubles), so the series spans the whole capture.
#[derive(Debug, Clone)]
pub struct Thinned<T> {
    cap: usize,
    stride: u64,
    n: u64,
    pub points: Vec<T>,
}

impl<T> Thinned<T> {
    pub fn new(cap: usize) -> Self {
        Thinned {
            cap: cap.max(2),
            stride: 1,
            n: 0,
            points: Vec::new(),
        }
    }

    pub fn push(&mut self, v: T) {
        if self.n.is_multiple_of(self.stride) {
            if self.points.len() >= self.cap {
                let mut i = 0;
                self.points.retain(|_| {
                    i += 1;
                    i % 2 == 1
                });
                self.stride *= 2;
            }
            if self.n.is_multiple_of(self.stride) {
                self.points.push(v);
            }
        }
        self.n += 1;
    }
}

/// Bytes per time bucket from time 0, at most [`Buckets::MAX`] buckets: when time runs past
/// the last one, neighbouring buckets merge and the width doubles.
#[derive(Debug, Clone)]
pub struct Buckets {
    pub width_ns: u64,
    pub bytes: Vec<u64>,
}

impl Buckets {
    pub const MAX: usize = 256;
    /// The first width: 100 µs.
    pub const FIRST_WIDTH_NS: u64 = 100_000;

    pub fn new() -> Buckets {
        Buckets {
            width_ns: Self::FIRST_WIDTH_NS,
            bytes: Vec::new(),
        }
    }

    pub fn add(&mut self, t_ns: u64, n: u64) {
        let mut i = t_ns / self.width_ns;
        while i >= Self::MAX as u64 {
            self.widen();
            i = t_ns / self.width_ns;
        }
        let i = i as usize;
        if self.bytes.len() <= i {
            self.bytes.resize(i + 1, 0);
        }
        self.bytes[i] += n;
    }

    /// Makes the width (at least) `w` so that series of different QPs line up.
    pub fn widen_to(&mut self, w: u64) {
        while self.width_ns < w {
            self.widen();
        }
    }

    fn widen(&mut self) {
        let merged = self.bytes.chunks(2).map(|c| c.iter().sum()).collect();
        self.bytes = merged;
        self.width_ns = self.width_ns.saturating_mul(2);
    }
}

impl Default for Buckets {
    fn default() -> Self {
        Self::new()
    }
}

/// Count, minimum, maximum and mean of durations, and the first [`Stat::SAMPLES`] samples
/// for the median and the 99th percentile.
#[derive(Debug, Clone, Default)]
pub struct Stat {
    pub n: u64,
    pub sum: u128,
    pub min: u64,
    pub max: u64,
    samples: Vec<u64>,
}

impl Stat {
    pub const SAMPLES: usize = 4096;

    pub fn add(&mut self, v: u64) {
        if self.n == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.n += 1;
        self.sum += u128::from(v);
        if self.samples.len() < Self::SAMPLES {
            self.samples.push(v);
        }
    }

    pub fn mean(&self) -> Option<u64> {
        (self.n > 0).then(|| (self.sum / u128::from(self.n)) as u64)
    }

    /// The `q` quantile (0…1) of the samples kept.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.samples.is_empty() {
            return None;
        }
        let mut s = self.samples.clone();
        s.sort_unstable();
        let i = ((s.len() - 1) as f64 * q).round() as usize;
        s.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_tells_new_seen_and_gaps_across_the_wrap() {
        let mut w = PsnWindow::default();
        let start = Psn::new(Psn::MODULUS - 3);
        assert_eq!(w.mark(start), Mark::New { missing: 0 });
        assert_eq!(w.mark(start.add(1)), Mark::New { missing: 0 });
        assert_eq!(w.mark(start.add(2)), Mark::New { missing: 0 });
        // Across the wrap, skipping two.
        assert_eq!(w.mark(start.add(5)), Mark::New { missing: 2 });
        assert_eq!(w.mark(start), Mark::Seen);
        assert_eq!(w.mark(start.add(5)), Mark::Seen);
        // A hole filled late is new once.
        assert_eq!(w.mark(start.add(3)), Mark::New { missing: 0 });
        assert_eq!(w.mark(start.add(3)), Mark::Seen);
        assert!(w.contains(start.add(1)));
        assert!(!w.contains(start.add(4)));
    }

    #[test]
    fn window_forgets_what_slides_out_and_resets_on_jumps() {
        let mut w = PsnWindow::default();
        w.mark(Psn::new(10));
        for i in 11..11 + PSN_WINDOW {
            assert_eq!(w.mark(Psn::new(i)), Mark::New { missing: 0 });
        }
        // 10 is now more than the window behind: a jump, not a retransmission.
        assert_eq!(w.mark(Psn::new(10)), Mark::Jump);
        assert_eq!(w.mark(Psn::new(11)), Mark::New { missing: 0 });
        assert_eq!(w.mark(Psn::new(10)), Mark::Seen);
        assert_eq!(w.mark(Psn::new(5_000_000)), Mark::Jump);
        assert_eq!(w.mark(Psn::new(5_000_001)), Mark::New { missing: 0 });
        // The slots reused after the jump were cleared.
        assert!(!w.contains(Psn::new(5_000_000 - 7)));
    }

    #[test]
    fn thinned_series_and_buckets_stay_bounded() {
        let mut t = Thinned::new(100);
        for i in 0..1_000_000u64 {
            t.push(i);
        }
        assert!(t.points.len() <= 100);
        assert_eq!(t.points[0], 0);
        assert!(*t.points.last().unwrap() > 900_000);
        let mut b = Buckets::new();
        for s in 0..10_000u64 {
            b.add(s * 1_000_000_000, 1);
        }
        assert!(b.bytes.len() <= Buckets::MAX);
        assert_eq!(b.bytes.iter().sum::<u64>(), 10_000);
    }
}
