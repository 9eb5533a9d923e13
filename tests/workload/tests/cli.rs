//! The progbench command line refuses bad settings with the option's name, before starting any
//! process.

use std::process::Command;

fn progbench(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
        .args(args)
        .output()
        .expect("run progbench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn compare_refuses_a_context_longer_than_the_kv_before_starting_simulators() {
    let (ok, err) = progbench(&[
        "compare",
        "--preset",
        "chat",
        "--programs",
        "2",
        "--num-gpu-blocks",
        "512",
    ]);
    assert!(!ok);
    assert!(err.contains("--max-model-len (32768)"), "{err}");
    assert!(!err.contains("running"), "nothing started: {err}");
}

#[test]
fn sim_refuses_bad_settings_by_name() {
    let (ok, err) = progbench(&["sim", "--ranks", "0"]);
    assert!(!ok);
    assert!(err.contains("--ranks"), "{err}");
    let (ok, err) = progbench(&["sim", "--client-retention-ttl=-1"]);
    assert!(!ok);
    assert!(err.contains("--client-retention-ttl"), "{err}");
}
