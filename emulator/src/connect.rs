//! Bringing a QP up to RTS the way the tools do (`ibv_rc_pingpong`'s INIT → RTR → RTS with
//! its attribute masks), for every tool, test and scenario that connects QPs by hand.
//!
//! Invariants: [`bring_up`] only calls the RNIC's public `modify_qp` (the state machine checks
//! every step); the masks it passes are the ones the IBTA requires for the QP type, nothing more,
//! so a QP brought up here is in the state a real ibverbs program would leave it.
use crate::rnic::Rnic;
use std::net::IpAddr;

/// What `connect` sets on both QPs (ibv_rc_pingpong's choices by default).
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    pub mtu: crate::rnic::Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    /// Reads and atomics this end keeps in flight as requester (RTS; the initiator depth):
    /// at most the peer's `max_dest_rd_atomic`.
    pub max_rd_atomic: u8,
    /// Reads and atomics this end accepts as responder (RTR; its responder resources, which it
    /// also keeps for re-executing a duplicate READ): at least the peer's `max_rd_atomic`.
    pub max_dest_rd_atomic: u8,
    pub access: crate::rnic::Access,
    pub psn_a: rocemu_wire::Psn,
    pub psn_b: rocemu_wire::Psn,
    pub qkey: rocemu_wire::QKey,
    /// The path's flow label (0: derived from the QPNs); rdma_cm puts one in the REQ and both
    /// ends take their UDP source port from it.
    pub flow_label: u32,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        use crate::rnic::{Access, Mtu};
        ConnectOpts {
            mtu: Mtu::M1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            psn_a: rocemu_wire::Psn::new(0x123),
            psn_b: rocemu_wire::Psn::new(0xabc),
            qkey: rocemu_wire::QKey(0x1111_1111),
            flow_label: 0,
        }
    }
}

/// Moves one QP through INIT, RTR and RTS towards `remote` (at `remote_ip`), the way
/// `ibv_rc_pingpong` does it.
pub fn bring_up(
    rnic: &mut Rnic,
    qpn: rocemu_wire::Qpn,
    remote: rocemu_wire::Qpn,
    remote_ip: IpAddr,
    my_psn: rocemu_wire::Psn,
    their_psn: rocemu_wire::Psn,
    o: &ConnectOpts,
) -> Result<(), crate::rnic::VerbsError> {
    use crate::rnic::{AhAttr, Gid, QpAttr, QpAttrMask as M, QpState, QpType};
    let qp_type = rnic.qp_type(qpn)?;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: o.qkey,
        ..Default::default()
    };
    let m = match qp_type {
        QpType::Ud => M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        _ => M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    };
    rnic.modify_qp(qpn, &a, m)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = remote;
    a.rq_psn = their_psn;
    a.max_dest_rd_atomic = o.max_dest_rd_atomic;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(remote_ip),
        hop_limit: 64,
        flow_label: o.flow_label,
        ..Default::default()
    };
    let m = match qp_type {
        QpType::Ud => M::STATE,
        QpType::Uc => M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
        QpType::Rc => {
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        }
    };
    rnic.modify_qp(qpn, &a, m)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = my_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    let m = match qp_type {
        QpType::Rc => {
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
        }
        _ => M::STATE | M::SQ_PSN,
    };
    rnic.modify_qp(qpn, &a, m)
}
