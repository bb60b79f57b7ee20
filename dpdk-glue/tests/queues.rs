//! A port with several queues, a `DpdkPort` per queue (`DpdkPort::open_queues`, for a device on
//! several polling threads): `net_ring` loops each tx queue back to the rx queue of the same
//! number, so a frame sent on a queue's port comes back on that port and on no other; each
//! queue's port works from a thread of its own; asking for more queues than the driver has is
//! an error that says how many it has, and several queues on `net_memif` are refused (a server
//! with more queues than its client reads the client's rings twice). One test function: the EAL can be initialised once per
//! process.
mod common;

use rocemu_dpdk::{DpdkConfig, DpdkPort};
use rocemu_emulator::port::Port;

#[test]
fn each_queue_is_a_port_of_its_own() {
    let sock = std::env::temp_dir().join(format!("{}.sock", common::unique("queues")));
    let (args, _dir) = common::eal_args(
        "queues",
        &format!(
            "--vdev=net_ring0 --vdev=net_ring1 --vdev=net_memif0,socket={},socket-abstract=no",
            sock.display()
        ),
    );
    let ports = DpdkPort::open_queues(&args, &DpdkConfig::default(), 3).unwrap();
    assert_eq!(ports.len(), 3);
    assert_eq!(ports[0].name(), "dpdk:net_ring0");
    assert_eq!(ports[2].name(), "dpdk:net_ring0 queue 2");
    assert_eq!(ports[1].eth().queues(), 3);
    // Each queue's port on a thread of its own, all at once: 200 frames out, each tagged with
    // its queue, and every one back on the same queue.
    let handles: Vec<_> = ports
        .into_iter()
        .enumerate()
        .map(|(q, mut p)| {
            std::thread::spawn(move || {
                let mut sent = 0;
                let mut got = Vec::new();
                for _ in 0..10_000 {
                    if sent < 200 {
                        sent += p.tx_burst(8, &mut |b: &mut [u8]| {
                            b[..64].fill(q as u8);
                            Some(64)
                        });
                    }
                    p.rx_burst(32, &mut |f: &mut [u8]| got.push(f.to_vec()));
                    if got.len() == 200 {
                        break;
                    }
                }
                (q, sent, got, p)
            })
        })
        .collect();
    let mut ports = Vec::new();
    for h in handles {
        let (q, sent, got, p) = h.join().expect("a queue's thread");
        assert_eq!(sent, 200, "queue {q} sent");
        assert_eq!(got.len(), 200, "queue {q} got back");
        assert!(
            got.iter()
                .all(|f| f.len() == 64 && f.iter().all(|&b| b == q as u8)),
            "queue {q} got a frame of another queue"
        );
        ports.push(p);
    }
    let eal = ports[0].eal().clone();
    drop(ports);

    // More queues than the driver has (net_ring: 16 of each kind in DPDK 22.11).
    let id = eal.port_by_name("net_ring1").unwrap();
    let mut config = DpdkConfig::default();
    config.eth.queues = 64;
    let e = DpdkPort::open_port_queues(&eal, id, &config).unwrap_err();
    assert!(
        e.to_string().contains("at most") && e.to_string().contains("64 were asked for"),
        "{e}"
    );
    // memif with several queues corrupts frames when the peer has fewer: refused.
    let id = eal.port_by_name("net_memif0").unwrap();
    config.eth.queues = 2;
    let e = DpdkPort::open_port_queues(&eal, id, &config).unwrap_err();
    assert!(e.to_string().contains("several queues are refused"), "{e}");
    let _ = std::fs::remove_file(&sock);
}
