//! `ibv_modify_qp`: the QP state machine's transitions as the verb applies them — the checks
//! (the transition table in [`super::state`], then each attribute's value), the attributes, and
//! each transition's side effects.
//!
//! Invariants: a rejected call changes nothing; RESET gives a QP as created; entering ERR
//! completes every outstanding work request with WR_FLUSH_ERR ([`flush`]); a connected QP past
//! INIT has its header template built from the attributes as they stand.
use super::device::Dev;
use super::qp::{self, Qp};
use super::verbs::*;
use super::{requester, responder, state, Rnic};
use crate::logs::qp_event;
use rocemu_wire::{NakCode, Psn, Qpn};
use std::fmt;

impl Rnic {
    /// `ibv_modify_qp`: checks the transition and the mask (see [`state`]), applies the
    /// attributes, and runs the transition's side effects (ERR flushes, RESET clears).
    pub fn modify_qp(
        &mut self,
        qpn: Qpn,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let slot = self.slot(qpn)?;
        let Some(qp) = self.qps[slot].as_mut() else {
            return Err(VerbsError::NotFound("queue pair"));
        };
        let cur = qp.state;
        let new = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != cur {
            return invalid(format!(
                "cur_qp_state {:?} but the QP is in {cur:?}",
                attr.cur_qp_state
            ));
        }
        state::check_transition(qp.qp_type, cur, new, mask.union(QpAttrMask::STATE))?;
        check_values(&self.dev, &self.attr, attr, mask)?;
        let dmac = peer_mac(&mut self.dev, qp, attr, mask)?;
        // Every check passed: from here on the call succeeds.
        apply_attrs(qp, attr, mask, dmac);
        enter_state(&mut self.dev, qp, new);
        if new != cur && new != QpState::Err {
            qp_event!(qp, DEBUG, from = ?cur, to = ?new, "QP state changed");
        }
        // A connected QP's packets all go to its peer: their headers are built once, from the
        // attributes as they now stand (RESET cleared them; INIT has no peer yet).
        qp.tmpl = match (qp.qp_type, qp.state) {
            (QpType::Ud, _) | (_, QpState::Reset | QpState::Init) => None,
            _ => Some(self.dev.template_for(qp)),
        };
        qp.peer_ip = qp.attr.ah_attr.dgid.ip();
        // A connected QP's reaction point and pacer, from RTR on (RESET drops them).
        if qp.cc.is_none()
            && matches!(qp.qp_type, QpType::Rc | QpType::Uc)
            && matches!(qp.state, QpState::Rtr | QpState::Rts)
        {
            qp.cc = super::cc::QpCc::new(&self.dev.cfg.cc).map(Box::new);
        }
        self.refresh(slot);
        self.settle_cq_errors();
        Ok(())
    }
}

/// The attributes' values against the spec's ranges and the device's limits.
fn check_values(
    dev: &Dev,
    dev_attr: &DeviceAttr,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<(), VerbsError> {
    if mask.contains(QpAttrMask::PKEY_INDEX) && attr.pkey_index as usize >= PKEY_TABLE.len() {
        return invalid(format!(
            "pkey_index {} beyond the P_Key table",
            attr.pkey_index
        ));
    }
    if mask.contains(QpAttrMask::PORT) && attr.port_num != 1 {
        return invalid(format!(
            "port {} does not exist (one port: 1)",
            attr.port_num
        ));
    }
    if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > dev.active_mtu {
        return invalid(format!(
            "path MTU {} above the port's active MTU {}",
            attr.path_mtu.bytes(),
            dev.active_mtu.bytes()
        ));
    }
    if mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7 {
        return invalid("retry_cnt above 7");
    }
    if mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7 {
        return invalid("rnr_retry above 7");
    }
    if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return invalid("min_rnr_timer above 31");
    }
    if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
        return invalid("timeout above 31");
    }
    if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC)
        && attr.max_rd_atomic as u32 > dev_attr.max_qp_init_rd_atom
    {
        return invalid("max_rd_atomic above the device's max_qp_init_rd_atom");
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC)
        && attr.max_dest_rd_atomic as u32 > dev_attr.max_qp_rd_atom
    {
        return invalid("max_dest_rd_atomic above the device's max_qp_rd_atom");
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) && attr.qp_access_flags.0 & !Access::ALL.0 != 0 {
        return invalid("unknown access flags");
    }
    Ok(())
}

/// The MAC the QP's packets go to: the new address vector's (resolved now, so that a peer
/// without one fails the call), or the one the QP has.
fn peer_mac(dev: &mut Dev, qp: &Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<Mac, VerbsError> {
    let mut dmac = qp.dmac;
    if mask.contains(QpAttrMask::AV) {
        let sgid = attr.ah_attr.sgid_index as usize;
        let Some(src) = dev.cfg.ips.get(sgid) else {
            return invalid(format!("sgid_index {sgid} beyond the GID table"));
        };
        if src.is_ipv4() != attr.ah_attr.dgid.is_v4() {
            dev.counters.gid_type_mismatch += 1;
            let v = |ip: &std::net::IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            let dst = attr.ah_attr.dgid.ip();
            return invalid(format!(
                "source GID index {sgid} is {src} ({}) and the destination GID is {dst} ({}): \
                 GIDs of different IP versions (gid_type_mismatch). {}",
                v(src),
                v(&dst),
                crate::GID_INDEX_HINT
            ));
        }
        dmac = match dev.resolve(&attr.ah_attr) {
            Some(m) => m,
            None => {
                return invalid(format!(
                    "no MAC address for {}: give ah_attr.dmac or add a neighbour",
                    attr.ah_attr.dgid.ip()
                ))
            }
        };
    }
    Ok(dmac)
}

/// Writes the attributes the mask names into the QP, with the transport state each one seeds
/// (PSNs, retry counters).
fn apply_attrs(qp: &mut Qp, attr: &QpAttr, mask: QpAttrMask, dmac: Mac) {
    let a = &mut qp.attr;
    let has = |m| mask.contains(m);
    if has(QpAttrMask::PKEY_INDEX) {
        a.pkey_index = attr.pkey_index;
    }
    if has(QpAttrMask::PORT) {
        a.port_num = attr.port_num;
    }
    if has(QpAttrMask::QKEY) {
        a.qkey = attr.qkey;
    }
    if has(QpAttrMask::ACCESS_FLAGS) {
        a.qp_access_flags = attr.qp_access_flags;
    }
    if has(QpAttrMask::AV) {
        a.ah_attr = attr.ah_attr;
        qp.dmac = dmac;
    }
    if has(QpAttrMask::PATH_MTU) {
        a.path_mtu = attr.path_mtu;
    }
    if has(QpAttrMask::DEST_QPN) {
        a.dest_qp_num = attr.dest_qp_num;
    }
    if has(QpAttrMask::RQ_PSN) {
        a.rq_psn = attr.rq_psn;
        qp.epsn = attr.rq_psn;
    }
    if has(QpAttrMask::SQ_PSN) {
        a.sq_psn = attr.sq_psn;
        qp.req_psn = attr.sq_psn;
        qp.acked_psn = attr.sq_psn;
        qp.psn_high_ = attr.sq_psn;
    }
    if has(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if has(QpAttrMask::MAX_QP_RD_ATOMIC) {
        a.max_rd_atomic = attr.max_rd_atomic;
    }
    if has(QpAttrMask::MIN_RNR_TIMER) {
        a.min_rnr_timer = attr.min_rnr_timer;
    }
    if has(QpAttrMask::TIMEOUT) {
        a.timeout = attr.timeout;
    }
    if has(QpAttrMask::RETRY_CNT) {
        a.retry_cnt = attr.retry_cnt;
        qp.retry_left = attr.retry_cnt;
    }
    if has(QpAttrMask::RNR_RETRY) {
        a.rnr_retry = attr.rnr_retry;
        qp.rnr_left = attr.rnr_retry;
    }
}

/// The new state and its side effects: RESET gives the QP as created, ERR flushes it.
fn enter_state(dev: &mut Dev, qp: &mut Qp, new: QpState) {
    match new {
        QpState::Reset => {
            let mut fresh = Qp::new(
                qp.qpn,
                qp.pd,
                &QpInitAttr {
                    qp_type: qp.qp_type,
                    send_cq: qp.send_cq,
                    recv_cq: qp.recv_cq,
                    srq: qp.srq,
                    cap: qp.cap,
                    sq_sig_all: qp.sq_sig_all,
                },
            );
            let counters = qp.counters;
            fresh.span = std::mem::replace(&mut qp.span, tracing::Span::none());
            *qp = fresh;
            qp.counters = counters;
        }
        QpState::Err => flush(dev, qp, ErrCause::ModifyQp),
        s => qp.state = s,
    }
}

/// Why a QP entered ERR: logged as it does (`crate::logs`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ErrCause {
    /// `ibv_modify_qp` to ERR.
    ModifyQp,
    /// A send work request failed (its completion carries the status).
    WqeFailed(WcStatus),
    /// The responder met a class C / D error (IBTA 9.9.3.1, unverified) and NAKed the request at
    /// `psn`.
    FatalNak(NakCode, Psn),
    /// A CQ of the QP went to error (IBV_EVENT_QP_FATAL).
    CqError(CqId),
}

impl fmt::Display for ErrCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrCause::ModifyQp => f.write_str("modify_qp"),
            ErrCause::WqeFailed(s) => write!(f, "a send work request failed: {s:?}"),
            ErrCause::FatalNak(c, p) => write!(f, "responder error: NAK {c:?} for PSN {p}"),
            ErrCause::CqError(cq) => write!(f, "CQ {} went to error", cq.0),
        }
    }
}

/// Entering ERR: every outstanding send and receive WQE completes with WR_FLUSH_ERR (IBTA 10.3.1.5,
/// 11.4.2.2, unverified), signaled or not. The WQEs of a QP's SRQ are the SRQ's, not flushed: only
/// the one the QP was filling; a QP with an SRQ raises `QpLastWqeReached` as it enters ERR.
pub(crate) fn flush(dev: &mut Dev, qp: &mut Qp, why: ErrCause) {
    let entering = qp.state != QpState::Err;
    if entering {
        log_to_err(qp, why);
    }
    qp.state = QpState::Err;
    while let Some(w) = qp.sq.pop_front() {
        requester::count_flushed_send(dev, &w);
        let status = w.error.unwrap_or(WcStatus::WrFlushErr);
        let wc = requester::wc_for(qp, &w, status);
        qp.note_wc(&wc);
        dev.push_wc(qp.send_cq, wc);
    }
    if let qp::RespMsg::Send { wqe, .. } = std::mem::replace(&mut qp.resp_msg, qp::RespMsg::Idle) {
        let wc = responder::recv_wc(qp, &wqe, WcStatus::WrFlushErr, 0);
        qp.note_wc(&wc);
        dev.push_wc(qp.recv_cq, wc);
    }
    while let Some(r) = qp.rq.pop_front() {
        let wc = responder::recv_wc(qp, &r, WcStatus::WrFlushErr, 0);
        qp.note_wc(&wc);
        dev.push_wc(qp.recv_cq, wc);
    }
    qp.sq_next = 0;
    qp.rd_outstanding = 0;
    qp.ack_deadline = None;
    qp.rnr_deadline = None;
    qp.resources.clear();
    if entering && qp.srq.is_some() {
        dev.raise(AsyncEvent::QpLastWqeReached(qp.qpn));
    }
}

/// The QP's move to ERR, with why and what it flushes: `debug` when the application asked for
/// it, `warn` otherwise.
fn log_to_err(qp: &Qp, why: ErrCause) {
    macro_rules! ev {
        ($lvl:ident) => {
            qp_event!(
                qp,
                $lvl,
                from = ?qp.state,
                reason = %why,
                send_wqes = qp.sq.len(),
                recv_wqes = qp.rq.len(),
                "QP to ERR"
            )
        };
    }
    match why {
        ErrCause::ModifyQp => ev!(DEBUG),
        _ => ev!(WARN),
    }
}
