//! Replays the committed corpus of the `render` fuzz target (router/fuzz/corpus/render/)
//! through `program_operator::fuzz::render` on stable, as `router/tests/fuzz_corpus.rs` does for
//! the router's targets.

#[test]
fn every_render_corpus_input_passes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../router/fuzz/corpus/render");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let data = std::fs::read(entry.expect("corpus entry").path()).expect("corpus input");
        program_operator::fuzz::render(&data);
        n += 1;
    }
    assert!(n > 0, "the render corpus is empty");
}
