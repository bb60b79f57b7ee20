//! Any bytes as a MAD / CM message; see `rocemu_wire::fuzzing::cm_mad_target`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rocemu_wire::fuzzing::cm_mad_target(data));
