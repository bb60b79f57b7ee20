//! `rocemu perf` one end per process, over perftest's TCP exchange: two endpoints in one process
//! over an in-memory pipe. Every test bandwidth (with `--verify`) and latency, and a server that
//! answers clients one after another (`--serve`). These pin what the ends report, so that the
//! perftest engine behind them can change shape without changing what they do.
mod common;

use rocemu_emulator::rnic::Mtu;
use rocemu_tools::perf::Test;
use rocemu_tools::remote::{perf, perf_serve, PerfOpts};
use std::net::TcpListener;

fn free_tcp_port() -> u16 {
    let l = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    l.local_addr().unwrap().port()
}

fn po(server: Option<&str>, port: u16, test: Test, lat: bool, qps: usize) -> PerfOpts {
    PerfOpts {
        test,
        server: server.map(str::to_string),
        port,
        size: if matches!(test, Test::Atomic { .. }) {
            8
        } else {
            3000
        },
        iters: 100,
        duration: None,
        qps,
        mtu: Mtu::M1024,
        tx_depth: 16,
        cq_mod: 4,
        verify: server.is_some() && !lat,
        qp_timeout: 14,
        lat,
        rdma_cm: false,
        out_reads: None,
    }
}

const TESTS: [Test; 5] = [
    Test::Write,
    Test::Read,
    Test::Send,
    Test::Atomic { cmp_swap: false },
    Test::Atomic { cmp_swap: true },
];

#[test]
fn bandwidth_every_test_verified() {
    for (k, test) in TESTS.into_iter().enumerate() {
        let qps = if k % 2 == 0 { 2 } else { 1 };
        let what = format!("{test:?} qps={qps}");
        let port = free_tcp_port();
        let (s, c) = common::pair(
            20 + k as u8,
            move |ep| perf(ep, &po(None, port, test, false, qps)),
            |ep| perf(ep, &po(Some("127.0.0.1"), port, test, false, qps)),
        );
        let s = s.unwrap_or_else(|e| panic!("{what}: server: {e}"));
        let c = c.unwrap_or_else(|e| panic!("{what}: client: {e}"));
        let rep = c.report.expect("the client reports");
        assert_eq!(rep.errors, 0, "{what}: {:?}", rep.first_error);
        assert_eq!(rep.messages, 100 * qps as u64, "{what}");
        assert_eq!(rep.iters, 100 * qps as u64, "{what}");
        assert_eq!(rep.qps, qps, "{what}");
        assert_eq!(rep.mtu, 1024, "{what}");
        assert_eq!(rep.verified, Some(true), "{what}: {}", rep.verify_detail);
        assert!(rep.limit_gbps > 0.0, "{what}");
        assert!(rep.bw_peak_mbps > 0.0, "{what}");
        assert!(rep.packets >= 2 * rep.messages, "{what}: {}", rep.packets);
        assert!(rep.lat_us.is_empty(), "{what}");
        let j = rep.to_json();
        assert_eq!(j["test"], test.name(), "{what}");
        assert_eq!(j["verified"], true, "{what}");
        if test == Test::Send {
            assert!(s.report.is_none(), "{what}");
            assert_eq!(
                s.lines,
                vec![format!(" server: {} messages received", 100 * qps)],
                "{what}"
            );
        } else {
            let got = s.report.expect("the server has the client's report");
            assert_eq!(got.iters, 100 * qps as u64, "{what}");
            assert_eq!(got.size, rep.size, "{what}");
        }
    }
}

/// perftest's `-D` on a datapath: the client posts for the duration rather than `iters` (here
/// far more than 100 messages a QP), reports what it did, and the server, which waits for the
/// client's end whichever way it runs, gets that report.
#[test]
fn a_timed_bandwidth_run_posts_for_its_duration() {
    for (k, test) in [Test::Write, Test::Read, Test::Atomic { cmp_swap: false }]
        .into_iter()
        .enumerate()
    {
        let what = format!("{test:?} -D 0.3");
        let port = free_tcp_port();
        let timed = move |server: Option<&str>| PerfOpts {
            duration: Some(0.3),
            verify: server.is_some() && test != Test::Atomic { cmp_swap: false },
            ..po(server, port, test, false, 2)
        };
        let (s, c) = common::pair(
            40 + k as u8,
            move |ep| perf(ep, &timed(None)),
            move |ep| perf(ep, &timed(Some("127.0.0.1"))),
        );
        let s = s.unwrap_or_else(|e| panic!("{what}: server: {e}"));
        let c = c.unwrap_or_else(|e| panic!("{what}: client: {e}"));
        let rep = c.report.expect("the client reports");
        assert_eq!(rep.errors, 0, "{what}: {:?}", rep.first_error);
        assert!(
            rep.seconds >= 0.3 && rep.seconds < 20.0,
            "{what}: {} s",
            rep.seconds
        );
        assert!(rep.messages > 2 * 100, "{what}: {} messages", rep.messages);
        assert_eq!(rep.iters, rep.messages, "{what}");
        if test != (Test::Atomic { cmp_swap: false }) {
            assert_eq!(rep.verified, Some(true), "{what}: {}", rep.verify_detail);
        }
        let got = s.report.expect("the server has the client's report");
        assert_eq!(got.iters, rep.messages, "{what}");
    }
}

#[test]
fn latency_every_test() {
    for (k, test) in TESTS.into_iter().enumerate() {
        let what = format!("{test:?} lat");
        let port = free_tcp_port();
        let (s, c) = common::pair(
            30 + k as u8,
            move |ep| perf(ep, &po(None, port, test, true, 1)),
            |ep| perf(ep, &po(Some("127.0.0.1"), port, test, true, 1)),
        );
        let s = s.unwrap_or_else(|e| panic!("{what}: server: {e}"));
        let c = c.unwrap_or_else(|e| panic!("{what}: client: {e}"));
        assert!(s.report.is_none(), "{what}: the server measures nothing");
        let rep = c.report.expect("the client reports");
        assert_eq!(rep.errors, 0, "{what}");
        assert_eq!(rep.iters, 100, "{what}");
        assert_eq!(rep.qps, 1, "{what}");
        assert_eq!(rep.verified, None, "{what}");
        // write_lat's first message starts no timer (the server writes first).
        let want = if test == Test::Write { 99 } else { 100 };
        assert_eq!(rep.lat_us.len(), want, "{what}");
        assert_eq!(rep.messages, want as u64, "{what}");
        assert!(
            rep.lat_us.windows(2).all(|w| w[0] <= w[1]),
            "{what}: sorted"
        );
        assert!(rep.lat_us[0] > 0.0, "{what}");
        let j = rep.to_json();
        assert!(j["lat_us"]["p50"].as_f64().unwrap() > 0.0, "{what}");
    }
}

#[test]
fn a_server_answers_clients_one_after_another() {
    let port = free_tcp_port();
    let (s, c) = common::pair(
        40,
        move |ep| {
            let mut seen = Vec::new();
            let failed = perf_serve(
                ep,
                &po(None, port, Test::Write, false, 2),
                Some(2),
                |n, out| {
                    seen.push((
                        n,
                        out.as_ref()
                            .map(|o| o.report.as_ref().map(|r| r.iters))
                            .ok(),
                    ))
                },
            );
            (failed, seen)
        },
        |ep| {
            (0..2)
                .map(|_| perf(ep, &po(Some("127.0.0.1"), port, Test::Write, false, 2)))
                .collect::<Vec<_>>()
        },
    );
    let (failed, seen) = s;
    assert_eq!(failed, Ok(0));
    assert_eq!(seen, vec![(1, Some(Some(200))), (2, Some(Some(200)))]);
    for c in c {
        let rep = c
            .expect("a client's run")
            .report
            .expect("the client reports");
        assert_eq!(rep.verified, Some(true), "{}", rep.verify_detail);
        assert_eq!(rep.messages, 200);
    }
}
