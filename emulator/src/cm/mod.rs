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
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};

mod state;
#[cfg(test)]
mod tests;

use state::{Book, Conn};
pub use state::{CmCounters, CmEvent, CmState, ConnParams};

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
