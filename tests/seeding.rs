//! Two `rocemu perf` servers released at the same instant hand out unrelated keys: the R_Key,
//! VA, QPN and PSN each one announces in perftest's exchange. Needs root (network namespaces and
//! AF_PACKET); `scripts/test` runs as root.
//!
//! How the servers start at the same moment: both are forked from this process, each child
//! enters its namespace, says it is ready on a pipe and blocks on a second pipe; when both are
//! waiting, one write releases them and both `exec` `rocemu` within microseconds.
//!
//! What "unrelated" is checked as: (1) the announced values differ between the two servers;
//! (2) a peer that knows when a server started (the window between its release and its first
//! message) and its pid cannot find a clock-and-pid seed that explains its VA and R_Key, which
//! is how a seed of `time ^ pid` falls (ReDMArk, USENIX Security 2021); (3) with `--seed 7` on
//! both, the two servers announce the same values, so the seed, and nothing else, decides them.
#![allow(unsafe_code)]
use rocemu_emulator::rng::Rng;
use rocemu_testbed::netns::VethPair;
use rocemu_tools::oob::{OobConfig, PerftestConn, PerftestDest, PerftestXchg, SysData};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors; O_CLOEXEC keeps them out of `rocemu`.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    (fds[0], fds[1])
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A server, its pid, and what it announced.
struct Server {
    child: Child,
    dest: PerftestDest,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts one `rocemu perf write` server per (namespace, interface, address) at the same
/// instant; returns the servers with their first address message, and the release time.
fn start_pair(ends: [(&str, &str, &str); 2], seed: Option<u64>) -> (Vec<Server>, u64, u64) {
    let (ready_r, ready_w) = pipe();
    let (go_r, go_w) = pipe();
    let spawners: Vec<_> = ends
        .iter()
        .map(|&(ns, ifname, ip)| {
            let nsf = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
            let mut c = Command::new(env!("CARGO_BIN_EXE_rocemu"));
            c.args(["perf", "write", "-s", "64", "-n", "10"])
                .args(["--dev", &format!("af_packet:{ifname}"), "--ip", ip])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(s) = seed {
                c.args(["--seed", &s.to_string()]);
            }
            let fd = nsf.as_raw_fd();
            // SAFETY: only async-signal-safe calls (setns, write, read) between fork and exec.
            unsafe {
                c.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let b = 1u8;
                    libc::write(ready_w, &b as *const u8 as *const libc::c_void, 1);
                    let mut g = 0u8;
                    libc::read(go_r, &mut g as *mut u8 as *mut libc::c_void, 1);
                    Ok(())
                });
            }
            std::thread::spawn(move || {
                let child = c.spawn().expect("spawn rocemu perf");
                drop(nsf);
                child
            })
        })
        .collect();
    // Both children are forked and waiting: release them together.
    let mut two = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        // SAFETY: reads into `two` within its bounds.
        let n = unsafe {
            libc::read(
                ready_r,
                two[got..].as_mut_ptr() as *mut libc::c_void,
                2 - got,
            )
        };
        assert!(n > 0, "a child did not get ready");
        got += n as usize;
    }
    let t0 = now_ns();
    // SAFETY: writes two bytes from a two-byte buffer.
    assert_eq!(
        unsafe { libc::write(go_w, two.as_ptr() as *const libc::c_void, 2) },
        2
    );
    let children: Vec<Child> = spawners.into_iter().map(|h| h.join().unwrap()).collect();
    for fd in [ready_r, ready_w, go_r, go_w] {
        // SAFETY: our own descriptors, closed once.
        unsafe { libc::close(fd) };
    }
    // perftest's client side of the exchange, from inside each namespace, up to the server's
    // first address message.
    let askers: Vec<_> = ends
        .iter()
        .map(|&(ns, _, _)| {
            let ns = ns.to_string();
            std::thread::spawn(move || -> Result<PerftestDest, String> {
                rocemu_testbed::netns::enter(&ns)?;
                let cfg = OobConfig::with_timeout(Duration::from_secs(20));
                let mut c =
                    PerftestConn::connect(("127.0.0.1", 18515), &cfg).map_err(|e| e.to_string())?;
                c.preamble(SysData::default(), 1024)
                    .map_err(|e| e.to_string())?;
                let mut gid = [0u8; 16];
                gid[10] = 0xff;
                gid[11] = 0xff;
                gid[12..].copy_from_slice(&[10, 97, 0, 99]);
                let me = PerftestDest {
                    out_reads: 1,
                    qpn: 0x11,
                    psn: 0x22,
                    rkey: 0x33,
                    vaddr: 0x44,
                    gid,
                    ..Default::default()
                };
                c.hand_shake(&me).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut servers = Vec::new();
    for (child, h) in children.into_iter().zip(askers) {
        let dest = h.join().unwrap();
        let s = match dest {
            Ok(dest) => Server { child, dest },
            Err(e) => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                panic!("no address message from a server: {e}");
            }
        };
        servers.push(s);
    }
    let t1 = now_ns();
    (servers, t0, t1)
}

/// The seed of a server whose RNIC is seeded `clock_ns ^ pid << 40` and whose keys are drawn
/// from xoshiro256** (its first draw seeds the QPN permutation, then `reg_mr` draws the VA,
/// the L_Key and the R_Key), searched over every nanosecond in `t0..=t1`.
fn guess_clock_seed(pid: u32, t0: u64, t1: u64, d: &PerftestDest) -> Option<u64> {
    (t0..=t1).find(|&t| {
        let mut r = Rng::new(t ^ (pid as u64) << 40);
        r.next_u64();
        if 0x7f00_0000_0000u64 + (r.below(1 << 28) << 12) != d.vaddr {
            return false;
        }
        r.next_u32();
        r.next_u32() == d.rkey
    })
}

#[test]
fn two_perf_servers_released_together_hand_out_unrelated_keys() {
    let v = VethPair::new("rngs", 1500, None, None).expect("veth pair (needs root)");
    let ends = [
        (v.a.ns.as_str(), v.a.ifname.as_str(), "10.97.0.1"),
        (v.b.ns.as_str(), v.b.ifname.as_str(), "10.97.0.2"),
    ];

    let (servers, t0, t1) = start_pair(ends, None);
    let (a, b) = (&servers[0].dest, &servers[1].dest);
    assert_ne!(a.rkey, b.rkey, "{a:x?} {b:x?}");
    assert_ne!(a.vaddr, b.vaddr, "{a:x?} {b:x?}");
    assert_ne!(a.qpn, b.qpn, "{a:x?} {b:x?}");
    assert_ne!(a.psn, b.psn, "{a:x?} {b:x?}");
    // The search below costs a few nanoseconds per candidate: keep the window to seconds.
    assert!(
        t1 - t0 < 5_000_000_000,
        "the servers took {} ms",
        (t1 - t0) / 1_000_000
    );
    for s in &servers {
        let found = guess_clock_seed(s.child.id(), t0, t1, &s.dest);
        assert_eq!(
            found,
            None,
            "the server's seed is its clock ({} ns after release) and pid {}: its keys can be predicted",
            found.unwrap_or(0).saturating_sub(t0),
            s.child.id()
        );
    }
    drop(servers);

    // The same seed replays: both servers announce the same keys, though started together on
    // different interfaces as different processes.
    let (servers, _, _) = start_pair(ends, Some(7));
    let (a, b) = (&servers[0].dest, &servers[1].dest);
    assert_eq!(
        (a.rkey, a.vaddr, a.qpn, a.psn),
        (b.rkey, b.vaddr, b.qpn, b.psn),
        "--seed 7 on both"
    );
    drop(servers);
}
