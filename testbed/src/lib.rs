//! The testbed: `rocemu demo` (every verb over the in-process wire, then RC over a lossy one)
//! and the perf harness behind `rocemu perf` (perftest's benchmarks on RoCEmu).
// Unsafe only where the kernel demands it (`netns`: setns).
#![deny(unsafe_code)]

pub mod demo;
pub mod netns;
pub mod oob;
pub mod perf;
pub mod remote;
