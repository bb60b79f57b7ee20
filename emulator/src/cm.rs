//! The IB communication manager (IBTA Vol. 1 12.6–12.9) as `rdma_cm` uses it on RoCE: a sans-IO
//! agent that turns connect / listen / accept / disconnect into REQ, REP, RTU, REJ, DREQ and DREP
//! MADs, retransmits them on its own timers, and reports what the peer did as events.
//!
//! It sits beside the RNIC, not inside it: MADs reach it as the payloads of UD receives on QP1
//! (`Rnic::create_gsi_qp`), and what it wants sent goes out as UD SENDs from QP1 to the peer's
//! QP1 with the GSI Q_Key 0x80010000. Moving the data QPs through RTR and RTS with what the
//! messages carry (QPN, starting PSN, path MTU) is the caller's part, as in librdmacm.
//!
//! Invariants:
//! * Nothing the wire brings panics it: a MAD that does not parse, names a connection we do not
//!   have, or comes in the wrong state is dropped (or answered with a REJ where IBTA says so).
//! * Every message that expects an answer (REQ, REP, DREQ) is sent again every
//!   4.096 µs × 2^`cm_response_timeout` until answered, at most `max_cm_retries` times; then the
//!   connection ends with [`CmEvent::Timeout`].
//! * Time comes in as `now`; randomness (communication IDs, transaction IDs) from the seed.
//!   Nothing depends on a hasher's order: connections are kept in a `BTreeMap` and timers fire
//!   in (deadline, comm id) order, so one seed and one input give one history.
//! * The state is bounded by what the application keeps, not by what peers send: at most
//!   [`CmAgent::max_half_open`] passive connections wait for accept or RTU (further REQs are
//!   refused, nothing kept); a REQ the application leaves unanswered is forgotten after
//!   [`CmAgent::half_open_timeout`]; an unanswered REP ends after its retries; a closed
//!   connection is forgotten after [`CmAgent::time_wait`]. A repeated REQ is found by
//!   (peer, remote comm id) in O(1). What was refused or thrown away is in [`CmCounters`].
//!
//! Not yet: MRA, LAP/APR (alternate paths), SIDR, and the time-wait state's stale-connection
//! checks. `rocemu-tools`' `rdmacm` wires it to an engine for `rocemu rping`, `perf -R` and
//! `pingpong --rdma-cm`; the conformance agent (`rocemu-conformance`, `agent::cm`) to its RNIC.
use crate::rng::{KeyRng, Seed};
use crate::time::Nanos;
use rocemu_wire::cm::{
    CmMadRepr, CmMessage, CmPath, CommId, DreqRepr, Guid, MsgKind, RejReason, RejRepr, RepRepr,
    ReqRepr, RtuRepr, ServiceId, ServiceType,
};
use rocemu_wire::mad::{timeout_nanos, Tid, MAD_LEN};
use rocemu_wire::{PKey, Psn, QKey, Qpn};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};

/// A connection's state (IBTA 12.9.6, the parts a RoCE endpoint walks through).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Active side: REQ sent, waiting for REP or REJ.
    ReqSent,
    /// Passive side: REQ received and reported, waiting for the application.
    ReqRcvd,
    /// Passive side: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    /// Closed; kept until the peer's retransmissions have died down.
    TimeWait,
}

/// What the agent reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service we listen on: answer with [`CmAgent::accept`] or [`CmAgent::reject`].
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
    },
    Rejected {
        id: CommId,
        reason: RejReason,
    },
    /// The peer sent DREQ (answered) or DREP.
    Disconnected {
        id: CommId,
    },
    /// An expected answer never came.
    Timeout {
        id: CommId,
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
            flow_label: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Conn {
    state: CmState,
    remote_comm_id: CommId,
    peer: IpAddr,
    tid: Tid,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    remote_psn: Psn,
    /// The last message that expects an answer, for retransmission.
    pending: Option<CmMadRepr>,
    retries_left: u8,
    /// When the timer fires: a retransmission (REQ, REP, DREQ), the end of a half-open
    /// connection's age (`ReqRcvd`), or the end of time-wait. Mirrored in `Book::timers`.
    deadline: Option<Nanos>,
    /// The last answer we gave (REP, RTU, DREP), sent again when the peer repeats itself.
    last_answer: Option<CmMadRepr>,
}

impl CmState {
    /// Passive side, not yet established: what the listen backlog bounds.
    fn is_half_open(self) -> bool {
        matches!(self, CmState::ReqRcvd | CmState::RepSent)
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
    /// REP, RTU, REJ, DREP (and DREQ, answered anyway) naming a connection we do not have, or
    /// one whose remote comm id or state does not fit.
    pub unknown_connection: u64,
}

/// The bookkeeping kept beside the connections: the timers, ordered by (deadline, comm id) so
/// that what falls due at one instant is handled in one order on every run, and the number of
/// half-open connections.
#[derive(Debug, Default)]
struct Book {
    timers: BTreeSet<(Nanos, u32)>,
    half_open: usize,
}

impl Book {
    fn set_state(&mut self, c: &mut Conn, s: CmState) {
        if c.state.is_half_open() {
            self.half_open -= 1;
        }
        if s.is_half_open() {
            self.half_open += 1;
        }
        c.state = s;
    }

    fn set_deadline(&mut self, id: u32, c: &mut Conn, d: Option<Nanos>) {
        if let Some(old) = c.deadline {
            self.timers.remove(&(old, id));
        }
        if let Some(new) = d {
            self.timers.insert((new, id));
        }
        c.deadline = d;
    }

    /// Closed: nothing left to retransmit; forgotten at `until`.
    fn time_wait(&mut self, id: u32, c: &mut Conn, until: Nanos) {
        self.set_state(c, CmState::TimeWait);
        c.pending = None;
        self.set_deadline(id, c, Some(until));
    }
}

/// Connection manager for one port.
#[derive(Debug)]
pub struct CmAgent {
    local_ip: IpAddr,
    guid: Guid,
    /// Communication and transaction IDs: a peer must not guess the next one (a forged REJ or
    /// DREQ names them).
    rng: KeyRng,
    /// 5-bit exponent: how long to wait for an answer (Linux uses 20: about 4.3 s).
    pub cm_response_timeout: u8,
    pub max_cm_retries: u8,
    /// The listen backlog: at most this many passive connections not yet established (REQ
    /// received, REP sent); REQs beyond it are refused. [`CmAgent::DEFAULT_MAX_HALF_OPEN`].
    pub max_half_open: usize,
    /// How long a REQ may wait for the application's accept or reject before it is forgotten.
    /// [`CmAgent::DEFAULT_HALF_OPEN_TIMEOUT`].
    pub half_open_timeout: Nanos,
    /// How long a closed connection is kept to answer the peer's repeats (a lost DREP, RTU)
    /// before it is forgotten. [`CmAgent::DEFAULT_TIME_WAIT`].
    pub time_wait: Nanos,
    listens: Vec<ServiceId>,
    /// By local comm id: a `BTreeMap`, so that nothing depends on a hasher's order.
    conns: BTreeMap<u32, Conn>,
    /// (peer, remote comm id) → local comm id, for connections whose remote id is known: a
    /// repeated REQ is found in O(1) (IBTA 12.9.5.1 identifies a REQ by both).
    by_remote: HashMap<(IpAddr, u32), u32>,
    book: Book,
    counters: CmCounters,
    /// The latest `now` seen, for the calls that take none (`reject`, `close`).
    now: Nanos,
    out: VecDeque<(IpAddr, CmMadRepr)>,
    events: VecDeque<CmEvent>,
}

fn gid(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

impl CmAgent {
    /// The listen backlog's default: Linux's historic `SOMAXCONN`.
    pub const DEFAULT_MAX_HALF_OPEN: usize = 128;
    /// A REQ's default age limit: 16 s, more than three of the active side's default response
    /// timeouts (4.3 s each), so a REQ retransmitted once or twice is still the same one.
    pub const DEFAULT_HALF_OPEN_TIMEOUT: Nanos = Nanos::from_millis(16_000);
    /// Time-wait's default: one CM response timeout at Linux's exponent 20 (4.096 µs × 2^20 ≈
    /// 4.3 s), the interval the peer retransmits at, so its repeat of the last message (DREQ
    /// for a lost DREP, REP for a lost RTU) still finds the connection; a bounded stay, where
    /// Linux's ib_cm derives its own from the path's packet lifetime (unverified).
    pub const DEFAULT_TIME_WAIT: Nanos = Nanos(4_294_967_296);

    /// An agent whose IDs replay from `seed` (the simulator, tests).
    pub fn new(local_ip: IpAddr, guid: u64, seed: u64) -> CmAgent {
        CmAgent::with_seed(local_ip, guid, &Seed::from_u64(seed))
    }

    /// An agent whose IDs come from `seed`: in deployment, one drawn from the RNIC's generator
    /// ([`Rnic::random_seed`](crate::rnic::Rnic::random_seed)).
    pub fn with_seed(local_ip: IpAddr, guid: u64, seed: &Seed) -> CmAgent {
        CmAgent {
            local_ip,
            guid: Guid(guid),
            rng: KeyRng::new(seed),
            cm_response_timeout: 20,
            max_cm_retries: 15,
            max_half_open: Self::DEFAULT_MAX_HALF_OPEN,
            half_open_timeout: Self::DEFAULT_HALF_OPEN_TIMEOUT,
            time_wait: Self::DEFAULT_TIME_WAIT,
            listens: Vec::new(),
            conns: BTreeMap::new(),
            by_remote: HashMap::new(),
            book: Book::default(),
            counters: CmCounters::default(),
            now: Nanos::ZERO,
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Accept REQs for `service`.
    pub fn listen(&mut self, service: ServiceId) {
        if !self.listens.contains(&service) {
            self.listens.push(service);
        }
    }

    /// Stops accepting REQs for `service`: later ones are rejected (reason 8). Connections
    /// already made are not touched.
    pub fn unlisten(&mut self, service: ServiceId) {
        self.listens.retain(|s| *s != service);
    }

    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// How many connections the agent holds, in every state.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    fn new_comm_id(&mut self) -> CommId {
        loop {
            let id = self.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) {
                return CommId(id);
            }
        }
    }

    fn wait(&self, now: Nanos) -> Nanos {
        now + Nanos(timeout_nanos(self.cm_response_timeout))
    }

    fn tick(&mut self, now: Nanos) {
        self.now = self.now.max(now);
    }

    fn insert(&mut self, id: u32, mut c: Conn) {
        let d = c.deadline.take();
        let s = c.state;
        c.state = CmState::TimeWait; // not half-open: set_state counts the real one
        self.book.set_state(&mut c, s);
        self.book.set_deadline(id, &mut c, d);
        if c.remote_comm_id.0 != 0 {
            self.by_remote.insert((c.peer, c.remote_comm_id.0), id);
        }
        self.conns.insert(id, c);
    }

    fn forget(&mut self, id: u32) -> Option<Conn> {
        let mut c = self.conns.remove(&id)?;
        self.book.set_state(&mut c, CmState::TimeWait);
        self.book.set_deadline(id, &mut c, None);
        if c.remote_comm_id.0 != 0 && self.by_remote.get(&(c.peer, c.remote_comm_id.0)) == Some(&id)
        {
            self.by_remote.remove(&(c.peer, c.remote_comm_id.0));
        }
        Some(c)
    }

    /// Active side: sends a REQ for `service` at `peer`.
    pub fn connect(
        &mut self,
        now: Nanos,
        peer: IpAddr,
        service: ServiceId,
        p: &ConnParams,
    ) -> CommId {
        self.tick(now);
        let id = self.new_comm_id();
        let tid = Tid(self.rng.next_u64());
        let req = ReqRepr {
            local_comm_id: id,
            service_id: service,
            local_ca_guid: self.guid,
            local_qkey: QKey(0),
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: self.cm_response_timeout,
            transport_service_type: ServiceType::Rc,
            starting_psn: p.psn,
            local_cm_response_timeout: self.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: PKey::DEFAULT,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: self.max_cm_retries,
            primary_path: CmPath {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: gid(self.local_ip),
                remote_gid: gid(peer),
                hop_limit: 64,
                local_ack_timeout: 19,
                flow_label: p.flow_label,
                ..CmPath::default()
            },
            private_data: p.private_data,
            ..ReqRepr::default()
        };
        let mad = CmMadRepr::new(tid, CmMessage::Req(req));
        self.out.push_back((peer, mad));
        let deadline = self.wait(now);
        self.insert(
            id.0,
            Conn {
                state: CmState::ReqSent,
                remote_comm_id: CommId(0),
                peer,
                tid,
                local_qpn: p.qpn,
                remote_qpn: Qpn::new(0),
                remote_psn: Psn::new(0),
                pending: Some(mad),
                retries_left: self.max_cm_retries,
                deadline: Some(deadline),
                last_answer: None,
            },
        );
        id
    }

    /// Passive side: answers a [`CmEvent::ConnectRequest`] with a REP.
    pub fn accept(&mut self, now: Nanos, id: CommId, p: &ConnParams) -> Result<(), String> {
        self.tick(now);
        let deadline = self.wait(now);
        let retries = self.max_cm_retries;
        let guid = self.guid;
        let Some(c) = self.conns.get_mut(&id.0) else {
            return Err(format!("no connection {id}"));
        };
        if c.state != CmState::ReqRcvd {
            return Err(format!(
                "connection {id} is {:?}, not waiting for accept",
                c.state
            ));
        }
        let rep = RepRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            local_qpn: p.qpn,
            starting_psn: p.psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 15,
            rnr_retry_count: p.rnr_retry_count,
            local_ca_guid: guid,
            ..RepRepr::default()
        };
        let mad = CmMadRepr::new(c.tid, CmMessage::Rep(rep));
        self.book.set_state(c, CmState::RepSent);
        c.local_qpn = p.qpn;
        c.pending = Some(mad);
        c.last_answer = Some(mad);
        c.retries_left = retries;
        self.book.set_deadline(id.0, c, Some(deadline));
        self.out.push_back((c.peer, mad));
        Ok(())
    }

    /// Passive side: refuses a [`CmEvent::ConnectRequest`] (or, REP sent, the connection it
    /// was to become).
    pub fn reject(&mut self, id: CommId, reason: RejReason) {
        let until = self.now + self.time_wait;
        if let Some(c) = self.conns.get_mut(&id.0) {
            let rej = RejRepr {
                local_comm_id: id,
                remote_comm_id: c.remote_comm_id,
                message_rejected: if c.state == CmState::RepSent {
                    MsgKind::Rep
                } else {
                    MsgKind::Req
                },
                reason,
                ..RejRepr::default()
            };
            self.out
                .push_back((c.peer, CmMadRepr::new(c.tid, CmMessage::Rej(rej))));
            self.book.time_wait(id.0, c, until);
        }
    }

    /// Sends a DREQ on an established connection.
    pub fn disconnect(&mut self, now: Nanos, id: CommId) -> Result<(), String> {
        self.tick(now);
        let deadline = self.wait(now);
        let retries = self.max_cm_retries;
        let Some(c) = self.conns.get_mut(&id.0) else {
            return Err(format!("no connection {id}"));
        };
        if c.state != CmState::Established {
            return Err(format!("connection {id} is {:?}, not established", c.state));
        }
        let dreq = DreqRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            ..DreqRepr::default()
        };
        let mad = CmMadRepr::new(c.tid, CmMessage::Dreq(dreq));
        self.book.set_state(c, CmState::DreqSent);
        c.pending = Some(mad);
        c.retries_left = retries;
        self.book.set_deadline(id.0, c, Some(deadline));
        self.out.push_back((c.peer, mad));
        Ok(())
    }

    /// Ends a connection for good, as Linux's `ib_destroy_cm_id` does: a DREQ when it is
    /// established, a REJ (consumer defined) while the REQ or our REP awaits an answer, nothing
    /// once it is closing or closed; then forgets it, so that nothing is sent again and no event
    /// or timer is left. A later MAD naming it is treated as one for an unknown connection (a
    /// DREQ still gets its DREP).
    pub fn close(&mut self, id: CommId) {
        match self.state(id) {
            Some(CmState::Established) => {
                if let Some(c) = self.conns.get(&id.0) {
                    let dreq = DreqRepr {
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        remote_qpn: c.remote_qpn,
                        ..DreqRepr::default()
                    };
                    let mad = CmMadRepr::new(Tid(self.rng.next_u64()), CmMessage::Dreq(dreq));
                    self.out.push_back((c.peer, mad));
                }
            }
            Some(CmState::ReqRcvd | CmState::RepSent) => {
                self.reject(id, RejReason::CONSUMER_DEFINED)
            }
            _ => {}
        }
        self.forget(id.0);
        self.events.retain(|e| e.id() != id);
    }

    /// Forgets a connection without a word: for a REQ whose sender cannot be reached (its
    /// address never resolves), where a REJ would have nowhere to go.
    pub fn abandon(&mut self, id: CommId) {
        self.forget(id.0);
        self.events.retain(|e| e.id() != id);
    }

    /// A MAD that arrived on QP1 from `from`.
    pub fn handle_mad(&mut self, now: Nanos, from: IpAddr, bytes: &[u8]) {
        self.tick(now);
        let Ok(m) = CmMadRepr::parse(bytes) else {
            self.counters.malformed += 1;
            return;
        };
        let tid = m.mad.tid;
        let until = now + self.time_wait;
        match m.msg {
            CmMessage::Req(r) => self.on_req(now, from, tid, r),
            CmMessage::Rep(r) => self.on_rep(r),
            CmMessage::Rtu(r) => match self.conns.get_mut(&r.remote_comm_id.0) {
                Some(c) if c.state == CmState::RepSent && c.remote_comm_id == r.local_comm_id => {
                    self.book.set_state(c, CmState::Established);
                    c.pending = None;
                    self.book.set_deadline(r.remote_comm_id.0, c, None);
                    self.events.push_back(CmEvent::Established {
                        id: r.remote_comm_id,
                        remote_qpn: c.remote_qpn,
                        remote_psn: c.remote_psn,
                        rep_rd_atomic: None,
                    });
                }
                // A repeated RTU (its REP was sent twice): nothing to do.
                Some(c) if c.state == CmState::Established => {}
                _ => self.counters.unknown_connection += 1,
            },
            CmMessage::Rej(r) => match self.conns.get_mut(&r.remote_comm_id.0) {
                Some(c)
                    if matches!(c.state, CmState::ReqSent | CmState::RepSent)
                        && (c.state == CmState::ReqSent || c.remote_comm_id == r.local_comm_id) =>
                {
                    self.book.time_wait(r.remote_comm_id.0, c, until);
                    self.events.push_back(CmEvent::Rejected {
                        id: r.remote_comm_id,
                        reason: r.reason,
                    });
                }
                _ => self.counters.unknown_connection += 1,
            },
            CmMessage::Dreq(r) => {
                let drep = CmMadRepr::new(
                    tid,
                    CmMessage::Drep(RtuRepr {
                        local_comm_id: r.remote_comm_id,
                        remote_comm_id: r.local_comm_id,
                        ..RtuRepr::default()
                    }),
                );
                let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) else {
                    // A connection we no longer know (its DREP was lost and our time-wait is
                    // over, or it never existed): answer anyway so the peer stops asking, as
                    // Linux's ib_cm does (cm_issue_drep).
                    self.counters.unknown_connection += 1;
                    self.out.push_back((from, drep));
                    return;
                };
                if c.remote_comm_id != r.local_comm_id {
                    self.counters.unknown_connection += 1;
                    return;
                }
                // A repeated DREQ gets the same DREP; the first one ends the connection.
                self.out.push_back((c.peer, drep));
                if matches!(c.state, CmState::Established | CmState::DreqSent) {
                    self.book.time_wait(r.remote_comm_id.0, c, until);
                    c.last_answer = Some(drep);
                    self.events.push_back(CmEvent::Disconnected {
                        id: r.remote_comm_id,
                    });
                }
            }
            CmMessage::Drep(r) => match self.conns.get_mut(&r.remote_comm_id.0) {
                Some(c) if c.state == CmState::DreqSent => {
                    self.book.time_wait(r.remote_comm_id.0, c, until);
                    self.events.push_back(CmEvent::Disconnected {
                        id: r.remote_comm_id,
                    });
                }
                Some(c) if c.state == CmState::TimeWait => {}
                _ => self.counters.unknown_connection += 1,
            },
            // MRA would stretch our timer; SIDR and the rest are not ours yet.
            _ => {}
        }
    }

    fn on_req(&mut self, now: Nanos, from: IpAddr, tid: Tid, r: ReqRepr) {
        // A retransmitted REQ: answer again with what we said (IBTA 12.9.5.1), or stay quiet
        // while the application decides.
        if let Some(id) = self.by_remote.get(&(from, r.local_comm_id.0)) {
            self.counters.reqs_duplicate += 1;
            if let Some(a) = self.conns.get(id).and_then(|c| c.last_answer) {
                self.out.push_back((from, a));
            }
            return;
        }
        self.counters.reqs_received += 1;
        let refuse = |reason| {
            let rej = RejRepr {
                local_comm_id: CommId(0),
                remote_comm_id: r.local_comm_id,
                message_rejected: MsgKind::Req,
                reason,
                ..RejRepr::default()
            };
            (from, CmMadRepr::new(tid, CmMessage::Rej(rej)))
        };
        if !self.listens.contains(&r.service_id) {
            self.counters.reqs_no_listener += 1;
            self.out.push_back(refuse(RejReason::INVALID_SERVICE_ID));
            return;
        }
        if self.book.half_open >= self.max_half_open {
            // The backlog is full: refused without keeping anything, as a listener whose
            // backlog is full refuses (the reason `RejReason::CONSUMER_DEFINED` documents).
            self.counters.reqs_rejected_backlog += 1;
            self.out.push_back(refuse(RejReason::CONSUMER_DEFINED));
            return;
        }
        let id = self.new_comm_id();
        self.insert(
            id.0,
            Conn {
                state: CmState::ReqRcvd,
                remote_comm_id: r.local_comm_id,
                peer: from,
                tid,
                local_qpn: Qpn::new(0),
                remote_qpn: r.local_qpn,
                remote_psn: r.starting_psn,
                pending: None,
                retries_left: 0,
                deadline: Some(now + self.half_open_timeout),
                last_answer: None,
            },
        );
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            from,
            req: Box::new(r),
        });
    }

    fn on_rep(&mut self, r: RepRepr) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) else {
            self.counters.unknown_connection += 1;
            return;
        };
        match c.state {
            CmState::ReqSent => {
                c.remote_comm_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.remote_psn = r.starting_psn;
                let rtu = CmMadRepr::new(
                    c.tid,
                    CmMessage::Rtu(RtuRepr {
                        local_comm_id: r.remote_comm_id,
                        remote_comm_id: r.local_comm_id,
                        ..RtuRepr::default()
                    }),
                );
                self.book.set_state(c, CmState::Established);
                c.pending = None;
                self.book.set_deadline(r.remote_comm_id.0, c, None);
                c.last_answer = Some(rtu);
                self.out.push_back((c.peer, rtu));
                self.by_remote
                    .insert((c.peer, r.local_comm_id.0), r.remote_comm_id.0);
                self.events.push_back(CmEvent::Established {
                    id: r.remote_comm_id,
                    remote_qpn: r.local_qpn,
                    remote_psn: r.starting_psn,
                    rep_rd_atomic: Some((r.responder_resources, r.initiator_depth)),
                });
            }
            // A repeated REP: our RTU was lost.
            CmState::Established if c.remote_comm_id == r.local_comm_id => {
                if let Some(a) = c.last_answer {
                    self.out.push_back((c.peer, a));
                }
            }
            _ => self.counters.unknown_connection += 1,
        }
    }

    /// The next MAD to send: to the peer's QP1 at the address given, 256 bytes.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, [u8; MAD_LEN])> {
        let (to, m) = self.out.pop_front()?;
        let mut b = [0u8; MAD_LEN];
        m.emit(&mut b).ok()?;
        Some((to, b))
    }

    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.book.timers.first().map(|&(d, _)| d)
    }

    /// Retransmits what is due, gives up on what has run out of retries, forgets the REQs
    /// nobody answered in time and the connections whose time-wait is over: in the order of
    /// (deadline, comm id). Idempotent for a given `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.tick(now);
        let wait = Nanos(timeout_nanos(self.cm_response_timeout));
        let until = now + self.time_wait;
        while let Some(&(d, id)) = self.book.timers.first() {
            if d > now {
                break;
            }
            let Some(c) = self.conns.get_mut(&id) else {
                self.book.timers.remove(&(d, id));
                continue;
            };
            match (c.state, c.pending, c.retries_left) {
                (CmState::TimeWait, _, _) => {
                    self.counters.time_wait_reaped += 1;
                    self.forget(id);
                }
                (CmState::ReqRcvd, _, _) => {
                    // The application never answered: forget the REQ (the peer's own timer
                    // ends its side). If the application has not seen it either, it never will.
                    self.counters.half_open_expired += 1;
                    self.forget(id);
                    let before = self.events.len();
                    self.events.retain(|e| e.id() != CommId(id));
                    if self.events.len() == before {
                        self.events.push_back(CmEvent::Timeout { id: CommId(id) });
                    }
                }
                (_, Some(m), n) if n > 0 => {
                    c.retries_left -= 1;
                    self.book.set_deadline(id, c, Some(now + wait));
                    self.out.push_back((c.peer, m));
                }
                _ => {
                    self.counters.timeouts += 1;
                    self.book.time_wait(id, c, until);
                    self.events.push_back(CmEvent::Timeout { id: CommId(id) });
                }
            }
        }
    }

    /// The QPN a connection's local side gave (for the caller's bookkeeping).
    pub fn local_qpn(&self, id: CommId) -> Option<Qpn> {
        self.conns.get(&id.0).map(|c| c.local_qpn)
    }
}
impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> CommId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::Established { id, .. }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Disconnected { id }
            | CmEvent::Timeout { id } => *id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocemu_wire::cm::PortSpace;

    fn pump(a: &mut CmAgent, b: &mut CmAgent, now: Nanos, drop_first: bool) -> usize {
        let (ia, ib) = (a.local_ip, b.local_ip);
        let mut n = 0;
        let mut dropped = !drop_first;
        loop {
            let mut moved = false;
            while let Some((to, m)) = a.poll_transmit() {
                assert_eq!(to, ib);
                if !dropped {
                    dropped = true;
                    continue;
                }
                b.handle_mad(now, ia, &m);
                moved = true;
                n += 1;
            }
            while let Some((to, m)) = b.poll_transmit() {
                assert_eq!(to, ia);
                a.handle_mad(now, ib, &m);
                moved = true;
                n += 1;
            }
            if !moved {
                return n;
            }
        }
    }

    fn two() -> (CmAgent, CmAgent, ServiceId) {
        let a = CmAgent::new("10.0.0.1".parse().unwrap(), 1, 1);
        let mut b = CmAgent::new("10.0.0.2".parse().unwrap(), 2, 2);
        let sid = ServiceId::rdma_cm(PortSpace::TCP, 7174);
        b.listen(sid);
        (a, b, sid)
    }

    fn params(qpn: u32, psn: u32) -> ConnParams {
        ConnParams {
            qpn: Qpn::new(qpn),
            psn: Psn::new(psn),
            ..ConnParams::default()
        }
    }

    /// A connects to B's service; B has seen the REQ. The two ends' ids.
    fn requested(a: &mut CmAgent, b: &mut CmAgent, sid: ServiceId, t: Nanos) -> (CommId, CommId) {
        let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
        pump(a, b, t, false);
        let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
            panic!("no REQ reported");
        };
        (ida, idb)
    }

    #[test]
    fn dreq_for_an_unknown_connection_gets_a_drep() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        let (ida, idb) = requested(&mut a, &mut b, sid, t);
        b.accept(t, idb, &params(0x22, 200)).unwrap();
        pump(&mut a, &mut b, t, false);
        // B forgets everything (a restart); A's DREQ still gets its DREP.
        let mut b2 = CmAgent::new(b.local_ip, 2, 3);
        a.disconnect(t, ida).unwrap();
        let (to, dreq) = a.poll_transmit().expect("a DREQ");
        assert_eq!(to, b2.local_ip);
        b2.handle_mad(t, a.local_ip, &dreq);
        let (back, drep) = b2
            .poll_transmit()
            .expect("a DREP for an unknown connection");
        assert_eq!(back, a.local_ip);
        assert!(matches!(
            CmMadRepr::parse(&drep).unwrap().msg,
            CmMessage::Drep(r) if r.remote_comm_id == ida
        ));
        a.handle_mad(t, b2.local_ip, &drep);
        assert!(std::iter::from_fn(|| a.poll_event())
            .any(|e| matches!(e, CmEvent::Disconnected { id } if id == ida)));
    }

    #[test]
    fn connect_accept_establish_and_disconnect() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
        pump(&mut a, &mut b, t, false);
        let Some(CmEvent::ConnectRequest { id: idb, req, .. }) = b.poll_event() else {
            panic!("no REQ reported");
        };
        assert_eq!(
            (req.local_qpn, req.starting_psn),
            (Qpn::new(0x11), Psn::new(100))
        );
        let rep = ConnParams {
            responder_resources: 4,
            initiator_depth: 2,
            ..params(0x22, 200)
        };
        b.accept(t, idb, &rep).unwrap();
        pump(&mut a, &mut b, t, false);
        // The active side learns what the passive side accepts (its max_rd_atomic's bound).
        assert_eq!(
            a.poll_event(),
            Some(CmEvent::Established {
                id: ida,
                remote_qpn: Qpn::new(0x22),
                remote_psn: Psn::new(200),
                rep_rd_atomic: Some((4, 2)),
            })
        );
        assert_eq!(
            b.poll_event(),
            Some(CmEvent::Established {
                id: idb,
                remote_qpn: Qpn::new(0x11),
                remote_psn: Psn::new(100),
                rep_rd_atomic: None,
            })
        );
        a.disconnect(t, ida).unwrap();
        pump(&mut a, &mut b, t, false);
        assert_eq!(b.poll_event(), Some(CmEvent::Disconnected { id: idb }));
        assert_eq!(a.poll_event(), Some(CmEvent::Disconnected { id: ida }));
        // Only time-wait's end is left.
        assert_eq!(a.poll_timeout(), Some(t + a.time_wait));
    }

    #[test]
    fn close_says_goodbye_once_and_forgets() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        // Established: one DREQ, then nothing is left to retransmit.
        let (ida, idb) = requested(&mut a, &mut b, sid, t);
        b.accept(t, idb, &params(0x22, 200)).unwrap();
        pump(&mut a, &mut b, t, false);
        assert!(matches!(b.poll_event(), Some(CmEvent::Established { .. })));
        b.close(idb);
        assert_eq!(b.state(idb), None);
        assert_eq!(b.poll_timeout(), None);
        let (_, dreq) = b.poll_transmit().expect("a DREQ");
        assert!(matches!(
            CmMadRepr::parse(&dreq).unwrap().msg,
            CmMessage::Dreq(r) if r.remote_comm_id == ida && r.remote_qpn == Qpn::new(0x11)
        ));
        assert!(b.poll_transmit().is_none());
        // A answers the DREQ and is disconnected; B, having forgotten, drops the DREP quietly.
        a.handle_mad(t, b.local_ip, &dreq);
        assert!(std::iter::from_fn(|| a.poll_event())
            .any(|e| matches!(e, CmEvent::Disconnected { id } if id == ida)));
        pump(&mut a, &mut b, t, false);
        assert_eq!(b.poll_event(), None);
        // REP sent, no RTU yet: a REJ that names the REP.
        let (mut a, mut b, sid) = two();
        let (ida, idb) = requested(&mut a, &mut b, sid, t);
        b.accept(t, idb, &params(0x22, 200)).unwrap();
        let (_, _rep) = b.poll_transmit().expect("a REP");
        b.close(idb);
        assert_eq!(b.poll_timeout(), None);
        let (_, rej) = b.poll_transmit().expect("a REJ");
        assert!(matches!(
            CmMadRepr::parse(&rej).unwrap().msg,
            CmMessage::Rej(r) if r.remote_comm_id == ida
                && r.message_rejected == MsgKind::Rep
                && r.reason == RejReason::CONSUMER_DEFINED
        ));
    }

    #[test]
    fn unknown_service_is_rejected_with_reason_8() {
        let (mut a, mut b, _) = two();
        let id = a.connect(
            Nanos(0),
            b.local_ip,
            ServiceId::rdma_cm(PortSpace::TCP, 1),
            &params(1, 1),
        );
        pump(&mut a, &mut b, Nanos(0), false);
        assert_eq!(
            a.poll_event(),
            Some(CmEvent::Rejected {
                id,
                reason: RejReason::INVALID_SERVICE_ID
            })
        );
    }

    #[test]
    fn after_unlisten_reqs_are_rejected() {
        let (mut a, mut b, sid) = two();
        b.unlisten(sid);
        let id = a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
        pump(&mut a, &mut b, Nanos(0), false);
        assert_eq!(b.poll_event(), None);
        assert_eq!(
            a.poll_event(),
            Some(CmEvent::Rejected {
                id,
                reason: RejReason::INVALID_SERVICE_ID
            })
        );
    }

    #[test]
    fn a_lost_req_is_sent_again_and_retries_run_out() {
        let (mut a, mut b, sid) = two();
        a.max_cm_retries = 2;
        let id = a.connect(Nanos(0), b.local_ip, sid, &params(1, 1));
        // The first REQ is lost; the retransmission after the timeout gets through.
        pump(&mut a, &mut b, Nanos(0), true);
        assert_eq!(b.poll_event(), None);
        let t1 = a.poll_timeout().unwrap();
        a.handle_timeout(t1);
        a.handle_timeout(t1);
        pump(&mut a, &mut b, t1, false);
        assert!(matches!(
            b.poll_event(),
            Some(CmEvent::ConnectRequest { .. })
        ));
        // Nobody accepts: a repeated REQ gets no answer; a times out after its retries.
        let mut t = t1;
        let mut turns = 0;
        while let Some(d) = a.poll_timeout() {
            if a.state(id) != Some(CmState::ReqSent) {
                break;
            }
            t = d;
            a.handle_timeout(t);
            pump(&mut a, &mut b, t, false);
            turns += 1;
            assert!(turns < 10, "retries never run out");
        }
        // Two retries: the one that got through, one more, then the end.
        assert_eq!(turns, 2);
        assert_eq!(a.poll_event(), Some(CmEvent::Timeout { id }));
        assert!(t > t1);
        assert_eq!(b.poll_event(), None);
    }

    /// A REQ from `from` with comm id `cid` for `sid`, as a peer would send it.
    fn req_mad(sid: ServiceId, cid: u32, from: IpAddr, to: IpAddr) -> [u8; MAD_LEN] {
        let mut a = CmAgent::new(from, 9, u64::from(cid));
        let _ = a.connect(Nanos(0), to, sid, &params(cid & 0xff_ffff, 1));
        let (_, m) = a.poll_transmit().unwrap();
        let mut r = CmMadRepr::parse(&m).unwrap();
        if let CmMessage::Req(q) = &mut r.msg {
            q.local_comm_id = CommId(cid);
        }
        let mut b = [0u8; MAD_LEN];
        r.emit(&mut b).unwrap();
        b
    }

    #[test]
    fn a_req_flood_stays_bounded_and_a_real_client_still_connects() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        // 100,000 REQs from distinct (peer, comm id) that nobody ever answers.
        let template = req_mad(sid, 1, "10.1.0.1".parse().unwrap(), b.local_ip);
        for i in 0..100_000u32 {
            let mut m = template;
            m[24..28].copy_from_slice(&(i + 1).to_be_bytes()); // REQ local comm id
            let from = IpAddr::from((0x0b00_0000 + i).to_be_bytes());
            b.handle_mad(t, from, &m);
            while b.poll_transmit().is_some() {}
            while b.poll_event().is_some() {}
        }
        assert!(
            b.conns.len() <= b.max_half_open,
            "{} connections",
            b.conns.len()
        );
        // The half-open ones age out; then a real client gets through.
        let later = t + b.half_open_timeout + Nanos(1);
        b.handle_timeout(later);
        assert_eq!(b.conns.len(), 0);
        let c = b.counters();
        assert_eq!(c.reqs_received, 100_000);
        assert_eq!(c.reqs_rejected_backlog, 100_000 - b.max_half_open as u64);
        assert_eq!(c.half_open_expired, b.max_half_open as u64);
        let ida = a.connect(later, b.local_ip, sid, &params(0x11, 100));
        pump(&mut a, &mut b, later, false);
        // The application had taken the flood's REQs: it hears that each one went away.
        let mut gone = 0;
        let idb = loop {
            match b.poll_event() {
                Some(CmEvent::Timeout { .. }) => gone += 1,
                Some(CmEvent::ConnectRequest { id, .. }) => break id,
                e => panic!("the real REQ was not reported: {e:?}"),
            }
        };
        assert_eq!(gone, b.max_half_open);
        b.accept(later, idb, &params(0x22, 200)).unwrap();
        pump(&mut a, &mut b, later, false);
        assert!(matches!(a.poll_event(), Some(CmEvent::Established { id, .. }) if id == ida));
        assert!(matches!(b.poll_event(), Some(CmEvent::Established { id, .. }) if id == idb));
    }

    #[test]
    fn a_full_backlog_rejects_with_consumer_defined() {
        let (mut a, mut b, sid) = two();
        b.max_half_open = 1;
        let _ = requested(&mut a, &mut b, sid, Nanos(0));
        let id2 = a.connect(Nanos(0), b.local_ip, sid, &params(0x12, 1));
        pump(&mut a, &mut b, Nanos(0), false);
        assert_eq!(b.poll_event(), None);
        assert_eq!(
            a.poll_event(),
            Some(CmEvent::Rejected {
                id: id2,
                reason: RejReason::CONSUMER_DEFINED
            })
        );
        assert_eq!(b.counters().reqs_rejected_backlog, 1);
    }

    #[test]
    fn time_wait_is_reaped_after_its_time() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        let (ida, idb) = requested(&mut a, &mut b, sid, t);
        b.accept(t, idb, &params(0x22, 200)).unwrap();
        pump(&mut a, &mut b, t, false);
        a.disconnect(t, ida).unwrap();
        pump(&mut a, &mut b, t, false);
        assert_eq!(a.state(ida), Some(CmState::TimeWait));
        assert_eq!(b.state(idb), Some(CmState::TimeWait));
        // Still there just before the end of time-wait, gone after it.
        let tw = a.time_wait;
        a.handle_timeout(t + tw - Nanos(1));
        assert_eq!(a.state(ida), Some(CmState::TimeWait));
        assert_eq!(a.poll_timeout(), Some(t + tw));
        a.handle_timeout(t + tw);
        b.handle_timeout(t + tw);
        assert_eq!(a.state(ida), None);
        assert_eq!(b.state(idb), None);
        assert_eq!(a.poll_timeout(), None);
        assert_eq!(a.counters().time_wait_reaped, 1);
        assert_eq!(b.conns.len(), 0);
    }

    #[test]
    fn a_repeated_req_is_answered_from_the_index() {
        let (mut a, mut b, sid) = two();
        let t = Nanos(0);
        let ida = a.connect(t, b.local_ip, sid, &params(0x11, 100));
        let (_, req) = a.poll_transmit().unwrap();
        b.handle_mad(t, a.local_ip, &req);
        let Some(CmEvent::ConnectRequest { id: idb, .. }) = b.poll_event() else {
            panic!("no REQ reported");
        };
        // While the application decides: quiet. Once it accepted: the same REP again.
        b.handle_mad(t, a.local_ip, &req);
        assert!(b.poll_transmit().is_none());
        b.accept(t, idb, &params(0x22, 200)).unwrap();
        let (_, rep) = b.poll_transmit().unwrap();
        b.handle_mad(t, a.local_ip, &req);
        assert_eq!(b.poll_transmit().map(|(_, m)| m), Some(rep));
        assert_eq!(b.poll_event(), None);
        assert_eq!(b.conns.len(), 1);
        assert_eq!(b.counters().reqs_duplicate, 2);
        // The same comm id from another peer is another connection.
        b.handle_mad(t, "10.0.0.3".parse().unwrap(), &req);
        assert!(matches!(
            b.poll_event(),
            Some(CmEvent::ConnectRequest { .. })
        ));
        let _ = ida;
    }

    #[test]
    fn one_seed_one_history_even_when_deadlines_coincide() {
        // Two agents with the same seed, fed the same MADs at the same times, say the same
        // things in the same order, timeouts included (several deadlines fall at one instant).
        fn run() -> Vec<String> {
            let (_, mut b, sid) = two();
            let mut log = Vec::new();
            let mut ids = Vec::new();
            let t = Nanos(0);
            for i in 0..64u32 {
                let from = IpAddr::from((0x0c00_0000 + i).to_be_bytes());
                b.handle_mad(t, from, &req_mad(sid, 1000 + i, from, b.local_ip));
                if let Some(CmEvent::ConnectRequest { id, .. }) = b.poll_event() {
                    ids.push(id);
                }
            }
            for id in &ids {
                b.accept(t, *id, &params(0x22, 200)).unwrap();
            }
            for _ in 0..40 {
                let Some(now) = b.poll_timeout() else { break };
                b.handle_timeout(now);
                while let Some((to, m)) = b.poll_transmit() {
                    log.push(format!("{now} tx {to} {:?}", &m[..]));
                }
                while let Some(e) = b.poll_event() {
                    log.push(format!("{now} {e:?}"));
                }
            }
            assert!(log.iter().any(|l| l.contains("Timeout")));
            log
        }
        assert_eq!(run(), run());
    }

    #[test]
    fn answers_a_real_rping_req() {
        // The REQ rping sent in wire/tests/data/cm/rping.pcap (frame 1), from its UD payload.
        let mut r = rocemu_wire::capture::CaptureReader::open(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../wire/tests/data/cm/rping.pcap"
        ))
        .unwrap();
        let f = r.next_frame().unwrap().unwrap();
        let p = rocemu_wire::parse_frame(&f.data).unwrap();
        let mad = rocemu_wire::mad::gsi_payload(&p).unwrap();
        let mut b = CmAgent::new("10.99.0.11".parse().unwrap(), 2, 2);
        b.listen(ServiceId::rdma_cm(PortSpace::TCP, 7174));
        b.handle_mad(Nanos(0), p.ip.src(), mad);
        let Some(CmEvent::ConnectRequest { id, req, .. }) = b.poll_event() else {
            panic!("rping's REQ not reported");
        };
        assert_eq!(req.local_qpn, Qpn::new(0x11));
        b.accept(Nanos(0), id, &params(0x33, 5)).unwrap();
        let (to, rep) = b.poll_transmit().unwrap();
        assert_eq!(to, p.ip.src());
        let m = CmMadRepr::parse(&rep).unwrap();
        assert_eq!(m.mad.tid, CmMadRepr::parse(mad).unwrap().mad.tid);
        let CmMessage::Rep(rep) = m.msg else {
            panic!("not a REP")
        };
        assert_eq!(rep.remote_comm_id, req.local_comm_id);
        assert_eq!(
            (rep.local_qpn, rep.starting_psn),
            (Qpn::new(0x33), Psn::new(5))
        );
    }
}
