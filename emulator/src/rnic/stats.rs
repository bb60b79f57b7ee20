//! What `rocemu stats` shows of an RNIC: its counters by name, and each QP's state and counters.
//!
//! Names follow rdma_rxe's `hw_counters` and mlx5's where those have one (same meaning), and are
//! RoCEmu's own otherwise. [`Counters::named`] and [`QpCounters::named`] give them in a fixed
//! order: the order `rocemu stats` prints and the Prometheus exposition uses.
use super::device::{Counters, Rnic};
use super::verbs::{QpState, QpType, WcStatus};
use rocemu_wire::{Psn, Qpn};

/// Counters that describe traffic rather than trouble: [`Counters::errors`] leaves them out.
const INFORMATIVE: &[&str] = &[
    "sent_pkts",
    "sent_bytes",
    "rcvd_pkts",
    "rcvd_bytes",
    "rdma_sends",
    "rdma_recvs",
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "resp_coalesced",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rp_cnp_handled",
    "rp_rate_reductions",
    "rx_drop_total",
];

/// Second names of one field in [`Counters::named`]: [`Counters::errors`] prints each value
/// once, under its first name.
const ALIASES: &[&str] = &["rnr_nak_sent", "rx_icrc_encapsulated"];

impl Counters {
    /// Every device counter with its name, in a fixed order: traffic, the requester's, the
    /// responder's, congestion, the receive drops by reason (after their total), the device's.
    /// Two fields carry two names each (rxe's or mlx5's and RoCEmu's, the same value):
    /// `send_rnr_err` = `rnr_nak_sent`, `rx_drop_bad_icrc` = `rx_icrc_encapsulated`.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            // traffic
            ("sent_pkts", self.sent_pkts),
            ("sent_bytes", self.sent_bytes),
            ("rcvd_pkts", self.rcvd_pkts),
            ("rcvd_bytes", self.rcvd_bytes),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("rx_write_requests", self.rx_write_requests),
            ("rx_read_requests", self.rx_read_requests),
            ("rx_atomic_requests", self.rx_atomic_requests),
            // requester
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("completer_retry_err", self.completer_retry_err),
            ("local_ack_timeout_err", self.local_ack_timeout_err),
            ("packet_seq_err", self.packet_seq_err),
            ("implied_nak_seq_err", self.implied_nak_seq_err),
            ("rnr_nak_retry_err", self.rnr_nak_retry_err),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("nak_rcvd_seq_err", self.nak_rcvd_seq_err),
            ("nak_rcvd_inv_req", self.nak_rcvd_inv_req),
            ("nak_rcvd_rem_access", self.nak_rcvd_rem_access),
            ("nak_rcvd_rem_op", self.nak_rcvd_rem_op),
            (
                "req_remote_invalid_request",
                self.req_remote_invalid_request,
            ),
            ("req_remote_access_errors", self.req_remote_access_errors),
            ("req_cqe_error", self.req_cqe_error),
            ("req_cqe_flush_error", self.req_cqe_flush_error),
            // responder
            ("duplicate_request", self.duplicate_request),
            ("out_of_sequence", self.out_of_sequence),
            ("out_of_seq_request", self.out_of_seq_request),
            ("out_of_buffer", self.out_of_buffer),
            ("send_rnr_err", self.send_rnr_err),
            ("rnr_nak_sent", self.send_rnr_err),
            ("nak_sent_seq_err", self.nak_sent_seq_err),
            ("nak_sent_inv_req", self.nak_sent_inv_req),
            ("nak_sent_rem_access", self.nak_sent_rem_access),
            ("nak_sent_rem_op", self.nak_sent_rem_op),
            ("resp_remote_access_errors", self.resp_remote_access_errors),
            ("resp_local_length_error", self.resp_local_length_error),
            ("resp_cqe_error", self.resp_cqe_error),
            ("resp_cqe_flush_error", self.resp_cqe_flush_error),
            ("resp_coalesced", self.resp_coalesced),
            ("resp_dropped", self.resp_dropped),
            // congestion
            (
                "np_ecn_marked_roce_packets",
                self.np_ecn_marked_roce_packets,
            ),
            ("np_cnp_sent", self.np_cnp_sent),
            ("rp_cnp_handled", self.rp_cnp_handled),
            ("rp_cnp_ignored", self.rp_cnp_ignored),
            ("rp_rate_reductions", self.rp_rate_reductions),
            // receive drops
            ("rx_drop_total", self.rx_drop_total()),
            ("rx_drop_malformed", self.rx_drop_malformed),
            ("rx_drop_wrong_dst_mac", self.rx_drop_wrong_dst_mac),
            ("rx_drop_wrong_dst_ip", self.rx_drop_wrong_dst_ip),
            ("rx_drop_bad_icrc", self.rx_drop_bad_icrc),
            ("rx_icrc_encapsulated", self.rx_drop_bad_icrc),
            ("rx_drop_bad_ip_checksum", self.rx_drop_bad_ip_checksum),
            ("rx_drop_bad_tver", self.rx_drop_bad_tver),
            ("rx_drop_bad_pkey", self.rx_drop_bad_pkey),
            ("rx_drop_no_qp", self.rx_drop_no_qp),
            ("rx_drop_wrong_transport", self.rx_drop_wrong_transport),
            ("rx_drop_qp_state", self.rx_drop_qp_state),
            ("rx_drop_wrong_src", self.rx_drop_wrong_src),
            ("rx_drop_bad_qkey", self.rx_drop_bad_qkey),
            ("rx_drop_opcode_seq", self.rx_drop_opcode_seq),
            ("rx_drop_bad_length", self.rx_drop_bad_length),
            ("rx_drop_rest_of_msg", self.rx_drop_rest_of_msg),
            ("rx_drop_bad_aeth", self.rx_drop_bad_aeth),
            ("rx_drop_unexpected_resp", self.rx_drop_unexpected_resp),
            ("rx_drop_duplicate_resp", self.rx_drop_duplicate_resp),
            // device
            ("cq_overflow", self.cq_overflow),
            ("async_events_dropped", self.async_events_dropped),
            ("gid_type_mismatch", self.gid_type_mismatch),
            ("send_err", self.send_err),
            ("link_downed", self.link_downed),
        ]
    }

    /// Every packet dropped silently on receipt, whatever the reason: the sum of the
    /// `rx_drop_*` counters (drops for lack of a receive WQE are `out_of_buffer`, and
    /// responses a full queue lost are `resp_dropped`, not in it).
    pub fn rx_drop_total(&self) -> u64 {
        self.rx_drop_malformed
            + self.rx_drop_wrong_dst_mac
            + self.rx_drop_wrong_dst_ip
            + self.rx_drop_bad_icrc
            + self.rx_drop_bad_ip_checksum
            + self.rx_drop_bad_tver
            + self.rx_drop_bad_pkey
            + self.rx_drop_no_qp
            + self.rx_drop_wrong_transport
            + self.rx_drop_qp_state
            + self.rx_drop_wrong_src
            + self.rx_drop_bad_qkey
            + self.rx_drop_opcode_seq
            + self.rx_drop_bad_length
            + self.rx_drop_rest_of_msg
            + self.rx_drop_bad_aeth
            + self.rx_drop_unexpected_resp
            + self.rx_drop_duplicate_resp
    }

    /// NAKs received, every code but RNR (the sum of the `nak_rcvd_*` counters).
    pub fn nak_rcvd(&self) -> u64 {
        self.nak_rcvd_seq_err
            + self.nak_rcvd_inv_req
            + self.nak_rcvd_rem_access
            + self.nak_rcvd_rem_op
    }

    /// NAKs sent, every code but RNR (the sum of the `nak_sent_*` counters).
    pub fn nak_sent(&self) -> u64 {
        self.nak_sent_seq_err
            + self.nak_sent_inv_req
            + self.nak_sent_rem_access
            + self.nak_sent_rem_op
    }

    /// The counters that point at a problem (every one but the traffic counters) and are not
    /// zero, each once, in [`Counters::named`] order: what a failing tool prints so that its
    /// user learns why (`rx_drop_wrong_src 12`: the peer's address vector names another GID).
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        self.named()
            .into_iter()
            .filter(|(n, v)| *v != 0 && !INFORMATIVE.contains(n) && !ALIASES.contains(n))
            .collect()
    }

    /// [`Counters::errors`] as text, one `name value` line each, every line starting with
    /// `indent`; empty when there is none.
    pub fn error_lines(&self, indent: &str) -> String {
        self.errors()
            .iter()
            .map(|(n, v)| format!("{indent}{n} {v}\n"))
            .collect()
    }
}

/// A QP's own counters: the device counters of the same names, for this QP's packets only
/// (`nak_sent`, `nak_rcvd` count every NAK code together; the device splits them by code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets this QP sent (requests, retransmissions, responses).
    pub sent_pkts: u64,
    pub sent_bytes: u64,
    /// Packets that reached this QP past every receive check.
    pub rcvd_pkts: u64,
    pub rcvd_bytes: u64,
    /// Request packets sent again.
    pub retransmitted_pkts: u64,
    /// Local ACK timeouts that started a retry.
    pub local_ack_timeout_err: u64,
    /// Implied NAKs that started a retry.
    pub implied_nak_seq_err: u64,
    /// NAKs sent (every code but RNR).
    pub nak_sent: u64,
    /// NAKs received (every code but RNR).
    pub nak_rcvd: u64,
    pub rnr_nak_sent: u64,
    pub rnr_nak_rcvd: u64,
    /// RC requests received with a PSN before the expected one.
    pub duplicate_request: u64,
    /// Requests received with a PSN after the expected one.
    pub out_of_sequence: u64,
}

impl QpCounters {
    /// Every QP counter with its name, in a fixed order.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("sent_pkts", self.sent_pkts),
            ("sent_bytes", self.sent_bytes),
            ("rcvd_pkts", self.rcvd_pkts),
            ("rcvd_bytes", self.rcvd_bytes),
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("local_ack_timeout_err", self.local_ack_timeout_err),
            ("implied_nak_seq_err", self.implied_nak_seq_err),
            ("nak_sent", self.nak_sent),
            ("nak_rcvd", self.nak_rcvd),
            ("rnr_nak_sent", self.rnr_nak_sent),
            ("rnr_nak_rcvd", self.rnr_nak_rcvd),
            ("duplicate_request", self.duplicate_request),
            ("out_of_sequence", self.out_of_sequence),
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
    /// The status of the last completion in error on this QP, if any (a flush does not
    /// replace the error that moved the QP to ERR; back to `None` in RESET).
    pub last_error: Option<WcStatus>,
    /// Its reaction point's current rate, kb/s (none without one: `--cc none`, UD).
    pub rate_kbps: Option<u64>,
    /// DCQCN's alpha, of 1024 (none without DCQCN).
    pub alpha: Option<u32>,
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
                last_error: qp.last_error,
                rate_kbps: qp.cc.as_ref().map(|c| c.rate_kbps()),
                alpha: qp.cc.as_ref().and_then(|c| c.alpha()),
                counters: qp.counters,
            })
            .collect()
    }
}
