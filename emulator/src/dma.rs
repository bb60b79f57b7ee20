//! DMA into memory the RNIC does not own: the one place where the emulator reads and writes a
//! program's memory through raw pointers (`ibv_reg_mr` of the program's own buffer).
//!
//! A [`ForeignMem`] is a base pointer and a length. The sans-IO core (`rnic/`, which forbids
//! unsafe code) holds it inside a memory region and moves bytes only through its safe, bounds-
//! checked methods; this module is the only code that dereferences the pointer.
//!
//! Invariants (a reviewer checks these, and only these, to trust the core with foreign memory):
//! * Every access lies inside `[ptr, ptr + len)`: each method checks `off + n <= len` without
//!   overflow before touching a byte, and answers `Err(())` otherwise; none panics.
//! * Bytes move only by `ptr::copy_nonoverlapping` between the foreign range and a slice the
//!   caller owns, and 8-byte atomics go through [`AtomicU64::from_ptr`]. No `&`/`&mut`
//!   reference or slice into foreign memory is ever made, so the compiler is never told that
//!   the program's bytes are unaliased or unchanging (the program's threads may use them at the
//!   same time, as they may with a hardware NIC's DMA).
//! * A `ForeignMem` is only made by [`ForeignMem::new`], whose caller promises the memory stays
//!   mapped and accessible until the region that holds it is deregistered; the RNIC drops the
//!   `ForeignMem` in `dereg_mr`, under the lock every datapath access also holds, so after
//!   deregistration returns nothing touches the memory again.
// The one module besides `port::af_packet` that the crate's `deny(unsafe_code)` lets through.
#![allow(unsafe_code)]
use rocemu_wire::icrc::CopyIn;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// A program's memory that the RNIC reads and writes as a NIC's DMA engine would: `len` bytes
/// from `ptr`. Accesses are bounds-checked and copy through raw pointers only.
#[derive(Debug)]
pub struct ForeignMem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `ForeignMem` is an address range, not a borrow of anything thread-local: the
// registration contract (see `new`) makes the range valid for any thread until deregistration,
// and every access is a raw copy or an atomic, which any thread may do. The RNIC that holds it
// moves between threads (the engine's polling thread, the program's verb calls) behind a lock.
unsafe impl Send for ForeignMem {}
// SAFETY: all methods take `&self` and touch the memory only by raw-pointer copies and atomics:
// two threads using one `ForeignMem` at once are two DMA streams into the same buffer, which
// the program has to order itself exactly as with a NIC (the verbs leave a buffer's contents
// undefined while an operation on it is outstanding); no Rust reference is formed to alias.
unsafe impl Sync for ForeignMem {}

// `Err(())` is the whole answer: the access lies outside the region (or is misaligned, for
// atomics), and the caller turns that into its own fault (a NAK, a completion status, errno).
#[allow(clippy::result_unit_err)]
impl ForeignMem {
    /// A region of `len` bytes at `ptr` in the program's memory.
    ///
    /// # Safety
    ///
    /// The caller (`ibv_reg_mr`) promises that, from now until the region holding this
    /// `ForeignMem` is deregistered (`Rnic::dereg_mr`, which takes the RNIC's lock and drops
    /// it):
    /// * `[ptr, ptr + len)` is mapped, readable and writable, and lies in one allocation (or
    ///   one mapping) of the program, and `ptr + len` does not wrap the address space;
    /// * it is not freed, unmapped or remapped read-only meanwhile.
    ///
    /// The program may read and write the memory concurrently, as it may a buffer a NIC
    /// DMAs into: what it sees of bytes an outstanding operation moves is undefined (the verbs'
    /// contract), but nothing here forms a Rust reference to them. After deregistration the
    /// RNIC never touches the memory again. `len == 0` with any non-null `ptr` is allowed (an
    /// empty region, every access of one or more bytes fails).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> ForeignMem {
        ForeignMem { ptr, len }
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address, as the program knows it (for `ibv_reg_mr`'s default iova).
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The offset `off` as an index, if `n` bytes from it lie inside the region.
    #[inline]
    fn range(&self, off: u64, n: usize) -> Result<usize, ()> {
        let off = usize::try_from(off).map_err(|_| ())?;
        match off.checked_add(n) {
            Some(end) if end <= self.len => Ok(off),
            _ => Err(()),
        }
    }

    /// Copies `out.len()` bytes from `off` bytes into the region into `out`.
    #[inline]
    pub fn read_at(&self, off: u64, out: &mut [u8]) -> Result<(), ()> {
        let n = out.len();
        self.read_into(off, out, 0, n)
    }

    /// Copies `n` bytes from `off` bytes into the region to `at` in `out` (a buffer, or a
    /// packet's payload that hashes its ICRC as it is copied).
    #[inline(always)]
    pub fn read_into<D: CopyIn + ?Sized>(
        &self,
        off: u64,
        out: &mut D,
        at: usize,
        n: usize,
    ) -> Result<(), ()> {
        let off = self.range(off, n)?;
        if !out.fits(at, n) {
            return Err(());
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: `off + n <= len` (checked above), so the source lies in `[ptr, ptr + len)`,
        // which `new`'s caller keeps mapped and readable until the region is deregistered,
        // which cannot happen while the RNIC (and so `self`) is borrowed here. The destination
        // is memory of our own (`out`, borrowed exclusively), so the ranges do not overlap (the
        // program's memory cannot be `out`: we never make a slice of it). The program's threads
        // may write the source concurrently: that is the DMA contract (they get undefined
        // bytes in `out`, as from a NIC), and `copy_in_raw` reads through the raw pointer, each
        // byte once, never through a reference that would promise the compiler the bytes do not
        // change.
        unsafe { out.copy_in_raw(at, self.ptr.add(off), n) };
        Ok(())
    }

    /// Copies `data` into the region, `off` bytes in.
    #[inline]
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<(), ()> {
        let off = self.range(off, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `read_at`: the destination `[ptr + off, ptr + off + data.len())` lies
        // in the registered range, mapped and writable until deregistration; `data` is a slice
        // of our own (never of foreign memory), so they do not overlap. Concurrent reads or
        // writes by the program's threads are the DMA contract: we write through a raw
        // pointer and hold no reference into the program's memory.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        Ok(())
    }

    /// The 8-byte word at `off`, as an atomic: `off` must leave 8 bytes in the region and the
    /// word's address must be 8-byte aligned.
    #[inline]
    fn word(&self, off: u64) -> Result<&AtomicU64, ()> {
        let off = self.range(off, 8)?;
        let p = self.ptr.wrapping_add(off);
        if !(p as usize).is_multiple_of(std::mem::align_of::<AtomicU64>()) {
            return Err(());
        }
        // SAFETY: `p` is 8-byte aligned (checked) and `[p, p + 8)` lies in the registered range
        // (checked), mapped and writable until deregistration, which cannot happen while `self`
        // is borrowed (the returned reference lives no longer than `&self`). An `&AtomicU64`
        // promises only atomic access, which is what a program's own atomics on the same word
        // do too, so they stay coherent with ours (`AtomicU64::from_ptr`'s requirement). A
        // program mixing plain accesses with our atomics on a word an operation targets races
        // as it would with a NIC's atomics: its own contract, and the value is what it is.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// An atomic compare-and-swap of the 8-byte word at `off` (native byte order); returns the
    /// value it held before.
    pub fn compare_swap(&self, off: u64, compare: u64, swap: u64) -> Result<u64, ()> {
        let w = self.word(off)?;
        Ok(
            match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// An atomic fetch-and-add (wrapping) of the 8-byte word at `off` (native byte order);
    /// returns the value it held before.
    pub fn fetch_add(&self, off: u64, add: u64) -> Result<u64, ()> {
        Ok(self.word(off)?.fetch_add(add, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer of `n` 8-byte words (so it is aligned), and a `ForeignMem` over its first
    /// `len` bytes.
    fn mem(words: &mut [u64], len: usize) -> ForeignMem {
        assert!(len <= words.len() * 8);
        // SAFETY: the test keeps `words` alive and does not touch it while the ForeignMem is used.
        unsafe { ForeignMem::new(words.as_mut_ptr().cast(), len) }
    }

    #[test]
    fn read_write_in_bounds() {
        let mut buf = [0u64; 4];
        let m = mem(&mut buf, 32);
        assert_eq!(m.len(), 32);
        m.write_at(3, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 6];
        m.read_at(2, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 0]);
        m.write_at(28, &[9; 4]).unwrap();
        let mut last = [0u8; 4];
        m.read_at(28, &mut last).unwrap();
        assert_eq!(last, [9; 4]);
        assert_eq!(buf[0].to_ne_bytes()[3..7], [1, 2, 3, 4]);
    }

    #[test]
    fn out_of_bounds_touches_nothing() {
        // 24 of 32 bytes registered: the last word is outside and must stay as it is.
        let mut buf = [0u64; 4];
        buf[3] = 0x5555_5555_5555_5555;
        let m = mem(&mut buf, 24);
        assert_eq!(m.write_at(20, &[1; 5]), Err(()), "one byte past the end");
        assert_eq!(m.write_at(24, &[1]), Err(()), "at the end");
        assert_eq!(m.write_at(u64::MAX, &[1]), Err(()), "far past");
        let mut out = [7u8; 5];
        assert_eq!(m.read_at(20, &mut out), Err(()));
        assert_eq!(out, [7; 5], "a failed read leaves out alone");
        assert_eq!(m.fetch_add(24, 1), Err(()));
        assert_eq!(m.compare_swap(24, 0, 1), Err(()));
        assert_eq!(m.fetch_add(20, 1), Err(()), "word straddles the end");
        assert_eq!(buf, [0, 0, 0, 0x5555_5555_5555_5555]);
    }

    #[test]
    fn offset_plus_length_overflow() {
        let mut buf = [0u64; 2];
        let m = mem(&mut buf, 16);
        let mut out = [0u8; 2];
        assert_eq!(m.read_at(u64::MAX - 1, &mut out), Err(()));
        assert_eq!(m.write_at(u64::MAX, &[1, 2]), Err(()));
        assert_eq!(m.write_at(usize::MAX as u64, &[1]), Err(()));
        assert_eq!(m.fetch_add(u64::MAX - 7, 1), Err(()));
        assert_eq!(m.fetch_add(!7u64, 1), Err(()));
        assert_eq!(buf, [0, 0]);
    }

    #[test]
    fn zero_length() {
        let mut buf = [0u64; 1];
        let m = mem(&mut buf, 8);
        assert_eq!(m.read_at(8, &mut []), Ok(()), "empty access at the end");
        assert_eq!(m.write_at(8, &[]), Ok(()));
        assert_eq!(m.write_at(9, &[]), Err(()), "past the end, even empty");
        let empty = mem(&mut buf, 0);
        assert!(empty.is_empty());
        assert_eq!(empty.write_at(0, &[1]), Err(()));
        assert_eq!(empty.read_at(0, &mut []), Ok(()));
        assert_eq!(empty.fetch_add(0, 1), Err(()));
    }

    #[test]
    fn atomics() {
        let mut buf = [0u64; 2];
        buf[1] = 10;
        let m = mem(&mut buf, 16);
        assert_eq!(m.fetch_add(8, 5), Ok(10));
        assert_eq!(m.fetch_add(8, u64::MAX), Ok(15), "wraps");
        assert_eq!(m.compare_swap(8, 1, 99), Ok(14), "no match: unchanged");
        assert_eq!(m.compare_swap(8, 14, 99), Ok(14));
        assert_eq!(m.fetch_add(8, 0), Ok(99));
        for off in 1..8 {
            assert_eq!(m.fetch_add(off, 1), Err(()), "misaligned at {off}");
            assert_eq!(m.compare_swap(off, 0, 1), Err(()), "misaligned at {off}");
        }
        assert_eq!(buf, [0, 99]);
    }

    #[test]
    fn misaligned_base() {
        // A region that starts one byte into a word: its offset 7 is the aligned word.
        let mut buf = [0u64; 3];
        // SAFETY: bytes 1..24 of `buf`, kept alive and untouched while `m` lives.
        let m = unsafe { ForeignMem::new(buf.as_mut_ptr().cast::<u8>().add(1), 23) };
        assert_eq!(m.fetch_add(0, 1), Err(()));
        assert_eq!(m.fetch_add(7, 3), Ok(0));
        assert_eq!(buf, [0, 3, 0]);
    }

    #[test]
    fn shared_between_threads() {
        // Two threads adding to one word through one ForeignMem: atomics, so no add is lost.
        let mut buf = [0u64; 1];
        let m = mem(&mut buf, 8);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        m.fetch_add(0, 1).unwrap();
                    }
                });
            }
        });
        assert_eq!(buf[0], 20_000);
    }
}
