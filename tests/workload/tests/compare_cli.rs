//! `progbench compare` end to end from its command line on a tiny workload: calibration first,
//! the table, the oracle, the no-KV-pressure and floor lines, and the JSON with the coefficients
//! both routers got. No timing assertions.

use std::path::Path;
use std::process::Command;

/// Runs `progbench compare` with `args`, `--json` and `--html`; its stdout and stderr once it
/// succeeded.
fn compare_ok(args: &[&str], json: &Path, html: &Path) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
        .args(args)
        .arg("--json")
        .arg(json)
        .arg("--html")
        .arg(html)
        .output()
        .expect("run progbench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn compare_calibrates_then_reports_runs_against_the_reference() {
    // The binaries compare starts live next to progbench (cargo build --workspace --bins).
    progbench::compare::test_binaries();
    let dir = std::env::temp_dir().join(format!("progbench-compare-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, html) = (dir.join("out.json"), dir.join("out.html"));
    let (stdout, stderr) = compare_ok(
        &[
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
        ],
        &json,
        &html,
    );
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

/// `progbench compare` with `args` fails, names each of `names`, and starts nothing.
fn refused(args: &[&str], names: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
        .args(["compare", "--programs", "1"])
        .args(args)
        .output()
        .expect("run progbench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?}: {stderr}");
    for name in names {
        assert!(stderr.contains(name), "{args:?}: {stderr}");
    }
    assert!(
        !stderr.contains("calibrating"),
        "{args:?}: nothing started: {stderr}"
    );
}

/// `progbench compare` with `flag` at each of `bad` fails, names the flag, and starts nothing.
fn refused_by_name(flag: &str, bad: &[&str], variant: &str) {
    for bad in bad {
        refused(&["--variants", variant, &format!("{flag}={bad}")], &[flag]);
    }
}

#[test]
fn a_negative_member_skew_is_refused_by_name_before_anything_starts() {
    refused_by_name("--member-skew-secs", &["-1", "NaN"], "pr-roll-skew");
}

#[test]
fn rounds_run_every_variant_again_in_reverse_and_report_the_spread() {
    progbench::compare::test_binaries();
    let dir = std::env::temp_dir().join(format!("progbench-rounds-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("out.json");
    let (stdout, stderr) = compare_ok(
        &[
            "compare",
            "--preset",
            "chat",
            "--programs",
            "2",
            "--rate",
            "2",
            "--servers",
            "1",
            "--time-scale",
            "50",
            "--limit-secs",
            "120",
            "--rounds",
            "2",
            "--variants",
            "pr-hash,pr-hash-unbounded-kv",
        ],
        &json,
        &dir.join("out.html"),
    );
    assert!(stderr.contains("round 2 of 2: running PrHash"), "{stderr}");
    assert!(stdout.contains("PrHashUnboundedKv #2"), "{stdout}");
    assert!(stdout.contains("over 2 rounds"), "{stdout}");
    assert!(stdout.contains("(round 2)"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("--json written")).expect("JSON");
    assert_eq!(report["rounds"], 2);
    let runs: Vec<(String, u64)> = report["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            (
                r["variant"].as_str().unwrap_or_default().to_string(),
                r["round"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [
        ("PrHash", 1),
        ("PrHashUnboundedKv", 1),
        ("PrHashUnboundedKv", 2),
        ("PrHash", 2),
    ]
    .iter()
    .map(|(v, r)| (v.to_string(), *r))
    .collect();
    assert_eq!(runs, want, "the second round in reverse");
    // No peer ran: no ratio to report.
    assert!(report["excess_ratio_vs_peer"].is_null(), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rounds_out_of_range_are_refused_by_name_before_anything_starts() {
    refused_by_name("--rounds", &["0", "21"], "pr-program");
}

/// `--pressure` sizes the KV itself: with `--num-gpu-blocks` as well it is refused by name, and
/// so are zero ranks (which it would size KV for), before anything starts.
#[test]
fn a_pressure_with_a_kv_size_or_on_no_ranks_is_refused_by_name() {
    refused(
        &["--pressure", "heavy", "--num-gpu-blocks", "4096"],
        &["--pressure", "--num-gpu-blocks"],
    );
    refused(&["--pressure", "heavy", "--dp", "0"], &["--dp"]);
    refused(&["--pressure", "heavy", "--servers", "0"], &["--servers"]);
}

#[test]
fn program_configs_that_are_not_json_objects_are_refused_by_name() {
    for flag in ["--program-config", "--program-config-b"] {
        refused_by_name(flag, &["[1]", "true", "{"], "pr-program,pr-program-b");
    }
}
