//! The IB communication manager (IBTA Vol. 1 chapter 12; 12.6–12.9 and 12.11 unverified) as
//! `rdma_cm` uses it on RoCE: a sans-IO agent that turns connect / listen / accept / establish /
//! disconnect into REQ, REP, RTU, REJ, MRA, DREQ and DREP MADs, and a UD service lookup into
//! SIDR_REQ and SIDR_REP; retransmits them on its own timers, and reports what the peer did (with
//! the private data its messages carried) as events.
//!
//! It sits beside the RNIC, not inside it: MADs reach it as the payloads of UD receives on QP1
//! (`Rnic::create_gsi_qp`), and what it wants sent goes out as UD SENDs from QP1 to the peer's
//! QP1 with the GSI Q_Key 0x80010000. Moving the data QPs through RTR and RTS with what the
//! messages carry (QPN, starting PSN, path MTU) is the caller's part, as in librdmacm.
//!
//! Invariants:
//! * Nothing the wire brings panics it: a MAD that does not parse, names a connection we do not
//!   have, or comes in the wrong state is dropped (or answered with a REJ where IBTA says so).
//! * Every message that expects an answer (REQ, REP, DREQ, SIDR_REQ) is sent again every
//!   4.096 µs × 2^`cm_response_timeout` until answered, at most `max_cm_retries` times; then the
//!   connection ends with [`CmEvent::Timeout`]. The first MRA for a REQ or REP stretches the wait
//!   once (see [`CmAgent::handle_mad`]); it never adds retries.
//! * Time comes in as `now`; randomness (communication IDs, transaction IDs) from the seed.
//!   Nothing depends on a hasher's order: connections are kept in a `BTreeMap` and timers fire
//!   in (deadline, comm id) order, so one seed and one input give one history.
//! * The state is bounded by what the application keeps, not by what peers send: at most
//!   [`CmAgent::max_half_open`] passive connections wait for accept or RTU (further REQs are
//!   refused, nothing kept); a REQ the application leaves unanswered is forgotten after
//!   [`CmAgent::half_open_timeout`]; an unanswered REP ends after its retries; a closed
//!   connection is forgotten after [`CmAgent::time_wait`]. SIDR_REQs count against the same
//!   backlog and age limit; a SIDR_REQ for a service nobody listens on is answered and nothing
//!   kept; an answered one stays for `time_wait` to answer repeats. An active connection whose
//!   RTU the application holds back ([`ConnParams::defer_rtu`]) is forgotten after
//!   `half_open_timeout`. A repeated REQ or SIDR_REQ is found by (peer, remote id) in O(1). What
//!   was refused or thrown away is in [`CmCounters`].
//!
//! Not yet: LAP/APR (alternate paths), sending an MRA for a REP, and the time-wait state's
//! stale-connection checks. `rocemu-tools`' `rdmacm` wires it to an engine for `rocemu rping`,
//! `perf -R` and `pingpong --rdma-cm`; the conformance agent (`rocemu-conformance`, `agent::cm`) to
//! its RNIC.
use crate::rng::{KeyRng, Seed};
use crate::time::Nanos;
use rocemu_wire::cm::{
    private_len, CmMadRepr, CmMessage, CmPath, CommId, DreqRepr, Guid, MraRepr, MsgKind, RejReason,
    RejRepr, RepRepr, ReqRepr, RtuRepr, ServiceId, ServiceType, SidrRepRepr, SidrReqRepr,
    SidrStatus,
};
use rocemu_wire::mad::{timeout_nanos, Tid, MAD_LEN};
use rocemu_wire::{PKey, QKey, Qpn};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod fuzz;
pub mod gsi;
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
    /// Answer every REQ handed to the application with an MRA at once, with this 5-bit
    /// service timeout exponent (4.096 µs × 2^n: "the answer may take this long"), and every
    /// repeat of it with the same MRA until the application answers. The REQ is then kept at
    /// least that long (not just [`CmAgent::half_open_timeout`]). None (the default): no MRA;
    /// a repeated REQ is not answered while the application decides. Linux's rdma_cm sends its
    /// MRA (exponent 24, about 69 s) only for a repeated REQ (`CMA_CM_MRA_SETTING` with
    /// `IB_CM_MRA_FLAG_DELAY`, cma.c / cm.c `cm_dup_req_handler`).
    pub mra_on_req: Option<u8>,
    /// With [`mra_on_req`](Self::mra_on_req): the MRA goes out with the first REQ too (true,
    /// the default), or only for a repeat, as Linux's rdma_cm sends it (false).
    pub mra_at_once: bool,
    /// How long a REQ for a service nobody listens on waits for a listener before it is
    /// refused (REJ "invalid service ID"): a server that makes its listener again between two
    /// connections (perftest's `-R` does, for its test QP after its exchange) gets the REQ that
    /// beat its `rdma_listen` by a moment, a race a kernel's slower address and route resolution
    /// on the active side usually hides. [`CmAgent::DEFAULT_LISTEN_GRACE`]; zero refuses at once,
    /// as Linux's ib_cm does. At most [`CmAgent::MAX_PARKED`] REQs wait; further ones are
    /// refused at once.
    pub listen_grace: Nanos,
    /// REQs for a service nobody listened on yet, oldest first: (refuse at, peer, tid, REQ).
    parked: VecDeque<(Nanos, IpAddr, Tid, ReqRepr)>,
    listens: Vec<ServiceId>,
    /// By local comm id: a `BTreeMap`, so that nothing depends on a hasher's order.
    conns: BTreeMap<u32, Conn>,
    /// (peer, remote comm id) → local comm id, for connections whose remote id is known: a
    /// repeated REQ is found in O(1) (IBTA 12.9.5.1, unverified, identifies a REQ by both).
    by_remote: HashMap<(IpAddr, u32), u32>,
    /// (peer, SIDR request id) → local id, for the SIDR_REQs we hold.
    sidr_by_remote: HashMap<(IpAddr, u32), u32>,
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
    /// [`CmAgent::listen_grace`]'s default: 200 ms.
    pub const DEFAULT_LISTEN_GRACE: Nanos = Nanos::from_millis(200);
    /// The most REQs that wait for a listener at once.
    pub const MAX_PARKED: usize = 64;

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
            mra_on_req: None,
            mra_at_once: true,
            listen_grace: Self::DEFAULT_LISTEN_GRACE,
            parked: VecDeque::new(),
            listens: Vec::new(),
            conns: BTreeMap::new(),
            by_remote: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            book: Book::default(),
            counters: CmCounters::default(),
            now: Nanos::ZERO,
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Accept REQs and SIDR_REQs for `service`.
    pub fn listen(&mut self, service: ServiceId) {
        if !self.listens.contains(&service) {
            self.listens.push(service);
        }
        // The REQs that came for it a moment early (see `listen_grace`).
        let now = self.now;
        let (early, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|(_, _, _, r)| r.service_id == service);
        self.parked = rest;
        for (_, from, tid, r) in early {
            self.counters.reqs_received -= 1; // counted when it came
            self.on_req(now, from, tid, r);
        }
    }

    /// Stops accepting REQs for `service`: later ones are rejected (reason 8; a SIDR_REQ gets
    /// status UNSUPPORTED). Connections already made are not touched.
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
        c.state = CmState::TimeWait; // not half-open: count_state counts the real one
        self.book.count_state(&mut c, s);
        tracing::debug!(cm_id = %CommId(id), peer = %c.peer, state = ?s, "CM connection");
        self.book.set_deadline(id, &mut c, d);
        if c.remote_comm_id.0 != 0 {
            let index = if c.sidr {
                &mut self.sidr_by_remote
            } else {
                &mut self.by_remote
            };
            index.insert((c.peer, c.remote_comm_id.0), id);
        }
        self.conns.insert(id, c);
    }

    fn forget(&mut self, id: u32) -> Option<Conn> {
        let mut c = self.conns.remove(&id)?;
        tracing::debug!(cm_id = %CommId(id), state = ?c.state, "CM connection forgotten");
        self.book.count_state(&mut c, CmState::TimeWait);
        self.book.set_deadline(id, &mut c, None);
        let index = if c.sidr {
            &mut self.sidr_by_remote
        } else {
            &mut self.by_remote
        };
        let key = (c.peer, c.remote_comm_id.0);
        if c.remote_comm_id.0 != 0 && index.get(&key) == Some(&id) {
            index.remove(&key);
        }
        Some(c)
    }

    /// Forgets `id` and the events about it still queued; true when some were (the
    /// application had not seen them).
    fn forget_unseen(&mut self, id: u32) -> bool {
        self.forget(id);
        let before = self.events.len();
        self.events.retain(|e| e.id() != CommId(id));
        self.events.len() != before
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
                local_qpn: p.qpn,
                pending: Some(mad),
                retries_left: self.max_cm_retries,
                deadline: Some(deadline),
                defer_rtu: p.defer_rtu,
                ..Conn::new(CmState::ReqSent, peer, tid)
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
            private_data: p.rep_private_data,
            ..RepRepr::default()
        };
        let mad = CmMadRepr::new(c.tid, CmMessage::Rep(rep));
        self.book.set_state(id.0, c, CmState::RepSent);
        c.local_qpn = p.qpn;
        c.pending = Some(mad);
        c.last_answer = Some(mad);
        c.retries_left = retries;
        self.book.set_deadline(id.0, c, Some(deadline));
        self.out.push_back((c.peer, mad));
        Ok(())
    }

    /// Refuses a [`CmEvent::ConnectRequest`] (or, REP sent, the connection it was to become;
    /// or, [`CmState::RepRcvd`], the peer's REP; or a [`CmEvent::SidrRequest`]): `reject_with`
    /// without private data.
    pub fn reject(&mut self, id: CommId, reason: RejReason) {
        self.reject_with(id, reason, &[]);
    }

    /// Sends a REJ with `reason` and the first 148 bytes of `private_data` (zero padded;
    /// longer is cut: librdmacm checks the length before it gets here), then keeps the
    /// connection in time-wait, answering a repeat of the rejected message with the same REJ.
    /// The message rejected is the REQ (states `ReqRcvd`, or "other" from `ReqSent`) or the REP
    /// (`RepSent`, `RepRcvd`), as Linux's `cm_format_rej` says. A SIDR request
    /// ([`CmState::SidrReqRcvd`]) gets a SIDR_REP with status REJECT and the first 136 bytes
    /// instead, as librdmacm's `rdma_reject` on a UDP id does (cma.c `cma_send_sidr_rep`;
    /// `reason` is not on that wire). In any other state (or an unknown id) nothing happens.
    pub fn reject_with(&mut self, id: CommId, reason: RejReason, private_data: &[u8]) {
        let until = self.now + self.time_wait;
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        let mad = match c.state {
            CmState::SidrReqRcvd => CmMadRepr::new(
                c.tid,
                CmMessage::SidrRep(SidrRepRepr {
                    request_id: c.remote_comm_id,
                    status: SidrStatus::REJECT,
                    service_id: c.service,
                    private_data: pad(private_data),
                    ..SidrRepRepr::default()
                }),
            ),
            s @ (CmState::ReqSent | CmState::ReqRcvd | CmState::RepSent | CmState::RepRcvd) => {
                CmMadRepr::new(
                    c.tid,
                    CmMessage::Rej(RejRepr {
                        local_comm_id: id,
                        remote_comm_id: c.remote_comm_id,
                        message_rejected: match s {
                            CmState::ReqSent => MsgKind::Other,
                            CmState::ReqRcvd => MsgKind::Req,
                            _ => MsgKind::Rep,
                        },
                        reason,
                        private_data: pad(private_data),
                        ..RejRepr::default()
                    }),
                )
            }
            _ => return,
        };
        tracing::debug!(cm_id = %id, peer = %c.peer, reason = reason.0, "CM: REJ sent");
        self.out.push_back((c.peer, mad));
        self.book.time_wait(id.0, c, until);
        c.last_answer = Some(mad);
    }

    /// Active side, [`ConnParams::defer_rtu`]: sends the RTU for the REP reported in
    /// [`CmEvent::RepReceived`]; the connection is established (no further event). A later
    /// repeat of the REP gets the RTU again. Linux: `ib_send_cm_rtu` from `IB_CM_REP_RCVD`.
    pub fn establish(&mut self, now: Nanos, id: CommId) -> Result<(), String> {
        self.tick(now);
        let Some(c) = self.conns.get_mut(&id.0) else {
            return Err(format!("no connection {id}"));
        };
        if c.state != CmState::RepRcvd {
            return Err(format!(
                "connection {id} is {:?}, not waiting for establish",
                c.state
            ));
        }
        let rtu = CmMadRepr::new(
            c.tid,
            CmMessage::Rtu(RtuRepr {
                local_comm_id: id,
                remote_comm_id: c.remote_comm_id,
                ..RtuRepr::default()
            }),
        );
        self.book.set_state(id.0, c, CmState::Established);
        self.book.set_deadline(id.0, c, None);
        c.last_answer = Some(rtu);
        self.out.push_back((c.peer, rtu));
        Ok(())
    }

    /// Active side of service ID resolution (IBTA 12.11, unverified; rdma_cm's `RDMA_PS_UDP`):
    /// sends a SIDR_REQ for `service` at `peer` with the first 216 bytes of `private_data` (zero
    /// padded; longer is cut), retransmitted as a REQ is. Ends with [`CmEvent::SidrReply`] or
    /// [`CmEvent::Timeout`], after which the id is forgotten. The id returned is the SIDR_REQ's
    /// Request ID.
    pub fn sidr_request(
        &mut self,
        now: Nanos,
        peer: IpAddr,
        service: ServiceId,
        private_data: &[u8],
    ) -> CommId {
        self.tick(now);
        let id = self.new_comm_id();
        let tid = Tid(self.rng.next_u64());
        let mad = CmMadRepr::new(
            tid,
            CmMessage::SidrReq(SidrReqRepr {
                request_id: id,
                pkey: PKey::DEFAULT,
                service_id: service,
                private_data: pad(private_data),
                ..SidrReqRepr::default()
            }),
        );
        self.out.push_back((peer, mad));
        let deadline = self.wait(now);
        self.insert(
            id.0,
            Conn {
                pending: Some(mad),
                retries_left: self.max_cm_retries,
                deadline: Some(deadline),
                service,
                sidr: true,
                ..Conn::new(CmState::SidrReqSent, peer, tid)
            },
        );
        id
    }

    /// Passive side: answers a [`CmEvent::SidrRequest`] with a SIDR_REP: `status`, and for
    /// [`SidrStatus::SUCCESS`] the UD QP and Q_Key behind the service; at most 136 bytes of
    /// private data (more is an error, nothing sent). The request is then kept for
    /// [`CmAgent::time_wait`] to answer the requester's repeats with the same SIDR_REP (Linux
    /// forgets it at once, `cm_send_sidr_rep_locked`, so a repeat is a new request there).
    pub fn sidr_reply(
        &mut self,
        id: CommId,
        status: SidrStatus,
        qpn: Qpn,
        qkey: QKey,
        private_data: &[u8],
    ) -> Result<(), String> {
        if private_data.len() > private_len::SIDR_REP {
            return Err(format!(
                "{} bytes of SIDR_REP private data, at most {}",
                private_data.len(),
                private_len::SIDR_REP
            ));
        }
        let until = self.now + self.time_wait;
        let Some(c) = self.conns.get_mut(&id.0) else {
            return Err(format!("no SIDR request {id}"));
        };
        if c.state != CmState::SidrReqRcvd {
            return Err(format!(
                "{id} is {:?}, not a SIDR request waiting for an answer",
                c.state
            ));
        }
        let mad = CmMadRepr::new(
            c.tid,
            CmMessage::SidrRep(SidrRepRepr {
                request_id: c.remote_comm_id,
                status,
                qpn,
                service_id: c.service,
                qkey,
                private_data: pad(private_data),
                ..SidrRepRepr::default()
            }),
        );
        self.out.push_back((c.peer, mad));
        self.book.time_wait(id.0, c, until);
        c.last_answer = Some(mad);
        Ok(())
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
        self.book.set_state(id.0, c, CmState::DreqSent);
        c.pending = Some(mad);
        c.retries_left = retries;
        self.book.set_deadline(id.0, c, Some(deadline));
        self.out.push_back((c.peer, mad));
        Ok(())
    }

    /// Ends a connection for good, as Linux's `ib_destroy_cm_id` does (cm.c `cm_destroy_id`):
    /// a DREQ when it is established, a REJ (consumer defined) while the REQ, our REP or the
    /// peer's REP awaits an answer, a SIDR_REP with status REJECT for a SIDR request not yet
    /// answered, nothing for our own REQ or SIDR_REQ or once it is closing or closed; then
    /// forgets it, so that nothing is sent again and no event or timer is left. A later MAD
    /// naming it is treated as one for an unknown connection (a DREQ still gets its DREP).
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
            Some(CmState::ReqRcvd | CmState::RepSent | CmState::RepRcvd | CmState::SidrReqRcvd) => {
                self.reject(id, RejReason::CONSUMER_DEFINED)
            }
            _ => {}
        }
        self.forget_unseen(id.0);
    }

    /// Forgets a connection without a word: for a REQ whose sender cannot be reached (its
    /// address never resolves), where a REJ would have nowhere to go.
    pub fn abandon(&mut self, id: CommId) {
        self.forget_unseen(id.0);
    }

    /// A MAD that arrived on QP1 from `from`.
    ///
    /// An MRA (IBTA 12.6.6, unverified; Table 107 in 1.3) for our REQ (state `ReqSent`, message
    /// MRAed REQ) or our REP (`RepSent`, message MRAed REP, from the connection's peer id) is
    /// counted ([`CmCounters::mras_received`]); the first one moves the next retransmission to at
    /// least its service timeout plus our response timeout from now (4.096 µs × (2^service +
    /// 2^`cm_response_timeout`)), later ones change nothing. The retries left are not touched: when
    /// the stretched wait ends unanswered, the message goes again at the usual interval. This is
    /// Linux's cm.c `cm_mra_handler` (the sum of the MRA's service timeout and the path's timeout,
    /// where we take our CM response timeout) with mad.c's `ib_modify_mad` since "IB/mad: Apply
    /// timeout modification (CM MRA) only once" (2024, citing IBTA 1.7 12.6.6): the stretch applies
    /// to the next retry only.
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
            CmMessage::Rep(r) => self.on_rep(now, r),
            CmMessage::Rtu(r) => match self.conns.get_mut(&r.remote_comm_id.0) {
                Some(c) if c.state == CmState::RepSent && c.remote_comm_id == r.local_comm_id => {
                    self.book
                        .set_state(r.remote_comm_id.0, c, CmState::Established);
                    c.pending = None;
                    self.book.set_deadline(r.remote_comm_id.0, c, None);
                    self.events.push_back(CmEvent::Established {
                        id: r.remote_comm_id,
                        remote_qpn: c.remote_qpn,
                        remote_psn: c.remote_psn,
                        rep_rd_atomic: None,
                        private_data: Box::new(pad(&r.private_data)),
                    });
                }
                // A repeated RTU (its REP was sent twice): nothing to do.
                Some(c) if c.state == CmState::Established => {}
                _ => self.counters.unknown_connection += 1,
            },
            CmMessage::Rej(r) => match self.conns.get_mut(&r.remote_comm_id.0) {
                Some(c)
                    if c.state == CmState::ReqSent
                        || (matches!(c.state, CmState::RepSent | CmState::RepRcvd)
                            && c.remote_comm_id == r.local_comm_id) =>
                {
                    tracing::debug!(
                        cm_id = %r.remote_comm_id,
                        peer = %from,
                        reason = r.reason.0,
                        "CM: REJ received"
                    );
                    self.book.time_wait(r.remote_comm_id.0, c, until);
                    self.events.push_back(CmEvent::Rejected {
                        id: r.remote_comm_id,
                        reason: r.reason,
                        private_data: Box::new(r.private_data),
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
            CmMessage::Mra(r) => self.on_mra(now, r),
            CmMessage::SidrReq(r) => self.on_sidr_req(now, from, tid, r),
            CmMessage::SidrRep(r) => match self.conns.get(&r.request_id.0) {
                // Only the request id names it: the answer must also come from where we asked.
                Some(c) if c.state == CmState::SidrReqSent && c.peer == from => {
                    self.forget(r.request_id.0);
                    self.events.push_back(CmEvent::SidrReply {
                        id: r.request_id,
                        status: r.status,
                        qpn: r.qpn,
                        qkey: r.qkey,
                        private_data: Box::new(r.private_data),
                    });
                }
                _ => self.counters.unknown_connection += 1,
            },
        }
    }

    fn on_mra(&mut self, now: Nanos, r: MraRepr) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) else {
            self.counters.unknown_connection += 1;
            return;
        };
        let ours = match (c.state, r.message_mraed) {
            (CmState::ReqSent, MsgKind::Req) => true,
            (CmState::RepSent, MsgKind::Rep) => c.remote_comm_id == r.local_comm_id,
            _ => false,
        };
        if !ours {
            self.counters.unknown_connection += 1;
            return;
        }
        self.counters.mras_received += 1;
        if c.mra_received {
            return;
        }
        c.mra_received = true;
        let stretched = now
            + Nanos(timeout_nanos(r.service_timeout))
            + Nanos(timeout_nanos(self.cm_response_timeout));
        let d = c.deadline.map_or(stretched, |d| d.max(stretched));
        self.book.set_deadline(r.remote_comm_id.0, c, Some(d));
    }

    fn on_sidr_req(&mut self, now: Nanos, from: IpAddr, tid: Tid, r: SidrReqRepr) {
        // A repeat: the same answer again, or quiet while the application decides.
        if let Some(id) = self.sidr_by_remote.get(&(from, r.request_id.0)) {
            self.counters.sidr_reqs_duplicate += 1;
            if let Some(a) = self.conns.get(id).and_then(|c| c.last_answer) {
                self.out.push_back((from, a));
            }
            return;
        }
        self.counters.sidr_reqs_received += 1;
        let refuse = |status| {
            let rep = SidrRepRepr {
                request_id: r.request_id,
                status,
                service_id: r.service_id,
                ..SidrRepRepr::default()
            };
            (from, CmMadRepr::new(tid, CmMessage::SidrRep(rep)))
        };
        if !self.listens.contains(&r.service_id) {
            // Linux's cm_sidr_req_handler: no listener, a SIDR_REP with status
            // IB_SIDR_UNSUPPORTED, and the request is not kept.
            self.counters.sidr_reqs_no_listener += 1;
            self.out.push_back(refuse(SidrStatus::UNSUPPORTED));
            return;
        }
        if self.book.half_open >= self.max_half_open {
            // Linux has no backlog here; REJECT is what it answers a request its listener
            // will not take (cm_destroy_id in IB_CM_SIDR_REQ_RCVD).
            self.counters.sidr_reqs_rejected_backlog += 1;
            self.out.push_back(refuse(SidrStatus::REJECT));
            return;
        }
        let id = self.new_comm_id();
        self.insert(
            id.0,
            Conn {
                remote_comm_id: r.request_id,
                deadline: Some(now + self.half_open_timeout),
                service: r.service_id,
                sidr: true,
                ..Conn::new(CmState::SidrReqRcvd, from, tid)
            },
        );
        self.events.push_back(CmEvent::SidrRequest {
            id,
            from,
            service: r.service_id,
            private_data: Box::new(r.private_data),
        });
    }

    fn on_req(&mut self, now: Nanos, from: IpAddr, tid: Tid, r: ReqRepr) {
        // A retransmitted REQ: answer again with what we said (IBTA 12.9.5.1, unverified), or stay
        // quiet while the application decides.
        if let Some(id) = self.by_remote.get(&(from, r.local_comm_id.0)) {
            self.counters.reqs_duplicate += 1;
            if let Some(a) = self.conns.get(id).and_then(|c| c.last_answer) {
                if matches!(a.msg, CmMessage::Mra(_)) {
                    self.counters.mras_sent += 1;
                }
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
            let parked = self
                .parked
                .iter()
                .any(|(_, f, _, p)| *f == from && p.local_comm_id == r.local_comm_id);
            if parked {
                // A repeat of a REQ that waits for its listener.
                self.counters.reqs_received -= 1;
                self.counters.reqs_duplicate += 1;
                return;
            }
            if self.listen_grace > Nanos::ZERO && self.parked.len() < Self::MAX_PARKED {
                tracing::debug!(peer = %from, service = r.service_id.0, "CM: REQ for a service nobody listens on yet: held for a listener");
                self.parked
                    .push_back((now + self.listen_grace, from, tid, r));
                return;
            }
            self.counters.reqs_no_listener += 1;
            tracing::debug!(peer = %from, service = r.service_id.0, "CM: REQ for a service nobody listens on: REJ sent");
            self.out.push_back(refuse(RejReason::INVALID_SERVICE_ID));
            return;
        }
        if self.book.half_open >= self.max_half_open {
            // The backlog is full: refused without keeping anything, as a listener whose
            // backlog is full refuses (the reason `RejReason::CONSUMER_DEFINED` documents).
            self.counters.reqs_rejected_backlog += 1;
            tracing::warn!(peer = %from, backlog = self.max_half_open, "CM: listen backlog full: REQ refused");
            self.out.push_back(refuse(RejReason::CONSUMER_DEFINED));
            return;
        }
        let id = self.new_comm_id();
        // With an MRA out, the REQ is kept at least as long as the MRA promised.
        let mra = self.mra_on_req.map(|e| {
            let m = CmMadRepr::new(
                tid,
                CmMessage::Mra(MraRepr {
                    local_comm_id: id,
                    remote_comm_id: r.local_comm_id,
                    message_mraed: MsgKind::Req,
                    service_timeout: e & 0x1f,
                    ..MraRepr::default()
                }),
            );
            (m, Nanos(timeout_nanos(e)))
        });
        let age = mra.map_or(self.half_open_timeout, |(_, t)| {
            self.half_open_timeout.max(t)
        });
        self.insert(
            id.0,
            Conn {
                remote_comm_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                remote_psn: r.starting_psn,
                deadline: Some(now + age),
                last_answer: mra.map(|(m, _)| m),
                ..Conn::new(CmState::ReqRcvd, from, tid)
            },
        );
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            from,
            req: Box::new(r),
        });
        if let (Some((m, _)), true) = (mra, self.mra_at_once) {
            self.counters.mras_sent += 1;
            self.out.push_back((from, m));
        }
    }

    fn on_rep(&mut self, now: Nanos, r: RepRepr) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) else {
            self.counters.unknown_connection += 1;
            return;
        };
        match c.state {
            CmState::ReqSent if c.defer_rtu => {
                c.remote_comm_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.remote_psn = r.starting_psn;
                c.pending = None;
                self.book.set_state(r.remote_comm_id.0, c, CmState::RepRcvd);
                // Bounded: the application has half_open_timeout to call establish.
                self.book
                    .set_deadline(r.remote_comm_id.0, c, Some(now + self.half_open_timeout));
                self.by_remote
                    .insert((c.peer, r.local_comm_id.0), r.remote_comm_id.0);
                self.events.push_back(CmEvent::RepReceived {
                    id: r.remote_comm_id,
                    remote_qpn: r.local_qpn,
                    remote_psn: r.starting_psn,
                    rep_rd_atomic: (r.responder_resources, r.initiator_depth),
                    private_data: Box::new(r.private_data),
                });
            }
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
                self.book
                    .set_state(r.remote_comm_id.0, c, CmState::Established);
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
                    private_data: Box::new(r.private_data),
                });
            }
            // A repeated REP while the application holds the RTU back: nothing to say yet
            // (Linux's cm_rep_handler drops it in IB_CM_REP_RCVD too).
            CmState::RepRcvd if c.remote_comm_id == r.local_comm_id => {}
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
        let parked = self.parked.front().map(|p| p.0);
        match (self.book.timers.first().map(|&(d, _)| d), parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Retransmits what is due, gives up on what has run out of retries, forgets the REQs and
    /// SIDR_REQs nobody answered in time, the deferred RTUs never sent (with a REJ, as
    /// [`CmAgent::close`]) and the connections whose time-wait is over: in the order of
    /// (deadline, comm id). Idempotent for a given `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.tick(now);
        // REQs whose listener did not come in time: refused now.
        while self.parked.front().is_some_and(|p| p.0 <= now) {
            let (_, from, tid, r) = self.parked.pop_front().expect("checked");
            self.counters.reqs_no_listener += 1;
            tracing::debug!(peer = %from, service = r.service_id.0, "CM: REQ for a service nobody listens on: REJ sent");
            let rej = RejRepr {
                local_comm_id: CommId(0),
                remote_comm_id: r.local_comm_id,
                message_rejected: MsgKind::Req,
                reason: RejReason::INVALID_SERVICE_ID,
                ..RejRepr::default()
            };
            self.out
                .push_back((from, CmMadRepr::new(tid, CmMessage::Rej(rej))));
        }
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
                (CmState::ReqRcvd | CmState::SidrReqRcvd, _, _) => {
                    // The application never answered: forget the REQ (the peer's own timer
                    // ends its side). If the application has not seen it either, it never will.
                    self.counters.half_open_expired += 1;
                    tracing::debug!(cm_id = %CommId(id), "CM: REQ never answered by the application: forgotten");
                    if !self.forget_unseen(id) {
                        self.events.push_back(CmEvent::Timeout { id: CommId(id) });
                    }
                }
                (CmState::RepRcvd, _, _) => {
                    // The application never sent its RTU: take the connection back.
                    self.counters.establish_expired += 1;
                    tracing::debug!(cm_id = %CommId(id), "CM: RTU never sent by the application: rejected");
                    self.reject(CommId(id), RejReason::CONSUMER_DEFINED);
                    if !self.forget_unseen(id) {
                        self.events.push_back(CmEvent::Timeout { id: CommId(id) });
                    }
                }
                (_, Some(m), n) if n > 0 => {
                    tracing::debug!(
                        cm_id = %CommId(id),
                        peer = %c.peer,
                        state = ?c.state,
                        retries_left = n - 1,
                        "CM: no answer: MAD sent again"
                    );
                    c.retries_left -= 1;
                    self.book.set_deadline(id, c, Some(now + wait));
                    self.out.push_back((c.peer, m));
                }
                (CmState::SidrReqSent, _, _) => {
                    // Nothing to answer later: no time-wait for a SIDR_REQ.
                    tracing::warn!(cm_id = %CommId(id), peer = %c.peer, "CM: SIDR_REQ never answered: timeout");
                    self.counters.timeouts += 1;
                    self.forget(id);
                    self.events.push_back(CmEvent::Timeout { id: CommId(id) });
                }
                _ => {
                    tracing::warn!(
                        cm_id = %CommId(id),
                        peer = %c.peer,
                        state = ?c.state,
                        retries = self.max_cm_retries,
                        "CM: peer stopped answering: timeout"
                    );
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

/// The first `N` bytes of `b`, zero padded: private data as the wire carries it (its length is
/// not on the wire; IBTA 12.6, unverified: senders pad with zeros).
fn pad<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = b.len().min(N);
    out[..n].copy_from_slice(&b[..n]);
    out
}
