//! A queue pair's state: attributes, the send queue with the requester's and completer's
//! cursors, the receive queue and the responder's state.
use super::stats::QpCounters;
use super::verbs::*;
use crate::time::Nanos;
use rocemu_wire::{HeaderTemplate, Msn, Psn, Qpn};
use std::collections::VecDeque;

/// A posted send work request and its progress.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Message length in bytes.
    pub len: u64,
    /// PSN of the first packet (request) and how many PSNs the message takes (for a READ, one
    /// per response packet). Assigned when the requester starts the message.
    pub first_psn: Psn,
    pub npkts: u32,
    pub started: bool,
    /// For READ: response packets received in order; for atomics: 1 once answered.
    pub resp_pkts: u32,
    /// For READ: the response index the last (re)request started at; responses to a resumed
    /// read start again at FIRST (IBTA 9.4.4: a retried READ need not start where the first did).
    pub read_base: u32,
    /// Counted against max_rd_atomic.
    pub rd_counted: bool,
    /// All its responses/acks are in: ready to complete in order.
    pub done: bool,
    pub signaled: bool,
    /// An error status decided for this WQE (completes it and moves the QP to ERR).
    pub error: Option<WcStatus>,
}

impl SendWqe {
    /// A WQE as posted: `len` bytes, not started yet.
    #[inline]
    pub fn new(wr: SendWr, len: u64, signaled: bool) -> SendWqe {
        SendWqe {
            wr,
            len,
            first_psn: Psn::new(0),
            npkts: 0,
            started: false,
            resp_pkts: 0,
            read_base: 0,
            rd_counted: false,
            done: false,
            signaled,
            error: None,
        }
    }

    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
}

/// The send queue: a ring of WQE slots, oldest first. Completing the oldest WQE drops it where
/// it lies (its slot becomes empty): nothing is moved or shifted, which matters because a WQE is
/// ~180 bytes and every message completes one. The ring grows by doubling when it is full (so a
/// deep queue that is never used costs nothing); `post_send` bounds it by `max_send_wr`.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// A power of two long (or empty); slots `head .. head + len` (wrapping) are full.
    slots: Vec<Option<SendWqe>>,
    head: usize,
    len: usize,
    /// READs and atomics among them: when there are none, no WQE can be awaiting a response,
    /// and the completer need not look for one on every ACK.
    reads: usize,
}

impl SendQueue {
    #[inline]
    fn slot(&self, i: usize) -> usize {
        (self.head + i) & (self.slots.len().wrapping_sub(1))
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&SendWqe> {
        if i < self.len {
            self.slots[self.slot(i)].as_ref()
        } else {
            None
        }
    }

    #[inline]
    pub fn get_mut(&mut self, i: usize) -> Option<&mut SendWqe> {
        if i < self.len {
            let s = self.slot(i);
            self.slots[s].as_mut()
        } else {
            None
        }
    }

    #[inline]
    pub fn front(&self) -> Option<&SendWqe> {
        self.get(0)
    }

    /// Queues a WQE for `wr` as posted (see [`SendWqe::new`]), built in its slot.
    #[inline]
    pub fn push_new(&mut self, wr: SendWr, len: u64, signaled: bool) {
        if self.len == self.slots.len() {
            self.grow();
        }
        self.reads += wr.opcode.is_read_or_atomic() as usize;
        let s = self.slot(self.len);
        let slot = &mut self.slots[s];
        // A free slot holds None already (a completed WQE is dropped where it lies); emptied
        // first, the WQE is then written straight into it rather than built on the stack.
        drop(slot.take());
        *slot = Some(SendWqe::new(wr, len, signaled));
        self.len += 1;
    }

    /// Removes the oldest WQE and hands it over.
    #[inline]
    pub fn pop_front(&mut self) -> Option<SendWqe> {
        if self.len == 0 {
            return None;
        }
        let w = self.slots[self.head].take();
        self.head = self.slot(1);
        self.len -= 1;
        self.reads -= w.as_ref().is_some_and(|w| w.wr.opcode.is_read_or_atomic()) as usize;
        w
    }

    /// Drops the oldest WQE in its slot.
    #[inline]
    pub fn drop_front(&mut self) {
        if self.len > 0 {
            let slot = &mut self.slots[self.head];
            self.reads -=
                slot.as_ref()
                    .is_some_and(|w| w.wr.opcode.is_read_or_atomic()) as usize;
            *slot = None;
            self.head = self.slot(1);
            self.len -= 1;
        }
    }

    /// How many READs and atomics the queue holds.
    #[inline]
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// Oldest first.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &SendWqe> {
        let (head, len) = (self.head.min(self.slots.len()), self.len);
        let (a, b) = self.slots.split_at(head);
        b.iter().chain(a).take(len).flatten()
    }

    /// Oldest first.
    #[inline]
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut SendWqe> {
        let (head, len) = (self.head.min(self.slots.len()), self.len);
        let (a, b) = self.slots.split_at_mut(head);
        b.iter_mut().chain(a).take(len).flatten()
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(4);
        let mut slots: Vec<Option<SendWqe>> = Vec::with_capacity(n);
        for i in 0..self.len {
            let s = self.slot(i);
            slots.push(self.slots[s].take());
        }
        slots.resize_with(n, || None);
        self.slots = slots;
        self.head = 0;
    }
}

impl core::ops::Index<usize> for SendQueue {
    type Output = SendWqe;
    #[inline]
    fn index(&self, i: usize) -> &SendWqe {
        match self.get(i) {
            Some(w) => w,
            None => panic!("send queue index {i} out of range (len {})", self.len),
        }
    }
}

impl core::ops::IndexMut<usize> for SendQueue {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut SendWqe {
        let len = self.len;
        match self.get_mut(i) {
            Some(w) => w,
            None => panic!("send queue index {i} out of range (len {len})"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sg_list: SgList,
    pub len: u64,
}

/// What the responder is in the middle of (IBTA 9.7.4.1 in 1.5; C9-91 unverified: opcode sequence
/// checks).
#[derive(Debug, Clone)]
pub(crate) enum RespMsg {
    Idle,
    /// Between a SEND FIRST and its LAST: the receive WQE being filled.
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    /// Between an RDMA WRITE FIRST and its LAST.
    Write {
        rkey: u32,
        va: u64,
        remaining: u64,
        total: u64,
    },
    /// UC only: a PSN gap hit this message; drop until the next FIRST or ONLY (IBTA 9.8.2.2,
    /// unverified).
    Drop,
}

/// A read or atomic the responder accepted, kept for responses and duplicate replays
/// (IBTA 9.7.5.1.4, unverified, "responder resources").
#[derive(Debug, Clone)]
pub(crate) enum Resource {
    Read {
        first_psn: Psn,
        npkts: u32,
        rkey: u32,
        va: u64,
        len: u64,
        /// Next response packet to send (index), `npkts` when finished.
        next: u32,
        /// Re-executed for a duplicate request: the requester may already have what it asked
        /// for (the first responses can still arrive), so it may make room for a new request.
        replay: bool,
        msn: Msn,
    },
    Atomic {
        psn: Psn,
        orig: u64,
        msn: Msn,
    },
}

/// Something the responder owes the requester, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespOut {
    /// ACK or NAK with this PSN and syndrome (MSN taken when sent).
    Ack {
        psn: Psn,
        syndrome: u8,
        msn: Msn,
    },
    /// Read response packets of the resource with this index in `resources`.
    Read {
        res_psn: Psn,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: Msn,
    },
}

#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    /// Its events' span (`crate::logs`): made at `create_qp`, kept across RESET; an empty
    /// handle when no subscriber listens.
    pub span: tracing::Span,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub state: QpState,
    pub attr: QpAttr,
    /// Destination MAC, resolved at RTR.
    pub dmac: Mac,
    /// RC, UC from RTR on: the Ethernet, IP and UDP headers of every packet to the peer.
    pub tmpl: Option<HeaderTemplate>,
    /// The address of `attr.ah_attr.dgid`: a connected QP accepts packets from there only.
    pub peer_ip: std::net::IpAddr,

    // requester
    pub sq: SendQueue,
    /// Index in `sq` of the WQE the requester sends next (or continues).
    pub sq_next: usize,
    /// Next PSN the requester sends.
    pub req_psn: Psn,
    /// This QP's share of the device counters, counted with them (monotonic: a move to RESET
    /// keeps them); beside the requester's hot fields, which every packet touches too.
    pub counters: QpCounters,
    /// Reads/atomics outstanding.
    pub rd_outstanding: u32,
    /// One past the highest PSN ever sent: anything below it sent again is a retransmission,
    /// and an ACK beyond it acknowledges something never sent.
    pub psn_high_: Psn,
    /// Highest PSN acknowledged so far + 1: where go-back-N restarts.
    pub acked_psn: Psn,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// A go-back-N for a lost response is under way: further gaps in the same stream do not
    /// spend another retry (rxe's `started_retry`).
    pub retry_pending: bool,
    pub ack_deadline: Option<Nanos>,
    pub rnr_deadline: Option<Nanos>,
    /// The deadlines last put on the device's timer heap.
    pub ack_pushed: Option<Nanos>,
    pub rnr_pushed: Option<Nanos>,
    /// Congestion window in PSNs: halves on every loss, grows with every PSN acknowledged
    /// (AIMD, so that go-back-N does not resend a whole queue for each lost packet).
    pub cwnd: u32,
    /// Restart PSN to use when the RNR timer fires.
    pub rnr_psn: Psn,

    // responder
    /// The SRQ its receives come from (then `rq` stays empty).
    pub srq: Option<SrqId>,
    pub rq: VecDeque<RecvWqe>,
    pub epsn: Psn,
    pub msn: Msn,
    pub resp_msg: RespMsg,
    pub nak_sent: bool,
    pub resources: VecDeque<Resource>,
    /// Responses owed, in order; never more than [`Qp::resp_slots`] whatever the peer sends,
    /// and one more for the NAK of a class C / D error (the QP goes to ERR with it).
    pub resp_out: VecDeque<RespOut>,

    /// On the device's transmit schedule.
    pub scheduled: bool,
    /// The status of the last completion in error (see [`Qp::note_wc`]).
    pub last_error: Option<WcStatus>,

    // congestion control
    /// The reaction point and pacer of a connected QP on a device with an RP algorithm, from
    /// RTR on (boxed: one pointer on the hot path when there is none).
    pub cc: Option<Box<crate::rnic::cc::QpCc>>,
    /// Whether the request packet last built asked for an ACK (TIMELY probes those).
    pub last_ack_req: bool,
    /// Notification point: when the last CNP for this QP was queued.
    pub cnp_last: Option<Nanos>,
    /// The CNP owed for a CE-marked packet: sent before anything else of the QP.
    pub cnp_out: Option<CnpTo>,
}

/// Where a CNP goes: back to the sender of the CE-marked packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CnpTo {
    pub mac: Mac,
    pub ip: std::net::IpAddr,
    /// Our address the marked packet was sent to.
    pub src_ip: std::net::IpAddr,
    /// The sender's QP (the one to throttle).
    pub dqpn: Qpn,
    /// The marked packet's BTH P_Key, which the CNP carries (Annex A17.9.3, Figure 6).
    pub pkey: rocemu_wire::PKey,
}

impl Qp {
    pub fn new(qpn: Qpn, pd: PdId, init: &QpInitAttr) -> Qp {
        Qp {
            qpn,
            qp_type: init.qp_type,
            span: tracing::Span::none(),
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            attr: QpAttr::default(),
            dmac: Mac::default(),
            tmpl: None,
            peer_ip: std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            sq: SendQueue::default(),
            sq_next: 0,
            req_psn: Psn::new(0),
            rd_outstanding: 0,
            acked_psn: Psn::new(0),
            psn_high_: Psn::new(0),
            retry_left: 0,
            rnr_left: 0,
            retry_pending: false,
            ack_deadline: None,
            rnr_deadline: None,
            ack_pushed: None,
            rnr_pushed: None,
            cwnd: crate::rnic::requester::MAX_INFLIGHT_PSNS,
            rnr_psn: Psn::new(0),
            srq: init.srq,
            rq: VecDeque::new(),
            epsn: Psn::new(0),
            msn: Msn::new(0),
            resp_msg: RespMsg::Idle,
            nak_sent: false,
            resources: VecDeque::new(),
            resp_out: VecDeque::new(),
            scheduled: false,
            counters: QpCounters::default(),
            last_error: None,
            cc: None,
            last_ack_req: false,
            cnp_last: None,
            cnp_out: None,
        }
    }

    /// Notes a completion of this QP as it is made: one in error becomes `last_error`,
    /// unless it is a flush and an error came before it (the flushes that follow an error
    /// would hide it).
    #[inline]
    pub fn note_wc(&mut self, wc: &Wc) {
        match wc.status {
            WcStatus::Success => {}
            WcStatus::WrFlushErr if self.last_error.is_some() => {}
            s => self.last_error = Some(s),
        }
    }

    pub fn psn_high(&self) -> Psn {
        self.psn_high_
    }

    pub fn note_sent(&mut self, next: Psn) {
        if next.is_after(self.psn_high_) {
            self.psn_high_ = next;
        }
    }

    pub fn mtu(&self) -> u64 {
        self.attr.path_mtu.bytes() as u64
    }

    /// Packets a message of `len` bytes takes at this QP's path MTU (a zero-length message
    /// takes one).
    pub fn pkts_for(&self, len: u64) -> u32 {
        len.div_ceil(self.mtu()).max(1) as u32
    }

    /// True when the requester has something it could send now.
    pub fn has_request_work(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.sq_next < self.sq.len()
            && self.rnr_deadline.is_none()
    }

    /// Request work the pacer does not hold back.
    #[inline]
    pub fn request_ready(&self) -> bool {
        self.has_request_work() && self.cc.as_ref().is_none_or(|c| !c.held())
    }

    /// Something to send now: a CNP, a response, or a request the pacer lets go.
    #[inline]
    pub fn has_tx_work(&self) -> bool {
        self.cnp_out.is_some() || !self.resp_out.is_empty() || self.request_ready()
    }

    /// How many responses the responder holds for the wire, as a responder in hardware has a
    /// fixed number of response slots: one per responder resource (max_dest_rd_atomic) for its
    /// read or atomic response, one for the ACK or NAK that may follow each (ACKs and NAKs in a
    /// row coalesce into one), and one for an ACK or NAK before them all. A requester that keeps
    /// to the limit never needs more; what a peer forces beyond it is dropped and counted.
    pub fn resp_slots(&self) -> usize {
        2 * self.attr.max_dest_rd_atomic.max(1) as usize + 1
    }

    /// The local ACK timeout (IBTA 9.7.6.1.3 in 1.2.1, as pib numbers its table): 4.096 µs ×
    /// 2^timeout, none for 0.
    pub fn ack_timeout(&self) -> Option<Nanos> {
        match self.attr.timeout {
            0 => None,
            t => Some(Nanos(4096u64 << t.min(31))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(id: u64) -> SendWr {
        let op = if id.is_multiple_of(3) {
            WrOpcode::RdmaRead {
                remote_addr: 0,
                rkey: 0,
            }
        } else {
            WrOpcode::Send
        };
        SendWr::new(id, op, Vec::new())
    }

    /// Against VecDeque, through pushes, pops, drops and growth across the wrap.
    #[test]
    fn send_queue_behaves_as_a_deque() {
        let mut q = SendQueue::default();
        let mut r = VecDeque::new();
        let mut next = 0;
        for step in 0..2000u64 {
            match (step * 7919) % 5 {
                0..=2 => {
                    q.push_new(wr(next), 0, true);
                    r.push_back(next);
                    next += 1;
                }
                3 => {
                    assert_eq!(q.pop_front().map(|w| w.wr.wr_id), r.pop_front());
                }
                _ => {
                    q.drop_front();
                    r.pop_front();
                }
            }
            assert_eq!(q.len(), r.len());
            assert_eq!(
                q.reads(),
                q.iter().filter(|w| w.wr.opcode.is_read_or_atomic()).count()
            );
            let ids: Vec<u64> = q.iter().map(|w| w.wr.wr_id).collect();
            assert_eq!(ids, r.iter().copied().collect::<Vec<_>>());
            for (i, w) in q.iter_mut().enumerate() {
                w.npkts = i as u32;
            }
            for i in 0..q.len() {
                assert_eq!(q[i].npkts, i as u32);
                assert_eq!(q.get(i).map(|w| w.wr.wr_id), r.get(i).copied());
            }
            assert!(q.get(q.len()).is_none());
        }
    }
}
