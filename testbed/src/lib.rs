//! The testbed: `rocemu demo` (every verb over the in-process wire, then RC over a lossy one),
//! the perf harness behind `rocemu perf` (perftest's benchmarks on RoCEmu), and the rdma_rxe
//! peer VMs for interop tests (`rxevm`).
// Unsafe only where the kernel demands it (`netns`: setns).
#![deny(unsafe_code)]

pub mod demo;
pub mod forge_cm;
pub mod netns;
pub mod oob;
pub mod perf;
pub mod perftest_cm;
pub mod rdmacm;
pub mod remote;
pub mod rping;
pub mod rxevm;
