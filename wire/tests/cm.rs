//! IB CM MADs from real `rdma_rxe` captures (wire/tests/data/cm, provenance in PROVENANCE.md
//! there; and ../rxe/rdmacm_*.pcap). Every CM MAD must parse, every field must equal what the
//! independent expectations in `cm_expected.txt` say (tshark's InfiniBand dissector, checked
//! against a raw-bytes reader), and every MAD must rebuild bit-exact into buffers pre-filled
//! with 0x00 and 0xFF. Then the rdma_cm facts the captures show, property round trips for each
//! message, and malformed input.
use proptest::prelude::*;
use rocemu_wire::capture::CaptureReader;
use rocemu_wire::cm::*;
use rocemu_wire::mad::{gsi_payload, AttrId, MadError, MadRepr, Method, MgmtClass, Tid, MAD_LEN};
use rocemu_wire::{parse_frame, udp_sport_for_flow, Opcode, PKey, Psn, QKey, Qpn};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

fn cm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cm")
}

fn frames(path: &Path) -> Vec<Vec<u8>> {
    CaptureReader::open(path)
        .unwrap()
        .map(|f| f.unwrap().data)
        .collect()
}

/// The captures with CM traffic, as `cm_expected.txt` names them.
fn captures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(cm_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    v.push("../rxe/rdmacm_rping.pcap".into());
    v.push("../rxe/rdmacm_udaddy.pcap".into());
    v.sort();
    v
}

/// The CM MADs of a capture: (frame number from 1, frame bytes).
fn cm_frames(name: &str) -> Vec<(usize, Vec<u8>)> {
    frames(&cm_dir().join(name))
        .into_iter()
        .enumerate()
        .filter(|(_, f)| {
            parse_frame(f)
                .ok()
                .and_then(|p| gsi_payload(&p).map(|m| m.get(1) == Some(&0x07)))
                .unwrap_or(false)
        })
        .map(|(i, f)| (i + 1, f))
        .collect()
}

fn parse_cm(frame: &[u8]) -> CmMadRepr {
    let p = parse_frame(frame).unwrap();
    CmMadRepr::parse(gsi_payload(&p).unwrap()).unwrap()
}

fn h(v: impl Into<u64>) -> String {
    format!("0x{:x}", v.into())
}

/// Private data and ARI as `cm_expected.txt` writes them: hex without trailing zero bytes.
fn z(b: &[u8]) -> String {
    let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    b[..n].iter().map(|x| format!("{x:02x}")).collect()
}

fn gid(g: Ipv6Addr) -> String {
    g.octets().iter().map(|x| format!("{x:02x}")).collect()
}

fn path_fields(out: &mut BTreeMap<String, String>, pre: &str, p: &CmPath) {
    let mut put = |k: &str, v: String| {
        out.insert(format!("{pre}{k}"), v);
    };
    put("local_lid", h(p.local_lid));
    put("remote_lid", h(p.remote_lid));
    put("local_gid", gid(p.local_gid));
    put("remote_gid", gid(p.remote_gid));
    put("flow_label", h(p.flow_label));
    put("resv_rate", h(p.resv_rate));
    put("packet_rate", h(p.packet_rate));
    put("traffic_class", h(p.traffic_class));
    put("hop_limit", h(p.hop_limit));
    put("sl", h(p.sl));
    put("subnet_local", h(p.subnet_local));
    put("resv_sl", h(p.resv_sl));
    put("local_ack_timeout", h(p.local_ack_timeout));
    put("resv_ack", h(p.resv_ack));
}

fn cma_fields(out: &mut BTreeMap<String, String>, pd: &[u8]) {
    // The expectations read the rdma_cm header's bytes whatever they hold; so does this.
    let c = CmaHdr::parse(pd).expect("every REQ and SIDR_REQ here is rdma_cm's");
    out.insert("cma.cma_version".into(), h(c.cma_version));
    out.insert("cma.ip_version".into(), h(c.ip_version));
    out.insert("cma.resv".into(), h(c.resv));
    out.insert("cma.src_port".into(), h(c.src_port));
    out.insert("cma.src_addr".into(), z16(&c.src_addr));
    out.insert("cma.dst_addr".into(), z16(&c.dst_addr));
}

fn z16(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every field of a parsed CM MAD, named and formatted as in `cm_expected.txt`.
fn fields(m: &CmMadRepr) -> (String, BTreeMap<String, String>) {
    let mut o = BTreeMap::new();
    let mad = &m.mad;
    for (k, v) in [
        ("base_version", h(mad.base_version)),
        ("mgmt_class", h(mad.mgmt_class.0)),
        ("class_version", h(mad.class_version)),
        ("method", h(mad.method.0)),
        ("status", h(mad.status)),
        ("class_specific", h(mad.class_specific)),
        ("tid", h(mad.tid.0)),
        ("attr_id", h(mad.attr_id.0)),
        ("resv", h(mad.resv)),
        ("attr_mod", h(mad.attr_mod)),
    ] {
        o.insert(format!("mad.{k}"), v);
    }
    let mut put = |k: &str, v: String| {
        o.insert(k.to_string(), v);
    };
    match &m.msg {
        CmMessage::Req(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("resv4", h(r.resv4));
            put("service_id", h(r.service_id.0));
            put("local_ca_guid", h(r.local_ca_guid.0));
            put("resv24", h(r.resv24));
            put("local_qkey", h(r.local_qkey.0));
            put("local_qpn", h(r.local_qpn.value()));
            put("responder_resources", h(r.responder_resources));
            put("local_eecn", h(r.local_eecn));
            put("initiator_depth", h(r.initiator_depth));
            put("remote_eecn", h(r.remote_eecn));
            put(
                "remote_cm_response_timeout",
                h(r.remote_cm_response_timeout),
            );
            put("transport_service_type", h(r.transport_service_type.bits()));
            put("end_to_end_flow_control", h(r.end_to_end_flow_control));
            put("starting_psn", h(r.starting_psn.value()));
            put("local_cm_response_timeout", h(r.local_cm_response_timeout));
            put("retry_count", h(r.retry_count));
            put("pkey", h(r.pkey.0));
            put("path_mtu", h(r.path_mtu));
            put("rdc_exists", h(r.rdc_exists));
            put("rnr_retry_count", h(r.rnr_retry_count));
            put("max_cm_retries", h(r.max_cm_retries));
            put("srq", h(r.srq));
            put("extended_transport_type", h(r.extended_transport_type));
            put("private_data", z(&r.private_data));
            path_fields(&mut o, "p.", &r.primary_path);
            path_fields(&mut o, "a.", &r.alternate_path);
            cma_fields(&mut o, &r.private_data);
        }
        CmMessage::Mra(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("remote_comm_id", h(r.remote_comm_id.0));
            put("message_mraed", h(r.message_mraed.bits()));
            put("resv8", h(r.resv8));
            put("service_timeout", h(r.service_timeout));
            put("resv9", h(r.resv9));
            put("private_data", z(&r.private_data));
        }
        CmMessage::Rej(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("remote_comm_id", h(r.remote_comm_id.0));
            put("message_rejected", h(r.message_rejected.bits()));
            put("resv8", h(r.resv8));
            put("reject_info_len", h(r.reject_info_len));
            put("resv9", h(r.resv9));
            put("reason", h(r.reason.0));
            put("ari", z(&r.ari));
            put("private_data", z(&r.private_data));
        }
        CmMessage::Rep(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("remote_comm_id", h(r.remote_comm_id.0));
            put("local_qkey", h(r.local_qkey.0));
            put("local_qpn", h(r.local_qpn.value()));
            put("resv_qpn", h(r.resv_qpn));
            put("local_eecn", h(r.local_eecn));
            put("resv_eecn", h(r.resv_eecn));
            put("starting_psn", h(r.starting_psn.value()));
            put("resv_psn", h(r.resv_psn));
            put("responder_resources", h(r.responder_resources));
            put("initiator_depth", h(r.initiator_depth));
            put("target_ack_delay", h(r.target_ack_delay));
            put("failover_accepted", h(r.failover_accepted));
            put("end_to_end_flow_control", h(r.end_to_end_flow_control));
            put("rnr_retry_count", h(r.rnr_retry_count));
            put("srq", h(r.srq));
            put("resv27", h(r.resv27));
            put("local_ca_guid", h(r.local_ca_guid.0));
            put("private_data", z(&r.private_data));
        }
        CmMessage::Rtu(r) | CmMessage::Drep(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("remote_comm_id", h(r.remote_comm_id.0));
            put("private_data", z(&r.private_data));
        }
        CmMessage::Dreq(r) => {
            put("local_comm_id", h(r.local_comm_id.0));
            put("remote_comm_id", h(r.remote_comm_id.0));
            put("remote_qpn", h(r.remote_qpn.value()));
            put("resv_qpn", h(r.resv_qpn));
            put("private_data", z(&r.private_data));
        }
        CmMessage::SidrReq(r) => {
            put("request_id", h(r.request_id.0));
            put("pkey", h(r.pkey.0));
            put("resv6", h(r.resv6));
            put("service_id", h(r.service_id.0));
            put("private_data", z(&r.private_data));
            cma_fields(&mut o, &r.private_data);
        }
        CmMessage::SidrRep(r) => {
            put("request_id", h(r.request_id.0));
            put("status", h(r.status.0));
            put("additional_info_len", h(r.additional_info_len));
            put("resv6", h(r.resv6));
            put("qpn", h(r.qpn.value()));
            put("resv_qpn", h(r.resv_qpn));
            put("service_id", h(r.service_id.0));
            put("qkey", h(r.qkey.0));
            put("additional_info", z(&r.additional_info));
            put("private_data", z(&r.private_data));
        }
    }
    (m.msg.name().to_string(), o)
}

struct Expected {
    capture: String,
    frame: usize,
    msg: String,
    fields: BTreeMap<String, String>,
}

fn expected() -> Vec<Expected> {
    std::fs::read_to_string(cm_dir().join("cm_expected.txt"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut it = l.split(' ');
            let capture = it.next().unwrap().to_string();
            let frame = it.next().unwrap().parse().unwrap();
            let msg = it.next().unwrap().to_string();
            let fields = it
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.to_string())
                })
                .collect();
            Expected {
                capture,
                frame,
                msg,
                fields,
            }
        })
        .collect()
}

#[test]
fn every_cm_mad_parses_matches_the_dissector_and_rebuilds_bit_exact() {
    let exp = expected();
    let mut cache: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
    let mut kinds = BTreeSet::new();
    for e in &exp {
        let fr = cache
            .entry(e.capture.clone())
            .or_insert_with(|| frames(&cm_dir().join(&e.capture)));
        let at = format!("{} frame {}", e.capture, e.frame);
        let p = parse_frame(&fr[e.frame - 1]).unwrap_or_else(|err| panic!("{at}: {err}"));
        assert!(p.icrc_ok(), "{at}: ICRC");
        assert_eq!(p.opcode(), Opcode::UD_SEND_ONLY, "{at}");
        let deth = p.ext.deth.unwrap();
        assert_eq!(deth.qkey, QKey::GSI, "{at}: GSI Q_Key");
        assert_eq!(deth.src_qpn, Qpn::GSI, "{at}: from QP1");
        let mad = gsi_payload(&p).unwrap();
        assert_eq!(mad.len(), MAD_LEN, "{at}");
        let m = CmMadRepr::parse(mad).unwrap_or_else(|err| panic!("{at}: {err}"));
        let (name, got) = fields(&m);
        assert_eq!(name, e.msg, "{at}");
        for (k, v) in &e.fields {
            assert_eq!(got.get(k), Some(v), "{at}: {} {k}", e.msg);
        }
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            e.fields.keys().collect::<Vec<_>>(),
            "{at}: the same fields"
        );
        for fill in [0x00u8, 0xff] {
            let mut buf = vec![fill; MAD_LEN + 16];
            assert_eq!(m.emit(&mut buf), Ok(MAD_LEN));
            assert_eq!(&buf[..MAD_LEN], mad, "{at}: rebuild into 0x{fill:02x}");
            assert!(
                buf[MAD_LEN..].iter().all(|&b| b == fill),
                "{at}: wrote past the MAD"
            );
        }
        // The header alone parses the same way.
        assert_eq!(MadRepr::parse(mad).unwrap(), m.mad);
        kinds.insert(e.msg.clone());
    }
    // Every CM MAD in the captures is in the expectations, and nothing else.
    let listed: BTreeSet<(String, usize)> =
        exp.iter().map(|e| (e.capture.clone(), e.frame)).collect();
    let mut seen = BTreeSet::new();
    for c in captures() {
        for (n, _) in cm_frames(&c) {
            seen.insert((c.clone(), n));
        }
    }
    assert_eq!(seen, listed);
    let want: BTreeSet<String> = [
        "REQ", "REP", "RTU", "DREQ", "DREP", "REJ", "MRA", "SIDR_REQ", "SIDR_REP",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds, want, "every message kind has a real capture");
    assert!(exp.len() >= 60, "{} CM MADs", exp.len());
}

fn sequence(name: &str) -> Vec<String> {
    cm_frames(name)
        .iter()
        .map(|(_, f)| {
            let m = parse_cm(f);
            match m.msg {
                CmMessage::Rej(r) => format!("REJ({})", r.reason.0),
                msg => msg.name().to_string(),
            }
        })
        .collect()
}

#[test]
fn the_cm_exchanges_of_each_tool() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        sequence("rping.pcap"),
        s(&["REQ", "REP", "RTU", "DREQ", "DREP"])
    );
    assert_eq!(
        sequence("rping_ipv6.pcap"),
        s(&["REQ", "REP", "RTU", "DREQ", "DREP"])
    );
    // perftest -R: a connection for its own exchange, then one for the test QP; both torn down.
    assert_eq!(
        sequence("write_bw_rdma_cm.pcap"),
        s(&["REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREP", "DREQ", "DREP"])
    );
    assert_eq!(sequence("rej_no_listener.pcap"), s(&["REQ", "REJ(8)"]));
    assert_eq!(
        sequence("rping_mra_rej.pcap"),
        s(&[
            "REQ", "REQ", "REQ", "REQ", // four clients, the server stopped
            "REQ", "MRA", "REQ", "MRA", "REQ", "MRA", // retries: MRA for the queued three
            "REQ", // the fourth, beyond the backlog: no answer
            "REP", "RTU", "DREQ", "DREP", // the server resumes and takes one
            "REJ(28)", "REJ(28)", // and rejects the others as it exits
            "REQ", "REJ(8)", // the fourth retries: nobody listens any more
        ])
    );
    assert_eq!(
        sequence("../rxe/rdmacm_udaddy.pcap"),
        s(&["SIDR_REQ", "SIDR_REP"])
    );
}

#[test]
fn rdma_cm_facts_hold_in_every_capture() {
    for c in captures() {
        let mut reqs: HashMap<u32, ReqRepr> = HashMap::new();
        for (n, f) in cm_frames(&c) {
            let at = format!("{c} frame {n}");
            let p = parse_frame(&f).unwrap();
            let m = CmMadRepr::parse(gsi_payload(&p).unwrap()).unwrap();
            // Linux: CM MADs are Sends, TID high half = the MAD agent, class version 2.
            assert_eq!(m.mad.method, Method::SEND, "{at}");
            assert_eq!(m.mad.tid.0 >> 32, 2, "{at}");
            match m.msg {
                CmMessage::Req(r) => {
                    let (ps, port) = r.service_id.rdma_cm_port().expect("rdma_cm service ID");
                    assert_eq!(ps, PortSpace::TCP, "{at}");
                    let cma = r.cma_hdr().unwrap().unwrap();
                    assert_eq!(cma.src_ip(), p.ip.src(), "{at}: cma_hdr source");
                    assert_eq!(cma.dst_ip(), p.ip.dst(), "{at}: cma_hdr destination");
                    assert_eq!(
                        r.primary_path.flow_label,
                        rdma_cm_flow_label(cma.src_port, port),
                        "{at}: flow label from the rdma_cm ports"
                    );
                    // The application's private data after the cma_hdr is empty for every tool.
                    assert!(
                        r.private_data[CMA_HDR_LEN..].iter().all(|&b| b == 0),
                        "{at}"
                    );
                    let gid = |a: IpAddr| match a {
                        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                        IpAddr::V6(v6) => v6,
                    };
                    assert_eq!(r.primary_path.local_gid, gid(p.ip.src()), "{at}");
                    assert_eq!(r.primary_path.remote_gid, gid(p.ip.dst()), "{at}");
                    assert_eq!(r.primary_path.local_lid, 0xffff, "{at}");
                    assert_eq!(r.primary_path.hop_limit, 64, "{at}");
                    assert_eq!(r.pkey, PKey::DEFAULT, "{at}");
                    assert_eq!(r.path_mtu, 3, "{at}: 1024, the rxe active MTU");
                    assert_eq!(r.transport_service_type, ServiceType::Rc, "{at}");
                    reqs.insert(r.local_comm_id.0, r);
                }
                CmMessage::Rep(r) => {
                    let req = reqs[&r.remote_comm_id.0];
                    assert_eq!(m.mad.tid, parse_tid_of_req(&c, req.local_comm_id), "{at}");
                    assert!(r.responder_resources <= req.initiator_depth.max(1), "{at}");
                }
                CmMessage::SidrReq(r) => {
                    assert_eq!(r.service_id.rdma_cm_port().unwrap().0, PortSpace::UDP);
                    let cma = CmaHdr::parse(&r.private_data).unwrap();
                    assert_eq!(cma.src_ip(), p.ip.src(), "{at}");
                }
                CmMessage::SidrRep(r) => {
                    assert_eq!(r.status, SidrStatus::SUCCESS, "{at}");
                    assert_eq!(r.qkey, QKey(0x0123_4567), "{at}: RDMA_UDP_QKEY");
                }
                _ => {}
            }
        }
    }
}

fn parse_tid_of_req(capture: &str, id: CommId) -> Tid {
    cm_frames(capture)
        .iter()
        .map(|(_, f)| parse_cm(f))
        .find(|m| matches!(m.msg, CmMessage::Req(r) if r.local_comm_id == id))
        .unwrap()
        .mad
        .tid
}

/// rping.pcap: which side sends from which Starting PSN, and the data path's UDP source port.
#[test]
fn starting_psns_and_udp_source_port_of_the_connected_qp() {
    let fr = frames(&cm_dir().join("rping.pcap"));
    let req = match parse_cm(&fr[0]).msg {
        CmMessage::Req(r) => r,
        m => panic!("{m:?}"),
    };
    let rep = match parse_cm(&fr[1]).msg {
        CmMessage::Rep(r) => r,
        m => panic!("{m:?}"),
    };
    let active = parse_frame(&fr[0]).unwrap().ip.src();
    let sport = udp_sport_for_flow(req.primary_path.flow_label, req.local_qpn, rep.local_qpn);
    let mut first_psn: HashMap<bool, Psn> = HashMap::new();
    for f in &fr {
        let p = parse_frame(f).unwrap();
        if p.bth.dqpn == Qpn::GSI {
            continue;
        }
        assert_eq!(p.udp.sport, sport, "both ends use the flow label's port");
        // The first request packet each side sends (ACKs and read responses carry the
        // requester's PSNs).
        let is_request = !matches!(
            p.opcode(),
            Opcode::RC_ACKNOWLEDGE | Opcode::RC_RDMA_READ_RESPONSE_ONLY
        );
        if is_request {
            first_psn.entry(p.ip.src() == active).or_insert(p.bth.psn);
        }
    }
    assert_eq!(
        first_psn[&true], rep.starting_psn,
        "active side sends from the REP's PSN"
    );
    assert_eq!(
        first_psn[&false], req.starting_psn,
        "passive side sends from the REQ's PSN"
    );
}

/// rping's data path: the 16-byte `struct rping_rdma_info` {be64 buf, be32 rkey, be32 size} the
/// client sends advertises the buffer the server then reads or writes.
#[test]
fn rping_advertises_buffers_the_server_then_reads_and_writes() {
    let fr = frames(&cm_dir().join("rping.pcap"));
    let mut advertised: Option<(u64, u32, u32)> = None;
    let mut checked = 0;
    for f in &fr {
        let p = parse_frame(f).unwrap();
        match p.opcode() {
            Opcode::RC_SEND_ONLY if p.payload.iter().any(|&b| b != 0) => {
                let b = p.payload;
                assert_eq!(b.len(), 16);
                advertised = Some((
                    u64::from_be_bytes(b[..8].try_into().unwrap()),
                    u32::from_be_bytes(b[8..12].try_into().unwrap()),
                    u32::from_be_bytes(b[12..16].try_into().unwrap()),
                ));
            }
            Opcode::RC_RDMA_READ_REQUEST | Opcode::RC_RDMA_WRITE_ONLY => {
                let reth = p.ext.reth.unwrap();
                let (va, rkey, len) = advertised.take().expect("advertised first");
                assert_eq!((reth.va, reth.rkey.0, reth.dma_len), (va, rkey, len));
                checked += 1;
            }
            _ => {}
        }
    }
    assert_eq!(checked, 6, "3 iterations × (READ + WRITE)");
}

// ------------------------------------------------------------------------------------------
// Property tests.

const ATTRS: [AttrId; 9] = [
    attr::REQ,
    attr::MRA,
    attr::REJ,
    attr::REP,
    attr::RTU,
    attr::DREQ,
    attr::DREP,
    attr::SIDR_REQ,
    attr::SIDR_REP,
];

fn arb_cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(ATTRS.to_vec()),
        any::<u64>(),
        any::<u8>(),
        any::<[u8; 4]>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 232),
    )
        .prop_map(|(attr, tid, method, stat, amod, data)| {
            let mut m = vec![1u8, 0x07, 2, method];
            m.extend_from_slice(&stat);
            m.extend_from_slice(&tid.to_be_bytes());
            m.extend_from_slice(&attr.0.to_be_bytes());
            m.extend_from_slice(&[0xa5, 0x5a]);
            m.extend_from_slice(&amod.to_be_bytes());
            m.extend_from_slice(&data);
            m
        })
}

fn arb_bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    proptest::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn arb_gid() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

fn arb_path() -> impl Strategy<Value = CmPath> {
    (
        (any::<u16>(), any::<u16>(), arb_gid(), arb_gid()),
        (0u32..1 << 20, 0u8..64, 0u8..64, any::<u8>(), any::<u8>()),
        (0u8..16, any::<bool>(), 0u8..8, 0u8..32, 0u8..8),
    )
        .prop_map(|(a, b, c)| CmPath {
            local_lid: a.0,
            remote_lid: a.1,
            local_gid: a.2,
            remote_gid: a.3,
            flow_label: b.0,
            resv_rate: b.1,
            packet_rate: b.2,
            traffic_class: b.3,
            hop_limit: b.4,
            sl: c.0,
            subnet_local: c.1,
            resv_sl: c.2,
            local_ack_timeout: c.3,
            resv_ack: c.4,
        })
}

fn arb_service_type() -> impl Strategy<Value = ServiceType> {
    (0u8..4).prop_map(ServiceType::from_bits)
}

fn arb_kind() -> impl Strategy<Value = MsgKind> {
    (0u8..4).prop_map(MsgKind::from_bits)
}

fn arb_req() -> impl Strategy<Value = ReqRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        ),
        (
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
            0u8..32,
        ),
        (
            arb_service_type(),
            any::<bool>(),
            0u32..1 << 24,
            0u8..32,
            0u8..8,
            any::<u16>(),
        ),
        (
            0u8..16,
            any::<bool>(),
            0u8..8,
            0u8..16,
            any::<bool>(),
            0u8..8,
        ),
        (arb_path(), arb_path(), arb_bytes::<92>()),
    )
        .prop_map(|(a, b, c, d, e)| ReqRepr {
            local_comm_id: CommId(a.0),
            resv4: a.1,
            service_id: ServiceId(a.2),
            local_ca_guid: Guid(a.3),
            resv24: a.4,
            local_qkey: QKey(a.5),
            local_qpn: Qpn::new(b.0),
            responder_resources: b.1,
            local_eecn: b.2,
            initiator_depth: b.3,
            remote_eecn: b.4,
            remote_cm_response_timeout: b.5,
            transport_service_type: c.0,
            end_to_end_flow_control: c.1,
            starting_psn: Psn::new(c.2),
            local_cm_response_timeout: c.3,
            retry_count: c.4,
            pkey: PKey(c.5),
            path_mtu: d.0,
            rdc_exists: d.1,
            rnr_retry_count: d.2,
            max_cm_retries: d.3,
            srq: d.4,
            extended_transport_type: d.5,
            primary_path: e.0,
            alternate_path: e.1,
            private_data: e.2,
        })
}

fn arb_rep() -> impl Strategy<Value = RepRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            0u32..1 << 24,
            any::<u8>(),
        ),
        (
            0u32..1 << 24,
            any::<u8>(),
            0u32..1 << 24,
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
        ),
        (
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..8,
            any::<bool>(),
            0u8..16,
        ),
        (any::<u64>(), arb_bytes::<196>()),
    )
        .prop_map(|(a, b, c, d)| RepRepr {
            local_comm_id: CommId(a.0),
            remote_comm_id: CommId(a.1),
            local_qkey: QKey(a.2),
            local_qpn: Qpn::new(a.3),
            resv_qpn: a.4,
            local_eecn: b.0,
            resv_eecn: b.1,
            starting_psn: Psn::new(b.2),
            resv_psn: b.3,
            responder_resources: b.4,
            initiator_depth: b.5,
            target_ack_delay: c.0,
            failover_accepted: c.1,
            end_to_end_flow_control: c.2,
            rnr_retry_count: c.3,
            srq: c.4,
            resv27: c.5,
            local_ca_guid: Guid(d.0),
            private_data: d.1,
        })
}

fn arb_rej() -> impl Strategy<Value = RejRepr> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            arb_kind(),
            0u8..64,
            0u8..128,
            0u8..2,
        ),
        (any::<u16>(), arb_bytes::<72>(), arb_bytes::<148>()),
    )
        .prop_map(|(a, b)| RejRepr {
            local_comm_id: CommId(a.0),
            remote_comm_id: CommId(a.1),
            message_rejected: a.2,
            resv8: a.3,
            reject_info_len: a.4,
            resv9: a.5,
            reason: RejReason(b.0),
            ari: b.1,
            private_data: b.2,
        })
}

fn arb_mra() -> impl Strategy<Value = MraRepr> {
    (
        any::<u32>(),
        any::<u32>(),
        arb_kind(),
        0u8..64,
        0u8..32,
        0u8..8,
        arb_bytes::<222>(),
    )
        .prop_map(|(l, r, k, r8, t, r9, pd)| MraRepr {
            local_comm_id: CommId(l),
            remote_comm_id: CommId(r),
            message_mraed: k,
            resv8: r8,
            service_timeout: t,
            resv9: r9,
            private_data: pd,
        })
}

fn arb_rtu() -> impl Strategy<Value = RtuRepr> {
    (any::<u32>(), any::<u32>(), arb_bytes::<224>()).prop_map(|(l, r, pd)| RtuRepr {
        local_comm_id: CommId(l),
        remote_comm_id: CommId(r),
        private_data: pd,
    })
}

fn arb_dreq() -> impl Strategy<Value = DreqRepr> {
    (
        any::<u32>(),
        any::<u32>(),
        0u32..1 << 24,
        any::<u8>(),
        arb_bytes::<220>(),
    )
        .prop_map(|(l, r, q, rq, pd)| DreqRepr {
            local_comm_id: CommId(l),
            remote_comm_id: CommId(r),
            remote_qpn: Qpn::new(q),
            resv_qpn: rq,
            private_data: pd,
        })
}

fn arb_sidr_req() -> impl Strategy<Value = SidrReqRepr> {
    (
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        arb_bytes::<216>(),
    )
        .prop_map(|(id, pk, r, s, pd)| SidrReqRepr {
            request_id: CommId(id),
            pkey: PKey(pk),
            resv6: r,
            service_id: ServiceId(s),
            private_data: pd,
        })
}

fn arb_sidr_rep() -> impl Strategy<Value = SidrRepRepr> {
    (
        (
            any::<u32>(),
            any::<u8>(),
            any::<u8>(),
            any::<u16>(),
            0u32..1 << 24,
            any::<u8>(),
        ),
        (
            any::<u64>(),
            any::<u32>(),
            arb_bytes::<72>(),
            arb_bytes::<136>(),
        ),
    )
        .prop_map(|(a, b)| SidrRepRepr {
            request_id: CommId(a.0),
            status: SidrStatus(a.1),
            additional_info_len: a.2,
            resv6: a.3,
            qpn: Qpn::new(a.4),
            resv_qpn: a.5,
            service_id: ServiceId(b.0),
            qkey: QKey(b.1),
            additional_info: b.2,
            private_data: b.3,
        })
}

fn arb_message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        arb_req().prop_map(CmMessage::Req),
        arb_mra().prop_map(CmMessage::Mra),
        arb_rej().prop_map(CmMessage::Rej),
        arb_rep().prop_map(CmMessage::Rep),
        arb_rtu().prop_map(CmMessage::Rtu),
        arb_dreq().prop_map(CmMessage::Dreq),
        arb_rtu().prop_map(CmMessage::Drep),
        arb_sidr_req().prop_map(CmMessage::SidrReq),
        arb_sidr_rep().prop_map(CmMessage::SidrRep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Repr → emit → parse gives back every field, and emit writes all 256 bytes.
    #[test]
    fn each_message_round_trips(msg in arb_message(), tid in any::<u64>(), st in any::<u16>()) {
        let mut m = CmMadRepr::new(Tid(tid), msg);
        m.mad.status = st;
        let mut a = [0x00u8; MAD_LEN];
        let mut b = [0xffu8; MAD_LEN];
        prop_assert_eq!(m.emit(&mut a), Ok(MAD_LEN));
        prop_assert_eq!(m.emit(&mut b), Ok(MAD_LEN));
        prop_assert_eq!(a, b);
        let p = CmMadRepr::parse(&a).unwrap();
        prop_assert_eq!(p, m);
        prop_assert_eq!(p.mad.attr_id, msg.attr_id());
    }

    /// Bytes → parse → emit gives back the same bytes, whatever the data area holds.
    #[test]
    fn any_cm_mad_rebuilds_bit_exact(mad in arb_cm_mad()) {
        let m = CmMadRepr::parse(&mad).unwrap();
        let mut out = [0x5au8; MAD_LEN];
        prop_assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
        prop_assert_eq!(&out[..], &mad[..]);
    }

    /// Arbitrary bytes: a value or an error, never a panic; the error matches the defect.
    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        match CmMadRepr::parse(&data) {
            Ok(m) => {
                let mut out = [0u8; MAD_LEN];
                m.emit(&mut out).unwrap();
                prop_assert_eq!(&out[..], &data[..]);
            }
            Err(MadError::Length { len }) => prop_assert!(len != MAD_LEN),
            Err(MadError::BaseVersion(v)) => prop_assert!(v != 1),
            Err(MadError::Class { found, .. }) => prop_assert!(found != MgmtClass::CM),
            Err(MadError::ClassVersion { version, .. }) => prop_assert!(version != 2),
            Err(MadError::Attribute { attr, .. }) => prop_assert!(!ATTRS.contains(&attr)),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
        let _ = CmaHdr::parse(&data).map(|h| (h.src(), h.dst_ip()));
        let _ = MadRepr::parse(&data);
        rocemu_wire::fuzzing::cm_mad_target(&data);
    }

    /// Any well-formed MAD with a mutated header byte: still no panic, and the same verdicts.
    #[test]
    fn mutated_headers_give_typed_errors(mad in arb_cm_mad(), at in 0usize..24, v in any::<u8>()) {
        let mut m = mad.clone();
        m[at] = v;
        let r = CmMadRepr::parse(&m);
        match at {
            0 if v != 1 => prop_assert_eq!(r, Err(MadError::BaseVersion(v))),
            1 if v != 7 => {
                let class_err = matches!(r, Err(MadError::Class { .. }));
                prop_assert!(class_err);
            }
            2 if v != 2 => {
                let version_err = matches!(r, Err(MadError::ClassVersion { .. }));
                prop_assert!(version_err);
            }
            16 | 17 => prop_assert_eq!(r.is_ok(), ATTRS.contains(&AttrId(u16::from_be_bytes([m[16], m[17]])))),
            _ => prop_assert!(r.is_ok()),
        }
    }

    #[test]
    fn cma_hdr_round_trips(v6 in any::<bool>(), s in any::<u128>(), d in any::<u128>(), port in any::<u16>(), resv in 0u8..16) {
        let (src, dst): (IpAddr, IpAddr) = if v6 {
            (Ipv6Addr::from(s).into(), Ipv6Addr::from(d).into())
        } else {
            (std::net::Ipv4Addr::from(s as u32).into(), std::net::Ipv4Addr::from(d as u32).into())
        };
        let mut h = CmaHdr::new(std::net::SocketAddr::new(src, port), dst).unwrap();
        h.resv = resv;
        let mut buf = [0xeeu8; 40];
        prop_assert_eq!(h.emit(&mut buf), Ok(CMA_HDR_LEN));
        let p = CmaHdr::parse(&buf).unwrap();
        prop_assert_eq!(p, h);
        prop_assert_eq!(p.src_ip(), src);
        prop_assert_eq!(p.dst_ip(), dst);
        prop_assert_eq!(p.src_port, port);
    }
}

#[test]
fn malformed_inputs_are_errors() {
    let good = {
        let mut b = [0u8; MAD_LEN];
        CmMadRepr::new(Tid(7), CmMessage::Req(ReqRepr::default()))
            .emit(&mut b)
            .unwrap();
        b
    };
    for len in [0, 1, 23, 24, 255, 257, 512] {
        let mut v = good.to_vec();
        v.resize(len, 0);
        assert_eq!(CmMadRepr::parse(&v), Err(MadError::Length { len }));
    }
    // ClassPortInfo, LAP, APR and undefined attributes are not parsed.
    for a in [
        attr::CLASS_PORT_INFO,
        attr::LAP,
        attr::APR,
        AttrId(0),
        AttrId(0xffff),
    ] {
        let mut v = good;
        v[16..18].copy_from_slice(&a.0.to_be_bytes());
        assert_eq!(
            CmMadRepr::parse(&v),
            Err(MadError::Attribute {
                class: MgmtClass::CM,
                attr: a
            })
        );
    }
    // A REQ whose private data is not an rdma_cm header: the REQ parses, the header does not.
    let mut req = ReqRepr {
        service_id: ServiceId::rdma_cm(PortSpace::TCP, 7174),
        ..ReqRepr::default()
    };
    req.private_data[0] = 3;
    assert_eq!(req.cma_hdr(), Some(Err(MadError::CmaVersion(3))));
    req.private_data[0] = 0;
    req.private_data[1] = 0x00;
    assert_eq!(req.cma_hdr(), Some(Err(MadError::CmaIpVersion(0))));
    req.service_id = ServiceId(0x0200_0000_0000_0001);
    assert_eq!(req.cma_hdr(), None, "not an rdma_cm service ID");
    // Errors say what they are.
    assert_eq!(
        MadError::Length { len: 3 }.to_string(),
        "not a MAD: 3 bytes, a MAD has 256"
    );
    assert_eq!(RejReason(28).to_string(), "consumer reject (28)");
    assert_eq!(RejReason(34).to_string(), "reason 34");
}

#[test]
fn a_req_built_from_values_looks_like_linux_s() {
    // The first REQ of rping.pcap, rebuilt from values alone (what RoCEmu's CM will send).
    let fr = frames(&cm_dir().join("rping.pcap"));
    let want = parse_cm(&fr[0]);
    let cma = CmaHdr::new(
        "10.99.0.12:57476".parse().unwrap(),
        "10.99.0.11".parse().unwrap(),
    )
    .unwrap();
    let mut private_data = [0u8; private_len::REQ];
    cma.emit(&mut private_data).unwrap();
    let path = CmPath {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: "::ffff:10.99.0.12".parse().unwrap(),
        remote_gid: "::ffff:10.99.0.11".parse().unwrap(),
        flow_label: rdma_cm_flow_label(57476, 7174),
        hop_limit: 64,
        local_ack_timeout: 19,
        ..CmPath::default()
    };
    let req = ReqRepr {
        local_comm_id: CommId(0x236b_a112),
        service_id: ServiceId::rdma_cm(PortSpace::TCP, 7174),
        local_ca_guid: Guid(0x5054_00ff_fe99_0002),
        local_qpn: Qpn::new(0x11),
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 20,
        starting_psn: Psn::new(0xf5b7cb),
        local_cm_response_timeout: 20,
        retry_count: 7,
        path_mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        primary_path: path,
        private_data,
        ..ReqRepr::default()
    };
    let got = CmMadRepr::new(Tid(0x0000_0002_12a1_6b23), CmMessage::Req(req));
    assert_eq!(got, want);
    let mut a = [0u8; MAD_LEN];
    got.emit(&mut a).unwrap();
    let p = parse_frame(&fr[0]).unwrap();
    assert_eq!(&a[..], gsi_payload(&p).unwrap());
    assert_eq!(
        Guid(0x5054_00ff_fe99_0002).to_string(),
        "5054:00ff:fe99:0002"
    );
}
