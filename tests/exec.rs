//! `rocemu exec` as a caller sees it (contract: shared/contracts.md): the library directory, the
//! environment PROGRAM runs in, and the exit statuses — PROGRAM's own, 125 when RoCEmu refuses to
//! start (with PROGRAM never run), 127 when PROGRAM does not exist.
//!
//! Most cases point `ROCEMU_LIBDIR` at a folder holding an empty `libibverbs.so.1` (the programs
//! run here, `env` and `sh`, never load it), so they need neither the real library nor root; the
//! `rocemu-lib/` links beside the executable are checked on a copy of `rocemu` in a scratch folder.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROCEMU: &str = env!("CARGO_BIN_EXE_rocemu");

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("rocemu-exec-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    /// A library directory as `ROCEMU_LIBDIR` wants it.
    fn libdir(tag: &str) -> Scratch {
        let s = Scratch::new(tag);
        std::fs::write(s.0.join("libibverbs.so.1"), b"").unwrap();
        s
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rocemu_in(libdir: &Path, args: &[&str]) -> Output {
    Command::new(ROCEMU)
        .env("ROCEMU_LIBDIR", libdir)
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `KEY=VALUE` lines of `env`'s output, as a lookup.
fn env_of(o: &Output) -> std::collections::HashMap<String, String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn program_sees_the_configuration_and_our_library_first() {
    let lib = Scratch::libdir("env");
    let o = Command::new(ROCEMU)
        .env("ROCEMU_LIBDIR", &lib.0)
        .env("LD_LIBRARY_PATH", "/opt/x:/opt/y")
        // A stale configuration in the caller's environment: --dev replaces all of it.
        .env("ROCEMU_MAC", "02:00:00:00:00:99")
        .env("ROCEMU_NAME", "stale0")
        .env("ROCEMU_ECN", "1")
        .args([
            "exec",
            "--dev",
            "af_packet:lo",
            "--ip",
            "fd00::1",
            "--",
            "env",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = env_of(&o);
    assert_eq!(
        e["LD_LIBRARY_PATH"],
        format!("{}:/opt/x:/opt/y", lib.0.display())
    );
    assert_eq!(e["ROCEMU_DEV"], "af_packet:lo");
    assert_eq!(e["ROCEMU_IP"], "fd00::1");
    for k in ["ROCEMU_MAC", "ROCEMU_NAME", "ROCEMU_ECN"] {
        assert!(!e.contains_key(k), "{k} inherited: {:?}", e.get(k));
    }

    let o = rocemu_in(
        &lib.0,
        &[
            "exec",
            "--dev",
            "af_packet:lo",
            "--ip",
            "10.9.0.1",
            "--mac",
            "02:AB:00:00:00:01",
            "--name",
            "rocemu3",
            "--ecn",
            "--",
            "env",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = env_of(&o);
    assert_eq!(e["ROCEMU_IP"], "10.9.0.1");
    assert_eq!(e["ROCEMU_MAC"].to_lowercase(), "02:ab:00:00:00:01");
    assert_eq!(e["ROCEMU_NAME"], "rocemu3");
    assert_eq!(e["ROCEMU_ECN"], "1");
}

#[test]
fn impairments_are_handed_on_and_stale_ones_removed() {
    let lib = Scratch::libdir("impair");
    let o = Command::new(ROCEMU)
        .env("ROCEMU_LIBDIR", &lib.0)
        .env("ROCEMU_DUPLICATE", "0.5")
        .env("ROCEMU_SEED", "99")
        .args([
            "exec",
            "--dev",
            "af_packet:lo",
            "--ip",
            "10.9.0.1",
            "--loss",
            "0.05",
            "--reorder",
            "0.05",
            "--corrupt",
            "0.001",
            "--",
            "env",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = env_of(&o);
    assert_eq!(e["ROCEMU_LOSS"], "0.05");
    assert_eq!(e["ROCEMU_REORDER"], "0.05");
    assert_eq!(e["ROCEMU_CORRUPT"], "0.001");
    for k in ["ROCEMU_DUPLICATE", "ROCEMU_SEED"] {
        assert!(!e.contains_key(k), "{k} inherited: {:?}", e.get(k));
    }
    let o = rocemu_in(
        &lib.0,
        &[
            "exec",
            "--dev",
            "af_packet:lo",
            "--ip",
            "10.9.0.1",
            "--duplicate",
            "1",
            "--seed",
            "12345",
            "--",
            "env",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = env_of(&o);
    assert_eq!(e["ROCEMU_DUPLICATE"], "1");
    assert_eq!(e["ROCEMU_SEED"], "12345");
    assert!(!e.contains_key("ROCEMU_LOSS"));
}

#[test]
fn without_dev_the_callers_configuration_passes_through() {
    let lib = Scratch::libdir("pass");
    let o = Command::new(ROCEMU)
        .env("ROCEMU_LIBDIR", &lib.0)
        .env_remove("LD_LIBRARY_PATH")
        .env("ROCEMU_DEV", "dpdk:--vdev=net_memif0")
        .env("ROCEMU_IP", "10.1.1.1")
        .args(["exec", "--", "env"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let e = env_of(&o);
    assert_eq!(e["LD_LIBRARY_PATH"], lib.0.display().to_string());
    assert_eq!(e["ROCEMU_DEV"], "dpdk:--vdev=net_memif0");
    assert_eq!(e["ROCEMU_IP"], "10.1.1.1");
}

#[test]
fn exit_status_is_the_programs() {
    let lib = Scratch::libdir("status");
    let o = rocemu_in(
        &lib.0,
        &[
            "exec",
            "--",
            "sh",
            "-c",
            "echo \"$0 $1\"; exit 7",
            "a",
            "-b",
        ],
    );
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "a -b\n");
}

#[test]
fn bad_configuration_is_125_before_the_program_runs() {
    let lib = Scratch::libdir("bad");
    let marker = lib.0.join("ran");
    let m = marker.to_str().unwrap();
    let cases: [(&[&str], &str); 12] = [
        (
            &["--dev", "eth0", "--ip", "10.0.0.1"],
            "give af_packet:IFACE",
        ),
        (
            &["--dev", "af_packet:rocemu-none9", "--ip", "10.0.0.1"],
            "no interface rocemu-none9",
        ),
        (
            &["--dev", "af_packet:lo", "--ip", "10.0.0.256"],
            "not an IPv4 or IPv6 address",
        ),
        (&["--dev", "af_packet:lo"], "needs --ip"),
        (
            &[
                "--dev",
                "af_packet:lo",
                "--ip",
                "10.0.0.1",
                "--mac",
                "zz:00:00:00:00:01",
            ],
            "--mac",
        ),
        (&["--dev", "dpdk:", "--ip", "10.0.0.1"], "EAL"),
        (&["--ip", "10.0.0.1"], "need --dev"),
        (&["--no-such-flag"], "unexpected argument"),
        (
            &["--dev", "af_packet:lo", "--ip", "10.0.0.1", "--loss", "1.5"],
            "--loss 1.5: a probability is between 0 and 1",
        ),
        (
            &[
                "--dev",
                "af_packet:lo",
                "--ip",
                "10.0.0.1",
                "--reorder",
                "lots",
            ],
            "invalid value 'lots'",
        ),
        (
            &["--dev", "af_packet:lo", "--ip", "10.0.0.1", "--seed", "1.5"],
            "invalid value '1.5' for '--seed",
        ),
        (&["--corrupt", "0.1"], "need --dev"),
    ];
    for (args, why) in cases {
        let mut v = vec!["exec"];
        v.extend_from_slice(args);
        v.extend_from_slice(&["--", "touch", m]);
        let o = rocemu_in(&lib.0, &v);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err:?} does not say {why:?}");
        assert!(!marker.exists(), "{args:?}: the program ran");
    }
    // The same command with a good configuration does run it: the marker above could appear.
    let o = rocemu_in(
        &lib.0,
        &[
            "exec",
            "--dev",
            "af_packet:lo",
            "--ip",
            "10.0.0.1",
            "--",
            "touch",
            m,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(marker.exists());
}

#[test]
fn a_missing_program_is_127_and_said() {
    let lib = Scratch::libdir("missing");
    let o = rocemu_in(&lib.0, &["exec", "--", "rocemu-no-such-program-42"]);
    assert_eq!(o.status.code(), Some(127));
    assert!(
        stderr(&o).contains("rocemu-no-such-program-42: command not found"),
        "{}",
        stderr(&o)
    );
    // A file without execute permission (not even root may execute it).
    let data = lib.0.join("data");
    std::fs::write(&data, b"not a program").unwrap();
    let o = rocemu_in(&lib.0, &["exec", "--", data.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
}

#[test]
fn libdir_from_the_environment_must_hold_the_library() {
    let lib = Scratch::libdir("envdir");
    let o = rocemu_in(&lib.0, &["exec", "--libdir"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{}\n", lib.0.display())
    );
    let empty = Scratch::new("emptydir");
    let o = rocemu_in(&empty.0, &["exec", "--libdir"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("no libibverbs.so.1"), "{}", stderr(&o));
}

#[test]
fn libdir_beside_the_executable_links_the_sonames() {
    let s = Scratch::new("beside");
    let exe = s.0.join("rocemu");
    std::fs::copy(ROCEMU, &exe).unwrap();
    // A test running beside this one may fork while the copy still holds the file open for
    // writing; its child keeps that descriptor until it execs, and exec then fails with
    // ETXTBSY ("Text file busy"). Such a failure is this harness's, not the program's: retried.
    let run = |args: &[&str]| {
        let mut tries = 0;
        loop {
            match Command::new(&exe)
                .env_remove("ROCEMU_LIBDIR")
                .args(args)
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.unwrap(),
            }
        }
    };
    // Not built yet: 125, and the message says how to build it.
    let o = run(&["exec", "--libdir"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        stderr(&o).contains("cargo build --release"),
        "{}",
        stderr(&o)
    );
    let o = run(&["exec", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));

    std::fs::write(s.0.join("libibverbs.so"), b"").unwrap();
    let o = run(&["exec", "--libdir"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim_end());
    assert_eq!(dir, s.0.join("rocemu-lib"));
    assert_eq!(
        std::fs::read_link(dir.join("libibverbs.so.1")).unwrap(),
        Path::new("../libibverbs.so")
    );
    // librdmacm.so.1 is the same library (one object serves both sonames).
    assert_eq!(
        std::fs::read_link(dir.join("librdmacm.so.1")).unwrap(),
        Path::new("../libibverbs.so")
    );
    let o = run(&["exec", "--", "env"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(env_of(&o)["LD_LIBRARY_PATH"].starts_with(dir.to_str().unwrap()));
}
