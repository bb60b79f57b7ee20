//! The perftest engine: bandwidth and latency, written once over an [`End`].
//!
//! Invariants:
//! - An [`End`] is one RNIC and what turns its datapath. In process ([`crate::perf`]) the end
//!   is RNIC A of two in one thread, and [`End::progress`] moves the frames between A and B and
//!   serves both RNICs' timers; B is passive as a perftest server is, except for what a server
//!   does in its own loop, which [`End::peer_turn`] does (a SEND test's receives). On a
//!   datapath ([`crate::remote`]) the end is the process's RNIC and its engine; the peer is
//!   another process.
//! - Work request ids name their QP: `wr_id = QP index << WR_QP_SHIFT | iteration`, so that a
//!   completion finds its QP without a lookup and covers, in order, every unsignaled work request
//!   before it ([`crate::perf::cover`]).
//! - The engine is generic over the end, not a trait object: the in-process pump inlines into
//!   the bandwidth loop, which is the benchmarked hot path.
//! - What differs between the ends is said by the end: its rules ([`End::PEAK_WINDOW`],
//!   [`End::POLL_BATCH`], [`End::STOP_AT_FIRST_ERROR`]) and its words (how an error completion
//!   and a stall are described). The figures a run reports, their JSON and perftest's table
//!   lines are built in one place ([`report`]).
use crate::perf::{cover, signaled, Test};
use rocemu_emulator::rnic::*;
use rocemu_wire::Qpn;
use std::time::{Duration, Instant};

pub(crate) mod report;
pub(crate) use report::{bw_report, lat_report, RunShape, Transport};

/// wr_id of the bandwidth work requests: QP index << WR_QP_SHIFT | iteration.
pub(crate) const WR_QP_SHIFT: u32 = 40;
const ITER_MASK: u64 = (1 << WR_QP_SHIFT) - 1;
/// How long without a completion a bandwidth run waits before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// One end of a perftest run: the RNIC the engine posts to and polls, and what turns it.
pub(crate) trait End {
    /// How long the window of the peak bandwidth is at least.
    const PEAK_WINDOW: Duration;
    /// Completions taken from the CQ per turn at most.
    const POLL_BATCH: usize;
    /// A bandwidth run ends at the first error completion (otherwise: once every work request
    /// posted has completed).
    const STOP_AT_FIRST_ERROR: bool;

    fn rnic(&mut self) -> &mut Rnic;
    /// One turn of the datapath; returns the work done (0: nothing moved).
    fn progress(&mut self) -> usize;
    /// After a turn that found no completion: what the datapath does when idle.
    fn idle(&mut self, work: usize);
    /// What the peer's own loop does, when the peer runs in this thread (in process: a SEND
    /// test's receiver). Called once before a bandwidth run and after every turn.
    fn peer_turn(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// The first error completion of a run, described for the report.
    fn describe_error(&mut self, wc: &Wc) -> String;
    /// Why a bandwidth run that saw no completion for [`STALL`] gave up.
    fn stalled(&mut self, completed: u64, total: u64) -> String;
}

/// One QP of a bandwidth run: where its work requests go, and how far it got.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BwQp {
    pub qpn: Qpn,
    /// The local buffer every work request of the QP names (its length is the message's).
    pub local: Sge,
    pub remote_addr: u64,
    pub rkey: u32,
    pub posted: u64,
    pub done: u64,
    pub outstanding: usize,
}

impl BwQp {
    pub fn new(qpn: Qpn, local: Sge, remote_addr: u64, rkey: u32) -> BwQp {
        BwQp {
            qpn,
            local,
            remote_addr,
            rkey,
            posted: 0,
            done: 0,
            outstanding: 0,
        }
    }
}

/// What a bandwidth run does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BwPlan {
    pub test: Test,
    /// Work requests per QP (ignored in a timed run).
    pub iters: u64,
    /// perftest's -D: post for this many seconds, then wait for what is signaled.
    pub duration: Option<f64>,
    pub tx_depth: usize,
    pub cq_mod: usize,
    /// The CQ every QP completes on.
    pub cq: CqId,
    /// Payload bytes a completion counts for the figures.
    pub msg_bytes: u64,
    /// Compare-and-swap: a chain (work request `i` swaps `i` for `i + 1`, the target starting
    /// at 0) rather than 0 for 0.
    pub cas_chain: bool,
}

/// What a bandwidth run did (the QPs' own counts are in their [`BwQp`]s).
#[derive(Debug, Clone, Default)]
pub(crate) struct BwRun {
    pub seconds: f64,
    pub messages: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The best window, or the average if better, in MB/s.
    pub peak_mbps: f64,
}

pub(crate) fn work_request(p: &BwPlan, q: &BwQp, i: u64) -> SendWr {
    let (remote_addr, rkey) = (q.remote_addr, q.rkey);
    let op = match p.test {
        Test::Write => WrOpcode::RdmaWrite { remote_addr, rkey },
        Test::Read => WrOpcode::RdmaRead { remote_addr, rkey },
        Test::Send => WrOpcode::Send,
        Test::Atomic { cmp_swap: false } => WrOpcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
        Test::Atomic { cmp_swap: true } => {
            let (compare, swap) = if p.cas_chain { (i, i + 1) } else { (0, 0) };
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            }
        }
    };
    SendWr::new(i, op, [q.local])
}

/// Posts while the QP has room in its tx depth. SQ full stops this QP for this turn; any
/// other refusal ends the run.
#[inline]
fn post_some(r: &mut Rnic, p: &BwPlan, qi: usize, q: &mut BwQp, total: u64) -> Result<(), String> {
    while q.outstanding < p.tx_depth && q.posted < total {
        let flags = if signaled(q.posted, p.cq_mod, total) {
            SendFlags::SIGNALED
        } else {
            SendFlags::default()
        };
        let wr_id = q.posted | (qi as u64) << WR_QP_SHIFT;
        // Built in the call's argument: a `SendWr` is 152 bytes, and one built apart and then
        // changed is copied into the argument first (a memcpy call per post).
        match r.post_send(
            q.qpn,
            SendWr {
                wr_id,
                flags,
                ..work_request(p, q, q.posted)
            },
        ) {
            Ok(()) => {}
            Err(VerbsError::NoSpace(_)) => break,
            Err(e) => return Err(e.to_string()),
        }
        q.posted += 1;
        q.outstanding += 1;
    }
    Ok(())
}

/// perftest's bandwidth loop: keeps every QP `tx_depth` work requests deep (one in `cq_mod`
/// signaled), counts what each completion covers, tracks the peak window, and ends when every
/// work request completed (a timed run: every signaled one), at an error as the end's rules say,
/// or with the end's words after [`STALL`] without a completion.
pub(crate) fn bandwidth<E: End>(
    end: &mut E,
    p: &BwPlan,
    qps: &mut [BwQp],
) -> Result<BwRun, String> {
    let total = if p.duration.is_some() {
        u64::MAX
    } else {
        p.iters
    };
    // A timed run has no last work request to signal: the ones posted after the last
    // signaled one never show a completion, and are not counted.
    let unseen = |q: &BwQp| match p.duration {
        Some(_) => (q.posted % p.cq_mod as u64) as usize,
        None => 0,
    };
    let mut wcs = Vec::with_capacity(E::POLL_BATCH.min(4096));
    let mut r = BwRun::default();
    let mut peak = 0.0f64;
    let mut stopped = false;
    end.peer_turn()?;
    let t0 = Instant::now();
    let deadline = p.duration.map(|d| t0 + Duration::from_secs_f64(d));
    let mut last_progress = t0;
    let mut window = (t0, 0u64);
    loop {
        if let Some(d) = deadline {
            stopped = stopped || Instant::now() >= d;
        }
        if !stopped {
            for (qi, q) in qps.iter_mut().enumerate() {
                post_some(end.rnic(), p, qi, q, total)?;
            }
        }
        let work = end.progress();
        wcs.clear();
        crate::poll_wcs(end.rnic(), p.cq, E::POLL_BATCH, &mut wcs)?;
        end.peer_turn()?;
        for w in &wcs {
            let Some(q) = qps.get_mut((w.wr_id >> WR_QP_SHIFT) as usize) else {
                continue;
            };
            if w.status != WcStatus::Success {
                r.errors += 1;
                if r.first_error.is_none() {
                    r.first_error = Some(end.describe_error(w));
                }
            }
            r.messages += cover(w.wr_id & ITER_MASK, &mut q.done, &mut q.outstanding);
        }
        if E::STOP_AT_FIRST_ERROR && r.errors > 0 {
            break;
        }
        if wcs.is_empty() {
            end.idle(work);
            if last_progress.elapsed() > STALL {
                return Err(end.stalled(r.messages, p.iters * qps.len() as u64));
            }
        } else {
            last_progress = Instant::now();
            let dt = last_progress.duration_since(window.0);
            if dt > E::PEAK_WINDOW {
                let mbps =
                    (r.messages - window.1) as f64 * p.msg_bytes as f64 / dt.as_secs_f64() / 1e6;
                peak = peak.max(mbps);
                window = (last_progress, r.messages);
            }
        }
        if qps
            .iter()
            .all(|q| q.outstanding <= unseen(q) && (stopped || q.posted >= total))
        {
            break;
        }
        if r.errors > 0 && qps.iter().all(|q| q.outstanding == 0) {
            break;
        }
    }
    r.seconds = t0.elapsed().as_secs_f64();
    r.peak_mbps = peak.max((r.messages * p.msg_bytes) as f64 / r.seconds / 1e6);
    Ok(r)
}

/// One RDMA READ of a peer's region into a local buffer, for `--verify`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadBack {
    pub qpn: Qpn,
    pub into: Sge,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// Posts every read-back at once and waits up to `limit` for their completions on `cq`;
/// returns their statuses, or None when they did not all complete.
pub(crate) fn read_back<E: End>(
    end: &mut E,
    cq: CqId,
    reads: &[ReadBack],
    limit: Duration,
) -> Result<Option<Vec<WcStatus>>, String> {
    for (i, b) in reads.iter().enumerate() {
        let op = WrOpcode::RdmaRead {
            remote_addr: b.remote_addr,
            rkey: b.rkey,
        };
        let w = SendWr::new(u64::MAX - i as u64, op, vec![b.into]);
        end.rnic().post_send(b.qpn, w).map_err(|e| e.to_string())?;
    }
    let t = Instant::now();
    let mut wcs = Vec::new();
    while wcs.len() < reads.len() {
        let work = end.progress();
        if crate::poll_wcs(end.rnic(), cq, reads.len() - wcs.len(), &mut wcs)? == 0 {
            end.idle(work);
            if t.elapsed() > limit {
                return Ok(None);
            }
        }
    }
    Ok(Some(wcs.iter().map(|w| w.status).collect()))
}

/// One operation at a time, each timed from its post to its completion (ib_read_lat,
/// ib_atomic_lat): `wr(i)` is the `i`-th. Error completions are counted (the first kept), not
/// fatal; `stall` is the error when one does not complete in 30 s.
pub(crate) fn one_at_a_time<E: End>(
    end: &mut E,
    qpn: Qpn,
    cq: CqId,
    iters: u64,
    mut wr: impl FnMut(u64) -> SendWr,
    stall: &str,
) -> Result<(Vec<f64>, u64, Option<WcStatus>), String> {
    let mut lat = Vec::with_capacity(iters as usize);
    let mut wcs = Vec::with_capacity(8);
    let (mut errors, mut first) = (0, None);
    for i in 0..iters {
        let t = Instant::now();
        end.rnic()
            .post_send(qpn, wr(i))
            .map_err(|e| e.to_string())?;
        loop {
            let work = end.progress();
            wcs.clear();
            if crate::poll_wcs(end.rnic(), cq, 8, &mut wcs)? > 0 {
                for w in wcs.iter().filter(|w| w.status != WcStatus::Success) {
                    errors += 1;
                    first.get_or_insert(w.status);
                }
                break;
            }
            end.idle(work);
            if t.elapsed() > Duration::from_secs(30) {
                return Err(stall.to_string());
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok((lat, errors, first))
}

/// One QP's receives in a SEND test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxQp {
    pub qpn: Qpn,
    /// The first receive buffer, and its byte offset in the MR.
    pub addr: u64,
    pub off: usize,
    pub posted: u64,
    pub done: u64,
}

/// A SEND test's receiving end, as a perftest server's loop: keeps `ring` receives posted per
/// QP (never more than `cap` over the run), cycling over `slots` buffers of `len` bytes, and
/// hands each arrived message to the caller. Receive wr_ids are `QP index << WR_QP_SHIFT |
/// receive number`; receives posted before it starts (by [`post_receives`]) are counted in
/// `posted`.
#[derive(Debug)]
pub(crate) struct Receiver {
    pub cq: CqId,
    pub lkey: u32,
    pub ring: u64,
    pub cap: Option<u64>,
    pub len: u32,
    pub slots: u64,
    pub qps: Vec<RxQp>,
    wcs: Vec<Wc>,
}

/// Posts `n` receives for QP `qi` into `buf` (a server's before the run; slot 0 of each).
pub(crate) fn post_receives(
    r: &mut Rnic,
    qi: usize,
    qpn: Qpn,
    buf: Sge,
    n: usize,
) -> Result<(), String> {
    for _ in 0..n {
        let w = RecvWr {
            wr_id: (qi as u64) << WR_QP_SHIFT,
            sg_list: [buf].into(),
        };
        r.post_recv(qpn, w).map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl Receiver {
    pub fn new(
        cq: CqId,
        lkey: u32,
        ring: u64,
        cap: Option<u64>,
        len: u32,
        slots: u64,
        qps: Vec<RxQp>,
    ) -> Receiver {
        Receiver {
            cq,
            lkey,
            ring,
            cap,
            len,
            slots,
            qps,
            wcs: Vec::with_capacity(4096),
        }
    }

    /// Takes up to `max` arrived messages, handing each to `arrived(wc, QP index, the buffer's
    /// byte offset in the MR, the MR)`, then tops every QP's receives up. Returns how many
    /// arrived.
    #[inline]
    pub fn turn(
        &mut self,
        r: &mut Rnic,
        max: usize,
        mut arrived: impl FnMut(&Wc, usize, usize, &[u8]) -> Result<(), String>,
    ) -> Result<usize, String> {
        self.wcs.clear();
        let n = crate::poll_wcs(r, self.cq, max, &mut self.wcs)?;
        if n > 0 {
            let mem = r.mr_bytes(self.lkey).expect("registered");
            for w in &self.wcs {
                let qi = (w.wr_id >> WR_QP_SHIFT) as usize;
                let Some(q) = self.qps.get_mut(qi) else {
                    continue;
                };
                q.done += 1;
                let slot = (w.wr_id & ITER_MASK) % self.slots;
                arrived(w, qi, q.off + (slot as usize) * self.len as usize, mem)?;
            }
        }
        for (qi, q) in self.qps.iter_mut().enumerate() {
            while q.posted - q.done < self.ring && self.cap.is_none_or(|c| q.posted < c) {
                let slot = q.posted % self.slots;
                let buf = Sge {
                    addr: q.addr + slot * self.len as u64,
                    length: self.len,
                    lkey: self.lkey,
                };
                let w = RecvWr {
                    wr_id: (qi as u64) << WR_QP_SHIFT | q.posted,
                    sg_list: [buf].into(),
                };
                match r.post_recv(q.qpn, w) {
                    Ok(()) => {}
                    Err(VerbsError::NoSpace(_)) => break,
                    Err(e) => return Err(e.to_string()),
                }
                q.posted += 1;
            }
        }
        Ok(n)
    }
}

/// Which ping-pong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PingOp {
    /// ib_write_lat: each end writes its counter into the last byte of the peer's region and
    /// polls the last byte of its own.
    Write,
    /// ib_send_lat: SENDs, each end keeping receives posted.
    Send,
}

/// What a [`PingPong`] turn found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    Done,
    /// Waiting on memory: turn again at once (no idle: a latency test busy-polls).
    Spin,
    /// Waiting on a completion: the datapath may idle.
    Wait,
}

/// One end of a latency ping-pong (ib_write_lat, ib_send_lat), as a machine turned without
/// blocking, so that one thread can turn both ends (in process) or one (on a datapath). The
/// ends alternate: the one that goes `first` sends, then waits for the peer's message, and so
/// on; `timed`, an end records the time from each of its messages to the next from the peer,
/// halved (perftest reports half the round trip). Each end sends `iters` and receives `iters`.
#[derive(Debug)]
pub(crate) struct PingPong {
    pub op: PingOp,
    pub qpn: Qpn,
    pub cq: CqId,
    pub lkey: u32,
    /// The start of the MR `lkey` names (the byte offsets of `recv` and `send` are from it).
    pub mr_addr: u64,
    /// Where the peer's messages land (write: the region whose last byte is polled).
    pub recv: Sge,
    /// What this end sends (write: its last byte carries the counter).
    pub send: Sge,
    /// Write: the peer's region.
    pub remote_addr: u64,
    pub rkey: u32,
    pub iters: u64,
    pub first: bool,
    pub timed: bool,
    scnt: u64,
    rcnt: u64,
    sends_done: u64,
    /// Write: the last write's completion is awaited before anything else.
    awaiting_send: bool,
    t_send: Instant,
    /// When the current wait began (taken at its first look at the clock).
    since: Option<Instant>,
    /// Turns spent waiting: the clock is read every [`CLOCK_EVERY`] of them only.
    spins: u32,
    start: Instant,
    wcs: Vec<Wc>,
    pub lat: Vec<f64>,
}

/// wr_id of a ping-pong's sends (its receives have 0).
const PING_SEND: u64 = 1;
/// A waiting ping-pong reads the clock for its deadline once in this many turns: a clock read
/// costs as much as a turn of the in-process datapath.
const CLOCK_EVERY: u32 = 1024;

impl PingPong {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        op: PingOp,
        qpn: Qpn,
        cq: CqId,
        mr_addr: u64,
        recv: Sge,
        send: Sge,
        remote: (u64, u32),
        iters: u64,
        first: bool,
        timed: bool,
    ) -> PingPong {
        let now = Instant::now();
        PingPong {
            op,
            qpn,
            cq,
            lkey: send.lkey,
            mr_addr,
            recv,
            send,
            remote_addr: remote.0,
            rkey: remote.1,
            iters,
            first,
            timed,
            scnt: 0,
            rcnt: 0,
            sends_done: 0,
            awaiting_send: false,
            t_send: now,
            since: None,
            spins: 0,
            start: now,
            wcs: Vec::with_capacity(4),
            lat: Vec::with_capacity(iters as usize),
        }
    }

    /// A receive for the peer's next SEND (send_lat keeps two posted, from before the sync).
    pub fn post_recv(r: &mut Rnic, qpn: Qpn, recv: Sge) -> Result<(), String> {
        let w = RecvWr {
            wr_id: 0,
            sg_list: [recv].into(),
        };
        r.post_recv(qpn, w).map_err(|e| e.to_string())
    }

    /// A new wait begins.
    fn wait_anew(&mut self) {
        self.since = None;
        self.spins = 0;
    }

    /// Whether the current wait has lasted over `limit` (looked at every [`CLOCK_EVERY`] turns).
    fn overdue(&mut self, limit: Duration) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if self.spins % CLOCK_EVERY != 1 {
            return false;
        }
        self.since.get_or_insert_with(Instant::now).elapsed() > limit
    }

    fn my_turn_to_send(&self) -> bool {
        self.scnt < self.iters
            && if self.first {
                self.scnt == self.rcnt
            } else {
                self.scnt < self.rcnt
            }
    }

    fn send(&mut self, r: &mut Rnic) -> Result<(), String> {
        self.scnt += 1;
        let op = match self.op {
            PingOp::Write => {
                let last = (self.send.addr - self.mr_addr) as usize + self.send.length as usize - 1;
                r.mr_bytes_mut(self.lkey).expect("registered")[last] = self.scnt as u8;
                self.awaiting_send = true;
                self.wait_anew();
                WrOpcode::RdmaWrite {
                    remote_addr: self.remote_addr,
                    rkey: self.rkey,
                }
            }
            PingOp::Send => WrOpcode::Send,
        };
        self.t_send = Instant::now();
        let mut w = SendWr::new(PING_SEND, op, vec![self.send]);
        w.flags = SendFlags::SIGNALED;
        r.post_send(self.qpn, w).map_err(|e| e.to_string())
    }

    fn received(&mut self) {
        self.rcnt += 1;
        if self.timed && self.scnt > 0 {
            self.lat
                .push(self.t_send.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }

    /// Polls what arrived and posts what is due, without blocking.
    pub fn turn(&mut self, r: &mut Rnic) -> Result<Turn, String> {
        match self.op {
            PingOp::Write => self.turn_write(r),
            PingOp::Send => self.turn_send(r),
        }
    }

    fn turn_write(&mut self, r: &mut Rnic) -> Result<Turn, String> {
        let deadline = Duration::from_secs(30);
        if self.awaiting_send {
            self.wcs.clear();
            if crate::poll_wcs(r, self.cq, 1, &mut self.wcs)? == 0 {
                if self.overdue(deadline) {
                    return Err("write_lat send: no completion for 30 s".into());
                }
                return Ok(Turn::Wait);
            }
            if self.wcs[0].status != WcStatus::Success {
                return Err(format!("write_lat send: {:?}", self.wcs[0].status));
            }
            self.awaiting_send = false;
            self.wait_anew();
        }
        if self.my_turn_to_send() {
            self.send(r)?;
            return Ok(Turn::Wait);
        }
        if self.rcnt == self.iters {
            return Ok(if self.scnt == self.iters {
                Turn::Done
            } else {
                Turn::Spin
            });
        }
        let at = (self.recv.addr - self.mr_addr) as usize + self.recv.length as usize - 1;
        if r.mr_bytes(self.lkey).expect("registered")[at] == (self.rcnt + 1) as u8 {
            self.received();
            self.wait_anew();
            return self.turn_write(r);
        }
        if self.overdue(deadline) {
            return Err(format!(
                "write_lat: message {} never arrived",
                self.rcnt + 1
            ));
        }
        Ok(Turn::Spin)
    }

    fn turn_send(&mut self, r: &mut Rnic) -> Result<Turn, String> {
        if self.first && self.scnt == 0 {
            self.start = Instant::now();
            self.send(r)?;
        }
        if self.rcnt >= self.iters && self.sends_done >= self.scnt {
            return Ok(Turn::Done);
        }
        self.wcs.clear();
        if crate::poll_wcs(r, self.cq, 4, &mut self.wcs)? == 0 {
            self.spins = self.spins.wrapping_add(1);
            if self.spins % CLOCK_EVERY == 1 && self.start.elapsed() > Duration::from_secs(120) {
                return Err(format!("send_lat: stalled after {} messages", self.rcnt));
            }
            return Ok(Turn::Wait);
        }
        let wcs = std::mem::take(&mut self.wcs);
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!("send_lat: {:?}", wc.status));
            }
            if wc.wr_id == PING_SEND {
                self.sends_done += 1;
                continue;
            }
            self.received();
            Self::post_recv(r, self.qpn, self.recv)?;
            if self.scnt < self.iters {
                self.send(r)?;
            }
        }
        self.wcs = wcs;
        Ok(Turn::Spin)
    }
}

/// Turns one end's ping-pong until it is done, the datapath turning between.
pub(crate) fn ping_pong<E: End>(end: &mut E, pp: &mut PingPong) -> Result<(), String> {
    loop {
        match pp.turn(end.rnic())? {
            Turn::Done => return Ok(()),
            Turn::Spin => {
                end.progress();
            }
            Turn::Wait => {
                let w = end.progress();
                end.idle(w);
            }
        }
    }
}
