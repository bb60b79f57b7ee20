//! The device: its configuration, its counters, the attributes it reports, the [`Rnic`] itself
//! (the tables every stage reads) and the frame builder every transmitting stage shares.
//!
//! Invariants: one IPv4 identification counter per device; a connected QP's packets are built
//! from its header template (made at `modify_qp`), a UD packet's from its work request's address
//! vector; the device's generator is the only source of randomness (keys, QPNs, PSNs, MR
//! addresses), seeded from [`RnicConfig::seed`].
use super::cq::CqTable;
use super::mr::MemTable;
use super::qp::Qp;
use super::qpn::{QpnMap, Slots};
use super::schedule::TX_BURST;
use super::srq::SrqTable;
use super::verbs::*;
use crate::engine::neighbors::Neighbors;
use crate::rng::{KeyRng, Seed};
use crate::time::Nanos;
use rocemu_wire::eth::EthernetRepr;
use rocemu_wire::frame::IpRepr;
use rocemu_wire::{BthRepr, ExtHeaders, FrameRepr, HeaderTemplate, Psn, Qpn, ROCEV2_UDP_PORT};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::IpAddr;

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
    /// Asynchronous events dropped because nobody polled them
    /// ([`ASYNC_EVENTS_MAX`](super::ASYNC_EVENTS_MAX) queued).
    pub async_events_dropped: u64,
    /// Responses (ACK, NAK, read response, atomic ACK) merged into one already queued: an
    /// ACK or NAK acknowledges every PSN before its own, and a duplicate's answer that is
    /// queued already needs no second copy.
    pub resp_coalesced: u64,
    /// Responses not queued because the QP's response slots were all taken (a peer that
    /// ignores its max_rd_atomic, or floods faster than the port drains).
    pub resp_dropped: u64,
}

/// Everything but the QPs, so that a QP and the device can be borrowed at once.
#[derive(Debug)]
pub(crate) struct Dev {
    pub cfg: RnicConfig,
    pub rng: KeyRng,
    pub mem: MemTable,
    pub cqs: CqTable,
    /// The engine's neighbour table as the RNIC last heard it (bounded; see [`Neighbors`]).
    pub neighbors: Neighbors,
    pub ip_ident: u16,
    pub counters: Counters,
    pub active_mtu: Mtu,
    /// CQs that went to error and whose QPs the RNIC has not moved to ERR yet (it does so before
    /// the entry point that overflowed them returns).
    pub failed_cqs: Vec<CqId>,
    /// For `ibv_get_async_event`; at most [`ASYNC_EVENTS_MAX`](super::ASYNC_EVENTS_MAX).
    pub async_events: VecDeque<AsyncEvent>,
    /// CQs whose armed notification fired and that [`Rnic::take_cq_events`] has not taken yet:
    /// each at most once (its `Cq::event_pending`), so at most one per CQ.
    pub cq_events: Vec<CqId>,
    /// The shared receive queues (here, not in the Rnic, because the responders take their
    /// receive WQEs from them with a QP borrowed).
    pub srqs: SrqTable,
}

impl Dev {
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
    pub(super) fn template_for(&self, qp: &Qp) -> HeaderTemplate {
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
    pub(super) qpn_map: QpnMap,
    pub(super) slots: Slots,
    /// The QPN looked up last and its slot: packets and posts come in runs per QP (a message, a
    /// transmit burst), and a hit skips the permutation's four rounds.
    pub(super) last_slot: std::cell::Cell<(Qpn, usize)>,
    /// The slot of QP1, the general services interface, when one was created.
    pub(super) gsi: Option<usize>,
    pub(super) live_qps: usize,
    /// QPs with something to send, by slot and QPN: an entry left by a destroyed QP whose slot
    /// was reused does not act on the new QP.
    pub(super) tx_sched: VecDeque<(usize, Qpn)>,
    /// Packets the QP at the head of the schedule may still send before the next QP's turn.
    pub(super) burst_left: u32,
    /// Deadlines by slot and QPN, as `tx_sched`.
    pub(super) timers: BinaryHeap<Reverse<(Nanos, usize, Qpn)>>,
    /// Entries of `timers` left by destroyed QPs: the heap is rebuilt without them when they
    /// are many (a destroyed QP's far-off retransmit deadline would otherwise stay for hours).
    pub(super) stale_timers: usize,
    pub(super) attr: DeviceAttr,
}

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
    max_srq: 1 << 16,
    max_srq_wr: 1 << 14,
    max_srq_sge: 32,
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
                cqs: CqTable::default(),
                neighbors: Neighbors::default(),
                ip_ident: 0,
                counters: Counters::default(),
                active_mtu,
                failed_cqs: Vec::new(),
                cq_events: Vec::new(),
                async_events: VecDeque::new(),
                srqs: SrqTable::default(),
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
}
