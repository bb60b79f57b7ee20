//! RoCEmu's conformance suite: judges a RoCEv2 device packet by packet.
//!
//! Two hands on the device under test (DESIGN.md, "Interop and conformance"):
//!
//! * the [`agent`]: a control channel that creates PDs, MRs, CQs and QPs on the device, moves QP
//!   states, posts work and polls completions — in-process for RoCEmu (`--target self`), or the
//!   JSON-lines protocol of `docs/agent-protocol.md` to `rocemu agent` or a libibverbs agent;
//! * the [`peer`]: a packet-level RoCEv2 endpoint that crafts frames (valid and deliberately
//!   invalid) onto the device's link, captures every frame both ways with timestamps, and judges
//!   what the device sends exactly (opcode, PSN, AETH syndrome and MSN, payload).
//!
//! A [`scenario::Scenario`] uses both and returns pass or fail with a precise reason; the
//! [`runner`] runs the catalogue ([`scenarios::catalogue`]) and writes the reports.
//!
//! Invariants: with `--target self` everything runs in virtual time on one thread, so a run is
//! deterministic and replays from the scenario id; nothing a device sends, and no line an agent
//! client sends, makes this crate panic.
#![forbid(unsafe_code)]

pub mod agent;
pub mod cite;
pub mod cm_peer;
pub mod counters;
pub mod dut;
pub mod peer;
pub mod runner;
pub mod scenario;
pub mod scenarios;
