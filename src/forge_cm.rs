//! `rocemu forge-cm` (hidden): a hostile peer's CM traffic for tests — forged REQs, DREQs and
//! REJs from made-up source addresses, valid RoCEv2 UD SENDs to the target's QP1
//! ([`rocemu_testbed::forge_cm`]), written through a packet socket in `sendmmsg` bursts. Used
//! by `scripts/hostile-cm-test`; keeps no state and reads nothing back.
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::{Port, BURST};
use rocemu_testbed::forge_cm::{frame, mad, source, Forged};
use rocemu_wire::eth::Mac;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
    // A locally administered source MAC of no one's.
    let src_mac = Mac([0x02, 0x66, 0x6f, 0x72, 0x67, 0x65]);
    let v6 = a.to.is_ipv6();
    let total = u64::from(a.reqs) + u64::from(a.dreqs) + u64::from(a.rejs);
    let kind = |i: u64| {
        if i < u64::from(a.reqs) {
            Forged::Req { port: a.port }
        } else if i < u64::from(a.reqs) + u64::from(a.dreqs) {
            Forged::Dreq
        } else {
            Forged::Rej
        }
    };
    let t = Instant::now();
    let (mut next, mut sent, mut stalls) = (0u64, 0u64, 0u32);
    while sent < total {
        if let Some(due) = (sent * 1_000_000_000).checked_div(a.pps) {
            let el = t.elapsed().as_nanos() as u64;
            if el < due {
                std::thread::sleep(Duration::from_nanos((due - el).min(1_000_000)));
                continue;
            }
        }
        let n = port.tx_burst(BURST, &mut |buf| {
            if next >= total {
                return None;
            }
            let i = next as u32;
            let src = source(i, a.seed, v6);
            let id = i.wrapping_mul(2_654_435_761) ^ a.seed | 1;
            let f = frame(
                src_mac,
                src,
                a.to_mac,
                a.to,
                &mad(kind(next), src, a.to, id, u64::from(id)),
            );
            buf.get_mut(..f.len())?.copy_from_slice(&f);
            next += 1;
            Some(f.len())
        });
        port.flush();
        sent = next;
        if n == 0 {
            stalls += 1;
            if stalls > 10_000 {
                return Err(format!("{}: the socket takes no more frames", a.iface).into());
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }
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
