//! The InfiniBand communication manager's messages (IBTA Vol. 1 12.6, unverified like every 12.x
//! section number here; the message tables are numbered as Linux's `ibta_vol1_c12.h` has them for
//! 1.3: REQ 106, MRA 107, REJ 108, REP 110, RTU 111, DREQ 112, DREP 113, SIDR 119/120), management
//! class 0x07 class version 2, each filling the 232 data bytes of a 256-byte MAD ([`crate::mad`]);
//! and the header rdma_cm puts at the front of a REQ's private data ([`CmaHdr`], IBTA Annex A11).
//!
//! Invariants:
//!
//! * Field positions are IBTA's: a byte offset into the message (the MAD data, after the 24-byte
//!   common header) and, for fields that are not whole bytes, a bit offset counted from the most
//!   significant bit of the word that holds them, and a width: the form of the message tables of
//!   12.6, and of Linux's `include/rdma/ibta_vol1_c12.h`, which these layouts were checked
//!   against. [`BitField`] does the shifting; const assertions check that the fields of every
//!   packed word tile it exactly, reserved bits included.
//! * Every bit is kept: reserved fields live in `resv*` members and private data is carried
//!   whole (its length is not on the wire; senders zero-pad it). Parse then emit gives back the
//!   same 256 bytes, whatever they hold.
//! * Only structure is an error: the base version, class, class version and attribute decide
//!   the layout. Values are reported as they stand (a REQ asking for transport type 3, a path
//!   MTU code 0, a REJ reason nobody defined); judging them is the CM state machine's business.
//!
//! What Linux (6.1, `rdma_rxe`) and librdmacm put in these fields, as the captures in
//! `wire/tests/data/cm/` show:
//!
//! * The REQ's Starting PSN is the PSN the *passive* side sends from (the active side's
//!   expected PSN); the REP's is the one the *active* side sends from.
//! * rdma_cm's service ID is `(port space << 16) | destination port` ([`ServiceId::rdma_cm`]);
//!   the source port travels in the [`CmaHdr`]. On RoCE the REQ's primary flow label is
//!   [`rdma_cm_flow_label`] of those two ports, and both ends derive the connected QP's UDP
//!   source port from it (`crate::udp_sport_for_flow`).
//! * LIDs are 0xFFFF, GIDs are the IPv4-mapped or IPv6 addresses, the hop limit is 64.
use crate::mad::{AttrId, Mad, MadError, MadRepr, Method, MgmtClass, Tid, MAD_DATA_LEN, MAD_LEN};
use crate::types::{PKey, Psn, QKey, Qpn};
use crate::BuildError;
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use zerocopy::byteorder::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The CM's class version (IBTA 1.2 and later; Linux `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

/// The CM's attribute IDs (IBTA 12.6; Linux `CM_*_ATTR_ID`).
pub mod attr {
    use crate::mad::AttrId;
    pub const CLASS_PORT_INFO: AttrId = AttrId(0x0001);
    pub const REQ: AttrId = AttrId(0x0010);
    pub const MRA: AttrId = AttrId(0x0011);
    pub const REJ: AttrId = AttrId(0x0012);
    pub const REP: AttrId = AttrId(0x0013);
    pub const RTU: AttrId = AttrId(0x0014);
    pub const DREQ: AttrId = AttrId(0x0015);
    pub const DREP: AttrId = AttrId(0x0016);
    pub const SIDR_REQ: AttrId = AttrId(0x0017);
    pub const SIDR_REP: AttrId = AttrId(0x0018);
    pub const LAP: AttrId = AttrId(0x0019);
    pub const APR: AttrId = AttrId(0x001a);
}

/// Private data lengths (IBTA 12.6; Linux `enum ib_cm_data_size`).
pub mod private_len {
    pub const REQ: usize = 92;
    pub const MRA: usize = 222;
    pub const REJ: usize = 148;
    pub const REP: usize = 196;
    pub const RTU: usize = 224;
    pub const DREQ: usize = 220;
    pub const DREP: usize = 224;
    pub const SIDR_REQ: usize = 216;
    pub const SIDR_REP: usize = 136;
    /// REJ's additional rejection information, and SIDR_REP's additional information.
    pub const ARI: usize = 72;
}

// ------------------------------------------------------------------------------------------
// Bit fields, the IBTA way.

/// A field of a big-endian word, placed as IBTA's message tables place it: `msb` bits below the
/// word's most significant bit, `width` bits wide. `size` is the word: 8 or 32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitField {
    pub size: u32,
    pub msb: u32,
    pub width: u32,
}

impl BitField {
    /// A field of a byte.
    pub const fn in8(msb: u32, width: u32) -> BitField {
        assert!(width >= 1 && msb + width <= 8);
        BitField {
            size: 8,
            msb,
            width,
        }
    }
    /// A field of a 32-bit word.
    pub const fn in32(msb: u32, width: u32) -> BitField {
        assert!(width >= 1 && msb + width <= 32);
        BitField {
            size: 32,
            msb,
            width,
        }
    }
    const fn shift(self) -> u32 {
        self.size - self.msb - self.width
    }
    /// The field's bits within the word.
    pub const fn mask(self) -> u32 {
        (u32::MAX >> (32 - self.width)) << self.shift()
    }
    /// The field's value in `word`.
    pub const fn get(self, word: u32) -> u32 {
        (word & self.mask()) >> self.shift()
    }
    /// `v`, cut to the field's width and moved into place, to be ORed into a word.
    pub const fn put(self, v: u32) -> u32 {
        (v << self.shift()) & self.mask()
    }
}

/// True when `fields` cover every bit of a `size`-bit word exactly once.
const fn tiles(size: u32, fields: &[BitField]) -> bool {
    let full = if size == 32 {
        u32::MAX
    } else {
        (1u32 << size) - 1
    };
    let mut seen = 0u32;
    let mut i = 0;
    while i < fields.len() {
        let m = fields[i].mask();
        if fields[i].size != size || seen & m != 0 {
            return false;
        }
        seen |= m;
        i += 1;
    }
    seen == full
}

/// Where each packed field sits, in IBTA's terms: the comment gives the byte offset of the word
/// in the message, then the bit offset and width.
mod field {
    use super::BitField;
    const fn b(msb: u32, width: u32) -> BitField {
        BitField::in8(msb, width)
    }
    const fn w(msb: u32, width: u32) -> BitField {
        BitField::in32(msb, width)
    }

    // REQ (12.6.5; Table 106 in 1.3)
    /// 32: Local QPN (0, 24), Responder Resources (24, 8)
    pub const REQ_LOCAL_QPN: BitField = w(0, 24);
    pub const REQ_RESPONDER_RESOURCES: BitField = w(24, 8);
    /// 36: Local EECN (0, 24), Initiator Depth (24, 8)
    pub const REQ_LOCAL_EECN: BitField = w(0, 24);
    pub const REQ_INITIATOR_DEPTH: BitField = w(24, 8);
    /// 40: Remote EECN (0, 24), Remote CM Response Timeout (24, 5), Transport Service Type
    /// (29, 2), End-to-End Flow Control (31, 1)
    pub const REQ_REMOTE_EECN: BitField = w(0, 24);
    pub const REQ_REMOTE_CM_RESPONSE_TIMEOUT: BitField = w(24, 5);
    pub const REQ_TRANSPORT_SERVICE_TYPE: BitField = w(29, 2);
    pub const REQ_END_TO_END_FLOW_CONTROL: BitField = w(31, 1);
    /// 44: Starting PSN (0, 24), Local CM Response Timeout (24, 5), Retry Count (29, 3)
    pub const REQ_STARTING_PSN: BitField = w(0, 24);
    pub const REQ_LOCAL_CM_RESPONSE_TIMEOUT: BitField = w(24, 5);
    pub const REQ_RETRY_COUNT: BitField = w(29, 3);
    /// 50: Path Packet Payload MTU (0, 4), RDC Exists (4, 1), RNR Retry Count (5, 3)
    pub const REQ_PATH_MTU: BitField = b(0, 4);
    pub const REQ_RDC_EXISTS: BitField = b(4, 1);
    pub const REQ_RNR_RETRY_COUNT: BitField = b(5, 3);
    /// 51: Max CM Retries (0, 4), SRQ (4, 1), Extended Transport Type (5, 3)
    pub const REQ_MAX_CM_RETRIES: BitField = b(0, 4);
    pub const REQ_SRQ: BitField = b(4, 1);
    pub const REQ_EXTENDED_TRANSPORT_TYPE: BitField = b(5, 3);
    /// Path +36 (88 primary, 132 alternate): Flow Label (0, 20), reserved (20, 6), Packet Rate
    /// (26, 6)
    pub const PATH_FLOW_LABEL: BitField = w(0, 20);
    pub const PATH_RESV_RATE: BitField = w(20, 6);
    pub const PATH_PACKET_RATE: BitField = w(26, 6);
    /// Path +42 (94, 138): SL (0, 4), Subnet Local (4, 1), reserved (5, 3)
    pub const PATH_SL: BitField = b(0, 4);
    pub const PATH_SUBNET_LOCAL: BitField = b(4, 1);
    pub const PATH_RESV_SL: BitField = b(5, 3);
    /// Path +43 (95, 139): Local ACK Timeout (0, 5), reserved (5, 3; IBA 1.4 calls bit 5 of
    /// the alternate path's byte "SAP supported")
    pub const PATH_LOCAL_ACK_TIMEOUT: BitField = b(0, 5);
    pub const PATH_RESV_ACK: BitField = b(5, 3);

    // MRA (12.6.6; Table 107) and REJ (12.6.7; Table 108)
    /// 8: Message MRAed / REJected (0, 2), reserved (2, 6)
    pub const MSG_KIND: BitField = b(0, 2);
    pub const MSG_KIND_RESV: BitField = b(2, 6);
    /// MRA 9: Service Timeout (0, 5), reserved (5, 3)
    pub const MRA_SERVICE_TIMEOUT: BitField = b(0, 5);
    pub const MRA_RESV9: BitField = b(5, 3);
    /// REJ 9: Reject Info Length (0, 7), reserved (7, 1)
    pub const REJ_INFO_LEN: BitField = b(0, 7);
    pub const REJ_RESV9: BitField = b(7, 1);

    // REP (12.6.8; Table 110), DREQ (12.6.10; Table 112), SIDR_REP (Table 120): a 24-bit number and
    // 8 reserved bits
    /// REP 12 Local QPN, 16 Local EECN, 20 Starting PSN; DREQ 8 Remote QPN/EECN; SIDR_REP 8 QPN
    pub const NUM24: BitField = w(0, 24);
    pub const NUM24_RESV: BitField = w(24, 8);
    /// REP 26: Target ACK Delay (0, 5), Failover Accepted (5, 2), End-to-End Flow Control (7, 1)
    pub const REP_TARGET_ACK_DELAY: BitField = b(0, 5);
    pub const REP_FAILOVER_ACCEPTED: BitField = b(5, 2);
    pub const REP_END_TO_END_FLOW_CONTROL: BitField = b(7, 1);
    /// REP 27: RNR Retry Count (0, 3), SRQ (3, 1), reserved (4, 4)
    pub const REP_RNR_RETRY_COUNT: BitField = b(0, 3);
    pub const REP_SRQ: BitField = b(3, 1);
    pub const REP_RESV27: BitField = b(4, 4);
}

const _: () = {
    use field::*;
    assert!(tiles(32, &[REQ_LOCAL_QPN, REQ_RESPONDER_RESOURCES]));
    assert!(tiles(32, &[REQ_LOCAL_EECN, REQ_INITIATOR_DEPTH]));
    assert!(tiles(
        32,
        &[
            REQ_REMOTE_EECN,
            REQ_REMOTE_CM_RESPONSE_TIMEOUT,
            REQ_TRANSPORT_SERVICE_TYPE,
            REQ_END_TO_END_FLOW_CONTROL
        ]
    ));
    assert!(tiles(
        32,
        &[
            REQ_STARTING_PSN,
            REQ_LOCAL_CM_RESPONSE_TIMEOUT,
            REQ_RETRY_COUNT
        ]
    ));
    assert!(tiles(
        8,
        &[REQ_PATH_MTU, REQ_RDC_EXISTS, REQ_RNR_RETRY_COUNT]
    ));
    assert!(tiles(
        8,
        &[REQ_MAX_CM_RETRIES, REQ_SRQ, REQ_EXTENDED_TRANSPORT_TYPE]
    ));
    assert!(tiles(
        32,
        &[PATH_FLOW_LABEL, PATH_RESV_RATE, PATH_PACKET_RATE]
    ));
    assert!(tiles(8, &[PATH_SL, PATH_SUBNET_LOCAL, PATH_RESV_SL]));
    assert!(tiles(8, &[PATH_LOCAL_ACK_TIMEOUT, PATH_RESV_ACK]));
    assert!(tiles(8, &[MSG_KIND, MSG_KIND_RESV]));
    assert!(tiles(8, &[MRA_SERVICE_TIMEOUT, MRA_RESV9]));
    assert!(tiles(8, &[REJ_INFO_LEN, REJ_RESV9]));
    assert!(tiles(32, &[NUM24, NUM24_RESV]));
    assert!(tiles(
        8,
        &[
            REP_TARGET_ACK_DELAY,
            REP_FAILOVER_ACCEPTED,
            REP_END_TO_END_FLOW_CONTROL
        ]
    ));
    assert!(tiles(8, &[REP_RNR_RETRY_COUNT, REP_SRQ, REP_RESV27]));
};

fn get8(f: BitField, byte: u8) -> u8 {
    f.get(byte as u32) as u8
}
fn put8(f: BitField, v: u8) -> u8 {
    f.put(v as u32) as u8
}
fn flag(f: BitField, word: u32) -> bool {
    f.get(word) != 0
}

// ------------------------------------------------------------------------------------------
// Values.

/// A communication ID: each end's name for a connection (Local/Remote Communication ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct CommId(pub u32);

impl CommId {
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Display for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08x}", self.0)
    }
}

/// A 64-bit EUI-64 (a CA GUID). rdma_rxe makes it from the netdev's MAC (`5054:00ff:fe99:0002`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Guid(pub u64);

impl Guid {
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            v >> 48,
            (v >> 32) & 0xffff,
            (v >> 16) & 0xffff,
            v & 0xffff
        )
    }
}

/// An rdma_cm port space (`enum rdma_ucm_port_space`): the protocol byte of an IP service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortSpace(pub u16);

impl PortSpace {
    pub const IPOIB: PortSpace = PortSpace(0x0002);
    /// Connected QPs: `rping`, perftest `-R`, `ucmatose`, NVMe-oF, iSER, SMB Direct.
    pub const TCP: PortSpace = PortSpace(0x0106);
    /// UD QPs, resolved with SIDR (`udaddy`).
    pub const UDP: PortSpace = PortSpace(0x0111);
    /// AF_IB: the service ID is the application's; no [`CmaHdr`] in the private data.
    pub const IB: PortSpace = PortSpace(0x013f);
    pub const fn value(self) -> u16 {
        self.0
    }
}

/// A service ID: what a REQ or SIDR_REQ asks to connect to (IBTA 12.6.5; Annex A11 for the IP
/// form rdma_cm uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    pub const fn value(self) -> u64 {
        self.0
    }
    /// The service ID rdma_cm listens on and connects to for `port` in `ps`: the kernel's
    /// `cma_get_service_id`, `(ps << 16) | port` (for TCP 0x0000_0000_0106_xxxx).
    pub const fn rdma_cm(ps: PortSpace, port: u16) -> ServiceId {
        ServiceId(((ps.0 as u64) << 16) | port as u64)
    }
    /// The port space and port of an rdma_cm service ID; `None` when the top 32 bits are not
    /// zero or the port space is not one rdma_cm defines.
    pub const fn rdma_cm_port(self) -> Option<(PortSpace, u16)> {
        if self.0 >> 32 != 0 {
            return None;
        }
        let ps = PortSpace((self.0 >> 16) as u16);
        match ps {
            PortSpace::IPOIB | PortSpace::TCP | PortSpace::UDP | PortSpace::IB => {
                Some((ps, self.0 as u16))
            }
            _ => None,
        }
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

/// The REQ's 2-bit Transport Service Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ServiceType {
    #[default]
    Rc,
    Uc,
    Rd,
    /// 3: see Extended Transport Type (1 = XRC).
    Extended,
}

impl ServiceType {
    pub const fn from_bits(v: u8) -> ServiceType {
        match v & 3 {
            0 => ServiceType::Rc,
            1 => ServiceType::Uc,
            2 => ServiceType::Rd,
            _ => ServiceType::Extended,
        }
    }
    pub const fn bits(self) -> u8 {
        match self {
            ServiceType::Rc => 0,
            ServiceType::Uc => 1,
            ServiceType::Rd => 2,
            ServiceType::Extended => 3,
        }
    }
}

/// Which message an MRA acknowledges or a REJ rejects (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MsgKind {
    #[default]
    Req,
    Rep,
    /// LAP for an MRA; "other" (a REJ sent on a timeout or a stale connection) for a REJ.
    Other,
    Reserved,
}

impl MsgKind {
    pub const fn from_bits(v: u8) -> MsgKind {
        match v & 3 {
            0 => MsgKind::Req,
            1 => MsgKind::Rep,
            2 => MsgKind::Other,
            _ => MsgKind::Reserved,
        }
    }
    pub const fn bits(self) -> u8 {
        match self {
            MsgKind::Req => 0,
            MsgKind::Rep => 1,
            MsgKind::Other => 2,
            MsgKind::Reserved => 3,
        }
    }
}

/// A REJ reason (IBTA 12.6.7; Linux `enum ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RejReason(pub u16);

impl RejReason {
    pub const NO_QP: RejReason = RejReason(1);
    pub const NO_EEC: RejReason = RejReason(2);
    pub const NO_RESOURCES: RejReason = RejReason(3);
    pub const TIMEOUT: RejReason = RejReason(4);
    pub const UNSUPPORTED: RejReason = RejReason(5);
    pub const INVALID_COMM_ID: RejReason = RejReason(6);
    pub const INVALID_COMM_INSTANCE: RejReason = RejReason(7);
    /// Nobody listens on the service ID: what Linux answers a REQ to a port without listener.
    pub const INVALID_SERVICE_ID: RejReason = RejReason(8);
    pub const INVALID_TRANSPORT_TYPE: RejReason = RejReason(9);
    pub const STALE_CONN: RejReason = RejReason(10);
    pub const RDC_NOT_EXIST: RejReason = RejReason(11);
    pub const INVALID_GID: RejReason = RejReason(12);
    pub const INVALID_LID: RejReason = RejReason(13);
    pub const INVALID_SL: RejReason = RejReason(14);
    pub const INVALID_TRAFFIC_CLASS: RejReason = RejReason(15);
    pub const INVALID_HOP_LIMIT: RejReason = RejReason(16);
    pub const INVALID_PACKET_RATE: RejReason = RejReason(17);
    pub const INVALID_ALT_GID: RejReason = RejReason(18);
    pub const INVALID_ALT_LID: RejReason = RejReason(19);
    pub const INVALID_ALT_SL: RejReason = RejReason(20);
    pub const INVALID_ALT_TRAFFIC_CLASS: RejReason = RejReason(21);
    pub const INVALID_ALT_HOP_LIMIT: RejReason = RejReason(22);
    pub const INVALID_ALT_PACKET_RATE: RejReason = RejReason(23);
    pub const PORT_CM_REDIRECT: RejReason = RejReason(24);
    pub const PORT_REDIRECT: RejReason = RejReason(25);
    pub const INVALID_MTU: RejReason = RejReason(26);
    pub const INSUFFICIENT_RESP_RESOURCES: RejReason = RejReason(27);
    /// The application said no (`rdma_reject`), or its listen backlog was full.
    pub const CONSUMER_DEFINED: RejReason = RejReason(28);
    pub const INVALID_RNR_RETRY: RejReason = RejReason(29);
    pub const DUPLICATE_LOCAL_COMM_ID: RejReason = RejReason(30);
    pub const INVALID_CLASS_VERSION: RejReason = RejReason(31);
    pub const INVALID_FLOW_LABEL: RejReason = RejReason(32);
    pub const INVALID_ALT_FLOW_LABEL: RejReason = RejReason(33);
    /// `rdma_reject_ece`.
    pub const VENDOR_OPTION_NOT_SUPPORTED: RejReason = RejReason(35);

    pub const fn value(self) -> u16 {
        self.0
    }

    /// The reason's name, or `None` for a code nobody defined.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "no QP",
            2 => "no EEC",
            3 => "no resources",
            4 => "timeout",
            5 => "unsupported request",
            6 => "invalid comm ID",
            7 => "invalid comm instance",
            8 => "invalid service ID",
            9 => "invalid transport service type",
            10 => "stale connection",
            11 => "RDC does not exist",
            12 => "primary remote GID rejected",
            13 => "primary remote LID rejected",
            14 => "invalid primary SL",
            15 => "invalid primary traffic class",
            16 => "invalid primary hop limit",
            17 => "invalid primary packet rate",
            18 => "alternate remote GID rejected",
            19 => "alternate remote LID rejected",
            20 => "invalid alternate SL",
            21 => "invalid alternate traffic class",
            22 => "invalid alternate hop limit",
            23 => "invalid alternate packet rate",
            24 => "port CM redirection",
            25 => "port redirection",
            26 => "invalid path MTU",
            27 => "insufficient responder resources",
            28 => "consumer reject",
            29 => "invalid RNR retry count",
            30 => "duplicate local comm ID",
            31 => "invalid class version",
            32 => "invalid primary flow label",
            33 => "invalid alternate flow label",
            35 => "vendor option not supported",
            _ => return None,
        })
    }
}

impl fmt::Display for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0),
            None => write!(f, "reason {}", self.0),
        }
    }
}

/// A SIDR_REP status (Linux `enum ib_cm_sidr_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    pub const REJECT: SidrStatus = SidrStatus(2);
    pub const NO_QP: SidrStatus = SidrStatus(3);
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
}

/// The flow label rdma_cm gives a RoCE connection when the application set none: the kernel's
/// `cma_get_roce_udp_flow_label`, `(src_port × 31 + dst_port) mod 2^20`, over the rdma_cm
/// ports (the [`CmaHdr`] source port, the service ID's destination port). It goes into the
/// REQ's primary path; both ends then take the QP's UDP source port from it.
pub const fn rdma_cm_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (src_port as u32 * 31 + dst_port as u32) & 0xf_ffff
}

// ------------------------------------------------------------------------------------------
// Layouts.

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct PathHdr {
    local_lid: U16,
    remote_lid: U16,
    local_gid: [u8; 16],
    remote_gid: [u8; 16],
    /// flow label, reserved, packet rate
    fl_rate: U32,
    traffic_class: u8,
    hop_limit: u8,
    /// SL, subnet local, reserved
    sl: u8,
    /// local ACK timeout, reserved
    ack: u8,
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ReqHdr {
    local_comm_id: U32,
    resv4: U32,
    service_id: U64,
    local_ca_guid: U64,
    resv24: U32,
    local_qkey: U32,
    w32: U32,
    w36: U32,
    w40: U32,
    w44: U32,
    pkey: U16,
    b50: u8,
    b51: u8,
    primary: PathHdr,
    alternate: PathHdr,
    private_data: [u8; private_len::REQ],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct MraHdr {
    local_comm_id: U32,
    remote_comm_id: U32,
    b8: u8,
    b9: u8,
    private_data: [u8; private_len::MRA],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RejHdr {
    local_comm_id: U32,
    remote_comm_id: U32,
    b8: u8,
    b9: u8,
    reason: U16,
    ari: [u8; private_len::ARI],
    private_data: [u8; private_len::REJ],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RepHdr {
    local_comm_id: U32,
    remote_comm_id: U32,
    local_qkey: U32,
    w12: U32,
    w16: U32,
    w20: U32,
    responder_resources: u8,
    initiator_depth: u8,
    b26: u8,
    b27: u8,
    /// At byte 28: only 4-byte aligned, which zerocopy's unaligned U64 does not mind.
    local_ca_guid: U64,
    private_data: [u8; private_len::REP],
}

/// RTU and DREP: the two communication IDs and private data.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct IdsHdr {
    local_comm_id: U32,
    remote_comm_id: U32,
    private_data: [u8; private_len::RTU],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DreqHdr {
    local_comm_id: U32,
    remote_comm_id: U32,
    w8: U32,
    private_data: [u8; private_len::DREQ],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SidrReqHdr {
    request_id: U32,
    pkey: U16,
    resv6: U16,
    service_id: U64,
    private_data: [u8; private_len::SIDR_REQ],
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SidrRepHdr {
    request_id: U32,
    status: u8,
    info_len: u8,
    resv6: U16,
    w8: U32,
    service_id: U64,
    qkey: U32,
    info: [u8; private_len::ARI],
    private_data: [u8; private_len::SIDR_REP],
}

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<PathHdr>() == 44);
    assert!(size_of::<ReqHdr>() == MAD_DATA_LEN);
    assert!(size_of::<MraHdr>() == MAD_DATA_LEN);
    assert!(size_of::<RejHdr>() == MAD_DATA_LEN);
    assert!(size_of::<RepHdr>() == MAD_DATA_LEN);
    assert!(size_of::<IdsHdr>() == MAD_DATA_LEN);
    assert!(private_len::DREP == private_len::RTU);
    assert!(size_of::<DreqHdr>() == MAD_DATA_LEN);
    assert!(size_of::<SidrReqHdr>() == MAD_DATA_LEN);
    assert!(size_of::<SidrRepHdr>() == MAD_DATA_LEN);
};

// ------------------------------------------------------------------------------------------
// Messages as values.

/// A REQ's primary or alternate path (44 bytes at message offset 52 or 96).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmPath {
    /// 0xFFFF on RoCE (the permissive LID).
    pub local_lid: u16,
    pub remote_lid: u16,
    /// On RoCE the GIDs are the IP addresses: IPv4-mapped (`::ffff:a.b.c.d`) or IPv6.
    pub local_gid: Ipv6Addr,
    pub remote_gid: Ipv6Addr,
    /// 20 bits.
    pub flow_label: u32,
    /// The 6 reserved bits between flow label and packet rate.
    pub resv_rate: u8,
    /// 6 bits (IBTA's rate encoding; 0 from rdma_rxe).
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    pub subnet_local: bool,
    /// 3 reserved bits after Subnet Local.
    pub resv_sl: u8,
    /// 5 bits: 4.096 µs × 2^n.
    pub local_ack_timeout: u8,
    /// 3 reserved bits after the Local ACK Timeout.
    pub resv_ack: u8,
}

impl Default for CmPath {
    fn default() -> CmPath {
        CmPath {
            local_lid: 0,
            remote_lid: 0,
            local_gid: Ipv6Addr::UNSPECIFIED,
            remote_gid: Ipv6Addr::UNSPECIFIED,
            flow_label: 0,
            resv_rate: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 0,
            sl: 0,
            subnet_local: false,
            resv_sl: 0,
            local_ack_timeout: 0,
            resv_ack: 0,
        }
    }
}

impl CmPath {
    fn from_hdr(h: &PathHdr) -> CmPath {
        use field::*;
        let fl = h.fl_rate.get();
        CmPath {
            local_lid: h.local_lid.get(),
            remote_lid: h.remote_lid.get(),
            local_gid: Ipv6Addr::from(h.local_gid),
            remote_gid: Ipv6Addr::from(h.remote_gid),
            flow_label: PATH_FLOW_LABEL.get(fl),
            resv_rate: PATH_RESV_RATE.get(fl) as u8,
            packet_rate: PATH_PACKET_RATE.get(fl) as u8,
            traffic_class: h.traffic_class,
            hop_limit: h.hop_limit,
            sl: get8(PATH_SL, h.sl),
            subnet_local: get8(PATH_SUBNET_LOCAL, h.sl) != 0,
            resv_sl: get8(PATH_RESV_SL, h.sl),
            local_ack_timeout: get8(PATH_LOCAL_ACK_TIMEOUT, h.ack),
            resv_ack: get8(PATH_RESV_ACK, h.ack),
        }
    }

    fn hdr(&self) -> PathHdr {
        use field::*;
        PathHdr {
            local_lid: U16::new(self.local_lid),
            remote_lid: U16::new(self.remote_lid),
            local_gid: self.local_gid.octets(),
            remote_gid: self.remote_gid.octets(),
            fl_rate: U32::new(
                PATH_FLOW_LABEL.put(self.flow_label)
                    | PATH_RESV_RATE.put(self.resv_rate as u32)
                    | PATH_PACKET_RATE.put(self.packet_rate as u32),
            ),
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            sl: put8(PATH_SL, self.sl)
                | put8(PATH_SUBNET_LOCAL, self.subnet_local as u8)
                | put8(PATH_RESV_SL, self.resv_sl),
            ack: put8(PATH_LOCAL_ACK_TIMEOUT, self.local_ack_timeout)
                | put8(PATH_RESV_ACK, self.resv_ack),
        }
    }
}

/// Connection request (IBTA 12.6.5, unverified; Table 106 in 1.3). Sent by the active side to the
/// passive side's QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    pub local_comm_id: CommId,
    /// Bytes 4..8, reserved.
    pub resv4: u32,
    pub service_id: ServiceId,
    pub local_ca_guid: Guid,
    /// Bytes 24..28, reserved.
    pub resv24: u32,
    /// RD only; 0 for RC/UC.
    pub local_qkey: QKey,
    pub local_qpn: Qpn,
    /// The RDMA READ / atomic requests the active side will accept (its `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// 24 bits; RD only.
    pub local_eecn: u32,
    /// The RDMA READ / atomic requests the active side will have outstanding.
    pub initiator_depth: u8,
    /// 24 bits; RD only.
    pub remote_eecn: u32,
    /// 5 bits: how long the passive side may take to answer, 4.096 µs × 2^n.
    pub remote_cm_response_timeout: u8,
    pub transport_service_type: ServiceType,
    pub end_to_end_flow_control: bool,
    /// The PSN the passive side starts sending from (see the module notes).
    pub starting_psn: Psn,
    /// 5 bits: how long the active side may take to answer a REP.
    pub local_cm_response_timeout: u8,
    /// 3 bits: the QP's transport retry count.
    pub retry_count: u8,
    pub pkey: PKey,
    /// 4 bits: 1 = 256 … 5 = 4096.
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits: 7 = retry forever.
    pub rnr_retry_count: u8,
    /// 4 bits: how often the CM resends the REQ.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits: with service type 3, 1 = XRC.
    pub extended_transport_type: u8,
    pub primary_path: CmPath,
    pub alternate_path: CmPath,
    /// For rdma_cm over IP: a [`CmaHdr`] (36 bytes), then the application's private data.
    pub private_data: [u8; private_len::REQ],
}

impl Default for ReqRepr {
    fn default() -> ReqRepr {
        ReqRepr {
            local_comm_id: CommId(0),
            resv4: 0,
            service_id: ServiceId(0),
            local_ca_guid: Guid(0),
            resv24: 0,
            local_qkey: QKey(0),
            local_qpn: Qpn::new(0),
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: ServiceType::Rc,
            end_to_end_flow_control: false,
            starting_psn: Psn::new(0),
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: PKey::DEFAULT,
            path_mtu: 0,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary_path: CmPath::default(),
            alternate_path: CmPath::default(),
            private_data: [0; private_len::REQ],
        }
    }
}

impl ReqRepr {
    fn from_hdr(h: &ReqHdr) -> ReqRepr {
        use field::*;
        let (w32, w36, w40, w44) = (h.w32.get(), h.w36.get(), h.w40.get(), h.w44.get());
        ReqRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            resv4: h.resv4.get(),
            service_id: ServiceId(h.service_id.get()),
            local_ca_guid: Guid(h.local_ca_guid.get()),
            resv24: h.resv24.get(),
            local_qkey: QKey(h.local_qkey.get()),
            local_qpn: Qpn::new(REQ_LOCAL_QPN.get(w32)),
            responder_resources: REQ_RESPONDER_RESOURCES.get(w32) as u8,
            local_eecn: REQ_LOCAL_EECN.get(w36),
            initiator_depth: REQ_INITIATOR_DEPTH.get(w36) as u8,
            remote_eecn: REQ_REMOTE_EECN.get(w40),
            remote_cm_response_timeout: REQ_REMOTE_CM_RESPONSE_TIMEOUT.get(w40) as u8,
            transport_service_type: ServiceType::from_bits(
                REQ_TRANSPORT_SERVICE_TYPE.get(w40) as u8
            ),
            end_to_end_flow_control: flag(REQ_END_TO_END_FLOW_CONTROL, w40),
            starting_psn: Psn::new(REQ_STARTING_PSN.get(w44)),
            local_cm_response_timeout: REQ_LOCAL_CM_RESPONSE_TIMEOUT.get(w44) as u8,
            retry_count: REQ_RETRY_COUNT.get(w44) as u8,
            pkey: PKey(h.pkey.get()),
            path_mtu: get8(REQ_PATH_MTU, h.b50),
            rdc_exists: get8(REQ_RDC_EXISTS, h.b50) != 0,
            rnr_retry_count: get8(REQ_RNR_RETRY_COUNT, h.b50),
            max_cm_retries: get8(REQ_MAX_CM_RETRIES, h.b51),
            srq: get8(REQ_SRQ, h.b51) != 0,
            extended_transport_type: get8(REQ_EXTENDED_TRANSPORT_TYPE, h.b51),
            primary_path: CmPath::from_hdr(&h.primary),
            alternate_path: CmPath::from_hdr(&h.alternate),
            private_data: h.private_data,
        }
    }

    fn hdr(&self) -> ReqHdr {
        use field::*;
        ReqHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            resv4: U32::new(self.resv4),
            service_id: U64::new(self.service_id.0),
            local_ca_guid: U64::new(self.local_ca_guid.0),
            resv24: U32::new(self.resv24),
            local_qkey: U32::new(self.local_qkey.0),
            w32: U32::new(
                REQ_LOCAL_QPN.put(self.local_qpn.value())
                    | REQ_RESPONDER_RESOURCES.put(self.responder_resources as u32),
            ),
            w36: U32::new(
                REQ_LOCAL_EECN.put(self.local_eecn)
                    | REQ_INITIATOR_DEPTH.put(self.initiator_depth as u32),
            ),
            w40: U32::new(
                REQ_REMOTE_EECN.put(self.remote_eecn)
                    | REQ_REMOTE_CM_RESPONSE_TIMEOUT.put(self.remote_cm_response_timeout as u32)
                    | REQ_TRANSPORT_SERVICE_TYPE.put(self.transport_service_type.bits() as u32)
                    | REQ_END_TO_END_FLOW_CONTROL.put(self.end_to_end_flow_control as u32),
            ),
            w44: U32::new(
                REQ_STARTING_PSN.put(self.starting_psn.value())
                    | REQ_LOCAL_CM_RESPONSE_TIMEOUT.put(self.local_cm_response_timeout as u32)
                    | REQ_RETRY_COUNT.put(self.retry_count as u32),
            ),
            pkey: U16::new(self.pkey.0),
            b50: put8(REQ_PATH_MTU, self.path_mtu)
                | put8(REQ_RDC_EXISTS, self.rdc_exists as u8)
                | put8(REQ_RNR_RETRY_COUNT, self.rnr_retry_count),
            b51: put8(REQ_MAX_CM_RETRIES, self.max_cm_retries)
                | put8(REQ_SRQ, self.srq as u8)
                | put8(REQ_EXTENDED_TRANSPORT_TYPE, self.extended_transport_type),
            primary: self.primary_path.hdr(),
            alternate: self.alternate_path.hdr(),
            private_data: self.private_data,
        }
    }

    /// The rdma_cm header at the front of the private data, when the service ID is an rdma_cm
    /// IP service (port space TCP, UDP or IPoIB). `None` for other service IDs; `Some(Err)` when
    /// the header is malformed.
    pub fn cma_hdr(&self) -> Option<Result<CmaHdr, MadError>> {
        match self.service_id.rdma_cm_port() {
            Some((ps, _)) if ps != PortSpace::IB => Some(CmaHdr::parse(&self.private_data)),
            _ => None,
        }
    }
}

/// Message receipt acknowledgement (IBTA 12.6.6, unverified; Table 107 in 1.3): "received, answer
/// coming, wait this long". Linux sends one for a REQ only when a duplicate of it arrives before
/// the application has accepted (`IB_CM_MRA_FLAG_DELAY`), with service timeout 24 (68.7 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    pub local_comm_id: CommId,
    pub remote_comm_id: CommId,
    pub message_mraed: MsgKind,
    /// 6 reserved bits.
    pub resv8: u8,
    /// 5 bits: 4.096 µs × 2^n.
    pub service_timeout: u8,
    /// 3 reserved bits.
    pub resv9: u8,
    pub private_data: [u8; private_len::MRA],
}

impl Default for MraRepr {
    fn default() -> MraRepr {
        MraRepr {
            local_comm_id: CommId(0),
            remote_comm_id: CommId(0),
            message_mraed: MsgKind::Req,
            resv8: 0,
            service_timeout: 0,
            resv9: 0,
            private_data: [0; private_len::MRA],
        }
    }
}

impl MraRepr {
    fn from_hdr(h: &MraHdr) -> MraRepr {
        use field::*;
        MraRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            remote_comm_id: CommId(h.remote_comm_id.get()),
            message_mraed: MsgKind::from_bits(get8(MSG_KIND, h.b8)),
            resv8: get8(MSG_KIND_RESV, h.b8),
            service_timeout: get8(MRA_SERVICE_TIMEOUT, h.b9),
            resv9: get8(MRA_RESV9, h.b9),
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> MraHdr {
        use field::*;
        MraHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            remote_comm_id: U32::new(self.remote_comm_id.0),
            b8: put8(MSG_KIND, self.message_mraed.bits()) | put8(MSG_KIND_RESV, self.resv8),
            b9: put8(MRA_SERVICE_TIMEOUT, self.service_timeout) | put8(MRA_RESV9, self.resv9),
            private_data: self.private_data,
        }
    }
}

/// Reject (IBTA 12.6.7, unverified; Table 108 in 1.3). A REJ for a REQ to a service nobody listens
/// on has Local Communication ID 0 (Linux answers without creating a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    pub local_comm_id: CommId,
    pub remote_comm_id: CommId,
    pub message_rejected: MsgKind,
    /// 6 reserved bits.
    pub resv8: u8,
    /// 7 bits: how many ARI bytes mean something.
    pub reject_info_len: u8,
    /// 1 reserved bit.
    pub resv9: u8,
    pub reason: RejReason,
    /// Additional rejection information (a GID for reason 12, a ClassPortInfo for 24, …).
    pub ari: [u8; private_len::ARI],
    pub private_data: [u8; private_len::REJ],
}

impl Default for RejRepr {
    fn default() -> RejRepr {
        RejRepr {
            local_comm_id: CommId(0),
            remote_comm_id: CommId(0),
            message_rejected: MsgKind::Req,
            resv8: 0,
            reject_info_len: 0,
            resv9: 0,
            reason: RejReason(0),
            ari: [0; private_len::ARI],
            private_data: [0; private_len::REJ],
        }
    }
}

impl RejRepr {
    fn from_hdr(h: &RejHdr) -> RejRepr {
        use field::*;
        RejRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            remote_comm_id: CommId(h.remote_comm_id.get()),
            message_rejected: MsgKind::from_bits(get8(MSG_KIND, h.b8)),
            resv8: get8(MSG_KIND_RESV, h.b8),
            reject_info_len: get8(REJ_INFO_LEN, h.b9),
            resv9: get8(REJ_RESV9, h.b9),
            reason: RejReason(h.reason.get()),
            ari: h.ari,
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> RejHdr {
        use field::*;
        RejHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            remote_comm_id: U32::new(self.remote_comm_id.0),
            b8: put8(MSG_KIND, self.message_rejected.bits()) | put8(MSG_KIND_RESV, self.resv8),
            b9: put8(REJ_INFO_LEN, self.reject_info_len) | put8(REJ_RESV9, self.resv9),
            reason: U16::new(self.reason.0),
            ari: self.ari,
            private_data: self.private_data,
        }
    }
    /// The meaningful ARI bytes (`reject_info_len` of them, at most 72).
    pub fn ari_bytes(&self) -> &[u8] {
        &self.ari[..(self.reject_info_len as usize).min(private_len::ARI)]
    }
}

/// Reply (IBTA 12.6.8, unverified; Table 110 in 1.3): the passive side accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    pub local_comm_id: CommId,
    pub remote_comm_id: CommId,
    pub local_qkey: QKey,
    pub local_qpn: Qpn,
    /// The 8 reserved bits after the Local QPN.
    pub resv_qpn: u8,
    /// 24 bits; RD only (Linux puts the XRC target QPN here for an XRC initiator).
    pub local_eecn: u32,
    pub resv_eecn: u8,
    /// The PSN the active side starts sending from.
    pub starting_psn: Psn,
    pub resv_psn: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits: 4.096 µs × 2^n.
    pub target_ack_delay: u8,
    /// 2 bits: the passive side's answer to the REQ's alternate path.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// 4 reserved bits.
    pub resv27: u8,
    pub local_ca_guid: Guid,
    /// rdma_cm puts no header here: only the application's bytes.
    pub private_data: [u8; private_len::REP],
}

impl Default for RepRepr {
    fn default() -> RepRepr {
        RepRepr {
            local_comm_id: CommId(0),
            remote_comm_id: CommId(0),
            local_qkey: QKey(0),
            local_qpn: Qpn::new(0),
            resv_qpn: 0,
            local_eecn: 0,
            resv_eecn: 0,
            starting_psn: Psn::new(0),
            resv_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            resv27: 0,
            local_ca_guid: Guid(0),
            private_data: [0; private_len::REP],
        }
    }
}

impl RepRepr {
    fn from_hdr(h: &RepHdr) -> RepRepr {
        use field::*;
        let (w12, w16, w20) = (h.w12.get(), h.w16.get(), h.w20.get());
        RepRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            remote_comm_id: CommId(h.remote_comm_id.get()),
            local_qkey: QKey(h.local_qkey.get()),
            local_qpn: Qpn::new(NUM24.get(w12)),
            resv_qpn: NUM24_RESV.get(w12) as u8,
            local_eecn: NUM24.get(w16),
            resv_eecn: NUM24_RESV.get(w16) as u8,
            starting_psn: Psn::new(NUM24.get(w20)),
            resv_psn: NUM24_RESV.get(w20) as u8,
            responder_resources: h.responder_resources,
            initiator_depth: h.initiator_depth,
            target_ack_delay: get8(REP_TARGET_ACK_DELAY, h.b26),
            failover_accepted: get8(REP_FAILOVER_ACCEPTED, h.b26),
            end_to_end_flow_control: get8(REP_END_TO_END_FLOW_CONTROL, h.b26) != 0,
            rnr_retry_count: get8(REP_RNR_RETRY_COUNT, h.b27),
            srq: get8(REP_SRQ, h.b27) != 0,
            resv27: get8(REP_RESV27, h.b27),
            local_ca_guid: Guid(h.local_ca_guid.get()),
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> RepHdr {
        use field::*;
        RepHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            remote_comm_id: U32::new(self.remote_comm_id.0),
            local_qkey: U32::new(self.local_qkey.0),
            w12: U32::new(NUM24.put(self.local_qpn.value()) | NUM24_RESV.put(self.resv_qpn as u32)),
            w16: U32::new(NUM24.put(self.local_eecn) | NUM24_RESV.put(self.resv_eecn as u32)),
            w20: U32::new(
                NUM24.put(self.starting_psn.value()) | NUM24_RESV.put(self.resv_psn as u32),
            ),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            b26: put8(REP_TARGET_ACK_DELAY, self.target_ack_delay)
                | put8(REP_FAILOVER_ACCEPTED, self.failover_accepted)
                | put8(
                    REP_END_TO_END_FLOW_CONTROL,
                    self.end_to_end_flow_control as u8,
                ),
            b27: put8(REP_RNR_RETRY_COUNT, self.rnr_retry_count)
                | put8(REP_SRQ, self.srq as u8)
                | put8(REP_RESV27, self.resv27),
            local_ca_guid: U64::new(self.local_ca_guid.0),
            private_data: self.private_data,
        }
    }
}

/// Ready to use (IBTA 12.6.9; Table 111 in 1.3) and disconnect reply (12.6.11; Table 113) share a
/// layout: the two communication IDs and 224 bytes of private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtuRepr {
    pub local_comm_id: CommId,
    pub remote_comm_id: CommId,
    pub private_data: [u8; private_len::RTU],
}

/// Disconnect reply (IBTA 12.6.11, unverified; Table 113 in 1.3).
pub type DrepRepr = RtuRepr;

impl Default for RtuRepr {
    fn default() -> RtuRepr {
        RtuRepr {
            local_comm_id: CommId(0),
            remote_comm_id: CommId(0),
            private_data: [0; private_len::RTU],
        }
    }
}

impl RtuRepr {
    fn from_hdr(h: &IdsHdr) -> RtuRepr {
        RtuRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            remote_comm_id: CommId(h.remote_comm_id.get()),
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> IdsHdr {
        IdsHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            remote_comm_id: U32::new(self.remote_comm_id.0),
            private_data: self.private_data,
        }
    }
}

/// Disconnect request (IBTA 12.6.10, unverified; Table 112 in 1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    pub local_comm_id: CommId,
    pub remote_comm_id: CommId,
    /// The receiver's QPN (or EECN).
    pub remote_qpn: Qpn,
    pub resv_qpn: u8,
    pub private_data: [u8; private_len::DREQ],
}

impl Default for DreqRepr {
    fn default() -> DreqRepr {
        DreqRepr {
            local_comm_id: CommId(0),
            remote_comm_id: CommId(0),
            remote_qpn: Qpn::new(0),
            resv_qpn: 0,
            private_data: [0; private_len::DREQ],
        }
    }
}

impl DreqRepr {
    fn from_hdr(h: &DreqHdr) -> DreqRepr {
        use field::*;
        let w8 = h.w8.get();
        DreqRepr {
            local_comm_id: CommId(h.local_comm_id.get()),
            remote_comm_id: CommId(h.remote_comm_id.get()),
            remote_qpn: Qpn::new(NUM24.get(w8)),
            resv_qpn: NUM24_RESV.get(w8) as u8,
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> DreqHdr {
        use field::*;
        DreqHdr {
            local_comm_id: U32::new(self.local_comm_id.0),
            remote_comm_id: U32::new(self.remote_comm_id.0),
            w8: U32::new(NUM24.put(self.remote_qpn.value()) | NUM24_RESV.put(self.resv_qpn as u32)),
            private_data: self.private_data,
        }
    }
}

/// Service ID resolution request (IBTA chapter 12, SIDR): a UD QP asks for the QPN and Q_Key
/// behind a service ID. rdma_cm's UDP port space uses it (`udaddy`); its private data starts
/// with a [`CmaHdr`] like a REQ's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    pub request_id: CommId,
    pub pkey: PKey,
    pub resv6: u16,
    pub service_id: ServiceId,
    pub private_data: [u8; private_len::SIDR_REQ],
}

impl Default for SidrReqRepr {
    fn default() -> SidrReqRepr {
        SidrReqRepr {
            request_id: CommId(0),
            pkey: PKey::DEFAULT,
            resv6: 0,
            service_id: ServiceId(0),
            private_data: [0; private_len::SIDR_REQ],
        }
    }
}

impl SidrReqRepr {
    fn from_hdr(h: &SidrReqHdr) -> SidrReqRepr {
        SidrReqRepr {
            request_id: CommId(h.request_id.get()),
            pkey: PKey(h.pkey.get()),
            resv6: h.resv6.get(),
            service_id: ServiceId(h.service_id.get()),
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> SidrReqHdr {
        SidrReqHdr {
            request_id: U32::new(self.request_id.0),
            pkey: U16::new(self.pkey.0),
            resv6: U16::new(self.resv6),
            service_id: U64::new(self.service_id.0),
            private_data: self.private_data,
        }
    }
}

/// Service ID resolution reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    pub request_id: CommId,
    pub status: SidrStatus,
    pub additional_info_len: u8,
    pub resv6: u16,
    pub qpn: Qpn,
    pub resv_qpn: u8,
    pub service_id: ServiceId,
    pub qkey: QKey,
    pub additional_info: [u8; private_len::ARI],
    pub private_data: [u8; private_len::SIDR_REP],
}

impl Default for SidrRepRepr {
    fn default() -> SidrRepRepr {
        SidrRepRepr {
            request_id: CommId(0),
            status: SidrStatus::SUCCESS,
            additional_info_len: 0,
            resv6: 0,
            qpn: Qpn::new(0),
            resv_qpn: 0,
            service_id: ServiceId(0),
            qkey: QKey(0),
            additional_info: [0; private_len::ARI],
            private_data: [0; private_len::SIDR_REP],
        }
    }
}

impl SidrRepRepr {
    fn from_hdr(h: &SidrRepHdr) -> SidrRepRepr {
        use field::*;
        let w8 = h.w8.get();
        SidrRepRepr {
            request_id: CommId(h.request_id.get()),
            status: SidrStatus(h.status),
            additional_info_len: h.info_len,
            resv6: h.resv6.get(),
            qpn: Qpn::new(NUM24.get(w8)),
            resv_qpn: NUM24_RESV.get(w8) as u8,
            service_id: ServiceId(h.service_id.get()),
            qkey: QKey(h.qkey.get()),
            additional_info: h.info,
            private_data: h.private_data,
        }
    }
    fn hdr(&self) -> SidrRepHdr {
        use field::*;
        SidrRepHdr {
            request_id: U32::new(self.request_id.0),
            status: self.status.0,
            info_len: self.additional_info_len,
            resv6: U16::new(self.resv6),
            w8: U32::new(NUM24.put(self.qpn.value()) | NUM24_RESV.put(self.resv_qpn as u32)),
            service_id: U64::new(self.service_id.0),
            qkey: U32::new(self.qkey.0),
            info: self.additional_info,
            private_data: self.private_data,
        }
    }
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    Req(ReqRepr),
    Mra(MraRepr),
    Rej(RejRepr),
    Rep(RepRepr),
    Rtu(RtuRepr),
    Dreq(DreqRepr),
    Drep(DrepRepr),
    SidrReq(SidrReqRepr),
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The attribute ID that names this message in the MAD header.
    pub const fn attr_id(&self) -> AttrId {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The message's name as IBTA spells it.
    pub const fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }

    /// The sender's communication ID (SIDR: the request ID).
    pub const fn local_comm_id(&self) -> CommId {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) | CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(m) => m.request_id,
        }
    }

    /// Reads the message named by `attr` from the 232 bytes after a MAD's common header.
    pub fn parse(attr: AttrId, data: &[u8; MAD_DATA_LEN]) -> Result<CmMessage, MadError> {
        // Every layout is exactly MAD_DATA_LEN bytes with alignment 1: `transmute_ref!` checks
        // that at compile time, so these views cannot fail.
        Ok(match attr {
            attr::REQ => CmMessage::Req(ReqRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::MRA => CmMessage::Mra(MraRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::REJ => CmMessage::Rej(RejRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::REP => CmMessage::Rep(RepRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::RTU => CmMessage::Rtu(RtuRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::DREQ => CmMessage::Dreq(DreqRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::DREP => CmMessage::Drep(RtuRepr::from_hdr(zerocopy::transmute_ref!(data))),
            attr::SIDR_REQ => {
                CmMessage::SidrReq(SidrReqRepr::from_hdr(zerocopy::transmute_ref!(data)))
            }
            attr::SIDR_REP => {
                CmMessage::SidrRep(SidrRepRepr::from_hdr(zerocopy::transmute_ref!(data)))
            }
            attr => {
                return Err(MadError::Attribute {
                    class: MgmtClass::CM,
                    attr,
                })
            }
        })
    }

    /// Writes the message into the 232 bytes after a MAD's common header.
    pub fn emit(&self, data: &mut [u8; MAD_DATA_LEN]) {
        *data = match self {
            CmMessage::Req(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::Mra(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::Rej(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::Rep(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::Rtu(m) | CmMessage::Drep(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::Dreq(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::SidrReq(m) => zerocopy::transmute!(m.hdr()),
            CmMessage::SidrRep(m) => zerocopy::transmute!(m.hdr()),
        };
    }
}

/// A whole CM MAD: the common header and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// The common header. On emit its attribute ID is replaced by the message's.
    pub mad: MadRepr,
    pub msg: CmMessage,
}

impl CmMadRepr {
    /// A CM MAD as Linux sends it: base version 1, class version 2, method Send, status 0.
    pub fn new(tid: Tid, msg: CmMessage) -> CmMadRepr {
        CmMadRepr {
            mad: MadRepr::new(
                MgmtClass::CM,
                CM_CLASS_VERSION,
                Method::SEND,
                tid,
                msg.attr_id(),
            ),
            msg,
        }
    }

    /// Reads a CM MAD: exactly 256 bytes, base version 1, class 0x07, class version 2, and one
    /// of the attributes [`CmMessage`] knows. The method is not checked (CM messages are Sends;
    /// what to do with anything else is the caller's decision).
    pub fn parse(bytes: &[u8]) -> Result<CmMadRepr, MadError> {
        let m = Mad::ref_from_checked(bytes)?;
        let mad = MadRepr::from_header(&m.header);
        if mad.base_version != crate::mad::MAD_BASE_VERSION {
            return Err(MadError::BaseVersion(mad.base_version));
        }
        if mad.mgmt_class != MgmtClass::CM {
            return Err(MadError::Class {
                expected: MgmtClass::CM,
                found: mad.mgmt_class,
            });
        }
        if mad.class_version != CM_CLASS_VERSION {
            return Err(MadError::ClassVersion {
                class: MgmtClass::CM,
                version: mad.class_version,
            });
        }
        let msg = CmMessage::parse(mad.attr_id, &m.data)?;
        Ok(CmMadRepr { mad, msg })
    }

    /// Writes the 256-byte MAD at the front of `buf`; returns 256.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BuildError> {
        let have = buf.len();
        let out = buf
            .get_mut(..MAD_LEN)
            .and_then(|b| Mad::mut_from_bytes(b).ok())
            .ok_or(BuildError::BufferTooSmall {
                need: MAD_LEN,
                have,
            })?;
        out.header = MadRepr {
            attr_id: self.msg.attr_id(),
            ..self.mad
        }
        .to_header();
        self.msg.emit(&mut out.data);
        Ok(MAD_LEN)
    }
}

// ------------------------------------------------------------------------------------------
// rdma_cm's private data header.

/// The length of [`CmaHdr`].
pub const CMA_HDR_LEN: usize = 36;

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CmaHdrRaw {
    cma_version: u8,
    /// IP version (7:4), reserved (3:0)
    ip_version: u8,
    port: U16,
    src_addr: [u8; 16],
    dst_addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<CmaHdrRaw>() == CMA_HDR_LEN);

/// The header rdma_cm puts at the front of a REQ's (and SIDR_REQ's) private data for IP port
/// spaces (the kernel's `struct cma_hdr`; IBTA Annex A11 "RDMA IP CM Service"): version 0, IP
/// version, the *source* port, then source and destination address. The destination port is in
/// the service ID. An IPv4 address sits in the last 4 bytes of its 16, after 12 zero bytes (not
/// IPv4-mapped). The application's private data follows, [`CMA_HDR_LEN`] bytes in: 56 bytes
/// of a REQ's 92.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// 0 (Annex A11 splits it into major and minor version nibbles).
    pub cma_version: u8,
    /// 4 or 6: the upper nibble of byte 1.
    pub ip_version: u8,
    /// The lower nibble of byte 1, reserved.
    pub resv: u8,
    pub src_port: u16,
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
}

impl CmaHdr {
    /// The header for a connection from `src` to `dst` (whose port goes in the service ID).
    /// Both addresses must be of one family.
    pub fn new(src: SocketAddr, dst: IpAddr) -> Result<CmaHdr, BuildError> {
        fn v4(a: Ipv4Addr) -> [u8; 16] {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&a.octets());
            b
        }
        let (ip_version, src_addr, dst_addr) = match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4, v4(s), v4(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s.octets(), d.octets()),
            _ => return Err(BuildError::Invalid("cma_hdr: IPv4 and IPv6 mixed")),
        };
        Ok(CmaHdr {
            cma_version: 0,
            ip_version,
            resv: 0,
            src_port: src.port(),
            src_addr,
            dst_addr,
        })
    }

    /// Reads the header from the front of `private_data`. Fails on fewer than 36 bytes, a
    /// version other than 0 or an IP version other than 4 or 6: the address layout depends on
    /// them (the kernel rejects such a REQ).
    pub fn parse(private_data: &[u8]) -> Result<CmaHdr, MadError> {
        let (h, _) =
            CmaHdrRaw::ref_from_prefix(private_data).map_err(|_| MadError::CmaTruncated {
                have: private_data.len(),
            })?;
        if h.cma_version != 0 {
            return Err(MadError::CmaVersion(h.cma_version));
        }
        let ip_version = h.ip_version >> 4;
        if ip_version != 4 && ip_version != 6 {
            return Err(MadError::CmaIpVersion(ip_version));
        }
        Ok(CmaHdr {
            cma_version: h.cma_version,
            ip_version,
            resv: h.ip_version & 0x0f,
            src_port: h.port.get(),
            src_addr: h.src_addr,
            dst_addr: h.dst_addr,
        })
    }

    /// Writes the 36 bytes at the front of `buf`; returns 36.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BuildError> {
        let have = buf.len();
        let out = buf
            .get_mut(..CMA_HDR_LEN)
            .ok_or(BuildError::BufferTooSmall {
                need: CMA_HDR_LEN,
                have,
            })?;
        let raw = CmaHdrRaw {
            cma_version: self.cma_version,
            ip_version: (self.ip_version << 4) | (self.resv & 0x0f),
            port: U16::new(self.src_port),
            src_addr: self.src_addr,
            dst_addr: self.dst_addr,
        };
        out.copy_from_slice(raw.as_bytes());
        Ok(CMA_HDR_LEN)
    }

    fn ip(&self, b: &[u8; 16]) -> IpAddr {
        if self.ip_version == 4 {
            IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        } else {
            IpAddr::V6(Ipv6Addr::from(*b))
        }
    }
    /// The active side's address.
    pub fn src_ip(&self) -> IpAddr {
        self.ip(&self.src_addr)
    }
    /// The passive side's address.
    pub fn dst_ip(&self) -> IpAddr {
        self.ip(&self.dst_addr)
    }
    pub fn src(&self) -> SocketAddr {
        SocketAddr::new(self.src_ip(), self.src_port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_count_from_the_most_significant_bit() {
        let f = BitField::in32(24, 5);
        assert_eq!(f.mask(), 0x0000_00f8);
        assert_eq!(f.get(0xa0), 0x14);
        assert_eq!(f.put(0x14), 0xa0);
        assert_eq!(f.put(0xff), 0xf8, "cut to the width");
        let g = BitField::in8(5, 3);
        assert_eq!(g.mask(), 0x07);
        assert_eq!(BitField::in32(0, 32).mask(), u32::MAX);
        assert!(tiles(32, &[BitField::in32(0, 24), BitField::in32(24, 8)]));
        assert!(!tiles(32, &[BitField::in32(0, 24), BitField::in32(23, 8)]));
        assert!(!tiles(32, &[BitField::in32(0, 24)]));
    }

    #[test]
    fn service_ids_carry_port_space_and_port() {
        let s = ServiceId::rdma_cm(PortSpace::TCP, 7174);
        assert_eq!(s, ServiceId(0x0000_0000_0106_1c06));
        assert_eq!(s.rdma_cm_port(), Some((PortSpace::TCP, 7174)));
        assert_eq!(
            ServiceId(0x0000_0000_0111_1234).rdma_cm_port(),
            Some((PortSpace::UDP, 0x1234))
        );
        assert_eq!(ServiceId(0x0000_0000_0107_1c06).rdma_cm_port(), None);
        assert_eq!(ServiceId(0x1000_0000_0106_1c06).rdma_cm_port(), None);
    }

    #[test]
    fn flow_label_of_the_rping_capture() {
        // rping.pcap: cma_hdr port 0xe084, service port 7174 → 0xb4c02, UDP sport 52271.
        assert_eq!(rdma_cm_flow_label(0xe084, 7174), 0xb4c02);
        assert_eq!(
            crate::udp_sport_for_flow(0xb4c02, Qpn::new(0x11), Qpn::new(0x11)),
            52271
        );
    }

    #[test]
    fn cma_hdr_round_trips() {
        let h = CmaHdr::new(
            "10.99.0.12:57476".parse().unwrap(),
            "10.99.0.11".parse().unwrap(),
        )
        .unwrap();
        let mut b = [0xffu8; 40];
        assert_eq!(h.emit(&mut b), Ok(36));
        assert_eq!(&b[..4], &[0x00, 0x40, 0xe0, 0x84]);
        assert_eq!(
            &b[4..20],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 99, 0, 12]
        );
        assert_eq!(b[36..], [0xff; 4]);
        let p = CmaHdr::parse(&b).unwrap();
        assert_eq!(p, h);
        assert_eq!(p.src(), "10.99.0.12:57476".parse().unwrap());
        assert_eq!(p.dst_ip(), "10.99.0.11".parse::<IpAddr>().unwrap());
        assert!(CmaHdr::new("10.99.0.12:1".parse().unwrap(), "fd99::11".parse().unwrap()).is_err());
        assert_eq!(
            CmaHdr::parse(&b[..35]),
            Err(MadError::CmaTruncated { have: 35 })
        );
        b[1] = 0x50;
        assert_eq!(CmaHdr::parse(&b), Err(MadError::CmaIpVersion(5)));
        b[0] = 1;
        assert_eq!(CmaHdr::parse(&b), Err(MadError::CmaVersion(1)));
        assert!(h.emit(&mut [0u8; 35]).is_err());
    }

    #[test]
    fn header_errors() {
        let mut mad = [0u8; MAD_LEN];
        CmMadRepr::new(Tid(1), CmMessage::Rtu(RtuRepr::default()))
            .emit(&mut mad)
            .unwrap();
        assert!(CmMadRepr::parse(&mad).is_ok());
        let mut m = mad;
        m[0] = 0x80;
        assert_eq!(CmMadRepr::parse(&m), Err(MadError::BaseVersion(0x80)));
        let mut m = mad;
        m[1] = 0x03;
        assert_eq!(
            CmMadRepr::parse(&m),
            Err(MadError::Class {
                expected: MgmtClass::CM,
                found: MgmtClass::SUBN_ADM
            })
        );
        let mut m = mad;
        m[2] = 1;
        assert_eq!(
            CmMadRepr::parse(&m),
            Err(MadError::ClassVersion {
                class: MgmtClass::CM,
                version: 1
            })
        );
        let mut m = mad;
        m[17] = 0x19;
        assert_eq!(
            CmMadRepr::parse(&m),
            Err(MadError::Attribute {
                class: MgmtClass::CM,
                attr: attr::LAP
            })
        );
        assert_eq!(
            CmMadRepr::parse(&mad[..255]),
            Err(MadError::Length { len: 255 })
        );
        assert!(CmMadRepr::new(Tid(1), CmMessage::Rtu(RtuRepr::default()))
            .emit(&mut [0u8; 255])
            .is_err());
    }
}
