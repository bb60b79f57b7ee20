//! One test for every parse and build error, each on a frame that is valid but for one thing.
use rocemu_wire::eth::{EthernetRepr, Mac};
use rocemu_wire::frame::IpRepr;
use rocemu_wire::ip::{ipv4_checksum, Ipv4Repr, Ipv6Repr};
use rocemu_wire::*;

fn v4() -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
        dscp: 0,
        ecn: 0,
        ident: 1,
        dont_frag: true,
        ttl: 64,
        protocol: 17,
        checksum: 0,
        header_len: 20,
        total_len: 0,
    })
}

fn v6() -> IpRepr {
    IpRepr::V6(Ipv6Repr {
        src: "fd00::1".parse().unwrap(),
        dst: "fd00::2".parse().unwrap(),
        dscp: 0,
        ecn: 0,
        flow_label: 0,
        payload_len: 0,
        next_header: 17,
        hop_limit: 64,
    })
}

fn repr(ip: IpRepr, op: Opcode) -> FrameRepr {
    FrameRepr {
        eth: EthernetRepr {
            dst: Mac([2, 0, 0, 0, 0, 2]),
            src: Mac([2, 0, 0, 0, 0, 1]),
            vlan: None,
            ethertype: 0,
        },
        ip,
        sport: 0xc000,
        dport: ROCEV2_UDP_PORT,
        bth: BthRepr::new(op, Qpn::new(0x11), Psn::new(0)),
        ext: ExtHeaders::default(),
    }
}

/// An RC SEND ONLY with an 8-byte payload over IPv4: 14 + 20 + 8 + 12 + 8 + 4 = 66 bytes.
fn send_v4() -> Vec<u8> {
    let r = repr(v4(), Opcode::RC_SEND_ONLY);
    let mut b = vec![0; 66];
    assert_eq!(
        r.emit_with_payload(&mut b, &[1, 2, 3, 4, 5, 6, 7, 8])
            .unwrap(),
        66
    );
    b
}

fn fix_v4_checksum(b: &mut [u8]) {
    b[24..26].fill(0);
    let c = ipv4_checksum(&b[14..34]);
    b[24..26].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn valid_baseline() {
    let b = send_v4();
    let p = parse_frame(&b).unwrap();
    assert!(p.icrc_ok() && p.ip_checksum_ok());
    assert_eq!(p.payload, &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn truncated_ethernet_and_vlan() {
    let e = parse_frame(&[0u8; 13]).unwrap_err();
    assert_eq!(
        e,
        Error::Truncated {
            layer: Layer::Ethernet,
            need: 14,
            have: 13
        }
    );
    let mut b = [0u8; 16];
    b[12] = 0x81;
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::Truncated {
            layer: Layer::Vlan,
            need: 18,
            have: 16
        }
    );
}

#[test]
fn not_ip() {
    let mut b = send_v4();
    b[12..14].copy_from_slice(&[0x08, 0x06]);
    let e = parse_frame(&b).unwrap_err();
    assert_eq!(e, Error::NotIp { ethertype: 0x0806 });
    assert!(e.to_string().starts_with("not IP"));
}

#[test]
fn ip_version_disagrees_with_ethertype() {
    let mut b = send_v4();
    b[14] = 0x65;
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::IpVersion {
            ethertype: 0x0800,
            version: 6
        }
    );
}

#[test]
fn short_ipv4_header_and_bad_ihl() {
    let b = send_v4();
    assert_eq!(
        parse_frame(&b[..30]).unwrap_err(),
        Error::Truncated {
            layer: Layer::Ipv4,
            need: 20,
            have: 16
        }
    );
    let mut c = b.clone();
    c[14] = 0x43;
    assert!(matches!(
        parse_frame(&c).unwrap_err(),
        Error::BadIpv4HeaderLength { ihl: 3, .. }
    ));
    // IHL 15 (60 bytes) but total length 52.
    let mut c = b.clone();
    c[14] = 0x4f;
    assert!(matches!(
        parse_frame(&c).unwrap_err(),
        Error::BadIpv4HeaderLength {
            ihl: 15,
            total_len: 52
        }
    ));
}

#[test]
fn ipv4_total_length_beyond_capture() {
    let b = send_v4();
    let e = parse_frame(&b[..60]).unwrap_err();
    assert_eq!(
        e,
        Error::IpLengthExceedsFrame {
            v6: false,
            claimed: 52,
            captured: 46
        }
    );
    assert_eq!(
        e.to_string(),
        "truncated: IPv4 total length 52 > 46 captured"
    );
}

#[test]
fn ipv6_payload_length_beyond_capture() {
    let r = repr(v6(), Opcode::RC_SEND_ONLY);
    let mut b = vec![0; r.frame_len(8)];
    r.emit_with_payload(&mut b, &[9; 8]).unwrap();
    let e = parse_frame(&b[..b.len() - 1]).unwrap_err();
    assert_eq!(
        e,
        Error::IpLengthExceedsFrame {
            v6: true,
            claimed: 32,
            captured: 31
        }
    );
    assert!(e
        .to_string()
        .starts_with("truncated: IPv6 payload length 32"));
}

#[test]
fn ipv4_fragments_are_refused() {
    let mut b = send_v4();
    b[20] = 0x00;
    b[21] = 0x10; // offset 16 × 8
    fix_v4_checksum(&mut b);
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::Ipv4Fragment {
            offset: 16,
            more: false
        }
    );
}

#[test]
fn ipv6_extension_header_is_a_clear_error() {
    let mut r = repr(v6(), Opcode::RC_SEND_ONLY);
    r.bth.pad = 0;
    let mut b = vec![0; r.frame_len(8)];
    r.emit_with_payload(&mut b, &[9; 8]).unwrap();
    b[14 + 6] = 43; // routing header
    let e = parse_frame(&b).unwrap_err();
    assert_eq!(e, Error::Ipv6ExtensionHeader { next_header: 43 });
    assert_eq!(e.to_string(), "IPv6 extension header 43 not supported");
}

#[test]
fn not_udp_and_not_4791() {
    let mut b = send_v4();
    b[14 + 9] = 6;
    fix_v4_checksum(&mut b);
    let e = parse_frame(&b).unwrap_err();
    assert_eq!(e, Error::NotUdp { protocol: 6 });
    assert!(e.to_string().starts_with("not UDP 4791"));
    let mut b = send_v4();
    b[36..38].copy_from_slice(&53u16.to_be_bytes());
    let e = parse_frame(&b).unwrap_err();
    assert_eq!(e, Error::NotRocePort { dport: 53 });
    assert!(e.to_string().starts_with("not UDP 4791"));
}

#[test]
fn udp_header_truncated_by_ip_length() {
    let mut b = send_v4();
    b[16..18].copy_from_slice(&24u16.to_be_bytes()); // total length: header + 4 bytes
    fix_v4_checksum(&mut b);
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::Truncated {
            layer: Layer::Udp,
            need: 8,
            have: 4
        }
    );
}

#[test]
fn udp_length_must_match_ip_payload() {
    for (ulen, text) in [
        (40u16, "UDP length 40 > IP payload 32"),
        (30, "UDP length 30 < IP payload 32"),
        (4, "bad UDP length 4"),
    ] {
        let mut b = send_v4();
        b[38..40].copy_from_slice(&ulen.to_be_bytes());
        let e = parse_frame(&b).unwrap_err();
        assert_eq!(
            e,
            Error::UdpLength {
                udp_len: ulen,
                ip_payload: 32
            }
        );
        assert!(e.to_string().contains(text), "{e}");
    }
}

#[test]
fn bth_truncated() {
    let mut b = send_v4();
    // shrink IP and UDP lengths so only 10 bytes follow the UDP header
    b[16..18].copy_from_slice(&38u16.to_be_bytes());
    b[38..40].copy_from_slice(&18u16.to_be_bytes());
    fix_v4_checksum(&mut b);
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::Truncated {
            layer: Layer::Bth,
            need: 12,
            have: 10
        }
    );
}

#[test]
fn unknown_opcodes() {
    for op in [0x15u8, 0x18, 0x1e, 0x2c, 0x40, 0x66, 0xa0, 0xff] {
        let mut b = send_v4();
        b[42] = op;
        let e = parse_frame(&b).unwrap_err();
        assert_eq!(e, Error::UnknownOpcode(op));
        assert_eq!(e.to_string(), format!("unknown opcode 0x{op:02x}"));
    }
}

#[test]
fn headers_of_the_layout_must_fit() {
    // An RC RDMA WRITE FIRST needs 12 + 16 + 4 bytes; this one has 12 + 8 + 4.
    let mut b = send_v4();
    b[42] = 0x06;
    assert_eq!(
        parse_frame(&b).unwrap_err(),
        Error::Truncated {
            layer: Layer::Transport,
            need: 32,
            have: 24
        }
    );
}

#[test]
fn pad_count_the_payload_cannot_hold() {
    let r = repr(v4(), Opcode::RC_SEND_ONLY);
    let mut b = vec![0; r.frame_len(2)];
    r.emit_with_payload(&mut b, &[1, 2]).unwrap();
    b[43] |= 0x30; // pad 3 > 2 payload bytes
    let e = parse_frame(&b).unwrap_err();
    assert_eq!(e, Error::PadExceedsPayload { pad: 3, payload: 2 });
    // A pad count equal to the payload is structure enough (payload_len 0).
    b[43] = (b[43] & !0x30) | 0x20;
    assert_eq!(parse_frame(&b).unwrap().payload.len(), 0);
}

#[test]
fn field_disagreements_are_reported_not_rejected() {
    let mut b = send_v4();
    b[22] = 1; // TTL without fixing the checksum: the checksum is wrong, the frame parses
    let p = parse_frame(&b).unwrap();
    assert!(!p.ip_checksum_ok());
    assert!(p.icrc_ok(), "TTL is masked out of the ICRC");
    let n = b.len();
    b[n - 1] ^= 1;
    assert!(!parse_frame(&b).unwrap().icrc_ok());
}

#[test]
fn build_errors() {
    let r = repr(v4(), Opcode::RC_RDMA_WRITE_ONLY);
    let mut b = vec![0; 200];
    assert_eq!(
        r.emit_with_payload(&mut b, &[0; 8]).unwrap_err(),
        BuildError::LayoutMismatch {
            opcode: 0x0a,
            header: "RETH"
        }
    );
    let mut r = repr(v4(), Opcode::RC_SEND_ONLY);
    assert_eq!(
        r.emit_with_payload(&mut b[..60], &[0; 8]).unwrap_err(),
        BuildError::BufferTooSmall { need: 66, have: 60 }
    );
    r.ext.imm = Some(1);
    assert!(matches!(
        r.emit_with_payload(&mut b, &[0; 8]),
        Err(BuildError::LayoutMismatch {
            header: "ImmDt",
            ..
        })
    ));
    r.ext.imm = None;
    r.bth.pad = 4;
    assert_eq!(
        r.emit_with_payload(&mut b, &[0; 8]).unwrap_err(),
        BuildError::Invalid("pad count above 3")
    );
    r.bth.pad = 0;
    let mut big = vec![0; 70_000];
    assert!(matches!(
        r.emit_with_payload(&mut big, &[0; 65_500]),
        Err(BuildError::TooLong { .. })
    ));
}

#[test]
fn udp_source_port_from_qpn_like_rxe() {
    for q in [0u32, 1, 0x11, 0x12, 0xff_ffff] {
        let p = udp_sport_for_qpn(Qpn::new(q));
        assert!(p >= 0xc000, "{p:#x}");
    }
    assert_ne!(
        udp_sport_for_qpn(Qpn::new(0x11)),
        udp_sport_for_qpn(Qpn::new(0x12))
    );
    for (l, r) in [
        (0x11u32, 0x12u32),
        (0xabcdef, 0x123456),
        (0xffffff, 0xffffff),
    ] {
        let (a, b) = (Qpn::new(l), Qpn::new(r));
        assert_eq!(
            udp_sport_for_flow(0, a, b),
            udp_sport_for_flow(0, b, a),
            "both ends agree"
        );
        assert!(udp_sport_for_flow(0, a, b) >= 0xc000);
    }
    assert_eq!(
        udp_sport_for_flow(0x12345, Qpn::new(1), Qpn::new(2)),
        0xc000 | (0x2345 ^ 0x4)
    );
}
