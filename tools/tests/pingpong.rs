//! `rocemu pingpong` between two RoCEmu endpoints in one process: two engines over an in-memory
//! pipe, the `ibv_rc_pingpong` TCP exchange on the loopback interface. Covers `--imm` (every
//! message with an immediate checked by the receiver, SEND and RDMA WRITE, RC / UC / UD), the
//! failure a missing immediate gives, and `--op write`'s rkey:vaddr message. No root needed.
mod common;
use rocemu_emulator::rnic::*;
use rocemu_tools::oob::imm_pingpong::WriteKey;
use rocemu_tools::pingpong::{pingpong, ImmOp, PingpongOpts};
use std::net::TcpListener;

fn free_tcp_port() -> u16 {
    let l = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    l.local_addr().unwrap().port()
}

/// Runs a server and a client, each with its (`--imm`, iterations); returns both results'
/// lines, or their errors.
fn run(
    transport: QpType,
    size: usize,
    srv: (Option<ImmOp>, u64),
    cli: (Option<ImmOp>, u64),
) -> (Result<Vec<String>, String>, Result<Vec<String>, String>) {
    let port = free_tcp_port();
    let opts = |server: Option<String>, (imm, iters): (Option<ImmOp>, u64)| PingpongOpts {
        server,
        port,
        size,
        iters,
        mtu: Mtu::M1024,
        rx_depth: 16,
        check: false,
        transport,
        imm,
        rdma_cm: false,
    };
    let so = opts(None, srv);
    let co = opts(Some("127.0.0.1".into()), cli);
    // A client that gave up must still acknowledge what the server sends, or the server
    // stalls: `pair` keeps its endpoint turning until the server is done.
    common::pair(
        7,
        move |ep| pingpong(ep, &so).map(|r| r.lines()),
        |ep| pingpong(ep, &co).map(|r| r.lines()),
    )
}

fn checked(lines: &[String]) -> &str {
    lines
        .iter()
        .find(|l| l.contains("immediates checked"))
        .map(String::as_str)
        .unwrap_or("")
}

#[test]
fn immediates_every_transport_and_operation() {
    for (t, op, size) in [
        (QpType::Rc, ImmOp::Send, 3000),
        (QpType::Uc, ImmOp::Send, 3000),
        (QpType::Ud, ImmOp::Send, 1000),
        (QpType::Rc, ImmOp::Write, 3000),
        (QpType::Uc, ImmOp::Write, 1),
    ] {
        let (s, c) = run(t, size, (Some(op), 40), (Some(op), 40));
        let what = format!("{t:?} {op:?}");
        let (s, c) = (s.expect(&what), c.expect(&what));
        for lines in [&s, &c] {
            assert!(
                checked(lines).starts_with("40 immediates checked"),
                "{what}: {lines:?}"
            );
        }
    }
}

#[test]
fn a_message_without_its_immediate_fails_the_receiver() {
    // The server sends plain SENDs; the --imm client must refuse the first one.
    let (s, c) = run(QpType::Rc, 512, (None, 1), (Some(ImmOp::Send), 1));
    assert!(s.is_ok(), "{s:?}");
    let e = c.unwrap_err();
    assert!(e.contains("message 0: no immediate"), "{e}");
}

#[test]
fn write_key_message() {
    let k = WriteKey {
        rkey: 0x1234,
        vaddr: 0x7f00_dead_beef,
    };
    let w = k.to_wire();
    assert_eq!(&w[..], b"00001234:00007f00deadbeef\0");
    assert_eq!(WriteKey::from_wire(&w), Ok(k));
    for bad in [
        &b"00001234:00007f00deadbeef"[..],
        b"00001234-00007f00deadbeef\0",
        b"0000123g:00007f00deadbeef\0",
        b"00001234:+0007f00deadbeef\0",
        b"00001234:00007f00deadbeefx",
    ] {
        assert!(WriteKey::from_wire(bad).is_err(), "{bad:?}");
    }
}
