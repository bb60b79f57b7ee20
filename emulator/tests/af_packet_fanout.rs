//! A device on several threads over one interface: three packet sockets in one fanout group
//! (`AfPacketOptions::fanout`), and the group's eBPF program hands every RoCEv2 frame, IPv4 and
//! IPv6, to the socket of the shard that has its QP — the shard `Rnic::shard_of_qpn` names —
//! and everything else (ARP, QP1) to shard 0. A veth pair in a network namespace of its own.
//! Needs root (scripts/test runs as root).
mod netns;
mod steering;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort, Fanout};
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig, Shard};
use rocemu_wire::eth::Mac;
use rocemu_wire::Qpn;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use steering::{arp, deliver, roce};

const NS: &str = "rnfo";
const OURS4: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);
const OURS6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x97, 0, 0, 0, 0, 0, 1);
const SHARDS: u32 = 3;

#[test]
fn the_fanout_program_hands_each_frame_to_the_shard_of_its_qp() {
    let _ns = netns::veth_ns(NS, "rnfo0", "rnfo1", |_| {});
    netns::ip(&["-n", NS, "addr", "add", "10.97.0.1/24", "dev", "rnfo0"]);
    let _ = Command::new("ip")
        .args([
            "-n",
            NS,
            "addr",
            "add",
            "fd00:97::1/64",
            "dev",
            "rnfo0",
            "nodad",
        ])
        .status();
    let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 0, 1]), IpAddr::V4(OURS4), 41);
    cfg.shard = Shard {
        index: 0,
        count: SHARDS,
    };
    let rnic = Rnic::new(cfg);
    let steering = rnic.qpn_steering();
    let addrs = vec![IpAddr::V4(OURS4), IpAddr::V6(OURS6)];
    let mut ports: Vec<AfPacketPort> = Vec::new();
    for k in 0..SHARDS {
        let fanout = match k {
            0 => Fanout::First(steering),
            _ => Fanout::Join(ports[0].fanout_group().expect("a group")),
        };
        let opts = AfPacketOptions {
            promiscuous: false,
            addrs: addrs.clone(),
            fanout: Some(fanout),
        };
        ports.push(AfPacketPort::open("rnfo0", &opts).unwrap_or_else(|e| panic!("shard {k}: {e}")));
    }
    let mut tx = AfPacketPort::open("rnfo1", &AfPacketOptions::default()).expect("open rnfo1");
    let mac = ports[0].mac().0;

    // QPNs spread over the space, QP1, and the frames that are not RoCE.
    let mut want: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut x: u32 = 0x9e37_79b9;
    for n in 0..3000u32 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let qpn = match n % 100 {
            7 => 1,
            _ => x & 0xff_ffff,
        };
        let dst = if n % 2 == 0 {
            IpAddr::V4(OURS4)
        } else {
            IpAddr::V6(OURS6)
        };
        let k = rnic.shard_of_qpn(Qpn::new(qpn));
        assert_eq!(k as u32, steering.shard_of(qpn));
        want.push((roce(mac, dst, qpn, n, 49152), k));
    }
    for n in 3000..3020u32 {
        want.push((arp(n, OURS4), 0));
    }
    let per_shard: Vec<usize> = (0..SHARDS as usize)
        .map(|k| want.iter().filter(|w| w.1 == k).count())
        .collect();
    assert!(per_shard.iter().all(|&c| c > 500), "{per_shard:?}");

    deliver(&mut tx, &mut ports, &want, 3, |_| {});
}
