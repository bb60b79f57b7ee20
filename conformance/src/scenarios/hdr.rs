//! Header validation (IBTA Annex A17.3.3 and A17.3.4; Vol. 1 9.6.1.1 unverified): packets that fail
//! it are dropped without a word, and the QP goes on as if they never came. Every scenario sends
//! the bad packet first, then the same packet made right, which must be accepted: a device that
//! drops everything does not pass.
use crate::cite;
use crate::peer::Craft;
use crate::scenario::{pattern, psn_text, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_wire::{NakCode, Opcode, PKey, Qpn};

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        id: "hdr.icrc.bad-silent-drop",
        title: "A SEND with a wrong ICRC is dropped silently; the same SEND with the right one is accepted",
        cites: &[cite::A17_ICRC, cite::A17_DROP],
        run: icrc_bad,
    },
    Scenario {
        id: "hdr.tver.nonzero-silent-drop",
        title: "A SEND with BTH TVer=1 is dropped silently",
        cites: &[cite::BTH, cite::A17_VALIDATE, cite::HDR_VALIDATION],
        run: tver_nonzero,
    },
    Scenario {
        id: "hdr.pkey.mismatch-silent-drop",
        title: "A SEND with a P_Key outside the QP's partition (0x1234) is dropped silently",
        cites: &[cite::PKEY_C9_43, cite::A17_PKEY, cite::PKEY_CHECK],
        run: pkey_mismatch,
    },
    Scenario {
        id: "hdr.dqpn.unknown-silent-drop",
        title: "A SEND to a QPN that does not exist is dropped silently",
        cites: &[cite::A17_VALIDATE, cite::HDR_VALIDATION],
        run: dqpn_unknown,
    },
    Scenario {
        id: "hdr.opcode.uc-on-rc-silent-drop",
        title: "A UC opcode sent to an RC QP is dropped silently",
        cites: &[cite::A17_VALIDATE, cite::HDR_VALIDATION],
        run: uc_on_rc,
    },
    Scenario {
        id: "hdr.pad.stripped",
        title: "A 5-byte SEND with pad count 3 delivers exactly 5 bytes; the pad bytes reach no memory",
        cites: &[cite::BTH],
        run: pad_stripped,
    },
    Scenario {
        id: "hdr.pad.first-short-nak",
        title: "A SEND FIRST carrying less than the path MTU (pad count 3) is NAKed invalid request",
        cites: &[cite::LENGTH_VALIDATION, cite::LENGTH_C9_92, cite::BTH],
        run: first_short,
    },
    Scenario {
        id: "hdr.ipv4.bad-checksum-silent-drop",
        title: "A SEND whose IPv4 header checksum is wrong (ICRC right: it masks the checksum) is dropped silently",
        cites: &[cite::A17_IPV4, cite::A17_DROP, cite::A17_ICRC],
        run: ipv4_bad_checksum,
    },
    Scenario {
        id: "hdr.udp.other-port-ignored",
        title: "A RoCEv2 packet sent to UDP port 4792 instead of 4791 is not taken for RoCEv2",
        cites: &[cite::A17_UDP_DPORT, cite::A17_DROP],
        run: udp_other_port,
    },
    Scenario {
        id: "hdr.ip.other-destination-ignored",
        title: "A SEND to another IP address (the device's MAC, the right QPN) is ignored",
        cites: &[cite::A17_ADDR, cite::ADDR_VALIDATION],
        run: ip_other_destination,
    },
    Scenario {
        id: "hdr.pkey.limited-member-accepted",
        title: "A SEND with P_Key 0x7fff (limited member of the default partition) is accepted by a full member",
        cites: &[cite::PKEY_C9_43, cite::PKEY_MATCHING],
        run: pkey_limited_member,
    },
];

/// The scenario shape of this module: `bad(good)` is dropped silently, `good` is accepted.
fn drop_then_accept(ctx: &mut Ctx<'_>, what: &str, bad: impl FnOnce(Craft) -> Craft) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let data = pattern(0x31, 32);
    let good = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&bad(good.clone()))?;
    ctx.peer
        .expect_silence(&format!("a SEND_ONLY with {what}"))?;
    ctx.expect_no_wc(&c, &format!("a SEND_ONLY with {what}"))?;
    ctx.peer.send(&good)?;
    ctx.peer
        .expect_ack(c.peer_psn, "the same SEND_ONLY made right")?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "the same SEND_ONLY made right",
    )?;
    if wc.byte_len != 32 {
        return Err(format!(
            "receive completed with byte_len {}, expected 32",
            wc.byte_len
        ));
    }
    Ok(())
}

fn icrc_bad(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "a wrong ICRC", |c| c.bad_icrc())
}

fn tver_nonzero(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "TVer=1", |c| c.tver(1))
}

fn pkey_mismatch(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "P_Key 0x1234", |c| c.pkey(PKey(0x1234)))
}

fn dqpn_unknown(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "an unknown destination QP", |mut c| {
        // Flipping the top bit gives a QPN no QP of this test has.
        let q = c.repr.bth.dqpn.value() ^ 0x80_0000;
        c.repr.bth.dqpn = Qpn::new(q);
        c
    })
}

fn uc_on_rc(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "the UC opcode UC_SEND_ONLY", |mut c| {
        c.repr.bth.opcode = Opcode::UC_SEND_ONLY;
        c
    })
}

fn pad_stripped(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    ctx.fill_mr(&c, 0, &[0xaa; 16])?;
    let data = pattern(0x51, 5);
    let req = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&data)
        .ack_req(true);
    if req.build()?.len() % 4 != 2 {
        // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + 8 (payload + pad) + ICRC 4: a multiple of 4 plus
        // 2.
        return Err("the peer did not pad the SEND to a multiple of 4".into());
    }
    ctx.peer.send(&req)?;
    ctx.peer.expect_ack(c.peer_psn, "a 5-byte SEND_ONLY")?;
    let wc = ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a 5-byte SEND_ONLY",
    )?;
    if wc.byte_len != 5 {
        return Err(format!(
            "a 5-byte SEND with pad count 3 completed with byte_len {} (pad bytes counted?)",
            wc.byte_len
        ));
    }
    let mem = ctx.mr_bytes(&c, 0, 8)?;
    let mut want = data.clone();
    want.extend_from_slice(&[0xaa; 3]);
    if mem != want {
        return Err(format!(
            "receive buffer holds {mem:02x?}, expected {want:02x?} (5 bytes, then untouched)"
        ));
    }
    Ok(())
}

fn first_short(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        recv_len: 4096,
        ..Default::default()
    })?;
    let data = pattern(0x61, c.mtu as usize - 3);
    let req = ctx
        .req(&c, Opcode::RC_SEND_FIRST, c.peer_psn)
        .payload(&data)
        .ack_req(true);
    ctx.peer.send(&req)?;
    let got = ctx.peer.collect(None);
    let naks: Vec<_> = got
        .iter()
        .filter(|p| p.is_nak(NakCode::InvalidRequest) && p.psn() == c.peer_psn)
        .collect();
    if naks.len() != 1 || got.len() != 1 {
        return Err(format!(
            "expected exactly one NAK invalid request at PSN {} for a {}-byte SEND_FIRST, got {}",
            psn_text(c.peer_psn),
            data.len(),
            crate::peer::describe(&got)
        ));
    }
    Ok(())
}

fn ipv4_bad_checksum(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let good = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x71, 16))
        .ack_req(true);
    let rocemu_wire::frame::IpRepr::V4(_) = good.repr.ip else {
        return Err("IPv4 only: the device's address is IPv6".into());
    };
    let mut bad = good.build()?;
    // Ethernet (14) + the checksum's offset in the IPv4 header (10).
    bad[24] ^= 0x5a;
    ctx.peer.send_raw(&bad);
    ctx.peer
        .expect_silence("a SEND_ONLY with a wrong IPv4 header checksum")?;
    ctx.peer.send(&good)?;
    ctx.peer
        .expect_ack(c.peer_psn, "the same SEND_ONLY with the right checksum")?;
    Ok(())
}

fn udp_other_port(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "UDP destination port 4792", |mut c| {
        c.repr.dport = 4792;
        c
    })
}

fn ip_other_destination(ctx: &mut Ctx<'_>) -> Outcome {
    drop_then_accept(ctx, "another destination IP address", |mut c| {
        match &mut c.repr.ip {
            rocemu_wire::frame::IpRepr::V4(r) => {
                r.dst = std::net::Ipv4Addr::from(u32::from(r.dst) ^ 0x80)
            }
            rocemu_wire::frame::IpRepr::V6(r) => {
                r.dst = std::net::Ipv6Addr::from(u128::from(r.dst) ^ 0x80)
            }
        }
        c
    })
}

fn pkey_limited_member(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 1,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x72, 16))
        .ack_req(true)
        .pkey(PKey(0x7fff));
    ctx.peer.send(&r)?;
    ctx.peer
        .expect_ack(c.peer_psn, "a SEND_ONLY with P_Key 0x7fff")?;
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a SEND_ONLY with P_Key 0x7fff",
    )?;
    Ok(())
}
