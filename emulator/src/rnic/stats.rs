//! What `rocemu stats` shows of an RNIC: its counters by name, and each QP's state and counters.
//!
//! Names follow rdma_rxe's `hw_counters` and mlx5's where those have one (same meaning), and are
//! RoCEmu's own otherwise. [`Counters::named`] and [`QpCounters::named`] give them in a fixed
//! order: the order `rocemu stats` prints and the Prometheus exposition uses.
use super::device::{Counters, Rnic};
use super::verbs::{QpState, QpType, WcStatus};
use rocemu_wire::{Psn, Qpn};

impl Counters {
    /// Every device counter with its name, in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("sent_pkts", self.tx_packets),
            ("sent_bytes", self.tx_bytes),
            ("rcvd_pkts", self.rx_packets),
            ("rcvd_bytes", self.rx_bytes),
            ("retransmitted_pkts", self.retransmits),
            ("local_ack_timeout_err", self.local_ack_timeouts),
            ("nak_sent", self.naks_sent),
            ("nak_rcvd", self.naks_received),
            ("send_rnr_err", self.rnr_naks_sent),
            ("rcvd_rnr_err", self.rnr_naks_received),
            ("out_of_seq_request", self.seq_errors),
            ("duplicate_request", self.duplicate_requests),
            ("rx_drop_bad_icrc", self.rx_icrc_errors),
            ("rx_drop_malformed", self.rx_malformed),
            ("rx_drop_not_ours", self.rx_not_ours),
            ("rx_drop_no_qp", self.rx_no_qp),
            ("rx_dropped", self.rx_dropped),
            ("rp_cnp_handled", self.cnp_received),
            ("cq_overflow", self.cq_overflows),
            ("async_events_dropped", self.async_events_dropped),
            ("resp_coalesced", self.resp_coalesced),
            ("resp_dropped", self.resp_dropped),
        ]
    }
}

/// A QP's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    pub sent_pkts: u64,
    pub rcvd_pkts: u64,
    pub retransmitted_pkts: u64,
}

impl QpCounters {
    /// Every QP counter with its name, in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("retransmitted_pkts", self.retransmitted_pkts),
        ]
    }
}

/// One QP as `rocemu stats --qp` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub state: QpState,
    /// The connected peer's QPN (0 for UD).
    pub dest_qpn: Qpn,
    /// The next PSN the requester sends.
    pub sq_psn: Psn,
    /// The oldest PSN not yet acknowledged.
    pub acked_psn: Psn,
    /// The responder's expected PSN.
    pub epsn: Psn,
    /// Send work requests posted and not yet completed.
    pub send_outstanding: usize,
    /// Receive work requests posted on its own receive queue (0 with an SRQ).
    pub recv_posted: usize,
    pub retry_left: u8,
    pub rnr_retry_left: u8,
    /// The status of the last completion in error on this QP, if any.
    pub last_error: Option<WcStatus>,
    pub counters: QpCounters,
}

impl Rnic {
    /// Every live QP (QP1 included), by slot.
    pub fn qp_infos(&self) -> Vec<QpInfo> {
        self.qps
            .iter()
            .flatten()
            .map(|qp| QpInfo {
                qpn: qp.qpn,
                qp_type: qp.qp_type,
                state: qp.state,
                dest_qpn: qp.attr.dest_qp_num,
                sq_psn: qp.req_psn,
                acked_psn: qp.acked_psn,
                epsn: qp.epsn,
                send_outstanding: qp.sq.len(),
                recv_posted: qp.rq.len(),
                retry_left: qp.retry_left,
                rnr_retry_left: qp.rnr_left,
                last_error: None,
                counters: QpCounters::default(),
            })
            .collect()
    }
}
