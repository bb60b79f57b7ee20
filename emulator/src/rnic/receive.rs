//! Receive dispatch: a frame from the port is counted, parsed, checked (address, ICRC, IP
//! checksum, transport version, P_Key), matched to its QP, and handed to the completer (a
//! response) or the responder (a request).
//!
//! Invariants: every frame is counted once: in `rcvd_pkts` as it goes to its QP, or under the one
//! `rx_drop_*` reason it was dropped for (or, a CNP, in `rp_cnp_handled` or `rp_cnp_ignored`);
//! a connected QP takes packets from its peer only, in RTR or later; no frame, whatever it
//! holds, panics.
use super::verbs::*;
use super::{cc, completer, responder, Rnic};
use crate::logs::qp_event;
use crate::time::Nanos;
use rocemu_wire::frame::ParsedFrame;
use rocemu_wire::opcode::Transport;
use rocemu_wire::{parse_frame, PKey};

/// A frame as the receive stages see it: parsed, its ICRC checked or not asked for.
pub(crate) type Packet<'a> = ParsedFrame<'a>;

impl Rnic {
    /// One frame from the port.
    pub fn handle_frame(&mut self, now: Nanos, frame: &[u8]) {
        self.receive(now, frame, self.dev.cfg.check_icrc);
    }

    /// One frame from the port, in a buffer the caller owns: parsed once, and the ICRC verified
    /// in one pass over the frame (its variant fields are masked in place and put back), which
    /// costs what a plain CRC does. The frame is left as it was.
    pub fn handle_frame_mut(&mut self, now: Nanos, frame: &mut [u8]) {
        if self.dev.cfg.fast_path && self.receive_fast(frame, now) {
            return;
        }
        if !self.dev.cfg.check_icrc {
            self.receive(now, frame, false);
            return;
        }
        let len = frame.len();
        // Handed over by reference: returning the parsed frame (some 300 bytes) copies it.
        rocemu_wire::frame::with_frame_in_place(frame, |r| match r {
            Err(_) => self.dev.counters.rx_drop_malformed += 1,
            // IBTA A17.3.3 / A17.3.4 (CA17-24): ICRC errors are dropped silently.
            Ok((_, false)) => self.dev.counters.rx_drop_bad_icrc += 1,
            Ok((pkt, true)) => self.receive_parsed(now, pkt, len, false),
        })
    }

    fn receive(&mut self, now: Nanos, frame: &[u8], check_icrc: bool) {
        let Ok(pkt) = parse_frame(frame) else {
            self.dev.counters.rx_drop_malformed += 1;
            return;
        };
        self.receive_parsed(now, &pkt, frame.len(), check_icrc);
    }

    /// A parsed frame of `len` bytes: checked in the order rxe's `rxe_rcv` and `hdr_check`
    /// check (address, ICRC, headers, QP, state, source, keys), counted under the first check
    /// it fails, or in `rcvd_pkts` as it goes to its QP.
    fn receive_parsed(&mut self, now: Nanos, pkt: &Packet<'_>, len: usize, check_icrc: bool) {
        let c = &mut self.dev.counters;
        if pkt.eth.dst != self.dev.cfg.mac && !pkt.eth.dst.is_multicast() {
            c.rx_drop_wrong_dst_mac += 1;
            return;
        }
        if !self.dev.cfg.ips.contains(&pkt.ip.dst()) {
            c.rx_drop_wrong_dst_ip += 1;
            return;
        }
        if check_icrc && !pkt.icrc_ok() {
            // IBTA A17.3.3 / A17.3.4 (CA17-24): ICRC errors are dropped silently.
            c.rx_drop_bad_icrc += 1;
            return;
        }
        if !pkt.ip_checksum_ok() {
            c.rx_drop_bad_ip_checksum += 1;
            return;
        }
        // ECN CE (RFC 3168: both bits), counted as the notification point sees it.
        let ce = pkt.ip.ecn() == 3;
        if ce {
            c.np_ecn_marked_roce_packets += 1;
        }
        // IBTA 9.6.1.1 (unverified): transport version must be 0; the P_Key must match the QP's
        // partition (C9-43, as pib numbers it; A17.4.7).
        if pkt.bth.tver != 0 {
            c.rx_drop_bad_tver += 1;
            return;
        }
        if !pkt.bth.pkey.matches(PKey::DEFAULT) {
            c.rx_drop_bad_pkey += 1;
            return;
        }
        if pkt.bth.opcode.transport() == Transport::Cnp {
            self.receive_cnp(now, pkt);
            return;
        }
        let slot = self.slot_of(pkt.bth.dqpn);
        let c = &mut self.dev.counters;
        let Some((slot, qp)) = slot.and_then(|s| Some((s, self.qps[s].as_mut()?))) else {
            c.rx_drop_no_qp += 1;
            return;
        };
        if !transport_matches(qp.qp_type, pkt.bth.opcode.transport()) {
            c.rx_drop_wrong_transport += 1;
            return;
        }
        let info = pkt.bth.opcode.info();
        let is_response = info.is_response();
        // A requester takes responses in RTS (and SQD, still completing); a responder takes
        // requests from RTR on (IBTA 10.3.1, unverified); in ERR, nothing.
        let state_ok = if is_response {
            matches!(qp.state, QpState::Rts | QpState::Sqd)
        } else {
            matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        };
        if !state_ok {
            c.rx_drop_qp_state += 1;
            return;
        }
        // Connected QPs accept packets from their peer only (rxe's check_addr).
        if qp.qp_type != QpType::Ud && pkt.ip.src() != qp.peer_ip {
            c.rx_drop_wrong_src += 1;
            return;
        }
        if qp.qp_type == QpType::Ud {
            // IBTA 10.2.4 (unverified): the Q_Key must match; otherwise the datagram is dropped
            // silently (rxe's check_keys, before it counts the packet).
            match pkt.ext.deth {
                None => {
                    c.rx_drop_malformed += 1;
                    return;
                }
                Some(d) if d.qkey != qp.attr.qkey => {
                    c.rx_drop_bad_qkey += 1;
                    return;
                }
                Some(_) => {}
            }
        }
        count_rcvd(c, qp, len);
        if ce && self.dev.cfg.cc.np {
            cc::qp::note_ce(&self.dev, qp, now, pkt);
        }
        if is_response {
            completer::handle(&mut self.dev, qp, now, pkt);
        } else {
            responder::handle(&mut self.dev, qp, now, pkt);
        }
        self.refresh(slot);
        if !self.dev.failed_cqs.is_empty() {
            self.settle_cq_errors();
        }
    }
}

impl Rnic {
    /// A CNP (BTH opcode 0x81) for the QP it names, the one to throttle: taken by the QP's
    /// reaction point when it runs DCQCN (`rp_cnp_handled`; `rp_rate_reductions` when it cut
    /// the rate), ignored otherwise (`rp_cnp_ignored`: no such QP, a QP that sends nothing,
    /// a CNP from another address than a connected QP's peer, or no DCQCN on the QP).
    fn receive_cnp(&mut self, now: Nanos, pkt: &Packet<'_>) {
        let slot = self.slot_of(pkt.bth.dqpn);
        let qp = slot.and_then(|s| self.qps[s].as_mut());
        let c = &mut self.dev.counters;
        let Some(qp) = qp.filter(|q| {
            matches!(q.state, QpState::Rts | QpState::Sqd)
                && (q.qp_type == QpType::Ud || pkt.ip.src() == q.peer_ip)
        }) else {
            c.rp_cnp_ignored += 1;
            return;
        };
        match qp.cc.as_deref_mut().and_then(|cc| cc.on_cnp(now)) {
            Some(cut) => {
                c.rp_cnp_handled += 1;
                c.rp_rate_reductions += u64::from(cut);
                qp_event!(
                    qp,
                    DEBUG,
                    cut,
                    rate_kbps = qp.cc.as_ref().map_or(0, |c| c.rate_kbps()),
                    "CNP"
                );
            }
            None => c.rp_cnp_ignored += 1,
        }
        if let Some(s) = slot {
            self.refresh(s);
        }
    }
}

fn transport_matches(t: QpType, tr: Transport) -> bool {
    matches!(
        (t, tr),
        (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
    )
}

/// A packet taken in for a QP (past every drop check): the device's and the QP's receive
/// counters, as rxe's `rcvd_pkts` and the bytes of the frame.
#[inline]
pub(super) fn count_rcvd(c: &mut super::device::Counters, qp: &mut super::qp::Qp, len: usize) {
    c.rcvd_pkts += 1;
    c.rcvd_bytes += len as u64;
    qp.counters.rcvd_pkts += 1;
    qp.counters.rcvd_bytes += len as u64;
}
