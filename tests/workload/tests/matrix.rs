//! `progbench matrix --quick`, the CI-sized matrix: every family × pressure cell is run, held to
//! its goals and written to the table, the JSON and the heat map.

use std::process::Command;

fn progbench(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_progbench"))
        .args(args)
        .output()
        .expect("run progbench");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_quick_matrix_runs_every_cell_against_its_floor() {
    let dir = std::env::temp_dir().join(format!("progbench-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, html) = (dir.join("m.json"), dir.join("m.html"));
    let (ok, out, err) = progbench(&[
        "matrix",
        "--quick",
        "--json",
        json.to_str().expect("utf-8"),
        "--html",
        html.to_str().expect("utf-8"),
    ]);
    assert!(ok, "{out}\n{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    let cells = doc["cells"].as_array().expect("cells");
    let runs = doc["runs"].as_array().expect("runs");
    // 8 families × 4 pressures, one seed of the report half.
    assert_eq!(cells.len(), 32, "{out}");
    assert_eq!(runs.len(), 32);
    for r in runs {
        assert_eq!(r["seed"], 2, "--quick runs the report half's first seed");
        let floor = r["floor"]["mean_jct"].as_f64().expect("floor");
        let hash = r["hash"]["mean_jct"].as_f64().expect("hash");
        assert!(
            floor > 0.0 && hash >= floor * 0.999,
            "hashing above its own floor: {r}"
        );
        assert_eq!(
            r["floor"]["preemptions"], 0,
            "the floor's KV never fills: {r}"
        );
        // Every Program ends the same way in both modes: the workload decides truncation.
        assert_eq!(
            r["hash"]["programs_truncated"],
            r["program"]["programs_truncated"]
        );
        assert_eq!(r["program"]["queue_timeouts"], 0, "{r}");
        assert_eq!(
            r["affinity"]["programs_truncated"],
            r["program"]["programs_truncated"]
        );
    }
    for c in cells {
        let goals = c["goals"].as_array().expect("goals");
        // Every cell: all Programs completed; then the pressure's own goals.
        let want = match c["pressure"].as_str() {
            Some("none") => 2,
            Some("moderate") => 3,
            _ => 4,
        };
        assert_eq!(goals.len(), want, "{c}");
        let line = out
            .lines()
            .find(|l| {
                l.split_whitespace().next().map(|f| f.trim_end_matches('*')) == c["family"].as_str()
                    && l.split_whitespace().nth(1) == c["pressure"].as_str()
            })
            .unwrap_or_else(|| panic!("no table line for {c}"));
        let missed = goals.iter().any(|g| g["met"] == false);
        assert_eq!(line.contains("NOT MET"), missed, "{line}");
    }
    // Pressure is what the name says: more pressure, less KV.
    let blocks = |f: &str, p: &str| {
        runs.iter()
            .find(|r| r["family"] == f && r["pressure"] == p)
            .and_then(|r| r["blocks_per_rank"].as_u64())
            .expect("run")
    };
    assert!(blocks("coding", "none") > blocks("coding", "moderate"));
    assert!(blocks("coding", "moderate") > blocks("coding", "heavy"));
    for summary in [
        "every Program completed (no queue timeouts): met in",
        "excess ≤ 0.5× hashing's: met in",
        "mean never worse than hashing: met in",
        "holding paid (mean ≤ affinity only's, within 1 %; not a goal):",
    ] {
        assert!(out.contains(summary), "{out}");
    }
    let page = std::fs::read_to_string(&html).expect("html written");
    for f in [
        "coding",
        "shared-prompt",
        "heavy-gaps",
        "short-many",
        "long-few",
        "subagents",
        "bursty",
        "mixed-chat",
    ] {
        assert!(page.contains(&format!("<th>{f}")), "{f} in the heat map");
    }
    assert_eq!(
        page.matches("<table>").count(),
        5,
        "four grids against hashing, one against affinity only"
    );
    for c in cells {
        assert!(
            c["affinity_mean_ratio"][0].as_f64().expect("ratio") > 0.0,
            "{c}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn matrix_refuses_bad_settings_by_name() {
    for (args, flag) in [
        (vec!["matrix", "--scale", "0"], "--scale"),
        (vec!["matrix", "--ranks", "0"], "--ranks"),
        (
            vec!["matrix", "--program-config", "{\"nope\":1}"],
            "--program-config",
        ),
        (vec!["matrix", "--families", "nope"], "--families"),
        (vec!["matrix", "--engine", "nope"], "--engine"),
    ] {
        let (ok, _, err) = progbench(&args);
        assert!(!ok, "{args:?}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

#[test]
fn another_engine_is_named_in_the_table_and_the_json() {
    let dir = std::env::temp_dir().join(format!("progbench-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("m.json");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "matrix",
            "--quick",
            "--families",
            "short-many",
            "--pressures",
            "overload",
            "--html",
        ];
        let html = dir.join("m.html");
        args.push(html.to_str().expect("utf-8"));
        args.extend_from_slice(&["--json", json.to_str().expect("utf-8")]);
        args.extend_from_slice(extra);
        let (ok, out, err) = progbench(&args);
        assert!(ok, "{out}\n{err}");
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("json");
        (out, doc)
    };
    let (out, reference) = run(&[]);
    assert!(out.contains("engine model (reference)"), "{out}");
    assert_eq!(reference["engine"], "reference");
    assert_eq!(reference["calibrated"], true);
    let (out, fast) = run(&["--engine", "fast-prefill", "--uncalibrated"]);
    assert!(
        out.contains("(fast-prefill, the router not calibrated to it)"),
        "{out}"
    );
    assert_eq!(fast["engine"], "fast-prefill");
    assert_eq!(fast["calibrated"], false);
    // A cheaper prefill finishes the same Programs' floor sooner.
    let floor = |d: &serde_json::Value| d["runs"][0]["floor"]["mean_jct"].as_f64().expect("floor");
    assert!(floor(&fast) < floor(&reference), "{fast} {reference}");
    let _ = std::fs::remove_dir_all(&dir);
}
