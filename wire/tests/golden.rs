//! Golden frames: real `rdma_rxe` traffic and a ConnectX-4 Lx CNP (wire/tests/data, provenance
//! in PROVENANCE.md). Every RoCE frame must parse, verify its ICRC, and rebuild bit-exact from its
//! parsed values into buffers pre-filled with 0x00 and with 0xFF.
use rocemu_wire::capture::CaptureReader;
use rocemu_wire::{parse_frame, FrameRepr, Opcode};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn frames(path: &Path) -> Vec<Vec<u8>> {
    CaptureReader::open(path)
        .unwrap()
        .map(|f| f.unwrap().data)
        .collect()
}

fn all_captures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    for d in [data(), data().join("rxe"), data().join("cm")] {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "pcap") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn every_roce_frame_parses_verifies_and_rebuilds_bit_exact() {
    let mut ops = BTreeSet::new();
    let mut v6 = 0;
    let mut n = 0;
    for cap in all_captures() {
        for (i, f) in frames(&cap).iter().enumerate() {
            let Ok(p) = parse_frame(f) else { continue };
            let at = format!("{} frame {}", cap.display(), i + 1);
            assert!(p.icrc_ok(), "{at}: ICRC");
            assert!(p.ip_checksum_ok(), "{at}: IPv4 checksum");
            ops.insert(p.opcode().value());
            v6 += p.ip.is_v6() as usize;
            n += 1;
            let repr = FrameRepr::from_parsed(&p);
            let len = repr.frame_len(p.payload.len());
            for fill in [0x00u8, 0xff] {
                let mut buf = vec![fill; len + 16];
                assert_eq!(repr.emit_with_payload(&mut buf, p.payload).unwrap(), len);
                assert_eq!(&buf[..len], &f[..len], "{at}: rebuild into 0x{fill:02x}");
                assert!(
                    buf[len..].iter().all(|&b| b == fill),
                    "{at}: wrote past the frame"
                );
            }
        }
    }
    assert!(n > 100, "{n} frames");
    assert!(v6 > 0, "no IPv6 frames");
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
        Opcode::RC_COMPARE_SWAP,
        Opcode::RC_FETCH_ADD,
        Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
        Opcode::RC_SEND_LAST_WITH_INVALIDATE,
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        Opcode::UC_SEND_FIRST,
        Opcode::UC_SEND_LAST,
        Opcode::UC_RDMA_WRITE_ONLY,
        Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Opcode::UD_SEND_ONLY,
        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        Opcode::CNP,
    ] {
        assert!(ops.contains(&op.value()), "no golden {op:?}");
    }
}

#[test]
fn connectx4_lx_cnp_from_scapys_tests() {
    let f = frames(&data().join("cx4lx_cnp.pcap"));
    assert_eq!(f.len(), 1);
    let p = parse_frame(&f[0]).unwrap();
    assert_eq!(p.opcode(), Opcode::CNP);
    assert_eq!(p.icrc, [0x82, 0xfd, 0x00, 0x2a]);
    assert!(p.icrc_ok());
    assert_eq!(p.payload.len(), 0);
    assert!(p.bth.becn, "a CNP carries BECN");
}

/// The UDP source ports rxe chose, from its captures: hash of the QPN for UD and QP1, the flow
/// label (from both QPNs) for connected QPs.
#[test]
fn udp_source_ports_match_rxe() {
    use rocemu_wire::{udp_sport_for_flow, udp_sport_for_qpn, Qpn};
    let sport_of = |name: &str, op: Opcode| {
        frames(&data().join("rxe").join(name))
            .iter()
            .filter_map(|f| {
                parse_frame(f)
                    .ok()
                    .filter(|p| p.opcode() == op)
                    .map(|p| (p.udp.sport, p.bth.dqpn))
            })
            .next()
            .unwrap()
    };
    // Both ends of these pairs had the same QPN, so the destination QPN is also the source's.
    let (port, q) = sport_of("rc_send_small.pcap", Opcode::RC_SEND_ONLY);
    assert_eq!(q, Qpn::new(0x11));
    assert_eq!(port, udp_sport_for_flow(0, q, q));
    assert_eq!(port, 49441);
    let (port, q) = sport_of("rc_atomic_cas.pcap", Opcode::RC_COMPARE_SWAP);
    assert_eq!(port, udp_sport_for_flow(0, q, q));
    let (port, q) = sport_of("ud_send.pcap", Opcode::UD_SEND_ONLY);
    assert_eq!(port, udp_sport_for_qpn(q));
    assert_eq!(
        udp_sport_for_qpn(Qpn::GSI),
        55410,
        "rxe's CM packets from QP1"
    );
}
