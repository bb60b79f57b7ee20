//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq`): one pool of receive WQEs that any number of QPs (RC, UC,
//! UD) of the same protection domain draw from, and where the responders take a receive WQE
//! ([`Dev::next_recv`]) for a QP created with one.
//!
//! Invariants: an SRQ never holds more than its `max_wr` WQEs, and at most `max_srq` live at
//! once (slots are reused; an [`SrqId`] carries its slot's generation, so a destroyed SRQ's id
//! reaches nothing); an SRQ with a QP attached is not destroyed (EBUSY); its WQEs belong to it,
//! not to a QP: a QP entering ERR flushes only the WQE it was filling, and raises
//! `QpLastWqeReached` instead (rdma-core's `ibv_get_async_event(3)`: "Last WQE Reached on a QP
//! associated with an SRQ"); the limit event fires once per arming: when the number of WQEs
//! drops below a non-zero `srq_limit`, `SrqLimitReached` is raised and the limit becomes 0, as
//! `ibv_query_srq(3)` documents ("If the value returned for srq_limit is 0, then the SRQ limit
//! reached ("low watermark") event is not (or no longer) armed") and `ibv_modify_srq(3)`
//! ("Modifying the srq_limit arms the SRQ to produce an IBV_EVENT_SRQ_LIMIT_REACHED "low
//! watermark" asynchronous event once the number of WRs in the SRQ drops below srq_limit").
use super::device::Dev;
use super::qp::{Qp, RecvWqe};
use super::verbs::*;
use super::Rnic;
use std::collections::VecDeque;

/// Slots are the low 16 bits of an [`SrqId`], the slot's generation the high 16.
const SLOT_BITS: u32 = 16;

/// A shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub id: SrqId,
    pub pd: PdId,
    pub q: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    /// Armed when non-zero (see the module's invariants).
    pub limit: u32,
    /// QPs created with this SRQ and not destroyed yet.
    pub attached: u32,
}

/// The SRQ table: slots reused through a free list, bounded by the device's `max_srq`.
#[derive(Debug, Default)]
pub(crate) struct SrqTable {
    slots: Vec<Option<Srq>>,
    /// The generation each slot gives its next SRQ.
    gens: Vec<u16>,
    free: Vec<usize>,
    live: usize,
}

impl SrqTable {
    /// True when an SRQ of `pd` lives.
    pub fn any_of_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|s| s.pd == pd)
    }

    pub fn get(&self, id: SrqId) -> Option<&Srq> {
        let slot = (id.0 & ((1 << SLOT_BITS) - 1)) as usize;
        self.slots
            .get(slot)
            .and_then(|s| s.as_ref())
            .filter(|s| s.id == id)
    }

    pub fn get_mut(&mut self, id: SrqId) -> Option<&mut Srq> {
        let slot = (id.0 & ((1 << SLOT_BITS) - 1)) as usize;
        self.slots
            .get_mut(slot)
            .and_then(|s| s.as_mut())
            .filter(|s| s.id == id)
    }
}

impl Dev {
    /// The receive WQE a new message on `qp` consumes: from its SRQ when it has one (raising
    /// `SrqLimitReached` when that takes the SRQ below its armed limit), else from its RQ.
    pub fn next_recv(&mut self, qp: &mut Qp) -> Option<RecvWqe> {
        let Some(id) = qp.srq else {
            return qp.rq.pop_front();
        };
        let s = self.srqs.get_mut(id)?;
        let w = s.q.pop_front()?;
        if s.limit > 0 && (s.q.len() as u32) < s.limit {
            s.limit = 0;
            self.raise(AsyncEvent::SrqLimitReached(id));
        }
        Some(w)
    }

    /// Gives back a receive WQE taken for a message that did not happen (it goes back to the
    /// head of the queue it came from, to serve the next message).
    pub fn unget_recv(&mut self, qp: &mut Qp, w: RecvWqe) {
        match qp.srq {
            None => qp.rq.push_front(w),
            Some(id) => {
                if let Some(s) = self.srqs.get_mut(id) {
                    s.q.push_front(w);
                }
            }
        }
    }
}

impl Rnic {
    /// `ibv_create_srq`. `max_wr` in 1..=`max_srq_wr`, `max_sge` in 1..=`max_srq_sge`; the
    /// SRQ is created exactly that size. `srq_limit` is ignored, as `ibv_create_srq(3)` says
    /// ("irrelevant for ibv_create_srq"): the limit starts disarmed, [`Rnic::modify_srq`] arms it.
    pub fn create_srq(&mut self, pd: PdId, attr: SrqInitAttr) -> Result<SrqId, VerbsError> {
        if !self.dev.mem.pd_valid(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        let a = &self.attr;
        if attr.max_wr == 0 || attr.max_wr > a.max_srq_wr {
            return invalid(format!(
                "SRQ max_wr {} not in 1..={}",
                attr.max_wr, a.max_srq_wr
            ));
        }
        if attr.max_sge == 0 || attr.max_sge > a.max_srq_sge {
            return invalid(format!(
                "SRQ max_sge {} not in 1..={}",
                attr.max_sge, a.max_srq_sge
            ));
        }
        let t = &mut self.dev.srqs;
        if t.live >= a.max_srq as usize {
            return Err(VerbsError::NoSpace("max_srq reached"));
        }
        let slot = match t.free.pop() {
            Some(s) => s,
            None => {
                t.slots.push(None);
                t.gens.push(0);
                t.slots.len() - 1
            }
        };
        let gen = t.gens[slot];
        t.gens[slot] = gen.wrapping_add(1);
        let id = SrqId(((gen as u32) << SLOT_BITS) | slot as u32);
        t.slots[slot] = Some(Srq {
            id,
            pd,
            q: VecDeque::with_capacity((attr.max_wr as usize).min(1024)),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: 0,
            attached: 0,
        });
        t.live += 1;
        Ok(id)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_MAX_WR` (`max_wr`: resize) and / or `IBV_SRQ_LIMIT`
    /// (`srq_limit`: arm the limit event, or disarm it with 0). A limit above the (new) size, a
    /// size of 0, above `max_srq_wr` or below the WQEs the SRQ holds is refused, and then
    /// nothing changes.
    pub fn modify_srq(
        &mut self,
        srq: SrqId,
        max_wr: Option<u32>,
        srq_limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        let cap = self.attr.max_srq_wr;
        let s = self
            .dev
            .srqs
            .get_mut(srq)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        let new_max = max_wr.unwrap_or(s.max_wr);
        if new_max == 0 || new_max > cap {
            return invalid(format!("SRQ max_wr {new_max} not in 1..={cap}"));
        }
        if (new_max as usize) < s.q.len() {
            return invalid(format!(
                "SRQ max_wr {new_max} below the {} WQEs it holds",
                s.q.len()
            ));
        }
        if let Some(l) = srq_limit {
            if l > new_max {
                return invalid(format!("srq_limit {l} above max_wr {new_max}"));
            }
        }
        s.max_wr = new_max;
        if let Some(l) = srq_limit {
            s.limit = l;
        }
        Ok(())
    }

    /// `ibv_query_srq`: `srq_limit` is 0 when the limit event is not (or no longer) armed.
    pub fn query_srq(&self, srq: SrqId) -> Result<SrqAttr, VerbsError> {
        let s = self
            .dev
            .srqs
            .get(srq)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        Ok(SrqAttr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit,
        })
    }

    /// How many receive WQEs the SRQ holds now.
    pub fn srq_len(&self, srq: SrqId) -> Result<usize, VerbsError> {
        self.dev
            .srqs
            .get(srq)
            .map(|s| s.q.len())
            .ok_or(VerbsError::NotFound("shared receive queue"))
    }

    /// `ibv_destroy_srq`: refused with [`VerbsError::Busy`] (EBUSY) while a QP is attached; its
    /// WQEs are dropped without completions (as a destroyed QP's).
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let t = &mut self.dev.srqs;
        let s = t
            .get(srq)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        if s.attached > 0 {
            return Err(VerbsError::Busy("a QP is still attached to the SRQ"));
        }
        let slot = (srq.0 & ((1 << SLOT_BITS) - 1)) as usize;
        t.slots[slot] = None;
        t.free.push(slot);
        t.live -= 1;
        Ok(())
    }

    /// `ibv_post_srq_recv`: refused when the SRQ is full or the WR has more SGEs than its
    /// `max_sge` (the L_Keys are checked when a message lands, as with `post_recv`).
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), VerbsError> {
        let s = self
            .dev
            .srqs
            .get_mut(srq)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        if s.q.len() >= s.max_wr as usize {
            return Err(VerbsError::NoSpace("shared receive queue full"));
        }
        if wr.sg_list.len() > s.max_sge as usize {
            return invalid(format!(
                "{} SGEs above the SRQ's max_sge {}",
                wr.sg_list.len(),
                s.max_sge
            ));
        }
        let len = wr.sg_list.iter().map(|s| s.length as u64).sum();
        s.q.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            len,
        });
        Ok(())
    }

    /// Checks a QP's SRQ at creation: it exists and is of the QP's protection domain (the
    /// responder checks the L_Keys of its WQEs against the QP's PD).
    pub(super) fn check_qp_srq(&self, pd: PdId, srq: SrqId) -> Result<(), VerbsError> {
        let s = self
            .dev
            .srqs
            .get(srq)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        if s.pd != pd {
            return invalid("the SRQ belongs to another protection domain than the QP");
        }
        Ok(())
    }

    /// A QP was created with this SRQ (`attach`) or destroyed (`!attach`).
    pub(super) fn srq_attach(&mut self, srq: SrqId, attach: bool) {
        if let Some(s) = self.dev.srqs.get_mut(srq) {
            if attach {
                s.attached += 1;
            } else {
                s.attached = s.attached.saturating_sub(1);
            }
        }
    }
}
