//! The completion queues and the asynchronous event queue: where finished work requests land.
//!
//! Invariants: a CQ holds at most its depth; the first completion that finds it full puts it in
//! error for good (`IBV_EVENT_CQ_ERR`), later ones are counted and lost, and every QP on it is
//! moved to ERR before the entry point that overflowed it returns ([`Rnic::settle_cq_errors`]);
//! at most [`ASYNC_EVENTS_MAX`] asynchronous events wait, later ones are counted and dropped; a
//! CQ a QP uses is not destroyed (EBUSY), and a destroyed CQ's [`CqId`] reaches nothing, not
//! the CQ that reuses its slot ([`CqTable`]).
//!
//! Completion notification (`ibv_req_notify_cq`) is one-shot: [`Rnic::req_notify_cq`] arms a
//! CQ, the next completion added to it that the arming asks for fires one event and disarms it;
//! [`Rnic::take_cq_events`] hands the events out. A CQ has at most one event pending (a second
//! firing before the first is taken merges with it), so the pending events are bounded by the
//! number of CQs.
use super::device::Dev;
use super::modify::{flush, ErrCause};
use super::slots::GenSlots;
use super::verbs::*;
use super::Rnic;
use std::collections::VecDeque;

/// The CQ table: a [`CqId`] is its slot (low 17 bits, `max_cq` = 2^17) and the slot's
/// generation (see [`GenSlots`]).
pub(crate) type CqTable = GenSlots<Cq, 17>;

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
    pub notify: Notify,
    /// The CQ is in `Dev::cq_events`.
    pub event_pending: bool,
}

/// What an armed CQ waits for (`ibv_req_notify_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Notify {
    #[default]
    Disarmed,
    /// Any completion (`solicited_only` = 0).
    Next,
    /// A solicited completion (`solicited_only` != 0).
    Solicited,
}

impl Dev {
    /// Adds a completion that is not solicited unless it failed: every send completion, and
    /// receive completions in error or of messages without the SE bit.
    #[inline]
    pub fn push_wc(&mut self, cq: CqId, wc: Wc) {
        self.push_wc_se(cq, wc, false);
    }

    /// Adds the receive completion of a message whose last packet carried the BTH SE bit `se`.
    #[inline]
    pub fn push_recv_wc(&mut self, cq: CqId, wc: Wc, se: bool) {
        self.push_wc_se(cq, wc, se);
    }

    #[inline]
    fn push_wc_se(&mut self, cq: CqId, wc: Wc, se: bool) {
        self.wcs_made += 1;
        self.count_wc(&wc);
        if let Some(c) = self.cqs.get_mut(cq.0) {
            if c.overflowed {
                self.counters.cq_overflow += 1;
            } else if c.q.len() >= c.depth {
                c.overflowed = true;
                self.counters.cq_overflow += 1;
                self.failed_cqs.push(cq);
                self.raise(AsyncEvent::CqErr(cq));
            } else {
                // The ibv_req_notify_cq(3) man page of rdma-core: a CQE is solicited if it is
                // a receive completion for a message with the Solicited Event header bit set,
                // or if its status is not successful; with solicited_only, only those fire.
                let fire = match c.notify {
                    Notify::Disarmed => false,
                    Notify::Next => true,
                    Notify::Solicited => se || wc.status != WcStatus::Success,
                };
                c.q.push_back(wc);
                if fire {
                    c.notify = Notify::Disarmed;
                    if !c.event_pending {
                        c.event_pending = true;
                        self.cq_events.push(cq);
                    }
                }
            }
        }
    }

    /// The completion counters, by side and status (mlx5's `req_cqe_error`,
    /// `resp_cqe_error`, their flush counterparts and `resp_local_length_error`; rxe's
    /// `rdma_recvs`), counted as the completion is made, whether its CQ has room or not.
    #[inline]
    fn count_wc(&mut self, wc: &Wc) {
        let c = &mut self.counters;
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        match (recv, wc.status) {
            (true, WcStatus::Success) => c.rdma_recvs += 1,
            (false, WcStatus::Success) => {}
            (true, WcStatus::WrFlushErr) => c.resp_cqe_flush_error += 1,
            (false, WcStatus::WrFlushErr) => c.req_cqe_flush_error += 1,
            (true, s) => {
                c.resp_cqe_error += 1;
                if s == WcStatus::LocLenErr {
                    c.resp_local_length_error += 1;
                }
            }
            (false, _) => c.req_cqe_error += 1,
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
        let cq = Cq {
            q: VecDeque::with_capacity(cqe.min(4096)),
            depth: cqe,
            overflowed: false,
            notify: Notify::Disarmed,
            event_pending: false,
        };
        self.dev
            .cqs
            .insert(self.attr.max_cq as usize, cq)
            .map(CqId)
            .ok_or(VerbsError::NoSpace("max_cq reached"))
    }

    /// `ibv_destroy_cq`: refused with [`VerbsError::Busy`] (EBUSY, as the kernel's uverbs
    /// answers) while a QP sends or receives on it; then the CQ, its completions and any event
    /// of it not yet taken are gone, its slot is free for the next CQ, and its [`CqId`] names
    /// nothing any more (not the CQ that reuses the slot).
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        self.cq_in_use(cq)?;
        self.dev.cqs.remove(cq.0);
        self.dev.cq_events.retain(|&c| c != cq);
        self.dev.failed_cqs.retain(|&c| c != cq);
        Ok(())
    }

    /// `ibv_resize_cq`: the CQ holds up to `cqe` completions from now on, more or fewer than
    /// before, as long as the ones waiting fit: the ibv_resize_cq(3) man page of rdma-core
    /// ("*cqe* must be at least the number of unpolled entries"), and rxe's `rxe_cq_chk_attr`,
    /// which answers EINVAL for 0, for more than `max_cqe` and for fewer than the CQ holds. The
    /// size is the one asked for (the man page lets a provider round up; rxe does not). The
    /// completions waiting stay, in order, and so does the arming; a CQ in error (it
    /// overflowed) stays in error.
    pub fn resize_cq(&mut self, cq: CqId, cqe: usize) -> Result<(), VerbsError> {
        let max = self.attr.max_cqe as usize;
        let Some(c) = self.dev.cqs.get_mut(cq.0) else {
            return Err(VerbsError::NotFound("completion queue"));
        };
        if cqe == 0 || cqe > max {
            return invalid(format!("CQ depth {cqe} not in 1..={max}"));
        }
        if cqe < c.q.len() {
            return invalid(format!(
                "CQ depth {cqe} below the {} completions it holds",
                c.q.len()
            ));
        }
        c.depth = cqe;
        Ok(())
    }

    /// How many completions wait in `cq` (for a device split into shards, whose CQ is resized
    /// in every shard only if all of them fit).
    pub fn cq_pending(&self, cq: CqId) -> Result<usize, VerbsError> {
        self.dev
            .cqs
            .get(cq.0)
            .map(|c| c.q.len())
            .ok_or(VerbsError::NotFound("completion queue"))
    }

    /// What [`Rnic::destroy_cq`] would refuse for, without destroying: for a device split
    /// into shards, whose CQ goes from every shard or from none.
    pub fn cq_in_use(&self, cq: CqId) -> Result<(), VerbsError> {
        if self.dev.cqs.get(cq.0).is_none() {
            return Err(VerbsError::NotFound("completion queue"));
        }
        if self
            .qps
            .iter()
            .flatten()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(VerbsError::Busy("a QP still uses the CQ"));
        }
        Ok(())
    }

    /// How many completions the RNIC has made (queued in a CQ or lost to its overflow) since it
    /// was created. Work that fails before it sends anything (a local protection error found
    /// when the payload is gathered) makes a completion and no frame: a driver that keeps
    /// "this CQ is still empty" without the RNIC's lock learns of new completions from this.
    pub fn completions_made(&self) -> u64 {
        self.dev.wcs_made
    }

    /// How many CQs live, and how many slots the CQ table holds (its memory: the peak of live
    /// CQs, since freed slots are reused).
    pub fn cq_table_size(&self) -> (usize, usize) {
        (self.dev.cqs.live(), self.dev.cqs.capacity())
    }

    /// `ibv_poll_cq`: up to `max` completions, oldest first.
    pub fn poll_cq(&mut self, cq: CqId, max: usize) -> Vec<Wc> {
        let mut v = Vec::new();
        self.poll_cq_into(cq, max, &mut v);
        v
    }

    /// `ibv_poll_cq` into a caller's vector (appends); returns how many.
    pub fn poll_cq_into(&mut self, cq: CqId, max: usize, out: &mut Vec<Wc>) -> usize {
        let Some(c) = self.dev.cqs.get_mut(cq.0) else {
            return 0;
        };
        let n = max.min(c.q.len());
        // Two slice copies rather than an element-by-element drain.
        let (a, b) = c.q.as_slices();
        let na = n.min(a.len());
        out.extend_from_slice(&a[..na]);
        out.extend_from_slice(&b[..n - na]);
        c.q.drain(..n);
        n
    }

    /// True when the CQ lost completions because it was full (`IBV_EVENT_CQ_ERR`).
    pub fn cq_overflowed(&self, cq: CqId) -> bool {
        matches!(self.dev.cqs.get(cq.0), Some(c) if c.overflowed)
    }

    /// The CQ's error, when it is in error ([`VerbsError::CqOverrun`]).
    pub fn cq_error(&self, cq: CqId) -> Option<VerbsError> {
        match self.dev.cqs.get(cq.0) {
            Some(c) if c.overflowed => Some(VerbsError::CqOverrun { cq, depth: c.depth }),
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
        if self.dev.cqs.get(cq.0).is_none() {
            return Err(VerbsError::NotFound("completion queue"));
        }
        match self.poll_cq_into(cq, max, out) {
            0 => self.cq_error(cq).map_or(Ok(0), Err),
            n => Ok(n),
        }
    }

    /// `ibv_req_notify_cq`: arms `cq` for one event, at its next completion (`solicited_only`
    /// false) or its next solicited one (true: a receive completion of a message whose BTH SE
    /// bit was set, or a completion in error). Arming for any completion overrides an arming
    /// for solicited ones until the event; arming for solicited ones leaves an arming for any
    /// in place (as rxe's `rxe_req_notify_cq`). Completions already in the CQ fire nothing: the
    /// program polls after arming.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<(), VerbsError> {
        let Some(c) = self.dev.cqs.get_mut(cq.0) else {
            return Err(VerbsError::NotFound("completion queue"));
        };
        c.notify = match (solicited_only, c.notify) {
            (false, _) => Notify::Next,
            (true, Notify::Next) => Notify::Next,
            (true, _) => Notify::Solicited,
        };
        Ok(())
    }

    /// The CQs whose notification fired since the last call, each once, oldest first
    /// (appended to `out`): `ibv_get_cq_event`'s events, for the completion channels.
    pub fn take_cq_events(&mut self, out: &mut Vec<CqId>) {
        for cq in self.dev.cq_events.drain(..) {
            if let Some(c) = self.dev.cqs.get_mut(cq.0) {
                c.event_pending = false;
            }
            out.push(cq);
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
                    flush(&mut self.dev, qp, ErrCause::CqError(cq));
                    let qpn = qp.qpn;
                    self.dev.raise(AsyncEvent::QpFatal(qpn));
                }
            }
        }
    }
}
