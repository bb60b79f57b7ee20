//! `--dev`, `--ip`, `--mac`: where an end of `rocemu pingpong` / `rocemu perf` meets the wire.
#[cfg(feature = "dpdk")]
use rocemu_dpdk::{open_boxed as open_dpdk, open_queues_boxed as open_dpdk_queues};
use rocemu_emulator::engine::{Engine, IdleStrategy};
use rocemu_emulator::inproc::Impairments;
use rocemu_emulator::port::af_packet::KernelGuard;
use rocemu_emulator::port::impair::ImpairedPort;
use rocemu_emulator::port::open::{open_datapath, open_datapath_shards, OpenedPort, ShardPorts};
use rocemu_emulator::port::Port;
use rocemu_emulator::rng::Seed;
use rocemu_emulator::rnic::cc::{CcAlgo, CcConfig, CC_PARAMS};
use rocemu_emulator::rnic::{Rnic, RnicConfig, Shard};
use rocemu_tools::remote::Endpoint;
use rocemu_wire::eth::Mac;
use std::net::IpAddr;
use std::path::Path;

/// Seeded impairments of frames, per frame and direction: on the in-process link, or on this
/// end's side of a real datapath.
#[derive(clap::Args, Debug, Clone)]
pub struct ImpairArgs {
    /// Probability (0…1) that a frame is lost.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a frame is held back and overtaken.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Probability that a frame is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Probability that a frame has a bit flipped.
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Seeds the run, to replay it: the impairments (default 1), an in-process run, and an RNIC
    /// on a real datapath (--dev): its keys, QPNs, PSNs and CM IDs (default: a seed from the
    /// operating system).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl ImpairArgs {
    /// The impairments' seed: `--seed`, or 1.
    pub fn impair_seed(&self) -> u64 {
        self.seed.unwrap_or(1)
    }

    /// The impairments, once every probability is checked.
    pub fn get(&self) -> Result<Impairments, String> {
        for (n, p) in [
            ("loss", self.loss),
            ("reorder", self.reorder),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("--{n} {p}: a probability is between 0 and 1"));
            }
        }
        Ok(Impairments {
            loss: self.loss,
            reorder: self.reorder,
            duplicate: self.duplicate,
            corrupt: self.corrupt,
            ..Impairments::default()
        })
    }
}

/// Where one end meets the wire, for the commands that always run on a real datapath.
#[derive(clap::Args, Debug)]
pub struct EndArgs {
    /// Datapath: af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS' (the EAL's first port).
    ///
    /// Its MTU gives the active MTU: the interface's, and for a DPDK driver on a kernel interface
    /// (net_pcap0,iface=IFACE; net_af_packet; net_tap) that interface's, capped at what the
    /// driver takes. With DPDK 22.11 only net_pcap carries jumbo frames (path MTU 4096).
    #[arg(long)]
    pub dev: String,
    /// This end's address (its GID), or several separated by commas: GID index i is the i-th
    /// (`10.77.0.1,fe80::1`, an IPv4 and an IPv6 GID, as a real RoCE port has).
    #[arg(long)]
    pub ip: String,
    /// This end's MAC (default: the port's).
    #[arg(long)]
    pub mac: Option<String>,
    /// Impairments on this end's frames, both ways (not in the real tools): to watch recovery
    /// against a real peer.
    #[command(flatten)]
    pub imp: ImpairArgs,
    /// Record every frame sent and received.
    #[arg(long)]
    pub pcap: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub name: NameArg,
    #[command(flatten)]
    pub cc: CcArgs,
}

/// The name `rocemu stats` knows a device by.
#[derive(clap::Args, Debug, Clone)]
pub struct NameArg {
    /// This device's name for `rocemu stats` (default: $ROCEMU_NAME, else rocemu0); two
    /// processes with the same name are NAME@PID there.
    #[arg(long = "name", value_name = "NAME")]
    pub name: Option<String>,
}

impl NameArg {
    /// The name given, or the default.
    pub fn get(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(rocemu_emulator::stats::default_name)
    }
}

impl EndArgs {
    /// Opens the datapath with its impairments.
    pub fn open(&self) -> Result<Opened, String> {
        let imp = self.imp.get()?;
        open(
            &self.dev,
            &self.ip,
            self.mac.as_deref(),
            self.pcap.as_deref(),
            Some((imp, self.imp.impair_seed())),
            self.imp.seed,
            &self.name.get(),
            &self.cc,
        )
    }
}

/// An endpoint and what must live as long as it.
pub struct Opened {
    pub ep: Endpoint,
    /// With `--threads N`: the device's shards 1 to N - 1 (`ep` is shard 0), each on a port of
    /// its own in the fanout group of shard 0's.
    pub more: Vec<Endpoint>,
    _guard: Option<KernelGuard>,
}

/// Opens the datapath `dev` (`af_packet:IFACE`, `af_xdp:IFACE` or `dpdk:'EAL ARGS'`) as address `ip`, a device
/// that answers `rocemu stats` as `name`, with the congestion control `cc`. The RNIC's keys replay from `seed` when given;
/// otherwise they are seeded by the operating system.
// Eight arguments, each one of the end's flags as given; the three callers pass them through.
#[allow(clippy::too_many_arguments)]
pub fn open(
    dev: &str,
    ip: &str,
    mac: Option<&str>,
    pcap: Option<&Path>,
    impair: Option<(Impairments, u64)>,
    seed: Option<u64>,
    name: &str,
    cc: &CcArgs,
) -> Result<Opened, String> {
    open_sharded(dev, ip, mac, pcap, impair, seed, name, cc, 1)
}

/// [`open`], the device split into `threads` shards (`threads` > 1: AF_PACKET, AF_XDP or DPDK),
/// one per polling thread: every shard has the device's MAC, addresses and seed. On AF_PACKET
/// each has a packet socket of its own in one fanout group whose program hands each frame to
/// the shard that has its QP (`port::af_packet::Fanout`); on AF_XDP each has the socket of
/// queue k of the interface, with DPDK rx and tx queue k of the port, and a frame read on
/// another shard's queue goes to its shard through a ring (`port::steered`). Shard 0 answers
/// ARP and neighbour discovery, and `rocemu stats` for the device (every shard's counters
/// summed, every shard's QPs).
#[allow(clippy::too_many_arguments)]
pub fn open_sharded(
    dev: &str,
    ip: &str,
    mac: Option<&str>,
    pcap: Option<&Path>,
    impair: Option<(Impairments, u64)>,
    seed: Option<u64>,
    name: &str,
    cc: &CcArgs,
    threads: usize,
) -> Result<Opened, String> {
    let cc = cc.config(rocemu_emulator::port::open::line_rate_mbps(dev))?;
    rocemu_emulator::stats::check_name(name).map_err(|e| format!("--name: {e}"))?;
    let ips = parse_ips(ip)?;
    let mac: Option<Mac> = match mac {
        Some(m) => Some(m.parse().map_err(|e| format!("--mac {m}: {e}"))?),
        None => None,
    };
    let promiscuous = mac.is_some();
    if threads > 1 && (pcap.is_some() || impair.as_ref().is_some_and(|(i, _)| !i.is_none())) {
        return Err(format!(
            "--threads {threads} on a datapath: without --pcap and impairments (each thread's port would need its own)"
        ));
    }
    let port = if threads > 1 {
        let what = format!("--threads {threads}");
        let ps = open_datapath_shards(
            "--dev",
            &what,
            dev,
            &ips,
            promiscuous,
            threads,
            &open_dpdk_queues,
        )?;
        Ports::Shards(ps)
    } else {
        Ports::One(open_datapath("--dev", dev, &ips, promiscuous, &open_dpdk)?)
    };
    let (port_mac, port_mtu, port_name) = match &port {
        Ports::One(o) => (o.port.mac(), o.port.mtu(), o.port.name()),
        Ports::Shards(ps) => (ps.first().mac(), ps.first().mtu(), ps.first().name()),
    };
    let mac = mac.unwrap_or(port_mac);
    if mac == Mac([0; 6]) || mac.is_multicast() {
        return Err(format!(
            "{port_name} has MAC {mac}, which cannot be a unicast source: give --mac"
        ));
    }
    let mut cfg = RnicConfig::new(mac, ips[0], 0);
    cfg.ips = ips.clone();
    cfg.seed = Seed::replay_or_os(seed)?;
    cfg.eth_mtu = port_mtu;
    cfg.cc = cc;
    cfg.shard = Shard {
        index: 0,
        count: threads as u32,
    };
    let rnic = Rnic::new(cfg.clone());
    let mut more = Vec::new();
    let mut wake = None;
    let (port, guard): (Box<dyn Port + Send>, _) = match port {
        Ports::One(o) => match impair {
            Some((imp, seed)) if !imp.is_none() => {
                (Box::new(ImpairedPort::new(o.port, imp, seed)), o.guard)
            }
            _ => (o.port, o.guard),
        },
        Ports::Shards(mut ps) => {
            let guard = ps.guard.take();
            let (ports, table) = ps.into_ports(rnic.qpn_steering())?;
            let mut ports = ports.into_iter();
            let first = ports.next().expect("shard 0's port");
            for (k, pk) in ports.enumerate() {
                let mut c = cfg.clone();
                c.shard.index = k as u32 + 1;
                let mut engine = engine_on(pk)?;
                if let Some(t) = &table {
                    t.set(
                        k + 1,
                        engine.doorbell().map_err(|e| format!("eventfd: {e}"))?,
                    );
                }
                more.push(Endpoint {
                    rnic: Rnic::new(c),
                    engine,
                });
            }
            wake = table;
            (first, guard)
        }
    };
    let mut engine = engine_on(port)?;
    if let Some(t) = wake {
        t.set(0, engine.doorbell().map_err(|e| format!("eventfd: {e}"))?);
    }
    if let Some(p) = pcap {
        engine.record(p)?;
    }
    let id = rocemu_emulator::stats::Identity {
        name: name.to_string(),
        datapath: engine.port().name(),
        address: ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(","),
        mac: mac.to_string(),
    };
    // Without its socket the end still runs: `rocemu stats` will not see it.
    match rocemu_emulator::stats::server::Server::bind(id) {
        Ok(s) => {
            // A device on several threads answers as one: each shard its part.
            for ep in more.iter_mut() {
                ep.engine.serve_stats_shard(s.shard_tap());
            }
            engine.serve_stats(s)
        }
        Err(e) => eprintln!("rocemu: stats: {e}; `rocemu stats` will not list this device"),
    }
    Ok(Opened {
        ep: Endpoint { rnic, engine },
        more,
        _guard: guard,
    })
}

/// The datapath `open_sharded` opened.
enum Ports {
    One(OpenedPort),
    Shards(ShardPorts),
}

/// An engine on `port`, idling as `ROCEMU_IDLE` says.
fn engine_on(port: Box<dyn Port + Send>) -> Result<Engine, String> {
    let mut engine = Engine::new(port);
    // Like perftest and DPDK applications: spin, for the lowest latency (one core per end).
    // ROCEMU_IDLE=wake blocks in ppoll(2) when idle and =backoff sleeps 50 µs at a time (as the
    // drop-in's engine; names as there), for machines with fewer cores than spinning ends
    // (scripts/cc-testbed's router VM shares two cores with four ends).
    engine.set_idle_strategy(match std::env::var("ROCEMU_IDLE").as_deref() {
        Ok("wake") => IdleStrategy::Wake,
        Ok("backoff") => IdleStrategy::Backoff,
        Ok("busy") | Err(_) => IdleStrategy::BusyPoll,
        Ok(other) => {
            return Err(format!(
                "ROCEMU_IDLE={other}: expected busy, backoff or wake"
            ))
        }
    });
    Ok(engine)
}

/// `--ip`: one address, or several separated by commas (GID index i is the i-th), as a real
/// port has both an IPv4 and an IPv6 GID: `--ip 10.77.0.1,fe80::52:4fff:fe43:4510`.
pub fn parse_ips(arg: &str) -> Result<Vec<IpAddr>, String> {
    let ips = arg
        .split(',')
        .map(|a| {
            a.trim()
                .parse::<IpAddr>()
                .map_err(|_| format!("--ip {arg}: {a:?} is not an IPv4 or IPv6 address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, a) in ips.iter().enumerate() {
        if a.is_unspecified() || a.is_multicast() || ips[..i].contains(a) {
            return Err(format!(
                "--ip {arg}: {a} cannot be a GID (unspecified, multicast or given twice)"
            ));
        }
    }
    Ok(ips)
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk_queues(_args: &str, _n: usize) -> Result<Vec<Box<dyn Port + Send>>, String> {
    Err(NO_DPDK.into())
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk(_args: &str) -> Result<Box<dyn Port + Send>, String> {
    Err(NO_DPDK.into())
}

#[cfg(not(feature = "dpdk"))]
const NO_DPDK: &str = "this rocemu was built without DPDK: build it with `cargo build --release \
     --features dpdk` (needs libdpdk-dev, pkg-config and libclang)";

/// Congestion control of an end's RNIC: `--ecn`, `--cc dcqcn|timely|none`, and every
/// parameter by its name (mlx5's for DCQCN, as `--rpg-time-reset 300`; `--timely-*` for
/// TIMELY; `--line-rate`, `--pacing-burst`), one flag per entry of [`CC_PARAMS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CcArgs {
    pub ecn: bool,
    pub cc: Option<CcAlgo>,
    pub params: Vec<(&'static str, u32)>,
}

fn flag_of(name: &'static str) -> &'static str {
    // Built once per command; the names are few and fixed.
    Box::leak(name.replace('_', "-").into_boxed_str())
}

impl clap::Args for CcArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        let mut cmd = cmd
            .next_help_heading("Congestion control")
            .arg(
                Arg::new("ecn")
                    .long("ecn")
                    .action(ArgAction::SetTrue)
                    .help("ECN-capable transport: ECT(0) on every RoCE packet this RNIC sends"),
            )
            .arg(
                Arg::new("cc")
                    .long("cc")
                    .value_name("ALGO")
                    .value_parser(["dcqcn", "timely", "none"])
                    .help(
                        "The reaction point on every connected QP: dcqcn (implies --ecn), \
                         timely, or none (default). The notification point always answers \
                         CE-marked packets with CNPs",
                    )
                    .long_help(
                        "The reaction point on every connected QP: dcqcn (implies --ecn), \
                         timely, or none (default). The notification point always answers \
                         CE-marked packets with CNPs. Every DCQCN and TIMELY parameter is a \
                         flag of its own, by its mlx5 name (below)",
                    ),
            );
        for &(name, lo, hi, what) in CC_PARAMS {
            cmd = cmd.arg(
                Arg::new(name)
                    .long(flag_of(name))
                    .value_name("N")
                    .value_parser(clap::value_parser!(u32))
                    .help(format!("{what} ({lo}…{hi})"))
                    .hide_short_help(true),
            );
        }
        cmd.after_help(
            "Congestion control's parameters (--rpg-time-reset, --dce-tcp-g, --timely-t-high-us, \
             …): see --help",
        )
        .after_long_help(
            "Congestion control's parameters are mlx5's names and units (DCQCN) and TIMELY's; \
             docs/congestion.md gives their defaults and meanings",
        )
        .next_help_heading(None)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for CcArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut a = CcArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.ecn = m.get_flag("ecn");
        if let Some(s) = m.get_one::<String>("cc") {
            self.cc =
                Some(s.parse().map_err(|e: String| {
                    clap::Error::raw(clap::error::ErrorKind::InvalidValue, e)
                })?);
        }
        self.params.clear();
        for &(name, ..) in CC_PARAMS {
            if let Some(v) = m.get_one::<u32>(name) {
                self.params.push((name, *v));
            }
        }
        Ok(())
    }
}

impl CcArgs {
    /// The configuration these flags give, on a port of `line_rate_mbps` when the port knows
    /// it (`--line-rate` wins).
    pub fn config(&self, line_rate_mbps: Option<u32>) -> Result<CcConfig, String> {
        let mut c = CcConfig::default();
        if let Some(l) = line_rate_mbps.filter(|&l| l > 0) {
            c.line_rate_mbps = l;
        }
        c.algo = self.cc.unwrap_or_default();
        c.ecn = self.ecn || c.algo == CcAlgo::Dcqcn;
        for &(n, v) in &self.params {
            c.set(n, v).map_err(|e| format!("--{}: {e}", flag_of(n)))?;
        }
        Ok(c)
    }

    /// The same flags as `ROCEMU_ECN`, `ROCEMU_CC`, `ROCEMU_CC_PARAMS` for the drop-in library
    /// (`None`: leave the variable unset).
    pub fn env(&self) -> Vec<(&'static str, Option<String>)> {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        vec![
            ("ROCEMU_ECN", self.ecn.then(|| "1".to_string())),
            ("ROCEMU_CC", self.cc.map(|a| a.name().to_string())),
            (
                "ROCEMU_CC_PARAMS",
                (!params.is_empty()).then(|| params.join(",")),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ips;
    use std::net::IpAddr;

    #[test]
    fn ip_takes_one_address_or_a_list_in_gid_order() {
        let one: IpAddr = "10.77.0.1".parse().unwrap();
        assert_eq!(parse_ips("10.77.0.1").unwrap(), [one]);
        let v6: IpAddr = "fe80::a012:d2ff:fe72:1ded".parse().unwrap();
        assert_eq!(
            parse_ips("10.77.0.1, fe80::a012:d2ff:fe72:1ded").unwrap(),
            [one, v6]
        );
        for bad in [
            "",
            "10.77.0.1,",
            "10.77.0.300",
            "10.77.0.1,10.77.0.1",
            "0.0.0.0",
            "ff02::1",
            "fe80::1;10.0.0.1",
        ] {
            let e = parse_ips(bad).unwrap_err();
            assert!(e.starts_with("--ip "), "{bad:?}: {e}");
        }
    }
}
