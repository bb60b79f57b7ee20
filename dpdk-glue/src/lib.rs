//! RoCEmu's DPDK datapath: safe values over the system DPDK (`rocemu-dpdk-sys`) and
//! [`DpdkPort`], a [`Port`](rocemu_emulator::port::Port) on any poll-mode driver: real NICs, and
//! the `net_ring`, `net_memif`, `net_af_packet`, `net_af_xdp`, `net_tap` and `net_null` vdevs.
//!
//! Invariants:
//! * Values own what they wrap and release it in `Drop`: [`Eal`] (`rte_eal_cleanup`, once the
//!   last clone goes), [`Mempool`], [`Mbuf`], [`EthPort`] (stop and close). Each holds what it
//!   needs alive (a port its pool, a pool the EAL), so no order of drops frees memory in use.
//! * The EAL is initialised at most once per process ([`Eal::init`] fails the second time).
//! * No safe function takes or returns a raw pointer; every `unsafe` block says why it holds.
//! * An mbuf the driver accepted is the driver's: it is never freed or read again here.
//! * No burst on a `net_memif` port runs while the EAL's interrupt thread runs drivers'
//!   callbacks (memif unmaps its rings there when the peer leaves): see `gate.rs`.
//!
//! Drivers: with DPDK linked as shared libraries (as Debian ships it), `rte_eal_init` loads every
//! poll-mode driver from the EAL's built-in plugin directory ([`PMD_DIR`]); nothing needs `-d`.
//!
//! ```no_run
//! use rocemu_dpdk::DpdkPort;
//! use rocemu_emulator::port::Port;
//! let mut port = DpdkPort::open("--no-huge -m 256 --no-pci --file-prefix=demo --vdev=net_ring0")?;
//! port.tx_burst(1, &mut |buf| {
//!     buf[..60].fill(0xab);
//!     Some(60)
//! });
//! port.rx_burst(32, &mut |frame| assert_eq!(frame.len(), 60));
//! # Ok::<(), rocemu_dpdk::Error>(())
//! ```
mod args;
mod eal;
mod error;
mod ethdev;
mod gate;
mod mempool;
mod port;

pub use args::split_args;
pub use eal::Eal;
pub use error::{Error, Result};
pub use ethdev::{EthConfig, EthPort, FRAME_OVERHEAD};
pub use mempool::{Mbuf, Mempool, DEFAULT_DATA_ROOM, HEADROOM};
pub use port::{open_boxed, open_queues_boxed, DpdkConfig, DpdkPort};

/// The DPDK version this crate was built against.
pub const DPDK_VERSION: &str = rocemu_dpdk_sys::DPDK_VERSION;

/// Where the EAL loads poll-mode drivers from.
pub const PMD_DIR: &str = rocemu_dpdk_sys::PMD_DIR;
