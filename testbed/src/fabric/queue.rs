//! The event queue: a calendar of 1-ns buckets over the next 65 µs, and a binary heap for
//! what lies further (RNIC timeouts, rate-increase timers). Most events of a fabric fall a
//! frame time or a link delay ahead, so a push and a pop cost a few instructions instead of a
//! heap's logarithm of cache misses.
//!
//! A bucket holds the events of one nanosecond as a list, newest first, of nodes in one arena
//! (a node freed by a pop is the next push's, so pushes write to memory still in the cache,
//! whatever bucket they go to); a pop reverses the current bucket's list once and takes its
//! entries oldest first. Pushes number their entries in increasing order, and a far entry
//! reaches its bucket before any entry of the same instant can be pushed there directly, so
//! oldest first is the order of the sequence numbers: no search.
//!
//! Invariants: `pop` returns the entry of least (time, sequence), exactly as a binary heap of
//! the same entries would, provided entries are pushed in increasing sequence order; every entry
//! in bucket `b & MASK` has time `b`, with `cur ≤ b < cur + BUCKETS`, its list newest first;
//! `ready` holds entries of time `cur` oldest first, all older than those in `cur`'s bucket; the
//! far heap holds only entries at or beyond `cur + BUCKETS` when pushed, and is drained into the
//! calendar before `cur` reaches them; a node is in exactly one list (a bucket, `ready`, `free`).
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const BUCKETS: u64 = 65_536;
const MASK: u64 = BUCKETS - 1;

/// What the queue orders: time, then the sequence number of the push (increasing from push to
/// push).
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

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node<T> {
    e: T,
    next: u32,
}

/// A calendar queue of `T`.
#[derive(Debug)]
pub struct Calendar<T> {
    /// Each instant's list (a node index, newest first).
    heads: Vec<u32>,
    nodes: Vec<Node<T>>,
    free: u32,
    /// The current instant's entries taken from its bucket, oldest first.
    ready: u32,
    cur: u64,
    near: usize,
    far: BinaryHeap<Reverse<Far<T>>>,
}

impl<T: Keyed> Default for Calendar<T> {
    fn default() -> Self {
        Calendar {
            heads: vec![NIL; BUCKETS as usize],
            nodes: Vec::new(),
            free: NIL,
            ready: NIL,
            cur: 0,
            near: 0,
            far: BinaryHeap::new(),
        }
    }
}

impl<T: Keyed + Copy> Calendar<T> {
    pub fn len(&self) -> usize {
        self.near + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `e`; its time must not be before the last popped one's, and its sequence number
    /// must be above every earlier push's.
    pub fn push(&mut self, e: T) {
        let b = e.key().0.max(self.cur);
        if b < self.cur + BUCKETS {
            self.link(b, e);
        } else {
            self.far.push(Reverse(Far(e)));
        }
    }

    fn link(&mut self, b: u64, e: T) {
        let head = &mut self.heads[(b & MASK) as usize];
        let n = if self.free != NIL {
            let n = self.free;
            let node = &mut self.nodes[n as usize];
            self.free = node.next;
            node.e = e;
            node.next = *head;
            n
        } else {
            self.nodes.push(Node { e, next: *head });
            (self.nodes.len() - 1) as u32
        };
        *head = n;
        self.near += 1;
    }

    fn migrate(&mut self) {
        while let Some(Reverse(Far(e))) = self.far.peek() {
            let b = e.key().0;
            if b >= self.cur + BUCKETS {
                break;
            }
            let Reverse(Far(e)) = self.far.pop().expect("peeked");
            self.link(b.max(self.cur), e);
        }
    }

    /// Removes the entry of least (time, sequence).
    pub fn pop(&mut self) -> Option<T> {
        loop {
            if self.ready != NIL {
                let n = self.ready;
                let node = &mut self.nodes[n as usize];
                self.ready = node.next;
                node.next = self.free;
                self.free = n;
                self.near -= 1;
                return Some(node.e);
            }
            let head = std::mem::replace(&mut self.heads[(self.cur & MASK) as usize], NIL);
            if head != NIL {
                // Newest first to oldest first.
                let (mut prev, mut n) = (NIL, head);
                while n != NIL {
                    let node = &mut self.nodes[n as usize];
                    let next = node.next;
                    node.next = prev;
                    prev = n;
                    n = next;
                }
                self.ready = prev;
                continue;
            }
            if self.near == 0 {
                let Reverse(Far(e)) = self.far.peek()?;
                self.cur = self.cur.max(e.key().0);
            } else {
                self.cur += 1;
            }
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
