//! Opening a datapath from its spec string (`af_packet:IFACE`, `af_xdp:IFACE` or
//! `dpdk:'EAL ARGS'`): shared by
//! the CLI's `--dev` and the drop-in libibverbs' `ROCEMU_DEV`, so that both accept the same
//! strings and say the same things about bad ones.
//!
//! DPDK lives above the emulator (`rocemu-dpdk` depends on it), so the caller hands in how to
//! open a DPDK port.
use super::af_packet::{AfPacketOptions, AfPacketPort, KernelGuard};
use super::af_xdp::AfXdpPort;
use super::Port;
use std::net::IpAddr;

/// How the caller opens `dpdk:ARGS` (its EAL arguments), or why it cannot.
pub type OpenDpdk<'a> = &'a dyn Fn(&str) -> Result<Box<dyn Port + Send>, String>;

/// A port and what must live as long as it.
pub struct OpenedPort {
    pub port: Box<dyn Port + Send>,
    /// Keeps the kernel from answering RoCE's UDP port (see [`KernelGuard`]).
    pub guard: Option<KernelGuard>,
}

impl std::fmt::Debug for OpenedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedPort")
            .field("port", &self.port.name())
            .finish_non_exhaustive()
    }
}

/// Opens the datapath `dev` for the addresses `addrs` (the AF_PACKET filter reads RoCEv2
/// datagrams to them); `promiscuous` when the RNIC uses a MAC other than the interface's.
/// `what` names the setting in error messages (`--dev`, `ROCEMU_DEV`).
pub fn open_datapath(
    what: &str,
    dev: &str,
    addrs: &[IpAddr],
    promiscuous: bool,
    dpdk: OpenDpdk<'_>,
) -> Result<OpenedPort, String> {
    if let Some(ifname) = dev.strip_prefix("af_packet:") {
        let opts = AfPacketOptions {
            promiscuous,
            addrs: addrs.to_vec(),
            fanout: None,
        };
        let p = AfPacketPort::open(ifname, &opts).map_err(|e| e.to_string())?;
        Ok(OpenedPort {
            port: Box::new(p),
            guard: Some(KernelGuard::new()),
        })
    } else if let Some(ifname) = dev.strip_prefix("af_xdp:") {
        let opts = AfPacketOptions {
            promiscuous,
            addrs: addrs.to_vec(),
            fanout: None,
        };
        let p = AfXdpPort::open(ifname, &opts).map_err(|e| e.to_string())?;
        // The guard for the frames the program passes to the kernel (a queue other than the
        // socket's, IPv4 with options): the kernel must not answer them.
        Ok(OpenedPort {
            port: Box::new(p),
            guard: Some(KernelGuard::new()),
        })
    } else if let Some(args) = dev.strip_prefix("dpdk:") {
        // A PMD on a kernel interface (net_af_packet, net_af_xdp, net_tap) leaves the kernel
        // seeing the same datagrams; on a real NIC the guard costs two idle sockets.
        Ok(OpenedPort {
            port: dpdk(args)?,
            guard: Some(KernelGuard::new()),
        })
    } else {
        Err(format!(
            "{what} {dev}: give af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'"
        ))
    }
}

/// The kernel interface of a datapath spec: IFACE of `af_packet:IFACE` or `af_xdp:IFACE`.
pub fn kernel_iface(spec: &str) -> Option<&str> {
    spec.strip_prefix("af_packet:")
        .or_else(|| spec.strip_prefix("af_xdp:"))
}

/// The line rate of the datapath `spec`, Mb/s, when the kernel knows it: an AF_PACKET or AF_XDP
/// interface's `/sys/class/net/IFACE/speed` (a veth says 10000). `None` otherwise (a DPDK
/// port, an interface that reports no speed): congestion control then assumes its default.
pub fn line_rate_mbps(spec: &str) -> Option<u32> {
    let iface = kernel_iface(spec)?;
    let s = std::fs::read_to_string(format!("/sys/class/net/{iface}/speed")).ok()?;
    s.trim()
        .parse::<i64>()
        .ok()
        .filter(|&v| v > 0 && v <= i64::from(u32::MAX))
        .map(|v| v as u32)
}
