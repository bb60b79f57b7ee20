//! RoCEmu's drop-in `libibverbs.so.1`: unmodified ibverbs programs (perftest, ibverbs-utils,
//! anything linked against rdma-core 44's libibverbs) run on a RoCEmu RNIC inside their own
//! process, on a machine whose kernel has no RDMA at all.
//!
//! ```text
//! abi.rs      the structs of <infiniband/verbs.h>, byte for byte (tests/layout.rs checks them)
//! nic.rs      configuration (ROCEMU_DEV, ROCEMU_IP, ROCEMU_MAC, ROCEMU_NAME), the device, the one
//!             RNIC per process and its engine thread (ARP/ND requests, completion and async events)
//! impair.rs   ROCEMU_LOSS, ROCEMU_REORDER, ROCEMU_DUPLICATE, ROCEMU_CORRUPT, ROCEMU_SEED
//! verbs.rs    the public verbs (IBVERBS_1.0 … IBVERBS_1.14): objects, queries, posting, polling,
//!             events, the ibv_wr_* post API, the *_str helpers
//! compat.rs   rdma-core's pre-1.1 entry points (name@IBVERBS_1.0): ENOSYS
//! private.rs  IBVERBS_PRIVATE_34 (the provider interface): ENOSYS, except what callers need to
//!             load (verbs_register_driver_34 from libmlx5's and libefa's constructors)
//! cq_ex.rs    ibv_create_cq_ex and the extended poll API (ibv_cq_ex's ops)
//! wr.rs       the ibv_wr_* post API (ibv_qp_ex's ops), which perftest uses by default
//! mem.rs      registering the program's memory with the core
//! ffi.rs      errno, panics kept from crossing the FFI boundary, C strings
//! rdmacm/     the drop-in librdmacm.so.1 (RDMACM_1.0 … 1.3), in the same shared object
//! ```
//!
//! Exports: no `#[no_mangle]` (rustc's own version script would leave them unversioned). The
//! build script turns `exports.txt`, the export table of Debian 12's libibverbs, into assembler
//! aliases of the mangled functions below and into the version script; tests/exports.rs checks
//! the built library exports every name at its version, default or not.
//!
//! Invariants: every entry point catches panics (a panic never unwinds into C, and a verb that
//! panicked answers an errno); the RNIC is behind one lock, taken by the verbs and by the engine
//! thread turn by turn; nothing a program passes through a verb reaches the engine thread as
//! anything but a checked verb on the sans-IO core.
mod abi;
mod compat;
mod cq_ex;
mod ffi;
mod impair;
mod mem;
mod nic;
mod private;
mod rdmacm;
mod verbs;
mod wr;

include!(concat!(env!("OUT_DIR"), "/exports.rs"));
