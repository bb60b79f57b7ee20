//! A run from arguments to figures: the scenarios of `rocemu sim`, and what they report as the
//! congestion-control literature does (per-flow throughput, Jain's fairness, bottleneck
//! utilisation and queue, pauses, drops, CNPs, marks, FCT and FCT slowdown with p50/p95/p99 per
//! flow-size bin).
//!
//! Invariants: the JSON's keys are the contract's, in its order; the same arguments give the same
//! JSON but for `events_per_second`; every figure is computed from the run, none is assumed.
use super::sim::{wire_ns, Fabric, FabricConfig, WIRE_OVERHEAD};
use super::topo::Topology;
use super::traffic::{poisson, Cdf, FlowSpec};
use rocemu_emulator::rnic::cc::{CcAlgo, CcConfig};
use serde_json::{json, Value};

/// Which experiment.
#[derive(Debug, Clone, PartialEq)]
pub enum Scenario {
    /// `flows` long flows across one link.
    Dumbbell { flows: usize },
    /// `senders` long flows into one receiver.
    Incast { senders: usize },
    /// An incast of `2·senders` (half of them behind the victim's switch) and the victim flow.
    Victim { senders: usize },
    /// HPCC's fat tree, Poisson flows from `cdf` at `load`.
    FatTree { load: f64, cdf: String },
    /// A topology in HPCC's format, Poisson flows from `cdf` at `load`.
    File {
        path: String,
        load: f64,
        cdf: String,
    },
}

impl Scenario {
    pub fn name(&self) -> String {
        match self {
            Scenario::Dumbbell { .. } => "dumbbell".into(),
            Scenario::Incast { .. } => "incast".into(),
            Scenario::Victim { .. } => "victim".into(),
            Scenario::FatTree { .. } => "fattree".into(),
            Scenario::File { path, .. } => format!("file:{path}"),
        }
    }
}

/// Everything a run takes.
#[derive(Debug, Clone)]
pub struct SimArgs {
    pub scenario: Scenario,
    /// Host link rate, b/s (switch-to-switch links of the built-in topologies too; the fat
    /// tree's core and aggregation links are as HPCC's file has them).
    pub rate_bps: u64,
    pub duration_ns: u64,
    /// The switches' knobs, and every host's congestion control (`fabric.cc`).
    pub fabric: FabricConfig,
}

impl SimArgs {
    pub fn new(scenario: Scenario, cc: CcAlgo) -> SimArgs {
        let mut c = CcConfig {
            algo: cc,
            ..CcConfig::default()
        };
        c.ecn = cc == CcAlgo::Dcqcn;
        let mut fabric = FabricConfig::new(1);
        fabric.cc = c;
        SimArgs {
            scenario,
            rate_bps: 100_000_000_000,
            duration_ns: 40_000_000,
            fabric,
        }
    }

    /// The topology and the flows.
    pub fn build(&self) -> Result<(Topology, Vec<FlowSpec>), String> {
        let r = self.rate_bps;
        let long = |src, dst| FlowSpec {
            src,
            dst,
            bytes: None,
            start_ns: 0,
        };
        Ok(match &self.scenario {
            Scenario::Dumbbell { flows } => {
                let n = *flows;
                if !(1..=1024).contains(&n) {
                    return Err(format!("--flows {n}: 1 to 1024"));
                }
                (
                    Topology::dumbbell(n, r),
                    (0..n).map(|i| long(i, n + i)).collect(),
                )
            }
            Scenario::Incast { senders } => {
                let n = *senders;
                if !(1..=1024).contains(&n) {
                    return Err(format!("--senders {n}: 1 to 1024"));
                }
                (Topology::incast(n, r), (0..n).map(|i| long(i, n)).collect())
            }
            Scenario::Victim { senders } => {
                let k = *senders;
                if !(1..=512).contains(&k) {
                    return Err(format!("--senders {k}: 1 to 512"));
                }
                let (t, roles) = Topology::victim(k, r);
                let mut f: Vec<FlowSpec> = roles
                    .incast_senders
                    .iter()
                    .map(|&s| long(s, roles.incast_receiver))
                    .collect();
                f.push(long(roles.victim_sender, roles.victim_receiver));
                (t, f)
            }
            Scenario::FatTree { load, cdf } => {
                let t = Topology::fat_tree();
                let f = self.poisson(&t, *load, cdf)?;
                (t, f)
            }
            Scenario::File { path, load, cdf } => {
                let text =
                    std::fs::read_to_string(path).map_err(|e| format!("file:{path}: {e}"))?;
                let t = Topology::parse_hpcc(&text).map_err(|e| format!("file:{path}: {e}"))?;
                let f = self.poisson(&t, *load, cdf)?;
                (t, f)
            }
        })
    }

    fn poisson(&self, t: &Topology, load: f64, cdf: &str) -> Result<Vec<FlowSpec>, String> {
        if !(load > 0.0 && load <= 1.0) {
            return Err(format!("--load {load}: above 0, at most 1"));
        }
        let c = Cdf::by_name(cdf)?;
        let hosts = t.hosts();
        // Each host's own link rate (HPCC's files: all hosts alike).
        let bps = t
            .links
            .iter()
            .find(|l| l.a == hosts[0] || l.b == hosts[0])
            .map_or(self.rate_bps, |l| l.bps);
        Ok(poisson(
            &hosts,
            bps,
            load,
            &c,
            self.duration_ns,
            self.fabric.seed,
        ))
    }

    /// Runs it. `progress(simulated_ns, hops)` is called every 65,536 events.
    pub fn run(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Report, String> {
        if self.duration_ns == 0 || self.duration_ns > 10_000_000_000 {
            return Err(format!(
                "--duration {} ms: above 0, at most 10000",
                self.duration_ns as f64 / 1e6
            ));
        }
        let (topo, flows) = self.build()?;
        let mut fab = Fabric::new(topo, self.fabric.clone())?;
        for f in flows {
            fab.add_flow(f)?;
        }
        let poisson = matches!(
            self.scenario,
            Scenario::FatTree { .. } | Scenario::File { .. }
        );
        let wall = std::time::Instant::now();
        let d = self.duration_ns;
        let drain = if poisson { d.saturating_mul(20) } else { d };
        fab.run(d / 2, d, drain, progress);
        let secs = wall.elapsed().as_secs_f64();
        Ok(Report::of(self, &fab, secs))
    }
}

/// One flow's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowFigures {
    pub id: usize,
    pub src: usize,
    pub dst: usize,
    /// The flow's size; for a long flow, what it delivered.
    pub bytes: u64,
    pub long: bool,
    pub start_us: f64,
    pub fct_us: Option<f64>,
    pub slowdown: Option<f64>,
    /// Long flows: goodput over the second half; others: size over FCT (or over the time it
    /// ran, unfinished).
    pub gbps: f64,
    pub failed: bool,
}

/// p50/p95/p99.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Pct {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Pct {
    pub fn of(v: &mut [f64]) -> Option<Pct> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        Some(Pct {
            n: v.len(),
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
        })
    }
}

/// Flow-size bins for the slowdown table: upper bounds, bytes.
pub const SIZE_BINS: &[(u64, &str)] = &[
    (10_000, "<10KB"),
    (100_000, "10KB-100KB"),
    (1_000_000, "100KB-1MB"),
    (10_000_000, "1MB-10MB"),
    (u64::MAX, ">10MB"),
];

/// Everything a run reports.
#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: String,
    pub cc: String,
    pub pfc: bool,
    pub seed: u64,
    pub simulated_ms: f64,
    pub flows: Vec<FlowFigures>,
    pub jain: Option<f64>,
    pub utilization: f64,
    pub queue_max_bytes: u64,
    pub queue_p99_bytes: u64,
    pub pause_frames: u64,
    pub resume_frames: u64,
    pub drops: u64,
    pub cnps: u64,
    pub ecn_marked: u64,
    pub retransmitted_pkts: u64,
    pub fct_slowdown: Option<Pct>,
    pub bins: Vec<(&'static str, Pct)>,
    pub watchdog: Vec<super::sim::WatchdogEvent>,
    pub hops: u64,
    pub wall_secs: f64,
    pub events_per_second: f64,
    /// The hosts computed and checked ICRCs (`FabricConfig::icrc`): the speed depends on it.
    pub icrc: bool,
    /// For the plot: sample period, each flow's cumulative bytes, the queue and the pauses.
    pub series_ns: u64,
    pub flow_series: Vec<Vec<u64>>,
    pub queue_series: Vec<u64>,
    pub pause_series: Vec<u64>,
    /// The first flow that failed, and why.
    pub first_failure: Option<(usize, String)>,
    /// The smallest headroom a switch port reserved, and what that port needed.
    pub headroom: (u64, u64),
}

/// Jain's index of `x`.
pub fn jain(x: &[f64]) -> Option<f64> {
    if x.is_empty() {
        return None;
    }
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    (s2 > 0.0).then(|| s * s / (x.len() as f64 * s2))
}

impl Report {
    fn of(a: &SimArgs, fab: &Fabric, wall_secs: f64) -> Report {
        let half_span = (fab.end_ns - fab.half_ns).max(1) as f64;
        let mut flows = Vec::new();
        for (id, f) in fab.flows.iter().enumerate() {
            let s = f.spec;
            let long = s.bytes.is_none();
            let fct = f.finish_ns.map(|t| (t - s.start_ns) as f64 / 1e3);
            let (bytes, gbps, slowdown) = match s.bytes {
                None => {
                    let g = (f.done - f.done_at_half.min(f.done)) as f64 * 8.0 / half_span;
                    (f.done, g, None)
                }
                Some(b) => {
                    let ran = f
                        .finish_ns
                        .unwrap_or(fab.now)
                        .saturating_sub(s.start_ns)
                        .max(1);
                    let g = f.done as f64 * 8.0 / ran as f64;
                    let path = fab.path(s.src, s.dst);
                    let host_bps = path.first().map_or(a.rate_bps, |p| p.0);
                    let ideal = ideal_fct_ns(&path, b, host_bps);
                    (b, g, fct.map(|us| (us * 1e3 / ideal).max(1.0)))
                }
            };
            flows.push(FlowFigures {
                id,
                src: s.src,
                dst: s.dst,
                bytes,
                long,
                start_us: s.start_ns as f64 / 1e3,
                fct_us: fct,
                slowdown,
                gbps,
                failed: f.failed.is_some(),
            });
        }
        let longs: Vec<f64> = flows.iter().filter(|f| f.long).map(|f| f.gbps).collect();
        let mut sl: Vec<f64> = flows.iter().filter_map(|f| f.slowdown).collect();
        let mut bins = Vec::new();
        let mut lo = 0;
        for &(hi, name) in SIZE_BINS {
            let mut v: Vec<f64> = flows
                .iter()
                .filter(|f| !f.long && f.bytes >= lo && f.bytes < hi)
                .filter_map(|f| f.slowdown)
                .collect();
            if let Some(p) = Pct::of(&mut v) {
                bins.push((name, p));
            }
            lo = hi;
        }
        let (utilization, queue_max_bytes) = fab.bottleneck_figures();
        let mut qs: Vec<f64> = fab
            .totals
            .queue_samples_2nd
            .iter()
            .map(|&q| q as f64)
            .collect();
        let queue_p99_bytes = Pct::of(&mut qs).map_or(0, |p| p.p99 as u64);
        let hr = fab.min_headroom();
        Report {
            scenario: a.scenario.name(),
            cc: a.fabric.cc.algo.name().to_string(),
            pfc: a.fabric.pfc,
            seed: a.fabric.seed,
            simulated_ms: fab.now as f64 / 1e6,
            jain: jain(&longs),
            utilization,
            queue_max_bytes,
            queue_p99_bytes,
            pause_frames: fab.totals.pause_frames,
            resume_frames: fab.totals.resume_frames,
            drops: fab.totals.drops,
            cnps: fab.host_counter(|c| c.np_cnp_sent),
            ecn_marked: fab.totals.ecn_marked,
            retransmitted_pkts: fab.host_counter(|c| c.retransmitted_pkts),
            fct_slowdown: Pct::of(&mut sl),
            bins,
            watchdog: fab.totals.watchdog.clone(),
            hops: fab.totals.hops,
            wall_secs,
            events_per_second: fab.totals.hops as f64 / wall_secs.max(1e-9),
            icrc: fab.cfg.icrc,
            series_ns: fab.cfg.series_ns,
            flow_series: fab.flows.iter().map(|f| f.series.clone()).collect(),
            queue_series: fab.totals.queue_series.clone(),
            pause_series: fab.totals.pause_series.clone(),
            headroom: hr,
            first_failure: fab
                .flows
                .iter()
                .enumerate()
                .find_map(|(i, f)| f.failed.clone().map(|w| (i, w))),
            flows,
        }
    }

    /// The contract's object.
    pub fn json(&self) -> Value {
        let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
        let flows: Vec<Value> = self
            .flows
            .iter()
            .map(|f| {
                json!({
                    "id": f.id,
                    "src": f.src,
                    "dst": f.dst,
                    "bytes": f.bytes,
                    "start_us": r3(f.start_us),
                    "fct_us": f.fct_us.map(r3),
                    "slowdown": f.slowdown.map(r3),
                    "gbps": r3(f.gbps),
                })
            })
            .collect();
        json!({
            "scenario": self.scenario,
            "cc": self.cc,
            "pfc": if self.pfc { "on" } else { "off" },
            "seed": self.seed,
            "simulated_ms": r3(self.simulated_ms),
            "flows": flows,
            "jain": self.jain.map(|j| (j * 10000.0).round() / 10000.0),
            "utilization": (self.utilization * 10000.0).round() / 10000.0,
            "queue_max_bytes": self.queue_max_bytes,
            "queue_p99_bytes": self.queue_p99_bytes,
            "pause_frames": self.pause_frames,
            "drops": self.drops,
            "cnps": self.cnps,
            "ecn_marked": self.ecn_marked,
            "fct_slowdown": self.fct_slowdown.map(|p| json!({"p50": r3(p.p50), "p95": r3(p.p95), "p99": r3(p.p99)})),
            "events_per_second": self.events_per_second.round(),
        })
    }

    /// The text report.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{} · cc {} · pfc {} · seed {} · {:.3} ms simulated\n",
            self.scenario,
            self.cc,
            if self.pfc { "on" } else { "off" },
            self.seed,
            self.simulated_ms
        );
        let longs: Vec<&FlowFigures> = self.flows.iter().filter(|f| f.long).collect();
        if !longs.is_empty() {
            s += "long flows (goodput over the second half):\n";
            for f in longs.iter().take(32) {
                s += &format!(
                    "  flow {:>3}  {:>4} → {:<4} {:>8.2} Gb/s  {:>12} B{}\n",
                    f.id,
                    f.src,
                    f.dst,
                    f.gbps,
                    f.bytes,
                    if f.failed { "  FAILED" } else { "" }
                );
            }
            if longs.len() > 32 {
                s += &format!("  … {} more\n", longs.len() - 32);
            }
        }
        let finite = self.flows.iter().filter(|f| !f.long).count();
        if finite > 0 {
            let done = self.flows.iter().filter(|f| f.fct_us.is_some()).count();
            let failed = self.flows.iter().filter(|f| f.failed).count();
            s += &format!("flows: {finite}, finished {done}, failed {failed}\n");
            s += "FCT slowdown by size     flows      p50      p95      p99\n";
            for (name, p) in &self.bins {
                s += &format!(
                    "  {:<20} {:>7} {:>8.2} {:>8.2} {:>8.2}\n",
                    name, p.n, p.p50, p.p95, p.p99
                );
            }
            if let Some(p) = self.fct_slowdown {
                s += &format!(
                    "  {:<20} {:>7} {:>8.2} {:>8.2} {:>8.2}\n",
                    "all", p.n, p.p50, p.p95, p.p99
                );
            }
        }
        if let Some((id, why)) = self.first_failure.as_ref() {
            s += &format!("first failed flow: {id}: {why}\n");
        }
        if let Some(j) = self.jain {
            s += &format!("Jain's fairness (long flows, second half): {j:.4}\n");
        }
        s += &format!(
            "bottleneck: utilisation {:.1} %, queue max {} B, p99 {} B\n",
            self.utilization * 100.0,
            self.queue_max_bytes,
            self.queue_p99_bytes
        );
        s += &format!(
            "pause frames {} (resume {}), drops {}, CNPs {}, ECN marks {}, retransmitted packets {}\n",
            self.pause_frames,
            self.resume_frames,
            self.drops,
            self.cnps,
            self.ecn_marked,
            self.retransmitted_pkts
        );
        for w in &self.watchdog {
            s += &format!(
                "PFC watchdog: switch {} port {} priority {}: paused since {:.1} µs, fired at {:.1} µs\n",
                w.switch,
                w.port,
                w.prio,
                w.stalled_ns as f64 / 1e3,
                w.fired_ns as f64 / 1e3
            );
        }
        s += &format!(
            "speed: {} packet-hops in {:.2} s, {:.2} M/s (ICRC {})\n",
            self.hops,
            self.wall_secs,
            self.events_per_second / 1e6,
            if self.icrc { "on" } else { "off" }
        );
        s
    }
}

/// The FCT of a flow alone on its path: its bytes (with every packet's headers) at the first
/// link's rate, plus each further link's store-and-forward of one packet and every link's
/// propagation both ways, plus the ACK's serialisation back.
pub fn ideal_fct_ns(path: &[(u64, u64)], bytes: u64, host_bps: u64) -> f64 {
    // 1024-byte packets: Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4, and the wire's 24;
    // RETH (16) once per 64 KiB work request.
    let pkts = bytes.div_ceil(1024).max(1);
    let wrs = bytes.div_ceil(64 * 1024).max(1);
    let wire = bytes + pkts * (58 + WIRE_OVERHEAD) + wrs * 16;
    let first = bytes.min(1024) + 58 + 16;
    let ack = 14 + 20 + 8 + 12 + 4 + 4;
    let mut t = (wire * 8) as f64 * 1e9 / host_bps as f64;
    for (k, &(bps, delay)) in path.iter().enumerate() {
        if k > 0 {
            t += wire_ns(first, bps) as f64;
        }
        t += 2.0 * delay as f64 + wire_ns(ack, bps) as f64;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_and_percentiles() {
        assert_eq!(jain(&[1.0, 1.0]), Some(1.0));
        assert!((jain(&[1.0, 0.0]).unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), None);
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Pct::of(&mut v).unwrap();
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 95.0, 99.0));
    }

    #[test]
    fn the_ideal_fct_is_line_rate_plus_the_path() {
        // One 100 Gb/s link of 1 µs: 1 MB takes about 86 µs (with headers) plus 2 µs.
        let t = ideal_fct_ns(&[(100_000_000_000, 1000)], 1_000_000, 100_000_000_000);
        assert!((87_000.0..89_000.0).contains(&t), "{t}");
    }
}
