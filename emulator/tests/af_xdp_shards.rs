//! A device on two threads over AF_XDP: a socket on each of a veth's two queues
//! (`AfXdpPort::open_shards`), each wrapped so that a frame read on one queue for the other
//! shard's QP goes there through a ring (`port::steered`). Frames with many UDP source ports
//! arrive on both queues; every RoCEv2 frame must come out once, from the port of the shard
//! `Rnic::shard_of_qpn` names, and frames must have been steered both ways. A veth pair in a
//! network namespace of its own. Needs root (scripts/test runs as root).
mod netns;
mod steering;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::af_xdp::AfXdpPort;
use rocemu_emulator::port::steered::steered;
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig, Shard};
use rocemu_wire::eth::Mac;
use rocemu_wire::Qpn;
use std::net::{IpAddr, Ipv4Addr};
use steering::{deliver, roce};

const NS: &str = "rxsh";
const OURS: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);

#[test]
fn frames_read_on_either_queue_reach_the_shard_of_their_qp() {
    let _ns = netns::veth_ns(NS, "rxsh0", "rxsh1", |_| {});
    // Two queues each way (the helper made single-queue ends): remake the pair.
    netns::ip(&["-n", NS, "link", "del", "rxsh0"]);
    netns::ip(&[
        "-n",
        NS,
        "link",
        "add",
        "rxsh0",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        "rxsh1",
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
    ]);
    for i in ["rxsh0", "rxsh1"] {
        netns::ip(&["-n", NS, "link", "set", i, "up"]);
    }
    netns::ip(&["-n", NS, "addr", "add", "10.97.0.1/24", "dev", "rxsh0"]);
    let mut cfg = RnicConfig::new(Mac([2, 0, 0, 0, 0, 1]), IpAddr::V4(OURS), 43);
    cfg.shard = Shard { index: 0, count: 2 };
    let rnic = Rnic::new(cfg);
    let opts = AfPacketOptions {
        promiscuous: false,
        addrs: vec![IpAddr::V4(OURS)],
        fanout: None,
    };
    let xs = AfXdpPort::open_shards("rxsh0", &opts, 2).unwrap_or_else(|e| panic!("{e}"));
    let mac = xs[0].mac().0;
    assert_eq!(xs[1].queue(), 1);
    let boxed: Vec<Box<dyn Port + Send>> = xs
        .into_iter()
        .map(|p| Box::new(p) as Box<dyn Port + Send>)
        .collect();
    let (mut ports, _) = steered(boxed, rnic.qpn_steering());
    let mut tx = AfPacketPort::open("rxsh1", &AfPacketOptions::default()).expect("open rxsh1");

    let mut want: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut x: u32 = 0x2545_f491;
    for n in 0..4000u32 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let qpn = x & 0xff_ffff;
        let k = rnic.shard_of_qpn(Qpn::new(qpn));
        want.push((
            roce(mac, IpAddr::V4(OURS), qpn, n, 49152 + (n % 64) as u16),
            k,
        ));
    }
    // A packet socket's frame leaves on the queue of the sending CPU (af_packet's
    // packet_pick_tx_queue), and a veth delivers it on the same queue: alternate CPUs.
    deliver(&mut tx, &mut ports, &want, 5, |burst| on_cpu(burst % 2));
    // Both queues had frames of the other shard's QPs.
    let steered: Vec<u64> = ports.iter().map(|p| p.steered()).collect();
    assert!(
        steered.iter().all(|&s| s > 100),
        "steered per shard: {steered:?}"
    );
}

/// Moves the calling thread to CPU `c` (of the machine's first two).
fn on_cpu(c: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity reads it within its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(c, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
