//! RoCEmu's test beds: where the tools and the conformance suite meet other network stacks.
//!
//! * [`netns`]: network namespaces and veth pairs (the AF_PACKET and DPDK tests, the netns
//!   matrix).
//! * [`rxevm`]: the `rdma_rxe` VM lab — TCG VMs running Linux's soft RoCE behind a bridge in a
//!   private namespace (`rocemu rxevm up|down|exec`; guest recipe and C peers in `rxevm/`).
//! * [`fabric`]: the fabric simulator — a real RNIC at every host of a simulated fabric of
//!   switches with ECN and PFC, in virtual time (`rocemu sim`).
//!
//! Invariants: a test bed creates only namespaces, interfaces and VMs of its own and removes
//! them when dropped (also while a failing test unwinds); nothing here carries RoCE itself — the
//! RNIC is `rocemu-emulator`'s and the programs that use it are `rocemu-tools`'.
// Unsafe only where the kernel demands it (`netns`: setns).
#![deny(unsafe_code)]

pub mod fabric;
pub mod netns;
pub mod rxevm;
