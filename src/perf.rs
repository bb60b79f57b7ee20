//! `rocemu perf TEST [options] [SERVER]` (contract: shared/contracts.md): perftest's
//! benchmarks on RoCEmu.
use rocemu_emulator::inproc::Impairments;
use rocemu_emulator::port::open::{iface_drops, kernel_iface};
use rocemu_emulator::port::PortStats;
use rocemu_emulator::rnic::Mtu;
use rocemu_emulator::time::Nanos;
use rocemu_tools::perf::{self, Opts, Report, Test};
use std::process::ExitCode;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestArg {
    Write,
    Read,
    Send,
    Atomic,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// write, read, send or atomic (fetch-and-add; --cmp-swap for compare-and-swap).
    #[arg(value_enum)]
    test: TestArg,
    /// With a datapath (--dev): the server's address; without it this end is the server.
    server: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Iterations (messages per QP).
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long)]
    duration: Option<f64>,
    /// Queue pairs (traffic round robin over them).
    #[arg(short = 'q', long, default_value_t = 1)]
    qps: usize,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long, default_value_t = 4096)]
    mtu: usize,
    /// Work requests outstanding per QP.
    #[arg(short = 't', long = "tx-depth", default_value_t = 128)]
    tx_depth: usize,
    /// A completion only every N work requests (perftest's CQ moderation: 100, or 1 above
    /// 8 KiB, unless given; at most the TX depth).
    #[arg(short = 'Q', long = "cq-mod")]
    cq_mod: Option<usize>,
    /// Every size from 2 bytes to 8 MiB.
    #[arg(short = 'a', long)]
    all: bool,
    /// Bandwidth in Gbit/s.
    #[arg(long = "report_gbits", alias = "report-gbits")]
    report_gbits: bool,
    /// Compare-and-swap instead of fetch-and-add (atomic).
    #[arg(long = "cmp-swap")]
    cmp_swap: bool,
    /// Measure latency instead of bandwidth.
    #[arg(long)]
    lat: bool,
    /// Check every delivered byte (and, for atomics, the final value) through the wire.
    #[arg(long)]
    verify: bool,
    /// The last line of stdout is one JSON object with the figures.
    #[arg(long)]
    json: bool,
    /// Wire impairments, deterministic from --seed. With --dev they act on this end's frames,
    /// both ways.
    #[command(flatten)]
    imp: crate::datapath::ImpairArgs,
    /// Local ACK timeout exponent: 4.096 µs × 2^N (perftest's -u).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    qp_timeout: u8,
    /// Datapath: af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'. Without it both ends run in-process.
    #[arg(long)]
    dev: Option<String>,
    /// This end's address (with --dev).
    #[arg(long)]
    ip: Option<String>,
    /// This end's MAC (with --dev).
    #[arg(long)]
    mac: Option<String>,
    /// Record every frame sent and received (with --dev).
    #[arg(long)]
    pcap: Option<std::path::PathBuf>,
    /// TCP port of perftest's exchange (with --dev); with --rdma-cm, the rdma_cm port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Connect through rdma_cm (the IB CM over QP1) and exchange over an RC QP, as perftest's
    /// -R (with --dev).
    #[arg(short = 'R', long = "rdma-cm", alias = "rdma_cm")]
    rdma_cm: bool,
    /// Reads/atomics this end accepts outstanding as responder and advertises to the peer, in
    /// the read and atomic tests (perftest's -o; default 16, at most the device's 128). The
    /// peer keeps no more than this in flight.
    #[arg(short = 'o', long = "outs")]
    outs: Option<u16>,
    /// Server (with --dev): answer N clients one after another on the same listener, then exit
    /// (0: until killed); each run prints what a one-client server prints. perftest's servers
    /// answer one.
    #[arg(long, default_value_t = 1, value_name = "N")]
    serve: u64,
    /// With --dev: the device's name for `rocemu stats`.
    #[command(flatten)]
    name: crate::datapath::NameArg,
    /// ECN, CNPs and the reaction point (in process: both ends alike).
    #[command(flatten)]
    cc: crate::datapath::CcArgs,
    /// Bandwidth tests: polling threads. Each device is split into this many shards by QPN,
    /// one per thread, the QPs dealt out round robin (-q at least N). In process, a frame for
    /// another thread's QP is steered to that thread; with --dev af_packet:IFACE each thread
    /// has a packet socket in one fanout group whose eBPF program hands each frame to the
    /// thread of its QP; with --dev af_xdp:IFACE each thread has the socket of a queue (the
    /// interface needs N), with --dev dpdk:'EAL ARGS' a queue of the port (e.g.
    /// net_af_packet's qpairs=N), and frames are steered to their QP's thread. Root; the peer
    /// may run any number of threads, or be perftest.
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
    /// With --threads: put each connection's server QP on the next thread's shard, so that
    /// every frame is for another thread and is steered there (what the steering costs; not
    /// with send).
    #[arg(long = "steer-every-frame")]
    steer_every_frame: bool,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if a.dev.is_none() && (a.server.is_some() || a.ip.is_some() || a.mac.is_some() || a.rdma_cm) {
        return Err(
            "SERVER, --ip, --mac and --rdma-cm go with --dev (af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'); \
                    without --dev both ends run in-process"
                .into(),
        );
    }
    let mtu = Mtu::from_bytes(a.mtu)
        .ok_or_else(|| format!("-m {}: the path MTU is 256, 512, 1024, 2048 or 4096", a.mtu))?;
    let wire_imp = a.imp.get()?;
    if a.qps == 0 || a.qps > 1 << 16 {
        return Err(format!("-q {}: between 1 and 65536 QPs", a.qps).into());
    }
    if a.tx_depth == 0 || a.tx_depth > 8192 {
        return Err(format!("-t {}: tx depth between 1 and 8192", a.tx_depth).into());
    }
    if a.cq_mod.is_some_and(|m| m == 0 || m > 1024) {
        return Err("-Q: CQ moderation between 1 and 1024".into());
    }
    if a.cmp_swap && a.test != TestArg::Atomic {
        return Err("--cmp-swap goes with the atomic test".into());
    }
    if a.outs.is_some_and(|n| n == 0 || n > 128) {
        return Err("-o: outstanding reads/atomics between 1 and 128".into());
    }
    if a.outs.is_some() && a.dev.is_none() {
        return Err("-o goes with --dev (in-process both ends accept 16)".into());
    }
    if a.qp_timeout > 31 {
        return Err("-u: timeout exponent 0…31".into());
    }
    // In process and on a datapath alike (a NaN or negative duration panicked in the timer).
    if let Some(d) = a.duration.filter(|d| !(*d > 0.0 && d.is_finite())) {
        return Err(format!("-D {d}: a duration in seconds, above 0").into());
    }
    let test = match a.test {
        TestArg::Write => Test::Write,
        TestArg::Read => Test::Read,
        TestArg::Send => Test::Send,
        TestArg::Atomic => Test::Atomic {
            cmp_swap: a.cmp_swap,
        },
    };
    let atomic = matches!(test, Test::Atomic { .. });
    let default_size = if a.lat { 2 } else { 65536 };
    let size = if atomic {
        8
    } else {
        a.size.unwrap_or(default_size)
    };
    if size > 1 << 31 {
        return Err("-s: at most 2^31 bytes".into());
    }
    if a.threads == 0 {
        return Err("--threads: at least 1".into());
    }
    if a.threads > 1 && (a.lat || a.rdma_cm || a.serve != 1) {
        return Err(
            "--threads N (N > 1) is for the bandwidth runs over perftest's TCP exchange: not with --lat, -R or --serve yet"
                .into(),
        );
    }
    if a.steer_every_frame && (a.threads < 2 || a.dev.is_some()) {
        return Err("--steer-every-frame goes with --threads N, N > 1, in process".into());
    }
    let iters = a.iters.unwrap_or(if a.lat { 1000 } else { 5000 });
    if let Some(dev) = &a.dev {
        return run_remote(a, dev, test, size, mtu);
    }
    let imp = Impairments {
        delay: Nanos::ZERO,
        reorder_delay: Nanos::from_micros(20),
        ..wire_imp
    };
    let sizes: Vec<usize> = if a.all && !atomic {
        (1..=23).map(|e| 1usize << e).collect()
    } else {
        vec![size]
    };
    let cc = a.cc.config(None)?;
    let mut reports: Vec<Report> = Vec::new();
    let rule = RULE;
    let cq_mod = perf::cq_moderation(a.cq_mod, size, a.tx_depth);
    print_header(
        test,
        a.lat,
        &if a.threads > 1 {
            format!("rocemu (in-process, {} engine threads)", a.threads)
        } else {
            "rocemu (in-process, one engine thread)".to_string()
        },
        (a.qps, a.tx_depth, cq_mod),
        mtu.bytes(),
    );
    if imp.loss + imp.reorder + imp.duplicate + imp.corrupt > 0.0 {
        println!(
            " Impairments    : loss {} reorder {} duplicate {} corrupt {} (seed {})",
            a.imp.loss,
            a.imp.reorder,
            a.imp.duplicate,
            a.imp.corrupt,
            a.imp.impair_seed()
        );
    }
    println!("{rule}");
    println!(
        "{}",
        if a.lat {
            perf::lat_header()
        } else {
            perf::bw_header(a.report_gbits)
        }
    );
    for s in sizes {
        let o = Opts {
            test,
            size: s,
            iters,
            duration: a.duration,
            qps: a.qps,
            mtu,
            tx_depth: a.tx_depth,
            cq_mod: perf::cq_moderation(a.cq_mod, s, a.tx_depth),
            verify: a.verify,
            lat: a.lat,
            imp,
            seed: a.imp.impair_seed(),
            qp_timeout: a.qp_timeout,
            cc: cc.clone(),
            threads: a.threads,
            b_shard_offset: usize::from(a.steer_every_frame),
        };
        let r = if a.lat {
            perf::run_lat(&o)?
        } else {
            perf::run_bw(&o)?
        };
        println!(
            "{}",
            if a.lat {
                perf::lat_line(&r)
            } else {
                perf::bw_line(&r, a.report_gbits)
            }
        );
        reports.push(r);
    }
    println!("{rule}");
    // Every run reports its errors, not only the first failing one.
    let ok = reports.iter().map(checked).filter(|ok| !ok).count() == 0;
    if let Some(r) = reports.last() {
        print_limit(r);
        if let Some(n) = r.steered {
            println!(
                " threads: {}; frames steered to another thread's shard: {n}{}",
                a.threads,
                if r.steer_dropped > 0 {
                    format!(" ({} dropped at a full ring)", r.steer_dropped)
                } else {
                    String::new()
                }
            );
        }
        if a.json {
            println!("{}", r.to_json());
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One end on a real datapath, facing a peer (RoCEmu or perftest) through perftest's exchange.
fn run_remote(
    a: &Args,
    dev: &str,
    test: Test,
    size: usize,
    mtu: Mtu,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let Some(ip) = &a.ip else {
        return Err("--dev needs --ip: this end's address".into());
    };
    if a.all {
        return Err("-a is not available with --dev yet: give -s (and -n or -D)".into());
    }
    if a.duration.is_some() {
        // perftest's -D on a datapath: the client posts for D seconds. A server of the WRITE,
        // READ and atomic tests waits for the client's end whichever way it runs; a SEND
        // server would have to receive by its own clock, and the latency tests count samples.
        if test == Test::Send || a.lat || a.rdma_cm || a.threads > 1 || a.serve != 1 {
            return Err("-D with --dev: the WRITE, READ and atomic bandwidth tests over perftest's TCP exchange, on one thread (not SEND, --lat, -R, --threads or --serve yet)".into());
        }
        if a.verify && matches!(test, Test::Atomic { .. }) {
            return Err("--verify of atomics counts the adds of -n: not with -D".into());
        }
    }
    if a.lat && a.qps != 1 {
        return Err("--lat runs on one QP (as perftest's latency tests)".into());
    }
    if a.lat && a.verify {
        return Err("--verify goes with the bandwidth tests".into());
    }
    if a.serve != 1 && (a.server.is_some() || a.rdma_cm) {
        return Err(
            "--serve goes on a server (no SERVER) of perftest's TCP exchange (no -R)".into(),
        );
    }
    if a.verify && a.server.is_none() {
        return Err("--verify goes on the client (it checks its results through the wire)".into());
    }
    // perftest's defaults: 5000 iterations for ib_write_bw, 1000 for the others.
    let iters = a.iters.unwrap_or(if test == Test::Write && !a.lat {
        5000
    } else {
        1000
    });
    let mut d = crate::datapath::open_sharded(
        dev,
        ip,
        a.mac.as_deref(),
        a.pcap.as_deref(),
        Some((a.imp.get()?, a.imp.impair_seed())),
        a.imp.seed,
        &a.name.get(),
        &a.cc,
        a.threads,
    )?;
    let tx_depth = a.tx_depth.min(iters as usize).max(1);
    let o = rocemu_tools::remote::PerfOpts {
        test,
        server: a.server.clone(),
        port: a.port,
        size,
        iters,
        duration: a.duration,
        qps: a.qps,
        mtu,
        tx_depth,
        cq_mod: perf::cq_moderation(a.cq_mod, size, tx_depth),
        verify: a.verify,
        qp_timeout: a.qp_timeout,
        lat: a.lat,
        rdma_cm: a.rdma_cm,
        out_reads: a.outs,
    };
    let port = d.ep.engine.port().name();
    // The interface's own drop counters before the run (AF_XDP and AF_PACKET share it with the
    // kernel, which drops what it cannot pass on without telling the socket: a veth whose peer
    // is behind drops on transmit after the AF_XDP socket handed the frame over).
    let iface0 = iface_drops(dev);
    if a.server.is_none() {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    if a.serve != 1 {
        let runs = (a.serve != 0).then_some(a.serve);
        let mut bad = 0u64;
        let failed = rocemu_tools::remote::perf_serve(&mut d.ep, &o, runs, |n, out| {
            let ok = match out {
                Ok(out) => print_outcome(a, test, &port, &o, out, &PortDrops::default()),
                Err(e) => {
                    eprintln!("rocemu perf: client {n}: {e}");
                    false
                }
            };
            bad += u64::from(!ok);
            // One line per client on stderr, for a supervisor to follow (stdout is the table).
            eprintln!("rocemu perf: served {n} clients, {bad} failed");
        });
        d.ep.engine.finish_recording()?;
        let failed = failed?;
        return Ok(if failed == 0 && bad == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if a.threads > 1 {
        let how = if port.starts_with("af_xdp:") || port.starts_with("dpdk:") {
            "a queue each, frames steered to their QP's thread"
        } else {
            "a packet socket each, in one fanout group"
        };
        println!(" rocemu: {} polling threads on {port} ({how})", a.threads);
        let pool = rocemu_tools::perf_shards::ShardPool::start(std::mem::take(&mut d.more));
        let out = rocemu_tools::perf_shards::perf(&mut d.ep, &pool, &o);
        let more = pool.stop();
        let mut ports = PortDrops::of(&d.ep.engine.port_stats(), iface0, dev);
        for ep in &more {
            let s = ep.engine.port_stats();
            ports.port.0 += s.rx_dropped;
            ports.port.1 += s.tx_dropped;
        }
        let out = out.map_err(|e| {
            let mut cs = vec![("thread 0: ".to_string(), d.ep.rnic.counters())];
            cs.extend(
                more.iter()
                    .enumerate()
                    .map(|(k, ep)| (format!("thread {}: ", k + 1), ep.rnic.counters())),
            );
            let cs: Vec<(&str, &rocemu_emulator::rnic::Counters)> =
                cs.iter().map(|(n, c)| (n.as_str(), c)).collect();
            rocemu_tools::explain(e, &cs)
        })?;
        return Ok(if print_outcome(a, test, &port, &o, &out, &ports) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let out = rocemu_tools::remote::perf(&mut d.ep, &o);
    d.ep.engine.finish_recording()?;
    let out = out.map_err(|e| rocemu_tools::explain(e, &[("", &d.ep.rnic.counters())]))?;
    let ports = PortDrops::of(&d.ep.engine.port_stats(), iface0, dev);
    if a.server.is_none() && out.report.as_ref().is_none_or(|r| r.counters.is_empty()) {
        // A server's bandwidth report is the client's, relayed as perftest relays it (and a
        // SEND server has none): its own device's counters that point at a problem say what
        // this end saw (stderr, as `checked` prints a report's own, which a latency server has).
        eprint!(
            "{}",
            rocemu_tools::failure_counters(&[("", &d.ep.rnic.counters())])
        );
    }
    Ok(if print_outcome(a, test, &port, &o, &out, &ports) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Prints one run of an end on a datapath as perftest does; true when it succeeded.
fn print_outcome(
    a: &Args,
    test: Test,
    port: &str,
    o: &rocemu_tools::remote::PerfOpts,
    out: &rocemu_tools::remote::PerfOutcome,
    ports: &PortDrops,
) -> bool {
    let rule = RULE;
    print_header(
        test,
        a.lat,
        &format!("rocemu on {port}"),
        (a.qps, o.tx_depth, o.cq_mod),
        out.mtu,
    );
    println!(" Peer version   : {}", out.peer_version);
    println!("{rule}");
    for l in &out.lines {
        println!("{l}");
    }
    let mut ok = true;
    if let Some(r) = &out.report {
        if a.lat {
            println!("{}", perf::lat_header());
            println!("{}", perf::lat_line(r));
        } else {
            println!("{}", perf::bw_header(a.report_gbits));
            println!("{}", perf::bw_line(r, a.report_gbits));
        }
        println!("{rule}");
        ok = checked(r);
        if a.server.is_some() && !a.lat {
            print_limit(r);
        }
        if let Some(l) = ports.line(port) {
            println!("{l}");
        }
        if a.json {
            println!("{}", r.to_json());
        }
    }
    ok
}

/// Prints a run's error completions and its verification; true when neither failed.
fn checked(r: &Report) -> bool {
    let mut ok = true;
    if r.errors > 0 {
        println!(
            " {} error completions; the first: {}",
            r.errors,
            r.first_error.as_deref().unwrap_or("?")
        );
        ok = false;
    }
    match r.verified {
        Some(true) => println!(" verify: every byte checked through the wire: ok"),
        Some(false) => {
            println!(" verify: FAILED: {}", r.verify_detail);
            ok = false;
        }
        None => {}
    }
    // Why, in the counters' words (stderr: stdout is perftest's table): the counters that
    // point at a problem, whether the run failed or went through with retransmissions (what
    // this end dropped or judged out of sequence says where the loss was); a clean run has
    // none.
    eprint!("{}", r.counters);
    ok
}

/// What a run's datapath dropped: the port's own counts since it opened (a full ring, the
/// kernel's drops of the socket, frames a driver refused after its retries), and the
/// interface's during the run ([`iface_drops`], for AF_XDP and AF_PACKET: the kernel's, of
/// every sender on it). `rocemu stats` names the port's while a run goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PortDrops {
    /// The port's: received, transmitted.
    port: (u64, u64),
    /// The interface's name and its drops during the run: received, transmitted.
    iface: Option<(String, u64, u64)>,
}

impl PortDrops {
    /// `s`, and the interface of datapath `dev` since `iface0` (its drops before the run).
    fn of(s: &PortStats, iface0: Option<(u64, u64)>, dev: &str) -> PortDrops {
        let iface = match (iface0, iface_drops(dev), kernel_iface(dev)) {
            (Some((r0, t0)), Some((r, t)), Some(name)) => {
                Some((name.to_string(), r.saturating_sub(r0), t.saturating_sub(t0)))
            }
            _ => None,
        };
        PortDrops {
            port: (s.rx_dropped, s.tx_dropped),
            iface,
        }
    }

    /// The line a run prints when anything was dropped (the first place to look when a run on
    /// a quiet link shows retransmissions); none when nothing was.
    fn line(&self, port: &str) -> Option<String> {
        let (rx, tx) = self.port;
        let (irx, itx) = self.iface.as_ref().map_or((0, 0), |&(_, r, t)| (r, t));
        if rx + tx + irx + itx == 0 {
            return None;
        }
        let mut l = format!(" port {port}: {rx} frames dropped on receive, {tx} on transmit");
        if let Some((name, _, _)) = &self.iface {
            l += &format!(
                "; interface {name}: {irx} dropped on receive, {itx} on transmit during the run (the kernel's count)"
            );
        }
        Some(l)
    }
}

fn print_limit(r: &Report) {
    println!(
        " limit (copy + 2 CRC passes + copy, one thread): {:.2} Gb/s; ratio to limit {:.3}; retransmits {} naks {} timeouts {}",
        r.limit_gbps,
        r.ratio_to_limit(),
        r.retransmits,
        r.naks,
        r.timeouts
    );
}

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// perftest's banner: the test, the device and the connection's settings.
fn print_header(test: Test, lat: bool, device: &str, queues: (usize, usize, usize), mtu: usize) {
    let (qps, tx_depth, cq_mod) = queues;
    let op = match test {
        Test::Write => "RDMA_Write",
        Test::Read => "RDMA_Read",
        Test::Send => "Send",
        Test::Atomic { cmp_swap: false } => "Atomic FETCH_AND_ADD",
        Test::Atomic { cmp_swap: true } => "Atomic CMP_AND_SWAP",
    };
    println!("{RULE}");
    println!(
        "                    {op} {} Test",
        if lat { "Latency" } else { "BW" }
    );
    println!(" Device         : {device}");
    println!(" Number of qps  : {qps}\t\tTransport type : IB");
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    println!(" TX depth       : {tx_depth}");
    if !lat {
        println!(" CQ Moderation  : {cq_mod}");
    }
    println!(" Mtu            : {mtu}[B]");
    println!(" Link type      : Ethernet (RoCEv2)");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that dropped nothing adds no line; one that did names the port, both counts and,
    /// for an interface the kernel shares, the interface's.
    #[test]
    fn a_run_names_what_its_datapath_dropped() {
        let mut d = PortDrops::default();
        assert_eq!(d.line("af_xdp:veth0"), None);
        d.port = (3, 0);
        assert_eq!(
            d.line("dpdk:net_memif0").as_deref(),
            Some(" port dpdk:net_memif0: 3 frames dropped on receive, 0 on transmit")
        );
        d = PortDrops {
            iface: Some(("veth0".into(), 0, 31)),
            ..PortDrops::default()
        };
        assert_eq!(
            d.line("af_xdp:veth0").as_deref(),
            Some(" port af_xdp:veth0: 0 frames dropped on receive, 0 on transmit; interface veth0: 0 dropped on receive, 31 on transmit during the run (the kernel's count)")
        );
        // No interface for DPDK; the loopback interface exists everywhere, its counters numbers.
        assert_eq!(iface_drops("dpdk:--vdev=net_memif0"), None);
        let lo = PortDrops::of(
            &PortStats::default(),
            iface_drops("af_packet:lo"),
            "af_packet:lo",
        );
        assert_eq!(lo.iface.as_ref().map(|i| i.0.as_str()), Some("lo"));
    }
}
