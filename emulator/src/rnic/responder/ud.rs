//! The UD responder (IBTA 9.8.3 and 10.2.4, unverified; A17.4.5.2 for the GRH area): one packet,
//! one message, with its 40-byte GRH area in front of the payload.
//!
//! Invariant: a datagram with the wrong Q_Key or in a QP not yet in RTR (both checked on
//! receipt), or with no receive posted (`out_of_buffer`), is dropped silently and counted; one
//! that does not fit its receive completes it with LOC_LEN_ERR.
use super::recv_wc;
use crate::rnic::qp::Qp;
use crate::rnic::verbs::*;
use crate::rnic::{Dev, Packet};

/// One datagram; its QP's state, its DETH and its Q_Key were checked on receipt.
pub(super) fn ud_receive(dev: &mut Dev, qp: &mut Qp, pkt: &Packet<'_>) {
    let Some(deth) = pkt.ext.deth else { return };
    let Some(wqe) = dev.next_recv(qp) else {
        dev.counters.out_of_buffer += 1;
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
        qp.note_wc(&wc);
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
    dev.push_recv_wc(qp.recv_cq, wc, pkt.bth.solicited);
}
