//! The fuzz corpora as plain tests: fuzz/corpus/parse_frame and every frame of the golden captures
//! through the `parse_frame` target's body, fuzz/corpus/cm_mad through the `cm_mad` target's.
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

/// The `cm_mad` target's corpus (fuzz/corpus/cm_mad): any bytes as a MAD and a CM message; one
/// that parses rebuilds to the same bytes.
#[test]
fn cm_mad_corpus_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(root.join("fuzz/corpus/cm_mad")).expect("fuzz/corpus/cm_mad exists")
    {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        rocemu_wire::fuzzing::cm_mad_target(&data);
        n += 1;
    }
    assert!(n >= 5, "corpus too small: {n}");
}
