//! Finds the system DPDK with `pkg-config libdpdk`, generates bindings to the headers in
//! `csrc/wrapper.h` and compiles the C shim (`csrc/shim.c`) for DPDK's inline functions.
//!
//! Linking: the DPDK shared libraries `pkg-config --libs libdpdk` names. The poll-mode drivers
//! are not linked: a dynamically linked EAL loads every driver in its built-in plugin directory
//! (Debian: /usr/lib/x86_64-linux-gnu/dpdk/pmds-<abi>) at `rte_eal_init`. That directory is
//! exported as `DEP_DPDK_PMD_DIR` / `ROCEMU_DPDK_PMD_DIR` for messages and tests.
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The oldest DPDK whose API this crate uses (`rte_eth_conf.rxmode.mtu`, `RTE_ETH_*` names).
const MIN_VERSION: &str = "21.11";

fn pkg_config(args: &[&str]) -> Result<String, String> {
    let exe = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let out = Command::new(&exe)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `{exe}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{exe} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn fail(msg: &str) -> ! {
    eprintln!(
        "\nrocemu-dpdk-sys: {msg}\n\n\
         DPDK {MIN_VERSION} or newer is needed, with its pkg-config file (libdpdk.pc): on Debian or \
         Ubuntu `apt-get install libdpdk-dev pkg-config clang libclang-dev`; for a DPDK built from \
         source, set PKG_CONFIG_PATH to the directory holding libdpdk.pc. Without DPDK, build \
         without the `dpdk` feature (a plain `cargo build` does).\n"
    );
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    let version = pkg_config(&["--modversion", "libdpdk"]).unwrap_or_else(|e| fail(&e));
    if pkg_config(&["--atleast-version", MIN_VERSION, "libdpdk"]).is_err() {
        fail(&format!("found DPDK {version}, which is too old"));
    }
    let cflags = pkg_config(&["--cflags", "libdpdk"]).unwrap_or_else(|e| fail(&e));
    let libs = pkg_config(&["--libs", "libdpdk"]).unwrap_or_else(|e| fail(&e));
    let libdir = pkg_config(&["--variable=libdir", "libdpdk"]).unwrap_or_default();
    let cflags: Vec<String> = cflags.split_whitespace().map(str::to_string).collect();

    // The shim first: it needs the DPDK libraries after it on the link line.
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").include("csrc").warnings(true);
    for f in &cflags {
        build.flag(f);
    }
    build.compile("rocemu_dpdk_shim");

    for tok in libs.split_whitespace() {
        if let Some(dir) = tok.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = tok.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        }
        // `-Wl,--as-needed` and the like: rustc already links shared libraries as needed.
    }

    let pmd_dir = pmd_dir(&libdir, &version);
    println!("cargo:rustc-env=ROCEMU_DPDK_VERSION={version}");
    println!("cargo:rustc-env=ROCEMU_DPDK_PMD_DIR={pmd_dir}");
    println!("cargo:version={version}");
    println!("cargo:pmd_dir={pmd_dir}");

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(&cflags)
        .clang_arg("-Icsrc")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        // Only what the named headers declare (and the types that needs), not all of DPDK.
        .allowlist_file(r".*/rte_(eal|errno|ethdev|lcore|mbuf|mbuf_core|mempool|ether)\.h")
        .allowlist_file(r".*/shim\.h")
        .allowlist_var("RTE_.*|SOCKET_ID_ANY|LCORE_ID_ANY")
        .derive_debug(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen over csrc/wrapper.h failed: {e}")));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

/// Where a dynamically linked EAL loads its drivers from: `<libdir>/dpdk/pmds-<ABI>`, with the
/// ABI version from the one directory that exists (DPDK 22.11 has ABI 23.0).
fn pmd_dir(libdir: &str, version: &str) -> String {
    let base = PathBuf::from(libdir).join("dpdk");
    if let Ok(rd) = std::fs::read_dir(&base) {
        let mut dirs: Vec<_> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("pmds-"))
            })
            .collect();
        dirs.sort();
        if let Some(d) = dirs.pop() {
            return d.display().to_string();
        }
    }
    format!("{}/pmds-(ABI of DPDK {version})", base.display())
}
