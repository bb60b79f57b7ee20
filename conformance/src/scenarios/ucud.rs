//! UC (IBTA 9.8.2, unverified): no acknowledgements ever, a PSN gap or a broken sequence drops
//! the message in progress, a bad R_Key is dropped silently; UD (9.8.3, unverified; DETH 9.3.2):
//! what the device's UD SEND carries, the controlled Q_Key, immediates, the GRH area (A17.4.5.2)
//! and a receive too short. Citations: `crate::cite`.
use crate::agent::{Ah, SendOpcode, SendWr, Sge, UdDest};
use crate::cite;
use crate::peer::describe;
use crate::scenario::{pattern, psn_text, wcs_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::{Access, QpState, QpType};
use rocemu_wire::{Opcode, Psn, QKey, RKey};
use std::net::IpAddr;

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "uc.send.never-acked",
        title: "Two UC SENDs with AckReq set are delivered and get no answer at all",
        cites: &[cite::UC_NO_ACK],
        run: uc_never_acked,
    },
    Scenario {
        id: "uc.psn-gap.drops-rest-of-message",
        title: "UC SEND FIRST, its MIDDLE lost, LAST: the message is dropped silently; the next SEND ONLY is delivered whole",
        cites: &[cite::UC_DROP, cite::UC_NO_ACK],
        run: uc_gap,
    },
    Scenario {
        id: "uc.middle-without-first-dropped",
        title: "A UC SEND MIDDLE without a FIRST is dropped silently, the QP stays in RTS, the next SEND ONLY is delivered",
        cites: &[cite::UC_DROP, cite::OPCODE_SEQUENCE],
        run: uc_middle_without_first,
    },
    Scenario {
        id: "uc.write.bad-rkey-silent-drop",
        title: "A UC RDMA WRITE with an unknown R_Key is dropped silently: no answer, memory untouched, the QP stays in RTS",
        cites: &[cite::UC_ERROR_SILENT, cite::RKEY_VALIDATION],
        run: uc_bad_rkey,
    },
    Scenario {
        id: "ud.send.deth-qkey-and-source-qp",
        title: "The device's UD SEND goes to the WR's QPN with the WR's Q_Key and its own QPN as source in the DETH",
        cites: &[cite::DETH, cite::UD_RULES],
        run: ud_send_deth,
    },
    Scenario {
        id: "ud.qkey.controlled-uses-qp-qkey",
        title: "A UD send whose WR Q_Key has the high bit set (0x80000000) carries the QP's own Q_Key",
        cites: &[cite::CONTROLLED_QKEY, cite::DETH],
        run: ud_controlled_qkey,
    },
    Scenario {
        id: "ud.send-imm.delivers-imm",
        title: "A UD SEND ONLY with immediate completes its receive with the immediate, IBV_WC_WITH_IMM and the source QP",
        cites: &[cite::IMMDT, cite::DETH, cite::POLL_CQ],
        run: ud_send_imm,
    },
    Scenario {
        id: "ud.recv.grh-ipv4-at-offset-20",
        title: "A UD receive over IPv4: the 40-byte GRH area holds the datagram's IPv4 header in its last 20 bytes, the payload after it",
        cites: &[cite::A17_UD_GRH, cite::POLL_CQ],
        run: ud_grh,
    },
    Scenario {
        id: "ud.recv.too-short-loc-len-err",
        title: "A 32-byte UD SEND into a receive of 40 + 16 bytes completes it IBV_WC_LOC_LEN_ERR",
        cites: &[cite::A17_UD_GRH, cite::UD_RULES, cite::LOCAL_LENGTH_ERROR],
        run: ud_short_receive,
    },
];

fn uc(recvs: u32, recv_len: u32) -> ConnOpts {
    ConnOpts {
        qp_type: QpType::Uc,
        qp_access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        recvs,
        recv_len,
        ..Default::default()
    }
}

fn uc_never_acked(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(uc(2, 64))?;
    for k in 0..2 {
        let r = ctx
            .req(&c, Opcode::UC_SEND_ONLY, c.peer_psn.add(k))
            .payload(&pattern(0x50 + k as u8, 8))
            .ack_req(true);
        ctx.peer.send(&r)?;
    }
    ctx.peer.expect_silence("two UC SEND_ONLY with AckReq")?;
    let w = ctx.wcs(&c, 2)?;
    if w.len() != 2 || !w.iter().all(|x| x.is_success() && x.byte_len == 8) {
        return Err(format!(
            "two 8-byte UC SENDs: expected two receives of 8 bytes, got {}",
            wcs_text(&w)
        ));
    }
    Ok(())
}

/// After what came before was dropped: an 8-byte UC SEND ONLY at `psn` is delivered as the only
/// completion, its bytes at the start of the receive buffer, and nothing is sent back.
fn uc_next_delivered(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, what: &str) -> Outcome {
    let data = pattern(0x5f, 8);
    let r = ctx
        .req(c, Opcode::UC_SEND_ONLY, psn)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&r)?;
    ctx.peer.expect_silence(what)?;
    let w = ctx.wcs(c, 1)?;
    match w.as_slice() {
        [x] if x.is_success() && x.byte_len == 8 => {}
        _ => {
            return Err(format!(
                "{what}, then an 8-byte SEND_ONLY at {}: expected one completion, that SEND's (byte_len 8), got {}",
                psn_text(psn),
                wcs_text(&w)
            ))
        }
    }
    if ctx.mr_bytes(c, 0, 8)? != data {
        return Err(format!(
            "{what}: the SEND_ONLY after it did not land at the start of its receive"
        ));
    }
    ctx.expect_state(c, QpState::Rts, what)
}

fn uc_gap(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(uc(2, 4096))?;
    let e = c.peer_psn;
    let m = c.mtu as usize;
    let first = ctx
        .req(&c, Opcode::UC_SEND_FIRST, e)
        .payload(&pattern(0x51, m));
    let last = ctx
        .req(&c, Opcode::UC_SEND_LAST, e.add(2))
        .payload(&pattern(0x52, 100))
        .ack_req(true);
    ctx.peer.send(&first)?;
    ctx.peer.send(&last)?;
    ctx.peer
        .expect_silence("a UC SEND FIRST and LAST with the MIDDLE missing")?;
    ctx.expect_no_wc(&c, "a UC SEND whose MIDDLE was lost")?;
    uc_next_delivered(ctx, &c, e.add(3), "a UC SEND cut by a PSN gap")
}

fn uc_middle_without_first(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(uc(1, 2048))?;
    let e = c.peer_psn;
    let mid = ctx
        .req(&c, Opcode::UC_SEND_MIDDLE, e)
        .payload(&pattern(0x53, c.mtu as usize))
        .ack_req(true);
    ctx.peer.send(&mid)?;
    ctx.peer
        .expect_silence("a UC SEND MIDDLE without a FIRST")?;
    ctx.expect_no_wc(&c, "a UC SEND MIDDLE without a FIRST")?;
    uc_next_delivered(ctx, &c, e.add(1), "a UC SEND MIDDLE without a FIRST")
}

fn uc_bad_rkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(uc(1, 64))?;
    ctx.fill_mr(&c, 1024, &[0x5a; 16])?;
    let bad = RKey(c.mr.rkey.0 ^ 0x0100_0080);
    let w = ctx
        .req(&c, Opcode::UC_RDMA_WRITE_ONLY, c.peer_psn)
        .reth(c.mr.addr + 1024, bad, 16)
        .payload(&pattern(0x54, 16))
        .ack_req(true);
    ctx.peer.send(&w)?;
    ctx.peer
        .expect_silence("a UC RDMA_WRITE_ONLY with an unknown R_Key")?;
    if ctx.mr_bytes(&c, 1024, 16)?.iter().any(|b| *b != 0x5a) {
        return Err("a UC WRITE with an unknown R_Key changed memory".into());
    }
    uc_next_delivered(
        ctx,
        &c,
        c.peer_psn.add(1),
        "a UC WRITE with an unknown R_Key",
    )
}

fn ud(recvs: u32, recv_len: u32) -> ConnOpts {
    ConnOpts {
        qp_type: QpType::Ud,
        recvs,
        recv_len,
        ..Default::default()
    }
}

/// The device sends one 8-byte UD SEND to the peer's QP with `qkey` in the WR; returns the
/// DETH's (Q_Key, source QPN) after checking the packet's opcode, destination and payload.
fn ud_device_send(ctx: &mut Ctx<'_>, c: &Conn, qkey: QKey) -> Result<(QKey, u32), String> {
    let data = pattern(0x60, 8);
    ctx.fill_mr(c, 0, &data)?;
    let mut wr = SendWr::new(
        5,
        SendOpcode::Send,
        vec![Sge {
            addr: c.mr.addr,
            length: 8,
            lkey: c.mr.lkey,
        }],
    );
    wr.ud = Some(UdDest {
        ah: Ah {
            sgid_index: ctx.sgid_index(),
            ..Ah::to(ctx.peer.ip)
        },
        remote_qpn: c.peer_qpn,
        remote_qkey: qkey,
    });
    ctx.agent.post_send(c.qpn, wr)?;
    let got = ctx.peer.collect(None);
    let deth = match got.as_slice() {
        [p] if p.opcode() == Opcode::UD_SEND_ONLY
            && p.bth.dqpn == c.peer_qpn
            && p.payload == data =>
        {
            p.ext.deth
        }
        _ => None,
    };
    let Some(d) = deth else {
        return Err(format!(
            "a UD send of 8 bytes to QP {}: expected one UD_SEND_ONLY with a DETH and the 8 bytes, got {}",
            c.peer_qpn,
            describe(&got)
        ));
    };
    ctx.expect_wc(c, "IBV_WC_SUCCESS", Some("IBV_WC_SEND"), "a UD send")?;
    Ok((d.qkey, d.src_qpn.value()))
}

fn ud_send_deth(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(0, 64))?;
    let (qkey, src) = ud_device_send(ctx, &c, QKey(0x2345_6789))?;
    if qkey != QKey(0x2345_6789) || src != c.qpn.value() {
        return Err(format!(
            "a UD send with Q_Key 0x23456789 from QP {}: the DETH carries Q_Key 0x{:08x} and source QP 0x{src:06x}",
            c.qpn, qkey.0
        ));
    }
    Ok(())
}

fn ud_controlled_qkey(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(0, 64))?;
    let (qkey, _) = ud_device_send(ctx, &c, QKey(0x8000_0000))?;
    if qkey != c.qkey {
        return Err(format!(
            "a UD send with the controlled Q_Key 0x80000000: expected the QP's Q_Key 0x{:08x} in the DETH, got 0x{:08x}",
            c.qkey.0, qkey.0
        ));
    }
    Ok(())
}

/// A UD SEND from the peer's QP to the device's, with the connection's Q_Key.
fn ud_req(ctx: &Ctx<'_>, c: &Conn, op: Opcode, data: &[u8]) -> crate::peer::Craft {
    ctx.req(c, op, Psn::new(0x77))
        .deth(c.qkey, c.peer_qpn)
        .payload(data)
}

fn ud_send_imm(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(1, 1024))?;
    let r = ud_req(
        ctx,
        &c,
        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        &pattern(0x61, 24),
    )
    .imm(0x0bad_cafe);
    ctx.peer.send(&r)?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a UD SEND with immediate",
    )?;
    if wc.imm_data != Some(0x0bad_cafe)
        || wc.wc_flags & 2 == 0
        || wc.byte_len != 40 + 24
        || wc.src_qp != c.peer_qpn
    {
        return Err(format!(
            "expected imm_data 0x0badcafe, IBV_WC_WITH_IMM, byte_len 64 (GRH + 24), src_qp {}, got {:?}, wc_flags {:#x}, byte_len {}, src_qp {}",
            c.peer_qpn,
            wc.imm_data.map(|i| format!("0x{i:08x}")),
            wc.wc_flags,
            wc.byte_len,
            wc.src_qp
        ));
    }
    Ok(())
}

fn ud_grh(ctx: &mut Ctx<'_>) -> Outcome {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (ctx.peer.ip, ctx.peer.dut_ip) else {
        return Err("this scenario needs IPv4 addresses for the peer and the device".into());
    };
    let c = ctx.connect(ud(1, 1024))?;
    ctx.fill_mr(&c, 0, &[0xee; 40])?;
    let data = pattern(0x62, 32);
    ctx.peer
        .send(&ud_req(ctx, &c, Opcode::UD_SEND_ONLY, &data))?;
    let wc = ctx.expect_wc(&c, "IBV_WC_SUCCESS", Some("IBV_WC_RECV"), "a UD SEND")?;
    if wc.byte_len != 72 {
        return Err(format!("expected byte_len 72 (GRH + 32), got {wc}"));
    }
    let b = ctx.mr_bytes(&c, 0, 72)?;
    let ip = &b[20..40];
    let ok = ip[0] == 0x45 && ip[12..16] == src.octets() && ip[16..20] == dst.octets();
    if !ok || b[40..] != data[..] {
        return Err(format!(
            "expected bytes 20..40 an IPv4 header (0x45 …) from {src} to {dst} and the 32 bytes at 40, got {:02x?} then {}",
            ip,
            if b[40..] == data[..] {
                "the payload"
            } else {
                "something else than the payload"
            }
        ));
    }
    Ok(())
}

fn ud_short_receive(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ud(1, 40 + 16))?;
    ctx.peer
        .send(&ud_req(ctx, &c, Opcode::UD_SEND_ONLY, &pattern(0x63, 32)))?;
    ctx.expect_wc(
        &c,
        "IBV_WC_LOC_LEN_ERR",
        None,
        "a 32-byte UD SEND into a receive of 40 + 16 bytes",
    )?;
    Ok(())
}
