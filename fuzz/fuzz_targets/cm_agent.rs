//! Arbitrary MADs against a CM agent with a connection in every state; see
//! `rocemu_emulator::fuzzing::cm_agent_target`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| rocemu_emulator::fuzzing::cm_agent_target(data));
