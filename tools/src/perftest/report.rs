//! A run's report: the figures the contract names (`Report::to_json`'s keys), perftest's table
//! lines, and how both ends build them from what the engine counted.
//!
//! Invariants: `lat_us` is sorted (the percentiles index it); `bw_peak_mbps` is at least the
//! average; a datapath end counts its own RNIC's events since the run began, the in-process end
//! both RNICs' from their start.
use super::BwRun;
use crate::perf::Test;
use rocemu_emulator::rnic::Counters;
use serde_json::{json, Value};

/// One run's figures (the contract's JSON keys).
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub test: &'static str,
    pub size: usize,
    pub iters: u64,
    pub qps: usize,
    pub mtu: usize,
    pub seconds: f64,
    pub bytes: u64,
    pub messages: u64,
    pub packets: u64,
    pub gbps: f64,
    pub mpps: f64,
    pub retransmits: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub timeouts: u64,
    pub verified: Option<bool>,
    pub verify_detail: String,
    pub errors: u64,
    /// The first error completion, described.
    pub first_error: Option<String>,
    pub limit_gbps: f64,
    pub bw_peak_mbps: f64,
    /// Latencies in microseconds, sorted.
    pub lat_us: Vec<f64>,
    /// The RNICs' counters that point at a problem, as [`crate::failure_counters`] gives
    /// them when the run ended (empty when none moved): printed when the run failed.
    pub counters: String,
    /// In process with several threads: frames one thread's shard sent to another's QP,
    /// which the steering handed over, over the whole run (the verification's read-back
    /// included; not in the JSON, whose keys are the contract's).
    pub steered: Option<u64>,
    /// Of those, frames dropped because the other thread's ring stayed full.
    pub steer_dropped: u64,
}

impl Report {
    pub fn ratio_to_limit(&self) -> f64 {
        if self.limit_gbps > 0.0 {
            self.gbps / self.limit_gbps
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "test": self.test,
            "size": self.size,
            "iters": self.iters,
            "qps": self.qps,
            "mtu": self.mtu,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "messages": self.messages,
            "packets": self.packets,
            "gbps": self.gbps,
            "mpps": self.mpps,
            "retransmits": self.retransmits,
            "naks": self.naks,
            "rnr_naks": self.rnr_naks,
            "timeouts": self.timeouts,
            "verified": self.verified,
            "errors": self.errors,
            "limit_gbps": self.limit_gbps,
            "ratio_to_limit": self.ratio_to_limit(),
        });
        if !self.lat_us.is_empty() {
            v["lat_us"] = json!({
                "min": self.lat_us[0],
                "p50": pct(&self.lat_us, 0.50),
                "p99": pct(&self.lat_us, 0.99),
                "p999": pct(&self.lat_us, 0.999),
                "max": self.lat_us[self.lat_us.len() - 1],
                "avg": self.lat_us.iter().sum::<f64>() / self.lat_us.len() as f64,
            });
        }
        v
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The transport's events over a run, as an end counts them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transport {
    pub packets: u64,
    pub retransmits: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub timeouts: u64,
}

impl Transport {
    /// What `c1` counted since `c0`, on one RNIC.
    pub fn since(c0: &Counters, c1: &Counters) -> Transport {
        Transport {
            packets: (c1.sent_pkts - c0.sent_pkts) + (c1.rcvd_pkts - c0.rcvd_pkts),
            retransmits: c1.retransmitted_pkts - c0.retransmitted_pkts,
            naks: c1.nak_rcvd() - c0.nak_rcvd(),
            rnr_naks: c1.rcvd_rnr_err - c0.rcvd_rnr_err,
            timeouts: c1.local_ack_timeout_err - c0.local_ack_timeout_err,
        }
    }

    /// Both RNICs' counts from their start, with `packets` frames moved between them.
    pub fn both(packets: u64, a: &Counters, b: &Counters) -> Transport {
        Transport {
            packets,
            retransmits: a.retransmitted_pkts + b.retransmitted_pkts,
            naks: a.nak_rcvd() + b.nak_rcvd(),
            rnr_naks: a.rcvd_rnr_err + b.rcvd_rnr_err,
            timeouts: a.local_ack_timeout_err + b.local_ack_timeout_err,
        }
    }
}

/// What a run ran: the report's fixed fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunShape {
    pub test: Test,
    pub size: usize,
    pub qps: usize,
    pub mtu: usize,
    /// The report's `iters`.
    pub iters: u64,
    pub limit_gbps: f64,
}

/// A bandwidth run's figures (the contract's JSON keys), `msg_bytes` per message.
pub(crate) fn bw_report(s: &RunShape, msg_bytes: u64, run: BwRun, t: Transport) -> Report {
    let bytes = run.messages * msg_bytes;
    Report {
        test: s.test.name(),
        size: s.size,
        iters: s.iters,
        qps: s.qps,
        mtu: s.mtu,
        seconds: run.seconds,
        bytes,
        messages: run.messages,
        packets: t.packets,
        gbps: bytes as f64 * 8.0 / run.seconds / 1e9,
        mpps: run.messages as f64 / run.seconds / 1e6,
        retransmits: t.retransmits,
        naks: t.naks,
        rnr_naks: t.rnr_naks,
        timeouts: t.timeouts,
        verified: None,
        verify_detail: String::new(),
        errors: run.errors,
        first_error: run.first_error,
        limit_gbps: s.limit_gbps,
        bw_peak_mbps: run.peak_mbps,
        lat_us: Vec::new(),
        counters: String::new(),
        steered: None,
        steer_dropped: 0,
    }
}

/// A latency run's figures: `lat_us` sorted here; `messages` and `bytes` count the samples.
pub(crate) fn lat_report(
    s: &RunShape,
    msg_bytes: u64,
    seconds: f64,
    mut lat: Vec<f64>,
    t: Transport,
) -> Report {
    lat.sort_by(|a, b| a.total_cmp(b));
    let n = lat.len() as u64;
    Report {
        test: s.test.name(),
        size: s.size,
        iters: s.iters,
        qps: 1,
        mtu: s.mtu,
        seconds,
        bytes: n * msg_bytes,
        messages: n,
        packets: t.packets,
        gbps: (n * msg_bytes) as f64 * 8.0 / seconds / 1e9,
        mpps: n as f64 / seconds / 1e6,
        retransmits: t.retransmits,
        naks: t.naks,
        rnr_naks: t.rnr_naks,
        timeouts: t.timeouts,
        limit_gbps: s.limit_gbps,
        lat_us: lat,
        ..Default::default()
    }
}

/// perftest's bandwidth table lines.
pub fn bw_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
}

/// In perftest's units: its "MB/sec" is 2^20 bytes a second (`print_report_bw` divides by
/// 0x100000), its "Gb/sec" 10^9 bits (125,000,000 bytes), so that the columns read as
/// `ib_write_bw`'s do. The JSON keeps `gbps` (10^9 bits) and `bw_peak_mbps` (10^6 bytes).
pub fn bw_line(r: &Report, gbits: bool) -> String {
    const MIB: f64 = 1048576.0;
    let avg = r.bytes as f64 / r.seconds;
    let (peak, avg) = if gbits {
        (r.bw_peak_mbps * 8.0 / 1e3, avg * 8.0 / 1e9)
    } else {
        (r.bw_peak_mbps * 1e6 / MIB, avg / MIB)
    };
    format!(
        " {:<10} {:<10}       {:<16.2}   {:<16.2}     {:.6}",
        r.size, r.iters, peak, avg, r.mpps
    )
}

pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ".to_string()
}

pub fn lat_line(r: &Report) -> String {
    let l = &r.lat_us;
    let avg = l.iter().sum::<f64>() / l.len() as f64;
    let var = l.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / l.len() as f64;
    format!(
        " {:<7} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}      {:<10.2}      {:<10.2}             {:<10.2}",
        r.size,
        r.iters,
        l[0],
        l[l.len() - 1],
        pct(l, 0.5),
        avg,
        var.sqrt(),
        pct(l, 0.99),
        pct(l, 0.999)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's columns in perftest's units: MB/sec is MiB/s, Gb/sec is 10^9 bits/s.
    #[test]
    fn bw_line_reads_as_perftest_s() {
        let r = Report {
            size: 65536,
            iters: 160,
            bytes: 10 * 1048576,
            seconds: 1.0,
            bw_peak_mbps: 20.0 * 1048576.0 / 1e6,
            mpps: 0.00016,
            ..Default::default()
        };
        let cols: Vec<String> = bw_line(&r, false)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(cols, ["65536", "160", "20.00", "10.00", "0.000160"]);
        let r = Report {
            bytes: 125_000_000,
            bw_peak_mbps: 250.0,
            ..r
        };
        let cols: Vec<String> = bw_line(&r, true)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(cols[2..4], ["2.00", "1.00"]);
    }
}
