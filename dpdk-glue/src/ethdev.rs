//! An Ethernet port with one rx and one tx queue (or [`EthConfig::queues`] of each), started, as
//! a value: `Drop` stops and closes it (for a vdev, closing releases the port for the rest of
//! the process).
//!
//! Invariants: queue 0 of each direction is used only through `&mut EthPort` (its own bursts)
//! or by the one [`DpdkPort`](crate::DpdkPort) given that queue; every other `EthPort` method
//! only reads, so a port shared by the ports of its queues is `Sync`. The port holds its rx pool
//! (and so the EAL), and is closed before that pool can go. An MTU is checked against
//! both limits a driver reports (`max_mtu`, and `max_rx_pktlen` less the overhead ethdev counts)
//! before DPDK sees it, so that a driver that cannot carry the frames says so in words.
//!
//! Jumbo frames with DPDK 22.11: `net_af_packet` reports 1518-byte frames at most whatever its
//! `framesz` (lifted in 26.03), `net_tap` 1522 (lifted in 23.03), `net_memif` 1518; `net_pcap`
//! takes any MTU, and on a kernel interface (`iface=IFACE`) carries jumbo frames.
use crate::eal::{port_name, Eal};
use crate::error::{check, Error, Result, ENOTSUP};
use crate::gate;
use crate::mempool::{Mbuf, Mempool};
use rocemu_dpdk_sys as sys;
use rocemu_emulator::port::BURST;
use rocemu_wire::eth::Mac;
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;

/// The RSS hash functions asked for with several queues: IPv4 and IPv6 with their UDP ports
/// (RoCEv2's source port differs by QP), where the driver has them.
/// (rte_ethdev.h's RTE_ETH_RSS_IPV4, _NONFRAG_IPV4_UDP, _IPV6, _NONFRAG_IPV6_UDP: bits 2, 5, 8
/// and 11, macros bindgen cannot evaluate.)
const RSS_IP_UDP: u64 = 1 << 2 | 1 << 5 | 1 << 8 | 1 << 11;

/// Ethernet overhead on top of the MTU that a frame buffer must hold: header (14) and FCS or a
/// VLAN tag (4), as [`Port::frame_capacity`](rocemu_emulator::port::Port::frame_capacity) counts.
pub const FRAME_OVERHEAD: usize = 18;

/// How to set a port up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthConfig {
    /// The MTU to set; `None` keeps the port's current one.
    pub mtu: Option<u16>,
    /// Rx descriptors (rounded to what the driver accepts).
    pub rx_desc: u16,
    /// Tx descriptors (likewise).
    pub tx_desc: u16,
    /// Receive every frame, not only those to the port's MAC (where the driver can).
    pub promiscuous: bool,
    /// Rx and tx queues (one each per polling thread); with more than one, RSS on the IP and
    /// UDP fields where the driver offers it.
    pub queues: u16,
}

impl Default for EthConfig {
    fn default() -> Self {
        EthConfig {
            mtu: None,
            rx_desc: 1024,
            tx_desc: 1024,
            promiscuous: true,
            queues: 1,
        }
    }
}

/// A configured and started ethdev port (`rte_eth_dev_configure` with one rx and one tx queue,
/// queue setup, `rte_eth_dev_start`, promiscuous mode).
pub struct EthPort {
    id: u16,
    name: String,
    driver: String,
    pool: Mempool,
    /// Bursts run under the interrupt-thread gate (see `gate`): memif remaps its rings there.
    gated: bool,
    queues: u16,
}

// SAFETY: the port's queue 0 may be used from any one thread at a time, which `&mut self` on
// its queue operations guarantees (another queue belongs to the one DpdkPort given it); the
// pool handle is Send.
unsafe impl Send for EthPort {}
// SAFETY: every `&self` method only reads the port's data (name, MAC, MTU, link) or takes the
// gate; nothing reaches a queue through `&EthPort`.
unsafe impl Sync for EthPort {}

impl fmt::Debug for EthPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EthPort")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("driver", &self.driver)
            .field("pool", &self.pool)
            .finish()
    }
}

/// What a driver says about a port (`rte_eth_dev_info_get`), as much as this crate uses.
#[derive(Debug, Clone)]
pub(crate) struct DevInfo {
    pub name: String,
    pub driver: String,
    pub min_mtu: u16,
    /// The largest MTU both of the driver's limits allow.
    pub max_mtu: u16,
    /// The longest frame it receives (`max_rx_pktlen`).
    pub max_frame: u32,
    /// What ethdev adds to an MTU to get a frame length for this driver.
    pub overhead: u32,
    /// The kernel interface the port sits on (`net_pcap`, `net_af_packet`, `net_tap`, …), or 0.
    pub if_index: u32,
    /// The most rx and tx queues it can have (the smaller of the two).
    pub max_queues: u16,
    /// The RSS hash functions it offers (`flow_type_rss_offloads`).
    pub rss: u64,
}

impl DevInfo {
    pub(crate) fn get(id: u16) -> Result<DevInfo> {
        let name = port_name(id)?;
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: `info` is a valid, writable rte_eth_dev_info.
        let ret = unsafe { sys::rte_eth_dev_info_get(id, &mut info) };
        check("rte_eth_dev_info_get", ret, || name.clone())?;
        let driver = if info.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-NULL driver_name is the driver's static NUL-terminated name.
            unsafe { CStr::from_ptr(info.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        // ethdev's own rule (eth_dev_get_overhead_len in DPDK 22.11): the gap between the two
        // limits when a driver gives both, else Ethernet header and CRC.
        let overhead = if info.max_mtu != u16::MAX && info.max_rx_pktlen > u32::from(info.max_mtu) {
            info.max_rx_pktlen - u32::from(info.max_mtu)
        } else {
            FRAME_OVERHEAD as u32
        };
        let by_frame = info.max_rx_pktlen.saturating_sub(overhead);
        let max_mtu = u16::try_from(by_frame)
            .unwrap_or(u16::MAX)
            .min(info.max_mtu);
        Ok(DevInfo {
            name,
            driver,
            min_mtu: info.min_mtu,
            max_mtu,
            max_frame: info.max_rx_pktlen,
            overhead,
            if_index: info.if_index,
            max_queues: info.max_rx_queues.min(info.max_tx_queues),
            rss: info.flow_type_rss_offloads,
        })
    }

    /// Whether the port can have `queues` rx and tx queues; the error says how many it can (or
    /// why a driver's several queues are not safe to use).
    pub(crate) fn check_queues(&self, queues: u16) -> Result<()> {
        if queues > 1 && self.driver == "net_memif" {
            // Seen with DPDK 22.11: a memif server with 2 queues and a client with 1 read
            // the client's one ring from both queues (961 malformed frames and 17 bad ICRCs
            // in one run); a client with more queues than the server gets no link at all.
            return Err(Error::other(
                "rte_eth_dev_configure",
                format!(
                    "{} (net_memif): several queues are refused: a memif server whose client has \
                     fewer queues reads that client's rings from two queues at once and corrupts \
                     frames (DPDK 22.11), and nothing tells one end the other's count; use one \
                     queue (one thread) on memif, or net_af_packet's qpairs=N, AF_XDP or a NIC",
                    self.name
                ),
            ));
        }
        if queues <= self.max_queues {
            return Ok(());
        }
        let hint = match self.driver.as_str() {
            "net_af_packet" => " (the vdev's qpairs=N gives it N)",
            "net_tap" => " (the vdev's queues=N gives it N)",
            _ => "",
        };
        Err(Error::other(
            "rte_eth_dev_configure",
            format!(
                "{} ({}) has at most {} queues of each kind; {queues} were asked for{hint}",
                self.name, self.driver, self.max_queues
            ),
        ))
    }

    /// Whether the driver can do `mtu`; the error says why not, for `func`.
    pub(crate) fn check_mtu(&self, func: &'static str, mtu: u16) -> Result<()> {
        let (name, driver) = (&self.name, &self.driver);
        if mtu < self.min_mtu {
            return Err(Error::other(
                func,
                format!(
                    "MTU {mtu} is below what {name} ({driver}) supports ({})",
                    self.min_mtu
                ),
            ));
        }
        if mtu > self.max_mtu {
            let frame = u32::from(mtu) + self.overhead;
            let hint = match driver.as_str() {
                "net_af_packet" | "net_tap" => {
                    "; for jumbo frames on a kernel interface use net_pcap (--vdev=net_pcap0,iface=IFACE,phy_mac=1)"
                }
                _ => "",
            };
            return Err(Error::other(
                func,
                format!(
                    "MTU {mtu} needs {frame}-byte frames but {name} ({driver}, DPDK {}) receives \
                     frames of {} bytes at most, MTU {}..={}{hint}",
                    crate::DPDK_VERSION,
                    self.max_frame,
                    self.min_mtu,
                    self.max_mtu
                ),
            ));
        }
        Ok(())
    }

    /// The MTU to use when none is asked for: the kernel interface's, for a driver on one (as
    /// AF_PACKET does), capped at what the driver can do; else the port's current MTU.
    pub(crate) fn default_mtu(&self, id: u16) -> Result<u16> {
        match kernel_mtu(self.if_index) {
            Some(k) => Ok(k.clamp(self.min_mtu, self.max_mtu)),
            None => port_mtu(id),
        }
    }
}

/// The MTU of kernel interface `if_index` in the calling thread's network namespace, if there
/// is one.
fn kernel_mtu(if_index: u32) -> Option<u16> {
    if if_index == 0 {
        return None;
    }
    let mut name: [libc::c_char; libc::IF_NAMESIZE] = [0; libc::IF_NAMESIZE];
    // SAFETY: `name` has the IF_NAMESIZE bytes if_indextoname may write.
    if unsafe { libc::if_indextoname(if_index, name.as_mut_ptr()) }.is_null() {
        return None;
    }
    // SAFETY: plain arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero ifreq is valid; the name (NUL-terminated, IF_NAMESIZE bytes at most)
    // is copied into its ifr_name of the same size.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name = name;
    // SAFETY: SIOCGIFMTU reads ifr_name and writes ifr_ifru.ifru_mtu of a valid ifreq.
    let ret = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut ifr) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if ret < 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds the MTU.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u16::try_from(mtu).ok()
}

/// The MTU of port `id` (`rte_eth_dev_get_mtu`).
pub(crate) fn port_mtu(id: u16) -> Result<u16> {
    let mut mtu = 0u16;
    // SAFETY: `mtu` is a valid place for the result; an invalid id is reported as -ENODEV.
    let ret = unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
    check("rte_eth_dev_get_mtu", ret, || format!("port {id}"))?;
    Ok(mtu)
}

impl EthPort {
    /// Configures port `port_id` with one rx queue filled from `pool` and one tx queue, and
    /// starts it. The MTU (configured or current) must fit in one of `pool`'s mbufs.
    pub fn new(eal: &Eal, port_id: u16, pool: &Mempool, config: &EthConfig) -> Result<EthPort> {
        // SAFETY: only reads the port table of the live EAL.
        if unsafe { sys::rte_eth_dev_is_valid_port(port_id) } == 0 {
            let names: Vec<String> = eal
                .ports()
                .into_iter()
                .map(|p| format!("{p}: {}", port_name(p).unwrap_or_default()))
                .collect();
            return Err(Error::other(
                "rte_eth_dev_is_valid_port",
                format!("no port {port_id}; the ports are [{}]", names.join(", ")),
            ));
        }
        let info = DevInfo::get(port_id)?;
        let mtu = match config.mtu {
            Some(m) => m,
            None => port_mtu(port_id)?,
        };
        info.check_mtu("rte_eth_dev_configure", mtu)?;
        let queues = config.queues.max(1);
        info.check_queues(queues)?;
        let rss = info.rss & RSS_IP_UDP;
        let DevInfo { name, driver, .. } = info;
        let gated = gate::needs_gate(&driver);
        if gated {
            gate::install()?;
        }
        let frame = usize::from(mtu) + FRAME_OVERHEAD;
        if frame > pool.frame_room() {
            return Err(Error::other(
                "rte_eth_rx_queue_setup",
                format!(
                    "MTU {mtu} needs {frame}-byte frames but the pool's mbufs hold {}: make the \
                     pool with Mempool::for_frames",
                    pool.frame_room()
                ),
            ));
        }

        let mut conf = sys::rte_eth_conf::default();
        conf.rxmode.mtu = u32::from(mtu);
        if queues > 1 && rss != 0 {
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss;
        }
        // SAFETY: `conf` is a valid rte_eth_conf (zeroed = driver defaults) read during the call.
        let ret = unsafe { sys::rte_eth_dev_configure(port_id, queues, queues, &conf) };
        check("rte_eth_dev_configure", ret, || {
            format!("{name} ({driver}), {queues} rx + {queues} tx queues, MTU {mtu}")
        })?;

        let (mut nrx, mut ntx) = (config.rx_desc, config.tx_desc);
        // SAFETY: both are valid, writable u16s.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &mut nrx, &mut ntx) };
        check("rte_eth_dev_adjust_nb_rx_tx_desc", ret, || name.clone())?;

        // SAFETY: only reads the port's data.
        let socket = unsafe { sys::rte_eth_dev_socket_id(port_id) };
        // DPDK takes the socket as unsigned with SOCKET_ID_ANY (-1) wrapping, as its examples do.
        let socket = socket as u32;
        for q in 0..queues {
            // SAFETY: a NULL rxconf means the driver's defaults; the pool is valid and outlives
            // the queue because the port holds a handle to it and closes the queue in `Drop`
            // first.
            let ret = unsafe {
                sys::rte_eth_rx_queue_setup(
                    port_id,
                    q,
                    nrx,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            };
            check("rte_eth_rx_queue_setup", ret, || {
                format!(
                    "{name} queue {q}: {nrx} descriptors from pool {}",
                    pool.name()
                )
            })?;
            // SAFETY: a NULL txconf means the driver's defaults.
            let ret =
                unsafe { sys::rte_eth_tx_queue_setup(port_id, q, ntx, socket, std::ptr::null()) };
            check("rte_eth_tx_queue_setup", ret, || {
                format!("{name} queue {q}: {ntx} descriptors")
            })?;
        }
        // SAFETY: the port is configured and its queues are set up.
        let ret = unsafe { sys::rte_eth_dev_start(port_id) };
        check("rte_eth_dev_start", ret, || format!("{name} ({driver})"))?;

        let port = EthPort {
            id: port_id,
            name,
            driver,
            pool: pool.clone(),
            gated,
            queues,
        };
        if config.promiscuous {
            // SAFETY: the port is started.
            let ret = unsafe { sys::rte_eth_promiscuous_enable(port_id) };
            if ret != -ENOTSUP {
                check("rte_eth_promiscuous_enable", ret, || port.name.clone())?;
            }
        }
        Ok(port)
    }

    /// The port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The device name (`net_ring0`, `0000:3b:00.0`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver's name (`net_ring`, `net_mlx5`, …).
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// The pool the rx queue fills.
    pub fn pool(&self) -> &Mempool {
        &self.pool
    }

    /// The port's MAC address (`rte_eth_macaddr_get`).
    pub fn mac(&self) -> Result<Mac> {
        let mut a = sys::rte_ether_addr::default();
        // SAFETY: `a` is a valid, writable rte_ether_addr.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.id, &mut a) };
        check("rte_eth_macaddr_get", ret, || self.name.clone())?;
        Ok(Mac(a.addr_bytes))
    }

    /// The MTU (`rte_eth_dev_get_mtu`).
    pub fn mtu(&self) -> Result<u16> {
        port_mtu(self.id)
    }

    /// Sets the MTU (`rte_eth_dev_set_mtu`); it must fit in one of the pool's mbufs.
    pub fn set_mtu(&mut self, mtu: u16) -> Result<()> {
        let frame = usize::from(mtu) + FRAME_OVERHEAD;
        if frame > self.pool.frame_room() {
            return Err(Error::other(
                "rte_eth_dev_set_mtu",
                format!(
                    "MTU {mtu} needs {frame}-byte frames but {}'s mbufs hold {}",
                    self.name,
                    self.pool.frame_room()
                ),
            ));
        }
        DevInfo::get(self.id)?.check_mtu("rte_eth_dev_set_mtu", mtu)?;
        // SAFETY: plain values; the driver validates the MTU.
        let ret = unsafe { sys::rte_eth_dev_set_mtu(self.id, mtu) };
        check("rte_eth_dev_set_mtu", ret, || {
            format!("{}: MTU {mtu}", self.name)
        })?;
        Ok(())
    }

    /// How many rx (and tx) queues the port has.
    pub fn queues(&self) -> u16 {
        self.queues
    }

    /// The interrupt-thread gate for a burst on this port and the use of its frames (nothing
    /// for drivers that need none): see `gate.rs`.
    pub(crate) fn gate(&self) -> Option<gate::Entered> {
        self.gated.then(gate::enter)
    }

    /// Whether the link is up (`rte_eth_link_get_nowait`).
    pub fn link_up(&self) -> bool {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: `link` is a valid, writable rte_eth_link.
        let ret = unsafe { sys::rte_eth_link_get_nowait(self.id, &mut link) };
        ret == 0 && link.link_status() != 0
    }

    /// Receives up to `max` frames and appends them to `out`; returns how many.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let _gate = self.gate();
        let mut total = 0;
        while total < max {
            let want = (max - total).min(BURST);
            let mut pkts = [std::ptr::null_mut(); BURST];
            // SAFETY: `pkts` has room for `want` ≤ BURST pointers; queue 0 exists (started) and
            // `&mut self` makes this its only user.
            let n = unsafe { sys::rocemu_eth_rx_burst(self.id, 0, pkts.as_mut_ptr(), want as u16) };
            let n = usize::from(n);
            for &m in &pkts[..n] {
                let m = NonNull::new(m).expect("rte_eth_rx_burst returned a NULL mbuf");
                // SAFETY: the driver handed us this mbuf; it is ours now. Its pool outlives it:
                // it is this port's pool (held by the Mbuf), or another pool of this crate,
                // which is not freed while this mbuf is in use.
                out.push(unsafe { Mbuf::from_raw(m, self.pool.clone()) });
            }
            total += n;
            if n < want {
                break;
            }
        }
        total
    }

    /// Hands frames from the front of `pkts` to the driver; those it took are removed (they
    /// belong to the driver now), the rest stay, in order. Returns how many it took.
    pub fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let _gate = self.gate();
        let mut total = 0;
        while !pkts.is_empty() {
            let want = pkts.len().min(BURST);
            let mut raw = [std::ptr::null_mut(); BURST];
            for (r, m) in raw.iter_mut().zip(&pkts[..want]) {
                *r = m.as_raw();
            }
            // SAFETY: `raw` holds `want` ≤ BURST valid mbufs we own; queue 0 exists and
            // `&mut self` makes this its only user.
            let n = unsafe { sys::rocemu_eth_tx_burst(self.id, 0, raw.as_mut_ptr(), want as u16) };
            let n = usize::from(n);
            // The driver owns the first n now (and may have freed them already): forget them.
            for m in pkts.drain(..n) {
                let _ = m.into_raw();
            }
            total += n;
            if n < want {
                break;
            }
        }
        total
    }
}

impl Drop for EthPort {
    fn drop(&mut self) {
        // Under the gate: memif's stop unmaps the rings, as its interrupt-thread disconnect does.
        let _gate = self.gate();
        // SAFETY: the port is ours and started; stopping it ends all queue use, and closing it
        // frees its queues (and the mbufs in their rings) while `self.pool` still lives. A
        // failure cannot be acted on here: the port is gone either way.
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
        }
    }
}
