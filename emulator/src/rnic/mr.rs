//! Protection domains and memory regions. A region's bytes are its `Backing`: bytes the RNIC owns
//! (`reg_mr`: the in-process tools and tests read and write them through the verbs API), or a
//! program's own memory (`reg_mr_foreign`, a [`ForeignMem`] that only [`crate::dma`] touches, by
//! raw copies; the core stays safe Rust). Every byte moves through the backing's bounds-checked
//! `read`/`write`/`atomic`, after the same checks for both kinds. Every access — local through an
//! L_Key, remote through an R_Key — is checked for the key, the protection domain, the permission
//! and the bounds before a byte moves (IBTA 10.6.3 and 9.4.4.3, unverified; 9.7.4.1.5 in 1.5 for
//! the responder's R_Key checks). Keys are drawn from the device's ChaCha20 generator ([`KeyRng`]):
//! not guessable from each other (ReDMArk's first attack was predictable R_Keys).
use super::slots::GenSlots;
use super::verbs::{Access, PdId, Sge, WcStatus};
use crate::dma::ForeignMem;
use crate::rng::KeyRng;
use rocemu_wire::icrc::CopyIn;
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for keys that are already random (R_Keys, L_Keys, QPNs): one multiply.
#[derive(Default, Clone, Copy, Debug)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// What an application learns of a region it registered (`ibv_mr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub lkey: u32,
    pub rkey: u32,
    /// The region's first virtual address: RETH and SGE addresses are relative to this space.
    pub addr: u64,
    pub length: u64,
    pub access: Access,
    pub pd: PdId,
}

/// Where a region's bytes live. Its length is the region's length (`MrInfo::length`); every
/// method checks its range against it and fails rather than panics.
#[derive(Debug)]
pub(crate) enum Backing {
    /// Zeroed bytes the RNIC owns (`reg_mr`).
    Owned(Vec<u8>),
    /// The program's memory (`reg_mr_foreign`): reached only through [`crate::dma`].
    Foreign(ForeignMem),
    /// No memory (`reg_mr_null`): this many bytes of address space whose writes are discarded
    /// and whose reads give zeros.
    Null(u64),
}

/// `off..off + n` inside a null region of `len` bytes.
#[inline]
fn null_inside(len: u64, off: usize, n: usize) -> bool {
    (off as u64).checked_add(n as u64).is_some_and(|e| e <= len)
}

// The foreign writes out of line: the owned path (every in-process tool's hot loop) stays as
// small as it was, and a foreign copy costs one call more, next to nothing beside the copy. The
// foreign read is inline since it became generic over its destination (`CopyIn`): out of line
// or inline, callgrind counted the same instructions for the owned path (2214 / 2211 a 64-byte
// WRITE).
#[inline(never)]
fn foreign_write(f: &ForeignMem, off: usize, data: &[u8]) -> bool {
    f.write_at(off as u64, data).is_ok()
}

/// An 8-byte atomic operation on a region's word (IBTA 9.4.5, unverified).
#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicOp {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd(u64),
}

impl AtomicOp {
    fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
            AtomicOp::CompareSwap { .. } => orig,
            AtomicOp::FetchAdd(add) => orig.wrapping_add(add),
        }
    }
}

impl Backing {
    /// The region's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Backing::Owned(v) => v.len() as u64,
            Backing::Foreign(f) => f.len() as u64,
            Backing::Null(len) => *len,
        }
    }

    /// Copies `out.len()` bytes from `off` into `out`; false (and nothing copied) outside.
    #[inline]
    pub fn read(&self, off: usize, out: &mut [u8]) -> bool {
        let n = out.len();
        self.read_into(off, out, 0, n)
    }

    /// Copies `n` bytes from `off` to `at` in `out` (a buffer, or a packet's payload that
    /// hashes its ICRC as it is copied); false (and nothing copied) when they are not inside
    /// the region or do not fit `out`.
    #[inline(always)]
    pub fn read_into<D: CopyIn + ?Sized>(
        &self,
        off: usize,
        out: &mut D,
        at: usize,
        n: usize,
    ) -> bool {
        if !out.fits(at, n) {
            return false;
        }
        match self {
            Backing::Owned(v) => match off.checked_add(n).and_then(|e| v.get(off..e)) {
                Some(src) => {
                    out.copy_in(at, src);
                    true
                }
                None => false,
            },
            Backing::Foreign(f) => f.read_into(off as u64, out, at, n).is_ok(),
            Backing::Null(len) => {
                let inside = null_inside(*len, off, n);
                if inside {
                    out.zero(at, n);
                }
                inside
            }
        }
    }

    /// Copies `data` to `off`; false (and nothing written) outside.
    #[inline]
    pub fn write(&mut self, off: usize, data: &[u8]) -> bool {
        match self {
            Backing::Owned(v) => {
                match off.checked_add(data.len()).and_then(|e| v.get_mut(off..e)) {
                    Some(dst) => {
                        dst.copy_from_slice(data);
                        true
                    }
                    None => false,
                }
            }
            Backing::Foreign(f) => foreign_write(f, off, data),
            Backing::Null(len) => null_inside(*len, off, data.len()),
        }
    }

    /// Applies `op` to the 8 bytes at `off` and returns the value they held before; None when
    /// they are not inside. The caller checked the virtual address's alignment.
    pub fn atomic(&mut self, off: usize, op: AtomicOp) -> Option<u64> {
        match self {
            Backing::Owned(v) => {
                let cell = v.get_mut(off..off.checked_add(8)?)?;
                // Host memory order (little-endian, as on the x86 hosts rxe and ConnectX serve).
                let mut b = [0u8; 8];
                b.copy_from_slice(cell);
                let orig = u64::from_le_bytes(b);
                cell.copy_from_slice(&op.apply(orig).to_le_bytes());
                Some(orig)
            }
            Backing::Foreign(f) => {
                let off = off as u64;
                let r = match op {
                    AtomicOp::CompareSwap { compare, swap } => f.compare_swap(off, compare, swap),
                    AtomicOp::FetchAdd(add) => f.fetch_add(off, add),
                };
                match r {
                    Ok(orig) => Some(orig),
                    // In bounds but not 8-byte aligned in the program's memory (an iova whose
                    // alignment differs from the pointer's): read, modify, write. Atomic against
                    // the RNIC's other atomics (all run under its lock), not against the
                    // program's own CPU atomics (as a NIC without PCIe AtomicOps).
                    Err(()) => {
                        let mut b = [0u8; 8];
                        f.read_at(off, &mut b).ok()?;
                        let orig = u64::from_ne_bytes(b);
                        f.write_at(off, &op.apply(orig).to_ne_bytes()).ok()?;
                        Some(orig)
                    }
                }
            }
            Backing::Null(len) => null_inside(*len, off, 8).then_some(0),
        }
    }

    /// The bytes, when the RNIC owns them.
    pub fn owned(&self) -> Option<&[u8]> {
        match self {
            Backing::Owned(v) => Some(v),
            Backing::Foreign(_) | Backing::Null(_) => None,
        }
    }

    pub fn owned_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Backing::Owned(v) => Some(v),
            Backing::Foreign(_) | Backing::Null(_) => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub info: MrInfo,
    pub data: Backing,
    /// False once the R_Key was invalidated (SEND with invalidate).
    pub rkey_valid: bool,
}

/// Why a local access failed: a `LocProtErr` (bad key, PD or bounds), `LocAccessErr` (no
/// local write), or `LocLenErr` (a scatter/gather list too short for the transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalFault {
    Protection,
    Access,
    Length,
}

impl LocalFault {
    /// The completion status of a work request that met this fault.
    pub fn status(self) -> WcStatus {
        match self {
            LocalFault::Protection => WcStatus::LocProtErr,
            LocalFault::Access => WcStatus::LocAccessErr,
            LocalFault::Length => WcStatus::LocLenErr,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct MemTable {
    pub mrs: Vec<Option<Mr>>,
    by_lkey: KeyMap<usize>,
    by_rkey: KeyMap<usize>,
    /// The key looked up last and its region's index: work comes in runs on one region (a
    /// benchmark's buffer, a message's packets), and a hit skips the hash lookup. Checked against
    /// the region itself, so a stale entry only misses.
    last_lkey: Cell<(u32, usize)>,
    last_rkey: Cell<(u32, usize)>,
    /// The PDs: a [`PdId`] is a slot (low 16 bits, `max_pd` = 2^16) and its generation.
    pub pds: GenSlots<(), 16>,
}

impl MemTable {
    /// A new PD; None when `max` PDs live.
    pub fn alloc_pd(&mut self, max: usize) -> Option<PdId> {
        self.pds.insert(max, ()).map(PdId)
    }

    /// Frees the PD's slot (the caller checked that nothing refers to it).
    pub fn dealloc_pd(&mut self, pd: PdId) {
        self.pds.remove(pd.0);
    }

    #[inline]
    pub fn pd_valid(&self, pd: PdId) -> bool {
        self.pds.get(pd.0).is_some()
    }

    fn fresh_key(&self, rng: &mut KeyRng) -> u32 {
        loop {
            let k = rng.next_u32();
            if k != 0 && !self.by_lkey.contains_key(&k) && !self.by_rkey.contains_key(&k) {
                return k;
            }
        }
    }

    /// Registers `length` zeroed bytes the RNIC owns, at `addr`.
    pub fn register(
        &mut self,
        rng: &mut KeyRng,
        pd: PdId,
        addr: u64,
        length: u64,
        access: Access,
    ) -> MrInfo {
        let data = Backing::Owned(vec![0; length as usize]);
        self.register_backing(rng, pd, addr, data, access)
    }

    /// Registers `data` as a region at `addr`; its length is the backing's. The caller checked
    /// that `addr + length` does not wrap.
    pub fn register_backing(
        &mut self,
        rng: &mut KeyRng,
        pd: PdId,
        addr: u64,
        data: Backing,
        access: Access,
    ) -> MrInfo {
        let length = data.len();
        let lkey = self.fresh_key(rng);
        let rkey = self.fresh_key(rng);
        self.insert(pd, addr, length, data, access, (lkey, rkey))
    }

    /// Registers `data` at `addr` under the keys `keys` (L_Key, R_Key) that another shard of
    /// the same device gave the same region; `None` when either key is zero, or either names
    /// a live region here.
    pub fn register_backing_keyed(
        &mut self,
        pd: PdId,
        addr: u64,
        data: Backing,
        access: Access,
        keys: (u32, u32),
    ) -> Option<MrInfo> {
        let (lkey, rkey) = keys;
        let taken =
            |k: u32| k == 0 || self.by_lkey.contains_key(&k) || self.by_rkey.contains_key(&k);
        if lkey == rkey || taken(lkey) || taken(rkey) {
            return None;
        }
        let length = data.len();
        Some(self.insert(pd, addr, length, data, access, keys))
    }

    fn insert(
        &mut self,
        pd: PdId,
        addr: u64,
        length: u64,
        data: Backing,
        access: Access,
        (lkey, rkey): (u32, u32),
    ) -> MrInfo {
        let info = MrInfo {
            lkey,
            rkey,
            addr,
            length,
            access,
            pd,
        };
        let idx = match self.mrs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.mrs.push(None);
                self.mrs.len() - 1
            }
        };
        self.mrs[idx] = Some(Mr {
            info,
            data,
            rkey_valid: true,
        });
        self.by_lkey.insert(lkey, idx);
        self.by_rkey.insert(rkey, idx);
        info
    }

    pub fn deregister(&mut self, lkey: u32) -> Option<MrInfo> {
        let idx = self.by_lkey.remove(&lkey)?;
        let mr = self.mrs[idx].take()?;
        self.by_rkey.remove(&mr.info.rkey);
        Some(mr.info)
    }

    /// The index of the region with L_Key `lkey`.
    #[inline]
    fn lkey_index(&self, lkey: u32) -> Option<usize> {
        self.index(lkey, &self.last_lkey, &self.by_lkey, |m| m.lkey)
    }

    /// The index of the region with R_Key `rkey` (valid or invalidated).
    #[inline]
    fn rkey_index(&self, rkey: u32) -> Option<usize> {
        self.index(rkey, &self.last_rkey, &self.by_rkey, |m| m.rkey)
    }

    /// A lookup of `key` in `map`, through the one-entry `cache`; `key_of` names the key a
    /// region carries, against which a cached entry is checked.
    #[inline]
    fn index(
        &self,
        key: u32,
        cache: &Cell<(u32, usize)>,
        map: &KeyMap<usize>,
        key_of: fn(&MrInfo) -> u32,
    ) -> Option<usize> {
        let (k, i) = cache.get();
        if k == key && matches!(self.mrs.get(i), Some(Some(m)) if key_of(&m.info) == key) {
            return Some(i);
        }
        let &i = map.get(&key)?;
        cache.set((key, i));
        Some(i)
    }

    pub fn by_lkey(&self, lkey: u32) -> Option<&Mr> {
        self.lkey_index(lkey).and_then(|i| self.mrs[i].as_ref())
    }

    pub fn by_lkey_mut(&mut self, lkey: u32) -> Option<&mut Mr> {
        let i = self.lkey_index(lkey)?;
        self.mrs[i].as_mut()
    }

    /// Checks a remote access of `len` bytes at `va` through `rkey` from a QP of `pd` wanting
    /// `need`; returns the region's index and the offset of `va` in it. A zero-length access
    /// checks nothing (C9-88, 9.7.4.1.5 in 1.5: the R_Key of a zero-length RDMA is not validated).
    pub fn check_remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(usize, usize), ()> {
        let i = self.rkey_index(rkey).ok_or(())?;
        let mr = self.mrs[i].as_ref().ok_or(())?;
        if !mr.rkey_valid || mr.info.pd != pd || !mr.info.access.contains(need) {
            return Err(());
        }
        let start = va.checked_sub(mr.info.addr).ok_or(())?;
        let end = start.checked_add(len).ok_or(())?;
        if end > mr.info.length {
            return Err(());
        }
        Ok((i, start as usize))
    }

    /// Invalidates the R_Key `rkey` of a region in `pd` (IBTA 10.6.6 remote invalidate,
    /// unverified).
    pub fn invalidate_rkey(&mut self, pd: PdId, rkey: u32) -> bool {
        let Some(i) = self.rkey_index(rkey) else {
            return false;
        };
        match self.mrs[i].as_mut() {
            Some(mr) if mr.info.pd == pd && mr.rkey_valid => {
                mr.rkey_valid = false;
                true
            }
            _ => false,
        }
    }

    /// Checks every SGE of a list for `pd` (with LOCAL_WRITE when `write`), and returns the
    /// total length.
    pub fn check_sges(&self, pd: PdId, sges: &[Sge], write: bool) -> Result<u64, LocalFault> {
        let mut total = 0u64;
        for s in sges {
            if s.length == 0 {
                continue;
            }
            self.piece(pd, s, 0, s.length as usize, write)?;
            total += s.length as u64;
        }
        Ok(total)
    }

    /// `check_sges` of a list of one SGE `s` of nonzero length: the region's index and the
    /// offset of the SGE in it, for [`MemTable::read_checked`] while nothing can have changed.
    #[inline]
    pub fn check_sge(&self, pd: PdId, s: &Sge, write: bool) -> Result<(usize, usize), LocalFault> {
        let (i, r) = self.piece(pd, s, 0, s.length as usize, write)?;
        Ok((i, r.start))
    }

    /// `gather` of `out.len()` bytes `at` bytes into a single SGE that [`MemTable::check_sge`]
    /// just checked (found at `start` in region `i`), with no change to the table since: the
    /// caller guarantees `at + out.len()` is within the SGE.
    #[inline(always)]
    pub fn read_checked<D: CopyIn + ?Sized>(
        &self,
        (i, start): (usize, usize),
        at: u64,
        out: &mut D,
    ) -> Result<(), LocalFault> {
        let n = out.room();
        match self.mrs.get(i).and_then(Option::as_ref) {
            Some(mr) if mr.data.read_into(start + at as usize, out, 0, n) => Ok(()),
            _ => Err(LocalFault::Protection),
        }
    }

    /// The bytes of region `i` that `len` bytes `at` bytes into SGE `s` cover: the region must
    /// be there, in `pd`, writable when `write`, and hold them. `check_sges` asks it of every SGE
    /// at post; every copy asks again, since the L_Key may have been deregistered (or its key
    /// reused by another region) since.
    #[inline]
    fn piece(
        &self,
        pd: PdId,
        s: &Sge,
        at: u64,
        len: usize,
        write: bool,
    ) -> Result<(usize, std::ops::Range<usize>), LocalFault> {
        let i = self.lkey_index(s.lkey).ok_or(LocalFault::Protection)?;
        let mr = self.mrs[i].as_ref().ok_or(LocalFault::Protection)?;
        if mr.info.pd != pd {
            return Err(LocalFault::Protection);
        }
        if write && !mr.info.access.contains(Access::LOCAL_WRITE) {
            return Err(LocalFault::Access);
        }
        let start = s
            .addr
            .checked_sub(mr.info.addr)
            .and_then(|o| o.checked_add(at))
            .ok_or(LocalFault::Protection)?;
        match start.checked_add(len as u64) {
            Some(end) if end <= mr.info.length => Ok((i, start as usize..end as usize)),
            _ => Err(LocalFault::Protection),
        }
    }

    /// Copies `out.len()` bytes starting `offset` bytes into the gather list `sges` of a QP in
    /// `pd` into `out`. Every region is looked up again: one deregistered since the WQE was
    /// checked fails the copy (`LocProtErr`, as rxe's `copy_data`), and the caller must then
    /// not send what `out` holds. A list too short for `out` is a length error.
    pub fn gather<D: CopyIn + ?Sized>(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: u64,
        out: &mut D,
    ) -> Result<(), LocalFault> {
        let len = out.room();
        // The usual case: one SGE holds the whole piece.
        if let [s] = sges {
            if offset + len as u64 <= s.length as u64 {
                let (i, r) = self.piece(pd, s, offset, len, false)?;
                return match self.mrs[i].as_ref() {
                    Some(mr) if mr.data.read_into(r.start, out, 0, len) => Ok(()),
                    _ => Err(LocalFault::Protection),
                };
            }
        }
        let mut done = 0;
        for (s, at, range) in pieces(sges, offset, len) {
            let (i, r) = self.piece(pd, s, at, range.len(), false)?;
            match self.mrs[i].as_ref() {
                Some(mr) if mr.data.read_into(r.start, out, range.start, range.len()) => {}
                _ => return Err(LocalFault::Protection),
            }
            done = range.end;
        }
        if done == len {
            Ok(())
        } else {
            Err(LocalFault::Length)
        }
    }

    /// Copies `data` into the scatter list `sges` of a QP in `pd`, starting `offset` bytes in.
    /// Every region is looked up and checked again (it may have been deregistered since the
    /// WQE was checked): a region gone is a protection fault, a list too short a length error.
    /// Pieces before the fault may have been written.
    pub fn scatter(
        &mut self,
        pd: PdId,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), LocalFault> {
        let mut done = 0;
        for (s, at, range) in pieces(sges, offset, data.len()) {
            let (i, r) = self.piece(pd, s, at, range.len(), true)?;
            let written = self.mrs[i]
                .as_mut()
                .is_some_and(|mr| mr.data.write(r.start, &data[range.clone()]));
            if !written {
                return Err(LocalFault::Protection);
            }
            done = range.end;
        }
        if done == data.len() {
            Ok(())
        } else {
            Err(LocalFault::Length)
        }
    }
}

/// The pieces of a transfer of `len` bytes that starts `offset` bytes into an SGE list: for each
/// SGE it touches, the SGE, the offset within it, and the range of the transfer it holds.
fn pieces(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
) -> impl Iterator<Item = (&Sge, u64, std::ops::Range<usize>)> {
    let mut done = 0usize;
    sges.iter().filter_map(move |s| {
        let l = s.length as u64;
        if done == len {
            return None;
        }
        if offset >= l {
            offset -= l;
            return None;
        }
        let at = offset;
        let n = ((l - at) as usize).min(len - done);
        let r = done..done + n;
        done += n;
        offset = 0;
        Some((s, at, r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_checks_refuse_an_sge_that_wraps() {
        // A region at address 0: an SGE near 2^64 must not wrap past the bounds check.
        let mut rng = KeyRng::new(&crate::rng::Seed::from_u64(1));
        let mut t = MemTable::default();
        let pd = t.alloc_pd(16).unwrap();
        let mr = t.register(&mut rng, pd, 0, 4096, Access::LOCAL_WRITE);
        let sge = |addr, length| Sge {
            addr,
            length,
            lkey: mr.lkey,
        };
        assert_eq!(t.check_sges(pd, &[sge(0, 4096)], true), Ok(4096));
        assert_eq!(
            t.check_sges(pd, &[sge(u64::MAX - 7, 64)], false),
            Err(LocalFault::Protection)
        );
        assert_eq!(
            t.check_sges(pd, &[sge(4095, 2)], false),
            Err(LocalFault::Protection)
        );
    }

    #[test]
    fn remote_checks() {
        let mut rng = KeyRng::new(&crate::rng::Seed::from_u64(1));
        let mut t = MemTable::default();
        let pd = t.alloc_pd(16).unwrap();
        let pd2 = t.alloc_pd(16).unwrap();
        let mr = t.register(
            &mut rng,
            pd,
            0x1000,
            4096,
            Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        );
        assert!(t
            .check_remote(pd, mr.rkey, 0x1000, 4096, Access::REMOTE_WRITE)
            .is_ok());
        assert!(
            t.check_remote(pd, mr.rkey, 0x1001, 4096, Access::REMOTE_WRITE)
                .is_err(),
            "bounds"
        );
        assert!(
            t.check_remote(pd, mr.rkey, 0xfff, 1, Access::REMOTE_WRITE)
                .is_err(),
            "below"
        );
        assert!(
            t.check_remote(pd, mr.rkey, u64::MAX, 2, Access::REMOTE_WRITE)
                .is_err(),
            "wrap"
        );
        assert!(
            t.check_remote(pd, mr.rkey, 0x1000, 8, Access::REMOTE_READ)
                .is_err(),
            "permission"
        );
        assert!(
            t.check_remote(pd2, mr.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .is_err(),
            "pd"
        );
        assert!(
            t.check_remote(pd, mr.lkey, 0x1000, 8, Access::REMOTE_WRITE)
                .is_err(),
            "lkey is not an rkey"
        );
        assert!(t.invalidate_rkey(pd, mr.rkey));
        assert!(
            t.check_remote(pd, mr.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .is_err(),
            "invalidated"
        );
    }

    #[test]
    fn scatter_gather_across_sges() {
        let mut rng = KeyRng::new(&crate::rng::Seed::from_u64(2));
        let mut t = MemTable::default();
        let pd = t.alloc_pd(16).unwrap();
        let a = t.register(&mut rng, pd, 0x1000, 16, Access::LOCAL_WRITE);
        let b = t.register(&mut rng, pd, 0x9000, 16, Access::LOCAL_WRITE);
        let sges = [
            Sge {
                addr: 0x1008,
                length: 8,
                lkey: a.lkey,
            },
            Sge {
                addr: 0x9000,
                length: 16,
                lkey: b.lkey,
            },
        ];
        assert_eq!(t.check_sges(pd, &sges, true), Ok(24));
        let data: Vec<u8> = (0..24).collect();
        assert_eq!(t.scatter(pd, &sges, 0, &data[..10]), Ok(()));
        assert_eq!(t.scatter(pd, &sges, 10, &data[10..]), Ok(()));
        assert_eq!(
            t.scatter(pd, &sges, 20, &data[..10]),
            Err(LocalFault::Length),
            "too long"
        );
        let mut out = [0u8; 24];
        assert_eq!(t.gather(pd, &sges, 0, &mut out[..]), Ok(()));
        assert_eq!(&out[..20], &data[..20]);
        assert_eq!(
            t.gather(pd, &sges, 1, &mut out[..]),
            Err(LocalFault::Length),
            "too long"
        );
        let bad = [Sge {
            addr: 0x1008,
            length: 9,
            lkey: a.lkey,
        }];
        assert_eq!(t.check_sges(pd, &bad, true), Err(LocalFault::Protection));
        let ro = t.register(&mut rng, pd, 0x5000, 16, Access::NONE);
        assert_eq!(
            t.check_sges(
                pd,
                &[Sge {
                    addr: 0x5000,
                    length: 4,
                    lkey: ro.lkey
                }],
                true
            ),
            Err(LocalFault::Access)
        );
        assert_eq!(
            t.check_sges(
                pd,
                &[Sge {
                    addr: 0x5000,
                    length: 4,
                    lkey: ro.lkey
                }],
                false
            ),
            Ok(4)
        );
    }

    #[test]
    fn scatter_gather_fail_once_a_region_is_gone() {
        // Checked at post, deregistered before the copy: the copy fails, it does not silently
        // do nothing (which sent stale bytes and completed reads without data).
        let mut rng = KeyRng::new(&crate::rng::Seed::from_u64(3));
        let mut t = MemTable::default();
        let pd = t.alloc_pd(16).unwrap();
        let other = t.alloc_pd(16).unwrap();
        let a = t.register(&mut rng, pd, 0x1000, 16, Access::LOCAL_WRITE);
        let b = t.register(&mut rng, pd, 0x9000, 16, Access::LOCAL_WRITE);
        let one = [Sge {
            addr: 0x1000,
            length: 16,
            lkey: a.lkey,
        }];
        let two = [
            one[0],
            Sge {
                addr: 0x9000,
                length: 16,
                lkey: b.lkey,
            },
        ];
        let mut out = [0u8; 8];
        assert_eq!(t.gather(pd, &one, 0, &mut out[..]), Ok(()));
        assert_eq!(
            t.gather(other, &one, 0, &mut out[..]),
            Err(LocalFault::Protection),
            "another PD"
        );
        assert!(t.deregister(b.lkey).is_some());
        let mut out = [0u8; 24];
        assert_eq!(
            t.gather(pd, &two, 0, &mut out[..]),
            Err(LocalFault::Protection)
        );
        assert_eq!(
            t.scatter(pd, &two, 12, &[1; 8]),
            Err(LocalFault::Protection)
        );
        assert!(t.deregister(a.lkey).is_some());
        let mut out = [0u8; 8];
        assert_eq!(
            t.gather(pd, &one, 0, &mut out[..]),
            Err(LocalFault::Protection)
        );
        assert_eq!(t.scatter(pd, &one, 0, &[1; 8]), Err(LocalFault::Protection));
    }
}
