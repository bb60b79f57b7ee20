//! The responder's output: the response queue — ACKs and NAKs coalesced, read and atomic
//! responses in slots — the class C / D errors that end a QP, and the response packets built
//! from the queue's head.
//!
//! Invariant: the queue never holds more than the QP's response slots (plus the one fatal NAK);
//! a response that finds no slot is dropped and counted (`resp_dropped`), as if lost.
use super::recv_wc;
use crate::logs::qp_event;
use crate::rnic::qp::{Qp, Resource, RespMsg, RespOut};
use crate::rnic::verbs::*;
use crate::rnic::{flush, Dev, ErrCause};
use crate::time::Nanos;
use rocemu_wire::frame::pad_for;
use rocemu_wire::headers::{AethRepr, AtomicAckEthRepr};
use rocemu_wire::{BthRepr, ExtHeaders, NakCode, Opcode, Psn, Syndrome};

/// The syndrome of a positive ACK: credits invalid (what rxe sends; RoCE has no end-to-end
/// credits).
const ACK: Syndrome = Syndrome::ack(Syndrome::CREDITS_INVALID);

/// Queues an ACK, coalescing it with an ACK or NAK already waiting (see [`queue_ack`]).
pub(crate) fn push_ack(dev: &mut Dev, qp: &mut Qp, psn: Psn) {
    let slots = qp.resp_slots();
    queue_ack(dev, qp, psn, ACK, slots);
}

pub(super) fn push_nak(dev: &mut Dev, qp: &mut Qp, psn: Psn, syn: Syndrome) {
    let slots = qp.resp_slots();
    queue_ack(dev, qp, psn, syn, slots);
}

/// The NAK of a class C / D error may take one slot more: the QP goes to ERR with it and
/// queues nothing after it, and the requester must learn why rather than time out.
fn push_fatal_nak(dev: &mut Dev, qp: &mut Qp, psn: Psn, syn: Syndrome) {
    let slots = qp.resp_slots() + 1;
    queue_ack(dev, qp, psn, syn, slots);
}

/// Queues an ACK or NAK for `psn`. The queue is bounded by the QP's response slots
/// ([`Qp::resp_slots`]) and a peer must not be able to grow it, whatever it sends: an ACK or
/// NAK acknowledges every request before its PSN (IBTA 9.7.5.1.2, "Coalesced Acknowledge
/// Messages", as quoted on linux-rdma), so one waiting at the back of the queue — nothing
/// queued after it, not yet sent — is replaced by a newer one, and a positive ACK for an older
/// PSN (a duplicate's) is already covered by it. Only the back is merged: an ACK must not move
/// ahead of a read or atomic response queued before it (it would acknowledge that request
/// before its data). What still does not fit is dropped and counted, as if lost: the
/// requester's retry recovers it.
fn queue_ack(dev: &mut Dev, qp: &mut Qp, psn: Psn, syn: Syndrome, slots: usize) {
    let msn = qp.msn;
    if let Some(RespOut::Ack {
        psn: p,
        syndrome,
        msn: m,
    }) = qp.resp_out.back_mut()
    {
        if !psn.is_before(*p) {
            (*p, *syndrome, *m) = (psn, syn.0, msn);
            dev.counters.resp_coalesced += 1;
            return;
        }
        if syn.is_ack() {
            dev.counters.resp_coalesced += 1;
            return;
        }
    }
    let out = RespOut::Ack {
        psn,
        syndrome: syn.0,
        msn,
    };
    if qp.resp_out.len() >= slots {
        dev.counters.resp_dropped += 1;
    } else {
        qp.resp_out.push_back(out);
    }
}

/// Queues a read or atomic response if a slot is free; otherwise drops and counts it.
pub(super) fn queue(dev: &mut Dev, qp: &mut Qp, out: RespOut) {
    if qp.resp_out.len() >= qp.resp_slots() {
        dev.counters.resp_dropped += 1;
    } else {
        qp.resp_out.push_back(out);
    }
}

/// True when a new read or atomic could queue its response: otherwise it is not executed at
/// all (dropped and counted, as if lost on the wire; a conforming requester, which keeps to
/// max_rd_atomic, never meets this).
pub(super) fn room_for_response(dev: &mut Dev, qp: &Qp) -> bool {
    if qp.resp_out.len() < qp.resp_slots() {
        return true;
    }
    dev.counters.resp_dropped += 1;
    false
}

/// A class C / D error (IBTA 9.9.3.1, unverified): NAK, complete the receive in progress with
/// `status`, and move the QP to ERR.
pub(super) fn fatal(
    dev: &mut Dev,
    qp: &mut Qp,
    psn: Psn,
    code: NakCode,
    recv_status: Option<WcStatus>,
) {
    push_fatal_nak(dev, qp, psn, Syndrome::nak(code));
    if let RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
        let wc = recv_wc(qp, &wqe, recv_status.unwrap_or(WcStatus::RemInvReqErr), 0);
        qp.note_wc(&wc);
        dev.push_wc(qp.recv_cq, wc);
    }
    // Responses owed for requests accepted before this one still go out, ahead of the NAK
    // (rxe executes requests one at a time: they were sent before this packet was looked at).
    let owed = std::mem::take(&mut qp.resources);
    flush(dev, qp, ErrCause::FatalNak(code, psn));
    qp.resources = owed;
}

/// Counts an ACK packet leaving with syndrome `syn`, by the NAK code it carries.
fn count_sent(dev: &mut Dev, qp: &mut Qp, syn: Syndrome) {
    use rocemu_wire::SyndromeKind;
    let c = &mut dev.counters;
    match syn.kind() {
        SyndromeKind::Ack { .. } | SyndromeKind::Reserved(_) => return,
        SyndromeKind::RnrNak { .. } => {
            c.send_rnr_err += 1;
            qp.counters.rnr_nak_sent += 1;
            return;
        }
        SyndromeKind::Nak(NakCode::PsnSequenceError) => c.nak_sent_seq_err += 1,
        SyndromeKind::Nak(NakCode::RemoteAccessError) => c.nak_sent_rem_access += 1,
        SyndromeKind::Nak(NakCode::RemoteOperationalError) => c.nak_sent_rem_op += 1,
        // The responder sends no other code: the invalid-RD and reserved ones are counted
        // with the invalid request they stand nearest to.
        SyndromeKind::Nak(_) => c.nak_sent_inv_req += 1,
    }
    qp.counters.nak_sent += 1;
}

/// Builds the next response packet (ACK, NAK, read response, atomic ACK) into `buf`.
pub(crate) fn produce(dev: &mut Dev, qp: &mut Qp, _now: Nanos, buf: &mut [u8]) -> Option<usize> {
    let out = *qp.resp_out.front()?;
    let dqpn = qp.attr.dest_qp_num;
    match out {
        RespOut::Ack { psn, syndrome, msn } => {
            qp.resp_out.pop_front();
            // Counted as they leave: a NAK replaced by a newer one in the queue is not sent.
            count_sent(dev, qp, Syndrome(syndrome));
            if !Syndrome(syndrome).is_ack() {
                qp_event!(qp, DEBUG, psn = psn.value(), syndrome = %Syndrome(syndrome), "NAK sent");
            }
            let bth = BthRepr::new(Opcode::RC_ACKNOWLEDGE, dqpn, psn);
            let ext = ExtHeaders {
                aeth: Some(AethRepr {
                    syndrome: Syndrome(syndrome),
                    msn,
                }),
                ..Default::default()
            };
            dev.emit(qp, None, &bth, &ext, buf, 0, |_, _| {}).ok()
        }
        RespOut::AtomicAck { psn, orig, msn } => {
            qp.resp_out.pop_front();
            let bth = BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dqpn, psn);
            let ext = ExtHeaders {
                aeth: Some(AethRepr { syndrome: ACK, msn }),
                atomic_ack: Some(AtomicAckEthRepr { orig }),
                ..Default::default()
            };
            dev.emit(qp, None, &bth, &ext, buf, 0, |_, _| {}).ok()
        }
        RespOut::Read { res_psn } => {
            let mtu = qp.mtu();
            let pos = qp.resources.iter().position(
                |r| matches!(r, Resource::Read { first_psn, .. } if *first_psn == res_psn),
            );
            let Some(i) = pos else {
                qp.resp_out.pop_front();
                return None;
            };
            let Resource::Read {
                first_psn,
                npkts,
                rkey,
                va,
                len,
                next,
                msn,
                ..
            } = qp.resources[i]
            else {
                return None;
            };
            let k = next;
            let off = k as u64 * mtu;
            let plen = (len - off.min(len)).min(mtu);
            let opcode = match (npkts, k) {
                (1, _) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (_, 0) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (n, k) if k + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            };
            // The region is checked again for every packet: it may have been deregistered or
            // invalidated since the request was accepted.
            let src = if plen > 0 {
                match dev.mem.check_remote(
                    qp.pd,
                    rkey,
                    va.wrapping_add(off),
                    plen,
                    Access::REMOTE_READ,
                ) {
                    Ok(t) => Some(t),
                    Err(()) => {
                        // The NAK takes the response's place in the queue: behind ACKs queued
                        // for later requests it would come after they acknowledged the READ.
                        dev.counters.resp_remote_access_errors += 1;
                        qp.resources.remove(i);
                        // Its MSN counts the messages before the READ, which did not complete.
                        let before = rocemu_wire::Msn::new(msn.value().wrapping_sub(1) & 0xff_ffff);
                        qp.resp_out[0] = RespOut::Ack {
                            psn: first_psn.add(k),
                            syndrome: Syndrome::nak(NakCode::RemoteAccessError).0,
                            msn: before,
                        };
                        return None;
                    }
                }
            } else {
                None
            };
            let mut bth = BthRepr::new(opcode, dqpn, first_psn.add(k));
            bth.pad = pad_for(plen as usize);
            let mut ext = ExtHeaders::default();
            if opcode.info().has(rocemu_wire::opcode::hdr::AETH) {
                ext.aeth = Some(AethRepr { syndrome: ACK, msn });
            }
            let n = dev
                .emit(qp, None, &bth, &ext, buf, plen as usize, |mem, d| {
                    if let Some((mr, o)) = src {
                        // Checked just above, so the read succeeds; were it not, no stale
                        // bytes of an earlier frame go out.
                        let n = d.len();
                        if !matches!(mem.mrs.get(mr), Some(Some(m)) if m.data.read_into(o, d, 0, n))
                        {
                            d.fill(0);
                        }
                    }
                })
                .ok();
            if let Resource::Read { next, .. } = &mut qp.resources[i] {
                *next += 1;
                if *next >= npkts {
                    qp.resp_out.pop_front();
                }
            }
            n
        }
    }
}
