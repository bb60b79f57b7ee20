//! `rocemu decode` describes the IB CM MADs on QP1 (text output) from real rdma_rxe captures.
use std::process::Command;

fn decode(path: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rocemu"))
        .args(["decode", path])
        .output()
        .expect("run rocemu decode");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn rping_connects_and_disconnects() {
    let t = decode("wire/tests/data/cm/rping.pcap");
    let cm: Vec<&str> = t
        .lines()
        .filter_map(|l| l.split(" cm ").nth(1))
        .map(|r| r.split(' ').next().unwrap())
        .collect();
    assert_eq!(cm, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert!(t.contains(
        "cm REQ tid=0x212a16b23 comm=0x236ba112 sid=0x0000000001061c06 qpn=0x000011 psn=16103371 mtu=3 cma=10.99.0.12:57476→10.99.0.11"
    ));
}

#[test]
fn a_reject_names_its_reason() {
    let t = decode("wire/tests/data/cm/rej_no_listener.pcap");
    assert!(t.contains(
        "cm REJ tid=0x212a16b20 comm=0x00000000 remote=0x206ba112 invalid service ID (8)"
    ));
}
