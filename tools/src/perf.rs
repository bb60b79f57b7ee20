//! The perf harness behind `rocemu perf`: perftest's bandwidth and latency benchmarks, run on
//! two RoCEmu RNICs in one process on one engine thread (the in-process datapath), with the
//! copy-and-CRC "limit" measured just before, so that figures are ratios taken in one run.
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{pattern, Impairments, Link, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::time::Nanos;
use rocemu_wire::{Psn, Qpn};
use serde_json::{json, Value};
use std::time::Instant;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    Write,
    Read,
    Send,
    /// Fetch-and-add, or compare-and-swap.
    Atomic {
        cmp_swap: bool,
    },
}

impl Test {
    pub fn name(self) -> &'static str {
        match self {
            Test::Write => "write",
            Test::Read => "read",
            Test::Send => "send",
            Test::Atomic { .. } => "atomic",
        }
    }
}

/// perftest's CQ moderation: one work request in `cq_mod` is signaled (100 unless asked; none
/// for messages above 8 KiB unless asked, as perftest, where the completions cost nothing next to
/// the transfer), never more than the send queue holds.
pub fn cq_moderation(requested: Option<usize>, size: usize, tx_depth: usize) -> usize {
    let m = match requested {
        Some(m) => m,
        None if size > 8192 => 1,
        None => 100,
    };
    m.clamp(1, tx_depth.max(1))
}

/// Whether work request `i` (0-based) of `iters` asks for a completion: every `cq_mod`-th, and
/// the last (perftest's rule).
pub fn signaled(i: u64, cq_mod: usize, iters: u64) -> bool {
    i % cq_mod as u64 == cq_mod as u64 - 1 || i + 1 == iters
}

/// The work requests a completion of work request `i` (0-based) covers, given `done` of them
/// completed already: completions come in order per QP, so it covers every unsignaled one before
/// it. Counts them into `done` and out of `outstanding`, and returns how many.
pub fn cover(i: u64, done: &mut u64, outstanding: &mut usize) -> u64 {
    let n = (i + 1).saturating_sub(*done);
    *done += n;
    *outstanding = outstanding.saturating_sub(n as usize);
    n
}

/// What to run (perftest's flags).
#[derive(Debug, Clone)]
pub struct Opts {
    pub test: Test,
    pub size: usize,
    pub iters: u64,
    pub duration: Option<f64>,
    pub qps: usize,
    pub mtu: Mtu,
    pub tx_depth: usize,
    /// A completion every this many work requests (perftest's CQ moderation, -Q).
    pub cq_mod: usize,
    pub verify: bool,
    pub lat: bool,
    pub imp: Impairments,
    pub seed: u64,
    /// Local ACK timeout exponent (perftest -u).
    pub qp_timeout: u8,
}

/// One run's figures (the contract's JSON keys).
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub test: &'static str,
    pub size: usize,
    pub iters: u64,
    pub qps: usize,
    pub mtu: usize,
    pub seconds: f64,
    pub bytes: u64,
    pub messages: u64,
    pub packets: u64,
    pub gbps: f64,
    pub mpps: f64,
    pub retransmits: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub timeouts: u64,
    pub verified: Option<bool>,
    pub verify_detail: String,
    pub errors: u64,
    /// The first error completion, described.
    pub first_error: Option<String>,
    pub limit_gbps: f64,
    pub bw_peak_mbps: f64,
    /// Latencies in microseconds, sorted.
    pub lat_us: Vec<f64>,
}

impl Report {
    pub fn ratio_to_limit(&self) -> f64 {
        if self.limit_gbps > 0.0 {
            self.gbps / self.limit_gbps
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "test": self.test,
            "size": self.size,
            "iters": self.iters,
            "qps": self.qps,
            "mtu": self.mtu,
            "seconds": self.seconds,
            "bytes": self.bytes,
            "messages": self.messages,
            "packets": self.packets,
            "gbps": self.gbps,
            "mpps": self.mpps,
            "retransmits": self.retransmits,
            "naks": self.naks,
            "rnr_naks": self.rnr_naks,
            "timeouts": self.timeouts,
            "verified": self.verified,
            "errors": self.errors,
            "limit_gbps": self.limit_gbps,
            "ratio_to_limit": self.ratio_to_limit(),
        });
        if !self.lat_us.is_empty() {
            v["lat_us"] = json!({
                "min": self.lat_us[0],
                "p50": pct(&self.lat_us, 0.50),
                "p99": pct(&self.lat_us, 0.99),
                "p999": pct(&self.lat_us, 0.999),
                "max": self.lat_us[self.lat_us.len() - 1],
                "avg": self.lat_us.iter().sum::<f64>() / self.lat_us.len() as f64,
            });
        }
        v
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The work a byte must cost at least, per the contract: for each MTU-sized chunk of `total`
/// payload bytes, a copy into a frame buffer, a CRC-32 pass over the frame (the sender's
/// ICRC), a second pass (the receiver's check) and a copy out. Returns Gbit/s of payload.
pub fn measure_limit(total: u64, mtu: usize) -> f64 {
    let hdr = 14 + 20 + 8 + 12 + 16;
    let src: Vec<u8> = (0..mtu).map(|i| i as u8).collect();
    let mut frame = vec![0u8; mtu + hdr + 4];
    let mut dst = vec![0u8; mtu];
    // At least 64 MiB so that the figure is not noise, at most the test's own total.
    let total = total.clamp(64 << 20, 1 << 30);
    let chunks = total.div_ceil(mtu as u64);
    let t = Instant::now();
    let mut acc = 0u32;
    for _ in 0..chunks {
        frame[hdr..hdr + mtu].copy_from_slice(&src);
        acc ^= crc32fast::hash(&frame);
        acc ^= crc32fast::hash(&frame);
        dst.copy_from_slice(&frame[hdr..hdr + mtu]);
        frame[hdr] ^= dst[mtu / 2];
    }
    std::hint::black_box(acc);
    let secs = t.elapsed().as_secs_f64();
    (chunks * mtu as u64) as f64 * 8.0 / secs / 1e9
}

struct Conn {
    /// Position in the connection list; carried in the top bits of every wr_id so that a
    /// completion finds its connection without a lookup.
    pos: usize,
    index: usize,
    qa: Qpn,
    qb: Qpn,
    cqa: CqId,
    cqb: CqId,
    /// Client: source / destination buffer, then a read-back area.
    mra: MrInfo,
    /// Server: target / source buffer, receive ring.
    mrb: MrInfo,
    /// Byte offsets of this QP's regions in the shared MRs.
    offa: usize,
    offb: usize,
    posted: u64,
    done: u64,
    outstanding: usize,
    rx_posted: u64,
    rx_done: u64,
}

struct Bed {
    a: Rnic,
    b: Rnic,
    ab: Option<Link>,
    ba: Option<Link>,
    buf: Vec<u8>,
    start: Instant,
    packets: u64,
}

impl Bed {
    fn now(&self) -> Nanos {
        Nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// Moves every frame both sides have, and serves due timers. Returns frames moved.
    fn pump(&mut self) -> u64 {
        let now = self.now();
        let mut moved = 0;
        match (&mut self.ab, &mut self.ba) {
            (None, None) => {
                // One engine thread, no wire in between: each frame goes straight from one
                // RNIC's transmit pipeline into the other's receive pipeline.
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf) {
                    self.b.handle_frame_mut(now, &mut self.buf[..n]);
                    moved += 1;
                }
                while let Some(n) = self.b.poll_transmit(now, &mut self.buf) {
                    self.a.handle_frame_mut(now, &mut self.buf[..n]);
                    moved += 1;
                }
            }
            (Some(ab), Some(ba)) => {
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf) {
                    let mut f = ab.buffer();
                    f.extend_from_slice(&self.buf[..n]);
                    ab.send(now, f);
                    moved += 1;
                }
                while let Some(n) = self.b.poll_transmit(now, &mut self.buf) {
                    let mut f = ba.buffer();
                    f.extend_from_slice(&self.buf[..n]);
                    ba.send(now, f);
                    moved += 1;
                }
                while let Some(mut f) = ab.recv(now) {
                    self.b.handle_frame_mut(now, &mut f);
                    ab.recycle(f);
                }
                while let Some(mut f) = ba.recv(now) {
                    self.a.handle_frame_mut(now, &mut f);
                    ba.recycle(f);
                }
            }
            _ => unreachable!("both directions or neither"),
        }
        if self.a.poll_timeout().is_some_and(|t| t <= now) {
            self.a.handle_timeout(now);
        }
        if self.b.poll_timeout().is_some_and(|t| t <= now) {
            self.b.handle_timeout(now);
        }
        self.packets += moved;
        moved
    }
}

const RX_DEPTH: usize = 512;
/// wr_id = connection position << POS_SHIFT | iteration.
const POS_SHIFT: u32 = 40;
/// Receive buffers per QP: receives are posted up to the ring depth but cycle over this many
/// buffers (every message of a QP carries the same pattern, checked as it completes), so that
/// the receive side works in cache as perftest's does.
const RX_BUFS: usize = 16;

fn setup(o: &Opts) -> Result<(Bed, Vec<Conn>), String> {
    let mut ca = RnicConfig::new(MAC_A, IP_A, o.seed.wrapping_mul(3) | 1);
    let mut cb = RnicConfig::new(MAC_B, IP_B, o.seed.wrapping_mul(5) | 2);
    ca.eth_mtu = 9000;
    cb.eth_mtu = 9000;
    let mut a = Rnic::new(ca);
    let mut b = Rnic::new(cb);
    a.set_neighbor(IP_B, MAC_B);
    b.set_neighbor(IP_A, MAC_A);
    let e = |e: VerbsError| e.to_string();
    let opts = ConnectOpts {
        mtu: o.mtu,
        timeout: o.qp_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        // Both ends alike: 16 reads in flight, 16 responder resources to answer them.
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        ..ConnectOpts::default()
    };
    let msg = o.size.max(8);
    let mut conns = Vec::new();
    // As perftest does by default: one PD, one CQ and one MR per side for all QPs. Each QP has
    // its own region of the MR while they fit in 64 MiB; beyond that regions are shared (their
    // contents are per region, so verification still holds).
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    let cq_depth = ((o.tx_depth + RX_DEPTH) * 2 * o.qps).min(1 << 20);
    let cqa = a.create_cq(cq_depth).map_err(e)?;
    let cqb = b.create_cq(cq_depth).map_err(e)?;
    let rx_ring = if o.test == Test::Send {
        msg * RX_BUFS
    } else {
        0
    };
    let ra = msg * 2 + 64;
    let rb = msg + 64 + rx_ring;
    let regions = o.qps.min(((64usize << 20) / ra.max(rb)).max(1));
    let mra = a.reg_mr(pda, ra * regions, Access::ALL).map_err(e)?;
    let mrb = b.reg_mr(pdb, rb * regions, Access::ALL).map_err(e)?;
    for r in 0..regions {
        a.mr_bytes_mut(mra.lkey).unwrap()[r * ra..r * ra + msg]
            .copy_from_slice(&pattern(1000 + r as u64, msg));
        b.mr_bytes_mut(mrb.lkey).unwrap()[r * rb..r * rb + msg]
            .copy_from_slice(&pattern(2000 + r as u64, msg));
        if matches!(o.test, Test::Atomic { .. }) {
            b.mr_bytes_mut(mrb.lkey).unwrap()[r * rb..r * rb + 8].fill(0);
        }
    }
    let cap = QpCap {
        max_send_wr: o.tx_depth as u32 + 2,
        max_recv_wr: RX_DEPTH as u32 + 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = |cq| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        // perftest's: completions as the work requests ask (CQ moderation).
        sq_sig_all: false,
    };
    for q in 0..o.qps {
        let qa = a.create_qp(pda, init(cqa)).map_err(e)?;
        let qb = b.create_qp(pdb, init(cqb)).map_err(e)?;
        let psn_a = Psn::new(o.seed as u32 ^ (q as u32 * 7919));
        let psn_b = Psn::new((o.seed >> 24) as u32 ^ (q as u32 * 104_729));
        bring_up(&mut a, qa, qb, IP_B, psn_a, psn_b, &opts).map_err(e)?;
        bring_up(&mut b, qb, qa, IP_A, psn_b, psn_a, &opts).map_err(e)?;
        let r = q % regions;
        conns.push(Conn {
            pos: q,
            index: r,
            qa,
            qb,
            cqa,
            cqb,
            mra: MrInfo {
                addr: mra.addr + (r * ra) as u64,
                ..mra
            },
            mrb: MrInfo {
                addr: mrb.addr + (r * rb) as u64,
                ..mrb
            },
            offa: r * ra,
            offb: r * rb,
            posted: 0,
            done: 0,
            outstanding: 0,
            rx_posted: 0,
            rx_done: 0,
        });
    }
    let (ab, ba) = if o.imp.is_none() && o.imp.delay.0 == 0 {
        (None, None)
    } else {
        (
            Some(Link::new(o.imp, o.seed ^ 0xab)),
            Some(Link::new(o.imp, o.seed ^ 0xba)),
        )
    };
    Ok((
        Bed {
            a,
            b,
            ab,
            ba,
            buf: vec![0u8; 10_000],
            start: Instant::now(),
            packets: 0,
        },
        conns,
    ))
}

fn wr_for(o: &Opts, c: &Conn, i: u64) -> SendWr {
    let n = if matches!(o.test, Test::Atomic { .. }) {
        8
    } else {
        o.size
    };
    let local = Sge {
        addr: c.mra.addr,
        length: n as u32,
        lkey: c.mra.lkey,
    };
    let op = match o.test {
        Test::Write => WrOpcode::RdmaWrite {
            remote_addr: c.mrb.addr,
            rkey: c.mrb.rkey,
        },
        Test::Read => WrOpcode::RdmaRead {
            remote_addr: c.mrb.addr,
            rkey: c.mrb.rkey,
        },
        Test::Send => WrOpcode::Send,
        Test::Atomic { cmp_swap: false } => WrOpcode::AtomicFetchAdd {
            remote_addr: c.mrb.addr,
            rkey: c.mrb.rkey,
            add: 1,
        },
        Test::Atomic { cmp_swap: true } => WrOpcode::AtomicCmpSwap {
            remote_addr: c.mrb.addr,
            rkey: c.mrb.rkey,
            compare: i,
            swap: i + 1,
        },
    };
    SendWr::new(i, op, [local])
}

fn post_recvs(bed: &mut Bed, o: &Opts, c: &mut Conn) {
    let msg = o.size.max(8);
    let ring = RX_DEPTH.min(o.tx_depth * 2).max(1);
    while c.rx_posted - c.rx_done < ring as u64 {
        let slot = (c.rx_posted % RX_BUFS as u64) as usize;
        let sge = Sge {
            addr: c.mrb.addr + (msg + 64 + slot * msg) as u64,
            length: msg as u32,
            lkey: c.mrb.lkey,
        };
        if bed
            .b
            .post_recv(
                c.qb,
                RecvWr {
                    wr_id: (c.pos as u64) << POS_SHIFT | c.rx_posted,
                    sg_list: vec![sge],
                },
            )
            .is_err()
        {
            break;
        }
        c.rx_posted += 1;
    }
}

/// A bandwidth run.
pub fn run_bw(o: &Opts) -> Result<Report, String> {
    let (mut bed, mut conns) = setup(o)?;
    let total_iters = if o.duration.is_some() {
        u64::MAX
    } else {
        o.iters
    };
    let msg_bytes = if matches!(o.test, Test::Atomic { .. }) {
        8
    } else {
        o.size as u64
    };
    let limit_gbps = measure_limit((msg_bytes * o.iters.min(1 << 20)).max(1), o.mtu.bytes());
    let mut wcs = Vec::with_capacity(4096);
    let mut errors = 0u64;
    let mut first_error: Option<String> = None;
    let mut send_bad = 0u64;
    let regions = conns.iter().map(|c| c.index).max().unwrap_or(0) + 1;
    let expect_send: Vec<Vec<u8>> = (0..regions)
        .map(|q| pattern(1000 + q as u64, o.size.max(8)))
        .collect();
    let (cqa, cqb) = (conns[0].cqa, conns[0].cqb);
    bed.start = Instant::now();
    let t0 = Instant::now();
    let deadline = o
        .duration
        .map(|d| t0 + std::time::Duration::from_secs_f64(d));
    let mut last_progress = Instant::now();
    let mut peak = 0.0f64;
    let mut window_t = Instant::now();
    let mut window_done = 0u64;
    let mut stopped_posting = false;
    loop {
        let mut all_done = true;
        let now_i = Instant::now();
        if let Some(d) = deadline {
            if now_i >= d {
                stopped_posting = true;
            }
        }
        for c in conns.iter_mut() {
            if o.test == Test::Send {
                post_recvs(&mut bed, o, c);
            }
            while !stopped_posting && c.outstanding < o.tx_depth && c.posted < total_iters {
                let mut w = wr_for(o, c, c.posted);
                w.wr_id |= (c.pos as u64) << POS_SHIFT;
                if !signaled(c.posted, o.cq_mod, total_iters) {
                    w.flags = SendFlags::default();
                }
                if bed.a.post_send(c.qa, w).is_err() {
                    break;
                }
                c.posted += 1;
                c.outstanding += 1;
            }
        }
        bed.pump();
        // One CQ per side for every QP: completions name their QP.
        wcs.clear();
        crate::poll_wcs(&mut bed.a, cqa, 1 << 16, &mut wcs)?;
        for w in &wcs {
            if w.status != WcStatus::Success {
                errors += 1;
                if first_error.is_none() {
                    first_error = Some(format!(
                        "qp {} wr {}: {} ({:?}); A {}",
                        w.qp_num,
                        w.wr_id & ((1 << POS_SHIFT) - 1),
                        w.status.as_str(),
                        w.status,
                        bed.a.debug_qp(w.qp_num)
                    ));
                }
            }
            if let Some(c) = conns.get_mut((w.wr_id >> POS_SHIFT) as usize) {
                cover(
                    w.wr_id & ((1 << POS_SHIFT) - 1),
                    &mut c.done,
                    &mut c.outstanding,
                );
            }
        }
        if o.test == Test::Send {
            wcs.clear();
            crate::poll_wcs(&mut bed.b, cqb, 1 << 16, &mut wcs)?;
            let msg = o.size.max(8);
            let mem = bed.b.mr_bytes(conns[0].mrb.lkey).unwrap();
            for w in &wcs {
                let Some(c) = conns.get_mut((w.wr_id >> POS_SHIFT) as usize) else {
                    continue;
                };
                c.rx_done += 1;
                if o.verify {
                    let slot = ((w.wr_id & ((1 << POS_SHIFT) - 1)) % RX_BUFS as u64) as usize;
                    let off = c.offb + msg + 64 + slot * msg;
                    if w.status != WcStatus::Success
                        || w.byte_len as usize != o.size
                        || mem[off..off + o.size] != expect_send[c.index][..o.size]
                    {
                        send_bad += 1;
                    }
                }
            }
        }
        // A timed run has no last work request to signal: the ones posted after the last
        // signaled one never show a completion, and are not counted.
        let unseen = |c: &Conn| {
            if o.duration.is_some() {
                (c.posted % o.cq_mod as u64) as usize
            } else {
                0
            }
        };
        for c in conns.iter() {
            if c.outstanding > unseen(c) || (!stopped_posting && c.posted < total_iters) {
                all_done = false;
                break;
            }
        }
        let done: u64 = conns.iter().map(|c| c.done).sum();
        if done != window_done {
            last_progress = Instant::now();
            let dt = window_t.elapsed().as_secs_f64();
            if dt > 0.01 {
                peak = peak.max((done - window_done) as f64 * msg_bytes as f64 / dt / 1e6);
                window_t = Instant::now();
                window_done = done;
            }
        }
        if all_done {
            break;
        }
        if errors > 0 && conns.iter().all(|c| c.outstanding == 0) {
            break;
        }
        if last_progress.elapsed().as_secs_f64() > 30.0 {
            return Err(format!(
                "no progress for 30 s: A {:?} {}",
                bed.a.counters(),
                conns
                    .first()
                    .map(|c| bed.a.debug_qp(c.qa))
                    .unwrap_or_default()
            ));
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let messages: u64 = conns.iter().map(|c| c.done).sum();
    let bytes = messages * msg_bytes;
    let ca = bed.a.counters();
    let cb = bed.b.counters();
    let mut r = Report {
        test: o.test.name(),
        size: o.size,
        iters: messages / o.qps as u64,
        qps: o.qps,
        mtu: o.mtu.bytes(),
        seconds,
        bytes,
        messages,
        packets: bed.packets,
        gbps: bytes as f64 * 8.0 / seconds / 1e9,
        mpps: messages as f64 / seconds / 1e6,
        retransmits: ca.retransmits + cb.retransmits,
        naks: ca.naks_received + cb.naks_received,
        rnr_naks: ca.rnr_naks_received + cb.rnr_naks_received,
        timeouts: ca.local_ack_timeouts + cb.local_ack_timeouts,
        verified: None,
        verify_detail: String::new(),
        errors,
        first_error,
        limit_gbps,
        bw_peak_mbps: peak.max(bytes as f64 / seconds / 1e6),
        lat_us: Vec::new(),
    };
    if o.verify {
        let (ok, detail) = verify(&mut bed, o, &mut conns, send_bad, errors)?;
        r.verified = Some(ok);
        r.verify_detail = detail;
    }
    Ok(r)
}

/// Drives until every connection's client CQ has `want` more completions (or fails).
fn wait_client(bed: &mut Bed, conns: &mut [Conn], want: u64) -> Result<u64, String> {
    let t = Instant::now();
    let mut errors = 0;
    let mut got = 0u64;
    let mut wcs = Vec::new();
    let need = want * conns.len() as u64;
    let cq = conns[0].cqa;
    while got < need {
        bed.pump();
        wcs.clear();
        crate::poll_wcs(&mut bed.a, cq, 1 << 16, &mut wcs)?;
        got += wcs.len() as u64;
        errors += wcs.iter().filter(|w| w.status != WcStatus::Success).count() as u64;
        if t.elapsed().as_secs_f64() > 60.0 {
            return Err("verification read-back did not complete in 60 s".into());
        }
    }
    Ok(errors)
}

/// `--verify`: checks results through the wire: what was written is read back, what was read
/// is compared with the server's bytes, every send was compared as it arrived, and every atomic
/// counter is read back and must equal the sum of its adds.
fn verify(
    bed: &mut Bed,
    o: &Opts,
    conns: &mut [Conn],
    send_bad: u64,
    errors: u64,
) -> Result<(bool, String), String> {
    if errors > 0 {
        return Ok((false, format!("{errors} error completions")));
    }
    let msg = o.size.max(8);
    let mut problems = Vec::new();
    match o.test {
        Test::Send => {
            if send_bad > 0 {
                problems.push(format!("{send_bad} received messages differ"));
            }
            let sent: u64 = conns.iter().map(|c| c.done).sum();
            let recvd: u64 = conns.iter().map(|c| c.rx_done).sum();
            if sent != recvd {
                problems.push(format!("{sent} sent, {recvd} received"));
            }
        }
        Test::Write | Test::Atomic { .. } => {
            // Read the target back into the client's second buffer, through the wire.
            let n = if o.test == Test::Write { o.size } else { 8 };
            for c in conns.iter() {
                bed.a.mr_bytes_mut(c.mra.lkey).unwrap()[c.offa + msg..c.offa + msg + n].fill(0);
                let local = Sge {
                    addr: c.mra.addr + msg as u64,
                    length: n as u32,
                    lkey: c.mra.lkey,
                };
                let w = SendWr::new(
                    u64::MAX,
                    WrOpcode::RdmaRead {
                        remote_addr: c.mrb.addr,
                        rkey: c.mrb.rkey,
                    },
                    vec![local],
                );
                bed.a.post_send(c.qa, w).map_err(|e| e.to_string())?;
            }
            let errs = wait_client(bed, conns, 1)?;
            if errs > 0 {
                problems.push("read-back failed".to_string());
            }
            for c in conns.iter() {
                let got =
                    bed.a.mr_bytes(c.mra.lkey).unwrap()[c.offa + msg..c.offa + msg + n].to_vec();
                if o.test == Test::Write {
                    let want = pattern(1000 + c.index as u64, msg);
                    if c.done > 0 && got[..] != want[..n] {
                        problems.push(format!("qp {}: written bytes differ", c.index));
                    }
                } else {
                    let v = u64::from_le_bytes(got[..8].try_into().unwrap());
                    // Fetch-add adds 1 per op; the compare-and-swap chain moves i → i+1.
                    if v != c.done {
                        problems.push(format!(
                            "qp {}: counter {v}, want {} (an atomic lost or applied twice)",
                            c.index, c.done
                        ));
                    }
                }
            }
        }
        Test::Read => {
            for c in conns.iter() {
                let want = pattern(2000 + c.index as u64, msg);
                let got = &bed.a.mr_bytes(c.mra.lkey).unwrap()[c.offa..c.offa + o.size];
                if c.done > 0 && got != &want[..o.size] {
                    problems.push(format!("qp {}: read bytes differ", c.index));
                }
            }
        }
    }
    Ok((problems.is_empty(), problems.join("; ")))
}

/// A latency run: send and write ping-pong (half the round trip, as perftest reports), read
/// and atomic as the time to their completion.
pub fn run_lat(o: &Opts) -> Result<Report, String> {
    let mut o1 = o.clone();
    o1.qps = 1;
    o1.tx_depth = 1;
    let (mut bed, mut conns) = setup(&o1)?;
    let msg_bytes = if matches!(o.test, Test::Atomic { .. }) {
        8
    } else {
        o.size as u64
    };
    let limit_gbps = measure_limit((msg_bytes * o.iters).max(1), o.mtu.bytes());
    let c = &mut conns[0];
    let mut lat = Vec::with_capacity(o.iters as usize);
    let mut wcs = Vec::with_capacity(8);
    let iters = o.iters.max(1);
    let t0 = Instant::now();
    let mut errors = 0;
    let msg = o.size.max(8);
    for i in 0..iters {
        let t = Instant::now();
        match o.test {
            Test::Send => {
                // A → B, then B → A: a full round trip.
                for from_a in [true, false] {
                    let (tx, rx) = if from_a {
                        (&mut bed.a, &mut bed.b)
                    } else {
                        (&mut bed.b, &mut bed.a)
                    };
                    let (tq, rq, tmr, rmr) = if from_a {
                        (c.qa, c.qb, c.mra, c.mrb)
                    } else {
                        (c.qb, c.qa, c.mrb, c.mra)
                    };
                    let rsge = Sge {
                        addr: rmr.addr + msg as u64,
                        length: msg as u32,
                        lkey: rmr.lkey,
                    };
                    rx.post_recv(
                        rq,
                        RecvWr {
                            wr_id: i,
                            sg_list: vec![rsge],
                        },
                    )
                    .map_err(|e| e.to_string())?;
                    let mut w = SendWr::new(
                        i,
                        WrOpcode::Send,
                        vec![Sge {
                            addr: tmr.addr,
                            length: o.size as u32,
                            lkey: tmr.lkey,
                        }],
                    );
                    w.flags = SendFlags::SIGNALED;
                    tx.post_send(tq, w).map_err(|e| e.to_string())?;
                    let rcq = if from_a { c.cqb } else { c.cqa };
                    loop {
                        bed.pump();
                        wcs.clear();
                        let r = if from_a { &mut bed.b } else { &mut bed.a };
                        crate::poll_wcs(r, rcq, 8, &mut wcs)?;
                        // the receive completion (send completions on the same CQ are skipped)
                        if let Some(w) = wcs.iter().find(|w| w.opcode == WcOpcode::Recv) {
                            errors += (w.status != WcStatus::Success) as u64;
                            break;
                        }
                        errors +=
                            wcs.iter().filter(|w| w.status != WcStatus::Success).count() as u64;
                        if t.elapsed().as_secs_f64() > 30.0 {
                            return Err("latency iteration did not complete in 30 s".into());
                        }
                    }
                }
                // drain send completions
                bed.a.poll_cq(c.cqa, 8);
                bed.b.poll_cq(c.cqb, 8);
                lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            _ => {
                let w = wr_for(&o1, c, i);
                bed.a.post_send(c.qa, w).map_err(|e| e.to_string())?;
                loop {
                    bed.pump();
                    wcs.clear();
                    crate::poll_wcs(&mut bed.a, c.cqa, 8, &mut wcs)?;
                    if !wcs.is_empty() {
                        errors +=
                            wcs.iter().filter(|w| w.status != WcStatus::Success).count() as u64;
                        break;
                    }
                    if t.elapsed().as_secs_f64() > 30.0 {
                        return Err("latency iteration did not complete in 30 s".into());
                    }
                }
                let us = t.elapsed().as_secs_f64() * 1e6;
                // A write is a round trip (request, ACK): report half, as perftest's ping-pong.
                lat.push(if o.test == Test::Write { us / 2.0 } else { us });
                c.done += 1;
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    let ca = bed.a.counters();
    let cb = bed.b.counters();
    Ok(Report {
        test: o.test.name(),
        size: o.size,
        iters,
        qps: 1,
        mtu: o.mtu.bytes(),
        seconds,
        bytes: msg_bytes * iters,
        messages: iters,
        packets: bed.packets,
        gbps: (msg_bytes * iters) as f64 * 8.0 / seconds / 1e9,
        mpps: iters as f64 / seconds / 1e6,
        retransmits: ca.retransmits + cb.retransmits,
        naks: ca.naks_received + cb.naks_received,
        rnr_naks: ca.rnr_naks_received + cb.rnr_naks_received,
        timeouts: ca.local_ack_timeouts + cb.local_ack_timeouts,
        verified: if o.verify { Some(errors == 0) } else { None },
        verify_detail: String::new(),
        errors,
        first_error: None,
        limit_gbps,
        bw_peak_mbps: 0.0,
        lat_us: lat,
    })
}

/// perftest's bandwidth table lines.
pub fn bw_header(gbits: bool) -> String {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    format!(" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]")
}

pub fn bw_line(r: &Report, gbits: bool) -> String {
    let avg = r.bytes as f64 / r.seconds;
    let (peak, avg) = if gbits {
        (r.bw_peak_mbps * 8.0 / 1e3, avg * 8.0 / 1e9)
    } else {
        (r.bw_peak_mbps, avg / 1e6)
    };
    format!(
        " {:<10} {:<10}       {:<16.2}   {:<16.2}     {:.6}",
        r.size, r.iters, peak, avg, r.mpps
    )
}

pub fn lat_header() -> String {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ".to_string()
}

pub fn lat_line(r: &Report) -> String {
    let l = &r.lat_us;
    let avg = l.iter().sum::<f64>() / l.len() as f64;
    let var = l.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / l.len() as f64;
    format!(
        " {:<7} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}      {:<10.2}      {:<10.2}             {:<10.2}",
        r.size,
        r.iters,
        l[0],
        l[l.len() - 1],
        pct(l, 0.5),
        avg,
        var.sqrt(),
        pct(l, 0.99),
        pct(l, 0.999)
    )
}
