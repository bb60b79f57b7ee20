//! Responder resources over the wire: a `rocemu perf read` server facing a client that
//! advertises out_reads = 1 (perftest's `-o 1`) must still keep its own 16 responder resources,
//! since the client keeps up to 16 READs in flight (its initiator depth is the server's
//! out_reads). With one, the server could not re-execute a retransmitted READ older than the
//! latest: the client's requester timed out. Two endpoints in one process over a pipe, the
//! server's first READ response lost on the way out.
use rocemu_emulator::engine::Engine;
use rocemu_emulator::port::impair::LoseFirst;
use rocemu_emulator::port::pipe::pipe;
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Mtu, Rnic, RnicConfig};
use rocemu_tools::perf::Test;
use rocemu_tools::remote::{perf, Endpoint, PerfOpts};
use rocemu_wire::eth::Mac;
use rocemu_wire::frame::parse_frame;
use rocemu_wire::Opcode;
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::atomic::Ordering;

fn free_tcp_port() -> u16 {
    let l = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    l.local_addr().unwrap().port()
}

fn is_read_response(f: &[u8]) -> bool {
    parse_frame(f).is_ok_and(|p| {
        matches!(
            p.opcode(),
            Opcode::RC_RDMA_READ_RESPONSE_ONLY | Opcode::RC_RDMA_READ_RESPONSE_FIRST
        )
    })
}

/// Endpoint 10.11.0.`last` (MAC 02:00:00:00:0b:`last`) on `port`, Ethernet MTU 1500.
fn endpoint(port: Box<dyn Port + Send>, last: u8) -> Endpoint {
    let ip = IpAddr::V4(Ipv4Addr::new(10, 11, 0, last));
    let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 11, last]), ip, last as u64);
    cfg.eth_mtu = 1500;
    Endpoint {
        rnic: Rnic::new(cfg),
        engine: Engine::new(port),
    }
}

fn opts(server: Option<String>, port: u16, out_reads: Option<u16>) -> PerfOpts {
    PerfOpts {
        test: Test::Read,
        server,
        port,
        size: 64,
        iters: 64,
        duration: None,
        qps: 1,
        mtu: Mtu::M1024,
        tx_depth: 16,
        cq_mod: 1,
        verify: false,
        // 4.096 µs × 2^10: a lost response costs milliseconds, not the default quarter second.
        qp_timeout: 10,
        lat: false,
        rdma_cm: false,
        out_reads,
    }
}

#[test]
fn a_peer_advertising_one_read_still_gets_its_lost_read_re_executed() {
    let port = free_tcp_port();
    let (pa, pb) = pipe(Mac([2, 0, 0, 0, 11, 1]), Mac([2, 0, 0, 0, 11, 2]), 1500);
    let server_port = LoseFirst::new(pa, 1, is_read_response);
    let lost = server_port.lost();
    let so = opts(None, port, None);
    let s = std::thread::spawn(move || perf(&mut endpoint(Box::new(server_port), 1), &so));
    // The client: perftest's `ib_read_bw -o 1`, it accepts one read as responder.
    let mut co = opts(Some("127.0.0.1".into()), port, Some(1));
    co.verify = true;
    let mut ep = endpoint(Box::new(pb), 2);
    let c = perf(&mut ep, &co);
    while !s.is_finished() {
        let w = ep.engine.poll(&mut ep.rnic);
        ep.engine.idle(w);
    }
    let s = s.join().unwrap();
    assert_eq!(lost.load(Ordering::Relaxed), 1, "one READ response lost");
    let c = c.expect("the client's run");
    let rep = c.report.expect("the client reports");
    assert_eq!(
        rep.errors, 0,
        "error completions on the client: {:?}",
        rep.first_error
    );
    assert_eq!(rep.verified, Some(true), "{}", rep.verify_detail);
    assert!(rep.retransmits >= 1, "the lost READ was sent again");
    s.expect("the server's run");
}
