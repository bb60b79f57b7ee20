//! The invariant CRC of RoCEv2 (IBTA Annex A17.3.3, built on Vol. 1 7.8.1).
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

/// CRC-32 of eight 0xFF bytes, the LRH stand-in every ICRC starts with.
const CRC_OF_8_ONES: u32 = 0x2144_df1c;

const UDP_LEN: usize = 8;
const BTH_LEN: usize = 12;

/// The ICRC of one RoCEv2 packet. `datagram` is the IP datagram from the first byte of the IP
/// header to the last byte before the ICRC; `ip_header_len` is 40 for IPv6 and IHL × 4 for IPv4.
/// The caller guarantees `datagram` holds the IP, UDP and BTH headers.
pub fn compute(datagram: &[u8], ip_header_len: usize, ipv6: bool) -> u32 {
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
/// pass over the frame itself: the eight bytes before the IP header (the end of the Ethernet
/// header) and the variant fields are overwritten with ones, hashed, and put back. This is what
/// the builder and a receive path that owns its buffer use; it costs what a plain CRC of the
/// same bytes costs. `end` is the offset just past the ICRC. Needs `l3 >= 8` (any Ethernet
/// frame); the caller guarantees that the IP, UDP and BTH headers lie within `frame[..end]`.
pub fn compute_in_place(
    frame: &mut [u8],
    l3: usize,
    ip_header_len: usize,
    ipv6: bool,
    end: usize,
) -> u32 {
    debug_assert!(l3 >= 8);
    let u = l3 + ip_header_len;
    let mut saved_lrh = [0u8; 8];
    saved_lrh.copy_from_slice(&frame[l3 - 8..l3]);
    let ip0 = [frame[l3], frame[l3 + 1], frame[l3 + 2], frame[l3 + 3]];
    let (ip7, ip8, ip10, ip11) = (frame[l3 + 7], frame[l3 + 8], frame[l3 + 10], frame[l3 + 11]);
    let (u6, u7, b4) = (frame[u + 6], frame[u + 7], frame[u + UDP_LEN + 4]);
    frame[l3 - 8..l3].fill(0xff);
    if ipv6 {
        frame[l3] |= 0x0f;
        frame[l3 + 1..l3 + 4].fill(0xff);
        frame[l3 + 7] = 0xff;
    } else {
        frame[l3 + 1] = 0xff;
        frame[l3 + 8] = 0xff;
        frame[l3 + 10] = 0xff;
        frame[l3 + 11] = 0xff;
    }
    frame[u + 6] = 0xff;
    frame[u + 7] = 0xff;
    frame[u + UDP_LEN + 4] = 0xff;
    let crc = crc32fast::hash(&frame[l3 - 8..end - 4]);
    frame[l3 - 8..l3].copy_from_slice(&saved_lrh);
    frame[l3..l3 + 4].copy_from_slice(&ip0);
    (frame[l3 + 7], frame[l3 + 8], frame[l3 + 10], frame[l3 + 11]) = (ip7, ip8, ip10, ip11);
    (frame[u + 6], frame[u + 7], frame[u + UDP_LEN + 4]) = (u6, u7, b4);
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
