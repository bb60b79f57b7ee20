//! The event queue: a calendar of 1-ns buckets over the next 65 µs, and a binary heap for
//! what lies further (RNIC timeouts, rate-increase timers). Most events of a fabric fall a
//! frame time or a link delay ahead, so a push and a pop cost a few instructions instead of a
//! heap's logarithm of cache misses.
//!
//! Events are ordered by time, then by the order of their pushes. A bucket holds the events of
//! one nanosecond as a list, newest first, of nodes in one arena (a node freed by a pop is the
//! next push's, so pushes write to memory still in the cache, whatever bucket they go to); a pop
//! reverses the current bucket's list once and takes its entries oldest first. A far entry
//! reaches its bucket before any entry of the same instant can be pushed there directly, so
//! oldest first is push order: no search. A node is the event alone (its time is its bucket's),
//! 16 bytes for the fabric's events.
//!
//! Invariants: `pop` returns the entry of least (time, push number), exactly as a binary heap
//! of the same entries would; every entry in bucket `b & MASK` has time `b`, with
//! `cur ≤ b < cur + BUCKETS`, its list newest first; `ready` holds entries of time `cur` oldest
//! first, all older than those in `cur`'s bucket; the far heap holds only entries at or beyond
//! `cur + BUCKETS` when pushed, and is drained into the calendar before `cur` reaches them; a
//! node is in exactly one list (a bucket, `ready`, `free`).
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const BUCKETS: u64 = 65_536;
const MASK: u64 = BUCKETS - 1;
const NIL: u32 = u32::MAX;

/// An entry beyond the calendar, ordered by (time, push number).
#[derive(Debug)]
struct Far<V> {
    t: u64,
    seq: u64,
    v: V,
}
impl<V> PartialEq for Far<V> {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl<V> Eq for Far<V> {}
impl<V> PartialOrd for Far<V> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<V> Ord for Far<V> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.t, self.seq).cmp(&(o.t, o.seq))
    }
}

#[derive(Debug)]
struct Node<V> {
    v: V,
    next: u32,
}

/// A calendar queue of events `V`.
#[derive(Debug)]
pub struct Calendar<V> {
    /// Each instant's list (a node index, newest first).
    heads: Vec<u32>,
    nodes: Vec<Node<V>>,
    free: u32,
    /// The current instant's entries taken from its bucket, oldest first.
    ready: u32,
    cur: u64,
    near: usize,
    seq: u64,
    far: BinaryHeap<Reverse<Far<V>>>,
}

impl<V> Default for Calendar<V> {
    fn default() -> Self {
        Calendar {
            heads: vec![NIL; BUCKETS as usize],
            nodes: Vec::new(),
            free: NIL,
            ready: NIL,
            cur: 0,
            near: 0,
            seq: 0,
            far: BinaryHeap::new(),
        }
    }
}

impl<V: Copy> Calendar<V> {
    pub fn len(&self) -> usize {
        self.near + self.far.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `v` at time `t`, which must not be before the last popped entry's.
    pub fn push(&mut self, t: u64, v: V) {
        let b = t.max(self.cur);
        if b < self.cur + BUCKETS {
            self.link(b, v);
        } else {
            self.seq += 1;
            self.far.push(Reverse(Far {
                t,
                seq: self.seq,
                v,
            }));
        }
    }

    fn link(&mut self, b: u64, v: V) {
        let head = &mut self.heads[(b & MASK) as usize];
        let n = if self.free != NIL {
            let n = self.free;
            let node = &mut self.nodes[n as usize];
            self.free = node.next;
            node.v = v;
            node.next = *head;
            n
        } else {
            self.nodes.push(Node { v, next: *head });
            (self.nodes.len() - 1) as u32
        };
        *head = n;
        self.near += 1;
    }

    fn migrate(&mut self) {
        while let Some(Reverse(f)) = self.far.peek() {
            if f.t >= self.cur + BUCKETS {
                break;
            }
            let Reverse(f) = self.far.pop().expect("peeked");
            self.link(f.t.max(self.cur), f.v);
        }
    }

    /// Removes the entry of least (time, push number): its time and itself.
    pub fn pop(&mut self) -> Option<(u64, V)> {
        loop {
            if self.ready != NIL {
                let n = self.ready;
                let node = &mut self.nodes[n as usize];
                self.ready = node.next;
                node.next = self.free;
                self.free = n;
                self.near -= 1;
                return Some((self.cur, node.v));
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
                let Reverse(f) = self.far.peek()?;
                self.cur = self.cur.max(f.t);
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
                c.push(now + d, seq);
                h.push(Reverse((now + d, seq)));
            } else {
                let a = c.pop().unwrap();
                let Reverse(b) = h.pop().unwrap();
                assert_eq!(a, b, "round {round}");
                now = a.0;
            }
            assert_eq!(c.len(), h.len());
        }
        while let Some(Reverse(b)) = h.pop() {
            assert_eq!(c.pop().unwrap(), b);
        }
        assert!(c.pop().is_none() && c.is_empty());
    }
}
