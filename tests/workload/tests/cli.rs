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

#[test]
fn sim_runs_the_engine_profile_it_is_given() {
    let (ok, err) = progbench(&["sim", "--engine", "nope"]);
    assert!(!ok);
    assert!(err.contains("--engine"), "{err}");
    let dir = std::env::temp_dir().join(format!("progbench-sim-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mean_jct = |engine: &str| {
        let json = dir.join(format!("{engine}.json"));
        let (json_arg, html_arg) = (
            json.display().to_string(),
            dir.join(format!("{engine}.html")).display().to_string(),
        );
        let (ok, err) = progbench(&[
            "sim",
            "--preset",
            "chat",
            "--programs",
            "6",
            "--modes",
            "program",
            "--engine",
            engine,
            "--json",
            &json_arg,
            "--html",
            &html_arg,
        ]);
        assert!(ok, "{err}");
        let html = std::fs::read_to_string(&html_arg).expect("the report");
        assert!(
            html.contains(&format!("{engine} engine")),
            "the report names the engine"
        );
        let reports: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("the JSON")).expect("JSON");
        reports[0]["mean_jct_seconds"].as_f64().expect("mean JCT")
    };
    // Virtual time: the same sessions take longer where every prefill takes twice as long.
    let (reference, slow) = (mean_jct("reference"), mean_jct("slow-prefill"));
    assert!(
        slow > reference,
        "slow-prefill {slow} vs reference {reference}"
    );
    let (ok, err) = progbench(&["sim", "--uncalibrated"]);
    assert!(!ok);
    assert!(
        err.contains("--engine"),
        "--uncalibrated needs an engine: {err}"
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
    let mean_jct = |config: &str, engine: Option<&str>| {
        let json = dir.join("run.json").display().to_string();
        let html = dir.join("run.html").display().to_string();
        let mut args = vec![
            "sim",
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
            "--json",
            &json,
            "--html",
            &html,
        ];
        if let Some(e) = engine {
            args.extend(["--engine", e]);
        }
        let (ok, err) = progbench(&args);
        assert!(ok, "{err}");
        let reports: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("the JSON")).expect("JSON");
        reports[0]["mean_jct_seconds"].as_f64().expect("mean JCT")
    };
    let defaults = mean_jct("{}", None);
    let kept = mean_jct(dear, None);
    assert_ne!(kept, defaults, "the given cost models steer the run");
    // Naming the engine calibrates the router to it: the given models are replaced.
    assert_eq!(mean_jct(dear, Some("reference")), defaults);
    let _ = std::fs::remove_dir_all(&dir);
}
