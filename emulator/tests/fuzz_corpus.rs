//! The fuzz targets' corpora as plain tests: fuzz/corpus/rnic (arbitrary frames and verbs calls
//! never panic the RNIC or write outside a memory region) and fuzz/corpus/cm_agent (arbitrary MADs
//! never panic the CM agent).
use std::path::Path;

/// Runs `target` on every input of fuzz/corpus/`name`; fails on a corpus of fewer than 10.
fn replay(name: &str, target: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(name);
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("fuzz/corpus/{name}: {e}")) {
        target(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n >= 10, "fuzz/corpus/{name} too small: {n}");
}

#[test]
fn rnic_fuzz_corpus_holds() {
    replay("rnic", rocemu_emulator::fuzzing::rnic_target);
}

/// The `cm_agent` target's corpus: arbitrary MADs never panic the CM agent, keep its half-open
/// count bounded and its timers finite.
#[test]
fn cm_agent_fuzz_corpus_holds() {
    replay("cm_agent", rocemu_emulator::fuzzing::cm_agent_target);
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Property: hostile requests — random R_Keys, addresses, lengths, opcodes and PSNs in
    /// well-formed frames, raw frames, and random verbs calls — never panic the RNIC, never write
    /// the guard regions around the target (which grant no remote access), and the fuzz body's
    /// own checks hold.
    #[test]
    fn hostile_requests_never_escape_a_memory_region(cmds in proptest::collection::vec(any::<u8>(), 0..2048)) {
        rocemu_emulator::fuzzing::rnic_target(&cmds);
    }

    /// The same, with the command stream biased towards crafted requests (commands 1–3) so that
    /// most inputs reach the responder's checks.
    #[test]
    fn crafted_requests_never_escape_a_memory_region(
        reqs in proptest::collection::vec((1u8..4, 0u8..3, proptest::collection::vec(any::<u8>(), 16)), 1..64)
    ) {
        let mut cmds = Vec::new();
        for (kind, qp, bytes) in reqs {
            cmds.push(kind | (qp << 4));
            cmds.extend(bytes);
            cmds.push(8); // transmit what the RNIC wants to answer
        }
        rocemu_emulator::fuzzing::rnic_target(&cmds);
    }
}
