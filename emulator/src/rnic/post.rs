//! The post paths (`ibv_post_send`, `ibv_post_recv`): the doorbell. A work request is checked
//! as far as post time allows and queued; the transmit scheduler picks the QP up from there.
//!
//! Invariants: a queue never holds more than its capacity; what post time cannot check (local
//! keys) fails the WQE when it executes, with `LocProtErr`, as on hardware; a post to a QP in ERR
//! completes at once with WR_FLUSH_ERR.
use super::qp::{RecvWqe, SendWqe};
use super::verbs::*;
use super::{requester, responder, Rnic};
use rocemu_wire::Qpn;

impl Rnic {
    /// `ibv_post_send`. Checks what can be checked at post time (state, queue space, SGE
    /// count, opcode for the QP type, sizes); local keys are checked when the WQE executes and
    /// fail it with `LocProtErr`, as on hardware.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        match qp.state {
            QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe => {}
            s => return invalid(format!("post_send in state {s:?} (needs RTS)")),
        }
        if qp.sq.len() >= qp.cap.max_send_wr as usize {
            return Err(VerbsError::NoSpace("send queue full"));
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        if !inline && wr.sg_list.len() > qp.cap.max_send_sge as usize {
            return invalid(format!(
                "{} SGEs above max_send_sge {}",
                wr.sg_list.len(),
                qp.cap.max_send_sge
            ));
        }
        if inline && wr.inline_data.len() > qp.cap.max_inline_data as usize {
            return invalid(format!(
                "{} inline bytes above max_inline_data {}",
                wr.inline_data.len(),
                qp.cap.max_inline_data
            ));
        }
        let ok_for_type = match qp.qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                wr.opcode,
                WrOpcode::Send
                    | WrOpcode::SendWithImm { .. }
                    | WrOpcode::RdmaWrite { .. }
                    | WrOpcode::RdmaWriteWithImm { .. }
            ),
            QpType::Ud => matches!(wr.opcode, WrOpcode::Send | WrOpcode::SendWithImm { .. }),
        };
        if !ok_for_type {
            return invalid(format!(
                "{:?} is not valid on a {:?} QP",
                wr.opcode, qp.qp_type
            ));
        }
        if qp.qp_type == QpType::Ud && wr.ud.is_none() {
            return invalid("UD send without a destination (wr.ud)");
        }
        if inline && wr.opcode.is_read_or_atomic() {
            return invalid("INLINE is for sends and writes");
        }
        let len: u64 = if inline {
            wr.inline_data.len() as u64
        } else {
            wr.sg_list.iter().map(|s| s.length as u64).sum()
        };
        if len > 1 << 31 {
            return invalid("message longer than 2^31 bytes");
        }
        if wr.opcode.is_atomic() {
            let addr = match wr.opcode {
                WrOpcode::AtomicCmpSwap { remote_addr, .. }
                | WrOpcode::AtomicFetchAdd { remote_addr, .. } => remote_addr,
                _ => 0,
            };
            if len != 8 {
                return invalid("atomics need one 8-byte local buffer");
            }
            if addr % 8 != 0 {
                // Sent anyway on hardware, and NAKed; rdma-core passes it through. So do we:
                // the responder's check is what conformance tests look at.
            }
        }
        let signaled = qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        if qp.state == QpState::Err {
            // Flushed at once, and counted as rxe's completer counts a flushed SEND.
            let mut wqe = SendWqe::new(wr, len, signaled);
            requester::count_flushed_send(&mut self.dev, &wqe);
            wqe.error = Some(WcStatus::WrFlushErr);
            let wc = requester::wc_for(qp, &wqe, WcStatus::WrFlushErr);
            qp.note_wc(&wc);
            self.dev.push_wc(qp.send_cq, wc);
            self.settle_cq_errors();
            return Ok(());
        }
        // Built in its ring slot: a WQE is ~180 bytes, and each move of it is a memcpy call.
        qp.sq.push_new(wr, len, signaled);
        // Onto the transmit schedule if it is not there yet. A post moves no retransmit or RNR
        // deadline, so those timers are left alone; a paced QP's may move (its pacer starts
        // with the first request), so it goes through `refresh`.
        if qp.cc.is_some() {
            self.refresh(slot);
        } else {
            super::schedule::schedule(&mut self.tx_sched, slot, qp);
        }
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        if qp.srq.is_some() {
            return invalid("post_recv on a QP with an SRQ (post to the SRQ: post_srq_recv)");
        }
        if qp.state == QpState::Reset {
            return invalid("post_recv in RESET");
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(VerbsError::NoSpace("receive queue full"));
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return invalid(format!(
                "{} SGEs above max_recv_sge {}",
                wr.sg_list.len(),
                qp.cap.max_recv_sge
            ));
        }
        let len = wr.sg_list.iter().map(|s| s.length as u64).sum();
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            sg_list: wr.sg_list,
            len,
        };
        if qp.state == QpState::Err {
            let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
            qp.note_wc(&wc);
            self.dev.push_wc(qp.recv_cq, wc);
            self.settle_cq_errors();
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }
}
