//! Congestion control: the algorithms as sans-IO units (they take `now` and return decisions,
//! like the rest of `rnic/`), and the glue that puts them in the datapath (`qp.rs`): ECT(0) on
//! transmit, CNPs for CE-marked packets (the receive path), a reaction point and a pacer per
//! connected QP (the transmit scheduler, the completer).
//!
//! ```text
//! dcqcn.rs   DCQCN's reaction point per QP with mlx5's parameters (DcqcnParams, DcqcnRp)
//! np.rs      DCQCN's notification point: CNP pacing per QP (CnpPacer) and the CNP frame
//! limiter.rs a pacing token bucket per QP (RateLimiter): next departure from rate and bytes
//! timely.rs  TIMELY per QP (TimelyParams, TimelyRp): RTT samples to a rate
//! qp.rs      the device's CcConfig, and one QP's RP and pacer as the datapath drives them (QpCc)
//! ```
//!
//! Sources and what is unverified: each file's opening comment and `docs/congestion.md`.
pub mod dcqcn;
pub mod limiter;
pub mod np;
pub(crate) mod qp;
pub mod timely;

pub use dcqcn::{CnpOutcome, DcqcnParams, DcqcnRp};
pub use limiter::RateLimiter;
pub use np::{build_cnp, CnpFields, CnpPacer};
pub(crate) use qp::QpCc;
pub use qp::{CcAlgo, CcConfig, CC_PARAMS, DEFAULT_BURST};
pub use timely::{TimelyParams, TimelyRp, TimelyRule};
