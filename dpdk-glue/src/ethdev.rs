//! An Ethernet port with one rx and one tx queue, started, as a value: `Drop` stops and closes
//! it (for a vdev, closing releases the port for the rest of the process).
//!
//! Invariants: queue 0 of each direction is used only through `&mut EthPort`; the port holds its
//! rx pool (and so the EAL), and is closed before that pool can go.
use crate::eal::{port_name, Eal};
use crate::error::{check, Error, Result, ENOTSUP};
use crate::mempool::{Mbuf, Mempool};
use rocemu_dpdk_sys as sys;
use rocemu_emulator::port::BURST;
use rocemu_wire::eth::Mac;
use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

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
}

impl Default for EthConfig {
    fn default() -> Self {
        EthConfig {
            mtu: None,
            rx_desc: 1024,
            tx_desc: 1024,
            promiscuous: true,
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
    /// Queues are not thread-safe: `Send`, not `Sync`.
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the port's queues may be used from any one thread at a time, which `&mut self` on
// every queue operation guarantees; the pool handle is Send.
unsafe impl Send for EthPort {}

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
        let name = port_name(port_id)?;
        let mut info = sys::rte_eth_dev_info::default();
        // SAFETY: `info` is a valid, writable rte_eth_dev_info.
        let ret = unsafe { sys::rte_eth_dev_info_get(port_id, &mut info) };
        check("rte_eth_dev_info_get", ret, || name.clone())?;
        let driver = if info.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-NULL driver_name is the driver's static NUL-terminated name.
            unsafe { CStr::from_ptr(info.driver_name) }
                .to_string_lossy()
                .into_owned()
        };

        let mtu = match config.mtu {
            Some(m) => m,
            None => port_mtu(port_id)?,
        };
        if mtu < info.min_mtu || mtu > info.max_mtu {
            return Err(Error::other(
                "rte_eth_dev_configure",
                format!(
                    "MTU {mtu} is outside what {name} ({driver}) supports: {}..={}",
                    info.min_mtu, info.max_mtu
                ),
            ));
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
        // SAFETY: `conf` is a valid rte_eth_conf (zeroed = driver defaults) read during the call.
        let ret = unsafe { sys::rte_eth_dev_configure(port_id, 1, 1, &conf) };
        check("rte_eth_dev_configure", ret, || {
            format!("{name} ({driver}), 1 rx + 1 tx queue, MTU {mtu}")
        })?;

        let (mut nrx, mut ntx) = (config.rx_desc, config.tx_desc);
        // SAFETY: both are valid, writable u16s.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(port_id, &mut nrx, &mut ntx) };
        check("rte_eth_dev_adjust_nb_rx_tx_desc", ret, || name.clone())?;

        // SAFETY: only reads the port's data.
        let socket = unsafe { sys::rte_eth_dev_socket_id(port_id) };
        // DPDK takes the socket as unsigned with SOCKET_ID_ANY (-1) wrapping, as its examples do.
        let socket = socket as u32;
        // SAFETY: a NULL rxconf means the driver's defaults; the pool is valid and outlives the
        // queue because the port holds a handle to it and closes the queue in `Drop` first.
        let ret = unsafe {
            sys::rte_eth_rx_queue_setup(port_id, 0, nrx, socket, std::ptr::null(), pool.as_ptr())
        };
        check("rte_eth_rx_queue_setup", ret, || {
            format!("{name}: {nrx} descriptors from pool {}", pool.name())
        })?;
        // SAFETY: a NULL txconf means the driver's defaults.
        let ret = unsafe { sys::rte_eth_tx_queue_setup(port_id, 0, ntx, socket, std::ptr::null()) };
        check("rte_eth_tx_queue_setup", ret, || {
            format!("{name}: {ntx} descriptors")
        })?;
        // SAFETY: the port is configured and its queues are set up.
        let ret = unsafe { sys::rte_eth_dev_start(port_id) };
        check("rte_eth_dev_start", ret, || format!("{name} ({driver})"))?;

        let port = EthPort {
            id: port_id,
            name,
            driver,
            pool: pool.clone(),
            _not_sync: PhantomData,
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
        // SAFETY: plain values; the driver validates the MTU.
        let ret = unsafe { sys::rte_eth_dev_set_mtu(self.id, mtu) };
        check("rte_eth_dev_set_mtu", ret, || {
            format!("{}: MTU {mtu}", self.name)
        })?;
        Ok(())
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
        // SAFETY: the port is ours and started; stopping it ends all queue use, and closing it
        // frees its queues (and the mbufs in their rings) while `self.pool` still lives. A
        // failure cannot be acted on here: the port is gone either way.
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
        }
    }
}
