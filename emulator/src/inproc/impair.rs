//! Impairments of one direction of the in-process link, and the rule that applies them.
//!
//! Invariants: every decision is drawn from the link's own seeded generator, in a fixed order
//! (loss, then corruption, then duplication, then reordering), so that a seed replays a run frame
//! for frame; a dropped frame is never also corrupted, duplicated or held back; with no
//! impairment set ([`Impairments::is_none`]) no random number is drawn at all.
//!
//! The same [`Impairments`] drive [`crate::port::impair::ImpairedPort`] on real datapaths; that
//! port decides with its own rule (it counts bursts, not nanoseconds).
use crate::rng::Rng;
use crate::time::Nanos;

/// Per-frame probabilities (0…1) and delays of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Impairments {
    pub loss: f64,
    pub reorder: f64,
    pub duplicate: f64,
    pub corrupt: f64,
    /// One-way latency.
    pub delay: Nanos,
    /// How long a reordered frame is held back (later frames overtake it).
    pub reorder_delay: Nanos,
}

impl Impairments {
    pub fn none() -> Impairments {
        Impairments::default()
    }
    pub fn is_none(&self) -> bool {
        self.loss <= 0.0 && self.reorder <= 0.0 && self.duplicate <= 0.0 && self.corrupt <= 0.0
    }

    /// How long a reordered frame waits: `reorder_delay`, or 20 µs when none is set.
    pub(crate) fn hold(&self) -> Nanos {
        if self.reorder_delay.0 > 0 {
            self.reorder_delay
        } else {
            Nanos::from_micros(20)
        }
    }

    /// Decides one frame's fate, flipping one of its bits in place when corruption is drawn.
    pub(crate) fn judge(&self, rng: &mut Rng, frame: &mut [u8]) -> Fate {
        if rng.chance(self.loss) {
            return Fate::Dropped;
        }
        let mut corrupted = false;
        if !frame.is_empty() && rng.chance(self.corrupt) {
            let bit = rng.below(frame.len() as u64 * 8);
            frame[(bit / 8) as usize] ^= 1 << (bit % 8);
            corrupted = true;
        }
        let duplicated = rng.chance(self.duplicate);
        let reordered = rng.chance(self.reorder);
        Fate::Delivered {
            corrupted,
            duplicated,
            reordered,
        }
    }
}

/// What [`Impairments::judge`] decided for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Dropped,
    /// Delivered (possibly with one bit flipped); a duplicate goes on time, the original is held
    /// back when `reordered`.
    Delivered {
        corrupted: bool,
        duplicated: bool,
        reordered: bool,
    },
}
