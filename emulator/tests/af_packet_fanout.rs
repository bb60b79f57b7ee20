//! A device on several threads over one interface: three packet sockets in one fanout group
//! (`AfPacketOptions::fanout`), and the group's eBPF program hands every RoCEv2 frame, IPv4 and
//! IPv6, to the socket of the shard that has its QP — the shard `Rnic::shard_of_qpn` names —
//! and everything else (ARP, QP1) to shard 0. A veth pair in a network namespace of its own.
//! Needs root (scripts/test runs as root).
mod netns;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort, Fanout};
use rocemu_emulator::port::Port;
use rocemu_emulator::rnic::{Rnic, RnicConfig, Shard};
use rocemu_wire::eth::Mac;
use rocemu_wire::Qpn;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "rnfo";
const OURS4: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);
const OURS6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x97, 0, 0, 0, 0, 0, 1);
const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x07];
const SHARDS: u32 = 3;

/// A RoCEv2 frame to `dst` whose BTH names `qpn`, numbered `n` in its payload.
fn roce(mac: [u8; 6], dst: IpAddr, qpn: u32, n: u32) -> Vec<u8> {
    let mut f = mac.to_vec();
    f.extend_from_slice(&SRC);
    let mut bth = vec![0x0a, 0, 0xff, 0xff, 0];
    bth.extend_from_slice(&qpn.to_be_bytes()[1..]);
    bth.extend_from_slice(&[0, 0, 0, 1]);
    let mut l4 = 49152u16.to_be_bytes().to_vec();
    l4.extend_from_slice(&4791u16.to_be_bytes());
    let udp_len = 8 + bth.len() + 16 + 4;
    l4.extend_from_slice(&(udp_len as u16).to_be_bytes());
    l4.extend_from_slice(&[0, 0]);
    l4.extend_from_slice(&bth);
    l4.extend_from_slice(&n.to_be_bytes());
    l4.resize(udp_len, 0);
    match dst {
        IpAddr::V4(d) => {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0]);
            f[16..18].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            f.extend_from_slice(&[10, 97, 0, 2]);
            f.extend_from_slice(&d.octets());
            let sum = rocemu_wire::ip::ipv4_checksum(&f[14..34]);
            f[24..26].copy_from_slice(&sum.to_be_bytes());
        }
        IpAddr::V6(d) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(udp_len as u16).to_be_bytes());
            f.extend_from_slice(&[17, 64]);
            f.extend_from_slice(&Ipv6Addr::new(0xfd00, 0x97, 0, 0, 0, 0, 0, 2).octets());
            f.extend_from_slice(&d.octets());
        }
    }
    f.extend_from_slice(&l4);
    f
}

/// An ARP request for our IPv4 address, numbered `n` in its target hardware address.
fn arp(n: u32) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[10, 97, 0, 2, 0, 0]);
    f.extend_from_slice(&n.to_be_bytes());
    f.extend_from_slice(&OURS4.octets());
    f
}

/// The number a frame of this test carries, if it is one.
fn number(f: &[u8]) -> Option<u32> {
    if f.len() < 42 || f[6..12] != SRC {
        return None;
    }
    let at = match u16::from_be_bytes([f[12], f[13]]) {
        0x0806 => 34,
        0x0800 => 14 + 20 + 8 + 12,
        0x86dd => 14 + 40 + 8 + 12,
        _ => return None,
    };
    Some(u32::from_be_bytes(f.get(at..at + 4)?.try_into().ok()?))
}

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
        want.push((roce(mac, dst, qpn, n), k));
    }
    for n in 3000..3020u32 {
        want.push((arp(n), 0));
    }
    let per_shard: Vec<usize> = (0..SHARDS as usize)
        .map(|k| want.iter().filter(|w| w.1 == k).count())
        .collect();
    assert!(per_shard.iter().all(|&c| c > 500), "{per_shard:?}");

    let mut queue: Vec<&Vec<u8>> = want.iter().rev().map(|w| &w.0).collect();
    let mut got: Vec<Option<usize>> = vec![None; want.len()];
    let mut wrong = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) && got.iter().any(Option::is_none) {
        tx.tx_burst(16, &mut |b| {
            let f = queue.pop()?;
            b[..f.len()].copy_from_slice(f);
            Some(f.len())
        });
        tx.flush();
        for (k, p) in ports.iter_mut().enumerate() {
            p.rx_burst(32, &mut |f| {
                if let Some(n) = number(f) {
                    let n = n as usize;
                    assert!(got[n].is_none(), "frame {n} read twice");
                    got[n] = Some(k);
                    if want[n].1 != k {
                        wrong.push((n, k, want[n].1));
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let lost = got.iter().filter(|g| g.is_none()).count();
    assert_eq!(lost, 0, "frames no shard read");
    assert!(
        wrong.is_empty(),
        "(frame, read by, should be) {:?}",
        &wrong[..wrong.len().min(10)]
    );
}
