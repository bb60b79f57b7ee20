//! Debian's own, unmodified ibverbs-utils and perftest on the built library: they load (every
//! import resolves with BIND_NOW) and, without a configuration, see no device and are told once
//! how to configure one; with a bad one, a clear line and no device.
use std::path::PathBuf;
use std::process::{Command, Output};

fn libdir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(make_libdir).clone()
}

fn make_libdir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libibverbs.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    let dir = std::env::temp_dir().join(format!("rocemu-ibverbs-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // As `rocemu exec` makes it: both sonames, one file.
    for so in ["libibverbs.so.1", "librdmacm.so.1"] {
        let link = dir.join(so);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).unwrap();
    }
    dir
}

fn run(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_LIBRARY_PATH", libdir())
        .env("LD_BIND_NOW", "1")
        .env_remove("ROCEMU_DEV")
        .env_remove("ROCEMU_IP")
        .env_remove("ROCEMU_MAC")
        .env_remove("ROCEMU_NAME");
    for k in [
        "ROCEMU_LOSS",
        "ROCEMU_REORDER",
        "ROCEMU_DUPLICATE",
        "ROCEMU_CORRUPT",
        "ROCEMU_SEED",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap_or_else(|e| {
        panic!("{prog}: {e} (Debian's ibverbs-utils, rdmacm-utils and perftest must be installed)")
    })
}

#[test]
fn without_configuration_no_device_and_one_line_saying_how() {
    let o = run("ibv_devices", &[], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("rocemu0"), "{out}");
    assert_eq!(
        err.matches("rocemu: no device: set ROCEMU_DEV=af_packet:IFACE and ROCEMU_IP=ADDR")
            .count(),
        1,
        "stderr: {err}"
    );
}

#[test]
fn a_bad_configuration_is_one_clear_line_and_no_device() {
    for (env, says) in [
        (
            vec![
                ("ROCEMU_DEV", "af_packet:rocemu-none0"),
                ("ROCEMU_IP", "10.0.0.1"),
            ],
            "no network interface \"rocemu-none0\"",
        ),
        (
            vec![("ROCEMU_DEV", "af_packet:lo"), ("ROCEMU_IP", "10.0.0.300")],
            "ROCEMU_IP=10.0.0.300: not an IPv4 or IPv6 address",
        ),
        (
            vec![("ROCEMU_DEV", "eth:lo"), ("ROCEMU_IP", "10.0.0.1")],
            "give af_packet:IFACE",
        ),
        (vec![("ROCEMU_DEV", "af_packet:lo")], "no ROCEMU_IP"),
        (
            vec![
                ("ROCEMU_DEV", "af_packet:lo"),
                ("ROCEMU_IP", "10.0.0.1"),
                ("ROCEMU_LOSS", "1.5"),
            ],
            "rocemu: ROCEMU_LOSS=1.5: a probability is a number between 0 and 1; no device",
        ),
        (
            vec![
                ("ROCEMU_DEV", "af_packet:lo"),
                ("ROCEMU_IP", "10.0.0.1"),
                ("ROCEMU_SEED", "seven"),
            ],
            "rocemu: ROCEMU_SEED=seven: a seed is an unsigned 64-bit integer; no device",
        ),
    ] {
        let o = run("ibv_devices", &[], &env);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{env:?}: stderr {err}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("rocemu0"));
    }
}

#[test]
fn configured_the_device_is_listed_with_its_guid() {
    let o = run(
        "ibv_devices",
        &[],
        &[
            ("ROCEMU_DEV", "af_packet:lo"),
            ("ROCEMU_IP", "10.0.0.1"),
            ("ROCEMU_MAC", "02:00:00:00:00:01"),
            ("ROCEMU_NAME", "rocemu7"),
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    // The GUID is the MAC as a modified EUI-64.
    assert!(
        out.contains("rocemu7") && out.contains("000000fffe000001"),
        "{out}"
    );
}

#[test]
fn debians_binaries_load_with_bind_now() {
    for p in [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_devinfo",
        // rdmacm-utils: librdmacm's API (rsockets' programs load too; their calls say ENOSYS).
        "rping",
        "ucmatose",
        "udaddy",
        "rdma_server",
        "rdma_client",
        "rdma_xserver",
        "rdma_xclient",
        "cmtime",
        "mckey",
        "rstream",
        "riostream",
    ] {
        let o = run(p, &["-h"], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("symbol lookup error")
                && !err.contains("undefined symbol")
                && !err.contains("version `"),
            "{p}: {err}"
        );
        // Each printed its usage: it ran, so the dynamic linker resolved every import.
        let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), err);
        assert!(
            all.to_lowercase().contains("usage")
                || all.contains("Options")
                || all.starts_with(&format!("{p} -s")),
            "{p}: {all}"
        );
    }
}

#[test]
fn one_object_serves_both_sonames() {
    // rping needs librdmacm.so.1 and libibverbs.so.1: the loader must map our file once (a second
    // copy would be a second RNIC, its rdma_cm ids unknown to the first one's verbs).
    let o = run("rping", &["-h"], &[("LD_DEBUG", "files")]);
    let err = String::from_utf8_lossy(&o.stderr);
    let maps: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("generating link map"))
        .filter(|l| l.contains("libibverbs.so") || l.contains("librdmacm.so"))
        .collect();
    assert_eq!(maps.len(), 1, "mapped more than once:\n{err}");
    let inits = err
        .lines()
        .filter(|l| l.contains("calling init:") && l.contains(&*libdir().to_string_lossy()))
        .count();
    assert_eq!(inits, 1, "{err}");
}
