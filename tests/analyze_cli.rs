//! `rocemu analyze` as a user runs it: the contract's JSON keys, the SVG plot, the text summary,
//! and the exit status for a missing file and for something that is not a capture.
use std::process::Command;

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rocemu"))
        .arg("analyze")
        .args(args)
        .output()
        .expect("run rocemu")
}

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/wire/tests/data/rxe/rc_write_multimtu.pcap"
);

#[test]
fn json_has_the_contracts_keys() {
    let out = analyze(&["--json", CAPTURE]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["frames"].as_u64().unwrap() > 0);
    assert!(v["findings"].is_array());
    let qps = v["qps"].as_array().expect("qps");
    assert!(!qps.is_empty());
    for q in qps {
        for k in [
            "src",
            "dst",
            "dqpn",
            "transport",
            "messages",
            "bytes",
            "retransmitted_packets",
            "naks",
            "rnr_naks",
            "cnps",
            "ecn_ce",
            "icrc_bad",
            "first_ts",
            "last_ts",
        ] {
            assert!(q.get(k).is_some(), "qp without {k}: {q}");
        }
        assert!(q["naks"].is_object());
    }
    // A clean rxe capture: writes, no retransmission.
    assert!(qps.iter().any(|q| q["messages"].as_u64().unwrap() > 0));
    assert!(qps
        .iter()
        .all(|q| q["retransmitted_packets"].as_u64() == Some(0)));
}

#[test]
fn plot_writes_an_svg_and_text_names_the_qps() {
    let dir = std::env::temp_dir().join(format!("rocemu-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("plot.svg");
    let out = analyze(&["--plot", svg.to_str().unwrap(), CAPTURE]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("QP 0x"), "{text}");
    let body = std::fs::read_to_string(&svg).expect("the SVG was written");
    assert!(
        body.contains("<svg") && body.contains("</svg>"),
        "not an SVG"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_file_or_not_a_capture_fails_with_a_message() {
    let out = analyze(&["/nonexistent/capture.pcap"]);
    assert!(!out.status.success());
    assert!(!out.stderr.is_empty());
    let out = analyze(&[concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")]);
    assert!(!out.status.success());
    assert!(!out.stderr.is_empty());
}
