//! `rocemu decode --json` on every golden capture must give, frame by frame, the objects in its
//! `.expected.jsonl` (derived independently: tshark's dissector and a Python ICRC check; see
//! wire/tests/data/PROVENANCE.md). Non-RoCE frames must be `ok: false` with an `error`.
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn captures() -> Vec<PathBuf> {
    let mut v = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("wire/tests/data")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "pcap" || x == "pcapng") {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

fn decode_json(path: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_rocemu"))
        .args(["decode", "--json"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn decode_matches_independent_expectations() {
    let caps = captures();
    assert!(caps.len() >= 10, "golden captures missing: {caps:?}");
    let mut roce = 0;
    for cap in caps {
        let exp_path = PathBuf::from(format!(
            "{}.expected.jsonl",
            cap.with_extension("").display()
        ));
        let expected: Vec<Value> = std::fs::read_to_string(&exp_path)
            .unwrap_or_else(|e| panic!("{}: {e}", exp_path.display()))
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got = decode_json(&cap);
        assert_eq!(got.len(), expected.len(), "{}: frame count", cap.display());
        for (g, e) in got.iter().zip(&expected) {
            let where_ = format!("{} frame {}", cap.display(), e["frame"]);
            assert_eq!(g["frame"], e["frame"], "{where_}");
            assert_eq!(g["ok"], e["ok"], "{where_}: got {g}");
            if e["ok"] == true {
                assert_eq!(g, e, "{where_}");
                roce += 1;
            } else {
                assert!(
                    g["error"].as_str().is_some_and(|s| !s.is_empty()),
                    "{where_}: {g}"
                );
                assert!(g.get("op").is_none(), "{where_}");
            }
        }
    }
    assert!(roce > 100, "only {roce} RoCE frames checked");
}

#[test]
fn missing_and_non_capture_files_fail_with_a_message() {
    let bin = env!("CARGO_BIN_EXE_rocemu");
    let out = Command::new(bin)
        .args(["decode", "--json", "/nonexistent/x.pcap"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.pcap"));
    let out = Command::new(bin)
        .args(["decode", "Cargo.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a capture"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
