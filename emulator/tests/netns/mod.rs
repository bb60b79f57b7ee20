//! A network namespace of a test's own with a veth pair in it, entered by the test's thread.
//! Needs root (scripts/test runs as root).
#![allow(dead_code)]
use std::process::Command;

/// Runs `ip ARGS`, failing the test with its stderr when it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace, deleted on drop (with the veth pair in it).
pub struct Ns(pub &'static str);
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", self.0]).status();
    }
}

/// Makes namespace `ns` (anew) with veth ends `a` and `b`, runs `before_up` on each end's
/// name, sets both up, and moves the calling thread into it.
pub fn veth_ns(ns: &'static str, a: &str, b: &str, before_up: impl Fn(&str)) -> Ns {
    // SAFETY: geteuid takes nothing and cannot fail.
    assert!(
        unsafe { libc::geteuid() } == 0,
        "needs root (network namespaces)"
    );
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
    ip(&["netns", "add", ns]);
    let guard = Ns(ns);
    ip(&[
        "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b,
    ]);
    for i in [a, b] {
        before_up(i);
        ip(&["-n", ns, "link", "set", i, "up"]);
    }
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: an open namespace file; setns changes only this thread's network namespace.
    assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
    guard
}
