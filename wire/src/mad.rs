//! Management datagrams (IBTA Vol. 1 13.4, unverified, like every 13.x number here): the 24-byte
//! common MAD header and the 256-byte MAD it starts, as a zerocopy view plus a plain [`MadRepr`].
//!
//! Invariants:
//!
//! * A MAD is exactly [`MAD_LEN`] = 256 bytes (IBTA 13.4: every MAD on QP0 and QP1 is).
//!   Parsers take the whole MAD and refuse any other length; builders write all 256 bytes, so
//!   nothing a buffer held before survives.
//! * Every bit of the header is kept, reserved ones included, so a MAD rebuilds bit-exact.
//! * On RoCE a general-services MAD (a GMP) is the whole payload of a UD SEND_ONLY to QP1, with
//!   the GSI Q_Key 0x8001_0000 in its DETH (IBTA 13.5.3.3; Annex A17 carries it in RoCEv2 like
//!   any UD packet). [`gsi_payload`] picks those out of parsed frames.
//!
//! What a parse error calls for ([`MadError`]): a MAD of the wrong length, base version or class
//! is dropped silently (the GSI discards what no agent registered for, IBTA 13.5). A MAD of a
//! known class but an unsupported class version or attribute is answered only when its method
//! asks for a response (Get/Set: a GetResp with status "unsupported class version" or
//! "unsupported method/attribute", IBTA 13.4); a CM REQ with a class version other than 2 may
//! be rejected with REJ reason 31 (12.6.7, unverified; Table 108 in 1.3).
use crate::frame::ParsedFrame;
use crate::opcode::Opcode;
use crate::types::Qpn;
use core::fmt;
use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The length of every MAD on QP0 and QP1.
pub const MAD_LEN: usize = 256;
/// The common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// What follows the common header: the class-specific part (for the CM, the whole message).
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// The only base version InfiniBand (and RoCE) MADs use; 0x80 is Omni-Path's OPA MAD.
pub const MAD_BASE_VERSION: u8 = 1;

/// A management class (IBTA 13.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MgmtClass(pub u8);

impl MgmtClass {
    pub const SUBN_LID_ROUTED: MgmtClass = MgmtClass(0x01);
    pub const SUBN_ADM: MgmtClass = MgmtClass(0x03);
    pub const PERF_MGMT: MgmtClass = MgmtClass(0x04);
    pub const BM: MgmtClass = MgmtClass(0x05);
    pub const DEVICE_MGMT: MgmtClass = MgmtClass(0x06);
    /// The communication manager (chapter 12).
    pub const CM: MgmtClass = MgmtClass(0x07);
    pub const SNMP: MgmtClass = MgmtClass(0x08);
    pub const SUBN_DIRECTED_ROUTE: MgmtClass = MgmtClass(0x81);
    pub const fn value(self) -> u8 {
        self.0
    }
}

impl fmt::Display for MgmtClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            MgmtClass::SUBN_LID_ROUTED => "SubnMgmt",
            MgmtClass::SUBN_ADM => "SubnAdm",
            MgmtClass::PERF_MGMT => "PerfMgmt",
            MgmtClass::BM => "BM",
            MgmtClass::DEVICE_MGMT => "DevMgmt",
            MgmtClass::CM => "CM",
            MgmtClass::SNMP => "SNMP",
            MgmtClass::SUBN_DIRECTED_ROUTE => "SubnMgmt-DR",
            _ => return write!(f, "class 0x{:02x}", self.0),
        };
        f.write_str(name)
    }
}

/// The method byte: the R (response) bit 7 and the 7-bit method (IBTA 13.4.2).
/// Kept whole; the constants include the R bit where the method is a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Method(pub u8);

impl Method {
    pub const GET: Method = Method(0x01);
    pub const SET: Method = Method(0x02);
    /// What every CM message uses.
    pub const SEND: Method = Method(0x03);
    pub const TRAP: Method = Method(0x05);
    pub const REPORT: Method = Method(0x06);
    pub const TRAP_REPRESS: Method = Method(0x07);
    pub const GET_RESP: Method = Method(0x81);
    pub const REPORT_RESP: Method = Method(0x86);
    pub const fn value(self) -> u8 {
        self.0
    }
    /// The R bit.
    pub const fn is_response(self) -> bool {
        self.0 & 0x80 != 0
    }
    /// The method without the R bit.
    pub const fn method(self) -> u8 {
        self.0 & 0x7f
    }
}

/// An attribute ID (IBTA 13.4.2); its meaning depends on the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrId(pub u16);

impl AttrId {
    pub const fn value(self) -> u16 {
        self.0
    }
}

impl fmt::Display for AttrId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

/// A transaction ID (IBTA 13.4.2): chosen by the requester, echoed by the responder. The
/// Linux MAD layer puts its agent number in the high 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tid(pub u64);

impl Tid {
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Tid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

/// The 24-byte common MAD header, in place (IBTA 13.4.2).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MadHeader {
    base_version: u8,
    mgmt_class: u8,
    class_version: u8,
    /// R(7) Method(6:0)
    method: u8,
    status: U16,
    class_specific: U16,
    tid: U64,
    attr_id: U16,
    resv: U16,
    attr_mod: U32,
}

const _: () = assert!(core::mem::size_of::<MadHeader>() == MAD_HEADER_LEN);

impl MadHeader {
    pub fn base_version(&self) -> u8 {
        self.base_version
    }
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass(self.mgmt_class)
    }
    pub fn class_version(&self) -> u8 {
        self.class_version
    }
    pub fn method(&self) -> Method {
        Method(self.method)
    }
    pub fn status(&self) -> u16 {
        self.status.get()
    }
    pub fn tid(&self) -> Tid {
        Tid(self.tid.get())
    }
    pub fn attr_id(&self) -> AttrId {
        AttrId(self.attr_id.get())
    }
    pub fn attr_mod(&self) -> u32 {
        self.attr_mod.get()
    }
}

/// A 256-byte MAD, in place: the common header and the class-specific data after it.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Mad {
    pub header: MadHeader,
    pub data: [u8; MAD_DATA_LEN],
}

const _: () = assert!(core::mem::size_of::<Mad>() == MAD_LEN);

impl Mad {
    /// The MAD in `bytes`, which must be exactly [`MAD_LEN`] long.
    pub fn ref_from_checked(bytes: &[u8]) -> Result<&Mad, MadError> {
        Mad::ref_from_bytes(bytes).map_err(|_| MadError::Length { len: bytes.len() })
    }
}

/// The common MAD header as plain values. `resv` is the reserved 16 bits after the attribute
/// ID, normally zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadRepr {
    pub base_version: u8,
    pub mgmt_class: MgmtClass,
    pub class_version: u8,
    pub method: Method,
    /// Bits 4:2 carry the common status codes (IBTA 13.4); 15:8 are class-specific.
    pub status: u16,
    pub class_specific: u16,
    pub tid: Tid,
    pub attr_id: AttrId,
    pub resv: u16,
    pub attr_mod: u32,
}

impl MadRepr {
    /// A header with base version 1, status 0 and no attribute modifier.
    pub const fn new(
        mgmt_class: MgmtClass,
        class_version: u8,
        method: Method,
        tid: Tid,
        attr_id: AttrId,
    ) -> MadRepr {
        MadRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class,
            class_version,
            method,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            resv: 0,
            attr_mod: 0,
        }
    }

    /// Reads the header of the MAD `mad`, which must be exactly 256 bytes. Any base version,
    /// class and method are accepted here: checking them is the class parser's business.
    pub fn parse(mad: &[u8]) -> Result<MadRepr, MadError> {
        Ok(MadRepr::from_header(&Mad::ref_from_checked(mad)?.header))
    }

    pub fn from_header(h: &MadHeader) -> MadRepr {
        MadRepr {
            base_version: h.base_version,
            mgmt_class: MgmtClass(h.mgmt_class),
            class_version: h.class_version,
            method: Method(h.method),
            status: h.status.get(),
            class_specific: h.class_specific.get(),
            tid: Tid(h.tid.get()),
            attr_id: AttrId(h.attr_id.get()),
            resv: h.resv.get(),
            attr_mod: h.attr_mod.get(),
        }
    }

    pub fn to_header(&self) -> MadHeader {
        MadHeader {
            base_version: self.base_version,
            mgmt_class: self.mgmt_class.0,
            class_version: self.class_version,
            method: self.method.0,
            status: U16::new(self.status),
            class_specific: U16::new(self.class_specific),
            tid: U64::new(self.tid.0),
            attr_id: U16::new(self.attr_id.0),
            resv: U16::new(self.resv),
            attr_mod: U32::new(self.attr_mod),
        }
    }

    /// Writes the 24-byte header at the front of `buf`; returns 24.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, crate::BuildError> {
        let have = buf.len();
        let out = buf
            .get_mut(..MAD_HEADER_LEN)
            .ok_or(crate::BuildError::BufferTooSmall {
                need: MAD_HEADER_LEN,
                have,
            })?;
        out.copy_from_slice(self.to_header().as_bytes());
        Ok(MAD_HEADER_LEN)
    }
}

/// The MAD a parsed frame carries when it is a general-services MAD on RoCE: a UD SEND_ONLY
/// to QP1. The payload is returned whatever its length; [`MadRepr::parse`] and the class parsers
/// check that. The DETH Q_Key is not checked (IBTA 13.5.3.3 has QP1 accept only 0x8001_0000; the
/// transport's Q_Key check is where that belongs).
pub fn gsi_payload<'a>(frame: &ParsedFrame<'a>) -> Option<&'a [u8]> {
    (frame.bth.opcode == Opcode::UD_SEND_ONLY && frame.bth.dqpn == Qpn::GSI)
        .then_some(frame.payload)
}

/// 4.096 µs × 2^`code`, in nanoseconds: how IBTA encodes every 5-bit timeout (CM response timeouts,
/// local ACK timeout, target ACK delay, MRA service timeout; IBTA 12.6.5 unverified, 9.7.6.1.3 for
/// the ACK timeout).
pub const fn timeout_nanos(code: u8) -> u64 {
    4096u64 << (code & 0x1f)
}

/// Why a byte string is not a MAD of the kind asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadError {
    /// A MAD is 256 bytes; this is not. Drop.
    Length { len: usize },
    /// The base version is not 1. Drop.
    BaseVersion(u8),
    /// Not the management class the parser reads. Drop (or hand it to that class's agent).
    Class {
        expected: MgmtClass,
        found: MgmtClass,
    },
    /// A class version whose layout is unknown (the CM's is 2).
    ClassVersion { class: MgmtClass, version: u8 },
    /// An attribute of the class that is not parsed here (for the CM: ClassPortInfo, LAP, APR,
    /// or an undefined ID).
    Attribute { class: MgmtClass, attr: AttrId },
    /// rdma_cm private data shorter than its 36-byte header.
    CmaTruncated { have: usize },
    /// A `cma_hdr` version other than 0 (the kernel rejects the connection).
    CmaVersion(u8),
    /// A `cma_hdr` IP version (its upper nibble) other than 4 or 6.
    CmaIpVersion(u8),
}

impl fmt::Display for MadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MadError::Length { len } => write!(f, "not a MAD: {len} bytes, a MAD has {MAD_LEN}"),
            MadError::BaseVersion(v) => write!(f, "MAD base version {v}, not 1"),
            MadError::Class { expected, found } => {
                write!(f, "management class {found}, expected {expected}")
            }
            MadError::ClassVersion { class, version } => {
                write!(f, "{class} class version {version} not supported")
            }
            MadError::Attribute { class, attr } => {
                write!(f, "{class} attribute {attr} not supported")
            }
            MadError::CmaTruncated { have } => {
                write!(f, "rdma_cm private data: {have} bytes, its header needs 36")
            }
            MadError::CmaVersion(v) => write!(f, "rdma_cm header version {v}, not 0"),
            MadError::CmaIpVersion(v) => write!(f, "rdma_cm header IP version {v}, not 4 or 6"),
        }
    }
}

impl std::error::Error for MadError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_keeps_reserved_bits() {
        let mut mad = [0u8; MAD_LEN];
        mad[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x02, 0x12, 0xa1,
            0x6b, 0x23, 0x00, 0x10, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef,
        ]);
        let r = MadRepr::parse(&mad).unwrap();
        assert_eq!(r.mgmt_class, MgmtClass::CM);
        assert_eq!(r.method, Method::SEND);
        assert_eq!(r.status, 0x1234);
        assert_eq!(r.class_specific, 0x5678);
        assert_eq!(r.tid, Tid(0x0000_0002_12a1_6b23));
        assert_eq!(r.attr_id, AttrId(0x0010));
        assert_eq!(r.resv, 0xbeef);
        assert_eq!(r.attr_mod, 0xdead_beef);
        let mut out = [0xffu8; 24];
        assert_eq!(r.emit(&mut out), Ok(24));
        assert_eq!(out, mad[..24]);
        assert!(r.emit(&mut [0u8; 23]).is_err());
    }

    #[test]
    fn a_mad_is_256_bytes() {
        assert_eq!(
            MadRepr::parse(&[0u8; 255]),
            Err(MadError::Length { len: 255 })
        );
        assert_eq!(
            MadRepr::parse(&[0u8; 257]),
            Err(MadError::Length { len: 257 })
        );
        assert!(MadRepr::parse(&[]).is_err());
    }

    #[test]
    fn methods_and_timeouts() {
        assert!(Method::GET_RESP.is_response());
        assert_eq!(Method::GET_RESP.method(), Method::GET.0);
        assert!(!Method::SEND.is_response());
        assert_eq!(timeout_nanos(0), 4_096);
        // The CM response timeout rdma_cm uses (20): 4.29 s.
        assert_eq!(timeout_nanos(20), 4_294_967_296);
        assert_eq!(timeout_nanos(31), 4096u64 << 31);
    }
}
