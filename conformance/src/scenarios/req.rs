//! The device as requester: what it puts on the wire for its work requests, and how it takes ACKs,
//! NAKs, atomic responses and silence (IBTA Vol. 1 9.7.5.2, 9.9.3, 10.2.1, unverified, for the QP
//! attributes that bound retries).
use crate::agent::{ModifyQp, SendOpcode, SendWr, Sge};
use crate::cite;
use crate::peer::{describe, Pkt};
use crate::scenario::{psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::QpState;
use rocemu_wire::{NakCode, Opcode, Psn, RKey, Syndrome};
use std::time::Duration;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "rdma.requester.fetch-add",
        title: "The device's FETCH_ADD carries its AtomicETH; the ATOMIC_ACKNOWLEDGE's original value lands in the local buffer",
        cites: &[cite::ATOMIC_ETH, cite::ATOMIC_ACK_ETH, cite::ATOMICS],
        run: fetch_add,
    },
    Scenario {
        id: "rdma.requester.ack-coalesced",
        title: "Three SENDs acknowledged by one ACK of the last PSN all complete, in order",
        cites: &[cite::COALESCED_ACK, cite::ACK_COVERS],
        run: ack_coalesced,
    },
    Scenario {
        id: "rdma.requester.seq-nak-go-back",
        title: "A NAK PSN sequence error at the second of three SENDs: the first completes, the device resends from the second",
        cites: &[cite::COALESCED_ACK, cite::SEQ_NAK_GO_BACK],
        run: seq_nak_go_back,
    },
    Scenario {
        id: "rnr.requester.retry-exhausted",
        title: "rnr_retry 1: a SEND RNR-NAKed twice goes out twice and completes IBV_WC_RNR_RETRY_EXC_ERR",
        cites: &[cite::RNR_NAK, cite::LOCAL_LENGTH_ERROR],
        run: rnr_exhausted,
    },
    Scenario {
        id: "ack.timeout.retry-exhausted",
        title: "retry_cnt 1, no answer: a SEND goes out twice (once more after the local ACK timeout) and completes IBV_WC_RETRY_EXC_ERR",
        cites: &[cite::LOCAL_ACK_TIMEOUT, cite::RETRY_COUNTER, cite::LOCAL_LENGTH_ERROR],
        run: timeout_exhausted,
    },
    Scenario {
        id: "verbs.modify.rtr-needs-attributes",
        title: "modify_qp INIT → RTR without the path attributes (AV, path MTU, destination QPN, rq_psn) is refused",
        cites: &[cite::MODIFY_QP, cite::QP_STATES],
        run: rtr_needs_attributes,
    },
];

fn sge(c: &Conn, offset: u64, length: u32) -> Vec<Sge> {
    vec![Sge {
        addr: c.mr.addr + offset,
        length,
        lkey: c.mr.lkey,
    }]
}

/// Posts `n` 8-byte SENDs (wr_ids 1..=n) and returns what the device sent.
fn post_sends(ctx: &mut Ctx<'_>, c: &Conn, n: u64) -> Result<Vec<Pkt>, String> {
    for id in 1..=n {
        let wr = SendWr::new(id, SendOpcode::Send, sge(c, 8 * id, 8));
        ctx.agent.post_send(c.qpn, wr)?;
    }
    Ok(ctx.peer.collect(None))
}

fn sends_at(got: &[Pkt], first: Psn, n: u32) -> bool {
    got.len() == n as usize
        && got
            .iter()
            .enumerate()
            .all(|(k, p)| p.opcode() == Opcode::RC_SEND_ONLY && p.psn() == first.add(k as u32))
}

fn ack(ctx: &Ctx<'_>, c: &Conn, psn: Psn, syndrome: Syndrome, msn: u32) -> crate::peer::Craft {
    ctx.req(c, Opcode::RC_ACKNOWLEDGE, psn).aeth(syndrome, msn)
}

const ACK: Syndrome = Syndrome::ack(Syndrome::CREDITS_INVALID);

fn fetch_add(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let mut wr = SendWr::new(31, SendOpcode::AtomicFetchAdd, sge(&c, 0, 8));
    wr.remote_addr = 0x8000_0000;
    wr.rkey = RKey(0x99);
    wr.compare_add = 3;
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    match got.as_slice() {
        [p] if p.opcode() == Opcode::RC_FETCH_ADD
            && p.psn() == c.dut_psn
            && p.ext.atomic.is_some_and(|a| {
                a.va == 0x8000_0000 && a.rkey == RKey(0x99) && a.swap_add == 3
            }) => {}
        _ => {
            return Err(format!(
            "expected one RC_FETCH_ADD at {} with AtomicETH va=0x80000000 rkey=0x99 add=3, got {}",
            psn_text(c.dut_psn),
            describe(&got)
        ))
        }
    }
    let orig = 0x1122_3344_5566_7788u64;
    let resp = ctx
        .req(&c, Opcode::RC_ATOMIC_ACKNOWLEDGE, c.dut_psn)
        .aeth(ACK, 1)
        .atomic_ack(orig);
    ctx.peer.send(&resp)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_FETCH_ADD"),
        "an ATOMIC_ACKNOWLEDGE",
    )?;
    if wc.wr_id != 31 {
        return Err(format!("completion for wr_id {}, expected 31", wc.wr_id));
    }
    if ctx.mr_bytes(&c, 0, 8)? != orig.to_le_bytes() {
        return Err(format!(
            "the local buffer does not hold the original value 0x{orig:x} (host order)"
        ));
    }
    Ok(())
}

fn ack_coalesced(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let p = c.dut_psn;
    let got = post_sends(ctx, &c, 3)?;
    if !sends_at(&got, p, 3) {
        return Err(format!(
            "expected three RC_SEND_ONLY from {}, got {}",
            psn_text(p),
            describe(&got)
        ));
    }
    ctx.peer.send(&ack(ctx, &c, p.add(2), ACK, 3))?;
    let w = ctx.wcs(&c, 3)?;
    let ids: Vec<u64> = w.iter().map(|x| x.wr_id).collect();
    if ids != [1, 2, 3] || !w.iter().all(|x| x.is_success()) {
        return Err(format!(
            "one ACK of {}: expected sends 1, 2, 3 completed in order, got {}",
            psn_text(p.add(2)),
            wcs_text(&w)
        ));
    }
    Ok(())
}

fn seq_nak_go_back(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::requester())?;
    let p = c.dut_psn;
    let got = post_sends(ctx, &c, 3)?;
    if !sends_at(&got, p, 3) {
        return Err(format!(
            "expected three RC_SEND_ONLY from {}, got {}",
            psn_text(p),
            describe(&got)
        ));
    }
    ctx.peer.send(&ack(
        ctx,
        &c,
        p.add(1),
        Syndrome::nak(NakCode::PsnSequenceError),
        1,
    ))?;
    let again = ctx.peer.collect(None);
    if !sends_at(&again, p.add(1), 2) {
        return Err(format!(
            "a NAK sequence error at {}: expected the SENDs at {} and {} again, got {}",
            psn_text(p.add(1)),
            psn_text(p.add(1)),
            psn_text(p.add(2)),
            describe(&again)
        ));
    }
    ctx.peer.send(&ack(ctx, &c, p.add(2), ACK, 3))?;
    let w = ctx.wcs(&c, 3)?;
    let ids: Vec<u64> = w.iter().map(|x| x.wr_id).collect();
    if ids != [1, 2, 3] || !w.iter().all(|x| x.is_success()) {
        return Err(format!(
            "expected sends 1, 2, 3 completed in order, got {}",
            wcs_text(&w)
        ));
    }
    Ok(())
}

fn rnr_exhausted(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        rnr_retry: 1,
        ..ConnOpts::requester()
    })?;
    let wr = SendWr::new(41, SendOpcode::Send, sge(&c, 0, 8));
    ctx.agent.post_send(c.qpn, wr)?;
    let mut sends = 0;
    // Answer every transmission with an RNR NAK asking for 10 µs (timer code 1).
    while let Some(p) = ctx.peer.recv(Duration::from_millis(300)) {
        if p.opcode() != Opcode::RC_SEND_ONLY || p.psn() != c.dut_psn {
            return Err(format!(
                "expected the RC_SEND_ONLY at {}, got {p}",
                psn_text(c.dut_psn)
            ));
        }
        sends += 1;
        if sends > 4 {
            break;
        }
        ctx.peer
            .send(&ack(ctx, &c, c.dut_psn, Syndrome::rnr_nak(1), 0))?;
    }
    if sends != 2 {
        return Err(format!(
            "rnr_retry 1, every attempt RNR-NAKed: expected the SEND twice, got it {sends} times"
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_RNR_RETRY_EXC_ERR",
        None,
        "RNR retries exhausted",
    )?;
    Ok(())
}

fn timeout_exhausted(ctx: &mut Ctx<'_>) -> Outcome {
    // Timeout code 12: 4.096 µs × 2^12 ≈ 16.8 ms.
    let c = ctx.connect(ConnOpts {
        retry_cnt: 1,
        timeout: 12,
        ..Default::default()
    })?;
    let wr = SendWr::new(51, SendOpcode::Send, sge(&c, 0, 8));
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(Some(Duration::from_millis(500)));
    let sends = got
        .iter()
        .filter(|p| p.opcode() == Opcode::RC_SEND_ONLY && p.psn() == c.dut_psn)
        .count();
    if sends != 2 || got.len() != 2 {
        return Err(format!(
            "retry_cnt 1, no answer: expected the SEND at {} twice, got {}",
            psn_text(c.dut_psn),
            describe(&got)
        ));
    }
    if got[1].at.saturating_sub(got[0].at) < Duration::from_millis(16) {
        return Err(format!(
            "the SEND went out again {} µs after the first; timeout 12 asks for at least 16.8 ms",
            got[1].at.saturating_sub(got[0].at).as_micros()
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_RETRY_EXC_ERR",
        None,
        "transport retries exhausted",
    )?;
    Ok(())
}

fn rtr_needs_attributes(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        stop_at: QpState::Init,
        ..Default::default()
    })?;
    let r = ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        },
    );
    if r.is_ok() {
        return Err("modify_qp INIT → RTR with the state alone was accepted".into());
    }
    ctx.expect_state(&c, QpState::Init, "a refused INIT → RTR")
}
