//! `rocemu decode [--json] FILE` (contract: shared/contracts.md).
use rocemu_wire::capture::{CaptureReader, CapturedFrame, LinkType};
use rocemu_wire::frame::parse_ip_packet;
use rocemu_wire::{parse_frame, Error, ParsedFrame};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per frame (JSON Lines) instead of one line of text.
    #[arg(long)]
    json: bool,
    /// The capture: pcap (micro- or nanosecond, either byte order) or pcapng.
    file: PathBuf,
}

pub fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let reader = CaptureReader::open(&a.file)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for f in reader {
        let f = match f {
            Ok(f) => f,
            Err(e) => {
                out.flush()?;
                return Err(format!("{}: {e}", a.file.display()).into());
            }
        };
        let parsed = parse_captured(&f);
        let r = if a.json {
            serde_json::to_writer(&mut out, &frame_json(f.number, &parsed))
                .map_err(std::io::Error::from)
                .and_then(|_| out.write_all(b"\n"))
        } else {
            writeln!(out, "{}", text_line(&f, &parsed))
        };
        if let Err(e) = r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(e.into());
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Why a frame is not a RoCEv2 packet, or the packet.
#[allow(clippy::large_enum_variant)] // short-lived, one per frame
pub enum Decoded<'a> {
    Frame(ParsedFrame<'a>),
    Bad(String),
}

/// For a frame that is not RoCEv2: what it is, as far as the headers tell (for the text line).
fn summary(f: &CapturedFrame) -> Option<String> {
    use rocemu_wire::eth::{EthernetRepr, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
    use rocemu_wire::ip::{Ipv4Repr, Ipv6Repr};
    if f.link != LinkType::Ethernet {
        return None;
    }
    let (eth, l3) = EthernetRepr::parse(&f.data).ok()?;
    let rest = &f.data[l3..];
    let (src, dst, proto, l4) = match eth.ethertype {
        ETHERTYPE_ARP => return Some(format!("{} → {} ARP", eth.src, eth.dst)),
        ETHERTYPE_IPV4 => {
            let (r, d) = Ipv4Repr::parse(rest).ok()?;
            (
                r.src.to_string(),
                r.dst.to_string(),
                r.protocol,
                &d[r.header_len..],
            )
        }
        ETHERTYPE_IPV6 => {
            let (r, d) = Ipv6Repr::parse(rest).ok()?;
            (
                format!("[{}]", r.src),
                format!("[{}]", r.dst),
                r.next_header,
                &d[40..],
            )
        }
        _ => return None,
    };
    let name = match proto {
        1 => "ICMP",
        6 => "TCP",
        17 => "UDP",
        58 => "ICMPv6",
        _ => return Some(format!("{src} → {dst} IP protocol {proto}")),
    };
    if (proto == 6 || proto == 17) && l4.len() >= 4 {
        let sp = u16::from_be_bytes([l4[0], l4[1]]);
        let dp = u16::from_be_bytes([l4[2], l4[3]]);
        return Some(format!("{src}:{sp} → {dst}:{dp} {name}"));
    }
    Some(format!("{src} → {dst} {name}"))
}

pub fn parse_captured(f: &CapturedFrame) -> Decoded<'_> {
    let r: Result<ParsedFrame<'_>, Error> = match f.link {
        LinkType::Ethernet => parse_frame(&f.data),
        LinkType::RawIp => parse_ip_packet(&f.data),
        LinkType::Other(l) => return Decoded::Bad(format!("link type {l} not supported")),
    };
    match r {
        Ok(p) => Decoded::Frame(p),
        Err(e) => Decoded::Bad(e.to_string()),
    }
}

/// The text line of a frame: the RoCE one-liner, or what the frame is and why it is not RoCE.
pub fn text_line(f: &CapturedFrame, d: &Decoded<'_>) -> String {
    match (d, summary(f)) {
        (Decoded::Bad(why), Some(s)) => format!("{} {s} -- {why}", f.number),
        _ => frame_line(f.number, d),
    }
}

fn hex4(b: [u8; 4]) -> String {
    format!("{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}

/// The JSON object of the contract for one frame.
pub fn frame_json(number: usize, d: &Decoded<'_>) -> Value {
    let mut m = Map::new();
    m.insert("frame".into(), json!(number));
    let p = match d {
        Decoded::Bad(why) => {
            m.insert("ok".into(), json!(false));
            m.insert("error".into(), json!(why));
            return Value::Object(m);
        }
        Decoded::Frame(p) => p,
    };
    let b = &p.bth;
    m.insert("ok".into(), json!(true));
    m.insert("ip".into(), json!(if p.ip.is_v6() { "v6" } else { "v4" }));
    m.insert("src".into(), json!(p.ip.src().to_string()));
    m.insert("dst".into(), json!(p.ip.dst().to_string()));
    m.insert("sport".into(), json!(p.udp.sport));
    m.insert("dport".into(), json!(p.udp.dport));
    m.insert("vlan".into(), json!(p.eth.vlan.map(|v| v.vid)));
    m.insert("ecn".into(), json!(p.ip.ecn()));
    m.insert("opcode".into(), json!(b.opcode.value()));
    m.insert("op".into(), json!(b.opcode.name()));
    m.insert("se".into(), json!(b.solicited));
    m.insert("m".into(), json!(b.mig_req));
    m.insert("pad".into(), json!(b.pad));
    m.insert("tver".into(), json!(b.tver));
    m.insert("pkey".into(), json!(b.pkey.value()));
    m.insert("fecn".into(), json!(b.fecn));
    m.insert("becn".into(), json!(b.becn));
    m.insert("dqpn".into(), json!(b.dqpn.value()));
    m.insert("psn".into(), json!(b.psn.value()));
    m.insert("ackreq".into(), json!(b.ack_req));
    m.insert("payload_len".into(), json!(p.payload.len()));
    m.insert("icrc".into(), json!(hex4(p.icrc)));
    m.insert("icrc_ok".into(), json!(p.icrc_ok()));
    let e = &p.ext;
    if let Some(r) = e.reth {
        m.insert(
            "reth".into(),
            json!({"va": r.va, "rkey": r.rkey.0, "len": r.dma_len}),
        );
    }
    if let Some(a) = e.aeth {
        m.insert(
            "aeth".into(),
            json!({"syndrome": a.syndrome.0, "msn": a.msn.value()}),
        );
    }
    if let Some(a) = e.atomic {
        m.insert(
            "atomic".into(),
            json!({"va": a.va, "rkey": a.rkey.0, "swap_add": a.swap_add, "compare": a.compare}),
        );
    }
    if let Some(a) = e.atomic_ack {
        m.insert("atomic_ack".into(), json!({"orig": a.orig}));
    }
    if let Some(i) = e.imm {
        m.insert("imm".into(), json!(i));
    }
    if let Some(k) = e.ieth {
        m.insert("ieth".into(), json!(k.0));
    }
    if let Some(d) = e.deth {
        m.insert(
            "deth".into(),
            json!({"qkey": d.qkey.0, "sqpn": d.src_qpn.value()}),
        );
    }
    Value::Object(m)
}

fn endpoint(ip: std::net::IpAddr, port: u16) -> String {
    match ip {
        std::net::IpAddr::V4(a) => format!("{a}:{port}"),
        std::net::IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// One human line per frame, in the spirit of a tshark one-liner.
pub fn frame_line(number: usize, d: &Decoded<'_>) -> String {
    let p = match d {
        Decoded::Bad(why) => return format!("{number} -- {why}"),
        Decoded::Frame(p) => p,
    };
    let b = &p.bth;
    let mut s = format!(
        "{number} {} → {} {} qp=0x{:06x} psn={}",
        endpoint(p.ip.src(), p.udp.sport),
        endpoint(p.ip.dst(), p.udp.dport),
        b.opcode.name(),
        b.dqpn.value(),
        b.psn.value()
    );
    let mut flags = String::new();
    for (on, c) in [
        (b.ack_req, 'A'),
        (b.solicited, 'S'),
        (b.mig_req, 'M'),
        (b.fecn, 'F'),
        (b.becn, 'B'),
    ] {
        if on {
            flags.push(c);
        }
    }
    if !flags.is_empty() {
        let _ = write!(s, " {flags}");
    }
    if let Some(v) = p.eth.vlan {
        let _ = write!(s, " vlan={}", v.vid);
    }
    if p.ip.ecn() != 0 {
        let _ = write!(
            s,
            " ecn={}",
            ["", "ECT1", "ECT0", "CE"][p.ip.ecn() as usize]
        );
    }
    if b.pkey.value() != 0xffff {
        let _ = write!(s, " pkey={}", b.pkey);
    }
    if b.tver != 0 {
        let _ = write!(s, " tver={}", b.tver);
    }
    let e = &p.ext;
    if let Some(f) = e.feth {
        let _ = write!(
            s,
            " feth(sel={}, plt={})",
            f.selectivity_level(),
            f.placement_type()
        );
    }
    if let Some(r) = e.reth {
        let _ = write!(
            s,
            " reth(va=0x{:x}, rkey={}, len={})",
            r.va, r.rkey, r.dma_len
        );
    }
    if let Some(a) = e.atomic {
        let _ = write!(
            s,
            " atomic(va=0x{:x}, rkey={}, swap_add=0x{:x}, compare=0x{:x})",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(d) = e.deth {
        let _ = write!(s, " deth(qkey={}, sqpn={})", d.qkey, d.src_qpn);
    }
    if let Some(a) = e.aeth {
        let _ = write!(s, " aeth({} msn={})", a.syndrome, a.msn.value());
    }
    if let Some(a) = e.atomic_ack {
        let _ = write!(s, " orig=0x{:x}", a.orig);
    }
    if let Some(i) = e.imm {
        let _ = write!(s, " imm=0x{i:08x}");
    }
    if let Some(k) = e.ieth {
        let _ = write!(s, " ieth={k}");
    }
    if !p.payload.is_empty() || b.opcode.info().has_payload() {
        let _ = write!(s, " {}B", p.payload.len());
    }
    if let Some(m) = rocemu_wire::mad::gsi_payload(p) {
        cm_summary(&mut s, m);
    }
    if b.pad != 0 {
        let _ = write!(s, " pad={}", b.pad);
    }
    if p.icrc_ok() {
        s.push_str(" icrc ok");
    } else {
        let _ = write!(
            s,
            " icrc BAD (wire {}, want {})",
            hex4(p.icrc),
            hex4(p.computed_icrc().to_le_bytes())
        );
    }
    if !p.ip_checksum_ok() {
        s.push_str(" ipv4-checksum BAD");
    }
    s
}

/// A short description of an IB CM MAD on QP1 (text output only; the JSON keys are the contract's).
fn cm_summary(s: &mut String, mad: &[u8]) {
    use rocemu_wire::cm::{CmMadRepr, CmMessage};
    let Ok(m) = CmMadRepr::parse(mad) else {
        s.push_str(" mad(not a CM message)");
        return;
    };
    let _ = write!(s, " cm {} tid=0x{:x}", m.msg.name(), m.mad.tid.value());
    match m.msg {
        CmMessage::Req(r) => {
            let _ = write!(
                s,
                " comm={} sid={} qpn=0x{:06x} psn={} mtu={}",
                r.local_comm_id,
                r.service_id,
                r.local_qpn.value(),
                r.starting_psn.value(),
                r.path_mtu
            );
            if let Some(Ok(h)) = r.cma_hdr() {
                let _ = write!(s, " cma={}→{}", h.src(), h.dst_ip());
            }
        }
        CmMessage::Rep(r) => {
            let _ = write!(
                s,
                " comm={} remote={} qpn=0x{:06x} psn={}",
                r.local_comm_id,
                r.remote_comm_id,
                r.local_qpn.value(),
                r.starting_psn.value()
            );
        }
        CmMessage::Rej(r) => {
            let _ = write!(
                s,
                " comm={} remote={} {}",
                r.local_comm_id, r.remote_comm_id, r.reason
            );
        }
        CmMessage::Mra(r) => {
            let _ = write!(
                s,
                " comm={} remote={} service_timeout={}",
                r.local_comm_id, r.remote_comm_id, r.service_timeout
            );
        }
        CmMessage::Rtu(r) | CmMessage::Drep(r) => {
            let _ = write!(s, " comm={} remote={}", r.local_comm_id, r.remote_comm_id);
        }
        CmMessage::Dreq(r) => {
            let _ = write!(
                s,
                " comm={} remote={} qpn=0x{:06x}",
                r.local_comm_id,
                r.remote_comm_id,
                r.remote_qpn.value()
            );
        }
        CmMessage::SidrReq(r) => {
            let _ = write!(s, " req={} sid={}", r.request_id, r.service_id);
        }
        CmMessage::SidrRep(r) => {
            let _ = write!(
                s,
                " req={} status={} qpn=0x{:06x}",
                r.request_id,
                r.status.0,
                r.qpn.value()
            );
        }
    }
}
