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
    let (head, mask): (usize, &[[u8; 16]]) = match (ipv6, ip_header_len) {
        (false, 20) => (V4_HEAD, &V4_MASK),
        (true, 40) => (V6_HEAD, &V6_MASK),
        _ => return compute_generic(datagram, ip_header_len, ipv6),
    };
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
    let mut saved = [[0u8; 16]; N];
    for (i, m) in mask.iter().enumerate() {
        let at = base + i * 16;
        saved[i].copy_from_slice(&frame[at..at + 16]);
        let v = or16(frame, at, m);
        frame[at..at + 16].copy_from_slice(&v);
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

/// The wire bytes of an ICRC value.
pub fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

/// The ICRC value its wire bytes stand for.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

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
