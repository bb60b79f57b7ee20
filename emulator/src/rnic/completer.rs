//! The completer (IBTA 9.7.5.2, 9.7.6): ACKs, NAKs, read responses and atomic ACKs; implied
//! NAKs; the local ACK timeout with retry_cnt; RNR waits with rnr_retry (7 = forever);
//! go-back-N, resuming a READ mid-message; error completions and the QP to ERR.
use super::qp::Qp;
use super::requester::{complete_front, fail_wqe};
use super::verbs::*;
use super::{Dev, Packet};
use crate::time::Nanos;
use rocemu_wire::opcode::{Operation, Position};
use rocemu_wire::{NakCode, Psn, SyndromeKind};

/// Restarts sending at PSN `p` (go-back-N). For a READ whose responses partly arrived, the
/// restart is at its first missing response.
fn go_back(qp: &mut Qp, now: Nanos, mut p: Psn) {
    let i = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.started && !w.last_psn().is_before(p));
    let Some(i) = i else { return };
    let w = &qp.sq[i];
    if p.is_before(w.first_psn) {
        p = w.first_psn;
    }
    if matches!(w.wr.opcode, WrOpcode::RdmaRead { .. }) {
        let resume = w.first_psn.add(w.resp_pkts);
        if p.is_before(resume) {
            p = resume;
        }
    }
    qp.sq_next = i;
    qp.req_psn = p;
    for w in qp.sq.iter_mut().skip(i) {
        w.rd_counted = false;
    }
    qp.rd_outstanding = qp.sq.iter().take(i).filter(|w| w.rd_counted).count() as u32;
    qp.rnr_deadline = None;
    qp.ack_deadline = qp.ack_timeout().map(|t| now + t);
}

/// Forward progress: the retry budgets refill (rxe does the same) and the timer restarts.
fn progress(qp: &mut Qp, now: Nanos) {
    qp.retry_left = qp.attr.retry_cnt;
    qp.rnr_left = qp.attr.rnr_retry;
    qp.ack_deadline = if qp.sq_next > 0 {
        qp.ack_timeout().map(|t| now + t)
    } else {
        None
    };
}

/// Completes every WQE whose PSNs are all at or before `psn`. A READ or atomic among them
/// without its response means responses were lost: an implied NAK (IBTA 9.7.5.2.2), so go back
/// to it. Returns true when something completed.
fn complete_upto(dev: &mut Dev, qp: &mut Qp, now: Nanos, psn: Psn) -> bool {
    let mut any = false;
    while qp.sq_next > 0 {
        let w = &qp.sq[0];
        if !w.started {
            break;
        }
        let covered = !w.last_psn().is_after(psn);
        let rd = w.wr.opcode.is_read_or_atomic();
        if rd && !w.done && !w.first_psn.is_after(psn) {
            // The ACK covers a read/atomic whose response never came.
            let resume = w.first_psn.add(w.resp_pkts);
            go_back(qp, now, resume);
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

fn acknowledge(dev: &mut Dev, qp: &mut Qp, now: Nanos, psn: Psn) {
    // An ACK for a PSN never sent, or older than the last one, changes nothing (C9-117).
    if !psn.is_before(qp.psn_high()) || psn.next().is_before(qp.acked_psn) {
        return;
    }
    if psn.next().is_after(qp.acked_psn) {
        qp.acked_psn = psn.next();
        progress(qp, now);
    }
    complete_upto(dev, qp, now, psn);
    if qp.sq_next == 0 {
        qp.ack_deadline = None;
    }
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

/// One response packet for this QP (RC only).
pub(crate) fn handle(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) || qp.qp_type != QpType::Rc {
        dev.counters.rx_dropped += 1;
        return;
    }
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    let syndrome = pkt.ext.aeth.map(|a| a.syndrome);
    if let Some(s) = syndrome {
        match s.kind() {
            SyndromeKind::Ack { .. } => {}
            SyndromeKind::RnrNak { timer } => {
                dev.counters.rnr_naks_received += 1;
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
                let wait = rocemu_wire::types::RNR_TIMER_MICROS[timer as usize] as u64;
                qp.rnr_deadline = Some(now + Nanos::from_micros(wait));
                qp.rnr_psn = psn;
                qp.ack_deadline = None;
                return;
            }
            SyndromeKind::Nak(code) => {
                dev.counters.naks_received += 1;
                if !psn.is_before(qp.psn_high()) {
                    return;
                }
                complete_before(dev, qp, now, psn);
                match code {
                    NakCode::PsnSequenceError => {
                        if !spend_retry(qp) {
                            fail_at(dev, qp, psn, WcStatus::RetryExcErr);
                            return;
                        }
                        go_back(qp, now, psn);
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
                dev.counters.rx_dropped += 1;
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
    if psn.is_after(qp.acked_psn) {
        qp.acked_psn = psn;
        progress(qp, now);
    }
    complete_upto(dev, qp, now, prev);
}

/// The WQE holding `psn` fails with `status`; the QP goes to ERR.
fn fail_at(dev: &mut Dev, qp: &mut Qp, psn: Psn, status: WcStatus) {
    let i = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.started && !w.last_psn().is_before(psn))
        .unwrap_or(0);
    fail_wqe(dev, qp, i, status);
}

fn read_response(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    // The READ this response belongs to: the oldest WQE still waiting for responses.
    let Some(ri) = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.wr.opcode.is_read_or_atomic() && !w.done)
    else {
        dev.counters.rx_dropped += 1;
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
        dev.counters.rx_dropped += 1; // a duplicate of an older response
        return;
    }
    // Everything before the READ is acknowledged by its response (IBTA 9.7.5.2.2).
    if ri > 0 {
        complete_before(dev, qp, now, first);
    }
    let Some(ri) = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.wr.opcode.is_read_or_atomic() && !w.done)
    else {
        return;
    };
    let expected = first.add(got);
    if !is_read || psn != expected {
        if psn.is_after(expected) || !is_read {
            // A gap in the responses: implied NAK, ask again from the first missing one.
            if !spend_retry(qp) {
                fail_wqe(dev, qp, ri, WcStatus::RetryExcErr);
                return;
            }
            go_back(qp, now, expected);
            dev.counters.retransmits += 0;
        } else {
            dev.counters.rx_dropped += 1;
        }
        return;
    }
    let info = pkt.bth.opcode.info();
    let mtu = qp.mtu();
    let w = &qp.sq[ri];
    let off = got as u64 * mtu;
    let remaining = w.len.saturating_sub(off);
    let plen = pkt.payload.len() as u64;
    let k = got;
    let pos_ok = match info.position {
        Position::Only => npkts == 1,
        Position::First => k == 0 && npkts > 1,
        Position::Middle => k > 0 && k + 1 < npkts,
        Position::Last => k > 0 && k + 1 == npkts,
    };
    let len_ok = if info.position.is_last() {
        plen == remaining
    } else {
        plen == mtu
    };
    if !pos_ok || !len_ok {
        // Malformed response (IBTA 9.7.5.2.5): bad response error.
        fail_wqe(dev, qp, ri, WcStatus::BadRespErr);
        return;
    }
    let sges = w.wr.sg_list.clone();
    dev.mem.scatter(&sges, off, pkt.payload);
    let w = &mut qp.sq[ri];
    w.resp_pkts += 1;
    if info.position.is_last() {
        w.done = true;
        let last = w.last_psn();
        qp.acked_psn = last.next();
        progress(qp, now);
        complete_upto(dev, qp, now, last);
    } else {
        progress(qp, now);
    }
    if qp.sq_next == 0 {
        qp.ack_deadline = None;
    }
}

fn atomic_ack(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let Some(ri) = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.wr.opcode.is_read_or_atomic() && !w.done)
    else {
        dev.counters.rx_dropped += 1;
        return;
    };
    let first = qp.sq[ri].first_psn;
    if psn != first || !qp.sq[ri].wr.opcode.is_atomic() {
        if psn.is_after(first) {
            if !spend_retry(qp) {
                fail_wqe(dev, qp, ri, WcStatus::RetryExcErr);
                return;
            }
            go_back(qp, now, first);
        } else {
            dev.counters.rx_dropped += 1;
        }
        return;
    }
    if ri > 0 {
        complete_before(dev, qp, now, first);
    }
    let Some(ri) = qp
        .sq
        .iter()
        .take(qp.sq_next)
        .position(|w| w.wr.opcode.is_read_or_atomic() && !w.done)
    else {
        return;
    };
    let orig = pkt.ext.atomic_ack.map(|a| a.orig).unwrap_or(0);
    let sges = qp.sq[ri].wr.sg_list.clone();
    // The original value lands in the local buffer in host order.
    dev.mem.scatter(&sges, 0, &orig.to_le_bytes());
    let w = &mut qp.sq[ri];
    w.done = true;
    w.resp_pkts = 1;
    qp.acked_psn = psn.next();
    progress(qp, now);
    complete_upto(dev, qp, now, psn);
    if qp.sq_next == 0 {
        qp.ack_deadline = None;
    }
}

/// The ACK and RNR timers.
pub(crate) fn timeout(dev: &mut Dev, qp: &mut Qp, now: Nanos) {
    if let Some(t) = qp.rnr_deadline {
        if t <= now {
            qp.rnr_deadline = None;
            let p = qp.rnr_psn;
            go_back(qp, now, p);
        }
    }
    if let Some(t) = qp.ack_deadline {
        if t <= now {
            qp.ack_deadline = None;
            if qp.sq_next == 0 {
                return;
            }
            dev.counters.local_ack_timeouts += 1;
            if !spend_retry(qp) {
                // IBTA 9.7.6.1.3: retries exhausted: RETRY_EXC_ERR and the QP to ERR.
                fail_wqe(dev, qp, 0, WcStatus::RetryExcErr);
                return;
            }
            let p = qp.acked_psn;
            go_back(qp, now, p);
        }
    }
}
