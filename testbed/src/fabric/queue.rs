//! The event queue: a calendar of 1-ns buckets over the next 65 µs, and a binary heap for
//! what lies further (RNIC timeouts, rate-increase timers). Most events of a fabric fall a
//! frame time or a link delay ahead, so a push and a pop cost a few instructions instead of a
//! heap's logarithm of cache misses.
//!
//! Events are ordered by time, then by the order of their pushes. A bucket holds the events of
//! one nanosecond as a list, oldest first, of nodes in one arena (a node freed by a pop is the
//! next push's, so pushes write to memory still in the cache, whatever bucket they go to). A far
//! entry reaches its bucket before any entry of the same instant can be pushed there directly,
//! so oldest first is push order: no search. A node is the event alone (its time is its
//! bucket's). A node is read a microsecond of simulated time after it was written, long out of
//! the cache: pops prefetch the next node of the current list and the first node of the bucket
//! `AHEAD` nanoseconds on.
//!
//! Invariants: `pop` returns the entry of least (time, push number), exactly as a binary heap
//! of the same entries would; every entry in bucket `b & MASK` has time `b`, with
//! `cur ≤ b < cur + BUCKETS`, its list oldest first (`tail` its last node); `ready` holds
//! entries of time `cur` oldest first, all older than those in `cur`'s bucket; the far heap
//! holds only entries at or beyond `cur + BUCKETS` when pushed, and is drained into the calendar
//! before `cur` reaches them; a node is in exactly one list (a bucket, `ready`, `free`).
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const BUCKETS: u64 = 65_536;
const MASK: u64 = BUCKETS - 1;
const NIL: u32 = u32::MAX;
/// How far ahead, ns, a bucket's first node is prefetched.
const AHEAD: u64 = 16;

/// Asks the CPU to bring `r`'s cache line in (a hint: no effect on what the program computes).
#[inline(always)]
fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and writes nothing the program sees; the address is a
    // valid reference's.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((r as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

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
    /// Each instant's list: its first and last node.
    heads: Vec<[u32; 2]>,
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
            heads: vec![[NIL; 2]; BUCKETS as usize],
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
        let n = if self.free != NIL {
            let n = self.free;
            let node = &mut self.nodes[n as usize];
            self.free = node.next;
            node.v = v;
            node.next = NIL;
            n
        } else {
            self.nodes.push(Node { v, next: NIL });
            (self.nodes.len() - 1) as u32
        };
        let [head, tail] = &mut self.heads[(b & MASK) as usize];
        if *head == NIL {
            *head = n;
        } else {
            self.nodes[*tail as usize].next = n;
        }
        *tail = n;
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
                let v = node.v;
                if self.ready != NIL {
                    prefetch(&self.nodes[self.ready as usize]);
                }
                return Some((self.cur, v));
            }
            let [head, _] =
                std::mem::replace(&mut self.heads[(self.cur & MASK) as usize], [NIL; 2]);
            if head != NIL {
                self.ready = head;
                continue;
            }
            if self.near == 0 {
                let Reverse(f) = self.far.peek()?;
                self.cur = self.cur.max(f.t);
            } else {
                self.cur += 1;
            }
            self.migrate();
            let [ahead, _] = self.heads[((self.cur + AHEAD) & MASK) as usize];
            if ahead != NIL {
                prefetch(&self.nodes[ahead as usize]);
            }
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
