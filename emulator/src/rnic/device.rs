//! The device: its configuration, its counters, the attributes it reports, the [`Rnic`] itself
//! (the tables every stage reads) and the frame builder every transmitting stage shares.
//!
//! Invariants: one IPv4 identification counter per device; a connected QP's packets are built
//! from its header template (made at `modify_qp`), a UD packet's from its work request's address
//! vector; the device's generator is the only source of randomness (keys, QPNs, PSNs, MR
//! addresses), seeded from [`RnicConfig::seed`].
use super::cc::CcConfig;
use super::cq::CqTable;
use super::mr::MemTable;
use super::qp::Qp;
use super::qpn::{QpnMap, Slots, MAX_SHARDS};
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
    /// Verify the ICRC of every received packet (drop on mismatch, IBTA A17.3.3, A17.3.4).
    pub check_icrc: bool,
    /// Compute the ICRC of every packet a connected QP sends (IBTA 9.2: always). `false` leaves
    /// it zero: only for a simulation whose links corrupt nothing and whose receivers do not
    /// check (`check_icrc` false; `rocemu sim --icrc off`), never on a wire, where a peer drops
    /// every such packet. UD packets and CNPs keep theirs.
    pub emit_icrc: bool,
    /// Send a connected QP's single-packet SENDs and RDMA WRITEs through the requester's fast
    /// path (on by default). Off, every packet takes the general path: the frames, state and
    /// counters are the same either way, which `emulator/tests/fast_path.rs` checks by
    /// running one workload both ways.
    pub fast_path: bool,
    /// Congestion control: ECN marking, the notification point, the reaction point and its
    /// parameters ([`CcConfig`]: no RP and no ECT marking by default; the NP answers CE marks).
    pub cc: CcConfig,
    /// Which part of a device this RNIC is when the device runs on several threads: one
    /// [`Shard`] per polling thread, every shard with the same MAC, addresses and `seed`. The
    /// QPN space is split between them (see [`Rnic::shard_of_qpn`]); a single-threaded device is
    /// shard 0 of 1, the default.
    pub shard: Shard,
}

/// One of `count` shards of a device (`index` < `count`): it makes only the QPNs whose slot is
/// `index` modulo `count`, so that any shard tells from a QPN alone which shard has the QP
/// (the QPN permutation's keys come from the device's seed, the same in every shard); its other
/// keys (R_Keys, PSNs) come from a stream of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard { index: 0, count: 1 }
    }
}

impl RnicConfig {
    pub fn new(mac: Mac, ip: IpAddr, seed: u64) -> RnicConfig {
        RnicConfig {
            mac,
            ips: vec![ip],
            eth_mtu: 9000,
            seed: Seed::from_u64(seed),
            check_icrc: true,
            emit_icrc: true,
            fast_path: true,
            cc: CcConfig::default(),
            shard: Shard::default(),
        }
    }
}

/// The device's event counters, named as rdma_rxe's `hw_counters`
/// (`drivers/infiniband/sw/rxe/rxe_hw_counters.c`) and mlx5's (NVIDIA's "Understanding mlx5
/// Linux counters" table) where one of them counts the same event, and RoCEmu's own otherwise.
/// Each field's doc says whose name it is and what moves it; [`Counters::named`] lists them
/// all. Where rxe and mlx5 count nearly the same event with different rules, both are kept
/// with each one's rule (`rcvd_rnr_err` and `rnr_nak_retry_err`, `out_of_seq_request` and
/// `out_of_sequence`); where two names mean exactly the same thing, one field carries both
/// names in [`Counters::named`] (`send_rnr_err` = `rnr_nak_sent`, `rx_drop_bad_icrc` =
/// `rx_icrc_encapsulated`).
///
/// Invariant: every frame handed to the RNIC either reaches a QP's completer or responder
/// (`rcvd_pkts`) or is counted under exactly one `rx_drop_*` reason (or, a CNP, under
/// `rp_cnp_handled` or `rp_cnp_ignored`);
/// packets a QP then drops are counted once more under the reason it dropped them for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    // ---- traffic ---------------------------------------------------------------------
    /// rxe: packets the RNIC sent (requests, retransmissions and responses).
    pub sent_pkts: u64,
    /// RoCEmu: the bytes of those packets, Ethernet header to ICRC.
    pub sent_bytes: u64,
    /// rxe: packets that passed every receive check (address, ICRC, headers, P_Key, QP,
    /// transport, state, source address, Q_Key) and went to a QP's completer or responder.
    pub rcvd_pkts: u64,
    /// RoCEmu: the bytes of those packets, Ethernet header to ICRC.
    pub rcvd_bytes: u64,
    /// rxe: SEND work requests (with immediate, with invalidate) completed, signaled or not,
    /// in error or not, flushed ones too (rxe's completer counts each in `do_complete()`).
    pub rdma_sends: u64,
    /// rxe: receive work requests completed successfully (a SEND or a WRITE with immediate
    /// delivered).
    pub rdma_recvs: u64,
    /// mlx5: new RDMA WRITE requests received (the first packet of each, duplicates not
    /// counted).
    pub rx_write_requests: u64,
    /// mlx5: new RDMA READ requests received (duplicates not counted).
    pub rx_read_requests: u64,
    /// mlx5: new atomic requests received (duplicates not counted).
    pub rx_atomic_requests: u64,

    // ---- requester -------------------------------------------------------------------
    /// RoCEmu: request packets sent again (go-back-N after a NAK, an implied NAK, a timeout
    /// or an RNR wait).
    pub retransmitted_pkts: u64,
    /// rxe: retries the completer started (a local ACK timeout, a sequence-error NAK or an
    /// implied NAK with retries left; RNR waits are not counted).
    pub completer_retry_err: u64,
    /// mlx5: local ACK timeouts that started a retry (the one that exhausts `retry_cnt` is
    /// `retry_exceeded_err` instead).
    pub local_ack_timeout_err: u64,
    /// mlx5: PSN sequence error NAKs received that started a retry.
    pub packet_seq_err: u64,
    /// mlx5: implied NAKs (a response or acknowledgement beyond a READ or atomic whose
    /// response is missing) that started a retry.
    pub implied_nak_seq_err: u64,
    /// mlx5: RNR NAKs received that started an RNR wait (`rnr_retry` not exhausted).
    pub rnr_nak_retry_err: u64,
    /// rxe: work requests failed with RETRY_EXC_ERR (`retry_cnt` exhausted).
    pub retry_exceeded_err: u64,
    /// rxe: work requests failed with RNR_RETRY_EXC_ERR (`rnr_retry` exhausted).
    pub retry_rnr_exceeded_err: u64,
    /// rxe: PSN sequence error NAKs received whose PSN is inside a message, after its first
    /// PSN and after what earlier ACKs covered (rxe's `check_psn` completes the messages the
    /// NAK acknowledges whole first, and `check_ack` counts a NAK only past the PSN it then
    /// expects: a NAK for the first PSN of a SEND or WRITE, or past a READ or atomic still
    /// in flight, is not counted).
    pub rcvd_seq_err: u64,
    /// rxe: RNR NAKs received, every one.
    pub rcvd_rnr_err: u64,
    /// RoCEmu: PSN sequence error NAKs received, every one.
    pub nak_rcvd_seq_err: u64,
    /// RoCEmu: invalid request NAKs received (and the reserved and invalid-RD codes, which
    /// complete as REM_INV_REQ_ERR too).
    pub nak_rcvd_inv_req: u64,
    /// RoCEmu: remote access error NAKs received.
    pub nak_rcvd_rem_access: u64,
    /// RoCEmu: remote operational error NAKs received.
    pub nak_rcvd_rem_op: u64,
    /// mlx5: work requests failed with REM_INV_REQ_ERR by a NAK.
    pub req_remote_invalid_request: u64,
    /// mlx5: work requests failed with REM_ACCESS_ERR by a NAK.
    pub req_remote_access_errors: u64,
    /// mlx5: send completions in error, flushes not counted.
    pub req_cqe_error: u64,
    /// mlx5: send completions flushed (WR_FLUSH_ERR).
    pub req_cqe_flush_error: u64,

    // ---- responder -------------------------------------------------------------------
    /// rxe and mlx5 (the same name): RC requests received with a PSN before the expected
    /// one (answered again, never executed twice).
    pub duplicate_request: u64,
    /// mlx5: request packets received with a PSN after the expected one (RC and UC), each
    /// one: the first of a sequence error and the ones dropped silently after it.
    pub out_of_sequence: u64,
    /// rxe: RC sequence errors, once each (the packet that makes the responder NAK; the
    /// ones after it until the expected PSN arrives are `out_of_sequence` only).
    pub out_of_seq_request: u64,
    /// mlx5: request packets that found no receive WQE (RC: RNR NAKed; UC, UD: dropped).
    pub out_of_buffer: u64,
    /// rxe `send_rnr_err`, RoCEmu `rnr_nak_sent` (one field, both names): RNR NAKs sent.
    pub send_rnr_err: u64,
    /// RoCEmu: PSN sequence error NAKs sent (counted as they leave: one replaced in the
    /// queue by a newer response is not).
    pub nak_sent_seq_err: u64,
    /// RoCEmu: invalid request NAKs sent.
    pub nak_sent_inv_req: u64,
    /// RoCEmu: remote access error NAKs sent.
    pub nak_sent_rem_access: u64,
    /// RoCEmu: remote operational error NAKs sent.
    pub nak_sent_rem_op: u64,
    /// mlx5: requests the responder found a remote access error in (R_Key, protection
    /// domain, permission, bounds): RC NAKs them, UC drops them.
    pub resp_remote_access_errors: u64,
    /// mlx5: receive completions with LOC_LEN_ERR (a message longer than its receive).
    pub resp_local_length_error: u64,
    /// mlx5: receive completions in error, flushes not counted.
    pub resp_cqe_error: u64,
    /// mlx5: receive completions flushed (WR_FLUSH_ERR).
    pub resp_cqe_flush_error: u64,
    /// RoCEmu: responses (ACK, NAK, read response, atomic ACK) merged into one already
    /// queued: an ACK or NAK acknowledges every PSN before its own, and a duplicate's answer
    /// that is queued already needs no second copy.
    pub resp_coalesced: u64,
    /// RoCEmu: responses not queued because the QP's response slots were all taken (a peer
    /// that ignores its max_rd_atomic, or floods faster than the port drains).
    pub resp_dropped: u64,

    // ---- congestion ------------------------------------------------------------------
    /// mlx5: RoCE packets received with ECN Congestion Experienced (both ECN bits set).
    pub np_ecn_marked_roce_packets: u64,
    /// mlx5: CNPs sent by the notification point (at most one per QP per
    /// `min_time_between_cnps` for the CE-marked packets it received).
    pub np_cnp_sent: u64,
    /// mlx5: CNPs taken by a QP's reaction point (DCQCN) to throttle its rate, whether or not
    /// they cut it (one inside the monitor period of the last cut counts for alpha only).
    pub rp_cnp_handled: u64,
    /// mlx5: CNPs received and ignored: no reaction point (`--cc none` or TIMELY), no such QP,
    /// a QP that sends nothing (not RTS or SQD), or a CNP from another address than a
    /// connected QP's peer.
    pub rp_cnp_ignored: u64,
    /// RoCEmu: CNPs that cut a QP's rate (DCQCN: at most one per
    /// `rate_reduce_monitor_period`).
    pub rp_rate_reductions: u64,

    // ---- receive drops, one counter per reason ----------------------------------------
    /// RoCEmu: frames that do not parse as RoCEv2 (truncated, bad lengths, not UDP 4791,
    /// an opcode without the headers it needs).
    pub rx_drop_malformed: u64,
    /// RoCEmu: frames for another Ethernet address (neither ours nor multicast).
    pub rx_drop_wrong_dst_mac: u64,
    /// RoCEmu: packets for an IP address that is none of the device's GIDs.
    pub rx_drop_wrong_dst_ip: u64,
    /// RoCEmu (mlx5 `rx_icrc_encapsulated`, one field, both names): packets with a bad
    /// ICRC (IBTA A17.3.4, CA17-24: dropped silently).
    pub rx_drop_bad_icrc: u64,
    /// RoCEmu: IPv4 packets with a bad header checksum.
    pub rx_drop_bad_ip_checksum: u64,
    /// RoCEmu: packets with a BTH transport version other than 0 (IBTA 9.6.1.1, unverified).
    pub rx_drop_bad_tver: u64,
    /// RoCEmu: packets whose P_Key does not match the partition (C9-43; A17.4.7).
    pub rx_drop_bad_pkey: u64,
    /// RoCEmu: packets for a QP number with no live QP.
    pub rx_drop_no_qp: u64,
    /// RoCEmu: packets whose opcode is for another transport than the QP's (an RC opcode
    /// to a UD QP, …).
    pub rx_drop_wrong_transport: u64,
    /// RoCEmu: packets for a QP in a state that takes none (a request before RTR, a
    /// response before RTS, anything in ERR).
    pub rx_drop_qp_state: u64,
    /// RoCEmu: packets to a connected QP from an address that is not its peer's (the
    /// address vector names another GID: the wrong GID index at either end).
    pub rx_drop_wrong_src: u64,
    /// RoCEmu: datagrams with the wrong Q_Key (IBTA 10.2.4, unverified).
    pub rx_drop_bad_qkey: u64,
    /// RoCEmu: UC packets out of opcode sequence (a MIDDLE or LAST with no message in
    /// progress, a FIRST or ONLY in the middle of one); RC NAKs them instead.
    pub rx_drop_opcode_seq: u64,
    /// RoCEmu: UC packets whose payload length does not fit their position (IBTA C9-92) or
    /// the RDMA WRITE's length; RC NAKs them instead.
    pub rx_drop_bad_length: u64,
    /// RoCEmu: UC packets of a message already lost (to a PSN gap or an error in an
    /// earlier packet of the message).
    pub rx_drop_rest_of_msg: u64,
    /// RoCEmu: responses whose AETH carries a reserved syndrome.
    pub rx_drop_bad_aeth: u64,
    /// RoCEmu: read responses or atomic ACKs with no READ or atomic waiting for one.
    pub rx_drop_unexpected_resp: u64,
    /// RoCEmu: read responses or atomic ACKs for a PSN answered already (a duplicate).
    pub rx_drop_duplicate_resp: u64,

    // ---- device ----------------------------------------------------------------------
    /// RoCEmu: completions lost to a full CQ, or to a CQ in error since.
    pub cq_overflow: u64,
    /// RoCEmu: asynchronous events dropped because nobody polled them
    /// ([`ASYNC_EVENTS_MAX`](super::ASYNC_EVENTS_MAX) queued).
    pub async_events_dropped: u64,
    /// rdma_rxe (`send_err`, `RXE_CNT_SEND_ERR` in `rxe_xmit_packet()`): packets the network
    /// stack refused to send. Here: frames the port dropped on transmit (refused for good by
    /// the kernel, or a DPDK backlog that stalled past its timeout).
    pub send_err: u64,
    /// rdma_rxe (`link_downed`, `rxe_port_down()` in `rxe_net.c`): times the port's link went
    /// down. Here: as the port saw it (AF_PACKET only: the kernel's ENETDOWN on its socket).
    pub link_downed: u64,
    /// RoCEmu: connections refused before anything went on the wire because the two ends' GIDs
    /// are of different IP versions (an RTR whose source GID index names an address of the
    /// other version than the destination GID; a peer whose GID is of a version this RNIC has
    /// no address of): the wrong GID index at either end. With rdma_rxe or mlx5 as the peer,
    /// whose GID index 0 is the IPv6 link-local address, this is the usual mistake (their
    /// perftest says "Found Incompatibility issue with GID types").
    pub gid_type_mismatch: u64,
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
    /// Completions made since the device was created, queued or lost to an overflow: what a
    /// driver that polls CQs without the RNIC's lock watches for ([`Rnic::completions_made`]).
    pub wcs_made: u64,
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
        // ECN-capable transport: ECT(0) unless the traffic class sets the ECN bits itself.
        let tc = if self.cfg.cc.ecn && av.traffic_class & 3 == 0 {
            av.traffic_class | 2
        } else {
            av.traffic_class
        };
        FrameRepr {
            eth: EthernetRepr {
                dst: dmac,
                src: self.cfg.mac,
                vlan: None,
                ethertype: 0,
            },
            ip: IpRepr::roce(src, dst, tc, ttl, av.flow_label),
            sport: Self::sport_for(qp, av),
            dport: ROCEV2_UDP_PORT,
            bth,
            ext,
        }
    }

    /// The UDP source port of `qp`'s packets to `av`: rxe's choice (Annex A17.3.2.1 and A17.9.4
    /// only ask for a port fixed per flow).
    pub fn sport_for(qp: &Qp, av: &AhAttr) -> u16 {
        match qp.qp_type {
            QpType::Ud => rocemu_wire::udp_sport_for_qpn(qp.qpn),
            _ => rocemu_wire::udp_sport_for_flow(av.flow_label, qp.qpn, qp.attr.dest_qp_num),
        }
    }

    /// The IPv4 identification of the next packet: one counter for the device.
    pub fn next_ident(&mut self) -> u16 {
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
        let t = HeaderTemplate::new(&self.frame_repr(
            qp,
            &qp.attr.ah_attr,
            qp.dmac,
            bth,
            ExtHeaders::default(),
        ));
        if self.cfg.emit_icrc {
            t
        } else {
            t.without_icrc()
        }
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
        fill: impl FnOnce(&MemTable, &mut rocemu_wire::icrc::Payload<'_>),
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
        let sh = cfg.shard;
        assert!(
            sh.count >= 1 && sh.index < sh.count && sh.count as usize <= MAX_SHARDS,
            "shard {} of {}",
            sh.index,
            sh.count
        );
        let qpn_map = QpnMap::new(&mut rng, sh.index, sh.count);
        if sh.index > 0 {
            // Shard 0 keeps the stream a one-shard device has; shard i takes the i-th fork.
            let mut s = rng.fork();
            for _ in 1..sh.index {
                s = rng.fork();
            }
            rng = KeyRng::new(&s);
        }
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
                wcs_made: 0,
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
    /// Counts a peer reached through a GID of an IP version this RNIC has no address of (the
    /// engine's address resolution finds it out before any verb does).
    pub(crate) fn count_gid_type_mismatch(&mut self) {
        self.dev.counters.gid_type_mismatch += 1;
    }
    /// Adds what the port counted since the last call: frames it dropped on transmit
    /// (`send_err`) and link-down events (`link_downed`).
    pub(crate) fn count_port_faults(&mut self, tx_dropped: u64, link_downed: u64) {
        self.dev.counters.send_err += tx_dropped;
        self.dev.counters.link_downed += link_downed;
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
