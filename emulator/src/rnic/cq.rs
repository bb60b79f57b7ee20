//! The completion queues and the asynchronous event queue: where finished work requests land.
//!
//! Invariants: a CQ holds at most its depth; the first completion that finds it full puts it in
//! error for good (`IBV_EVENT_CQ_ERR`), later ones are counted and lost, and every QP on it is
//! moved to ERR before the entry point that overflowed it returns ([`Rnic::settle_cq_errors`]);
//! at most [`ASYNC_EVENTS_MAX`] asynchronous events wait, later ones are counted and dropped.
use super::device::Dev;
use super::modify::flush;
use super::verbs::*;
use super::Rnic;
use std::collections::VecDeque;

/// Asynchronous events kept for [`Rnic::poll_async_event`]; later ones are counted and dropped.
pub const ASYNC_EVENTS_MAX: usize = 4096;

/// A completion queue. Once a completion finds it full it is in error for good (`overflowed`),
/// as with rxe (`rxe_cq_post` raises `IB_EVENT_CQ_ERR` and fails): the completions queued
/// before stay pollable, later ones are lost (counted), and the QPs on it go to ERR.
#[derive(Debug)]
pub(crate) struct Cq {
    pub q: VecDeque<Wc>,
    pub depth: usize,
    pub overflowed: bool,
}

impl Dev {
    pub fn push_wc(&mut self, cq: CqId, wc: Wc) {
        if let Some(Some(c)) = self.cqs.get_mut(cq.0 as usize) {
            if c.overflowed {
                self.counters.cq_overflows += 1;
            } else if c.q.len() >= c.depth {
                c.overflowed = true;
                self.counters.cq_overflows += 1;
                self.failed_cqs.push(cq);
                self.raise(AsyncEvent::CqErr(cq));
            } else {
                c.q.push_back(wc);
            }
        }
    }

    pub fn raise(&mut self, e: AsyncEvent) {
        if self.async_events.len() >= ASYNC_EVENTS_MAX {
            self.counters.async_events_dropped += 1;
        } else {
            self.async_events.push_back(e);
        }
    }
}

impl Rnic {
    /// `ibv_create_cq`.
    pub fn create_cq(&mut self, cqe: usize) -> Result<CqId, VerbsError> {
        if cqe == 0 || cqe > self.attr.max_cqe as usize {
            return invalid(format!("CQ depth {cqe} not in 1..={}", self.attr.max_cqe));
        }
        self.dev.cqs.push(Some(Cq {
            q: VecDeque::with_capacity(cqe.min(4096)),
            depth: cqe,
            overflowed: false,
        }));
        Ok(CqId(self.dev.cqs.len() as u32 - 1))
    }

    /// `ibv_poll_cq`: up to `max` completions, oldest first.
    pub fn poll_cq(&mut self, cq: CqId, max: usize) -> Vec<Wc> {
        let mut v = Vec::new();
        self.poll_cq_into(cq, max, &mut v);
        v
    }

    /// `ibv_poll_cq` into a caller's vector (appends); returns how many.
    pub fn poll_cq_into(&mut self, cq: CqId, max: usize, out: &mut Vec<Wc>) -> usize {
        let Some(Some(c)) = self.dev.cqs.get_mut(cq.0 as usize) else {
            return 0;
        };
        let n = max.min(c.q.len());
        out.extend(c.q.drain(..n));
        n
    }

    /// True when the CQ lost completions because it was full (`IBV_EVENT_CQ_ERR`).
    pub fn cq_overflowed(&self, cq: CqId) -> bool {
        matches!(self.dev.cqs.get(cq.0 as usize), Some(Some(c)) if c.overflowed)
    }

    /// The CQ's error, when it is in error ([`VerbsError::CqOverrun`]).
    pub fn cq_error(&self, cq: CqId) -> Option<VerbsError> {
        match self.dev.cqs.get(cq.0 as usize) {
            Some(Some(c)) if c.overflowed => Some(VerbsError::CqOverrun { cq, depth: c.depth }),
            _ => None,
        }
    }

    /// `ibv_poll_cq` that reports a CQ in error: the completions queued before the overflow
    /// first, then the error (as `ibv_poll_cq` returns a negative value on a CQ in error).
    /// Callers that wait for completions poll with this, so that an overflow ends the wait.
    pub fn try_poll_cq(
        &mut self,
        cq: CqId,
        max: usize,
        out: &mut Vec<Wc>,
    ) -> Result<usize, VerbsError> {
        if !matches!(self.dev.cqs.get(cq.0 as usize), Some(Some(_))) {
            return Err(VerbsError::NotFound("completion queue"));
        }
        match self.poll_cq_into(cq, max, out) {
            0 => self.cq_error(cq).map_or(Ok(0), Err),
            n => Ok(n),
        }
    }

    /// `ibv_get_async_event` without blocking: the oldest event not yet taken.
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.dev.async_events.pop_front()
    }

    /// `ibv_get_async_event` without blocking, all at once: appends every event not yet taken
    /// to `out`, oldest first.
    pub fn take_async_events(&mut self, out: &mut Vec<AsyncEvent>) {
        out.extend(self.dev.async_events.drain(..));
    }

    /// Moves the QPs on CQs that went to error to ERR (`IBV_EVENT_QP_FATAL`): their outstanding
    /// work requests are flushed (the completions meant for the failed CQ are lost; those for
    /// a QP's other CQ arrive there). Flushing may overflow another CQ: repeated until none is
    /// left. Called before every entry point that can complete work returns.
    pub(super) fn settle_cq_errors(&mut self) {
        while let Some(cq) = self.dev.failed_cqs.pop() {
            for slot in 0..self.qps.len() {
                let Some(qp) = self.qps[slot].as_mut() else {
                    continue;
                };
                if (qp.send_cq == cq || qp.recv_cq == cq)
                    && !matches!(qp.state, QpState::Err | QpState::Reset)
                {
                    flush(&mut self.dev, qp);
                    let qpn = qp.qpn;
                    self.dev.raise(AsyncEvent::QpFatal(qpn));
                }
            }
        }
    }
}
