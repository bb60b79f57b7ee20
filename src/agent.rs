//! `rocemu agent`: serves the conformance agent protocol (`docs/agent-protocol.md`) for a
//! RoCEmu RNIC on a datapath, so that `rocemu conformance --target agent:ADDR` can judge it.
use crate::datapath;
use rocemu_conformance::agent::server::{serve, EngineBackend, Listener, NullBackend};
use rocemu_emulator::engine::IdleStrategy;
use rocemu_emulator::rng::Seed;
use rocemu_emulator::rnic::{Rnic, RnicConfig};
use rocemu_wire::eth::Mac;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to serve the protocol: tcp:HOST:PORT or unix:PATH.
    #[arg(long)]
    listen: String,
    /// The RNIC's datapath: af_packet:IFACE, af_xdp:IFACE, dpdk:'EAL ARGS', or `null` (no datapath: the
    /// protocol alone, for trying it out).
    #[arg(long)]
    dev: String,
    /// The RNIC's address (its GID), or several separated by commas (GID index i is the i-th:
    /// `10.77.0.1,fe80::52:4fff:fe43:4510` gives an IPv4 and an IPv6 GID); default 10.77.0.1 with
    /// --dev null.
    #[arg(long)]
    ip: Option<String>,
    /// The RNIC's MAC (default: the port's).
    #[arg(long)]
    mac: Option<String>,
    /// Record every frame sent and received.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Serve this many clients, one after the other, then exit (default: serve forever).
    #[arg(long)]
    clients: Option<usize>,
    /// Seeds the RNIC's keys, QPNs and PSNs, to replay a run (default: a seed from the
    /// operating system).
    #[arg(long)]
    seed: Option<u64>,
    /// With a datapath: the device's name for `rocemu stats`.
    #[command(flatten)]
    name: datapath::NameArg,
    #[command(flatten)]
    cc: datapath::CcArgs,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let listener = Listener::bind(&a.listen)?;
    let r = serve_on(a, &listener);
    if let Some(p) = a.listen.strip_prefix("unix:") {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn serve_on(a: &Args, listener: &Listener) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if a.dev == "null" {
        let ips = datapath::parse_ips(a.ip.as_deref().unwrap_or("10.77.0.1"))?;
        let ip = ips[0];
        let mac: Mac = a.mac.as_deref().unwrap_or("02:52:4f:43:45:10").parse()?;
        let mut cfg = RnicConfig::new(mac, ip, 0);
        cfg.ips = ips;
        cfg.seed = Seed::replay_or_os(a.seed)?;
        cfg.cc = a.cc.config(None)?;
        let mut b = NullBackend::new(Rnic::new(cfg));
        eprintln!(
            "rocemu agent: RoCEmu at {ip} (no datapath), listening on {}",
            listener.local()
        );
        serve(listener, &mut b, a.clients);
        return Ok(ExitCode::SUCCESS);
    }
    let ip =
        a.ip.as_deref()
            .ok_or("--ip: the RNIC's address is needed with a datapath")?;
    let opened = datapath::open(
        &a.dev,
        ip,
        a.mac.as_deref(),
        a.pcap.as_deref(),
        None,
        a.seed,
        &a.name.get(),
        &a.cc,
    )?;
    // A partial move: the rest of `opened` (the kernel's UDP 4791 guard) lives to the end.
    let ep = opened.ep;
    let mut b = EngineBackend {
        rnic: ep.rnic,
        engine: ep.engine,
    };
    // A control agent waits on its client most of the time: do not burn a core spinning.
    b.engine.set_idle_strategy(IdleStrategy::Backoff);
    eprintln!(
        "rocemu agent: RoCEmu at {ip} on {}, listening on {}",
        b.engine.port().name(),
        listener.local()
    );
    serve(listener, &mut b, a.clients);
    b.engine.finish_recording()?;
    Ok(ExitCode::SUCCESS)
}
