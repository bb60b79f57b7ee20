//! Two RNICs joined by a [`Cable`], driven in virtual time (the quinn `Pair` shape): frames
//! move, timers fire, and the clock jumps to the next event when nothing else can happen.
//!
//! Invariants: deterministic from its seeds (the RNICs' and the cable's); the clock only moves
//! forward, and only when nothing can move at the current instant; a stalled run is a bug and
//! fails loudly ([`Pair::drive_until`] returns an error, it never spins).
use super::impair::Impairments;
use super::link::Cable;
use crate::connect::{bring_up, ConnectOpts};
use crate::rnic::{Rnic, RnicConfig};
use crate::time::Nanos;
use rocemu_wire::capture::CaptureWriter;
use rocemu_wire::eth::Mac;
use std::net::{IpAddr, Ipv4Addr};

/// Which side of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Two RNICs and the cable between them.
pub struct Pair {
    pub a: Rnic,
    pub b: Rnic,
    pub cable: Cable,
    pub now: Nanos,
    /// Every frame put on the cable, as sent (before impairments), for `--pcap`.
    pub capture: Option<CaptureWriter<std::io::BufWriter<std::fs::File>>>,
    /// Frames moved since creation.
    pub frames: u64,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("now", &self.now)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

pub const MAC_A: Mac = Mac([0x02, 0x52, 0x4f, 0x43, 0x45, 0x01]);
pub const MAC_B: Mac = Mac([0x02, 0x52, 0x4f, 0x43, 0x45, 0x02]);
pub const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

impl Pair {
    /// Two RNICs (10.0.0.1 and 10.0.0.2, 9000-byte Ethernet MTU) on a cable with `imp` both ways.
    pub fn new(seed: u64, imp: Impairments) -> Pair {
        let mut a = Rnic::new(RnicConfig::new(
            MAC_A,
            IP_A,
            seed.wrapping_mul(3).wrapping_add(1),
        ));
        let mut b = Rnic::new(RnicConfig::new(
            MAC_B,
            IP_B,
            seed.wrapping_mul(5).wrapping_add(2),
        ));
        a.set_neighbor(IP_B, MAC_B);
        b.set_neighbor(IP_A, MAC_A);
        Pair::with(a, b, Cable::new(imp, seed))
    }

    pub fn with(a: Rnic, b: Rnic, cable: Cable) -> Pair {
        Pair {
            a,
            b,
            cable,
            now: Nanos::ZERO,
            capture: None,
            frames: 0,
            scratch: vec![0u8; 10_000],
        }
    }

    pub fn rnic(&mut self, s: Side) -> &mut Rnic {
        match s {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Moves every frame both sides want to send and every frame due, without advancing the
    /// clock. Returns true when anything moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        let now = self.now;
        for side in [Side::A, Side::B] {
            loop {
                let (rnic, link) = match side {
                    Side::A => (&mut self.a, &mut self.cable.ab),
                    Side::B => (&mut self.b, &mut self.cable.ba),
                };
                let Some(n) = rnic.poll_transmit(now, &mut self.scratch) else {
                    break;
                };
                let mut f = link.buffer();
                f.extend_from_slice(&self.scratch[..n]);
                if let Some(c) = self.capture.as_mut() {
                    let _ = c.write(std::time::Duration::from_nanos(now.0), &f);
                }
                link.send(now, f);
                self.frames += 1;
                moved = true;
            }
        }
        while let Some(mut f) = self.cable.ab.recv(now) {
            self.b.handle_frame_mut(now, &mut f);
            self.cable.ab.recycle(f);
            moved = true;
        }
        while let Some(mut f) = self.cable.ba.recv(now) {
            self.a.handle_frame_mut(now, &mut f);
            self.cable.ba.recycle(f);
            moved = true;
        }
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        // A timer that fired may have queued a retransmission for `now`: that is progress too.
        moved || self.a.wants_transmit() || self.b.wants_transmit()
    }

    /// The next time anything is due (a frame or a timer).
    pub fn next_event(&mut self) -> Option<Nanos> {
        [
            self.cable.next_due(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs until `done` holds, jumping the clock to the next event whenever nothing moves.
    /// Fails (Err with a description) when nothing is left to happen and `done` still does not
    /// hold, or after `max_steps` steps.
    pub fn drive_until(
        &mut self,
        max_steps: u64,
        mut done: impl FnMut(&mut Pair) -> bool,
    ) -> Result<(), String> {
        for _ in 0..max_steps {
            if done(self) {
                return Ok(());
            }
            if self.step() {
                continue;
            }
            match self.next_event() {
                Some(t) if t > self.now => self.now = t,
                Some(_) => {}
                None => {
                    if done(self) {
                        return Ok(());
                    }
                    return Err(format!("stalled at {}: nothing left to happen", self.now));
                }
            }
        }
        Err(format!("no end after {max_steps} steps (at {})", self.now))
    }

    /// Runs until nothing is left to happen (every queue drained, no timer armed).
    pub fn drive(&mut self, max_steps: u64) -> Result<(), String> {
        for _ in 0..max_steps {
            if self.step() {
                continue;
            }
            match self.next_event() {
                Some(t) if t > self.now => self.now = t,
                Some(_) => {}
                None => return Ok(()),
            }
        }
        Err(format!(
            "still busy after {max_steps} steps (at {})",
            self.now
        ))
    }
}

impl Pair {
    /// Connects QP `qa` on A with QP `qb` on B.
    pub fn connect(
        &mut self,
        qa: rocemu_wire::Qpn,
        qb: rocemu_wire::Qpn,
        o: &ConnectOpts,
    ) -> Result<(), crate::rnic::VerbsError> {
        bring_up(&mut self.a, qa, qb, IP_B, o.psn_a, o.psn_b, o)?;
        bring_up(&mut self.b, qb, qa, IP_A, o.psn_b, o.psn_a, o)
    }
}

/// A deterministic byte pattern for test data (xorshift of the seed): different seeds give
/// different bytes, so that a message landing in the wrong place shows.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
