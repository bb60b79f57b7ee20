//! A pacing rate limiter per QP: when the next packet may leave, from the current rate and the
//! bytes already sent, with a burst bound. Integer only.
//!
//! It is a token bucket kept in the time domain (GCRA): `tat`, the theoretical departure time
//! of the next byte, advances by each packet's serialisation time at the rate (`bytes·8·10^6 /
//! rate_kbps` ns, the remainder carried so that the long-run rate is exact); a packet may leave
//! at `t` when sending it keeps `tat ≤ t + τ`, `τ` being the burst's time at the rate. So over
//! any interval `[a, b]` the bytes sent are at most `burst + rate·(b − a)` (and a packet larger
//! than the burst still goes, alone, once the bucket is full). A rate of 0 holds everything.
//! The transmit scheduler paces through it (`qp.rs`).
use crate::time::Nanos;

/// A pacer at `rate_kbps` with a burst of `burst_bytes`.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    rate_kbps: u64,
    burst_bytes: u64,
    /// The theoretical departure time, ns, and its fraction in 1/rate_kbps ns.
    tat: u64,
    rem: u64,
}

const NS_PER_BYTE_KBPS: u128 = 8_000_000;

impl RateLimiter {
    pub fn new(rate_kbps: u64, burst_bytes: u64) -> RateLimiter {
        RateLimiter {
            rate_kbps,
            burst_bytes,
            tat: 0,
            rem: 0,
        }
    }

    pub fn rate_kbps(&self) -> u64 {
        self.rate_kbps
    }

    /// A new rate from `now` on (what was sent before keeps its cost at the old rate).
    pub fn set_rate(&mut self, rate_kbps: u64) {
        self.rate_kbps = rate_kbps;
        self.rem = 0;
    }

    /// Nanoseconds `bytes` take at the rate (rounded down; the remainder is the caller's).
    fn cost(&self, bytes: u64, rem: u64) -> (u64, u64) {
        let r = u128::from(self.rate_kbps);
        let total = u128::from(bytes) * NS_PER_BYTE_KBPS + u128::from(rem);
        (
            (total / r).min(u128::from(u64::MAX)) as u64,
            (total % r) as u64,
        )
    }

    fn tau(&self, cost: u64) -> u64 {
        self.cost(self.burst_bytes, 0).0.max(cost)
    }

    /// The earliest time at or after `now` a packet of `bytes` may leave; `None` at rate 0.
    pub fn earliest(&self, now: Nanos, bytes: u64) -> Option<Nanos> {
        if self.rate_kbps == 0 {
            return None;
        }
        let (tat, rem) = self.start(now);
        let (cost, _) = self.cost(bytes, rem);
        let t = tat.saturating_add(cost).saturating_sub(self.tau(cost));
        Some(Nanos(t.max(now.as_nanos())))
    }

    fn start(&self, now: Nanos) -> (u64, u64) {
        // Strictly idle only: a packet leaving exactly at `tat` keeps the carried fraction.
        if self.tat < now.as_nanos() {
            (now.as_nanos(), 0)
        } else {
            (self.tat, self.rem)
        }
    }

    /// Whether a packet of `bytes` may leave at `now`.
    pub fn may_send(&self, now: Nanos, bytes: u64) -> bool {
        self.earliest(now, bytes).is_some_and(|t| t <= now)
    }

    /// A packet of `bytes` left at `now` (whether or not it conformed: it is accounted).
    pub fn on_send(&mut self, now: Nanos, bytes: u64) {
        if self.rate_kbps == 0 {
            return;
        }
        let (tat, rem) = self.start(now);
        let (cost, rem) = self.cost(bytes, rem);
        self.tat = tat.saturating_add(cost);
        self.rem = rem;
    }
}
