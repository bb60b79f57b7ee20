//! Makes, from `exports.txt` (the export table of Debian 12's libibverbs.so.1), the version
//! script and the table of export aliases.
//!
//! rustc hands the linker its own version script for `#[no_mangle]` symbols, which would leave
//! ours unversioned; so the crate has none: every export is an assembler stub of an
//! ordinary (mangled) `extern "C" fn` (a jump to it, see [`export`]), versioned by our script (default versions) or by
//! `.symver` (non-default ones, `name@VERSION`).
//!
//! Which Rust function implements an export: `crate::private::NAME` for IBVERBS_PRIVATE_34,
//! `crate::compat::NAME` for a non-default version (rdma-core's compatibility entry points
//! with the pre-1.1 structs), `crate::verbs::NAME` for the rest. A missing one is a compile
//! error.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let table = std::fs::read_to_string(dir.join("exports.txt")).expect("exports.txt")
        + &std::fs::read_to_string(dir.join("exports-rdmacm.txt")).expect("exports-rdmacm.txt");
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=exports-rdmacm.txt");
    println!("cargo:rerun-if-changed=build.rs");

    // Version nodes in order of appearance in the chain, with their default symbols.
    let mut nodes: Vec<String> = Vec::new();
    let mut defaults: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut asm = String::new();
    for line in table.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (ver, name) = line
            .split_once(' ')
            .expect("`VERSION name` or `(VERSION) name`");
        let name = name.trim();
        let (ver, default) = match ver.strip_prefix('(').and_then(|v| v.strip_suffix(')')) {
            Some(v) => (v, false),
            None => (ver, true),
        };
        if !nodes.iter().any(|n| n == ver) {
            nodes.push(ver.to_string());
        }
        if name == ver {
            continue; // the version node's own symbol: the linker makes it
        }
        let path = if ver.starts_with("RDMACM_") || ver.starts_with("ROCEMU_") {
            "rdmacm"
        } else if ver.starts_with("IBVERBS_PRIVATE") {
            "private"
        } else if !default {
            "compat"
        } else {
            "verbs"
        };
        if default {
            defaults
                .entry(ver.to_string())
                .or_default()
                .push(name.to_string());
            writeln!(asm, "{}", export(name, name, path, None)).unwrap();
        } else {
            let alias = format!("__rocemu_{name}_{}", ver.replace('.', "_"));
            writeln!(asm, "{}", export(&alias, name, path, Some(ver))).unwrap();
        }
    }
    // The chains as rdma-core's libibverbs.map.in and librdmacm.map have them: IBVERBS_1.0 ← 1.1
    // ← 1.5 ← … ← 1.14, RDMACM_1.0 ← 1.1 ← 1.2 ← 1.3; the private node and ours stand alone.
    nodes.sort_by_key(|n| version_key(n));
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    for n in &nodes {
        if n.starts_with("RDMACM_1.0") || n.starts_with("ROCEMU_") {
            prev = None;
        }
        writeln!(map, "{n} {{").unwrap();
        let syms = defaults.get(n).map(|v| v.as_slice()).unwrap_or(&[]);
        if !syms.is_empty() {
            writeln!(map, "  global:").unwrap();
            for s in syms {
                writeln!(map, "    {s};").unwrap();
            }
        }
        match prev {
            Some(p) if !n.starts_with("IBVERBS_PRIVATE") && !n.starts_with("ROCEMU_") => {
                writeln!(map, "}} {p};").unwrap()
            }
            _ => writeln!(map, "}};").unwrap(),
        }
        if !n.starts_with("IBVERBS_PRIVATE") && !n.starts_with("ROCEMU_") {
            prev = Some(n);
        }
    }
    std::fs::write(out.join("libibverbs.map"), &map).unwrap();
    std::fs::write(out.join("exports.rs"), &asm).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        out.join("libibverbs.map").display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}

/// One export: a function `sym` of its own section that jumps to the Rust implementation, and
/// for a non-default version the `.symver` that names it `name@VER`.
///
/// A jump rather than an alias (`.set sym, impl`): an alias needs its target in the same
/// object, and rustc puts the function and this assembly in whichever codegen units it likes.
fn export(sym: &str, name: &str, path: &str, ver: Option<&str>) -> String {
    let symver = match ver {
        Some(v) => format!("\".symver {sym}, {name}@{v}\", "),
        None => String::new(),
    };
    format!(
        "core::arch::global_asm!(\".pushsection .text.rocemu.{sym},\\\"ax\\\",@progbits\", \
         \".globl {sym}\", \".type {sym},@function\", \"{sym}:\", \"jmp {{f}}\", \
         \".size {sym}, .-{sym}\", {symver}\".popsection\", f = sym crate::{path}::{name});"
    )
}

/// IBVERBS_1.10 after IBVERBS_1.9, then the private node, then RDMACM_1.0 … 1.3, then ours.
fn version_key(n: &str) -> (u32, u32, u32) {
    let num = |v: &str| {
        let mut it = v.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    if let Some(v) = n.strip_prefix("IBVERBS_") {
        if v.starts_with("PRIVATE") {
            return (1, 0, 0);
        }
        let (a, b) = num(v);
        return (0, a, b);
    }
    if let Some(v) = n.strip_prefix("RDMACM_") {
        let (a, b) = num(v);
        return (2, a, b);
    }
    (3, 0, 0)
}
