//! The port's faults as rdma_rxe counts them: a veth end going down is one `link_downed` (the
//! kernel's ENETDOWN on the packet socket, once per NETDEV_DOWN), and a frame the kernel then
//! refuses is a `send_err`, on the port and, through the engine, on the RNIC. A veth pair in a
//! network namespace of its own. Needs root (scripts/test runs as root).
#![allow(unsafe_code)]
mod netns;
use rocemu_emulator::engine::Engine;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const NS: &str = "rngl";

#[test]
fn a_link_going_down_is_one_link_downed_and_a_refused_frame_a_send_err() {
    let _ns = netns::veth_ns(NS, "rngl0", "rngl1", |_| {});
    let me = IpAddr::V4(Ipv4Addr::new(10, 97, 0, 1));
    let port = AfPacketPort::open(
        "rngl0",
        &AfPacketOptions {
            promiscuous: false,
            addrs: vec![me],
            fanout: None,
        },
    )
    .expect("open rngl0");
    let mut rnic = Rnic::new(RnicConfig::new(port.mac(), me, 1));
    let mut e = Engine::new(Box::new(port));
    for _ in 0..10 {
        e.poll(&mut rnic);
    }
    assert_eq!(rnic.counters().link_downed, 0);
    assert_eq!(rnic.counters().send_err, 0);

    netns::ip(&["-n", NS, "link", "set", "rngl0", "down"]);
    // The memory-mapped rings read the socket's error every 64 empty receive bursts.
    for _ in 0..200 {
        e.poll(&mut rnic);
    }
    assert_eq!(e.port().stats().link_downed, 1);
    assert_eq!(
        rnic.counters().link_downed,
        1,
        "one NETDEV_DOWN, counted once"
    );

    // An ARP request on the downed link: the kernel refuses it (ENETDOWN) and the port drops
    // it, each one a send_err.
    let peer = IpAddr::V4(Ipv4Addr::new(10, 97, 0, 2));
    let err = e
        .resolve(&mut rnic, peer, Duration::from_millis(100))
        .unwrap_err();
    assert!(err.contains("no answer"), "{err}");
    let dropped = e.port().stats().tx_dropped;
    assert!(dropped >= 1, "the ARP request was refused");
    assert_eq!(rnic.counters().send_err, dropped);
    assert_eq!(rnic.counters().link_downed, 1);
}
