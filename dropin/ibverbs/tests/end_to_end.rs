//! Debian's unmodified ibverbs-utils and perftest, both ends on the built library, over
//! AF_PACKET on the loopback interface (two RoCEmu RNICs, 127.77.N.1 and .2 with MACs of
//! their own, in two processes; N of the test's own): every transport, the completion-event path, SRQs, the new
//! post API (perftest's default) and the old one.
//!
//! Needs root (AF_PACKET). Each pair of runs uses a TCP port and a subnet of its own so that
//! the tests run in parallel: on `lo` every RNIC sees every frame, and two pairs on the same
//! addresses took each other's packets for their own (srq_pingpong's 16 QPs ended in "transport
//! retry counter exceeded" about one run in three).
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

fn libdir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let lib = exe.parent().unwrap().join("libibverbs.so");
        assert!(lib.exists(), "{} was not built", lib.display());
        let dir = std::env::temp_dir().join(format!("rocemu-ibverbs-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("libibverbs.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        dir
    })
    .clone()
}

/// One end; `pin`: on CPU 0 only (`taskset`), where its program and engine threads take turns;
/// its device on `threads` engine threads (`ROCEMU_THREADS`).
fn end(prog: &str, args: &[&str], net: u8, n: u8, pin: bool, threads: u8) -> Command {
    let mut c = Command::new("timeout");
    c.arg("60");
    if pin {
        c.args(["taskset", "-c", "0"]);
    }
    c.arg(prog)
        .args(args)
        .env("LD_LIBRARY_PATH", libdir())
        .env("LD_BIND_NOW", "1")
        .env("ROCEMU_DEV", "af_packet:lo")
        .env("ROCEMU_IP", format!("127.77.{net}.{n}"))
        .env("ROCEMU_MAC", format!("02:52:4f:00:{net:02x}:{n:02x}"))
        .env("ROCEMU_THREADS", threads.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `prog args` as server (RNIC .1) and as client of it (RNIC .2); returns both outputs.
fn pair(prog: &str, args: &[&str], port: u16) -> (String, String) {
    pair_on(prog, args, port, false, 1)
}

/// [`pair`], both ends on one CPU if `pin`, each end's device on `threads` engine threads.
fn pair_on(prog: &str, args: &[&str], port: u16, pin: bool, threads: u8) -> (String, String) {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "needs root (AF_PACKET on lo)"
    );
    let net = (port % 250) as u8;
    let port = port.to_string();
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["-p", &port]);
    let server = end(prog, &a, net, 1, pin, threads).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let mut c = a.clone();
    c.push("127.0.0.1");
    let client = end(prog, &c, net, 2, pin, threads).output().unwrap();
    let server = server.wait_with_output().unwrap();
    let s = format!(
        "{}{}",
        String::from_utf8_lossy(&server.stdout),
        String::from_utf8_lossy(&server.stderr)
    );
    let k = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success() && client.status.success(),
        "{prog} {args:?}\n--- server ({}):\n{s}\n--- client ({}):\n{k}",
        server.status,
        client.status
    );
    (s, k)
}

fn pingpong(prog: &str, extra: &[&str], port: u16) {
    pingpong_on(prog, extra, port, false, 1)
}

fn pingpong_on(prog: &str, extra: &[&str], port: u16, pin: bool, threads: u8) {
    let mut a = vec!["-g", "1", "-n", "200"];
    a.extend(extra);
    let (s, k) = pair_on(prog, &a, port, pin, threads);
    for o in [&s, &k] {
        assert!(o.contains("200 iters in"), "{prog} {extra:?}: {o}");
        assert!(o.contains("GID ::ffff:127.77."), "{o}");
    }
}

/// The result line of a perftest run: the message size leads it.
fn perftest(prog: &str, extra: &[&str], size: &str, port: u16) {
    let mut a = vec!["-x", "1", "-n", "200"];
    a.extend(extra);
    let (_s, k) = pair(prog, &a, port);
    let line = k
        .lines()
        .find(|l| l.split_whitespace().next() == Some(size))
        .unwrap_or_else(|| panic!("{prog} {extra:?}: no result line:\n{k}"));
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert!(f.len() >= 4 && f[2] > 0.0, "{prog}: {line}");
}

#[test]
fn rc_pingpong_polling_and_events() {
    pingpong("ibv_rc_pingpong", &[], 18601);
    pingpong("ibv_rc_pingpong", &["-e"], 18602);
}

/// `-t`: the CQ is an extended one with completion timestamps (ibv_create_cq_ex, start/next/
/// end_poll, read_completion_ts); each end prints its receive completions' clock deltas, which
/// exist only when every timestamped completion was parsed. Not with `-e`: rc_pingpong's `-t -e`
/// loop takes ENOENT from the start_poll after an event for a failure, and a completion that
/// arrives after its re-arm but is taken by that round's next_poll leaves exactly that event
/// (legitimately: it came while armed); under load the run then fails, on any provider that
/// raises that event as the verbs say (not checked on hardware).
#[test]
fn rc_pingpong_extended_cq_with_timestamps() {
    let (s, k) = pair(
        "ibv_rc_pingpong",
        &["-g", "1", "-c", "-n", "200", "-t"],
        18606,
    );
    for o in [&s, &k] {
        assert!(o.contains("200 iters in"), "{o}");
        assert!(o.contains("Average receive completion clock cycles"), "{o}");
    }
}

#[test]
fn uc_and_ud_pingpong() {
    pingpong("ibv_uc_pingpong", &[], 18603);
    // UD: the server answers through ibv_create_ah_from_wc.
    pingpong("ibv_ud_pingpong", &[], 18604);
}

/// Also three times with both ends on one CPU: there the client, having seen its last receive
/// completions, destroyed its QPs before its engine's next burst had sent their ACKs, and the
/// server retried into QPs that were gone ("transport retry counter exceeded", one run in two
/// before `ibv_destroy_qp` and exit waited for queued responses to leave).
#[test]
fn srq_pingpong() {
    pingpong("ibv_srq_pingpong", &["-e"], 18605);
    for port in [18607, 18608, 18609] {
        pingpong_on("ibv_srq_pingpong", &["-e"], port, true, 1);
    }
}

#[test]
fn perftest_bandwidth_new_and_old_post_api() {
    perftest("ib_write_bw", &["-q", "2"], "65536", 18611);
    perftest("ib_write_bw", &["--use_old_post_send"], "65536", 18612);
    perftest("ib_read_bw", &["-e"], "65536", 18613);
    perftest("ib_send_bw", &["-q", "2", "--use-srq"], "65536", 18614);
    perftest("ib_atomic_bw", &[], "8", 18615);
}

#[test]
fn perftest_latency() {
    perftest("ib_send_lat", &["-e"], "2", 18621);
    perftest("ib_read_lat", &[], "2", 18622);
    perftest("ib_atomic_lat", &[], "8", 18623);
}

/// tests/c/verbs_check.c, compiled against the system's verbs.h and linked against the
/// system's libibverbs (then run on ours): impossible arguments answer rdma-core's errno; four
/// threads post RDMA WRITEs with two SGEs each and poll at once, into a second process's
/// regions, which checks every byte; ibv_resize_cq and ibv_rereg_mr (a new translation, a new
/// PD) do what rdma-core's man pages say; an R_Key never valid completes with REM_ACCESS_ERR.
#[test]
fn verbs_program_of_our_own_errno_threads_bad_rkey() {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "needs root (AF_PACKET on lo)"
    );
    let exe = c_program("verbs_check", &["-Wall"], &["-libverbs", "-lpthread"]);
    // On one engine thread and on two (shards): the completion of a work request that fails
    // before sending anything once got lost to ibv_poll_cq's "still empty" shortcut, more often
    // with two.
    for threads in ["1", "2"] {
        run_c_program(
            &exe,
            120,
            threads,
            ["127.77.14.9", "02:52:4f:00:0e:09"],
            ["127.77.14.10", "02:52:4f:00:0e:0a"],
        );
    }
}

/// tests/c/cq_ex_check.c (built and run like verbs_check.c): ibv_create_cq_ex and the extended
/// poll API. SEND with immediate, RDMA WRITE and RDMA WRITE with immediate between two RNICs,
/// once on plain CQs and once on extended ones: every field read through start/next_poll and
/// the read_* ops equals what ibv_poll_cq reports for the same work request (and what the
/// traffic implies); ibv_poll_cq through ibv_cq_ex_to_cq and a completion channel work on an
/// extended CQ; completion timestamps fall between post and poll; EOPNOTSUPP for unsupported
/// flags (wallclock, flow tag), EINVAL for cqe 0 or too big, ENOENT from start_poll on an empty
/// CQ.
#[test]
fn extended_cq_poll_api_matches_poll_cq() {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "needs root (AF_PACKET on lo)"
    );
    let exe = c_program(
        "cq_ex_check",
        &["-Wall", "-Wextra", "-Werror"],
        &["-libverbs"],
    );
    run_c_program(
        &exe,
        60,
        "1",
        ["127.77.14.11", "02:52:4f:00:0e:0b"],
        ["127.77.14.12", "02:52:4f:00:0e:0c"],
    );
}

/// `tests/c/NAME.c` compiled with `cc WARNINGS … LIBS` against the system's verbs.h and
/// libibverbs, into the directory where it then runs on ours.
fn c_program(name: &str, warnings: &[&str], libs: &[&str]) -> PathBuf {
    let exe = libdir().join(name);
    let st = Command::new("cc")
        .args(warnings)
        .arg("-o")
        .arg(&exe)
        .arg(format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR")))
        .args(libs)
        .status()
        .expect("cc");
    assert!(st.success(), "{name}.c did not compile");
    exe
}

/// Runs one of those programs (it forks its peer) for at most `secs` seconds on AF_PACKET over
/// lo on `threads` engine threads, this end at `me` and the peer at `peer` (IP, MAC); it must
/// exit 0 having printed "ok".
fn run_c_program(exe: &std::path::Path, secs: u32, threads: &str, me: [&str; 2], peer: [&str; 2]) {
    let o = Command::new("timeout")
        .arg(secs.to_string())
        .arg(exe)
        .env("LD_LIBRARY_PATH", libdir())
        .env("ROCEMU_DEV", "af_packet:lo")
        .env("ROCEMU_THREADS", threads)
        .env("ROCEMU_IP", me[0])
        .env("ROCEMU_MAC", me[1])
        .env("PEER_IP", peer[0])
        .env("PEER_MAC", peer[1])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.trim() == "ok",
        "{} on {threads} engine thread(s): {}{}",
        exe.display(),
        out,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Each end's device on two engine threads (`ROCEMU_THREADS=2`: two AF_PACKET sockets in a
/// fanout group on lo), the programs unchanged: QPs dealt out between the shards, a CQ polled
/// and armed across them, an SRQ's QPs on its shard; `-c` checks every byte.
#[test]
fn two_engine_threads_under_unmodified_programs() {
    pingpong_on("ibv_rc_pingpong", &["-e", "-c"], 18631, false, 2);
    pingpong_on(
        "ibv_srq_pingpong",
        &["-e", "-c", "-q", "4"],
        18632,
        false,
        2,
    );
    let (_s, k) = pair_on(
        "ib_write_bw",
        &["-x", "1", "-n", "500", "-q", "4"],
        18633,
        false,
        2,
    );
    assert!(
        k.lines()
            .any(|l| l.split_whitespace().next() == Some("65536")),
        "no result line:\n{k}"
    );
}
