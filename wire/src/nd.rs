//! IPv6 neighbour discovery (RFC 4861): neighbour solicitations and advertisements with their
//! link-layer address options, enough to answer for an RNIC's own IPv6 addresses and to resolve
//! its peers'. Messages must carry hop limit 255 (RFC 4861 7.1.1) and a valid ICMPv6 checksum.
use crate::error::{Error, Layer};
use crate::eth::{EthernetRepr, Mac, ETHERTYPE_IPV6};
use crate::ip::{ones_complement_sum, Ipv6Repr, IPV6_HEADER_LEN};
use core::net::Ipv6Addr;

pub const PROTO_ICMPV6: u8 = 58;
pub const TYPE_NEIGHBOR_SOLICIT: u8 = 135;
pub const TYPE_NEIGHBOR_ADVERT: u8 = 136;
/// Type, code, checksum, 4 bytes of flags or reserved, the target, one link-layer option.
pub const MESSAGE_LEN: usize = 4 + 4 + 16 + 8;
const OPT_SOURCE_LL: u8 = 1;
const OPT_TARGET_LL: u8 = 2;

/// A neighbour solicitation or advertisement as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdRepr {
    Solicit {
        target: Ipv6Addr,
        source_mac: Option<Mac>,
    },
    Advert {
        router: bool,
        solicited: bool,
        override_: bool,
        target: Ipv6Addr,
        target_mac: Option<Mac>,
    },
}

/// The solicited-node multicast address of `a` (ff02::1:ffXX:XXXX).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// The Ethernet multicast address of an IPv6 multicast address (RFC 2464: 33:33 + last 4 bytes).
pub fn multicast_mac(a: Ipv6Addr) -> Mac {
    let o = a.octets();
    Mac([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

fn checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut acc = ones_complement_sum(&src.octets(), 0) as u32;
    acc = ones_complement_sum(&dst.octets(), acc) as u32;
    acc += msg.len() as u32 >> 16;
    acc += msg.len() as u32 & 0xffff;
    acc += PROTO_ICMPV6 as u32;
    !ones_complement_sum(msg, acc)
}

impl NdRepr {
    /// Parses an ND message from an IPv6 packet (header and payload). Other ICMPv6 messages,
    /// other protocols, a hop limit other than 255 or a bad checksum are errors.
    pub fn parse(ip: &Ipv6Repr, payload: &[u8]) -> Result<NdRepr, Error> {
        if ip.next_header != PROTO_ICMPV6 || ip.hop_limit != 255 {
            return Err(Error::NotNd);
        }
        if payload.len() < 24 {
            return Err(Error::Truncated {
                layer: Layer::Icmpv6,
                need: 24,
                have: payload.len(),
            });
        }
        if payload[1] != 0 || checksum(ip.src, ip.dst, payload) != 0 {
            return Err(Error::NotNd);
        }
        let mut t = [0u8; 16];
        t.copy_from_slice(&payload[8..24]);
        let target = Ipv6Addr::from(t);
        // Options: (type, length in units of 8 bytes, value); a zero length is invalid.
        let mut ll = [None, None];
        let mut opts = &payload[24..];
        while opts.len() >= 2 {
            let len = opts[1] as usize * 8;
            if len == 0 || len > opts.len() {
                return Err(Error::NotNd);
            }
            if (opts[0] == OPT_SOURCE_LL || opts[0] == OPT_TARGET_LL) && len == 8 {
                let mut m = [0u8; 6];
                m.copy_from_slice(&opts[2..8]);
                ll[(opts[0] - 1) as usize] = Some(Mac(m));
            }
            opts = &opts[len..];
        }
        match payload[0] {
            TYPE_NEIGHBOR_SOLICIT => Ok(NdRepr::Solicit {
                target,
                source_mac: ll[0],
            }),
            TYPE_NEIGHBOR_ADVERT => Ok(NdRepr::Advert {
                router: payload[4] & 0x80 != 0,
                solicited: payload[4] & 0x40 != 0,
                override_: payload[4] & 0x20 != 0,
                target,
                target_mac: ll[1],
            }),
            _ => Err(Error::NotNd),
        }
    }

    /// Writes a whole Ethernet frame carrying this message from `src` to `dst` (IPv6 addresses)
    /// and `dst_mac`; returns its length. `b` must hold 86 bytes.
    pub fn emit_frame(
        &self,
        src_mac: Mac,
        dst_mac: Mac,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        b: &mut [u8],
    ) -> usize {
        let eth = EthernetRepr {
            dst: dst_mac,
            src: src_mac,
            vlan: None,
            ethertype: ETHERTYPE_IPV6,
        };
        eth.emit(b);
        let h = eth.header_len();
        Ipv6Repr {
            src,
            dst,
            dscp: 0,
            ecn: 0,
            flow_label: 0,
            payload_len: MESSAGE_LEN as u16,
            next_header: PROTO_ICMPV6,
            hop_limit: 255,
        }
        .emit(&mut b[h..]);
        let m = &mut b[h + IPV6_HEADER_LEN..h + IPV6_HEADER_LEN + MESSAGE_LEN];
        m.fill(0);
        let (target, opt, mac) = match *self {
            NdRepr::Solicit { target, source_mac } => {
                m[0] = TYPE_NEIGHBOR_SOLICIT;
                (target, OPT_SOURCE_LL, source_mac)
            }
            NdRepr::Advert {
                router,
                solicited,
                override_,
                target,
                target_mac,
            } => {
                m[0] = TYPE_NEIGHBOR_ADVERT;
                m[4] = (router as u8) << 7 | (solicited as u8) << 6 | (override_ as u8) << 5;
                (target, OPT_TARGET_LL, target_mac)
            }
        };
        m[8..24].copy_from_slice(&target.octets());
        let len = match mac {
            Some(mac) => {
                m[24] = opt;
                m[25] = 1;
                m[26..32].copy_from_slice(&mac.0);
                MESSAGE_LEN
            }
            None => MESSAGE_LEN - 8,
        };
        b[h + 4..h + 6].copy_from_slice(&(len as u16).to_be_bytes());
        let m = &mut b[h + IPV6_HEADER_LEN..h + IPV6_HEADER_LEN + len];
        let c = checksum(src, dst, m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        h + IPV6_HEADER_LEN + len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_frame_nd(b: &[u8]) -> Result<NdRepr, Error> {
        let (eth, off) = EthernetRepr::parse(b)?;
        assert_eq!(eth.ethertype, ETHERTYPE_IPV6);
        let (ip, dgram) = Ipv6Repr::parse(&b[off..])?;
        NdRepr::parse(&ip, &dgram[IPV6_HEADER_LEN..])
    }

    #[test]
    fn solicit_round_trip_and_checksum() {
        let me: Ipv6Addr = "fd00::1".parse().unwrap();
        let peer: Ipv6Addr = "fd00::2:1234".parse().unwrap();
        let mac = Mac([2, 0, 0, 0, 0, 1]);
        let ns = NdRepr::Solicit {
            target: peer,
            source_mac: Some(mac),
        };
        let mut b = [0u8; 100];
        let dst = solicited_node(peer);
        assert_eq!(dst, "ff02::1:ff02:1234".parse::<Ipv6Addr>().unwrap());
        let n = ns.emit_frame(mac, multicast_mac(dst), me, dst, &mut b);
        assert_eq!(n, 86);
        assert_eq!(&b[0..6], &[0x33, 0x33, 0xff, 0x02, 0x12, 0x34]);
        assert_eq!(parse_frame_nd(&b[..n]).unwrap(), ns);
        // One flipped bit and the checksum no longer holds.
        b[70] ^= 1;
        assert!(parse_frame_nd(&b[..n]).is_err());
    }

    #[test]
    fn advert_round_trip() {
        let na = NdRepr::Advert {
            router: false,
            solicited: true,
            override_: true,
            target: "fd00::1".parse().unwrap(),
            target_mac: Some(Mac([2, 0, 0, 0, 0, 1])),
        };
        let mut b = [0u8; 100];
        let n = na.emit_frame(
            Mac([2, 0, 0, 0, 0, 1]),
            Mac([2, 0, 0, 0, 0, 2]),
            "fd00::1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
            &mut b,
        );
        assert_eq!(parse_frame_nd(&b[..n]).unwrap(), na);
    }

    #[test]
    fn hostile_options_are_errors_not_panics() {
        let na = NdRepr::Solicit {
            target: "fd00::1".parse().unwrap(),
            source_mac: Some(Mac([2, 0, 0, 0, 0, 1])),
        };
        let mut b = [0u8; 100];
        let src: Ipv6Addr = "fd00::2".parse().unwrap();
        let dst: Ipv6Addr = "fd00::1".parse().unwrap();
        let n = na.emit_frame(Mac::BROADCAST, Mac::BROADCAST, src, dst, &mut b);
        for len in [0u8, 2, 255] {
            let mut f = b;
            f[14 + 40 + 25] = len;
            f[14 + 40 + 2..14 + 40 + 4].fill(0);
            let c = checksum(src, dst, &f[14 + 40..n]);
            f[14 + 40 + 2..14 + 40 + 4].copy_from_slice(&c.to_be_bytes());
            let (ip, d) = Ipv6Repr::parse(&f[14..n]).unwrap();
            assert!(NdRepr::parse(&ip, &d[40..]).is_err());
        }
    }
}
