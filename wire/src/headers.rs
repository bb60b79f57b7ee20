//! The base transport header and every extension header (IBTA 9.2, 9.3), as zerocopy views over
//! bytes plus plain `Repr` values with `parse` / `emit`.
//!
//! zerocopy has no 24-bit integer: a QPN, PSN or MSN lives in the low 24 bits of a big-endian
//! `U32` whose top byte holds flags (BTH FECN/BECN, BTH AckReq) or the syndrome (AETH), behind
//! typed accessors. Reserved bits are kept, not zeroed, so a frame rebuilds bit-exact.
use crate::opcode::{hdr, len, Opcode, OpcodeInfo};
use crate::types::{Msn, PKey, Psn, QKey, Qpn, RKey, Syndrome};
use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The 12-byte base transport header, in place.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BthHeader {
    opcode: u8,
    /// SE(7) M(6) PadCnt(5:4) TVer(3:0)
    flags: u8,
    pkey: U16,
    /// FECN(31) BECN(30) Resv6(29:24) DestQP(23:0)
    qp_word: U32,
    /// AckReq(31) Resv7(30:24) PSN(23:0)
    psn_word: U32,
}

const _: () = assert!(core::mem::size_of::<BthHeader>() == len::BTH);

impl BthHeader {
    pub fn opcode_byte(&self) -> u8 {
        self.opcode
    }
    pub fn solicited(&self) -> bool {
        self.flags & 0x80 != 0
    }
    pub fn mig_req(&self) -> bool {
        self.flags & 0x40 != 0
    }
    pub fn pad(&self) -> u8 {
        (self.flags >> 4) & 3
    }
    pub fn tver(&self) -> u8 {
        self.flags & 0x0f
    }
    pub fn pkey(&self) -> PKey {
        PKey(self.pkey.get())
    }
    pub fn fecn(&self) -> bool {
        self.qp_word.get() & 0x8000_0000 != 0
    }
    pub fn becn(&self) -> bool {
        self.qp_word.get() & 0x4000_0000 != 0
    }
    pub fn dqpn(&self) -> Qpn {
        Qpn::new(self.qp_word.get())
    }
    pub fn ack_req(&self) -> bool {
        self.psn_word.get() & 0x8000_0000 != 0
    }
    pub fn psn(&self) -> Psn {
        Psn::new(self.psn_word.get())
    }
    /// Sets FECN in place: what a congested switch does, and why the ICRC masks this byte.
    pub fn set_fecn(&mut self, on: bool) {
        let w = self.qp_word.get();
        self.qp_word.set(if on {
            w | 0x8000_0000
        } else {
            w & !0x8000_0000
        });
    }
    pub fn set_becn(&mut self, on: bool) {
        let w = self.qp_word.get();
        self.qp_word.set(if on {
            w | 0x4000_0000
        } else {
            w & !0x4000_0000
        });
    }
    pub fn set_psn(&mut self, psn: Psn) {
        self.psn_word
            .set((self.psn_word.get() & 0xff00_0000) | psn.value());
    }
    pub fn set_dqpn(&mut self, qpn: Qpn) {
        self.qp_word
            .set((self.qp_word.get() & 0xff00_0000) | qpn.value());
    }
}

/// A BTH as plain values. `resv6` and `resv7` are the reserved bits, normally zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad: u8,
    pub tver: u8,
    pub pkey: PKey,
    pub fecn: bool,
    pub becn: bool,
    pub resv6: u8,
    pub dqpn: Qpn,
    pub ack_req: bool,
    pub resv7: u8,
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with the defaults real RNICs send: P_Key 0xFFFF, TVer 0, no flags.
    pub fn new(opcode: Opcode, dqpn: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            resv6: 0,
            dqpn,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Reads a BTH from the front of `bytes`. Fails on short input or an unknown opcode.
    pub fn parse(bytes: &[u8]) -> Result<BthRepr, crate::Error> {
        let (h, _) = BthHeader::ref_from_prefix(bytes).map_err(|_| crate::Error::Truncated {
            layer: crate::Layer::Bth,
            need: len::BTH,
            have: bytes.len(),
        })?;
        Ok(BthRepr::from_header(h, Opcode::new(h.opcode)?))
    }

    #[inline]
    pub(crate) fn from_header(h: &BthHeader, opcode: Opcode) -> BthRepr {
        let qw = h.qp_word.get();
        let pw = h.psn_word.get();
        BthRepr {
            opcode,
            solicited: h.solicited(),
            mig_req: h.mig_req(),
            pad: h.pad(),
            tver: h.tver(),
            pkey: h.pkey(),
            fecn: h.fecn(),
            becn: h.becn(),
            resv6: ((qw >> 24) & 0x3f) as u8,
            dqpn: Qpn::new(qw),
            ack_req: h.ack_req(),
            resv7: ((pw >> 24) & 0x7f) as u8,
            psn: Psn::new(pw),
        }
    }

    /// Writes the 12 bytes at the front of `buf`, which must hold them.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) {
        let h = BthHeader {
            opcode: self.opcode.value(),
            flags: (self.solicited as u8) << 7
                | (self.mig_req as u8) << 6
                | (self.pad & 3) << 4
                | (self.tver & 0x0f),
            pkey: U16::new(self.pkey.value()),
            qp_word: U32::new(
                (self.fecn as u32) << 31
                    | (self.becn as u32) << 30
                    | ((self.resv6 as u32) & 0x3f) << 24
                    | self.dqpn.value(),
            ),
            psn_word: U32::new(
                (self.ack_req as u32) << 31 | ((self.resv7 as u32) & 0x7f) << 24 | self.psn.value(),
            ),
        };
        buf[..len::BTH].copy_from_slice(h.as_bytes());
    }
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RethHdr {
    va: U64,
    rkey: U32,
    dma_len: U32,
}

/// RDMA extended transport header (IBTA 9.3.3): virtual address, R_Key, DMA length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: RKey,
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads the 16 bytes at the front of `b`; `None` when `b` is shorter.
    #[inline]
    fn read(b: &[u8]) -> Option<RethRepr> {
        let (r, _) = RethHdr::ref_from_prefix(b).ok()?;
        Some(RethRepr {
            va: r.va.get(),
            rkey: RKey(r.rkey.get()),
            dma_len: r.dma_len.get(),
        })
    }

    /// Writes the 16 bytes at the front of `buf`, which must hold them.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) {
        let h = RethHdr {
            va: U64::new(self.va),
            rkey: U32::new(self.rkey.0),
            dma_len: U32::new(self.dma_len),
        };
        buf[..len::RETH].copy_from_slice(h.as_bytes());
    }
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AethHdr {
    /// Syndrome(31:24) MSN(23:0)
    word: U32,
}

/// ACK extended transport header (IBTA 9.3.5): syndrome and MSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    pub msn: Msn,
}

impl AethRepr {
    /// Reads the 4 bytes at the front of `b`; `None` when `b` is shorter.
    #[inline]
    fn read(b: &[u8]) -> Option<AethRepr> {
        let (a, _) = AethHdr::ref_from_prefix(b).ok()?;
        let w = a.word.get();
        Some(AethRepr {
            syndrome: Syndrome((w >> 24) as u8),
            msn: Msn::new(w),
        })
    }
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AtomicEthHdr {
    va: U64,
    rkey: U32,
    swap_add: U64,
    compare: U64,
}

/// Atomic extended transport header (IBTA 9.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: RKey,
    /// The swap value (CmpSwap) or the addend (FetchAdd).
    pub swap_add: u64,
    pub compare: u64,
}

/// Atomic acknowledge extended transport header (IBTA 9.5.3): the original remote value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    pub orig: u64,
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DethHdr {
    qkey: U32,
    /// Resv8(31:24) SrcQP(23:0)
    word: U32,
}

/// Datagram extended transport header (IBTA 9.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    pub qkey: QKey,
    pub src_qpn: Qpn,
    /// The reserved byte, normally zero.
    pub resv: u8,
}

/// Flush extended transport header (IBA 1.5; 9.3.7 in the 1.5 numbering unverified: 9.3.7 is the
/// IETH in 1.2.1): selectivity level (bits 5:4) and placement type (bits 3:0), the rest reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FethRepr {
    pub raw: u32,
}

impl FethRepr {
    pub const fn placement_type(self) -> u8 {
        (self.raw & 0x0f) as u8
    }
    pub const fn selectivity_level(self) -> u8 {
        ((self.raw >> 4) & 3) as u8
    }
}

/// The extension headers of one packet, each present exactly when the opcode's layout says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtHeaders {
    pub feth: Option<FethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub deth: Option<DethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<AtomicAckEthRepr>,
    pub imm: Option<u32>,
    /// The R_Key to invalidate (IETH).
    pub ieth: Option<RKey>,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl ExtHeaders {
    /// Reads the headers `info` lists from the front of `b`, which must hold `info.ext_len`
    /// bytes (the caller checked).
    #[inline]
    pub(crate) fn parse(info: &OpcodeInfo, b: &[u8]) -> ExtHeaders {
        // The layouts of nearly every packet a connected QP moves, read without the walk.
        match info.headers & hdr::EXT {
            0 => return ExtHeaders::default(),
            hdr::RETH => {
                return ExtHeaders {
                    reth: RethRepr::read(b),
                    ..ExtHeaders::default()
                }
            }
            hdr::AETH => {
                return ExtHeaders {
                    aeth: AethRepr::read(b),
                    ..ExtHeaders::default()
                }
            }
            _ => {}
        }
        Self::parse_walk(info, b)
    }

    /// Every header `info` lists, in the order of IBTA 9.2's packet layouts.
    fn parse_walk(info: &OpcodeInfo, b: &[u8]) -> ExtHeaders {
        let mut e = ExtHeaders::default();
        let mut off = 0;
        let h = info.headers;
        if h & hdr::FETH != 0 {
            e.feth = Some(FethRepr {
                raw: be32(&b[off..]),
            });
            off += len::FETH;
        }
        if h & hdr::RETH != 0 {
            e.reth = RethRepr::read(&b[off..]);
            off += len::RETH;
        }
        if h & hdr::ATOMIC_ETH != 0 {
            if let Ok((a, _)) = AtomicEthHdr::ref_from_prefix(&b[off..]) {
                e.atomic = Some(AtomicEthRepr {
                    va: a.va.get(),
                    rkey: RKey(a.rkey.get()),
                    swap_add: a.swap_add.get(),
                    compare: a.compare.get(),
                });
            }
            off += len::ATOMIC_ETH;
        }
        if h & hdr::DETH != 0 {
            if let Ok((d, _)) = DethHdr::ref_from_prefix(&b[off..]) {
                let w = d.word.get();
                e.deth = Some(DethRepr {
                    qkey: QKey(d.qkey.get()),
                    src_qpn: Qpn::new(w),
                    resv: (w >> 24) as u8,
                });
            }
            off += len::DETH;
        }
        if h & hdr::AETH != 0 {
            e.aeth = AethRepr::read(&b[off..]);
            off += len::AETH;
        }
        if h & hdr::ATOMIC_ACK_ETH != 0 {
            e.atomic_ack = Some(AtomicAckEthRepr {
                orig: be64(&b[off..]),
            });
            off += len::ATOMIC_ACK_ETH;
        }
        if h & hdr::IMM != 0 {
            e.imm = Some(be32(&b[off..]));
            off += len::IMM;
        }
        if h & hdr::IETH != 0 {
            e.ieth = Some(RKey(be32(&b[off..])));
        }
        e
    }

    /// The extension headers present, as `hdr` bits.
    fn present(&self) -> u16 {
        let bit = |p: bool, h: u16| if p { h } else { 0 };
        bit(self.feth.is_some(), hdr::FETH)
            | bit(self.reth.is_some(), hdr::RETH)
            | bit(self.atomic.is_some(), hdr::ATOMIC_ETH)
            | bit(self.deth.is_some(), hdr::DETH)
            | bit(self.aeth.is_some(), hdr::AETH)
            | bit(self.atomic_ack.is_some(), hdr::ATOMIC_ACK_ETH)
            | bit(self.imm.is_some(), hdr::IMM)
            | bit(self.ieth.is_some(), hdr::IETH)
    }

    /// Checks that exactly the headers `info`'s layout needs are present.
    #[inline]
    pub fn check_layout(&self, info: &OpcodeInfo) -> Result<(), crate::BuildError> {
        if self.present() == info.headers & hdr::EXT {
            return Ok(());
        }
        self.layout_mismatch(info)
    }

    #[cold]
    fn layout_mismatch(&self, info: &OpcodeInfo) -> Result<(), crate::BuildError> {
        let has = |h: u16| info.headers & h != 0;
        let checks: [(&'static str, bool, bool); 8] = [
            ("FETH", self.feth.is_some(), has(hdr::FETH)),
            ("RETH", self.reth.is_some(), has(hdr::RETH)),
            ("AtomicETH", self.atomic.is_some(), has(hdr::ATOMIC_ETH)),
            ("DETH", self.deth.is_some(), has(hdr::DETH)),
            ("AETH", self.aeth.is_some(), has(hdr::AETH)),
            (
                "AtomicAckETH",
                self.atomic_ack.is_some(),
                has(hdr::ATOMIC_ACK_ETH),
            ),
            ("ImmDt", self.imm.is_some(), has(hdr::IMM)),
            ("IETH", self.ieth.is_some(), has(hdr::IETH)),
        ];
        for (name, present, wanted) in checks {
            if present != wanted {
                return Err(crate::BuildError::LayoutMismatch {
                    opcode: info.opcode,
                    header: name,
                });
            }
        }
        Ok(())
    }

    /// Writes the headers present, in wire order, at the front of `buf` (which must hold them),
    /// and then the CNP's 16 reserved bytes if `info` is a CNP. Returns the bytes written.
    #[inline]
    pub(crate) fn emit(&self, info: &OpcodeInfo, buf: &mut [u8]) -> usize {
        let mut off = 0;
        if let Some(f) = self.feth {
            buf[off..off + 4].copy_from_slice(&f.raw.to_be_bytes());
            off += len::FETH;
        }
        if let Some(r) = self.reth {
            r.emit(&mut buf[off..]);
            off += len::RETH;
        }
        if let Some(a) = self.atomic {
            let h = AtomicEthHdr {
                va: U64::new(a.va),
                rkey: U32::new(a.rkey.0),
                swap_add: U64::new(a.swap_add),
                compare: U64::new(a.compare),
            };
            buf[off..off + len::ATOMIC_ETH].copy_from_slice(h.as_bytes());
            off += len::ATOMIC_ETH;
        }
        if let Some(d) = self.deth {
            let h = DethHdr {
                qkey: U32::new(d.qkey.0),
                word: U32::new((d.resv as u32) << 24 | d.src_qpn.value()),
            };
            buf[off..off + len::DETH].copy_from_slice(h.as_bytes());
            off += len::DETH;
        }
        if let Some(a) = self.aeth {
            let h = AethHdr {
                word: U32::new((a.syndrome.0 as u32) << 24 | a.msn.value()),
            };
            buf[off..off + len::AETH].copy_from_slice(h.as_bytes());
            off += len::AETH;
        }
        if let Some(a) = self.atomic_ack {
            buf[off..off + 8].copy_from_slice(&a.orig.to_be_bytes());
            off += len::ATOMIC_ACK_ETH;
        }
        if let Some(i) = self.imm {
            buf[off..off + 4].copy_from_slice(&i.to_be_bytes());
            off += len::IMM;
        }
        if let Some(k) = self.ieth {
            buf[off..off + 4].copy_from_slice(&k.0.to_be_bytes());
            off += len::IETH;
        }
        if info.headers & hdr::CNP_RESERVED != 0 {
            buf[off..off + len::CNP_RESERVED].fill(0);
            off += len::CNP_RESERVED;
        }
        off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bth_round_trip_keeps_reserved_bits() {
        let b = [
            0x0a,
            0b1110_0001,
            0xff,
            0xff,
            0b1101_0101,
            0x00,
            0x00,
            0x11,
            0b1000_0011,
            0x12,
            0x34,
            0x56,
        ];
        let r = BthRepr::parse(&b).unwrap();
        assert_eq!(r.opcode, Opcode::RC_RDMA_WRITE_ONLY);
        assert!(r.solicited && r.mig_req);
        assert_eq!((r.pad, r.tver), (2, 1));
        assert_eq!(r.pkey, PKey(0xffff));
        assert!(r.fecn && r.becn);
        assert_eq!(r.resv6, 0b01_0101);
        assert_eq!(r.dqpn, Qpn::new(0x11));
        assert!(r.ack_req);
        assert_eq!(r.resv7, 3);
        assert_eq!(r.psn, Psn::new(0x123456));
        let mut out = [0xaau8; 12];
        r.emit(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn bth_rejects_short_and_unknown() {
        assert!(matches!(
            BthRepr::parse(&[0u8; 11]),
            Err(crate::Error::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        let mut b = [0u8; 12];
        b[0] = 0x15;
        assert_eq!(BthRepr::parse(&b), Err(crate::Error::UnknownOpcode(0x15)));
    }

    #[test]
    fn ext_headers_in_wire_order() {
        let info = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info();
        let e = ExtHeaders {
            deth: Some(DethRepr {
                qkey: QKey(0x1111_1111),
                src_qpn: Qpn::new(0x12),
                resv: 0,
            }),
            imm: Some(0xdead_beef),
            ..Default::default()
        };
        e.check_layout(info).unwrap();
        let mut b = [0u8; 12];
        assert_eq!(e.emit(info, &mut b), 12);
        assert_eq!(
            b,
            [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x12, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(ExtHeaders::parse(info, &b), e);
        let wrong = ExtHeaders {
            imm: Some(1),
            ..Default::default()
        };
        assert!(wrong.check_layout(info).is_err());
    }
}
