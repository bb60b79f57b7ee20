//! Verbs-facing types, named after ibverbs (`ibv_*`) so that people who know rdma-core find
//! their way: access flags, QP types and states, `ibv_modify_qp` attributes and masks, work
//! requests, work completions, device attributes.
use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
pub use rocemu_wire::eth::Mac;
use rocemu_wire::{PKey, Psn, QKey, Qpn};

/// Memory access flags (`ibv_access_flags`, same bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(2);
    pub const REMOTE_READ: Access = Access(4);
    pub const REMOTE_ATOMIC: Access = Access(8);
    pub const NONE: Access = Access(0);
    pub const ALL: Access = Access(15);
    pub const fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn union(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// `ibv_qp_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

/// `ibv_qp_state` (IBTA 10.3.1, unverified).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

/// `ibv_mtu`: the path MTU, 256 … 4096 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    M256 = 1,
    M512 = 2,
    M1024 = 3,
    M2048 = 4,
    M4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> usize {
        128 << (self as usize)
    }
    pub fn from_bytes(n: usize) -> Option<Mtu> {
        Some(match n {
            256 => Mtu::M256,
            512 => Mtu::M512,
            1024 => Mtu::M1024,
            2048 => Mtu::M2048,
            4096 => Mtu::M4096,
            _ => return None,
        })
    }
    /// The largest IBTA MTU whose packets fit an Ethernet MTU (IP + UDP + BTH + the largest
    /// extension headers + ICRC), as rxe computes its active MTU.
    pub fn for_netdev_mtu(eth_mtu: usize) -> Mtu {
        let overhead = 40 + 8 + 12 + 28 + 4;
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| m.bytes() + overhead <= eth_mtu)
            .unwrap_or(Mtu::M256)
    }
}

/// A 128-bit GID. RoCEv2 GIDs are IPv6 addresses or IPv4-mapped IPv6 addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(a) => Gid(a.to_ipv6_mapped().octets()),
            IpAddr::V6(a) => Gid(a.octets()),
        }
    }
    /// The IP address the GID stands for (IPv4 for a mapped GID).
    pub fn ip(&self) -> IpAddr {
        let a = Ipv6Addr::from(self.0);
        match a.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(a),
        }
    }
    pub fn is_v4(&self) -> bool {
        matches!(self.ip(), IpAddr::V4(_))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.ip())
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(a: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(a))
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Gid {
        Gid::from_ip(IpAddr::V6(a))
    }
}

/// `ibv_ah_attr` for RoCE: where packets go. `dmac` is resolved from the GID by the engine's
/// neighbour table when not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    pub dgid: Gid,
    pub sgid_index: u8,
    pub dmac: Option<Mac>,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub sl: u8,
}

impl AhAttr {
    pub fn to(ip: IpAddr, dmac: Mac) -> AhAttr {
        AhAttr {
            dgid: Gid::from_ip(ip),
            sgid_index: 0,
            dmac: Some(dmac),
            hop_limit: 64,
            ..Default::default()
        }
    }
}

/// `ibv_qp_attr_mask`, same bit values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpAttrMask(pub u32);

#[allow(missing_docs)]
impl QpAttrMask {
    pub const STATE: QpAttrMask = QpAttrMask(1 << 0);
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);

    pub const fn contains(self, o: QpAttrMask) -> bool {
        self.0 & o.0 == o.0
    }
    pub const fn intersects(self, o: QpAttrMask) -> bool {
        self.0 & o.0 != 0
    }
    pub const fn union(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | o.0)
    }
    pub const fn minus(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 & !o.0)
    }
    /// The names of the set bits, for error messages.
    pub fn names(self) -> Vec<&'static str> {
        const N: [&str; 21] = [
            "STATE",
            "CUR_STATE",
            "EN_SQD_ASYNC_NOTIFY",
            "ACCESS_FLAGS",
            "PKEY_INDEX",
            "PORT",
            "QKEY",
            "AV",
            "PATH_MTU",
            "TIMEOUT",
            "RETRY_CNT",
            "RNR_RETRY",
            "RQ_PSN",
            "MAX_QP_RD_ATOMIC",
            "ALT_PATH",
            "MIN_RNR_TIMER",
            "SQ_PSN",
            "MAX_DEST_RD_ATOMIC",
            "PATH_MIG_STATE",
            "CAP",
            "DEST_QPN",
        ];
        (0..32)
            .filter(|b| self.0 & (1 << b) != 0)
            .map(|b| N.get(b).copied().unwrap_or("UNKNOWN"))
            .collect()
    }
}

impl core::ops::BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, o: QpAttrMask) -> QpAttrMask {
        QpAttrMask(self.0 | o.0)
    }
}

/// `ibv_qp_attr`: the values `modify_qp` reads where the mask says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: QKey,
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    pub dest_qp_num: Qpn,
    pub qp_access_flags: Access,
    pub ah_attr: AhAttr,
    pub pkey_index: u16,
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout; 0 = infinite.
    pub timeout: u8,
    pub retry_cnt: u8,
    /// 7 = retry forever.
    pub rnr_retry: u8,
    /// The RNR NAK timer code this QP's responder sends (IBTA Table 45, "Encoding for RNR NAK Timer
    /// Field", as Linux's cma.c names it).
    pub min_rnr_timer: u8,
    /// Reads and atomics this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// Reads and atomics this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::M1024,
            qkey: QKey(0),
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            dest_qp_num: Qpn::new(0),
            qp_access_flags: Access::NONE,
            ah_attr: AhAttr::default(),
            pkey_index: 0,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

/// `ibv_qp_cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> QpCap {
        QpCap {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 256,
        }
    }
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);
/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);
/// A shared receive queue handle: opaque (slot and generation: a destroyed SRQ's handle
/// reaches nothing, even when its slot serves a new SRQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub(crate) u32);

impl SrqId {
    /// A number unique among the device's live SRQs (for `ibv_srq.handle`).
    pub const fn handle(self) -> u32 {
        self.0
    }
}

/// `ibv_srq_init_attr.attr`: the size of a new SRQ. `srq_limit` is ignored at creation
/// (`ibv_create_srq(3)`: "irrelevant for ibv_create_srq"); `Rnic::modify_srq` arms it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInitAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `ibv_srq_attr` as `ibv_query_srq` returns it: `srq_limit` 0 means the limit event is not
/// (or no longer) armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<SrqId>,
    pub cap: QpCap,
    /// Every send WR generates a completion, whatever its SIGNALED flag.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    /// A QP of `qp_type` whose sends and receives complete on `cq`, with the default capacities
    /// and only signaled sends completing.
    pub fn new(qp_type: QpType, cq: CqId) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// `ibv_sge`: local memory by L_Key and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ibv_send_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    pub const FENCE: SendFlags = SendFlags(1);
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// The BTH SE bit on the message's last packet, for a SEND or a WRITE with immediate: the
    /// receiver's CQ armed for solicited completions fires.
    pub const SOLICITED: SendFlags = SendFlags(4);
    pub const INLINE: SendFlags = SendFlags(8);
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}

/// `ibv_wr_opcode`, with each opcode's own fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrOpcode {
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        invalidate_rkey: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    AtomicCmpSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    AtomicFetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

impl WrOpcode {
    /// A SEND (with immediate, with invalidate): what rxe's `rdma_sends` counts.
    pub fn is_send(&self) -> bool {
        matches!(
            self,
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. }
        )
    }
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead { .. }
                | WrOpcode::AtomicCmpSwap { .. }
                | WrOpcode::AtomicFetchAdd { .. }
        )
    }
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpSwap { .. } | WrOpcode::AtomicFetchAdd { .. }
        )
    }
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::SendWithInv { .. } => {
                WcOpcode::Send
            }
            WrOpcode::RdmaWrite { .. } | WrOpcode::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}

/// The UD destination of a send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub ah: AhAttr,
    pub remote_qpn: Qpn,
    /// When its high bit is set, the QP's own Q_Key is sent instead (IBTA 3.5.3 in 1.2.1, as pib
    /// cites it; C10-15 per issue 20, unverified).
    pub remote_qkey: QKey,
}

/// A scatter/gather list, of a send or a receive: up to two entries stored inline (no
/// allocation per work request, no pointer to chase when the WQE executes), more on the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SgList {
    Inline { n: u8, sges: [Sge; 2] },
    Heap(Vec<Sge>),
}

impl Default for SgList {
    fn default() -> SgList {
        SgList::Inline {
            n: 0,
            sges: [Sge::default(); 2],
        }
    }
}

impl core::ops::Deref for SgList {
    type Target = [Sge];
    #[inline]
    fn deref(&self) -> &[Sge] {
        match self {
            SgList::Inline { n, sges } => &sges[..*n as usize],
            SgList::Heap(v) => v,
        }
    }
}

impl From<&[Sge]> for SgList {
    #[inline]
    fn from(s: &[Sge]) -> SgList {
        // Element by element: a slice copy of a variable length is a memcpy call, which costs
        // more than the one or two 16-byte SGEs of every work request.
        let d = Sge::default();
        let (n, sges) = match *s {
            [] => (0, [d, d]),
            [a] => (1, [a, d]),
            [a, b] => (2, [a, b]),
            _ => return SgList::Heap(s.to_vec()),
        };
        SgList::Inline { n, sges }
    }
}

impl From<Vec<Sge>> for SgList {
    fn from(v: Vec<Sge>) -> SgList {
        if v.len() <= 2 {
            SgList::from(&v[..])
        } else {
            SgList::Heap(v)
        }
    }
}

impl<const N: usize> From<[Sge; N]> for SgList {
    #[inline]
    fn from(a: [Sge; N]) -> SgList {
        SgList::from(&a[..])
    }
}

/// `ibv_send_wr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    pub sg_list: SgList,
    pub flags: SendFlags,
    /// For `SendFlags::INLINE`: the bytes themselves, copied at post time.
    pub inline_data: Vec<u8>,
    pub ud: Option<UdDest>,
}

impl SendWr {
    #[inline]
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: impl Into<SgList>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            sg_list: sg_list.into(),
            flags: SendFlags::SIGNALED,
            inline_data: Vec::new(),
            ud: None,
        }
    }
}

/// `ibv_recv_wr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    /// Up to two SGEs inline: posting a receive allocates nothing for them.
    pub sg_list: SgList,
}

/// `ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success,
    LocLenErr,
    LocQpOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    GeneralErr,
}

impl WcStatus {
    /// `ibv_wc_status_str`.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// `ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    Recv,
    RecvRdmaWithImm,
}

/// The sender's address from the 40-byte GRH area at the head of a UD receive (completed with
/// `WcFlags::GRH`): the IPv6 header, or for IPv4 20 zero bytes and then the IPv4 header, as the
/// responder writes it (rdma-core's RoCEv2 convention). `None` for anything else.
pub fn grh_source(area: &[u8]) -> Option<IpAddr> {
    if area.len() < 40 {
        return None;
    }
    if area[..20].iter().all(|&b| b == 0) && area[20] >> 4 == 4 {
        Some(IpAddr::V4(Ipv4Addr::new(
            area[32], area[33], area[34], area[35],
        )))
    } else if area[0] >> 4 == 6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&area[8..24]);
        Some(IpAddr::V6(Ipv6Addr::from(a)))
    } else {
        None
    }
}

/// `ibv_wc_flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    pub const GRH: WcFlags = WcFlags(1);
    pub const WITH_IMM: WcFlags = WcFlags(2);
    pub const WITH_INV: WcFlags = WcFlags(8);
    pub const fn contains(self, o: WcFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

/// `ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// Immediate data (host order), or the invalidated R_Key with `WITH_INV`.
    pub imm_data: u32,
    pub qp_num: Qpn,
    pub src_qp: Qpn,
    pub wc_flags: WcFlags,
    pub pkey_index: u16,
}

/// `ibv_device_attr`, the part RoCE applications look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: &'static str,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_mr_size: u64,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    /// `IBV_ATOMIC_HCA`: atomics are atomic with respect to this device.
    pub atomic_cap_hca: bool,
    pub max_pkeys: u16,
}

/// An asynchronous event (`ibv_get_async_event`), named after `ibv_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed and is in error.
    CqErr(CqId),
    /// `IBV_EVENT_QP_FATAL`: the QP went to ERR for a reason it cannot report in a completion
    /// (here: its CQ is in error).
    QpFatal(Qpn),
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ holds fewer WQEs than its armed `srq_limit`;
    /// the limit is disarmed (0) until `modify_srq` sets it again.
    SrqLimitReached(SrqId),
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP attached to an SRQ entered ERR; it takes no
    /// more WQEs from the SRQ (the one it was filling was flushed to its CQ).
    QpLastWqeReached(Qpn),
}

/// Why a verb was refused (the errno a real provider would return, in words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// EINVAL: an argument is out of range or inconsistent.
    Invalid(String),
    /// ENOMEM: a queue or table is full.
    NoSpace(&'static str),
    /// ENOENT: no such object.
    NotFound(&'static str),
    /// EBUSY: the object is still in use.
    Busy(&'static str),
    /// The CQ was full when a completion came: it is in error (`IBV_EVENT_CQ_ERR`), its
    /// completions since are lost and the QPs on it are in ERR.
    CqOverrun { cq: CqId, depth: usize },
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::Invalid(s) => write!(f, "invalid argument: {s}"),
            VerbsError::NoSpace(s) => write!(f, "no space: {s}"),
            VerbsError::NotFound(s) => write!(f, "not found: {s}"),
            VerbsError::Busy(s) => write!(f, "busy: {s}"),
            VerbsError::CqOverrun { cq, depth } => write!(
                f,
                "CQ overflow: CQ {} (depth {depth}) was full when a completion came; it is in \
                 error, completions were lost and its QPs are in ERR (IBV_EVENT_CQ_ERR): \
                 poll it more often or make it deeper",
                cq.0
            ),
        }
    }
}

impl std::error::Error for VerbsError {}

pub(crate) fn invalid<T>(s: impl Into<String>) -> Result<T, VerbsError> {
    Err(VerbsError::Invalid(s.into()))
}

/// The default P_Key table: one entry, the default partition.
pub const PKEY_TABLE: [PKey; 1] = [PKey::DEFAULT];
