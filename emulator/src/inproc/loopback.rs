//! [`Loopback`]: two [`Device`]s joined by a [`Cable`], driven in real time by one engine thread
//! until dropped — the in-process counterpart of an engine on a real port, for applications
//! written against [`crate::api`] (`examples/async_verbs.rs`).
//!
//! Invariants: the engine thread is the only one that moves frames and serves timers; it holds
//! both devices' locks only for one burst (up to 32 frames each way), so verbs from application
//! threads interleave with it; it wakes every waiter after a burst that moved anything, and backs
//! off (spin, yield, 50 µs sleeps) when idle. Dropping the `Loopback` stops and joins the thread.
use super::impair::Impairments;
use super::link::Cable;
use super::pair::{IP_A, IP_B, MAC_A, MAC_B};
use crate::api::Device;
use crate::rnic::{Rnic, RnicConfig};
use crate::time::Nanos;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Two devices (10.0.0.1 and 10.0.0.2) joined by an in-process cable, driven by an engine
/// thread in real time until dropped.
#[derive(Debug)]
pub struct Loopback {
    pub a: Device,
    pub b: Device,
    stop: Arc<AtomicBool>,
    engine: Option<std::thread::JoinHandle<()>>,
}

impl Loopback {
    /// Starts the engine. `imp` impairs both directions (deterministic from `seed`).
    pub fn start(seed: u64, imp: Impairments) -> Loopback {
        let mut ra = Rnic::new(RnicConfig::new(MAC_A, IP_A, seed.wrapping_mul(3) | 1));
        let mut rb = Rnic::new(RnicConfig::new(MAC_B, IP_B, seed.wrapping_mul(5) | 2));
        ra.set_neighbor(IP_B, MAC_B);
        rb.set_neighbor(IP_A, MAC_A);
        let (a, b) = (Device::new(ra), Device::new(rb));
        let stop = Arc::new(AtomicBool::new(false));
        let (ea, eb, st) = (a.clone(), b.clone(), stop.clone());
        let engine = std::thread::Builder::new()
            .name("rocemu-engine".into())
            .spawn(move || engine(ea, eb, Cable::new(imp, seed), st))
            .expect("spawn the engine thread");
        Loopback {
            a,
            b,
            stop,
            engine: Some(engine),
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.engine.take() {
            let _ = t.join();
        }
    }
}

/// The engine: run to completion in bursts, back off when idle.
fn engine(a: Device, b: Device, mut cable: Cable, stop: Arc<AtomicBool>) {
    let start = Instant::now();
    let mut buf = vec![0u8; 10_000];
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let now = Nanos(start.elapsed().as_nanos() as u64);
        let mut moved = 0;
        {
            let mut ra = a.lock();
            let mut rb = b.lock();
            for (tx, link) in [(&mut *ra, &mut cable.ab), (&mut *rb, &mut cable.ba)] {
                for _ in 0..32 {
                    let Some(n) = tx.poll_transmit(now, &mut buf) else {
                        break;
                    };
                    let mut f = link.buffer();
                    f.extend_from_slice(&buf[..n]);
                    link.send(now, f);
                    moved += 1;
                }
            }
            for (rx, link) in [(&mut *rb, &mut cable.ab), (&mut *ra, &mut cable.ba)] {
                for _ in 0..32 {
                    let Some(mut f) = link.recv(now) else { break };
                    rx.handle_frame_mut(now, &mut f);
                    link.recycle(f);
                    moved += 1;
                }
            }
            for r in [&mut *ra, &mut *rb] {
                if r.poll_timeout().is_some_and(|t| t <= now) {
                    r.handle_timeout(now);
                    moved += 1;
                }
            }
        }
        if moved > 0 {
            a.wake();
            b.wake();
            idle = 0;
        } else {
            // Back off when idle: spin a little, then yield, then sleep briefly.
            idle = idle.saturating_add(1);
            if idle > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else if idle > 100 {
                std::thread::yield_now();
            }
        }
    }
}
