//! In process: RNICs joined without a datapath, for the tests, the simulator scenarios, the
//! fuzzer, `rocemu demo` and in-process `rocemu perf`.
//!
//! * [`link`]: a [`Link`] carries frames one way with a latency and seeded impairments; a
//!   [`Cable`] is two links, one per direction.
//! * [`impair`]: [`Impairments`] (loss, reorder, duplicate, corrupt, delay) and the rule a link
//!   applies to each frame.
//! * [`pair`]: [`Pair`], two RNICs on a cable driven in virtual time, the addresses its sides
//!   use ([`IP_A`], [`MAC_A`], …) and [`pattern`], the test data.
//! * [`loopback`]: [`Loopback`], two [`crate::api::Device`]s on a cable driven in real time by an
//!   engine thread.
//!
//! Invariants: everything here is deterministic from its seeds except [`Loopback`], which reads
//! the real clock; nothing here opens a socket. The names avoid "wire": that is the
//! `rocemu-wire` crate (and the physical wire).
pub mod impair;
pub mod link;
pub mod loopback;
pub mod pair;

pub use impair::Impairments;
pub use link::{Cable, Link, LinkStats};
pub use loopback::Loopback;
pub use pair::{pattern, Pair, Side, IP_A, IP_B, MAC_A, MAC_B};
