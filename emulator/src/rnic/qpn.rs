//! QP numbers and the QP table's slots.
//!
//! A QPN is the image of (generation, slot) under a keyed permutation of the 24-bit space: it
//! looks random (QPNs must not be guessable, ReDMArk), and maps back to its slot in a few
//! arithmetic operations, without a hash lookup. The low [`SLOT_BITS`] bits of the permutation's
//! input are the slot (enough for `max_qp` QPs), the high bits the slot's generation.
//!
//! Invariants:
//! * the table never holds more than [`MAX_SLOTS`] slots, whatever the number of creations;
//! * a destroyed QP's slot is reused only with the next generation, so the QPN differs, and
//!   the QP found through a QPN is the one whose own QPN it is (the caller checks
//!   `qp.qpn == qpn`): a stale QPN reaches nothing;
//! * a freed slot waits until [`FREE_RESERVE`] slots are free (or the table is full) before it
//!   is used again, so that a tight create/destroy loop cycles through many slots and a QPN
//!   comes back only after `FREE_RESERVE × 2^GEN_BITS` creations (Linux allocates QPNs
//!   cyclically for the same reason);
//! * QPNs 0 and 1 (the special QPs: QP1 is created apart, with its fixed number) and 0xFFFFFF
//!   (multicast) are never handed out: an input whose image is one of them is skipped by moving to the next
//!   generation.
use crate::rng::KeyRng;
use rocemu_wire::Qpn;
use std::collections::VecDeque;

/// Bits of the permutation's input that select the slot.
pub(crate) const SLOT_BITS: u32 = 17;
/// The most slots the table ever holds.
pub(crate) const MAX_SLOTS: usize = 1 << SLOT_BITS;
const GEN_BITS: u32 = 24 - SLOT_BITS;
const GEN_MASK: u8 = (1 << GEN_BITS) - 1;
/// Free slots kept before the oldest of them is reused.
pub(crate) const FREE_RESERVE: usize = 256;

/// A keyed permutation of the 24-bit QPN space: a Feistel network on two 12-bit halves,
/// [`ROUNDS`] rounds, each round's function a 64-bit multiply-xorshift mix (SplitMix64's
/// finaliser) of the half under its own 64-bit key from the device's ChaCha20 generator. With a
/// pseudo-random round function four rounds already make a strong pseudo-random permutation
/// (Luby–Rackoff); the mix is not a proven PRF, so six rounds and 384 key bits leave a peer that
/// collects its own QPNs nothing cheaper than guessing.
#[derive(Debug, Clone)]
pub(crate) struct QpnMap {
    keys: [u64; ROUNDS],
    /// This shard's index and the device's shard count (see `Shard`): the permutation's slot
    /// field is `local slot × count + index`.
    shard: u32,
    shards: u32,
}

/// The most shards a device is split into (its slots are shared out between them).
pub const MAX_SHARDS: usize = 64;

const ROUNDS: usize = 6;

/// The two multipliers of the permutation's round function (SplitMix64's finaliser).
pub const QPN_MIX: [u64; 2] = [0xbf58_476d_1ce4_e5b9, 0x94d0_49bb_1331_11eb];

/// What a datapath's flow steering needs to tell from a QPN alone which shard of a device has
/// its QP ([`crate::rnic::Rnic::qpn_steering`]): the permutation's round keys and the shard
/// count. The shard of QPN `y` is `(decode(y) & (2^17 - 1)) % shards` where `decode` runs the
/// Feistel rounds backwards: on the halves `l = y >> 12`, `r = y & 0xfff`, for each key `k`
/// from the last, `(l, r) = (r ^ f(l, k), l)`; `f(x, k)` is SplitMix64's finaliser of `x ^ k`
/// ([`QPN_MIX`]) masked to 12 bits. QP1's frames are shard 0's. The keys make QPNs
/// unguessable: hand them to the kernel (a fanout program), never to a peer.
#[derive(Clone, Copy)]
pub struct QpnSteering {
    pub keys: [u64; ROUNDS],
    pub shards: u32,
}

impl std::fmt::Debug for QpnSteering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys stay out of logs.
        f.debug_struct("QpnSteering")
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl QpnSteering {
    /// Bits of a decoded QPN that are the slot (the shard is the slot modulo the count).
    pub const SLOT_MASK: u32 = MAX_SLOTS as u32 - 1;

    /// Which shard has (or would have) QPN `qpn`: what [`crate::rnic::Rnic::shard_of_qpn`] says.
    pub fn shard_of(&self, qpn: u32) -> u32 {
        if qpn == Qpn::GSI.value() {
            return 0;
        }
        (decode(&self.keys, qpn & 0xff_ffff) & Self::SLOT_MASK) % self.shards.max(1)
    }
}

#[inline]
fn mix(x: u32, k: u64) -> u32 {
    let mut v = u64::from(x) ^ k;
    v = (v ^ (v >> 30)).wrapping_mul(QPN_MIX[0]);
    v = (v ^ (v >> 27)).wrapping_mul(QPN_MIX[1]);
    ((v ^ (v >> 31)) & 0xfff) as u32
}

#[inline]
fn decode(keys: &[u64; ROUNDS], y: u32) -> u32 {
    let (mut l, mut r) = ((y >> 12) & 0xfff, y & 0xfff);
    for &k in keys.iter().rev() {
        (l, r) = (r ^ mix(l, k), l);
    }
    l << 12 | r
}

impl QpnMap {
    pub fn new(rng: &mut KeyRng, shard: u32, shards: u32) -> QpnMap {
        QpnMap {
            keys: std::array::from_fn(|_| rng.next_u64()),
            shard,
            shards,
        }
    }
    /// How many slots this shard has.
    pub fn max_slots(&self) -> usize {
        MAX_SLOTS / self.shards as usize
    }
    /// What a datapath's flow steering needs (see [`QpnSteering`]).
    pub fn steering(&self) -> QpnSteering {
        QpnSteering {
            keys: self.keys,
            shards: self.shards,
        }
    }
    fn encode(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> 12) & 0xfff, x & 0xfff);
        for &k in &self.keys {
            (l, r) = (r, l ^ mix(r, k));
        }
        l << 12 | r
    }
    #[inline]
    fn decode(&self, y: u32) -> u32 {
        decode(&self.keys, y)
    }
    /// The QPN of generation `gen` of this shard's `slot`.
    fn qpn(&self, slot: usize, gen: u8) -> u32 {
        let global = slot as u32 * self.shards + self.shard;
        self.encode(u32::from(gen) << SLOT_BITS | global)
    }
    /// This shard's slot that `qpn` names, if it were live (the caller checks the QP there has
    /// this QPN; a QPN of another shard names no slot: `usize::MAX`).
    #[inline]
    pub fn slot(&self, qpn: Qpn) -> usize {
        let global = self.decode(qpn.value()) & (MAX_SLOTS as u32 - 1);
        if self.shards == 1 {
            return global as usize;
        }
        if global % self.shards != self.shard {
            return usize::MAX;
        }
        (global / self.shards) as usize
    }
    /// Which shard of the device has (or would have) `qpn`.
    pub fn shard_of(&self, qpn: Qpn) -> usize {
        ((self.decode(qpn.value()) & (MAX_SLOTS as u32 - 1)) % self.shards) as usize
    }
}

fn reserved(q: u32) -> bool {
    q <= 1 || q == Qpn::MULTICAST.value()
}

/// Which slots exist, which are free, and each slot's generation.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// The generation of each slot's current (or next) QP.
    gens: Vec<u8>,
    /// Free slots, the longest free first.
    free: VecDeque<u32>,
}

impl Slots {
    /// How many slots exist.
    pub fn len(&self) -> usize {
        self.gens.len()
    }

    /// A slot for a new QP, and its QPN (`fixed`: QP1's, whatever the slot). A new slot when
    /// fewer than [`FREE_RESERVE`] are free and the table has room, else the longest free.
    /// The caller grows its table to [`Slots::len`].
    pub fn alloc(&mut self, map: &QpnMap, fixed: Option<Qpn>) -> Option<(usize, Qpn)> {
        let slot = if self.free.len() < FREE_RESERVE.min(map.max_slots() / 2)
            && self.gens.len() < map.max_slots()
        {
            self.gens.push(0);
            self.gens.len() - 1
        } else {
            self.free.pop_front()? as usize
        };
        if let Some(q) = fixed {
            return Some((slot, q));
        }
        loop {
            let q = map.qpn(slot, self.gens[slot]);
            if !reserved(q) {
                return Some((slot, Qpn::new(q)));
            }
            self.gens[slot] = (self.gens[slot] + 1) & GEN_MASK;
        }
    }

    /// `slot`'s QP is gone: the slot is free, for the next generation.
    pub fn release(&mut self, slot: usize) {
        self.gens[slot] = (self.gens[slot] + 1) & GEN_MASK;
        self.free.push_back(slot as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device split into shards: every QPN a shard makes is its own by `shard_of` in every
    /// shard, names its slot in it and no slot in any other; the QPNs of all shards are
    /// distinct; a shard's slots stop at its share.
    #[test]
    fn shards_split_the_qpn_space() {
        for count in [2u32, 3, 16] {
            let maps: Vec<QpnMap> = (0..count)
                .map(|k| QpnMap::new(&mut KeyRng::new(&crate::rng::Seed::from_u64(9)), k, count))
                .collect();
            let mut seen = std::collections::HashSet::new();
            for (k, m) in maps.iter().enumerate() {
                let mut s = Slots::default();
                for _ in 0..600 {
                    let (slot, q) = s.alloc(m, None).unwrap();
                    assert!(seen.insert(q.value()), "{q:?} made twice");
                    assert_eq!(m.steering().shard_of(q.value()), k as u32);
                    for (j, o) in maps.iter().enumerate() {
                        assert_eq!(o.shard_of(q), k);
                        assert_eq!(o.slot(q), if j == k { slot } else { usize::MAX });
                    }
                }
            }
            let mut s = Slots::default();
            let n = (0..)
                .take_while(|_| s.alloc(&maps[0], None).is_some())
                .count();
            assert_eq!(n, MAX_SLOTS / count as usize);
        }
    }

    #[test]
    fn qpn_map_is_a_permutation_of_the_24_bit_space() {
        let m = QpnMap::new(&mut KeyRng::new(&crate::rng::Seed::from_u64(3)), 0, 1);
        let mut seen = vec![false; 1 << 24];
        for x in 0..1u32 << 24 {
            let y = m.encode(x);
            assert!(y < 1 << 24);
            assert!(!seen[y as usize], "{x} collides");
            seen[y as usize] = true;
            assert_eq!(m.decode(y), x);
        }
        // Consecutive slots do not give consecutive QPNs.
        let v: Vec<u32> = (0..8).map(|x| m.encode(x)).collect();
        assert!(v.windows(2).all(|w| w[0].abs_diff(w[1]) > 1), "{v:x?}");
    }

    #[test]
    fn every_generation_of_a_slot_has_its_own_qpn_and_decodes_to_the_slot() {
        let m = QpnMap::new(&mut KeyRng::new(&crate::rng::Seed::from_u64(5)), 0, 1);
        for slot in [0, 1, 77, MAX_SLOTS - 1] {
            let qpns: std::collections::HashSet<u32> =
                (0..=GEN_MASK).map(|g| m.qpn(slot, g)).collect();
            assert_eq!(qpns.len(), 1 << GEN_BITS);
            for q in qpns {
                assert_eq!(m.slot(Qpn::new(q)), slot);
            }
        }
    }

    #[test]
    fn slots_stay_bounded_and_are_reused_in_fifo_order() {
        let m = QpnMap::new(&mut KeyRng::new(&crate::rng::Seed::from_u64(7)), 0, 1);
        let mut s = Slots::default();
        let mut last = Vec::new();
        for _ in 0..100_000 {
            let (slot, q) = s.alloc(&m, None).unwrap();
            assert!(!reserved(q.value()));
            assert_eq!(m.slot(q), slot);
            last.push(q);
            s.release(slot);
        }
        assert_eq!(s.len(), FREE_RESERVE);
        // A QPN comes back only after FREE_RESERVE × 2^GEN_BITS creations.
        let n = FREE_RESERVE << GEN_BITS;
        let recent: std::collections::HashSet<_> = last[last.len() - n..].iter().collect();
        assert_eq!(recent.len(), n);
        // A full table reuses its free slots.
        let mut s = Slots::default();
        for _ in 0..MAX_SLOTS {
            s.alloc(&m, None).unwrap();
        }
        assert_eq!(s.alloc(&m, None), None);
        s.release(42);
        assert_eq!(s.alloc(&m, None).map(|(slot, _)| slot), Some(42));
        assert_eq!(s.len(), MAX_SLOTS);
    }
}
