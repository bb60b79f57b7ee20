//! Receive dispatch: a frame from the port is counted, parsed, checked (address, ICRC, IP
//! checksum, transport version, P_Key), matched to its QP, and handed to the completer (a
//! response) or the responder (a request).
//!
//! Invariants: every frame is counted once in `rx_packets`, and one dropped is counted under the
//! reason it was dropped for; a connected QP takes packets from its peer only, in RTR or later; no
//! frame, whatever it holds, panics.
use super::verbs::*;
use super::{completer, responder, Rnic};
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
        if !self.dev.cfg.check_icrc {
            self.receive(now, frame, false);
            return;
        }
        let c = &mut self.dev.counters;
        c.rx_packets += 1;
        c.rx_bytes += frame.len() as u64;
        match rocemu_wire::parse_frame_in_place(frame) {
            Err(_) => c.rx_malformed += 1,
            // IBTA A17.3.3 / 9.6.1: ICRC errors are dropped silently.
            Ok((_, false)) => c.rx_icrc_errors += 1,
            Ok((pkt, true)) => self.receive_parsed(now, &pkt, false),
        }
    }

    fn receive(&mut self, now: Nanos, frame: &[u8], check_icrc: bool) {
        let c = &mut self.dev.counters;
        c.rx_packets += 1;
        c.rx_bytes += frame.len() as u64;
        let Ok(pkt) = parse_frame(frame) else {
            c.rx_malformed += 1;
            return;
        };
        self.receive_parsed(now, &pkt, check_icrc);
    }

    /// A parsed frame, counted already.
    fn receive_parsed(&mut self, now: Nanos, pkt: &Packet<'_>, check_icrc: bool) {
        let c = &mut self.dev.counters;
        if pkt.eth.dst != self.dev.cfg.mac && !pkt.eth.dst.is_multicast() {
            c.rx_not_ours += 1;
            return;
        }
        if !self.dev.cfg.ips.contains(&pkt.ip.dst()) {
            c.rx_not_ours += 1;
            return;
        }
        if check_icrc && !pkt.icrc_ok() {
            // IBTA A17.3.3 / 9.6.1: ICRC errors are dropped silently.
            c.rx_icrc_errors += 1;
            return;
        }
        if !pkt.ip_checksum_ok() {
            c.rx_malformed += 1;
            return;
        }
        // IBTA 9.6.1.1: transport version must be 0; the P_Key must match the QP's partition.
        if pkt.bth.tver != 0 || !pkt.bth.pkey.matches(PKey::DEFAULT) {
            c.rx_dropped += 1;
            return;
        }
        if pkt.bth.opcode.transport() == Transport::Cnp {
            c.cnp_received += 1;
            return;
        }
        let Some(slot) = self.slot_of(pkt.bth.dqpn) else {
            self.dev.counters.rx_no_qp += 1;
            return;
        };
        let Some(qp) = self.qps[slot].as_mut() else {
            return;
        };
        if !transport_matches(qp.qp_type, pkt.bth.opcode.transport()) {
            self.dev.counters.rx_dropped += 1;
            return;
        }
        // Connected QPs accept packets from their peer only (rxe's check_addr).
        if qp.qp_type != QpType::Ud
            && (!matches!(
                qp.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            ) || pkt.ip.src() != qp.peer_ip)
        {
            self.dev.counters.rx_dropped += 1;
            return;
        }
        let info = pkt.bth.opcode.info();
        if info.is_response() {
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

fn transport_matches(t: QpType, tr: Transport) -> bool {
    matches!(
        (t, tr),
        (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
    )
}
