//! The event queue: a calendar of 4-ns buckets over the next 262 µs, and a binary heap for
//! what lies further (RNIC timeouts, rate-increase timers). Most events of a fabric fall a
//! frame time or a link delay ahead, so a push and a pop cost a few instructions instead of a
//! heap's logarithm of cache misses.
//!
//! Invariants: `pop` returns the entry of least (time, sequence), exactly as a binary heap of
//! the same entries would; every entry in bucket `b & MASK` has bucket number `b`, with
//! `cur ≤ b < cur + BUCKETS`; the far heap holds only entries at or beyond `cur + BUCKETS` when
//! pushed, and is drained into the calendar before `cur` reaches them.
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const SHIFT: u32 = 2;
const BUCKETS: u64 = 65_536;
const MASK: u64 = BUCKETS - 1;

/// What the queue orders: time, then the sequence number of the push.
pub trait Keyed {
    fn key(&self) -> (u64, u64);
}

#[derive(Debug)]
struct Far<T>(T);
impl<T: Keyed> PartialEq for Far<T> {
    fn eq(&self, o: &Self) -> bool {
        self.0.key() == o.0.key()
    }
}
impl<T: Keyed> Eq for Far<T> {}
impl<T: Keyed> PartialOrd for Far<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T: Keyed> Ord for Far<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.key().cmp(&o.0.key())
    }
}

/// A calendar queue of `T`.
#[derive(Debug)]
pub struct Calendar<T> {
    buckets: Vec<Vec<T>>,
    cur: u64,
    near: usize,
    far: BinaryHeap<Reverse<Far<T>>>,
}

impl<T: Keyed> Default for Calendar<T> {
    fn default() -> Self {
        Calendar {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            cur: 0,
            near: 0,
            far: BinaryHeap::new(),
        }
    }
}

impl<T: Keyed> Calendar<T> {
    pub fn len(&self) -> usize {
        self.near + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `e`; its time must not be before the last popped one's.
    pub fn push(&mut self, e: T) {
        let b = (e.key().0 >> SHIFT).max(self.cur);
        if b < self.cur + BUCKETS {
            self.buckets[(b & MASK) as usize].push(e);
            self.near += 1;
        } else {
            self.far.push(Reverse(Far(e)));
        }
    }

    fn migrate(&mut self) {
        while let Some(Reverse(Far(e))) = self.far.peek() {
            let b = e.key().0 >> SHIFT;
            if b >= self.cur + BUCKETS {
                break;
            }
            let Reverse(Far(e)) = self.far.pop().expect("peeked");
            self.buckets[(b.max(self.cur) & MASK) as usize].push(e);
            self.near += 1;
        }
    }

    /// Removes the entry of least (time, sequence).
    pub fn pop(&mut self) -> Option<T> {
        loop {
            if self.near == 0 {
                let Reverse(Far(e)) = self.far.peek()?;
                self.cur = self.cur.max(e.key().0 >> SHIFT);
                self.migrate();
            }
            let bucket = &mut self.buckets[(self.cur & MASK) as usize];
            if !bucket.is_empty() {
                let mut best = 0;
                for i in 1..bucket.len() {
                    if bucket[i].key() < bucket[best].key() {
                        best = i;
                    }
                }
                self.near -= 1;
                return Some(bucket.swap_remove(best));
            }
            self.cur += 1;
            self.migrate();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::{Rng as _, SeedableRng};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct E(u64, u64);
    impl Keyed for E {
        fn key(&self) -> (u64, u64) {
            (self.0, self.1)
        }
    }

    #[test]
    fn pops_in_the_order_of_a_binary_heap() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut c = Calendar::default();
        let mut h = BinaryHeap::new();
        let (mut now, mut seq) = (0u64, 0u64);
        for round in 0..200_000u64 {
            if rng.next_u64() % 3 != 0 || h.is_empty() {
                seq += 1;
                // Mostly near, some far ahead, some at the same instant.
                let d = match rng.next_u64() % 10 {
                    0 => rng.next_u64() % 100_000_000,
                    1 => 0,
                    _ => rng.next_u64() % 5_000,
                };
                let e = E(now + d, seq);
                c.push(e);
                h.push(Reverse((e.0, e.1)));
            } else {
                let a = c.pop().unwrap();
                let Reverse(b) = h.pop().unwrap();
                assert_eq!((a.0, a.1), b, "round {round}");
                now = a.0;
            }
            assert_eq!(c.len(), h.len());
        }
        while let Some(Reverse(b)) = h.pop() {
            let a = c.pop().unwrap();
            assert_eq!((a.0, a.1), b);
        }
        assert!(c.pop().is_none() && c.is_empty());
    }
}
