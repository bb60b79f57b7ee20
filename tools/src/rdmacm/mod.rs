//! `rdma_cm` on a real datapath: QP1 (the GSI QP) carrying the IB CM's MADs for a
//! [`CmAgent`], turned together with the engine, and the steps an `rdma_cm` application takes
//! to connect an RC QP: `Cm::connect_rc` (`rdma_resolve_*` + `rdma_connect`) and
//! `Cm::accept_rc` (`rdma_listen` + `rdma_accept`). Used by `rocemu rping`, by `rocemu perf
//! --rdma-cm` (perftest's `-R`) and by `rocemu pingpong --rdma-cm`.
//!
//! Invariants:
//! * Nothing a peer sends ends the server or blocks its loop: a MAD to an address whose MAC is
//!   unknown waits in a bounded queue while the engine is asked (without waiting), leaves once
//!   the answer is in, and is dropped after [`SOLICIT_FOR`]; a connection request from such an
//!   address is accepted only once it resolves, and forgotten (counted) if it never does; a
//!   REP whose RTU never comes is withdrawn and the next request served. What was dropped is in
//!   [`GsiCounters`] and the agent's [`rocemu_emulator::cm::CmCounters`].
//!
//! What goes on the wire follows Linux's `rdma_cm` over rxe (`wire/tests/data/cm/`): the REQ's
//! private data starts with the 36-byte `cma_hdr` naming both IP endpoints, the service ID is the
//! rdma_cm TCP port space plus the port, and each end's Starting PSN is the PSN it expects to
//! receive (the peer sends from it).
use crate::remote::Endpoint;
use rocemu_emulator::cm::gsi::Gsi;
use rocemu_emulator::cm::{CmAgent, CmCounters, CmEvent, CmState, ConnParams};
use rocemu_emulator::rnic::*;
use rocemu_wire::cm::{
    rdma_cm_flow_label, CmaHdr, CommId, PortSpace, RejReason, ReqRepr, ServiceId,
};
use rocemu_wire::eth::Mac;
use rocemu_wire::mad::{timeout_nanos, MAD_LEN};
use rocemu_wire::{Psn, Qpn};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Receives kept posted on QP1: a burst of MADs beyond them is dropped by the RNIC (counted
/// there), as a NIC drops what finds no receive; enough for a burst of the engine's.
const MAD_RECVS: usize = 64;
const MAD_SENDS: usize = 64;
/// How long a CM step (an answer to a REQ, a REQ on a listener) may take.
pub(crate) const CM_TIMEOUT: Duration = Duration::from_secs(30);
const RESOLVE: Duration = Duration::from_secs(5);
/// Wr ids of QP1's work: receives are `ID_MAD_RECV * 1000 + slot`.
const ID_MAD_RECV: u64 = 10;
const ID_MAD_SEND: u64 = 11;
/// Addresses without a MAC that MADs may wait for at once, and MADs per address: what a forger
/// sending from made-up addresses can make us hold.
const UNRESOLVED_PEERS: usize = 32;
const UNRESOLVED_MADS: usize = 4;
/// How often an unresolved address is asked about again, and for how long.
pub const SOLICIT_EVERY: Duration = Duration::from_millis(500);
pub const SOLICIT_FOR: Duration = Duration::from_secs(3);
/// Events kept for a step that has not asked for them yet; beyond, the oldest go.
pub const EVENTS_MAX: usize = 1024;

/// What QP1's glue counts (the agent counts the rest, [`CmCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiCounters {
    pub mads_sent: u64,
    /// MADs that waited for their destination's MAC.
    pub mads_deferred: u64,
    /// MADs dropped: their destination never answered ARP / ND within [`SOLICIT_FOR`].
    pub mads_dropped_unresolved: u64,
    /// MADs dropped: too many unresolved destinations, or MADs for one, already waiting.
    pub mads_dropped_queue_full: u64,
    /// MADs the RNIC refused to send (post_send failed).
    pub send_failures: u64,
    /// Connection requests forgotten because their sender never resolved.
    pub reqs_unreachable: u64,
    /// Accepted connections withdrawn because the RTU never came.
    pub accepts_withdrawn: u64,
    /// Events dropped because nobody took them ([`EVENTS_MAX`]).
    pub events_dropped: u64,
}

/// MADs waiting for `to`'s MAC.
struct Unresolved {
    to: IpAddr,
    mads: Vec<[u8; MAD_LEN]>,
    since: Instant,
    asked: Instant,
}

/// A connection request whose sender's MAC is being asked for.
struct Waiting {
    id: CommId,
    from: IpAddr,
    req: Box<ReqRepr>,
    since: Instant,
    asked: Instant,
}

/// QP1 and the CM agent, driven by the engine's turns.
pub(crate) struct Cm {
    gsi: Gsi,
    pub(crate) agent: CmAgent,
    /// Events the agent reported that no one has taken yet: a step waiting for one event must
    /// not lose another (a REQ may come in while a SEND's ACK is awaited).
    events: VecDeque<CmEvent>,
    unresolved: Vec<Unresolved>,
    stats: GsiCounters,
    /// Whether [`Cm::linger`] has already stayed for the peer's repeated DREQs (once a run).
    time_wait_served: bool,
}

/// An RC QP's side of a connection, as `rdma_connect` / `rdma_accept` describe it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RcSide {
    pub qpn: Qpn,
    /// The PSN this end expects to receive first (announced in REQ/REP).
    pub psn: Psn,
    /// `enum ibv_mtu` this end asks for (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Reads/atomics this end accepts as responder (`responder_resources`).
    pub responder_resources: u8,
    /// Reads/atomics this end keeps in flight as requester (`initiator_depth`).
    pub initiator_depth: u8,
    /// Local ACK timeout exponent for the QP (not carried by the CM on RoCE).
    pub timeout: u8,
}

/// A connected RC QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RcConn {
    pub id: CommId,
    pub peer: IpAddr,
    pub remote_qpn: Qpn,
    /// The PSN the peer expects first (we send from it).
    pub remote_psn: Psn,
}

impl Cm {
    pub(crate) fn new(ep: &mut Endpoint) -> Result<Cm, String> {
        let r = &mut ep.rnic;
        let gsi = Gsi::open(r, MAD_SENDS, MAD_RECVS).map_err(|e| e.to_string())?;
        for i in 0..MAD_RECVS {
            post_mad_recv(r, &gsi, i)?;
        }
        let ip = r.ips()[0];
        let guid = r.node_guid();
        // The CM's IDs are drawn from a generator forked from the RNIC's: unguessable in
        // deployment (the RNIC is seeded by the OS), replayed with `--seed`.
        let seed = r.random_seed();
        Ok(Cm {
            gsi,
            agent: CmAgent::with_seed(ip, guid, &seed),
            events: VecDeque::new(),
            unresolved: Vec::new(),
            stats: GsiCounters::default(),
            time_wait_served: false,
        })
    }

    pub(crate) fn counters(&self) -> (CmCounters, GsiCounters) {
        (self.agent.counters(), self.stats)
    }

    /// The counters on one line, for the tools to print.
    pub(crate) fn counters_line(&self) -> String {
        let (c, g) = self.counters();
        format!(
            "rdma_cm: {} REQs ({} repeated, {} refused for a full backlog, {} without listener, \
             {} expired unanswered, {} from unreachable senders), {} timeouts, {} time-waits \
             reaped, {} malformed MADs, {} for unknown connections; MADs {} sent, {} deferred, \
             {} dropped unresolved, {} dropped queue full, {} send failures; {} accepts \
             withdrawn, {} events dropped; {} connections held",
            c.reqs_received,
            c.reqs_duplicate,
            c.reqs_rejected_backlog,
            c.reqs_no_listener,
            c.half_open_expired,
            g.reqs_unreachable,
            c.timeouts,
            c.time_wait_reaped,
            c.malformed,
            c.unknown_connection,
            g.mads_sent,
            g.mads_deferred,
            g.mads_dropped_unresolved,
            g.mads_dropped_queue_full,
            g.send_failures,
            g.accepts_withdrawn,
            g.events_dropped,
            self.agent.connections(),
        )
    }

    /// One turn ([`pump`](Self::pump)), then the oldest event not yet taken.
    pub(crate) fn turn(&mut self, ep: &mut Endpoint) -> Result<Option<CmEvent>, String> {
        self.pump(ep)?;
        Ok(self.events.pop_front())
    }

    /// Takes the oldest event that `f` wants, leaving the others queued.
    pub(crate) fn take(&mut self, f: impl Fn(&CmEvent) -> bool) -> Option<CmEvent> {
        let i = self.events.iter().position(f)?;
        self.events.remove(i)
    }

    /// One turn: the engine, MADs in, timers, MADs out; the agent's events are queued.
    pub(crate) fn pump(&mut self, ep: &mut Endpoint) -> Result<(), String> {
        let w = ep.engine.poll(&mut ep.rnic);
        let now = ep.engine.now();
        let mut wcs = Vec::new();
        ep.rnic
            .poll_cq_into(self.gsi.cq, MAD_SENDS + MAD_RECVS, &mut wcs);
        for wc in &wcs {
            if wc.wr_id < ID_MAD_RECV * 1000 {
                continue; // a send completion
            }
            let i = (wc.wr_id - ID_MAD_RECV * 1000) as usize;
            if let Some((from, mad)) = self.gsi.received(&ep.rnic, i, wc) {
                self.agent.handle_mad(now, from, &mad);
            }
            post_mad_recv(&mut ep.rnic, &self.gsi, i)?;
        }
        if self.agent.poll_timeout().is_some_and(|t| t <= now) {
            self.agent.handle_timeout(now);
        }
        while let Some((to, mad)) = self.agent.poll_transmit() {
            self.send_mad(ep, to, &mad);
        }
        self.serve_unresolved(ep);
        let mut new = false;
        while let Some(e) = self.agent.poll_event() {
            // A REQ that expired unanswered: the agent has forgotten it, nobody waits on it.
            if matches!(e, CmEvent::Timeout { id } if self.agent.state(id).is_none()) {
                continue;
            }
            if self.events.len() >= EVENTS_MAX {
                self.events.pop_front();
                self.stats.events_dropped += 1;
            }
            self.events.push_back(e);
            new = true;
        }
        if !new && w == 0 && wcs.is_empty() {
            ep.engine.idle(0);
        }
        Ok(())
    }

    /// Sends `mad` to `to`'s QP1 now if its MAC is known, else queues it (bounded) and asks.
    /// Never waits for the peer and never fails the caller: what cannot go is counted.
    fn send_mad(&mut self, ep: &mut Endpoint, to: IpAddr, mad: &[u8; MAD_LEN]) {
        if let Some(mac) = ep.engine.neighbor(&mut ep.rnic, to) {
            self.post_mad(ep, to, mac, mad);
            return;
        }
        if let Some(u) = self.unresolved.iter_mut().find(|u| u.to == to) {
            if u.mads.len() < UNRESOLVED_MADS {
                u.mads.push(*mad);
                self.stats.mads_deferred += 1;
            } else {
                self.stats.mads_dropped_queue_full += 1;
            }
            return;
        }
        if self.unresolved.len() >= UNRESOLVED_PEERS {
            self.stats.mads_dropped_queue_full += 1;
            return;
        }
        if ep.engine.solicit(&mut ep.rnic, to).is_err() {
            self.stats.send_failures += 1;
            return;
        }
        let now = Instant::now();
        self.unresolved.push(Unresolved {
            to,
            mads: vec![*mad],
            since: now,
            asked: now,
        });
        self.stats.mads_deferred += 1;
    }

    /// The queued MADs: sent when their address resolved, dropped when it did not in time.
    fn serve_unresolved(&mut self, ep: &mut Endpoint) {
        let mut i = 0;
        while i < self.unresolved.len() {
            let to = self.unresolved[i].to;
            if let Some(mac) = ep.engine.neighbor(&mut ep.rnic, to) {
                let u = self.unresolved.swap_remove(i);
                for m in &u.mads {
                    self.post_mad(ep, to, mac, m);
                }
                continue;
            }
            let u = &mut self.unresolved[i];
            if u.since.elapsed() > SOLICIT_FOR {
                self.stats.mads_dropped_unresolved += u.mads.len() as u64;
                ep.engine.forget_solicit(to);
                self.unresolved.swap_remove(i);
                continue;
            }
            if u.asked.elapsed() > SOLICIT_EVERY {
                u.asked = Instant::now();
                let _ = ep.engine.solicit(&mut ep.rnic, to);
            }
            i += 1;
        }
    }

    fn post_mad(&mut self, ep: &mut Endpoint, to: IpAddr, mac: Mac, mad: &[u8; MAD_LEN]) {
        // One send buffer (slot 0), from our first GID: the endpoint's address.
        if self
            .gsi
            .send(&mut ep.rnic, 0, ID_MAD_SEND, to, mac, 0, mad)
            .is_err()
        {
            self.stats.send_failures += 1;
            return;
        }
        self.stats.mads_sent += 1;
        // One send buffer: let it leave before the next MAD is copied in.
        let t = Instant::now();
        while ep.rnic.poll_cq(self.gsi.cq, 0).is_empty() && ep.rnic.wants_transmit() {
            ep.engine.poll(&mut ep.rnic);
            if t.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
    }

    /// Turns until the agent reports something.
    pub(crate) fn wait_event(&mut self, ep: &mut Endpoint, what: &str) -> Result<CmEvent, String> {
        let t = Instant::now();
        loop {
            if let Some(e) = self.turn(ep)? {
                return Ok(e);
            }
            if t.elapsed() > CM_TIMEOUT {
                return Err(format!(
                    "rdma_cm: no {what} within {} s",
                    CM_TIMEOUT.as_secs()
                ));
            }
        }
    }

    /// Turns until an event about connection `id` comes (others stay queued).
    fn wait_for(&mut self, ep: &mut Endpoint, id: CommId, what: &str) -> Result<CmEvent, String> {
        let t = Instant::now();
        loop {
            if let Some(e) = self.take(|e| e.id() == id) {
                return Ok(e);
            }
            if t.elapsed() > CM_TIMEOUT {
                return Err(format!(
                    "rdma_cm: no {what} within {} s",
                    CM_TIMEOUT.as_secs()
                ));
            }
            self.pump(ep)?;
        }
    }

    /// The active side (`rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`): a REQ for
    /// `me` to `server`:`port`, and on the REP the QP goes to RTR and RTS (the agent sends the
    /// RTU). A REJ "no listener" (reason 8) is retried `rej_retries` times 100 ms apart, as
    /// perftest's client does: its server listens only after the exchange step before.
    pub(crate) fn connect_rc(
        &mut self,
        ep: &mut Endpoint,
        server: IpAddr,
        port: u16,
        me: &RcSide,
        rej_retries: u32,
    ) -> Result<RcConn, String> {
        let service = ServiceId::rdma_cm(PortSpace::TCP, port);
        let local = ep.rnic.ips()[0];
        ep.engine.resolve(&mut ep.rnic, server, RESOLVE)?;
        let mut tries = 0;
        loop {
            // rdma_cm's source port: an ephemeral one, as Linux picks for rdma_resolve_addr.
            let src_port = 32768 + (ep.engine.now().0 % 28000) as u16;
            let mut pd = [0u8; 92];
            CmaHdr::new(SocketAddr::new(local, src_port), server)
                .and_then(|h| h.emit(&mut pd))
                .map_err(|e| format!("rdma_cm: {e}"))?;
            // As Linux's rdma_cm: the path's flow label from the two ports, and the QP's UDP
            // source port from it (cma_get_roce_udp_flow_label, rdma_get_udp_sport).
            let flow_label = rdma_cm_flow_label(src_port, port);
            let p = ConnParams {
                qpn: me.qpn,
                psn: me.psn,
                path_mtu: me.path_mtu,
                responder_resources: me.responder_resources,
                initiator_depth: me.initiator_depth,
                private_data: pd,
                flow_label,
                ..ConnParams::default()
            };
            let now = ep.engine.now();
            let id = self.agent.connect(now, server, service, &p);
            match self.wait_for(ep, id, "answer to our REQ")? {
                CmEvent::Established {
                    remote_qpn,
                    remote_psn,
                    rep_rd_atomic,
                    ..
                } => {
                    // Our reads in flight: no more than we asked for nor than the passive side
                    // accepts (the REP's responder resources). Our responder resources: the
                    // ones we offered in the REQ, which bound the REP's initiator depth.
                    let granted = rep_rd_atomic.map_or(me.initiator_depth, |(rr, _)| rr);
                    let path = Path {
                        peer: server,
                        flow_label,
                    };
                    let depth = (me.initiator_depth.min(granted), me.responder_resources);
                    rc_up(ep, me, depth, path, remote_qpn, remote_psn)?;
                    return Ok(RcConn {
                        id,
                        peer: server,
                        remote_qpn,
                        remote_psn,
                    });
                }
                CmEvent::Rejected { reason, .. }
                    if reason == RejReason::INVALID_SERVICE_ID && tries < rej_retries =>
                {
                    tries += 1;
                    let until = Instant::now() + Duration::from_millis(100);
                    while Instant::now() < until {
                        self.pump(ep)?;
                    }
                }
                CmEvent::Rejected { reason, .. } => {
                    return Err(format!(
                        "rdma_cm: {server} port {port} rejected the connection ({})",
                        rej_text(reason)
                    ))
                }
                e => return Err(format!("rdma_cm: connecting to {server}: {e:?}")),
            }
        }
    }

    /// The passive side (`rdma_listen`, then `rdma_accept` on the next CONNECT_REQUEST): waits
    /// for a REQ on `port`, moves the QP to RTR and RTS with the REQ's values, sends the REP and
    /// waits for the RTU. `prepare` runs once the QP can receive and before the REP leaves
    /// (post the first receives there: the peer may send as soon as it has the REP). Call
    /// [`listen`](Self::listen) first.
    pub(crate) fn accept_rc(
        &mut self,
        ep: &mut Endpoint,
        me: &RcSide,
        wait: Duration,
        mut prepare: impl FnMut(&mut Endpoint) -> Result<(), String>,
    ) -> Result<RcConn, String> {
        let t = Instant::now();
        let mut waiting: Vec<Waiting> = Vec::new();
        let r = loop {
            let Some((id, from, req)) = self.next_request(ep, &mut waiting, t, wait)? else {
                break Err(format!(
                    "rdma_cm: no connection request within {} s",
                    wait.as_secs()
                ));
            };
            let mine = accepted(me, &req);
            let path = Path {
                peer: from,
                flow_label: req.primary_path.flow_label,
            };
            // What the REP will say: reads in flight no deeper than the active side accepts,
            // responder resources for as many as it keeps in flight. One value for both (the
            // smaller) once left the passive side of perftest -R with one responder resource
            // when the client accepted one read itself.
            rc_up(
                ep,
                &mine,
                (mine.initiator_depth, mine.responder_resources),
                path,
                req.local_qpn,
                req.starting_psn,
            )?;
            prepare(ep)?;
            let p = ConnParams {
                qpn: mine.qpn,
                psn: mine.psn,
                path_mtu: mine.path_mtu,
                responder_resources: mine.responder_resources,
                initiator_depth: mine.initiator_depth,
                ..ConnParams::default()
            };
            let now = ep.engine.now();
            if self.agent.accept(now, id, &p).is_err() {
                // Expired or withdrawn since it was taken: the next one.
                reset_qp(ep, me.qpn)?;
                continue;
            }
            match self.wait_for(ep, id, "RTU") {
                Ok(CmEvent::Established { .. }) => {
                    break Ok(RcConn {
                        id,
                        peer: from,
                        remote_qpn: req.local_qpn,
                        remote_psn: req.starting_psn,
                    })
                }
                // No RTU (a REQ with a borrowed source address, or a client gone): withdraw
                // the REP and serve the next request on a QP made new.
                _ => {
                    self.agent.close(id);
                    self.stats.accepts_withdrawn += 1;
                    reset_qp(ep, me.qpn)?;
                }
            }
        };
        // Requests still being resolved stay for the next accept (which asks again).
        for w in waiting.into_iter().rev() {
            ep.engine.forget_solicit(w.from);
            self.events.push_front(CmEvent::ConnectRequest {
                id: w.id,
                from: w.from,
                req: w.req,
            });
        }
        r
    }

    /// The next connection request whose sender's MAC is known, without waiting on any one
    /// sender: one whose address does not resolve yet waits in `waiting` (its address asked
    /// about every [`SOLICIT_EVERY`]) while others are served, and is forgotten after
    /// [`SOLICIT_FOR`]. `None` when `wait` since `t` has passed.
    fn next_request(
        &mut self,
        ep: &mut Endpoint,
        waiting: &mut Vec<Waiting>,
        t: Instant,
        wait: Duration,
    ) -> Result<Option<(CommId, IpAddr, Box<ReqRepr>)>, String> {
        loop {
            if let Some(CmEvent::ConnectRequest { id, from, req }) =
                self.take(|e| matches!(e, CmEvent::ConnectRequest { .. }))
            {
                if self.agent.state(id) != Some(CmState::ReqRcvd) {
                    continue;
                }
                if ep.engine.neighbor(&mut ep.rnic, from).is_some() {
                    return Ok(Some((id, from, req)));
                }
                if ep.engine.solicit(&mut ep.rnic, from).is_err() {
                    self.agent.abandon(id);
                    self.stats.reqs_unreachable += 1;
                    continue;
                }
                let now = Instant::now();
                waiting.push(Waiting {
                    id,
                    from,
                    req,
                    since: now,
                    asked: now,
                });
                continue;
            }
            let mut i = 0;
            while i < waiting.len() {
                let w = &mut waiting[i];
                if self.agent.state(w.id) != Some(CmState::ReqRcvd) {
                    ep.engine.forget_solicit(w.from);
                    waiting.swap_remove(i);
                    continue;
                }
                if ep.engine.neighbor(&mut ep.rnic, w.from).is_some() {
                    let w = waiting.swap_remove(i);
                    return Ok(Some((w.id, w.from, w.req)));
                }
                if w.since.elapsed() > SOLICIT_FOR {
                    // Nowhere to send a REJ: forget it without a word.
                    ep.engine.forget_solicit(w.from);
                    self.agent.abandon(w.id);
                    self.stats.reqs_unreachable += 1;
                    waiting.swap_remove(i);
                    continue;
                }
                if w.asked.elapsed() > SOLICIT_EVERY {
                    w.asked = Instant::now();
                    let _ = ep.engine.solicit(&mut ep.rnic, w.from);
                }
                i += 1;
            }
            if t.elapsed() > wait {
                return Ok(None);
            }
            self.pump(ep)?;
        }
    }

    /// Listens on `port` of rdma_cm's TCP port space.
    pub(crate) fn listen(&mut self, port: u16) {
        self.agent.listen(ServiceId::rdma_cm(PortSpace::TCP, port));
    }

    /// Ends every connection in `ids` (`rdma_disconnect`): a DREQ for those still up, then
    /// waits up to `wait` for each to be closed, by our DREQ's DREP or by the peer's DREQ.
    ///
    /// The wait is at least [`Cm::dreq_patience`]: a DREQ or its DREP lost on the way is only
    /// resent after the CM response timeout, and a peer whose DREQ never came waits for it
    /// (perftest's client blocks in `rdma_get_cm_event` until every test QP is disconnected).
    pub(crate) fn disconnect_all(&mut self, ep: &mut Endpoint, ids: &[CommId], wait: Duration) {
        for &id in ids {
            if self.agent.state(id) == Some(CmState::Established) {
                let now = ep.engine.now();
                let _ = self.agent.disconnect(now, id);
            }
        }
        self.linger(ep, ids, wait.max(self.dreq_patience()));
    }

    /// How long an unanswered DREQ is worth waiting for: two of the agent's retransmissions
    /// (4.096 µs × 2^`cm_response_timeout` apart: 4.3 s for Linux's and our 20) and a second.
    pub(crate) fn dreq_patience(&self) -> Duration {
        Duration::from_nanos(2 * timeout_nanos(self.agent.cm_response_timeout))
            + Duration::from_secs(1)
    }

    /// Keeps answering (DREQs, repeated MADs) until none of `ids` is established or
    /// disconnecting any more, or `wait` has passed.
    pub(crate) fn linger(&mut self, ep: &mut Endpoint, ids: &[CommId], wait: Duration) {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            let open = ids.iter().any(|&id| {
                matches!(
                    self.agent.state(id),
                    Some(CmState::Established | CmState::DreqSent)
                )
            });
            if !open {
                break;
            }
            if self.pump(ep).is_err() {
                break;
            }
        }
        // Let the last answers (DREP, ACKs) leave. Where our port drops frames on purpose
        // (`--loss`), a DREP we sent may be one of them: the peer then sends its DREQ again after
        // waiting the CM response timeout we announced (4.3 s) and, unanswered, goes on through
        // all its retries (Linux: 15, over a minute) before it gives up; perftest's client sat
        // that long in `rdma_get_cm_event`. A kernel CM answers such repeats after the process
        // has gone; once a run, when every connection is closed, we stay that long instead.
        let closed = !ids.iter().any(|&id| {
            matches!(
                self.agent.state(id),
                Some(CmState::Established | CmState::DreqSent)
            )
        });
        let tail = if closed && !self.time_wait_served && ep.engine.port().impaired() {
            self.time_wait_served = true;
            // Linux waits 2 × the path's packet lifetime more (ib_cm's timeout_ms; 0.5 s for
            // rdma_cm's RoCE lifetime): a second covers it.
            Duration::from_nanos(timeout_nanos(self.agent.cm_response_timeout))
                + Duration::from_secs(1)
        } else {
            Duration::from_millis(50)
        };
        let end = Instant::now() + tail;
        while Instant::now() < end {
            if self.pump(ep).is_err() {
                break;
            }
        }
    }
}

/// The server's address as rdma_cm's tools take it: a literal, else the resolver's first answer
/// (only IPv4 ones with `ipv4_only`, as perftest asks `getaddrinfo` for AF_INET).
pub(crate) fn server_ip(name: &str, port: u16, ipv4_only: bool) -> Result<IpAddr, String> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(ip);
    }
    (name, port)
        .to_socket_addrs()
        .map_err(|e| format!("{name}: {e}"))?
        .find(|a| !ipv4_only || a.is_ipv4())
        .map(|a| a.ip())
        .ok_or_else(|| format!("{name}: no {}address", if ipv4_only { "IPv4 " } else { "" }))
}

/// What the passive side settles from a REQ: the smaller MTU, and reads/atomics no deeper than the
/// active side offers (IBTA 12.7.31, unverified: responder resources ≤ the REQ's initiator depth).
fn accepted(me: &RcSide, req: &ReqRepr) -> RcSide {
    let mtu = if (1..=5).contains(&req.path_mtu) {
        req.path_mtu.min(me.path_mtu)
    } else {
        me.path_mtu
    };
    RcSide {
        path_mtu: mtu,
        responder_resources: me.responder_resources.min(req.initiator_depth),
        initiator_depth: me.initiator_depth.min(req.responder_resources),
        ..*me
    }
}

fn rej_text(r: RejReason) -> String {
    match r {
        RejReason::INVALID_SERVICE_ID => "reason 8: nobody listens there".into(),
        RejReason::CONSUMER_DEFINED => "reason 28: refused by the application".into(),
        r => format!("reason {}", r.0),
    }
}

/// Where a connection goes: the peer, and the REQ's flow label.
#[derive(Debug, Clone, Copy)]
struct Path {
    peer: IpAddr,
    flow_label: u32,
}

/// RTR and RTS for a CM-connected RC QP: the peer sends from the PSN we announced, we send from
/// the one it announced.
fn rc_up(
    ep: &mut Endpoint,
    me: &RcSide,
    (max_rd_atomic, max_dest_rd_atomic): (u8, u8),
    path: Path,
    remote_qpn: Qpn,
    remote_psn: Psn,
) -> Result<(), String> {
    let peer = path.peer;
    ep.engine.resolve(&mut ep.rnic, peer, RESOLVE)?;
    let active = ep.rnic.active_mtu();
    let mtu = crate::oob::mtu_from_enum(me.path_mtu as i64)
        .and_then(|b| Mtu::from_bytes(b as usize))
        .filter(|m| m.bytes() <= active.bytes())
        .unwrap_or(active);
    let o = rocemu_emulator::connect::ConnectOpts {
        mtu,
        timeout: me.timeout,
        max_rd_atomic: max_rd_atomic.max(1),
        max_dest_rd_atomic: max_dest_rd_atomic.max(1),
        flow_label: path.flow_label,
        ..Default::default()
    };
    rocemu_emulator::connect::bring_up(
        &mut ep.rnic,
        me.qpn,
        remote_qpn,
        peer,
        remote_psn,
        me.psn,
        &o,
    )
    .map_err(|e| format!("modify QP {:#x}: {e}", me.qpn.value()))
}

/// Back to RESET, so the QP can be brought up again for another connection.
fn reset_qp(ep: &mut Endpoint, qpn: Qpn) -> Result<(), String> {
    let attr = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    ep.rnic
        .modify_qp(qpn, &attr, QpAttrMask::STATE)
        .map_err(|e| format!("modify QP {:#x} to RESET: {e}", qpn.value()))
}

fn post_mad_recv(r: &mut Rnic, g: &Gsi, i: usize) -> Result<(), String> {
    g.post_recv(r, i, ID_MAD_RECV * 1000 + i as u64)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
