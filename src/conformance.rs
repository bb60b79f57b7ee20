//! `rocemu conformance`: runs the scenario catalogue against a device and writes the reports
//! (`docs/conformance.md`).
use rocemu_conformance::counters;
use rocemu_conformance::dut::{PortLink, PEER_IP};
use rocemu_conformance::runner::{self, AgentTarget, Report};
use rocemu_conformance::scenarios;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort, KernelGuard};
use rocemu_emulator::port::Port;
use rocemu_wire::eth::Mac;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The device under test: `self` (a RoCEmu RNIC in-process, in virtual time) or
    /// `agent:ADDR` (an agent at tcp:HOST:PORT or unix:PATH, with --dev for the peer's port).
    #[arg(long, default_value = "self")]
    target: String,
    /// With an agent target: the peer's datapath, af_packet:IFACE on the device's link.
    #[arg(long)]
    dev: Option<String>,
    /// With an agent target: the peer's address (default 10.77.0.2).
    #[arg(long)]
    ip: Option<String>,
    /// With an agent target: the peer's MAC (default: the port's).
    #[arg(long)]
    mac: Option<String>,
    /// With an agent target: the GID index of the device's address to test.
    #[arg(long, default_value_t = 0)]
    gid_index: usize,
    /// With an agent target: how long the peer listens for answers, in ms.
    #[arg(long, default_value_t = 100)]
    settle_ms: u64,
    /// Run only the scenarios whose id contains PATTERN (several: comma-separated).
    #[arg(long)]
    filter: Option<String>,
    /// Where report.json, junit.xml, matrix.md and pcap/ go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the catalogue with its citations (release, and the source that confirms each, or
    /// "unverified") and exit.
    #[arg(long)]
    list: bool,
    /// Print a Markdown matrix of earlier runs side by side (their report.json files) and exit.
    #[arg(long, num_args = 1.., value_name = "REPORT")]
    matrix: Vec<PathBuf>,
    /// Column names for --matrix, in order (default: each run's device).
    #[arg(long, value_delimiter = ',')]
    names: Vec<String>,
    /// With an agent target: a shell command, run before and after each scenario, that prints
    /// the device's counters as `rdma statistic show link DEV/PORT` does; each scenario's
    /// deltas go into report.json ("counters"). A read that fails leaves them out.
    #[arg(long, value_name = "CMD")]
    counters_cmd: Option<String>,
    /// Compare the counter deltas of two runs (OURS.json THEIRS.json, their report.json files)
    /// scenario by scenario, with --deviations; exit status 1 when a difference is unexplained.
    #[arg(long, num_args = 2, value_names = ["OURS", "THEIRS"])]
    compare_counters: Vec<PathBuf>,
    /// For --compare-counters: the explained deviations, `scenario counter reason…` a line.
    #[arg(long, value_name = "FILE")]
    deviations: Option<PathBuf>,
}

fn read_json(p: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let selected = scenarios::select(a.filter.as_deref().unwrap_or(""));
    if let [ours, theirs] = &a.compare_counters[..] {
        let deviations = match &a.deviations {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                counters::parse_deviations(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => Vec::new(),
        };
        let c = counters::compare(&read_json(ours)?, &read_json(theirs)?, &deviations)?;
        print!("{}", c.text());
        return Ok(if c.problems.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    if !a.matrix.is_empty() {
        let mut reports = Vec::new();
        for p in &a.matrix {
            reports.push(read_json(p)?);
        }
        print!("{}", runner::side_by_side(&reports, &a.names)?);
        return Ok(ExitCode::SUCCESS);
    }
    if a.list {
        print!("{}", runner::list(&selected));
        return Ok(ExitCode::SUCCESS);
    }
    if selected.is_empty() {
        return Err(format!(
            "--filter {}: no scenario matches",
            a.filter.as_deref().unwrap_or("")
        )
        .into());
    }
    let out = a.out.as_deref();
    let report = if a.target == "self" {
        let cases = selected
            .iter()
            .map(|sc| runner::record(runner::run_self(sc), out))
            .collect();
        Report {
            target: "self".into(),
            device: "RoCEmu in-process, virtual time".into(),
            cases,
        }
    } else if let Some(addr) = a.target.strip_prefix("agent:") {
        run_agent(a, addr, &selected)?
    } else {
        return Err(format!("--target {}: give self or agent:ADDR", a.target).into());
    };
    print!("{}", report.summary());
    if let Some(dir) = out {
        report.write(dir)?;
        println!("reports in {}", dir.display());
    }
    Ok(if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run_agent(
    a: &Args,
    addr: &str,
    selected: &[rocemu_conformance::scenario::Scenario],
) -> Result<Report, String> {
    let dev = a
        .dev
        .as_deref()
        .ok_or("--target agent:… needs --dev af_packet:IFACE for the peer's port")?;
    let ifname = dev
        .strip_prefix("af_packet:")
        .ok_or_else(|| format!("--dev {dev}: the peer runs on af_packet:IFACE"))?;
    let mac: Option<Mac> = match &a.mac {
        Some(m) => Some(m.parse().map_err(|e| format!("--mac {m}: {e}"))?),
        None => None,
    };
    let ip: IpAddr = match &a.ip {
        Some(s) => s
            .parse()
            .map_err(|_| format!("--ip {s}: not an IP address"))?,
        None => PEER_IP,
    };
    let port = AfPacketPort::open(
        ifname,
        &AfPacketOptions {
            promiscuous: mac.is_some(),
            // The test peer reads RoCEv2 to any address: whatever the device sends is judged.
            addrs: Vec::new(),
            fanout: None,
        },
    )
    .map_err(|e| e.to_string())?;
    // The peer's address is not the kernel's: keep the kernel from answering RoCEv2 datagrams
    // to addresses it does own with ICMP.
    let _guard = KernelGuard::new();
    let mac = mac.unwrap_or(port.mac());
    let link = PortLink::new(Box::new(port), mac, ip);
    let mut t = AgentTarget::connect(addr, Box::new(link), mac, ip, a.gid_index)?;
    t.settle = Duration::from_millis(a.settle_ms);
    t.counters_cmd = a.counters_cmd.clone();
    let device = format!("{} at {} ({})", t.dev.name, t.dut_ip, t.dev.mac);
    let cases = selected
        .iter()
        .map(|sc| runner::record(t.run(sc), a.out.as_deref()))
        .collect();
    if t.counters_cmd.is_some() {
        let (n, took) = t.counter_reads;
        println!("counters: {n} reads in {:.1} s", took.as_secs_f64());
    }
    Ok(Report {
        target: format!("agent:{addr}"),
        device,
        cases,
    })
}
