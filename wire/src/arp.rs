//! ARP for IPv4 over Ethernet (RFC 826): what an RNIC needs to answer for its own addresses and to
//! resolve its peers'. With DPDK the kernel no longer sees the port, so nobody else will.
use crate::error::{Error, Layer};
use crate::eth::{EthernetRepr, Mac, ETHERTYPE_ARP};
use core::net::Ipv4Addr;

/// Bytes of an ARP packet for IPv4 over Ethernet.
pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

/// An ARP packet (hardware type Ethernet, protocol IPv4) as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub op: u16,
    pub sender_mac: Mac,
    pub sender_ip: Ipv4Addr,
    pub target_mac: Mac,
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    /// Parses the ARP packet at the front of `b` (the Ethernet payload). Anything but Ethernet /
    /// IPv4 with 6- and 4-byte addresses is an error.
    pub fn parse(b: &[u8]) -> Result<ArpRepr, Error> {
        if b.len() < PACKET_LEN {
            return Err(Error::Truncated {
                layer: Layer::Arp,
                need: PACKET_LEN,
                have: b.len(),
            });
        }
        let htype = u16::from_be_bytes([b[0], b[1]]);
        let ptype = u16::from_be_bytes([b[2], b[3]]);
        if htype != 1 || ptype != 0x0800 || b[4] != 6 || b[5] != 4 {
            return Err(Error::NotArpForIpv4 { htype, ptype });
        }
        let mac = |o: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&b[o..o + 6]);
            Mac(m)
        };
        let ip = |o: usize| Ipv4Addr::new(b[o], b[o + 1], b[o + 2], b[o + 3]);
        Ok(ArpRepr {
            op: u16::from_be_bytes([b[6], b[7]]),
            sender_mac: mac(8),
            sender_ip: ip(14),
            target_mac: mac(18),
            target_ip: ip(24),
        })
    }

    /// Writes the 28-byte packet at the front of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&1u16.to_be_bytes());
        b[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
        b[4] = 6;
        b[5] = 4;
        b[6..8].copy_from_slice(&self.op.to_be_bytes());
        b[8..14].copy_from_slice(&self.sender_mac.0);
        b[14..18].copy_from_slice(&self.sender_ip.octets());
        b[18..24].copy_from_slice(&self.target_mac.0);
        b[24..28].copy_from_slice(&self.target_ip.octets());
    }

    /// Writes a whole Ethernet frame carrying this packet (padded to the 60-byte minimum);
    /// returns its length. `b` must hold 60 bytes.
    pub fn emit_frame(&self, dst: Mac, b: &mut [u8]) -> usize {
        let eth = EthernetRepr {
            dst,
            src: self.sender_mac,
            vlan: None,
            ethertype: ETHERTYPE_ARP,
        };
        eth.emit(b);
        let h = eth.header_len();
        self.emit(&mut b[h..]);
        b[h + PACKET_LEN..60].fill(0);
        60
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A request as Linux sends it: who-has 10.99.0.2 tell 10.99.0.11.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 10, 99,
        0, 11, 0, 0, 0, 0, 0, 0, 10, 99, 0, 2,
    ];

    #[test]
    fn parse_and_emit_round_trip() {
        let r = ArpRepr::parse(&REQUEST).unwrap();
        assert_eq!(r.op, OP_REQUEST);
        assert_eq!(r.sender_mac, Mac([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
        assert_eq!(r.sender_ip, Ipv4Addr::new(10, 99, 0, 11));
        assert_eq!(r.target_ip, Ipv4Addr::new(10, 99, 0, 2));
        let mut b = [0xa5u8; 28];
        r.emit(&mut b);
        assert_eq!(b, REQUEST);
    }

    #[test]
    fn frame_is_padded_to_minimum() {
        let r = ArpRepr::parse(&REQUEST).unwrap();
        let mut b = [0xa5u8; 64];
        assert_eq!(r.emit_frame(Mac::BROADCAST, &mut b), 60);
        assert_eq!(&b[12..14], &[0x08, 0x06]);
        assert_eq!(&b[14..42], &REQUEST);
        assert!(b[42..60].iter().all(|&x| x == 0));
    }

    #[test]
    fn rejects_short_and_foreign() {
        assert!(ArpRepr::parse(&REQUEST[..27]).is_err());
        let mut other = REQUEST;
        other[5] = 16; // IPv6-sized protocol addresses
        assert!(ArpRepr::parse(&other).is_err());
    }
}
