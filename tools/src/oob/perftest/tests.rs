//! perftest's exchange against itself and against scripted C peers, byte for byte.
use super::*;
use crate::oob::testutil::*;
use crate::oob::OobConfig;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

#[test]
fn perftest_golden_messages() {
    let d = PerftestDest {
        lid: 0,
        out_reads: 0x10,
        qpn: 0x11,
        psn: 0xabcdef,
        rkey: 0x1234,
        vaddr: 0x7f00_1234_5678,
        gid: v4_gid([192, 168, 1, 5]),
        srqn: 0,
    };
    let w = d.to_wire();
    let expect: &[u8] = b"0000:0010:000011:abcdef:00001234:00007f0012345678:\
00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:01:05:00000000:\0";
    assert_eq!(expect.len(), 108);
    assert_eq!(&w[..], expect);
    assert_eq!(PerftestDest::from_wire(&w).unwrap(), d);
    assert!(d.gid_is_ipv4_mapped());

    let n = d.to_wire_no_gid();
    let expect: &[u8] = b"0000:0010:000011:abcdef:00001234:00007f0012345678:00000000\0";
    assert_eq!(expect.len(), 59);
    assert_eq!(&n[..], expect);
    let mut no_gid = d;
    no_gid.gid = [0; 16];
    assert_eq!(PerftestDest::from_wire_no_gid(&n).unwrap(), no_gid);

    let full = PerftestDest {
        lid: 0xffff,
        out_reads: 0xffff,
        qpn: 0xffffff,
        psn: 0xffffff,
        rkey: u32::MAX,
        vaddr: u64::MAX,
        gid: [0xfe; 16],
        srqn: u32::MAX,
    };
    assert_eq!(PerftestDest::from_wire(&full.to_wire()).unwrap(), full);
    assert_eq!(full.to_wire()[107], 0);
    assert!(!full.gid_is_ipv4_mapped());
}

#[test]
fn perftest_malformed_messages_are_errors() {
    let good = PerftestDest {
        qpn: 5,
        gid: v4_gid([1, 1, 1, 1]),
        ..Default::default()
    }
    .to_wire();
    assert!(PerftestDest::from_wire(&good[..107])
        .unwrap_err()
        .message()
        .contains("108 bytes"));
    let mut no_colon = good;
    no_colon[106] = 0;
    assert_eq!(
        PerftestDest::from_wire(&no_colon).unwrap_err().kind(),
        OobErrorKind::Malformed
    );
    let mut bad = good;
    bad[60] = b'x';
    assert!(PerftestDest::from_wire(&bad)
        .unwrap_err()
        .message()
        .contains("GID byte"));
    let mut garbage = [b'z'; 108];
    garbage[107] = 0;
    assert!(PerftestDest::from_wire(&garbage).is_err());
    assert!(PerftestDest::from_wire(&[0u8; 108]).is_err());
    assert!(PerftestDest::from_wire_no_gid(&[0u8; 59]).is_err());
    let mut nonprint = good;
    nonprint[3] = 0x07;
    assert!(PerftestDest::from_wire(&nonprint)
        .unwrap_err()
        .message()
        .contains("\\x07"));
}

#[test]
fn helpers_mirror_c() {
    assert_eq!(version_number("6.06"), 6.06);
    assert_eq!(version_number("5.70abc"), 5.70);
    assert_eq!(version_number(""), 0.0);
    assert_eq!(version_number("x"), 0.0);
    assert_eq!(c_strtol(b"3\0"), 3);
    assert_eq!(c_strtol(b"5\0"), 5);
    assert_eq!(c_strtol(b"\0\0"), 0);
    assert_eq!(mtu_from_enum(3), Some(1024));
    assert_eq!(mtu_from_enum(6), None);
    assert_eq!(mtu_to_enum(4096), Some(5));
    assert_eq!(mtu_to_enum(1500), None);
}

// ---- perftest sessions -------------------------------------------------------------------

fn dests(base_qpn: u32, n: usize, ip: [u8; 4]) -> Vec<PerftestDest> {
    (0..n)
        .map(|i| PerftestDest {
            lid: 0,
            out_reads: 16,
            qpn: base_qpn + i as u32,
            psn: 0x1000 * (i as u32 + 1),
            rkey: 0x100 + i as u32,
            vaddr: 0x5555_0000_0000 + 0x10000 * i as u64,
            gid: v4_gid(ip),
            srqn: 0,
        })
        .collect()
}

/// Runs `test` with both ends of this module over 127.0.0.1; returns (client, server)
/// (negotiated, remote dests, remote report) and the order of events.
#[allow(clippy::type_complexity)]
fn session(
    test: PerftestTest,
    qps: usize,
) -> (
    (Negotiated, Vec<PerftestDest>, Option<BwReport>),
    (Negotiated, Vec<PerftestDest>, Option<BwReport>),
) {
    let (listener, addr) = local_listener();
    let srv_d = dests(0x200, qps, [10, 0, 0, 2]);
    let cli_d = dests(0x100, qps, [10, 0, 0, 1]);
    let (sd, cd) = (srv_d.clone(), cli_d.clone());
    let server = thread::spawn(move || {
        let mut c = PerftestConn::accept(&listener, &cfg()).unwrap();
        assert_eq!(c.role(), Role::Server);
        let neg = c
            .preamble(
                SysData {
                    cycle_buffer: 4096,
                    cache_line_size: 128,
                },
                4096,
            )
            .unwrap();
        let rem = c
            .setup_qps(test, &sd, |r| {
                if r.len() == sd.len() {
                    Ok(())
                } else {
                    Err("n".into())
                }
            })
            .unwrap();
        if test.is_send() {
            c.sync(&sd[0]).unwrap();
        }
        let rep = c.finish(test, &sd[0], &BwReport::default()).unwrap();
        (neg, rem, rep)
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    let neg = c
        .preamble(
            SysData {
                cycle_buffer: 65536,
                cache_line_size: 64,
            },
            1024,
        )
        .unwrap();
    assert_eq!(neg.remote_version, "6.06");
    let rem = c.setup_qps(test, &cd, |_| Ok(())).unwrap();
    if test.is_send() {
        c.sync(&cd[0]).unwrap();
    }
    let mine = BwReport {
        size: 65536,
        iters: 5000,
        bw_peak: 1234.5,
        bw_avg: 1000.25,
        msg_rate_avg: 0.016,
        per_port: None,
    };
    let rep = c.finish(test, &cd[0], &mine).unwrap();
    let client = (neg, rem, rep);
    let server = server.join().unwrap();
    assert_eq!(client.1, srv_d);
    assert_eq!(server.1, cli_d);
    (client, server)
}

#[test]
fn perftest_sessions_agree_for_every_test() {
    let (c, s) = session(PerftestTest::WriteBw, 3);
    for neg in [&c.0, &s.0] {
        assert_eq!(neg.remote_version, "6.06");
        assert_eq!(
            neg.sys,
            SysData {
                cycle_buffer: 65536,
                cache_line_size: 128
            }
        );
        assert_eq!(neg.mtu, 1024);
    }
    assert_eq!(c.0.remote_mtu, Some(4096));
    assert_eq!(s.0.remote_mtu, Some(1024));
    assert_eq!(c.2, Some(BwReport::default()));
    let srv_rep = s.2.unwrap();
    assert_eq!(
        (srv_rep.size, srv_rep.iters, srv_rep.bw_avg),
        (65536, 5000, 1000.25)
    );
    for test in [
        PerftestTest::ReadBw,
        PerftestTest::AtomicBw,
        PerftestTest::SendBw,
        PerftestTest::WriteLat,
        PerftestTest::ReadLat,
        PerftestTest::SendLat,
        PerftestTest::AtomicLat,
    ] {
        let (c, s) = session(test, if test.is_latency() { 1 } else { 2 });
        assert_eq!(
            c.2.is_some(),
            test.exchanges_reports(),
            "{}",
            test.program()
        );
        assert_eq!(
            s.2.is_some(),
            test.exchanges_reports(),
            "{}",
            test.program()
        );
    }
}

fn version_msg(v: &str) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m[..v.len()].copy_from_slice(v.as_bytes());
    m
}

/// The exact byte sequence a C `ib_write_bw` (2 QPs) exchanges, from the side that is not ours.
fn write_bw_transcript(
    we_are: Role,
    ours: &[PerftestDest],
    theirs: &[PerftestDest],
    rep: &BwReport,
) -> Vec<Step> {
    // Their side's (the raw peer's) steps for one xchg: a C client writes first, a C server reads first.
    let x = |mine: Vec<u8>, expect: Vec<u8>| -> Vec<Step> {
        match we_are {
            Role::Server => vec![Step::Send(mine), Step::Expect(expect)],
            Role::Client => vec![Step::Expect(expect), Step::Send(mine)],
        }
    };
    let mut s = Vec::new();
    s.extend(x(version_msg("6.06"), version_msg("6.06")));
    s.extend(x(
        4096u32.to_be_bytes().to_vec(),
        4096u32.to_be_bytes().to_vec(),
    ));
    s.extend(x(
        64u32.to_be_bytes().to_vec(),
        64u32.to_be_bytes().to_vec(),
    ));
    s.extend(x(b"3\0".to_vec(), b"5\0".to_vec()));
    for _round in 0..2 {
        for (t, o) in theirs.iter().zip(ours) {
            s.extend(x(t.to_wire().to_vec(), o.to_wire().to_vec()));
        }
    }
    s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // after RTR
    s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // end of run
    let f = |v: f64| v.to_bits().to_be_bytes().to_vec();
    let zero = vec![0u8; 8];
    let (their_rep, our_rep): (Vec<Vec<u8>>, Vec<Vec<u8>>) = match we_are {
        // The raw peer is a C client: it sends its results, we (server) send zeros.
        Role::Server => (
            vec![
                65536u64.to_be_bytes().to_vec(),
                10000u64.to_be_bytes().to_vec(),
                f(2.5),
                f(2.0),
                f(0.5),
            ],
            vec![zero.clone(), zero.clone(), zero.clone(), zero.clone(), zero],
        ),
        // The raw peer is a C server: it sends garbage, we (client) send our report.
        Role::Client => (
            vec![
                vec![0xaa; 8],
                vec![0xbb; 8],
                vec![0xcc; 8],
                vec![0xdd; 8],
                vec![0xee; 8],
            ],
            vec![
                rep.size.to_be_bytes().to_vec(),
                rep.iters.to_be_bytes().to_vec(),
                f(rep.bw_peak),
                f(rep.bw_avg),
                f(rep.msg_rate_avg),
            ],
        ),
    };
    for (t, o) in their_rep.into_iter().zip(our_rep) {
        s.extend(x(t, o));
    }
    s.extend(x(theirs[0].to_wire().to_vec(), ours[0].to_wire().to_vec())); // close
    s.push(Step::Send(b"done\0".to_vec()));
    s.push(Step::Expect(b"done\0".to_vec()));
    s.push(Step::ExpectEof);
    s
}

#[test]
fn perftest_server_bytes_match_a_c_write_bw_client() {
    let (listener, addr) = local_listener();
    let ours = dests(0x300, 2, [10, 1, 1, 2]);
    let theirs = dests(0x400, 2, [10, 1, 1, 1]);
    let script = write_bw_transcript(Role::Server, &ours, &theirs, &BwReport::default());
    let o = ours.clone();
    let server = thread::spawn(
        move || -> OobResult<(Negotiated, Vec<PerftestDest>, Option<BwReport>)> {
            let mut c = PerftestConn::accept(&listener, &cfg())?;
            let neg = c.preamble(SysData::default(), 4096)?;
            let rem = c.setup_qps(PerftestTest::WriteBw, &o, |_| Ok(()))?;
            let rep = c.finish(PerftestTest::WriteBw, &o[0], &BwReport::default())?;
            Ok((neg, rem, rep))
        },
    );
    run_script(TcpStream::connect(addr).unwrap(), script).unwrap();
    let (neg, rem, rep) = server.join().unwrap().unwrap();
    assert_eq!(neg.mtu, 1024);
    assert_eq!(rem, theirs);
    let rep = rep.unwrap();
    assert_eq!(
        (
            rep.size,
            rep.iters,
            rep.bw_peak,
            rep.bw_avg,
            rep.msg_rate_avg
        ),
        (65536, 10000, 2.5, 2.0, 0.5)
    );
}

#[test]
fn perftest_client_bytes_match_a_c_write_bw_server() {
    let (listener, addr) = local_listener();
    let ours = dests(0x500, 2, [10, 2, 2, 1]);
    let theirs = dests(0x600, 2, [10, 2, 2, 2]);
    let rep = BwReport {
        size: 65536,
        iters: 10000,
        bw_peak: 11.0,
        bw_avg: 10.5,
        msg_rate_avg: 0.25,
        per_port: None,
    };
    let script = write_bw_transcript(Role::Client, &ours, &theirs, &rep);
    let raw = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        run_script(s, script)
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    let neg = c.preamble(SysData::default(), 4096).unwrap();
    assert_eq!(neg.mtu, 1024);
    let rem = c
        .setup_qps(PerftestTest::WriteBw, &ours, |_| Ok(()))
        .unwrap();
    assert_eq!(rem, theirs);
    let got = c
        .finish(PerftestTest::WriteBw, &ours[0], &rep)
        .unwrap()
        .unwrap();
    assert_eq!(got.size, 0xaaaa_aaaa_aaaa_aaaa);
    raw.join().unwrap().unwrap();
}

#[test]
fn perftest_send_bw_order_matches_c() {
    // ib_send_bw as the C client: q × addr, [connect], addr0, q × addr, addr0 (pre-run), close.
    let (listener, addr) = local_listener();
    let ours = dests(0x700, 2, [10, 3, 3, 2]);
    let theirs = dests(0x800, 2, [10, 3, 3, 1]);
    let mut script = vec![
        Step::Send(version_msg("6.06")),
        Step::Expect(version_msg("6.06")),
        Step::Send(vec![0, 0, 0x10, 0]),
        Step::Expect(vec![0, 0, 0x10, 0]),
        Step::Send(vec![0, 0, 0, 64]),
        Step::Expect(vec![0, 0, 0, 64]),
        Step::Send(b"3\0".to_vec()),
        Step::Expect(b"3\0".to_vec()),
    ];
    let mut x = |t: &PerftestDest, o: &PerftestDest| {
        script.push(Step::Send(t.to_wire().to_vec()));
        script.push(Step::Expect(o.to_wire().to_vec()));
    };
    for i in 0..2 {
        x(&theirs[i], &ours[i]);
    }
    x(&theirs[0], &ours[0]);
    for i in 0..2 {
        x(&theirs[i], &ours[i]);
    }
    x(&theirs[0], &ours[0]); // pre-run sync
    x(&theirs[0], &ours[0]); // close
    script.push(Step::Send(b"done\0".to_vec()));
    script.push(Step::Expect(b"done\0".to_vec()));
    script.push(Step::ExpectEof);
    let o = ours.clone();
    let server = thread::spawn(move || -> OobResult<()> {
        let mut c = PerftestConn::accept(&listener, &cfg())?;
        c.preamble(SysData::default(), 1024)?;
        let connected = std::cell::Cell::new(false);
        c.setup_qps(PerftestTest::SendBw, &o, |_| {
            connected.set(true);
            Ok(())
        })?;
        assert!(connected.get());
        c.sync(&o[0])?;
        assert_eq!(
            c.finish(PerftestTest::SendBw, &o[0], &BwReport::default())?,
            None
        );
        Ok(())
    });
    run_script(TcpStream::connect(addr).unwrap(), script).unwrap();
    server.join().unwrap().unwrap();
}

#[test]
fn perftest_rejects_old_versions_and_bad_peers() {
    // A peer claiming 5.60 is refused, like perftest refuses it.
    let (listener, addr) = local_listener();
    let raw = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        run_script(
            s,
            vec![
                Step::Expect(version_msg("6.06")),
                Step::Send(version_msg("5.60")),
            ],
        )
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    let e = c.exchange_versions().unwrap_err();
    assert_eq!(e.kind(), OobErrorKind::Incompatible);
    assert!(e.message().contains("5.60"), "{e}");
    raw.join().unwrap().unwrap();

    // A malformed address from the peer.
    let (listener, addr) = local_listener();
    let raw = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        run_script(
            s,
            vec![
                Step::Expect(PerftestDest::default().to_wire().to_vec()),
                Step::Send(vec![b'?'; 108]),
            ],
        )
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    let e = c.hand_shake(&PerftestDest::default()).unwrap_err();
    assert_eq!(e.kind(), OobErrorKind::Malformed, "{e}");
    raw.join().unwrap().unwrap();

    // Nobody connects: accept times out.
    let idle = TcpListener::bind("127.0.0.1:0").unwrap();
    let quick_accept = OobConfig {
        accept_timeout: Some(Duration::from_millis(100)),
        ..cfg()
    };
    let e = PerftestConn::accept(&idle, &quick_accept).unwrap_err();
    assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");

    // The peer goes away mid-message.
    let (listener, addr) = local_listener();
    let raw = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&[b'0'; 50]).unwrap();
    });
    let mut srv =
        PerftestConn::from_stream(TcpStream::connect(addr).unwrap(), Role::Server, &cfg());
    raw.join().unwrap();
    let e = srv.hand_shake(&PerftestDest::default()).unwrap_err();
    assert_eq!(e.kind(), OobErrorKind::Closed);
    assert!(e.message().contains("50 of the 108 bytes"), "{e}");
    assert_eq!(e.to_string(), e.message());

    // A silent peer times out.
    let (listener, addr) = local_listener();
    let hold = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_millis(700));
        drop(s);
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    c.set_io_timeout(Some(Duration::from_millis(200)));
    let e = c.exchange_versions().unwrap_err();
    assert_eq!(e.kind(), OobErrorKind::Timeout, "{e}");
    hold.join().unwrap();

    // Bad arguments.
    let (listener, addr) = local_listener();
    let keep = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        thread::sleep(Duration::from_millis(300));
        drop(s);
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    assert_eq!(
        c.preamble(SysData::default(), 1500).unwrap_err().kind(),
        OobErrorKind::InvalidInput
    );
    assert_eq!(
        c.setup_qps(PerftestTest::WriteBw, &[], |_| Ok(()))
            .unwrap_err()
            .kind(),
        OobErrorKind::InvalidInput
    );
    keep.join().unwrap();
}

#[test]
fn perftest_reports_with_per_port_and_no_gid_dests() {
    let (listener, addr) = local_listener();
    let pp = PerPortReport {
        bw_avg_p1: 1.0,
        msg_rate_avg_p1: 2.0,
        bw_avg_p2: 3.0,
        msg_rate_avg_p2: 4.0,
    };
    let server = thread::spawn(move || -> OobResult<(BwReport, PerftestDest)> {
        let mut c = PerftestConn::accept(&listener, &cfg())?;
        c.set_dests_with_gid(false);
        let d = c.hand_shake(&PerftestDest {
            qpn: 9,
            ..Default::default()
        })?;
        let r = c.exchange_reports(&BwReport {
            per_port: Some(PerPortReport::default()),
            ..Default::default()
        })?;
        Ok((r, d))
    });
    let mut c = PerftestConn::connect(addr, &cfg()).unwrap();
    c.set_dests_with_gid(false);
    let d = c
        .hand_shake(&PerftestDest {
            qpn: 8,
            rkey: 7,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(d.qpn, 9);
    let mine = BwReport {
        size: 8,
        iters: 1,
        bw_peak: -0.0,
        bw_avg: f64::MAX,
        msg_rate_avg: 1e-9,
        per_port: Some(pp),
    };
    let theirs = c.exchange_reports(&mine).unwrap();
    assert_eq!(theirs.per_port, Some(PerPortReport::default()));
    let (r, d) = server.join().unwrap().unwrap();
    assert_eq!(r, mine);
    assert_eq!((d.qpn, d.rkey), (8, 7));
}
