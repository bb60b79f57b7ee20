//! The completer (IBTA 9.7.5.2 and 9.7.6, unverified): ACKs, NAKs, read responses and atomic ACKs;
//! implied NAKs; the local ACK timeout with retry_cnt; RNR waits with rnr_retry (7 = forever);
//! go-back-N, resuming a READ mid-message; error completions and the QP to ERR.
use super::qp::Qp;
use super::requester::{complete_front, fail_wqe};
use super::verbs::*;
use super::{Dev, Packet};
use crate::logs::qp_event;
use crate::time::Nanos;
use rocemu_wire::opcode::{Operation, Position};
use rocemu_wire::{NakCode, Psn, SyndromeKind};

/// Why the requester goes back (logged with the retransmission).
#[derive(Debug, Clone, Copy)]
enum Why {
    /// A PSN sequence error NAK.
    Nak,
    /// A response beyond a missing one, or an ACK past a READ or atomic without its response.
    ImpliedNak,
    /// The local ACK timer expired.
    Timeout,
    /// The wait an RNR NAK asked for is over.
    RnrWaitOver,
}

/// Restarts sending at PSN `p` (go-back-N). For a READ whose responses partly arrived, the
/// restart is at its first missing response.
fn go_back(qp: &mut Qp, now: Nanos, p: Psn, why: Why) {
    // The first WQE not yet acknowledged in full: its PSNs reach `p`, or it is a read or atomic
    // still waiting for its response (an ACK beyond it does not make up for the response).
    let i = qp.sq.iter().take_while(|w| w.started).position(|w| {
        w.started && (!w.last_psn().is_before(p) || (w.wr.opcode.is_read_or_atomic() && !w.done))
    });
    qp.rnr_deadline = None;
    qp.ack_deadline = if outstanding(qp) {
        qp.ack_timeout().map(|t| now + t)
    } else {
        None
    };
    if let Some(c) = qp.cc.as_deref_mut() {
        c.on_go_back();
    }
    let Some(i) = i else { return };
    let w = &qp.sq[i];
    let mut p = if p.is_before(w.first_psn) || w.last_psn().is_before(p) {
        w.first_psn
    } else {
        p
    };
    if matches!(w.wr.opcode, WrOpcode::RdmaRead { .. }) {
        let resume = w.first_psn.add(w.resp_pkts);
        if p.is_before(resume) {
            p = resume;
        }
    }
    // A loss: halve the window, from what was in flight.
    let inflight = qp
        .req_psn
        .distance_from(qp.acked_psn)
        .max(qp.psn_high().distance_from(qp.acked_psn));
    qp.cwnd = (qp.cwnd.min(inflight) / 2).max(MIN_CWND);
    qp.sq_next = i;
    qp.req_psn = p;
    for w in qp.sq.iter_mut().skip(i) {
        w.rd_counted = false;
    }
    qp.rd_outstanding = qp.sq.iter().take(i).filter(|w| w.rd_counted).count() as u32;
    qp_event!(
        qp,
        DEBUG,
        from_psn = p.value(),
        reason = ?why,
        retry_left = qp.retry_left,
        rnr_left = qp.rnr_left,
        cwnd = qp.cwnd,
        "go-back-N: retransmitting"
    );
}

const MIN_CWND: u32 = 4;

/// True when some WQE was sent and is not complete yet.
fn outstanding(qp: &Qp) -> bool {
    qp.sq.front().is_some_and(|w| w.started)
}

/// After acknowledgements: nothing acknowledged is sent again (a retransmission in progress
/// skips ahead), and with nothing outstanding the timer stops.
fn after_ack(qp: &mut Qp) {
    if qp.req_psn.is_before(qp.acked_psn) {
        let p = qp.acked_psn;
        let i = qp
            .sq
            .iter()
            .take_while(|w| w.started)
            .position(|w| !w.last_psn().is_before(p));
        match i {
            Some(i) => {
                let w = &qp.sq[i];
                let first = w.first_psn;
                if !matches!(w.wr.opcode, WrOpcode::RdmaRead { .. }) || !p.is_after(first) {
                    qp.sq_next = i;
                    qp.req_psn = if p.is_before(first) { first } else { p };
                }
            }
            None => {
                qp.sq_next = qp.sq.iter().take_while(|w| w.started).count();
                qp.req_psn = qp.psn_high();
                if qp.req_psn.is_before(qp.acked_psn) {
                    qp.req_psn = qp.acked_psn;
                }
            }
        }
    }
    if !outstanding(qp) {
        qp.ack_deadline = None;
    }
}

/// The oldest sent READ or atomic still waiting for its response: responses arrive for it (in
/// order), and no acknowledgement may move past its missing ones.
fn awaiting_response(qp: &Qp) -> Option<usize> {
    if qp.sq.reads() == 0 {
        return None;
    }
    qp.sq
        .iter()
        .take_while(|w| w.started)
        .position(|w| w.wr.opcode.is_read_or_atomic() && !w.done)
}

/// Moves the acknowledged PSN forward to `to`, but never past a read or atomic whose response
/// has not arrived: an ACK or NAK beyond it acknowledges the request, not the data (IBTA
/// 9.7.5.2.2, unverified). Returns true when it moved.
fn advance_acked(qp: &mut Qp, now: Nanos, to: Psn) -> bool {
    let limit = awaiting_response(qp).map(|i| qp.sq[i].first_psn.add(qp.sq[i].resp_pkts));
    let to = match limit {
        Some(l) if to.is_after(l) => l,
        _ => to,
    };
    if to.is_after(qp.acked_psn) {
        grow(qp, to);
        qp.acked_psn = to;
        if let Some(c) = qp.cc.as_deref_mut() {
            c.on_acked(now, to);
        }
        true
    } else {
        false
    }
}

/// The window grows by the PSNs newly acknowledged up to `to` (additive per PSN, like slow
/// start: the window doubles each round trip until the next loss).
fn grow(qp: &mut Qp, to: Psn) {
    let n = to
        .distance_from(qp.acked_psn)
        .min(super::requester::MAX_INFLIGHT_PSNS);
    qp.cwnd = (qp.cwnd + n).min(super::requester::MAX_INFLIGHT_PSNS);
}

/// Forward progress: the retry budgets refill (rxe does the same) and the timer restarts.
fn progress(qp: &mut Qp, now: Nanos) {
    qp.retry_pending = false;
    qp.retry_left = qp.attr.retry_cnt;
    qp.rnr_left = qp.attr.rnr_retry;
    qp.ack_deadline = if outstanding(qp) {
        qp.ack_timeout().map(|t| now + t)
    } else {
        None
    };
}

/// Completes every WQE whose PSNs are all at or before `psn`. A READ or atomic among them without
/// its response means responses were lost: an implied NAK (IBTA 9.7.5.2.2, unverified), so go back
/// to it. Returns true when something completed.
fn complete_upto(dev: &mut Dev, qp: &mut Qp, now: Nanos, psn: Psn) -> bool {
    let mut any = false;
    while let Some(w) = qp.sq.front() {
        if !w.started {
            break;
        }
        let covered = !w.last_psn().is_after(psn);
        let rd = w.wr.opcode.is_read_or_atomic();
        let resume = w.first_psn.add(w.resp_pkts);
        if rd && !w.done && !resume.is_after(psn) {
            // The ACK covers a PSN of a read/atomic whose response never came (an implied NAK,
            // IBTA 9.7.5.2.2, unverified). A NAK right after the responses that did come (a
            // READ cut short by the responder) covers none of the missing ones: no retry.
            implied_nak(dev, qp, now, 0, resume);
            return any;
        }
        if !covered {
            break;
        }
        complete_front(dev, qp);
        any = true;
    }
    any
}

pub(super) fn acknowledge(dev: &mut Dev, qp: &mut Qp, now: Nanos, psn: Psn) {
    // An ACK for a PSN never sent, or older than the last one, changes nothing (C9-117,
    // unverified).
    if !psn.is_before(qp.psn_high()) || psn.next().is_before(qp.acked_psn) {
        return;
    }
    if advance_acked(qp, now, psn.next()) {
        progress(qp, now);
    }
    complete_upto(dev, qp, now, psn);
    after_ack(qp);
}

/// Retry budget for a transport error (sequence-error NAK, implied NAK, timeout): false when
/// it is spent.
fn spend_retry(qp: &mut Qp) -> bool {
    if qp.retry_left == 0 {
        return false;
    }
    qp.retry_left -= 1;
    true
}

/// A response is missing (a later one arrived): go back to it, spending one retry — unless a
/// go-back for this gap is already under way.
fn implied_nak(dev: &mut Dev, qp: &mut Qp, now: Nanos, ri: usize, resume: Psn) {
    if qp.retry_pending {
        return;
    }
    if !spend_retry(qp) {
        fail_wqe(dev, qp, ri, WcStatus::RetryExcErr);
        return;
    }
    dev.counters.implied_nak_seq_err += 1;
    dev.counters.completer_retry_err += 1;
    qp.counters.implied_nak_seq_err += 1;
    qp.retry_pending = true;
    go_back(qp, now, resume, Why::ImpliedNak);
}

/// One response packet for this QP: an RC QP in RTS or SQD (checked on receipt).
pub(crate) fn handle(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    let syndrome = pkt.ext.aeth.map(|a| a.syndrome);
    if let Some(s) = syndrome {
        match s.kind() {
            SyndromeKind::Ack { .. } => {}
            SyndromeKind::RnrNak { timer } => {
                dev.counters.rcvd_rnr_err += 1;
                qp.counters.rnr_nak_rcvd += 1;
                if !psn.is_before(qp.psn_high()) {
                    return;
                }
                complete_before(dev, qp, now, psn);
                if qp.attr.rnr_retry != 7 {
                    if qp.rnr_left == 0 {
                        fail_at(dev, qp, psn, WcStatus::RnrRetryExcErr);
                        return;
                    }
                    qp.rnr_left -= 1;
                }
                dev.counters.rnr_nak_retry_err += 1;
                let wait = rocemu_wire::types::RNR_TIMER_MICROS[timer as usize] as u64;
                qp.rnr_deadline = Some(now + Nanos::from_micros(wait));
                qp.rnr_psn = psn;
                qp.ack_deadline = None;
                qp_event!(
                    qp,
                    DEBUG,
                    psn = psn.value(),
                    wait_us = wait,
                    rnr_left = qp.rnr_left,
                    rnr_retry = qp.attr.rnr_retry,
                    "RNR NAK received: waiting"
                );
                return;
            }
            SyndromeKind::Nak(code) => {
                let c = &mut dev.counters;
                match code {
                    NakCode::PsnSequenceError => c.nak_rcvd_seq_err += 1,
                    NakCode::RemoteAccessError => c.nak_rcvd_rem_access += 1,
                    NakCode::RemoteOperationalError => c.nak_rcvd_rem_op += 1,
                    NakCode::InvalidRequest | NakCode::InvalidRdRequest | NakCode::Reserved(_) => {
                        c.nak_rcvd_inv_req += 1
                    }
                }
                qp.counters.nak_rcvd += 1;
                if !psn.is_before(qp.psn_high()) {
                    return;
                }
                let acked_before = qp.acked_psn;
                complete_before(dev, qp, now, psn);
                if matches!(code, NakCode::PsnSequenceError)
                    && rxe_counts_seq_nak(qp, acked_before, psn)
                {
                    dev.counters.rcvd_seq_err += 1;
                }
                qp_event!(qp, DEBUG, psn = psn.value(), ?code, "NAK received");
                match code {
                    NakCode::PsnSequenceError => {
                        if !spend_retry(qp) {
                            fail_at(dev, qp, psn, WcStatus::RetryExcErr);
                            return;
                        }
                        dev.counters.packet_seq_err += 1;
                        dev.counters.completer_retry_err += 1;
                        go_back(qp, now, psn, Why::Nak);
                    }
                    NakCode::InvalidRequest => fail_at(dev, qp, psn, WcStatus::RemInvReqErr),
                    NakCode::RemoteAccessError => fail_at(dev, qp, psn, WcStatus::RemAccessErr),
                    NakCode::RemoteOperationalError => fail_at(dev, qp, psn, WcStatus::RemOpErr),
                    NakCode::InvalidRdRequest | NakCode::Reserved(_) => {
                        fail_at(dev, qp, psn, WcStatus::RemInvReqErr)
                    }
                }
                return;
            }
            SyndromeKind::Reserved(_) => {
                dev.counters.rx_drop_bad_aeth += 1;
                return;
            }
        }
    }
    match info.operation {
        Operation::Acknowledge => acknowledge(dev, qp, now, psn),
        Operation::AtomicAcknowledge => atomic_ack(dev, qp, now, pkt),
        Operation::RdmaReadResponse => read_response(dev, qp, now, pkt),
        _ => {}
    }
}

/// A NAK or response at `psn` acknowledges everything before it.
fn complete_before(dev: &mut Dev, qp: &mut Qp, now: Nanos, psn: Psn) {
    let prev = psn.sub(1);
    if advance_acked(qp, now, psn) {
        progress(qp, now);
    }
    complete_upto(dev, qp, now, prev);
}

/// Whether rxe counts a sequence-error NAK for `psn` in `rcvd_seq_err` (called once the WQEs
/// the NAK acknowledges whole are completed; `acked_before`: the oldest unacknowledged PSN
/// before it). rxe's completer first completes every WQE whose last PSN is before the NAK's
/// (`check_psn()` → `complete_wqe()` in `rxe_comp.c`, which moves `comp.psn` past each), and
/// `check_ack()` then counts `RXE_CNT_RCV_SEQ_ERR` only when `psn_compare(pkt->psn,
/// qp->comp.psn) > 0`: the NAK must fall after the first PSN of the WQE holding it (and after
/// what earlier ACKs covered). A NAK past a READ or atomic still in flight is not counted
/// either (`check_psn()` returns COMPST_ERROR_RETRY or COMPST_DONE before `check_ack()`).
fn rxe_counts_seq_nak(qp: &Qp, acked_before: Psn, psn: Psn) -> bool {
    let Some(w) = qp.sq.front() else {
        return false;
    };
    psn.is_after(acked_before)
        && psn.is_after(w.first_psn)
        && !w.last_psn().is_before(psn)
        && !w.wr.opcode.is_read_or_atomic()
}

/// The WQE holding `psn` fails with `status`; the QP goes to ERR.
fn fail_at(dev: &mut Dev, qp: &mut Qp, psn: Psn, status: WcStatus) {
    let i = qp
        .sq
        .iter()
        .take_while(|w| w.started)
        .position(|w| !w.last_psn().is_before(psn))
        .unwrap_or(0);
    fail_wqe(dev, qp, i, status);
}

/// A READ response or ATOMIC_ACKNOWLEDGE at the PSN the requester waits for next, of a kind the
/// WQE at that PSN does not expect (a READ response for a SEND, WRITE or atomic; an
/// ATOMIC_ACKNOWLEDGE for anything but an atomic): that WQE completes IBV_WC_BAD_RESP_ERR and
/// the QP goes to ERR. rdma-core's ibv_poll_cq(3): "Bad Response Error - an unexpected transport
/// layer opcode was returned by the responder"; rxe's check_ack() fails the WQE as well (with
/// IBV_WC_FATAL_ERR). A response at any other PSN is a duplicate or a gap, handled by the
/// callers. Returns true when the WQE failed.
fn unexpected_opcode(dev: &mut Dev, qp: &mut Qp, psn: Psn, read_response: bool) -> bool {
    if psn != qp.acked_psn {
        return false;
    }
    let Some(i) = qp
        .sq
        .iter()
        .take_while(|w| w.started)
        .position(|w| !w.last_psn().is_before(psn))
    else {
        return false;
    };
    let w = &qp.sq[i];
    let expected = if read_response {
        matches!(w.wr.opcode, WrOpcode::RdmaRead { .. })
    } else {
        w.wr.opcode.is_atomic()
    };
    if psn.is_before(w.first_psn) || expected {
        return false;
    }
    dev.counters.rx_drop_unexpected_resp += 1;
    fail_wqe(dev, qp, i, WcStatus::BadRespErr);
    true
}

fn read_response(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    if unexpected_opcode(dev, qp, psn, true) {
        return;
    }
    // The READ this response belongs to: the oldest WQE still waiting for responses.
    let Some(ri) = awaiting_response(qp) else {
        dev.counters.rx_drop_unexpected_resp += 1;
        return;
    };
    let (first, npkts, got, is_read) = {
        let w = &qp.sq[ri];
        (
            w.first_psn,
            w.npkts,
            w.resp_pkts,
            matches!(w.wr.opcode, WrOpcode::RdmaRead { .. }),
        )
    };
    if psn.is_before(first) {
        dev.counters.rx_drop_duplicate_resp += 1; // a duplicate of an older response
        return;
    }
    // Everything before the READ is acknowledged by its response (IBTA 9.7.5.1.2, coalesced ACKs).
    if ri > 0 {
        complete_before(dev, qp, now, first);
    }
    let Some(ri) = awaiting_response(qp) else {
        return;
    };
    let expected = first.add(got);
    if !is_read || psn != expected {
        if psn.is_after(expected) || !is_read {
            // A gap in the responses: implied NAK, ask again from the first missing one —
            // once per gap, not once per packet after it.
            implied_nak(dev, qp, now, ri, expected);
        } else {
            dev.counters.rx_drop_duplicate_resp += 1;
        }
        return;
    }
    let info = pkt.bth.opcode.info();
    let mtu = qp.mtu();
    let w = &qp.sq[ri];
    let off = got as u64 * mtu;
    let remaining = w.len.saturating_sub(off);
    let plen = pkt.payload.len() as u64;
    let base = w.read_base.min(got);
    let fits = |k: u32, n: u32| match info.position {
        Position::Only => n == 1,
        Position::First => k == 0 && n > 1,
        Position::Middle => k > 0 && k + 1 < n,
        Position::Last => k > 0 && k + 1 == n,
    };
    // Numbered within the original request, or within the resumed one (IBTA 9.4.4: a retried READ
    // may start later).
    let pos_ok = fits(got, npkts) || fits(got - base, npkts - base);
    let len_ok = if got + 1 == npkts {
        plen == remaining
    } else {
        plen == mtu
    };
    if !pos_ok || !len_ok {
        // Malformed response (IBTA 9.7.5.2.5, unverified): bad response error.
        fail_wqe(dev, qp, ri, WcStatus::BadRespErr);
        return;
    }
    let sges = w.wr.sg_list.clone();
    if let Err(f) = dev.mem.scatter(qp.pd, &sges, off, pkt.payload) {
        // The sink was deregistered after the READ was checked: LOC_PROT_ERR and the QP to ERR
        // (rxe's do_read), not a success without its data.
        fail_wqe(dev, qp, ri, f.status());
        return;
    }
    let w = &mut qp.sq[ri];
    w.resp_pkts += 1;
    let last = info.position.is_last();
    if last {
        w.done = true;
    }
    // Each response in order acknowledges its PSN.
    advance_acked(qp, now, psn.next());
    let w = &mut qp.sq[ri];
    if last {
        let last = w.last_psn();
        advance_acked(qp, now, last.next());
        progress(qp, now);
        complete_upto(dev, qp, now, last);
    } else {
        progress(qp, now);
    }
    after_ack(qp);
}

fn atomic_ack(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    if unexpected_opcode(dev, qp, psn, false) {
        return;
    }
    let Some(ri) = awaiting_response(qp) else {
        dev.counters.rx_drop_unexpected_resp += 1;
        return;
    };
    let first = qp.sq[ri].first_psn;
    if psn != first || !qp.sq[ri].wr.opcode.is_atomic() {
        if psn.is_after(first) {
            let resume = first.add(qp.sq[ri].resp_pkts);
            implied_nak(dev, qp, now, ri, resume);
        } else {
            dev.counters.rx_drop_duplicate_resp += 1;
        }
        return;
    }
    if ri > 0 {
        complete_before(dev, qp, now, first);
    }
    let Some(ri) = awaiting_response(qp) else {
        return;
    };
    let orig = pkt.ext.atomic_ack.map(|a| a.orig).unwrap_or(0);
    let sges = qp.sq[ri].wr.sg_list.clone();
    // The original value lands in the local buffer in host order; a sink deregistered since
    // the atomic was checked fails it (rxe's do_atomic).
    if let Err(f) = dev.mem.scatter(qp.pd, &sges, 0, &orig.to_le_bytes()) {
        fail_wqe(dev, qp, ri, f.status());
        return;
    }
    let w = &mut qp.sq[ri];
    w.done = true;
    w.resp_pkts = 1;
    advance_acked(qp, now, psn.next());
    progress(qp, now);
    complete_upto(dev, qp, now, psn);
    after_ack(qp);
}

/// The ACK and RNR timers.
pub(crate) fn timeout(dev: &mut Dev, qp: &mut Qp, now: Nanos) {
    if let Some(t) = qp.rnr_deadline {
        if t <= now {
            qp.rnr_deadline = None;
            let p = qp.rnr_psn;
            go_back(qp, now, p, Why::RnrWaitOver);
        }
    }
    if let Some(t) = qp.ack_deadline {
        if t <= now {
            qp.ack_deadline = None;
            if !outstanding(qp) {
                return;
            }
            if !spend_retry(qp) {
                // Retries exhausted (the retry counter, unverified; 9.7.6.1.3 is the timeout):
                // RETRY_EXC_ERR and the QP to ERR.
                fail_wqe(dev, qp, 0, WcStatus::RetryExcErr);
                return;
            }
            dev.counters.local_ack_timeout_err += 1;
            dev.counters.completer_retry_err += 1;
            qp.counters.local_ack_timeout_err += 1;
            let p = qp.acked_psn;
            go_back(qp, now, p, Why::Timeout);
        }
    }
}
