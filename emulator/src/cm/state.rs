//! The CM's vocabulary and its bookkeeping: connection states and events, what a connection
//! says about itself, the counters, and the per-connection record with the timer and backlog
//! book kept beside it. Invariant: a connection's state and deadline change only through
//! [`Book`], so that `Book::timers` holds exactly the deadlines set and `Book::half_open`
//! counts exactly the passive connections not yet established.
#[cfg(doc)]
use super::CmAgent;
use crate::time::Nanos;
use rocemu_wire::cm::{private_len, CmMadRepr, CommId, RejReason, ReqRepr, ServiceId, SidrStatus};
use rocemu_wire::mad::Tid;
use rocemu_wire::{Psn, QKey, Qpn};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// A connection's state (IBTA 12.9.6, unverified, the parts a RoCE endpoint walks through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Active side: REQ sent, waiting for REP or REJ.
    ReqSent,
    /// Passive side: REQ received and reported, waiting for the application.
    ReqRcvd,
    /// Passive side: REP sent, waiting for RTU.
    RepSent,
    /// Active side, [`ConnParams::defer_rtu`]: REP received and reported
    /// ([`CmEvent::RepReceived`]), no RTU sent until [`CmAgent::establish`] (IBTA's REP
    /// Received state; Linux `IB_CM_REP_RCVD`, librdmacm's `rdma_establish`).
    RepRcvd,
    Established,
    DreqSent,
    /// Closed; kept until the peer's retransmissions have died down. A SIDR request we
    /// answered waits here too, to answer the requester's repeats with the same SIDR_REP.
    TimeWait,
    /// Active side of service ID resolution (IBTA 12.11, unverified): SIDR_REQ sent, waiting for
    /// the SIDR_REP ([`CmAgent::sidr_request`]).
    SidrReqSent,
    /// Passive side of service ID resolution: SIDR_REQ received and reported
    /// ([`CmEvent::SidrRequest`]), waiting for [`CmAgent::sidr_reply`]. Counted against
    /// [`CmAgent::max_half_open`] like a REQ.
    SidrReqRcvd,
}

/// What the agent reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on: answer with [`CmAgent::accept`] or [`CmAgent::reject`]
    /// (with [`CmAgent::mra_on_req`] set, an MRA has already gone back).
    ConnectRequest {
        id: CommId,
        from: IpAddr,
        req: Box<ReqRepr>,
    },
    /// Active side: the REP came (RTU sent); the QP may go to RTR/RTS with these values.
    /// Passive side: the RTU came; the QP may go to RTS.
    Established {
        id: CommId,
        remote_qpn: Qpn,
        remote_psn: Psn,
        /// Active side: the REP's responder resources and initiator depth, the reads/atomics
        /// the passive side accepts and keeps in flight (this end's `max_rd_atomic` is at most
        /// the first). Passive side: None (it chose its own in [`CmAgent::accept`]).
        rep_rd_atomic: Option<(u8, u8)>,
        /// What the peer's message carried, whole (its length is not on the wire): active
        /// side, the REP's 196 bytes of private data; passive side, the first 196 of the
        /// RTU's 224 (rdma_cm sends none in an RTU; the last 28 are dropped).
        private_data: Box<[u8; private_len::REP]>,
    },
    /// Active side, [`ConnParams::defer_rtu`]: the REP came and no RTU was sent. Bring the QP
    /// to RTR/RTS with these values, then call [`CmAgent::establish`]; no `Established`
    /// event follows.
    RepReceived {
        id: CommId,
        remote_qpn: Qpn,
        remote_psn: Psn,
        /// The REP's responder resources and initiator depth (see `Established`).
        rep_rd_atomic: (u8, u8),
        /// The REP's 196 bytes of private data.
        private_data: Box<[u8; private_len::REP]>,
    },
    /// The peer sent a REJ for our REQ or REP (or, [`ConnParams::defer_rtu`], took its REP
    /// back before our RTU).
    Rejected {
        id: CommId,
        reason: RejReason,
        /// The REJ's 148 bytes of private data.
        private_data: Box<[u8; private_len::REJ]>,
    },
    /// The peer sent DREQ (answered) or DREP.
    Disconnected { id: CommId },
    /// An expected answer never came (REP, RTU, DREP, SIDR_REP), or a request the
    /// application had taken was forgotten unanswered (a REQ or SIDR_REQ after
    /// [`CmAgent::half_open_timeout`], a deferred RTU never sent).
    Timeout { id: CommId },
    /// A SIDR_REQ for a service we listen on: answer with [`CmAgent::sidr_reply`] (or
    /// [`CmAgent::reject`], a SIDR_REP with status REJECT).
    SidrRequest {
        id: CommId,
        from: IpAddr,
        service: ServiceId,
        /// The SIDR_REQ's 216 bytes of private data (rdma_cm's header for `RDMA_PS_UDP`
        /// first, as in a REQ).
        private_data: Box<[u8; private_len::SIDR_REQ]>,
    },
    /// The answer to our [`CmAgent::sidr_request`]: the QPN and Q_Key behind the service
    /// when `status` is [`SidrStatus::SUCCESS`].
    SidrReply {
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        /// The SIDR_REP's 136 bytes of private data.
        private_data: Box<[u8; private_len::SIDR_REP]>,
    },
}

/// What a connection needs to say about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    pub qpn: Qpn,
    /// The Starting PSN this end announces: the PSN it expects to receive first, which the peer
    /// sends from (how Linux fills REQ and REP; `wire/tests/data/cm/rping.pcap`).
    pub psn: Psn,
    /// `enum ibv_mtu` (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// rdma_cm's REQ private data (its 36-byte header, then the application's).
    pub private_data: [u8; 92],
    /// What [`CmAgent::accept`] puts in the REP's private data (rdma_cm puts no header
    /// there: the application's bytes, zero padded).
    pub rep_private_data: [u8; 196],
    /// [`CmAgent::connect`] only: when the REP comes, report [`CmEvent::RepReceived`] and
    /// wait for [`CmAgent::establish`] before sending the RTU (librdmacm's `rdma_establish`,
    /// for an application that moves its own QP to RTR/RTS). False: the RTU goes at once.
    pub defer_rtu: bool,
    /// The primary path's flow label in a REQ: rdma_cm's is
    /// [`rocemu_wire::cm::rdma_cm_flow_label`] of the two ports, and both ends derive the
    /// connection's UDP source port from it.
    pub flow_label: u32,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            qpn: Qpn::new(0),
            psn: Psn::new(0),
            path_mtu: 3,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: [0; 92],
            rep_private_data: [0; 196],
            defer_rtu: false,
            flow_label: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Conn {
    pub(super) state: CmState,
    pub(super) remote_comm_id: CommId,
    pub(super) peer: IpAddr,
    pub(super) tid: Tid,
    pub(super) local_qpn: Qpn,
    pub(super) remote_qpn: Qpn,
    pub(super) remote_psn: Psn,
    /// The last message that expects an answer, for retransmission.
    pub(super) pending: Option<CmMadRepr>,
    pub(super) retries_left: u8,
    /// When the timer fires: a retransmission (REQ, REP, DREQ), the end of a half-open
    /// connection's age (`ReqRcvd`), or the end of time-wait. Mirrored in `Book::timers`.
    pub(super) deadline: Option<Nanos>,
    /// The last answer we gave (MRA, REP, RTU, DREP, SIDR_REP), sent again when the peer
    /// repeats itself.
    pub(super) last_answer: Option<CmMadRepr>,
    /// Active side: hold the RTU for [`CmAgent::establish`].
    pub(super) defer_rtu: bool,
    /// An MRA for the message in `pending` has stretched the current wait; later MRAs for it
    /// do not stretch it again (Linux: the `IB_CM_MRA_REQ_RCVD` / `IB_CM_MRA_REP_RCVD` states).
    pub(super) mra_received: bool,
    /// SIDR: the service asked for (a SIDR_REP names it again).
    pub(super) service: ServiceId,
    /// A service ID resolution, not a connection: indexed by (peer, request id) apart from the
    /// connections, so that a peer's REQ comm id and SIDR request id cannot be taken for one
    /// another.
    pub(super) sidr: bool,
}

impl Conn {
    /// A record in `state` with `peer`, under the transaction `tid`, nothing else known yet.
    pub(super) fn new(state: CmState, peer: IpAddr, tid: Tid) -> Conn {
        Conn {
            state,
            remote_comm_id: CommId(0),
            peer,
            tid,
            local_qpn: Qpn::new(0),
            remote_qpn: Qpn::new(0),
            remote_psn: Psn::new(0),
            pending: None,
            retries_left: 0,
            deadline: None,
            last_answer: None,
            defer_rtu: false,
            mra_received: false,
            service: ServiceId(0),
            sidr: false,
        }
    }
}

impl CmState {
    /// Passive side, not yet established: what the listen backlog bounds.
    pub(super) fn is_half_open(self) -> bool {
        matches!(
            self,
            CmState::ReqRcvd | CmState::RepSent | CmState::SidrReqRcvd
        )
    }
}

/// What the agent counts: what a flood or a forger costs, and what was thrown away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// REQs received, repeats not included (those refused too).
    pub reqs_received: u64,
    /// Retransmitted REQs of a connection we have (answered again or ignored).
    pub reqs_duplicate: u64,
    /// REQs refused (REJ consumer-defined) because [`CmAgent::max_half_open`] were pending.
    pub reqs_rejected_backlog: u64,
    /// REQs for a service nobody listens on (REJ invalid service ID).
    pub reqs_no_listener: u64,
    /// Half-open connections forgotten: a REQ the application never answered within
    /// [`CmAgent::half_open_timeout`].
    pub half_open_expired: u64,
    /// Connections whose peer stopped answering our REQ, REP or DREQ.
    pub timeouts: u64,
    /// Connections forgotten at the end of time-wait.
    pub time_wait_reaped: u64,
    /// MADs that did not parse as CM MADs.
    pub malformed: u64,
    /// MRAs received for our REQ or REP (the first stretched the wait; repeats did not).
    pub mras_received: u64,
    /// MRAs sent ([`CmAgent::mra_on_req`]): at a REQ's arrival and for each repeat of it.
    pub mras_sent: u64,
    /// Active connections forgotten in [`CmState::RepRcvd`]: the application never called
    /// [`CmAgent::establish`] within [`CmAgent::half_open_timeout`].
    pub establish_expired: u64,
    /// SIDR_REQs received, repeats not included (those refused too).
    pub sidr_reqs_received: u64,
    /// Repeated SIDR_REQs of a request we hold (answered again or ignored).
    pub sidr_reqs_duplicate: u64,
    /// SIDR_REQs for a service nobody listens on (SIDR_REP status UNSUPPORTED, nothing kept).
    pub sidr_reqs_no_listener: u64,
    /// SIDR_REQs refused (SIDR_REP status REJECT) because [`CmAgent::max_half_open`] were
    /// pending.
    pub sidr_reqs_rejected_backlog: u64,
    /// REP, RTU, REJ, DREP (and DREQ, answered anyway) naming a connection we do not have, or
    /// one whose remote comm id or state does not fit.
    pub unknown_connection: u64,
}

/// The bookkeeping kept beside the connections: the timers, ordered by (deadline, comm id) so
/// that what falls due at one instant is handled in one order on every run, and the number of
/// half-open connections.
#[derive(Debug, Default)]
pub(super) struct Book {
    pub(super) timers: BTreeSet<(Nanos, u32)>,
    pub(super) half_open: usize,
}

impl Book {
    /// Connection `id` moves to `s` (logged, `crate::logs`).
    pub(super) fn set_state(&mut self, id: u32, c: &mut Conn, s: CmState) {
        if c.state != s {
            tracing::debug!(
                cm_id = %CommId(id),
                peer = %c.peer,
                qpn = %c.local_qpn,
                from = ?c.state,
                to = ?s,
                "CM state changed"
            );
        }
        self.count_state(c, s);
    }

    /// `c.state = s`, with the half-open count kept.
    pub(super) fn count_state(&mut self, c: &mut Conn, s: CmState) {
        if c.state.is_half_open() {
            self.half_open -= 1;
        }
        if s.is_half_open() {
            self.half_open += 1;
        }
        c.state = s;
    }

    pub(super) fn set_deadline(&mut self, id: u32, c: &mut Conn, d: Option<Nanos>) {
        if let Some(old) = c.deadline {
            self.timers.remove(&(old, id));
        }
        if let Some(new) = d {
            self.timers.insert((new, id));
        }
        c.deadline = d;
    }

    /// Closed: nothing left to retransmit; forgotten at `until`.
    pub(super) fn time_wait(&mut self, id: u32, c: &mut Conn, until: Nanos) {
        self.set_state(id, c, CmState::TimeWait);
        c.pending = None;
        self.set_deadline(id, c, Some(until));
    }
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> CommId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::Established { id, .. }
            | CmEvent::RepReceived { id, .. }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Disconnected { id }
            | CmEvent::Timeout { id }
            | CmEvent::SidrRequest { id, .. }
            | CmEvent::SidrReply { id, .. } => *id,
        }
    }
}
