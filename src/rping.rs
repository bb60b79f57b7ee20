//! `rocemu rping`: librdmacm's `rping` on RoCEmu (connection through the IB CM over QP1).
use crate::datapath;
use rocemu_tools::rping::{self, RpingOpts};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Server: wait for a client.
    #[arg(short = 's', conflicts_with = "client")]
    server: bool,
    /// Client: connect to -a.
    #[arg(short = 'c')]
    client: bool,
    /// Client: the server's address (server: accepted, RoCEmu listens on --ip).
    #[arg(short = 'a')]
    addr: Option<String>,
    /// rdma_cm port (TCP port space).
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Iterations (0: as rping, forever; here at most 2^32).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Buffer size.
    #[arg(short = 'S', default_value_t = 64)]
    size: usize,
    /// Print the data of each iteration.
    #[arg(short = 'v')]
    verbose: bool,
    /// Client: check that the data came back unchanged.
    #[arg(short = 'V')]
    validate: bool,
    /// Accepted (debug output).
    #[arg(short = 'd')]
    debug: bool,
    #[command(flatten)]
    end: datapath::EndArgs,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if a.server == a.client {
        return Err("give -s (server) or -c (client)".into());
    }
    let server = if a.client {
        let s = a.addr.as_deref().ok_or("-c needs -a SERVER")?;
        Some(
            s.parse()
                .map_err(|_| format!("-a {s}: not an IP address"))?,
        )
    } else {
        None
    };
    let mut d = a.end.open()?;
    let o = RpingOpts {
        server,
        port: a.port,
        count: if a.count == 0 {
            u32::MAX as u64
        } else {
            a.count
        },
        size: a.size,
        verbose: a.verbose,
        validate: a.validate,
    };
    let (r, report) = rping::rping_counted(&mut d.ep, &o);
    d.ep.engine.finish_recording()?;
    // The server says what peers cost it (refused, expired, dropped), also when it fails.
    if a.server {
        eprintln!("{}", report.line);
    }
    // A failure ends with the counters that explain it (rx_drop_wrong_src: a wrong GID index).
    let r = r.map_err(|e| rocemu_tools::explain(e, &[("", &d.ep.rnic.counters())]))?;
    for l in r {
        println!("{l}");
    }
    let c = d.ep.rnic.counters();
    if !a.end.imp.get()?.is_none() {
        println!(
            "retransmitted {} packets, {} NAKs received, {} local ACK timeouts",
            c.retransmitted_pkts,
            c.nak_rcvd(),
            c.local_ack_timeout_err
        );
    }
    Ok(ExitCode::SUCCESS)
}
