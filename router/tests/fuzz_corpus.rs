//! Replays the committed fuzz corpora (router/fuzz/corpus/<target>/) through the same entry
//! points the cargo-fuzz targets call: every input a fuzzing run kept (and every crash turned
//! into a regression input) is checked on stable in the test suite, in seconds.

use std::path::Path;

/// A fuzz target's entry point.
type Target = fn(&[u8]);

fn replay(target: &str, f: Target) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus input");
        f(&data);
        n += 1;
    }
    n
}

#[test]
fn every_corpus_input_passes_its_target() {
    use program_router::fuzz;
    fn metrics(data: &[u8]) {
        fuzz::metrics_against(data, testkit::reference_samples)
    }
    let targets: [(&str, Target); 9] = [
        ("request", fuzz::request),
        ("identity", fuzz::identity),
        ("metrics", metrics),
        ("config", fuzz::config),
        ("cli", fuzz::cli),
        ("usage", fuzz::usage),
        ("peer_usage", fuzz::peer_usage),
        ("peers", fuzz::peers),
        ("scheduler", fuzz::scheduler),
    ];
    for (name, f) in targets {
        assert!(replay(name, f) > 0, "the {name} corpus is empty");
    }
}
