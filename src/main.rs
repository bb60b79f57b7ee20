//! `rocemu`: the command-line face of RoCEmu. Subcommands follow `../shared/contracts.md`.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod agent;
mod analyze;
mod conformance;
mod datapath;
mod decode;
mod demo;
mod exec;
mod forge_cm;
mod perf;
mod pingpong;
mod rping;
mod sim;
mod stats;

#[derive(Parser, Debug)]
#[command(name = "rocemu", version, about = "RoCEmu: a software RoCEv2 NIC")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve the conformance agent protocol (JSON lines) for a RoCEmu RNIC on --dev.
    Agent(agent::Args),
    /// Reconstruct each QP's conversation from a capture: messages, retransmissions and their
    /// triggers, NAKs, RNR waits, CNPs, latencies, the CM set-up; findings in words.
    Analyze(analyze::Args),
    /// Run the conformance scenarios against RoCEmu (--target self) or an agent; write reports.
    Conformance(conformance::Args),
    /// Describe every frame of a capture (pcap or pcapng), one line or one JSON object each.
    Decode(decode::Args),
    /// Two RoCEmu RNICs in one process: every verb, then RC over a lossy wire; checks every
    /// byte and completion and prints a table. Exit status 0 only when everything verified.
    Demo(demo::Args),
    /// Run an unmodified ibverbs program on RoCEmu's drop-in libibverbs.so.1, on --dev.
    /// Exit status: the program's; 125 when RoCEmu could not start, 127 when it is not found.
    Exec(exec::Args),
    /// Hidden, for hostile-peer tests: forged CM REQs, DREQs and REJs from made-up sources.
    #[command(hide = true)]
    ForgeCm(forge_cm::Args),
    /// perftest's benchmarks (write, read, send, atomic) on RoCEmu.
    Perf(perf::Args),
    /// ibv_rc_pingpong on RoCEmu: same flags and TCP exchange, on --dev (af_packet, af_xdp or dpdk).
    Pingpong(pingpong::Args),
    /// librdmacm's rping on RoCEmu: connects through the IB CM (rdma_cm), on --dev.
    Rping(rping::Args),
    /// The fabric simulator: real RoCEmu RNICs at every host of a simulated fabric (switches
    /// with ECN and PFC), in virtual time, deterministic from --seed.
    Sim(sim::Args),
    /// The running RoCEmu devices, and one's counters (rdma statistic's names), per QP, as
    /// rates, JSON or Prometheus (also served on HTTP with --listen).
    Stats(stats::Args),
    /// Linux rdma_rxe peers in QEMU VMs on a private bridge: up, down, exec, status, build.
    #[command(disable_help_flag = true)]
    Rxevm {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Lets a command that writes its results to stdout end quietly, as other command-line tools do,
/// when the reader goes away (`rocemu decode big.pcap | head`): Rust ignores SIGPIPE, and every
/// `println!` after that would panic. Not for the commands that talk over sockets (`agent`,
/// `conformance`, `stats --listen`): a peer closing its Unix socket must be an error they handle, not their death.
fn default_sigpipe() {
    // SAFETY: `signal` with SIG_DFL only resets one signal's disposition; it runs first thing in
    // `main`, before any thread of ours exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // `rocemu exec`'s own usage errors are 125, as `env`'s: its other statuses are PROGRAM's.
        Err(e) if e.use_stderr() && std::env::args().nth(1).as_deref() == Some("exec") => {
            let _ = e.print();
            return ExitCode::from(exec::EXIT_CANNOT_START);
        }
        Err(e) => e.exit(),
    };
    let serves = match &cli.cmd {
        Cmd::Agent(_) | Cmd::Conformance(_) => true,
        Cmd::Stats(a) => a.serves(),
        _ => false,
    };
    if !serves {
        default_sigpipe();
    }
    // Logs on stderr when ROCEMU_LOG or RUST_LOG asks for them (README, "Logs"); none otherwise.
    rocemu_emulator::logs::init_from_env();
    let r = match cli.cmd {
        Cmd::Agent(a) => agent::run(&a),
        Cmd::Analyze(a) => analyze::run(&a),
        Cmd::Conformance(a) => conformance::run(&a),
        Cmd::Decode(a) => decode::run(&a),
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Exec(a) => exec::run(&a),
        Cmd::ForgeCm(a) => forge_cm::run(&a),
        Cmd::Perf(a) => perf::run(&a),
        Cmd::Pingpong(a) => pingpong::run(&a),
        Cmd::Rping(a) => rping::run(&a),
        Cmd::Sim(a) => sim::run(&a),
        Cmd::Stats(a) => stats::run(&a),
        Cmd::Rxevm { args } => rocemu_testbed::rxevm::cli(&args)
            .map(|c| ExitCode::from(c.clamp(0, 255) as u8))
            .map_err(Into::into),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rocemu: {e}");
            ExitCode::from(2)
        }
    }
}
