//! What every DPDK test needs: EAL arguments that work without hugepages or PCI devices, with a
//! runtime directory of their own per run, removed when the test is done.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// A name unique to this run (process id and time).
pub fn unique(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("rocemu-{tag}-{}-{nanos}", std::process::id())
}

/// The EAL's runtime directory for a `--file-prefix`; removed on drop.
pub struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--no-huge -m 256 --no-pci --no-telemetry --file-prefix=<unique>` and then `extra`, with
/// the runtime directory that prefix makes (drop it after the EAL is gone).
pub fn eal_args(tag: &str, extra: &str) -> (String, RunDir) {
    let prefix = unique(tag);
    // Where the EAL puts it: /var/run/dpdk for root, $XDG_RUNTIME_DIR/dpdk (or /tmp/dpdk) else.
    let base = match std::env::var_os("XDG_RUNTIME_DIR") {
        _ if is_root() => PathBuf::from("/var/run"),
        Some(d) => PathBuf::from(d),
        None => PathBuf::from("/tmp"),
    };
    let dir = RunDir(base.join("dpdk").join(&prefix));
    let args = format!("--no-huge -m 256 --no-pci --no-telemetry --file-prefix={prefix} {extra}");
    (args, dir)
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// A network namespace of its own for a test, deleted on drop (with every interface in it).
/// Needs root and `ip` (iproute2), as scripts/test provides.
pub struct Netns(pub String);

impl Netns {
    pub fn new(tag: &str) -> Netns {
        assert!(
            is_root(),
            "this test makes a network namespace: run it as root (scripts/test does)"
        );
        let ns = Netns(unique(tag));
        ns.ip(&["netns", "add", &ns.0]);
        ns.ip_in(&["link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("ip {}: {e} (is iproute2 installed?)", args.join(" ")));
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// Runs `ip -n NS ARGS…`; panics if it fails.
    pub fn ip_in(&self, args: &[&str]) {
        let mut v = vec!["-n", &self.0];
        v.extend_from_slice(args);
        self.ip(&v);
    }

    /// Moves the calling thread into the namespace: the sockets and interfaces it (and the
    /// threads it starts) makes from now on are there.
    pub fn enter(&self) {
        let path = format!("/var/run/netns/{}", self.0);
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        use std::os::fd::AsRawFd;
        // SAFETY: `f` is an open namespace file; setns changes only this thread's namespace.
        let ret = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(ret, 0, "setns({path}): {}", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output();
    }
}
