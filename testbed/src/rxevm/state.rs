//! The lab's state file (`labs/NS/state.json` in the work folder) and what it is for: `rocemu
//! rxevm exec|status|down` from another process, and reaping labs whose owner died.
//!
//! Invariants:
//! * The file is written atomically whenever the lab changes (created, each VM booted,
//!   detached); it records the owner's PID and start time, so a later process with the same
//!   PID is not taken for the owner.
//! * A lab not detached whose owner is gone is torn down by the next [`reap_stale`] on the same
//!   work folder; a detached one only by [`down`].
use super::network::ns_exists;
use super::vm::{kill_qemu, pid_alive};
use super::{write_atomic, RxeLab, BRIDGE};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};

impl RxeLab {
    /// The lab as JSON (what `rocemu rxevm up --json` prints and the state file holds).
    pub fn info(&self) -> Value {
        json!({
            "ns": self.ns,
            "dir": self.dir,
            "owner_pid": std::process::id(),
            "owner_start": proc_start_time(std::process::id()),
            "detached": self.detached,
            "mtu": self.mtu,
            "prefix_len": self.prefix_len,
            "bridge": { "ifname": BRIDGE, "ip": self.bridge_ip.to_string() },
            "host": { "ifname": self.host.ifname, "ip": self.host.ip.to_string(), "mac": self.host.mac },
            "kernel": self.guest.kernel,
            "vms": self.vms.iter().map(|v| json!({
                "name": v.name, "ip": v.ip.to_string(), "mac": v.mac, "tap": v.tap,
                "pid": v.pid, "ctl_port": v.ctl.addr.port(), "serial_log": v.serial_log,
            })).collect::<Vec<_>>(),
        })
    }

    pub(super) fn write_state(&self) -> Result<(), String> {
        let s = serde_json::to_string_pretty(&self.info()).map_err(|e| e.to_string())?;
        write_atomic(&self.dir.join("state.json"), s.as_bytes())
    }
}

/// Field 22 of /proc/PID/stat (start time in clock ticks): tells a process from a later one
/// with the same PID.
fn proc_start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(super) fn read_state(dir: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).ok()?).ok()
}

/// Kills a lab's VMs (by recorded PID), deletes its namespace and folder.
pub(super) fn teardown(dir: &Path, st: &Value) {
    for vm in st["vms"].as_array().into_iter().flatten() {
        if let (Some(pid), Some(log)) = (vm["pid"].as_u64(), vm["serial_log"].as_str()) {
            kill_qemu(pid as u32, log);
        }
    }
    if let Some(ns) = st["ns"].as_str() {
        if ns_exists(ns) {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Tears down the labs in `workdir` whose owner is gone without cleaning up (killed, aborted),
/// and removes the folders that failed tests left for inspection.
pub fn reap_stale(workdir: &Path) {
    let Ok(rd) = std::fs::read_dir(workdir.join("labs")) else {
        return;
    };
    for e in rd.flatten() {
        let dir = e.path();
        let Some(st) = read_state(&dir) else { continue };
        if st["detached"].as_bool() == Some(true) {
            continue;
        }
        let owner = st["owner_pid"].as_u64().unwrap_or(0) as u32;
        let alive = pid_alive(owner) && proc_start_time(owner) == st["owner_start"].as_u64();
        if !alive {
            if st["ns"].as_str().is_some_and(ns_exists) {
                eprintln!(
                    "rxevm: reaping lab {} (its owner, PID {owner}, is gone)",
                    st["ns"].as_str().unwrap_or("?")
                );
            }
            teardown(&dir, &st);
        }
    }
}

/// Stops lab `ns` of `workdir`, detached or not: kills its VMs by recorded PID, deletes the
/// namespace and the lab's folder. Returns whether there was anything to stop.
pub fn down(workdir: &Path, ns: &str) -> bool {
    let dir = workdir.join("labs").join(ns);
    let st = read_state(&dir);
    let found = st.is_some() || ns_exists(ns);
    let st = st.unwrap_or_else(|| json!({ "ns": ns }));
    teardown(&dir, &st);
    found
}
