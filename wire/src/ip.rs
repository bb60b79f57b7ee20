//! IPv4 and IPv6 as RoCEv2 uses them (Annex A17.3.1: A17.3.1.1 for IPv4, A17.3.1.2 for IPv6): IPv4
//! with IHL honoured and the header checksum computed and checked; IPv6 with UDP as the next header
//! (extension headers are an error, not skipped).
use crate::error::{Error, Layer};
use core::net::{Ipv4Addr, Ipv6Addr};

pub const IPV4_MIN_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
pub const PROTO_UDP: u8 = 17;

/// RFC 1071 one's-complement sum of 16-bit words, folded.
pub fn ones_complement_sum(data: &[u8], acc: u32) -> u16 {
    fold(word_sum(data) as u64 + acc as u64)
}

/// The sum of `data`'s big-endian 16-bit words (a last odd byte as the high half of a word),
/// not folded: what an incremental checksum starts from. Read four bytes at a time, since the
/// sum of big-endian 32-bit words folds to the same value as the sum of their 16-bit halves.
pub(crate) fn word_sum(data: &[u8]) -> u32 {
    let mut acc = 0u64;
    let mut quads = data.chunks_exact(4);
    for q in &mut quads {
        acc += u32::from_be_bytes([q[0], q[1], q[2], q[3]]) as u64;
    }
    let mut rest = quads.remainder().chunks_exact(2);
    for c in &mut rest {
        acc += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = rest.remainder() {
        acc += (*last as u64) << 8;
    }
    fold(acc) as u32
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 header checksum of `header` (whose checksum field is skipped).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let s = ones_complement_sum(&header[..10], 0) as u32;
    !ones_complement_sum(&header[12..], s)
}

/// True when the IPv4 header's checksum verifies.
#[inline]
pub fn ipv4_checksum_ok(header: &[u8]) -> bool {
    // The usual header, without options: five 32-bit words.
    if let Ok(h) = <&[u8; IPV4_MIN_HEADER_LEN]>::try_from(header) {
        let w = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]) as u64;
        return fold(w(0) + w(4) + w(8) + w(12) + w(16)) == 0xffff;
    }
    ones_complement_sum(header, 0) == 0xffff
}

/// An IPv4 header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub dscp: u8,
    pub ecn: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub ttl: u8,
    pub protocol: u8,
    pub checksum: u16,
    /// The header length in bytes (IHL × 4).
    pub header_len: usize,
    pub total_len: u16,
}

impl Ipv4Repr {
    /// Parses an IPv4 header at the front of `b` (the rest of the frame) and checks that the
    /// datagram fits. Returns the header and the datagram's bytes (total length, without any
    /// Ethernet padding that follows).
    #[inline]
    pub fn parse(b: &[u8]) -> Result<(Ipv4Repr, &[u8]), Error> {
        if b.len() < IPV4_MIN_HEADER_LEN {
            return Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: IPV4_MIN_HEADER_LEN,
                have: b.len(),
            });
        }
        let version = b[0] >> 4;
        if version != 4 {
            return Err(Error::IpVersion {
                ethertype: crate::eth::ETHERTYPE_IPV4,
                version,
            });
        }
        let ihl = b[0] & 0x0f;
        let hl = ihl as usize * 4;
        let total_len = u16::from_be_bytes([b[2], b[3]]);
        if ihl < 5 || (total_len as usize) < hl {
            return Err(Error::BadIpv4HeaderLength { ihl, total_len });
        }
        if b.len() < hl {
            return Err(Error::Truncated {
                layer: Layer::Ipv4,
                need: hl,
                have: b.len(),
            });
        }
        if total_len as usize > b.len() {
            return Err(Error::IpLengthExceedsFrame {
                v6: false,
                claimed: total_len as usize,
                captured: b.len(),
            });
        }
        let frag = u16::from_be_bytes([b[6], b[7]]);
        let more = frag & 0x2000 != 0;
        let offset = frag & 0x1fff;
        if more || offset != 0 {
            return Err(Error::Ipv4Fragment { offset, more });
        }
        let r = Ipv4Repr {
            src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
            dst: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
            dscp: b[1] >> 2,
            ecn: b[1] & 3,
            ident: u16::from_be_bytes([b[4], b[5]]),
            dont_frag: frag & 0x4000 != 0,
            ttl: b[8],
            protocol: b[9],
            checksum: u16::from_be_bytes([b[10], b[11]]),
            header_len: hl,
            total_len,
        };
        Ok((r, &b[..total_len as usize]))
    }

    /// Writes a 20-byte header (no options) with its checksum at the front of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = 0x45;
        b[1] = self.dscp << 2 | (self.ecn & 3);
        b[2..4].copy_from_slice(&self.total_len.to_be_bytes());
        b[4..6].copy_from_slice(&self.ident.to_be_bytes());
        b[6..8].copy_from_slice(&(if self.dont_frag { 0x4000u16 } else { 0 }).to_be_bytes());
        b[8] = self.ttl;
        b[9] = self.protocol;
        b[10..12].fill(0);
        b[12..16].copy_from_slice(&self.src.octets());
        b[16..20].copy_from_slice(&self.dst.octets());
        let c = ipv4_checksum(&b[..20]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
    }
}

/// An IPv6 header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub dscp: u8,
    pub ecn: u8,
    pub flow_label: u32,
    pub payload_len: u16,
    pub next_header: u8,
    pub hop_limit: u8,
}

/// Next-header values that are IPv6 extension headers (RFC 8200 and the IANA registry).
fn is_ipv6_extension(nh: u8) -> bool {
    matches!(nh, 0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254)
}

impl Ipv6Repr {
    /// Parses an IPv6 header at the front of `b`; returns it and the datagram (header and
    /// payload length, without Ethernet padding). An extension header is an error.
    #[inline]
    pub fn parse(b: &[u8]) -> Result<(Ipv6Repr, &[u8]), Error> {
        if b.len() < IPV6_HEADER_LEN {
            return Err(Error::Truncated {
                layer: Layer::Ipv6,
                need: IPV6_HEADER_LEN,
                have: b.len(),
            });
        }
        let version = b[0] >> 4;
        if version != 6 {
            return Err(Error::IpVersion {
                ethertype: crate::eth::ETHERTYPE_IPV6,
                version,
            });
        }
        let tc = (b[0] << 4) | (b[1] >> 4);
        let payload_len = u16::from_be_bytes([b[4], b[5]]);
        let total = IPV6_HEADER_LEN + payload_len as usize;
        if total > b.len() {
            return Err(Error::IpLengthExceedsFrame {
                v6: true,
                claimed: payload_len as usize,
                captured: b.len() - IPV6_HEADER_LEN,
            });
        }
        let next_header = b[6];
        if is_ipv6_extension(next_header) {
            return Err(Error::Ipv6ExtensionHeader { next_header });
        }
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&b[8..24]);
        dst.copy_from_slice(&b[24..40]);
        let r = Ipv6Repr {
            src: Ipv6Addr::from(src),
            dst: Ipv6Addr::from(dst),
            dscp: tc >> 2,
            ecn: tc & 3,
            flow_label: u32::from_be_bytes([0, b[1] & 0x0f, b[2], b[3]]),
            payload_len,
            next_header,
            hop_limit: b[7],
        };
        Ok((r, &b[..total]))
    }

    /// Writes the 40-byte header at the front of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        let tc = self.dscp << 2 | (self.ecn & 3);
        let fl = self.flow_label & 0x000f_ffff;
        b[0] = 0x60 | (tc >> 4);
        b[1] = (tc << 4) | (fl >> 16) as u8;
        b[2] = (fl >> 8) as u8;
        b[3] = fl as u8;
        b[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
        b[6] = self.next_header;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src.octets());
        b[24..40].copy_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An IPv4 header rxe sent (DF, TTL 64, UDP), from the golden captures.
    const V4: [u8; 20] = [
        0x45, 0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0x0a, 0x63, 0x00,
        0x0b, 0x0a, 0x63, 0x00, 0x0c,
    ];

    #[test]
    fn ipv4_checksum_round_trip() {
        let mut h = V4;
        let c = ipv4_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert!(ipv4_checksum_ok(&h));
        h[8] = 63;
        assert!(!ipv4_checksum_ok(&h));
    }

    #[test]
    fn ipv4_errors() {
        let mut h = [0u8; 60];
        h[..20].copy_from_slice(&V4);
        assert!(Ipv4Repr::parse(&h).is_ok());
        let mut bad = h;
        bad[0] = 0x44;
        assert!(matches!(
            Ipv4Repr::parse(&bad),
            Err(Error::BadIpv4HeaderLength { ihl: 4, .. })
        ));
        let mut frag = h;
        frag[6] = 0x20;
        assert!(matches!(
            Ipv4Repr::parse(&frag),
            Err(Error::Ipv4Fragment { more: true, .. })
        ));
        let e = Ipv4Repr::parse(&h[..50]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "truncated: IPv4 total length 60 > 50 captured"
        );
        let mut v6 = h;
        v6[0] = 0x65;
        assert!(matches!(
            Ipv4Repr::parse(&v6),
            Err(Error::IpVersion { version: 6, .. })
        ));
    }

    #[test]
    fn ipv6_extension_header_is_an_error() {
        let r = Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            dscp: 26,
            ecn: 2,
            flow_label: 0xabcde,
            payload_len: 8,
            next_header: 0,
            hop_limit: 64,
        };
        let mut b = [0u8; 48];
        r.emit(&mut b);
        assert_eq!(
            Ipv6Repr::parse(&b).unwrap_err(),
            Error::Ipv6ExtensionHeader { next_header: 0 }
        );
        let r = Ipv6Repr {
            next_header: 17,
            ..r
        };
        r.emit(&mut b);
        assert_eq!(Ipv6Repr::parse(&b).unwrap().0, r);
    }
}
