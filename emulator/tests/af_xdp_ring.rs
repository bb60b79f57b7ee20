//! The AF_XDP port's rings carry every frame, in order and byte for byte, both ways through
//! many turns of the fill, RX, TX and completion rings (every UMEM chunk reused many times),
//! for every frame size up to the MTU; the XDP program takes only RoCEv2 to the port's own
//! address (a datagram to another UDP port or another address goes to the kernel, not to the
//! socket) and ARP reaches the port through the packet socket beside; what an idle engine sleeps
//! on is those two sockets (not an epoll set), each woken by its frames. A veth pair in a network
//! namespace of its own. Needs root (scripts/test runs as root).
mod netns;
use rocemu_emulator::port::af_packet::AfPacketOptions;
use rocemu_emulator::port::af_xdp::{AfXdpPort, XdpMode};
use rocemu_emulator::port::Port;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "rxdp";
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 98, 0, 2);
const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x03];

/// A UDP frame (IPv4, to `dst_ip` and `port`) of `len` bytes, numbered `seq`, its payload a
/// pattern of the number.
fn frame(dst: [u8; 6], dst_ip: Ipv4Addr, port: u16, seq: u32, len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&ip_len.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 98, 0, 9]);
    f.extend_from_slice(&dst_ip.octets());
    f.extend_from_slice(&49152u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&(ip_len - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(2_654_435_761) | 1;
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f.push(x as u8);
    }
    f
}

fn open(ifname: &str, ip: Ipv4Addr) -> AfXdpPort {
    let opts = AfPacketOptions {
        promiscuous: false,
        addrs: vec![IpAddr::V4(ip)],
        fanout: None,
    };
    AfXdpPort::open(ifname, &opts).unwrap_or_else(|e| panic!("{e}"))
}

/// Sends `n` RoCEv2 frames of sizes cycling from 60 bytes to the largest untagged frame
/// (MTU + 14) from `tx` to `rx` (whose address is `ip`), receiving as it goes, and checks each
/// frame read against the one sent. Returns how many came.
fn exchange(tx: &mut AfXdpPort, rx: &mut AfXdpPort, ip: Ipv4Addr, n: u32) -> u32 {
    let dst = rx.mac().0;
    let largest = tx.mtu() + 14;
    let size = |seq: u32| 60 + (seq as usize * 997) % (largest - 60 + 1);
    let (mut next_tx, mut next_rx) = (0u32, 0u32);
    let mut bad = Vec::new();
    let t = Instant::now();
    while next_rx < n && t.elapsed() < Duration::from_secs(20) {
        // A few bursts ahead of the receiver at most: the RX ring (2048) must not overflow.
        if next_tx < n && next_tx - next_rx < 512 {
            tx.tx_burst(32, &mut |b| {
                if next_tx == n {
                    return None;
                }
                let f = frame(dst, ip, 4791, next_tx, size(next_tx));
                b[..f.len()].copy_from_slice(&f);
                next_tx += 1;
                Some(f.len())
            });
        }
        tx.flush();
        rx.rx_burst(32, &mut |f| {
            if f.len() < 14 || f[6..12] != SRC {
                return; // the kernel's own frames (ARP copies)
            }
            let want = frame(dst, ip, 4791, next_rx, size(next_rx));
            if f != want.as_slice() && bad.len() < 5 {
                let seq = f
                    .get(42..46)
                    .map(|s| u32::from_be_bytes(s.try_into().unwrap()));
                bad.push(format!(
                    "frame {next_rx}: got {} bytes numbered {seq:?}, want {}",
                    f.len(),
                    want.len()
                ));
            }
            next_rx += 1;
        });
    }
    assert!(bad.is_empty(), "{bad:?}");
    next_rx
}

/// Frames from SRC that `rx` reads within `wait`, while `tx` sends `frames` once.
fn deliver(tx: &mut AfXdpPort, rx: &mut AfXdpPort, frames: Vec<Vec<u8>>, wait: Duration) -> usize {
    let mut q = frames;
    q.reverse();
    tx.tx_burst(32, &mut |b| {
        let f = q.pop()?;
        b[..f.len()].copy_from_slice(&f);
        Some(f.len())
    });
    let mut got = 0;
    let t = Instant::now();
    while t.elapsed() < wait {
        tx.flush();
        rx.rx_burst(32, &mut |f| {
            if f.len() >= 12 && f[6..12] == SRC {
                got += 1;
            }
        });
    }
    got
}

/// Sends one frame from `tx` and hands it to the kernel.
fn send(tx: &mut AfXdpPort, f: &[u8]) {
    let mut once = Some(f);
    tx.tx_burst(1, &mut |b| {
        let f = once.take()?;
        b[..f.len()].copy_from_slice(f);
        Some(f.len())
    });
    assert!(tx.flush(), "the kernel took the frame");
}

fn is_socket(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: a zeroed stat is valid; fstat writes within it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable stat.
    (unsafe { libc::fstat(fd, &mut st) } == 0) && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

/// Which of `fds` poll(2) finds readable within `ms` milliseconds.
fn readable(fds: [std::os::fd::RawFd; 2], ms: i32) -> [bool; 2] {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: `p` is a live array of two pollfds.
    unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
    p.map(|x| x.revents & libc::POLLIN != 0)
}

#[test]
fn the_rings_carry_every_frame_both_ways_and_only_roce_for_us() {
    let _ns = netns::veth_ns(NS, "rxdp0", "rxdp1", |i| {
        // No IPv6: the kernel's own router solicitations stay away.
        let _ = Command::new("ip")
            .args(["netns", "exec", NS, "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{i}.disable_ipv6=1"))
            .status();
    });
    let mut a = open("rxdp0", IP_A);
    let mut b = open("rxdp1", IP_B);
    assert_eq!(a.xdp_mode(), XdpMode::Native, "veth runs XDP in its driver");
    assert!(!a.zerocopy(), "veth has no zero-copy: copy mode");
    assert_eq!(a.name(), "af_xdp:rxdp0");
    // 20,000 frames: each direction's 2048 RX chunks and 2048 TX chunks turn ten times.
    let n = 20_000;
    assert_eq!(
        exchange(&mut a, &mut b, IP_B, n),
        n,
        "every frame a sent reached b"
    );
    assert_eq!(exchange(&mut b, &mut a, IP_A, n), n, "and back");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_frames, u64::from(n));
    assert_eq!(sb.tx_frames, u64::from(n));
    assert_eq!(sa.rx_frames, u64::from(n), "{sa:?}");
    assert_eq!(
        sa.tx_dropped + sa.rx_dropped + sb.tx_dropped + sb.rx_dropped,
        0
    );

    // Not RoCEv2 (another UDP port), or RoCEv2 to an address that is not b's: the kernel's,
    // not b's socket's. ARP: a copy for b, through the packet socket.
    let dst = b.mac().0;
    let other = vec![
        frame(dst, IP_B, 4792, 1, 100),
        frame(dst, Ipv4Addr::new(10, 98, 0, 7), 4791, 2, 100),
    ];
    assert_eq!(
        deliver(&mut a, &mut b, other, Duration::from_millis(300)),
        0
    );
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&SRC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&SRC);
    arp.extend_from_slice(&IP_A.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&IP_B.octets());
    arp.resize(60, 0);
    let before = b.neighbour_frames();
    assert_eq!(
        deliver(
            &mut a,
            &mut b,
            vec![arp.clone()],
            Duration::from_millis(300)
        ),
        1
    );
    assert_eq!(
        b.neighbour_frames(),
        before + 1,
        "through the packet socket"
    );

    // What an idle engine sleeps on: the two sockets themselves, never an epoll set over them
    // (a socket in an epoll set has a sleeper on its wait queue all the time, so every frame
    // queued to it and every frame it sends takes that queue's lock: docs/performance.md),
    // each made readable by its own kind of frame.
    let fds = b
        .wait_fds()
        .expect("an AF_XDP port has descriptors to sleep on");
    for fd in fds {
        assert!(is_socket(fd), "descriptor {fd} is not a socket: {fds:?}");
    }
    b.rx_burst(64, &mut |_| {});
    assert_eq!(readable(fds, 0), [false, false], "nothing waits yet");
    let roce = frame(b.mac().0, IP_B, 4791, 9, 100);
    send(&mut a, &roce);
    assert_eq!(
        readable(fds, 2000),
        [true, false],
        "a RoCEv2 frame: the AF_XDP socket"
    );
    b.rx_burst(64, &mut |_| {});
    send(&mut a, &arp);
    assert_eq!(readable(fds, 2000), [false, true], "ARP: the packet socket");
    b.rx_burst(64, &mut |_| {});

    // Dropping the port detaches the program: the interface has no XDP program left.
    drop(a);
    let out = Command::new("ip")
        .args(["link", "show", "rxdp0"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains("prog/xdp"), "{text}");
    let out = Command::new("ip")
        .args(["link", "show", "rxdp1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp"),
        "b's is still there"
    );
}

/// Clear errors: no such interface, no address.
#[test]
fn bad_interfaces_are_refused_with_a_reason() {
    let opts = AfPacketOptions {
        promiscuous: false,
        addrs: vec![IpAddr::V4(IP_A)],
        fanout: None,
    };
    let e = AfXdpPort::open("rocemu-none0", &opts).unwrap_err();
    assert!(
        e.0.contains("af_xdp:rocemu-none0: no such interface"),
        "{e}"
    );
    let e = AfXdpPort::open("lo", &AfPacketOptions::default()).unwrap_err();
    assert!(e.0.contains("no address"), "{e}");
}
