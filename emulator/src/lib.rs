//! The RoCEmu RNIC.
//!
//! * [`rnic`] is the sans-IO core: it never reads a clock, opens a socket, spawns a thread or
//!   draws its own randomness. Frames come in through [`rnic::Rnic::handle_frame`], go out
//!   through [`rnic::Rnic::poll_transmit`]; deadlines come out of [`rnic::Rnic::poll_timeout`]
//!   and are served by [`rnic::Rnic::handle_timeout`]. Randomness (keys, QPNs, initial PSNs)
//!   comes from the seed given at creation through a ChaCha20 generator ([`rng::KeyRng`]):
//!   a `u64` seed replays a run, a seed from the OS makes the keys unguessable in deployment.
//! * [`port`] moves whole Ethernet frames between an RNIC and a datapath (AF_PACKET, an
//!   in-memory pipe, seeded impairments on any port); [`engine`] binds an RNIC to a port.
//! * [`inproc`] joins RNICs in one process: the link and its impairments, the virtual-time
//!   [`inproc::Pair`], the real-time [`inproc::Loopback`].
//! * [`connect`] brings a QP to RTS as the tools do ([`connect::bring_up`]).
//! * [`api`] is the shareable [`api::Device`] for applications; [`cm`] the IB CM over QP1.
//! * [`stats`] is `rocemu stats`' endpoint: a device's socket, answered between engine turns
//!   ([`engine::Engine::serve_stats`]), and the reader's side.
//! * [`dma`] reads and writes memory the RNIC does not own (a program's buffer registered with
//!   [`rnic::Rnic::reg_mr_foreign`]), bounds-checked, through raw pointers only.
//! * [`cpu`] pins a polling thread to a CPU of its own (`rocemu perf --threads`).
// Unsafe code only where a kernel interface demands it (`port::af_packet`, `engine::wake`: eventfd
// and ppoll; `stats::server`: shutdown and atexit; `cpu`: the affinity calls) and in the one module
// that touches a program's memory (`dma`); the core forbids it.
#![deny(unsafe_code)]

pub mod api;
pub mod cm;
pub mod connect;
pub mod cpu;
pub mod dma;
pub mod engine;
// The fuzz targets' bodies: only with the `fuzzing` feature (fuzz/, and the corpus tests).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod inproc;
pub mod logs;
pub mod port;
pub mod rng;
pub mod rnic;
pub mod stats;
pub mod steer;
pub mod time;

pub use rnic::Rnic;

/// What a connection refused for GIDs of different IP versions (`gid_type_mismatch`) tells its
/// user: the usual cause and its fix.
pub const GID_INDEX_HINT: &str = "Both ends' GID indexes must name addresses of one IP version: \
    on rdma_rxe and mlx5 (and RoCEmu's drop-in libibverbs) GID index 0 is the IPv6 link-local \
    address and 1 the first IPv4 one (`ibv_devinfo -v` lists them); for IPv4 give the tool \
    there -x 1 (perftest) or -g 1 (ibv_*_pingpong), or give RoCEmu an address of the peer's \
    version (--ip)";
pub use time::Nanos;
