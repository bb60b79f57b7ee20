//! The responder (IBTA 9.7.5.1, 9.8.3 for UC, 9.8.2 and 10.2.4 for UD): PSN checks, opcode
//! sequence checks, receive queue consumption, RDMA WRITE / READ / ATOMIC with R_Key,
//! permission, bounds and alignment checks, duplicates (re-ACK, read re-execution, atomic
//! replay), NAKs and the QP behaviour each implies, RNR NAK, ACK coalescing, the MSN.
//!
//! Invariant: what a QP owes the wire (`resp_out`) is bounded by its response slots
//! ([`Qp::resp_slots`], plus the one NAK that moves it to ERR), whatever a peer sends: ACKs and
//! NAKs coalesce, a duplicate's answer is queued once, and a response that finds no slot is
//! dropped and counted (`resp_dropped`), as if lost — a new read or atomic is then not executed.
use super::qp::{Qp, RecvWqe, Resource, RespMsg, RespOut};
use super::verbs::*;
use super::{flush, Dev, Packet};
use crate::time::Nanos;
use rocemu_wire::frame::pad_for;
use rocemu_wire::headers::{AethRepr, AtomicAckEthRepr};
use rocemu_wire::opcode::{OpcodeInfo, Operation, Position};
use rocemu_wire::{BthRepr, ExtHeaders, NakCode, Opcode, Psn, Syndrome};

/// The syndrome of a positive ACK: credits invalid (what rxe sends; RoCE has no end-to-end
/// credits).
const ACK: Syndrome = Syndrome::ack(Syndrome::CREDITS_INVALID);

pub(crate) fn recv_wc(qp: &Qp, w: &RecvWqe, status: WcStatus, byte_len: u32) -> Wc {
    Wc {
        wr_id: w.wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len,
        imm_data: 0,
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        wc_flags: WcFlags::default(),
        pkey_index: 0,
    }
}

/// Queues an ACK, coalescing it with an ACK or NAK already waiting (see [`queue_ack`]).
fn push_ack(dev: &mut Dev, qp: &mut Qp, psn: Psn) {
    let slots = qp.resp_slots();
    queue_ack(dev, qp, psn, ACK, slots);
}

fn push_nak(dev: &mut Dev, qp: &mut Qp, psn: Psn, syn: Syndrome) {
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
fn queue(dev: &mut Dev, qp: &mut Qp, out: RespOut) {
    if qp.resp_out.len() >= qp.resp_slots() {
        dev.counters.resp_dropped += 1;
    } else {
        qp.resp_out.push_back(out);
    }
}

/// True when a new read or atomic could queue its response: otherwise it is not executed at
/// all (dropped and counted, as if lost on the wire; a conforming requester, which keeps to
/// max_rd_atomic, never meets this).
fn room_for_response(dev: &mut Dev, qp: &Qp) -> bool {
    if qp.resp_out.len() < qp.resp_slots() {
        return true;
    }
    dev.counters.resp_dropped += 1;
    false
}

/// A class C / D error (IBTA 9.9.3.1): NAK, complete the receive in progress with `status`,
/// and move the QP to ERR.
fn fatal(dev: &mut Dev, qp: &mut Qp, psn: Psn, code: NakCode, recv_status: Option<WcStatus>) {
    push_fatal_nak(dev, qp, psn, Syndrome::nak(code));
    if let RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
        let wc = recv_wc(qp, &wqe, recv_status.unwrap_or(WcStatus::RemInvReqErr), 0);
        dev.push_wc(qp.recv_cq, wc);
    }
    // Responses owed for requests accepted before this one still go out, ahead of the NAK
    // (rxe executes requests one at a time: they were sent before this packet was looked at).
    let owed = std::mem::take(&mut qp.resources);
    flush(dev, qp);
    qp.resources = owed;
}

/// One request packet for this QP.
pub(crate) fn handle(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let _ = now;
    match qp.qp_type {
        QpType::Ud => ud_receive(dev, qp, pkt),
        QpType::Uc => uc_receive(dev, qp, pkt),
        QpType::Rc => rc_receive(dev, qp, pkt),
    }
}

// ---- RC --------------------------------------------------------------------------------

fn rc_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
        dev.counters.rx_dropped += 1;
        return;
    }
    let psn = pkt.bth.psn;
    let d = psn.diff(qp.epsn);
    if d > 0 {
        // A gap: NAK once per sequence error (IBTA 9.7.5.1.2, C9-112), then drop silently
        // until the expected PSN shows up.
        dev.counters.seq_errors += 1;
        if !qp.nak_sent {
            qp.nak_sent = true;
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

/// Takes the receive WQE a new message needs, or RNR-NAKs (IBTA 9.7.5.2.8) and returns None.
fn take_recv(dev: &mut Dev, qp: &mut Qp, psn: Psn) -> Option<RecvWqe> {
    match qp.rq.pop_front() {
        Some(w) => Some(w),
        None => {
            // No receive posted: RNR NAK with our min_rnr_timer; drop what follows until the
            // requester comes back to this PSN.
            // Every attempt at the expected PSN gets its RNR NAK (rxe: RESPST_ERR_RNR, class
            // B); nak_sent only silences the out-of-sequence packets behind it.
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
        // error on the receive (IBTA 9.7.5.1.6, C9-140).
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
            // IBTA 10.6.6.2: an R_Key that cannot be invalidated is an invalid request.
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
    dev.push_wc(qp.recv_cq, wc);
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
        // IBTA 9.4.4.3 (C9-88): R_Key, protection domain, permission and bounds; a zero-length
        // transfer checks nothing.
        let check_len = write_check_len(info, plen, total);
        match dev
            .mem
            .check_remote(qp.pd, rkey, va, check_len, Access::REMOTE_WRITE)
        {
            Ok((mr, off)) => {
                if plen > 0 {
                    if let Some(m) = dev.mem.mrs[mr].as_mut() {
                        m.data[off..off + plen as usize].copy_from_slice(pkt.payload);
                    }
                }
            }
            Err(()) => {
                if let Some(w) = recv {
                    qp.rq.push_front(w);
                }
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

/// Opcode sequence (IBTA 9.7.5.1.3, C9-91; 9.8.3 for UC): a MIDDLE or LAST continues the
/// message in progress, anything else needs none in progress.
fn in_sequence(msg: &RespMsg, info: &OpcodeInfo) -> bool {
    let in_send = matches!(msg, RespMsg::Send { .. });
    let in_write = matches!(msg, RespMsg::Write { .. });
    match (info.operation, info.position) {
        (Operation::Send, Position::Middle | Position::Last) => in_send,
        (Operation::RdmaWrite, Position::Middle | Position::Last) => in_write,
        _ => !in_send && !in_write,
    }
}

/// Packet lengths (IBTA 9.7.5.1.3, C9-94): FIRST and MIDDLE carry exactly one path MTU, LAST
/// 1 … MTU bytes, ONLY at most the MTU.
fn length_ok(info: &OpcodeInfo, plen: u64, mtu: u64) -> bool {
    match info.position {
        Position::First | Position::Middle => plen == mtu,
        Position::Last => plen >= 1 && plen <= mtu,
        Position::Only => plen <= mtu,
    }
}

/// Where an RDMA WRITE packet lands — (R_Key, address, bytes remaining, message length) — from
/// the RETH of a FIRST or ONLY, or from the write in progress; `None` for a MIDDLE or LAST with
/// none in progress.
fn write_cursor(msg: &RespMsg, pkt: &Packet<'_>) -> Option<(u32, u64, u64, u64)> {
    match (msg, pkt.ext.reth) {
        (_, Some(r)) => Some((r.rkey.0, r.va, r.dma_len as u64, r.dma_len as u64)),
        (
            RespMsg::Write {
                rkey,
                va,
                remaining,
                total,
            },
            None,
        ) => Some((*rkey, *va, *remaining, *total)),
        _ => None,
    }
}

/// The payload must fit the RETH length, and the last packet must finish it (C9-95).
fn write_fits(info: &OpcodeInfo, plen: u64, remaining: u64) -> bool {
    plen <= remaining && (!info.position.is_last() || plen == remaining)
}

/// The bytes a WRITE packet's access check covers: the whole RETH length at the first packet
/// (so that a write that cannot finish fails before it starts), the packet's own after that.
fn write_check_len(info: &OpcodeInfo, plen: u64, total: u64) -> u64 {
    if info.position.is_first() {
        total
    } else {
        plen
    }
}

/// After an RDMA WRITE packet's bytes landed (RC and UC alike): at the last packet, the message
/// is over and a WRITE with immediate completes its receive; otherwise the write goes on at the
/// next address. `w` is (R_Key, address, payload length, bytes remaining, message length).
fn write_done(
    dev: &mut Dev,
    qp: &mut Qp,
    pkt: &Packet<'_>,
    recv: Option<RecvWqe>,
    w: (u32, u64, u64, u64, u64),
) {
    let (rkey, va, plen, remaining, total) = w;
    if pkt.bth.opcode.info().position.is_last() {
        qp.resp_msg = RespMsg::Idle;
        if let Some(r) = recv {
            let mut wc = recv_wc(qp, &r, WcStatus::Success, total as u32);
            wc.opcode = WcOpcode::RecvRdmaWithImm;
            wc.imm_data = pkt.ext.imm.unwrap_or(0);
            wc.wc_flags = WcFlags::WITH_IMM;
            dev.push_wc(qp.recv_cq, wc);
        }
    } else {
        qp.resp_msg = RespMsg::Write {
            rkey,
            va: va + plen,
            remaining: remaining - plen,
            total,
        };
    }
}

/// Frees responder resources that finished, oldest first, down to `keep` entries.
fn trim_resources(qp: &mut Qp, keep: usize) {
    // Oldest first: resources that finished responding, then re-executions. A conforming
    // requester completes reads in order and only sends a new one with fewer than its
    // max_rd_atomic outstanding, so the oldest replays are ones it no longer waits for (rxe
    // recycles its oldest resource the same way); an original request still being answered is
    // never dropped, so a requester that really exceeds the limit is NAKed (C9-150).
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

fn rc_read(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let Some(reth) = pkt.ext.reth else { return };
    let len = reth.dma_len as u64;
    let max = qp.attr.max_dest_rd_atomic.max(1) as usize;
    trim_resources(qp, max - 1);
    if qp.resources.len() >= max {
        // More reads and atomics outstanding than this QP accepts (C9-150).
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return;
    }
    if !room_for_response(dev, qp) {
        return;
    }
    if len > 0
        && dev
            .mem
            .check_remote(qp.pd, reth.rkey.0, reth.va, len, Access::REMOTE_READ)
            .is_err()
    {
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
    let max = qp.attr.max_dest_rd_atomic.max(1) as usize;
    trim_resources(qp, max - 1);
    if qp.resources.len() >= max {
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return;
    }
    if !room_for_response(dev, qp) {
        return;
    }
    if a.va % 8 != 0 {
        // IBTA 9.4.5 (C9-68): atomics need 8-byte alignment; a misaligned one is an invalid
        // request.
        fatal(dev, qp, psn, NakCode::InvalidRequest, None);
        return;
    }
    let Ok((mr, off)) = dev
        .mem
        .check_remote(qp.pd, a.rkey.0, a.va, 8, Access::REMOTE_ATOMIC)
    else {
        fatal(dev, qp, psn, NakCode::RemoteAccessError, None);
        return;
    };
    let Some(m) = dev.mem.mrs[mr].as_mut() else {
        return;
    };
    let cell: &mut [u8] = &mut m.data[off..off + 8];
    // Host memory order (little-endian, as on the x86 hosts rxe and ConnectX serve).
    let orig = u64::from_le_bytes([
        cell[0], cell[1], cell[2], cell[3], cell[4], cell[5], cell[6], cell[7],
    ]);
    let new = if pkt.bth.opcode == Opcode::RC_COMPARE_SWAP {
        if orig == a.compare {
            a.swap_add
        } else {
            orig
        }
    } else {
        orig.wrapping_add(a.swap_add)
    };
    cell.copy_from_slice(&new.to_le_bytes());
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

/// A request whose PSN is before the expected one (IBTA 9.7.5.1.2, C9-104 … C9-111).
fn duplicate(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    dev.counters.duplicate_requests += 1;
    let psn = pkt.bth.psn;
    // Too old to be a retransmission: drop (IBTA: duplicates lie within the 2^23 window).
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
            // Re-execute from the requested PSN, possibly mid-message (C9-106).
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
            // Answered from the replay cache, never applied twice (C9-107).
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

// ---- UC --------------------------------------------------------------------------------

fn uc_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    if !matches!(
        qp.state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        dev.counters.rx_dropped += 1;
        return;
    }
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    if psn != qp.epsn {
        // IBTA 9.8.3.1: a PSN gap loses the message in progress; the receive WQE is reused.
        dev.counters.seq_errors += 1;
        abandon_uc(qp);
        qp.resp_msg = RespMsg::Drop;
    }
    qp.epsn = psn.next();
    if matches!(qp.resp_msg, RespMsg::Drop) {
        if info.position.is_first() {
            qp.resp_msg = RespMsg::Idle;
        } else {
            return;
        }
    }
    let seq_ok = in_sequence(&qp.resp_msg, info);
    let mtu = qp.mtu();
    let plen = pkt.payload.len() as u64;
    if !seq_ok || !length_ok(info, plen, mtu) {
        abandon_uc(qp);
        qp.resp_msg = if info.position.is_last() {
            RespMsg::Idle
        } else {
            RespMsg::Drop
        };
        return;
    }
    match info.operation {
        Operation::Send => {
            let (wqe, offset) = match std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
                RespMsg::Send { wqe, offset } => (wqe, offset),
                _ => match qp.rq.pop_front() {
                    Some(w) => (w, 0),
                    None => {
                        // No receive: the message is dropped silently (UC has no RNR).
                        dev.counters.rx_dropped += 1;
                        qp.resp_msg = if info.position.is_last() {
                            RespMsg::Idle
                        } else {
                            RespMsg::Drop
                        };
                        return;
                    }
                },
            };
            // Too long or a bad buffer (its region may have been deregistered since it was
            // posted): the receive completes in error (IBTA 9.8.3.2), LOC_LEN_ERR or
            // LOC_PROT_ERR.
            let landed = if wqe.len < offset + plen {
                Err(WcStatus::LocLenErr)
            } else {
                dev.mem
                    .check_sges(qp.pd, &wqe.sg_list, true)
                    .and_then(|_| dev.mem.scatter(qp.pd, &wqe.sg_list, offset, pkt.payload))
                    .map_err(|f| f.status())
            };
            if let Err(status) = landed {
                let wc = recv_wc(qp, &wqe, status, 0);
                dev.push_wc(qp.recv_cq, wc);
                qp.resp_msg = if info.position.is_last() {
                    RespMsg::Idle
                } else {
                    RespMsg::Drop
                };
                return;
            }
            let offset = offset + plen;
            if info.position.is_last() {
                let mut wc = recv_wc(qp, &wqe, WcStatus::Success, offset as u32);
                if let Some(imm) = pkt.ext.imm {
                    wc.imm_data = imm;
                    wc.wc_flags = WcFlags::WITH_IMM;
                }
                dev.push_wc(qp.recv_cq, wc);
            } else {
                qp.resp_msg = RespMsg::Send { wqe, offset };
            }
        }
        Operation::RdmaWrite => {
            let Some((rkey, va, remaining, total)) = write_cursor(&qp.resp_msg, pkt) else {
                return;
            };
            let fits = write_fits(info, plen, remaining);
            let check_len = write_check_len(info, plen, total);
            let target = if check_len > 0 && qp.attr.qp_access_flags.contains(Access::REMOTE_WRITE)
            {
                dev.mem
                    .check_remote(qp.pd, rkey, va, check_len, Access::REMOTE_WRITE)
                    .ok()
            } else if check_len == 0 {
                Some((usize::MAX, 0))
            } else {
                None
            };
            let (Some((mr, off)), true) = (target, fits) else {
                // UC errors drop the message silently (IBTA 9.8.3.2).
                dev.counters.rx_dropped += 1;
                qp.resp_msg = if info.position.is_last() {
                    RespMsg::Idle
                } else {
                    RespMsg::Drop
                };
                return;
            };
            let mut recv = None;
            if info.has_immediate() {
                match qp.rq.pop_front() {
                    Some(w) => recv = Some(w),
                    None => {
                        dev.counters.rx_dropped += 1;
                        qp.resp_msg = RespMsg::Idle;
                        return;
                    }
                }
            }
            if plen > 0 {
                if let Some(Some(m)) = dev.mem.mrs.get_mut(mr) {
                    m.data[off..off + plen as usize].copy_from_slice(pkt.payload);
                }
            }
            write_done(dev, qp, pkt, recv, (rkey, va, plen, remaining, total));
        }
        _ => {}
    }
}

/// A UC message in progress is lost: its receive WQE goes back to the head of the queue.
fn abandon_uc(qp: &mut Qp) {
    if let RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
        qp.rq.push_front(wqe);
    }
}

// ---- UD --------------------------------------------------------------------------------

fn ud_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    if !matches!(
        qp.state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        dev.counters.rx_dropped += 1;
        return;
    }
    let Some(deth) = pkt.ext.deth else { return };
    // IBTA 10.2.4 (C10-15): the Q_Key must match; otherwise the datagram is dropped silently.
    if deth.qkey != qp.attr.qkey {
        dev.counters.rx_dropped += 1;
        return;
    }
    let Some(wqe) = qp.rq.pop_front() else {
        dev.counters.rx_dropped += 1;
        return;
    };
    let plen = pkt.payload.len() as u64;
    // The 40-byte GRH area: the IPv6 header, or for IPv4 20 zero bytes then the IPv4 header
    // (the RoCEv2 convention rdma-core documents for ibv_wc with IBV_WC_GRH).
    let mut grh = [0u8; 40];
    let dg = pkt.datagram();
    if pkt.ip.is_v6() {
        grh.copy_from_slice(&dg[..40]);
    } else {
        grh[20..].copy_from_slice(&dg[..20]);
    }
    // Too short, or a buffer whose region went away since it was posted.
    let landed = if wqe.len < 40 + plen {
        Err(WcStatus::LocLenErr)
    } else {
        let (pd, sges) = (qp.pd, &wqe.sg_list);
        dev.mem
            .check_sges(pd, sges, true)
            .and_then(|_| dev.mem.scatter(pd, sges, 0, &grh))
            .and_then(|_| dev.mem.scatter(pd, sges, 40, pkt.payload))
            .map_err(|f| f.status())
    };
    if let Err(status) = landed {
        let wc = recv_wc(qp, &wqe, status, 0);
        dev.push_wc(qp.recv_cq, wc);
        return;
    }
    let mut wc = recv_wc(qp, &wqe, WcStatus::Success, (40 + plen) as u32);
    wc.src_qp = deth.src_qpn;
    wc.wc_flags = WcFlags::GRH;
    if let Some(imm) = pkt.ext.imm {
        wc.imm_data = imm;
        wc.wc_flags = WcFlags(WcFlags::GRH.0 | WcFlags::WITH_IMM.0);
    }
    dev.push_wc(qp.recv_cq, wc);
}

// ---- output ----------------------------------------------------------------------------

/// Builds the next response packet (ACK, NAK, read response, atomic ACK) into `buf`.
pub(crate) fn produce(dev: &mut Dev, qp: &mut Qp, _now: Nanos, buf: &mut [u8]) -> Option<usize> {
    let out = *qp.resp_out.front()?;
    let dqpn = qp.attr.dest_qp_num;
    match out {
        RespOut::Ack { psn, syndrome, msn } => {
            qp.resp_out.pop_front();
            // Counted as they leave: a NAK replaced by a newer one in the queue is not sent.
            match Syndrome(syndrome).kind() {
                rocemu_wire::SyndromeKind::RnrNak { .. } => dev.counters.rnr_naks_sent += 1,
                rocemu_wire::SyndromeKind::Nak(_) => dev.counters.naks_sent += 1,
                _ => {}
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
                        if let Some(Some(m)) = mem.mrs.get(mr) {
                            d.copy_from_slice(&m.data[o..o + d.len()]);
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
