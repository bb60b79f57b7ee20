//! One end of a benchmark or a pingpong on a real datapath: an [`Endpoint`] (an RNIC and the
//! engine that binds it to a port) facing a peer process, and perftest's end on it: its options
//! ([`PerfOpts`]), its entry points ([`perf`], [`perf_serve`]) and the exchange around the run,
//! over TCP ([`crate::oob`]) or, with `-R`, an rdma_cm QP ([`crate::perftest_cm`]), both through
//! the `Exchange` carrier. The work the end does on its RNIC (resources, QPs, connect, the
//! runs, `--verify`) is in `perf_end.rs`; `ibv_rc_pingpong`'s end is [`crate::pingpong`].
//!
//! The engine must keep turning while the out-of-band exchange waits on TCP: the peer resolves
//! our MAC while it moves its QPs to RTR, and a passive server's RNIC answers the client's
//! traffic while its TCP side waits for the end of the run. So the exchange runs on a thread of
//! its own and hands the work that touches the RNIC to the engine's thread as jobs
//! ([`Ctl::run`]); the engine's thread turns the engine between jobs ([`serve`]). A DPDK port
//! is thus only ever polled from the thread that opened it.
use crate::oob::{
    self, BwReport, OobConfig, PerftestConn, PerftestDest, PerftestTest, PerftestXchg, SysData,
};
use crate::perf::Report;
use crate::perf_end::{
    destroy_qps, dests, perf_connect, perf_qps, perf_resources, post_server_recvs,
    run_client_verified, run_lat, serve_send, PerfResources, PerfSetup, RX_DEPTH,
};
use rocemu_emulator::engine::Engine;
use rocemu_emulator::rnic::*;
use rocemu_wire::Psn;
use std::net::{IpAddr, Ipv6Addr, TcpListener};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An RNIC bound to a port.
#[derive(Debug)]
pub struct Endpoint {
    pub rnic: Rnic,
    pub engine: Engine,
}

pub(crate) type Job = Box<dyn FnOnce(&mut Endpoint) + Send>;

/// The out-of-band thread's handle on the engine's thread.
#[derive(Debug, Clone)]
pub struct Ctl {
    tx: mpsc::Sender<Job>,
}

impl Ctl {
    /// Runs `f` on the engine's thread and returns its result.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce(&mut Endpoint) -> R + Send + 'static) -> R {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move |ep| {
            let _ = rtx.send(f(ep));
        });
        self.tx
            .send(job)
            .expect("the engine thread outlives the control thread");
        rrx.recv().expect("the engine thread runs every job")
    }
}

/// Runs `control` on a thread of its own while this thread turns the engine and runs the jobs
/// `control` hands it; returns what `control` returned.
pub fn serve<T: Send>(ep: &mut Endpoint, control: impl FnOnce(Ctl) -> T + Send) -> T {
    serve_lingering(ep, LINGER, control)
}

/// How long [`serve`] keeps answering after `control` returned: the last ACKs and answers of a
/// process about to close its port.
pub(crate) const LINGER: Duration = Duration::from_millis(100);

/// [`serve`], answering for `linger` after `control` returned. Zero between the steps of one
/// exchange, whose next step turns the engine again at once.
pub fn serve_lingering<T: Send>(
    ep: &mut Endpoint,
    linger: Duration,
    control: impl FnOnce(Ctl) -> T + Send,
) -> T {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::scope(|s| {
        let h = s.spawn(move || control(Ctl { tx }));
        turn_with_jobs(ep, &rx, linger);
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Turns `ep`'s engine, running the jobs that come on `rx` between turns, until every sender
/// is gone; then answers for `linger` more (the last ACKs and answers leave before the port
/// closes) and flushes the port.
pub(crate) fn turn_with_jobs(ep: &mut Endpoint, rx: &mpsc::Receiver<Job>, linger: Duration) {
    loop {
        match rx.try_recv() {
            Ok(job) => job(ep),
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => break,
        }
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    let until = Instant::now() + linger;
    while Instant::now() < until {
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    ep.engine.flush();
}

/// The GID of an address as it goes on the wire (IPv4-mapped for IPv4).
pub fn gid_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The address in a GID, or an error a user can act on.
pub fn gid_ip(gid: &[u8; 16], who: &str) -> Result<IpAddr, String> {
    if gid.iter().all(|&b| b == 0) {
        return Err(format!(
            "{who} sent an all-zero GID: on RoCE both ends need a GID index (-g for the pingpong tools, -x for perftest)"
        ));
    }
    let a = Ipv6Addr::from(*gid);
    Ok(match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    })
}

/// A random initial PSN (where perftest and rdma-core take `lrand48() & 0xffffff`), from the
/// RNIC's key generator: as hard to guess as its R_Keys, and replayed with its seed.
pub(crate) fn random_psn(r: &mut Rnic) -> Psn {
    Psn::new(r.random_u64() as u32 & 0x00ff_ffff)
}

pub(crate) fn verr(e: VerbsError) -> String {
    e.to_string()
}

/// How long an end waits for the peer's MAC.
pub(crate) const RESOLVE: Duration = Duration::from_secs(5);

// ---- perf ------------------------------------------------------------------------------------

/// Which perftest benchmark, and its options (both ends must agree on the ones perftest does
/// not exchange: size, iterations, QPs).
#[derive(Debug, Clone)]
pub struct PerfOpts {
    pub test: crate::perf::Test,
    pub server: Option<String>,
    pub port: u16,
    pub size: usize,
    /// Messages per QP (not in a timed run).
    pub iters: u64,
    /// perftest's `-D`: the client posts for this many seconds instead of `iters` per QP (the
    /// WRITE, READ and atomic bandwidth tests; a server of those waits for the client's end
    /// whichever it is).
    pub duration: Option<f64>,
    pub qps: usize,
    /// The path MTU asked for (the smaller of the two ends' is used).
    pub mtu: Mtu,
    pub tx_depth: usize,
    /// A completion every this many work requests (perftest's CQ moderation, -Q).
    pub cq_mod: usize,
    pub verify: bool,
    pub qp_timeout: u8,
    /// Latency instead of bandwidth (ib_*_lat): one QP, one message in flight.
    pub lat: bool,
    /// perftest's `-R`: connect through rdma_cm and run the exchange on an RC QP of its own.
    pub rdma_cm: bool,
    /// perftest's `-o`: the reads and atomics this end accepts as responder in the read and
    /// atomic tests, which it advertises as out_reads (None: 16, perftest's default; capped at the
    /// device's `max_qp_rd_atom`, as perftest does).
    pub out_reads: Option<u16>,
}

impl PerfOpts {
    pub(crate) fn perftest(&self) -> PerftestTest {
        use crate::perf::Test;
        match (self.test, self.lat) {
            (Test::Write, false) => PerftestTest::WriteBw,
            (Test::Read, false) => PerftestTest::ReadBw,
            (Test::Send, false) => PerftestTest::SendBw,
            (Test::Atomic { .. }, false) => PerftestTest::AtomicBw,
            (Test::Write, true) => PerftestTest::WriteLat,
            (Test::Read, true) => PerftestTest::ReadLat,
            (Test::Send, true) => PerftestTest::SendLat,
            (Test::Atomic { .. }, true) => PerftestTest::AtomicLat,
        }
    }

    /// Bytes of one QP's region: the message, at least a page (perftest's rule).
    pub(crate) fn region(&self) -> usize {
        self.size.max(4096).next_multiple_of(64)
    }
}

/// What a perf end prints and returns.
#[derive(Debug, Clone)]
pub struct PerfOutcome {
    /// This end's figures (client), or the client's as it reported them (server, when the test
    /// exchanges reports).
    pub report: Option<Report>,
    pub peer_version: String,
    pub mtu: usize,
    pub lines: Vec<String>,
}

/// Runs one end of perftest's bandwidth test `o.test` (client when `o.server` is set).
pub fn perf(ep: &mut Endpoint, o: &PerfOpts) -> Result<PerfOutcome, String> {
    if o.rdma_cm {
        return crate::perftest_cm::perf(ep, o);
    }
    let server = o.server.is_none();
    let res = perf_resources(&mut ep.rnic, o, server)?;
    let listener = match server {
        true => Some(oob::listen(o.port).map_err(|e| e.to_string())?),
        false => None,
    };
    perf_run(ep, o, &res, listener.as_ref(), LINGER)
}

/// A perf server that answers `runs` clients one after another (None: until killed) on one
/// TCP listener, one PD, one CQ and one MR; each client gets QPs of its own, destroyed after
/// its run. `each` sees every run's outcome; a failed run does not end the server. Returns the
/// runs that failed.
pub fn perf_serve(
    ep: &mut Endpoint,
    o: &PerfOpts,
    runs: Option<u64>,
    mut each: impl FnMut(u64, &Result<PerfOutcome, String>),
) -> Result<u64, String> {
    if o.server.is_some() || o.rdma_cm {
        return Err("perf_serve: a TCP-exchange server (no SERVER, no -R)".into());
    }
    let res = perf_resources(&mut ep.rnic, o, true)?;
    let l = oob::listen(o.port).map_err(|e| e.to_string())?;
    let mut failed = 0;
    let mut n = 0;
    let mut wcs = Vec::new();
    while runs.is_none_or(|r| n < r) {
        // The engine keeps turning while the next client is awaited: no linger.
        let out = perf_run(ep, o, &res, Some(&l), Duration::ZERO);
        n += 1;
        if out.is_err() {
            failed += 1;
        }
        each(n, &out);
        // Completions of the destroyed QPs (a send test's receives, flushed or not).
        while ep.rnic.poll_cq_into(res.cq, 64, &mut wcs) > 0 {
            wcs.clear();
        }
    }
    Ok(failed)
}

/// One run of a perf end on resources made before; its QPs are destroyed when it ends, however
/// it ends. `linger`: how long the last exchange keeps answering before returning.
fn perf_run(
    ep: &mut Endpoint,
    o: &PerfOpts,
    res: &PerfResources,
    listener: Option<&TcpListener>,
    linger: Duration,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let setup = perf_qps(&mut ep.rnic, o, server, res)?;
    let out = perf_exchange(ep, o, &setup, listener, linger);
    destroy_qps(&mut ep.rnic, &setup.qps);
    out
}

fn perf_exchange(
    ep: &mut Endpoint,
    o: &PerfOpts,
    setup: &PerfSetup,
    listener: Option<&TcpListener>,
    linger: Duration,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let active = ep.rnic.active_mtu();
    let want = o.mtu.bytes().min(active.bytes());
    let my = dests(ep, o, setup);
    let test = o.perftest();
    let cfg = OobConfig::default();
    // Between the steps the engine is turned again at once: no linger.
    let mut conn = match (&o.server, listener) {
        (Some(addr), _) => {
            let a = (addr.as_str(), o.port);
            serve_lingering(ep, Duration::ZERO, |_| PerftestConn::connect(a, &cfg))
                .map_err(|e| e.to_string())?
        }
        (None, Some(l)) => serve_lingering(ep, Duration::ZERO, |_| PerftestConn::accept(l, &cfg))
            .map_err(|e| e.to_string())?,
        (None, None) => return Err("a perf server needs its listener".into()),
    };
    let neg = serve_lingering(ep, Duration::ZERO, |_| {
        conn.preamble(SysData::default(), want as u32)
    })
    .map_err(|e| e.to_string())?;
    let mtu = Mtu::from_bytes(neg.mtu as usize).unwrap_or(active);
    // Setup and connect on the out-of-band thread; the QPs are moved by the engine's thread.
    let setup_parts = (setup.cq, setup.mr, setup.qps.clone());
    let o2 = o.clone();
    let my2 = my.clone();
    let rem = serve_lingering(ep, Duration::ZERO, move |ctl| {
        conn.setup_qps(test, &my2, |rem| {
            let rem = rem.to_vec();
            let o3 = o2.clone();
            let (cq, mr, qps) = (setup_parts.0, setup_parts.1, setup_parts.2.clone());
            ctl.run(move |ep| {
                let s = PerfSetup { cq, mr, qps };
                perf_connect(ep, &o3, &s, &rem, mtu)?;
                if server && test == PerftestTest::SendBw {
                    for qi in 0..s.qps.len() {
                        post_server_recvs(&mut ep.rnic, &o3, &s, qi, RX_DEPTH)?;
                    }
                }
                if test == PerftestTest::SendLat {
                    // Both ends receive; posted before the sync so that no first SEND meets RNR.
                    post_server_recvs(&mut ep.rnic, &o3, &s, 0, 2)?;
                }
                Ok(())
            })
        })
        .map(|rem| (rem, conn))
    })
    .map_err(|e| e.to_string())?;
    let (rem, conn) = rem;
    let mut ex = TcpExchange(conn, linger);
    data_phase(ep, o, setup, &my, &rem, mtu, neg.remote_version, &mut ex)
}

/// The exchange steps after the QPs are connected.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// [`PerftestXchg::sync`].
    Sync,
    /// [`PerftestXchg::close`].
    Close,
    /// [`PerftestXchg::finish`] with this end's report.
    Finish(PerftestTest, &'a BwReport),
}

impl Step<'_> {
    pub(crate) fn run(
        self,
        x: &mut impl PerftestXchg,
        my0: &PerftestDest,
    ) -> oob::OobResult<Option<BwReport>> {
        match self {
            Step::Sync => x.sync(my0).map(|_| None),
            Step::Close => x.close(my0).map(|_| None),
            Step::Finish(test, my) => x.finish(test, my0, my),
        }
    }
}

/// The carrier of perftest's exchange (TCP, or perftest `-R`'s rdma_cm QP): runs a [`Step`]
/// while the engine keeps turning. `patient`: no deadline (a passive server waits there for
/// the client's whole run).
pub(crate) trait Exchange {
    fn step(
        &mut self,
        ep: &mut Endpoint,
        my0: &PerftestDest,
        step: Step,
        patient: bool,
    ) -> Result<Option<BwReport>, String>;
}

/// perftest's exchange over TCP, on a thread of its own while the engine's thread turns.
/// The linger: after the last step only (the server's run, the client's report).
pub(crate) struct TcpExchange(PerftestConn, Duration);

impl TcpExchange {
    /// The exchange on `conn`, lingering `linger` after its last step.
    pub(crate) fn new(conn: PerftestConn, linger: Duration) -> TcpExchange {
        TcpExchange(conn, linger)
    }
}

impl Exchange for TcpExchange {
    fn step(
        &mut self,
        ep: &mut Endpoint,
        my0: &PerftestDest,
        step: Step,
        patient: bool,
    ) -> Result<Option<BwReport>, String> {
        if patient {
            self.0.set_io_timeout(None);
        }
        let linger = match step {
            Step::Sync => Duration::ZERO,
            Step::Close | Step::Finish(..) => self.1,
        };
        serve_lingering(ep, linger, |_| step.run(&mut self.0, my0)).map_err(|e| e.to_string())
    }
}

/// Everything from the last set-up exchange to the end: the run, `--verify`, the closing
/// exchanges.
#[allow(clippy::too_many_arguments)]
pub(crate) fn data_phase(
    ep: &mut Endpoint,
    o: &PerfOpts,
    setup: &PerfSetup,
    my: &[PerftestDest],
    rem: &[PerftestDest],
    mtu: Mtu,
    peer_version: String,
    ex: &mut dyn Exchange,
) -> Result<PerfOutcome, String> {
    let server = o.server.is_none();
    let test = o.perftest();
    let my0 = my[0];
    if matches!(test, PerftestTest::SendBw | PerftestTest::SendLat) {
        ex.step(ep, &my0, Step::Sync, false)?;
    }
    let mut lines = Vec::new();
    if o.lat {
        let rep = run_lat(ep, o, setup, rem, mtu, server)?;
        // A passive read/atomic latency server waits for the client's whole run in the
        // closing exchange.
        let patient = server && matches!(test, PerftestTest::ReadLat | PerftestTest::AtomicLat);
        ex.step(ep, &my0, Step::Finish(test, &BwReport::default()), patient)?;
        return Ok(PerfOutcome {
            report: rep,
            peer_version,
            mtu: mtu.bytes(),
            lines,
        });
    }
    if server {
        let report = if test == PerftestTest::SendBw {
            let got = serve_send(ep, o, setup)?;
            ex.step(ep, &my0, Step::Close, false)?;
            lines.push(format!(" server: {got} messages received"));
            None
        } else {
            // The server waits in the report exchange for the client's whole run.
            let rep = ex.step(ep, &my0, Step::Finish(test, &BwReport::default()), true)?;
            rep.map(|b| client_report(o, &b, mtu))
        };
        return Ok(PerfOutcome {
            report,
            peer_version,
            mtu: mtu.bytes(),
            lines,
        });
    }
    let rep = run_client_verified(ep, o, setup, rem, mtu)?;
    // A run stopped at an error completion skips the closing exchange: the server still waits
    // for the messages that never came and will not reach it (perftest's client exits there
    // too). The report says which completion failed; waiting on the exchange would end in its
    // timeout instead and hide that.
    if rep.errors == 0 {
        ex.step(ep, &my0, Step::Finish(test, &bw_report(o, &rep)), false)?;
    }
    Ok(PerfOutcome {
        report: Some(rep),
        peer_version,
        mtu: mtu.bytes(),
        lines,
    })
}

/// What the client tells the server of its run in perftest's closing exchange.
pub(crate) fn bw_report(o: &PerfOpts, rep: &Report) -> BwReport {
    BwReport {
        size: o.size as u64,
        iters: rep.messages,
        bw_peak: rep.bw_peak_mbps * 1e6 / 1048576.0,
        bw_avg: rep.bytes as f64 / rep.seconds / 1048576.0,
        msg_rate_avg: rep.mpps,
        per_port: None,
    }
}

/// The client's figures as its report said them (what perftest's server prints).
pub(crate) fn client_report(o: &PerfOpts, b: &BwReport, mtu: Mtu) -> Report {
    let bytes = b.size * b.iters;
    let seconds = if b.bw_avg > 0.0 {
        bytes as f64 / (b.bw_avg * 1048576.0)
    } else {
        0.0
    };
    Report {
        test: o.test.name(),
        size: b.size as usize,
        iters: b.iters,
        qps: o.qps,
        mtu: mtu.bytes(),
        seconds,
        bytes,
        messages: b.iters,
        gbps: b.bw_avg * 1048576.0 * 8.0 / 1e9,
        mpps: b.msg_rate_avg,
        bw_peak_mbps: b.bw_peak * 1048576.0 / 1e6,
        ..Default::default()
    }
}
