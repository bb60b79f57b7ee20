//! `rocemu analyze`: a capture of RoCE traffic turned into an explanation. Reads every frame as
//! `rocemu decode` does and reconstructs each QP's conversation: its messages, retransmissions
//! and what triggered them, NAKs, RNR waits, CNPs and the ECN marks they answer, READ and atomic
//! latencies, ACK coalescing, goodput over time, and the CM exchange that created the QP.
//!
//! Invariants:
//!
//! * A QP is one direction of traffic: (source address, destination address, destination QPN),
//!   the contract's key. Its *requests* are what the source's QP asks of the destination's; the
//!   responses to them (ACKs, NAKs, READ responses, atomic ACKs) and the CNPs that throttle it
//!   travel the other way, on the *paired* key (destination → source, the requester's QPN as
//!   destination QPN), and are reported with the requester they answer. Pairs come from the CM
//!   (REQ and REP announce both QPNs), else from the first response whose PSN is one the
//!   requester used, else from the only candidate.
//! * A retransmitted packet is a request packet whose PSN was already seen on that QP (the
//!   contract). A READ request occupies the PSNs of all its responses; they count as seen.
//!   A go-back (the requester jumping back to an earlier PSN) gets one trigger: a sequence-error
//!   NAK or an RNR NAK for that PSN, an implied NAK (a response shortly before that left a READ
//!   or atomic unanswered), or else a local ACK timeout. "Shortly" is [`TRIGGER_WINDOW_RTTS`]
//!   round trips as the capture measures them (at least [`MIN_TRIGGER_WINDOW_NS`]).
//! * Bounded whatever the capture holds: at most [`MAX_QPS`] QPs are followed (frames of others
//!   are counted), each with a PSN window of [`window::PSN_WINDOW`] bits, at most
//!   [`MAX_EVENTS`] timeline events, [`MAX_POINTS`] plot points, 256 goodput buckets,
//!   [`MAX_PENDING`] READs/atomics awaiting a response, 4096 latency samples; at most
//!   [`MAX_CM`] CM connections. Counters are exact whatever was dropped from the timelines.
//! * Never panics on any input: frames that are not RoCE are counted as such, frames with a bad
//!   ICRC are counted and otherwise ignored (their headers cannot be trusted), a capture cut
//!   mid-record ends the analysis with what was read ([`Report::truncated`]).
//!
//! What a capture can show depends on where it was taken: a frame lost after the capture point
//! (the demo records what each RNIC sends, before the lossy cable) is in it, so its
//! retransmission is a repeated PSN; a frame lost before it (`ibdump` at the receiver) is not,
//! and shows as a PSN gap instead.
mod plot;
mod report;
pub mod window;

pub use plot::render_svg;

use rocemu_wire::capture::{CaptureError, CaptureReader, CapturedFrame, LinkType};
use rocemu_wire::cm::{CmMadRepr, CmMessage};
use rocemu_wire::frame::parse_ip_packet;
use rocemu_wire::opcode::{Operation, Position, Transport};
use rocemu_wire::{parse_frame, NakCode, ParsedFrame, Psn, SyndromeKind};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::IpAddr;
use std::path::Path;
use window::{Buckets, Mark, PsnWindow, Stat, Thinned};

/// QPs followed at most; frames of further QPs are counted in [`Report::untracked_frames`].
pub const MAX_QPS: usize = 1024;
/// Timeline events (NAKs, RNR NAKs, go-backs) kept per QP; the counts stay exact.
pub const MAX_EVENTS: usize = 512;
/// Points of the PSN-over-time series kept per QP.
pub const MAX_POINTS: usize = 2048;
/// READ and atomic requests awaiting their first response, per QP.
pub const MAX_PENDING: usize = 256;
/// CM connections followed.
pub const MAX_CM: usize = 1024;
/// Distinct NAKed PSNs counted per QP (for "NAKed PSN 1234 three times").
const MAX_NAKED_PSNS: usize = 64;
/// A trigger counts when it came at most this many round trips before the go-back.
pub const TRIGGER_WINDOW_RTTS: u64 = 8;
/// The smallest trigger window: 20 µs.
pub const MIN_TRIGGER_WINDOW_NS: u64 = 20_000;
/// The trigger window before any round trip was measured: 1 ms.
pub const DEFAULT_TRIGGER_WINDOW_NS: u64 = 1_000_000;

/// A QP: source address, destination address, destination QPN.
pub type Key = (IpAddr, IpAddr, u32);

/// The NAK kinds, as the JSON names them (IBTA table 44).
pub fn nak_kind_name(c: NakCode) -> &'static str {
    match c {
        NakCode::PsnSequenceError => "psn_seq_err",
        NakCode::InvalidRequest => "invalid_request",
        NakCode::RemoteAccessError => "remote_access_err",
        NakCode::RemoteOperationalError => "remote_op_err",
        NakCode::InvalidRdRequest => "invalid_rd_request",
        NakCode::Reserved(_) => "reserved",
    }
}

/// What made the requester go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A PSN sequence error NAK for the PSN it went back to.
    Nak,
    /// An RNR NAK: the wait it asked for is over.
    Rnr,
    /// A response that left a READ or atomic unanswered (IBTA 9.7.5.2.2, unverified), or skipped
    /// PSNs.
    ImpliedNak,
    /// Nothing came back for the ACK timeout.
    Timeout,
}

impl Trigger {
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Nak => "nak",
            Trigger::Rnr => "rnr",
            Trigger::ImpliedNak => "implied_nak",
            Trigger::Timeout => "timeout",
        }
    }
}

/// One event on a QP's timeline (times in ns from the capture's first frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The responder NAKed `psn`.
    Nak { t: u64, psn: Psn, code: NakCode },
    /// The responder answered `psn` with an RNR NAK asking for `timer_us`.
    Rnr { t: u64, psn: Psn, timer_us: u32 },
    /// The requester went back to `psn`; `idle_ns`: how long the conversation had been quiet.
    GoBack {
        t: u64,
        psn: Psn,
        trigger: Trigger,
        idle_ns: u64,
    },
}

/// The CM exchange that created a QP pair.
#[derive(Debug, Clone, Default)]
pub struct CmConn {
    pub active: Option<IpAddr>,
    pub passive: Option<IpAddr>,
    pub active_comm_id: u32,
    pub passive_comm_id: Option<u32>,
    pub service_id: u64,
    pub active_qpn: u32,
    pub passive_qpn: Option<u32>,
    /// The PSN the passive side sends from (the REQ's Starting PSN, as Linux fills it).
    pub passive_psn: u32,
    /// The PSN the active side sends from (the REP's Starting PSN).
    pub active_psn: Option<u32>,
    pub req_ts: Vec<u64>,
    pub rep_ts: Option<u64>,
    pub rtu_ts: Option<u64>,
    pub mra_ts: Option<u64>,
    pub rej: Option<(u64, String)>,
    pub dreq_ts: Option<u64>,
    pub drep_ts: Option<u64>,
    /// The REQ's local ACK timeout code (4.096 µs × 2^n).
    pub ack_timeout: u8,
}

/// Everything known about one key.
#[derive(Debug, Clone)]
pub struct Qp {
    pub key: Key,
    /// Transport of its first packet that was not a CNP.
    pub transport: Option<Transport>,
    pub frames: u64,
    pub first_ts: u64,
    pub last_ts: u64,
    /// The paired key (the other direction), an index into [`Report::qps`].
    pub pair: Option<usize>,
    /// The CM connection that announced this QP, an index into [`Report::cm`].
    pub cm: Option<usize>,
    pub ecn_ce: u64,
    pub icrc_bad: u64,
    /// The frames' UDP source port (the last one seen).
    pub sport: u16,
    // ---- requests sent on this key
    pub request_packets: u64,
    pub messages: u64,
    pub messages_by_op: BTreeMap<&'static str, u64>,
    /// Message bytes: payloads first sent for SEND/WRITE, the RETH length for READ, 8 for atomics.
    pub bytes: u64,
    pub retransmitted_packets: u64,
    pub go_backs: u64,
    pub triggers: BTreeMap<&'static str, u64>,
    /// PSNs skipped by the requester (missing from the capture).
    pub psn_gaps: u64,
    /// PSNs more than the window away from the last one.
    pub psn_jumps: u64,
    pub first_psn: Option<Psn>,
    pub first_request_ts: Option<u64>,
    pub first_retransmit_ts: Option<u64>,
    pub first_timeout_ts: Option<u64>,
    pub timeout_idle: Stat,
    /// The path MTU as the payloads of FIRST and MIDDLE packets show it, either direction.
    pub pmtu: Option<u32>,
    pub read_latency: Stat,
    pub atomic_latency: Stat,
    pub rtt: Stat,
    pub unanswered_reads: u64,
    // ---- responses and CNPs sent on this key (they answer the pair's requests)
    pub acks_sent: u64,
    pub read_responses_sent: u64,
    pub atomic_acks_sent: u64,
    pub naks_sent: BTreeMap<&'static str, u64>,
    pub rnr_naks_sent: u64,
    pub cnps_sent: u64,
    /// CE marks on this key not yet answered by a CNP on the pair, and those answered.
    pub ce_pending: u64,
    pub ce_answered: u64,
    /// Timelines: events about this key's requests (NAKs and RNR NAKs the responder sent them,
    /// go-backs).
    pub events: Vec<Event>,
    pub events_dropped: u64,
    /// (t, psn, retransmitted) of request packets, thinned.
    pub psn_series: Thinned<(u64, u32, bool)>,
    pub goodput: Buckets,
    // ---- working state
    seen: PsnWindow,
    next_psn: Option<Psn>,
    next_exact: bool,
    resp_high: Option<Psn>,
    last_request_ts: u64,
    last_response_ts: Option<u64>,
    last_nak: Option<(u64, Psn, bool)>,
    last_rnr: Option<(u64, Psn, bool)>,
    last_ackreq: Option<(Psn, u64)>,
    pending: Vec<(Psn, u64, bool)>,
    naked_psns: BTreeMap<u32, u64>,
}

impl Qp {
    fn new(key: Key, t: u64) -> Qp {
        Qp {
            key,
            transport: None,
            frames: 0,
            first_ts: t,
            last_ts: t,
            pair: None,
            cm: None,
            ecn_ce: 0,
            icrc_bad: 0,
            sport: 0,
            request_packets: 0,
            messages: 0,
            messages_by_op: BTreeMap::new(),
            bytes: 0,
            retransmitted_packets: 0,
            go_backs: 0,
            triggers: BTreeMap::new(),
            psn_gaps: 0,
            psn_jumps: 0,
            first_psn: None,
            first_request_ts: None,
            first_retransmit_ts: None,
            first_timeout_ts: None,
            timeout_idle: Stat::default(),
            pmtu: None,
            read_latency: Stat::default(),
            atomic_latency: Stat::default(),
            rtt: Stat::default(),
            unanswered_reads: 0,
            acks_sent: 0,
            read_responses_sent: 0,
            atomic_acks_sent: 0,
            naks_sent: BTreeMap::new(),
            rnr_naks_sent: 0,
            cnps_sent: 0,
            ce_pending: 0,
            ce_answered: 0,
            events: Vec::new(),
            events_dropped: 0,
            psn_series: Thinned::new(MAX_POINTS),
            goodput: Buckets::new(),
            seen: PsnWindow::default(),
            next_psn: None,
            next_exact: true,
            resp_high: None,
            last_request_ts: 0,
            last_response_ts: None,
            last_nak: None,
            last_rnr: None,
            last_ackreq: None,
            pending: Vec::new(),
            naked_psns: BTreeMap::new(),
        }
    }

    fn event(&mut self, e: Event) {
        if self.events.len() < MAX_EVENTS {
            self.events.push(e);
        } else {
            self.events_dropped += 1;
        }
    }

    /// The PSN NAKed most often and how often, when some PSN was NAKed more than once.
    pub fn most_naked_psn(&self) -> Option<(u32, u64)> {
        self.naked_psns
            .iter()
            .max_by_key(|(p, n)| (**n, std::cmp::Reverse(**p)))
            .filter(|(_, n)| **n > 1)
            .map(|(p, n)| (*p, *n))
    }

    /// The trigger window: [`TRIGGER_WINDOW_RTTS`] of the smallest round trip measured.
    fn trigger_window(&self, pair: Option<&Qp>) -> u64 {
        let mut rtt = self.rtt.n.gt(&0).then_some(self.rtt.min);
        if let Some(p) = pair {
            if p.rtt.n > 0 {
                rtt = Some(rtt.map_or(p.rtt.min, |r| r.min(p.rtt.min)));
            }
        }
        match rtt {
            Some(r) => (r * TRIGGER_WINDOW_RTTS).max(MIN_TRIGGER_WINDOW_NS),
            None => DEFAULT_TRIGGER_WINDOW_NS,
        }
    }
}

/// The analysis of one capture.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Frames read.
    pub frames: u64,
    /// Frames that were well-formed RoCEv2.
    pub roce_frames: u64,
    /// Frames that were not RoCEv2, by what they were.
    pub other_frames: BTreeMap<String, u64>,
    /// Frames whose ICRC did not verify.
    pub icrc_bad: u64,
    /// Frames of QPs beyond [`MAX_QPS`].
    pub untracked_frames: u64,
    /// CM MADs that did not parse, or matched no connection.
    pub cm_unmatched: u64,
    /// Responses and CNPs that answer no request in the capture.
    pub orphan_responses: u64,
    /// The capture's first timestamp (since the Unix epoch), ns.
    pub start_ns: u64,
    /// The last frame's time from the first, ns.
    pub span_ns: u64,
    /// Why reading stopped early, when it did (a capture cut mid-record).
    pub truncated: Option<String>,
    pub qps: Vec<Qp>,
    pub cm: Vec<CmConn>,
    /// Findings in words (filled by [`Analyzer::finish`]).
    pub findings: Vec<String>,
}

impl Report {
    /// The index of a QP by its key.
    pub fn find(&self, key: &Key) -> Option<usize> {
        self.qps.iter().position(|q| q.key == *key)
    }
}

/// Reads frames one at a time and builds a [`Report`].
#[derive(Debug, Default)]
pub struct Analyzer {
    r: Report,
    index: HashMap<Key, usize>,
    started: bool,
}

/// The message name of a LAST or ONLY request opcode: `SEND`, `SEND_WITH_IMM`, `RDMA_WRITE`, …
fn message_name(op: Operation, imm: bool, inv: bool) -> &'static str {
    match (op, imm, inv) {
        (Operation::Send, false, true) => "SEND_WITH_INV",
        (Operation::Send, true, _) => "SEND_WITH_IMM",
        (Operation::Send, false, false) => "SEND",
        (Operation::RdmaWrite, true, _) => "RDMA_WRITE_WITH_IMM",
        (Operation::RdmaWrite, false, _) => "RDMA_WRITE",
        (Operation::RdmaReadRequest, ..) => "RDMA_READ",
        (Operation::CompareSwap, ..) => "CMP_SWAP",
        (Operation::FetchAdd, ..) => "FETCH_ADD",
        (Operation::Flush, ..) => "FLUSH",
        (Operation::AtomicWrite, ..) => "ATOMIC_WRITE",
        _ => "OTHER",
    }
}

/// What a frame that is not RoCEv2 is, as far as its headers tell.
fn other_kind(f: &CapturedFrame) -> String {
    use rocemu_wire::eth::{EthernetRepr, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
    use rocemu_wire::ip::{Ipv4Repr, Ipv6Repr};
    let ip = |proto: u8| match proto {
        1 => "ICMP".to_string(),
        6 => "TCP".to_string(),
        17 => "UDP (not 4791)".to_string(),
        58 => "ICMPv6".to_string(),
        p => format!("IP protocol {p}"),
    };
    let l3 = match f.link {
        LinkType::Ethernet => match EthernetRepr::parse(&f.data) {
            Ok((eth, off)) => match eth.ethertype {
                ETHERTYPE_ARP => return "ARP".into(),
                ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => &f.data[off..],
                t => return format!("ethertype 0x{t:04x}"),
            },
            Err(_) => return "malformed".into(),
        },
        LinkType::RawIp => &f.data[..],
        LinkType::Other(l) => return format!("link type {l}"),
    };
    match l3.first().map(|b| b >> 4) {
        Some(4) => Ipv4Repr::parse(l3).map_or("malformed".into(), |(r, _)| ip(r.protocol)),
        Some(6) => Ipv6Repr::parse(l3).map_or("malformed".into(), |(r, _)| ip(r.next_header)),
        _ => "malformed".into(),
    }
}

impl Analyzer {
    pub fn new() -> Analyzer {
        Analyzer::default()
    }

    /// The QP for `key`, created on first sight (None beyond [`MAX_QPS`]).
    fn qp(&mut self, key: Key, t: u64) -> Option<usize> {
        if let Some(&i) = self.index.get(&key) {
            return Some(i);
        }
        if self.r.qps.len() >= MAX_QPS {
            return None;
        }
        let i = self.r.qps.len();
        self.r.qps.push(Qp::new(key, t));
        self.index.insert(key, i);
        Some(i)
    }

    /// Reads one captured frame.
    pub fn frame(&mut self, f: &CapturedFrame) {
        let ts = u64::try_from(f.timestamp.as_nanos()).unwrap_or(u64::MAX);
        if !self.started {
            self.started = true;
            self.r.start_ns = ts;
        }
        // Times go from the first frame; a capture whose clock steps back does not go negative.
        let t = ts.saturating_sub(self.r.start_ns);
        self.r.frames += 1;
        self.r.span_ns = self.r.span_ns.max(t);
        let parsed = match f.link {
            LinkType::Ethernet => parse_frame(&f.data),
            LinkType::RawIp => parse_ip_packet(&f.data),
            LinkType::Other(_) => {
                *self.r.other_frames.entry(other_kind(f)).or_default() += 1;
                return;
            }
        };
        match parsed {
            Ok(p) => self.roce(t, &p),
            Err(_) => *self.r.other_frames.entry(other_kind(f)).or_default() += 1,
        }
    }

    fn roce(&mut self, t: u64, p: &ParsedFrame<'_>) {
        self.r.roce_frames += 1;
        let key: Key = (p.ip.src(), p.ip.dst(), p.bth.dqpn.value());
        let Some(i) = self.qp(key, t) else {
            self.r.untracked_frames += 1;
            if !p.icrc_ok() {
                self.r.icrc_bad += 1;
            }
            return;
        };
        {
            let q = &mut self.r.qps[i];
            q.frames += 1;
            q.last_ts = t;
            q.sport = p.udp.sport;
            if p.ip.ecn() == 3 {
                q.ecn_ce += 1;
                q.ce_pending += 1;
            }
        }
        if !p.icrc_ok() {
            self.r.icrc_bad += 1;
            self.r.qps[i].icrc_bad += 1;
            return;
        }
        let info = p.bth.opcode.info();
        if info.transport != Transport::Cnp && self.r.qps[i].transport.is_none() {
            self.r.qps[i].transport = Some(info.transport);
        }
        if matches!(info.position, Position::First | Position::Middle)
            && info.has_payload()
            && !p.payload.is_empty()
        {
            let n = p.payload.len() as u32;
            let q = &mut self.r.qps[i];
            q.pmtu = Some(q.pmtu.map_or(n, |m| m.max(n)));
        }
        if let Some(m) = rocemu_wire::mad::gsi_payload(p) {
            self.cm_mad(t, p, m);
        }
        if info.transport == Transport::Cnp {
            self.r.qps[i].cnps_sent += 1;
            match self.pair_of(i, None) {
                Some(j) => {
                    let r = &mut self.r.qps[j];
                    r.ce_answered += r.ce_pending;
                    r.ce_pending = 0;
                }
                None => self.r.orphan_responses += 1,
            }
        } else if info.is_request() {
            self.request(i, t, p);
        } else {
            self.response(i, t, p);
        }
    }

    /// The pair of QP `i`, pairing it now when it has none: among the QPs the other way (RC
    /// ones for a response), the one whose requests used `psn`, else the one whose UDP source
    /// port is this one's (RoCEmu and rxe answer from the requester's port), else the only one.
    fn pair_of(&mut self, i: usize, psn: Option<Psn>) -> Option<usize> {
        if let Some(j) = self.r.qps[i].pair {
            return Some(j);
        }
        let (src, dst, _) = self.r.qps[i].key;
        let sport = self.r.qps[i].sport;
        let cands: Vec<usize> = (0..self.r.qps.len())
            .filter(|&j| {
                let q = &self.r.qps[j];
                j != i
                    && q.key.0 == dst
                    && q.key.1 == src
                    && q.pair.is_none()
                    && q.request_packets > 0
                    && (psn.is_none() || q.transport == Some(Transport::Rc))
            })
            .collect();
        let pick = |f: &dyn Fn(&Qp) -> bool| -> Option<usize> {
            let m: Vec<usize> = cands
                .iter()
                .copied()
                .filter(|&j| f(&self.r.qps[j]))
                .collect();
            (m.len() == 1).then(|| m[0])
        };
        let j = psn
            .and_then(|p| {
                pick(&|q| q.seen.contains(p) && q.sport == sport)
                    .or_else(|| pick(&|q| q.seen.contains(p)))
            })
            .or_else(|| pick(&|q| q.sport == sport))
            .or_else(|| pick(&|_| true))?;
        self.link(i, j);
        Some(j)
    }

    fn link(&mut self, i: usize, j: usize) {
        if i == j {
            return;
        }
        self.r.qps[i].pair = Some(j);
        self.r.qps[j].pair = Some(i);
    }

    fn request(&mut self, i: usize, t: u64, p: &ParsedFrame<'_>) {
        let info = p.bth.opcode.info();
        let psn = p.bth.psn;
        let rc = info.transport == Transport::Rc;
        let read = info.operation == Operation::RdmaReadRequest;
        let atomic = matches!(info.operation, Operation::CompareSwap | Operation::FetchAdd);
        let pair = self.r.qps[i].pair;
        let window = {
            let q = &self.r.qps[i];
            q.trigger_window(pair.map(|j| &self.r.qps[j]))
        };
        let pmtu = self.r.qps[i]
            .pmtu
            .or_else(|| pair.and_then(|j| self.r.qps[j].pmtu));
        let reth_len = p.ext.reth.map_or(0, |r| r.dma_len);
        // A READ occupies one PSN per response packet; the path MTU is known only from a
        // FIRST/MIDDLE payload (a guess could take PSNs the next requests will use).
        let npkts = if read {
            pmtu.map_or(1, |m| reth_len.div_ceil(m.max(1)).max(1))
                .min(window::PSN_WINDOW / 2)
        } else {
            1
        };
        // After a READ of unknown extent, the next request's PSN is not known.
        let extent_known = !read || pmtu.is_some() || reth_len == 0;
        let q = &mut self.r.qps[i];
        q.request_packets += 1;
        q.first_request_ts.get_or_insert(t);
        q.first_psn.get_or_insert(psn);
        let mark = q.seen.mark(psn);
        let retransmitted = mark == Mark::Seen && q.transport != Some(Transport::Ud);
        let go_back = retransmitted && q.next_psn != Some(psn);
        match mark {
            Mark::New { missing } if missing > 0 && q.next_psn.is_some() && q.next_exact => {
                q.psn_gaps += u64::from(missing)
            }
            Mark::Jump => q.psn_jumps += 1,
            _ => {}
        }
        for k in 1..npkts {
            q.seen.mark(psn.add(k));
        }
        q.next_psn = Some(psn.add(npkts));
        q.next_exact = extent_known;
        q.psn_series.push((t, psn.value(), retransmitted));
        if p.bth.ack_req && !retransmitted {
            q.last_ackreq = Some((psn, t));
        }
        if retransmitted {
            q.retransmitted_packets += 1;
            q.first_retransmit_ts.get_or_insert(t);
            // Karn: a repeated request's response times nothing.
            q.pending.retain(|e| e.0 != psn);
            if q.last_ackreq.is_some_and(|(a, _)| a == psn) {
                q.last_ackreq = None;
            }
        } else {
            if info.position.is_last() {
                q.messages += 1;
                let name = message_name(info.operation, info.has_immediate(), p.ext.ieth.is_some());
                *q.messages_by_op.entry(name).or_default() += 1;
            }
            let b = if read {
                u64::from(reth_len)
            } else if atomic {
                8
            } else {
                p.payload.len() as u64
            };
            q.bytes += b;
            if !read {
                q.goodput.add(t, b);
            }
            if (read || atomic) && rc {
                if q.pending.len() >= MAX_PENDING {
                    q.pending.remove(0);
                    q.unanswered_reads += 1;
                }
                q.pending.push((psn, t, atomic));
            }
        }
        let last_request_ts = q.last_request_ts;
        q.last_request_ts = t;
        if go_back && rc {
            self.go_back(i, t, psn, window, last_request_ts);
        }
    }

    /// Decides what triggered the go-back to `psn` at `t`.
    fn go_back(&mut self, i: usize, t: u64, psn: Psn, window: u64, last_request_ts: u64) {
        let pair = self.r.qps[i].pair;
        let q = &mut self.r.qps[i];
        let recent = |at: u64| t.saturating_sub(at) <= window;
        let trigger = if let Some(r) = q.last_rnr.as_mut().filter(|r| r.2 && r.1 == psn) {
            // The RNR wait (up to 655 ms) is over: no window.
            r.2 = false;
            Trigger::Rnr
        } else if let Some(n) = q.last_nak.as_mut().filter(|n| n.2 && recent(n.0)) {
            n.2 = false;
            Trigger::Nak
        } else if q.last_response_ts.is_some_and(recent) {
            Trigger::ImpliedNak
        } else {
            Trigger::Timeout
        };
        let idle = t.saturating_sub(last_request_ts.max(q.last_response_ts.unwrap_or(0)));
        q.go_backs += 1;
        *q.triggers.entry(trigger.name()).or_default() += 1;
        if trigger == Trigger::Timeout {
            q.first_timeout_ts.get_or_insert(t);
            q.timeout_idle.add(idle);
        }
        if let Some(n) = q.last_nak.as_mut() {
            // A NAK is answered by one go-back at most.
            if trigger != Trigger::Nak && n.1 == psn {
                n.2 = false;
            }
        }
        q.event(Event::GoBack {
            t,
            psn,
            trigger,
            idle_ns: idle,
        });
        let _ = pair;
    }

    fn response(&mut self, i: usize, t: u64, p: &ParsedFrame<'_>) {
        let info = p.bth.opcode.info();
        let psn = p.bth.psn;
        {
            let q = &mut self.r.qps[i];
            match info.operation {
                Operation::RdmaReadResponse => q.read_responses_sent += 1,
                Operation::AtomicAcknowledge => q.atomic_acks_sent += 1,
                _ => {}
            }
        }
        let Some(j) = self.pair_of(i, Some(psn)) else {
            self.r.orphan_responses += 1;
            let q = &mut self.r.qps[i];
            if let Some(a) = p.ext.aeth {
                match a.syndrome.kind() {
                    SyndromeKind::Nak(c) => *q.naks_sent.entry(nak_kind_name(c)).or_default() += 1,
                    SyndromeKind::RnrNak { .. } => q.rnr_naks_sent += 1,
                    _ => q.acks_sent += 1,
                }
            }
            return;
        };
        let kind = p.ext.aeth.map(|a| a.syndrome.kind());
        let Some((qi, qj)) = two(&mut self.r.qps, i, j) else {
            return;
        };
        match kind {
            Some(SyndromeKind::Nak(code)) => {
                *qi.naks_sent.entry(nak_kind_name(code)).or_default() += 1;
                qj.event(Event::Nak { t, psn, code });
                if code == NakCode::PsnSequenceError {
                    qj.last_nak = Some((t, psn, true));
                }
                if qj.naked_psns.len() < MAX_NAKED_PSNS || qj.naked_psns.contains_key(&psn.value())
                {
                    *qj.naked_psns.entry(psn.value()).or_default() += 1;
                }
                return;
            }
            Some(SyndromeKind::RnrNak { timer }) => {
                qi.rnr_naks_sent += 1;
                qj.event(Event::Rnr {
                    t,
                    psn,
                    timer_us: rocemu_wire::types::RNR_TIMER_MICROS[timer as usize],
                });
                qj.last_rnr = Some((t, psn, true));
                return;
            }
            Some(SyndromeKind::Ack { .. }) if info.operation == Operation::Acknowledge => {
                qi.acks_sent += 1;
            }
            _ => {}
        }
        if let Some((a, at)) = qj.last_ackreq {
            if a == psn && info.operation == Operation::Acknowledge {
                qj.rtt.add(t.saturating_sub(at));
                qj.last_ackreq = None;
            }
        }
        qj.last_response_ts = Some(t);
        // A response to a READ: its PSNs are the requester's; its payload is the READ's data.
        if info.operation == Operation::RdmaReadResponse {
            qj.seen.mark(psn);
            let fresh = qj.resp_high.is_none_or(|h| psn.is_after(h));
            if fresh {
                qj.resp_high = Some(psn);
                qj.goodput.add(t, p.payload.len() as u64);
            }
        }
        if info.position.is_first() {
            if let Some(k) = qj.pending.iter().position(|e| e.0 == psn) {
                let (_, at, atomic) = qj.pending.remove(k);
                let d = t.saturating_sub(at);
                if atomic {
                    qj.atomic_latency.add(d);
                } else {
                    qj.read_latency.add(d);
                }
            }
        }
    }

    fn cm_mad(&mut self, t: u64, p: &ParsedFrame<'_>, mad: &[u8]) {
        let Ok(m) = CmMadRepr::parse(mad) else {
            self.r.cm_unmatched += 1;
            return;
        };
        let (src, dst) = (p.ip.src(), p.ip.dst());
        let find = |cm: &[CmConn], f: &dyn Fn(&CmConn) -> bool| cm.iter().rposition(f);
        match m.msg {
            CmMessage::Req(r) => {
                let id = r.local_comm_id.0;
                if let Some(k) = find(&self.r.cm, &|c| {
                    c.active == Some(src) && c.active_comm_id == id
                }) {
                    self.r.cm[k].req_ts.push(t);
                    return;
                }
                if self.r.cm.len() >= MAX_CM {
                    self.r.cm_unmatched += 1;
                    return;
                }
                self.r.cm.push(CmConn {
                    active: Some(src),
                    passive: Some(dst),
                    active_comm_id: id,
                    service_id: r.service_id.0,
                    active_qpn: r.local_qpn.value(),
                    passive_psn: r.starting_psn.value(),
                    req_ts: vec![t],
                    ack_timeout: r.primary_path.local_ack_timeout,
                    ..CmConn::default()
                });
            }
            CmMessage::Rep(r) => {
                let id = r.remote_comm_id.0;
                let Some(k) = find(&self.r.cm, &|c| {
                    c.passive == Some(src) && c.active == Some(dst) && c.active_comm_id == id
                }) else {
                    self.r.cm_unmatched += 1;
                    return;
                };
                let c = &mut self.r.cm[k];
                c.rep_ts.get_or_insert(t);
                c.passive_comm_id = Some(r.local_comm_id.0);
                c.passive_qpn = Some(r.local_qpn.value());
                c.active_psn = Some(r.starting_psn.value());
                let (a, b, qa, qb) = (dst, src, c.active_qpn, r.local_qpn.value());
                let i = self.qp((a, b, qb), t);
                let j = self.qp((b, a, qa), t);
                if let (Some(i), Some(j)) = (i, j) {
                    // The CM's word wins over a guess made from PSNs.
                    for x in [i, j] {
                        if let Some(o) = self.r.qps[x].pair.take() {
                            self.r.qps[o].pair = None;
                        }
                    }
                    self.link(i, j);
                    self.r.qps[i].cm = Some(k);
                    self.r.qps[j].cm = Some(k);
                }
            }
            msg => {
                let (local, remote) = match msg {
                    CmMessage::Rtu(r) | CmMessage::Drep(r) => {
                        (r.local_comm_id.0, r.remote_comm_id.0)
                    }
                    CmMessage::Dreq(r) => (r.local_comm_id.0, r.remote_comm_id.0),
                    CmMessage::Rej(r) => (r.local_comm_id.0, r.remote_comm_id.0),
                    CmMessage::Mra(r) => (r.local_comm_id.0, r.remote_comm_id.0),
                    _ => return,
                };
                // From the active side: local is its ID; from the passive side: remote is.
                let k = find(&self.r.cm, &|c| {
                    (c.active == Some(src) && c.active_comm_id == local)
                        || (c.active == Some(dst) && c.active_comm_id == remote)
                });
                let Some(k) = k else {
                    self.r.cm_unmatched += 1;
                    return;
                };
                let c = &mut self.r.cm[k];
                match msg {
                    CmMessage::Rtu(_) => {
                        c.rtu_ts.get_or_insert(t);
                    }
                    CmMessage::Drep(_) => {
                        c.drep_ts.get_or_insert(t);
                    }
                    CmMessage::Dreq(_) => {
                        c.dreq_ts.get_or_insert(t);
                    }
                    CmMessage::Mra(_) => {
                        c.mra_ts.get_or_insert(t);
                    }
                    CmMessage::Rej(r) => {
                        c.rej.get_or_insert((t, r.reason.to_string()));
                    }
                    _ => {}
                }
            }
        }
    }

    /// The report, with its findings.
    pub fn finish(mut self) -> Report {
        let span = self.r.span_ns;
        for q in &mut self.r.qps {
            q.unanswered_reads += q.pending.len() as u64;
            q.pending.clear();
        }
        // One bucket width for every QP, so goodput series line up.
        let w = self
            .r
            .qps
            .iter()
            .map(|q| q.goodput.width_ns)
            .max()
            .unwrap_or(Buckets::FIRST_WIDTH_NS);
        let _ = span;
        for q in &mut self.r.qps {
            q.goodput.widen_to(w);
        }
        self.r.findings = report::findings(&self.r);
        self.r
    }

    /// Marks the analysis as cut short by `why` (a corrupt or truncated record).
    pub fn truncated(&mut self, why: String) {
        self.r.truncated = Some(why);
    }
}

/// Two distinct elements of a slice, mutably.
fn two<T>(v: &mut [T], i: usize, j: usize) -> Option<(&mut T, &mut T)> {
    if i == j || i.max(j) >= v.len() {
        return None;
    }
    Some(if i < j {
        let (a, b) = v.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = v.split_at_mut(i);
        (&mut b[0], &mut a[j])
    })
}

/// Analyzes a capture read from `reader`. A corrupt record ends the analysis: the report
/// holds what came before it and says why in [`Report::truncated`].
pub fn analyze<R: Read>(reader: CaptureReader<R>) -> Report {
    let mut a = Analyzer::new();
    for f in reader {
        match f {
            Ok(f) => a.frame(&f),
            Err(e) => {
                a.truncated(e.to_string());
                break;
            }
        }
    }
    a.finish()
}

/// Opens and analyzes the capture at `path`. Errors only when it cannot be opened or is no
/// capture at all.
pub fn analyze_path(path: impl AsRef<Path>) -> Result<Report, CaptureError> {
    Ok(analyze(CaptureReader::open(path)?))
}

#[cfg(test)]
mod tests;
