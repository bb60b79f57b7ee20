//! Frames for the tests of a device on several threads: RoCEv2 frames to a given QPN and ARP
//! requests, each numbered, and the number read back.
#![allow(dead_code)]
use rocemu_emulator::port::Port;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

pub const SRC: [u8; 6] = [0x02, 0x52, 0x4e, 0x47, 0x00, 0x07];

/// A RoCEv2 frame to `dst` whose BTH names `qpn`, numbered `n` in its payload.
pub fn roce(mac: [u8; 6], dst: IpAddr, qpn: u32, n: u32, sport: u16) -> Vec<u8> {
    let mut f = mac.to_vec();
    f.extend_from_slice(&SRC);
    let mut bth = vec![0x0a, 0, 0xff, 0xff, 0];
    bth.extend_from_slice(&qpn.to_be_bytes()[1..]);
    bth.extend_from_slice(&[0, 0, 0, 1]);
    let mut l4 = sport.to_be_bytes().to_vec();
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
pub fn arp(n: u32, ours: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[10, 97, 0, 2, 0, 0]);
    f.extend_from_slice(&n.to_be_bytes());
    f.extend_from_slice(&ours.octets());
    f
}

/// The number a frame of this test carries, if it is one.
pub fn number(f: &[u8]) -> Option<u32> {
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

/// Sends the frames of `want` from `tx` in bursts (`before` is called ahead of each, with its
/// number from 1), reads every port in turn for up to `secs` seconds, and checks that each
/// frame was read once, by the port its entry names (frames are numbered by their index).
pub fn deliver<P: Port>(
    tx: &mut impl Port,
    ports: &mut [P],
    want: &[(Vec<u8>, usize)],
    secs: u64,
    mut before: impl FnMut(usize),
) {
    let mut queue: Vec<&Vec<u8>> = want.iter().rev().map(|w| &w.0).collect();
    let mut got: Vec<Option<usize>> = vec![None; want.len()];
    let mut wrong = Vec::new();
    let t = Instant::now();
    let mut burst = 0usize;
    while t.elapsed() < Duration::from_secs(secs) && got.iter().any(Option::is_none) {
        burst += 1;
        before(burst);
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
