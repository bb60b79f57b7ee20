//! `rocemu sim`: the fabric simulator (contract in `../shared/contracts.md`).
use crate::datapath::CcArgs;
use rocemu_testbed::fabric::{plot, Scenario, SimArgs};
use std::io::Write;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// dumbbell, incast, victim, fattree, or file:TOPOLOGY (HPCC's topology format).
    pub scenario: String,
    /// dumbbell: long flows across the bottleneck.
    #[arg(long, default_value_t = 2)]
    pub flows: usize,
    /// incast: senders into one receiver; victim: incast senders behind each of the two
    /// switches.
    #[arg(long)]
    pub senders: Option<usize>,
    /// fattree and file: offered load of each host's link (0…1).
    #[arg(long, default_value_t = 0.3)]
    pub load: f64,
    /// fattree and file: the flow-size distribution.
    #[arg(long, default_value = "websearch", value_parser = ["websearch", "fbhdp"])]
    pub cdf: String,
    /// Priority flow control on the data priority (3).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub pfc: String,
    /// Host link rate, Gb/s (and the built-in topologies' switch links).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Simulated milliseconds (fattree and file: of flow arrivals; the run then lets the
    /// flows finish, up to 20 times as long).
    #[arg(long, default_value_t = 40.0)]
    pub duration: f64,
    /// Seeds every RNIC, every switch's marking and the traffic.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// RED/ECN: no mark below this queue, KB.
    #[arg(long, default_value_t = 100.0)]
    pub kmin: f64,
    /// RED/ECN: every ECN-capable frame marked above this queue, KB.
    #[arg(long, default_value_t = 400.0)]
    pub kmax: f64,
    /// RED/ECN: the marking probability at Kmax.
    #[arg(long, default_value_t = 0.2)]
    pub pmax: f64,
    /// Each switch's shared buffer, KB.
    #[arg(long, default_value_t = 32000.0)]
    pub buffer: f64,
    /// PFC headroom per port, KB (default: each port's computed need).
    #[arg(long)]
    pub headroom: Option<f64>,
    /// The PFC watchdog's detection (and restoration) time, ms; 0 turns it off.
    #[arg(long, default_value_t = 10.0)]
    pub pfc_watchdog: f64,
    /// Every host computes and checks ICRCs, as on a wire; off skips both (no figure changes:
    /// the simulated links corrupt nothing), for speed.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub icrc: String,
    /// The last line of stdout is one JSON object (the contract's keys).
    #[arg(long)]
    pub json: bool,
    /// Write per-flow rate, queue depth and pauses over time (and FCT slowdown by size) here.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub cc: CcArgs,
}

fn kb(name: &str, v: f64) -> Result<u64, String> {
    if !(0.0..=1e9).contains(&v) {
        return Err(format!("--{name} {v}: KB between 0 and 10^9"));
    }
    Ok((v * 1000.0).round() as u64)
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let scenario = match a.scenario.as_str() {
        "dumbbell" => Scenario::Dumbbell { flows: a.flows },
        "incast" => Scenario::Incast {
            senders: a.senders.unwrap_or(8),
        },
        "victim" => Scenario::Victim {
            senders: a.senders.unwrap_or(2),
        },
        "fattree" => Scenario::FatTree {
            load: a.load,
            cdf: a.cdf.clone(),
        },
        s => match s.strip_prefix("file:") {
            Some(p) if !p.is_empty() => Scenario::File {
                path: p.to_string(),
                load: a.load,
                cdf: a.cdf.clone(),
            },
            _ => {
                return Err(format!(
                    "{s}: a scenario is dumbbell, incast, victim, fattree or file:TOPOLOGY"
                )
                .into())
            }
        },
    };
    if !(a.rate > 0.0 && a.rate <= 10_000.0) {
        return Err(format!("--rate {}: Gb/s above 0, at most 10000", a.rate).into());
    }
    if !(a.duration > 0.0 && a.duration <= 10_000.0) {
        return Err(format!("--duration {}: ms above 0, at most 10000", a.duration).into());
    }
    if !(0.0..=1.0).contains(&a.pmax) {
        return Err(format!("--pmax {}: a probability", a.pmax).into());
    }
    let rate_bps = (a.rate * 1e9).round() as u64;
    let mut s = SimArgs::new(scenario, a.cc.cc.unwrap_or_default());
    s.rate_bps = rate_bps;
    s.duration_ns = (a.duration * 1e6).round() as u64;
    s.fabric.cc = a.cc.config(Some((rate_bps / 1_000_000) as u32))?;
    let f = &mut s.fabric;
    f.seed = a.seed;
    f.pfc = a.pfc == "on";
    f.icrc = a.icrc == "on";
    f.kmin_bytes = kb("kmin", a.kmin)?;
    f.kmax_bytes = kb("kmax", a.kmax)?;
    if f.kmax_bytes < f.kmin_bytes {
        return Err(format!("--kmax {} is below --kmin {}", a.kmax, a.kmin).into());
    }
    f.pmax = a.pmax;
    f.buffer_bytes = kb("buffer", a.buffer)?;
    f.headroom_bytes = a.headroom.map(|h| kb("headroom", h)).transpose()?;
    if !(0.0..=10_000.0).contains(&a.pfc_watchdog) {
        return Err(format!("--pfc-watchdog {}: ms, 0 to 10000", a.pfc_watchdog).into());
    }
    f.watchdog_detect_ns = (a.pfc_watchdog * 1e6).round() as u64;
    f.watchdog_restore_ns = f.watchdog_detect_ns;
    f.series_ns = (s.duration_ns / 400).clamp(1_000, 1_000_000) / 1_000 * 1_000;

    // A progress line on stderr for runs longer than a few seconds.
    let t0 = std::time::Instant::now();
    let mut last = 0u64;
    let total = s.duration_ns;
    let mut progress = |sim_ns: u64, hops: u64| {
        let e = t0.elapsed().as_secs();
        if e >= 3 && e != last {
            last = e;
            let (sim, end) = (sim_ns as f64 / 1e6, total as f64 / 1e6);
            let speed = hops as f64 / 1e6 / t0.elapsed().as_secs_f64();
            if sim_ns <= total {
                eprint!("\rrocemu sim: {sim:.2} of {end:.2} ms simulated, {speed:.1} M packet-hops/s   ");
            } else {
                eprint!(
                    "\rrocemu sim: {sim:.2} ms simulated, the last flows finishing (they arrived until {end:.2} ms), {speed:.1} M packet-hops/s   "
                );
            }
        }
    };
    let r = s.run(&mut progress)?;
    if last > 0 {
        eprintln!();
    }
    if let Some(p) = &a.plot {
        let svg = plot::render_svg(&r)?;
        std::fs::write(p, svg).map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    let mut out = std::io::stdout().lock();
    write!(out, "{}", r.text())?;
    if a.json {
        writeln!(out, "{}", r.json())?;
    }
    Ok(ExitCode::SUCCESS)
}
