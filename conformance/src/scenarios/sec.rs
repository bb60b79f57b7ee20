//! Security, after ReDMArk (Rothenberger et al., "ReDMArk: Bypassing RDMA Security
//! Mechanisms", USENIX Security 2021): an attacker who can put packets on the network guesses
//! R_Keys, QPNs and PSNs from the ones it saw, and injects packets into a connection with
//! guessed PSNs or from another address. The device must make the guesses hard and the
//! injections harmless.
//!
//! With ibverbs the application chooses a QP's PSNs (`sq_psn`, `rq_psn`), so a device chooses a
//! starting PSN only in its connection manager: the passive side's REP announces the PSN it
//! expects first, which is the PSN an injected packet must carry. `sec.psn.unpredictable`
//! therefore connects through the device's CM (the agent's `cm_listen`) as an rdma_cm client.
use crate::agent::QpInit;
use crate::cite;
use crate::cm_peer::{self, Accepted, Offer, Patience};
use crate::peer::{describe, Craft};
use crate::scenario::{pattern, psn_text, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpType};
use rocemu_wire::cm::{CommId, Guid};
use rocemu_wire::frame::IpRepr;
use rocemu_wire::mad::Tid;
use rocemu_wire::{NakCode, Opcode, Qpn, RKey};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "sec.rkey.unpredictable",
        title: "32 R_Keys in a row: none guessable within ±2^16 of the previous key plus the usual step",
        cites: &[cite::REDMARK_KEYS, cite::RKEY_VALUE],
        run: rkey_unpredictable,
    },
    Scenario {
        id: "sec.qpn.unpredictable",
        title: "32 QPNs in a row: none guessable within ±2^10 of the previous QPN plus the usual step",
        cites: &[cite::REDMARK_INJECT, cite::QPN_VALUE],
        run: qpn_unpredictable,
    },
    Scenario {
        id: "sec.psn.unpredictable",
        title: "32 rdma_cm connections to the device: no REP's starting PSN guessable within ±2^10 of the previous plus the usual step",
        cites: &[cite::REDMARK_INJECT, cite::REP_PSN, cite::BTH],
        run: psn_unpredictable,
    },
    Scenario {
        id: "sec.inject.future-psn-not-applied",
        title: "A WRITE with a valid R_Key but a guessed PSN 2^18 ahead writes nothing (at most one sequence NAK)",
        cites: &[cite::REDMARK_INJECT, cite::NAK_ONCE],
        run: inject_future_psn,
    },
    Scenario {
        id: "sec.inject.past-psn-not-applied",
        title: "A WRITE with a valid R_Key but a PSN 2^18 behind (an old duplicate) writes nothing",
        cites: &[cite::REDMARK_INJECT, cite::DUP_C9_105],
        run: inject_past_psn,
    },
    Scenario {
        id: "sec.inject.foreign-source-dropped",
        title: "A WRITE with the right QPN, PSN and R_Key from another source address is dropped",
        cites: &[cite::REDMARK_INJECT, cite::A17_ADDR, cite::ADDR_VALIDATION],
        run: inject_foreign_source,
    },
    Scenario {
        id: "sec.access.qp-without-remote-write-nak",
        title: "A WRITE to a QP whose access flags lack REMOTE_WRITE is NAKed, whatever the MR allows; memory untouched",
        cites: &[cite::REDMARK_ACCESS, cite::RESPONDER_CHECKS, cite::QP_ACCESS],
        run: qp_without_remote_write,
    },
    Scenario {
        id: "sec.access.other-pd-nak",
        title: "A WRITE with the R_Key of an MR in another protection domain is NAKed remote access error",
        cites: &[cite::REDMARK_ACCESS, cite::RKEY_VALIDATION, cite::REMOTE_ACCESS_NAK],
        run: other_pd,
    },
    Scenario {
        id: "sec.access.deregistered-rkey-nak",
        title: "A WRITE with the R_Key of a deregistered MR is NAKed remote access error",
        cites: &[cite::REDMARK_ACCESS, cite::RKEY_VALIDATION, cite::DEREGISTER],
        run: deregistered_rkey,
    },
];

/// How many of `v[1..]` an attacker guesses: the previous value plus the median step, within
/// `window` (modulo `modulus`). ReDMArk's attack on keys and QPNs handed out in sequence.
pub fn guessable(v: &[u32], modulus: u64, window: u64) -> usize {
    if v.len() < 3 {
        return 0;
    }
    let step = |a: u32, b: u32| (b as u64 + modulus - a as u64) % modulus;
    let mut steps: Vec<u64> = v.windows(2).map(|w| step(w[0], w[1])).collect();
    steps.sort_unstable();
    let median = steps[steps.len() / 2];
    v.windows(2)
        .filter(|w| {
            let guess = (w[0] as u64 + median) % modulus;
            let d = (w[1] as u64 + modulus - guess) % modulus;
            d.min(modulus - d) <= window
        })
        .count()
}

fn judge_sequence(what: &str, v: &[u32], modulus: u64, window: u64) -> Outcome {
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != v.len() {
        return Err(format!(
            "{what}: {} of {} values repeat",
            v.len() - sorted.len(),
            v.len()
        ));
    }
    let hits = guessable(v, modulus, window);
    // A random sequence hits with probability about 2·window/modulus per guess.
    if hits > (v.len() - 1) / 4 {
        let shown: Vec<String> = v.iter().take(6).map(|x| format!("0x{x:x}")).collect();
        return Err(format!(
            "{what}: {hits} of {} guessed within ±{window} of previous + median step ({}, …)",
            v.len() - 1,
            shown.join(", ")
        ));
    }
    Ok(())
}

fn rkey_unpredictable(ctx: &mut Ctx<'_>) -> Outcome {
    let pd = ctx.agent.alloc_pd()?;
    let mut keys = Vec::new();
    for _ in 0..32 {
        let m = ctx.agent.reg_mr(pd, 4096, Access::ALL)?;
        keys.push(m.rkey.0);
    }
    judge_sequence("R_Keys", &keys, 1 << 32, 1 << 16)
}

fn qpn_unpredictable(ctx: &mut Ctx<'_>) -> Outcome {
    let pd = ctx.agent.alloc_pd()?;
    let cq = ctx.agent.create_cq(64)?;
    let mut qpns = Vec::new();
    for _ in 0..32 {
        qpns.push(
            ctx.agent
                .create_qp(QpInit::new(pd, QpType::Rc, cq))?
                .value(),
        );
    }
    judge_sequence("QPNs", &qpns, 1 << 24, 1 << 10)
}

/// How many connections `sec.psn.unpredictable` makes.
const CM_SAMPLE: usize = 32;

/// The starting PSNs the device's CM picks, from [`CM_SAMPLE`] connections the peer makes as an
/// rdma_cm client (REQ, REP, RTU, then DREQ, DREP: each one ended cleanly before the next).
///
/// The window: ±2^10 around the previous PSN plus the median step, as for QPNs, which live in
/// the same 24-bit space. An attacker who has seen one connection's starting PSN and can send
/// 2^11 packets into the next one guesses it if it lands there; 2^11 64-byte packets are a
/// burst of about 0.15 ms on a 10 Gb/s link, and a responder only answers wrong PSNs with a
/// sequence NAK. Values drawn at random hit the window with probability 2^11 / 2^24 = 2^-13
/// per connection; a CM that counts up, or adds a fixed stride, hits it every time; one that
/// repeats itself fails on the repeats.
fn psn_unpredictable(ctx: &mut Ctx<'_>) -> Outcome {
    let port = 0x4000 + (ctx.random() % 0x8000) as u16;
    ctx.agent.cm_listen(port)?;
    let sampled = sample_starting_psns(ctx, port);
    // Stop listening whatever happened (every connection made has been ended already).
    let stopped = ctx.agent.cm_stop(port);
    let psns = sampled?;
    stopped?;
    judge_sequence("REP starting PSNs", &psns, 1 << 24, 1 << 10)
}

fn sample_starting_psns(ctx: &mut Ctx<'_>, port: u16) -> Result<Vec<u32>, String> {
    let patience = Patience::for_settle(ctx.peer.settle);
    let guid = Guid(ctx.random() | 1);
    let mut made: Vec<Accepted> = Vec::new();
    for i in 0..CM_SAMPLE {
        let offer = Offer {
            comm_id: CommId((ctx.random() as u32).max(1)),
            guid,
            qpn: Qpn::new(0x100 + (ctx.random() % 0xff_0000) as u32),
            psn: ctx.random_psn(),
            src_port: 32768 + (ctx.random() % 28000) as u16,
            path_mtu: 3,
            tid: Tid(ctx.random()),
        };
        let what = |e: String| format!("connection {} of {CM_SAMPLE}: {e}", i + 1);
        let a = cm_peer::connect(&mut ctx.peer, port, &offer, patience).map_err(what)?;
        cm_peer::rtu(&mut ctx.peer, &a).map_err(what)?;
        let dreq_tid = Tid(ctx.random());
        cm_peer::disconnect(&mut ctx.peer, &a, dreq_tid, patience).map_err(what)?;
        made.push(a);
    }
    // What the agent says its QPs were given must be what the REPs said, both ways.
    let listed = ctx.agent.cm_connections()?;
    for (i, a) in made.iter().enumerate() {
        let q = a.rep.local_qpn;
        let Some(c) = listed.iter().find(|c| c.qpn == q && c.port == port) else {
            return Err(format!(
                "connection {}: the REP names QP 0x{:06x}, which the agent does not list for port {port}",
                i + 1,
                q.value()
            ));
        };
        if c.psn != a.rep.starting_psn || c.sq_psn != a.offer.psn {
            return Err(format!(
                "connection {}: the REP announces starting PSN {} and the REQ offered {}, but the agent's QP 0x{:06x} has rq_psn {} and sq_psn {}",
                i + 1,
                psn_text(a.rep.starting_psn),
                psn_text(a.offer.psn),
                q.value(),
                psn_text(c.psn),
                psn_text(c.sq_psn)
            ));
        }
    }
    Ok(made.iter().map(|a| a.rep.starting_psn.value()).collect())
}

/// A WRITE that must not land: at most `allowed` answers, memory as it was, then the real
/// PSN still works.
fn injected_write(ctx: &mut Ctx<'_>, psn_offset: i64, what: &str) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &[0x5a; 32])?;
    let e = c.peer_psn;
    let psn = if psn_offset >= 0 {
        e.add(psn_offset as u32)
    } else {
        e.sub((-psn_offset) as u32)
    };
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, psn)
        .reth(c.mr.addr, c.mr.rkey, 32)
        .payload(&[0xee; 32])
        .ack_req(true);
    ctx.peer.send(&w)?;
    let got = ctx.peer.collect(None);
    // Allowed: silence, one sequence NAK at the expected PSN, or a re-ACK that does not
    // acknowledge anything new (a PSN before the expected one).
    let harmless = got.len() <= 1
        && got.iter().all(|p| {
            (p.is_nak(NakCode::PsnSequenceError) && p.psn() == e)
                || (p.is_ack() && p.psn().is_before(e))
        });
    if !harmless {
        return Err(format!(
            "{what} (PSN {}, expected {}): got {}",
            psn_text(psn),
            psn_text(e),
            describe(&got)
        ));
    }
    if ctx.mr_bytes(&c, 0, 32)?.iter().any(|b| *b != 0x5a) {
        return Err(format!(
            "{what} (PSN {}): the WRITE reached memory",
            psn_text(psn)
        ));
    }
    let ok = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, e)
        .reth(c.mr.addr, c.mr.rkey, 8)
        .payload(&pattern(1, 8))
        .ack_req(true);
    ctx.peer.send(&ok)?;
    ctx.peer
        .expect_ack(e, "a WRITE at the expected PSN afterwards")?;
    Ok(())
}

fn inject_future_psn(ctx: &mut Ctx<'_>) -> Outcome {
    injected_write(ctx, 1 << 18, "a WRITE with a PSN 2^18 ahead")
}

fn inject_past_psn(ctx: &mut Ctx<'_>) -> Outcome {
    injected_write(ctx, -(1 << 18), "a WRITE with a PSN 2^18 behind")
}

fn from_address(mut c: Craft, src: IpAddr) -> Craft {
    match (&mut c.repr.ip, src) {
        (IpRepr::V4(r), IpAddr::V4(a)) => r.src = a,
        (IpRepr::V6(r), IpAddr::V6(a)) => r.src = a,
        _ => {}
    }
    c
}

fn inject_foreign_source(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    ctx.fill_mr(&c, 0, &[0x5a; 16])?;
    let w = ctx
        .req(&c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(c.mr.addr, c.mr.rkey, 16)
        .payload(&[0xee; 16])
        .ack_req(true);
    let other = match ctx.peer.ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) ^ 0x40)),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) ^ 0x40)),
    };
    ctx.peer.send(&from_address(w.clone(), other))?;
    ctx.peer.expect_silence(&format!(
        "a WRITE from {other} on a QP connected to {}",
        ctx.peer.ip
    ))?;
    if ctx.mr_bytes(&c, 0, 16)?.iter().any(|b| *b != 0x5a) {
        return Err(format!("a WRITE from {other} reached memory"));
    }
    ctx.peer.send(&w)?;
    ctx.peer
        .expect_ack(c.peer_psn, "the same WRITE from the connected address")?;
    Ok(())
}

fn refused_write(
    ctx: &mut Ctx<'_>,
    c: &crate::scenario::Conn,
    va: u64,
    rkey: RKey,
    codes: &[NakCode],
    what: &str,
) -> Result<(), String> {
    let w = ctx
        .req(c, Opcode::RC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(va, rkey, 16)
        .payload(&[0xee; 16])
        .ack_req(true);
    ctx.peer.send(&w)?;
    let got = ctx.peer.collect(None);
    let ok =
        got.len() == 1 && codes.iter().any(|k| got[0].is_nak(*k)) && got[0].psn() == c.peer_psn;
    if !ok {
        return Err(format!(
            "{what}: expected one NAK ({}) at PSN {}, got {}",
            codes
                .iter()
                .map(|k| format!("{k:?}"))
                .collect::<Vec<_>>()
                .join(" or "),
            psn_text(c.peer_psn),
            describe(&got)
        ));
    }
    Ok(())
}

fn qp_without_remote_write(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..Default::default()
    })?;
    ctx.fill_mr(&c, 0, &[0x5a; 16])?;
    refused_write(
        ctx,
        &c,
        c.mr.addr,
        c.mr.rkey,
        &[NakCode::InvalidRequest, NakCode::RemoteAccessError],
        "a WRITE to a QP without REMOTE_WRITE",
    )?;
    if ctx.mr_bytes(&c, 0, 16)?.iter().any(|b| *b != 0x5a) {
        return Err("a WRITE to a QP without REMOTE_WRITE reached memory".into());
    }
    Ok(())
}

fn other_pd(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let pd2 = ctx.agent.alloc_pd()?;
    let m2 = ctx.agent.reg_mr(pd2, 4096, Access::ALL)?;
    ctx.agent.write_mr(m2.lkey, 0, &[0x5a; 16])?;
    refused_write(
        ctx,
        &c,
        m2.addr,
        m2.rkey,
        &[NakCode::RemoteAccessError],
        "a WRITE with another PD's R_Key",
    )?;
    if ctx
        .agent
        .read_mr(m2.lkey, 0, 16)?
        .iter()
        .any(|b| *b != 0x5a)
    {
        return Err("a WRITE with another PD's R_Key reached that MR".into());
    }
    Ok(())
}

fn deregistered_rkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts::default())?;
    let m2 = ctx.agent.reg_mr(c.pd, 4096, Access::ALL)?;
    ctx.agent.dereg_mr(m2.lkey)?;
    refused_write(
        ctx,
        &c,
        m2.addr,
        m2.rkey,
        &[NakCode::RemoteAccessError],
        "a WRITE with a deregistered MR's R_Key",
    )
}

#[cfg(test)]
mod tests {
    use super::guessable;

    #[test]
    fn sequential_keys_are_guessable_random_ones_are_not() {
        // rxe-like keys: an index in the upper 24 bits, a random byte below.
        let seq: Vec<u32> = (0..32u32)
            .map(|i| ((0x100 + i) << 8) | (i * 37 % 256))
            .collect();
        assert!(guessable(&seq, 1 << 32, 1 << 16) > 24);
        let mut x = 0x1234_5678u32;
        let rnd: Vec<u32> = (0..32)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x
            })
            .collect();
        assert!(guessable(&rnd, 1 << 32, 1 << 16) <= 2);
    }

    #[test]
    fn psns_counting_up_across_the_wrap_are_guessable() {
        // A CM that adds a stride of 0x1000 from near 2^24: the wrap does not hide the step.
        let mut p = 0xff_8000u32;
        let seq: Vec<u32> = (0..32)
            .map(|_| {
                let v = p;
                p = rocemu_wire::Psn::new(p).add(0x1000).value();
                v
            })
            .collect();
        assert_eq!(guessable(&seq, 1 << 24, 1 << 10), 31);
        let mut x = 0x9e37_79b9u32;
        let rnd: Vec<u32> = (0..32)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x & 0xff_ffff
            })
            .collect();
        assert!(guessable(&rnd, 1 << 24, 1 << 10) <= 1);
    }
}
