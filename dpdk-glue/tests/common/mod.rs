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
