//! Arbitrary frames and verbs calls against one RNIC; see `rocemu_emulator::fuzzing`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rocemu_emulator::fuzzing::rnic_target(data));
