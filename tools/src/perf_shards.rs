//! perftest's bandwidth end on a datapath with the device on several threads (`rocemu perf
//! --dev af_packet:IFACE --threads N`): shard 0 is the [`Endpoint`] the exchange runs on, as
//! with one thread; shards 1 to N - 1 each turn their own engine on a thread of their own
//! ([`ShardPool`]) and take the work that touches their RNIC as jobs. QP i of the run is shard
//! i mod N's; the peer sees one device with `-q` QPs (its own threads, if any, are its
//! business), and perftest's exchange carries every QP's address in order, so the peer may be
//! perftest itself.
//!
//! Invariants: the QPs of every shard are destroyed however the run ends; only shard 0 asks
//! for the peer's MAC (the fanout program hands ARP answers to shard 0), the others are told it.
use crate::oob::{
    BwReport, OobConfig, PerftestConn, PerftestDest, PerftestTest, PerftestXchg, SysData,
};
use crate::perf::Report;
use crate::perf_end::{
    destroy_qps, dests, perf_connect_to, perf_qps, perf_resources, post_server_recvs,
    run_client_verified, serve_send, PerfSetup, RX_DEPTH,
};
use crate::remote::{
    bw_report, client_report, gid_ip, serve_lingering, turn_with_jobs, Endpoint, Exchange, Job,
    PerfOpts, PerfOutcome, Step, TcpExchange, LINGER,
};
use rocemu_emulator::rnic::Mtu;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Shards 1 to N - 1 of a device, each turning its engine on a thread of its own between the
/// jobs it is handed.
#[derive(Debug)]
pub struct ShardPool {
    threads: Vec<(mpsc::Sender<Job>, JoinHandle<Endpoint>)>,
}

impl ShardPool {
    /// Starts a thread per endpoint (shard k + 1 for `eps[k]`).
    pub fn start(eps: Vec<Endpoint>) -> ShardPool {
        let threads = eps
            .into_iter()
            .enumerate()
            .map(|(i, mut ep)| {
                let (tx, rx) = mpsc::channel::<Job>();
                let h = std::thread::Builder::new()
                    .name(format!("rocemu-shard{}", i + 1))
                    .spawn(move || {
                        turn_with_jobs(&mut ep, &rx, LINGER);
                        ep
                    })
                    .expect("a thread for a shard");
                (tx, h)
            })
            .collect();
        ShardPool { threads }
    }

    /// How many shards the pool turns (the device has one more: shard 0).
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Hands `f` to shard `k` (1 ≤ k ≤ len) and returns where its result will arrive.
    fn spawn<R: Send + 'static>(
        &self,
        k: usize,
        f: impl FnOnce(&mut Endpoint) -> R + Send + 'static,
    ) -> mpsc::Receiver<R> {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move |ep| {
            let _ = rtx.send(f(ep));
        });
        let _ = self.threads[k - 1].0.send(job);
        rrx
    }

    /// Runs `f` on shard `k` and returns its result.
    fn run<R: Send + 'static>(
        &self,
        k: usize,
        f: impl FnOnce(&mut Endpoint) -> R + Send + 'static,
    ) -> Result<R, String> {
        self.spawn(k, f)
            .recv()
            .map_err(|_| format!("shard {k}'s thread ended"))
    }

    /// Stops the threads (after their linger) and returns the endpoints.
    pub fn stop(self) -> Vec<Endpoint> {
        self.threads
            .into_iter()
            .filter_map(|(tx, h)| {
                drop(tx);
                h.join().ok()
            })
            .collect()
    }
}

/// The QPs of shard `k` of `n` in a run of `qps`: QP i is shard i mod n's.
fn share(qps: usize, n: usize, k: usize) -> usize {
    (qps + n - 1 - k) / n
}

/// One bandwidth run of a perf end whose device is shard 0 (`ep`) and `pool`'s shards, over
/// perftest's TCP exchange (client when `o.server` is set).
pub fn perf(ep: &mut Endpoint, pool: &ShardPool, o: &PerfOpts) -> Result<PerfOutcome, String> {
    let n = pool.len() + 1;
    if o.lat || o.rdma_cm {
        return Err(
            "--threads N on a datapath: the bandwidth tests over TCP (no --lat, no -R)".into(),
        );
    }
    if o.qps < n {
        return Err(format!(
            "--threads {n}: -q {} gives a thread no QP; give at least one QP per thread",
            o.qps
        ));
    }
    let server = o.server.is_none();
    let opts: Vec<PerfOpts> = (0..n)
        .map(|k| PerfOpts {
            qps: share(o.qps, n, k),
            ..o.clone()
        })
        .collect();
    // Every shard's resources and QPs; whatever was made is destroyed below, however it ends.
    let mut setups: Vec<Option<PerfSetup>> = Vec::with_capacity(n);
    let mut made = Ok(());
    for (k, ok) in opts.iter().enumerate() {
        let ok = ok.clone();
        let r = if k == 0 {
            perf_resources(&mut ep.rnic, &ok, server)
                .and_then(|res| perf_qps(&mut ep.rnic, &ok, server, &res))
        } else {
            pool.run(k, move |ep| {
                perf_resources(&mut ep.rnic, &ok, server)
                    .and_then(|res| perf_qps(&mut ep.rnic, &ok, server, &res))
            })
            .and_then(|r| r)
        };
        match r {
            Ok(s) => setups.push(Some(s)),
            Err(e) => {
                made = Err(format!("shard {k}: {e}"));
                break;
            }
        }
    }
    let out = made.and_then(|()| {
        let setups: Vec<PerfSetup> = setups.iter().flatten().cloned().collect();
        run(ep, pool, o, &opts, &setups)
    });
    for (k, s) in setups.into_iter().enumerate() {
        let Some(s) = s else { continue };
        if k == 0 {
            destroy_qps(&mut ep.rnic, &s.qps);
        } else {
            let _ = pool.run(k, move |ep| destroy_qps(&mut ep.rnic, &s.qps));
        }
    }
    out
}

/// The exchange and the run on set-up shards.
fn run(
    ep: &mut Endpoint,
    pool: &ShardPool,
    o: &PerfOpts,
    opts: &[PerfOpts],
    setups: &[PerfSetup],
) -> Result<PerfOutcome, String> {
    let n = opts.len();
    let server = o.server.is_none();
    let test = o.perftest();
    // Every QP's address in the run's order: QP i is shard i mod n's (i / n)-th.
    let mut per_shard: Vec<Vec<PerftestDest>> = vec![dests(ep, &opts[0], &setups[0])];
    for k in 1..n {
        let (ok, s) = (opts[k].clone(), setups[k].clone());
        per_shard.push(pool.run(k, move |ep| dests(ep, &ok, &s))?);
    }
    let my: Vec<PerftestDest> = (0..o.qps).map(|i| per_shard[i % n][i / n]).collect();
    let split = |all: &[PerftestDest], k: usize| -> Vec<PerftestDest> {
        all.iter().skip(k).step_by(n).copied().collect()
    };

    let active = ep.rnic.active_mtu();
    let want = o.mtu.bytes().min(active.bytes());
    let cfg = OobConfig::default();
    let listener = match server {
        true => Some(crate::oob::listen(o.port).map_err(|e| e.to_string())?),
        false => None,
    };
    let mut conn = match (&o.server, &listener) {
        (Some(addr), _) => {
            let a = (addr.as_str(), o.port);
            serve_lingering(ep, Duration::ZERO, |_| PerftestConn::connect(a, &cfg))
                .map_err(|e| e.to_string())?
        }
        (None, Some(l)) => serve_lingering(ep, Duration::ZERO, |_| PerftestConn::accept(l, &cfg))
            .map_err(|e| e.to_string())?,
        (None, None) => unreachable!("a server has its listener"),
    };
    let neg = serve_lingering(ep, Duration::ZERO, |_| {
        conn.preamble(SysData::default(), want as u32)
    })
    .map_err(|e| e.to_string())?;
    let mtu = Mtu::from_bytes(neg.mtu as usize).unwrap_or(active);
    let o0 = opts[0].clone();
    let s0 = setups[0].clone();
    let my2 = my.clone();
    let rem = serve_lingering(ep, Duration::ZERO, |ctl| {
        conn.setup_qps(test, &my2, |rem| {
            // Shard 0 finds the peer's MAC; the others are told it.
            let rem0 = split(rem, 0);
            let mac = ctl.run(move |ep| {
                perf_connect_to(ep, &o0, &s0, &rem0, mtu, None)?;
                let peer = gid_ip(&rem0[0].gid, "the peer")?;
                let mac = ep
                    .rnic
                    .neighbor(peer)
                    .ok_or("the peer's MAC was not kept")?;
                if server && test == PerftestTest::SendBw {
                    for qi in 0..s0.qps.len() {
                        post_server_recvs(&mut ep.rnic, &o0, &s0, qi, RX_DEPTH)?;
                    }
                }
                Ok::<_, String>(mac)
            })?;
            for k in 1..n {
                let (ok, s, remk) = (opts[k].clone(), setups[k].clone(), split(rem, k));
                pool.run(k, move |ep| {
                    perf_connect_to(ep, &ok, &s, &remk, mtu, Some(mac))?;
                    if server && test == PerftestTest::SendBw {
                        for qi in 0..s.qps.len() {
                            post_server_recvs(&mut ep.rnic, &ok, &s, qi, RX_DEPTH)?;
                        }
                    }
                    Ok::<_, String>(())
                })?
                .map_err(|e| format!("shard {k}: {e}"))?;
            }
            Ok(())
        })
        .map(|rem| (rem, conn))
    })
    .map_err(|e| e.to_string())?;
    let (rem, conn) = rem;
    let mut ex = TcpExchange::new(conn, LINGER);
    let my0 = my[0];
    let threads_line = format!(
        " threads: {n}; QPs per thread: {}",
        opts.iter()
            .map(|x| x.qps.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut lines = vec![threads_line];
    if test == PerftestTest::SendBw {
        ex.step(ep, &my0, Step::Sync, false)?;
    }
    let outcome = |report, lines| PerfOutcome {
        report,
        peer_version: neg.remote_version.clone(),
        mtu: mtu.bytes(),
        lines,
    };
    if server {
        if test == PerftestTest::SendBw {
            // Every shard serves its QPs' receives at once.
            let waits: Vec<_> = (1..n)
                .map(|k| {
                    let (ok, s) = (opts[k].clone(), setups[k].clone());
                    pool.spawn(k, move |ep| serve_send(ep, &ok, &s))
                })
                .collect();
            let mut got = serve_send(ep, &opts[0], &setups[0])?;
            for r in gather(ep, waits)? {
                got += r;
            }
            ex.step(ep, &my0, Step::Close, false)?;
            lines.push(format!(" server: {got} messages received"));
            return Ok(outcome(None, lines));
        }
        // The server waits in the report exchange for the client's whole run; its shards
        // answer on their own threads meanwhile.
        let rep = ex.step(ep, &my0, Step::Finish(test, &BwReport::default()), true)?;
        return Ok(outcome(rep.map(|b| client_report(o, &b, mtu)), lines));
    }
    // Every shard runs its QPs at once (and verifies them), shard 0 on this thread.
    let waits: Vec<_> = (1..n)
        .map(|k| {
            let (ok, s, remk) = (opts[k].clone(), setups[k].clone(), split(&rem, k));
            pool.spawn(k, move |ep| run_client_verified(ep, &ok, &s, &remk, mtu))
        })
        .collect();
    let mut parts = vec![run_client_verified(
        ep,
        &opts[0],
        &setups[0],
        &split(&rem, 0),
        mtu,
    )?];
    parts.extend(gather(ep, waits)?);
    lines.push(format!(
        " messages per thread: {}",
        parts
            .iter()
            .map(|r| r.messages.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let rep = merge(o, parts);
    ex.step(ep, &my0, Step::Finish(test, &bw_report(o, &rep)), false)?;
    Ok(outcome(Some(rep), lines))
}

/// What shards 1 to N - 1 return, in shard order, while shard 0's engine keeps turning: on a
/// datapath whose queues the kernel does not steer (AF_XDP, DPDK), frames for another shard's
/// QPs arrive on shard 0's queue too, and a shard 0 that stopped reading them would leave
/// those QPs to time out (it did: two retransmission timeouts a run over DPDK).
fn gather<T: Send>(
    ep: &mut Endpoint,
    waits: Vec<mpsc::Receiver<Result<T, String>>>,
) -> Result<Vec<T>, String> {
    serve_lingering(ep, Duration::ZERO, move |_| {
        waits
            .into_iter()
            .enumerate()
            .map(|(k, w)| {
                w.recv()
                    .map_err(|_| format!("shard {}'s thread ended", k + 1))?
                    .map_err(|e| format!("shard {}: {e}", k + 1))
            })
            .collect()
    })
}

/// The shards' reports as one: messages, bytes and packets summed, the longest shard's time,
/// the peaks summed, the first error; each shard's verification detail and counters say whose
/// they are.
fn merge(o: &PerfOpts, parts: Vec<Report>) -> Report {
    let mut r = Report {
        qps: o.qps,
        ..parts[0].clone()
    };
    let (mut details, mut counters) = (Vec::new(), Vec::new());
    r.seconds = 0.0;
    (r.bytes, r.messages, r.packets, r.iters) = (0, 0, 0, 0);
    (r.retransmits, r.naks, r.rnr_naks, r.timeouts, r.errors) = (0, 0, 0, 0, 0);
    r.bw_peak_mbps = 0.0;
    r.first_error = None;
    let mut verified = None;
    for (k, p) in parts.into_iter().enumerate() {
        r.seconds = r.seconds.max(p.seconds);
        r.bytes += p.bytes;
        r.messages += p.messages;
        r.packets += p.packets;
        r.iters += p.iters;
        r.retransmits += p.retransmits;
        r.naks += p.naks;
        r.rnr_naks += p.rnr_naks;
        r.timeouts += p.timeouts;
        r.errors += p.errors;
        r.bw_peak_mbps += p.bw_peak_mbps;
        if r.first_error.is_none() {
            r.first_error = p.first_error;
        }
        if let Some(v) = p.verified {
            verified = Some(verified.unwrap_or(true) && v);
        }
        if !p.verify_detail.is_empty() {
            details.push(format!("thread {k}: {}", p.verify_detail));
        }
        if !p.counters.is_empty() {
            counters.push(format!("thread {k}: {}", p.counters));
        }
    }
    if r.seconds > 0.0 {
        r.gbps = r.bytes as f64 * 8.0 / r.seconds / 1e9;
        r.mpps = r.messages as f64 / r.seconds / 1e6;
    }
    r.verified = verified;
    r.verify_detail = details.join("; ");
    r.counters = counters.join("; ");
    r
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn qps_are_dealt_out_round_robin() {
        for (qps, n) in [(4, 2), (5, 2), (7, 3), (3, 3), (16, 5)] {
            let shares: Vec<usize> = (0..n).map(|k| share(qps, n, k)).collect();
            assert_eq!(shares.iter().sum::<usize>(), qps);
            for (k, &s) in shares.iter().enumerate() {
                assert_eq!(s, (0..qps).filter(|i| i % n == k).count());
            }
        }
    }
}
