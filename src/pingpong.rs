//! `rocemu pingpong` (contract: shared/contracts.md): `ibv_rc_pingpong`, on RoCEmu.
use crate::datapath;
use rocemu_emulator::rnic::Mtu;
use rocemu_tools::pingpong::{self, ImmOp, PingpongOpts};
use std::process::ExitCode;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Rc,
    Uc,
    Ud,
}

/// What carries the immediate with --imm.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// SEND with immediate.
    Send,
    /// RDMA WRITE with immediate (rc and uc).
    Write,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The server's address; without it this end is the server.
    server: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Accepted for compatibility (the device is --dev).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Accepted for compatibility (RoCEmu has one port).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u32,
    /// Message size (4096; 2048 for UD, as the real tools).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Path MTU.
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: usize,
    /// Receives posted at once.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: usize,
    /// Iterations.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Service level (accepted; RoCEv2 carries no SL).
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Completion events instead of polling (accepted: RoCEmu polls).
    #[arg(short = 'e', long)]
    events: bool,
    /// GID index (accepted: RoCEmu's GID is --ip).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<i32>,
    /// Validate the received buffer (the client sends 0 at each page start).
    #[arg(short = 'c', long)]
    chk: bool,
    /// Transport: rc (ibv_rc_pingpong), uc (ibv_uc_pingpong) or ud (ibv_ud_pingpong).
    #[arg(long, value_enum, default_value_t = Transport::Rc)]
    transport: Transport,
    /// Every message carries an immediate that the receiver checks, with its completion's
    /// flags, opcode, length and payload: the peer is testbed/rxevm/imm_pingpong.c (in the rxe
    /// guest) or another `rocemu pingpong --imm`, not the rdma-core tools.
    #[arg(long, conflicts_with = "chk")]
    imm: bool,
    /// With --imm: what carries it (write adds an rkey:vaddr message to the TCP exchange).
    #[arg(long, value_enum, requires = "imm")]
    op: Option<Op>,
    /// Connect through rdma_cm (the IB CM over QP1, port -p of its TCP port space) instead of
    /// the TCP exchange: RC, against another `rocemu pingpong --rdma-cm`.
    #[arg(short = 'R', long = "rdma-cm")]
    rdma_cm: bool,
    #[command(flatten)]
    end: datapath::EndArgs,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mtu = Mtu::from_bytes(a.mtu)
        .ok_or_else(|| format!("-m {}: the path MTU is 256, 512, 1024, 2048 or 4096", a.mtu))?;
    let size = a.size.unwrap_or(if a.transport == Transport::Ud {
        2048
    } else {
        4096
    });
    if size == 0 || size > 1 << 30 {
        return Err(format!("-s {size}: between 1 byte and 1 GiB").into());
    }
    if a.rx_depth < 2 || a.rx_depth > 16384 {
        return Err(format!("-r {}: between 2 and 16384", a.rx_depth).into());
    }
    if a.iters == 0 {
        return Err("-n 0: at least one iteration".into());
    }
    let imm = match (a.imm, a.op) {
        (false, _) => None,
        (true, None | Some(Op::Send)) => Some(ImmOp::Send),
        (true, Some(Op::Write)) if a.transport == Transport::Ud => {
            return Err("--op write needs a connected QP: --transport rc or uc".into())
        }
        (true, Some(Op::Write)) => Some(ImmOp::Write),
    };
    let mut d = a.end.open()?;
    let o = PingpongOpts {
        server: a.server.clone(),
        port: a.port,
        size,
        iters: a.iters,
        mtu,
        rx_depth: a.rx_depth,
        check: a.chk,
        transport: match a.transport {
            Transport::Rc => rocemu_emulator::rnic::QpType::Rc,
            Transport::Uc => rocemu_emulator::rnic::QpType::Uc,
            Transport::Ud => rocemu_emulator::rnic::QpType::Ud,
        },
        imm,
        rdma_cm: a.rdma_cm,
    };
    let r = pingpong::pingpong(&mut d.ep, &o);
    d.ep.engine.finish_recording()?;
    // A failure ends with the counters that explain it (rx_drop_wrong_src: a wrong GID index).
    let r = r.map_err(|e| rocemu_tools::explain(e, &[("", &d.ep.rnic.counters())]))?;
    for l in r.lines() {
        println!("{l}");
    }
    let c = d.ep.rnic.counters();
    if c.retransmitted_pkts > 0 || !a.end.imp.get()?.is_none() {
        println!(
            "retransmitted {} packets, {} NAKs received, {} local ACK timeouts",
            c.retransmitted_pkts,
            c.nak_rcvd(),
            c.local_ack_timeout_err
        );
    }
    Ok(ExitCode::SUCCESS)
}
