//! More of the device as RC requester (issue 20): implied NAKs with a READ or atomic outstanding,
//! responses of the wrong opcode, NAKs amid READ responses, the retry counters at 7 and 0, the
//! local ACK timeout 0, fences, the initiator depth, unsignaled WRs in error, SQ drain, a READ
//! whose responses wrap the PSN, and ACK credits. The peer plays the responder.
//!
//! What Linux does, for the unverified rules: rxe's `do_complete()` posts a completion when
//! `wqe->status != IB_WC_SUCCESS` whatever IB_SEND_SIGNALED says; qib and hfi1 spend the RNR
//! retry count only `if (qp->s_rnr_retry_cnt < 7)`; rxe's completer (`rxe_comp.c`) takes a
//! response past an outstanding READ or atomic as an implied NAK (`check_psn()`:
//! COMPST_ERROR_RETRY) and waits in `req_next_wqe()` (`rxe_req.c`) for IB_SEND_FENCE.
use crate::agent::{ModifyQp, SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::{describe, Craft, Pkt};
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::QpState;
use rocemu_wire::{NakCode, Opcode, Psn, RKey, Syndrome};
use std::time::Duration;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "req.implied-nak.read-retransmitted",
        title: "A READ then a SEND; the ACK of the SEND comes, the READ's response does not: the device sends the READ again",
        cites: &[cite::IMPLIED_NAK, cite::COALESCED_ACK],
        run: implied_nak_read,
    },
    Scenario {
        id: "req.implied-nak.atomic-retransmitted",
        title: "A FETCH_ADD then a SEND; the ACK of the SEND comes, the ATOMIC_ACKNOWLEDGE does not: the device sends the FETCH_ADD again",
        cites: &[cite::IMPLIED_NAK, cite::COALESCED_ACK, cite::ATOMICS],
        run: implied_nak_atomic,
    },
    Scenario {
        id: "req.unexpected-opcode.read-response-for-send-bad-resp",
        title: "A READ_RESPONSE_ONLY at the PSN of a SEND: the SEND completes IBV_WC_BAD_RESP_ERR, the QP goes to ERR",
        cites: &[cite::UNEXPECTED_RESPONSE, cite::BAD_RESPONSE],
        run: read_response_for_send,
    },
    Scenario {
        id: "req.unexpected-opcode.atomic-ack-for-read-bad-resp",
        title: "An ATOMIC_ACKNOWLEDGE at the PSN of a READ: the READ completes IBV_WC_BAD_RESP_ERR with nothing written, the QP goes to ERR",
        cites: &[cite::UNEXPECTED_RESPONSE, cite::BAD_RESPONSE],
        run: atomic_ack_for_read,
    },
    Scenario {
        id: "req.read.nak-seq-mid-response-resumes",
        title: "READ of 3 packets, FIRST then a NAK PSN sequence error at the second: the device asks again from the second PSN with the VA and length advanced",
        cites: &[cite::READ_NAK_MIDWAY, cite::READ_RETRY, cite::SEQ_NAK_GO_BACK],
        run: read_nak_seq_mid,
    },
    Scenario {
        id: "req.read.nak-rem-op-mid-response-fails",
        title: "READ of 3 packets, FIRST then a NAK remote operational error: the READ completes IBV_WC_REM_OP_ERR, the QP goes to ERR",
        cites: &[cite::READ_NAK_MIDWAY, cite::LOCAL_LENGTH_ERROR],
        run: read_nak_op_mid,
    },
    Scenario {
        id: "req.read.psn-wrap",
        title: "A READ of 3 packets from PSN 0xfffffe: responses at 0xfffffe, 0xffffff, 0x000000 complete it with its data; the next SEND goes at 0x000001",
        cites: &[cite::PSN_MODULO, cite::RESPONSE_PSNS, cite::BTH],
        run: read_psn_wrap,
    },
    Scenario {
        id: "rnr.requester.retry-7-forever",
        title: "rnr_retry 7: a SEND RNR-NAKed ten times goes out eleven times, then completes on the ACK",
        cites: &[cite::RNR_RETRY_INFINITE, cite::RNR_NAK],
        run: rnr_retry_forever,
    },
    Scenario {
        id: "ack.timeout.retry-cnt-7-finite",
        title: "retry_cnt 7, no answer: the SEND goes out eight times (seven retries), then IBV_WC_RETRY_EXC_ERR",
        cites: &[cite::RETRY_CNT_FINITE, cite::LOCAL_ACK_TIMEOUT],
        run: retry_cnt_7,
    },
    Scenario {
        id: "ack.timeout.retry-cnt-0-no-retry",
        title: "retry_cnt 0, no answer: the SEND goes out once, then IBV_WC_RETRY_EXC_ERR",
        cites: &[cite::RETRY_COUNTER, cite::LOCAL_ACK_TIMEOUT],
        run: retry_cnt_0,
    },
    Scenario {
        id: "ack.timeout.zero-never-retransmits",
        title: "Local ACK timeout 0 (infinite), no answer: the SEND goes out once and never again; a late ACK completes it",
        cites: &[cite::LOCAL_ACK_TIMEOUT],
        run: timeout_zero,
    },
    Scenario {
        id: "req.fence.waits-for-read",
        title: "A READ, then a fenced SEND: the SEND goes out only once the READ's response came",
        cites: &[cite::FENCE],
        run: fence_read,
    },
    Scenario {
        id: "req.fence.waits-for-atomic",
        title: "A FETCH_ADD, then a fenced WRITE: the WRITE goes out only once the ATOMIC_ACKNOWLEDGE came",
        cites: &[cite::FENCE, cite::ATOMICS],
        run: fence_atomic,
    },
    Scenario {
        id: "req.initiator-depth.max-rd-atomic",
        title: "max_rd_atomic 2, three READs posted: two go out; the third only after the first's response",
        cites: &[cite::INITIATOR_DEPTH],
        run: initiator_depth,
    },
    Scenario {
        id: "req.unsignaled.error-completes",
        title: "An unsignaled SEND ACKed leaves no completion; an unsignaled SEND NAKed remote access error completes IBV_WC_REM_ACCESS_ERR",
        cites: &[cite::UNSIGNALED_ERROR, cite::REMOTE_ACCESS_NAK],
        run: unsignaled_error,
    },
    Scenario {
        id: "req.sqd.drains-and-holds",
        title: "To SQD with a SEND outstanding: its ACK completes it, a SEND posted in SQD stays unsent until the QP is back in RTS",
        cites: &[cite::SQ_DRAIN, cite::MODIFY_QP],
        run: sqd_drain,
    },
    Scenario {
        id: "ack.aeth.zero-credits-completes",
        title: "An ACK whose AETH advertises zero credits still acknowledges: the SEND completes, and the next SEND still goes out",
        cites: &[cite::AETH, cite::ACK_COVERS],
        run: zero_credits,
    },
];

const ACK: Syndrome = Syndrome::ack(Syndrome::CREDITS_INVALID);

/// The requester's options for scenarios whose subject is not the local ACK timeout: code 20
/// (about 4.3 s), so that no retransmission on timeout mixes in even where the agent's round
/// trips take a few hundred milliseconds (rdma_rxe in an emulated VM).
fn opts() -> ConnOpts {
    ConnOpts {
        timeout: 20,
        ..ConnOpts::requester()
    }
}

/// What the device sends to the connection's peer QP within `window` (the settle time when
/// `None`): frames still on their way from an earlier scenario's QP are left out.
fn collect(ctx: &mut Ctx<'_>, c: &Conn, window: Option<Duration>) -> Vec<Pkt> {
    let mut v = ctx.peer.collect(window);
    v.retain(|p| p.bth.dqpn == c.peer_qpn);
    v
}
const VA: u64 = 0x7000_0000;
const RK: RKey = RKey(0x4321);

fn sge(c: &Conn, offset: u64, length: u32) -> Vec<Sge> {
    vec![Sge {
        addr: c.mr.addr + offset,
        length,
        lkey: c.mr.lkey,
    }]
}

fn send_wr(c: &Conn, id: u64) -> SendWr {
    SendWr::new(id, SendOpcode::Send, sge(c, 2048 + 8 * id, 8))
}

/// A READ of `len` bytes from the peer's `VA + off` into the MR at offset 0.
fn read_wr(c: &Conn, id: u64, off: u64, len: u32) -> SendWr {
    let mut wr = SendWr::new(id, SendOpcode::RdmaRead, sge(c, off, len));
    wr.remote_addr = VA + off;
    wr.rkey = RK;
    wr
}

fn fetch_add_wr(c: &Conn, id: u64) -> SendWr {
    let mut wr = SendWr::new(id, SendOpcode::AtomicFetchAdd, sge(c, 0, 8));
    wr.remote_addr = VA;
    wr.rkey = RK;
    wr.compare_add = 1;
    wr
}

fn ack(ctx: &Ctx<'_>, c: &Conn, psn: Psn, syndrome: Syndrome, msn: u32) -> Craft {
    ctx.req(c, Opcode::RC_ACKNOWLEDGE, psn).aeth(syndrome, msn)
}

fn read_resp(ctx: &Ctx<'_>, c: &Conn, op: Opcode, psn: Psn, data: &[u8], msn: u32) -> Craft {
    let r = ctx.req(c, op, psn).payload(data);
    if op == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
        r
    } else {
        r.aeth(ACK, msn)
    }
}

fn is(p: &Pkt, op: Opcode, psn: Psn) -> bool {
    p.opcode() == op && p.psn() == psn
}

/// Fails unless `got` is exactly the packets `want` (opcode, PSN), in order.
fn expect_pkts(got: &[Pkt], want: &[(Opcode, Psn)], why: &str) -> Outcome {
    let ok = got.len() == want.len() && got.iter().zip(want).all(|(p, (o, s))| is(p, *o, *s));
    if ok {
        return Ok(());
    }
    let w: Vec<String> = want
        .iter()
        .map(|(o, s)| format!("{o} psn={}", psn_text(*s)))
        .collect();
    Err(format!(
        "{why}: expected {}, got {}",
        w.join("; "),
        describe(got)
    ))
}

/// The completions must be these wr_ids, all successful, in order.
fn expect_successes(ctx: &mut Ctx<'_>, c: &Conn, ids: &[u64], why: &str) -> Outcome {
    let w = ctx.wcs(c, ids.len() as u32)?;
    let got: Vec<u64> = w.iter().map(|x| x.wr_id).collect();
    if got != ids || !w.iter().all(|x| x.is_success()) {
        return Err(format!(
            "{why}: expected wr_ids {ids:?} completed successfully in order, got {}",
            wcs_text(&w)
        ));
    }
    Ok(())
}

/// READ (wr 1, 8 bytes) then SEND (wr 2) on the wire, at p and p + 1.
fn read_then_send(ctx: &mut Ctx<'_>, c: &Conn, atomic: bool) -> Outcome {
    let p = c.dut_psn;
    let (wr, op) = if atomic {
        (fetch_add_wr(c, 1), Opcode::RC_FETCH_ADD)
    } else {
        (read_wr(c, 1, 0, 8), Opcode::RC_RDMA_READ_REQUEST)
    };
    ctx.agent.post_send(c.qpn, wr)?;
    ctx.agent.post_send(c.qpn, send_wr(c, 2))?;
    let got = collect(ctx, c, None);
    expect_pkts(
        &got,
        &[(op, p), (Opcode::RC_SEND_ONLY, p.add(1))],
        "posted a request and a SEND",
    )
}

fn implied_nak(ctx: &mut Ctx<'_>, atomic: bool) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    read_then_send(ctx, &c, atomic)?;
    let op = if atomic {
        Opcode::RC_FETCH_ADD
    } else {
        Opcode::RC_RDMA_READ_REQUEST
    };
    // The ACK of the SEND: the response at p was lost on the way.
    ctx.peer.send(&ack(ctx, &c, p.add(1), ACK, 2))?;
    let again = collect(ctx, &c, None);
    if !again.first().is_some_and(|x| is(x, op, p)) {
        return Err(format!(
            "an ACK of {} with the response at {} missing (an implied NAK): expected {op} at {} again, got {}",
            psn_text(p.add(1)),
            psn_text(p),
            psn_text(p),
            describe(&again)
        ));
    }
    ctx.expect_no_wc(&c, "the response at the first PSN has not come")?;
    let data = 0x0102_0304_0506_0708u64.to_le_bytes();
    let resp = if atomic {
        ctx.req(&c, Opcode::RC_ATOMIC_ACKNOWLEDGE, p)
            .aeth(ACK, 1)
            .atomic_ack(u64::from_le_bytes(data))
    } else {
        read_resp(ctx, &c, Opcode::RC_RDMA_READ_RESPONSE_ONLY, p, &data, 1)
    };
    ctx.peer.send(&resp)?;
    ctx.peer.send(&ack(ctx, &c, p.add(1), ACK, 2))?;
    expect_successes(ctx, &c, &[1, 2], "the response, then the ACK again")?;
    if ctx.mr_bytes(&c, 0, 8)? != data {
        return Err("the response's 8 bytes are not in the local buffer".into());
    }
    Ok(())
}

fn implied_nak_read(ctx: &mut Ctx<'_>) -> Outcome {
    implied_nak(ctx, false)
}

fn implied_nak_atomic(ctx: &mut Ctx<'_>) -> Outcome {
    implied_nak(ctx, true)
}

fn read_response_for_send(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_SEND_ONLY, p)], "one SEND")?;
    ctx.peer.send(&read_resp(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        p,
        &[0xee; 8],
        1,
    ))?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_BAD_RESP_ERR",
        None,
        "an RDMA_READ_RESPONSE_ONLY at the PSN of a SEND",
    )?;
    if wc.wr_id != 1 {
        return Err(format!("completion for wr_id {}, expected 1", wc.wr_id));
    }
    ctx.expect_state(&c, QpState::Err, "after a bad response")
}

fn atomic_ack_for_read(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    ctx.fill_mr(&c, 0, &[0; 8])?;
    ctx.agent.post_send(c.qpn, read_wr(&c, 1, 0, 8))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_RDMA_READ_REQUEST, p)], "one READ")?;
    let stray = ctx
        .req(&c, Opcode::RC_ATOMIC_ACKNOWLEDGE, p)
        .aeth(ACK, 1)
        .atomic_ack(0xdead_beef_dead_beef);
    ctx.peer.send(&stray)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_BAD_RESP_ERR",
        None,
        "an ATOMIC_ACKNOWLEDGE at the PSN of a READ",
    )?;
    if wc.wr_id != 1 {
        return Err(format!("completion for wr_id {}, expected 1", wc.wr_id));
    }
    if ctx.mr_bytes(&c, 0, 8)? != [0; 8] {
        return Err("the ATOMIC_ACKNOWLEDGE's value landed in the READ's buffer".into());
    }
    ctx.expect_state(&c, QpState::Err, "after a bad response")
}

/// A READ of three packets (wr 1) on the wire, and its first response sent.
fn read_three_first(ctx: &mut Ctx<'_>, c: &Conn, data: &[u8]) -> Outcome {
    let p = c.dut_psn;
    let mtu = c.mtu as usize;
    ctx.agent
        .post_send(c.qpn, read_wr(c, 1, 0, data.len() as u32))?;
    let got = collect(ctx, c, None);
    expect_pkts(&got, &[(Opcode::RC_RDMA_READ_REQUEST, p)], "one READ")?;
    ctx.peer.send(&read_resp(
        ctx,
        c,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        p,
        &data[..mtu],
        0,
    ))?;
    Ok(())
}

fn read_nak_seq_mid(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    let mtu = c.mtu;
    let data = pattern(0x44, 3 * mtu as usize);
    read_three_first(ctx, &c, &data)?;
    ctx.peer.send(&ack(
        ctx,
        &c,
        p.add(1),
        Syndrome::nak(NakCode::PsnSequenceError),
        0,
    ))?;
    let again = collect(ctx, &c, None);
    let want = (VA + mtu as u64, 2 * mtu);
    match again.first() {
        Some(r)
            if is(r, Opcode::RC_RDMA_READ_REQUEST, p.add(1))
                && r.ext.reth.is_some_and(|x| (x.va, x.dma_len) == want) => {}
        _ => {
            return Err(format!(
                "FIRST at {}, then a NAK sequence error at {}: expected a READ at {} for VA 0x{:x}, {} bytes, got {}",
                psn_text(p),
                psn_text(p.add(1)),
                psn_text(p.add(1)),
                want.0,
                want.1,
                describe(&again)
            ))
        }
    }
    let m = mtu as usize;
    ctx.peer.send(&read_resp(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        p.add(1),
        &data[m..2 * m],
        0,
    ))?;
    ctx.peer.send(&read_resp(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        p.add(2),
        &data[2 * m..],
        1,
    ))?;
    expect_successes(ctx, &c, &[1], "the resumed READ's responses")?;
    if ctx.mr_bytes(&c, 0, data.len() as u64)? != data {
        return Err("the READ's bytes in the local buffer are not the responses'".into());
    }
    Ok(())
}

fn read_nak_op_mid(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    let data = pattern(0x55, 3 * c.mtu as usize);
    read_three_first(ctx, &c, &data)?;
    ctx.peer.send(&ack(
        ctx,
        &c,
        p.add(1),
        Syndrome::nak(NakCode::RemoteOperationalError),
        0,
    ))?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_REM_OP_ERR",
        None,
        "FIRST, then a NAK remote operational error",
    )?;
    if wc.wr_id != 1 {
        return Err(format!("completion for wr_id {}, expected 1", wc.wr_id));
    }
    ctx.expect_state(&c, QpState::Err, "after a remote operational error")
}

fn read_psn_wrap(ctx: &mut Ctx<'_>) -> Outcome {
    let p = Psn::new(0xff_fffe);
    let c = ctx.connect(ConnOpts {
        dut_psn: Some(p),
        ..opts()
    })?;
    let m = c.mtu as usize;
    let data = pattern(0x66, 3 * m);
    ctx.agent
        .post_send(c.qpn, read_wr(&c, 1, 0, data.len() as u32))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_RDMA_READ_REQUEST, p)], "one READ")?;
    let parts = [
        (Opcode::RC_RDMA_READ_RESPONSE_FIRST, &data[..m]),
        (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, &data[m..2 * m]),
        (Opcode::RC_RDMA_READ_RESPONSE_LAST, &data[2 * m..]),
    ];
    for (k, (op, d)) in parts.into_iter().enumerate() {
        ctx.peer
            .send(&read_resp(ctx, &c, op, p.add(k as u32), d, 1))?;
    }
    expect_successes(ctx, &c, &[1], "responses at 0xfffffe, 0xffffff, 0x000000")?;
    if ctx.mr_bytes(&c, 0, data.len() as u64)? != data {
        return Err("the READ's bytes in the local buffer are not the responses'".into());
    }
    ctx.agent.post_send(c.qpn, send_wr(&c, 2))?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(Opcode::RC_SEND_ONLY, Psn::new(1))],
        "the SEND after the READ",
    )
}

fn rnr_retry_forever(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        rnr_retry: 7,
        ..opts()
    })?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    let mut sends = 0;
    while let Some(x) = ctx.peer.recv(Duration::from_millis(500)) {
        if !is(&x, Opcode::RC_SEND_ONLY, p) {
            return Err(format!(
                "expected the RC_SEND_ONLY at {}, got {x}",
                psn_text(p)
            ));
        }
        sends += 1;
        if sends == 11 {
            break;
        }
        // RNR NAK timer code 1: 0.01 ms.
        ctx.peer.send(&ack(ctx, &c, p, Syndrome::rnr_nak(1), 0))?;
    }
    if sends != 11 {
        let w = ctx.wcs(&c, 0)?;
        return Err(format!(
            "rnr_retry 7 (infinite), each attempt RNR-NAKed: expected the SEND eleven times, got it {sends} times; completions: {}",
            wcs_text(&w)
        ));
    }
    ctx.peer.send(&ack(ctx, &c, p, ACK, 1))?;
    expect_successes(ctx, &c, &[1], "the ACK after ten RNR NAKs")
}

/// retry_cnt `n`, timeout code 12 (16.8 ms), no answer: the SEND goes out `n + 1` times, then
/// RETRY_EXC_ERR.
fn retry_cnt(ctx: &mut Ctx<'_>, n: u8) -> Outcome {
    let c = ctx.connect(ConnOpts {
        retry_cnt: n,
        timeout: 12,
        ..Default::default()
    })?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    // Up to (n + 1) × 16.8 ms of timeouts, and a margin for a slow timer.
    let got = collect(ctx, &c, Some(Duration::from_millis(300 + 120 * n as u64)));
    let want = n as usize + 1;
    if got.len() != want || !got.iter().all(|x| is(x, Opcode::RC_SEND_ONLY, p)) {
        return Err(format!(
            "retry_cnt {n}, no answer: expected the SEND at {} {want} times, got {} packets: {}",
            psn_text(p),
            got.len(),
            describe(&got[..got.len().min(12)])
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_RETRY_EXC_ERR",
        None,
        &format!("retry_cnt {n} spent"),
    )?;
    Ok(())
}

fn retry_cnt_7(ctx: &mut Ctx<'_>) -> Outcome {
    retry_cnt(ctx, 7)
}

fn retry_cnt_0(ctx: &mut Ctx<'_>) -> Outcome {
    retry_cnt(ctx, 0)
}

fn timeout_zero(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        timeout: 0,
        retry_cnt: 1,
        ..Default::default()
    })?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    // Two seconds: longer than any finite timeout a device could take 0 for, up to code 18.
    let got = collect(ctx, &c, Some(Duration::from_secs(2)));
    expect_pkts(
        &got,
        &[(Opcode::RC_SEND_ONLY, p)],
        "timeout 0, no answer for 2 s",
    )?;
    ctx.expect_no_wc(&c, "timeout 0: no retry counter is ever spent")?;
    ctx.peer.send(&ack(ctx, &c, p, ACK, 1))?;
    expect_successes(ctx, &c, &[1], "the late ACK")
}

fn fence(ctx: &mut Ctx<'_>, atomic: bool) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    let (first, op) = if atomic {
        (fetch_add_wr(&c, 1), Opcode::RC_FETCH_ADD)
    } else {
        (read_wr(&c, 1, 0, 8), Opcode::RC_RDMA_READ_REQUEST)
    };
    ctx.agent.post_send(c.qpn, first)?;
    let (mut second, second_op) = if atomic {
        let mut w = SendWr::new(2, SendOpcode::RdmaWrite, sge(&c, 64, 8));
        w.remote_addr = VA + 64;
        w.rkey = RK;
        (w, Opcode::RC_RDMA_WRITE_ONLY)
    } else {
        (send_wr(&c, 2), Opcode::RC_SEND_ONLY)
    };
    second.fence = true;
    ctx.agent.post_send(c.qpn, second)?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(op, p)],
        "a fenced WR behind an outstanding READ or atomic",
    )?;
    let data = 7u64.to_le_bytes();
    let resp = if atomic {
        ctx.req(&c, Opcode::RC_ATOMIC_ACKNOWLEDGE, p)
            .aeth(ACK, 1)
            .atomic_ack(7)
    } else {
        read_resp(ctx, &c, Opcode::RC_RDMA_READ_RESPONSE_ONLY, p, &data, 1)
    };
    ctx.peer.send(&resp)?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(second_op, p.add(1))],
        "the response came: the fenced WR",
    )?;
    ctx.peer.send(&ack(ctx, &c, p.add(1), ACK, 2))?;
    expect_successes(ctx, &c, &[1, 2], "both answered")
}

fn fence_read(ctx: &mut Ctx<'_>) -> Outcome {
    fence(ctx, false)
}

fn fence_atomic(ctx: &mut Ctx<'_>) -> Outcome {
    fence(ctx, true)
}

fn initiator_depth(ctx: &mut Ctx<'_>) -> Outcome {
    let o = ConnOpts {
        stop_at: QpState::Rtr,
        ..opts()
    };
    let c = ctx.connect(o)?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(c.dut_psn),
            timeout: Some(o.timeout),
            retry_cnt: Some(o.retry_cnt),
            rnr_retry: Some(o.rnr_retry),
            max_rd_atomic: Some(2),
            ..Default::default()
        },
    )?;
    let p = c.dut_psn;
    for k in 0..3u64 {
        ctx.agent.post_send(c.qpn, read_wr(&c, k + 1, 8 * k, 8))?;
    }
    let got = collect(ctx, &c, None);
    let r = Opcode::RC_RDMA_READ_REQUEST;
    expect_pkts(
        &got,
        &[(r, p), (r, p.add(1))],
        "max_rd_atomic 2, three READs posted",
    )?;
    ctx.peer.send(&read_resp(
        ctx,
        &c,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        p,
        &[1; 8],
        1,
    ))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(r, p.add(2))], "the first READ answered")?;
    for k in 1..3u32 {
        ctx.peer.send(&read_resp(
            ctx,
            &c,
            Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            p.add(k),
            &[1; 8],
            1 + k,
        ))?;
    }
    expect_successes(ctx, &c, &[1, 2, 3], "all three READs answered")
}

fn unsignaled_error(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    let mut wr = send_wr(&c, 1);
    wr.signaled = false;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_SEND_ONLY, p)], "an unsignaled SEND")?;
    ctx.peer.send(&ack(ctx, &c, p, ACK, 1))?;
    ctx.expect_no_wc(&c, "an unsignaled SEND, ACKed")?;
    let mut wr = send_wr(&c, 2);
    wr.signaled = false;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(Opcode::RC_SEND_ONLY, p.add(1))],
        "a second unsignaled SEND",
    )?;
    ctx.peer.send(&ack(
        ctx,
        &c,
        p.add(1),
        Syndrome::nak(NakCode::RemoteAccessError),
        1,
    ))?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_REM_ACCESS_ERR",
        None,
        "an unsignaled SEND NAKed remote access error",
    )?;
    if wc.wr_id != 2 {
        return Err(format!("completion for wr_id {}, expected 2", wc.wr_id));
    }
    Ok(())
}

fn sqd_drain(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_SEND_ONLY, p)], "a SEND")?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Sqd),
            ..Default::default()
        },
    )?;
    ctx.agent.post_send(c.qpn, send_wr(&c, 2))?;
    ctx.peer
        .expect_silence("a SEND posted after the move to SQD")?;
    ctx.peer.send(&ack(ctx, &c, p, ACK, 1))?;
    expect_successes(ctx, &c, &[1], "the outstanding SEND's ACK in SQD")?;
    ctx.peer
        .expect_silence("in SQD, the first SEND complete: the second must wait")?;
    ctx.expect_state(&c, QpState::Sqd, "drained")?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rts),
            ..Default::default()
        },
    )?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(Opcode::RC_SEND_ONLY, p.add(1))],
        "back in RTS: the SEND posted in SQD",
    )?;
    ctx.peer.send(&ack(ctx, &c, p.add(1), ACK, 2))?;
    expect_successes(ctx, &c, &[2], "its ACK")
}

fn zero_credits(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(opts())?;
    let p = c.dut_psn;
    ctx.agent.post_send(c.qpn, send_wr(&c, 1))?;
    let got = collect(ctx, &c, None);
    expect_pkts(&got, &[(Opcode::RC_SEND_ONLY, p)], "a SEND")?;
    ctx.peer.send(&ack(ctx, &c, p, Syndrome::ack(0), 1))?;
    expect_successes(ctx, &c, &[1], "an ACK with zero credits")?;
    ctx.agent.post_send(c.qpn, send_wr(&c, 2))?;
    let got = collect(ctx, &c, None);
    expect_pkts(
        &got,
        &[(Opcode::RC_SEND_ONLY, p.add(1))],
        "a SEND after a zero-credit ACK",
    )?;
    ctx.peer
        .send(&ack(ctx, &c, p.add(1), Syndrome::ack(0), 2))?;
    expect_successes(ctx, &c, &[2], "the second ACK with zero credits")
}
