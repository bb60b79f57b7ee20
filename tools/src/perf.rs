//! The perf harness behind `rocemu perf`: perftest's bandwidth and latency benchmarks, run on
//! two RoCEmu RNICs in one process on one engine thread (the in-process datapath), with the
//! copy-and-CRC "limit" measured just before, so that figures are ratios taken in one run.
//!
//! The benchmarks themselves are the perftest engine's (`perftest.rs`), the same as on a
//! datapath ([`crate::remote`]); this file is their in-process end: the two RNICs and their
//! regions (`Bed`, `setup`), A as the engine's end whose datapath turn is `Bed::pump`, B's
//! SEND receiver as its peer's loop. The report, its JSON and perftest's table lines are the
//! engine's (`perftest/report.rs`), re-exported here.
pub use crate::perftest::report::{bw_header, bw_line, lat_header, lat_line, Report};
use crate::perftest::{
    self, BwPlan, BwQp, End, PingOp, PingPong, ReadBack, Receiver, RunShape, RxQp, Transport, Turn,
    WR_QP_SHIFT,
};
use rocemu_emulator::connect::{bring_up, ConnectOpts};
use rocemu_emulator::inproc::{pattern, Impairments, Link, IP_A, IP_B, MAC_A, MAC_B};
use rocemu_emulator::rnic::mr::MrInfo;
use rocemu_emulator::rnic::*;
use rocemu_emulator::steer::{frame_ring, FrameRx, FrameTx};
use rocemu_emulator::time::Nanos;
use rocemu_wire::{Psn, Qpn};
use std::time::{Duration, Instant};

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
    /// Both ends' congestion control.
    pub cc: rocemu_emulator::rnic::cc::CcConfig,
    /// Polling threads (`--threads`): each device is this many shards, one per thread, and
    /// the QPs are dealt out round robin ([`run_bw`]).
    pub threads: usize,
    /// Where B's QP of connection q goes: on the shard after A's by this many (0: the same
    /// index, as the round robin of two devices with the same thread count puts them). Not
    /// 0, every frame is for another thread's shard and is steered there: for the tests.
    pub b_shard_offset: usize,
}

/// The work a byte must cost at least, per the contract: for each MTU-sized chunk of `total`
/// payload bytes, a copy into a frame buffer, a CRC-32 pass over the frame (the sender's
/// ICRC), a second pass (the receiver's check) and a copy out. Returns Gbit/s of payload.
///
/// The fastest of [`LIMIT_PASSES`] passes over `total`: a limit is the best the machine does.
/// One pass of a few milliseconds, taken alone, read anywhere from 85 to 158 Gb/s on the same
/// VM within a minute (2026-12-07, Intel Xeon) while the runs it divided stayed within ±4 %, so
/// `ratio_to_limit` moved with the limit's noise and went above 1.
pub fn measure_limit(total: u64, mtu: usize) -> f64 {
    // At least 64 MiB so that the figure is not noise, at most the test's own total.
    let total = total.clamp(64 << 20, 1 << 30);
    let mut k = LimitKernel::new(mtu, mtu);
    let chunks = total.div_ceil(mtu as u64);
    let mut best = f64::MAX;
    let mut acc = 0u32;
    for _ in 0..LIMIT_PASSES {
        let t = Instant::now();
        for c in 0..chunks {
            acc ^= k.chunk(c as usize);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(acc);
    (chunks * mtu as u64) as f64 * 8.0 / best / 1e9
}

/// How many times [`measure_limit`] does the limit's work before it takes the fastest.
pub const LIMIT_PASSES: usize = 3;

/// The limit's buffers and its work on one chunk. The contract's limit copies from and to one
/// MTU of memory (`region` = `mtu`: it stays in L1); with a larger `region` the chunks walk it,
/// as a run's payload walks its message (`cargo bench -p rocemu-tools --bench limit` compares
/// the two).
///
/// Each buffer starts on a page, as a registered region does (perftest's buffers are
/// page-aligned; an owned region is mmap'd), so the copies' distances are fixed: +70 bytes in,
/// −70 out, modulo 4 KiB. Left to `malloc`, the three buffers landed where the copy out wrote
/// 10 bytes after its source modulo 4 KiB, and on AMD EPYC (Zen 3, FSRM) glibc's `memcpy` of 4
/// KiB (`rep movsb`) is 3.5× slower when the destination is 1–31 bytes past the source modulo 4
/// KiB: the limit measured 11–14 Gb/s instead of ~60, and `ratio_to_limit` read 3.3–4.3.
#[derive(Debug)]
pub struct LimitKernel {
    src: PageBuf,
    frame: PageBuf,
    dst: PageBuf,
    mtu: usize,
    /// Bytes of `src` and `dst` the chunks walk (a multiple of `mtu`).
    region: usize,
}

/// At least `len` bytes, in whole 4 KiB pages starting on a page boundary: the limit's
/// buffers, and the in-process bed's frame buffer (so that its payload copies' distances from a
/// region are the same from run to run; see [`LimitKernel`]).
#[derive(Debug)]
struct PageBuf(Vec<Page>);

#[derive(Debug, Clone, zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::Immutable)]
#[repr(C, align(4096))]
struct Page([u8; 4096]);

impl PageBuf {
    fn new(len: usize) -> PageBuf {
        PageBuf(vec![Page([0; 4096]); len.div_ceil(4096).max(1)])
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        zerocopy::IntoBytes::as_bytes(&self.0[..])
    }
}

impl std::ops::DerefMut for PageBuf {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        zerocopy::IntoBytes::as_mut_bytes(&mut self.0[..])
    }
}

/// Ethernet, IPv4, UDP, BTH and RETH: the headers before a WRITE's payload.
const LIMIT_HDR: usize = 14 + 20 + 8 + 12 + 16;

impl LimitKernel {
    pub fn new(mtu: usize, region: usize) -> LimitKernel {
        let region = region.max(mtu) / mtu * mtu;
        let mut src = PageBuf::new(region);
        for (i, b) in src.iter_mut().enumerate() {
            *b = i as u8;
        }
        LimitKernel {
            src,
            frame: PageBuf::new(mtu + LIMIT_HDR + 4),
            dst: PageBuf::new(region),
            mtu,
            region,
        }
    }

    /// Chunk `c` (of the region, cyclically): copy in, two CRC passes, copy out.
    #[inline]
    pub fn chunk(&mut self, c: usize) -> u32 {
        let (mtu, h) = (self.mtu, LIMIT_HDR);
        let frame = &mut self.frame[..mtu + h + 4];
        let o = c % (self.region / mtu) * mtu;
        frame[h..h + mtu].copy_from_slice(&self.src[o..o + mtu]);
        let mut acc = crc32fast::hash(frame);
        acc ^= crc32fast::hash(frame);
        self.dst[o..o + mtu].copy_from_slice(&frame[h..h + mtu]);
        frame[h] ^= self.dst[o + mtu / 2];
        acc
    }
}

/// One QP pair: A's QP (the client's) and B's (the server's), and their regions.
struct Conn {
    /// Which of the regions this QP's are (regions are shared beyond 64 MiB of them).
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
}

struct Bed {
    a: Rnic,
    b: Rnic,
    ab: Option<Link>,
    ba: Option<Link>,
    /// The frame between the two pipelines, on a page, as a NIC's buffer would be.
    buf: PageBuf,
    start: Instant,
    packets: u64,
    /// With several threads: this thread's shards are A's and B's shard `k`; frames for a QP
    /// of another shard go to that shard's thread.
    steer: Option<Steer>,
}

/// The steering of one thread's shards (`--threads`): a frame is handed to the shard whose
/// QP it names (`Rnic::shard_of_frame`, fixed offsets, as a NIC's flow steering) — this
/// thread's own at once, another's through a ring of fixed slots to that thread
/// (`rocemu_emulator::steer`: one copy, no lock, no allocation), whose turn takes it in.
struct Steer {
    k: usize,
    /// To each other thread (none to this one): frames for its A shard, for its B shard.
    to_a: Vec<Option<FrameTx>>,
    to_b: Vec<Option<FrameTx>>,
    /// From each other thread: frames for this thread's A shard, for its B shard.
    for_a: Vec<FrameRx>,
    for_b: Vec<FrameRx>,
    /// Frames this thread sent to another.
    steered: u64,
    /// Frames dropped because another thread's ring stayed full (RC retransmits them).
    dropped: u64,
}

/// Slots of a steering ring: more than the frames a run keeps in flight at perftest's depths.
const STEER_SLOTS: usize = 2048;
/// Bytes of a steering slot: a frame of a 4096-byte path MTU with every header.
const STEER_SLOT_BYTES: usize = 4096 + 256;
/// Tries at a full ring (taking this thread's own frames in between) before a frame is dropped.
const STEER_TRIES: u32 = 100_000;

impl Steer {
    /// Hands a frame from A (`to_b`) or B to another thread's `shard`. While that thread's
    /// ring is full, this thread takes in the frames others handed it (so two threads waiting
    /// on each other's rings both move on); a frame that still finds no room is dropped.
    fn send(
        &mut self,
        shard: usize,
        frame: &[u8],
        to_b: bool,
        ab: (&mut Rnic, &mut Rnic),
        now: Nanos,
    ) {
        let (a, b) = ab;
        for _ in 0..STEER_TRIES {
            let q = if to_b { &mut self.to_b } else { &mut self.to_a };
            let Some(tx) = q[shard].as_mut() else {
                break;
            };
            if tx.push(frame) {
                self.steered += 1;
                return;
            }
            self.take_in(a, b, now);
            std::hint::spin_loop();
        }
        self.dropped += 1;
    }

    /// Gives this thread's shards the frames other threads handed them.
    fn take_in(&mut self, a: &mut Rnic, b: &mut Rnic, now: Nanos) {
        for rx in &mut self.for_b {
            while rx.pop_with(|f| b.handle_frame_mut(now, f)).is_some() {}
        }
        for rx in &mut self.for_a {
            while rx.pop_with(|f| a.handle_frame_mut(now, f)).is_some() {}
        }
    }
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
            (None, None) if self.steer.is_none() => {
                // One engine thread, no wire in between: each frame goes straight from one
                // RNIC's transmit pipeline into the other's receive pipeline.
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf[..]) {
                    self.b.handle_frame_mut(now, &mut self.buf[..n]);
                    moved += 1;
                }
                while let Some(n) = self.b.poll_transmit(now, &mut self.buf[..]) {
                    self.a.handle_frame_mut(now, &mut self.buf[..n]);
                    moved += 1;
                }
            }
            (None, None) => {
                let Bed {
                    a, b, buf, steer, ..
                } = self;
                let st = steer.as_mut().expect("checked above");
                while let Some(n) = a.poll_transmit(now, buf) {
                    let f = &mut buf[..n];
                    let k = b.shard_of_frame(f);
                    if k == st.k {
                        b.handle_frame_mut(now, f);
                    } else {
                        st.send(k, f, true, (a, b), now);
                    }
                    moved += 1;
                }
                while let Some(n) = b.poll_transmit(now, buf) {
                    let f = &mut buf[..n];
                    let k = a.shard_of_frame(f);
                    if k == st.k {
                        a.handle_frame_mut(now, f);
                    } else {
                        st.send(k, f, false, (a, b), now);
                    }
                    moved += 1;
                }
                st.take_in(a, b, now);
            }
            (Some(ab), Some(ba)) => {
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf[..]) {
                    let mut f = ab.buffer();
                    f.extend_from_slice(&self.buf[..n]);
                    ab.send(now, f);
                    moved += 1;
                }
                while let Some(n) = self.b.poll_transmit(now, &mut self.buf[..]) {
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
/// Receive buffers per QP: receives are posted up to the ring depth but cycle over this many
/// buffers (every message of a QP carries the same pattern, checked as it completes), so that
/// the receive side works in cache as perftest's does.
const RX_BUFS: usize = 16;

fn setup(o: &Opts) -> Result<(Bed, Vec<Conn>), String> {
    let mut v = setup_shards(o, 1, 0, None, Vec::new())?;
    Ok(v.pop().expect("one shard"))
}

/// Both devices as `n` shards each (one thread's pair per shard), with the QP pairs dealt out
/// round robin: connection q's A QP on A's shard q mod n, its B QP on B's shard (q + `offset`)
/// mod n. Returns each shard's bed with the connections whose A QP it has, each with its
/// [`Steer`] from `steer` (one per shard built; none for one shard). `only`: build shard k
/// alone, with its connections (B's QPs on the same shard: `offset` a multiple of n) — on the
/// thread that will turn it, so that its memory is its own: shards built on one thread had
/// their hot structures side by side in the allocator's memory, and two threads writing
/// neighbouring cache lines ran at half speed. One shard is the single-threaded device, object
/// for object as it always was.
fn setup_shards(
    o: &Opts,
    n: usize,
    offset: usize,
    only: Option<usize>,
    mut steer: Vec<Steer>,
) -> Result<Vec<(Bed, Vec<Conn>)>, String> {
    assert!(only.is_none() || offset.is_multiple_of(n));
    let e = |e: VerbsError| e.to_string();
    let shards: Vec<usize> = match only {
        Some(k) => vec![k],
        None => (0..n).collect(),
    };
    // Shard k's place in the vectors below.
    let at = |k: usize| if only.is_some() { 0 } else { k };
    let mut a: Vec<Rnic> = Vec::with_capacity(n);
    let mut b: Vec<Rnic> = Vec::with_capacity(n);
    for &k in &shards {
        let shard = Shard {
            index: k as u32,
            count: n as u32,
        };
        let mut ca = RnicConfig::new(MAC_A, IP_A, o.seed.wrapping_mul(3) | 1);
        let mut cb = RnicConfig::new(MAC_B, IP_B, o.seed.wrapping_mul(5) | 2);
        ca.eth_mtu = 9000;
        cb.eth_mtu = 9000;
        ca.cc = o.cc.clone();
        cb.cc = o.cc.clone();
        ca.shard = shard;
        cb.shard = shard;
        let mut ra = Rnic::new(ca);
        let mut rb = Rnic::new(cb);
        ra.set_neighbor(IP_B, MAC_B);
        rb.set_neighbor(IP_A, MAC_A);
        a.push(ra);
        b.push(rb);
    }
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
    // Connections per shard (A's; B's shard k has as many, shifted by the offset).
    let per = |k: usize| (o.qps + n - 1 - k) / n;
    // As perftest does by default: one PD, one CQ and one MR per side (per shard) for all its
    // QPs. Each QP has its own region of the MR while they fit in 64 MiB; beyond that regions
    // are shared (their contents are per region, so verification still holds).
    // B's receive ring in a SEND test; in a latency test, where B sends from.
    let rx_ring = if o.test == Test::Send {
        msg * RX_BUFS
    } else if o.lat {
        msg
    } else {
        0
    };
    let ra = msg * 2 + 64;
    let rb = msg + 64 + rx_ring;
    let mut side = Vec::with_capacity(n);
    for (i, &k) in shards.iter().enumerate() {
        let qk = per(k).max(1);
        let pda = a[i].alloc_pd();
        let pdb = b[i].alloc_pd();
        let cq_depth = ((o.tx_depth + RX_DEPTH) * 2 * qk).min(1 << 20);
        let cqa = a[i].create_cq(cq_depth).map_err(e)?;
        let cqb = b[i].create_cq(cq_depth).map_err(e)?;
        let regions = qk.min(((64usize << 20) / ra.max(rb)).max(1));
        let mra = a[i].reg_mr(pda, ra * regions, Access::ALL).map_err(e)?;
        let mrb = b[i].reg_mr(pdb, rb * regions, Access::ALL).map_err(e)?;
        for r in 0..regions {
            a[i].mr_bytes_mut(mra.lkey).unwrap()[r * ra..r * ra + msg]
                .copy_from_slice(&pattern(1000 + r as u64, msg));
            b[i].mr_bytes_mut(mrb.lkey).unwrap()[r * rb..r * rb + msg]
                .copy_from_slice(&pattern(2000 + r as u64, msg));
            if matches!(o.test, Test::Atomic { .. }) {
                b[i].mr_bytes_mut(mrb.lkey).unwrap()[r * rb..r * rb + 8].fill(0);
            }
        }
        side.push((pda, pdb, cqa, cqb, mra, mrb, regions));
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
    let mut conns: Vec<Vec<Conn>> = shards.iter().map(|_| Vec::new()).collect();
    for q in 0..o.qps {
        let (ka, kb) = (q % n, (q + offset) % n);
        if only.is_some_and(|k| k != ka) {
            continue;
        }
        let (ka, kb) = (at(ka), at(kb));
        let (pda, _, cqa, _, mra, _, regions) = side[ka];
        let (_, pdb, _, cqb, _, mrb, _) = side[kb];
        let qa = a[ka].create_qp(pda, init(cqa)).map_err(e)?;
        let qb = b[kb].create_qp(pdb, init(cqb)).map_err(e)?;
        let psn_a = Psn::new(o.seed as u32 ^ (q as u32 * 7919));
        let psn_b = Psn::new((o.seed >> 24) as u32 ^ (q as u32 * 104_729));
        bring_up(&mut a[ka], qa, qb, IP_B, psn_a, psn_b, &opts).map_err(e)?;
        bring_up(&mut b[kb], qb, qa, IP_A, psn_b, psn_a, &opts).map_err(e)?;
        // The same region index on both sides: B's shard kb has the connections of A's shard
        // ka, in the same order.
        let r = (q / n) % regions;
        conns[ka].push(Conn {
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
        });
    }
    let impaired = !(o.imp.is_none() && o.imp.delay.0 == 0);
    let mut out = Vec::with_capacity(n);
    for ((a, b), c) in a.into_iter().zip(b).zip(conns) {
        let (ab, ba) = if impaired {
            (
                Some(Link::new(o.imp, o.seed ^ 0xab)),
                Some(Link::new(o.imp, o.seed ^ 0xba)),
            )
        } else {
            (None, None)
        };
        out.push((
            Bed {
                a,
                b,
                ab,
                ba,
                buf: PageBuf::new(10_000),
                start: Instant::now(),
                packets: 0,
                steer: if steer.is_empty() {
                    None
                } else {
                    Some(steer.remove(0))
                },
            },
            c,
        ));
    }
    Ok(out)
}

/// The rings between `n` threads' shards (none for one thread): thread k's [`Steer`].
fn steering(n: usize) -> Vec<Steer> {
    if n < 2 {
        return Vec::new();
    }
    // rings[i][j]: from thread i to thread j, for A's shards and for B's.
    let mut tx: Vec<Vec<[Option<FrameTx>; 2]>> = (0..n)
        .map(|_| (0..n).map(|_| [None, None]).collect())
        .collect();
    let mut rx: Vec<[Vec<FrameRx>; 2]> = (0..n).map(|_| [Vec::new(), Vec::new()]).collect();
    for (i, row) in tx.iter_mut().enumerate() {
        for (j, pair) in row.iter_mut().enumerate() {
            if i == j {
                continue;
            }
            for (side, slot) in pair.iter_mut().enumerate() {
                let (t, r) = frame_ring(STEER_SLOTS, STEER_SLOT_BYTES);
                *slot = Some(t);
                rx[j][side].push(r);
            }
        }
    }
    tx.into_iter()
        .zip(rx)
        .enumerate()
        .map(|(k, (row, [for_a, for_b]))| {
            let (to_a, to_b) = row.into_iter().map(|[x, y]| (x, y)).unzip();
            Steer {
                k,
                to_a,
                to_b,
                for_a,
                for_b,
                steered: 0,
                dropped: 0,
            }
        })
        .collect()
}

/// The in-process end: A, whose datapath turn is the whole bed's ([`Bed::pump`]), and B's
/// receiver in a SEND test (B's own loop, as a perftest server's).
struct InProcess<'a> {
    bed: &'a mut Bed,
    rx: Option<SendReceiver>,
    /// The QP whose state a stall reports.
    first_qa: Option<Qpn>,
}

impl End for InProcess<'_> {
    const PEAK_WINDOW: Duration = Duration::from_millis(10);
    const POLL_BATCH: usize = 1 << 16;
    const STOP_AT_FIRST_ERROR: bool = false;

    #[inline]
    fn rnic(&mut self) -> &mut Rnic {
        &mut self.bed.a
    }

    #[inline]
    fn progress(&mut self) -> usize {
        self.bed.pump() as usize
    }

    #[inline]
    fn idle(&mut self, _work: usize) {}

    #[inline]
    fn peer_turn(&mut self) -> Result<(), String> {
        match &mut self.rx {
            Some(rx) => rx.turn(&mut self.bed.b),
            None => Ok(()),
        }
    }

    fn describe_error(&mut self, w: &Wc) -> String {
        format!(
            "qp {} wr {}: {} ({:?}); A {}",
            w.qp_num,
            w.wr_id & ((1 << WR_QP_SHIFT) - 1),
            w.status.as_str(),
            w.status,
            self.bed.a.debug_qp(w.qp_num)
        )
    }

    fn stalled(&mut self, _completed: u64, _total: u64) -> String {
        crate::explain(
            format!(
                "no progress for 30 s: A {}",
                self.first_qa
                    .map(|q| self.bed.a.debug_qp(q))
                    .unwrap_or_default()
            ),
            &[("A", &self.bed.a.counters()), ("B", &self.bed.b.counters())],
        )
    }
}

/// B's loop in a SEND test: receives kept posted (up to the ring depth, cycling over
/// [`RX_BUFS`] buffers per QP so that the receive side works in cache as perftest's does) and,
/// with `--verify`, every message checked as it completes.
struct SendReceiver {
    rx: Receiver,
    verify: bool,
    size: usize,
    /// Each QP's region.
    index: Vec<usize>,
    /// The pattern each region's messages carry.
    expect: Vec<Vec<u8>>,
    /// Messages that arrived wrong.
    bad: u64,
}

impl SendReceiver {
    fn new(o: &Opts, conns: &[Conn]) -> SendReceiver {
        let msg = o.size.max(8);
        let regions = conns.iter().map(|c| c.index).max().unwrap_or(0) + 1;
        let qps = conns
            .iter()
            .map(|c| RxQp {
                qpn: c.qb,
                addr: c.mrb.addr + (msg + 64) as u64,
                off: c.offb + msg + 64,
                posted: 0,
                done: 0,
            })
            .collect();
        let ring = RX_DEPTH.min(o.tx_depth * 2).max(1) as u64;
        let (cq, lkey) = (conns[0].cqb, conns[0].mrb.lkey);
        SendReceiver {
            rx: Receiver::new(cq, lkey, ring, None, msg as u32, RX_BUFS as u64, qps),
            verify: o.verify,
            size: o.size,
            index: conns.iter().map(|c| c.index).collect(),
            expect: (0..regions)
                .map(|q| pattern(1000 + q as u64, msg))
                .collect(),
            bad: 0,
        }
    }

    #[inline]
    fn turn(&mut self, b: &mut Rnic) -> Result<(), String> {
        let SendReceiver {
            rx,
            verify,
            size,
            index,
            expect,
            bad,
        } = self;
        let (verify, size) = (*verify, *size);
        rx.turn(b, 1 << 16, |w, qi, off, mem| {
            if verify
                && (w.status != WcStatus::Success
                    || w.byte_len as usize != size
                    || mem[off..off + size] != expect[index[qi]][..size])
            {
                *bad += 1;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Bytes a message counts for: an atomic's 8, else the size.
fn msg_bytes(o: &Opts) -> u64 {
    if matches!(o.test, Test::Atomic { .. }) {
        8
    } else {
        o.size as u64
    }
}

/// The engine's view of a connection: A's QP, its buffer, and B's region.
fn bw_qp(o: &Opts, c: &Conn) -> BwQp {
    let local = Sge {
        addr: c.mra.addr,
        length: msg_bytes(o) as u32,
        lkey: c.mra.lkey,
    };
    BwQp::new(c.qa, local, c.mrb.addr, c.mrb.rkey)
}

fn bw_plan(o: &Opts, cq: CqId) -> BwPlan {
    BwPlan {
        test: o.test,
        iters: o.iters,
        duration: o.duration,
        tx_depth: o.tx_depth,
        cq_mod: o.cq_mod,
        cq,
        msg_bytes: msg_bytes(o),
        // B's targets start at 0: the chain i → i + 1 leaves the count of swaps.
        cas_chain: true,
    }
}

/// A bandwidth run.
pub fn run_bw(o: &Opts) -> Result<Report, String> {
    if o.threads > 1 {
        return run_bw_threads(o);
    }
    let (mut bed, conns) = setup(o)?;
    let msg_bytes = msg_bytes(o);
    let limit_gbps = measure_limit((msg_bytes * o.iters.min(1 << 20)).max(1), o.mtu.bytes());
    let run = run_on_bed(o, &mut bed, &conns)?;
    Ok(bw_report_of(o, limit_gbps, vec![run], None))
}

/// perftest's bandwidth loop over A's QPs of `conns` on `bed`, then `--verify`: what one
/// thread did, the only one or one of several. The transport's figures are taken before the
/// verification's read-back.
fn run_on_bed(o: &Opts, bed: &mut Bed, conns: &[Conn]) -> Result<ShardRun, String> {
    let mut qps: Vec<BwQp> = conns.iter().map(|c| bw_qp(o, c)).collect();
    bed.start = Instant::now();
    let mut end = InProcess {
        bed,
        rx: (o.test == Test::Send).then(|| SendReceiver::new(o, conns)),
        first_qa: conns.first().map(|c| c.qa),
    };
    let run = perftest::bandwidth(&mut end, &bw_plan(o, conns[0].cqa), &mut qps)?;
    let transport = Transport::both(
        end.bed.packets,
        &end.bed.a.counters(),
        &end.bed.b.counters(),
    );
    let verified = if o.verify {
        Some(verify(&mut end, o, conns, &qps, run.errors)?)
    } else {
        None
    };
    Ok(ShardRun {
        run,
        transport,
        verified,
        counters: both_counters(&end.bed.a, &end.bed.b),
        steered: 0,
        steer_dropped: 0,
    })
}

/// What one thread's shards did in a run of several threads.
struct ShardRun {
    run: perftest::BwRun,
    transport: Transport,
    verified: Option<(bool, String)>,
    counters: String,
    steered: u64,
    steer_dropped: u64,
}

/// Counts a thread out when it ends, whichever way (an error, a panic): the others serve its
/// peers' QPs on their shards until every thread is out.
struct Out<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A bandwidth run on `o.threads` threads: each device split into that many shards
/// ([`setup_shards`]), thread k turning both devices' shard k and running perftest's loop on
/// the QPs of A's shard k; the figures are the threads' together (messages and bytes summed,
/// the longest thread's time, the peaks summed). A thread that is done keeps turning its shards
/// until all are, since the others' frames may be for its QPs.
fn run_bw_threads(o: &Opts) -> Result<Report, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = o.threads;
    if n > MAX_SHARDS {
        return Err(format!("--threads {n}: at most {MAX_SHARDS}"));
    }
    if o.qps < n {
        return Err(format!(
            "--threads {n}: -q {} gives a thread no QP; give at least one QP per thread",
            o.qps
        ));
    }
    if !(o.imp.is_none() && o.imp.delay.0 == 0) {
        return Err(
            "--threads: the in-process impairments run on one thread; leave out --threads".into(),
        );
    }
    if o.test == Test::Send && !o.b_shard_offset.is_multiple_of(n) {
        return Err(
            "a SEND run's receivers are on the sender's thread: B's QPs on the same shard".into(),
        );
    }
    let msg_bytes = msg_bytes(o);
    let limit_gbps = measure_limit((msg_bytes * o.iters.min(1 << 20)).max(1), o.mtu.bytes());
    // Each thread builds its own shards where it can (B's QPs on A's shard): see
    // `setup_shards`. Otherwise this thread builds them all.
    let local = o.b_shard_offset.is_multiple_of(n);
    let mut built: Vec<Option<(Bed, Vec<Conn>)>> = if local {
        (0..n).map(|_| None).collect()
    } else {
        setup_shards(o, n, o.b_shard_offset, None, steering(n))?
            .into_iter()
            .map(Some)
            .collect()
    };
    let mut steers: Vec<Option<Steer>> = if local {
        steering(n).into_iter().map(Some).collect()
    } else {
        (0..n).map(|_| None).collect()
    };
    let ready = std::sync::Barrier::new(n);
    let out = AtomicUsize::new(0);
    let results: Vec<Result<ShardRun, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|k| {
                let (ready, out) = (&ready, &out);
                let (shard, steer) = (built[k].take(), steers[k].take());
                sc.spawn(move || -> Result<ShardRun, String> {
                    let leaving = Out(out);
                    // A CPU of its own, as an lcore (see `rocemu_emulator::cpu`).
                    let _ = rocemu_emulator::cpu::pin_to_nth_allowed(k);
                    let shard = match (shard, steer) {
                        (Some(s), _) => Ok(s),
                        (None, steer) => {
                            setup_shards(o, n, 0, Some(k), steer.into_iter().collect())
                                .map(|mut v| v.pop().expect("one shard"))
                        }
                    };
                    // Every thread reaches the start, whether its set-up worked or not.
                    ready.wait();
                    let (mut bed, conns) = shard?;
                    let result = run_on_bed(o, &mut bed, &conns);
                    drop(leaving);
                    while out.load(Ordering::SeqCst) < n {
                        bed.pump();
                    }
                    // Everything this thread's shards steered: the run, the verification's
                    // read-back and the frames of the other threads' runs served after its own.
                    result.map(|mut r| {
                        r.steered = bed.steer.as_ref().map_or(0, |s| s.steered);
                        r.steer_dropped = bed.steer.as_ref().map_or(0, |s| s.dropped);
                        r
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a polling thread panicked".into()))
            })
            .collect()
    });
    let mut runs = Vec::with_capacity(n);
    for r in results {
        runs.push(r?);
    }
    let steered = runs.iter().map(|r| r.steered).sum();
    let dropped = runs.iter().map(|r| r.steer_dropped).sum();
    let mut r = bw_report_of(o, limit_gbps, runs, Some(steered));
    r.steer_dropped = dropped;
    Ok(r)
}

/// The report of a run on one thread or several together: messages and bytes summed, the
/// longest thread's time, the peaks summed, the first error; with several threads each
/// thread's verification detail and counters say whose they are.
fn bw_report_of(o: &Opts, limit_gbps: f64, runs: Vec<ShardRun>, steered: Option<u64>) -> Report {
    let several = runs.len() > 1;
    let whose = |k: usize, s: &str| {
        if several {
            format!("thread {k}: {s}")
        } else {
            s.to_string()
        }
    };
    let mut run = perftest::BwRun::default();
    let mut t = Transport::default();
    let (mut ok, mut details, mut counters) = (true, Vec::new(), Vec::new());
    for (k, r) in runs.into_iter().enumerate() {
        run.seconds = run.seconds.max(r.run.seconds);
        run.messages += r.run.messages;
        run.errors += r.run.errors;
        run.peak_mbps += r.run.peak_mbps;
        if run.first_error.is_none() {
            run.first_error = r.run.first_error;
        }
        t.packets += r.transport.packets;
        t.retransmits += r.transport.retransmits;
        t.naks += r.transport.naks;
        t.rnr_naks += r.transport.rnr_naks;
        t.timeouts += r.transport.timeouts;
        if let Some((v, d)) = &r.verified {
            ok &= *v;
            if !d.is_empty() {
                details.push(whose(k, d));
            }
        }
        if !r.counters.is_empty() {
            counters.push(whose(k, &r.counters));
        }
    }
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: o.qps,
        mtu: o.mtu.bytes(),
        iters: run.messages / o.qps as u64,
        limit_gbps,
    };
    let mut r = perftest::bw_report(&shape, msg_bytes(o), run, t);
    if o.verify {
        r.verified = Some(ok);
        r.verify_detail = details.join("; ");
    }
    r.counters = counters.join("; ");
    r.steered = steered;
    r
}

/// [`crate::failure_counters`] of the two in-process RNICs.
fn both_counters(a: &Rnic, b: &Rnic) -> String {
    crate::failure_counters(&[("A", &a.counters()), ("B", &b.counters())])
}

/// `--verify`: checks results through the wire: what was written is read back, what was read
/// is compared with the server's bytes, every send was compared as it arrived, and every atomic
/// counter is read back and must equal the sum of its adds.
fn verify(
    end: &mut InProcess,
    o: &Opts,
    conns: &[Conn],
    qps: &[BwQp],
    errors: u64,
) -> Result<(bool, String), String> {
    if errors > 0 {
        return Ok((false, format!("{errors} error completions")));
    }
    let msg = o.size.max(8);
    let mut problems = Vec::new();
    match o.test {
        Test::Send => {
            let rx = end.rx.as_ref().expect("a SEND test has its receiver");
            if rx.bad > 0 {
                problems.push(format!("{} received messages differ", rx.bad));
            }
            let sent: u64 = qps.iter().map(|q| q.done).sum();
            let recvd: u64 = rx.rx.qps.iter().map(|q| q.done).sum();
            if sent != recvd {
                problems.push(format!("{sent} sent, {recvd} received"));
            }
        }
        Test::Write | Test::Atomic { .. } => {
            // Read the target back into the client's second buffer, through the wire.
            let n = if o.test == Test::Write { o.size } else { 8 };
            let mut reads = Vec::with_capacity(conns.len());
            for c in conns {
                end.bed.a.mr_bytes_mut(c.mra.lkey).unwrap()[c.offa + msg..c.offa + msg + n].fill(0);
                reads.push(ReadBack {
                    qpn: c.qa,
                    into: Sge {
                        addr: c.mra.addr + msg as u64,
                        length: n as u32,
                        lkey: c.mra.lkey,
                    },
                    remote_addr: c.mrb.addr,
                    rkey: c.mrb.rkey,
                });
            }
            let cq = conns[0].cqa;
            let Some(st) = perftest::read_back(end, cq, &reads, Duration::from_secs(60))? else {
                return Err("verification read-back did not complete in 60 s".into());
            };
            if st.iter().any(|s| *s != WcStatus::Success) {
                problems.push("read-back failed".to_string());
            }
            for (c, q) in conns.iter().zip(qps) {
                let got = &end.bed.a.mr_bytes(c.mra.lkey).unwrap()[c.offa + msg..c.offa + msg + n];
                if o.test == Test::Write {
                    let want = pattern(1000 + c.index as u64, msg);
                    if q.done > 0 && got[..] != want[..n] {
                        problems.push(format!("qp {}: written bytes differ", c.index));
                    }
                } else {
                    let v = u64::from_le_bytes(got[..8].try_into().unwrap());
                    // Fetch-add adds 1 per op; the compare-and-swap chain moves i → i+1.
                    if v != q.done {
                        problems.push(format!(
                            "qp {}: counter {v}, want {} (an atomic lost or applied twice)",
                            c.index, q.done
                        ));
                    }
                }
            }
        }
        Test::Read => {
            for (c, q) in conns.iter().zip(qps) {
                let want = pattern(2000 + c.index as u64, msg);
                let got = &end.bed.a.mr_bytes(c.mra.lkey).unwrap()[c.offa..c.offa + o.size];
                if q.done > 0 && got != &want[..o.size] {
                    problems.push(format!("qp {}: read bytes differ", c.index));
                }
            }
        }
    }
    Ok((problems.is_empty(), problems.join("; ")))
}

/// A latency run on one QP pair: send and write as perftest's ping-pongs (half the round
/// trip; A goes first and measures, B answers, both turned in this thread), read and atomic as
/// the time to their completion.
pub fn run_lat(o: &Opts) -> Result<Report, String> {
    let mut o1 = o.clone();
    o1.qps = 1;
    o1.tx_depth = 1;
    o1.lat = true;
    let (mut bed, conns) = setup(&o1)?;
    let msg_bytes = msg_bytes(o);
    let limit_gbps = measure_limit((msg_bytes * o.iters).max(1), o.mtu.bytes());
    let c = &conns[0];
    let iters = o.iters.max(1);
    let t0 = Instant::now();
    let mut errors = 0;
    let lat = match o.test {
        Test::Send | Test::Write => ping_pong(&mut bed, o, c, iters)?,
        Test::Read | Test::Atomic { .. } => {
            let mut end = InProcess {
                bed: &mut bed,
                rx: None,
                first_qa: Some(c.qa),
            };
            let (q, plan) = (bw_qp(&o1, c), bw_plan(&o1, c.cqa));
            let wr = |i| perftest::work_request(&plan, &q, i);
            let stall = "latency iteration did not complete in 30 s";
            let (lat, e, _) = perftest::one_at_a_time(&mut end, c.qa, c.cqa, iters, wr, stall)?;
            errors = e;
            lat
        }
    };
    let seconds = t0.elapsed().as_secs_f64();
    let shape = RunShape {
        test: o.test,
        size: o.size,
        qps: 1,
        mtu: o.mtu.bytes(),
        iters,
        limit_gbps,
    };
    let t = Transport::both(bed.packets, &bed.a.counters(), &bed.b.counters());
    let mut r = perftest::lat_report(&shape, msg_bytes, seconds, lat, t);
    r.errors = errors;
    r.verified = o.verify.then_some(errors == 0);
    r.counters = both_counters(&bed.a, &bed.b);
    Ok(r)
}

/// ib_write_lat / ib_send_lat with both ends in this thread: A sends first and measures, B
/// answers; each writes into (write) or receives into (send) the other's zeroed region.
fn ping_pong(bed: &mut Bed, o: &Opts, c: &Conn, iters: u64) -> Result<Vec<f64>, String> {
    let msg = o.size.max(8);
    // A write carries its counter in its last byte: at least one.
    let len = if o.test == Test::Write {
        o.size.max(1)
    } else {
        o.size
    } as u32;
    let sge = |mr: &MrInfo, off: usize| Sge {
        addr: mr.addr + off as u64,
        length: len,
        lkey: mr.lkey,
    };
    // A: sends from its buffer, receives into its read-back area. B: receives into its target,
    // sends from behind it.
    let (a_send, a_recv) = (sge(&c.mra, 0), sge(&c.mra, msg));
    let (b_recv, b_send) = (sge(&c.mrb, 0), sge(&c.mrb, msg + 64));
    bed.a.mr_bytes_mut(c.mra.lkey).unwrap()[c.offa + msg..c.offa + 2 * msg].fill(0);
    bed.b.mr_bytes_mut(c.mrb.lkey).unwrap()[c.offb..c.offb + msg].fill(0);
    let (op, first_send) = match o.test {
        Test::Write => (PingOp::Write, false),
        _ => (PingOp::Send, true),
    };
    let mut a = PingPong::new(
        op,
        c.qa,
        c.cqa,
        c.mra.addr - c.offa as u64,
        a_recv,
        a_send,
        (b_recv.addr, c.mrb.rkey),
        iters,
        true,
        true,
    );
    let mut b = PingPong::new(
        op,
        c.qb,
        c.cqb,
        c.mrb.addr - c.offb as u64,
        b_recv,
        b_send,
        (a_recv.addr, c.mra.rkey),
        iters,
        false,
        false,
    );
    if first_send {
        for _ in 0..2 {
            PingPong::post_recv(&mut bed.a, c.qa, a_recv)?;
            PingPong::post_recv(&mut bed.b, c.qb, b_recv)?;
        }
    }
    // A pump after each end's turn: what one end posted reaches the other before its turn.
    loop {
        let ta = a.turn(&mut bed.a)?;
        bed.pump();
        let tb = b.turn(&mut bed.b)?;
        if ta == Turn::Done && tb == Turn::Done {
            return Ok(a.lat);
        }
        bed.pump();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit's buffers start on pages (so its copies' distances modulo 4 KiB are the same
    /// on every run and machine: +70 in, −70 out), and a pass over the region moves every
    /// byte: the copy out lands where the copy in read.
    #[test]
    fn the_limit_copies_between_page_aligned_buffers() {
        let mut k = LimitKernel::new(1024, 4096);
        for b in [&k.src, &k.frame, &k.dst] {
            assert_eq!(b.as_ptr() as usize % 4096, 0);
        }
        assert!(k.frame.len() >= 1024 + LIMIT_HDR + 4);
        for c in 0..4 {
            k.chunk(c);
        }
        assert_eq!(k.region, 4096);
        assert!(
            k.src[..4096] == k.dst[..4096],
            "the copy out is the copy in"
        );
        assert!(k.src.iter().any(|&b| b != 0));
    }
}
