//! The control agent: the verbs a scenario needs on the device under test, typed.
//!
//! The operations are ibverbs' (`ibv_alloc_pd`, `ibv_reg_mr`, `ibv_create_qp`, `ibv_modify_qp`,
//! `ibv_post_send`, `ibv_poll_cq`, …) reduced to what a packet-level test needs, with values a
//! small C agent over libibverbs can produce: numbers, short strings, hex. One [`Request`] gives
//! one [`Reply`] or an [`AgentError`]; [`Agent`] adds the typed calls on top of that single
//! method, so the in-process agent ([`crate::dut::SelfAgent`], over [`rnic::execute`]), the JSON-lines client
//! ([`client::JsonClient`]) and a wrapper that misbehaves on purpose all share them.
//!
//! The wire form is in [`json`] and `docs/agent-protocol.md`.
pub mod client;
pub mod cm;
pub mod json;
pub mod rnic;
pub mod server;

use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::eth::Mac;
use rocemu_wire::{Psn, QKey, Qpn, RKey};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// The protocol version this side speaks: 2 = version 1 plus the rdma_cm operations
/// (`docs/agent-protocol.md`, "Versions"). An agent also serves every older version.
pub const PROTOCOL_VERSION: u32 = 2;
/// The oldest version still served.
pub const MIN_PROTOCOL_VERSION: u32 = 1;
/// The first version with the `cm_*` operations.
pub const CM_PROTOCOL_VERSION: u32 = 2;

/// Why a request failed: the agent's words (a verbs error, a malformed request, a lost link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError(pub String);

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AgentError {}

impl From<String> for AgentError {
    fn from(s: String) -> AgentError {
        AgentError(s)
    }
}

impl From<&str> for AgentError {
    fn from(s: &str) -> AgentError {
        AgentError(s.to_string())
    }
}

pub type AgentResult<T> = Result<T, AgentError>;

/// What `hello` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    /// Who serves the protocol (`rocemu 0.1.0`, `ibv-agent rxe0`).
    pub agent: String,
}

/// What `query_device` answers: where the device is on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub mac: Mac,
    /// GID index i is `gids[i]`, as an IP address (IPv4-mapped GIDs as IPv4).
    pub gids: Vec<IpAddr>,
    /// The port's active MTU in bytes (256 … 4096).
    pub active_mtu: u32,
    /// Free text: the device name and firmware.
    pub name: String,
    /// Optional features the device says it has (`query_device`'s optional `caps`): `flush`
    /// (IBA 1.5 FLUSH), `atomic_write` (IBA 1.5 ATOMIC WRITE). Empty when the agent says nothing.
    pub caps: Vec<String>,
}

impl DeviceInfo {
    /// Whether the device says it has the optional feature `cap`.
    pub fn has(&self, cap: &str) -> bool {
        self.caps.iter().any(|c| c == cap)
    }
}

/// A registered memory region (`struct ibv_mr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub addr: u64,
    pub length: u64,
    pub lkey: u32,
    pub rkey: RKey,
}

/// `ibv_qp_init_attr`, flat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    pub pd: u32,
    pub qp_type: QpType,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub sq_sig_all: bool,
}

impl QpInit {
    /// A QP of `qp_type` on one CQ, 16 WRs and 1 SGE each way.
    pub fn new(pd: u32, qp_type: QpType, cq: u32) -> QpInit {
        QpInit {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
        }
    }
}

/// An address handle for RoCE: the destination GID (as an IP address) and the source GID index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ah {
    pub dgid: IpAddr,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

impl Ah {
    pub fn to(dgid: IpAddr) -> Ah {
        Ah {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
        }
    }
}

/// `ibv_modify_qp`: every attribute that is `Some` is set, and its bit joins the attribute mask
/// (`ah` stands for `IBV_QP_AV`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModifyQp {
    pub qp_state: Option<QpState>,
    pub dest_qp_num: Option<Qpn>,
    pub rq_psn: Option<Psn>,
    pub sq_psn: Option<Psn>,
    /// Bytes: 256 … 4096.
    pub path_mtu: Option<u32>,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    pub min_rnr_timer: Option<u8>,
    pub max_rd_atomic: Option<u8>,
    pub max_dest_rd_atomic: Option<u8>,
    pub qp_access_flags: Option<Access>,
    pub qkey: Option<QKey>,
    pub pkey_index: Option<u16>,
    pub port_num: Option<u8>,
    pub ah: Option<Ah>,
}

/// What `query_qp` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qp_state: QpState,
    pub dest_qp_num: Qpn,
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    pub path_mtu: u32,
    pub qkey: QKey,
    pub qp_access_flags: Access,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

/// `ibv_sge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `ibv_wr_opcode`, the ones the protocol knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOpcode {
    Send,
    SendWithImm,
    RdmaWrite,
    RdmaWriteWithImm,
    RdmaRead,
    AtomicCmpSwp,
    AtomicFetchAdd,
}

impl SendOpcode {
    pub const ALL: [SendOpcode; 7] = [
        SendOpcode::Send,
        SendOpcode::SendWithImm,
        SendOpcode::RdmaWrite,
        SendOpcode::RdmaWriteWithImm,
        SendOpcode::RdmaRead,
        SendOpcode::AtomicCmpSwp,
        SendOpcode::AtomicFetchAdd,
    ];
    /// The protocol's name (ibverbs' `IBV_WR_*`, lower case, without the prefix).
    pub fn name(self) -> &'static str {
        match self {
            SendOpcode::Send => "send",
            SendOpcode::SendWithImm => "send_with_imm",
            SendOpcode::RdmaWrite => "rdma_write",
            SendOpcode::RdmaWriteWithImm => "rdma_write_with_imm",
            SendOpcode::RdmaRead => "rdma_read",
            SendOpcode::AtomicCmpSwp => "atomic_cmp_and_swp",
            SendOpcode::AtomicFetchAdd => "atomic_fetch_and_add",
        }
    }
    /// Also takes the short names `atomic_cmp_swp` and `atomic_fetch_add`.
    pub fn from_name(s: &str) -> Option<SendOpcode> {
        match s {
            "atomic_cmp_swp" => Some(SendOpcode::AtomicCmpSwp),
            "atomic_fetch_add" => Some(SendOpcode::AtomicFetchAdd),
            _ => SendOpcode::ALL.into_iter().find(|o| o.name() == s),
        }
    }
}

/// The destination of a UD send (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub ah: Ah,
    pub remote_qpn: Qpn,
    pub remote_qkey: QKey,
}

/// `ibv_send_wr`, flat: the fields an opcode does not use are ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: SendOpcode,
    pub sg: Vec<Sge>,
    pub remote_addr: u64,
    pub rkey: RKey,
    pub imm_data: u32,
    /// The compare value of a CMP_SWAP, the addend of a FETCH_ADD.
    pub compare_add: u64,
    pub swap: u64,
    pub signaled: bool,
    /// IBV_SEND_FENCE: not sent before the READs and atomics posted ahead of it complete.
    pub fence: bool,
    pub ud: Option<UdDest>,
    /// `IBV_SEND_SOLICITED`: the last packet of the message carries the BTH SE bit.
    pub solicited: bool,
}

impl SendWr {
    /// A signaled work request of `opcode` over `sg`, every other field zero.
    pub fn new(wr_id: u64, opcode: SendOpcode, sg: Vec<Sge>) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            sg,
            remote_addr: 0,
            rkey: RKey(0),
            imm_data: 0,
            compare_add: 0,
            swap: 0,
            signaled: true,
            fence: false,
            ud: None,
            solicited: false,
        }
    }
}

/// `ibv_recv_wr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg: Vec<Sge>,
}

/// `ibv_wc`, with ibverbs' enum names as strings (`IBV_WC_REM_ACCESS_ERR`, `IBV_WC_RECV`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: String,
    pub opcode: String,
    pub byte_len: u32,
    /// Present with `IBV_WC_WITH_IMM`.
    pub imm_data: Option<u32>,
    pub qp_num: Qpn,
    pub src_qp: Qpn,
    pub wc_flags: u32,
}

impl WorkCompletion {
    pub fn is_success(&self) -> bool {
        self.status == "IBV_WC_SUCCESS"
    }
}

impl fmt::Display for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wr_id={} {} {} byte_len={}",
            self.wr_id, self.status, self.opcode, self.byte_len
        )
    }
}

/// Where an accepted rdma_cm connection stands (the last `rdma_cm` event about it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmConnState {
    /// REP sent (`rdma_accept` done), no RTU yet.
    Connecting,
    /// RTU received (`RDMA_CM_EVENT_ESTABLISHED`).
    Established,
    /// Ended by the peer's DREQ or by our DREQ's DREP (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected,
    /// The peer answered our REP with a REJ (`RDMA_CM_EVENT_REJECTED`).
    Rejected,
    /// No RTU or DREP came, or the device failed (`RDMA_CM_EVENT_CONNECT_ERROR` and the like).
    Error,
}

impl CmConnState {
    pub const ALL: [CmConnState; 5] = [
        CmConnState::Connecting,
        CmConnState::Established,
        CmConnState::Disconnected,
        CmConnState::Rejected,
        CmConnState::Error,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CmConnState::Connecting => "connecting",
            CmConnState::Established => "established",
            CmConnState::Disconnected => "disconnected",
            CmConnState::Rejected => "rejected",
            CmConnState::Error => "error",
        }
    }
    pub fn from_name(s: &str) -> Option<CmConnState> {
        CmConnState::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// One connection the device's CM accepted on a `cm_listen` port, with an RC QP of the agent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConn {
    /// The rdma_cm port (service ID 0x0000000001060000 | port) it came in on.
    pub port: u16,
    /// The local RC QP.
    pub qpn: Qpn,
    /// The Starting PSN the device's CM chose and sent in its REP: the PSN it expects first
    /// (the QP's `rq_psn`), the one a packet injected into the connection must carry.
    pub psn: Psn,
    /// The PSN the QP sends from (`sq_psn`): the REQ's Starting PSN, the peer's choice.
    pub sq_psn: Psn,
    /// The peer's QP (the REQ's Local QPN).
    pub remote_qpn: Qpn,
    /// The peer's address.
    pub peer: IpAddr,
    pub state: CmConnState,
}

/// One request of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello {
        version: u32,
    },
    QueryDevice,
    AllocPd,
    DeallocPd {
        pd: u32,
    },
    RegMr {
        pd: u32,
        length: u64,
        access: Access,
    },
    DeregMr {
        lkey: u32,
    },
    WriteMr {
        lkey: u32,
        offset: u64,
        data: Vec<u8>,
    },
    ReadMr {
        lkey: u32,
        offset: u64,
        length: u64,
    },
    CreateCq {
        cqe: u32,
    },
    DestroyCq {
        cq: u32,
    },
    CreateQp(QpInit),
    ModifyQp {
        qpn: Qpn,
        attr: ModifyQp,
    },
    QueryQp {
        qpn: Qpn,
    },
    DestroyQp {
        qpn: Qpn,
    },
    PostSend {
        qpn: Qpn,
        wr: SendWr,
    },
    PostRecv {
        qpn: Qpn,
        wr: RecvWr,
    },
    /// Up to `max` completions; waits up to `wait_ms` for at least `min` of them.
    PollCq {
        cq: u32,
        max: u32,
        min: u32,
        wait_ms: u64,
    },
    /// Destroys everything this session created.
    Reset,
    /// Version 2: accept every rdma_cm connection request for `port` (service ID
    /// 0x0000000001060000 | port) with an RC QP of the agent's, the device's CM choosing the
    /// starting PSN.
    CmListen {
        port: u16,
    },
    /// Version 2: the connections accepted so far, oldest first.
    CmConnections,
    /// Version 2: ends the connection of the local QP `qpn` (a DREQ if it is established, a
    /// REJ while it is connecting) and destroys its QP.
    CmDisconnect {
        qpn: Qpn,
    },
    /// Version 2: stops listening on `port` and ends every connection accepted there.
    CmStop {
        port: u16,
    },
}

impl Request {
    /// The protocol's name of the operation.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::QueryDevice => "query_device",
            Request::AllocPd => "alloc_pd",
            Request::DeallocPd { .. } => "dealloc_pd",
            Request::RegMr { .. } => "reg_mr",
            Request::DeregMr { .. } => "dereg_mr",
            Request::WriteMr { .. } => "write_mr",
            Request::ReadMr { .. } => "read_mr",
            Request::CreateCq { .. } => "create_cq",
            Request::DestroyCq { .. } => "destroy_cq",
            Request::CreateQp(_) => "create_qp",
            Request::ModifyQp { .. } => "modify_qp",
            Request::QueryQp { .. } => "query_qp",
            Request::DestroyQp { .. } => "destroy_qp",
            Request::PostSend { .. } => "post_send",
            Request::PostRecv { .. } => "post_recv",
            Request::PollCq { .. } => "poll_cq",
            Request::Reset => "reset",
            Request::CmListen { .. } => "cm_listen",
            Request::CmConnections => "cm_connections",
            Request::CmDisconnect { .. } => "cm_disconnect",
            Request::CmStop { .. } => "cm_stop",
        }
    }

    /// The protocol version that introduced the operation.
    pub fn since_version(&self) -> u32 {
        match self {
            Request::CmListen { .. }
            | Request::CmConnections
            | Request::CmDisconnect { .. }
            | Request::CmStop { .. } => CM_PROTOCOL_VERSION,
            _ => 1,
        }
    }
}

/// One answer. Which variant comes back is fixed by the request's operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Hello(Hello),
    Device(DeviceInfo),
    Pd(u32),
    Mr(MrInfo),
    Data(Vec<u8>),
    Cq(u32),
    Qp(Qpn),
    QpAttr(QpInfo),
    Wcs(Vec<WorkCompletion>),
    CmConns(Vec<CmConn>),
    Done,
}

pub(crate) fn unexpected<T>(r: Reply) -> AgentResult<T> {
    Err(AgentError(format!("agent answered with {r:?}")))
}

/// A device under test's control channel. Implementations provide [`Agent::call`]; the typed
/// calls are built on it.
pub trait Agent {
    fn call(&mut self, req: Request) -> AgentResult<Reply>;

    fn hello(&mut self) -> AgentResult<Hello> {
        match self.call(Request::Hello {
            version: PROTOCOL_VERSION,
        })? {
            Reply::Hello(h) => Ok(h),
            r => unexpected(r),
        }
    }
    fn query_device(&mut self) -> AgentResult<DeviceInfo> {
        match self.call(Request::QueryDevice)? {
            Reply::Device(d) => Ok(d),
            r => unexpected(r),
        }
    }
    fn alloc_pd(&mut self) -> AgentResult<u32> {
        match self.call(Request::AllocPd)? {
            Reply::Pd(p) => Ok(p),
            r => unexpected(r),
        }
    }
    fn reg_mr(&mut self, pd: u32, length: u64, access: Access) -> AgentResult<MrInfo> {
        match self.call(Request::RegMr { pd, length, access })? {
            Reply::Mr(m) => Ok(m),
            r => unexpected(r),
        }
    }
    fn dereg_mr(&mut self, lkey: u32) -> AgentResult<()> {
        self.call(Request::DeregMr { lkey }).map(|_| ())
    }
    fn write_mr(&mut self, lkey: u32, offset: u64, data: &[u8]) -> AgentResult<()> {
        self.call(Request::WriteMr {
            lkey,
            offset,
            data: data.to_vec(),
        })
        .map(|_| ())
    }
    fn read_mr(&mut self, lkey: u32, offset: u64, length: u64) -> AgentResult<Vec<u8>> {
        match self.call(Request::ReadMr {
            lkey,
            offset,
            length,
        })? {
            Reply::Data(d) => Ok(d),
            r => unexpected(r),
        }
    }
    fn create_cq(&mut self, cqe: u32) -> AgentResult<u32> {
        match self.call(Request::CreateCq { cqe })? {
            Reply::Cq(c) => Ok(c),
            r => unexpected(r),
        }
    }
    fn create_qp(&mut self, init: QpInit) -> AgentResult<Qpn> {
        match self.call(Request::CreateQp(init))? {
            Reply::Qp(q) => Ok(q),
            r => unexpected(r),
        }
    }
    fn modify_qp(&mut self, qpn: Qpn, attr: ModifyQp) -> AgentResult<()> {
        self.call(Request::ModifyQp { qpn, attr }).map(|_| ())
    }
    fn query_qp(&mut self, qpn: Qpn) -> AgentResult<QpInfo> {
        match self.call(Request::QueryQp { qpn })? {
            Reply::QpAttr(a) => Ok(a),
            r => unexpected(r),
        }
    }
    fn destroy_qp(&mut self, qpn: Qpn) -> AgentResult<()> {
        self.call(Request::DestroyQp { qpn }).map(|_| ())
    }
    fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> AgentResult<()> {
        self.call(Request::PostSend { qpn, wr }).map(|_| ())
    }
    fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> AgentResult<()> {
        self.call(Request::PostRecv { qpn, wr }).map(|_| ())
    }
    /// Up to `max` completions, waiting up to `wait` for at least `min`.
    fn poll_cq(
        &mut self,
        cq: u32,
        max: u32,
        min: u32,
        wait: Duration,
    ) -> AgentResult<Vec<WorkCompletion>> {
        match self.call(Request::PollCq {
            cq,
            max,
            min,
            wait_ms: wait.as_millis() as u64,
        })? {
            Reply::Wcs(w) => Ok(w),
            r => unexpected(r),
        }
    }
    fn reset(&mut self) -> AgentResult<()> {
        self.call(Request::Reset).map(|_| ())
    }
    fn cm_listen(&mut self, port: u16) -> AgentResult<()> {
        self.call(Request::CmListen { port }).map(|_| ())
    }
    fn cm_connections(&mut self) -> AgentResult<Vec<CmConn>> {
        match self.call(Request::CmConnections)? {
            Reply::CmConns(c) => Ok(c),
            r => unexpected(r),
        }
    }
    fn cm_disconnect(&mut self, qpn: Qpn) -> AgentResult<()> {
        self.call(Request::CmDisconnect { qpn }).map(|_| ())
    }
    fn cm_stop(&mut self, port: u16) -> AgentResult<()> {
        self.call(Request::CmStop { port }).map(|_| ())
    }
}

impl<A: Agent + ?Sized> Agent for Box<A> {
    fn call(&mut self, req: Request) -> AgentResult<Reply> {
        (**self).call(req)
    }
}

/// ibverbs' `IBV_QPS_*` name of a state, lower case without the prefix (`rts`).
pub fn qp_state_name(s: QpState) -> &'static str {
    match s {
        QpState::Reset => "reset",
        QpState::Init => "init",
        QpState::Rtr => "rtr",
        QpState::Rts => "rts",
        QpState::Sqd => "sqd",
        QpState::Sqe => "sqe",
        QpState::Err => "err",
    }
}

pub fn qp_state_from_name(s: &str) -> Option<QpState> {
    [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ]
    .into_iter()
    .find(|q| qp_state_name(*q) == s)
}

pub fn qp_type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
    }
}

pub fn qp_type_from_name(s: &str) -> Option<QpType> {
    [QpType::Rc, QpType::Uc, QpType::Ud]
        .into_iter()
        .find(|q| qp_type_name(*q) == s)
}
