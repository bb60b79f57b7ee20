//! The sans-IO RNIC core.
//!
//! Work flows through it like a hardware pipeline (DESIGN.md):
//!
//! ```text
//! rx:  parse + ICRC → QP lookup → transport checks → execute → ACK/NAK → completion   handle_frame
//! tx:  doorbell → WQE fetch → segmentation by path MTU → headers → ICRC → port        poll_transmit
//! completer: ACK / NAK / read responses, retransmit and RNR timers, go-back-N        handle_frame, handle_timeout
//! ```
//!
//! One file per stage or table, as a hardware designer would draw the blocks:
//!
//! ```text
//! device.rs     config, counters, device attributes, the Rnic and its tables, the frame builder
//! objects.rs    verbs that make and unmake objects: PD, MR, QP (and QP1); the QP table's lookup; queries
//! modify.rs     ibv_modify_qp: checks, attributes, transitions (ERR flushes, RESET clears)
//! state.rs      the QP state machine table: transitions, required and optional attributes
//! post.rs       the doorbell: ibv_post_send, ibv_post_recv
//! schedule.rs   the transmit scheduler (round robin, bursts) and the timer heap
//! requester.rs  WQE fetch, segmentation, headers: one request packet per call
//! receive.rs    receive dispatch: checks, QP lookup, to the completer or the responder
//! receive_fast.rs  the fast path of an RC RDMA WRITE or SEND packet in order (the rest: receive.rs)
//! responder/    requests in: RC, UC, UD execution; ACK/NAK and read/atomic responses out
//! completer.rs  responses in: ACK, NAK, read responses, retransmit and RNR timers
//! cq.rs         completion queues, their notification (req_notify_cq) and asynchronous events
//! srq.rs        shared receive queues: the verbs, and the receive WQE fetch RQ or SRQ
//! qp.rs         a QP's state: attributes, queues, cursors
//! qpn.rs        the QPN map: a keyed permutation from (generation, slot) to QPN
//! slots.rs      handle tables with generations: the CQs and the PDs
//! mr.rs         the memory table: PDs, MRs, key and bounds checks, gather and scatter
//! verbs.rs      the verbs-facing types, named after ibverbs
//! stats.rs      counters by name, and each QP's state and counters (`rocemu stats`)
//! cc/           congestion control: ECN, CNPs, DCQCN and TIMELY per QP, the pacer (cc/qp.rs glues them in)
//! ```
//!
//! Invariants: nothing here reads a clock (every entry point takes `now`), opens a socket or
//! spawns a thread; randomness comes from the seed in [`RnicConfig`]; `handle_timeout(now)` is
//! idempotent; a frame from the wire, whatever it holds, is answered per the spec or dropped and
//! counted — never a panic, never a byte outside a memory region.
#![forbid(unsafe_code)]
pub mod cc;
mod completer;
mod cq;
mod device;
mod modify;
pub mod mr;
mod objects;
mod post;
mod qp;
mod qpn;
mod receive;
mod receive_fast;
mod requester;
mod responder;
mod schedule;
mod slots;
mod srq;
pub mod state;
mod stats;
pub mod verbs;

pub use cq::ASYNC_EVENTS_MAX;
pub(crate) use device::Dev;
pub use device::{Counters, Rnic, RnicConfig, Shard};
pub(crate) use modify::{flush, ErrCause};
pub use qpn::{QpnSteering, MAX_SHARDS, QPN_MIX};
pub(crate) use receive::Packet;
pub use stats::{QpCounters, QpInfo};
pub use verbs::*;
