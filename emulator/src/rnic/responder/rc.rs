//! The RC responder (IBTA 9.7.4.1 in 1.5): PSN and opcode-sequence checks, receive queue
//! consumption, RDMA WRITE / READ / ATOMIC with their R_Key, permission, bounds and alignment
//! checks, and the duplicates (re-ACK, read re-execution, atomic replay).
//!
//! Invariants: a request is executed once — its duplicate is answered from the responder's
//! resources, never executed again (an atomic is replayed from its saved result); a new read or
//! atomic with no response slot free is not executed at all.
use super::responses::{fatal, push_ack, push_nak, queue, room_for_response};
use super::{
    in_sequence, length_ok, recv_wc, write_check_len, write_cursor, write_done, write_fits,
};
use crate::rnic::mr::AtomicOp;
use crate::rnic::qp::{Qp, RecvWqe, Resource, RespMsg, RespOut};
use crate::rnic::verbs::*;
use crate::rnic::{Dev, Packet};
use rocemu_wire::opcode::Operation;
use rocemu_wire::{NakCode, Opcode, Psn, Syndrome};

/// One RC request packet; the QP's state was checked on receipt (an RC QP never enters SQE).
pub(super) fn rc_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let d = psn.diff(qp.epsn);
    if d > 0 {
        // A gap: NAK once per sequence error (C9-112, unverified), then drop silently
        // until the expected PSN shows up.
        dev.counters.out_of_sequence += 1;
        qp.counters.out_of_sequence += 1;
        if !qp.nak_sent {
            qp.nak_sent = true;
            dev.counters.out_of_seq_request += 1;
            push_nak(dev, qp, qp.epsn, Syndrome::nak(NakCode::PsnSequenceError));
        }
        return;
    }
    if d < 0 {
        duplicate(dev, qp, pkt);
        return;
    }
    let info = pkt.bth.opcode.info();
    let seq_ok = in_sequence(&qp.resp_msg, info);
    if !seq_ok {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return;
    }
    let mtu = qp.mtu();
    let plen = pkt.payload.len() as u64;
    if info.has_payload() && !length_ok(info, plen, mtu) {
        fatal(
            dev,
            qp,
            psn,
            NakCode::InvalidRequest,
            Some(WcStatus::LocLenErr),
        );
        return;
    }
    let access = qp.attr.qp_access_flags;
    match info.operation {
        Operation::Send => {
            if !rc_send(dev, qp, pkt) {
                return;
            }
        }
        Operation::RdmaWrite => {
            if !access.contains(Access::REMOTE_WRITE) {
                fatal(dev, qp, psn, NakCode::InvalidRequest, None);
                return;
            }
            if !rc_write(dev, qp, pkt) {
                return;
            }
        }
        Operation::RdmaReadRequest => {
            if !access.contains(Access::REMOTE_READ) || !pkt.payload.is_empty() {
                fatal(dev, qp, psn, NakCode::InvalidRequest, None);
                return;
            }
            rc_read(dev, qp, pkt);
            return;
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            if !access.contains(Access::REMOTE_ATOMIC) || !pkt.payload.is_empty() {
                fatal(dev, qp, psn, NakCode::InvalidRequest, None);
                return;
            }
            rc_atomic(dev, qp, pkt);
            return;
        }
        // FLUSH and ATOMIC WRITE (IBA 1.5) are not offered (the device does not advertise
        // them): an unsupported opcode is an invalid request.
        _ => {
            fatal(dev, qp, psn, NakCode::InvalidRequest, None);
            return;
        }
    }
    qp.nak_sent = false;
    qp.epsn = psn.next();
    if pkt.bth.ack_req {
        push_ack(dev, qp, psn);
    }
}

/// Takes the receive WQE a new message needs, or RNR-NAKs (IBTA 9.7.5.2.8, unverified) and returns
/// None.
fn take_recv(dev: &mut Dev, qp: &mut Qp, psn: Psn) -> Option<RecvWqe> {
    match dev.next_recv(qp) {
        Some(w) => Some(w),
        None => {
            // No receive posted: RNR NAK with our min_rnr_timer; drop what follows until the
            // requester comes back to this PSN.
            // Every attempt at the expected PSN gets its RNR NAK (rxe: RESPST_ERR_RNR, class
            // B); nak_sent only silences the out-of-sequence packets behind it.
            dev.counters.out_of_buffer += 1;
            qp.nak_sent = true;
            push_nak(dev, qp, psn, Syndrome::rnr_nak(qp.attr.min_rnr_timer));
            None
        }
    }
}

/// SEND FIRST / MIDDLE / LAST / ONLY. Returns true when the packet was consumed.
fn rc_send(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) -> bool {
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    let (wqe, offset) = match std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
        RespMsg::Send { wqe, offset } => (wqe, offset),
        _ => match take_recv(dev, qp, psn) {
            Some(w) => (w, 0),
            None => return false,
        },
    };
    if wqe.len < offset + pkt.payload.len() as u64 {
        // The message is longer than the receive buffer: invalid request NAK, local length
        // error on the receive (IBTA 9.7.5.1.6, unverified).
        qp.resp_msg = RespMsg::Send { wqe, offset };
        fatal(
            dev,
            qp,
            psn,
            NakCode::InvalidRequest,
            Some(WcStatus::LocLenErr),
        );
        return false;
    }
    // The whole receive buffer is checked at every packet (its region may have been
    // deregistered since it was posted), then the copy checks again what it touches.
    let landed = dev
        .mem
        .check_sges(qp.pd, &wqe.sg_list, true)
        .and_then(|_| dev.mem.scatter(qp.pd, &wqe.sg_list, offset, pkt.payload));
    if let Err(f) = landed {
        qp.resp_msg = RespMsg::Send { wqe, offset };
        fatal(
            dev,
            qp,
            psn,
            NakCode::RemoteOperationalError,
            Some(f.status()),
        );
        return false;
    }
    let offset = offset + pkt.payload.len() as u64;
    if !info.position.is_last() {
        qp.resp_msg = RespMsg::Send { wqe, offset };
        return true;
    }
    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, offset as u32);
    if let Some(imm) = pkt.ext.imm {
        wc.imm_data = imm;
        wc.wc_flags = WcFlags(wc.wc_flags.0 | WcFlags::WITH_IMM.0);
    }
    if let Some(k) = pkt.ext.ieth {
        if !dev.mem.invalidate_rkey(qp.pd, k.0) {
            // IBTA 10.6.6.2 (unverified): an R_Key that cannot be invalidated is an invalid
            // request.
            qp.resp_msg = RespMsg::Send { wqe, offset };
            fatal(
                dev,
                qp,
                psn,
                NakCode::InvalidRequest,
                Some(WcStatus::RemInvReqErr),
            );
            return false;
        }
        wc.imm_data = k.0;
        wc.wc_flags = WcFlags(wc.wc_flags.0 | WcFlags::WITH_INV.0);
    }
    qp.msn = qp.msn.next();
    dev.push_recv_wc(qp.recv_cq, wc, pkt.bth.solicited);
    true
}

/// RDMA WRITE FIRST / MIDDLE / LAST / ONLY (with immediate). Returns true when consumed.
fn rc_write(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) -> bool {
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    let plen = pkt.payload.len() as u64;
    let Some((rkey, va, remaining, total)) = write_cursor(&qp.resp_msg, pkt) else {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return false;
    };
    if info.position.is_first() {
        dev.counters.rx_write_requests += 1;
    }
    if !write_fits(info, plen, remaining) {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return false;
    }
    // WRITE with immediate consumes a receive WQE at its last packet: check before writing,
    // so that an RNR NAK leaves memory as it was.
    let mut recv = None;
    if info.has_immediate() {
        match take_recv(dev, qp, psn) {
            Some(w) => recv = Some(w),
            None => return false,
        }
    }
    if plen > 0 || (info.position.is_first() && total > 0) {
        // IBTA 9.7.4.1.5 in 1.5: R_Key, protection domain, permission and bounds; a zero-length
        // transfer checks nothing.
        let check_len = write_check_len(info, plen, total);
        match dev
            .mem
            .check_remote(qp.pd, rkey, va, check_len, Access::REMOTE_WRITE)
        {
            Ok((mr, off)) => {
                if plen > 0 {
                    // The check covered `plen` bytes at `off`: the write cannot fail.
                    if let Some(m) = dev.mem.mrs[mr].as_mut() {
                        m.data.write(off, pkt.payload);
                    }
                }
            }
            Err(()) => {
                if let Some(w) = recv {
                    dev.unget_recv(qp, w);
                }
                dev.counters.resp_remote_access_errors += 1;
                fatal(dev, qp, psn, NakCode::RemoteAccessError, None);
                return false;
            }
        }
    }
    if info.position.is_last() {
        qp.msn = qp.msn.next();
    }
    write_done(dev, qp, pkt, recv, (rkey, va, plen, remaining, total));
    true
}

/// Frees responder resources that finished, oldest first, down to `keep` entries.
fn trim_resources(qp: &mut Qp, keep: usize) {
    // Oldest first: resources that finished responding, then re-executions. A conforming
    // requester completes reads in order and only sends a new one with fewer than its
    // max_rd_atomic outstanding, so the oldest replays are ones it no longer waits for (rxe
    // recycles its oldest resource the same way); an original request still being answered is
    // never dropped, so a requester that really exceeds the limit is NAKed (C9-150, unverified).
    let finished = |r: &Resource| match r {
        Resource::Read { next, npkts, .. } => next >= npkts,
        Resource::Atomic { .. } => true,
    };
    let replay = |r: &Resource| matches!(r, Resource::Read { replay: true, .. });
    for pick in [&finished as &dyn Fn(&Resource) -> bool, &replay] {
        while qp.resources.len() > keep {
            match qp.resources.iter().position(pick) {
                Some(i) => {
                    // A replay still being answered takes its queued response with it: the
                    // queue holds a response only for a resource that exists.
                    if let Some(Resource::Read { first_psn, .. }) = qp.resources.remove(i) {
                        qp.resp_out.retain(
                            |o| !matches!(o, RespOut::Read { res_psn } if *res_psn == first_psn),
                        );
                    }
                }
                None => break,
            }
        }
    }
}

/// Whether a new READ or atomic at `psn` may take one of the QP's `max_dest_rd_atomic`
/// responder resources and a response slot: more reads and atomics outstanding than the QP
/// accepts are an invalid request (C9-150, unverified), NAKed and fatal; with no response slot
/// free the request is not executed at all, as if lost (the requester sends it again).
fn responder_resource(dev: &mut Dev, qp: &mut Qp, psn: Psn) -> bool {
    // max_dest_rd_atomic 0: the QP takes no READ or atomic at all (rxe's check_resource():
    // RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, a NAK invalid request).
    if qp.attr.max_dest_rd_atomic == 0 {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return false;
    }
    let max = qp.attr.max_dest_rd_atomic as usize;
    trim_resources(qp, max - 1);
    if qp.resources.len() >= max {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return false;
    }
    room_for_response(dev, qp)
}

fn rc_read(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let Some(reth) = pkt.ext.reth else { return };
    let len = reth.dma_len as u64;
    dev.counters.rx_read_requests += 1;
    if !responder_resource(dev, qp, psn) {
        return;
    }
    if len > 0
        && dev
            .mem
            .check_remote(qp.pd, reth.rkey.0, reth.va, len, Access::REMOTE_READ)
            .is_err()
    {
        dev.counters.resp_remote_access_errors += 1;
        fatal(dev, qp, psn, NakCode::RemoteAccessError, None);
        return;
    }
    let npkts = qp.pkts_for(len);
    qp.msn = qp.msn.next();
    qp.resources.push_back(Resource::Read {
        first_psn: psn,
        npkts,
        rkey: reth.rkey.0,
        va: reth.va,
        len,
        next: 0,
        replay: false,
        msn: qp.msn,
    });
    queue(dev, qp, RespOut::Read { res_psn: psn });
    qp.nak_sent = false;
    qp.epsn = psn.add(npkts);
}

fn rc_atomic(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let Some(a) = pkt.ext.atomic else { return };
    dev.counters.rx_atomic_requests += 1;
    if !responder_resource(dev, qp, psn) {
        return;
    }
    if a.va % 8 != 0 {
        // IBTA 9.4.5 (C9-68), unverified: atomics need 8-byte alignment; a misaligned one is an
        // invalid request.
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return;
    }
    let Ok((mr, off)) = dev
        .mem
        .check_remote(qp.pd, a.rkey.0, a.va, 8, Access::REMOTE_ATOMIC)
    else {
        dev.counters.resp_remote_access_errors += 1;
        fatal(dev, qp, psn, NakCode::RemoteAccessError, None);
        return;
    };
    let op = if pkt.bth.opcode == Opcode::RC_COMPARE_SWAP {
        AtomicOp::CompareSwap {
            compare: a.compare,
            swap: a.swap_add,
        }
    } else {
        AtomicOp::FetchAdd(a.swap_add)
    };
    // The check covered the 8 bytes at `off`: the operation cannot miss.
    let Some(orig) = dev.mem.mrs[mr]
        .as_mut()
        .and_then(|m| m.data.atomic(off, op))
    else {
        return;
    };
    qp.msn = qp.msn.next();
    qp.resources.push_back(Resource::Atomic {
        psn,
        orig,
        msn: qp.msn,
    });
    let msn = qp.msn;
    queue(dev, qp, RespOut::AtomicAck { psn, orig, msn });
    qp.nak_sent = false;
    qp.epsn = psn.next();
}

/// A request whose PSN is before the expected one (C9-104 … C9-111, unverified but for C9-105).
fn duplicate(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    dev.counters.duplicate_request += 1;
    qp.counters.duplicate_request += 1;
    let psn = pkt.bth.psn;
    // Too old to be a retransmission: drop (duplicates lie within the 2^23 window; no section
    // checked).
    let info = pkt.bth.opcode.info();
    match info.operation {
        Operation::Send | Operation::RdmaWrite => {
            // Never executed twice; acknowledged again (C9-105) with the duplicate's own PSN,
            // not the latest one: a later READ or atomic may lie in between, and an ACK must
            // never cover one whose response the requester may still be waiting for (rdma_rxe
            // completes the READ on such an ACK without its data; found by rping under loss).
            push_ack(dev, qp, psn);
        }
        Operation::RdmaReadRequest => {
            let Some(reth) = pkt.ext.reth else { return };
            // Re-execute from the requested PSN, possibly mid-message (C9-106, unverified).
            let pos = qp.resources.iter().position(|r| match r {
                Resource::Read {
                    first_psn, npkts, ..
                } => psn.in_window(*first_psn, *npkts),
                _ => false,
            });
            let Some(i) = pos else { return };
            let len = reth.dma_len as u64;
            if len > 0
                && dev
                    .mem
                    .check_remote(qp.pd, reth.rkey.0, reth.va, len, Access::REMOTE_READ)
                    .is_err()
            {
                dev.counters.resp_remote_access_errors += 1;
                fatal(dev, qp, psn, NakCode::RemoteAccessError, None);
                return;
            }
            let (msn, old_psn) = match qp.resources[i] {
                Resource::Read { msn, first_psn, .. } => (msn, first_psn),
                _ => (qp.msn, psn),
            };
            let npkts = qp.pkts_for(len);
            qp.resources[i] = Resource::Read {
                first_psn: psn,
                npkts,
                rkey: reth.rkey.0,
                va: reth.va,
                len,
                next: 0,
                replay: true,
                msn,
            };
            // One queued response per resource: a re-execution still waiting to go out (or
            // under way) restarts where it stands in the queue, from the new PSN.
            let queued = qp.resp_out.iter_mut().find_map(|o| match o {
                RespOut::Read { res_psn } if *res_psn == old_psn || *res_psn == psn => {
                    Some(res_psn)
                }
                _ => None,
            });
            match queued {
                Some(r) => {
                    *r = psn;
                    dev.counters.resp_coalesced += 1;
                }
                None => {
                    queue(dev, qp, RespOut::Read { res_psn: psn });
                }
            }
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            // Answered from the replay cache, never applied twice (C9-107, unverified).
            let hit = qp.resources.iter().find_map(|r| match r {
                Resource::Atomic { psn: p, orig, msn } if *p == psn => Some((*orig, *msn)),
                _ => None,
            });
            if let Some((orig, msn)) = hit {
                // Its answer queued already (not sent yet) needs no second copy.
                let queued = qp
                    .resp_out
                    .iter()
                    .any(|o| matches!(o, RespOut::AtomicAck { psn: p, .. } if *p == psn));
                if queued {
                    dev.counters.resp_coalesced += 1;
                } else {
                    queue(dev, qp, RespOut::AtomicAck { psn, orig, msn });
                }
            }
        }
        _ => {}
    }
}
