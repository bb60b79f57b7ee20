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
//! A push number can be taken ahead of its entry ([`Calendar::reserve`]) and the entry pushed
//! with it later ([`Calendar::push_reserved`]): it is then served where it would have been had
//! it been pushed then. The fabric takes one for every transmitter's end and pushes it only when
//! the transmitter has more to send by then (most ends at a lightly loaded switch have not).
//! For that, a node keeps the low 32 bits of its push number; an entry from the far heap, older
//! than anything pushed within the calendar's span of the same instant, gets one that compares
//! as older than every push of the last 2^30.
//!
//! Invariants: `pop` returns the entry of least (time, push number), exactly as a binary heap
//! of the same entries would; every entry in bucket `b & MASK` has time `b`, with
//! `cur ≤ b < cur + BUCKETS`, its list oldest first (`tail` its last node); `ready` holds
//! entries of time `cur` oldest first, all older than those in `cur`'s bucket; the far heap
//! holds only entries at or beyond `cur + BUCKETS` when pushed, and is drained into the calendar
//! before `cur` reaches them; a node is in exactly one list (a bucket, `ready`, `free`).
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The calendar's span, ns: a push at least this far ahead goes to the far heap.
pub(crate) const BUCKETS: u64 = 65_536;
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
    /// The push number's low 32 bits (see the module's text for entries from the far heap).
    seq: u32,
}

/// `a` was pushed before `b` (push numbers' low bits, within 2^31 of each other).
#[inline]
fn older(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
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
    /// Push numbers given so far (pushes and reservations).
    seq: u64,
    /// The push number of the entry `pop` returned last.
    last: u64,
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
            last: 0,
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
        let s = self.reserve();
        let b = t.max(self.cur);
        if b < self.cur + BUCKETS {
            let n = self.node(v, s as u32);
            self.append(b, n);
        } else {
            self.far.push(Reverse(Far { t, seq: s, v }));
        }
    }

    /// Takes the next push number without pushing: [`Calendar::push_reserved`] may push an
    /// entry with it later, or nothing may.
    pub fn reserve(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    /// The push number of the entry the last [`Calendar::pop`] returned.
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// Adds `v` at time `t` with the push number `s` from [`Calendar::reserve`]: it is served
    /// where a push at the reservation would have been. `(t, s)` must not be before the last
    /// popped entry's (time, push number); `s` must be within 2^30 pushes of the newest, and
    /// reserved while `t` was within the calendar's span (not for the far heap).
    pub fn push_reserved(&mut self, t: u64, s: u64, v: V) {
        debug_assert!((t, s) > (self.cur, self.last) && s < self.seq);
        if t >= self.cur + BUCKETS {
            self.far.push(Reverse(Far { t, seq: s, v }));
            return;
        }
        let n = self.node(v, s as u32);
        if t != self.cur {
            // Most often the newest of its instant's list (its entries were mostly pushed a
            // link's delay before, this end's number a frame's time): then at its end.
            let tail = self.heads[(t & MASK) as usize][1];
            if tail == NIL || older(self.nodes[tail as usize].seq, s as u32) {
                self.append(t, n);
                return;
            }
        }
        self.near += 1;
        // The list it goes in: the current instant's entries being served (everything pushed
        // at this instant since it began is newer, so it goes before them), or its bucket's.
        let list = if t == self.cur {
            None
        } else {
            Some((t & MASK) as usize)
        };
        let (mut prev, mut at) = match list {
            None => (NIL, self.ready),
            Some(b) => (NIL, self.heads[b][0]),
        };
        while at != NIL && older(self.nodes[at as usize].seq, s as u32) {
            prev = at;
            at = self.nodes[at as usize].next;
        }
        self.nodes[n as usize].next = at;
        if prev != NIL {
            self.nodes[prev as usize].next = n;
        }
        match list {
            None => {
                if prev == NIL {
                    self.ready = n;
                }
            }
            Some(b) => {
                let [head, tail] = &mut self.heads[b];
                if prev == NIL {
                    *head = n;
                }
                if at == NIL {
                    *tail = n;
                }
            }
        }
    }

    fn node(&mut self, v: V, seq: u32) -> u32 {
        if self.free != NIL {
            let n = self.free;
            let node = &mut self.nodes[n as usize];
            self.free = node.next;
            node.v = v;
            node.next = NIL;
            node.seq = seq;
            // The next push's node: freed longer ago, as likely as not out of the cache.
            if self.free != NIL {
                prefetch(&self.nodes[self.free as usize]);
            }
            n
        } else {
            self.nodes.push(Node { v, next: NIL, seq });
            (self.nodes.len() - 1) as u32
        }
    }

    fn append(&mut self, b: u64, n: u32) {
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
            // Older than anything pushed into the calendar for its instant (module text).
            let n = self.node(f.v, self.seq.wrapping_sub(1 << 30) as u32);
            self.append(f.t.max(self.cur), n);
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
                let low = self.seq as u32;
                self.last = self
                    .seq
                    .saturating_sub(u64::from(low.wrapping_sub(node.seq)));
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
        // Reserved push numbers not pushed yet: (time, number).
        let mut reserved: Vec<(u64, u64)> = Vec::new();
        let (mut now, mut last) = (0u64, 0u64);
        for round in 0..300_000u64 {
            let r = rng.next_u64() % 12;
            if r < 6 || h.is_empty() {
                // Mostly near, some far ahead, some at the same instant.
                let d = match rng.next_u64() % 10 {
                    0 => rng.next_u64() % 100_000_000,
                    1 => 0,
                    _ => rng.next_u64() % 5_000,
                };
                let seq = c.seq;
                c.push(now + d, seq);
                h.push(Reverse((now + d, seq)));
            } else if r < 8 {
                // A transmitter's end: a number taken now for an instant up to 2 µs on (at
                // the current instant too), pushed later or never.
                let t = now + rng.next_u64() % 2_000;
                reserved.push((t, c.reserve()));
            } else if r < 9 && !reserved.is_empty() {
                let i = (rng.next_u64() % reserved.len() as u64) as usize;
                let (t, s) = reserved.swap_remove(i);
                if (t, s) > (now, last) {
                    c.push_reserved(t, s, s);
                    h.push(Reverse((t, s)));
                }
            } else {
                let a = c.pop().unwrap();
                let Reverse(b) = h.pop().unwrap();
                assert_eq!(a, b, "round {round}");
                assert_eq!(c.last_seq(), b.1, "round {round}");
                (now, last) = b;
                reserved.retain(|&r| r > (now, last));
            }
            assert_eq!(c.len(), h.len());
        }
        while let Some(Reverse(b)) = h.pop() {
            assert_eq!(c.pop().unwrap(), b);
        }
        assert!(c.pop().is_none() && c.is_empty());
    }
}
