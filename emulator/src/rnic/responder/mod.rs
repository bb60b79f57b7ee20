//! The responder (IBTA 9.7.4.1 in 1.5; UC 9.8.2.2, UD 9.8.3 and 10.2.4, all three unverified): PSN
//! checks, opcode sequence checks, receive queue consumption, RDMA WRITE / READ / ATOMIC with
//! R_Key, permission, bounds and alignment checks, duplicates (re-ACK, read re-execution, atomic
//! replay), NAKs and the QP behaviour each implies, RNR NAK, ACK coalescing, the MSN.
//!
//! Invariant: what a QP owes the wire (`resp_out`) is bounded by its response slots
//! ([`Qp::resp_slots`], plus the one NAK that moves it to ERR), whatever a peer sends: ACKs and
//! NAKs coalesce, a duplicate's answer is queued once, and a response that finds no slot is
//! dropped and counted (`resp_dropped`), as if lost — a new read or atomic is then not executed.
//!
//! Files: `rc.rs` executes RC requests (SEND, WRITE, READ, ATOMIC, duplicates), `uc.rs` and
//! `ud.rs` the UC and UD receive paths, `responses.rs` is the response queue (ACK coalescing,
//! NAKs, the fatal errors) and builds the responses for the wire; this file dispatches and holds
//! the message checks RC and UC share.
mod rc;
mod responses;
mod uc;
mod ud;

use crate::rnic::qp::{Qp, RecvWqe, RespMsg};
use crate::rnic::verbs::*;
use crate::rnic::{Dev, Packet};
use crate::time::Nanos;
pub(crate) use responses::{produce, push_ack};
use rocemu_wire::opcode::{OpcodeInfo, Operation, Position};

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

/// One request packet for this QP.
pub(crate) fn handle(dev: &mut Dev, qp: &mut Qp, now: Nanos, pkt: &Packet<'_>) {
    let _ = now;
    match qp.qp_type {
        QpType::Ud => ud::ud_receive(dev, qp, pkt),
        QpType::Uc => uc::uc_receive(dev, qp, pkt),
        QpType::Rc => rc::rc_receive(dev, qp, pkt),
    }
}

/// Opcode sequence (IBTA 9.7.4.1 in 1.5; C9-91 and, for UC, 9.8.2.2 unverified): a MIDDLE or LAST
/// continues the message in progress, anything else needs none in progress.
pub(super) fn in_sequence(msg: &RespMsg, info: &OpcodeInfo) -> bool {
    let in_send = matches!(msg, RespMsg::Send { .. });
    let in_write = matches!(msg, RespMsg::Write { .. });
    match (info.operation, info.position) {
        (Operation::Send, Position::Middle | Position::Last) => in_send,
        (Operation::RdmaWrite, Position::Middle | Position::Last) => in_write,
        _ => !in_send && !in_write,
    }
}

/// Packet lengths (IBTA 9.7.4.1.6 in 1.5, C9-92 as rxe numbers it): FIRST and MIDDLE carry exactly
/// one path MTU, LAST 1 … MTU bytes, ONLY at most the MTU.
pub(super) fn length_ok(info: &OpcodeInfo, plen: u64, mtu: u64) -> bool {
    length_ok_at(info.position, plen, mtu)
}

/// [`length_ok`] by the packet's position alone (the receive fast path knows it from its own
/// opcode match).
#[inline]
pub(crate) fn length_ok_at(position: Position, plen: u64, mtu: u64) -> bool {
    match position {
        Position::First | Position::Middle => plen == mtu,
        Position::Last => plen >= 1 && plen <= mtu,
        Position::Only => plen <= mtu,
    }
}

/// Where an RDMA WRITE packet lands — (R_Key, address, bytes remaining, message length) — from
/// the RETH of a FIRST or ONLY, or from the write in progress; `None` for a MIDDLE or LAST with
/// none in progress.
pub(super) fn write_cursor(msg: &RespMsg, pkt: &Packet<'_>) -> Option<(u32, u64, u64, u64)> {
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

/// The payload must fit the RETH length, and the last packet must finish it (C9-95, unverified).
pub(super) fn write_fits(info: &OpcodeInfo, plen: u64, remaining: u64) -> bool {
    plen <= remaining && (!info.position.is_last() || plen == remaining)
}

/// The bytes a WRITE packet's access check covers: the whole RETH length at the first packet
/// (so that a write that cannot finish fails before it starts), the packet's own after that.
pub(super) fn write_check_len(info: &OpcodeInfo, plen: u64, total: u64) -> u64 {
    if info.position.is_first() {
        total
    } else {
        plen
    }
}

/// After an RDMA WRITE packet's bytes landed (RC and UC alike): at the last packet, the message
/// is over and a WRITE with immediate completes its receive; otherwise the write goes on at the
/// next address. `w` is (R_Key, address, payload length, bytes remaining, message length).
pub(super) fn write_done(
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
            dev.push_recv_wc(qp.recv_cq, wc, pkt.bth.solicited);
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
