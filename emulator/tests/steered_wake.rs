//! A device on two threads whose engines sleep in `ppoll` (`IdleStrategy::Wake`, naps of up
//! to 10 s here): a frame that arrives on shard 0's port for a QP of shard 1 is handed over
//! (`port::steered`) and shard 1's engine is woken through the `WakeTable` at once, not at the
//! end of its nap. Without the doorbell the frame would wait for the nap (the test then fails).
//! And a shard that finds another's ring full waits for room rather than dropping.
use rocemu_emulator::engine::{Engine, IdleStrategy};
use rocemu_emulator::port::steered::{steered, SteeredPort};
use rocemu_emulator::port::{Port, PortStats};
use rocemu_emulator::rnic::{QpnSteering, Rnic, RnicConfig, Shard};
use rocemu_wire::eth::Mac;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A port fed by the test: frames pushed into `q`, an eventfd readable while it holds any.
struct TestPort {
    q: Arc<Mutex<VecDeque<Vec<u8>>>>,
    efd: Arc<OwnedFd>,
}

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd takes no pointers; the result is checked and then owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl Port for TestPort {
    fn rx_burst(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(mut fr) = self.q.lock().unwrap().pop_front() else {
                break;
            };
            f(&mut fr);
            n += 1;
        }
        if n > 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a local (clears the eventfd; EAGAIN when empty).
            unsafe { libc::read(self.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        n
    }
    fn tx_burst(
        &mut self,
        _max: usize,
        _fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> usize {
        0
    }
    fn mac(&self) -> Mac {
        Mac([2, 0, 0, 0, 0, 1])
    }
    fn frame_capacity(&self) -> usize {
        1600
    }
    fn stats(&self) -> PortStats {
        PortStats::default()
    }
    fn name(&self) -> String {
        "test".into()
    }
    fn wait_fds(&self) -> Option<[RawFd; 2]> {
        Some([self.efd.as_raw_fd(), -1])
    }
}

/// What the test feeds a test port through: its queue, and its eventfd.
type Feed = (Arc<Mutex<VecDeque<Vec<u8>>>>, Arc<OwnedFd>);

/// Two test ports, and what the test feeds each through.
fn test_ports() -> (Vec<Feed>, Vec<Box<dyn Port + Send>>) {
    let mut qs = Vec::new();
    let mut ports: Vec<Box<dyn Port + Send>> = Vec::new();
    for _ in 0..2 {
        let q = Arc::new(Mutex::new(VecDeque::new()));
        let efd = Arc::new(eventfd());
        qs.push((q.clone(), efd.clone()));
        ports.push(Box::new(TestPort { q, efd }));
    }
    (qs, ports)
}

/// Shard `k` of a device on two threads.
fn shard_rnic(k: u32) -> Rnic {
    let mut c = RnicConfig::new(Mac([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap(), 5);
    c.shard = Shard { index: k, count: 2 };
    Rnic::new(c)
}

/// A QPN of shard 1's (no QP there: shard 1 drops a frame for it and counts it).
fn shard1_qpn(steering: QpnSteering) -> u32 {
    (2u32..).find(|&q| steering.shard_of(q) == 1).unwrap()
}

/// A RoCEv2 frame for QPN `qpn` carrying `seq` after its headers.
fn roce_frame(qpn: u32, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 8 + 12 + 4];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[23] = 17;
    f[36..38].copy_from_slice(&4791u16.to_be_bytes());
    f[14 + 20 + 8 + 5..14 + 20 + 8 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    f[54..58].copy_from_slice(&seq.to_be_bytes());
    f
}

#[test]
fn a_sleeping_shard_is_woken_for_a_frame_steered_to_it() {
    let (qs, ports) = test_ports();
    let rnics: Vec<Rnic> = (0..2).map(shard_rnic).collect();
    let steering = rnics[0].qpn_steering();
    let qpn = shard1_qpn(steering);
    let (ports, table) = steered(ports, steering);
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    let mut bells = Vec::new();
    for (k, (port, mut rnic)) in ports.into_iter().zip(rnics).enumerate() {
        let mut e = Engine::new(Box::new(port));
        e.set_idle_strategy(IdleStrategy::Wake);
        e.set_wake_nap_max(Duration::from_secs(10));
        let bell = e.doorbell().unwrap();
        bells.push(bell.clone());
        table.set(k, bell);
        let (st, tx) = (stop.clone(), tx.clone());
        threads.push(std::thread::spawn(move || {
            let mut told = false;
            while !st.load(Ordering::Relaxed) {
                let w = e.poll(&mut rnic);
                if k == 1 && !told && rnic.counters().rx_drop_total() > 0 {
                    let _ = tx.send(Instant::now());
                    told = true;
                }
                e.idle(w);
            }
        }));
    }
    // Both engines fall asleep (their naps grow towards the 10-s cap).
    std::thread::sleep(Duration::from_millis(1500));
    // A RoCEv2 frame for shard 1's QPN, read by shard 0.
    let t0 = Instant::now();
    qs[0].0.lock().unwrap().push_back(roce_frame(qpn, 0));
    let one = 1u64;
    // SAFETY: writes 8 bytes from a local to the eventfd.
    unsafe { libc::write(qs[0].1.as_raw_fd(), (&one as *const u64).cast(), 8) };
    let took = rx
        .recv_timeout(Duration::from_secs(8))
        .map(|t| t - t0)
        .expect("shard 1 took the frame in (woken, not at the end of its nap)");
    stop.store(true, Ordering::Relaxed);
    // Wake both so that the threads see the stop.
    for (q, efd) in &qs {
        q.lock().unwrap().push_back(vec![0; 60]);
        // SAFETY: as above.
        unsafe { libc::write(efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
    for t in threads {
        t.join().unwrap();
    }
    // Rung while shard 1 slept (the naps had grown to hundreds of milliseconds), and in time.
    assert!(bells[1].rung() >= 1, "shard 1's doorbell was not rung");
    assert!(took < Duration::from_millis(100), "took {took:?}");
}

/// Two shards' steered ports, shard 0's fed `total` frames for a QP of shard 1 (numbered 0..).
fn fed_pair(total: u32) -> (SteeredPort, SteeredPort) {
    let (qs, ports) = test_ports();
    let steering = shard_rnic(0).qpn_steering();
    let qpn = shard1_qpn(steering);
    qs[0]
        .0
        .lock()
        .unwrap()
        .extend((0..total).map(|i| roce_frame(qpn, i)));
    let (ports, _table) = steered(ports, steering);
    let mut ports = ports.into_iter();
    (ports.next().unwrap(), ports.next().unwrap())
}

/// Shard 0 reads three rings' worth of frames for shard 1 at once while shard 1 takes them in
/// slowly: shard 0 waits for room rather than dropping, and every frame arrives once, in order.
/// (Before, the 1,025th frame and all after it in the burst were dropped.)
#[test]
fn a_full_ring_waits_for_its_reader_instead_of_dropping() {
    use rocemu_emulator::port::steered::STEER_SLOTS;
    let total = 3 * STEER_SLOTS as u32;
    let (mut p0, mut p1) = fed_pair(total);
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while got.len() < total as usize && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
            p1.rx_burst(64, &mut |f| {
                got.push(u32::from_be_bytes(f[54..58].try_into().unwrap()))
            });
        }
        got
    });
    // One burst asks for all of them.
    p0.rx_burst(usize::MAX, &mut |_| {
        panic!("a frame of shard 1's given to shard 0")
    });
    let got = reader.join().unwrap();
    assert_eq!(p0.stats().rx_dropped, 0, "shard 0 dropped frames");
    assert_eq!(got.len(), total as usize);
    assert!(got.iter().copied().eq(0..total), "out of order");
}

/// Nobody reads shard 1's ring: shard 0 waits for room no longer than `PUSH_WAIT` per frame,
/// then drops it and counts it, and its burst ends (a stuck shard must not stall the others for
/// ever). The ring's frames stay for shard 1.
#[test]
fn a_ring_nobody_reads_drops_after_the_wait() {
    use rocemu_emulator::port::steered::{PUSH_WAIT, STEER_SLOTS};
    let (mut p0, mut p1) = fed_pair(STEER_SLOTS as u32 + 2);
    let t0 = Instant::now();
    p0.rx_burst(usize::MAX, &mut |_| {
        panic!("a frame of shard 1's given to shard 0")
    });
    let took = t0.elapsed();
    assert_eq!(p0.stats().rx_dropped, 2, "the two frames past the ring");
    assert!(took >= 2 * PUSH_WAIT, "gave up after {took:?}");
    let mut got = Vec::new();
    while p1.rx_burst(64, &mut |f| {
        got.push(u32::from_be_bytes(f[54..58].try_into().unwrap()))
    }) > 0
    {}
    assert!(
        got.iter().copied().eq(0..STEER_SLOTS as u32),
        "{} frames",
        got.len()
    );
}
