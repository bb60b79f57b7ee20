//! Jumbo frames through DPDK drivers on kernel interfaces, in a network namespace of its own
//! with two veth pairs at MTU 9000: `net_pcap` on both ends of one takes the interface's MTU
//! and carries every frame up to 9014 bytes (a RoCEv2 frame at path MTU 4096 is 4154) exactly,
//! both ways; on the other pair a port opened at MTU 1500 gets a 4154-byte frame chained over
//! two mbufs and drops it, counted, while the frames around it arrive; `net_af_packet` and
//! `net_tap` either do MTU 9000 or say why not. One test function: the EAL can be initialised
//! once per process. Needs root (scripts/test runs as root).
mod common;

use rocemu_dpdk::{DpdkConfig, DpdkPort, Eal, EthConfig};
use rocemu_emulator::port::{Port, BURST};
use rocemu_wire::eth::Mac;
use std::time::{Duration, Instant};

/// An EtherType for local experiments (IEEE 802): the kernel ignores it, and frames of any
/// other type (the kernel's own IPv6 chatter) are not ours.
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];
const T: Duration = Duration::from_secs(10);

/// Frame `i` of `len` bytes from `src` to `dst`, its payload depending on `i`.
fn frame(i: usize, len: usize, src: Mac, dst: Mac) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ETHERTYPE);
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.push(x as u8);
    }
    f
}

/// Sends `frames` from `tx` and returns the frames of ours (EtherType and source) that `rx`
/// receives, once as many have come or `T` has passed.
fn send(tx: &mut DpdkPort, rx: &mut DpdkPort, frames: &[Vec<u8>], expect: usize) -> Vec<Vec<u8>> {
    let src = tx.mac();
    let (mut next, mut got) = (0, Vec::new());
    let t = Instant::now();
    while (next < frames.len() || tx.backlog() > 0 || got.len() < expect) && t.elapsed() < T {
        tx.tx_burst(BURST, &mut |buf| {
            let f = frames.get(next)?;
            buf[..f.len()].copy_from_slice(f);
            next += 1;
            Some(f.len())
        });
        rx.rx_burst(BURST, &mut |f| {
            if f.len() >= 14 && f[12..14] == ETHERTYPE && f[6..12] == src.0 {
                got.push(f.to_vec());
            }
        });
    }
    assert_eq!(
        next,
        frames.len(),
        "{}: not every frame was taken",
        tx.name()
    );
    got
}

fn check_same(what: &str, sent: &[Vec<u8>], got: &[Vec<u8>]) {
    assert_eq!(got.len(), sent.len(), "{what}: frames lost or duplicated");
    for (i, (a, b)) in sent.iter().zip(got).enumerate() {
        assert!(
            a == b,
            "{what}: frame {i} went out with {} bytes and came back with {}",
            a.len(),
            b.len()
        );
    }
}

fn open(eal: &Eal, vdev: &str, mtu: Option<u16>) -> rocemu_dpdk::Result<DpdkPort> {
    let id = eal.port_by_name(vdev).unwrap();
    let config = DpdkConfig {
        eth: EthConfig {
            mtu,
            ..EthConfig::default()
        },
        mbufs: 1024,
        ..DpdkConfig::default()
    };
    DpdkPort::open_port(eal, id, &config)
}

/// `open` at MTU 9000 of a driver that may not do it: if it cannot, it has to say why.
fn jumbo_or_reason(eal: &Eal, vdev: &str) {
    match open(eal, vdev, Some(9000)) {
        Ok(p) => {
            assert_eq!(p.mtu(), 9000);
            assert_eq!(p.eth().mtu().unwrap(), 9000);
        }
        Err(e) => {
            let s = e.to_string();
            assert_eq!(e.function(), "rte_eth_dev_configure", "{s}");
            assert!(s.contains("MTU 9000 needs 9018-byte frames"), "{s}");
            assert!(s.contains("bytes at most"), "{s}");
            assert!(s.contains("use net_pcap"), "{s}");
        }
    }
}

#[test]
fn jumbo_frames_on_kernel_interfaces() {
    let ns = common::Netns::new("jumbo");
    let macs: [Mac; 4] = [
        "02:00:5e:00:90:01",
        "02:00:5e:00:90:02",
        "02:00:5e:00:90:03",
        "02:00:5e:00:90:04",
    ]
    .map(|m| m.parse().unwrap());
    for (a, b, ma, mb) in [
        ("jv0", "jv1", macs[0], macs[1]),
        ("kv0", "kv1", macs[2], macs[3]),
    ] {
        let (ma, mb) = (ma.to_string(), mb.to_string());
        ns.ip_in(&[
            "link", "add", a, "mtu", "9000", "address", &ma, "type", "veth", "peer", "name", b,
            "mtu", "9000", "address", &mb,
        ]);
        for i in [a, b] {
            ns.ip_in(&["link", "set", i, "up"]);
        }
    }
    // The EAL opens the drivers' sockets and the tap from this thread, in the namespace.
    ns.enter();
    let (args, _rundir) = common::eal_args(
        "jumbo",
        "--vdev=net_pcap0,iface=jv0,phy_mac=1 --vdev=net_pcap1,iface=jv1,phy_mac=1 \
         --vdev=net_pcap2,iface=kv0,phy_mac=1 --vdev=net_pcap3,iface=kv1,phy_mac=1 \
         --vdev=net_af_packet0,iface=kv0 --vdev=net_af_packet1,iface=kv0 \
         --vdev=net_tap0,iface=rjtap0",
    );
    let eal = Eal::init(&args).unwrap_or_else(|e| panic!("Eal::init({args}): {e}"));

    // The interface's MTU when none is asked for; the interface's MAC (phy_mac=1).
    let mut p0 = open(&eal, "net_pcap0", None).unwrap();
    let mut p1 = open(&eal, "net_pcap1", None).unwrap();
    assert_eq!(p0.eth().driver(), "net_pcap");
    for (p, mac) in [(&p0, macs[0]), (&p1, macs[1])] {
        assert_eq!(p.mtu(), 9000, "{}", p.name());
        assert_eq!(p.eth().mtu().unwrap(), 9000);
        assert_eq!(p.frame_capacity(), 9018);
        assert_eq!(p.mac(), mac);
    }

    // Every size up to the largest untagged frame the kernel passes at MTU 9000 (MTU + 14).
    let sizes = [
        60, 1514, 1515, 2048, 4154, 4155, 8000, 9014, 64, 4154, 9013, 3000,
    ];
    let there: Vec<Vec<u8>> = (0..60)
        .map(|i| frame(i, sizes[i % sizes.len()], macs[0], macs[1]))
        .collect();
    let back: Vec<Vec<u8>> = (0..60)
        .map(|i| frame(1000 + i, sizes[(i + 5) % sizes.len()], macs[1], macs[0]))
        .collect();
    let got = send(&mut p0, &mut p1, &there, there.len());
    check_same("net_pcap0 → net_pcap1", &there, &got);
    let got = send(&mut p1, &mut p0, &back, back.len());
    check_same("net_pcap1 → net_pcap0", &back, &got);
    for p in [&p0, &p1] {
        let s = p.stats();
        assert_eq!((s.tx_dropped, s.rx_dropped), (0, 0), "{}: {s:?}", p.name());
        assert_eq!(s.tx_frames, 60, "{}", p.name());
        assert_eq!(p.pool().in_use(), 0, "{}: mbufs leaked", p.name());
    }
    drop((p0, p1));

    // A port at MTU 1500 on an interface at 9000: a longer frame comes chained, and is dropped
    // and counted, not read as its first segment; the frames around it arrive.
    let mut small = open(&eal, "net_pcap2", Some(1500)).unwrap();
    let mut big = open(&eal, "net_pcap3", None).unwrap();
    assert_eq!((small.mtu(), big.mtu()), (1500, 9000));
    let frames: Vec<Vec<u8>> = [1000, 4154, 1514, 9014, 60]
        .iter()
        .enumerate()
        .map(|(i, &len)| frame(2000 + i, len, macs[3], macs[2]))
        .collect();
    let got = send(&mut big, &mut small, &frames, 3);
    check_same(
        "net_pcap3 → net_pcap2 at MTU 1500",
        &[frames[0].clone(), frames[2].clone(), frames[4].clone()],
        &got,
    );
    assert_eq!(small.stats().rx_dropped, 2, "{:?}", small.stats());
    assert_eq!(small.pool().in_use(), 0, "the chains went back to the pool");
    drop((small, big));

    // Drivers with a lower limit: MTU 9000 works or is refused in words; by default they take
    // the interface's MTU capped at what they can do.
    jumbo_or_reason(&eal, "net_af_packet0");
    let p = open(&eal, "net_af_packet1", None).unwrap();
    assert!((1500..=9000).contains(&p.mtu()), "{}", p.mtu());
    drop(p);
    jumbo_or_reason(&eal, "net_tap0");

    drop(eal);
}
