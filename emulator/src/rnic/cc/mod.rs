//! Congestion control (issue 17, step 1): the algorithms as sans-IO units, **not yet wired into
//! the datapath** — nothing in the RNIC calls them yet; the transmit scheduler does not pace, the
//! receive path sends no CNP. They take `now` and return decisions, like the rest of `rnic/`.
//!
//! ```text
//! dcqcn.rs   DCQCN's reaction point per QP with mlx5's parameters (DcqcnParams, DcqcnRp)
//! np.rs      DCQCN's notification point: CNP pacing per QP (CnpPacer) and the CNP frame
//! limiter.rs a pacing token bucket per QP (RateLimiter): next departure from rate and bytes
//! timely.rs  TIMELY per QP (TimelyParams, TimelyRp): RTT samples to a rate
//! ```
//!
//! Sources and what is unverified: each file's opening comment and `docs/congestion.md`.
pub mod dcqcn;
pub mod limiter;
pub mod np;
pub mod timely;

pub use dcqcn::{CnpOutcome, DcqcnParams, DcqcnRp};
pub use limiter::RateLimiter;
pub use np::{build_cnp, CnpFields, CnpPacer};
pub use timely::{TimelyParams, TimelyRp, TimelyRule};
