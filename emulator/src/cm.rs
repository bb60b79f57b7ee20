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
//!
//! Not yet: MRA, LAP/APR (alternate paths), SIDR, and the time-wait state's stale-connection
//! checks. `rocemu-testbed`'s `rdmacm` wires it to an engine for `rocemu rping`, `perf -R` and
//! `pingpong --rdma-cm`; the conformance agent (`rocemu-conformance`, `agent::cm`) to its RNIC.
use crate::rng::{KeyRng, Seed};
use crate::time::Nanos;
use rocemu_wire::cm::{
    CmMadRepr, CmMessage, CmPath, CommId, DreqRepr, Guid, MsgKind, RejReason, RejRepr, RepRepr,
    ReqRepr, RtuRepr, ServiceId, ServiceType,
};
use rocemu_wire::mad::{timeout_nanos, Tid, MAD_LEN};
use rocemu_wire::{PKey, Psn, QKey, Qpn};
use std::collections::{HashMap, VecDeque};
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
    deadline: Option<Nanos>,
    /// The last answer we gave (REP, RTU, DREP), sent again when the peer repeats itself.
    last_answer: Option<CmMadRepr>,
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
    listens: Vec<ServiceId>,
    conns: HashMap<u32, Conn>,
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
            listens: Vec::new(),
            conns: HashMap::new(),
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

    /// Active side: sends a REQ for `service` at `peer`.
    pub fn connect(
        &mut self,
        now: Nanos,
        peer: IpAddr,
        service: ServiceId,
        p: &ConnParams,
    ) -> CommId {
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
        self.conns.insert(
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
                deadline: Some(self.wait(now)),
                last_answer: None,
            },
        );
        id
    }

    /// Passive side: answers a [`CmEvent::ConnectRequest`] with a REP.
    pub fn accept(&mut self, now: Nanos, id: CommId, p: &ConnParams) -> Result<(), String> {
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
        c.state = CmState::RepSent;
        c.local_qpn = p.qpn;
        c.pending = Some(mad);
        c.last_answer = Some(mad);
        c.retries_left = retries;
        c.deadline = Some(deadline);
        self.out.push_back((c.peer, mad));
        Ok(())
    }

    /// Passive side: refuses a [`CmEvent::ConnectRequest`] (or, REP sent, the connection it
    /// was to become).
    pub fn reject(&mut self, id: CommId, reason: RejReason) {
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
            c.state = CmState::TimeWait;
            c.pending = None;
            c.deadline = None;
        }
    }

    /// Sends a DREQ on an established connection.
    pub fn disconnect(&mut self, now: Nanos, id: CommId) -> Result<(), String> {
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
        c.state = CmState::DreqSent;
        c.pending = Some(mad);
        c.retries_left = retries;
        c.deadline = Some(deadline);
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
        self.conns.remove(&id.0);
        self.events.retain(|e| e.id() != id);
    }

    /// A MAD that arrived on QP1 from `from`.
    pub fn handle_mad(&mut self, now: Nanos, from: IpAddr, bytes: &[u8]) {
        let Ok(m) = CmMadRepr::parse(bytes) else {
            return;
        };
        let tid = m.mad.tid;
        match m.msg {
            CmMessage::Req(r) => self.on_req(from, tid, r),
            CmMessage::Rep(r) => self.on_rep(r),
            CmMessage::Rtu(r) => {
                if let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) {
                    if c.state == CmState::RepSent && c.remote_comm_id == r.local_comm_id {
                        c.state = CmState::Established;
                        c.pending = None;
                        c.deadline = None;
                        self.events.push_back(CmEvent::Established {
                            id: r.remote_comm_id,
                            remote_qpn: c.remote_qpn,
                            remote_psn: c.remote_psn,
                            rep_rd_atomic: None,
                        });
                    }
                }
            }
            CmMessage::Rej(r) => {
                if let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) {
                    if matches!(c.state, CmState::ReqSent | CmState::RepSent) {
                        c.state = CmState::TimeWait;
                        c.pending = None;
                        c.deadline = None;
                        self.events.push_back(CmEvent::Rejected {
                            id: r.remote_comm_id,
                            reason: r.reason,
                        });
                    }
                }
            }
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
                    self.out.push_back((from, drep));
                    return;
                };
                if c.remote_comm_id != r.local_comm_id {
                    return;
                }
                // A repeated DREQ gets the same DREP; the first one ends the connection.
                self.out.push_back((c.peer, drep));
                if matches!(c.state, CmState::Established | CmState::DreqSent) {
                    c.state = CmState::TimeWait;
                    c.pending = None;
                    c.deadline = None;
                    c.last_answer = Some(drep);
                    self.events.push_back(CmEvent::Disconnected {
                        id: r.remote_comm_id,
                    });
                }
            }
            CmMessage::Drep(r) => {
                if let Some(c) = self.conns.get_mut(&r.remote_comm_id.0) {
                    if c.state == CmState::DreqSent {
                        c.state = CmState::TimeWait;
                        c.pending = None;
                        c.deadline = None;
                        self.events.push_back(CmEvent::Disconnected {
                            id: r.remote_comm_id,
                        });
                    }
                }
            }
            // MRA would stretch our timer; SIDR and the rest are not ours yet.
            _ => {}
        }
        let _ = now;
    }

    fn on_req(&mut self, from: IpAddr, tid: Tid, r: ReqRepr) {
        // A retransmitted REQ: answer again with what we said (IBTA 12.9.5.1), or stay quiet
        // while the application decides.
        if let Some((_, c)) = self
            .conns
            .iter()
            .find(|(_, c)| c.peer == from && c.remote_comm_id == r.local_comm_id)
        {
            if let Some(a) = c.last_answer {
                self.out.push_back((from, a));
            }
            return;
        }
        if !self.listens.contains(&r.service_id) {
            let rej = RejRepr {
                local_comm_id: CommId(0),
                remote_comm_id: r.local_comm_id,
                message_rejected: MsgKind::Req,
                reason: RejReason::INVALID_SERVICE_ID,
                ..RejRepr::default()
            };
            self.out
                .push_back((from, CmMadRepr::new(tid, CmMessage::Rej(rej))));
            return;
        }
        let id = self.new_comm_id();
        self.conns.insert(
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
                deadline: None,
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
                c.state = CmState::Established;
                c.pending = None;
                c.deadline = None;
                c.last_answer = Some(rtu);
                self.out.push_back((c.peer, rtu));
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
            _ => {}
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
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    /// Retransmits what is due, and gives up on what has run out of retries. Idempotent for a
    /// given `now`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        let wait = Nanos(timeout_nanos(self.cm_response_timeout));
        for (id, c) in self.conns.iter_mut() {
            let Some(d) = c.deadline else { continue };
            if d > now {
                continue;
            }
            match (c.pending, c.retries_left) {
                (Some(m), n) if n > 0 => {
                    c.retries_left -= 1;
                    c.deadline = Some(now + wait);
                    self.out.push_back((c.peer, m));
                }
                _ => {
                    c.state = CmState::TimeWait;
                    c.pending = None;
                    c.deadline = None;
                    self.events.push_back(CmEvent::Timeout { id: CommId(*id) });
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
        assert_eq!(a.poll_timeout(), None);
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
