//! IEEE 802.1Qbb priority-based flow control (PFC) frames: the MAC control frame a switch sends
//! to stop (and restart) one or more priorities of its upstream neighbour.
//!
//! ```text
//! 0      6      12       14       16                 18                      34      60
//! | dst  | src  | 0x8808 | 0x0101 | class-enable vec | time[0] … time[7]     | pad  |
//!   01-80-C2-00-00-01     opcode   bit i: priority i   u16 each, big-endian
//! ```
//!
//! The layout is IEEE 802.1Qbb's (clause 36 of 802.1Q-2011, Annex 31D of 802.3): the reserved
//! MAC-control multicast destination, EtherType 0x8808, opcode 0x0101, a class-enable vector whose
//! bit i says that `time[i]` applies to priority i, then eight pause times in quanta of 512 bit
//! times. A time of 0 for an enabled priority restarts it at once (XON). The frame is padded to
//! the 60-byte minimum (the FCS is the port's). Checked against Wireshark's
//! `epan/dissectors/packet-maccontrol.c`, which decodes opcode 0x0101 ("Class-Based Flow
//! Control") as an enable vector and then pause times C0…C7; the standard's own text is not in
//! the stored copies (unverified here).
use crate::error::{Error, Layer};
use crate::eth::Mac;

/// The MAC-control EtherType.
pub const ETHERTYPE_MAC_CONTROL: u16 = 0x8808;
/// The PFC opcode (802.3x PAUSE is 0x0001).
pub const OPCODE_PFC: u16 = 0x0101;
/// The reserved multicast address MAC control frames go to.
pub const DST: Mac = Mac([0x01, 0x80, 0xc2, 0x00, 0x00, 0x01]);
/// The frame without its FCS: the Ethernet minimum.
pub const FRAME_LEN: usize = 60;
/// Bit times in one pause quantum.
pub const BITS_PER_QUANTUM: u64 = 512;

/// A PFC frame's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcRepr {
    pub src: Mac,
    /// Bit i set: `quanta[i]` applies to priority i.
    pub enable: u8,
    /// Pause times, in quanta of 512 bit times (0: resume).
    pub quanta: [u16; 8],
}

impl PfcRepr {
    /// A frame that pauses (or, with `quanta` 0, resumes) priority `prio` alone.
    pub fn one(src: Mac, prio: u8, quanta: u16) -> PfcRepr {
        let mut q = [0; 8];
        q[usize::from(prio & 7)] = quanta;
        PfcRepr {
            src,
            enable: 1 << (prio & 7),
            quanta: q,
        }
    }

    /// Writes the frame at the front of `b` (at least [`FRAME_LEN`] bytes); its length.
    pub fn emit(&self, b: &mut [u8]) -> usize {
        let b = &mut b[..FRAME_LEN];
        b[0..6].copy_from_slice(&DST.0);
        b[6..12].copy_from_slice(&self.src.0);
        b[12..14].copy_from_slice(&ETHERTYPE_MAC_CONTROL.to_be_bytes());
        b[14..16].copy_from_slice(&OPCODE_PFC.to_be_bytes());
        b[16..18].copy_from_slice(&u16::from(self.enable).to_be_bytes());
        for (i, q) in self.quanta.iter().enumerate() {
            b[18 + 2 * i..20 + 2 * i].copy_from_slice(&q.to_be_bytes());
        }
        b[34..].fill(0);
        FRAME_LEN
    }

    /// Reads a PFC frame; `Ok(None)` for a frame of another EtherType or MAC-control opcode.
    pub fn parse(b: &[u8]) -> Result<Option<PfcRepr>, Error> {
        if b.len() < 14 || u16::from_be_bytes([b[12], b[13]]) != ETHERTYPE_MAC_CONTROL {
            return Ok(None);
        }
        if b.len() < 34 {
            return Err(Error::Truncated {
                layer: Layer::Ethernet,
                need: 34,
                have: b.len(),
            });
        }
        if u16::from_be_bytes([b[14], b[15]]) != OPCODE_PFC {
            return Ok(None);
        }
        let mut quanta = [0; 8];
        for (i, q) in quanta.iter_mut().enumerate() {
            *q = u16::from_be_bytes([b[18 + 2 * i], b[19 + 2 * i]]);
        }
        let mut src = [0; 6];
        src.copy_from_slice(&b[6..12]);
        Ok(Some(PfcRepr {
            src: Mac(src),
            // The vector's upper octet is reserved (802.1Qbb): ignored as a receiver must.
            enable: b[17],
            quanta,
        }))
    }

    /// How long `quanta` pause a port of `bps` bits per second, in nanoseconds.
    pub fn pause_ns(quanta: u16, bps: u64) -> u64 {
        (u64::from(quanta) * BITS_PER_QUANTUM * 1_000_000_000).div_ceil(bps.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_the_standards() {
        let src = Mac([2, 0, 0, 0, 0, 9]);
        let mut b = [0xaa; 64];
        let n = PfcRepr::one(src, 3, 0xffff).emit(&mut b);
        assert_eq!(n, 60);
        assert_eq!(&b[0..6], &[0x01, 0x80, 0xc2, 0, 0, 1]);
        assert_eq!(&b[6..12], &src.0);
        assert_eq!(&b[12..18], &[0x88, 0x08, 0x01, 0x01, 0x00, 0x08]);
        // time[3] alone, big-endian.
        assert_eq!(
            &b[18..34],
            &[0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert!(b[34..60].iter().all(|&x| x == 0));
        assert_eq!(b[60], 0xaa, "nothing written past the frame");
        let p = PfcRepr::parse(&b[..60]).unwrap().unwrap();
        assert_eq!(p, PfcRepr::one(src, 3, 0xffff));
    }

    #[test]
    fn other_frames_and_short_ones() {
        let mut b = [0u8; 60];
        PfcRepr::one(Mac([2; 6]), 0, 1).emit(&mut b);
        // 802.3x PAUSE (opcode 0x0001) is not PFC.
        b[14] = 0;
        b[15] = 1;
        assert_eq!(PfcRepr::parse(&b).unwrap(), None);
        b[12] = 0x08;
        b[13] = 0x00;
        assert_eq!(PfcRepr::parse(&b).unwrap(), None);
        let mut c = [0u8; 60];
        PfcRepr::one(Mac([2; 6]), 0, 1).emit(&mut c);
        assert!(PfcRepr::parse(&c[..20]).is_err());
        assert_eq!(PfcRepr::parse(&c[..3]).unwrap(), None);
    }

    #[test]
    fn quanta_are_512_bit_times() {
        // 65535 quanta at 100 Gb/s: 335.5 µs.
        assert_eq!(PfcRepr::pause_ns(0xffff, 100_000_000_000), 335_540);
        assert_eq!(PfcRepr::pause_ns(1, 10_000_000_000), 52);
        assert_eq!(PfcRepr::pause_ns(0, 1), 0);
    }
}
