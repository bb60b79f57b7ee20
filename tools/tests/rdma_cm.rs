//! `--rdma-cm` between two RoCEmu endpoints in one process (two engines over an in-memory pipe):
//! `rocemu pingpong --rdma-cm` (the QP connected through the IB CM alone, no TCP) and `rocemu
//! perf --rdma-cm` (perftest's `-R`: the exchange as SENDs on an RC QP connected through the
//! CM, then the test QPs through the CM too), every byte checked where the test allows it.
//! No root needed. The same code runs against `ib_*_bw -R` in `scripts/interop-tests`.
mod common;

use rocemu_emulator::port::pipe::pipe;
use rocemu_emulator::rnic::*;
use rocemu_tools::perf::Test;
use rocemu_tools::pingpong::{pingpong, PingpongOpts};
use rocemu_tools::remote::{perf, PerfOpts};
use rocemu_wire::eth::Mac;

fn pp(server: Option<&str>, transport: QpType) -> PingpongOpts {
    PingpongOpts {
        server: server.map(str::to_string),
        port: 18515,
        size: 3000,
        iters: 50,
        mtu: Mtu::M1024,
        rx_depth: 16,
        check: false,
        transport,
        imm: None,
        rdma_cm: true,
    }
}

#[test]
fn pingpong_connects_through_the_cm() {
    let (s, c) = common::pair(
        8,
        |ep| pingpong(ep, &pp(None, QpType::Rc)).map(|r| r.lines()),
        |ep| pingpong(ep, &pp(Some("10.8.0.1"), QpType::Rc)).map(|r| r.lines()),
    );
    let (s, c) = (s.unwrap(), c.unwrap());
    // Each side knows the other's QP from the CM: "remote address: LID …, QPN 0x…".
    for (lines, peer) in [(&s, "10.8.0.2"), (&c, "10.8.0.1")] {
        assert!(
            lines.iter().any(|l| l.contains("remote address")),
            "{lines:?}"
        );
        assert!(
            lines.iter().any(|l| l.contains("300000 bytes")),
            "{peer}: {lines:?}"
        );
    }
}

/// As Linux's rdma_cm (wire/tests/data/cm/rping.pcap): the REQ's primary path carries the flow
/// label of the two ports, and both ends of the connected QP send from the UDP source port
/// derived from it, not from their QPNs.
#[test]
fn the_req_flow_label_sets_both_ends_udp_source_port() {
    use rocemu_wire::capture::CaptureReader;
    use rocemu_wire::cm::{rdma_cm_flow_label, CmMadRepr, CmMessage, CmaHdr, ServiceId};
    use rocemu_wire::frame::{parse_frame, udp_sport_for_flow};
    use rocemu_wire::mad::gsi_payload;
    use rocemu_wire::Qpn;
    let dir = std::env::temp_dir().join(format!("rocemu-cm-fl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("client.pcap");
    let p2 = pcap.clone();
    let (s, c) = common::pair(
        8,
        |ep| pingpong(ep, &pp(None, QpType::Rc)).map(|r| r.lines()),
        move |ep| {
            ep.engine.record(&p2).unwrap();
            let r = pingpong(ep, &pp(Some("10.8.0.1"), QpType::Rc)).map(|r| r.lines());
            ep.engine.finish_recording().unwrap();
            r
        },
    );
    s.unwrap();
    c.unwrap();
    let frames: Vec<Vec<u8>> = CaptureReader::open(&pcap)
        .unwrap()
        .map(|f| f.unwrap().data)
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    let mads: Vec<CmMessage> = frames
        .iter()
        .filter_map(|f| parse_frame(f).ok().and_then(|p| gsi_payload(&p)))
        .filter_map(|m| CmMadRepr::parse(m).ok().map(|r| r.msg))
        .collect();
    let Some(CmMessage::Req(req)) = mads.iter().find(|m| matches!(m, CmMessage::Req(_))) else {
        panic!("no REQ in {} frames", frames.len());
    };
    let Some(CmMessage::Rep(rep)) = mads.iter().find(|m| matches!(m, CmMessage::Rep(_))) else {
        panic!("no REP");
    };
    let cma = CmaHdr::parse(&req.private_data).unwrap();
    assert_eq!(
        req.service_id,
        ServiceId::rdma_cm(rocemu_wire::cm::PortSpace::TCP, 18515)
    );
    let fl = rdma_cm_flow_label(cma.src_port, 18515);
    assert_ne!(fl, 0);
    assert_eq!(req.primary_path.flow_label, fl);
    let sport = udp_sport_for_flow(fl, req.local_qpn, rep.local_qpn);
    let mut data = 0;
    for f in &frames {
        let Ok(p) = parse_frame(f) else { continue };
        if p.bth.dqpn == Qpn::GSI {
            continue;
        }
        assert_eq!(p.udp.sport, sport, "{:?} {:?}", p.opcode(), p.bth.dqpn);
        data += 1;
    }
    // Both directions: the client's SENDs and ACKs, and the server's.
    assert!(data >= 200, "{data} data frames");
}

#[test]
fn pingpong_rdma_cm_is_rc_only() {
    let (pa, _pb) = pipe(Mac([2, 0, 0, 0, 8, 1]), Mac([2, 0, 0, 0, 8, 2]), 1500);
    let e = pingpong(&mut common::endpoint(pa, 8, 1), &pp(None, QpType::Uc)).unwrap_err();
    assert!(e.contains("--transport rc"), "{e}");
}

fn po(server: Option<&str>, test: Test, lat: bool, qps: usize) -> PerfOpts {
    PerfOpts {
        test,
        server: server.map(str::to_string),
        port: 18515,
        size: if matches!(test, Test::Atomic { .. }) {
            8
        } else {
            5000
        },
        iters: 64,
        duration: None,
        qps,
        mtu: Mtu::M1024,
        tx_depth: 16,
        cq_mod: 1,
        verify: server.is_some() && !lat && test != Test::Send,
        qp_timeout: 14,
        lat,
        rdma_cm: true,
        out_reads: None,
    }
}

#[test]
fn perf_rdma_cm_every_test() {
    for (test, lat, qps) in [
        (Test::Write, false, 3),
        (Test::Read, false, 2),
        (Test::Send, false, 2),
        (Test::Atomic { cmp_swap: false }, false, 1),
        (Test::Write, true, 1),
        (Test::Read, true, 1),
        (Test::Send, true, 1),
    ] {
        let what = format!("{test:?} lat={lat} qps={qps}");
        let (s, c) = common::pair(
            8,
            move |ep| perf(ep, &po(None, test, lat, qps)),
            |ep| perf(ep, &po(Some("10.8.0.1"), test, lat, qps)),
        );
        let s = s.unwrap_or_else(|e| panic!("{what}: server: {e}"));
        let c = c.unwrap_or_else(|e| panic!("{what}: client: {e}"));
        assert_eq!(s.peer_version, "6.06", "{what}");
        let rep = c.report.expect("the client reports");
        assert_eq!(rep.errors, 0, "{what}: {:?}", rep.first_error);
        if !lat {
            assert_eq!(rep.messages, 64 * qps as u64, "{what}");
        }
        if let Some(ok) = rep.verified {
            assert!(ok, "{what}: {}", rep.verify_detail);
        }
        // The server of a write/read/atomic test prints the client's report, sent over the
        // rdma_cm exchange QP.
        if !lat && test != Test::Send {
            let got = s.report.expect("the server has the client's report");
            assert_eq!(got.iters, 64 * qps as u64, "{what}");
        }
    }
}

/// perftest `-R`'s 56-byte binary address messages, read from a real `ib_write_bw -R` between two
/// rxe peers (wire/tests/data/cm/write_bw_rdma_cm.pcap): the server's last address names the
/// rkey and address that the client's first RDMA WRITE then carries in its RETH; and what
/// RoCEmu writes reads back the same.
#[test]
fn perftest_binary_address_messages_of_a_real_run() {
    use rocemu_tools::oob::{PerftestDest, PERFTEST_DEST_LEN_BINARY};
    use rocemu_wire::capture::CaptureReader;
    use rocemu_wire::frame::parse_frame;
    use rocemu_wire::Opcode;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../wire/tests/data/cm/write_bw_rdma_cm.pcap");
    let frames: Vec<Vec<u8>> = CaptureReader::open(&path)
        .unwrap()
        .map(|f| f.unwrap().data)
        .collect();
    let mut from_server = Vec::new();
    let mut first_write = None;
    for f in &frames {
        let p = parse_frame(f).unwrap();
        let server = p.ip.src().to_string() == "10.99.0.11";
        if p.opcode() == Opcode::RC_SEND_ONLY && p.payload.len() == PERFTEST_DEST_LEN_BINARY {
            let d = PerftestDest::from_binary(p.payload).unwrap();
            // Round trip: everything the reader takes survives.
            assert_eq!(PerftestDest::from_binary(&d.to_binary()).unwrap(), d);
            if server {
                from_server.push(d);
            }
        }
        if p.opcode() == Opcode::RC_RDMA_WRITE_FIRST && first_write.is_none() {
            first_write = p.ext.reth;
        }
    }
    let reth = first_write.expect("the test's first WRITE");
    assert!(from_server.len() >= 5, "{from_server:?}");
    let last = from_server.last().unwrap();
    assert_eq!((last.rkey, last.vaddr), (reth.rkey.0, reth.va), "{last:?}");
    assert_eq!(&last.gid[10..], &[0xff, 0xff, 10, 99, 0, 11]);
    // Malformed: a short message, and a QPN beyond 24 bits.
    assert!(PerftestDest::from_binary(&[0; 55]).is_err());
    let mut big = last.to_binary();
    big[8] = 1;
    assert!(PerftestDest::from_binary(&big).is_err());
}

/// A forged REQ from an address that never answers ARP, a forged DREQ and a forged REJ reach an
/// `rping -s` before the real client: the server answers none of them synchronously, counts
/// them, and serves the client. (Before, the REQ was accepted first and its 5 s ARP failure,
/// or the DREP's, ended the server.)
#[test]
fn forged_mads_from_unresolvable_sources_do_not_stop_an_rping_server() {
    use rocemu_tools::forge_cm::{frame, mad, Forged};
    use rocemu_tools::rping::{rping, rping_counted, RpingOpts};
    use std::net::IpAddr;
    let server: IpAddr = "10.8.0.1".parse().unwrap();
    let server_mac = Mac([2, 0, 0, 0, 8, 1]);
    let forger = Mac([2, 0x66, 0, 0, 0, 1]);
    let frames: Vec<Vec<u8>> = [
        (Forged::Req { port: 7174 }, "10.201.0.7", 0x1234),
        (Forged::Dreq, "10.201.0.8", 0x2345),
        (Forged::Rej, "10.201.0.9", 0x3456),
    ]
    .into_iter()
    .map(|(k, src, id)| {
        let src: IpAddr = src.parse().unwrap();
        frame(forger, src, server_mac, server, &mad(k, src, server, id, 7))
    })
    .collect();
    let opts = |server: Option<IpAddr>| RpingOpts {
        server,
        port: 7174,
        count: 5,
        size: 64,
        verbose: false,
        validate: true,
    };
    let t = std::time::Instant::now();
    let (s, c) = common::pair_injected(
        8,
        &frames,
        move |ep| rping_counted(ep, &opts(None)),
        |ep| {
            // Let the forged MADs be seen first.
            std::thread::sleep(std::time::Duration::from_millis(200));
            rping(ep, &opts(Some(server)))
        },
    );
    let (s, report) = s;
    let c = c.unwrap();
    let s = s.unwrap();
    assert!(c.iter().any(|l| l.contains("5 iterations")), "{c:?}");
    assert!(s.iter().any(|l| l.contains("5 iterations")), "{s:?}");
    // The forged REQ was received and, its sender never resolving, forgotten or never chosen;
    // the DREQ (for no connection) and the REJ were counted as for unknown connections; the
    // DREP to the DREQ's source waited for a MAC that never came.
    assert_eq!(report.cm.reqs_received, 2, "{}", report.line);
    assert_eq!(report.cm.unknown_connection, 2, "{}", report.line);
    assert!(report.gsi.mads_deferred >= 1, "{}", report.line);
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
}
