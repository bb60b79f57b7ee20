//! The AF_PACKET port spares the kernel's IP stack the RoCEv2 datagrams it has read: with its
//! tcx ingress program the namespace's `Ip: InReceives` does not move while the port reads every
//! frame; with `ROCEMU_AF_PACKET_TCX=0` it counts each one. Frames to other addresses, or to
//! other UDP ports, still reach the kernel. A veth pair in a network namespace of its own, the
//! port's address configured on its end as a user's would be. Needs root (scripts/test runs as
//! root).
mod netns;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::Port;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "rngt";
const OURS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x03];

/// An IPv4 UDP frame to `dst`:`dport` from 10.96.0.2, with a 64-byte payload.
fn frame(mac: [u8; 6], dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut f = mac.to_vec();
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[
        0x08, 0x00, 0x45, 0, 0, 92, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 96, 0, 2,
    ]);
    f.extend_from_slice(&dst.octets());
    // The IPv4 header checksum, so that the kernel counts the datagram as received.
    let sum = rocemu_wire::ip::ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&49152u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 72, 0, 0]);
    f.resize(14 + 92, 0xab);
    f
}

/// `Ip: InReceives` of the calling thread's network namespace.
fn ip_in_receives() -> u64 {
    let t = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
    let mut ip = t.lines().filter(|l| l.starts_with("Ip:"));
    let (names, values) = (ip.next().unwrap(), ip.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "InReceives")
        .unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// Sends `frames` from `tx` to `rx` and returns (frames `rx` read, the change of InReceives).
fn send(tx: &mut AfPacketPort, rx: &mut AfPacketPort, frames: &[Vec<u8>]) -> (usize, u64) {
    let before = ip_in_receives();
    let mut queue: Vec<&Vec<u8>> = frames.iter().rev().collect();
    let mut got = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(700) {
        tx.tx_burst(32, &mut |b| {
            let f = queue.pop()?;
            b[..f.len()].copy_from_slice(f);
            Some(f.len())
        });
        tx.flush();
        rx.rx_burst(32, &mut |f| {
            if f.len() >= 12 && f[6..12] == SRC {
                got += 1;
            }
        });
    }
    (got, ip_in_receives() - before)
}

#[test]
fn the_kernel_does_not_see_the_datagrams_the_port_read() {
    let _ns = netns::veth_ns(NS, "rngt0", "rngt1", |i| {
        let _ = Command::new("ip")
            .args(["netns", "exec", NS, "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{i}.disable_ipv6=1"))
            .status();
    });
    netns::ip(&["-n", NS, "addr", "add", "10.96.0.1/24", "dev", "rngt0"]);
    let opts = AfPacketOptions {
        promiscuous: false,
        addrs: vec![IpAddr::V4(OURS)],
        fanout: None,
    };
    let mut tx = AfPacketPort::open("rngt1", &AfPacketOptions::default()).expect("open rngt1");
    let n = 500;
    {
        let mut rx = AfPacketPort::open("rngt0", &opts).expect("open rngt0");
        assert!(rx.drops_at_ingress(), "the tcx program was attached");
        let ours: Vec<_> = (0..n).map(|_| frame(rx.mac().0, OURS, 4791)).collect();
        let (got, seen) = send(&mut tx, &mut rx, &ours);
        assert_eq!(got, n, "the port read every datagram");
        assert!(seen < 5, "the kernel's IP stack received {seen} of them");
        // Not ours to drop: another UDP port, another address (the port's filter does not
        // read them; the kernel does).
        let other: Vec<_> = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    frame(rx.mac().0, OURS, 4792)
                } else {
                    frame(rx.mac().0, Ipv4Addr::new(10, 96, 0, 9), 4791)
                }
            })
            .collect();
        let (got, seen) = send(&mut tx, &mut rx, &other);
        assert_eq!(got, 0);
        assert!(seen >= n as u64, "the kernel received {seen} of {n}");
    }
    // Without the program (and once the port that had it is gone: the link went with it).
    for env in [true, false] {
        if env {
            std::env::set_var("ROCEMU_AF_PACKET_TCX", "0");
        }
        // With the variable: not asked to; without an address: nothing to drop for (and the
        // first port's program must be gone).
        let o = if env {
            opts.clone()
        } else {
            AfPacketOptions::default()
        };
        let mut rx = AfPacketPort::open("rngt0", &o).expect("open");
        std::env::remove_var("ROCEMU_AF_PACKET_TCX");
        assert!(!rx.drops_at_ingress());
        let ours: Vec<_> = (0..n).map(|_| frame(rx.mac().0, OURS, 4791)).collect();
        let (got, seen) = send(&mut tx, &mut rx, &ours);
        assert_eq!(got, n);
        assert!(seen >= n as u64, "the kernel received {seen} of {n}");
    }
}
