//! The AF_PACKET port reads only what the RNIC and the engine use: RoCEv2 to its addresses, ARP
//! and IPv6 neighbour discovery. A veth pair in a network namespace of its own: frames of every
//! kind are sent from one end; only the RoCE and neighbour frames may come out of the other
//! end's `rx_burst`. Needs root (scripts/test runs as root).
#![allow(unsafe_code)]
mod netns;
use rocemu_emulator::port::af_packet::{roce_filter, AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::Port;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "rngf";
const OURS4: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 1);
const OURS6: Ipv6Addr = Ipv6Addr::new(0xfd98, 0, 0, 0, 0, 0, 0, 1);
/// The source MAC of every test frame: frames from anyone else (the kernel) are not counted.
const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x01];

fn setup() -> netns::Ns {
    netns::veth_ns(NS, "rngf0", "rngf1", |i| {
        // No IPv6 on the pair: the kernel's own router solicitations and MLD reports stay away.
        let _ = Command::new("ip")
            .args(["netns", "exec", NS, "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{i}.disable_ipv6=1"))
            .status();
    })
}

/// An Ethernet frame to `dst` from [`SRC`], with an optional 802.1Q tag; `mark` (2 bytes) ends
/// the frame, to tell the frames apart.
fn eth(dst: [u8; 6], vlan: bool, ethertype: u16, l3: &[u8], mark: u16) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&SRC);
    if vlan {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f.extend_from_slice(&[0; 16]);
    f.extend_from_slice(&mark.to_be_bytes());
    f
}

/// An IPv4 header (with `opts` words of options) and 8 bytes of transport header: source
/// and destination ports as UDP and TCP put them.
fn ipv4(proto: u8, dst: Ipv4Addr, dport: u16, frag: u16, opts: usize) -> Vec<u8> {
    let mut h = vec![0x45 + opts as u8, 0, 0, 0, 0, 1];
    h.extend_from_slice(&frag.to_be_bytes());
    h.extend_from_slice(&[64, proto, 0, 0]);
    h.extend_from_slice(&[10, 98, 0, 2]);
    h.extend_from_slice(&dst.octets());
    h.extend(std::iter::repeat_n(1u8, 4 * opts)); // NOP options
    let total = (h.len() + 8 + 18) as u16;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&49152u16.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0, 26, 0, 0]);
    h
}

fn ipv6(next: u8, dst: Ipv6Addr, first8: [u8; 8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0, 0, 26, next, 64];
    h.extend_from_slice(&Ipv6Addr::new(0xfd98, 0, 0, 0, 0, 0, 0, 2).octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(&first8);
    h
}

fn udp6(dport: u16) -> [u8; 8] {
    let d = dport.to_be_bytes();
    [0xc0, 0x00, d[0], d[1], 0, 26, 0, 0]
}

#[test]
fn only_roce_to_our_addresses_and_neighbour_frames_reach_rx_burst() {
    let _ns = setup();
    let opts = AfPacketOptions {
        promiscuous: false,
        addrs: vec![IpAddr::V4(OURS4), IpAddr::V6(OURS6)],
        fanout: None,
    };
    let mut rx = AfPacketPort::open("rngf0", &opts).expect("open rngf0 with the filter");
    let mut tx = AfPacketPort::open("rngf1", &AfPacketOptions::default()).expect("open rngf1");
    let me = rx.mac().0;
    let other4 = Ipv4Addr::new(10, 98, 0, 7);
    let other6 = Ipv6Addr::new(0xfd98, 0, 0, 0, 0, 0, 0, 7);
    let arp = [0, 1, 8, 0, 6, 4, 0, 1];
    let ns = [135, 0, 0, 0, 0, 0, 0, 0];
    let na = [136, 0, 0, 0, 0, 0, 0, 0];
    let echo = [128, 0, 0, 0, 0, 0, 0, 0];
    // (mark, frame, whether it is for the RNIC or the engine)
    let cases: Vec<(u16, Vec<u8>, bool)> = vec![
        (
            1,
            eth(me, false, 0x0800, &ipv4(17, OURS4, 4791, 0, 0), 1),
            true,
        ),
        (
            2,
            eth(me, false, 0x0800, &ipv4(17, OURS4, 53, 0, 0), 2),
            false,
        ),
        (
            3,
            eth(me, false, 0x0800, &ipv4(6, OURS4, 22, 0, 0), 3),
            false,
        ),
        (
            4,
            eth(me, false, 0x0800, &ipv4(6, OURS4, 4791, 0, 0), 4),
            false,
        ),
        (
            5,
            eth(me, false, 0x0800, &ipv4(17, other4, 4791, 0, 0), 5),
            false,
        ),
        (
            6,
            eth(me, false, 0x0800, &ipv4(17, OURS4, 4791, 0, 2), 6),
            true,
        ),
        (
            7,
            eth(me, false, 0x0800, &ipv4(17, OURS4, 4791, 0x00b9, 0), 7),
            false,
        ),
        (8, eth(me, false, 0x0806, &arp, 8), true),
        (
            9,
            eth(me, false, 0x86dd, &ipv6(17, OURS6, udp6(4791)), 9),
            true,
        ),
        (
            10,
            eth(me, false, 0x86dd, &ipv6(17, other6, udp6(4791)), 10),
            false,
        ),
        (
            11,
            eth(me, false, 0x86dd, &ipv6(17, OURS6, udp6(5353)), 11),
            false,
        ),
        (
            12,
            eth(me, false, 0x86dd, &ipv6(6, OURS6, udp6(22)), 12),
            false,
        ),
        (13, eth(me, false, 0x86dd, &ipv6(58, OURS6, ns), 13), true),
        (14, eth(me, false, 0x86dd, &ipv6(58, OURS6, na), 14), true),
        (
            15,
            eth(me, false, 0x86dd, &ipv6(58, OURS6, echo), 15),
            false,
        ),
        // Hop-by-hop options before UDP: RoCEv2 never has them.
        (
            16,
            eth(me, false, 0x86dd, &ipv6(0, OURS6, udp6(4791)), 16),
            false,
        ),
        (
            17,
            eth(me, true, 0x0800, &ipv4(17, OURS4, 4791, 0, 0), 17),
            true,
        ),
        (
            18,
            eth(me, true, 0x0800, &ipv4(6, OURS4, 22, 0, 0), 18),
            false,
        ),
        (19, eth(me, false, 0x88cc, &[0; 8], 19), false),
        // Truncated inside the IPv4 header: the filter's load past the end drops it.
        (
            20,
            eth(me, false, 0x0800, &ipv4(17, OURS4, 4791, 0, 0)[..12], 20)[..26].to_vec(),
            false,
        ),
    ];
    let mut queue: Vec<Vec<u8>> = cases.iter().map(|c| c.1.clone()).collect();
    queue.reverse();
    let mut sent = 0;
    let t = Instant::now();
    while !queue.is_empty() && t.elapsed() < Duration::from_secs(5) {
        sent += tx.tx_burst(64, &mut |b| {
            let f = queue.pop()?;
            b[..f.len()].copy_from_slice(&f);
            Some(f.len())
        });
        tx.flush();
    }
    assert_eq!(sent, cases.len(), "every test frame sent");
    let mut got = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(500) {
        rx.rx_burst(32, &mut |f| {
            if f.len() >= 12 && f[6..12] == SRC {
                got.push(u16::from_be_bytes([f[f.len() - 2], f[f.len() - 1]]));
            }
        });
        std::thread::sleep(Duration::from_millis(5));
    }
    got.sort_unstable();
    let want: Vec<u16> = cases.iter().filter(|c| c.2).map(|c| c.0).collect();
    assert_eq!(
        got, want,
        "marks of the frames read (left) and of those meant for us"
    );
}

/// The program builds for many addresses until its jumps would not fit, then says so.
#[test]
fn the_filter_says_when_it_cannot_hold_the_addresses() {
    let few: Vec<IpAddr> = (0..4)
        .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i)))
        .collect();
    let p = roce_filter(&few).unwrap();
    assert!(p.len() < 4096);
    assert_eq!(p.last().unwrap().code, 0x06, "ends in a ret");
    let many: Vec<IpAddr> = (0..40)
        .map(|i| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, i)))
        .collect();
    let e = roce_filter(&many).unwrap_err();
    assert!(e.contains("too many addresses"), "{e}");
}
