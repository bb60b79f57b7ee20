//! Network namespaces joined by veth pairs, for tests that put RoCEmu on real (virtual)
//! interfaces. Everything created here is removed on drop, so a failed test leaves nothing
//! behind; traffic never leaves the namespaces.
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and `ip` from iproute2; `scripts/test` runs as
//! root and installs iproute2.
#![allow(unsafe_code)]

use std::process::Command;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (is iproute2 installed?)", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Runs `ip` inside namespace `ns`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut v = vec!["-n", ns];
    v.extend_from_slice(args);
    ip(&v)
}

/// A network namespace, deleted on drop (with every interface in it).
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `name` (removing a stale one of that name first) with its loopback up.
    pub fn new(name: &str) -> Result<Netns, String> {
        if unsafe_is_root() {
            let _ = ip(&["netns", "del", name]);
            ip(&["netns", "add", name])?;
            ip_in(name, &["link", "set", "lo", "up"])?;
            Ok(Netns {
                name: name.to_string(),
            })
        } else {
            Err("network namespaces need root: run the tests as root (scripts/test does)".into())
        }
    }

    /// Moves the calling thread into this namespace: sockets it opens from now on belong here.
    pub fn enter(&self) -> Result<(), String> {
        enter(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Moves the calling thread into the named namespace.
pub fn enter(name: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{name}");
    let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: `f` is an open namespace file; setns only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "setns({path}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn unsafe_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// One end of a veth pair: its namespace, interface name and address.
#[derive(Debug, Clone)]
pub struct End {
    pub ns: String,
    pub ifname: String,
    /// The kernel's address on the interface (with prefix), if any.
    pub cidr: Option<String>,
}

/// Two namespaces joined by a veth pair. `a.ifname` lives in `ns_a`, `b.ifname` in `ns_b`.
#[derive(Debug)]
pub struct VethPair {
    pub a: End,
    pub b: End,
    // Dropped after the fields above are used; deleting a namespace deletes its veth end and
    // with it the pair.
    _ns: Vec<Netns>,
}

impl VethPair {
    /// Creates namespaces `{prefix}a` and `{prefix}b` with veth `{prefix}0` / `{prefix}1`,
    /// MTU `mtu`, the kernel addresses `cidr_a` / `cidr_b` (or none), all up.
    pub fn new(
        prefix: &str,
        mtu: usize,
        cidr_a: Option<&str>,
        cidr_b: Option<&str>,
    ) -> Result<VethPair, String> {
        let na = Netns::new(&format!("{prefix}a"))?;
        let nb = Netns::new(&format!("{prefix}b"))?;
        let (ia, ib) = (format!("{prefix}0"), format!("{prefix}1"));
        ip(&[
            "link", "add", &ia, "netns", &na.name, "type", "veth", "peer", "name", &ib, "netns",
            &nb.name,
        ])?;
        let m = mtu.to_string();
        for (ns, ifn, cidr) in [(&na.name, &ia, cidr_a), (&nb.name, &ib, cidr_b)] {
            ip_in(ns, &["link", "set", ifn, "mtu", &m])?;
            if let Some(c) = cidr {
                ip_in(ns, &["addr", "add", c, "dev", ifn])?;
            }
            ip_in(ns, &["link", "set", ifn, "up"])?;
        }
        Ok(VethPair {
            a: End {
                ns: na.name.clone(),
                ifname: ia,
                cidr: cidr_a.map(str::to_string),
            },
            b: End {
                ns: nb.name.clone(),
                ifname: ib,
                cidr: cidr_b.map(str::to_string),
            },
            _ns: vec![na, nb],
        })
    }
}
