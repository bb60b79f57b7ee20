//! The invariant CRC of RoCEv2 (IBTA Annex A17.3.3, CA17-22, built on Vol. 1 7.8.1 as CA17-22
//! says).
//!
//! ICRC = CRC-32 (the Ethernet / zlib polynomial, initial value all ones, final complement) over
//! eight bytes of 0xFF standing in for the LRH, the IP header with its variant fields set to all
//! ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP
//! header with its checksum set to all ones, the BTH with its byte 4 (FECN, BECN, Resv6) set to
//! all ones, and every byte after the BTH up to the ICRC. The four ICRC bytes on the wire are
//! that value least-significant byte first (as rxe and ConnectX send them).
//!
//! The masked headers (at most 88 bytes) are assembled in a stack buffer; the rest of the packet
//! is fed to crc32fast straight from the frame, never copied.
//!
//! On x86-64 with PCLMULQDQ a packet shorter than [`FOLD_MAX`] bytes (every ACK, a 64-byte WRITE
//! or SEND) is hashed by this module's own carry-less-multiply fold (`fold`): the masked head is
//! ORed in registers as it is loaded, so nothing is written to the frame or the stack before the
//! CRC reads it (a 16-byte load of bytes just stored piecewise waits for the stores to retire:
//! that stall, not the arithmetic, was most of a short packet's ICRC), and there is no hasher to
//! make, dispatch or finalize. A longer packet is masked in place in whole 16-byte stores and
//! hashed by crc32fast in one call (its wider folds, AVX-512 where the CPU has it, are what a long
//! packet needs), as is every packet on a CPU without PCLMULQDQ.
//!
//! On a CPU with AVX-512 and VPCLMULQDQ (`wide`), a long packet is hashed without writing the
//! frame: the masked head by `fold` from registers, the rest by four 512-bit streams and a 128-bit
//! tail. And the sender's payload copy is the CRC's pass ([`Payload`], [`copy_hashing`]): each
//! 64-byte load from the source region is stored into the frame and folded from the same
//! register, so a long packet's bytes are read once to be both copied and hashed.
use crc32fast::Hasher;

/// A fresh CRC-32 hasher. crc32fast picks its kernel by CPU feature detection each time a
/// `Hasher` is made — a handful of atomic loads and tests, as much as a short packet's CRC
/// costs — so it is done once and the result cloned.
#[inline]
fn hasher() -> Hasher {
    static PROTO: std::sync::OnceLock<Hasher> = std::sync::OnceLock::new();
    PROTO.get_or_init(Hasher::new).clone()
}

/// CRC-32 of eight 0xFF bytes, the LRH stand-in every ICRC starts with.
const CRC_OF_8_ONES: u32 = 0x2144_df1c;

const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;

/// Bytes of the pseudo-packet (8 × 0xFF, then the datagram) that carry masked fields, as OR
/// masks over 16-byte chunks: masking is setting bytes to all ones. IPv4 without options: the
/// LRH stand-in 0..8, TOS 9, TTL 16, checksum 18..20, UDP checksum 34..36, BTH byte 4 at 40.
const V4_HEAD: usize = 48;
const V4_MASK: [[u8; 16]; 3] =
    masks::<3>(&[(0, 8), (9, 1), (16, 1), (18, 2), (34, 2), (40, 1)], &[]);
/// IPv6: the LRH stand-in 0..8, traffic class and flow label 8 (low nibble) and 9..12, hop
/// limit 15, UDP checksum 54..56, BTH byte 4 at 60.
const V6_HEAD: usize = 64;
const V6_MASK: [[u8; 16]; 4] =
    masks::<4>(&[(0, 8), (9, 3), (15, 1), (54, 2), (60, 1)], &[(8, 0x0f)]);

const fn masks<const N: usize>(full: &[(usize, usize)], partial: &[(usize, u8)]) -> [[u8; 16]; N] {
    let mut bytes = [0u8; 64];
    let mut i = 0;
    while i < full.len() {
        let (at, n) = full[i];
        let mut k = 0;
        while k < n {
            bytes[at + k] = 0xff;
            k += 1;
        }
        i += 1;
    }
    let mut i = 0;
    while i < partial.len() {
        bytes[partial[i].0] |= partial[i].1;
        i += 1;
    }
    let mut out = [[0u8; 16]; N];
    let mut c = 0;
    while c < N {
        let mut k = 0;
        while k < 16 {
            out[c][k] = bytes[c * 16 + k];
            k += 1;
        }
        c += 1;
    }
    out
}

/// 16 bytes at `at`, ORed with `m`. Byte arrays, not u128: LLVM turns this into one vector load,
/// OR and store, and a later 16-byte load of the same bytes is forwarded from the store (a u128
/// lives in two general registers and is stored as two halves, which a 16-byte load cannot
/// forward from: that stall cost more than the CRC of a small packet).
#[inline(always)]
fn or16(b: &[u8], at: usize, m: &[u8; 16]) -> [u8; 16] {
    let mut w = [0u8; 16];
    w.copy_from_slice(&b[at..at + 16]);
    for (x, y) in w.iter_mut().zip(m) {
        *x |= *y;
    }
    w
}

/// The ICRC of one RoCEv2 packet. `datagram` is the IP datagram from the first byte of the IP
/// header to the last byte before the ICRC; `ip_header_len` is 40 for IPv6 and IHL × 4 for IPv4.
/// The caller guarantees `datagram` holds the IP, UDP and BTH headers.
///
/// The masked head (48 bytes for IPv4, 64 for IPv6) is assembled in 16-byte chunks on the
/// stack — whole-chunk stores, so that the CRC's 16-byte loads forward from them — and the rest
/// is hashed straight from the packet.
pub fn compute(datagram: &[u8], ip_header_len: usize, ipv6: bool) -> u32 {
    match (ipv6, ip_header_len) {
        (false, 20) => masked_copy(datagram, V4_HEAD, &V4_MASK),
        (true, 40) => masked_copy(datagram, V6_HEAD, &V6_MASK),
        _ => compute_generic(datagram, ip_header_len, ipv6),
    }
}

/// The CRC of the LRH stand-in and `datagram`, its first `N` 16-byte chunks (of which `head`
/// bytes carry masked fields) ORed with `mask`: by `fold` for a short packet, else the masked
/// head assembled on the stack and crc32fast over it and the rest. The chunk count is a
/// constant, so that the loops unroll.
#[inline(always)]
fn masked_copy<const N: usize>(datagram: &[u8], head: usize, mask: &[[u8; 16]; N]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(crc) = fold::masked(datagram, mask) {
        return crc;
    }
    let from = head - 8; // datagram bytes in the head
    let mut buf = [0u8; 64];
    // Chunk 0 starts 8 bytes before the datagram: its first 8 bytes are all ones anyway.
    let mut c0 = [0u8; 16];
    c0[8..].copy_from_slice(&datagram[..8]);
    buf[..16].copy_from_slice(&or16(&c0, 0, &mask[0]));
    for (i, m) in mask.iter().enumerate().skip(1) {
        buf[i * 16..i * 16 + 16].copy_from_slice(&or16(datagram, i * 16 - 8, m));
    }
    let mut h = hasher();
    h.update(&buf[..head]);
    h.update(&datagram[from..]);
    h.finalize()
}

fn compute_generic(datagram: &[u8], ip_header_len: usize, ipv6: bool) -> u32 {
    let hdr_end = ip_header_len + UDP_LEN + BTH_LEN;
    let mut masked = [0u8; 60 + UDP_LEN + BTH_LEN];
    let m = &mut masked[..hdr_end];
    m.copy_from_slice(&datagram[..hdr_end]);
    if ipv6 {
        // version stays; traffic class and flow label become ones
        m[0] |= 0x0f;
        m[1] = 0xff;
        m[2] = 0xff;
        m[3] = 0xff;
        m[7] = 0xff; // hop limit
    } else {
        m[1] = 0xff; // TOS (DSCP and ECN)
        m[8] = 0xff; // TTL
        m[10] = 0xff; // header checksum
        m[11] = 0xff;
    }
    let u = ip_header_len;
    m[u + 6] = 0xff; // UDP checksum
    m[u + 7] = 0xff;
    m[u + UDP_LEN + 4] = 0xff; // BTH FECN | BECN | Resv6
    let mut h = Hasher::new_with_initial(CRC_OF_8_ONES);
    h.update(m);
    h.update(&datagram[hdr_end..]);
    h.finalize()
}

/// The ICRC of the RoCEv2 packet whose IP header starts at `l3` in `frame`, computed in one
/// pass over the frame itself: the masked head is written over the frame in 16-byte chunks
/// (the eight bytes before the IP header, the end of the Ethernet header, stand in for the LRH),
/// hashed with the rest in one call, and put back. This is what the builder and a receive path
/// that owns its buffer use; it costs what a plain CRC of the same bytes costs. `end` is the
/// offset just past the ICRC. Needs `l3 >= 8` (any Ethernet frame); the caller guarantees that
/// the IP, UDP and BTH headers lie within `frame[..end - 4]`.
pub fn compute_in_place(
    frame: &mut [u8],
    l3: usize,
    ip_header_len: usize,
    ipv6: bool,
    end: usize,
) -> u32 {
    match (ipv6, ip_header_len) {
        (false, 20) => masked_in_place(frame, l3 - 8, V4_HEAD, &V4_MASK, end),
        (true, 40) => masked_in_place(frame, l3 - 8, V6_HEAD, &V6_MASK, end),
        _ => compute_generic(&frame[l3..end - 4], ip_header_len, ipv6),
    }
}

/// The CRC of `frame[base..end - 4]` with its first `N` 16-byte chunks ORed with `mask` (of
/// which `head` bytes carry masked fields): masked in place, hashed, put back. The chunk count
/// is a constant, so that the loops unroll.
#[inline(always)]
fn masked_in_place<const N: usize>(
    frame: &mut [u8],
    base: usize,
    head: usize,
    mask: &[[u8; 16]; N],
    end: usize,
) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(crc) = fold::masked(&frame[base + 8..end - 4], mask) {
        return crc;
    }
    // A long packet on a CPU with the wide kernel: the masked head folded from registers, the
    // rest by the wide kernel (and crc32fast for its last partial block), nothing written.
    #[cfg(target_arch = "x86_64")]
    if end - 4 >= base + 16 * N + wide::BLOCK && wide::available() {
        return wide::masked(&frame[base + 8..end - 4], mask);
    }
    let mut saved = [[0u8; 16]; N];
    for (i, m) in mask.iter().enumerate() {
        let at = base + i * 16;
        saved[i].copy_from_slice(&frame[at..at + 16]);
        #[cfg(target_arch = "x86_64")]
        fold::or_in_place(&mut frame[at..at + 16], m);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let v = or16(frame, at, m);
            frame[at..at + 16].copy_from_slice(&v);
        }
    }
    debug_assert!(base + head <= end - 4);
    let mut h = hasher();
    h.update(&frame[base..end - 4]);
    let crc = h.finalize();
    for (i, v) in saved.iter().enumerate() {
        let at = base + i * 16;
        frame[at..at + 16].copy_from_slice(v);
    }
    crc
}

/// `detect()`, asked the first time and kept in `flag` (0 not yet asked, 1 yes, 2 no): the CPU
/// feature checks of the kernels, one load each time after the first.
/// The load is inlined into the kernels' callers, the first time's checks kept out of line.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn detect_once(flag: &std::sync::atomic::AtomicU8, detect: impl FnOnce() -> bool) -> bool {
    use std::sync::atomic::Ordering;
    #[cold]
    #[inline(never)]
    fn first(flag: &std::sync::atomic::AtomicU8, detect: impl FnOnce() -> bool) -> bool {
        let has = detect();
        flag.store(if has { 1 } else { 2 }, Ordering::Relaxed);
        has
    }
    match flag.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => first(flag, detect),
    }
}

/// Packets (from the LRH stand-in to the ICRC, exclusive) shorter than this are hashed by
/// `fold`; longer ones by crc32fast, masked in place.
pub const FOLD_MAX: usize = 256;

/// CRC-32 by carry-less multiplication over 16-byte blocks, for short packets (and the masked
/// head's 16-byte stores for long ones): the folding
/// of Gopal et al., "Fast CRC computation for generic polynomials using PCLMULQDQ" (Intel, 2009),
/// with its bit-reflected constants for the zlib polynomial (the ones crc32fast uses, whose
/// fold by four and `reduce_128_to_crc` this follows).
///
/// The crate's one module with `unsafe`: calling the kernel compiled for those CPU features after
/// checking that the CPU has them, and unaligned 16-byte loads and stores of bounds-checked
/// slices.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod fold {
    use core::arch::x86_64 as a;
    use std::sync::atomic::AtomicU8;

    /// x^(512+32) mod P and x^(512-32) mod P, reflected: a 512-bit fold (four streams).
    pub(super) const K1: i64 = 0x154442bd4;
    pub(super) const K2: i64 = 0x1c6e41596;
    /// x^(128+32) mod P and x^(128-32) mod P, reflected: one 128-bit fold.
    pub(super) const K3: i64 = 0x1751997d0;
    pub(super) const K4: i64 = 0x0ccaa009e;
    /// x^64 mod P, reflected: 96 bits to 64.
    pub(super) const K5: i64 = 0x163cd6124;
    /// P(x) and floor(x^64 / P(x)), reflected: the Barrett reduction.
    pub(super) const P_X: i64 = 0x1DB710641;
    pub(super) const U_PRIME: i64 = 0x1F7011641;

    /// Whether the CPU has what `kernel` is compiled for (PCLMULQDQ, SSE4.1, SSSE3): asked once,
    /// then one load.
    #[inline]
    fn available() -> bool {
        static HAS: AtomicU8 = AtomicU8::new(0);
        super::detect_once(&HAS, || {
            std::is_x86_feature_detected!("pclmulqdq")
                && std::is_x86_feature_detected!("sse4.1")
                && std::is_x86_feature_detected!("ssse3")
        })
    }

    /// The CRC-32 (zlib: initial ones, final complement) of eight 0xFF bytes (the LRH stand-in)
    /// and then the datagram `dg`, its first `16 * N` bytes (the stand-in's included) ORed with
    /// `mask`; `None` on a CPU without PCLMULQDQ or for a packet of [`FOLD_MAX`](super::FOLD_MAX)
    /// bytes or more (a long packet goes to `wide` where the CPU has AVX-512 and VPCLMULQDQ,
    /// else to crc32fast's wider folds). Panics if `N < 3` or `dg` is shorter than the masked head.
    #[inline(always)] // a long packet then pays one comparison, not a call
    pub(super) fn masked<const N: usize>(dg: &[u8], mask: &[[u8; 16]; N]) -> Option<u32> {
        if dg.len() + 8 >= super::FOLD_MAX || !available() {
            return None;
        }
        assert!(N >= 3 && dg.len() + 8 >= 16 * N);
        // SAFETY: `kernel` needs only the CPU features `available` has just checked.
        Some(unsafe { kernel(dg, mask) })
    }

    /// The fold (128 bits, not reduced, aligned with the next 16 bytes) of the LRH stand-in and
    /// the head `dg` (at least its `16 N - 8` masked bytes after the stand-in; any bytes after
    /// them unmasked): where the wide kernel takes over a long packet — after the masked head
    /// on the receive check, after the headers up to the payload as the sender copies it.
    /// Inlined into the wide kernel's callers, so that it is encoded as they are (VEX) and
    /// nothing is reduced in between.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    pub(super) fn head_state<const N: usize>(dg: &[u8], mask: &[[u8; 16]; N]) -> a::__m128i {
        let len = dg.len() + 8;
        assert!(N >= 3 && len >= 16 * N);
        let k3k4 = a::_mm_set_epi64x(K4, K3);
        let mut x = first_block(dg, &mask[0]);
        for (i, m) in mask.iter().enumerate().skip(1) {
            x = fold16(x, a::_mm_or_si128(load(&dg[i * 16 - 8..]), load(m)), k3k4);
        }
        for i in N..len / 16 {
            x = fold16(x, load(&dg[i * 16 - 8..]), k3k4);
        }
        // `dg` holds at least 40 bytes, as `fold_last` needs.
        let x = fold_last(x, dg, len % 16);
        // Moved forward over the next 16 bytes, onto which it is XORed.
        fold16(x, a::_mm_setzero_si128(), k3k4)
    }

    /// `chunk` (16 bytes) ORed with `m` in one 16-byte store: written as bytes, the mask's
    /// constant bytes became single-byte stores, and crc32fast's wide loads of them then waited
    /// for the stores to retire.
    #[inline]
    pub(super) fn or_in_place(chunk: &mut [u8], m: &[u8; 16]) {
        let chunk = &mut chunk[..16];
        // SAFETY: SSE2 is part of x86-64; 16 bytes readable and writable, no alignment needed.
        unsafe {
            let v = a::_mm_or_si128(a::_mm_loadu_si128(chunk.as_ptr().cast()), load(m));
            a::_mm_storeu_si128(chunk.as_mut_ptr().cast(), v);
        }
    }

    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    fn kernel<const N: usize>(dg: &[u8], mask: &[[u8; 16]; N]) -> u32 {
        let k3k4 = a::_mm_set_epi64x(K4, K3);
        // Block i (i >= 1) of the packet: dg from 16 i - 8, masked while i < N.
        let block = |i: usize| {
            let b = load(&dg[i * 16 - 8..]);
            match mask.get(i) {
                Some(m) => a::_mm_or_si128(b, load(m)),
                None => b,
            }
        };
        let len = dg.len() + 8;
        let blocks = len / 16;
        let mut x = first_block(dg, &mask[0]);
        let mut i = 1;
        if blocks >= 8 {
            // Four streams (block i into stream i mod 4), each folded 512 bits forward, so that
            // the folds of a round do not wait on each other; then one 128-bit fold apiece
            // brings them together.
            let k1k2 = a::_mm_set_epi64x(K2, K1);
            let (mut x1, mut x2, mut x3) = (block(1), block(2), block(3));
            i = 4;
            while blocks - i >= 4 {
                x = fold16(x, block(i), k1k2);
                x1 = fold16(x1, block(i + 1), k1k2);
                x2 = fold16(x2, block(i + 2), k1k2);
                x3 = fold16(x3, block(i + 3), k1k2);
                i += 4;
            }
            x = fold16(x, x1, k3k4);
            x = fold16(x, x2, k3k4);
            x = fold16(x, x3, k3k4);
        }
        while i < blocks {
            x = fold16(x, block(i), k3k4);
            i += 1;
        }
        last_and_reduce(x, dg, len % 16)
    }

    /// `x` (the fold of everything before `data[from..]`, not yet reduced) folded over
    /// `data[from..]`, then reduced: the CRC of it all. Needs `data.len() >= 16` when
    /// `data.len() - from` is not a multiple of 16. The wide kernel's last partial block.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    pub(super) fn fold_rest(mut x: a::__m128i, data: &[u8], from: usize) -> u32 {
        let k3k4 = a::_mm_set_epi64x(K4, K3);
        let mut o = from;
        while data.len() - o >= 16 {
            x = fold16(x, load(&data[o..]), k3k4);
            o += 16;
        }
        last_and_reduce(x, data, data.len() - o)
    }

    /// `x` folded over the last `n` (0..=15) bytes of `data` (which holds at least 16 when
    /// `n > 0`), then reduced to the CRC.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    fn last_and_reduce(x: a::__m128i, data: &[u8], n: usize) -> u32 {
        reduce(fold_last(x, data, n))
    }

    /// `x` (aligned with `data`'s last `n` bytes: the fold of everything before them) folded
    /// over those `n` (0..=15) bytes: the fold aligned with `data`'s end. `data` holds at least
    /// 16 bytes when `n > 0`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    fn fold_last(x: a::__m128i, data: &[u8], n: usize) -> a::__m128i {
        if n == 0 {
            return x;
        }
        // The last n (1..=15) bytes: x moves down by n bytes, its low n bytes (shifted out)
        // are folded over the vacated top, where the n new bytes go — read as the top of the
        // data's last 16 bytes, the bytes before them zeroed.
        let k3k4 = a::_mm_set_epi64x(K4, K3);
        let seq = a::_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let shl = a::_mm_add_epi8(seq, a::_mm_set1_epi8(n as i8 - 16));
        let high = a::_mm_set1_epi8(-128);
        let shr = a::_mm_xor_si128(shl, high);
        let keep_top = a::_mm_or_si128(seq, a::_mm_and_si128(shl, high));
        let out = a::_mm_shuffle_epi8(x, shl);
        let last = a::_mm_shuffle_epi8(load(&data[data.len() - 16..]), keep_top);
        fold16(
            out,
            a::_mm_xor_si128(a::_mm_shuffle_epi8(x, shr), last),
            k3k4,
        )
    }

    /// A fold (128 bits, aligned with the end of the bytes) reduced to their CRC: 128 bits to
    /// 96, to 64 (K4, K5), then Barrett to 32.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1,ssse3")]
    fn reduce(x: a::__m128i) -> u32 {
        let k3k4 = a::_mm_set_epi64x(K4, K3);
        let lo32 = a::_mm_set_epi32(0, 0, 0, -1);
        let x = a::_mm_xor_si128(
            a::_mm_clmulepi64_si128(x, k3k4, 0x10),
            a::_mm_srli_si128(x, 8),
        );
        let x = a::_mm_xor_si128(
            a::_mm_clmulepi64_si128(a::_mm_and_si128(x, lo32), a::_mm_set_epi64x(0, K5), 0x00),
            a::_mm_srli_si128(x, 4),
        );
        let pu = a::_mm_set_epi64x(U_PRIME, P_X);
        let t1 = a::_mm_clmulepi64_si128(a::_mm_and_si128(x, lo32), pu, 0x10);
        let t2 = a::_mm_clmulepi64_si128(a::_mm_and_si128(t1, lo32), pu, 0x00);
        !(a::_mm_extract_epi32(a::_mm_xor_si128(x, t2), 1) as u32)
    }

    /// Block 0 of a packet, with the CRC's initial ones XORed in: eight bytes of ones (the LRH
    /// stand-in), then `dg`'s first eight, put together in a register (a 16-byte load of bytes
    /// just stored piecewise would wait for the stores to retire), ORed with `m`.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn first_block(dg: &[u8], m: &[u8; 16]) -> a::__m128i {
        let dg = &dg[..8];
        // SAFETY: 8 readable bytes; the load needs no alignment.
        let first = unsafe { a::_mm_loadl_epi64(dg.as_ptr().cast()) };
        let b0 = a::_mm_or_si128(a::_mm_unpacklo_epi64(a::_mm_set1_epi8(-1), first), load(m));
        a::_mm_xor_si128(b0, a::_mm_cvtsi32_si128(-1))
    }

    /// The first 16 bytes of `b` (bounds-checked).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn load(b: &[u8]) -> a::__m128i {
        let b = &b[..16];
        // SAFETY: 16 readable bytes; the load needs no alignment.
        unsafe { a::_mm_loadu_si128(b.as_ptr().cast()) }
    }

    /// x folded 128 bits forward onto b (with `k` = K3, K4; other distances with theirs).
    #[inline]
    #[target_feature(enable = "pclmulqdq", enable = "sse2")]
    pub(super) fn fold16(x: a::__m128i, b: a::__m128i, k: a::__m128i) -> a::__m128i {
        let lo = a::_mm_clmulepi64_si128(x, k, 0x00);
        let hi = a::_mm_clmulepi64_si128(x, k, 0x11);
        a::_mm_xor_si128(a::_mm_xor_si128(b, lo), hi)
    }
}

/// The wire bytes of an ICRC value.
pub fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

/// The ICRC value its wire bytes stand for.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

/// Payloads of at least this many bytes are hashed into the ICRC as they are copied into the
/// frame ([`Payload::copy_in`]), on a CPU with the wide kernel (AVX-512 with VPCLMULQDQ).
pub const FUSE_MIN: usize = 256;

/// Whether the CPU has what the fused copy-and-hash kernel needs (asked once).
pub fn fused_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        wide::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Copies `src` into `dst` (of the same length) and returns the CRC-32 (zlib) of the bytes
/// `crc` was the CRC of followed by `src`: `crc32fast::Hasher::new_with_initial(crc)` updated
/// with `src`, in one pass over the bytes where a copy and a CRC make two.
pub fn copy_hashing(crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(src.len(), dst.len(), "copy_hashing: lengths differ");
    // SAFETY: `src` is a slice of `dst.len()` readable bytes, and cannot overlap `dst`, which
    // is borrowed mutably.
    #[allow(unsafe_code)]
    unsafe {
        copy_hashing_raw(crc, src.as_ptr(), dst)
    }
}

/// [`copy_hashing`] from a raw source: another program's memory, which may change while it is
/// read (a NIC's DMA source). Each byte is loaded once, and what is stored and what is hashed
/// are that one load, so the CRC is always the CRC of the bytes `dst` ends up holding.
///
/// # Safety
///
/// `src` must be valid for reads of `dst.len()` bytes and must not overlap `dst`.
#[allow(unsafe_code)]
pub unsafe fn copy_hashing_raw(crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= wide::BLOCK && wide::available() {
        // SAFETY: the CPU has the kernel's features (just checked); `src` is readable for
        // `dst.len()` bytes and does not overlap `dst` (the caller's promise).
        return unsafe { wide::copy_hashing(crc, src, dst) };
    }
    if dst.is_empty() {
        return crc;
    }
    // SAFETY: `src` is readable for `dst.len()` bytes and does not overlap `dst` (the caller's
    // promise). The CRC is then of `dst`, what was stored.
    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
    let mut h = Hasher::new_with_initial(crc);
    h.update(dst);
    h.finalize()
}

/// The CRC-32 (zlib) of the bytes `crc` was the CRC of followed by `bytes`, a bit at a time:
/// for the zero to three pad bytes after a payload hashed as it was copied.
fn update_bitwise(crc: u32, bytes: &[u8]) -> u32 {
    let mut r = !crc;
    for &b in bytes {
        r ^= b as u32;
        for _ in 0..8 {
            r = (r >> 1) ^ (0xEDB8_8320 & (r & 1).wrapping_neg());
        }
    }
    !r
}

/// Where a copy writes: a plain buffer, or a packet's [`Payload`] that hashes what is copied
/// into it. The RNIC's gather (from registered memory into a frame) is written against it.
pub trait CopyIn {
    /// Bytes it holds.
    fn room(&self) -> usize;
    /// Whether `n` bytes at `at` fit (the check before a copy that must not panic).
    #[inline]
    fn fits(&self, at: usize, n: usize) -> bool {
        at.checked_add(n).is_some_and(|e| e <= self.room())
    }
    /// Copies `src` to `at`. Panics if it does not fit.
    fn copy_in(&mut self, at: usize, src: &[u8]);
    /// Copies `n` bytes from `src` to `at`. Panics if they do not fit.
    ///
    /// # Safety
    ///
    /// `src` must be valid for reads of `n` bytes and must not overlap `self`; the bytes may
    /// change while they are read (each is loaded once).
    #[allow(unsafe_code)]
    unsafe fn copy_in_raw(&mut self, at: usize, src: *const u8, n: usize);
    /// Zeroes `n` bytes at `at`. Panics if they do not fit.
    fn zero(&mut self, at: usize, n: usize);
}

impl CopyIn for [u8] {
    fn room(&self) -> usize {
        self.len()
    }
    #[inline]
    fn copy_in(&mut self, at: usize, src: &[u8]) {
        self[at..at + src.len()].copy_from_slice(src);
    }
    #[inline]
    #[allow(unsafe_code)]
    unsafe fn copy_in_raw(&mut self, at: usize, src: *const u8, n: usize) {
        let dst = &mut self[at..at + n];
        // SAFETY: `dst` is `n` writable bytes; the caller promises `src` is readable for `n`
        // bytes and does not overlap us.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) };
    }
    fn zero(&mut self, at: usize, n: usize) {
        self[at..at + n].fill(0);
    }
}

/// A packet's payload as the builder hands it to the code that writes it (the `fill` of
/// [`crate::HeaderTemplate::emit`] and [`crate::FrameRepr::emit`]), with the frame around it.
/// Bytes copied in with [`CopyIn::copy_in`] (or `copy_in_raw`) in order from the payload's first
/// byte are hashed into the ICRC as they are copied — one pass over them where there were two
/// — when the payload is at least [`FUSE_MIN`] bytes and the CPU has the wide kernel. Bytes
/// written any other way (through `DerefMut`, out of order) are hashed with the whole frame
/// after the fill, as every payload is otherwise: the ICRC is the same either way.
#[derive(Debug)]
pub struct Payload<'a> {
    /// The frame up to the payload's end.
    frame: &'a mut [u8],
    /// Where the payload starts in `frame`.
    at: usize,
    /// The IP header's place (offset, length, IPv6), for the head's CRC.
    ip: (usize, usize, bool),
    /// Whether the payload is being hashed as it is copied: false once anything else happened
    /// (or from the start, when it cannot be).
    fusing: bool,
    /// Payload bytes hashed so far, and the CRC of the frame's covered bytes up to them.
    hashed: usize,
    crc: u32,
}

impl<'a> Payload<'a> {
    /// The payload `frame[at..]`, to be hashed as it is copied when `ip` (the IP header's place)
    /// is given, it is long enough and the CPU has the kernel.
    #[inline(always)]
    pub(crate) fn new(frame: &'a mut [u8], at: usize, ip: Option<(usize, usize, bool)>) -> Self {
        let fusing = ip.is_some() && frame.len() - at >= FUSE_MIN && fused_available();
        Payload {
            frame,
            at,
            ip: ip.unwrap_or_default(),
            fusing,
            hashed: 0,
            crc: 0,
        }
    }

    /// The CRC of the frame's covered bytes to the payload's end, when every payload byte was
    /// hashed as it was copied.
    #[inline(always)]
    pub(crate) fn hashed(&self) -> Option<u32> {
        (self.fusing && self.hashed == self.frame.len() - self.at).then_some(self.crc)
    }

    /// Whether bytes copied to `at` can go on with the hash (the next byte it needs).
    #[inline(always)]
    fn hash_from(&mut self, at: usize) -> bool {
        if !self.fusing || at != self.hashed {
            self.fusing = false;
            return false;
        }
        true
    }

    /// Copies `n` bytes at `at` from `src`, hashing them when they go on with the hash: the one
    /// body of `copy_in` and `copy_in_raw`. The first piece hashes the head (the LRH stand-in
    /// and the masked headers up to the payload) before it.
    ///
    /// # Safety
    ///
    /// As [`CopyIn::copy_in_raw`].
    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn put(&mut self, at: usize, src: *const u8, n: usize) {
        let hash = self.hash_from(at);
        let start = self.at + at;
        if hash && at == 0 {
            let (head, rest) = self.frame.split_at_mut(start);
            // SAFETY: the caller's promise about `src`.
            self.crc = unsafe { head_copy_hashing(head, self.ip, src, &mut rest[..n]) };
            self.hashed = n;
            return;
        }
        let dst = &mut self.frame[start..start + n];
        if hash {
            // SAFETY: the caller's promise about `src`.
            self.crc = unsafe { copy_hashing_raw(self.crc, src, dst) };
            self.hashed += n;
        } else {
            // SAFETY: as above; `dst` is `n` writable bytes.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) };
        }
    }
}

/// Copies `dst.len()` bytes from `src` to `dst`, the payload's first piece, and returns the CRC
/// of the LRH stand-in, the masked headers (`head[ip.0..]`, the IP header's place `ip`) and
/// those bytes. With the wide kernel and a standard IP header, the head's fold enters the
/// kernel's first block unreduced; otherwise the head's CRC is taken first.
///
/// # Safety
///
/// As [`copy_hashing_raw`].
// Inlined: as a call, it was handed the IP header's place by reference and read it with one
// 16-byte load of bytes stored in eight-byte pieces when the payload was made, a load that waited
// for those stores to retire.
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn head_copy_hashing(
    head: &mut [u8],
    (l3, ihl, v6): (usize, usize, bool),
    src: *const u8,
    dst: &mut [u8],
) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= wide::BLOCK && wide::available() {
        let dg = &head[l3..];
        // SAFETY (both): the CPU has the kernel's features (just checked); the caller's promise
        // about `src`.
        match (v6, ihl) {
            (false, 20) if dg.len() + 8 >= V4_HEAD => {
                return unsafe { wide::copy_hashing_after(dg, &V4_MASK, src, dst) };
            }
            (true, 40) if dg.len() + 8 >= V6_HEAD => {
                return unsafe { wide::copy_hashing_after(dg, &V6_MASK, src, dst) };
            }
            _ => {}
        }
    }
    let end = head.len() + 4;
    let crc = compute_in_place(head, l3, ihl, v6, end);
    // SAFETY: the caller's promise.
    unsafe { copy_hashing_raw(crc, src, dst) }
}

impl CopyIn for Payload<'_> {
    fn room(&self) -> usize {
        self.frame.len() - self.at
    }
    #[inline(always)]
    fn copy_in(&mut self, at: usize, src: &[u8]) {
        // SAFETY: a slice of `src.len()` readable bytes, which cannot overlap `self.frame`
        // (borrowed mutably by us).
        #[allow(unsafe_code)]
        unsafe {
            self.put(at, src.as_ptr(), src.len())
        }
    }
    #[inline]
    #[allow(unsafe_code)]
    unsafe fn copy_in_raw(&mut self, at: usize, src: *const u8, n: usize) {
        // SAFETY: the caller's promise.
        unsafe { self.put(at, src, n) }
    }
    fn zero(&mut self, at: usize, n: usize) {
        self.fusing = false;
        let start = self.at + at;
        self.frame[start..start + n].fill(0);
    }
}

impl std::ops::Deref for Payload<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        &self.frame[self.at..]
    }
}

/// Writing the payload directly: it is then hashed with the whole frame after the fill.
impl std::ops::DerefMut for Payload<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.fusing = false;
        &mut self.frame[self.at..]
    }
}

/// The ICRC of a frame whose payload `frame[p..p + payload_len]` was written (`hashed`: the
/// CRC to the payload's end when it was hashed as it was copied), its zero to three pad bytes
/// after it and `end` just past the ICRC.
#[inline]
pub(crate) fn finish(
    frame: &mut [u8],
    (l3, ihl, v6): (usize, usize, bool),
    hashed: Option<u32>,
    pad_from: usize,
    end: usize,
) -> u32 {
    match hashed {
        Some(crc) => update_bitwise(crc, &frame[pad_from..end - 4]),
        None => compute_in_place(frame, l3, ihl, v6, end),
    }
}

/// The fused copy and CRC for long payloads: four 512-bit streams folded 2048 bits forward as
/// the bytes are loaded, stored and hashed from the same registers, then brought to one
/// 128-bit value and reduced as `fold` does. The fold constants are x^(d+32) and x^(d-32) mod
/// P for a fold over d bits, bit-reflected and shifted left by one (the convention of `fold`'s
/// K1–K5, which `constants_are_the_fold_ones` checks they reproduce), computed at compile time.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod wide {
    use core::arch::x86_64 as a;
    use std::sync::atomic::AtomicU8;

    /// The least the kernel takes: four streams of 64 bytes.
    pub(super) const BLOCK: usize = 256;

    /// x^n mod P (the CRC-32 polynomial, not reflected).
    pub(super) const fn xpow(n: u32) -> u32 {
        let mut r: u64 = 1;
        let mut i = 0;
        while i < n {
            r <<= 1;
            if r & (1 << 32) != 0 {
                r ^= 0x1_04C1_1DB7;
            }
            i += 1;
        }
        r as u32
    }

    /// A fold constant for the bit-reflected CRC: x^n mod P reflected, shifted left by one.
    pub(super) const fn k(n: u32) -> i64 {
        ((xpow(n).reverse_bits() as u64) << 1) as i64
    }

    /// Whether the CPU has AVX-512F and VPCLMULQDQ, and what the 128-bit fold inlined into the
    /// kernel's callers needs (asked once, then one load).
    #[inline]
    pub(super) fn available() -> bool {
        static HAS: AtomicU8 = AtomicU8::new(0);
        super::detect_once(&HAS, || {
            std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("vpclmulqdq")
                && std::is_x86_feature_detected!("pclmulqdq")
                && std::is_x86_feature_detected!("sse4.1")
                && std::is_x86_feature_detected!("ssse3")
        })
    }

    /// Copies `dst.len()` bytes (at least [`BLOCK`]) from `src` to `dst` and returns the CRC of
    /// the bytes `crc` was the CRC of followed by them.
    ///
    /// # Safety
    ///
    /// The CPU has the features `available` checks; `src` is readable for `dst.len()` bytes and
    /// does not overlap `dst`.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
    pub(super) unsafe fn copy_hashing(crc: u32, src: *const u8, dst: &mut [u8]) -> u32 {
        // SAFETY: the caller's promises.
        unsafe { copy_from(a::_mm_cvtsi32_si128(!crc as i32), src, dst) }
    }

    /// As [`copy_hashing`], after the LRH stand-in and the head `dg` (the datagram up to the
    /// payload), its first `16 N` bytes (the stand-in's included) ORed with `mask`: the head
    /// folded into the kernel's first block from registers, not reduced to a CRC first.
    ///
    /// # Safety
    ///
    /// As [`copy_hashing`].
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
    pub(super) unsafe fn copy_hashing_after<const N: usize>(
        dg: &[u8],
        mask: &[[u8; 16]; N],
        src: *const u8,
        dst: &mut [u8],
    ) -> u32 {
        let init = super::fold::head_state(dg, mask);
        // SAFETY: the caller's promises.
        unsafe { copy_from(init, src, dst) }
    }

    /// The body of both: `init` in the kernel's form (XORed onto the first 16 bytes).
    ///
    /// # Safety
    ///
    /// As [`copy_hashing`].
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
    unsafe fn copy_from(init: a::__m128i, src: *const u8, dst: &mut [u8]) -> u32 {
        let n = dst.len();
        assert!(n >= BLOCK);
        let whole = n / 64 * 64;
        // SAFETY: the caller's promises; `dst` is `n >= whole` writable bytes.
        let x = unsafe { kernel::<true>(init, src, dst.as_mut_ptr(), whole) };
        // SAFETY: as above, for the last `n - whole` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(whole), dst[whole..].as_mut_ptr(), n - whole)
        };
        // `dst` holds at least 256 bytes, as `fold_rest` needs.
        super::fold::fold_rest(x, dst, whole)
    }

    /// The ICRC of a long packet: the LRH stand-in and `dg` (the datagram to the ICRC), its
    /// first `16 N` bytes (the stand-in's included) ORed with `mask`: the head folded from
    /// registers, the rest (at least [`BLOCK`] bytes) by the wide kernel over its whole 64-byte
    /// chunks, and the 128-bit fold over what is left; one reduction at the end. The CPU must
    /// have the features `available` checks.
    #[inline]
    pub(super) fn masked<const N: usize>(dg: &[u8], mask: &[[u8; 16]; N]) -> u32 {
        // SAFETY: the caller checked the features (which include `fold`'s).
        unsafe { masked_kernel(dg, mask) }
    }

    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
    fn masked_kernel<const N: usize>(dg: &[u8], mask: &[[u8; 16]; N]) -> u32 {
        let h = 16 * N - 8;
        let rest = &dg[h..];
        assert!(rest.len() >= BLOCK);
        let whole = rest.len() / 64 * 64;
        let init = super::fold::head_state(&dg[..h], mask);
        // SAFETY: `rest` is readable for `whole` bytes; nothing is written; `rest` holds at
        // least 256 bytes for `fold_rest`; the features are this function's.
        unsafe {
            let x = kernel::<false>(init, rest.as_ptr(), std::ptr::null_mut(), whole);
            super::fold::fold_rest(x, rest, whole)
        }
    }

    /// The fold (128 bits, not yet reduced) of what `init` stands for (a running CRC in its
    /// register form, or a fold aligned with `src`, XORed onto the first 16 bytes) followed by
    /// `n` bytes at `src` (at least [`BLOCK`], a multiple of 64), copied to `d` on the way when
    /// `COPY`: four streams over whole blocks, then one over the 64-byte rest.
    ///
    /// # Safety
    ///
    /// The CPU has the features `available` checks; `src` is readable for `n` bytes, and with
    /// `COPY` `dst` is writable for `n` bytes and does not overlap it.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.1,ssse3")]
    unsafe fn kernel<const COPY: bool>(
        init: a::__m128i,
        src: *const u8,
        d: *mut u8,
        n: usize,
    ) -> a::__m128i {
        debug_assert!(n >= BLOCK && n.is_multiple_of(64));
        // Macros, not closures: a closure does not inherit the function's target features, and
        // its intrinsics would become calls.
        macro_rules! copy64 {
            ($o:expr) => {{
                // SAFETY: `$o + 64 <= n`: readable at `src`, writable at `d` with `COPY`; no
                // alignment needed.
                let v = unsafe { a::_mm512_loadu_si512(src.add($o).cast()) };
                if COPY {
                    unsafe { a::_mm512_storeu_si512(d.add($o).cast(), v) };
                }
                v
            }};
        }
        // A fold's constants over `$dist` bits, in a 128-bit lane and in all four of a zmm.
        macro_rules! k128 {
            ($dist:expr) => {
                a::_mm_set_epi64x(const { k($dist - 32) }, const { k($dist + 32) })
            };
        }
        macro_rules! kz {
            ($dist:expr) => {
                a::_mm512_broadcast_i32x4(k128!($dist))
            };
        }
        macro_rules! fold512 {
            ($x:expr, $y:expr, $k:expr) => {
                a::_mm512_ternarylogic_epi64::<0x96>(
                    a::_mm512_clmulepi64_epi128::<0x00>($x, $k),
                    a::_mm512_clmulepi64_epi128::<0x11>($x, $k),
                    $y,
                )
            };
        }
        let (mut x0, mut x1, mut x2, mut x3) =
            (copy64!(0), copy64!(64), copy64!(128), copy64!(192));
        // What came before enters XORed onto the first 16 bytes: a running CRC as the first four
        // bytes (inverted: the register form), or the head's fold.
        x0 = a::_mm512_xor_si512(x0, a::_mm512_zextsi128_si512(init));
        let k2048 = kz!(2048);
        let mut o = BLOCK;
        while n - o >= BLOCK {
            let (y0, y1, y2, y3) = (
                copy64!(o),
                copy64!(o + 64),
                copy64!(o + 128),
                copy64!(o + 192),
            );
            x0 = fold512!(x0, y0, k2048);
            x1 = fold512!(x1, y1, k2048);
            x2 = fold512!(x2, y2, k2048);
            x3 = fold512!(x3, y3, k2048);
            o += BLOCK;
        }
        // Four streams to one (stream i is 64 (3 - i) bytes before the last), then its four
        // 128-bit lanes to one.
        let k512 = kz!(512);
        let x = fold512!(x2, x3, k512);
        let x = fold512!(x1, x, kz!(1024));
        let mut x = fold512!(x0, x, kz!(1536));
        // Then 64 bytes at a time, one stream.
        while o < n {
            x = fold512!(x, copy64!(o), k512);
            o += 64;
        }
        let l0 = a::_mm512_extracti32x4_epi32::<0>(x);
        let l1 = a::_mm512_extracti32x4_epi32::<1>(x);
        let l2 = a::_mm512_extracti32x4_epi32::<2>(x);
        let l3 = a::_mm512_extracti32x4_epi32::<3>(x);
        let x = super::fold::fold16(l2, l3, k128!(128));
        let x = super::fold::fold16(l1, x, k128!(256));
        super::fold::fold16(l0, x, k128!(384))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wide kernel's constants, computed at compile time, are the fold's (checked by hand
    /// against crc32fast's): a wrong exponent convention would give wrong CRCs everywhere.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn constants_are_the_fold_ones() {
        use super::fold::{K1, K2, K3, K4, K5};
        use super::wide::k;
        assert_eq!(
            [k(512 + 32), k(512 - 32), k(128 + 32), k(128 - 32), k(64)],
            [K1, K2, K3, K4, K5]
        );
    }

    /// The lengths around the kernel's block (256 bytes) and a 4 KiB packet's, from odd offsets
    /// and with odd initial CRCs: the copy is exact and the CRC is crc32fast's, continued.
    #[test]
    fn copy_hashing_matches_crc32fast() {
        if !fused_available() {
            eprintln!("copy_hashing_matches_crc32fast: this CPU has no AVX-512 with VPCLMULQDQ; only the fallback (copy, then crc32fast) was checked");
        }
        let src: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for len in [
            0, 1, 255, 256, 257, 511, 512, 768, 1024, 4095, 4096, 4099, 8192,
        ] {
            for (off, init) in [(0, 0u32), (3, 0xffff_ffff), (61, 0x1234_5678)] {
                let mut dst = vec![0u8; len + 7];
                let got = copy_hashing(init, &src[off..off + len], &mut dst[5..5 + len]);
                let mut h = Hasher::new_with_initial(init);
                h.update(&src[off..off + len]);
                assert_eq!(
                    got,
                    h.finalize(),
                    "{len} bytes from {off}, initial {init:#x}"
                );
                assert_eq!(&dst[5..5 + len], &src[off..off + len]);
                assert_eq!(&dst[..5], &[0; 5]);
                assert_eq!(&dst[5 + len..], &[0; 2]);
            }
        }
    }

    proptest::proptest! {
        /// Any bytes, any length to 6 KiB, any initial CRC: crc32fast's CRC, and the bytes.
        #[test]
        fn copy_hashing_any_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6200),
            init in proptest::prelude::any::<u32>(),
        ) {
            let mut dst = vec![0u8; bytes.len()];
            let got = copy_hashing(init, &bytes, &mut dst);
            let mut h = Hasher::new_with_initial(init);
            h.update(&bytes);
            proptest::prop_assert_eq!(got, h.finalize());
            proptest::prop_assert_eq!(dst, bytes);
        }
    }

    #[test]
    fn pad_bytes_bitwise() {
        for n in 0..4 {
            let mut h = Hasher::new_with_initial(0xdead_beef);
            h.update(&[0, 7, 0xff][..n.min(3)]);
            assert_eq!(
                update_bitwise(0xdead_beef, &[0, 7, 0xff][..n.min(3)]),
                h.finalize()
            );
        }
    }

    #[test]
    fn crc_of_eight_ones_constant() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), CRC_OF_8_ONES);
    }

    /// Reference: mask by copying, then one CRC pass (the algorithm of the rxe-peer notes).
    fn reference(datagram: &[u8], ihl: usize, v6: bool) -> u32 {
        let mut d = datagram.to_vec();
        if v6 {
            d[0] |= 0x0f;
            d[1..4].fill(0xff);
            d[7] = 0xff;
        } else {
            d[1] = 0xff;
            d[8] = 0xff;
            d[10..12].fill(0xff);
        }
        d[ihl + 6..ihl + 8].fill(0xff);
        d[ihl + 12] = 0xff;
        let mut all = vec![0xffu8; 8];
        all.extend_from_slice(&d);
        crc32fast::hash(&all)
    }

    #[test]
    fn matches_copy_and_mask_reference() {
        let mut d: Vec<u8> = (0..300u32).map(|i| (i * 37 + 11) as u8).collect();
        d[0] = 0x45;
        assert_eq!(compute(&d, 20, false), reference(&d, 20, false));
        d[0] = 0x47; // IHL 7: options are covered
        assert_eq!(compute(&d, 28, false), reference(&d, 28, false));
        d[0] = 0x6a;
        assert_eq!(compute(&d, 40, true), reference(&d, 40, true));
    }

    proptest::proptest! {
        /// Every datagram length either side of `FOLD_MAX` (the short kernel and crc32fast),
        /// IPv4 with and without options and IPv6, any bytes: both entry points give the
        /// copy-and-mask reference's CRC, and the in-place one leaves the frame as it was.
        #[test]
        fn both_kernels_match_the_reference(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 48..600),
            kind in 0usize..3,
            lead in 8usize..24,
        ) {
            let (ihl, v6, first) = [(20, false, 0x45u8), (28, false, 0x47), (40, true, 0x6a)][kind];
            proptest::prop_assume!(bytes.len() >= ihl + UDP_LEN + BTH_LEN + 4);
            let mut d = bytes.clone();
            d[0] = first;
            let want = reference(&d[..d.len() - 4], ihl, v6);
            proptest::prop_assert_eq!(compute(&d[..d.len() - 4], ihl, v6), want);
            // The same datagram after `lead` bytes of a frame, in place.
            let mut f = vec![0x5au8; lead];
            f.extend_from_slice(&d);
            let before = f.clone();
            let end = f.len();
            proptest::prop_assert_eq!(compute_in_place(&mut f, lead, ihl, v6, end), want);
            proptest::prop_assert_eq!(f, before);
        }
    }

    /// Every length of the short kernel, one by one (the partial last block takes 1..=15 bytes).
    #[test]
    fn every_short_length_matches() {
        for len in 40..FOLD_MAX + 20 {
            let mut d: Vec<u8> = (0..len as u32)
                .map(|i| (i * 131 + len as u32) as u8)
                .collect();
            d[0] = 0x45;
            assert_eq!(
                compute(&d, 20, false),
                reference(&d, 20, false),
                "IPv4, {len} bytes"
            );
            d[0] = 0x6a;
            if len >= 60 {
                assert_eq!(
                    compute(&d, 40, true),
                    reference(&d, 40, true),
                    "IPv6, {len} bytes"
                );
            }
        }
    }

    #[test]
    fn in_place_matches_and_restores_every_byte() {
        for (ihl, v6, first) in [(20, false, 0x45u8), (28, false, 0x47), (40, true, 0x6a)] {
            let mut f: Vec<u8> = (0..400u32).map(|i| (i * 91 + 3) as u8).collect();
            f[14] = first;
            let before = f.clone();
            let end = 380;
            let c = compute_in_place(&mut f, 14, ihl, v6, end);
            assert_eq!(f, before, "frame restored");
            assert_eq!(c, compute(&f[14..end - 4], ihl, v6));
        }
    }
}
