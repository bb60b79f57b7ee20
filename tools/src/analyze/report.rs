//! The report in words (findings, the text summary) and as the contract's JSON object.
use super::window::Stat;
use super::{Event, Qp, Report};
use rocemu_wire::opcode::Transport;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn transport_name(t: Option<Transport>) -> &'static str {
    match t {
        Some(Transport::Rc) => "RC",
        Some(Transport::Uc) => "UC",
        Some(Transport::Ud) => "UD",
        Some(Transport::Cnp) | None => "CNP",
    }
}

/// A duration in the unit that reads best.
fn dur(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.3} s", secs(ns))
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.1} µs", ns as f64 / 1e3)
    }
}

fn rate(bits_per_s: f64) -> String {
    if bits_per_s >= 1e9 {
        format!("{:.2} Gb/s", bits_per_s / 1e9)
    } else if bits_per_s >= 1e6 {
        format!("{:.2} Mb/s", bits_per_s / 1e6)
    } else {
        format!("{:.1} kb/s", bits_per_s / 1e3)
    }
}

/// Columns of the goodput-over-time line at most.
const GOODPUT_COLUMNS: usize = 48;

/// Goodput over time as one text line: the QP's buckets from its first payload to its last,
/// merged into at most [`GOODPUT_COLUMNS`] columns, each drawn as one of eight bar heights
/// relative to the busiest (a blank column: nothing moved, a stall), then the busiest and the
/// quietest column with their start times. `None` when nothing moved.
pub(super) fn goodput_over_time(b: &super::window::Buckets) -> Option<String> {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let first = b.bytes.iter().position(|&x| x > 0)?;
    let last = b.bytes.iter().rposition(|&x| x > 0)?;
    let span = &b.bytes[first..=last];
    let per = span.len().div_ceil(GOODPUT_COLUMNS);
    // Each column's rate over its own width (the last may hold fewer buckets).
    let cols: Vec<(u64, f64)> = span
        .chunks(per)
        .enumerate()
        .map(|(i, c)| {
            let t = (first + i * per) as u64 * b.width_ns;
            let w = secs(c.len() as u64 * b.width_ns);
            (t, c.iter().sum::<u64>() as f64 * 8.0 / w)
        })
        .collect();
    let max = cols.iter().map(|c| c.1).fold(0.0, f64::max);
    let bars: String = cols
        .iter()
        .map(|&(_, r)| {
            if r <= 0.0 {
                ' '
            } else {
                BARS[((r / max * 8.0).ceil() as usize).clamp(1, 8) - 1]
            }
        })
        .collect();
    let busiest = cols
        .iter()
        .fold(cols[0], |a, c| if c.1 > a.1 { *c } else { a });
    let quietest = cols
        .iter()
        .fold(cols[0], |a, c| if c.1 < a.1 { *c } else { a });
    Some(format!(
        "  goodput over time, {} a column from {:.6} s: |{bars}| peak {} at {:.6} s, lowest {} at {:.6} s",
        dur(per as u64 * b.width_ns),
        secs(first as u64 * b.width_ns),
        rate(busiest.1),
        secs(busiest.0),
        rate(quietest.1),
        secs(quietest.0)
    ))
}

/// "QP 0x000012 (10.0.0.1 → 10.0.0.2)".
pub(super) fn qp_name(q: &Qp) -> String {
    format!("QP 0x{:06x} ({} → {})", q.key.2, q.key.0, q.key.1)
}

impl Qp {
    /// From its first frame to the last frame that answers it, ns.
    pub fn duration_ns(&self, pair: Option<&Qp>) -> u64 {
        let last = pair.map_or(self.last_ts, |p| p.last_ts.max(self.last_ts));
        last.saturating_sub(self.first_ts)
    }

    /// Message bytes per second over [`Qp::duration_ns`], in bits.
    pub fn goodput_bps(&self, pair: Option<&Qp>) -> Option<f64> {
        let d = self.duration_ns(pair);
        (d > 0 && self.bytes > 0).then(|| self.bytes as f64 * 8.0 / secs(d))
    }
}

fn pair<'a>(r: &'a Report, q: &Qp) -> Option<&'a Qp> {
    q.pair.and_then(|j| r.qps.get(j))
}

fn naks_of(r: &Report, q: &Qp) -> Vec<(&'static str, u64)> {
    pair(r, q).map_or(Vec::new(), |p| {
        p.naks_sent.iter().map(|(k, v)| (*k, *v)).collect()
    })
}

fn trig(q: &Qp, t: &str) -> u64 {
    q.triggers.get(t).copied().unwrap_or(0)
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub(super) fn findings(r: &Report) -> Vec<String> {
    let mut f = Vec::new();
    if let Some(why) = &r.truncated {
        f.push(format!(
            "the capture ends in a corrupt or cut record after frame {}: {why}",
            r.frames
        ));
    }
    for q in &r.qps {
        let name = qp_name(q);
        let p = pair(r, q);
        if q.retransmitted_packets > 0 {
            let mut s = format!(
                "{name}: {} in {}",
                plural(
                    q.retransmitted_packets,
                    "retransmitted packet",
                    "retransmitted packets"
                ),
                plural(q.go_backs, "go-back", "go-backs")
            );
            let mut why = Vec::new();
            let to = trig(q, "timeout");
            if to > 0 {
                let mut w = format!(
                    "{to} after local ACK timeouts (first at {:.3} s",
                    secs(q.first_timeout_ts.unwrap_or(0))
                );
                if let Some(m) = q.timeout_idle.quantile(0.5) {
                    let _ = write!(w, ", after {} of silence", dur(m));
                }
                w.push(')');
                why.push(w);
            }
            for (k, words) in [
                ("nak", "after sequence-error NAKs"),
                (
                    "implied_nak",
                    "after implied NAKs (a response that skipped a READ or atomic)",
                ),
                ("rnr", "after RNR NAK waits"),
            ] {
                let n = trig(q, k);
                if n > 0 {
                    why.push(format!("{n} {words}"));
                }
            }
            if !why.is_empty() {
                let _ = write!(s, ": {}", why.join(", "));
            }
            let _ = write!(
                s,
                "; first retransmission at {:.3} s",
                secs(q.first_retransmit_ts.unwrap_or(0))
            );
            if let Some((psn, n)) = q.most_naked_psn() {
                let _ = write!(
                    s,
                    "; the responder NAKed PSN {psn} (sequence error) {n} times"
                );
            }
            f.push(s);
        }
        for (k, n) in naks_of(r, q) {
            let what = match k {
                "psn_seq_err" => {
                    if q.retransmitted_packets == 0 {
                        f.push(format!(
                            "{name}: the responder sent {} (PSN sequence error) that no retransmission followed",
                            plural(n, "NAK", "NAKs")
                        ));
                    }
                    continue;
                }
                "remote_access_err" => "remote access errors (a bad R_Key, an address outside the region, or access rights the region lacks)",
                "invalid_request" => "invalid-request errors (an opcode, length or message sequence the responder does not accept)",
                "remote_op_err" => "remote operational errors (the responder could not carry out the request: an error on its side)",
                "invalid_rd_request" => "invalid-RD-request errors",
                _ => "NAKs with a reserved code",
            };
            f.push(format!(
                "{name}: the responder answered {} with {what}; the QP goes to the error state",
                plural(n, "request", "requests")
            ));
        }
        if let Some(p) = p.filter(|p| p.rnr_naks_sent > 0) {
            let timers: Vec<u32> = q
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::Rnr { timer_us, .. } => Some(*timer_us),
                    _ => None,
                })
                .collect();
            let first = q.events.iter().find_map(|e| match e {
                Event::Rnr { t, .. } => Some(*t),
                _ => None,
            });
            let mut s = format!(
                "{name}: RNR NAKs: the responder had no receive posted {} (first at {:.3} s",
                plural(p.rnr_naks_sent, "time", "times"),
                secs(first.unwrap_or(0))
            );
            if let (Some(lo), Some(hi)) = (timers.iter().min(), timers.iter().max()) {
                if lo == hi {
                    let _ = write!(s, "; it asked for waits of {}", dur(u64::from(*lo) * 1000));
                } else {
                    let _ = write!(
                        s,
                        "; it asked for waits of {} to {}",
                        dur(u64::from(*lo) * 1000),
                        dur(u64::from(*hi) * 1000)
                    );
                }
            }
            s.push_str(
                "): post receives before the peer sends, or raise the RNR timer / rnr_retry",
            );
            f.push(s);
        }
        if q.psn_gaps > 0 {
            f.push(format!(
                "{name}: {} never appear in the capture (lost before the capture point, or the capture dropped them)",
                plural(q.psn_gaps, "request PSN", "request PSNs")
            ));
        }
        if q.psn_jumps > 0 {
            f.push(format!(
                "{name}: the PSN jumped {} by more than {} (a new connection on the same QPN, or frames that are not what they seem)",
                plural(q.psn_jumps, "time", "times"),
                super::window::PSN_WINDOW
            ));
        }
        if q.unanswered_reads > 0 && q.transport == Some(Transport::Rc) {
            f.push(format!(
                "{name}: {} got no response in the capture",
                plural(
                    q.unanswered_reads,
                    "READ or atomic request",
                    "READ or atomic requests"
                )
            ));
        }
        let cnps = p.map_or(0, |p| p.cnps_sent);
        if q.ecn_ce > 0 {
            let mut s = format!(
                "{name}: {} ECN-CE marked (congestion on the path)",
                plural(q.ecn_ce, "packet arrived", "packets arrived")
            );
            if cnps == 0 {
                s.push_str("; no CNP answered them (the receiver does not notify: is DCQCN's notification point on?)");
            } else {
                let _ = write!(
                    s,
                    ", answered by {}; {} after the last CNP",
                    plural(cnps, "CNP", "CNPs"),
                    plural(q.ce_pending, "mark", "marks")
                );
            }
            f.push(s);
        } else if cnps > 0 {
            f.push(format!(
                "{name}: {} throttled this QP though none of its packets in the capture was CE-marked (marked after the capture point)",
                plural(cnps, "CNP", "CNPs")
            ));
        }
        if let Some(c) = q.cm.and_then(|k| r.cm.get(k)) {
            let want = if Some(q.key.0) == c.active {
                c.active_psn
            } else {
                Some(c.passive_psn)
            };
            if let (Some(w), Some(first)) = (want, q.first_psn) {
                if q.request_packets > 0 && w != first.value() && q.first_retransmit_ts.is_none() {
                    f.push(format!(
                        "{name}: its first request has PSN {first}, but the CM announced {w}"
                    ));
                }
            }
        }
    }
    for c in &r.cm {
        let who = format!(
            "connection {} → {} (service 0x{:016x})",
            c.active.map_or("?".into(), |a| a.to_string()),
            c.passive.map_or("?".into(), |a| a.to_string()),
            c.service_id
        );
        if let Some((t, why)) = &c.rej {
            f.push(format!("{who}: refused by REJ at {:.3} s: {why}", secs(*t)));
        } else if c.rep_ts.is_none() && !c.req_ts.is_empty() {
            f.push(format!(
                "{who}: the REQ got no answer in the capture (sent {})",
                plural(c.req_ts.len() as u64, "time", "times")
            ));
        } else if c.req_ts.len() > 1 {
            f.push(format!(
                "{who}: the REQ was sent {} times before the REP",
                c.req_ts.len()
            ));
        }
        if c.rep_ts.is_some() && c.rtu_ts.is_none() && c.rej.is_none() {
            f.push(format!("{who}: REP without an RTU in the capture"));
        }
    }
    if r.icrc_bad > 0 {
        let per: Vec<String> = r
            .qps
            .iter()
            .filter(|q| q.icrc_bad > 0)
            .take(8)
            .map(|q| format!("{} {}", qp_name(q), q.icrc_bad))
            .collect();
        f.push(format!(
            "ICRC failed on {} ({}): corrupted on the wire, or an ICRC computed differently",
            plural(r.icrc_bad, "frame", "frames"),
            per.join(", ")
        ));
    }
    if r.untracked_frames > 0 {
        f.push(format!(
            "more than {} QPs: {} of further QPs were not analysed",
            super::MAX_QPS,
            plural(r.untracked_frames, "frame", "frames")
        ));
    }
    if r.orphan_responses > 0 {
        f.push(format!(
            "{} answer no request in the capture (it started mid-conversation, or missed the requests)",
            plural(r.orphan_responses, "response or CNP", "responses or CNPs")
        ));
    }
    if r.cm_unmatched > 0 {
        f.push(format!(
            "{} matched no connection in the capture",
            plural(r.cm_unmatched, "CM MAD", "CM MADs")
        ));
    }
    if f.is_empty() {
        f.push(if r.roce_frames == 0 {
            "no RoCE traffic in the capture".to_string()
        } else {
            "no problems found: no retransmissions, NAKs, RNR waits, ECN marks or ICRC failures"
                .to_string()
        });
    }
    f
}

fn stat_json(s: &Stat) -> Value {
    if s.n == 0 {
        return Value::Null;
    }
    let us = |v: Option<u64>| v.map(|v| v as f64 / 1e3);
    json!({"n": s.n, "min_us": us(Some(s.min)), "median_us": us(s.quantile(0.5)),
           "p99_us": us(s.quantile(0.99)), "max_us": us(Some(s.max)), "mean_us": us(s.mean())})
}

fn key_json(q: &Qp) -> Value {
    json!({"src": q.key.0.to_string(), "dst": q.key.1.to_string(), "dqpn": q.key.2})
}

fn event_json(r: &Report, e: &Event) -> Value {
    let ts = |t: u64| secs(r.start_ns.saturating_add(t));
    match *e {
        Event::Nak { t, psn, code } => {
            json!({"ts": ts(t), "event": "nak", "psn": psn.value(), "kind": super::nak_kind_name(code)})
        }
        Event::Rnr { t, psn, timer_us } => {
            json!({"ts": ts(t), "event": "rnr_nak", "psn": psn.value(), "timer_us": timer_us})
        }
        Event::GoBack {
            t,
            psn,
            trigger,
            idle_ns,
        } => json!({"ts": ts(t), "event": "go_back", "psn": psn.value(),
                    "trigger": trigger.name(), "idle_us": idle_ns as f64 / 1e3}),
    }
}

fn qp_json(r: &Report, q: &Qp) -> Value {
    let p = pair(r, q);
    let ts = |t: u64| secs(r.start_ns.saturating_add(t));
    let mut m = Map::new();
    m.insert("src".into(), json!(q.key.0.to_string()));
    m.insert("dst".into(), json!(q.key.1.to_string()));
    m.insert("dqpn".into(), json!(q.key.2));
    m.insert("transport".into(), json!(transport_name(q.transport)));
    m.insert("messages".into(), json!(q.messages));
    m.insert("bytes".into(), json!(q.bytes));
    m.insert(
        "retransmitted_packets".into(),
        json!(q.retransmitted_packets),
    );
    let naks: Map<String, Value> = naks_of(r, q)
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    m.insert("naks".into(), Value::Object(naks));
    m.insert("rnr_naks".into(), json!(p.map_or(0, |p| p.rnr_naks_sent)));
    m.insert("cnps".into(), json!(p.map_or(0, |p| p.cnps_sent)));
    m.insert("ecn_ce".into(), json!(q.ecn_ce));
    m.insert("icrc_bad".into(), json!(q.icrc_bad));
    m.insert("first_ts".into(), json!(ts(q.first_ts)));
    m.insert("last_ts".into(), json!(ts(q.last_ts)));
    // Extra keys, after the contract's.
    m.insert("frames".into(), json!(q.frames));
    m.insert("sport".into(), json!(q.sport));
    m.insert("src_qpn".into(), json!(p.map(|p| p.key.2)));
    m.insert("paired_with".into(), p.map_or(Value::Null, key_json));
    m.insert("request_packets".into(), json!(q.request_packets));
    m.insert("messages_by_op".into(), json!(q.messages_by_op));
    m.insert("duration_s".into(), json!(secs(q.duration_ns(p))));
    m.insert("goodput_bps".into(), json!(q.goodput_bps(p)));
    m.insert("go_backs".into(), json!(q.go_backs));
    m.insert("retransmission_triggers".into(), json!(q.triggers));
    m.insert("timeouts".into(), json!(trig(q, "timeout")));
    m.insert(
        "first_retransmit_ts".into(),
        json!(q.first_retransmit_ts.map(ts)),
    );
    m.insert("first_timeout_ts".into(), json!(q.first_timeout_ts.map(ts)));
    m.insert("timeout_silence".into(), stat_json(&q.timeout_idle));
    m.insert("psn_gaps".into(), json!(q.psn_gaps));
    m.insert("psn_jumps".into(), json!(q.psn_jumps));
    m.insert("first_psn".into(), json!(q.first_psn.map(|p| p.value())));
    m.insert("pmtu".into(), json!(q.pmtu));
    let acks = p.map_or(0, |p| p.acks_sent);
    m.insert("acks".into(), json!(acks));
    m.insert(
        "acks_per_request_packet".into(),
        json!((q.request_packets > 0).then(|| acks as f64 / q.request_packets as f64)),
    );
    m.insert("rtt".into(), stat_json(&q.rtt));
    m.insert("read_latency".into(), stat_json(&q.read_latency));
    m.insert("atomic_latency".into(), stat_json(&q.atomic_latency));
    m.insert("unanswered_reads".into(), json!(q.unanswered_reads));
    m.insert("ecn_ce_answered".into(), json!(q.ce_answered));
    m.insert(
        "responses_sent".into(),
        json!({"acks": q.acks_sent, "read_responses": q.read_responses_sent,
               "atomic_acks": q.atomic_acks_sent, "naks": q.naks_sent,
               "rnr_naks": q.rnr_naks_sent, "cnps": q.cnps_sent}),
    );
    let cm = q.cm.and_then(|k| r.cm.get(k)).map(|c| {
        json!({"active": c.active.map(|a| a.to_string()), "passive": c.passive.map(|a| a.to_string()),
               "service_id": c.service_id, "active_qpn": c.active_qpn, "passive_qpn": c.passive_qpn,
               "active_psn": c.active_psn, "passive_psn": c.passive_psn,
               "req_ts": c.req_ts.iter().map(|t| ts(*t)).collect::<Vec<_>>(),
               "rep_ts": c.rep_ts.map(ts), "rtu_ts": c.rtu_ts.map(ts), "mra_ts": c.mra_ts.map(ts),
               "rej": c.rej.as_ref().map(|(t, why)| json!({"ts": ts(*t), "reason": why})),
               "dreq_ts": c.dreq_ts.map(ts), "drep_ts": c.drep_ts.map(ts),
               "local_ack_timeout": c.ack_timeout})
    });
    m.insert("cm".into(), cm.unwrap_or(Value::Null));
    m.insert(
        "timeline".into(),
        Value::Array(q.events.iter().map(|e| event_json(r, e)).collect()),
    );
    m.insert("timeline_dropped".into(), json!(q.events_dropped));
    let w = secs(q.goodput.width_ns);
    m.insert(
        "goodput".into(),
        json!({"bucket_s": w,
               "bps": q.goodput.bytes.iter().map(|b| *b as f64 * 8.0 / w).collect::<Vec<_>>()}),
    );
    Value::Object(m)
}

impl Report {
    /// The contract's object: `{"frames", "qps": [...], "findings": [...]}` and extra keys.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("frames".into(), json!(self.frames));
        m.insert(
            "qps".into(),
            Value::Array(self.qps.iter().map(|q| qp_json(self, q)).collect()),
        );
        m.insert("findings".into(), json!(self.findings));
        m.insert("roce_frames".into(), json!(self.roce_frames));
        m.insert("other_frames".into(), json!(self.other_frames));
        m.insert("icrc_bad".into(), json!(self.icrc_bad));
        m.insert("untracked_frames".into(), json!(self.untracked_frames));
        m.insert("orphan_responses".into(), json!(self.orphan_responses));
        m.insert("start_ts".into(), json!(secs(self.start_ns)));
        m.insert("duration_s".into(), json!(secs(self.span_ns)));
        m.insert("truncated".into(), json!(self.truncated));
        Value::Object(m)
    }

    /// The text summary: one block per QP, then the findings.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let other: u64 = self.other_frames.values().sum();
        let _ = write!(
            s,
            "{} frames over {}: {} RoCE",
            self.frames,
            dur(self.span_ns),
            self.roce_frames
        );
        if other > 0 {
            let kinds: Vec<String> = self
                .other_frames
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            let _ = write!(s, ", {other} other ({})", kinds.join(", "));
        }
        s.push('\n');
        for q in &self.qps {
            let p = pair(self, q);
            let _ = write!(
                s,
                "\nQP 0x{:06x}  {} → {}  {}",
                q.key.2,
                q.key.0,
                q.key.1,
                transport_name(q.transport)
            );
            if let Some(p) = p {
                // The reverse direction's block is addressed to the QP that sends these.
                let _ = write!(s, "  (source QP 0x{:06x})", p.key.2);
            }
            s.push('\n');
            let _ = writeln!(
                s,
                "  frames {}, first at {:.6} s, last at {:.6} s",
                q.frames,
                secs(q.first_ts),
                secs(q.last_ts)
            );
            if let Some(c) = q.cm.and_then(|k| self.cm.get(k)) {
                let mut steps = Vec::new();
                if let Some(t) = c.req_ts.first() {
                    steps.push(format!("REQ {:.6} s", secs(*t)));
                }
                for (n, t) in [
                    ("REP", c.rep_ts),
                    ("RTU", c.rtu_ts),
                    ("DREQ", c.dreq_ts),
                    ("DREP", c.drep_ts),
                ] {
                    if let Some(t) = t {
                        steps.push(format!("{n} {:.6} s", secs(t)));
                    }
                }
                let _ = writeln!(
                    s,
                    "  set up by the CM: {}; QPNs 0x{:06x} (active) / 0x{:06x} (passive), starting PSNs {} / {}",
                    steps.join(", "),
                    c.active_qpn,
                    c.passive_qpn.unwrap_or(0),
                    c.active_psn.map_or("?".into(), |p| p.to_string()),
                    c.passive_psn
                );
            }
            if q.request_packets > 0 {
                let ops: Vec<String> = q
                    .messages_by_op
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                let _ = write!(
                    s,
                    "  messages {} ({}), {} bytes in {}",
                    q.messages,
                    ops.join(", "),
                    q.bytes,
                    dur(q.duration_ns(p))
                );
                if let Some(g) = q.goodput_bps(p) {
                    let _ = write!(s, ", goodput {}", rate(g));
                }
                s.push('\n');
                if let Some(l) = goodput_over_time(&q.goodput) {
                    s += &l;
                    s.push('\n');
                }
                let _ = write!(
                    s,
                    "  request packets {}, retransmitted {}",
                    q.request_packets, q.retransmitted_packets
                );
                if q.go_backs > 0 {
                    let t: Vec<String> =
                        q.triggers.iter().map(|(k, v)| format!("{k} {v}")).collect();
                    let _ = write!(s, " in {} go-backs ({})", q.go_backs, t.join(", "));
                }
                if q.psn_gaps > 0 {
                    let _ = write!(s, ", PSNs missing {}", q.psn_gaps);
                }
                s.push('\n');
                if let Some(p) = p {
                    let naks: Vec<String> = p
                        .naks_sent
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect();
                    let _ = write!(
                        s,
                        "  responses: ACKs {} ({:.2} per request packet)",
                        p.acks_sent,
                        p.acks_sent as f64 / q.request_packets.max(1) as f64
                    );
                    if p.read_responses_sent + p.atomic_acks_sent > 0 {
                        let _ = write!(
                            s,
                            ", READ responses {}, atomic ACKs {}",
                            p.read_responses_sent, p.atomic_acks_sent
                        );
                    }
                    let _ = writeln!(
                        s,
                        ", NAKs {}, RNR NAKs {}",
                        if naks.is_empty() {
                            "0".to_string()
                        } else {
                            naks.join(", ")
                        },
                        p.rnr_naks_sent
                    );
                }
                for (what, st) in [
                    ("READ latency", &q.read_latency),
                    ("atomic latency", &q.atomic_latency),
                    ("ACK round trip", &q.rtt),
                ] {
                    if st.n > 0 {
                        let _ = writeln!(
                            s,
                            "  {what}: {} samples, min {}, median {}, p99 {}, max {}",
                            st.n,
                            dur(st.min),
                            dur(st.quantile(0.5).unwrap_or(0)),
                            dur(st.quantile(0.99).unwrap_or(0)),
                            dur(st.max)
                        );
                    }
                }
            } else {
                let _ = writeln!(s, "  no requests: responses only");
            }
            let _ = writeln!(
                s,
                "  ECN-CE {}, CNPs {}, ICRC bad {}",
                q.ecn_ce,
                p.map_or(0, |p| p.cnps_sent),
                q.icrc_bad
            );
        }
        s.push_str("\nfindings:\n");
        for f in &self.findings {
            let _ = writeln!(s, "  - {f}");
        }
        s
    }
}
