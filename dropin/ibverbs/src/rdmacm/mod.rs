//! RoCEmu's drop-in `librdmacm.so.1`: librdmacm's API (rdma-core 44's RDMACM_1.0 … 1.3) on the
//! RoCEmu RNIC of the same process, its IB CM (`rocemu_emulator::cm`) talking over QP1.
//!
//! One shared object serves both sonames: `rocemu exec` links `librdmacm.so.1` to the same file
//! as `libibverbs.so.1`, and the dynamic loader, finding the file already loaded under the other
//! name (same device and inode), maps it once. So the program's verbs and its rdma_cm share one
//! RNIC, as librdmacm and libibverbs share one kernel device.
//!
//! ```text
//! abi.rs       the structs of <rdma/rdma_cma.h>, byte for byte (tests/layout.rs)
//! service.rs   QP1, the CM agent, every id's state, address resolution, the event queues;
//!              turned by the engine thread after each engine turn
//! api.rs       the rdma_* entry points
//! addrinfo.rs  rdma_getaddrinfo / rdma_freeaddrinfo
//! rsocket.rs   rsockets: exported, ENOSYS
//! live.rs      live object counts (rocemu_live_objects, for leak checks)
//! ```
//!
//! How it follows librdmacm over the kernel's rdma_cm (Linux 6.1, RoCE): the IP address is the
//! GID (index 1 for the configured address, 0 the link-local one); address resolution is ARP /
//! neighbour discovery on the datapath, ADDR_ERROR with -ETIMEDOUT after the program's timeout;
//! the route is the addresses' (ROUTE_RESOLVED at once, one path record); the QP moves as
//! librdmacm moves it: to INIT at `rdma_create_qp` (a UD QP on to RTS), to RTR and RTS in
//! `rdma_accept` before the REP, and on the active side when the REP's event is read
//! (`rdma_get_cm_event`), which then sends the RTU; to ERR at `rdma_disconnect`. A program that
//! owns its QP (`rdma_connect` with `qp_num`) gets CONNECT_RESPONSE and calls `rdma_establish`.
//! REQ private data carries rdma_cm's 36-byte header for the IP port spaces, then the
//! program's; RDMA_PS_UDP connects with SIDR.
//!
//! Not here: multicast (`rdma_join_multicast`: ENOSYS), ECE, XRC, rsockets, AF_IB addresses,
//! connections to this RNIC's own address (the datapath does not loop back).
pub mod abi;
mod addrinfo;
pub mod api;
pub mod live;
mod rsocket;
pub mod service;

pub use api::*;
pub use rsocket::*;
