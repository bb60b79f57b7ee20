//! The requester (IBTA 9.5–9.7.4, unverified): WQE fetch, segmentation by path MTU, header build,
//! PSN assignment, AckReq, the max_rd_atomic limit and fences. One packet per call, so the device
//! can interleave QPs.
use super::qp::{Qp, SendWqe};
use super::verbs::*;
use super::{flush, Dev, ErrCause};
use crate::logs::qp_event;
use crate::time::Nanos;
use rocemu_wire::frame::pad_for;
use rocemu_wire::headers::{AtomicEthRepr, DethRepr, RethRepr};
use rocemu_wire::opcode::OpcodeInfo;
use rocemu_wire::{BthRepr, ExtHeaders, Opcode, PKey, QKey, RKey};

/// Requests an ACK at least this often within a long message (rxe: RXE_MAX_PKT_PER_ACK).
const MAX_PKTS_PER_ACK: u32 = 64;
/// PSNs in flight at most (IBTA 9.7.4.1.2, unverified, bounds it by 2^23; this keeps go-back-N
/// cheap).
pub(crate) const MAX_INFLIGHT_PSNS: u32 = 8192;

/// The completion of a send WQE.
pub(crate) fn wc_for(qp: &Qp, w: &SendWqe, status: WcStatus) -> Wc {
    Wc {
        wr_id: w.wr.wr_id,
        status,
        opcode: w.wr.opcode.wc_opcode(),
        byte_len: if status == WcStatus::Success && w.wr.opcode.is_read_or_atomic() {
            w.len as u32
        } else {
            0
        },
        imm_data: 0,
        qp_num: qp.qpn,
        src_qp: qp.qpn,
        wc_flags: WcFlags::default(),
        pkey_index: 0,
    }
}

/// Completes the front WQE successfully: a CQE when signaled.
pub(crate) fn complete_front(dev: &mut Dev, qp: &mut Qp) {
    let Some(w) = qp.sq.front() else {
        return;
    };
    let rd_counted = w.rd_counted;
    if w.wr.opcode.is_send() {
        dev.counters.rdma_sends += 1;
    }
    // The CQE straight from the WQE, before the WQE goes (built apart, it was moved twice).
    if w.signaled {
        dev.push_wc(qp.send_cq, wc_for(qp, w, WcStatus::Success));
    }
    // Dropped where it lies: popping would copy the whole WQE out first.
    qp.sq.drop_front();
    if rd_counted {
        qp.rd_outstanding = qp.rd_outstanding.saturating_sub(1);
    }
    qp.sq_next = qp.sq_next.saturating_sub(1);
}

/// rxe's `rdma_sends` counts every SEND work request its completer finishes, flushed ones
/// included: `do_complete()` in `rxe_comp.c` increments `RXE_CNT_RDMA_SEND` for a SEND,
/// whatever the status, and the completer's drain of a QP in ERR (`rxe_drain_resp_pkts()` with
/// `notify`) completes each WQE left with `IB_WC_WR_FLUSH_ERR` through `do_complete()`. A WQE
/// that failed on its own (`error` set) was counted when it failed ([`fail`]).
pub(crate) fn count_flushed_send(dev: &mut Dev, w: &SendWqe) {
    if w.error.is_none() && w.wr.opcode.is_send() {
        dev.counters.rdma_sends += 1;
    }
}

/// Fails WQE `i` with `status` on an answer from the responder (a NAK, a bad or undeliverable
/// response, retries exhausted): the answer acknowledges every WQE before `i`, which complete;
/// it and everything after it complete in error and the QP enters ERR (RC), or SQE (UC, UD:
/// IBTA 10.3.1.6, unverified).
pub(crate) fn fail_wqe(dev: &mut Dev, qp: &mut Qp, i: usize, status: WcStatus) {
    fail(dev, qp, i, status, true);
}

/// Fails WQE `i` with `status` for a reason found at this end (its region went away, no route):
/// on RC nothing acknowledged the WQEs before it, so they are flushed with WR_FLUSH_ERR as the
/// QP enters ERR (as rxe's completer flushes its send queue), never completed as a success.
pub(crate) fn fail_wqe_local(dev: &mut Dev, qp: &mut Qp, i: usize, status: WcStatus) {
    fail(dev, qp, i, status, qp.qp_type != QpType::Rc);
}

fn fail(dev: &mut Dev, qp: &mut Qp, i: usize, status: WcStatus, earlier_done: bool) {
    qp_event!(
        qp,
        WARN,
        wr_id = qp.sq.get(i).map(|w| w.wr.wr_id),
        first_psn = qp.sq.get(i).map(|w| w.first_psn.value()),
        ?status,
        retry_cnt = qp.attr.retry_cnt,
        rnr_retry = qp.attr.rnr_retry,
        "send work request failed"
    );
    if let Some(w) = qp.sq.get_mut(i) {
        w.error = Some(status);
        if w.wr.opcode.is_send() {
            dev.counters.rdma_sends += 1;
        }
    }
    let c = &mut dev.counters;
    match status {
        WcStatus::RetryExcErr => c.retry_exceeded_err += 1,
        WcStatus::RnrRetryExcErr => c.retry_rnr_exceeded_err += 1,
        WcStatus::RemInvReqErr => c.req_remote_invalid_request += 1,
        WcStatus::RemAccessErr => c.req_remote_access_errors += 1,
        _ => {}
    }
    for _ in 0..if earlier_done { i } else { 0 } {
        // A read or atomic without its response is not done: it is flushed, not a success.
        match qp.sq.front() {
            Some(w) if w.wr.opcode.is_read_or_atomic() && !w.done => break,
            _ => complete_front(dev, qp),
        }
    }
    if qp.qp_type == QpType::Rc {
        flush(dev, qp, ErrCause::WqeFailed(status));
    } else {
        // SQE: the failed WQE and every later one complete (flushed); receives go on.
        qp_event!(qp, WARN, from = ?qp.state, reason = ?status, "QP to SQE");
        qp.state = QpState::Sqe;
        while let Some(w) = qp.sq.pop_front() {
            count_flushed_send(dev, &w);
            let st = w.error.unwrap_or(WcStatus::WrFlushErr);
            let wc = wc_for(qp, &w, st);
            qp.note_wc(&wc);
            dev.push_wc(qp.send_cq, wc);
        }
        qp.sq_next = 0;
    }
}

/// The opcode of packet `k` of an `n`-packet message (IBTA 9.2.1, Table 35's numbering): one
/// table row per work request opcode, RC's codes; UC's SEND and WRITE codes are 0x20 more.
#[inline]
fn packet_opcode(op: &WrOpcode, uc: bool, k: u32, n: u32) -> Opcode {
    // [first, middle, last, only]
    const RC: [[u8; 4]; 8] = [
        [0x00, 0x01, 0x02, 0x04], // SEND
        [0x00, 0x01, 0x03, 0x05], // SEND with immediate
        [0x00, 0x01, 0x16, 0x17], // SEND with invalidate (RC only)
        [0x06, 0x07, 0x08, 0x0a], // RDMA WRITE
        [0x06, 0x07, 0x09, 0x0b], // RDMA WRITE with immediate
        [0x0c; 4],                // RDMA READ request
        [0x13; 4],                // CmpSwap
        [0x14; 4],                // FetchAdd
    ];
    let (row, uc_too) = match op {
        WrOpcode::Send => (0, true),
        WrOpcode::SendWithImm { .. } => (1, true),
        WrOpcode::SendWithInv { .. } => (2, false),
        WrOpcode::RdmaWrite { .. } => (3, true),
        WrOpcode::RdmaWriteWithImm { .. } => (4, true),
        WrOpcode::RdmaRead { .. } => (5, false),
        WrOpcode::AtomicCmpSwap { .. } => (6, false),
        WrOpcode::AtomicFetchAdd { .. } => (7, false),
    };
    let pos = if n == 1 {
        3
    } else if k == 0 {
        0
    } else if k + 1 == n {
        2
    } else {
        1
    };
    let code = RC[row][pos] + if uc && uc_too { 0x20 } else { 0 };
    match Opcode::new(code) {
        Ok(o) => o,
        Err(_) => unreachable!("the table has every requester opcode"),
    }
}

/// C10-93.1.1 (as Linux's rxe_req.c quotes it): "If the total sum of all the buffer lengths
/// specified for a UD message exceeds the MTU of the port as returned by QueryHCA, the CI shall
/// not emit any packets for this message. Further, the CI shall not generate an error due to
/// this condition." Such messages at the head of a UD send queue complete successfully, unsent
/// (as rxe's requester fakes a successful UD send). A UD WQE completes as it leaves, so the next
/// one to send is always the oldest.
fn skip_ud_over_mtu(dev: &mut Dev, qp: &mut Qp) {
    let limit = qp.mtu().max(dev.active_mtu.bytes() as u64);
    while qp.sq_next == 0
        && qp
            .sq
            .front()
            .is_some_and(|w| w.error.is_none() && !w.started && w.len > limit)
    {
        complete_front(dev, qp);
    }
}

/// Builds the next request packet of `qp` into `buf`.
#[inline]
pub(crate) fn produce(dev: &mut Dev, qp: &mut Qp, now: Nanos, buf: &mut [u8]) -> Option<usize> {
    if dev.cfg.fast_path {
        if let Some(r) = produce_fast(dev, qp, now, buf) {
            return r;
        }
    }
    if qp.qp_type == QpType::Ud {
        skip_ud_over_mtu(dev, qp);
    }
    let idx = qp.sq_next;
    let w = qp.sq.get(idx)?;
    let mut checked = None;
    if let Some(st) = w.error {
        fail_wqe_local(dev, qp, idx, st);
        return None;
    }
    if !w.started {
        if qp.state == QpState::Sqd {
            return None; // draining: finish what started, start nothing new
        }
        if qp.qp_type == QpType::Rc {
            if w.wr.flags.contains(SendFlags::FENCE) && qp.rd_outstanding > 0 {
                return None;
            }
            if w.wr.opcode.is_read_or_atomic()
                && qp.rd_outstanding >= qp.attr.max_rd_atomic.max(1) as u32
            {
                return None;
            }
        }
        let inline = w.wr.flags.contains(SendFlags::INLINE);
        if !inline {
            let write = matches!(w.wr.opcode, WrOpcode::RdmaRead { .. }) || w.wr.opcode.is_atomic();
            // One SGE (the usual case): its check is kept for the first packet's gather below,
            // which then need not look the region up and check it again.
            let r = match &*w.wr.sg_list {
                [s] if s.length > 0 => dev.mem.check_sge(qp.pd, s, write).map(|c| {
                    checked = Some(c);
                }),
                sges => dev.mem.check_sges(qp.pd, sges, write).map(|_| ()),
            };
            if let Err(f) = r {
                // A list too short cannot be: the length is the list's sum.
                fail_wqe_local(dev, qp, idx, f.status());
                return None;
            }
        }
        let npkts = match w.wr.opcode {
            WrOpcode::AtomicCmpSwap { .. } | WrOpcode::AtomicFetchAdd { .. } => 1,
            // A UD message is one packet (one longer than the port MTU completed unsent in
            // skip_ud_over_mtu; a UD QP has no path MTU of its own).
            _ if qp.qp_type == QpType::Ud => 1,
            _ => qp.pkts_for(w.len),
        };
        let psn = qp.req_psn;
        let w = &mut qp.sq[idx];
        w.first_psn = psn;
        w.npkts = npkts;
        w.started = true;
    }
    // The window (IBTA 9.7.4.1.2, unverified, caps it at 2^23; the congestion window is smaller):
    // at least one packet may always be outstanding.
    if qp.qp_type == QpType::Rc {
        let inflight = if qp.req_psn.is_before(qp.acked_psn) {
            0
        } else {
            qp.req_psn.distance_from(qp.acked_psn)
        };
        if inflight > 0 && inflight >= qp.cwnd.min(MAX_INFLIGHT_PSNS) {
            return None;
        }
    }
    emit_packet(dev, qp, idx, now, buf, checked)
}

/// The requester's fast path, for what a connected QP sends most: the packets of a SEND or an
/// RDMA WRITE (with immediate data or without) on an RC or UC QP that has its header template,
/// a message that starts from one SGE or inline data (once started, from any list). The
/// general path's decisions for such a packet, made without the general path's questions.
/// `None` when the WQE at the cursor is not such a request (the general path takes it, and a
/// local fault too: it checks again and fails the WQE); otherwise what the general path
/// returns, with the same frame, state and counters (`emulator/tests/fast_path.rs` runs one
/// workload both ways and compares every frame).
#[inline]
fn produce_fast(dev: &mut Dev, qp: &mut Qp, now: Nanos, buf: &mut [u8]) -> Option<Option<usize>> {
    let rc = match qp.qp_type {
        QpType::Rc => true,
        QpType::Uc => false,
        QpType::Ud => return None,
    };
    if qp.tmpl.is_none() || qp.state == QpState::Sqd {
        return None;
    }
    let idx = qp.sq_next;
    let mtu = qp.mtu();
    let psn = qp.req_psn;
    let w = qp.sq.get_mut(idx)?;
    if w.error.is_some() {
        return None;
    }
    // Whether the opcode may carry SE (on its last packet).
    let se_ok = match w.wr.opcode {
        WrOpcode::Send | WrOpcode::SendWithImm { .. } | WrOpcode::RdmaWriteWithImm { .. } => true,
        WrOpcode::RdmaWrite { .. } => false,
        _ => return None,
    };
    let inline = w.wr.flags.contains(SendFlags::INLINE);
    let mut checked = None;
    if !w.started {
        if w.wr.flags.contains(SendFlags::FENCE) {
            return None;
        }
        if !inline {
            match &*w.wr.sg_list {
                [s] if s.length > 0 => checked = Some(dev.mem.check_sge(qp.pd, s, false).ok()?),
                _ => return None,
            }
        }
        w.first_psn = psn;
        w.npkts = w.len.div_ceil(mtu).max(1) as u32;
        w.started = true;
    }
    if rc {
        let inflight = if psn.is_before(qp.acked_psn) {
            0
        } else {
            psn.distance_from(qp.acked_psn)
        };
        if inflight > 0 && inflight >= qp.cwnd.min(MAX_INFLIGHT_PSNS) {
            return Some(None);
        }
    }
    let w = &*w;
    let n = w.npkts;
    let k = psn.distance_from(w.first_psn).min(n.saturating_sub(1));
    let last = k + 1 == n;
    let offset = k as u64 * mtu;
    let payload_len = (w.len - offset.min(w.len)).min(mtu) as usize;
    let opcode = packet_opcode(&w.wr.opcode, !rc, k, n);
    let info = opcode.info();
    let mut bth = BthRepr::new(opcode, qp.attr.dest_qp_num, psn);
    bth.pad = pad_for(payload_len);
    bth.solicited = last && se_ok && w.wr.flags.contains(SendFlags::SOLICITED);
    let fills_window = psn.next().distance_from(qp.acked_psn) >= qp.cwnd.min(MAX_INFLIGHT_PSNS);
    bth.ack_req = rc && (last || fills_window || (k + 1).is_multiple_of(MAX_PKTS_PER_ACK));
    let reth = match w.wr.opcode {
        WrOpcode::RdmaWrite { remote_addr, rkey }
        | WrOpcode::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } if info.has(rocemu_wire::opcode::hdr::RETH) => Some(RethRepr {
            va: remote_addr,
            rkey: RKey(rkey),
            dma_len: w.len as u32,
        }),
        _ => None,
    };
    let imm = match w.wr.opcode {
        WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. }
            if info.has(rocemu_wire::opcode::hdr::IMM) =>
        {
            Some(imm)
        }
        _ => None,
    };
    let tmpl = qp.tmpl.as_ref()?;
    let ident = if tmpl.is_v6() { 0 } else { dev.next_ident() };
    let (mem, pd) = (&dev.mem, qp.pd);
    let mut gathered = Ok(());
    let written = tmpl.emit_only(buf, ident, &bth, reth.as_ref(), imm, payload_len, |d| {
        gathered = if inline {
            d.copy_from_slice(&w.wr.inline_data[offset as usize..offset as usize + payload_len]);
            Ok(())
        } else {
            match checked {
                // The single SGE checked a moment ago (the message's first packet).
                Some(c) => mem.read_checked(c, offset, d),
                None => mem.gather(pd, &w.wr.sg_list, offset, d),
            }
        };
    });
    let len = match (written, gathered) {
        (Ok(n), Ok(())) => n,
        (Ok(_), Err(f)) => {
            fail_wqe_local(dev, qp, idx, f.status());
            return Some(None);
        }
        (Err(_), _) => {
            fail_wqe_local(dev, qp, idx, WcStatus::LocLenErr);
            return Some(None);
        }
    };
    qp.last_ack_req = bth.ack_req;
    // `advance` for a SEND or WRITE packet (no read to count), without looking at the WQE.
    if psn.is_before(qp.psn_high()) {
        dev.counters.retransmitted_pkts += 1;
        qp.counters.retransmitted_pkts += 1;
    }
    qp.req_psn = psn.next();
    qp.note_sent(qp.req_psn);
    if last {
        qp.sq_next += 1;
        if !rc {
            complete_front(dev, qp);
        }
    }
    if rc && qp.ack_deadline.is_none() {
        qp.ack_deadline = qp.ack_timeout().map(|t| now + t);
    }
    Some(Some(len))
}

#[inline]
fn emit_packet(
    dev: &mut Dev,
    qp: &mut Qp,
    idx: usize,
    now: Nanos,
    buf: &mut [u8],
    checked: Option<(usize, usize)>,
) -> Option<usize> {
    let mtu = if qp.qp_type == QpType::Ud {
        qp.sq[idx].len.max(1)
    } else {
        qp.mtu()
    };
    let uc = qp.qp_type == QpType::Uc;
    let ud = qp.qp_type == QpType::Ud;
    let w = &qp.sq[idx];
    let psn = qp.req_psn;
    let k = psn
        .distance_from(w.first_psn)
        .min(w.npkts.saturating_sub(1));
    let n = w.npkts;
    let opcode = if ud {
        match w.wr.opcode {
            WrOpcode::SendWithImm { .. } => Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
            _ => Opcode::UD_SEND_ONLY,
        }
    } else {
        packet_opcode(&w.wr.opcode, uc, k, n)
    };
    let is_read = matches!(w.wr.opcode, WrOpcode::RdmaRead { .. });
    let offset = k as u64 * mtu;
    let (payload_len, last) = match w.wr.opcode {
        WrOpcode::RdmaRead { .. }
        | WrOpcode::AtomicCmpSwap { .. }
        | WrOpcode::AtomicFetchAdd { .. } => (0, true),
        _ => ((w.len - offset.min(w.len)).min(mtu), k + 1 == n),
    };
    let mut bth = BthRepr::new(opcode, qp.attr.dest_qp_num, psn);
    bth.pad = pad_for(payload_len as usize);
    bth.pkey = PKey::DEFAULT;
    // IBV_SEND_SOLICITED: the SE bit on the last packet of a message that makes a receive
    // completion, a SEND or a WRITE with immediate (as rxe's init_req_packet).
    bth.solicited = last
        && w.wr.flags.contains(SendFlags::SOLICITED)
        && matches!(
            w.wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::SendWithInv { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
        );
    // Ask for an ACK at the end of a message, every MAX_PKTS_PER_ACK packets, and when this
    // packet fills the window: otherwise nothing acknowledges it before the ACK timeout.
    let fills_window = psn.next().distance_from(qp.acked_psn) >= qp.cwnd.min(MAX_INFLIGHT_PSNS);
    bth.ack_req = qp.qp_type == QpType::Rc
        && (last || fills_window || (k + 1).is_multiple_of(MAX_PKTS_PER_ACK));
    let mut ext = request_headers(&w.wr, opcode.info(), w.len, offset);
    let ud_dest = if ud {
        match ud_headers(dev, qp, &w.wr, &mut bth, &mut ext) {
            Some(d) => Some(d),
            None => {
                fail_wqe_local(dev, qp, idx, WcStatus::LocQpOpErr);
                return None;
            }
        }
    } else {
        None
    };
    let w = &qp.sq[idx];
    let ud_dest = ud_dest.as_ref().map(|(ah, m)| (ah, *m));
    let pd = qp.pd;
    let mut gathered = Ok(());
    let written = dev.emit(
        qp,
        ud_dest,
        &bth,
        &ext,
        buf,
        payload_len as usize,
        |mem, d| {
            if w.wr.flags.contains(SendFlags::INLINE) {
                d.copy_from_slice(
                    &w.wr.inline_data[offset as usize..(offset + payload_len) as usize],
                );
            } else {
                gathered = match checked {
                    // The single SGE checked a moment ago (the WQE's first packet): no need
                    // to look its region up again.
                    Some(c) if offset + d.len() as u64 <= w.len => mem.read_checked(c, offset, d),
                    _ => mem.gather(pd, &w.wr.sg_list, offset, d),
                };
            }
        },
    );
    let len = match (written, gathered) {
        (Ok(n), Ok(())) => n,
        // A region of the gather list was deregistered after the WQE was checked (between
        // two packets of a message, or before a retransmission): the frame in `buf` lacks its
        // payload and is not sent; the WQE fails with LOC_PROT_ERR (rxe: a `fill_packet`
        // failure) and the QP goes to ERR.
        (Ok(_), Err(f)) => {
            fail_wqe_local(dev, qp, idx, f.status());
            return None;
        }
        (Err(_), _) => {
            // The caller's buffer cannot hold a path-MTU packet: an engine bug, not a wire
            // condition. Fail the WQE rather than send garbage.
            fail_wqe_local(dev, qp, idx, WcStatus::LocLenErr);
            return None;
        }
    };
    qp.last_ack_req = bth.ack_req;
    advance(dev, qp, idx, now, k, is_read, last);
    Some(len)
}

/// The extension headers of a request packet `offset` bytes into its message of `len` bytes:
/// the RETH, AtomicETH, immediate and IETH its opcode carries.
#[inline]
fn request_headers(wr: &SendWr, info: &OpcodeInfo, len: u64, offset: u64) -> ExtHeaders {
    let mut ext = ExtHeaders::default();
    match wr.opcode {
        WrOpcode::RdmaWrite { remote_addr, rkey }
        | WrOpcode::RdmaWriteWithImm {
            remote_addr, rkey, ..
        } if info.has(rocemu_wire::opcode::hdr::RETH) => {
            ext.reth = Some(RethRepr {
                va: remote_addr,
                rkey: RKey(rkey),
                dma_len: len as u32,
            });
        }
        WrOpcode::RdmaRead { remote_addr, rkey } => {
            // Resuming mid-read (go-back-N; IBTA 9.4.4: a retried READ need not start at the same
            // address): ask for the rest only.
            ext.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(offset),
                rkey: RKey(rkey),
                dma_len: (len - offset.min(len)) as u32,
            });
        }
        WrOpcode::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            ext.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey: RKey(rkey),
                swap_add: swap,
                compare,
            });
        }
        WrOpcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            ext.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey: RKey(rkey),
                swap_add: add,
                compare: 0,
            });
        }
        _ => {}
    }
    if info.has(rocemu_wire::opcode::hdr::IMM) {
        if let WrOpcode::SendWithImm { imm } | WrOpcode::RdmaWriteWithImm { imm, .. } = wr.opcode {
            ext.imm = Some(imm);
        }
    }
    if info.has(rocemu_wire::opcode::hdr::IETH) {
        if let WrOpcode::SendWithInv { invalidate_rkey } = wr.opcode {
            ext.ieth = Some(RKey(invalidate_rkey));
        }
    }
    ext
}

/// A UD request's DETH and destination QP, from its work request (IBTA 10.2.4.1, unverified), and
/// the address vector and MAC it goes to: `None` when no MAC is known for the destination.
#[inline]
fn ud_headers(
    dev: &Dev,
    qp: &Qp,
    wr: &SendWr,
    bth: &mut BthRepr,
    ext: &mut ExtHeaders,
) -> Option<(AhAttr, Mac)> {
    let d = wr.ud.unwrap_or(UdDest {
        ah: AhAttr::default(),
        remote_qpn: qp.qpn,
        remote_qkey: QKey(0),
    });
    // A Q_Key with the high bit set in the WR means "use the QP's" (IBTA 3.5.3 in 1.2.1, as
    // pib cites it; C10-15 per issue 20, unverified).
    let qkey = if d.remote_qkey.is_controlled() {
        qp.attr.qkey
    } else {
        d.remote_qkey
    };
    ext.deth = Some(DethRepr {
        qkey,
        src_qpn: qp.qpn,
        resv: 0,
    });
    bth.dqpn = d.remote_qpn;
    dev.resolve(&d.ah).map(|m| (d.ah, m))
}

/// After packet `k` of the WQE at `idx` left (the packet at `qp.req_psn`): the next PSN (a read
/// asks for all its rest at once), the retransmit count, and once the message is out (a read,
/// or the `last` packet) the send queue cursor, the reads and atomics outstanding, UC and UD
/// completions; and the retransmit timer.
#[inline]
fn advance(dev: &mut Dev, qp: &mut Qp, idx: usize, now: Nanos, k: u32, is_read: bool, last: bool) {
    let psn = qp.req_psn;
    let n = qp.sq[idx].npkts;
    if qp.req_psn.is_before(qp.psn_high()) {
        dev.counters.retransmitted_pkts += 1;
        qp.counters.retransmitted_pkts += 1;
    }
    if is_read {
        qp.sq[idx].read_base = k;
        qp.req_psn = qp.sq[idx].first_psn.add(n);
    } else {
        qp.req_psn = psn.next();
    }
    qp.note_sent(qp.req_psn);
    let done_msg = is_read || last;
    if done_msg {
        qp.sq_next += 1;
        match qp.qp_type {
            QpType::Rc => {
                let w = &mut qp.sq[idx];
                if w.wr.opcode.is_read_or_atomic() && !w.rd_counted {
                    w.rd_counted = true;
                    qp.rd_outstanding += 1;
                }
            }
            // UC and UD complete as soon as the last packet left (IBTA 9.8.2 and 9.8.3, unverified;
            // 9.8.4 is raw datagrams, A17.4.6).
            _ => complete_front(dev, qp),
        }
    }
    if qp.qp_type == QpType::Rc && qp.ack_deadline.is_none() {
        qp.ack_deadline = qp.ack_timeout().map(|t| now + t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table against the opcode names (IBTA 9.2, Table 35), for every position of a
    /// three-packet message and a one-packet one, RC and UC.
    #[test]
    fn packet_opcodes_by_position() {
        let w = WrOpcode::RdmaWrite {
            remote_addr: 0,
            rkey: 0,
        };
        let wi = WrOpcode::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        let s = WrOpcode::Send;
        let si = WrOpcode::SendWithImm { imm: 0 };
        let sv = WrOpcode::SendWithInv { invalidate_rkey: 0 };
        let pos = |op: &WrOpcode, uc: bool| {
            [(0, 3), (1, 3), (2, 3), (0, 1)].map(|(k, n)| packet_opcode(op, uc, k, n))
        };
        use Opcode as O;
        assert_eq!(
            pos(&w, false),
            [
                O::RC_RDMA_WRITE_FIRST,
                O::RC_RDMA_WRITE_MIDDLE,
                O::RC_RDMA_WRITE_LAST,
                O::RC_RDMA_WRITE_ONLY
            ]
        );
        assert_eq!(
            pos(&wi, true),
            [
                O::UC_RDMA_WRITE_FIRST,
                O::UC_RDMA_WRITE_MIDDLE,
                O::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                O::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            ]
        );
        assert_eq!(
            pos(&s, true),
            [
                O::UC_SEND_FIRST,
                O::UC_SEND_MIDDLE,
                O::UC_SEND_LAST,
                O::UC_SEND_ONLY
            ]
        );
        assert_eq!(
            pos(&si, false),
            [
                O::RC_SEND_FIRST,
                O::RC_SEND_MIDDLE,
                O::RC_SEND_LAST_WITH_IMMEDIATE,
                O::RC_SEND_ONLY_WITH_IMMEDIATE
            ]
        );
        assert_eq!(
            pos(&sv, false),
            [
                O::RC_SEND_FIRST,
                O::RC_SEND_MIDDLE,
                O::RC_SEND_LAST_WITH_INVALIDATE,
                O::RC_SEND_ONLY_WITH_INVALIDATE
            ]
        );
        let read = WrOpcode::RdmaRead {
            remote_addr: 0,
            rkey: 0,
        };
        assert_eq!(pos(&read, false), [O::RC_RDMA_READ_REQUEST; 4]);
        let fa = WrOpcode::AtomicFetchAdd {
            remote_addr: 0,
            rkey: 0,
            add: 1,
        };
        assert_eq!(pos(&fa, false)[3], O::RC_FETCH_ADD);
        let cs = WrOpcode::AtomicCmpSwap {
            remote_addr: 0,
            rkey: 0,
            compare: 0,
            swap: 1,
        };
        assert_eq!(pos(&cs, false)[3], O::RC_COMPARE_SWAP);
    }
}
