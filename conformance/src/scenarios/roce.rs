//! RoCEv2 itself (Annex A17): the IPv6 twins of the header scenarios, the IP and UDP headers a
//! device must drop, accept or send, and congestion notification (ECN marks answered by CNPs,
//! A17.9.3). Every drop scenario sends the bad packet first and the same packet made right after,
//! which must be accepted: a device that drops everything does not pass.
use crate::agent::{Ah, ModifyQp};
use crate::cite;
use crate::peer::{describe, Craft, Pkt};
use crate::scenario::{pattern, psn_text, Conn, ConnOpts, Ctx, Outcome, Scenario};
use rocemu_emulator::rnic::QpState;
use rocemu_wire::frame::IpRepr;
use rocemu_wire::{parse_frame, Opcode, PKey, Psn, Qpn};
use std::net::IpAddr;

/// Runs the `hdr.` scenario `id` with the peer and the device on IPv6.
fn over_ipv6(ctx: &mut Ctx<'_>, id: &str) -> Outcome {
    ctx.use_ipv6()?;
    let sc = crate::scenarios::hdr::SCENARIOS
        .iter()
        .find(|s| s.id == id)
        .ok_or_else(|| format!("no scenario {id} to run over IPv6"))?;
    (sc.run)(ctx)
}

macro_rules! twins {
    ($($f:ident => $id:literal),* $(,)?) => {
        $(fn $f(ctx: &mut Ctx<'_>) -> Outcome { over_ipv6(ctx, $id) })*
    };
}

twins! {
    v6_icrc => "hdr.icrc.bad-silent-drop",
    v6_tver => "hdr.tver.nonzero-silent-drop",
    v6_pkey => "hdr.pkey.mismatch-silent-drop",
    v6_dqpn => "hdr.dqpn.unknown-silent-drop",
    v6_uc_on_rc => "hdr.opcode.uc-on-rc-silent-drop",
    v6_pad => "hdr.pad.stripped",
    v6_first_short => "hdr.pad.first-short-nak",
    v6_udp_port => "hdr.udp.other-port-ignored",
    v6_other_dst => "hdr.ip.other-destination-ignored",
    v6_limited => "hdr.pkey.limited-member-accepted",
}

pub const SCENARIOS: &[Scenario] = &[
    // ---- IPv6 twins of the hdr. scenarios ----
    Scenario {
        id: "hdr.ipv6.icrc.bad-silent-drop",
        title: "Over IPv6: a SEND with a wrong ICRC is dropped silently; the same SEND with the right one is accepted",
        cites: &[cite::A17_BOTH_IP, cite::A17_ICRC, cite::A17_DROP],
        run: v6_icrc,
    },
    Scenario {
        id: "hdr.ipv6.tver.nonzero-silent-drop",
        title: "Over IPv6: a SEND with BTH TVer=1 is dropped silently",
        cites: &[cite::A17_BOTH_IP, cite::BTH, cite::A17_VALIDATE],
        run: v6_tver,
    },
    Scenario {
        id: "hdr.ipv6.pkey.mismatch-silent-drop",
        title: "Over IPv6: a SEND with a P_Key outside the QP's partition (0x1234) is dropped silently",
        cites: &[cite::A17_BOTH_IP, cite::PKEY_C9_43, cite::A17_PKEY],
        run: v6_pkey,
    },
    Scenario {
        id: "hdr.ipv6.dqpn.unknown-silent-drop",
        title: "Over IPv6: a SEND to a QPN that does not exist is dropped silently",
        cites: &[cite::A17_BOTH_IP, cite::A17_VALIDATE],
        run: v6_dqpn,
    },
    Scenario {
        id: "hdr.ipv6.opcode.uc-on-rc-silent-drop",
        title: "Over IPv6: a UC opcode sent to an RC QP is dropped silently",
        cites: &[cite::A17_BOTH_IP, cite::A17_VALIDATE],
        run: v6_uc_on_rc,
    },
    Scenario {
        id: "hdr.ipv6.pad.stripped",
        title: "Over IPv6: a 5-byte SEND with pad count 3 delivers exactly 5 bytes",
        cites: &[cite::A17_BOTH_IP, cite::BTH],
        run: v6_pad,
    },
    Scenario {
        id: "hdr.ipv6.pad.first-short-nak",
        title: "Over IPv6: a SEND FIRST carrying less than the path MTU is NAKed invalid request",
        cites: &[cite::A17_BOTH_IP, cite::LENGTH_VALIDATION, cite::LENGTH_C9_92],
        run: v6_first_short,
    },
    Scenario {
        id: "hdr.ipv6.udp.other-port-ignored",
        title: "Over IPv6: a RoCEv2 packet sent to UDP port 4792 is not taken for RoCEv2",
        cites: &[cite::A17_BOTH_IP, cite::A17_UDP_DPORT, cite::A17_DROP],
        run: v6_udp_port,
    },
    Scenario {
        id: "hdr.ipv6.ip.other-destination-ignored",
        title: "Over IPv6: a SEND to another IPv6 address (the device's MAC, the right QPN) is ignored",
        cites: &[cite::A17_BOTH_IP, cite::A17_ADDR, cite::ADDR_VALIDATION],
        run: v6_other_dst,
    },
    Scenario {
        id: "hdr.ipv6.pkey.limited-member-accepted",
        title: "Over IPv6: a SEND with P_Key 0x7fff (limited member) is accepted by a full member",
        cites: &[cite::A17_BOTH_IP, cite::PKEY_C9_43, cite::PKEY_MATCHING],
        run: v6_limited,
    },
    // ---- inbound IP and BTH headers ----
    Scenario {
        id: "hdr.ip.version-mismatch-silent-drop",
        title: "An IPv4 frame (Ethertype 0x0800) whose IP version field says 6 is dropped silently",
        cites: &[cite::A17_IP_VERSION, cite::A17_DROP],
        run: version_in_v4,
    },
    Scenario {
        id: "hdr.ipv6.version-mismatch-silent-drop",
        title: "An IPv6 frame (Ethertype 0x86DD) whose IP version field says 4 is dropped silently",
        cites: &[cite::A17_IP_VERSION, cite::A17_DROP],
        run: version_in_v6,
    },
    Scenario {
        id: "hdr.ip.ipv6-to-ipv4-qp-silent-drop",
        title: "A SEND over IPv6 to an RC QP connected over IPv4 (right QPN and PSN) is dropped silently",
        cites: &[cite::A17_ADDR, cite::ADDR_VALIDATION],
        run: v6_to_v4_qp,
    },
    Scenario {
        id: "hdr.ipv4.fragment-more-silent-drop",
        title: "A SEND in an IPv4 datagram with More Fragments set is dropped silently",
        cites: &[cite::A17_IPV4_NO_FRAGMENT, cite::A17_DROP],
        run: fragment_more,
    },
    Scenario {
        id: "hdr.ipv4.fragment-offset-silent-drop",
        title: "A SEND in an IPv4 datagram with a fragment offset of 8 bytes is dropped silently",
        cites: &[cite::A17_IPV4_NO_FRAGMENT, cite::A17_DROP],
        run: fragment_offset,
    },
    Scenario {
        id: "hdr.dqpn.zero-silent-drop",
        title: "A SEND to QP0 is dropped silently (no QP0 on a RoCEv2 port)",
        cites: &[cite::A17_QP0],
        run: dqpn_zero,
    },
    Scenario {
        id: "hdr.transit.ipv4-ttl-tos-rewritten-accepted",
        title: "A SEND whose IPv4 TTL, DSCP and ECN (ECT(1)) were rewritten in transit is accepted: the ICRC masks them",
        cites: &[cite::A17_ICRC],
        run: transit_v4,
    },
    Scenario {
        id: "hdr.transit.ipv6-tclass-flow-hop-rewritten-accepted",
        title: "A SEND whose IPv6 traffic class, flow label and hop limit were rewritten in transit is accepted",
        cites: &[cite::A17_ICRC, cite::A17_BOTH_IP],
        run: transit_v6,
    },
    Scenario {
        id: "hdr.transit.udp-checksum-accepted",
        title: "A SEND with a valid non-zero UDP checksum (filled in on the way) is accepted: the ICRC masks it",
        cites: &[cite::A17_ICRC, cite::A17_UDP_CHECKSUM],
        run: transit_udp_checksum,
    },
    Scenario {
        id: "hdr.bth.fecn-becn-request-accepted",
        title: "A SEND with the BTH FECN and BECN bits set is accepted as if they were clear",
        cites: &[cite::A17_FECN_BECN],
        run: fecn_becn,
    },
    // ---- what the device sends ----
    Scenario {
        id: "hdr.out.ipv4-ihl-df-no-fragment",
        title: "The device's IPv4 packets (ACKs, READ responses) have IHL 5, DF set, MF clear, fragment offset 0, protocol UDP",
        cites: &[cite::A17_IHL, cite::A17_IPV4_NO_FRAGMENT, cite::A17_IPV4],
        run: out_ihl_df,
    },
    Scenario {
        id: "hdr.out.ipv4-ttl-dscp-from-av",
        title: "The device's IPv4 packets carry the QP's address vector: TTL = hop limit 17, DSCP = traffic class 0x60 >> 2",
        cites: &[cite::A17_HOP_LIMIT, cite::A17_DSCP],
        run: out_ttl_dscp,
    },
    Scenario {
        id: "hdr.out.ecn-never-ce",
        title: "The device never sends a packet marked CE (ECN '11'): '00' without congestion management, '01'/'10' with it",
        cites: &[cite::A17_ECN_SENT],
        run: out_ecn,
    },
    Scenario {
        id: "hdr.out.ipv4-udp-lengths",
        title: "The device's IPv4 total length and UDP length run exactly to the end of the ICRC",
        cites: &[cite::A17_LENGTHS],
        run: out_lengths,
    },
    Scenario {
        id: "hdr.out.udp-checksum-zero",
        title: "The device's UDP checksum is 0",
        cites: &[cite::A17_UDP_CHECKSUM],
        run: out_udp_checksum,
    },
    Scenario {
        id: "hdr.out.udp-sport-fixed-per-qp",
        title: "Every packet of one RC QP (ACKs, a 3-packet READ response) carries the same UDP source port",
        cites: &[cite::A17_UDP_SPORT],
        run: out_sport,
    },
    Scenario {
        id: "hdr.out.ipv6-header",
        title: "The device's IPv6 packets: next header UDP, hop limit and traffic class from the address vector, payload and UDP lengths to the end of the ICRC",
        cites: &[cite::A17_IPV6, cite::A17_HOP_LIMIT, cite::A17_DSCP, cite::A17_LENGTHS],
        run: out_ipv6,
    },
    // ---- ECN and CNP ----
    Scenario {
        id: "cnp.ce-marked-answered",
        title: "A SEND marked CE (ECN '11') is executed and answered by a CNP in the Figure 6 format to the sender's QP",
        cites: &[cite::A17_CNP, cite::A17_CNP_FORMAT],
        run: cnp_answered,
    },
    Scenario {
        id: "cnp.ipv6.ce-marked-answered",
        title: "Over IPv6: a SEND marked CE is answered by a CNP in the Figure 6 format",
        cites: &[cite::A17_CNP, cite::A17_CNP_FORMAT, cite::A17_BOTH_IP],
        run: cnp_answered_v6,
    },
    Scenario {
        id: "cnp.pkey-of-marked-packet",
        title: "The CNP for a CE-marked SEND with P_Key 0x7fff carries P_Key 0x7fff",
        cites: &[cite::A17_CNP_FORMAT],
        run: cnp_pkey,
    },
    Scenario {
        id: "cnp.ce-burst-bounded",
        title: "Four CE-marked SENDs back to back get at least one CNP and no more than four, all for the sender's QP",
        cites: &[cite::A17_CNP],
        run: cnp_burst,
    },
    Scenario {
        id: "cnp.ud.ce-marked-answered",
        title: "A UD SEND marked CE is delivered and answered by a CNP to the DETH's source QP",
        cites: &[cite::A17_CNP, cite::A17_CNP_FORMAT],
        run: cnp_ud,
    },
    Scenario {
        id: "ecn.ect-not-answered",
        title: "SENDs marked ECT(0) and ECT(1) (ECN '10', '01') get their ACKs and no CNP",
        cites: &[cite::A17_CNP],
        run: ect_no_cnp,
    },
    Scenario {
        id: "cnp.unknown-qp-ignored",
        title: "A CNP naming a QP that does not exist is dropped silently; the connection goes on",
        cites: &[cite::A17_CNP_REACTION, cite::A17_VALIDATE],
        run: cnp_unknown_qp,
    },
    Scenario {
        id: "cnp.to-qp-no-answer",
        title: "A CNP naming the device's QP gets no answer (no ACK, no NAK) and the QP goes on",
        cites: &[cite::A17_CNP_REACTION, cite::A17_CNP_FORMAT],
        run: cnp_known_qp,
    },
];

// ---- helpers ----

/// Ethernet header length (the peer sends untagged frames).
const ETH: usize = 14;

/// Recomputes the IPv4 header checksum (if IPv4) and the ICRC of a RoCEv2 frame after its bytes
/// were changed in place.
fn reseal(f: &mut [u8], icrc_too: bool) {
    let v6 = f[12..14] == [0x86, 0xdd];
    let hl = if v6 { 40 } else { (f[ETH] & 0x0f) as usize * 4 };
    if !v6 {
        f[ETH + 10..ETH + 12].fill(0);
        let c = rocemu_wire::ip::ipv4_checksum(&f[ETH..ETH + hl]);
        f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
    }
    if icrc_too {
        let l = f.len();
        let crc = rocemu_wire::icrc::compute(&f[ETH..l - 4], hl, v6);
        f[l - 4..].copy_from_slice(&rocemu_wire::icrc::to_wire(crc));
    }
}

/// A connection with one receive posted, and the SEND_ONLY (32 bytes, ACK requested) that must be
/// accepted at its first PSN.
fn conn_and_send(ctx: &mut Ctx<'_>) -> Result<(Conn, Craft), String> {
    let c = ctx.connect(ConnOpts {
        recvs: 2,
        ..Default::default()
    })?;
    let good = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn)
        .payload(&pattern(0x3c, 32))
        .ack_req(true);
    Ok((c, good))
}

/// The good SEND is ACKed and completes a 32-byte receive.
fn accepted(ctx: &mut Ctx<'_>, c: &Conn, psn: Psn, what: &str) -> Outcome {
    ctx.peer.expect_ack(psn, what)?;
    let wc = ctx.expect_wc(c, "IBV_WC_SUCCESS", Some("IBV_WC_RECV"), what)?;
    if wc.byte_len != 32 {
        return Err(format!(
            "{what}: the receive completed with byte_len {}, expected 32",
            wc.byte_len
        ));
    }
    Ok(())
}

/// `bad` (bytes) is dropped silently; then `good` is accepted.
fn raw_drop_then_accept(
    ctx: &mut Ctx<'_>,
    c: &Conn,
    bad: &[u8],
    good: &Craft,
    what: &str,
) -> Outcome {
    ctx.peer.send_raw(bad);
    ctx.peer.expect_silence(&format!("a SEND_ONLY {what}"))?;
    ctx.expect_no_wc(c, &format!("a SEND_ONLY {what}"))?;
    ctx.peer.send(good)?;
    accepted(ctx, c, good.psn(), "the same SEND_ONLY made right")
}

/// The device's IPv6 GID under test (not an IPv4-mapped one).
fn dut_ipv6(ctx: &Ctx<'_>) -> Result<IpAddr, String> {
    ctx.dev
        .gids
        .iter()
        .copied()
        .find(|g| matches!(g, IpAddr::V6(a) if a.to_ipv4_mapped().is_none()))
        .ok_or_else(|| format!("the device has no IPv6 GID (GIDs {:?})", ctx.dev.gids))
}

/// A connection whose QP's address vector has `hop_limit` and `traffic_class`.
fn connect_av(ctx: &mut Ctx<'_>, hop_limit: u8, traffic_class: u8) -> Result<Conn, String> {
    let o = ConnOpts {
        recvs: 4,
        stop_at: QpState::Init,
        ..Default::default()
    };
    let c = ctx.connect(o)?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(o.path_mtu),
            dest_qp_num: Some(c.peer_qpn),
            rq_psn: Some(c.peer_psn),
            ah: Some(Ah {
                sgid_index: ctx.sgid_index(),
                hop_limit,
                traffic_class,
                ..Ah::to(ctx.peer.ip)
            }),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(o.min_rnr_timer),
            ..Default::default()
        },
    )?;
    ctx.agent.modify_qp(
        c.qpn,
        ModifyQp {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(c.dut_psn),
            timeout: Some(o.timeout),
            retry_cnt: Some(o.retry_cnt),
            rnr_retry: Some(o.rnr_retry),
            max_rd_atomic: Some(16),
            ..Default::default()
        },
    )?;
    Ok(c)
}

/// Makes the device send: three SENDs (three ACKs) and a READ of 3 × the MTU (three response
/// packets). Returns the frames the device sent to the peer's address meanwhile, as bytes.
fn make_device_send(ctx: &mut Ctx<'_>, c: &Conn) -> Result<Vec<Vec<u8>>, String> {
    let from = ctx.peer.capture.len();
    let mut psn = c.peer_psn;
    for i in 0..3u8 {
        let r = ctx
            .req(c, Opcode::RC_SEND_ONLY, psn)
            .payload(&pattern(0x40 + i, 32))
            .ack_req(true);
        ctx.peer.send(&r)?;
        ctx.peer.expect_ack(psn, "a SEND_ONLY")?;
        psn = psn.add(1);
    }
    let len = 3 * c.mtu;
    let read = ctx
        .req(c, Opcode::RC_RDMA_READ_REQUEST, psn)
        .reth(c.mr.addr, c.mr.rkey, len);
    ctx.peer.send(&read)?;
    let got = ctx.peer.collect(None);
    if got.len() != 3 {
        return Err(format!(
            "expected a 3-packet READ response, got {}",
            describe(&got)
        ));
    }
    let me = ctx.peer.ip;
    let frames: Vec<Vec<u8>> = ctx.peer.capture[from..]
        .iter()
        .filter(|(_, f, sent)| {
            !*sent && parse_frame(f).is_ok_and(|p| p.ip.dst() == me && p.bth.dqpn != Qpn::GSI)
        })
        .map(|(_, f, _)| f.clone())
        .collect();
    if frames.len() != 6 {
        return Err(format!(
            "expected 6 frames from the device (3 ACKs, 3 READ responses), got {}",
            frames.len()
        ));
    }
    Ok(frames)
}

fn set_ecn(mut r: Craft, ecn: u8) -> Craft {
    match &mut r.repr.ip {
        IpRepr::V4(ip) => ip.ecn = ecn,
        IpRepr::V6(ip) => ip.ecn = ecn,
    }
    r
}

// ---- inbound ----

fn version_in_v4(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    let mut bad = good.build()?;
    if bad[12..14] != [0x08, 0x00] {
        return Err("the peer's frame is not IPv4".into());
    }
    bad[ETH] = 0x65;
    reseal(&mut bad, true);
    raw_drop_then_accept(ctx, &c, &bad, &good, "in an IPv4 frame with IP version 6")
}

fn version_in_v6(ctx: &mut Ctx<'_>) -> Outcome {
    ctx.use_ipv6()?;
    let (c, good) = conn_and_send(ctx)?;
    let mut bad = good.build()?;
    if bad[12..14] != [0x86, 0xdd] {
        return Err("the peer's frame is not IPv6".into());
    }
    bad[ETH] = 0x40 | (bad[ETH] & 0x0f);
    reseal(&mut bad, true);
    raw_drop_then_accept(ctx, &c, &bad, &good, "in an IPv6 frame with IP version 4")
}

fn v6_to_v4_qp(ctx: &mut Ctx<'_>) -> Outcome {
    let dut6 = dut_ipv6(ctx)?;
    let (c, good) = conn_and_send(ctx)?;
    let me6 = IpAddr::V6(crate::dut::link_local(ctx.peer.mac));
    let mut bad = good.clone();
    bad.repr.ip = IpRepr::roce(me6, dut6, 0, 64, 0);
    let bad = bad.build()?;
    raw_drop_then_accept(
        ctx,
        &c,
        &bad,
        &good,
        "over IPv6 to a QP connected over IPv4",
    )
}

fn fragment_more(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    let mut bad = good.build()?;
    // Flags: DF off, MF on; offset 0.
    bad[ETH + 6] = 0x20;
    bad[ETH + 7] = 0;
    reseal(&mut bad, true);
    raw_drop_then_accept(ctx, &c, &bad, &good, "with IPv4 More Fragments set")
}

fn fragment_offset(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    let mut bad = good.build()?;
    // Flags 000, offset 1 (8 bytes): a last fragment.
    bad[ETH + 6] = 0;
    bad[ETH + 7] = 1;
    reseal(&mut bad, true);
    raw_drop_then_accept(ctx, &c, &bad, &good, "with an IPv4 fragment offset of 8")
}

fn dqpn_zero(ctx: &mut Ctx<'_>) -> Outcome {
    // A SEND first (accepted), then the next one to QP0, then the next one right.
    let (c, first) = conn_and_send(ctx)?;
    ctx.peer.send(&first)?;
    accepted(ctx, &c, c.peer_psn, "the first SEND_ONLY")?;
    let next = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn.add(1))
        .payload(&pattern(0x3d, 32))
        .ack_req(true);
    let mut bad = next.clone();
    bad.repr.bth.dqpn = Qpn::new(0);
    let bad = bad.build()?;
    raw_drop_then_accept(ctx, &c, &bad, &next, "to QP0")
}

fn transit_v4(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    let mut f = good.build()?;
    if f[12..14] != [0x08, 0x00] {
        return Err("the peer's frame is not IPv4".into());
    }
    // DSCP 46 (EF), ECN ECT(1); TTL 3. The IPv4 checksum is fixed, the ICRC left as sent.
    f[ETH + 1] = 46 << 2 | 1;
    f[ETH + 8] = 3;
    reseal(&mut f, false);
    ctx.peer.send_raw(&f);
    accepted(
        ctx,
        &c,
        c.peer_psn,
        "a SEND_ONLY whose TTL, DSCP and ECN were rewritten",
    )
}

fn transit_v6(ctx: &mut Ctx<'_>) -> Outcome {
    ctx.use_ipv6()?;
    let (c, good) = conn_and_send(ctx)?;
    let mut f = good.build()?;
    if f[12..14] != [0x86, 0xdd] {
        return Err("the peer's frame is not IPv6".into());
    }
    // Traffic class DSCP 46 / ECT(1), flow label 0x5a5a5, hop limit 3.
    let tc: u8 = 46 << 2 | 1;
    let flow: u32 = 0x5_a5a5;
    let word = 6u32 << 28 | (tc as u32) << 20 | flow;
    f[ETH..ETH + 4].copy_from_slice(&word.to_be_bytes());
    f[ETH + 7] = 3;
    ctx.peer.send_raw(&f);
    accepted(
        ctx,
        &c,
        c.peer_psn,
        "a SEND_ONLY whose traffic class, flow label and hop limit were rewritten",
    )
}

fn transit_udp_checksum(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    let mut f = good.build()?;
    if f[12..14] != [0x08, 0x00] {
        return Err("the peer's frame is not IPv4".into());
    }
    let udp = ETH + 20;
    let udp_len = u16::from_be_bytes([f[udp + 4], f[udp + 5]]) as usize;
    // RFC 768: the pseudo-header (addresses, protocol, UDP length) and the datagram.
    let mut pseudo = Vec::with_capacity(12 + udp_len);
    pseudo.extend_from_slice(&f[ETH + 12..ETH + 20]);
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f[udp + 6..udp + 8].fill(0);
    pseudo.extend_from_slice(&f[udp..udp + udp_len]);
    let mut sum = !rocemu_wire::ip::ones_complement_sum(&pseudo, 0);
    if sum == 0 {
        sum = 0xffff;
    }
    f[udp + 6..udp + 8].copy_from_slice(&sum.to_be_bytes());
    ctx.peer.send_raw(&f);
    accepted(
        ctx,
        &c,
        c.peer_psn,
        &format!("a SEND_ONLY with UDP checksum 0x{sum:04x}"),
    )
}

fn fecn_becn(ctx: &mut Ctx<'_>) -> Outcome {
    let (c, mut good) = conn_and_send(ctx)?;
    good.repr.bth.fecn = true;
    good.repr.bth.becn = true;
    ctx.peer.send(&good)?;
    accepted(ctx, &c, c.peer_psn, "a SEND_ONLY with FECN and BECN set")
}

// ---- outbound ----

fn out_ihl_df(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    for f in make_device_send(ctx, &c)? {
        if f[12..14] != [0x08, 0x00] {
            return Err("a frame of the device is not IPv4".into());
        }
        let ip = &f[ETH..];
        let frag = u16::from_be_bytes([ip[6], ip[7]]);
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        if ip[0] != 0x45 || frag != 0x4000 || ip[9] != 17 {
            return Err(format!(
                "{}: version/IHL 0x{:02x} (expected 0x45), flags+offset 0x{frag:04x} (expected \
                 0x4000: DF, offset 0), protocol {} (expected 17)",
                p.bth.opcode, ip[0], ip[9]
            ));
        }
    }
    Ok(())
}

fn out_ttl_dscp(ctx: &mut Ctx<'_>) -> Outcome {
    let c = connect_av(ctx, 17, 0x60)?;
    for f in make_device_send(ctx, &c)? {
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        let IpRepr::V4(ip) = p.ip else {
            return Err("a frame of the device is not IPv4".into());
        };
        if ip.ttl != 17 || ip.dscp != 0x60 >> 2 {
            return Err(format!(
                "{}: TTL {} and DSCP {}, expected the address vector's hop limit 17 and DSCP {}",
                p.bth.opcode,
                ip.ttl,
                ip.dscp,
                0x60 >> 2
            ));
        }
    }
    Ok(())
}

fn out_ecn(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    for f in make_device_send(ctx, &c)? {
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        if p.ip.ecn() == 3 {
            return Err(format!("{} went out marked CE (ECN '11')", p.bth.opcode));
        }
    }
    Ok(())
}

fn out_lengths(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    for f in make_device_send(ctx, &c)? {
        if f[12..14] != [0x08, 0x00] {
            return Err("a frame of the device is not IPv4".into());
        }
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        // The datagram ends with the ICRC: BTH, its extension headers, payload, pad, ICRC.
        let transport = p.datagram().len() - 20;
        let total = u16::from_be_bytes([f[ETH + 2], f[ETH + 3]]) as usize;
        let udp_len = u16::from_be_bytes([f[ETH + 24], f[ETH + 25]]) as usize;
        let want_udp =
            8 + 12 + p.bth.opcode.info().ext_len + p.payload.len() + p.bth.pad as usize + 4;
        if udp_len != want_udp || total != 20 + want_udp || transport != want_udp {
            return Err(format!(
                "{}: IPv4 total length {total}, UDP length {udp_len}; the headers, payload, \
                 pad and ICRC make {want_udp} bytes from the UDP header on (total {})",
                p.bth.opcode,
                20 + want_udp
            ));
        }
    }
    Ok(())
}

fn out_udp_checksum(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    for f in make_device_send(ctx, &c)? {
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        let udp = ETH + p.ip.header_len();
        let sum = u16::from_be_bytes([f[udp + 6], f[udp + 7]]);
        if sum != 0 {
            return Err(format!(
                "{} went out with UDP checksum 0x{sum:04x}, expected 0",
                p.bth.opcode
            ));
        }
    }
    Ok(())
}

fn out_sport(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    let ports: Vec<u16> = make_device_send(ctx, &c)?
        .iter()
        .map(|f| {
            let p = parse_frame(f).map_err(|e| e.to_string())?;
            let udp = ETH + p.ip.header_len();
            Ok(u16::from_be_bytes([f[udp], f[udp + 1]]))
        })
        .collect::<Result<_, String>>()?;
    if ports.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!(
            "the QP's packets went out from UDP source ports {ports:?}, expected one fixed port"
        ));
    }
    Ok(())
}

fn out_ipv6(ctx: &mut Ctx<'_>) -> Outcome {
    ctx.use_ipv6()?;
    let c = connect_av(ctx, 9, 0x20)?;
    for f in make_device_send(ctx, &c)? {
        if f[12..14] != [0x86, 0xdd] {
            return Err("a frame of the device is not IPv6".into());
        }
        let p = parse_frame(&f).map_err(|e| e.to_string())?;
        let IpRepr::V6(ip) = p.ip else {
            return Err("a frame of the device is not IPv6".into());
        };
        let payload_len = u16::from_be_bytes([f[ETH + 4], f[ETH + 5]]) as usize;
        let udp_len = u16::from_be_bytes([f[ETH + 44], f[ETH + 45]]) as usize;
        let want = 8 + 12 + p.bth.opcode.info().ext_len + p.payload.len() + p.bth.pad as usize + 4;
        if ip.next_header != 17
            || ip.hop_limit != 9
            || ip.dscp != 0x20 >> 2
            || ip.ecn == 3
            || payload_len != want
            || udp_len != want
        {
            return Err(format!(
                "{}: next header {} (17), hop limit {} (9), DSCP {} ({}), ECN {} (not 3), \
                 payload length {payload_len} and UDP length {udp_len} ({want})",
                p.bth.opcode,
                ip.next_header,
                ip.hop_limit,
                ip.dscp,
                0x20 >> 2,
                ip.ecn
            ));
        }
    }
    Ok(())
}

// ---- ECN and CNP ----

/// Splits what the device sent into CNPs and the rest.
fn split_cnps(got: Vec<Pkt>) -> (Vec<Pkt>, Vec<Pkt>) {
    got.into_iter().partition(|p| p.opcode() == Opcode::CNP)
}

/// Checks one CNP against Figure 6 for a marked packet from the connection's peer QP with
/// `pkey`.
fn check_cnp(ctx: &Ctx<'_>, c: &Conn, p: &Pkt, pkey: PKey) -> Outcome {
    let b = &p.bth;
    let mut wrong = Vec::new();
    if b.dqpn != c.peer_qpn {
        wrong.push(format!(
            "DestQP 0x{:06x} (expected the sender's QP 0x{:06x})",
            b.dqpn.value(),
            c.peer_qpn.value()
        ));
    }
    if b.psn != Psn::new(0) {
        wrong.push(format!("PSN {} (expected 0)", psn_text(b.psn)));
    }
    if b.solicited || b.mig_req {
        wrong.push(format!(
            "SE {} M {} (expected 0, 0)",
            b.solicited, b.mig_req
        ));
    }
    if b.pkey != pkey {
        wrong.push(format!(
            "P_Key 0x{:04x} (expected the marked packet's 0x{:04x})",
            b.pkey.0, pkey.0
        ));
    }
    // The 16 reserved bytes: the frame's, from the capture (the parser takes them as the
    // CNP's extension header).
    let raw = ctx.peer.capture.iter().rev().find(|(_, f, sent)| {
        !*sent && parse_frame(f).is_ok_and(|q| q.bth == p.bth && q.ip.src() == p.src)
    });
    match raw.map(|(_, f, _)| (f, parse_frame(f))) {
        Some((f, Ok(q))) => {
            let bth_end = ETH + q.ip.header_len() + 8 + 12;
            let after = &f[bth_end..q.payload_offset().max(bth_end)];
            let udp_len = u16::from_be_bytes([
                f[ETH + q.ip.header_len() + 4],
                f[ETH + q.ip.header_len() + 5],
            ]) as usize;
            if after != [0u8; 16] || !p.payload.is_empty() || udp_len != 8 + 12 + 16 + 4 {
                wrong.push(format!(
                    "{} bytes between the BTH and the ICRC, {after:02x?} then {} more (UDP length \
                     {udp_len}; expected 16 zero bytes and UDP length 40)",
                    after.len(),
                    p.payload.len()
                ));
            }
        }
        _ => wrong.push("no frame in the capture".into()),
    }
    if !p.icrc_ok {
        wrong.push("a wrong ICRC".into());
    }
    if p.src != ctx.peer.dut_ip || p.dst != ctx.peer.ip {
        wrong.push(format!(
            "addresses {} -> {} (expected {} -> {})",
            p.src, p.dst, ctx.peer.dut_ip, ctx.peer.ip
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("the CNP has {}", wrong.join(", ")))
    }
}

/// A CE-marked SEND with `pkey`: executed, ACKed, and answered by exactly one CNP in the format.
fn ce_send_answered(ctx: &mut Ctx<'_>, pkey: PKey) -> Outcome {
    let (c, good) = conn_and_send(ctx)?;
    ctx.peer.send(&set_ecn(good.pkey(pkey), 3))?;
    let (cnps, rest) = split_cnps(ctx.peer.collect(None));
    if rest.len() != 1 || !rest[0].is_ack() || rest[0].psn() != c.peer_psn {
        return Err(format!(
            "a CE-marked SEND_ONLY: expected its ACK psn={}, got {}",
            psn_text(c.peer_psn),
            describe(&rest)
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a CE-marked SEND_ONLY",
    )?;
    match cnps.as_slice() {
        [p] => check_cnp(ctx, &c, p, pkey),
        [] => Err(
            "a CE-marked SEND_ONLY: no CNP came back (the device implements no RoCEv2 \
             congestion management, or ignores CE)"
                .into(),
        ),
        _ => Err(format!(
            "one CE-marked SEND_ONLY: expected one CNP, got {}",
            describe(&cnps)
        )),
    }
}

fn cnp_answered(ctx: &mut Ctx<'_>) -> Outcome {
    ce_send_answered(ctx, PKey::DEFAULT)
}

fn cnp_answered_v6(ctx: &mut Ctx<'_>) -> Outcome {
    ctx.use_ipv6()?;
    ce_send_answered(ctx, PKey::DEFAULT)
}

fn cnp_pkey(ctx: &mut Ctx<'_>) -> Outcome {
    ce_send_answered(ctx, PKey(0x7fff))
}

fn cnp_burst(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 4,
        ..Default::default()
    })?;
    for i in 0..4u32 {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn.add(i))
            .payload(&pattern(0x50 + i as u8, 32))
            .ack_req(true);
        ctx.peer.send(&set_ecn(r, 3))?;
    }
    let (cnps, rest) = split_cnps(ctx.peer.collect(None));
    let last = c.peer_psn.add(3);
    if !rest.iter().any(|p| p.is_ack() && p.psn() == last) {
        return Err(format!(
            "four CE-marked SENDs: expected an ACK up to psn={}, got {}",
            psn_text(last),
            describe(&rest)
        ));
    }
    if cnps.is_empty() || cnps.len() > 4 {
        return Err(format!(
            "four CE-marked SENDs: expected 1 to 4 CNPs, got {}",
            cnps.len()
        ));
    }
    for p in &cnps {
        check_cnp(ctx, &c, p, PKey::DEFAULT)?;
    }
    Ok(())
}

fn cnp_ud(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        qp_type: rocemu_emulator::rnic::QpType::Ud,
        recvs: 1,
        recv_len: 40 + 32,
        ..Default::default()
    })?;
    let r = ctx
        .req(&c, Opcode::UD_SEND_ONLY, Psn::new(0x77))
        .deth(c.qkey, c.peer_qpn)
        .payload(&pattern(0x6a, 32));
    ctx.peer.send(&set_ecn(r, 3))?;
    let (cnps, rest) = split_cnps(ctx.peer.collect(None));
    if !rest.is_empty() {
        return Err(format!(
            "a CE-marked UD SEND_ONLY: expected a CNP alone, also got {}",
            describe(&rest)
        ));
    }
    ctx.expect_wc(
        &c,
        "IBV_WC_SUCCESS",
        Some("IBV_WC_RECV"),
        "a CE-marked UD SEND_ONLY",
    )?;
    match cnps.as_slice() {
        // The DETH's source QP is the connection's peer QP: check_cnp's DestQP.
        [p] => check_cnp(ctx, &c, p, PKey::DEFAULT),
        [] => Err("a CE-marked UD SEND_ONLY: no CNP came back".into()),
        _ => Err(format!(
            "one CE-marked UD SEND_ONLY: expected one CNP, got {}",
            describe(&cnps)
        )),
    }
}

fn ect_no_cnp(ctx: &mut Ctx<'_>) -> Outcome {
    let c = ctx.connect(ConnOpts {
        recvs: 2,
        ..Default::default()
    })?;
    for (i, ecn) in [(0u32, 2u8), (1, 1)] {
        let r = ctx
            .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn.add(i))
            .payload(&pattern(0x60 + i as u8, 32))
            .ack_req(true);
        ctx.peer.send(&set_ecn(r, ecn))?;
        let got = ctx.peer.collect(None);
        if got.len() != 1 || !got[0].is_ack() || got[0].psn() != c.peer_psn.add(i) {
            return Err(format!(
                "a SEND_ONLY marked ECN '{ecn:02b}': expected its ACK alone, got {}",
                describe(&got)
            ));
        }
    }
    Ok(())
}

/// A SEND accepted, a CNP naming `cnp_qpn(conn)`, silence, then the next SEND accepted.
fn cnp_ignored(ctx: &mut Ctx<'_>, cnp_qpn: fn(&Conn) -> Qpn, what: &str) -> Outcome {
    let (c, first) = conn_and_send(ctx)?;
    ctx.peer.send(&first)?;
    accepted(ctx, &c, c.peer_psn, "the first SEND_ONLY")?;
    let mut cnp = ctx.peer.craft(Opcode::CNP, cnp_qpn(&c), Psn::new(0));
    cnp.repr.bth.becn = true;
    ctx.peer.send(&cnp)?;
    ctx.peer.expect_silence(&format!("a CNP {what}"))?;
    ctx.expect_no_wc(&c, &format!("a CNP {what}"))?;
    let next = ctx
        .req(&c, Opcode::RC_SEND_ONLY, c.peer_psn.add(1))
        .payload(&pattern(0x3e, 32))
        .ack_req(true);
    ctx.peer.send(&next)?;
    accepted(ctx, &c, c.peer_psn.add(1), "the SEND_ONLY after the CNP")?;
    ctx.expect_state(&c, QpState::Rts, &format!("after a CNP {what}"))
}

fn cnp_unknown_qp(ctx: &mut Ctx<'_>) -> Outcome {
    // Flipping the top bit gives a QPN no QP of this test has.
    cnp_ignored(
        ctx,
        |c| Qpn::new(c.qpn.value() ^ 0x80_0000),
        "to a QP that does not exist",
    )
}

fn cnp_known_qp(ctx: &mut Ctx<'_>) -> Outcome {
    cnp_ignored(ctx, |c| c.qpn, "naming the device's QP")
}
