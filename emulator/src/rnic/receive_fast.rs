//! The receive fast path: an RDMA WRITE or SEND packet (FIRST, MIDDLE, LAST or ONLY, without
//! immediate data or invalidation) to an RC QP, at the QP's expected PSN, in an untagged IPv4
//! frame — what a connected QP receives most — checked and executed from the frame's bytes,
//! without the general parse. (A SEND for a QP on an SRQ goes the general way.) And the answer
//! a requester receives most: an RC ACKNOWLEDGE whose AETH says ACK, for the completer.
//!
//! It is a hardware pipeline's fast path: it takes a packet only when every check of the general
//! path (`receive_parsed`, then the responder's `rc_receive`, `rc_write` and `rc_send`) would
//! pass, and
//! changes nothing before it knows that. Any other packet — a field out of the ordinary (a VLAN
//! tag, IPv6, IP options, another opcode), a check that would fail (ICRC, IPv4 checksum, P_Key,
//! QP state, source, R_Key, bounds, lengths), a duplicate or a gap, a CE mark (the notification
//! point's business) — goes to the general path, which checks it again from the start and
//! executes, NAKs, drops or counts it. The frames sent, the state and the counters are the same
//! either way: `emulator/tests/fast_path.rs` runs a lossy random workload with the fast paths
//! (`RnicConfig::fast_path`) and without, and compares them.
use super::qp::RespMsg;
use super::receive::count_rcvd;
use super::verbs::*;
use super::{completer, responder, Rnic};
use crate::time::Nanos;
use rocemu_wire::opcode::Position;
use rocemu_wire::{icrc, PKey, Psn, Qpn, ROCEV2_UDP_PORT};
use std::net::{IpAddr, Ipv4Addr};

/// Where the headers of an untagged IPv4 RoCEv2 frame start.
const L3: usize = 14;
const L4: usize = L3 + 20;
const BTH: usize = L4 + 8;
const RETH: usize = BTH + 12;
const AETH: usize = BTH + 12;
/// IP, UDP, BTH and ICRC: the least an RDMA WRITE MIDDLE or LAST datagram holds.
const MIN_DATAGRAM: usize = 20 + 8 + 12 + 4;

#[inline(always)]
fn be16(f: &[u8], at: usize) -> u16 {
    // One range check for the field, not one per byte.
    u16::from_be_bytes(f[at..at + 2].try_into().unwrap())
}

#[inline(always)]
fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(f[at..at + 4].try_into().unwrap())
}

impl Rnic {
    /// True when the fast path took the frame (executed it, as the general path would have);
    /// false when it left the frame as it found it, for the general path.
    #[inline]
    pub(super) fn receive_fast(&mut self, frame: &mut [u8], now: Nanos) -> bool {
        let n = frame.len();
        if n < L3 + MIN_DATAGRAM {
            return false;
        }
        let f: &[u8] = frame;
        // Ethernet: to this port's MAC, untagged, IPv4.
        if be16(f, 12) != 0x0800 || f[..6] != self.dev.cfg.mac.0 {
            return false;
        }
        // IPv4 without options, not a fragment, UDP, with its length inside the frame and not
        // marked CE; to one of this device's addresses.
        let total = be16(f, L3 + 2) as usize;
        if f[L3] != 0x45
            || f[L3 + 9] != 17
            || be16(f, L3 + 6) & 0x3fff != 0
            || total < MIN_DATAGRAM
            || total > n - L3
            || f[L3 + 1] & 3 == 3
        {
            return false;
        }
        let dst = Ipv4Addr::new(f[L3 + 16], f[L3 + 17], f[L3 + 18], f[L3 + 19]);
        if !self.dev.cfg.ips.contains(&IpAddr::V4(dst)) {
            return false;
        }
        // UDP to 4791, its length the IP payload's.
        if be16(f, L4 + 2) != ROCEV2_UDP_PORT || be16(f, L4 + 4) as usize != total - 20 {
            return false;
        }
        if f[BTH] == 0x11 {
            return self.receive_ack_fast(frame, now, total); // RC ACKNOWLEDGE
        }
        // The BTH: an RC SEND or RDMA WRITE without immediate data, TVer 0, the default
        // partition.
        let (send, has_reth, position) = match f[BTH] {
            0x00 => (true, false, Position::First),   // SEND FIRST
            0x01 => (true, false, Position::Middle),  // SEND MIDDLE
            0x02 => (true, false, Position::Last),    // SEND LAST
            0x04 => (true, false, Position::Only),    // SEND ONLY
            0x06 => (false, true, Position::First),   // WRITE FIRST
            0x07 => (false, false, Position::Middle), // WRITE MIDDLE
            0x08 => (false, false, Position::Last),   // WRITE LAST
            0x0a => (false, true, Position::Only),    // WRITE ONLY
            _ => return false,
        };
        let (first, last) = (position.is_first(), position.is_last());
        let flags = f[BTH + 1];
        if flags & 0x0f != 0 || !PKey(be16(f, BTH + 2)).matches(PKey::DEFAULT) {
            return false;
        }
        let pad = ((flags >> 4) & 3) as usize;
        let hdrs = MIN_DATAGRAM + if has_reth { 16 } else { 0 };
        if total < hdrs + pad {
            return false;
        }
        let plen = total - hdrs - pad;
        let payload_at = RETH + if has_reth { 16 } else { 0 };
        let psn_word = be32(f, BTH + 8);
        let (ack_req, psn) = (psn_word & 0x8000_0000 != 0, Psn::new(psn_word));
        // The QP: RC, taking requests, from its peer, at the expected PSN.
        let Some((slot, qp)) = self.peer_qp(f) else {
            return false;
        };
        if qp.qp_type != QpType::Rc
            || !matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            || psn != qp.epsn
        {
            return false;
        }
        if send {
            return self.receive_send_fast(
                frame,
                slot,
                position,
                (psn, ack_req),
                (total, payload_at, plen),
            );
        }
        if !qp.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            return false;
        }
        // The write: a new one (FIRST, ONLY) with none in progress, or the one in progress;
        // lengths as the position needs (C9-92) and within what the RETH asked for (C9-95).
        let (rkey, va, remaining, msg_len) = match (&qp.resp_msg, first) {
            (RespMsg::Idle, true) => {
                let len = be32(f, RETH + 12) as u64;
                (
                    be32(f, RETH + 8),
                    u64::from_be_bytes(f[RETH..RETH + 8].try_into().unwrap()),
                    len,
                    len,
                )
            }
            (
                RespMsg::Write {
                    rkey,
                    va,
                    remaining,
                    total,
                },
                false,
            ) => (*rkey, *va, *remaining, *total),
            _ => return false,
        };
        let p = plen as u64;
        if !responder::length_ok_at(position, p, qp.mtu())
            || p > remaining
            || (last && p != remaining)
        {
            return false;
        }
        // R_Key, protection domain, permission and bounds (the whole message at its first
        // packet); a zero-length write checks nothing.
        let mut target = None;
        if plen > 0 || (first && msg_len > 0) {
            let check_len = if first { msg_len } else { p };
            match self
                .dev
                .mem
                .check_remote(qp.pd, rkey, va, check_len, Access::REMOTE_WRITE)
            {
                Ok(t) => target = Some(t),
                Err(()) => return false,
            }
        }
        if !self.frame_sound(frame, total) {
            return false;
        }
        // Every check passed: execute, as the general path does.
        let payload = &frame[payload_at..payload_at + plen];
        let Some(qp) = self.qps[slot].as_mut() else {
            return false;
        };
        count_rcvd(&mut self.dev.counters, qp, n);
        if first {
            self.dev.counters.rx_write_requests += 1;
        }
        if let (Some((mr, off)), true) = (target, plen > 0) {
            if let Some(m) = self.dev.mem.mrs[mr].as_mut() {
                m.data.write(off, payload);
            }
        }
        if last {
            qp.msn = qp.msn.next();
            qp.resp_msg = RespMsg::Idle;
        } else {
            qp.resp_msg = RespMsg::Write {
                rkey,
                va: va + p,
                remaining: remaining - p,
                total: msg_len,
            };
        }
        self.request_done(slot, psn, ack_req);
        true
    }

    /// An RC ACKNOWLEDGE (its Ethernet, IP and UDP headers checked by `receive_fast`) whose
    /// AETH syndrome is an ACK, with no payload and no pad, TVer 0, the default partition, to
    /// an RC QP in RTS or SQD from its peer: what `receive_parsed` and the completer's `handle`
    /// do for it when every check passes — counted, then `acknowledge`. False, with nothing
    /// changed, for anything else (a NAK, an RNR NAK, a reserved syndrome, a bad checksum).
    fn receive_ack_fast(&mut self, frame: &mut [u8], now: Nanos, total: usize) -> bool {
        let n = frame.len();
        let f: &[u8] = frame;
        if total != MIN_DATAGRAM + 4
            || f[BTH + 1] & 0x3f != 0
            || !PKey(be16(f, BTH + 2)).matches(PKey::DEFAULT)
            || f[AETH] & 0xe0 != 0
        {
            return false;
        }
        let psn = Psn::new(be32(f, BTH + 8));
        let slot = match self.peer_qp(f) {
            Some((slot, qp))
                if qp.qp_type == QpType::Rc && matches!(qp.state, QpState::Rts | QpState::Sqd) =>
            {
                slot
            }
            _ => return false,
        };
        if !self.frame_sound(frame, total) {
            return false;
        }
        let Some(qp) = self.qps[slot].as_mut() else {
            return false;
        };
        count_rcvd(&mut self.dev.counters, qp, n);
        completer::acknowledge(&mut self.dev, qp, now, psn);
        self.settle(slot);
        true
    }

    /// The QP the frame's BTH names (its slot with it), if the frame comes from that QP's
    /// peer: a connected QP takes packets from its peer only (`receive_parsed`'s check).
    #[inline(always)]
    fn peer_qp(&self, f: &[u8]) -> Option<(usize, &super::qp::Qp)> {
        let slot = self.slot_of(Qpn::new(be32(f, BTH + 4)))?;
        let qp = self.qps[slot].as_ref()?;
        let src = Ipv4Addr::new(f[L3 + 12], f[L3 + 13], f[L3 + 14], f[L3 + 15]);
        (IpAddr::V4(src) == qp.peer_ip).then_some((slot, qp))
    }

    /// After a packet executed: the QP's turn on the schedule and its deadlines, and any CQ
    /// that overflowed (as `receive_parsed` ends).
    #[inline(always)]
    fn settle(&mut self, slot: usize) {
        self.refresh(slot);
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
    }

    /// After a request packet executed: the next PSN expected, its ACK queued when asked for,
    /// the QP's turn on the schedule (as `rc_receive` and `receive_parsed` end).
    #[inline(always)]
    fn request_done(&mut self, slot: usize, psn: Psn, ack_req: bool) {
        if let Some(qp) = self.qps[slot].as_mut() {
            qp.nak_sent = false;
            qp.epsn = psn.next();
            if ack_req {
                responder::push_ack(&mut self.dev, qp, psn);
            }
        }
        self.settle(slot);
    }

    /// The IPv4 checksum, then the ICRC (IBTA A17.3.3), computed in place: the frame is left
    /// as it was. `total` is the IP datagram's length.
    #[inline]
    fn frame_sound(&self, frame: &mut [u8], total: usize) -> bool {
        if !rocemu_wire::ip::ipv4_checksum_ok(&frame[L3..L4]) {
            return false;
        }
        if self.dev.cfg.check_icrc {
            let end = L3 + total;
            let c = icrc::compute_in_place(frame, L3, 20, false, end);
            if icrc::to_wire(c) != frame[end - 4..end] {
                return false;
            }
        }
        true
    }

    /// A SEND packet (FIRST, MIDDLE, LAST, ONLY, without immediate data or invalidation) for
    /// the RC QP in `slot`, its frame's headers and PSN checked: what the responder's
    /// `rc_send` does when every check passes — a new message takes the QP's next receive WQE
    /// (a QP on an SRQ goes the general way), the payload lands in its SGEs at the message's
    /// offset, the last packet completes it. False, with nothing changed, when any check would
    /// fail: no receive WQE (RNR), a message longer than the WQE, an SGE the region table
    /// refuses, a bad checksum.
    fn receive_send_fast(
        &mut self,
        frame: &mut [u8],
        slot: usize,
        position: Position,
        (psn, ack_req): (Psn, bool),
        (total, payload_at, plen): (usize, usize, usize),
    ) -> bool {
        let (first, last) = (position.is_first(), position.is_last());
        let n = frame.len();
        let solicited = frame[BTH + 1] & 0x80 != 0;
        let Some(qp) = self.qps[slot].as_ref() else {
            return false;
        };
        if !responder::length_ok_at(position, plen as u64, qp.mtu()) {
            return false;
        }
        let (wqe, offset) = match (&qp.resp_msg, first) {
            (RespMsg::Idle, true) if qp.srq.is_none() => match qp.rq.front() {
                Some(w) => (w, 0),
                None => return false,
            },
            (RespMsg::Send { wqe, offset }, false) => (wqe, *offset),
            _ => return false,
        };
        if wqe.len < offset + plen as u64
            || self.dev.mem.check_sges(qp.pd, &wqe.sg_list, true).is_err()
        {
            return false;
        }
        if !self.frame_sound(frame, total) {
            return false;
        }
        // Every check passed: execute, as the general path does.
        let Some(qp) = self.qps[slot].as_mut() else {
            return false;
        };
        count_rcvd(&mut self.dev.counters, qp, n);
        let (wqe, offset) = match std::mem::replace(&mut qp.resp_msg, RespMsg::Idle) {
            RespMsg::Send { wqe, offset } => (wqe, offset),
            _ => match self.dev.next_recv(qp) {
                Some(w) => (w, 0),
                None => unreachable!("the receive queue's front was there a moment ago"),
            },
        };
        let payload = &frame[payload_at..payload_at + plen];
        // The SGEs were checked whole and the payload fits the WQE: the scatter's own checks
        // (the same ones, piece by piece) pass.
        let landed = self.dev.mem.scatter(qp.pd, &wqe.sg_list, offset, payload);
        debug_assert!(landed.is_ok());
        let offset = offset + plen as u64;
        if last {
            let wc = responder::recv_wc(qp, &wqe, WcStatus::Success, offset as u32);
            qp.msn = qp.msn.next();
            self.dev.push_recv_wc(qp.recv_cq, wc, solicited);
        } else {
            qp.resp_msg = RespMsg::Send { wqe, offset };
        }
        self.request_done(slot, psn, ack_req);
        true
    }
}
