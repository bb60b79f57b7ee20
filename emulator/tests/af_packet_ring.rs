//! The AF_PACKET port's memory-mapped rings carry every frame, in order and intact, through many
//! turns of both rings (so every slot is reused), for every frame size up to the MTU; a frame
//! the interface refuses does not stop the ring; and the system-call path
//! (`ROCEMU_AF_PACKET=mmsg`) carries the same frames. A veth pair in a network namespace of its
//! own. Needs root (scripts/test runs as root).
#![allow(unsafe_code)]
mod netns;
use rocemu_emulator::port::af_packet::{AfPacketOptions, AfPacketPort};
use rocemu_emulator::port::Port;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

const NS: &str = "rngr";
const DST: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x02];

/// A RoCEv2-shaped frame (IPv4, UDP to 4791, so that the port's filter keeps it) of `len`
/// bytes, numbered `seq`, its payload a pattern of the number.
fn frame(dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&ip_len.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 2]);
    f.extend_from_slice(&DST.octets());
    f.extend_from_slice(&49152u16.to_be_bytes());
    f.extend_from_slice(&4791u16.to_be_bytes());
    f.extend_from_slice(&(ip_len - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(2_654_435_761);
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f.push(x as u8);
    }
    f
}

fn open(ifname: &str) -> AfPacketPort {
    AfPacketPort::open(ifname, &AfPacketOptions::default()).expect("open")
}

/// Sends `n` frames of sizes cycling from 60 bytes to the largest untagged frame (MTU + 14)
/// from `tx` to `rx`, receiving as it goes, and checks each frame read against the one sent.
/// Returns how many came.
fn exchange(tx: &mut AfPacketPort, rx: &mut AfPacketPort, n: u32) -> u32 {
    let dst = rx.mac().0;
    let largest = tx.mtu() + 14;
    let size = |seq: u32| 60 + (seq as usize * 997) % (largest - 60 + 1);
    let (mut next_tx, mut next_rx) = (0u32, 0u32);
    let mut bad = Vec::new();
    let t = Instant::now();
    while next_rx < n && t.elapsed() < Duration::from_secs(20) {
        // At most a few bursts ahead of the receiver: the veth's backlog (1000 frames by
        // default) must not overflow, or frames would be lost before either ring.
        if next_tx < n && next_tx - next_rx < 256 {
            tx.tx_burst(32, &mut |b| {
                if next_tx == n {
                    return None;
                }
                let f = frame(dst, next_tx, size(next_tx));
                b[..f.len()].copy_from_slice(&f);
                next_tx += 1;
                Some(f.len())
            });
        }
        tx.flush();
        rx.rx_burst(32, &mut |f| {
            if f.len() < 14 || f[6..12] != SRC {
                return; // the kernel's own frames
            }
            let want = frame(dst, next_rx, size(next_rx));
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

#[test]
fn the_rings_carry_every_frame_in_order_through_many_turns() {
    let _ns = netns::veth_ns(NS, "rngr0", "rngr1", |i| {
        // No IPv6: the kernel's own router solicitations stay away. Jumbo frames: the port
        // still carries (and sizes its slots for) RoCEv2 packets of at most 4352 bytes.
        let _ = Command::new("ip")
            .args(["netns", "exec", NS, "sysctl", "-qw"])
            .arg(format!("net.ipv6.conf.{i}.disable_ipv6=1"))
            .status();
        netns::ip(&["-n", NS, "link", "set", i, "mtu", "9000"]);
    });
    let mut a = open("rngr0");
    let mut b = open("rngr1");
    assert!(a.uses_rings() && b.uses_rings(), "the rings were set up");
    assert_eq!(
        a.mtu(),
        4096 + 256,
        "the interface's 9000 clamped to what the port carries"
    );
    // The transmit ring has 2 MiB of 4.4 KiB slots, the receive ring 8 MiB: 20,000 frames turn
    // both many times.
    let n = 20_000;
    assert_eq!(
        exchange(&mut a, &mut b, n),
        n,
        "every frame a sent reached b"
    );
    assert_eq!(exchange(&mut b, &mut a, n), n, "and back");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_frames, u64::from(n));
    assert!(sb.rx_frames >= u64::from(n), "{sb:?}");
    assert_eq!(
        sa.tx_dropped + sa.rx_dropped + sb.tx_dropped + sb.rx_dropped,
        0
    );

    // A frame longer than the interface carries (MTU + 18 bytes without a VLAN tag) is refused
    // and counted as dropped; the ring goes on with the next frame.
    let dst = b.mac().0;
    let mut queue = vec![frame(dst, 7, 1000), frame(dst, 6, a.mtu() + 18)];
    let sent = a.tx_burst(32, &mut |buf| {
        let f = queue.pop()?;
        buf[..f.len()].copy_from_slice(&f);
        Some(f.len())
    });
    assert_eq!(sent, 1, "the refused frame is not sent");
    assert_eq!(a.stats().tx_dropped, 1);
    let mut got = Vec::new();
    let t = Instant::now();
    while got.is_empty() && t.elapsed() < Duration::from_secs(2) {
        a.flush();
        b.rx_burst(32, &mut |f| {
            if f.len() >= 46 && f[6..12] == SRC {
                got.push((f.len(), u32::from_be_bytes(f[42..46].try_into().unwrap())));
            }
        });
    }
    assert_eq!(got, vec![(1000, 7)], "the frame after the refused one");
    drop((a, b));

    // The system-call path, on the same pair.
    std::env::set_var("ROCEMU_AF_PACKET", "mmsg");
    let mut a = open("rngr0");
    let mut b = open("rngr1");
    std::env::set_var("ROCEMU_AF_PACKET", "bogus");
    let e = AfPacketPort::open("rngr0", &AfPacketOptions::default()).unwrap_err();
    assert!(e.0.contains("ROCEMU_AF_PACKET=bogus"), "{e}");
    std::env::remove_var("ROCEMU_AF_PACKET");
    assert!(!a.uses_rings() && !b.uses_rings());
    assert_eq!(exchange(&mut a, &mut b, 2000), 2000);
}
