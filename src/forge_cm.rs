//! `rocemu forge-cm` (hidden): a hostile peer's CM traffic for tests — forged REQs, DREQs and
//! REJs from made-up source addresses, valid RoCEv2 UD SENDs to the target's QP1
//! ([`rocemu_tools::forge_cm::flood`]), written through a packet socket in `sendmmsg` bursts.
//! Used by `scripts/hostile-cm-test`; keeps no state and reads nothing back. This file parses
//! the arguments and prints the summary line.
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::Port;
use rocemu_tools::forge_cm::{flood, Flood};
use rocemu_wire::eth::Mac;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The interface to send on.
    #[arg(long)]
    iface: String,
    /// The target's IP address.
    #[arg(long)]
    to: IpAddr,
    /// The target's MAC address.
    #[arg(long)]
    to_mac: Mac,
    /// The rdma_cm port the REQs ask for.
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// REQs to send, each from its own source address and comm id.
    #[arg(long, default_value_t = 100_000)]
    reqs: u32,
    /// DREQs to send (for connections the target does not have).
    #[arg(long, default_value_t = 1000)]
    dreqs: u32,
    /// REJs to send (for connections the target does not have).
    #[arg(long, default_value_t = 1000)]
    rejs: u32,
    /// Varies the source addresses and ids between runs.
    #[arg(long, default_value_t = 1)]
    seed: u32,
    /// Frames per second at most (0: as fast as the socket takes them).
    #[arg(long, default_value_t = 0)]
    pps: u64,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut port = AfPacketPort::open(&a.iface, &AfPacketOptions::default())
        .map_err(|e| format!("{}: {e}", a.iface))?;
    let f = Flood {
        to: a.to,
        to_mac: a.to_mac,
        port: a.port,
        reqs: a.reqs,
        dreqs: a.dreqs,
        rejs: a.rejs,
        seed: a.seed,
        pps: a.pps,
    };
    let t = Instant::now();
    flood(&mut port, &f).map_err(|e| format!("{}: {e}", a.iface))?;
    let s = port.stats();
    println!(
        "forged {} REQs, {} DREQs, {} REJs to {} in {:.2} s ({} frames sent, {} tx errors)",
        a.reqs,
        a.dreqs,
        a.rejs,
        a.to,
        t.elapsed().as_secs_f64(),
        s.tx_frames,
        s.tx_dropped
    );
    Ok(ExitCode::SUCCESS)
}
