//! The built libibverbs.so exports exactly what Debian 12's libibverbs and librdmacm do
//! (`exports.txt`, `exports-rdmacm.txt`; one object serves both sonames) plus RoCEmu's
//! `rocemu_live_objects@ROCEMU_1.0`: every name at its version, default (`name@@V`) or not
//! (`name@V`), each version node defined, nothing else exported; and it has rdma-core's soname.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

/// The library cargo built for this test run (beside the test executable).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libibverbs.so");
    assert!(p.exists(), "{} was not built", p.display());
    p
}

fn table() -> (BTreeSet<(String, String, bool)>, BTreeSet<String>) {
    let t = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/exports.txt")).unwrap()
        + &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/exports-rdmacm.txt"))
            .unwrap();
    let mut syms = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for l in t
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (v, n) = l.split_once(' ').unwrap();
        let (v, default) = match v.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
            Some(v) => (v, false),
            None => (v, true),
        };
        nodes.insert(v.to_string());
        if n != v {
            syms.insert((n.to_string(), v.to_string(), default));
        }
    }
    (syms, nodes)
}

fn readelf(args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(built_library())
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_symbol_at_its_version_and_nothing_else() {
    let (want, _) = table();
    assert_eq!(
        want.len(),
        180 + 69,
        "exports.txt lists 180 symbols, exports-rdmacm.txt 68 and rocemu_live_objects"
    );
    let mut got = BTreeSet::new();
    for l in readelf(&["--dyn-syms", "-W"]).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Num: Value Size Type Bind Vis Ndx Name
        if f.len() < 8 || f[6] == "UND" || f[0].trim_end_matches(':').parse::<u32>().is_err() {
            continue;
        }
        let name = f[7];
        let (n, v, default) = if let Some((n, v)) = name.split_once("@@") {
            (n, v, true)
        } else if let Some((n, v)) = name.split_once('@') {
            (n, v, false)
        } else {
            (name, "", true)
        };
        got.insert((n.to_string(), v.to_string(), default));
    }
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty(),
        "not exported as Debian's libibverbs and librdmacm do: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "exported beyond Debian's libibverbs and librdmacm: {extra:?}"
    );
}

#[test]
fn every_version_node_is_defined_and_the_soname_is_rdma_cores() {
    let (_, nodes) = table();
    let v = readelf(&["-V", "-W"]);
    let defs = &v[v
        .find("Version definition section")
        .expect("a version definition section")..];
    let defs = &defs[..defs.find("Version needs section").unwrap_or(defs.len())];
    for n in &nodes {
        assert!(
            defs.contains(&format!("Name: {n}")),
            "version node {n} not defined:\n{defs}"
        );
    }
    assert!(readelf(&["-d"]).contains("Library soname: [libibverbs.so.1]"));
}
