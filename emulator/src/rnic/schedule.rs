//! The transmit scheduler and the timers: which QP sends next, and when a retransmit or RNR
//! deadline is served.
//!
//! Invariants: a QP is on the schedule once at most (`scheduled`), and is on it whenever it has
//! a CNP, responses or requests to send (requests its pacer does not hold back: a held QP has
//! a pacing deadline on the heap instead); a CNP goes first, then responses, then requests; a
//! QP sends at most [`TX_BURST`] packets before the next QP's turn. Entries of the schedule and of the timer
//! heap carry the QPN as well as the slot, so that one left by a destroyed QP acts on nothing.
//! The heap holds at most one entry per deadline kind (retransmit, RNR, congestion control) and
//! live QP plus the stale ones, which it is rebuilt without when they are many.
//! `handle_timeout(now)` is idempotent.
use super::qp::Qp;
use super::{cc, completer, requester, responder, Rnic};
use crate::time::Nanos;
use rocemu_wire::Qpn;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Packets one QP sends in a row before the transmit scheduler moves on (DPDK's burst of 32
/// is per port; per QP, 16 keeps fairness while amortising the QP's cache misses).
pub(super) const TX_BURST: u32 = 16;

impl Rnic {
    /// The next frame to send, written at the front of `buf` (which should hold the Ethernet
    /// MTU plus 18 bytes); its length, or `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<usize> {
        let n = self.transmit(now, buf);
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
        n
    }

    // Its one caller's body; out of line, it cost a 64-byte WRITE 16 instructions (callgrind)
    // when the gather it inlines grew.
    #[inline(always)]
    fn transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<usize> {
        // The QP at the head of the schedule stays there for its burst: it leaves (and goes to
        // the back if it has more) when the burst ends or it has nothing more to send now.
        while let Some(&(slot, qpn)) = self.tx_sched.front() {
            let Some(qp) = self.qps.get_mut(slot).and_then(Option::as_mut) else {
                self.tx_sched.pop_front();
                continue;
            };
            if qp.qpn != qpn {
                // Left by a destroyed QP; the slot's new QP has its own entry when it needs one.
                self.tx_sched.pop_front();
                continue;
            }
            qp.scheduled = false;
            let mut n = None;
            // A CNP first (the sender it throttles should hear of congestion at once).
            if let Some(to) = qp.cnp_out.take() {
                n = cc::qp::produce_cnp(&mut self.dev, qp, to, buf);
            }
            // Responses next (they free the peer's resources); each failed attempt consumes
            // the entry it tried, so this ends.
            while n.is_none() && !qp.resp_out.is_empty() {
                n = responder::produce(&mut self.dev, qp, now, buf);
            }
            // Requests, through the pacer when the QP's reaction point holds it below line
            // rate (a QP it holds back gets a pacing deadline and leaves the schedule).
            if n.is_none()
                && qp.has_request_work()
                && qp.cc.as_deref_mut().is_none_or(|c| c.admit(now))
            {
                let resent = qp.counters.retransmitted_pkts;
                n = requester::produce(&mut self.dev, qp, now, buf);
                if let (Some(len), Some(c)) = (n, qp.cc.as_deref_mut()) {
                    // (An idle DCQCN QP at line rate has nothing to learn from a packet.)
                    if c.wants_tx_events() {
                        let again = qp.counters.retransmitted_pkts != resent;
                        c.on_request_sent(now, len, qp.req_psn, qp.last_ack_req, again);
                    }
                }
            }
            match n {
                Some(n) => {
                    qp.counters.sent_pkts += 1;
                    qp.counters.sent_bytes += n as u64;
                    // A QP sends a burst before the next one's turn (its state is hot in the
                    // cache now); then it goes to the end of the round-robin schedule.
                    let more = qp.has_tx_work();
                    if more && self.burst_left > 1 {
                        self.burst_left -= 1;
                        qp.scheduled = true;
                    } else {
                        self.burst_left = TX_BURST;
                        self.tx_sched.pop_front();
                        if more {
                            qp.scheduled = true;
                            self.tx_sched.push_back((slot, qpn));
                        }
                    }
                    arm_timers(&mut self.timers, slot, qp);
                    self.dev.counters.sent_pkts += 1;
                    self.dev.counters.sent_bytes += n as u64;
                    return Some(n);
                }
                // Blocked (window, max_rd_atomic, fence, pacer) or done: off the schedule
                // until an ACK, a timer or a post changes that.
                None => {
                    self.burst_left = TX_BURST;
                    self.tx_sched.pop_front();
                    arm_timers(&mut self.timers, slot, qp);
                }
            }
        }
        None
    }

    /// True when `poll_transmit` may have a frame.
    pub fn wants_transmit(&self) -> bool {
        !self.tx_sched.is_empty()
    }

    /// The earliest deadline the RNIC wants `handle_timeout` called at. It may be early (a
    /// deadline that moved later is found out when its old entry comes up): calling
    /// `handle_timeout` then does nothing but re-arm.
    pub fn poll_timeout(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((t, slot, qpn))) = self.timers.peek() {
            if self.timer_armed(slot, qpn) {
                return Some(t);
            }
            self.timers.pop();
            self.forget_timer(t, slot, qpn);
        }
        None
    }

    /// The live QP an entry of `timers` or `tx_sched` is for: none when that QP was destroyed
    /// (another may live in its slot now).
    fn entry_qp(&mut self, slot: usize, qpn: Qpn) -> Option<&mut Qp> {
        self.qps
            .get_mut(slot)
            .and_then(Option::as_mut)
            .filter(|q| q.qpn == qpn)
    }

    /// A heap entry left: the QP's deadline must be pushed again if it is still set.
    fn forget_timer(&mut self, t: Nanos, slot: usize, qpn: Qpn) {
        match self.entry_qp(slot, qpn) {
            Some(qp) => {
                if qp.ack_pushed == Some(t) {
                    qp.ack_pushed = None;
                }
                if qp.rnr_pushed == Some(t) {
                    qp.rnr_pushed = None;
                }
                if let Some(c) = qp.cc.as_deref_mut() {
                    if c.pushed == Some(t) {
                        c.pushed = None;
                    }
                }
            }
            None => self.stale_timers = self.stale_timers.saturating_sub(1),
        }
    }

    fn timer_armed(&self, slot: usize, qpn: Qpn) -> bool {
        match self.qps.get(slot).and_then(Option::as_ref) {
            Some(qp) if qp.qpn == qpn => {
                qp.ack_deadline.is_some()
                    || qp.rnr_deadline.is_some()
                    || qp.cc.as_ref().is_some_and(|c| c.deadline().is_some())
            }
            _ => false,
        }
    }

    /// Serves every deadline at or before `now`. Calling it again with the same `now` does
    /// nothing more.
    pub fn handle_timeout(&mut self, now: Nanos) {
        while let Some(&Reverse((t, slot, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            self.forget_timer(t, slot, qpn);
            let Some(qp) = self
                .qps
                .get_mut(slot)
                .and_then(Option::as_mut)
                .filter(|q| q.qpn == qpn)
            else {
                continue;
            };
            let due = [qp.ack_deadline, qp.rnr_deadline]
                .into_iter()
                .flatten()
                .any(|d| d <= now);
            if due {
                completer::timeout(&mut self.dev, qp, now);
            }
            if let Some(c) = qp.cc.as_deref_mut() {
                if c.deadline().is_some_and(|d| d <= now) {
                    c.on_timer(now);
                }
            }
            // Re-arms whatever is still set (a deadline that moved later than its entry).
            self.refresh(slot);
        }
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
    }

    /// Puts a QP on the transmit schedule if it has something to send, and its deadlines on the
    /// timer heap.
    #[inline]
    pub(super) fn refresh(&mut self, slot: usize) {
        let Some(qp) = self.qps.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        schedule(&mut self.tx_sched, slot, qp);
        arm_timers(&mut self.timers, slot, qp);
    }

    /// A destroyed QP's timer entries stay in the heap until they come up (and then act on
    /// nothing: they carry its QPN); when they are many, the heap is rebuilt without them.
    pub(super) fn forget_timers_of(&mut self, qp: &Qp) {
        self.stale_timers += usize::from(qp.ack_pushed.is_some())
            + usize::from(qp.rnr_pushed.is_some())
            + usize::from(qp.cc.as_ref().is_some_and(|c| c.pushed.is_some()));
        if self.stale_timers > 1024 && self.stale_timers * 2 > self.timers.len() {
            let qps = &self.qps;
            self.timers
                .retain(|Reverse((_, s, q))| matches!(qps.get(*s), Some(Some(p)) if p.qpn == *q));
            self.stale_timers = 0;
        }
    }
}

/// Puts a QP on the transmit schedule if it has something to send and is not there yet
/// ([`Rnic::refresh`]'s first half, which a post needs alone).
#[inline(always)]
pub(super) fn schedule(tx_sched: &mut VecDeque<(usize, Qpn)>, slot: usize, qp: &mut Qp) {
    if !qp.scheduled && qp.has_tx_work() {
        qp.scheduled = true;
        tx_sched.push_back((slot, qp.qpn));
    }
}

/// Puts a QP's deadlines on the timer heap. One entry per deadline kind and QP: a deadline
/// that moves later (every ACK pushes the retransmit timer out) keeps its earlier entry,
/// which re-arms when it comes up; only an earlier deadline needs a new entry. Without this
/// the heap grows by an entry per ACK. Called after every packet and post: the usual case,
/// nothing to push, is decided inline.
#[inline]
fn arm_timers(timers: &mut BinaryHeap<Reverse<(Nanos, usize, Qpn)>>, slot: usize, qp: &mut Qp) {
    let needs = |d: Option<Nanos>, pushed: Option<Nanos>| match d {
        Some(t) => pushed.is_none_or(|p| t < p),
        None => false,
    };
    if needs(qp.ack_deadline, qp.ack_pushed)
        || needs(qp.rnr_deadline, qp.rnr_pushed)
        || qp
            .cc
            .as_deref()
            .is_some_and(|c| needs(c.deadline(), c.pushed))
    {
        arm_timers_slow(timers, slot, qp);
    }
}

#[inline(never)]
fn arm_timers_slow(
    timers: &mut BinaryHeap<Reverse<(Nanos, usize, Qpn)>>,
    slot: usize,
    qp: &mut Qp,
) {
    for (d, pushed) in [
        (qp.ack_deadline, &mut qp.ack_pushed),
        (qp.rnr_deadline, &mut qp.rnr_pushed),
    ] {
        if let Some(t) = d {
            if pushed.is_none_or(|p| t < p) {
                *pushed = Some(t);
                timers.push(Reverse((t, slot, qp.qpn)));
            }
        }
    }
    // The pacing deadline and the reaction point's next rate change, as one kind.
    if let Some(c) = qp.cc.as_deref_mut() {
        if let Some(t) = c.deadline() {
            if c.pushed.is_none_or(|p| t < p) {
                c.pushed = Some(t);
                timers.push(Reverse((t, slot, qp.qpn)));
            }
        }
    }
}
