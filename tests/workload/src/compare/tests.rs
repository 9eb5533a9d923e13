//! Tests of `compare`'s readers and bookkeeping.

use super::*;

#[test]
fn calibrated_coefficients_fill_only_what_the_config_leaves_out() {
    let c = Calibrated {
        prefill_cost_model: [
            ("intercept_seconds", 0.003),
            ("linear_seconds_per_1k_tokens", 0.002),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into(),
        decode_throughput_model: [("fixed_step_seconds", 0.0005)]
            .map(|(k, v)| (k.to_string(), v))
            .into(),
        prefill_r2: 1.0,
        decode_r2: 1.0,
    };
    let mut ps = serde_json::json!({
        "prefill_cost_model": {"linear_seconds_per_1k_tokens": 0.1, "decode_throughput_alpha": 0.3}
    });
    c.apply(&mut ps);
    assert_eq!(
        ps,
        serde_json::json!({
            "prefill_cost_model": {"intercept_seconds": 0.003,
                "linear_seconds_per_1k_tokens": 0.1, "decode_throughput_alpha": 0.3},
            "decode_throughput_model": {"fixed_step_seconds": 0.0005}
        })
    );
}

#[test]
fn runs_that_served_other_turns_are_not_comparable() {
    let run = |served: &[(&str, usize)]| {
        let mut r = RunResult::empty(Variant::PrProgram);
        r.ok = true;
        r.served = served.iter().map(|(p, n)| (p.to_string(), *n)).collect();
        r.requests = r.served.values().sum();
        r.completion_tokens = 10;
        r
    };
    let mut rs = vec![
        run(&[("a", 3), ("b", 2)]),
        run(&[("a", 3), ("b", 2)]),
        run(&[("a", 2), ("b", 3)]),
        run(&[("a", 3)]),
    ];
    check_comparable(&mut rs);
    let ok: Vec<bool> = rs.iter().map(|r| r.ok).collect();
    assert_eq!(ok, [true, true, false, false]);
    assert!(
        rs[2]
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("other turns"))
    );
    assert!(
        rs[3]
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("served 3 requests"))
    );
}

#[test]
fn router_durations_follow_the_simulators_time_scale() {
    let mut ps = serde_json::json!({"queue_timeout_seconds": 100.0, "global_queue": true});
    to_workload_time(&mut ps, 20.0, SECONDS_FIELDS);
    assert_eq!(ps["queue_timeout_seconds"], 5.0, "given: scaled");
    assert_eq!(ps["metrics_interval_seconds"], 0.05, "defaulted: scaled");
    assert_eq!(ps["max_acting_ttl_seconds"], 0.5);
    assert_eq!(ps["global_queue"], true, "not a duration");
    let defaults = program_router::config::ProgramSchedulingConfig::default();
    let d = serde_json::to_value(&defaults).expect("json");
    for (field, default) in SECONDS_FIELDS {
        assert_eq!(
            d[field].as_f64(),
            Some(default),
            "{field}: the router's default"
        );
    }
    let mut same = serde_json::json!({});
    to_workload_time(&mut same, 1.0, SECONDS_FIELDS);
    assert_eq!(same, serde_json::json!({}));
}

#[test]
fn every_duration_of_ours_follows_the_time_scale() {
    let ext = extension_seconds_fields();
    let names: Vec<&str> = ext.iter().map(|(k, _)| k.as_str()).collect();
    // Unscaled, a duration lasts time_scale times too long: the grace outlasts the queue limit.
    assert!(
        names.contains(&"force_resume_engine_grace_seconds"),
        "{names:?}"
    );
    assert!(names.contains(&"new_program_demand_aging_seconds"));
    let d = serde_json::to_value(program_router::config::ProgramSchedulingConfig::default())
        .expect("json");
    let all = d.as_object().expect("object");
    for key in all.keys().filter(|k| k.ends_with("_seconds")) {
        let spec = SECONDS_FIELDS.iter().any(|(f, _)| f == key);
        assert!(
            spec != names.contains(&key.as_str()),
            "{key}: scaled exactly once"
        );
    }
    let mut ps = serde_json::json!({"force_resume_engine_grace_seconds": 40.0});
    to_workload_time(&mut ps, 20.0, ext.iter().map(|(k, v)| (k.as_str(), *v)));
    assert_eq!(
        ps["force_resume_engine_grace_seconds"], 2.0,
        "given: scaled"
    );
    assert_eq!(ps["new_program_demand_aging_seconds"], 0.0, "0 stays off");
    assert!(
        ps.get("queue_timeout_seconds").is_none(),
        "the spec's are not scaled twice"
    );
}

#[test]
fn counters_sum_over_series_only_for_the_exact_name() {
    let t = "vllm:prompt_tokens_total{engine=\"0\"} 10\nvllm:prompt_tokens_total{engine=\"1\"} 5\nvllm:prompt_tokens_cached_total{engine=\"0\"} 7\n";
    assert_eq!(counter(t, "vllm:prompt_tokens_total"), 15.0);
    assert_eq!(counter(t, "vllm:prompt_tokens_cached_total"), 7.0);
}

#[test]
fn admissions_count_admit_and_force_resume_only() {
    let t = "vllm_router_agent_aware_transitions_total{transition=\"admit\"} 4\nvllm_router_agent_aware_transitions_total{transition=\"force_resume\"} 1\nvllm_router_agent_aware_transitions_total{transition=\"ttl_expired\"} 9\n";
    let t = transitions(t);
    assert_eq!(admissions(&t), 5.0);
    assert_eq!(sum_of(&t, &["force_resume"]), 1.0);
}

#[test]
fn the_peers_transitions_are_read_per_reason_over_targets() {
    let t = "# TYPE vllm_router_agent_aware_transitions_total counter\nvllm_router_agent_aware_transitions_total{target=\"http://127.0.0.1:1@0\",reason=\"program_admit\"} 3\nvllm_router_agent_aware_transitions_total{target=\"http://127.0.0.1:1@1\",reason=\"program_admit\"} 6\nvllm_router_agent_aware_transitions_total{target=\"http://127.0.0.1:1@1\",reason=\"ttl_expired\"} 2\n";
    let t = transitions(t);
    assert_eq!(admissions(&t), 9.0);
    assert_eq!(t.get("ttl_expired"), Some(&2.0));
}

#[test]
fn kv_usage_is_read_per_engine() {
    let t = "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\nvllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\nvllm:kv_cache_usage_perc_other 3\n";
    assert_eq!(
        per_engine(t, "vllm:kv_cache_usage_perc"),
        vec![("0".to_string(), 0.25), ("1".to_string(), 0.5)]
    );
}

#[test]
fn the_peer_gets_its_own_resume_order_and_everything_else_unchanged() {
    let ours = serde_json::json!({"resume_order": "last_use", "global_queue": true});
    let peer = peer_config(&ours);
    assert_eq!(peer["resume_order"], "mru");
    assert_eq!(peer["global_queue"], true);
    let fcfs = serde_json::json!({"resume_order": "fcfs"});
    assert_eq!(peer_config(&fcfs), fcfs);
}

fn timed(v: Variant, round: u32, jct: f64, ok: bool) -> RunResult {
    RunResult {
        round,
        ok,
        mean_jct: jct,
        ..RunResult::empty(v)
    }
}

#[test]
fn rounds_are_ranked_each_above_its_own_floor_and_pooled() {
    use Variant::{PrHashUnboundedKv as Floor, PrProgram as Ours, VrProgram as Peer};
    let rs = vec![
        timed(Ours, 1, 600.0, true),
        timed(Floor, 1, 200.0, true),
        timed(Peer, 1, 1000.0, true),
        timed(Peer, 2, 900.0, true),
        timed(Floor, 2, 300.0, true),
        timed(Ours, 2, 700.0, true),
        // A round whose peer failed counts in neither the list nor the pool.
        timed(Ours, 3, 650.0, true),
        timed(Floor, 3, 250.0, true),
        timed(Peer, 3, 950.0, false),
    ];
    let p = excess_ratios(&rs, Ours, Peer, Floor).expect("two full rounds");
    let rounds: Vec<u32> = p.per_round.iter().map(|(r, _)| *r).collect();
    assert_eq!(rounds, [1, 2]);
    assert!((p.per_round[0].1 - 0.5).abs() < 1e-12);
    assert!((p.per_round[1].1 - 400.0 / 600.0).abs() < 1e-12);
    // Pooled is the ratio of the sums (800 ÷ 1,400), not the mean of the ratios (0.583).
    assert!((p.pooled - 800.0 / 1400.0).abs() < 1e-12);
    assert!(excess_ratios(&rs, Ours, Variant::VrHash, Floor).is_none());
    // A peer at or below the floor leaves nothing to divide by.
    let level = vec![
        timed(Ours, 1, 210.0, true),
        timed(Floor, 1, 200.0, true),
        timed(Peer, 1, 200.0, true),
    ];
    assert!(excess_ratios(&level, Ours, Peer, Floor).is_none());

    let s = spread(&rs, Ours, |r| r.mean_jct).expect("ours ran");
    assert_eq!((s.runs, s.min, s.max), (3, 600.0, 700.0));
    assert!((s.mean - 650.0).abs() < 1e-12);
    let peer = spread(&rs, Peer, |r| r.mean_jct).expect("the peer ran");
    assert_eq!(peer.runs, 2, "the failed run is left out");
    assert!(spread(&rs, Variant::PrHash, |r| r.mean_jct).is_none());
    assert_eq!(rs[3].label(), "VrProgram #2");
    assert_eq!(rs[0].label(), "PrProgram");
}

/// `scripts/compare-pool.py` reads what `compare --json` writes: pooled across files, a round
/// counts only when all three variants ran cleanly in it and the peer left something to win,
/// and the pool is the ratio of the sums.
#[test]
fn the_pooling_script_reads_compare_json_across_files() {
    use Variant::{PrHashUnboundedKv as Floor, PrProgram as Ours, VrProgram as Peer};
    let dir = std::env::temp_dir().join(format!("progbench-pool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |name: &str, runs: Vec<RunResult>| {
        let path = dir.join(name);
        let json = serde_json::json!({ "runs": runs });
        std::fs::write(&path, json.to_string()).expect("write json");
        path
    };
    // Seed A: two full rounds (400 and 400 above the floor; the peer 800 and 600).
    let a = write(
        "a.json",
        vec![
            timed(Ours, 1, 600.0, true),
            timed(Floor, 1, 200.0, true),
            timed(Peer, 1, 1000.0, true),
            timed(Ours, 2, 700.0, true),
            timed(Floor, 2, 300.0, true),
            timed(Peer, 2, 900.0, true),
            timed(Variant::PrClairvoyant, 1, 500.0, true),
            timed(Variant::PrClairvoyant, 2, 600.0, true),
        ],
    );
    // Seed B: one full round (100 against 500) and one whose peer failed.
    let b = write(
        "b.json",
        vec![
            timed(Ours, 1, 300.0, true),
            timed(Floor, 1, 200.0, true),
            timed(Peer, 1, 700.0, true),
            timed(Ours, 2, 300.0, true),
            timed(Floor, 2, 200.0, true),
            timed(Peer, 2, 650.0, false),
        ],
    );
    // Seed C: the peer 2 s above the floor, nothing to win: listed, not pooled.
    let c = write(
        "c.json",
        vec![
            timed(Ours, 1, 199.0, true),
            timed(Floor, 1, 200.0, true),
            timed(Peer, 1, 202.0, true),
        ],
    );
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/compare-pool.py");
    let pool_as = |ours: &[&str], files: &[&std::path::PathBuf]| {
        std::process::Command::new("python3")
            .arg(&script)
            .args(ours)
            .args(files)
            .output()
            .expect("python3 runs the script")
    };
    let pool = |files: &[&std::path::PathBuf]| pool_as(&[], files);
    let out = pool(&[&a, &b, &c]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (400 + 400 + 100) ÷ (800 + 600 + 500) = 0.474; rounds 0.50, 0.67 and 0.20.
    assert!(
        stdout.contains("pooled over 2 files, 3 rounds: 0.474×"),
        "{stdout}"
    );
    assert!(stdout.contains("2 of 3 rounds ≤ 0.5×"), "{stdout}");
    assert!(
        stdout.contains("| c.json | nothing to win: the peer +2.0 s from the floor |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| a.json | 650.0 / 950.0 / 250.0 | 0.50×, 0.67× | 0.57× |"),
        "{stdout}"
    );
    // Another variant of ours in its place: (300 + 300) ÷ (800 + 600) = 0.429.
    let out = pool_as(&["--ours", "pr-clairvoyant"], &[&a]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("| a.json | 550.0 / 950.0 / 250.0 | 0.38×, 0.50× | 0.43× |"),
        "{stdout}"
    );
    let out = pool_as(&["--ours", "vr-program"], &[&a]);
    assert!(
        !out.status.success(),
        "only program-router variants stand for ours"
    );
    // Anything else is refused by name, without a traceback.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"variant\": 1}").expect("write json");
    let out = pool(&[&a, &bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("bad.json: not a `progbench compare --json` file"),
        "{stderr}"
    );
    assert!(!stderr.contains("Traceback"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A setup of two servers × two ranks that starts nothing (for what is derived from it).
fn setup(engine: EngineProfile) -> Setup {
    Setup {
        servers: 2,
        dp: 2,
        num_gpu_blocks: 1000,
        max_model_len: 32768,
        time_scale: 20.0,
        limit: std::time::Duration::from_secs(1),
        bin_dir: std::path::PathBuf::new(),
        vllm_router: None,
        program_config: serde_json::json!({}),
        program_config_b: serde_json::json!({}),
        calibration: None,
        member_skew_secs: 0.0,
        member_skew_seed: 1,
        engine,
    }
}

#[test]
fn every_simulator_of_a_run_gets_the_engine_profiles_timing() {
    let fast = EngineProfile::FastPrefill;
    let flags = sim_flags(&setup(fast), Variant::PrClairvoyant, 1234);
    for (flag, value) in fast.sim_flags() {
        assert!(
            flags.contains(&(flag, value.clone())),
            "{flag} {value}: {flags:?}"
        );
    }
    assert!(flags.contains(&("num-gpu-blocks", "1234".into())));
    assert!(flags.contains(&("end-hint", String::new())));
    // Another profile, other values: the flags follow the setup, not a constant.
    let slow = sim_flags(&setup(EngineProfile::SlowPrefill), Variant::PrProgram, 1234);
    assert_ne!(
        slow.iter()
            .find(|f| f.0 == "prefill-linear-seconds-per-1k-tokens"),
        flags
            .iter()
            .find(|f| f.0 == "prefill-linear-seconds-per-1k-tokens")
    );
    assert!(!slow.iter().any(|f| f.0 == "end-hint"));
}

#[test]
fn only_pr_program_b_takes_the_b_fields_over_the_shared_config() {
    let setup = Setup {
        program_config: serde_json::json!({"kv_retention_ttl_seconds_max": 30, "global_queue": 0}),
        program_config_b: serde_json::json!({"resume_most_turns_first": 1, "global_queue": 1}),
        ..setup(EngineProfile::Reference)
    };
    assert_eq!(
        program_config_of(&setup, Variant::PrProgramB),
        serde_json::json!({
            "kv_retention_ttl_seconds_max": 30,
            "global_queue": 1,
            "resume_most_turns_first": 1,
        })
    );
    for v in [
        Variant::PrProgram,
        Variant::VrProgram,
        Variant::PrClairvoyant,
    ] {
        assert_eq!(program_config_of(&setup, v), setup.program_config, "{v:?}");
    }
}
