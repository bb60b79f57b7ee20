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

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rocemu-analyze-{}-{name}", std::process::id()))
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
