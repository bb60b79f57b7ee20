//! The CM beside the RNIC: QP1 (the GSI QP) carrying the IB CM's MADs for a [`CmAgent`], the
//! state of every `rdma_cm_id`, address resolution, and the events each event channel holds.
//! It lives in the RNIC's lock ([`Inner::cm`](crate::nic::Inner)), made at the first
//! `rdma_create_event_channel` / `rdma_create_id`; the engine thread turns it after each engine
//! turn ([`turn`]), the `rdma_*` calls change it under the same lock.
//!
//! Invariants:
//! * Every id in [`Service::ids`] is a live `Box<rdma_cm_id>` of ours (inserted by
//!   `rdma_create_id` or by a connection request, removed by `rdma_destroy_id`); every channel
//!   in [`Service::queues`] a live `Box<rdma_event_channel>`. Nothing else is dereferenced.
//! * Each queued event adds one to its channel's eventfd (semaphore mode); `rdma_get_cm_event`
//!   reads one, then takes the oldest event (an event taken back when its id is destroyed
//!   leaves a count with no event behind it: the reader reads again).
//! * Bounded: [`QUEUE_MAX`] events per channel (beyond, new events are dropped and counted),
//!   [`UNRESOLVED_PEERS`] × [`UNRESOLVED_MADS`] MADs waiting for a MAC, the agent's own bounds
//!   for connections; ids and channels are the program's.
//! * Nothing a peer sends panics or reaches an id that is not waiting for it: the agent drops
//!   what does not fit its state; an event for a connection whose id is gone is dropped.
use super::abi::*;
use crate::abi::*;
use crate::nic::eventfd_add;
use rocemu_emulator::cm::gsi::Gsi;
use rocemu_emulator::cm::{CmAgent, CmEvent};
use rocemu_emulator::engine::Engine;
use rocemu_emulator::rng::KeyRng;
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::cm::{CmaHdr, CommId, PortSpace, ReqRepr, ServiceId, SidrStatus};
use rocemu_wire::eth::Mac;
use rocemu_wire::mad::MAD_LEN;
use rocemu_wire::{Psn, QKey, Qpn};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

const MAD_RECVS: usize = 64;
const MAD_SENDS: usize = 32;
/// Receives are `ID_RECV + slot`, sends `ID_SEND + slot`.
const ID_RECV: u64 = 1 << 32;
const ID_SEND: u64 = 2 << 32;
/// Events a channel holds unread.
pub const QUEUE_MAX: usize = 4096;
const UNRESOLVED_PEERS: usize = 64;
const UNRESOLVED_MADS: usize = 8;
/// Connection requests that may wait for their sender's MAC at once.
const WAITING_REQS_MAX: usize = 256;
/// MADs that may wait for a send buffer (a burst of connects: cmtime -c 1000).
const BACKLOG_MAX: usize = 4096;
/// How often an address being resolved is asked about again.
const ASK_EVERY: Duration = Duration::from_millis(250);
/// How long MADs wait for their destination's MAC.
const MAD_WAIT: Duration = Duration::from_secs(3);
/// Linux's `-ETIMEDOUT`, the status of an address or connection nobody answered.
pub const ETIMEDOUT: i32 = -libc::ETIMEDOUT;

/// Where an id is in its life (librdmacm's and the kernel's `rdma_cm_state`, as far as RoCE
/// walks them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum St {
    Idle,
    Bound,
    AddrQuery,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ (or SIDR_REQ) sent.
    Connecting,
    /// Active: REP received, the RTU waits for the QP (or `rdma_establish`).
    RepRcvd,
    /// Passive: the REQ was handed to the program, which has not answered.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    Accepting,
    Connected,
    Disconnected,
}

/// What both ends settled for a connection.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conn {
    pub remote_qpn: u32,
    /// The PSN the peer announced: the one it expects first, which we send from.
    pub remote_psn: u32,
    /// Ours: the one we expect first.
    pub my_psn: u32,
    /// `enum ibv_mtu`.
    pub path_mtu: u8,
    /// Reads/atomics we accept as responder (max_dest_rd_atomic).
    pub resp_res: u8,
    /// Reads/atomics we keep in flight (max_rd_atomic).
    pub init_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub flow_label: u32,
    pub remote_qkey: u32,
}

/// One `rdma_cm_id`'s state.
pub struct IdState {
    /// `*mut rdma_event_channel` its events go to.
    pub chan: usize,
    /// The channel was made for it (a NULL channel: synchronous calls), freed with it.
    pub sync: bool,
    pub ps: i32,
    pub qp_type: i32,
    pub st: St,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub comm: Option<CommId>,
    /// Passive ids: the listener they came from.
    pub listener: usize,
    pub conn: Conn,
    pub tos: u8,
    pub ack_timeout: Option<u8>,
    pub reuseaddr: bool,
    pub afonly: bool,
    pub backlog: i32,
    /// What the connection request offered (passive): its initiator depth and responder
    /// resources, the bounds of ours.
    pub offered: (u8, u8),
    /// `rdma_create_ep` on a listener: the QP every request's id gets, and its PD.
    pub ep_qp: Option<(ibv_qp_init_attr, usize)>,
    /// Objects `rdma_create_qp` / `rdma_create_ep` made for it (freed with its QP / it).
    pub own_cqs: bool,
    pub own_srq: bool,
    /// The address resolution under way: until when, and when to ask next.
    pub resolving: Option<(Instant, Instant)>,
    /// Events of this id handed to the program and not yet acked: `rdma_destroy_id` waits for
    /// them, as librdmacm's does (its `events_completed`).
    pub unacked: u32,
}

// SAFETY: the pointers an IdState holds (in `ep_qp`: the program's CQs, SRQ, context) are only
// handed back to the verbs, which check them under the RNIC's lock; the service that owns the
// state is only touched with that lock held.
unsafe impl Send for IdState {}

impl IdState {
    pub fn new(chan: usize, sync: bool, ps: i32, qp_type: i32) -> IdState {
        IdState {
            chan,
            sync,
            ps,
            qp_type,
            st: St::Idle,
            src: None,
            dst: None,
            comm: None,
            listener: 0,
            conn: Conn::default(),
            tos: 0,
            ack_timeout: None,
            reuseaddr: false,
            afonly: false,
            backlog: 0,
            offered: (0, 0),
            ep_qp: None,
            own_cqs: false,
            own_srq: false,
            resolving: None,
            unacked: 0,
        }
    }
}

/// What `rdma_get_cm_event` still has to do with an event before the program sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    None,
    /// Active side, REP received: with a QP on the id, RTR + RTS + RTU and ESTABLISHED; without,
    /// CONNECT_RESPONSE as it is (the program calls `rdma_establish`).
    ConnectResponse,
}

/// An event and the private data it points to.
#[repr(C)]
pub struct Ev {
    pub ev: rdma_cm_event,
    pub post: Post,
    pub data: [u8; 256],
}

// SAFETY: an event's pointers name our ids and its own `data`; it moves between threads only
// through the locked service and `rdma_get_cm_event`.
unsafe impl Send for Ev {}

impl Ev {
    pub fn new(id: usize, event: i32, status: i32) -> Box<Ev> {
        // SAFETY: rdma_cm_event is plain data (pointers, integers, a union of them): zeroes are
        // a valid value.
        let mut e: Box<Ev> = Box::new(unsafe { std::mem::zeroed() });
        e.ev.id = id as *mut rdma_cm_id;
        e.ev.event = event;
        e.ev.status = status;
        e.post = Post::None;
        e
    }

    /// A copy of `d` in the event's own storage (at most 255 bytes, what the length field
    /// holds): where the private data points, and its length.
    fn keep(&mut self, d: &[u8]) -> (*const libc::c_void, u8) {
        let n = d.len().min(self.data.len()).min(255);
        self.data[..n].copy_from_slice(&d[..n]);
        let p = if n > 0 {
            self.data.as_ptr().cast()
        } else {
            std::ptr::null()
        };
        (p, n as u8)
    }

    /// Points the event's (connection) private data at a copy of `d`.
    pub fn set_conn_data(&mut self, d: &[u8]) {
        let (p, n) = self.keep(d);
        self.ev.param.conn.private_data = p;
        self.ev.param.conn.private_data_len = n;
    }

    /// Points the event's (UD) private data at a copy of `d`.
    pub fn set_ud_data(&mut self, d: &[u8]) {
        let (p, n) = self.keep(d);
        self.ev.param.ud.private_data = p;
        self.ev.param.ud.private_data_len = n;
    }
}

/// MADs waiting for their destination's MAC.
struct Unresolved {
    to: IpAddr,
    mads: Vec<[u8; MAD_LEN]>,
    since: Instant,
    asked: Instant,
}

/// What the CM counts beside the agent's counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub mads_sent: u64,
    pub mads_dropped_unresolved: u64,
    pub mads_dropped_full: u64,
    pub events_dropped: u64,
    pub events_orphaned: u64,
    /// Connection requests forgotten: their sender never answered ARP / ND.
    pub reqs_unreachable: u64,
}

/// QP1, the agent and every id.
pub struct Service {
    gsi: Gsi,
    free_sends: Vec<usize>,
    pub agent: CmAgent,
    pub ids: HashMap<usize, IdState>,
    pub by_comm: HashMap<u32, usize>,
    /// Service ID → listening id.
    pub listeners: HashMap<u64, usize>,
    /// Channel → its unread events.
    pub queues: HashMap<usize, VecDeque<Box<Ev>>>,
    /// The addresses of the last [`GONE_CHANNELS`] channels destroyed (bounded): a thread that
    /// calls `rdma_get_cm_event` on one waits there, as a thread already waiting does.
    pub gone_channels: VecDeque<usize>,
    unresolved: Vec<Unresolved>,
    /// Connection requests (REQ, SIDR_REQ) whose sender's MAC is being asked for: handed to the
    /// program once it answers ARP / ND (an answer could not reach it before), forgotten after
    /// [`MAD_WAIT`] (as Linux's ib_cm drops a REQ whose sender's L2 address does not resolve).
    waiting_reqs: VecDeque<(CmEvent, IpAddr, Instant, Instant)>,
    /// MADs waiting for a free send buffer, oldest first.
    backlog: VecDeque<(IpAddr, Mac, [u8; MAD_LEN])>,
    /// Ids whose address is being resolved.
    pub resolving: Vec<usize>,
    pub rng: KeyRng,
    clock0: Instant,
    pub next_port: u16,
    pub counters: Counters,
    wcs: Vec<Wc>,
    /// Our addresses (GID index i is `ips[i]`).
    pub ips: Vec<IpAddr>,
    /// Engine turns of the service so far (for [`Service::quiet_since`]).
    pub turns: u64,
}

impl Service {
    pub fn new(r: &mut Rnic, ips: Vec<IpAddr>) -> Result<Service, String> {
        let gsi = Gsi::open(r, MAD_SENDS, MAD_RECVS).map_err(|e| e.to_string())?;
        let seed = r.random_seed();
        let mut agent = CmAgent::with_seed(ips[ips.len() - 1], r.node_guid(), &seed);
        // As Linux's rdma_cm for a program's connection request: an MRA (service timeout 24,
        // about 69 s) when the REQ is repeated before the program answered.
        agent.mra_on_req = Some(24);
        agent.mra_at_once = false;
        // Linux's ucma takes a listen backlog of 0 (or above its max_backlog) as max_backlog,
        // 1024; the kernel's IB CM does not bound it further per listener. Ours is one bound
        // for the whole device (ucmatose -c 1000 listens with 0).
        agent.max_half_open = 1024;
        let mut rng = KeyRng::new(&r.random_seed());
        let next_port = 32768 + (rng.next_u32() % 28000) as u16;
        let s = Service {
            gsi,
            free_sends: (0..MAD_SENDS).collect(),
            agent,
            ids: HashMap::new(),
            by_comm: HashMap::new(),
            listeners: HashMap::new(),
            queues: HashMap::new(),
            gone_channels: VecDeque::new(),
            unresolved: Vec::new(),
            backlog: VecDeque::new(),
            waiting_reqs: VecDeque::new(),
            resolving: Vec::new(),
            rng,
            clock0: Instant::now(),
            next_port,
            counters: Counters::default(),
            wcs: Vec::with_capacity(MAD_SENDS + MAD_RECVS),
            ips,
            turns: 0,
        };
        for i in 0..MAD_RECVS {
            s.post_recv(r, i).map_err(|e| e.to_string())?;
        }
        Ok(s)
    }

    /// True when every MAD made before turn `turn` has left: a turn since then has taken what
    /// the agent had to send, and no MAD waits for a send buffer, an address or a completion.
    pub fn quiet_since(&self, turn: u64) -> bool {
        self.turns >= turn + 2
            && self.backlog.is_empty()
            && self.unresolved.is_empty()
            && self.free_sends.len() == MAD_SENDS
    }

    /// The agent's clock.
    pub fn now(&self) -> Nanos {
        Nanos(self.clock0.elapsed().as_nanos() as u64)
    }

    fn post_recv(&self, r: &mut Rnic, i: usize) -> Result<(), VerbsError> {
        self.gsi.post_recv(r, i, ID_RECV + i as u64)
    }

    /// A random 24-bit PSN (as Linux's `get_random_u32() & 0xffffff`).
    pub fn psn(&mut self) -> u32 {
        self.rng.next_u32() & 0xff_ffff
    }

    /// An ephemeral port not used by a listener.
    pub fn ephemeral_port(&mut self, ps: i32) -> u16 {
        for _ in 0..60000 {
            let p = self.next_port;
            self.next_port = if p >= 60999 { 32768 } else { p + 1 };
            let sid = service_id(ps, p).value();
            if !self.listeners.contains_key(&sid) {
                return p;
            }
        }
        self.next_port
    }

    /// The GID index of our address `ip`.
    pub fn gid_index(&self, ip: IpAddr) -> u8 {
        self.ips.iter().position(|a| *a == ip).unwrap_or(1) as u8
    }

    /// Our address of `peer`'s family (the configured one first).
    pub fn local_ip_for(&self, peer: IpAddr) -> Option<IpAddr> {
        let same = |a: &IpAddr| a.is_ipv4() == peer.is_ipv4();
        let link_local = |a: &IpAddr| matches!(a, IpAddr::V6(v) if v.segments()[0] == 0xfe80);
        let peer_ll = link_local(&peer);
        self.ips
            .iter()
            .rev()
            .find(|a| same(a) && link_local(a) == peer_ll)
            .or_else(|| self.ips.iter().rev().find(|a| same(a)))
            .copied()
    }

    /// Queues `e` on `chan` and counts it on the channel's eventfd.
    pub fn push(&mut self, chan: usize, e: Box<Ev>) {
        let Some(q) = self.queues.get_mut(&chan) else {
            self.counters.events_orphaned += 1;
            return;
        };
        if q.len() >= QUEUE_MAX {
            self.counters.events_dropped += 1;
            return;
        }
        q.push_back(e);
        // SAFETY: a channel in `queues` is a live Box<rdma_event_channel> of ours.
        let fd = unsafe { (*(chan as *mut rdma_event_channel)).fd };
        eventfd_add(fd, 1);
    }

    /// Queues an event for id `id` on its channel.
    pub fn event(&mut self, id: usize, e: Box<Ev>) {
        if let Some(chan) = self.ids.get(&id).map(|s| s.chan) {
            self.push(chan, e);
        }
    }

    /// Takes back the unread events of id `id` (it is being destroyed).
    pub fn drop_events_of(&mut self, id: usize) {
        for q in self.queues.values_mut() {
            q.retain(|e| e.ev.id as usize != id && e.ev.listen_id as usize != id);
        }
    }

    fn send_mad(&mut self, r: &mut Rnic, engine: &mut Engine, to: IpAddr, mad: &[u8; MAD_LEN]) {
        if let Some(mac) = engine.neighbor(r, to) {
            self.post_mad(r, to, mac, mad);
            return;
        }
        if let Some(u) = self.unresolved.iter_mut().find(|u| u.to == to) {
            if u.mads.len() < UNRESOLVED_MADS {
                u.mads.push(*mad);
            } else {
                self.counters.mads_dropped_full += 1;
            }
            return;
        }
        if self.unresolved.len() >= UNRESOLVED_PEERS || engine.solicit(r, to).is_err() {
            self.counters.mads_dropped_full += 1;
            return;
        }
        let now = Instant::now();
        self.unresolved.push(Unresolved {
            to,
            mads: vec![*mad],
            since: now,
            asked: now,
        });
    }

    /// Posts `mad` from a free send buffer, or queues it (bounded) until one is free.
    fn post_mad(&mut self, r: &mut Rnic, to: IpAddr, mac: Mac, mad: &[u8; MAD_LEN]) {
        if self.free_sends.is_empty() || !self.backlog.is_empty() {
            if self.backlog.len() < BACKLOG_MAX {
                self.backlog.push_back((to, mac, *mad));
            } else {
                self.counters.mads_dropped_full += 1;
            }
            return;
        }
        self.post_now(r, to, mac, mad);
    }

    fn post_now(&mut self, r: &mut Rnic, to: IpAddr, mac: Mac, mad: &[u8; MAD_LEN]) {
        let Some(slot) = self.free_sends.pop() else {
            self.counters.mads_dropped_full += 1;
            return;
        };
        let sgid = self
            .local_ip_for(to)
            .map(|ip| self.gid_index(ip))
            .unwrap_or(1);
        if self
            .gsi
            .send(r, slot, ID_SEND + slot as u64, to, mac, sgid, mad)
            .is_err()
        {
            self.free_sends.push(slot);
            self.counters.mads_dropped_full += 1;
            return;
        }
        self.counters.mads_sent += 1;
    }

    fn serve_unresolved(&mut self, r: &mut Rnic, engine: &mut Engine) {
        let mut i = 0;
        while i < self.unresolved.len() {
            let to = self.unresolved[i].to;
            if let Some(mac) = engine.neighbor(r, to) {
                let u = self.unresolved.swap_remove(i);
                for m in &u.mads {
                    self.post_mad(r, to, mac, m);
                }
                continue;
            }
            let u = &mut self.unresolved[i];
            if u.since.elapsed() > MAD_WAIT {
                self.counters.mads_dropped_unresolved += u.mads.len() as u64;
                engine.forget_solicit(to);
                self.unresolved.swap_remove(i);
                continue;
            }
            if u.asked.elapsed() > ASK_EVERY {
                u.asked = Instant::now();
                let _ = engine.solicit(r, to);
            }
            i += 1;
        }
    }

    fn wait_for_sender(&mut self, r: &mut Rnic, engine: &mut Engine, e: CmEvent, ip: IpAddr) {
        if self.waiting_reqs.len() >= WAITING_REQS_MAX || engine.solicit(r, ip).is_err() {
            self.agent.abandon(e.id());
            self.counters.reqs_unreachable += 1;
            return;
        }
        let now = Instant::now();
        self.waiting_reqs.push_back((e, ip, now, now));
    }

    fn serve_waiting_reqs(&mut self, r: &mut Rnic, engine: &mut Engine) {
        let now = Instant::now();
        for _ in 0..self.waiting_reqs.len() {
            let Some((e, ip, since, asked)) = self.waiting_reqs.pop_front() else {
                break;
            };
            if engine.neighbor(r, ip).is_some() {
                self.on_agent_event(e);
            } else if now.duration_since(since) > MAD_WAIT {
                self.agent.abandon(e.id());
                self.counters.reqs_unreachable += 1;
                if !self.waiting_reqs.iter().any(|w| w.1 == ip) {
                    engine.forget_solicit(ip);
                }
            } else {
                let asked = if now.duration_since(asked) > ASK_EVERY {
                    let _ = engine.solicit(r, ip);
                    now
                } else {
                    asked
                };
                self.waiting_reqs.push_back((e, ip, since, asked));
            }
        }
    }

    /// Addresses being resolved: ADDR_RESOLVED once the peer's MAC is known, ADDR_ERROR
    /// (-ETIMEDOUT, as Linux's addr.c) when the program's timeout passed first.
    fn serve_resolving(&mut self, r: &mut Rnic, engine: &mut Engine) {
        let now = Instant::now();
        let mut done: Vec<(usize, bool)> = Vec::new();
        let ids = std::mem::take(&mut self.resolving);
        for &id in &ids {
            let Some(s) = self.ids.get_mut(&id) else {
                continue;
            };
            let Some((until, next)) = s.resolving else {
                continue;
            };
            let Some(dst) = s.dst else {
                s.resolving = None;
                continue;
            };
            let ip = dst.ip();
            if engine.neighbor(r, ip).is_some() {
                s.resolving = None;
                done.push((id, true));
            } else if now >= until {
                s.resolving = None;
                engine.forget_solicit(ip);
                done.push((id, false));
            } else {
                if now >= next {
                    let _ = engine.solicit(r, ip);
                    s.resolving = Some((until, now + ASK_EVERY));
                }
                self.resolving.push(id);
            }
        }
        for (id, ok) in done {
            let s = self.ids.get_mut(&id).expect("listed above");
            if ok {
                s.st = St::AddrResolved;
                self.event(id, Ev::new(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
            } else {
                s.st = St::Bound;
                self.event(id, Ev::new(id, RDMA_CM_EVENT_ADDR_ERROR, ETIMEDOUT));
            }
        }
    }

    /// What the agent reported, as the program's events.
    fn on_agent_event(&mut self, e: CmEvent) {
        match e {
            CmEvent::ConnectRequest { id, from, req } => self.on_request(id, from, &req),
            CmEvent::SidrRequest {
                id,
                from,
                service,
                private_data,
            } => self.on_sidr_request(id, from, service, &private_data[..]),
            CmEvent::RepReceived {
                id,
                remote_qpn,
                remote_psn,
                rep_rd_atomic,
                private_data,
            } => {
                let Some(&cid) = self.by_comm.get(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                s.st = St::RepRcvd;
                s.conn.remote_qpn = remote_qpn.value();
                s.conn.remote_psn = remote_psn.value();
                // Reads in flight: no more than we asked for nor than the passive side accepts
                // (the REP's responder resources); ours as responder bound its initiator depth.
                let (rr, idepth) = rep_rd_atomic;
                s.conn.init_depth = s.conn.init_depth.min(rr);
                let mut ev = Ev::new(cid, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
                ev.post = Post::ConnectResponse;
                ev.set_conn_data(&private_data[..]);
                ev.ev.param.conn.responder_resources = idepth;
                ev.ev.param.conn.initiator_depth = rr;
                ev.ev.param.conn.qp_num = remote_qpn.value();
                self.event(cid, ev);
            }
            // Passive side, the RTU came: ESTABLISHED without private data, as the kernel's
            // cma reports it.
            CmEvent::Established { id, .. } => {
                let Some(&cid) = self.by_comm.get(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                if s.st != St::Accepting {
                    return;
                }
                s.st = St::Connected;
                self.event(cid, Ev::new(cid, RDMA_CM_EVENT_ESTABLISHED, 0));
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => {
                let Some(cid) = self.by_comm.remove(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                s.comm = None;
                s.st = if s.listener != 0 {
                    St::Disconnected
                } else {
                    St::RouteResolved
                };
                let mut ev = Ev::new(cid, RDMA_CM_EVENT_REJECTED, reason.0 as i32);
                ev.set_conn_data(&private_data[..]);
                self.event(cid, ev);
            }
            CmEvent::Disconnected { id } => {
                let Some(&cid) = self.by_comm.get(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                if matches!(s.st, St::Connected | St::RepRcvd | St::Accepting) {
                    s.st = St::Disconnected;
                    self.event(cid, Ev::new(cid, RDMA_CM_EVENT_DISCONNECTED, 0));
                } else if s.st == St::Disconnected {
                    // Our DREQ answered (or it ran out of retries): the program's
                    // rdma_disconnect already moved on; it waits for this event.
                    self.event(cid, Ev::new(cid, RDMA_CM_EVENT_DISCONNECTED, 0));
                }
            }
            CmEvent::Timeout { id } => {
                let Some(&cid) = self.by_comm.get(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                match s.st {
                    St::Connecting | St::Accepting | St::RepRcvd => {
                        s.st = St::Disconnected;
                        self.event(cid, Ev::new(cid, RDMA_CM_EVENT_UNREACHABLE, ETIMEDOUT));
                    }
                    St::Disconnected => {
                        self.event(cid, Ev::new(cid, RDMA_CM_EVENT_DISCONNECTED, 0));
                    }
                    _ => {}
                }
            }
            CmEvent::SidrReply {
                id,
                status,
                qpn,
                qkey,
                private_data,
            } => {
                let Some(cid) = self.by_comm.remove(&id.0) else {
                    return;
                };
                let s = self.ids.get_mut(&cid).expect("by_comm names live ids");
                s.comm = None;
                let Some(dst) = s.dst else { return };
                if status != SidrStatus::SUCCESS {
                    s.st = St::RouteResolved;
                    let mut ev = Ev::new(cid, RDMA_CM_EVENT_UNREACHABLE, status.0 as i32);
                    ev.set_ud_data(&private_data[..]);
                    self.event(cid, ev);
                    return;
                }
                s.st = St::Connected;
                s.conn.remote_qpn = qpn.value();
                s.conn.remote_qkey = qkey.0;
                let tos = s.tos;
                let local = s.src.map(|a| a.ip());
                let sgid = local.map(|ip| self.gid_index(ip)).unwrap_or(1);
                let mut ev = Ev::new(cid, RDMA_CM_EVENT_ESTABLISHED, 0);
                ev.set_ud_data(&private_data[..]);
                ev.ev.param.ud.ah_attr = ah_to(dst.ip(), sgid, tos, 0);
                ev.ev.param.ud.qp_num = qpn.value();
                ev.ev.param.ud.qkey = qkey.0;
                self.event(cid, ev);
            }
        }
    }

    /// A REQ for one of our listeners: a new id for the connection, CONNECT_REQUEST on the
    /// listener's channel.
    fn on_request(&mut self, comm: CommId, from: IpAddr, req: &ReqRepr) {
        let Some(&lid) = self.listeners.get(&req.service_id.value()) else {
            self.agent
                .reject(comm, rocemu_wire::cm::RejReason::INVALID_SERVICE_ID);
            return;
        };
        let (ps, port) = req
            .service_id
            .rdma_cm_port()
            .map(|(ps, p)| (ps.0 as i32, p))
            .unwrap_or((RDMA_PS_IB, 0));
        // The addresses: the rdma_cm header's (PS_TCP), else the GIDs'.
        let (src, dst, off) = match req.cma_hdr() {
            Some(Ok(h)) => {
                let ip = |b: [u8; 16], v: u8| ip_of(b, v);
                (
                    SocketAddr::new(ip(h.dst_addr, h.ip_version), port),
                    SocketAddr::new(ip(h.src_addr, h.ip_version), h.src_port),
                    36,
                )
            }
            Some(Err(_)) => {
                self.agent
                    .reject(comm, rocemu_wire::cm::RejReason::CONSUMER_DEFINED);
                return;
            }
            None => {
                let local = self.local_ip_for(from).unwrap_or(from);
                (SocketAddr::new(local, port), SocketAddr::new(from, 0), 0)
            }
        };
        let Some(l) = self.ids.get(&lid) else { return };
        let (chan, tos) = (l.chan, l.tos);
        let cid = new_id(lid, ps, IBV_QPT_RC);
        let mut s = IdState::new(chan, false, ps, IBV_QPT_RC);
        s.st = St::ReqRcvd;
        s.listener = lid;
        s.comm = Some(comm);
        s.src = Some(src);
        s.dst = Some(dst);
        s.tos = tos;
        s.offered = (req.initiator_depth, req.responder_resources);
        s.conn = Conn {
            remote_qpn: req.local_qpn.value(),
            remote_psn: req.starting_psn.value(),
            my_psn: 0,
            path_mtu: req.path_mtu,
            resp_res: req.initiator_depth,
            init_depth: req.responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            flow_label: req.primary_path.flow_label,
            remote_qkey: 0,
        };
        set_route(cid, &s);
        self.ids.insert(cid, s);
        self.by_comm.insert(comm.0, cid);
        let mut ev = Ev::new(cid, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        ev.ev.listen_id = lid as *mut rdma_cm_id;
        ev.set_conn_data(&req.private_data[off..]);
        // As the kernel reports them: the request's initiator depth is what we may accept as
        // responder, and the other way round.
        ev.ev.param.conn.responder_resources = req.initiator_depth;
        ev.ev.param.conn.initiator_depth = req.responder_resources;
        ev.ev.param.conn.retry_count = req.retry_count;
        ev.ev.param.conn.rnr_retry_count = req.rnr_retry_count;
        ev.ev.param.conn.qp_num = req.local_qpn.value();
        self.push(chan, ev);
    }

    fn on_sidr_request(&mut self, comm: CommId, from: IpAddr, service: ServiceId, pd: &[u8]) {
        let Some(&lid) = self.listeners.get(&service.value()) else {
            let _ = self
                .agent
                .sidr_reply(comm, SidrStatus::UNSUPPORTED, Qpn::new(0), QKey(0), &[]);
            return;
        };
        let port = service.rdma_cm_port().map(|(_, p)| p).unwrap_or(0);
        let (src, dst) = match CmaHdr::parse(pd) {
            Ok(h) => (
                SocketAddr::new(ip_of(h.dst_addr, h.ip_version), port),
                SocketAddr::new(ip_of(h.src_addr, h.ip_version), h.src_port),
            ),
            Err(_) => {
                let _ = self
                    .agent
                    .sidr_reply(comm, SidrStatus::REJECT, Qpn::new(0), QKey(0), &[]);
                return;
            }
        };
        let Some(l) = self.ids.get(&lid) else { return };
        let (chan, tos, ps) = (l.chan, l.tos, l.ps);
        let cid = new_id(lid, ps, IBV_QPT_UD);
        let mut s = IdState::new(chan, false, ps, IBV_QPT_UD);
        s.st = St::ReqRcvd;
        s.listener = lid;
        s.comm = Some(comm);
        s.src = Some(src);
        s.dst = Some(dst);
        s.tos = tos;
        set_route(cid, &s);
        let sgid = self.gid_index(src.ip());
        self.ids.insert(cid, s);
        self.by_comm.insert(comm.0, cid);
        let mut ev = Ev::new(cid, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        ev.ev.listen_id = lid as *mut rdma_cm_id;
        ev.set_ud_data(&pd[36.min(pd.len())..]);
        ev.ev.param.ud.ah_attr = ah_to(from, sgid, tos, 0);
        self.push(chan, ev);
    }
}

/// A new `rdma_cm_id` for a connection request on listener `lid`: its device and context.
fn new_id(lid: usize, ps: i32, qp_type: i32) -> usize {
    // SAFETY: rdma_cm_id is plain data: zeroes are valid; the listener is a live id of ours.
    let mut b: Box<rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
    let l = lid as *mut rdma_cm_id;
    // SAFETY: as above.
    unsafe {
        b.verbs = (*l).verbs;
        b.channel = (*l).channel;
        b.context = (*l).context;
        b.pd = (*l).pd;
    }
    b.ps = ps;
    b.qp_type = qp_type;
    b.port_num = 1;
    super::live::add(super::live::IDS, 1);
    Box::into_raw(b) as usize
}

/// Writes an id's addresses, GIDs and path record into the program-visible struct.
pub fn set_route(id: usize, s: &IdState) {
    let p = id as *mut rdma_cm_id;
    // SAFETY: a live id of ours; only its route is written.
    let r = unsafe { &mut (*p).route };
    if let Some(a) = s.src {
        write_sockaddr(&mut r.addr.src_storage, a);
        r.addr.ibaddr.sgid = ibv_gid {
            raw: Gid::from_ip(a.ip()).0,
        };
    }
    if let Some(a) = s.dst {
        write_sockaddr(&mut r.addr.dst_storage, a);
        r.addr.ibaddr.dgid = ibv_gid {
            raw: Gid::from_ip(a.ip()).0,
        };
    }
    r.addr.ibaddr.pkey = 0xffff_u16.to_be();
}

/// The IP address a CMA header's 16 bytes hold (IPv4 in the last four for version 4).
fn ip_of(b: [u8; 16], version: u8) -> IpAddr {
    if version == 4 {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    } else {
        let v6 = Ipv6Addr::from(b);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

/// An address vector to `ip` from our GID `sgid`.
pub fn ah_to(ip: IpAddr, sgid: u8, tos: u8, flow_label: u32) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid {
                raw: Gid::from_ip(ip).0,
            },
            flow_label,
            sgid_index: sgid,
            hop_limit: 64,
            traffic_class: tos,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// rdma_cm's service ID for a port of a port space.
pub fn service_id(ps: i32, port: u16) -> ServiceId {
    ServiceId::rdma_cm(PortSpace(ps as u16), port)
}

pub fn write_sockaddr(dst: &mut libc::sockaddr_storage, a: SocketAddr) {
    // SAFETY: sockaddr_storage is plain data, large and aligned enough for either family.
    unsafe {
        *dst = std::mem::zeroed();
        match a {
            SocketAddr::V4(v) => {
                let s = dst as *mut _ as *mut libc::sockaddr_in;
                (*s).sin_family = libc::AF_INET as u16;
                (*s).sin_port = v.port().to_be();
                (*s).sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = dst as *mut _ as *mut libc::sockaddr_in6;
                (*s).sin6_family = libc::AF_INET6 as u16;
                (*s).sin6_port = v.port().to_be();
                (*s).sin6_addr.s6_addr = v.ip().octets();
                (*s).sin6_scope_id = v.scope_id();
            }
        }
    }
}

/// One turn of the CM, on the engine thread with the RNIC locked: MADs in, timers, the agent's
/// events, MADs out, addresses being resolved.
pub fn turn(svc: &mut Service, r: &mut Rnic, engine: &mut Engine) -> usize {
    svc.turns += 1;
    let now = svc.now();
    let mut wcs = std::mem::take(&mut svc.wcs);
    wcs.clear();
    r.poll_cq_into(svc.gsi.cq, MAD_SENDS + MAD_RECVS, &mut wcs);
    let work = wcs.len();
    for wc in &wcs {
        if wc.wr_id >= ID_SEND {
            svc.free_sends.push((wc.wr_id - ID_SEND) as usize);
            continue;
        }
        let i = (wc.wr_id - ID_RECV) as usize;
        if i >= MAD_RECVS {
            continue;
        }
        if let Some((from, mad)) = svc.gsi.received(r, i, wc) {
            svc.agent.handle_mad(now, from, &mad);
        }
        let _ = svc.post_recv(r, i);
    }
    svc.wcs = wcs;
    while !svc.free_sends.is_empty() {
        let Some((to, mac, mad)) = svc.backlog.pop_front() else {
            break;
        };
        svc.post_now(r, to, mac, &mad);
    }
    if svc.agent.poll_timeout().is_some_and(|t| t <= now) {
        svc.agent.handle_timeout(now);
    }
    let mut n = work;
    // What the agent answered on its own (a DREP for a DREQ, a repeated RTU) leaves before the
    // program hears of the event: a program that exits on its last event still answered.
    while let Some((to, mad)) = svc.agent.poll_transmit() {
        svc.send_mad(r, engine, to, &mad);
        n += 1;
    }
    while let Some(e) = svc.agent.poll_event() {
        let from = match &e {
            CmEvent::ConnectRequest { from, .. } | CmEvent::SidrRequest { from, .. } => Some(*from),
            _ => None,
        };
        match from {
            Some(ip) if engine.neighbor(r, ip).is_none() => svc.wait_for_sender(r, engine, e, ip),
            _ => svc.on_agent_event(e),
        }
        n += 1;
    }
    if !svc.waiting_reqs.is_empty() {
        svc.serve_waiting_reqs(r, engine);
    }
    while let Some((to, mad)) = svc.agent.poll_transmit() {
        svc.send_mad(r, engine, to, &mad);
        n += 1;
    }
    if !svc.unresolved.is_empty() {
        svc.serve_unresolved(r, engine);
    }
    if !svc.resolving.is_empty() {
        svc.serve_resolving(r, engine);
    }
    n
}

/// `Psn` and `Qpn` from the numbers the verbs carry.
pub fn psn(v: u32) -> Psn {
    Psn::new(v & 0xff_ffff)
}
pub fn qpn(v: u32) -> Qpn {
    Qpn::new(v & 0xff_ffff)
}
