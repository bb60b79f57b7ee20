//! Live object counts, for leak checks (`rocemu_live_objects`): each create adds one, each
//! destroy takes one away.
use std::sync::atomic::{AtomicI64, Ordering};

pub const PDS: usize = 0;
pub const CQS: usize = 1;
pub const QPS: usize = 2;
pub const SRQS: usize = 3;
pub const MRS: usize = 4;
pub const AHS: usize = 5;
pub const COMP_CHANNELS: usize = 6;
pub const IDS: usize = 7;
pub const CHANNELS: usize = 8;

static LIVE: [AtomicI64; 9] = [const { AtomicI64::new(0) }; 9];

pub fn add(kind: usize, n: i64) {
    LIVE[kind].fetch_add(n, Ordering::Relaxed);
}

pub fn get(kind: usize) -> u64 {
    LIVE[kind].load(Ordering::Relaxed).max(0) as u64
}
