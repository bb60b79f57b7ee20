//! What a lab is made of: [`LabConfig`], its defaults and its checks.
//!
//! Invariants: [`LabConfig::check`] passes before anything is created: 1 to 64 VMs, an MTU of
//! 576 to 65535, and every address (bridge, RoCEmu, VMs) a distinct host address of one subnet.
use super::default_workdir;
#[cfg(doc)]
use super::{RxeLab, HOST_IF};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

/// What [`RxeLab::start`] builds. `LabConfig { vms: 2, mtu: 9000, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The namespace's name; default `rxe<pid>n<k>`, unique per process and lab. A named
    /// namespace that exists already is an error (a lab is up there).
    pub ns: Option<String>,
    /// Guest build cache, debs, and one folder per lab (serial logs, state): [`default_workdir`].
    pub workdir: PathBuf,
    /// Number of VMs (`vm1`, `vm2`, …), booted in parallel.
    pub vms: usize,
    /// The bridge's (the kernel's) address in the namespace.
    pub bridge_ip: Ipv4Addr,
    /// RoCEmu's address on [`HOST_IF`] (the kernel does not have it: RoCEmu answers ARP for it).
    pub host_ip: Ipv4Addr,
    /// vm1's address; vmN's is this plus N-1.
    pub first_vm_ip: Ipv4Addr,
    pub prefix_len: u8,
    /// MTU of the bridge, taps, veth and the guests' eth0: 1500 → rxe active MTU 1024; ≥ 4200
    /// (9000) → 4096.
    pub mtu: u32,
    /// Guest memory, MiB.
    pub mem_mb: u32,
    /// The VMs' control channel port.
    pub ctl_port: u16,
    /// From QEMU's start to the guest's READY line.
    pub boot_timeout: Duration,
    pub qemu: String,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            ns: None,
            workdir: default_workdir(),
            vms: 1,
            bridge_ip: Ipv4Addr::new(10, 99, 0, 1),
            host_ip: Ipv4Addr::new(10, 99, 0, 2),
            first_vm_ip: Ipv4Addr::new(10, 99, 0, 11),
            prefix_len: 24,
            mtu: 1500,
            mem_mb: 768,
            ctl_port: 5000,
            boot_timeout: Duration::from_secs(180),
            qemu: "qemu-system-x86_64".into(),
        }
    }
}

impl LabConfig {
    pub(super) fn vm_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.first_vm_ip) + i as u32)
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if self.vms == 0 || self.vms > 64 {
            return Err(format!("vms = {}: 1 to 64", self.vms));
        }
        if !(576..=65535).contains(&self.mtu) {
            return Err(format!("mtu = {}: 576 to 65535", self.mtu));
        }
        if !(8..=30).contains(&self.prefix_len) {
            return Err(format!("prefix_len = {}: 8 to 30", self.prefix_len));
        }
        let mask = u32::MAX << (32 - self.prefix_len);
        let net = u32::from(self.bridge_ip) & mask;
        let mut all = vec![self.bridge_ip, self.host_ip];
        all.extend((0..self.vms).map(|i| self.vm_ip(i)));
        for (k, a) in all.iter().enumerate() {
            let h = u32::from(*a) & !mask;
            if u32::from(*a) & mask != net || h == 0 || h == !mask {
                return Err(format!(
                    "{a} is not a host address in {}/{}",
                    Ipv4Addr::from(net),
                    self.prefix_len
                ));
            }
            if all[..k].contains(a) {
                return Err(format!("{a} is used twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_checks_addresses_and_limits() {
        let ok = LabConfig::default();
        assert!(ok.check().is_ok());
        assert_eq!(ok.vm_ip(1), Ipv4Addr::new(10, 99, 0, 12));
        for bad in [
            LabConfig {
                vms: 0,
                ..ok.clone()
            },
            LabConfig {
                mtu: 100,
                ..ok.clone()
            },
            LabConfig {
                host_ip: Ipv4Addr::new(10, 98, 0, 2),
                ..ok.clone()
            },
            LabConfig {
                host_ip: Ipv4Addr::new(10, 99, 0, 11),
                ..ok.clone()
            },
            LabConfig {
                first_vm_ip: Ipv4Addr::new(10, 99, 0, 254),
                vms: 2,
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
