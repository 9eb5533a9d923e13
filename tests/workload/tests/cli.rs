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

/// Runs `progbench sim` with `args` plus a JSON and an HTML report in `dir` named `name`;
/// returns the first mode's mean JCT and the HTML report.
fn sim_mean_jct(args: &[&str], dir: &std::path::Path, name: &str) -> (f64, String) {
    let json = dir.join(format!("{name}.json")).display().to_string();
    let html = dir.join(format!("{name}.html")).display().to_string();
    let mut all = vec!["sim"];
    all.extend_from_slice(args);
    all.extend(["--json", &json, "--html", &html]);
    let (ok, err) = progbench(&all);
    assert!(ok, "{err}");
    let reports: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON")).expect("JSON");
    let mean = reports[0]["mean_jct_seconds"].as_f64().expect("mean JCT");
    (mean, std::fs::read_to_string(&html).expect("the report"))
}

#[test]
fn sim_runs_the_engine_profile_it_is_given() {
    let (ok, err) = progbench(&["sim", "--engine", "nope"]);
    assert!(!ok);
    assert!(err.contains("--engine"), "{err}");
    let (ok, err) = progbench(&["sim", "--uncalibrated"]);
    assert!(!ok);
    assert!(
        err.contains("--engine"),
        "--uncalibrated needs an engine: {err}"
    );
    let dir = std::env::temp_dir().join(format!("progbench-sim-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mean_jct = |engine: &str| {
        let args = [
            "--preset",
            "chat",
            "--programs",
            "6",
            "--modes",
            "program",
            "--engine",
            engine,
        ];
        let (mean, html) = sim_mean_jct(&args, &dir, engine);
        assert!(
            html.contains(&format!("{engine} engine")),
            "the report names the engine"
        );
        mean
    };
    // Virtual time: the same sessions take longer where every prefill takes twice as long.
    let (reference, slow) = (mean_jct("reference"), mean_jct("slow-prefill"));
    assert!(
        slow > reference,
        "slow-prefill {slow} vs reference {reference}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_keeps_the_given_cost_models_unless_an_engine_is_named() {
    let dir = std::env::temp_dir().join(format!("progbench-sim-costs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Ten times the reference's prefill: a router that believes misses cost that much holds
    // differently under KV pressure.
    let dear = r#"{"prefill_cost_model":{"intercept_seconds":0.6,"linear_seconds_per_1k_tokens":0.5,"quadratic_seconds_per_1k_tokens_squared":0.04,"decode_throughput_alpha":0.15}}"#;
    let mean_jct = |config: &str, engine: &[&str]| {
        let mut args = vec![
            "--preset",
            "swe-agent",
            "--programs",
            "8",
            "--ranks",
            "2",
            "--num-gpu-blocks",
            "2048",
            "--modes",
            "program",
            "--program-config",
            config,
        ];
        args.extend_from_slice(engine);
        sim_mean_jct(&args, &dir, "run").0
    };
    let defaults = mean_jct("{}", &[]);
    let kept = mean_jct(dear, &[]);
    assert_ne!(kept, defaults, "the given cost models steer the run");
    // Naming the engine calibrates the router to it: the given models are replaced.
    assert_eq!(mean_jct(dear, &["--engine", "reference"]), defaults);
    let _ = std::fs::remove_dir_all(&dir);
}
