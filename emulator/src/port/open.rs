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

/// The kernel's `rx_dropped` and `tx_dropped` of the interface of the datapath `spec` (its
/// `/sys/class/net/IFACE/statistics`), when it has one: every sender's drops on the interface,
/// the kernel's own included (a veth whose peer is behind drops on transmit after an AF_XDP
/// socket handed it the frame, and the socket never hears of it).
pub fn iface_drops(spec: &str) -> Option<(u64, u64)> {
    let iface = kernel_iface(spec)?;
    let read = |c: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{c}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("rx_dropped")?, read("tx_dropped")?))
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

/// How the caller opens `dpdk:ARGS` with `n` rx and tx queues: a port per queue, queue k's
/// k-th (see [`OpenDpdk`]).
pub type OpenDpdkQueues<'a> = &'a dyn Fn(&str, usize) -> Result<Vec<Box<dyn Port + Send>>, String>;

/// Every shard's port, shard 0's first, and, for ports on queues, the table of doorbells that
/// wakes a shard when another has steered a frame to it.
pub type ShardSet = (
    Vec<Box<dyn Port + Send>>,
    Option<std::sync::Arc<super::steered::WakeTable>>,
);

/// A datapath opened for a device split into shards, one per polling thread, before the
/// shards' RNICs exist: the ports are handed out by [`ShardPorts::into_ports`] once the
/// device's QPN steering (its keys) is known.
pub struct ShardPorts {
    kind: ShardKind,
    /// Keeps the kernel from answering RoCE's UDP port (see [`KernelGuard`]).
    pub guard: Option<KernelGuard>,
}

enum ShardKind {
    /// AF_PACKET: shard 0's socket, concrete (it makes the fanout group once the keys are
    /// known), and what the others open with.
    Fanout {
        first: Box<AfPacketPort>,
        ifname: String,
        opts: AfPacketOptions,
        threads: usize,
    },
    /// A port per queue (AF_XDP, DPDK), shard k's on queue k.
    Queues(Vec<Box<dyn Port + Send>>),
}

impl std::fmt::Debug for ShardPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardPorts")
            .field("port", &self.first().name())
            .finish_non_exhaustive()
    }
}

/// Opens the datapath `dev` for a device on `threads` polling threads (more than one):
/// AF_PACKET (a packet socket per shard, in one fanout group), AF_XDP (the socket of queue k
/// for shard k) or DPDK (rx and tx queue k of the port for shard k). `threads_what` names the
/// setting in error messages (`--threads 2`, `ROCEMU_THREADS=2`); the rest is as
/// [`open_datapath`].
pub fn open_datapath_shards(
    what: &str,
    threads_what: &str,
    dev: &str,
    addrs: &[IpAddr],
    promiscuous: bool,
    threads: usize,
    dpdk_queues: OpenDpdkQueues<'_>,
) -> Result<ShardPorts, String> {
    use crate::rnic::MAX_SHARDS;
    if !(2..=MAX_SHARDS).contains(&threads) {
        return Err(format!(
            "{threads_what}: from 2 to {MAX_SHARDS} threads on a datapath"
        ));
    }
    let opts = AfPacketOptions {
        promiscuous,
        addrs: addrs.to_vec(),
        fanout: None,
    };
    let guard = Some(KernelGuard::new());
    let kind = if let Some(ifname) = dev.strip_prefix("af_packet:") {
        let first = AfPacketPort::open(ifname, &opts).map_err(|e| e.to_string())?;
        ShardKind::Fanout {
            first: Box::new(first),
            ifname: ifname.to_string(),
            opts,
            threads,
        }
    } else if let Some(ifname) = dev.strip_prefix("af_xdp:") {
        let ps = AfXdpPort::open_shards(ifname, &opts, threads).map_err(|e| e.to_string())?;
        ShardKind::Queues(
            ps.into_iter()
                .map(|p| Box::new(p) as Box<dyn Port + Send>)
                .collect(),
        )
    } else if let Some(args) = dev.strip_prefix("dpdk:") {
        ShardKind::Queues(dpdk_queues(args, threads)?)
    } else {
        return Err(format!(
            "{threads_what} on a datapath: {what} af_packet:IFACE, af_xdp:IFACE or dpdk:'EAL ARGS'"
        ));
    };
    Ok(ShardPorts { kind, guard })
}

impl ShardPorts {
    /// Shard 0's port (for the device's MAC, MTU and name).
    pub fn first(&self) -> &dyn Port {
        match &self.kind {
            ShardKind::Fanout { first, .. } => &**first,
            ShardKind::Queues(ps) => &*ps[0],
        }
    }

    /// Every shard's port, shard 0's first, for a device whose QPN steering is `steering`
    /// ([`crate::rnic::Rnic::qpn_steering`], the same in every shard): on AF_PACKET the
    /// sockets join one fanout group whose program hands each frame to the shard that has its
    /// QP; on queues, a frame read on another shard's queue goes to its shard through a ring
    /// ([`super::steered`]), whose reader is woken through the returned table (set each
    /// shard's engine's doorbell in it).
    pub fn into_ports(self, steering: crate::rnic::QpnSteering) -> Result<ShardSet, String> {
        use super::af_packet::Fanout;
        match self.kind {
            ShardKind::Fanout {
                mut first,
                ifname,
                opts,
                threads,
            } => {
                let id = first
                    .join_fanout(&Fanout::First(steering))
                    .map_err(|e| e.to_string())?;
                let mut ports: Vec<Box<dyn Port + Send>> = vec![first];
                // The others join in shard order: the group numbers its members as they join.
                for _ in 1..threads {
                    let o = AfPacketOptions {
                        fanout: Some(Fanout::Join(id)),
                        ..opts.clone()
                    };
                    let p = AfPacketPort::open(&ifname, &o).map_err(|e| e.to_string())?;
                    ports.push(Box::new(p));
                }
                Ok((ports, None))
            }
            ShardKind::Queues(ps) => {
                let (ports, table) = super::steered::steered(ps, steering);
                Ok((
                    ports
                        .into_iter()
                        .map(|p| Box::new(p) as Box<dyn Port + Send>)
                        .collect(),
                    Some(table),
                ))
            }
        }
    }
}
