//! Ethernet II with an optional 802.1Q tag (views in the smoltcp style).
use crate::error::{Error, Layer};

pub type Field = core::ops::Range<usize>;

mod field {
    use super::Field;
    pub const DST: Field = 0..6;
    pub const SRC: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const VLAN_TCI: Field = 14..16;
    pub const VLAN_ETHERTYPE: Field = 16..18;
}

pub const HEADER_LEN: usize = field::ETHERTYPE.end;
pub const VLAN_TAG_LEN: usize = 4;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    pub const BROADCAST: Mac = Mac([0xff; 6]);
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl core::fmt::Display for Mac {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl core::str::FromStr for Mac {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Mac, &'static str> {
        let mut m = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in m.iter_mut() {
            let p = parts.next().ok_or("MAC address needs six hex bytes")?;
            if p.is_empty() || p.len() > 2 {
                return Err("MAC address needs six hex bytes");
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| "MAC address needs six hex bytes")?;
        }
        if parts.next().is_some() {
            return Err("MAC address needs six hex bytes");
        }
        Ok(Mac(m))
    }
}

/// An 802.1Q tag: priority, drop eligible, VLAN id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    pub pcp: u8,
    pub dei: bool,
    pub vid: u16,
}

impl VlanTag {
    pub fn tci(&self) -> u16 {
        (self.pcp as u16 & 7) << 13 | (self.dei as u16) << 12 | (self.vid & 0x0fff)
    }
    pub fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }
}

/// An Ethernet header as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthernetRepr {
    pub dst: Mac,
    pub src: Mac,
    pub vlan: Option<VlanTag>,
    /// The EtherType of the payload (after the tag, if any).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header; returns it and the offset of its payload.
    #[inline]
    pub fn parse(b: &[u8]) -> Result<(EthernetRepr, usize), Error> {
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated {
                layer: Layer::Ethernet,
                need: HEADER_LEN,
                have: b.len(),
            });
        }
        let mut dst = [0; 6];
        let mut src = [0; 6];
        dst.copy_from_slice(&b[field::DST]);
        src.copy_from_slice(&b[field::SRC]);
        let et = u16::from_be_bytes([b[12], b[13]]);
        if et == ETHERTYPE_VLAN {
            if b.len() < HEADER_LEN + VLAN_TAG_LEN {
                return Err(Error::Truncated {
                    layer: Layer::Vlan,
                    need: HEADER_LEN + VLAN_TAG_LEN,
                    have: b.len(),
                });
            }
            let tci = u16::from_be_bytes([b[field::VLAN_TCI][0], b[field::VLAN_TCI][1]]);
            let inner =
                u16::from_be_bytes([b[field::VLAN_ETHERTYPE][0], b[field::VLAN_ETHERTYPE][1]]);
            return Ok((
                EthernetRepr {
                    dst: Mac(dst),
                    src: Mac(src),
                    vlan: Some(VlanTag::from_tci(tci)),
                    ethertype: inner,
                },
                HEADER_LEN + VLAN_TAG_LEN,
            ));
        }
        Ok((
            EthernetRepr {
                dst: Mac(dst),
                src: Mac(src),
                vlan: None,
                ethertype: et,
            },
            HEADER_LEN,
        ))
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN + if self.vlan.is_some() { VLAN_TAG_LEN } else { 0 }
    }

    /// Writes the header at the front of `b`, which must hold `header_len()` bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[field::DST].copy_from_slice(&self.dst.0);
        b[field::SRC].copy_from_slice(&self.src.0);
        match self.vlan {
            Some(tag) => {
                b[field::ETHERTYPE].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                b[field::VLAN_TCI].copy_from_slice(&tag.tci().to_be_bytes());
                b[field::VLAN_ETHERTYPE].copy_from_slice(&self.ethertype.to_be_bytes());
            }
            None => b[field::ETHERTYPE].copy_from_slice(&self.ethertype.to_be_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_round_trip() {
        let r = EthernetRepr {
            dst: Mac([2, 0, 0, 0, 0, 1]),
            src: Mac([2, 0, 0, 0, 0, 2]),
            vlan: Some(VlanTag {
                pcp: 3,
                dei: true,
                vid: 100,
            }),
            ethertype: ETHERTYPE_IPV6,
        };
        let mut b = [0xffu8; 18];
        r.emit(&mut b);
        assert_eq!(&b[12..18], &[0x81, 0x00, 0x70, 0x64, 0x86, 0xdd]);
        assert_eq!(EthernetRepr::parse(&b).unwrap(), (r, 18));
        assert!(matches!(
            EthernetRepr::parse(&b[..15]),
            Err(Error::Truncated {
                layer: Layer::Vlan,
                ..
            })
        ));
        assert!(matches!(
            EthernetRepr::parse(&b[..13]),
            Err(Error::Truncated {
                layer: Layer::Ethernet,
                ..
            })
        ));
    }

    #[test]
    fn mac_text() {
        let m: Mac = "52:54:00:99:00:1a".parse().unwrap();
        assert_eq!(m.to_string(), "52:54:00:99:00:1a");
        assert!("52:54:00:99:00".parse::<Mac>().is_err());
        assert!("52:54:00:99:00:1a:00".parse::<Mac>().is_err());
    }
}
