//! Frames handed from one polling thread to another, for a device on several threads whose
//! frames may arrive on a thread other than their QP's: a bounded single-producer,
//! single-consumer ring of fixed slots ([`frame_ring`]). The producer copies a frame into the
//! next free slot and publishes it with one release store; the consumer handles it in place
//! (the RNIC's receive path takes `&mut [u8]`) and frees the slot with another. No allocation
//! after the ring is made, no lock, and each side reads the other's index only when its cached
//! copy says the ring is full (or empty).
//!
//! Invariants: a slot is written only by the producer while it is free (`tail - head <
//! slots`), and read or written only by the consumer while it is published (`head < tail`);
//! the indexes only grow (wrapping at 2^64, never reached); a frame longer than a slot, or one
//! pushed while every slot is taken, is refused, counted by the caller as a NIC counts a full
//! queue's drops: a ring never grows.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An index on a cache line of its own (two lines: the adjacent-line prefetcher pairs them).
#[repr(align(128))]
struct Padded(AtomicUsize);

struct Shared {
    /// The next slot the consumer reads.
    head: Padded,
    /// The next slot the producer writes.
    tail: Padded,
    /// `slots` slots of `4 + slot_bytes` bytes: the frame's length, then the frame.
    buf: Box<[UnsafeCell<u8>]>,
    slots: usize,
    slot_bytes: usize,
}

// SAFETY: the buffer's slots are shared between exactly one producer and one consumer, each
// touching a slot only while the indexes give it to them (see the module's invariants); the
// indexes are atomics.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

impl Shared {
    /// The start of slot `i` (modulo the slot count).
    fn slot(&self, i: usize) -> *mut u8 {
        let at = (i & (self.slots - 1)) * (4 + self.slot_bytes);
        // `UnsafeCell<u8>` has the layout of `u8`; the range is within `buf`.
        self.buf[at..at + 4 + self.slot_bytes].as_ptr() as *mut u8
    }
}

/// The producing end of a frame ring.
pub struct FrameTx {
    s: Arc<Shared>,
    tail: usize,
    /// The consumer's index as last read: the ring has room while `tail - head < slots`.
    head: usize,
}

/// The consuming end of a frame ring.
pub struct FrameRx {
    s: Arc<Shared>,
    head: usize,
    /// The producer's index as last read.
    tail: usize,
}

impl std::fmt::Debug for FrameTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FrameTx({} of {} slots)",
            self.tail - self.head,
            self.s.slots
        )
    }
}
impl std::fmt::Debug for FrameRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameRx(at {})", self.head)
    }
}

/// A ring of `slots` (rounded up to a power of two, at least 2) frames of at most
/// `slot_bytes` bytes each.
pub fn frame_ring(slots: usize, slot_bytes: usize) -> (FrameTx, FrameRx) {
    let slots = slots.max(2).next_power_of_two();
    let s = Arc::new(Shared {
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
        buf: (0..slots * (4 + slot_bytes))
            .map(|_| UnsafeCell::new(0))
            .collect(),
        slots,
        slot_bytes,
    });
    (
        FrameTx {
            s: s.clone(),
            tail: 0,
            head: 0,
        },
        FrameRx {
            s,
            head: 0,
            tail: 0,
        },
    )
}

impl FrameTx {
    /// Copies `frame` into the next slot and publishes it. False (nothing written) when the
    /// frame is longer than a slot or every slot is taken.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        if frame.len() > self.s.slot_bytes {
            return false;
        }
        if self.tail - self.head == self.s.slots {
            self.head = self.s.head.0.load(Ordering::Acquire);
            if self.tail - self.head == self.s.slots {
                return false;
            }
        }
        let p = self.s.slot(self.tail);
        // SAFETY: slot `tail` is free (tail - head < slots, and the consumer released it with
        // its store of head, which the acquire load above saw), so only this end touches it
        // until the store below; the slot holds 4 + slot_bytes ≥ 4 + frame.len() bytes.
        unsafe {
            p.cast::<[u8; 4]>()
                .write((frame.len() as u32).to_ne_bytes());
            std::ptr::copy_nonoverlapping(frame.as_ptr(), p.add(4), frame.len());
        }
        self.tail += 1;
        self.s.tail.0.store(self.tail, Ordering::Release);
        true
    }

    /// The longest frame a slot holds ([`FrameTx::push`] refuses longer ones).
    pub fn slot_bytes(&self) -> usize {
        self.s.slot_bytes
    }

    /// Frames pushed and not yet taken, as far as this end knows.
    pub fn queued(&self) -> usize {
        self.tail - self.s.head.0.load(Ordering::Relaxed)
    }
}

impl FrameRx {
    /// Hands the oldest published frame to `f` in place, then frees its slot; `None` when the
    /// ring is empty.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if self.head == self.tail {
            self.tail = self.s.tail.0.load(Ordering::Acquire);
            if self.head == self.tail {
                return None;
            }
        }
        let p = self.s.slot(self.head);
        // SAFETY: slot `head` is published (head < tail, and the acquire load of tail saw the
        // producer's writes to it), and the producer does not touch it again until the store
        // of head below; its length was written by the producer and is at most slot_bytes.
        let r = unsafe {
            let len = u32::from_ne_bytes(p.cast::<[u8; 4]>().read()) as usize;
            f(std::slice::from_raw_parts_mut(
                p.add(4),
                len.min(self.s.slot_bytes),
            ))
        };
        self.head += 1;
        self.s.head.0.store(self.head, Ordering::Release);
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_in_order_and_a_full_ring_refuses() {
        let (mut tx, mut rx) = frame_ring(3, 16);
        assert!(tx.push(&[1, 2, 3]));
        assert!(tx.push(&[4; 16]));
        assert!(!tx.push(&[0; 17]), "longer than a slot");
        assert!(tx.push(&[5]));
        assert!(tx.push(&[]));
        assert!(!tx.push(&[6]), "four slots, all taken");
        assert_eq!(tx.queued(), 4);
        assert_eq!(rx.pop_with(|f| f.to_vec()), Some(vec![1, 2, 3]));
        assert!(tx.push(&[7, 7]), "a slot was freed");
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| rx.pop_with(|f| f.to_vec())).collect();
        assert_eq!(got, vec![vec![4; 16], vec![5], vec![], vec![7, 7]]);
        assert_eq!(rx.pop_with(|f| f.len()), None);
    }

    /// One thread pushes a numbered stream, another takes it: every frame arrives once, in
    /// order, whole; a refused push is retried, so nothing is lost.
    #[test]
    fn two_threads_pass_every_frame_in_order() {
        let (mut tx, mut rx) = frame_ring(64, 64);
        const N: u32 = 200_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                let len = 4 + (i % 60) as usize;
                let mut f = vec![(i % 251) as u8; len];
                f[..4].copy_from_slice(&i.to_le_bytes());
                while !tx.push(&f) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u32;
        while next < N {
            rx.pop_with(|f| {
                let i = u32::from_le_bytes(f[..4].try_into().unwrap());
                assert_eq!(i, next);
                assert_eq!(f.len(), 4 + (i % 60) as usize);
                assert!(f[4..].iter().all(|&b| b == (i % 251) as u8));
                f[4..].fill(0); // in place: the consumer may write the slot
                next += 1;
            });
        }
        t.join().unwrap();
    }
}
