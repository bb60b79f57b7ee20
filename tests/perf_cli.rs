//! `rocemu perf`'s refusals of impossible arguments: one line on stderr, exit status 2, before
//! anything runs (no datapath is opened, so no root is needed).
use std::process::Command;

fn perf(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_rocemu"))
        .arg("perf")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A duration that is no positive number of seconds, in process and on a datapath alike (a NaN
/// or negative one panicked in the in-process timer; 0 ran nothing and exited 0).
#[test]
fn a_duration_must_be_positive_seconds() {
    for d in ["-D0", "-Dnan", "--duration=-1", "-Dinf"] {
        for dev in [&[][..], &["--dev", "af_packet:lo", "--ip", "10.9.0.1"][..]] {
            let args: Vec<&str> = ["write", d]
                .iter()
                .copied()
                .chain(dev.iter().copied())
                .collect();
            let (code, err) = perf(&args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert!(
                err.contains("a duration in seconds, above 0"),
                "{args:?}: {err}"
            );
            assert!(!err.contains("panicked"), "{args:?}: {err}");
        }
    }
}

/// `-D` on a datapath: the WRITE, READ and atomic bandwidth tests only, each refusal saying so.
#[test]
fn a_timed_run_on_a_datapath_says_what_it_takes() {
    let dev = ["--dev", "af_packet:lo", "--ip", "10.9.0.1", "-D", "1"];
    for extra in [
        &["send"][..],
        &["write", "--lat"],
        &["write", "-R"],
        &["write", "--threads", "2", "-q", "2"],
        &["write", "--serve", "0"],
    ] {
        let args: Vec<&str> = extra.iter().chain(&dev).copied().collect();
        let (code, err) = perf(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("-D with --dev: the WRITE, READ and atomic bandwidth tests"),
            "{args:?}: {err}"
        );
    }
    let (code, err) = perf(&[
        "atomic",
        "--verify",
        "-D",
        "1",
        "--dev",
        "af_packet:lo",
        "--ip",
        "10.9.0.1",
        "10.9.0.2",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not with -D"), "{err}");
    let (code, err) = perf(&["write", "-a", "--dev", "af_packet:lo", "--ip", "10.9.0.1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("-a is not available with --dev"), "{err}");
}
