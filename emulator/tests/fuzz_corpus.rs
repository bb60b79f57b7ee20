//! The `rnic` fuzz target's corpus (fuzz/corpus/rnic) as a plain test: arbitrary frames and
//! verbs calls never panic the RNIC or write outside a memory region.
use std::path::Path;

#[test]
fn rnic_fuzz_corpus_holds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/rnic");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("fuzz/corpus/rnic exists") {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        rocemu_emulator::fuzzing::rnic_target(&data);
        n += 1;
    }
    assert!(n >= 10, "corpus too small: {n}");
}
