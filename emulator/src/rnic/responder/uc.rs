//! The UC responder (IBTA 9.8.2.2.x, unverified: issue 20's number; not 9.8.3): no ACKs, no NAKs,
//! no retries.
//!
//! Invariants: nothing is ever sent back; a message cut by a PSN gap or an opcode out of
//! sequence is dropped and its receive WQE goes back to the head of the queue ([`abandon_uc`]),
//! for the next message; one that does not fit its receive buffer, or finds the buffer's region
//! gone, completes the receive in error (LOC_LEN_ERR, LOC_PROT_ERR).
use super::{
    in_sequence, length_ok, recv_wc, write_check_len, write_cursor, write_done, write_fits,
};
use crate::rnic::qp::{Qp, RespMsg};
use crate::rnic::verbs::*;
use crate::rnic::{Dev, Packet};
use rocemu_wire::opcode::Operation;

/// One UC request packet; the QP's state was checked on receipt.
pub(super) fn uc_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let psn = pkt.bth.psn;
    let info = pkt.bth.opcode.info();
    if psn != qp.epsn {
        // IBTA 9.8.2.2 (unverified): a PSN gap loses the message in progress; the receive WQE is
        // reused.
        dev.counters.out_of_sequence += 1;
        qp.counters.out_of_sequence += 1;
        abandon_uc(dev, qp);
        qp.resp_msg = RespMsg::Drop;
    }
    qp.epsn = psn.next();
    if matches!(qp.resp_msg, RespMsg::Drop) {
        if info.position.is_first() {
            qp.resp_msg = RespMsg::Idle;
        } else {
            dev.counters.rx_drop_rest_of_msg += 1;
            return;
        }
    }
    let seq_ok = in_sequence(&qp.resp_msg, info);
    let mtu = qp.mtu();
    let plen = pkt.payload.len() as u64;
    if !seq_ok || !length_ok(info, plen, mtu) {
        if seq_ok {
            dev.counters.rx_drop_bad_length += 1;
        } else {
            dev.counters.rx_drop_opcode_seq += 1;
        }
        abandon_uc(dev, qp);
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
                _ => match dev.next_recv(qp) {
                    Some(w) => (w, 0),
                    None => {
                        // No receive: the message is dropped silently (UC has no RNR).
                        dev.counters.out_of_buffer += 1;
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
            // posted): the receive completes in error (IBTA 9.8.2.2, unverified), LOC_LEN_ERR or
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
                qp.note_wc(&wc);
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
                dev.push_recv_wc(qp.recv_cq, wc, pkt.bth.solicited);
            } else {
                qp.resp_msg = RespMsg::Send { wqe, offset };
            }
        }
        Operation::RdmaWrite => {
            let Some((rkey, va, remaining, total)) = write_cursor(&qp.resp_msg, pkt) else {
                // A MIDDLE or LAST with no write in progress (the sequence check lets none
                // through; counted should one come).
                dev.counters.rx_drop_opcode_seq += 1;
                return;
            };
            if info.position.is_first() {
                dev.counters.rx_write_requests += 1;
            }
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
                // UC errors drop the message silently (IBTA 9.8.2.2, unverified).
                if fits {
                    dev.counters.resp_remote_access_errors += 1;
                } else {
                    dev.counters.rx_drop_bad_length += 1;
                }
                qp.resp_msg = if info.position.is_last() {
                    RespMsg::Idle
                } else {
                    RespMsg::Drop
                };
                return;
            };
            let mut recv = None;
            if info.has_immediate() {
                match dev.next_recv(qp) {
                    Some(w) => recv = Some(w),
                    None => {
                        dev.counters.out_of_buffer += 1;
                        qp.resp_msg = RespMsg::Idle;
                        return;
                    }
                }
            }
            if plen > 0 {
                if let Some(Some(m)) = dev.mem.mrs.get_mut(mr) {
                    m.data.write(off, pkt.payload);
                }
            }
            write_done(dev, qp, pkt, recv, (rkey, va, plen, remaining, total));
        }
        _ => {}
    }
}

/// A UC message in progress is lost: its receive WQE goes back to the head of its queue (RQ
/// or SRQ).
fn abandon_uc(dev: &mut Dev, qp: &mut Qp) {
    if let RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
        dev.unget_recv(qp, wqe);
    }
}
