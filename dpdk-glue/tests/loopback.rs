//! Frames through real DPDK drivers in one process: `net_ring` loops a port's tx queue back to
//! its rx queue; a `net_memif` server with no client has its link down and refuses every frame.
//! One test function: the EAL can be initialised once per process.
mod common;

use rocemu_dpdk::{DpdkConfig, DpdkPort, Eal, EthConfig, EthPort, Mbuf, Mempool, HEADROOM};
use rocemu_emulator::port::{Port, BURST};
use rocemu_wire::eth::Mac;
use std::time::{Duration, Instant};

/// Frame `i`: its length varies over 1..=cap (both ends included), its bytes depend on `i`.
fn frame(i: usize, cap: usize) -> Vec<u8> {
    let len = match i % 7 {
        0 => cap,
        1 => 60,
        2 => 1 + i % 13,
        _ => 1 + (i.wrapping_mul(2_654_435_761) >> 7) % cap,
    };
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends `frames` through `port`, which loops them back, in bursts of changing size; when
/// `stall` holds, it first sends without receiving until the driver refuses frames, so that
/// the port's backlog has to keep them. Returns what came back.
fn round_trip(port: &mut DpdkPort, frames: &[Vec<u8>], stall: bool) -> Vec<Vec<u8>> {
    let mut next = 0;
    let mut got = Vec::new();
    let fill = |next: &mut usize, buf: &mut [u8]| {
        let f = frames.get(*next)?;
        buf[..f.len()].copy_from_slice(f);
        *next += 1;
        Some(f.len())
    };
    if stall {
        let mut refused = 0;
        for _ in 0..10_000 {
            let before = next;
            let n = port.tx_burst(BURST, &mut |b| fill(&mut next, b));
            if n == 0 {
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
            if next == frames.len() && before == next {
                break;
            }
        }
        assert!(port.backlog() > 0, "the ring never filled up");
        assert!(next < frames.len());
    }
    let sizes = [1, 7, BURST, 3 * BURST, 5];
    for round in 0..100_000 {
        if got.len() == frames.len() && port.backlog() == 0 {
            break;
        }
        port.tx_burst(sizes[round % sizes.len()], &mut |b| fill(&mut next, b));
        port.rx_burst(sizes[(round + 2) % sizes.len()], &mut |f| {
            got.push(f.to_vec())
        });
    }
    assert!(port.flush());
    got
}

fn check_round_trip(port: &mut DpdkPort, n: usize, stall: bool) {
    let cap = port.frame_capacity();
    let frames: Vec<Vec<u8>> = (0..n).map(|i| frame(i, cap)).collect();
    let before = port.stats();
    let got = round_trip(port, &frames, stall);
    assert_eq!(
        got.len(),
        frames.len(),
        "{}: frames lost or duplicated",
        port.name()
    );
    for (i, (a, b)) in frames.iter().zip(&got).enumerate() {
        if a != b {
            let at = a.iter().zip(b.iter()).position(|(x, y)| x != y);
            panic!(
                "{}: frame {i} went out with {} bytes and came back with {}, first difference at \
                 {at:?}",
                port.name(),
                a.len(),
                b.len()
            );
        }
    }
    let s = port.stats();
    let bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
    assert_eq!(s.tx_frames - before.tx_frames, n as u64);
    assert_eq!(s.rx_frames - before.rx_frames, n as u64);
    assert_eq!(s.tx_bytes - before.tx_bytes, bytes);
    assert_eq!(s.rx_bytes - before.rx_bytes, bytes);
    assert_eq!(s.tx_dropped, 0);
    assert_eq!(s.rx_dropped, 0);
    // Every mbuf is back: nothing leaked, nothing freed twice (that would push `available`
    // past the pool's size).
    assert_eq!(
        port.pool().available(),
        port.pool().size(),
        "{}",
        port.name()
    );
    assert_eq!(port.pool().in_use(), 0);
}

/// The building blocks by themselves: mbufs from a pool, through an `EthPort`, and back.
fn check_eth_port(eal: &Eal, id: u16) {
    let pool = Mempool::new(eal, 512, rocemu_dpdk::DEFAULT_DATA_ROOM).unwrap();
    let mut port = EthPort::new(eal, id, &pool, &EthConfig::default()).unwrap();
    assert_eq!(port.id(), id);
    assert_eq!(port.name(), "net_ring2");
    assert_eq!(pool.frame_room(), 2048);
    // An MTU its mbufs cannot hold is refused before DPDK sees it.
    let e = port.set_mtu(9000).unwrap_err();
    assert!(e.to_string().contains("mbufs hold 2048"), "{e}");
    // net_ring takes its MTU at configure time only and says so.
    match port.set_mtu(1400) {
        Ok(()) => assert_eq!(port.mtu().unwrap(), 1400),
        Err(e) => assert!(e.to_string().contains("not supported"), "{e}"),
    }

    let frames: Vec<Vec<u8>> = (0..100).map(|i| frame(i, 2048)).collect();
    let mut out: Vec<Mbuf> = frames
        .iter()
        .map(|f| {
            let mut m = pool.alloc().expect("a free mbuf");
            assert!(m.is_empty());
            assert_eq!(m.nb_segs(), 1);
            assert!(m.capacity() >= 2048);
            m.set_len(f.len());
            m.copy_from_slice(f);
            assert_eq!(m.pkt_len(), f.len());
            m
        })
        .collect();
    assert_eq!(pool.in_use(), 100);
    assert_eq!(port.tx_burst(&mut out), 100);
    assert!(out.is_empty());
    let mut back = Vec::new();
    assert_eq!(port.rx_burst(&mut back, 1000), 100);
    let back: Vec<Vec<u8>> = back.into_iter().map(|m| m.to_vec()).collect();
    assert!(back == frames, "EthPort: frames came back different");

    let mut m = pool.alloc().unwrap();
    let cap = m.capacity();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.set_len(cap + 1)));
    std::panic::set_hook(hook);
    assert!(r.is_err(), "set_len past the capacity must panic");
    drop(m);
    drop(port);
    assert_eq!(pool.in_use(), 0);
    assert_eq!(pool.available(), 512);
}

#[test]
fn dpdk_ports_move_frames_exactly() {
    let sock = std::env::temp_dir().join(format!("{}.sock", common::unique("memif")));
    let memif_mac: Mac = "02:00:5e:10:20:30".parse().unwrap();
    let (args, _rundir) = common::eal_args(
        "loopback",
        &format!(
            "--vdev=net_ring0 --vdev=net_ring1 --vdev=net_ring2 --vdev=net_memif0,role=server,socket={},mac={memif_mac}",
            sock.display()
        ),
    );

    // The first port, as the CLI opens it.
    let mut p0 = DpdkPort::open(&args).unwrap_or_else(|e| panic!("DpdkPort::open({args}): {e}"));
    assert_eq!(p0.name(), "dpdk:net_ring0");
    assert_eq!(p0.eth().driver(), "net_ring");
    assert_eq!(p0.mtu(), 1500);
    assert_eq!(p0.frame_capacity(), 1518);
    assert_eq!(p0.eth().mtu().unwrap(), 1500);
    assert_eq!(p0.mac(), p0.eth().mac().unwrap());
    assert_eq!(p0.pool().size(), 8192);
    assert!(p0.pool().frame_room() >= 1518);
    assert!(p0.eth().link_up());

    let eal = p0.eal().clone();
    assert_eq!(eal.ports(), [0, 1, 2, 3]);
    assert_eq!(eal.port_by_name("net_ring1").unwrap(), 1);
    let e = eal.port_by_name("net_nope").unwrap_err();
    assert!(e.to_string().contains("net_ring0"), "{e}");

    // The EAL is once per process.
    let e = Eal::init(&common::eal_args("again", "").0).unwrap_err();
    assert_eq!(e.function(), "rte_eal_init");
    assert!(e.to_string().contains("already initialised"), "{e}");
    assert!(Eal::current().is_some());

    // 1000 frames of every size from 1 to 1518 bytes, one burst size after another.
    check_round_trip(&mut p0, 1000, false);
    // More than the ring holds without reading it: the backlog keeps the refused frames. On
    // another thread (not an EAL lcore), as the engine runs it.
    let p0 = std::thread::spawn(move || {
        check_round_trip(&mut p0, 3000, true);
        p0
    })
    .join()
    .expect("the port works from a thread of its own");

    // A jumbo MTU gets a pool with mbufs big enough for it.
    let jumbo = DpdkConfig {
        eth: EthConfig {
            mtu: Some(9000),
            ..EthConfig::default()
        },
        mbufs: 4096,
        ..DpdkConfig::default()
    };
    let mut p1 = DpdkPort::open_port(&eal, 1, &jumbo).unwrap();
    assert_eq!(p1.name(), "dpdk:net_ring1");
    assert_eq!(p1.mtu(), 9000);
    assert_eq!(p1.frame_capacity(), 9018);
    assert_eq!(p1.eth().mtu().unwrap(), 9000);
    assert!(usize::from(p1.pool().data_room()) >= 9018 + HEADROOM);
    check_round_trip(&mut p1, 300, false);

    // The MAC given to net_memif; with no client its link is down and it takes no frame.
    let quick = DpdkConfig {
        tx_stall_timeout: Duration::from_millis(20),
        mbufs: 1024,
        ..DpdkConfig::default()
    };
    let mut p2 = DpdkPort::open_port(&eal, 3, &quick).unwrap();
    assert_eq!(p2.mac(), memif_mac);
    assert_eq!(p2.eth().mac().unwrap(), memif_mac);
    assert!(!p2.eth().link_up());
    assert_eq!(
        p2.link_up(),
        Some(false),
        "what the engine's messages are told"
    );
    let n = p2.tx_burst(BURST, &mut |b| {
        b[..64].fill(7);
        Some(64)
    });
    assert_eq!(n, 0);
    assert_eq!(p2.backlog(), BURST, "refused frames are kept");
    assert_eq!(p2.stats().tx_dropped, 0);
    // Nothing new is built while the backlog waits.
    let mut asked = 0;
    p2.tx_burst(BURST, &mut |_| {
        asked += 1;
        None
    });
    assert_eq!(asked, 0);
    assert!(!p2.flush());
    let t = Instant::now();
    while !p2.flush() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the backlog is never given up"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(t.elapsed() >= Duration::from_millis(15));
    assert_eq!(p2.stats().tx_dropped, BURST as u64);
    assert_eq!(p2.stats().tx_frames, 0);
    assert_eq!(p2.pool().in_use(), 0, "dropped frames go back to the pool");

    drop(p2);
    check_eth_port(&eal, 2);
    drop(p1);
    drop(p0);
    // `eal` is the last handle: cleanup runs now, and DPDK cannot start again.
    drop(eal);
    assert!(Eal::current().is_none());
    let e = Eal::init(&common::eal_args("after", "").0).unwrap_err();
    assert!(e.to_string().contains("cleaned up"), "{e}");
    let _ = std::fs::remove_file(&sock);
}
