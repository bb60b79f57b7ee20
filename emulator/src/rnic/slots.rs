//! A table of objects named by 32-bit handles that carry their slot's generation: the tables
//! of completion queues and protection domains.
//!
//! Invariants: a handle is `generation << BITS | slot`; a slot's generation advances every time
//! it is given out, so the handle of a destroyed object reaches nothing — not even the object a
//! reused slot holds now — until the slot's generation wraps (`2^(32 - BITS)` reuses of that one
//! slot); at most `2^BITS` objects live at once ([`GenSlots::insert`] refuses more), and freed
//! slots are reused first, so a create/destroy loop keeps the table's size at its peak of live
//! objects.

/// A slot table whose handles are `generation << BITS | slot`.
#[derive(Debug)]
pub(crate) struct GenSlots<T, const BITS: u32> {
    slots: Vec<Option<(u32, T)>>,
    /// The generation each slot gives its next object.
    gens: Vec<u32>,
    free: Vec<usize>,
    live: usize,
}

impl<T, const BITS: u32> Default for GenSlots<T, BITS> {
    fn default() -> Self {
        GenSlots {
            slots: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T, const BITS: u32> GenSlots<T, BITS> {
    const SLOT_MASK: u32 = (1 << BITS) - 1;
    const GEN_MASK: u32 = u32::MAX >> BITS;

    /// Puts `v` in a free slot (or a new one) and returns its handle; None when `max` (at most
    /// `2^BITS`) objects live already.
    pub fn insert(&mut self, max: usize, v: T) -> Option<u32> {
        if self.live >= max.min(1 << BITS) {
            return None;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                self.slots.len() - 1
            }
        };
        let gen = self.gens[slot];
        self.gens[slot] = (gen + 1) & Self::GEN_MASK;
        let id = (gen << BITS) | slot as u32;
        self.slots[slot] = Some((id, v));
        self.live += 1;
        Some(id)
    }

    #[inline]
    pub fn get(&self, id: u32) -> Option<&T> {
        match self.slots.get((id & Self::SLOT_MASK) as usize) {
            Some(Some((i, v))) if *i == id => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        match self.slots.get_mut((id & Self::SLOT_MASK) as usize) {
            Some(Some((i, v))) if *i == id => Some(v),
            _ => None,
        }
    }

    /// Takes the object out and frees its slot; None when `id` names no live object.
    pub fn remove(&mut self, id: u32) -> Option<T> {
        let slot = (id & Self::SLOT_MASK) as usize;
        match self.slots.get(slot) {
            Some(Some((i, _))) if *i == id => {}
            _ => return None,
        }
        let (_, v) = self.slots[slot].take()?;
        self.free.push(slot);
        self.live -= 1;
        Some(v)
    }

    /// How many objects live.
    pub fn live(&self) -> usize {
        self.live
    }

    /// How many slots the table holds (live or free): its memory.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_handles_miss_and_slots_are_reused() {
        let mut t: GenSlots<u8, 4> = GenSlots::default();
        let a = t.insert(16, 1).unwrap();
        assert_eq!(t.remove(a), Some(1));
        let b = t.insert(16, 2).unwrap();
        assert_eq!(a & 0xf, b & 0xf, "the freed slot is reused");
        assert_ne!(a, b);
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&2));
        assert_eq!(t.capacity(), 1);
    }

    #[test]
    fn bounded_by_max_and_bits() {
        let mut t: GenSlots<(), 2> = GenSlots::default();
        for _ in 0..4 {
            assert!(t.insert(100, ()).is_some());
        }
        assert_eq!(t.insert(100, ()), None, "2 bits hold 4 slots");
        let mut u: GenSlots<(), 8> = GenSlots::default();
        assert!(u.insert(1, ()).is_some());
        assert_eq!(u.insert(1, ()), None);
    }
}
