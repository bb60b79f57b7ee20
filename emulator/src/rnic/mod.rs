//! The sans-IO RNIC core.
//!
//! Work flows through it like a hardware pipeline (DESIGN.md):
//!
//! ```text
//! rx:  parse + ICRC → QP lookup → transport checks → execute → ACK/NAK → completion   handle_frame
//! tx:  doorbell → WQE fetch → segmentation by path MTU → headers → ICRC → port        poll_transmit
//! completer: ACK / NAK / read responses, retransmit and RNR timers, go-back-N        handle_frame, handle_timeout
//! ```
//!
//! Invariants: nothing here reads a clock (every entry point takes `now`), opens a socket or
//! spawns a thread; randomness comes from the seed in [`RnicConfig`]; `handle_timeout(now)` is
//! idempotent; a frame from the wire, whatever it holds, is answered per the spec or dropped and
//! counted — never a panic, never a byte outside a memory region.
#![forbid(unsafe_code)]
mod completer;
pub mod mr;
mod qp;
mod qpn;
mod requester;
mod responder;
pub mod state;
pub mod verbs;

use crate::engine::neighbors::Neighbors;
use crate::rng::{KeyRng, Seed};
use crate::time::Nanos;
use mr::{MemTable, MrInfo};
use qp::{Qp, RecvWqe, SendWqe};
use qpn::{QpnMap, Slots};
use rocemu_wire::eth::EthernetRepr;
use rocemu_wire::frame::{IpRepr, ParsedFrame};
use rocemu_wire::opcode::Transport;
use rocemu_wire::{
    parse_frame, BthRepr, ExtHeaders, FrameRepr, HeaderTemplate, PKey, Psn, Qpn, ROCEV2_UDP_PORT,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::IpAddr;
pub use verbs::*;

/// How an RNIC is set up.
#[derive(Debug, Clone)]
pub struct RnicConfig {
    pub mac: Mac,
    /// Its addresses; GID index i is `ips[i]` (IPv4 as an IPv4-mapped GID).
    pub ips: Vec<IpAddr>,
    /// The Ethernet MTU of its port (1500 gives an active MTU of 1024, as with rxe).
    pub eth_mtu: usize,
    /// Seeds keys, QPNs, initial PSNs and the addresses `reg_mr` picks (a [`KeyRng`]): a
    /// `u64` replays, [`Seed::from_os`] is for deployment.
    pub seed: Seed,
    /// Verify the ICRC of every received packet (drop on mismatch, IBTA A17.3.3).
    pub check_icrc: bool,
}

impl RnicConfig {
    pub fn new(mac: Mac, ip: IpAddr, seed: u64) -> RnicConfig {
        RnicConfig {
            mac,
            ips: vec![ip],
            eth_mtu: 9000,
            seed: Seed::from_u64(seed),
            check_icrc: true,
        }
    }
}

/// Event counters, in the spirit of rdma's `hw_counters`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N, timeouts, RNR).
    pub retransmits: u64,
    pub local_ack_timeouts: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub seq_errors: u64,
    pub duplicate_requests: u64,
    pub rx_icrc_errors: u64,
    pub rx_malformed: u64,
    pub rx_not_ours: u64,
    pub rx_no_qp: u64,
    pub rx_dropped: u64,
    pub cnp_received: u64,
    /// Completions lost to a full CQ, or to a CQ in error since.
    pub cq_overflows: u64,
    /// Asynchronous events dropped because nobody polled them ([`ASYNC_EVENTS_MAX`] queued).
    pub async_events_dropped: u64,
    /// Responses (ACK, NAK, read response, atomic ACK) merged into one already queued: an
    /// ACK or NAK acknowledges every PSN before its own, and a duplicate's answer that is
    /// queued already needs no second copy.
    pub resp_coalesced: u64,
    /// Responses not queued because the QP's response slots were all taken (a peer that
    /// ignores its max_rd_atomic, or floods faster than the port drains).
    pub resp_dropped: u64,
}

/// Asynchronous events kept for [`Rnic::poll_async_event`]; later ones are counted and dropped.
pub const ASYNC_EVENTS_MAX: usize = 4096;

/// A completion queue. Once a completion finds it full it is in error for good (`overflowed`),
/// as with rxe (`rxe_cq_post` raises `IB_EVENT_CQ_ERR` and fails): the completions queued
/// before stay pollable, later ones are lost (counted), and the QPs on it go to ERR.
#[derive(Debug)]
pub(crate) struct Cq {
    pub q: VecDeque<Wc>,
    pub depth: usize,
    pub overflowed: bool,
}

/// Everything but the QPs, so that a QP and the device can be borrowed at once.
#[derive(Debug)]
pub(crate) struct Dev {
    pub cfg: RnicConfig,
    pub rng: KeyRng,
    pub mem: MemTable,
    pub cqs: Vec<Option<Cq>>,
    /// The engine's neighbour table as the RNIC last heard it (bounded; see [`Neighbors`]).
    pub neighbors: Neighbors,
    pub ip_ident: u16,
    pub counters: Counters,
    pub active_mtu: Mtu,
    /// CQs that went to error and whose QPs the RNIC has not moved to ERR yet (it does so before
    /// the entry point that overflowed them returns).
    pub failed_cqs: Vec<CqId>,
    /// For `ibv_get_async_event`; at most [`ASYNC_EVENTS_MAX`].
    pub async_events: VecDeque<AsyncEvent>,
}

impl Dev {
    pub fn push_wc(&mut self, cq: CqId, wc: Wc) {
        if let Some(Some(c)) = self.cqs.get_mut(cq.0 as usize) {
            if c.overflowed {
                self.counters.cq_overflows += 1;
            } else if c.q.len() >= c.depth {
                c.overflowed = true;
                self.counters.cq_overflows += 1;
                self.failed_cqs.push(cq);
                self.raise(AsyncEvent::CqErr(cq));
            } else {
                c.q.push_back(wc);
            }
        }
    }

    pub fn raise(&mut self, e: AsyncEvent) {
        if self.async_events.len() >= ASYNC_EVENTS_MAX {
            self.counters.async_events_dropped += 1;
        } else {
            self.async_events.push_back(e);
        }
    }

    /// The frame headers for a packet of `qp` to its destination (or a UD destination), with
    /// the next IPv4 identification.
    pub fn frame_for(
        &mut self,
        qp: &Qp,
        av: &AhAttr,
        dmac: Mac,
        bth: BthRepr,
        ext: ExtHeaders,
    ) -> FrameRepr {
        let mut repr = self.frame_repr(qp, av, dmac, bth, ext);
        if let IpRepr::V4(v4) = &mut repr.ip {
            v4.ident = self.next_ident();
        }
        repr
    }

    /// The frame headers for a packet of `qp` to `av` at `dmac`, IPv4 identification 0.
    fn frame_repr(
        &self,
        qp: &Qp,
        av: &AhAttr,
        dmac: Mac,
        bth: BthRepr,
        ext: ExtHeaders,
    ) -> FrameRepr {
        let dst = av.dgid.ip();
        let src = self
            .cfg
            .ips
            .get(av.sgid_index as usize)
            .copied()
            .unwrap_or(self.cfg.ips[0]);
        let ttl = if av.hop_limit == 0 { 64 } else { av.hop_limit };
        FrameRepr {
            eth: EthernetRepr {
                dst: dmac,
                src: self.cfg.mac,
                vlan: None,
                ethertype: 0,
            },
            ip: IpRepr::roce(src, dst, av.traffic_class, ttl, av.flow_label),
            // rxe's choice (Annex A17.5.1.1 only asks for a port fixed per flow).
            sport: match qp.qp_type {
                QpType::Ud => rocemu_wire::udp_sport_for_qpn(qp.qpn),
                _ => rocemu_wire::udp_sport_for_flow(av.flow_label, qp.qpn, qp.attr.dest_qp_num),
            },
            dport: ROCEV2_UDP_PORT,
            bth,
            ext,
        }
    }

    /// The IPv4 identification of the next packet: one counter for the device.
    fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    /// The header template of a connected QP's packets to its peer (its address vector and
    /// destination QP as they stand).
    fn template_for(&self, qp: &Qp) -> HeaderTemplate {
        let bth = BthRepr::new(
            rocemu_wire::Opcode::RC_ACKNOWLEDGE,
            qp.attr.dest_qp_num,
            Psn::new(0),
        );
        HeaderTemplate::new(&self.frame_repr(
            qp,
            &qp.attr.ah_attr,
            qp.dmac,
            bth,
            ExtHeaders::default(),
        ))
    }

    /// Builds a packet of `qp` with these transport headers at the front of `buf`: to `ud` (a UD
    /// work request's destination and its MAC), or for a connected QP to its peer, from the QP's
    /// header template. `fill` writes the payload, with the device's memory at hand. Returns the
    /// frame length.
    // Eight arguments: the headers go by reference, since a struct gathering them would be
    // built (copied) per packet on the hottest path of the RNIC.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn emit(
        &mut self,
        qp: &Qp,
        ud: Option<(&AhAttr, Mac)>,
        bth: &BthRepr,
        ext: &ExtHeaders,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&MemTable, &mut [u8]),
    ) -> Result<usize, rocemu_wire::BuildError> {
        match (&qp.tmpl, ud) {
            (Some(t), None) => {
                let ident = if t.is_v6() { 0 } else { self.next_ident() };
                let mem = &self.mem;
                t.emit(buf, ident, bth, ext, payload_len, |d| fill(mem, d))
            }
            (_, ud) => {
                let (av, dmac) = ud.unwrap_or((&qp.attr.ah_attr, qp.dmac));
                let repr = self.frame_for(qp, av, dmac, *bth, *ext);
                let mem = &self.mem;
                repr.emit(buf, payload_len, |d| fill(mem, d))
            }
        }
    }

    pub fn resolve(&self, av: &AhAttr) -> Option<Mac> {
        av.dmac.or_else(|| self.neighbors.pinned(av.dgid.ip()))
    }
}

/// A software RoCEv2 RNIC: verbs objects, QP state machines and the transport, sans-IO.
#[derive(Debug)]
pub struct Rnic {
    pub(crate) dev: Dev,
    /// The QP table, indexed by slot ([`qpn`]: slots are reused, bounded by `max_qp`).
    pub(crate) qps: Vec<Option<Qp>>,
    qpn_map: QpnMap,
    slots: Slots,
    /// The QPN looked up last and its slot: packets and posts come in runs per QP (a message, a
    /// transmit burst), and a hit skips the permutation's four rounds.
    last_slot: std::cell::Cell<(Qpn, usize)>,
    /// The slot of QP1, the general services interface, when one was created.
    gsi: Option<usize>,
    live_qps: usize,
    /// QPs with something to send, by slot and QPN: an entry left by a destroyed QP whose slot
    /// was reused does not act on the new QP.
    tx_sched: VecDeque<(usize, Qpn)>,
    /// Packets the QP at the head of the schedule may still send before the next QP's turn.
    burst_left: u32,
    /// Deadlines by slot and QPN, as `tx_sched`.
    timers: BinaryHeap<Reverse<(Nanos, usize, Qpn)>>,
    /// Entries of `timers` left by destroyed QPs: the heap is rebuilt without them when they
    /// are many (a destroyed QP's far-off retransmit deadline would otherwise stay for hours).
    stale_timers: usize,
    attr: DeviceAttr,
}

/// Packets one QP sends in a row before the transmit scheduler moves on (DPDK's burst of 32
/// is per port; per QP, 16 keeps fairness while amortising the QP's cache misses).
const TX_BURST: u32 = 16;

const DEVICE_ATTR: DeviceAttr = DeviceAttr {
    fw_ver: "0.1.0",
    vendor_id: 0x000000,
    vendor_part_id: 0x524f, // "RO"
    max_qp: 1 << 17,
    max_qp_wr: 1 << 14,
    max_sge: 32,
    max_cq: 1 << 17,
    max_cqe: 1 << 20,
    max_mr: 1 << 17,
    max_mr_size: 1 << 32,
    max_pd: 1 << 16,
    max_qp_rd_atom: 128,
    max_qp_init_rd_atom: 128,
    max_srq: 0,
    max_srq_wr: 0,
    atomic_cap_hca: true,
    max_pkeys: 1,
};

impl Rnic {
    pub fn new(cfg: RnicConfig) -> Rnic {
        assert!(!cfg.ips.is_empty(), "an RNIC needs at least one address");
        let mut rng = KeyRng::new(&cfg.seed);
        let qpn_map = QpnMap::new(&mut rng);
        let active_mtu = Mtu::for_netdev_mtu(cfg.eth_mtu);
        Rnic {
            dev: Dev {
                cfg,
                rng,
                mem: MemTable::default(),
                cqs: Vec::new(),
                neighbors: Neighbors::default(),
                ip_ident: 0,
                counters: Counters::default(),
                active_mtu,
                failed_cqs: Vec::new(),
                async_events: VecDeque::new(),
            },
            qps: Vec::new(),
            qpn_map,
            slots: Slots::default(),
            last_slot: std::cell::Cell::new((Qpn::new(0), 0)),
            gsi: None,
            live_qps: 0,
            tx_sched: VecDeque::new(),
            burst_left: TX_BURST,
            timers: BinaryHeap::new(),
            stale_timers: 0,
            attr: DEVICE_ATTR,
        }
    }

    // ---- device ------------------------------------------------------------------------

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.attr
    }
    pub fn mac(&self) -> Mac {
        self.dev.cfg.mac
    }
    /// The node GUID, as Linux derives it for rxe: the MAC as a modified EUI-64.
    pub fn node_guid(&self) -> u64 {
        let m = self.dev.cfg.mac.0;
        u64::from_be_bytes([m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
    }
    /// The GID at `index` (`ibv_query_gid`).
    pub fn gid(&self, index: usize) -> Option<Gid> {
        self.dev.cfg.ips.get(index).map(|ip| Gid::from_ip(*ip))
    }
    pub fn ips(&self) -> &[IpAddr] {
        &self.dev.cfg.ips
    }
    /// The port's active MTU (`ibv_query_port`).
    pub fn active_mtu(&self) -> Mtu {
        self.dev.active_mtu
    }
    pub fn counters(&self) -> Counters {
        self.dev.counters
    }
    /// Tells the RNIC the MAC of a peer address (the engine's neighbour table feeds this, on
    /// every confirmation; a program may set static entries). The RNIC keeps at most
    /// [`Neighbors::CAPACITY`], forgetting those confirmed longest ago.
    pub fn set_neighbor(&mut self, ip: IpAddr, mac: Mac) {
        self.dev.neighbors.pin(ip, mac);
    }
    /// The MAC the RNIC holds for `ip`.
    pub fn neighbor(&self, ip: IpAddr) -> Option<Mac> {
        self.dev.neighbors.pinned(ip)
    }
    /// How many neighbours the RNIC holds.
    pub fn neighbor_count(&self) -> usize {
        self.dev.neighbors.len()
    }
    /// The QP table's size in slots (live QPs and free slots): what its memory grows with.
    pub fn qp_slots(&self) -> usize {
        self.qps.len()
    }
    /// A draw from the device's seeded generator, for what sits beside the core and must be
    /// as hard to guess as its keys: a connection manager's starting PSNs and communication IDs.
    pub fn random_u64(&mut self) -> u64 {
        self.dev.rng.next_u64()
    }
    /// A 256-bit seed drawn from the device's generator, for a generator beside the core (a
    /// connection manager's [`KeyRng`]).
    pub fn random_seed(&mut self) -> Seed {
        self.dev.rng.fork()
    }

    // ---- PD, MR, CQ ------------------------------------------------------------------------

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> PdId {
        self.dev.mem.alloc_pd()
    }

    /// `ibv_reg_mr` of `length` zeroed bytes owned by the RNIC, at a virtual address it picks.
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        let addr = 0x7f00_0000_0000u64 + (self.dev.rng.below(1 << 28) << 12);
        self.reg_mr_at(pd, addr, length, access)
    }

    /// `ibv_reg_mr` at a virtual address the caller picks.
    pub fn reg_mr_at(
        &mut self,
        pd: PdId,
        addr: u64,
        length: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if length as u64 > self.attr.max_mr_size {
            return invalid(format!("MR of {length} bytes exceeds max_mr_size"));
        }
        if addr.checked_add(length as u64).is_none() {
            return invalid("MR wraps the address space");
        }
        // IBTA 10.6.3.1: remote write or atomic access needs local write.
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return invalid("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE");
        }
        if access.0 & !Access::ALL.0 != 0 {
            return invalid(format!("unknown access flags 0x{:x}", access.0));
        }
        Ok(self
            .dev
            .mem
            .register(&mut self.dev.rng, pd, addr, length as u64, access))
    }

    /// `ibv_dereg_mr`.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), VerbsError> {
        self.dev
            .mem
            .deregister(lkey)
            .map(|_| ())
            .ok_or(VerbsError::NotFound("memory region"))
    }

    /// The bytes of a region, for the application.
    pub fn mr_bytes(&self, lkey: u32) -> Option<&[u8]> {
        self.dev.mem.by_lkey(lkey).map(|m| &m.data[..])
    }
    pub fn mr_bytes_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        self.dev.mem.by_lkey_mut(lkey).map(|m| &mut m.data[..])
    }

    /// `ibv_create_cq`.
    pub fn create_cq(&mut self, cqe: usize) -> Result<CqId, VerbsError> {
        if cqe == 0 || cqe > self.attr.max_cqe as usize {
            return invalid(format!("CQ depth {cqe} not in 1..={}", self.attr.max_cqe));
        }
        self.dev.cqs.push(Some(Cq {
            q: VecDeque::with_capacity(cqe.min(4096)),
            depth: cqe,
            overflowed: false,
        }));
        Ok(CqId(self.dev.cqs.len() as u32 - 1))
    }

    /// `ibv_poll_cq`: up to `max` completions, oldest first.
    pub fn poll_cq(&mut self, cq: CqId, max: usize) -> Vec<Wc> {
        let mut v = Vec::new();
        self.poll_cq_into(cq, max, &mut v);
        v
    }

    /// `ibv_poll_cq` into a caller's vector (appends); returns how many.
    pub fn poll_cq_into(&mut self, cq: CqId, max: usize, out: &mut Vec<Wc>) -> usize {
        let Some(Some(c)) = self.dev.cqs.get_mut(cq.0 as usize) else {
            return 0;
        };
        let n = max.min(c.q.len());
        out.extend(c.q.drain(..n));
        n
    }

    /// True when the CQ lost completions because it was full (`IBV_EVENT_CQ_ERR`).
    pub fn cq_overflowed(&self, cq: CqId) -> bool {
        matches!(self.dev.cqs.get(cq.0 as usize), Some(Some(c)) if c.overflowed)
    }

    /// The CQ's error, when it is in error ([`VerbsError::CqOverrun`]).
    pub fn cq_error(&self, cq: CqId) -> Option<VerbsError> {
        match self.dev.cqs.get(cq.0 as usize) {
            Some(Some(c)) if c.overflowed => Some(VerbsError::CqOverrun { cq, depth: c.depth }),
            _ => None,
        }
    }

    /// `ibv_poll_cq` that reports a CQ in error: the completions queued before the overflow
    /// first, then the error (as `ibv_poll_cq` returns a negative value on a CQ in error).
    /// Callers that wait for completions poll with this, so that an overflow ends the wait.
    pub fn try_poll_cq(
        &mut self,
        cq: CqId,
        max: usize,
        out: &mut Vec<Wc>,
    ) -> Result<usize, VerbsError> {
        if !matches!(self.dev.cqs.get(cq.0 as usize), Some(Some(_))) {
            return Err(VerbsError::NotFound("completion queue"));
        }
        match self.poll_cq_into(cq, max, out) {
            0 => self.cq_error(cq).map_or(Ok(0), Err),
            n => Ok(n),
        }
    }

    /// `ibv_get_async_event` without blocking: the oldest event not yet taken.
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.dev.async_events.pop_front()
    }

    /// Moves the QPs on CQs that went to error to ERR (`IBV_EVENT_QP_FATAL`): their outstanding
    /// work requests are flushed (the completions meant for the failed CQ are lost; those for
    /// a QP's other CQ arrive there). Flushing may overflow another CQ: repeated until none is
    /// left. Called before every entry point that can complete work returns.
    fn settle_cq_errors(&mut self) {
        while let Some(cq) = self.dev.failed_cqs.pop() {
            for slot in 0..self.qps.len() {
                let Some(qp) = self.qps[slot].as_mut() else {
                    continue;
                };
                if (qp.send_cq == cq || qp.recv_cq == cq)
                    && !matches!(qp.state, QpState::Err | QpState::Reset)
                {
                    flush(&mut self.dev, qp);
                    let qpn = qp.qpn;
                    self.dev.raise(AsyncEvent::QpFatal(qpn));
                }
            }
        }
    }

    // ---- QP ----------------------------------------------------------------------------

    /// `ibv_create_qp`. The QPN looks random (never 0 or 1, which are reserved); see the `rnic::qpn` module.
    pub fn create_qp(&mut self, pd: PdId, init: QpInitAttr) -> Result<Qpn, VerbsError> {
        self.check_qp_init(pd, &init)?;
        self.insert_qp(pd, &init, None)
    }

    /// Puts a new QP in a slot (a free one, or a new one) with the slot's next QPN, or `fixed`.
    fn insert_qp(
        &mut self,
        pd: PdId,
        init: &QpInitAttr,
        fixed: Option<Qpn>,
    ) -> Result<Qpn, VerbsError> {
        let (slot, qpn) = self
            .slots
            .alloc(&self.qpn_map, fixed)
            .ok_or(VerbsError::NoSpace("max_qp reached"))?;
        if self.qps.len() < self.slots.len() {
            self.qps.resize_with(self.slots.len(), || None);
        }
        debug_assert!(self.qps[slot].is_none());
        self.qps[slot] = Some(Qp::new(qpn, pd, init));
        self.live_qps += 1;
        if fixed == Some(Qpn::GSI) {
            self.gsi = Some(slot);
        }
        Ok(qpn)
    }

    /// QP1 to RTS as the kernel brings up its GSI QP: INIT with the well-known Q_Key
    /// ([`QKey::GSI`](rocemu_wire::QKey::GSI)) on port 1, then RTR and RTS.
    pub fn ready_gsi_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey: rocemu_wire::QKey::GSI,
            port_num: 1,
            ..Default::default()
        };
        use QpAttrMask as M;
        self.modify_qp(qpn, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
        a.qp_state = QpState::Rtr;
        self.modify_qp(qpn, &a, M::STATE)?;
        a.qp_state = QpState::Rts;
        self.modify_qp(qpn, &a, M::STATE | M::SQ_PSN)
    }

    /// QP1, the general services interface (IBTA 13.5.1): a UD QP where management datagrams
    /// arrive (the IB CM's, for `rdma_cm`). Its Q_Key is the well-known 0x80010000, set as any UD
    /// QP's at INIT. One per device.
    pub fn create_gsi_qp(&mut self, pd: PdId, init: QpInitAttr) -> Result<Qpn, VerbsError> {
        if init.qp_type != QpType::Ud {
            return invalid("QP1 is a UD QP");
        }
        if self
            .gsi
            .is_some_and(|s| matches!(self.qps.get(s), Some(Some(_))))
        {
            return Err(VerbsError::NoSpace("QP1 exists already"));
        }
        self.check_qp_init(pd, &init)?;
        self.insert_qp(pd, &init, Some(Qpn::GSI))
    }

    fn check_qp_init(&self, pd: PdId, init: &QpInitAttr) -> Result<(), VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        for cq in [init.send_cq, init.recv_cq] {
            if !matches!(self.dev.cqs.get(cq.0 as usize), Some(Some(_))) {
                return Err(VerbsError::NotFound("completion queue"));
            }
        }
        if init.srq.is_some() {
            return invalid("shared receive queues are not supported (max_srq = 0)");
        }
        let c = init.cap;
        if c.max_send_wr > self.attr.max_qp_wr || c.max_recv_wr > self.attr.max_qp_wr {
            return invalid(format!(
                "queue depth above max_qp_wr {}",
                self.attr.max_qp_wr
            ));
        }
        if c.max_send_sge > self.attr.max_sge || c.max_recv_sge > self.attr.max_sge {
            return invalid(format!("SGE count above max_sge {}", self.attr.max_sge));
        }
        if self.live_qps >= self.attr.max_qp as usize {
            return Err(VerbsError::NoSpace("max_qp reached"));
        }
        Ok(())
    }

    fn slot_of(&self, qpn: Qpn) -> Option<usize> {
        if qpn == Qpn::GSI {
            return self
                .gsi
                .filter(|&s| matches!(self.qps.get(s), Some(Some(q)) if q.qpn == qpn));
        }
        let (last, s) = self.last_slot.get();
        if last == qpn && matches!(self.qps.get(s), Some(Some(q)) if q.qpn == qpn) {
            return Some(s);
        }
        // The QP in the slot must carry this very QPN: a destroyed QP's QPN names its slot
        // still, where another generation may live now.
        let s = self.qpn_map.slot(qpn);
        match self.qps.get(s) {
            Some(Some(q)) if q.qpn == qpn => {
                self.last_slot.set((qpn, s));
                Some(s)
            }
            _ => None,
        }
    }

    fn slot(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        self.slot_of(qpn).ok_or(VerbsError::NotFound("queue pair"))
    }

    fn qp(&self, qpn: Qpn) -> Result<&Qp, VerbsError> {
        let s = self.slot(qpn)?;
        self.qps[s]
            .as_ref()
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let s = self.slot(qpn)?;
        if let Some(qp) = self.qps[s].take() {
            // Its timer entries stay in the heap until they come up (and then act on nothing:
            // they carry this QPN); when they are many, the heap is rebuilt without them.
            self.stale_timers +=
                usize::from(qp.ack_pushed.is_some()) + usize::from(qp.rnr_pushed.is_some());
            if self.stale_timers > 1024 && self.stale_timers * 2 > self.timers.len() {
                let qps = &self.qps;
                self.timers.retain(
                    |Reverse((_, s, q))| matches!(qps.get(*s), Some(Some(p)) if p.qpn == *q),
                );
                self.stale_timers = 0;
            }
        }
        if self.gsi == Some(s) {
            self.gsi = None;
        }
        self.slots.release(s);
        self.live_qps -= 1;
        Ok(())
    }

    /// `ibv_query_qp`: state and attributes.
    pub fn query_qp(&self, qpn: Qpn) -> Result<QpAttr, VerbsError> {
        let qp = self.qp(qpn)?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        Ok(a)
    }

    /// A one-line description of a QP's transport state, for failure messages.
    pub fn debug_qp(&self, qpn: Qpn) -> String {
        match self.qp(qpn) {
            Ok(q) => format!(
                "qp {} {:?} sq={} sq_next={} req_psn={} acked={} high={} cwnd={} retry={} rnr={} ack_dl={:?} rnr_dl={:?} rd_out={} epsn={} resp_out={} sched={} front={:?}",
                q.qpn, q.state, q.sq.len(), q.sq_next, q.req_psn, q.acked_psn, q.psn_high(), q.cwnd, q.retry_left, q.rnr_left,
                q.ack_deadline, q.rnr_deadline, q.rd_outstanding, q.epsn, q.resp_out.len(), q.scheduled,
                q.sq.front().map(|w| (w.first_psn.value(), w.npkts, w.started, w.done, w.resp_pkts))
            ),
            Err(e) => e.to_string(),
        }
    }

    /// How many responses (ACKs, NAKs, read and atomic responses) a QP has queued for the wire.
    pub fn queued_responses(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        Ok(self.qp(qpn)?.resp_out.len())
    }

    pub fn qp_type(&self, qpn: Qpn) -> Result<QpType, VerbsError> {
        Ok(self.qp(qpn)?.qp_type)
    }

    pub fn qp_state(&self, qpn: Qpn) -> Result<QpState, VerbsError> {
        Ok(self.qp(qpn)?.state)
    }

    /// `ibv_modify_qp`: checks the transition and the mask (see [`state`]), applies the
    /// attributes, and runs the transition's side effects (ERR flushes, RESET clears).
    pub fn modify_qp(
        &mut self,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        let cur = qp.state;
        let new = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            return invalid(format!(
                "cur_qp_state {:?} but the QP is in {cur:?}",
                attr.cur_qp_state
            ));
        }
        state::check_transition(qp.qp_type, cur, new, mask.union(QpAttrMask::STATE))?;
        // Values.
        if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index as usize >= PKEY_TABLE.len() {
            return invalid(format!(
                "pkey_index {} beyond the P_Key table",
                attr.pkey_index
            ));
        }
        if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
            return invalid(format!(
                "port {} does not exist (one port: 1)",
                attr.port_num
            ));
        }
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > self.dev.active_mtu {
            return invalid(format!(
                "path MTU {} above the port's active MTU {}",
                attr.path_mtu.bytes(),
                self.dev.active_mtu.bytes()
            ));
        }
        if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
            return invalid("retry_cnt above 7");
        }
        if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
            return invalid("rnr_retry above 7");
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return invalid("min_rnr_timer above 31");
        }
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return invalid("timeout above 31");
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
            && attr.max_rd_atomic as u32 > self.attr.max_qp_init_rd_atom
        {
            return invalid("max_rd_atomic above the device's max_qp_init_rd_atom");
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
            && attr.max_dest_rd_atomic as u32 > self.attr.max_qp_rd_atom
        {
            return invalid("max_dest_rd_atomic above the device's max_qp_rd_atom");
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) && attr.qp_access_flags.0 & !Access::ALL.0 != 0 {
            return invalid("unknown access flags");
        }
        let mut dmac = qp.dmac;
        if mask.contains(QpAttrMask::AV) {
            let sgid = attr.ah_attr.sgid_index as usize;
            let Some(src) = self.dev.cfg.ips.get(sgid) else {
                return invalid(format!("sgid_index {sgid} beyond the GID table"));
            };
            if src.is_ipv4() != attr.ah_attr.dgid.is_v4() {
                return invalid("source and destination GIDs are of different IP versions");
            }
            dmac = match self.dev.resolve(&attr.ah_attr) {
                Some(m) => m,
                None => {
                    return invalid(format!(
                        "no MAC address for {}: give ah_attr.dmac or add a neighbour",
                        attr.ah_attr.dgid.ip()
                    ))
                }
            };
        }
        // Apply.
        let a = &mut qp.attr;
        let has = |m| mask.contains(m);
        if has(QpAttrMask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if has(QpAttrMask::PORT) {
            a.port_num = attr.port_num;
        }
        if has(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if has(QpAttrMask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if has(QpAttrMask::AV) {
            a.ah_attr = attr.ah_attr;
            qp.dmac = dmac;
        }
        if has(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if has(QpAttrMask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if has(QpAttrMask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            qp.epsn = attr.rq_psn;
        }
        if has(QpAttrMask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            qp.req_psn = attr.sq_psn;
            qp.acked_psn = attr.sq_psn;
            qp.psn_high_ = attr.sq_psn;
        }
        if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if has(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if has(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if has(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            qp.retry_left = attr.retry_cnt;
        }
        if has(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            qp.rnr_left = attr.rnr_retry;
        }
        match new {
            QpState::Reset => {
                let fresh = Qp::new(
                    qp.qpn,
                    qp.pd,
                    &QpInitAttr {
                        qp_type: qp.qp_type,
                        send_cq: qp.send_cq,
                        recv_cq: qp.recv_cq,
                        srq: None,
                        cap: qp.cap,
                        sq_sig_all: qp.sq_sig_all,
                    },
                );
                *qp = fresh;
            }
            QpState::Err => {
                qp.state = QpState::Err;
                flush(&mut self.dev, qp);
            }
            s => qp.state = s,
        }
        // A connected QP's packets all go to its peer: their headers are built once, from the
        // attributes as they now stand (RESET cleared them; INIT has no peer yet).
        qp.tmpl = match (qp.qp_type, qp.state) {
            (QpType::Ud, _) | (_, QpState::Reset | QpState::Init) => None,
            _ => Some(self.dev.template_for(qp)),
        };
        qp.peer_ip = qp.attr.ah_attr.dgid.ip();
        self.refresh(slot);
        self.settle_cq_errors();
        Ok(())
    }

    /// `ibv_post_send`. Checks what can be checked at post time (state, queue space, SGE
    /// count, opcode for the QP type, sizes); local keys are checked when the WQE executes and
    /// fail it with `LocProtErr`, as on hardware.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        match qp.state {
            QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe => {}
            s => return invalid(format!("post_send in state {s:?} (needs RTS)")),
        }
        if qp.sq.len() >= qp.cap.max_send_wr as usize {
            return Err(VerbsError::NoSpace("send queue full"));
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        if !inline && wr.sg_list.len() > qp.cap.max_send_sge as usize {
            return invalid(format!(
                "{} SGEs above max_send_sge {}",
                wr.sg_list.len(),
                qp.cap.max_send_sge
            ));
        }
        if inline && wr.inline_data.len() > qp.cap.max_inline_data as usize {
            return invalid(format!(
                "{} inline bytes above max_inline_data {}",
                wr.inline_data.len(),
                qp.cap.max_inline_data
            ));
        }
        let ok_for_type = match qp.qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                wr.opcode,
                WrOpcode::Send
                    | WrOpcode::SendWithImm { .. }
                    | WrOpcode::RdmaWrite { .. }
                    | WrOpcode::RdmaWriteWithImm { .. }
            ),
            QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }),
        };
        if !ok_for_type {
            return invalid(format!(
                "{:?} is not valid on a {:?} QP",
                wr.opcode, qp.qp_type
            ));
        }
        if qp.qp_type == QpType::Ud && wr.ud.is_none() {
            return invalid("UD send without a destination (wr.ud)");
        }
        if inline && wr.opcode.is_read_or_atomic() {
            return invalid("INLINE is for sends and writes");
        }
        let len: u64 = if inline {
            wr.inline_data.len() as u64
        } else {
            wr.sg_list.iter().map(|s| s.length as u64).sum()
        };
        if len > 1 << 31 {
            return invalid("message longer than 2^31 bytes");
        }
        if wr.opcode.is_atomic() {
            let addr = match wr.opcode {
                WrOpcode::AtomicCmpSwap { remote_addr, .. }
                | WrOpcode::AtomicFetchAdd { remote_addr, .. } => remote_addr,
                _ => 0,
            };
            if len != 8 {
                return invalid("atomics need one 8-byte local buffer");
            }
            if addr % 8 != 0 {
                // Sent anyway on hardware, and NAKed; rdma-core passes it through. So do we:
                // the responder's check is what conformance tests look at.
            }
        }
        let signaled = qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let mut wqe = SendWqe::new(wr, len, signaled);
        if qp.state == QpState::Err {
            wqe.error = Some(WcStatus::WrFlushErr);
            let wc = requester::wc_for(qp, &wqe, WcStatus::WrFlushErr);
            self.dev.push_wc(qp.send_cq, wc);
            self.settle_cq_errors();
            return Ok(());
        }
        if qp.qp_type == QpType::Ud && len > qp.mtu().max(self.dev.active_mtu.bytes() as u64) {
            // IBTA 10.8.3: a UD message longer than the path MTU fails with a local length error.
            wqe.error = Some(WcStatus::LocLenErr);
        }
        qp.sq.push_back(wqe);
        self.refresh(slot);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        if qp.state == QpState::Reset {
            return invalid("post_recv in RESET");
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(VerbsError::NoSpace("receive queue full"));
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return invalid(format!(
                "{} SGEs above max_recv_sge {}",
                wr.sg_list.len(),
                qp.cap.max_recv_sge
            ));
        }
        let len = wr.sg_list.iter().map(|s| s.length as u64).sum();
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            len,
        };
        if qp.state == QpState::Err {
            let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
            self.dev.push_wc(qp.recv_cq, wc);
            self.settle_cq_errors();
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }

    // ---- the wire ------------------------------------------------------------------------

    /// One frame from the port.
    pub fn handle_frame(&mut self, now: Nanos, frame: &[u8]) {
        self.receive(now, frame, self.dev.cfg.check_icrc);
    }

    /// One frame from the port, in a buffer the caller owns: parsed once, and the ICRC verified
    /// in one pass over the frame (its variant fields are masked in place and put back), which
    /// costs what a plain CRC does. The frame is left as it was.
    pub fn handle_frame_mut(&mut self, now: Nanos, frame: &mut [u8]) {
        if !self.dev.cfg.check_icrc {
            self.receive(now, frame, false);
            return;
        }
        let c = &mut self.dev.counters;
        c.rx_packets += 1;
        c.rx_bytes += frame.len() as u64;
        match rocemu_wire::parse_frame_in_place(frame) {
            Err(_) => c.rx_malformed += 1,
            // IBTA A17.3.3 / 9.6.1: ICRC errors are dropped silently.
            Ok((_, false)) => c.rx_icrc_errors += 1,
            Ok((pkt, true)) => self.receive_parsed(now, &pkt, false),
        }
    }

    fn receive(&mut self, now: Nanos, frame: &[u8], check_icrc: bool) {
        let c = &mut self.dev.counters;
        c.rx_packets += 1;
        c.rx_bytes += frame.len() as u64;
        let Ok(pkt) = parse_frame(frame) else {
            c.rx_malformed += 1;
            return;
        };
        self.receive_parsed(now, &pkt, check_icrc);
    }

    /// A parsed frame, counted already.
    fn receive_parsed(&mut self, now: Nanos, pkt: &Packet<'_>, check_icrc: bool) {
        let c = &mut self.dev.counters;
        if pkt.eth.dst != self.dev.cfg.mac && !pkt.eth.dst.is_multicast() {
            c.rx_not_ours += 1;
            return;
        }
        if !self.dev.cfg.ips.contains(&pkt.ip.dst()) {
            c.rx_not_ours += 1;
            return;
        }
        if check_icrc && !pkt.icrc_ok() {
            // IBTA A17.3.3 / 9.6.1: ICRC errors are dropped silently.
            c.rx_icrc_errors += 1;
            return;
        }
        if !pkt.ip_checksum_ok() {
            c.rx_malformed += 1;
            return;
        }
        // IBTA 9.6.1.1: transport version must be 0; the P_Key must match the QP's partition.
        if pkt.bth.tver != 0 || !pkt.bth.pkey.matches(PKey::DEFAULT) {
            c.rx_dropped += 1;
            return;
        }
        if pkt.bth.opcode.transport() == Transport::Cnp {
            c.cnp_received += 1;
            return;
        }
        let Some(slot) = self.slot_of(pkt.bth.dqpn) else {
            self.dev.counters.rx_no_qp += 1;
            return;
        };
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        if !transport_matches(qp.qp_type, pkt.bth.opcode.transport()) {
            self.dev.counters.rx_dropped += 1;
            return;
        }
        // Connected QPs accept packets from their peer only (rxe's check_addr).
        if qp.qp_type != QpType::Ud
            && (!matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) || pkt.ip.src() != qp.peer_ip)
        {
            self.dev.counters.rx_dropped += 1;
            return;
        }
        let info = pkt.bth.opcode.info();
        if info.is_response() {
            completer::handle(&mut self.dev, qp, now, pkt);
        } else {
            responder::handle(&mut self.dev, qp, now, pkt);
        }
        self.refresh(slot);
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
    }

    /// The next frame to send, written at the front of `buf` (which should hold the Ethernet
    /// MTU plus 18 bytes); its length, or `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<usize> {
        let n = self.transmit(now, buf);
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
        n
    }

    fn transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<usize> {
        while let Some((slot, qpn)) = self.tx_sched.pop_front() {
            let Some(qp) = self.qps.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if qp.qpn != qpn {
                // Left by a destroyed QP; the slot's new QP has its own entry when it needs one.
                continue;
            }
            qp.scheduled = false;
            let mut n = None;
            // Responses first (they free the peer's resources); each failed attempt consumes
            // the entry it tried, so this ends.
            while n.is_none() && !qp.resp_out.is_empty() {
                n = responder::produce(&mut self.dev, qp, now, buf);
            }
            if n.is_none() && qp.has_request_work() {
                n = requester::produce(&mut self.dev, qp, now, buf);
            }
            match n {
                Some(n) => {
                    // A QP sends a burst before the next one's turn (its state is hot in the
                    // cache now); then it goes to the end of the round-robin schedule.
                    let more = !qp.resp_out.is_empty() || qp.has_request_work();
                    if more && self.burst_left > 1 {
                        self.burst_left -= 1;
                        qp.scheduled = true;
                        self.tx_sched.push_front((slot, qpn));
                        self.refresh_timers(slot);
                    } else {
                        self.burst_left = TX_BURST;
                        self.refresh(slot);
                    }
                    self.dev.counters.tx_packets += 1;
                    self.dev.counters.tx_bytes += n as u64;
                    return Some(n);
                }
                // Blocked (window, max_rd_atomic, fence) or done: off the schedule until an
                // ACK, a timer or a post changes that.
                None => {
                    self.burst_left = TX_BURST;
                    self.refresh_timers(slot);
                }
            }
        }
        None
    }

    /// True when `poll_transmit` may have a frame.
    pub fn wants_transmit(&self) -> bool {
        !self.tx_sched.is_empty()
    }

    /// The earliest deadline the RNIC wants `handle_timeout` called at. It may be early (a
    /// deadline that moved later is found out when its old entry comes up): calling
    /// `handle_timeout` then does nothing but re-arm.
    pub fn poll_timeout(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((t, slot, qpn))) = self.timers.peek() {
            if self.timer_armed(slot, qpn) {
                return Some(t);
            }
            self.timers.pop();
            self.forget_timer(t, slot, qpn);
        }
        None
    }

    /// The live QP an entry of `timers` or `tx_sched` is for: none when that QP was destroyed
    /// (another may live in its slot now).
    fn entry_qp(&mut self, slot: usize, qpn: Qpn) -> Option<&mut Qp> {
        self.qps
            .get_mut(slot)
            .and_then(Option::as_mut)
            .filter(|q| q.qpn == qpn)
    }

    /// A heap entry left: the QP's deadline must be pushed again if it is still set.
    fn forget_timer(&mut self, t: Nanos, slot: usize, qpn: Qpn) {
        match self.entry_qp(slot, qpn) {
            Some(qp) => {
                if qp.ack_pushed == Some(t) {
                    qp.ack_pushed = None;
                }
                if qp.rnr_pushed == Some(t) {
                    qp.rnr_pushed = None;
                }
            }
            None => self.stale_timers = self.stale_timers.saturating_sub(1),
        }
    }

    fn timer_armed(&self, slot: usize, qpn: Qpn) -> bool {
        match self.qps.get(slot).and_then(Option::as_ref) {
            Some(qp) if qp.qpn == qpn => qp.ack_deadline.is_some() || qp.rnr_deadline.is_some(),
            _ => false,
        }
    }

    /// Serves every deadline at or before `now`. Calling it again with the same `now` does
    /// nothing more.
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some(&Reverse((t, slot, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            self.forget_timer(t, slot, qpn);
            let Some(qp) = self
                .qps
                .get_mut(slot)
                .and_then(Option::as_mut)
                .filter(|q| q.qpn == qpn)
            else {
                continue;
            };
            let due = [qp.ack_deadline, qp.rnr_deadline]
                .into_iter()
                .flatten()
                .any(|d| d <= now);
            if due {
                completer::timeout(&mut self.dev, qp, now);
            }
            // Re-arms whatever is still set (a deadline that moved later than its entry).
            self.refresh(slot);
        }
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
    }

    /// Puts a QP on the transmit schedule if it has something to send, and its deadlines on the
    /// timer heap.
    fn refresh(&mut self, slot: usize) {
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        if !qp.scheduled && (!qp.resp_out.is_empty() || qp.has_request_work()) {
            qp.scheduled = true;
            self.tx_sched.push_back((slot, qp.qpn));
        }
        self.refresh_timers(slot);
    }

    /// Puts a QP's deadlines on the timer heap. One entry per deadline kind and QP: a deadline
    /// that moves later (every ACK pushes the retransmit timer out) keeps its earlier entry,
    /// which re-arms when it comes up; only an earlier deadline needs a new entry. Without this
    /// the heap grows by an entry per ACK.
    fn refresh_timers(&mut self, slot: usize) {
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        for (d, pushed) in [
            (qp.ack_deadline, &mut qp.ack_pushed),
            (qp.rnr_deadline, &mut qp.rnr_pushed),
        ] {
            if let Some(t) = d {
                if pushed.is_none_or(|p| t < p) {
                    *pushed = Some(t);
                    self.timers.push(Reverse((t, slot, qp.qpn)));
                }
            }
        }
    }
}

fn transport_matches(t: QpType, tr: Transport) -> bool {
    matches!(
        (t, tr),
        (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
    )
}

/// Entering ERR: every outstanding send and receive WQE completes with WR_FLUSH_ERR (IBTA
/// 10.3.1.5, 11.4.2.2), signaled or not.
pub(crate) fn flush(dev: &mut Dev, qp: &mut Qp) {
    qp.state = QpState::Err;
    while let Some(w) = qp.sq.pop_front() {
        let status = w.error.unwrap_or(WcStatus::WrFlushErr);
        let wc = requester::wc_for(qp, &w, status);
        dev.push_wc(qp.send_cq, wc);
    }
    if let qp::RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, qp::RespMsg::Idle) {
        let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        dev.push_wc(qp.recv_cq, wc);
    }
    while let Some(r) = qp.rq.pop_front() {
        let wc = responder::recv_wc(qp, &r, WcStatus::WrFlushErr, 0);
        dev.push_wc(qp.recv_cq, wc);
    }
    qp.sq_next = 0;
    qp.rd_outstanding = 0;
    qp.ack_deadline = None;
    qp.rnr_deadline = None;
    qp.resources.clear();
}

pub(crate) type Packet<'a> = ParsedFrame<'a>;
