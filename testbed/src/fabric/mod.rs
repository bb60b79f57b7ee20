//! The fabric simulator: a real RoCEmu RNIC at every host of a simulated fabric, in virtual time,
//! deterministic from a seed (`rocemu sim`, contract in `../shared/contracts.md`).
//!
//! ```text
//! topo.rs     topologies as data: dumbbell, incast, victim, HPCC's topology file; shortest-path routes
//! traffic.rs  long flows; Poisson arrivals from a flow-size CDF (WebSearch, FB Hadoop) at a load
//! queue.rs    the event queue: a calendar of 1-ns buckets taken in push order, a heap beyond 65 µs
//! sim.rs      the event loop: hosts (an Rnic each), links, switches (buffer, queues, ECN, PFC, watchdog, ECMP)
//! report.rs   what the CC literature reports: throughput, fairness, queue, pauses, FCT slowdown; JSON, text
//! plot.rs     per-flow rate, queue depth and pauses over time; FCT slowdown by size (SVG)
//! ```
//!
//! What is modelled, and how (docs/congestion.md has the experiments):
//! - **Hosts.** Each is an [`rocemu_emulator::rnic::Rnic`] with its own congestion control,
//!   one RC QP pair per flow, a flow a train of 64 KiB RDMA WRITEs (8 posted at a time). The NIC
//!   sends whenever its link is free and its priority not paused; frames it produced while paused
//!   wait in one slot. With `FabricConfig::icrc` off (`--icrc off`) hosts neither compute nor
//!   check ICRCs: no figure changes, the run is faster.
//! - **Links**: a rate and a propagation delay; a frame costs its bytes plus 24 (preamble, IFG,
//!   FCS) of wire time; store and forward.
//! - **Switches**: one shared buffer; per egress port, eight priority queues served strictly by
//!   priority (CNPs in priority 6, everything else in 3); RED/ECN marking at dequeue on
//!   ECN-capable frames (CE, IPv4 checksum updated; the ICRC does not cover the ECN bits);
//!   ECMP on the addresses and the UDP source port; PFC on priority 3 with the dynamic threshold,
//!   headroom, hysteresis, refresh and 802.1Qbb frames of HPCC's switch model; a PFC watchdog.
//!
//! Invariants: see each file; a run is a function of its arguments (the same seed gives the same
//! JSON but for `events_per_second`).
pub mod plot;
pub mod queue;
pub mod report;
pub mod sim;
pub mod topo;
pub mod traffic;

pub use report::{Report, Scenario, SimArgs};
pub use sim::{Fabric, FabricConfig, FlowState, WatchdogEvent};
pub use topo::Topology;
pub use traffic::{Cdf, FlowSpec};
