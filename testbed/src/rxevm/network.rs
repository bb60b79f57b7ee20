//! The lab's network namespace and what is in it: the bridge, RoCEmu's veth and the VMs' taps.
//!
//! Invariants: everything is created inside the lab's own namespace (nothing on the host: no
//! interface, route or firewall rule), so deleting the namespace removes all of it; the bridge
//! and the veth have fixed MACs, and every link gets the lab's MTU.
use super::{LabConfig, RxeLab, BRIDGE, BRIDGE_MAC, HOST_IF, HOST_IF_PEER, HOST_MAC};
use crate::netns::ip_in;
use std::path::Path;

impl RxeLab {
    pub(super) fn network(&mut self, cfg: &LabConfig) -> Result<(), String> {
        let ns = self.ns.as_str();
        let m = cfg.mtu.to_string();
        let ip = |args: &[&str]| ip_in(ns, args);
        // Fixed MACs: a bridge otherwise takes the lowest of its ports' and changes it when
        // ports come and go, which stale ARP caches in the guests would not follow.
        ip(&[
            "link",
            "add",
            "name",
            BRIDGE,
            "address",
            BRIDGE_MAC,
            "mtu",
            &m,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ])?;
        let cidr = format!("{}/{}", cfg.bridge_ip, cfg.prefix_len);
        ip(&["addr", "add", &cidr, "dev", BRIDGE])?;
        ip(&[
            "link",
            "add",
            HOST_IF,
            "address",
            HOST_MAC,
            "mtu",
            &m,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IF_PEER,
            "mtu",
            &m,
        ])?;
        ip(&["link", "set", HOST_IF_PEER, "master", BRIDGE, "up"])?;
        ip(&["link", "set", HOST_IF, "up"])?;
        for i in 0..cfg.vms {
            let tap = format!("rxetap{}", i + 1);
            ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
            ip(&["link", "set", &tap, "mtu", &m, "master", BRIDGE, "up"])?;
        }
        ip(&["link", "set", BRIDGE, "mtu", &m, "up"])?;
        self.host.mac = self
            .read_in_ns(&format!("/sys/class/net/{HOST_IF}/address"))?
            .trim()
            .to_string();
        Ok(())
    }

    fn read_in_ns(&self, path: &str) -> Result<String, String> {
        let out = self
            .command("cat")
            .arg(path)
            .output()
            .map_err(|e| format!("ip netns exec cat: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{path} in netns {}: {}",
                self.ns,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// Effective UID 0, from /proc (no libc call, no unsafe).
pub(super) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

pub(super) fn ns_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists() || Path::new("/run/netns").join(name).exists()
}
