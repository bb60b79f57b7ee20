//! Property tests: every opcode round-trips Repr → emit → parse; masked fields leave the ICRC
//! valid and covered bits break it; arbitrary bytes never panic the parser.
use proptest::prelude::*;
use rocemu_wire::eth::{EthernetRepr, Mac, VlanTag};
use rocemu_wire::frame::{pad_for, IpRepr};
use rocemu_wire::headers::FethRepr;
use rocemu_wire::ip::{Ipv4Repr, Ipv6Repr};
use rocemu_wire::opcode::hdr;
use rocemu_wire::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    let all: Vec<Opcode> = Opcode::all().collect();
    proptest::sample::select(all)
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(|(s, d, dscp, ecn, ident, df, ttl)| IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                dscp,
                ecn,
                ident,
                dont_frag: df,
                ttl,
                protocol: 17,
                checksum: 0,
                header_len: 20,
                total_len: 0,
            })),
        (
            any::<u128>(),
            any::<u128>(),
            0u8..64,
            0u8..4,
            0u32..(1 << 20),
            any::<u8>()
        )
            .prop_map(|(s, d, dscp, ecn, fl, hl)| IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                dscp,
                ecn,
                flow_label: fl,
                payload_len: 0,
                next_header: 17,
                hop_limit: hl,
            })),
    ]
}

prop_compose! {
    fn arb_frame()(
        op in arb_opcode(),
        ip in arb_ip(),
        vlan in proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
        macs in any::<([u8; 6], [u8; 6])>(),
        sport in any::<u16>(),
        flags in any::<(bool, bool, bool, bool, bool)>(),
        tver in 0u8..16, pkey in any::<u16>(), resv6 in 0u8..64, resv7 in 0u8..128,
        dqpn in any::<u32>(), psn in any::<u32>(),
        v in any::<(u64, u32, u32, u64, u64, u32, u32, u8)>(),
        payload in proptest::collection::vec(any::<u8>(), 0..1500),
    ) -> (FrameRepr, Vec<u8>) {
        let info = op.info();
        let payload = if info.has_payload() { payload } else { Vec::new() };
        let mut bth = BthRepr::new(op, Qpn::new(dqpn), Psn::new(psn));
        (bth.solicited, bth.mig_req, bth.fecn, bth.becn, bth.ack_req) = flags;
        bth.tver = tver;
        bth.pkey = PKey(pkey);
        bth.resv6 = resv6;
        bth.resv7 = resv7;
        bth.pad = pad_for(payload.len());
        let (a, b, c, d, e, f, g, h) = v;
        let has = |x| info.has(x);
        let ext = ExtHeaders {
            feth: has(hdr::FETH).then_some(FethRepr { raw: b }),
            reth: has(hdr::RETH).then_some(RethRepr { va: a, rkey: RKey(b), dma_len: c }),
            atomic: has(hdr::ATOMIC_ETH).then_some(AtomicEthRepr { va: a, rkey: RKey(b), swap_add: d, compare: e }),
            deth: has(hdr::DETH).then_some(DethRepr { qkey: QKey(f), src_qpn: Qpn::new(g), resv: h }),
            aeth: has(hdr::AETH).then_some(AethRepr { syndrome: Syndrome(h), msn: Msn::new(g) }),
            atomic_ack: has(hdr::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { orig: d }),
            imm: has(hdr::IMM).then_some(f),
            ieth: has(hdr::IETH).then_some(RKey(c)),
        };
        let eth = EthernetRepr {
            dst: Mac(macs.0),
            src: Mac(macs.1),
            vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
            ethertype: 0,
        };
        (FrameRepr { eth, ip, sport, dport: ROCEV2_UDP_PORT, bth, ext }, payload)
    }
}

fn build(repr: &FrameRepr, payload: &[u8], fill: u8) -> Vec<u8> {
    let mut buf = vec![fill; repr.frame_len(payload.len()) + 7];
    let n = repr.emit_with_payload(&mut buf, payload).expect("emit");
    assert_eq!(n, repr.frame_len(payload.len()));
    buf.truncate(n);
    buf
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn emit_then_parse_gives_back_every_field((repr, payload) in arb_frame()) {
        let a = build(&repr, &payload, 0x00);
        let b = build(&repr, &payload, 0xff);
        prop_assert_eq!(&a, &b, "emit must write every byte, whatever the buffer held");
        let p = parse_frame(&a).expect("parse");
        prop_assert!(p.icrc_ok());
        prop_assert!(p.ip_checksum_ok());
        prop_assert_eq!(p.bth, repr.bth);
        prop_assert_eq!(p.ext, repr.ext);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert_eq!(p.pad_bytes().len(), repr.bth.pad as usize);
        prop_assert_eq!(p.udp.sport, repr.sport);
        prop_assert_eq!(p.eth.vlan, repr.eth.vlan);
        prop_assert_eq!(p.ip.src(), repr.ip.src());
        prop_assert_eq!(p.ip.dst(), repr.ip.dst());
        prop_assert_eq!(p.ip.ecn(), repr.ip.ecn());
        prop_assert_eq!(p.ip.dscp(), repr.ip.dscp());
        prop_assert_eq!(&a[p.payload_offset()..p.payload_offset() + payload.len()], &payload[..]);
        // And the parsed values rebuild the same bytes.
        let again = build(&FrameRepr::from_parsed(&p), p.payload, 0x5a);
        prop_assert_eq!(again, a);
    }

    /// Flow steering's fixed-offset read names the QP the full parse finds, with or without a
    /// VLAN tag, over IPv4 and IPv6; cut anywhere before the BTH's DestQP, it names none.
    #[test]
    fn steering_reads_the_destination_qp_the_parser_reads((repr, payload) in arb_frame(), cut in 0usize..80) {
        let a = build(&repr, &payload, 0);
        let p = parse_frame(&a).unwrap();
        prop_assert_eq!(rocemu_wire::frame::dest_qpn(&a), Some(p.bth.dqpn));
        let eth = if p.eth.vlan.is_some() { 18 } else { 14 };
        let qpn_end = eth + p.ip.header_len() + 8 + 8;
        if cut < qpn_end {
            prop_assert_eq!(rocemu_wire::frame::dest_qpn(&a[..cut]), None);
        }
    }

    #[test]
    fn ethernet_padding_after_the_datagram_is_ignored((repr, payload) in arb_frame(), junk in proptest::collection::vec(any::<u8>(), 1..64)) {
        let a = build(&repr, &payload, 0);
        let mut padded = a.clone();
        padded.extend_from_slice(&junk);
        let p = parse_frame(&a).unwrap();
        let q = parse_frame(&padded).unwrap();
        prop_assert_eq!(p.payload, q.payload);
        prop_assert_eq!(p.icrc, q.icrc);
        prop_assert!(q.icrc_ok());
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic((repr, payload) in arb_frame()) {
        let a = build(&repr, &payload, 0);
        for cut in 0..a.len() {
            prop_assert!(parse_frame(&a[..cut]).is_err(), "cut at {} of {} parsed", cut, a.len());
        }
    }

    #[test]
    fn masked_fields_keep_the_icrc_valid((repr, payload) in arb_frame(), which in 0usize..6, val in any::<u8>()) {
        let mut a = build(&repr, &payload, 0);
        let l3 = repr.eth.header_len();
        let (udp, bth) = if repr.ip.is_v6() { (l3 + 40, l3 + 48) } else { (l3 + 20, l3 + 28) };
        match (repr.ip.is_v6(), which) {
            (false, 0) => a[l3 + 1] = val,                 // TOS
            (false, 1) => a[l3 + 8] = val,                 // TTL
            (false, 2) => a[l3 + 10] = val,                // header checksum
            (true, 0) => a[l3] = 0x60 | (val & 0x0f),      // traffic class (high nibble)
            (true, 1) => a[l3 + 2] = val,                  // flow label
            (true, 2) => a[l3 + 7] = val,                  // hop limit
            (_, 3) => a[udp + 6] = val,                    // UDP checksum
            (_, 4) => a[bth + 4] ^= 0x80,                  // FECN
            _ => a[bth + 4] ^= 0x40,                       // BECN
        }
        let p = parse_frame(&a).unwrap();
        prop_assert!(p.icrc_ok());
    }

    #[test]
    fn a_flipped_covered_bit_breaks_the_icrc((repr, payload) in arb_frame(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut a = build(&repr, &payload, 0);
        let l3 = repr.eth.header_len();
        let v6 = repr.ip.is_v6();
        let udp = l3 + if v6 { 40 } else { 20 };
        // Covered bytes that do not change the layout: addresses, UDP ports, BTH bytes 1..12
        // except byte 4 and the pad bits, everything after the BTH (headers, payload, ICRC).
        let mut covered: Vec<(usize, u8)> = Vec::new();
        let addrs = if v6 { l3 + 8..l3 + 40 } else { l3 + 12..l3 + 20 };
        covered.extend(addrs.map(|i| (i, 0xff)));
        covered.extend((udp..udp + 2).map(|i| (i, 0xff)));
        covered.extend([(udp + 8 + 1, 0xcf), (udp + 8 + 2, 0xff), (udp + 8 + 3, 0xff)]);
        covered.extend((udp + 8 + 5..udp + 8 + 12).map(|i| (i, 0xff)));
        covered.extend((udp + 8 + 12..a.len()).map(|i| (i, 0xff)));
        let (i, mask) = covered[pos.index(covered.len())];
        let m = (1u8 << bit) & mask;
        prop_assume!(m != 0);
        a[i] ^= m;
        let p = parse_frame(&a).unwrap();
        prop_assert!(!p.icrc_ok(), "flipping bit {} of byte {} kept the ICRC valid", bit, i);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = parse_frame(&bytes) {
            let _ = p.icrc_ok();
            let _ = p.ip_checksum_ok();
            let _ = p.pad_bytes();
        }
    }

    #[test]
    fn mutated_valid_frames_never_panic((repr, payload) in arb_frame(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut a = build(&repr, &payload, 0);
        for (i, v) in edits {
            let n = a.len();
            a[i.index(n)] = v;
        }
        if let Ok(p) = parse_frame(&a) {
            let _ = p.icrc_ok();
            let _ = p.pad_bytes();
            let _ = FrameRepr::from_parsed(&p);
        }
    }
}
