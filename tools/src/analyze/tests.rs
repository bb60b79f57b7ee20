//! The analysis held against what the RNICs counted (the lossy demo), against decode's goldens
//! of the rxe captures, and against hostile input.
use super::*;
use rocemu_emulator::rnic::Counters;
use std::path::PathBuf;

/// The counters the comparison reads, by the names `Counters::named` gives them. The names
/// are being settled by the counters work (issue 16): each entry is the name to look for
/// first, then the one main had when this was written.
mod names {
    pub const RETRANSMITTED: &[&str] = &["retransmitted_pkts"];
    pub const TIMEOUTS: &[&str] = &["local_ack_timeout_err"];
    pub const NAK_SENT_SEQ: &[&str] = &["nak_sent_seq_err", "nak_sent"];
    pub const NAK_RCVD_SEQ: &[&str] = &["nak_rcvd_seq_err", "nak_rcvd"];
    pub const IMPLIED_NAK: &[&str] = &["implied_nak_seq_err"];
    pub const RNR_SENT: &[&str] = &["send_rnr_err"];
}

/// The counter of the first of `names` that `c` has.
fn counter(c: &Counters, names: &[&str]) -> Option<u64> {
    let named = c.named();
    names
        .iter()
        .find_map(|n| named.iter().find(|(k, _)| k == n).map(|(_, v)| *v))
}

/// A file name of its own for each call (tests run in parallel).
fn tmp(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("rocemu-analyze-{}-{n}-{name}", std::process::id()))
}

/// The lossy demo: the capture is taken where each RNIC hands frames to the cable, before the
/// cable loses, reorders or duplicates them. So every packet sent is in it once, lost ones
/// included: a retransmission is always a repeated PSN, and every NAK the responder sent is
/// there, whether it arrived or not.
#[test]
fn the_lossy_demo_capture_tells_what_the_rnics_counted() {
    for seed in [1, 2, 3] {
        lossy_demo_seed(seed);
    }
}

fn lossy_demo_seed(seed: u64) {
    let pcap = tmp(&format!("demo{seed}.pcap"));
    let out = crate::demo::run_counted(seed, Some(&pcap)).expect("demo");
    assert!(out.rows.iter().all(|r| r.ok), "{:?}", out.rows);
    let r = analyze_path(&pcap).expect("analyze");
    let _ = std::fs::remove_file(&pcap);
    let (a, b) = (&out.a, &out.b);
    let retransmitted: u64 = r.qps.iter().map(|q| q.retransmitted_packets).sum();
    let want = counter(a, names::RETRANSMITTED).expect("retransmitted counter");
    assert!(want > 0, "the lossy phase retransmits");
    // Exact: every packet A sent is in the capture, and A counts a packet as retransmitted
    // when its PSN is one it already sent.
    assert_eq!(retransmitted, want, "retransmitted packets");
    // Exact: every NAK B sent is in the capture (lost ones included).
    let naks: u64 = r
        .qps
        .iter()
        .map(|q| q.naks_sent.get("psn_seq_err").copied().unwrap_or(0))
        .sum();
    assert_eq!(
        Some(naks),
        counter(b, names::NAK_SENT_SEQ),
        "NAKs the responder sent"
    );
    let trig = |t: &str| -> u64 {
        r.qps
            .iter()
            .map(|q| q.triggers.get(t).copied().unwrap_or(0))
            .sum()
    };
    let (timeouts, nak_go_backs, implied) = (trig("timeout"), trig("nak"), trig("implied_nak"));
    eprintln!(
        "analyze: retransmitted {retransmitted}, NAKs {naks}, go-backs: timeout {timeouts}, nak {nak_go_backs}, implied {implied}; A: {:?}",
        a.named()
    );
    let a_timeouts = counter(a, names::TIMEOUTS).expect("timeout counter");
    let a_naks = counter(a, names::NAK_RCVD_SEQ).expect("NAKs received counter");
    // Not exact: the cable loses NAKs after the capture (A never counts them) and duplicates
    // others (A counts them twice); A goes back at most once per NAK it received, and a
    // go-back the capture puts down to a NAK is one where a NAK for that PSN came just before.
    assert!(nak_go_backs <= a_naks, "{nak_go_backs} > {a_naks}");
    assert_eq!(timeouts, a_timeouts, "local ACK timeouts");
    // Exact: a timeout fires only on a QP that went quiet, so its go-back always shows as a
    // jump back. A go-back after a NAK or an implied NAK may not: when the requester is already
    // resending (an earlier go-back under way) or goes back to the PSN it was about to send,
    // the capture shows no jump. So the capture sees at most as many as A made.
    if let Some(i) = counter(a, names::IMPLIED_NAK) {
        assert!(implied <= i, "implied NAKs: {implied} > {i}");
    }
    assert_eq!(Some(0), counter(b, names::RNR_SENT));
}

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../wire/tests/data")
}

/// The message name a golden's `op` gives a message's last packet, worked out from the IBTA
/// name alone (not through the opcode table the analysis uses).
fn golden_message(op: &str) -> Option<String> {
    let t = op.get(3..)?;
    let name = match t {
        "RDMA_READ_REQUEST" => "RDMA_READ".to_string(),
        "COMPARE_SWAP" => "CMP_SWAP".to_string(),
        "FETCH_ADD" | "FLUSH" | "ATOMIC_WRITE" => t.to_string(),
        _ if t.contains("_LAST") || t.contains("_ONLY") => {
            if t.starts_with("RDMA_READ_RESPONSE") {
                return None;
            }
            t.replace("_LAST", "")
                .replace("_ONLY", "")
                .replace("_WITH_IMMEDIATE", "_WITH_IMM")
                .replace("_WITH_INVALIDATE", "_WITH_INV")
        }
        _ => return None,
    };
    Some(name)
}

/// On every rxe capture (and the CM ones), each QP's messages by operation are what decode's
/// golden objects show: a message per request PSN ending one (LAST, ONLY, a READ request, an
/// atomic), counted once.
#[test]
fn every_message_of_each_qp_of_the_rxe_captures() {
    let mut checked = 0;
    for dir in ["rxe", "cm"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
            .collect();
        files.sort();
        for pcap in files {
            let golden = pcap.with_extension("expected.jsonl");
            let text = std::fs::read_to_string(&golden).unwrap();
            let mut want: BTreeMap<(String, String, u64), BTreeMap<String, u64>> = BTreeMap::new();
            let mut seen = std::collections::HashSet::new();
            for l in text.lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                if v["ok"] != true || v["icrc_ok"] != true {
                    continue;
                }
                let Some(name) = golden_message(v["op"].as_str().unwrap()) else {
                    continue;
                };
                let key = (
                    v["src"].as_str().unwrap().to_string(),
                    v["dst"].as_str().unwrap().to_string(),
                    v["dqpn"].as_u64().unwrap(),
                );
                if seen.insert((key.clone(), v["psn"].as_u64().unwrap())) {
                    *want.entry(key).or_default().entry(name).or_default() += 1;
                }
            }
            let r = analyze_path(&pcap).unwrap();
            assert!(r.truncated.is_none(), "{}", pcap.display());
            let got: BTreeMap<(String, String, u64), BTreeMap<String, u64>> = r
                .qps
                .iter()
                .filter(|q| q.messages > 0)
                .map(|q| {
                    (
                        (q.key.0.to_string(), q.key.1.to_string(), u64::from(q.key.2)),
                        q.messages_by_op
                            .iter()
                            .map(|(k, v)| (k.to_string(), *v))
                            .collect(),
                    )
                })
                .collect();
            assert_eq!(got, want, "{}", pcap.display());
            assert!(!want.is_empty(), "{}", pcap.display());
            for q in &r.qps {
                assert_eq!(q.psn_gaps, 0, "{} {:?}", pcap.display(), q.key);
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} captures");
}

/// The rxe capture with an RNR NAK and a remote access error: each NAK named, the RNR waits
/// tied to the retransmissions they caused.
#[test]
fn rnr_and_access_naks_of_rxe_are_explained() {
    let r = analyze_path(data_dir().join("rxe/rc_nak_rnr_access.pcap")).unwrap();
    let q = &r.qps[r
        .find(&(
            "10.99.0.11".parse().unwrap(),
            "10.99.0.12".parse().unwrap(),
            0x14,
        ))
        .unwrap()];
    let p = &r.qps[q.pair.unwrap()];
    assert_eq!(p.rnr_naks_sent, 3);
    assert_eq!(p.naks_sent.get("remote_access_err"), Some(&1));
    assert_eq!(q.retransmitted_packets, 3);
    assert_eq!(q.triggers.get("rnr"), Some(&3));
    assert!(
        r.findings
            .iter()
            .any(|f| f.contains("RNR NAKs: the responder had no receive posted 3 times")),
        "{:?}",
        r.findings
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.contains("remote access errors")),
        "{:?}",
        r.findings
    );
}

/// rping through the CM: the REQ/REP pair ties both directions together, with the QPNs and
/// starting PSNs they announced; a REJ is named.
#[test]
fn the_cm_exchange_is_tied_to_the_qps_it_created() {
    let r = analyze_path(data_dir().join("rxe/rdmacm_rping.pcap")).unwrap();
    let a: IpAddr = "10.99.0.11".parse().unwrap();
    let b: IpAddr = "10.99.0.12".parse().unwrap();
    let i = r.find(&(a, b, 0x1f)).unwrap();
    let j = r.find(&(b, a, 0x1f)).unwrap();
    assert_eq!(r.qps[i].pair, Some(j));
    let c = &r.cm[r.qps[i].cm.unwrap()];
    assert_eq!(r.qps[j].cm, r.qps[i].cm);
    assert_eq!(c.active_psn, r.qps[i].first_psn.map(|p| p.value()));
    assert_eq!(Some(c.passive_psn), r.qps[j].first_psn.map(|p| p.value()));
    assert!(c.rtu_ts.is_some() && c.dreq_ts.is_some() && c.drep_ts.is_some());
    let rej = analyze_path(data_dir().join("cm/rej_no_listener.pcap")).unwrap();
    assert!(
        rej.findings
            .iter()
            .any(|f| f.contains("refused by REJ") && f.contains("invalid service ID")),
        "{:?}",
        rej.findings
    );
}

/// A CNP from a ConnectX-4 Lx: counted, and said to answer no request of the capture.
#[test]
fn a_lone_cnp_is_counted() {
    let r = analyze_path(data_dir().join("cx4lx_cnp.pcap")).unwrap();
    assert_eq!(r.qps.len(), 1);
    assert_eq!(r.qps[0].cnps_sent, 1);
    assert_eq!(r.orphan_responses, 1);
}

fn pcap_bytes(frames: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut w = rocemu_wire::capture::CaptureWriter::new(Vec::new()).unwrap();
    for (t, f) in frames {
        w.write(std::time::Duration::from_nanos(*t), f).unwrap();
    }
    w.into_inner()
}

fn analyze_bytes(b: &[u8]) -> Report {
    analyze(CaptureReader::new(std::io::Cursor::new(b.to_vec())).unwrap())
}

/// Frames of the demo's capture, to cut, garble and mix with other traffic.
fn demo_frames() -> Vec<(u64, Vec<u8>)> {
    let pcap = tmp("frames.pcap");
    crate::demo::run(4, Some(&pcap)).unwrap();
    let r = CaptureReader::open(&pcap).unwrap();
    let v = r
        .map(|f| {
            let f = f.unwrap();
            (f.timestamp.as_nanos() as u64, f.data)
        })
        .collect();
    let _ = std::fs::remove_file(&pcap);
    v
}

/// A capture cut mid-record: what came before is analysed and the cut is a finding.
#[test]
fn a_capture_cut_mid_record_is_analysed_up_to_the_cut() {
    let frames = demo_frames();
    let full = pcap_bytes(&frames[..2000]);
    for cut in [full.len() - 1, full.len() - 30, full.len() / 2 + 7, 24 + 8] {
        let r = analyze_bytes(&full[..cut]);
        assert!(r.truncated.is_some(), "cut at {cut}");
        assert!(r.frames < 2000);
        assert!(
            r.findings[0].contains("corrupt or cut record"),
            "{:?}",
            r.findings
        );
        let _ = r.to_text();
        let _ = r.to_json();
    }
}

/// Garbage: random bytes, the demo's frames with bytes flipped and cut at random places,
/// non-RoCE traffic (ARP, TCP, IPv6 ND), huge PSN jumps: no panic, bounded state, sane output.
#[test]
fn garbage_and_foreign_traffic_never_panic() {
    let mut frames = demo_frames();
    frames.truncate(3000);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::new();
    for (t, f) in &frames {
        let mut g = f.clone();
        match rnd() % 6 {
            0 => {
                let i = (rnd() as usize) % g.len();
                g[i] ^= 1 << (rnd() % 8);
            }
            1 => g.truncate((rnd() as usize) % g.len()),
            // A random PSN: a huge jump either way (the ICRC is not fixed: also a bad frame).
            2 if g.len() > 14 + 20 + 8 + 12 => {
                let o = 14 + 20 + 8 + 9;
                g[o] = rnd() as u8;
                g[o + 1] = rnd() as u8;
            }
            _ => {}
        }
        out.push((*t, g));
        if rnd() % 10 == 0 {
            let n = (rnd() % 200) as usize;
            out.push((*t, (0..n).map(|_| rnd() as u8).collect()));
        }
    }
    // ARP, a TCP segment, an IPv6 neighbour solicitation.
    let mut arp = vec![0xffu8; 6];
    arp.extend([2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend([0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(42, 0);
    let mut tcp = vec![2u8, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    tcp.extend([
        0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    tcp.extend([0x30, 0x39, 0x12, 0xb7]);
    tcp.resize(14 + 40, 0);
    let mut nd = vec![0x33u8, 0x33, 0xff, 0, 0, 1, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
    nd.extend([0x60, 0, 0, 0, 0, 24, 58, 255]);
    nd.extend([0u8; 32]);
    nd.extend([135, 0, 0, 0, 0, 0, 0, 0]);
    nd.resize(14 + 40 + 24, 0);
    for f in [arp, tcp, nd] {
        out.push((1, f));
    }
    let r = analyze_bytes(&pcap_bytes(&out));
    assert!(r.truncated.is_none());
    assert_eq!(r.frames, out.len() as u64);
    assert!(
        r.other_frames.get("ARP") >= Some(&1),
        "{:?}",
        r.other_frames
    );
    assert!(
        r.other_frames.get("TCP") >= Some(&1),
        "{:?}",
        r.other_frames
    );
    assert!(
        r.other_frames.get("ICMPv6") >= Some(&1),
        "{:?}",
        r.other_frames
    );
    assert!(r.icrc_bad > 0);
    assert!(r.qps.len() <= MAX_QPS);
    for q in &r.qps {
        assert!(q.events.len() <= MAX_EVENTS);
        assert!(q.psn_series.points.len() <= MAX_POINTS);
    }
    let _ = r.to_text();
    let _ = r.to_json();
    render_svg(&r).unwrap();
}

/// A one-packet-message RC request of the demo (a SEND_LAST: a message of its own here) as a
/// frame to rewrite, and its payload.
fn rc_request() -> (rocemu_wire::frame::FrameRepr, Vec<u8>) {
    let frames = demo_frames();
    let f = frames
        .iter()
        .find(|(_, f)| {
            parse_frame(f).is_ok_and(|p| {
                let i = p.bth.opcode.info();
                i.transport == Transport::Rc
                    && i.is_request()
                    && i.position.is_last()
                    && i.operation == Operation::Send
            })
        })
        .expect("an RC SEND in the demo");
    let p = parse_frame(&f.1).unwrap();
    (
        rocemu_wire::frame::FrameRepr::from_parsed(&p),
        p.payload.to_vec(),
    )
}

fn emit(repr: &rocemu_wire::frame::FrameRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 9000];
    let n = repr.emit_with_payload(&mut buf, payload).unwrap();
    buf.truncate(n);
    buf
}

/// A flood of distinct QPs stops at MAX_QPS; the rest is counted, not kept.
#[test]
fn qps_beyond_the_bound_are_counted_not_kept() {
    let (mut repr, payload) = rc_request();
    let mut out = Vec::new();
    for q in 0..(MAX_QPS as u32 + 500) {
        repr.bth.dqpn = rocemu_wire::Qpn::new(q + 2);
        out.push((u64::from(q), emit(&repr, &payload)));
    }
    let r = analyze_bytes(&pcap_bytes(&out));
    assert_eq!(r.qps.len(), MAX_QPS);
    assert_eq!(r.untracked_frames, 500);
    assert!(
        r.findings.iter().any(|f| f.contains("not analysed")),
        "{:?}",
        r.findings
    );
}

/// PSNs across the 24-bit wrap are in order: no retransmission, no gap, no jump.
#[test]
fn the_psn_wrap_is_no_retransmission() {
    let (mut repr, payload) = rc_request();
    let mut out = Vec::new();
    for k in 0..100u32 {
        repr.bth.psn = Psn::new(Psn::MODULUS - 50).add(k);
        out.push((u64::from(k) * 1000, emit(&repr, &payload)));
    }
    // Then PSN 2^24 - 10 again (a go-back across the wrap), and a jump of 2^22.
    repr.bth.psn = Psn::new(Psn::MODULUS - 10);
    out.push((200_000, emit(&repr, &payload)));
    repr.bth.psn = Psn::new(1 << 22);
    out.push((300_000, emit(&repr, &payload)));
    let r = analyze_bytes(&pcap_bytes(&out));
    assert_eq!(r.qps.len(), 1);
    let q = &r.qps[0];
    assert_eq!(
        (
            q.messages,
            q.retransmitted_packets,
            q.psn_gaps,
            q.psn_jumps,
            q.go_backs
        ),
        (101, 1, 0, 1, 1)
    );
    assert_eq!(q.triggers.get("timeout"), Some(&1));
}

/// Goodput over time in the text: the buckets from the first payload to the last, one bar per
/// column scaled to the busiest, a blank where nothing moved, rates over each column's width.
#[test]
fn goodput_over_time_is_one_line_of_bars_with_the_peak_and_the_stall() {
    use super::window::Buckets;
    // 100 µs buckets; nothing for 0.2 ms, then 1000, 500, 0 (a stall), 125 bytes.
    let mut b = Buckets::new();
    for (i, n) in [(2u64, 1000u64), (3, 500), (5, 125)] {
        b.add(i * 100_000 + 1, n);
    }
    let l = super::report::goodput_over_time(&b).unwrap();
    // 1000 bytes in 100 µs = 80 Mb/s; 500 → half (▄), 125 → an eighth (▁).
    assert_eq!(
        l,
        "  goodput over time, 100.0 µs a column from 0.000200 s: |█▄ ▁| \
         peak 80.00 Mb/s at 0.000200 s, lowest 0.0 kb/s at 0.000400 s"
    );
    assert_eq!(super::report::goodput_over_time(&Buckets::new()), None);
    // Long series merge into at most 48 columns.
    let mut long = Buckets::new();
    for i in 0..200u64 {
        long.add(i * 100_000, 10);
    }
    let l = super::report::goodput_over_time(&long).unwrap();
    let bars = l.split('|').nth(1).unwrap();
    assert_eq!(
        bars.chars().count(),
        200usize.div_ceil(200usize.div_ceil(48))
    );
    assert!(bars.chars().all(|c| c == '█'), "{l}");
}
