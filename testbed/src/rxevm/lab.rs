//! [`RxeLab`]: one lab's lifetime, from [`RxeLab::start`] to its drop (or [`RxeLab::detach`]).
//!
//! Invariants:
//! * From the moment the namespace exists, the lab value owns it: an error in `start` drops the
//!   lab, which cleans up what exists so far.
//! * Dropping a lab kills its QEMU processes and deletes its namespace (with every interface in
//!   it), also while a failing test unwinds; then it keeps its folder (serial logs) for
//!   inspection and prints the consoles' last lines, else it removes the folder.
//! * A detached lab is left running, its state file marked so; only [`down`] stops it.
use super::network::{is_root, ns_exists};
use super::state::reap_stale;
use super::{build_guest, tail, Guest, LabConfig, Output, Vm, HOST_IF};
#[cfg(doc)]
use super::{down, BRIDGE};
use crate::netns::Netns;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static LAB_SEQ: AtomicU64 = AtomicU64::new(0);

/// Where RoCEmu sits in a lab.
#[derive(Debug, Clone)]
pub struct HostSide {
    /// [`HOST_IF`]: `--dev af_packet:rxeh0`.
    pub ifname: String,
    /// RoCEmu's address (`--ip`); the kernel does not have it.
    pub ip: Ipv4Addr,
    /// The interface's MAC, which RoCEmu uses by default.
    pub mac: String,
}

/// A private namespace with a bridge, RoCEmu's veth and N rdma_rxe VMs. Dropping it kills the
/// VMs and deletes the namespace.
#[derive(Debug)]
pub struct RxeLab {
    /// The network namespace everything lives in (`ip netns exec NS …`).
    pub ns: String,
    /// This lab's folder: serial logs (`vmN.log`), QEMU's own output (`vmN.qemu.log`), state.
    pub dir: PathBuf,
    pub mtu: u32,
    pub prefix_len: u8,
    /// [`BRIDGE`]'s address: the kernel's in the namespace.
    pub bridge_ip: Ipv4Addr,
    pub host: HostSide,
    pub guest: Guest,
    pub(super) vms: Vec<Vm>,
    pub(super) netns: Option<Netns>,
    pub(super) detached: bool,
}

impl RxeLab {
    /// Builds the guest if needed, sets up the namespace and boots the VMs; returns when every
    /// VM is READY and answers on its control channel.
    pub fn start(cfg: &LabConfig) -> Result<RxeLab, String> {
        cfg.check()?;
        if !is_root() {
            return Err(
                "the rxe lab needs root (network namespaces, taps): run as root, \
                        as scripts/test does"
                    .into(),
            );
        }
        let t0 = Instant::now();
        std::fs::create_dir_all(&cfg.workdir)
            .map_err(|e| format!("{}: {e}", cfg.workdir.display()))?;
        reap_stale(&cfg.workdir);
        let guest = build_guest(&cfg.workdir)?;
        let ns = match &cfg.ns {
            Some(n) => {
                if ns_exists(n) {
                    return Err(format!(
                        "network namespace {n} exists: a lab is up there (rocemu rxevm down --ns {n})"
                    ));
                }
                n.clone()
            }
            None => format!(
                "rxe{}n{}",
                std::process::id(),
                LAB_SEQ.fetch_add(1, Ordering::Relaxed)
            ),
        };
        if ns.is_empty() || ns.len() > 64 || ns.contains(['/', ' ', '\n']) {
            return Err(format!("bad namespace name {ns:?}"));
        }
        let dir = cfg.workdir.join("labs").join(&ns);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dir = dir.canonicalize().map_err(|e| e.to_string())?;
        let netns = Netns::new(&ns)?;
        let mut lab = RxeLab {
            ns: ns.clone(),
            dir,
            mtu: cfg.mtu,
            prefix_len: cfg.prefix_len,
            bridge_ip: cfg.bridge_ip,
            host: HostSide {
                ifname: HOST_IF.into(),
                ip: cfg.host_ip,
                mac: String::new(),
            },
            guest,
            vms: Vec::new(),
            netns: Some(netns),
            detached: false,
        };
        // From here on, an error drops `lab`, which cleans up what exists.
        lab.write_state()?;
        lab.network(cfg)?;
        for i in 0..cfg.vms {
            let vm = lab.boot(cfg, i)?;
            lab.vms.push(vm);
            lab.write_state()?;
        }
        let t1 = Instant::now();
        lab.wait_ready(cfg.boot_timeout)?;
        eprintln!(
            "rxevm: lab {ns}: {} VM(s) ready in {:.1} s (setup {:.1} s), mtu {}, dir {}",
            cfg.vms,
            t1.elapsed().as_secs_f64(),
            (t1 - t0).as_secs_f64(),
            cfg.mtu,
            lab.dir.display()
        );
        Ok(lab)
    }

    /// The VMs, `vm1` first.
    pub fn vms(&self) -> &[Vm] {
        &self.vms
    }

    /// VM `i`, counting from 0 (`vm(0)` is `vm1`). Panics when there is no such VM.
    pub fn vm(&self, i: usize) -> &Vm {
        &self.vms[i]
    }

    /// `vm(i).exec(cmd)`.
    pub fn exec(&self, i: usize, cmd: &str) -> Result<Output, String> {
        self.vm(i).exec(cmd)
    }

    /// A command to run `program` inside the lab's namespace (`ip netns exec NS program`):
    /// RoCEmu, tcpdump on [`BRIDGE`], …
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// `--dev` for RoCEmu on its veth: `af_packet:rxeh0` (its address is [`HostSide::ip`]).
    pub fn rocemu_dev(&self) -> String {
        format!("af_packet:{}", self.host.ifname)
    }

    /// Leaves the lab running after this value is gone (`rocemu rxevm up`); [`down`] stops it.
    pub fn detach(mut self) -> Result<(), String> {
        self.detached = true;
        self.write_state()?;
        for vm in &mut self.vms {
            vm.child = None;
        }
        if let Some(n) = self.netns.take() {
            std::mem::forget(n);
        }
        Ok(())
    }
}

impl Drop for RxeLab {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        let panicking = std::thread::panicking();
        for vm in &mut self.vms {
            if panicking {
                eprintln!(
                    "rxevm: {} ({}) serial console, last lines:\n{}",
                    vm.name,
                    self.ns,
                    tail(&vm.serial(), 25)
                );
            }
            if let Some(mut c) = vm.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        drop(self.netns.take()); // deletes the namespace, its bridge, taps and veth
        if panicking {
            eprintln!(
                "rxevm: lab {} cleaned up; its logs stay in {} until the next lab starts",
                self.ns,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
