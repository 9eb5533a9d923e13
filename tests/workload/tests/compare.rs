//! The compare pipeline on a tiny configuration: real binaries on loopback, fresh simulators per
//! run, identical token totals across runs. No timing assertions.

use std::time::Duration;

use progbench::compare::{Setup, Variant, calibrate, check_comparable, run_variant};
use progbench::engines::EngineProfile;
use progbench::workload::{Preset, generate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn program_router_variants_serve_identical_work() {
    let (dir, vllm_router) = progbench::compare::test_binaries();
    // What both routers get: program-router calibrate against a simulator, converted to 50×.
    let calibration = calibrate(&dir, 50.0, EngineProfile::Reference)
        .await
        .expect("program-router calibrate against a simulator");
    // The coefficients are the simulator's own cost model, in wall seconds at 50×.
    let truth = vllm_sim::timing::TimingModel::default();
    for (got, want) in [
        (
            calibration.prefill_cost_model["linear_seconds_per_1k_tokens"],
            truth.prefill_linear_seconds_per_1k_tokens,
        ),
        (
            calibration.decode_throughput_model["fixed_step_seconds"],
            truth.decode_fixed_step_seconds,
        ),
    ] {
        let ratio = got * 50.0 / want;
        assert!((0.5..2.0).contains(&ratio), "{calibration:?}: {ratio}");
    }
    // Against a simulator running another engine profile, calibrate fits that engine: prefill
    // a third of the reference's, decode the same.
    let fast = calibrate(&dir, 50.0, EngineProfile::FastPrefill)
        .await
        .expect("program-router calibrate against a fast-prefill simulator");
    let linear = "linear_seconds_per_1k_tokens";
    let prefill = fast.prefill_cost_model[linear] / calibration.prefill_cost_model[linear];
    assert!((0.2..0.5).contains(&prefill), "{fast:?}: {prefill}");
    let fixed = "fixed_step_seconds";
    let decode = fast.decode_throughput_model[fixed] / calibration.decode_throughput_model[fixed];
    assert!((0.6..1.6).contains(&decode), "{fast:?}: {decode}");
    let setup = Setup {
        servers: 1,
        dp: 2,
        num_gpu_blocks: 4096,
        max_model_len: 32768,
        time_scale: 50.0,
        limit: Duration::from_secs(120),
        bin_dir: dir,
        vllm_router: vllm_router.clone(),
        program_config: serde_json::json!({}),
        program_config_b: serde_json::json!({}),
        calibration: Some(calibration.clone()),
        member_skew_secs: 60.0,
        member_skew_seed: 1,
        engine: EngineProfile::Reference,
    };
    let turns = generate(Preset::Chat, 3, 2.0, 5);
    // pr-auto: the same scheduling, identity from session headers only (`enable_key: auto`).
    // pr-unbounded-kv: the no-KV-pressure reference (simulators sized for the whole workload);
    // pr-hash-unbounded-kv: the same simulators behind consistent hashing (issue 35's floor).
    // pr-split2 / pr-peers2: two replicas, turns alternating between them, without and with
    // `peers`. pr-roll / pr-roll-cold: the peers replaced one by one while the Programs run,
    // with and without hand-over; pr-roll-skew(-norev): each member list reaching each replica
    // at its own time, numbered or not.
    let mut variants = vec![
        Variant::PrHash,
        Variant::PrProgram,
        Variant::PrAuto,
        Variant::PrUnboundedKv,
        Variant::PrHashUnboundedKv,
        Variant::PrSplit2,
        Variant::PrPeers2,
        Variant::PrRoll,
        Variant::PrRollCold,
        Variant::PrRollSkew,
        Variant::PrRollSkewNorev,
    ];
    if vllm_router.is_some() {
        variants.push(Variant::VrHash);
    }
    let mut results = Vec::new();
    for v in variants {
        results.push(run_variant(&turns, v, &setup).await);
    }
    check_comparable(&mut results);
    for r in &results {
        assert!(r.ok, "{:?}: {:?}", r.variant, r.failure);
        assert!(r.requests > 0 && r.programs_completed == 3, "{r:?}");
        assert_eq!(r.served.values().sum::<usize>(), r.requests, "{r:?}");
        assert!(r.server_token_hit > 0.0 && r.server_token_hit < 1.0);
        // Program scheduling engaged for every Program where it is on, and only there.
        match r.variant {
            Variant::PrProgram
            | Variant::PrAuto
            | Variant::PrUnboundedKv
            | Variant::PrSplit2
            | Variant::PrPeers2
            | Variant::PrRoll
            | Variant::PrRollCold
            | Variant::PrRollSkew
            | Variant::PrRollSkewNorev => {
                assert!(r.program_admissions >= 3.0, "{r:?}")
            }
            _ => assert_eq!(r.program_admissions, 0.0, "{r:?}"),
        }
        // A rolling update starts a new replica for each one it stops, and every one that
        // stopped exited cleanly (or the run failed); without hand-over nothing is handed.
        let started = match r.variant {
            Variant::PrRoll
            | Variant::PrRollCold
            | Variant::PrRollSkew
            | Variant::PrRollSkewNorev => 4,
            Variant::PrSplit2 | Variant::PrPeers2 => 2,
            _ => 1,
        };
        assert_eq!(r.router_replicas, started, "{r:?}");
        if r.variant == Variant::PrRollCold {
            assert!(
                r.peer_counts
                    .iter()
                    .all(|(k, n)| !k.starts_with("handover:") || *n == 0.0),
                "{r:?}"
            );
        }
        // With a skewed delivery every member-list change (two per replacement) reached
        // every replica that stayed, by itself or from another replica.
        if matches!(r.variant, Variant::PrRollSkew | Variant::PrRollSkewNorev) {
            assert_eq!(r.member_spreads.len(), 4, "{r:?}");
            assert!(r.member_spreads.iter().all(Option::is_some), "{r:?}");
        } else {
            assert!(r.member_spreads.is_empty(), "{r:?}");
        }
        if matches!(r.variant, Variant::PrPeers2 | Variant::PrRoll) {
            assert!(r.peer_counts.get("forward:forwarded") > Some(&0.0), "{r:?}");
        }
        // What the report plots: every Program's JCT, every request's wait, the simulators
        // sampled during the replay (hit so far within 0..1, one KV line per DP rank).
        let s = &r.series;
        assert_eq!(s.jcts.len(), 3);
        assert_eq!(s.waits.len(), r.requests);
        assert!(s.waits.iter().all(|w| *w >= 0.0));
        assert!(r.p99_queue_wait >= r.p90_queue_wait);
        assert!(!s.hit.is_empty(), "{:?}: no hit samples", r.variant);
        assert!(
            s.hit
                .iter()
                .all(|(t, h)| *t >= 0.0 && (0.0..=1.0).contains(h))
        );
        assert_eq!(s.kv_usage.len(), 2, "{:?}: one KV line per rank", r.variant);
        assert_eq!(s.kv_names.len(), 2);
        assert!(s.kv_usage.iter().all(|l| !l.is_empty()));
        assert!(r.request_throughput > 0.0 && r.output_token_throughput > 0.0);
    }
    let html = progbench::report::compare_html("tiny", &results);
    assert!(html.starts_with("<!doctype html>"));
    // Three shared charts and one KV chart per run, each an inline SVG.
    assert_eq!(html.matches("<svg").count(), 3 + results.len(), "{html}");
    for r in &results {
        assert!(html.contains(&format!("KV usage per rank — {:?}", r.variant)));
    }
    assert!(html.contains("server 0 rank 0") && html.contains("server 0 rank 1"));
}
