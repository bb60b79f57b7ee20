//! Any bytes as a frame; see `rocemu_wire::fuzzing::parse_frame_target`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rocemu_wire::fuzzing::parse_frame_target(data));
