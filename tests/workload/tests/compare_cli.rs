//! `progbench compare` end to end from its command line on a tiny workload: calibration first,
//! the table, the oracle, the no-KV-pressure and floor lines, and the JSON with the coefficients
//! both routers got. No timing assertions.

use std::process::Command;

#[test]
fn compare_calibrates_then_reports_runs_against_the_reference() {
    // The binaries compare starts live next to progbench (cargo build --workspace --bins).
    progbench::compare::test_binaries();
    let dir = std::env::temp_dir().join(format!("progbench-compare-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, html) = (dir.join("out.json"), dir.join("out.html"));
    let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
        .args([
            "compare",
            "--preset",
            "chat",
            "--programs",
            "3",
            "--rate",
            "2",
            "--seed",
            "5",
            "--servers",
            "1",
            "--num-gpu-blocks",
            "4096",
            // Below calibrate's largest prompt (8192 + 1): the calibration simulator has its own.
            "--max-model-len",
            "8192",
            "--time-scale",
            "50",
            "--limit-secs",
            "120",
            "--variants",
            "pr-program,pr-unbounded-kv,pr-hash-unbounded-kv",
        ])
        .arg("--json")
        .arg(&json)
        .arg("--html")
        .arg(&html)
        .output()
        .expect("run progbench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("calibrating the cost models"), "{stderr}");
    assert!(stdout.contains("oracle: H* ="), "{stdout}");
    let above = stdout
        .split("above the reference without KV pressure")
        .nth(1)
        .and_then(|s| s.split("above the floor").next())
        .unwrap_or_else(|| panic!("no reference section: {stdout}"));
    assert!(
        above.contains("PrProgram") && !above.contains("PrUnboundedKv"),
        "{stdout}"
    );
    let floor = stdout
        .split("above the floor, consistent hashing without KV pressure")
        .nth(1)
        .unwrap_or_else(|| panic!("no floor section: {stdout}"));
    assert!(
        floor.contains("PrProgram") && floor.contains("PrUnboundedKv"),
        "{stdout}"
    );

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("--json written")).expect("JSON");
    let cal = &report["calibration"];
    for field in [
        "intercept_seconds",
        "linear_seconds_per_1k_tokens",
        "quadratic_seconds_per_1k_tokens_squared",
    ] {
        assert!(cal["prefill_cost_model"][field].as_f64().is_some(), "{cal}");
    }
    assert!(cal["decode_throughput_model"]["fixed_step_seconds"].as_f64() > Some(0.0));
    assert_eq!(report["runs"].as_array().map(Vec::len), Some(3));
    let page = std::fs::read_to_string(&html).expect("--html written");
    assert!(page.contains("cost models from program-router calibrate"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_negative_member_skew_is_refused_by_name_before_anything_starts() {
    for bad in ["-1", "NaN"] {
        let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
            .args(["compare", "--programs", "1", "--variants", "pr-roll-skew"])
            .arg(format!("--member-skew-secs={bad}"))
            .output()
            .expect("run progbench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {stderr}");
        assert!(stderr.contains("--member-skew-secs"), "{bad}: {stderr}");
        assert!(
            !stderr.contains("calibrating"),
            "{bad}: nothing started: {stderr}"
        );
    }
}
