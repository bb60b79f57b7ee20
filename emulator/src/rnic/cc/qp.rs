//! Congestion control in the datapath: the device's configuration ([`CcConfig`]) and one
//! connected QP's reaction point with its pacer ([`QpCc`]), as the transmit scheduler, the
//! completer and the receive path use them.
//!
//! - **Pacing.** A QP whose RP holds it below line rate sends its request packets through its
//!   [`RateLimiter`] at the RP's current rate: the scheduler asks [`QpCc::admit`] before it
//!   builds a request packet; a QP held back leaves the schedule with a pacing deadline on the
//!   timer heap ([`QpCc::deadline`]). A QP at line rate skips the limiter altogether (one
//!   compare), so that uncongested traffic pays nothing. Responses (ACKs, NAKs, read responses,
//!   atomic ACKs) and CNPs are not paced. The pacer admits a packet while its bucket is not
//!   empty and charges the packet's bytes after it left (send, then pay): over any interval the
//!   bytes sent are at most the rate's plus the burst plus one packet.
//! - **DCQCN** ([`DcqcnRp`]): CNPs cut the rate; its increase timer is a deadline on the heap
//!   ([`DcqcnRp::next_increase`]); its 1-µs alpha ticks are served lazily (in time order, by
//!   the next event that polls it), so that the engine is not woken every microsecond; the byte
//!   counter takes every request packet's bytes while the RP is active.
//! - **TIMELY** ([`TimelyRp`]): one RTT probe in flight per QP, a request packet that asked for
//!   an ACK, sampled when the acknowledged PSN passes it (an ACK, or a read response or atomic
//!   ACK that acknowledges it); a go-back-N forgets the probe and a retransmitted packet is
//!   never one (Karn's rule), so that no sample mixes two transmissions.
use super::{DcqcnParams, DcqcnRp, RateLimiter, TimelyParams, TimelyRp};
use crate::time::Nanos;
use rocemu_wire::Psn;

/// The reaction point's algorithm on a device's connected QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CcAlgo {
    /// No reaction point: CNPs are counted as ignored, the QP is never paced.
    #[default]
    None,
    Dcqcn,
    Timely,
}

impl CcAlgo {
    pub fn name(self) -> &'static str {
        match self {
            CcAlgo::None => "none",
            CcAlgo::Dcqcn => "dcqcn",
            CcAlgo::Timely => "timely",
        }
    }
}

impl std::str::FromStr for CcAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<CcAlgo, String> {
        match s {
            "none" => Ok(CcAlgo::None),
            "dcqcn" => Ok(CcAlgo::Dcqcn),
            "timely" => Ok(CcAlgo::Timely),
            _ => Err(format!(
                "{s}: the congestion control is dcqcn, timely or none"
            )),
        }
    }
}

/// A device's congestion control, as mlx5's per-device enable bits and parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CcConfig {
    /// ECN-capable transport: ECT(0) on every RoCE packet sent (when the address vector's
    /// traffic class leaves the ECN bits 0).
    pub ecn: bool,
    /// The notification point (mlx5's `roce_np` enable, on by default as on ConnectX): a
    /// CE-marked packet to a QP is answered by a CNP, at most one per QP per
    /// `min_time_between_cnps`.
    pub np: bool,
    /// The reaction point's algorithm (mlx5's `roce_rp` enable and its algorithm).
    pub algo: CcAlgo,
    pub dcqcn: DcqcnParams,
    pub timely: TimelyParams,
    /// The port's line rate, Mb/s: where an RP starts and what it never exceeds.
    pub line_rate_mbps: u32,
    /// The pacer's burst, bytes.
    pub burst_bytes: u32,
}

impl Default for CcConfig {
    fn default() -> CcConfig {
        CcConfig {
            ecn: false,
            np: true,
            algo: CcAlgo::None,
            dcqcn: DcqcnParams::default(),
            timely: TimelyParams::default(),
            line_rate_mbps: 100_000,
            burst_bytes: DEFAULT_BURST,
        }
    }
}

/// Every parameter of [`CcConfig`] by name (mlx5's for DCQCN, `timely_*` for TIMELY), with
/// its range and unit: what `--rpg-time-reset 300`, `ROCEMU_CC_PARAMS=rpg_time_reset=300` and
/// `rocemu sim` set.
pub const CC_PARAMS: &[(&str, u32, u32, &str)] = &[
    (
        "rpg_time_reset",
        1,
        131_071,
        "µs between timer-driven rate increases",
    ),
    (
        "rpg_byte_reset",
        0,
        32_767,
        "64-byte units sent between byte-counter increases (0: off)",
    ),
    ("rpg_threshold", 1, 31, "stages F of fast recovery"),
    ("rpg_ai_rate", 0, 1_000_000, "Mb/s of an additive increase"),
    ("rpg_hai_rate", 0, 1_000_000, "Mb/s of a hyper increase"),
    (
        "rpg_gd",
        0,
        31,
        "the shift of alpha in a cut: rc·alpha/2^gd",
    ),
    ("rpg_min_dec_fac", 0, 100, "% a cut keeps at least"),
    ("rpg_min_rate", 0, 1_000_000, "Mb/s, the lowest rate"),
    (
        "rpg_max_rate",
        0,
        1_000_000,
        "Mb/s, the highest rate (0: line rate)",
    ),
    ("dce_tcp_g", 0, 1_024, "alpha's gain, of 1024"),
    ("dce_tcp_rtt", 1, 131_071, "µs between alpha updates"),
    (
        "rate_reduce_monitor_period",
        0,
        131_071,
        "µs: at most one cut per period",
    ),
    (
        "initial_alpha_value",
        0,
        1_023,
        "alpha at the first CNP, of 1024",
    ),
    (
        "clamp_tgt_rate",
        0,
        1,
        "1: only the first cut sets the target rate",
    ),
    (
        "clamp_tgt_rate_after_time_inc",
        0,
        1,
        "stored only (no effect here)",
    ),
    (
        "rate_to_set_on_first_cnp",
        0,
        1_000_000,
        "Mb/s at the first CNP (0: cut instead)",
    ),
    (
        "min_time_between_cnps",
        0,
        131_071,
        "µs: the NP's CNP gap per QP",
    ),
    ("cnp_dscp", 0, 63, "the CNPs' DSCP"),
    (
        "cnp_802p_prio",
        0,
        7,
        "the CNPs' 802.1p priority (on a VLAN)",
    ),
    ("timely_t_low_us", 0, 10_000_000, "TIMELY Tlow, µs"),
    ("timely_t_high_us", 0, 10_000_000, "TIMELY Thigh, µs"),
    (
        "timely_min_rtt_us",
        1,
        10_000_000,
        "TIMELY minimum RTT (the gradient's normaliser), µs",
    ),
    ("timely_beta_milli", 0, 1_000, "TIMELY β, 1/1000"),
    ("timely_alpha_milli", 0, 1_000, "TIMELY EWMA α, 1/1000"),
    (
        "timely_delta_mbps",
        0,
        1_000_000,
        "TIMELY additive step δ, Mb/s",
    ),
    (
        "timely_hai_after",
        1,
        1_000,
        "TIMELY: negative gradients before hyper-additive increase",
    ),
    (
        "timely_hai_n",
        1,
        1_000,
        "TIMELY: steps of δ per hyper-additive increase",
    ),
    ("timely_min_rate_mbps", 0, 1_000_000, "TIMELY's floor, Mb/s"),
    (
        "line_rate",
        1,
        10_000_000,
        "Mb/s: the port's rate, where an RP starts",
    ),
    (
        "pacing_burst",
        64,
        16 << 20,
        "bytes the pacer lets out at once",
    ),
];

impl CcConfig {
    /// Sets the parameter `name` (one of [`CC_PARAMS`]) to `value`, checked against its range.
    pub fn set(&mut self, name: &str, value: u32) -> Result<(), String> {
        let Some(&(_, lo, hi, what)) = CC_PARAMS.iter().find(|p| p.0 == name) else {
            return Err(format!(
                "{name}: no such congestion-control parameter (they are {})",
                CC_PARAMS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
            ));
        };
        if !(lo..=hi).contains(&value) {
            return Err(format!("{name} {value}: between {lo} and {hi} ({what})"));
        }
        let (d, t) = (&mut self.dcqcn, &mut self.timely);
        let v = value;
        match name {
            "rpg_time_reset" => d.rpg_time_reset = v,
            "rpg_byte_reset" => d.rpg_byte_reset = v,
            "rpg_threshold" => d.rpg_threshold = v,
            "rpg_ai_rate" => d.rpg_ai_rate = v,
            "rpg_hai_rate" => d.rpg_hai_rate = v,
            "rpg_gd" => d.rpg_gd = v,
            "rpg_min_dec_fac" => d.rpg_min_dec_fac = v,
            "rpg_min_rate" => d.rpg_min_rate = v,
            "rpg_max_rate" => d.rpg_max_rate = v,
            "dce_tcp_g" => d.dce_tcp_g = v,
            "dce_tcp_rtt" => d.dce_tcp_rtt = v,
            "rate_reduce_monitor_period" => d.rate_reduce_monitor_period = v,
            "initial_alpha_value" => d.initial_alpha_value = v,
            "clamp_tgt_rate" => d.clamp_tgt_rate = v,
            "clamp_tgt_rate_after_time_inc" => d.clamp_tgt_rate_after_time_inc = v,
            "rate_to_set_on_first_cnp" => d.rate_to_set_on_first_cnp = v,
            "min_time_between_cnps" => d.min_time_between_cnps = v,
            "cnp_dscp" => d.cnp_dscp = v as u8,
            "cnp_802p_prio" => d.cnp_802p_prio = v as u8,
            "timely_t_low_us" => t.t_low_us = v,
            "timely_t_high_us" => t.t_high_us = v,
            "timely_min_rtt_us" => t.min_rtt_us = v,
            "timely_beta_milli" => t.beta_milli = v,
            "timely_alpha_milli" => t.alpha_milli = v,
            "timely_delta_mbps" => t.delta_mbps = v,
            "timely_hai_after" => t.hai_after = v,
            "timely_hai_n" => t.hai_n = v,
            "timely_min_rate_mbps" => t.min_rate_mbps = v,
            "line_rate" => self.line_rate_mbps = v,
            "pacing_burst" => self.burst_bytes = v,
            _ => unreachable!("every name of CC_PARAMS has its field"),
        }
        Ok(())
    }

    /// Applies `name=value` pairs separated by commas or spaces (`ROCEMU_CC_PARAMS`).
    pub fn set_list(&mut self, list: &str) -> Result<(), String> {
        for item in list.split([',', ' ']).filter(|s| !s.is_empty()) {
            let (n, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{item}: a parameter is NAME=VALUE"))?;
            let v: u32 = v
                .trim()
                .parse()
                .map_err(|_| format!("{item}: the value is an unsigned integer"))?;
            self.set(n.trim(), v)?;
        }
        Ok(())
    }
}

/// 16 KiB: four 4-KiB-MTU packets, 1.3 µs at 100 Gb/s. It is what the pacer lets out at once
/// after an idle moment, and what an engine that wakes late may send to catch up.
pub const DEFAULT_BURST: u32 = 16 * 1024;

#[derive(Debug, Clone)]
pub(crate) enum Rp {
    Dcqcn(DcqcnRp),
    Timely(TimelyRp),
}

/// One connected QP's reaction point and pacer.
#[derive(Debug, Clone)]
pub(crate) struct QpCc {
    pub rp: Rp,
    limiter: RateLimiter,
    line_kbps: u64,
    /// A request is ready but the pacer holds it until then.
    pace_at: Option<Nanos>,
    /// The deadline last put on the device's timer heap.
    pub pushed: Option<Nanos>,
    /// TIMELY: the PSN one past the probe packet, and when the probe left.
    probe: Option<(Psn, Nanos)>,
}

impl QpCc {
    /// The QP's congestion control under `cfg`; none without a reaction point.
    pub fn new(cfg: &CcConfig) -> Option<QpCc> {
        let line = cfg.line_rate_mbps.max(1);
        let rp = match cfg.algo {
            CcAlgo::None => return None,
            CcAlgo::Dcqcn => Rp::Dcqcn(DcqcnRp::new(cfg.dcqcn, line)),
            CcAlgo::Timely => Rp::Timely(TimelyRp::new(cfg.timely, line)),
        };
        let line_kbps = u64::from(line) * 1_000;
        let mut cc = QpCc {
            rp,
            limiter: RateLimiter::new(line_kbps, u64::from(cfg.burst_bytes.max(1))),
            line_kbps,
            pace_at: None,
            pushed: None,
            probe: None,
        };
        cc.sync();
        Some(cc)
    }

    /// The RP's current rate, kb/s.
    pub fn rate_kbps(&self) -> u64 {
        match &self.rp {
            Rp::Dcqcn(r) => r.rate_kbps(),
            Rp::Timely(r) => r.rate_kbps(),
        }
    }

    /// DCQCN's alpha, of 1024 (none for TIMELY).
    pub fn alpha(&self) -> Option<u32> {
        match &self.rp {
            Rp::Dcqcn(r) => Some(r.alpha()),
            Rp::Timely(_) => None,
        }
    }

    /// Whether the pacer limits the QP now (the rate is below line rate).
    #[inline]
    pub fn limiting(&self) -> bool {
        self.limiter.rate_kbps() < self.line_kbps
    }

    /// Whether [`QpCc::on_request_sent`] has anything to do: the pacer limits, DCQCN's RP is
    /// active (its byte counter), or TIMELY (its probes).
    #[inline]
    pub fn wants_tx_events(&self) -> bool {
        self.limiting()
            || match &self.rp {
                Rp::Dcqcn(r) => r.is_active(),
                Rp::Timely(_) => true,
            }
    }

    /// Whether a request is held by the pacer until its deadline.
    #[inline]
    pub fn held(&self) -> bool {
        self.pace_at.is_some()
    }

    /// The pacer takes the RP's rate; at line rate it lets go.
    fn sync(&mut self) {
        let r = self.rate_kbps().clamp(1, self.line_kbps);
        if r != self.limiter.rate_kbps() {
            self.limiter.set_rate(r);
        }
        if !self.limiting() {
            self.pace_at = None;
        }
    }

    /// A CNP for this QP at `now`: `Some(cut)` when the RP is DCQCN (whether it cut the rate),
    /// `None` when the QP's algorithm takes no CNPs.
    pub fn on_cnp(&mut self, now: Nanos) -> Option<bool> {
        let Rp::Dcqcn(r) = &mut self.rp else {
            return None;
        };
        let cut = r.on_cnp(now) == super::CnpOutcome::Handled;
        self.sync();
        Some(cut)
    }

    /// Whether a request packet may be built at `now`; when not, the QP is held until
    /// [`QpCc::deadline`].
    #[inline]
    pub fn admit(&mut self, now: Nanos) -> bool {
        if !self.limiting() {
            return true;
        }
        if let Some(t) = self.pace_at {
            if now < t {
                return false;
            }
            self.pace_at = None;
        }
        match self.limiter.earliest(now, 0) {
            Some(t) if t <= now => true,
            Some(t) => {
                self.pace_at = Some(t);
                false
            }
            // Rate 0 cannot be (sync clamps to 1 kb/s): hold for a millisecond.
            None => {
                self.pace_at = Some(now + Nanos::from_millis(1));
                false
            }
        }
    }

    /// A request packet of `bytes` left at `now`; `next` is the PSN after it, `ack_req` its
    /// AckReq bit, `retransmitted` whether its PSN was sent before.
    #[inline]
    pub fn on_request_sent(
        &mut self,
        now: Nanos,
        bytes: usize,
        next: Psn,
        ack_req: bool,
        retransmitted: bool,
    ) {
        if self.limiting() {
            self.limiter.on_send(now, bytes as u64);
        }
        match &mut self.rp {
            Rp::Dcqcn(r) => {
                if r.is_active() {
                    r.on_tx(now, bytes as u64);
                    self.sync();
                }
            }
            Rp::Timely(_) => {
                if self.probe.is_none() && ack_req && !retransmitted {
                    self.probe = Some((next, now));
                }
            }
        }
    }

    /// The requester's acknowledged PSN (one past the last acknowledged) is now `acked`.
    pub fn on_acked(&mut self, now: Nanos, acked: Psn) {
        let Some((p, t)) = self.probe else {
            return;
        };
        if acked.is_before(p) {
            return;
        }
        self.probe = None;
        if let Rp::Timely(r) = &mut self.rp {
            r.on_rtt(now.saturating_sub(t).as_nanos());
            self.sync();
        }
    }

    /// A go-back-N: the probe in flight is forgotten (Karn's rule).
    pub fn on_go_back(&mut self) {
        self.probe = None;
    }

    /// The earliest of the pacing deadline and the RP's next rate change.
    pub fn deadline(&self) -> Option<Nanos> {
        let rp = match &self.rp {
            Rp::Dcqcn(r) => r.next_increase(),
            Rp::Timely(_) => None,
        };
        match (self.pace_at, rp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Serves what is due at `now`: the RP's timers, and a pacing deadline that passed.
    pub fn on_timer(&mut self, now: Nanos) {
        if let Rp::Dcqcn(r) = &mut self.rp {
            r.poll(now);
        }
        if self.pace_at.is_some_and(|t| t <= now) {
            self.pace_at = None;
        }
        self.sync();
    }
}

/// Notification point: a packet that passed every receive check of `qp` carried ECN CE at
/// `now`. A CNP is owed to its sender unless one was queued for this QP less than
/// `min_time_between_cnps` ago (or one is still waiting to leave).
pub(crate) fn note_ce(
    dev: &crate::rnic::Dev,
    qp: &mut crate::rnic::qp::Qp,
    now: Nanos,
    pkt: &crate::rnic::Packet<'_>,
) {
    use crate::rnic::verbs::QpType;
    let gap = Nanos::from_micros(u64::from(dev.cfg.cc.dcqcn.min_time_between_cnps));
    if qp.cnp_out.is_some() || qp.cnp_last.is_some_and(|t| now.saturating_sub(t) < gap) {
        return;
    }
    let dqpn = match (qp.qp_type, pkt.ext.deth) {
        (QpType::Ud, Some(d)) => d.src_qpn,
        (QpType::Ud, None) => return,
        _ => qp.attr.dest_qp_num,
    };
    qp.cnp_last = Some(now);
    qp.cnp_out = Some(crate::rnic::qp::CnpTo {
        mac: pkt.eth.src,
        ip: pkt.ip.src(),
        src_ip: pkt.ip.dst(),
        dqpn,
        pkey: pkt.bth.pkey,
    });
}

/// The CNP owed by `qp`, written at the front of `buf`: ConnectX's format (`build_cnp`), with
/// the device's `cnp_dscp`, the QP's UDP source port, TTL 64, and the device's IPv4
/// identification.
pub(crate) fn produce_cnp(
    dev: &mut crate::rnic::Dev,
    qp: &crate::rnic::qp::Qp,
    to: crate::rnic::qp::CnpTo,
    buf: &mut [u8],
) -> Option<usize> {
    let udp_sport = crate::rnic::Dev::sport_for(qp, &qp.attr.ah_attr);
    let ip_ident = dev.next_ident();
    let f = super::CnpFields {
        src_mac: dev.cfg.mac,
        dst_mac: to.mac,
        src_ip: to.src_ip,
        dst_ip: to.ip,
        dqpn: to.dqpn,
        pkey: to.pkey,
        dscp: dev.cfg.cc.dcqcn.cnp_dscp,
        ecn: 2,
        vlan: None,
        prio: dev.cfg.cc.dcqcn.cnp_802p_prio,
        ttl: 64,
        ip_ident,
        udp_sport,
        flow_label: qp.attr.ah_attr.flow_label,
    };
    match super::build_cnp(buf, &f) {
        Ok(n) => {
            dev.counters.np_cnp_sent += 1;
            Some(n)
        }
        Err(_) => None,
    }
}
