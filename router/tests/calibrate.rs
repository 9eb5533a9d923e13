//! `program-router calibrate` against vllm-sim recovers the simulator's own cost model: the modelled
//! prefill time at every measured size (15 % or 20 ms) and each decode coefficient within 10 %.

mod common;

use clap::Parser;
use common::*;
use program_router::cli::{Cli, Command};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovers_the_simulators_cost_model() {
    // Real time (scale 1): HTTP overhead is not magnified in simulated seconds.
    let scale = 1.0;
    let s = sim(&[]).await;
    let cli = Cli::try_parse_from([
        "program-router",
        "calibrate",
        "--worker-url",
        &s.base(),
        "--reps",
        "2",
        "--prompt-sizes",
        "512,2048,4096,8192,12288",
    ])
    .expect("args");
    let Some(Command::Calibrate(args)) = cli.command else {
        panic!("calibrate")
    };
    let c = program_router::calibrate::run(&args)
        .await
        .expect("calibration runs");
    let truth = vllm_sim::timing::TimingModel::default();
    let p = &c.prefill_cost_model;
    let d = &c.decode_throughput_model;
    let checks = [
        (
            "intercept",
            p.intercept_seconds,
            truth.prefill_intercept_seconds,
        ),
        (
            "linear",
            p.linear_seconds_per_1k_tokens,
            truth.prefill_linear_seconds_per_1k_tokens,
        ),
        (
            "quadratic",
            p.quadratic_seconds_per_1k_tokens_squared,
            truth.prefill_quadratic_seconds_per_1k_tokens_squared,
        ),
        (
            "fixed",
            d.fixed_step_seconds,
            truth.decode_fixed_step_seconds,
        ),
        (
            "per request",
            d.batch_step_seconds_per_request,
            truth.decode_batch_step_seconds_per_request,
        ),
        (
            "per token",
            d.context_step_seconds_per_token,
            truth.decode_context_step_seconds_per_token,
        ),
    ];
    for (name, measured, want) in checks {
        eprintln!(
            "{name}: {:.6} vs {want:.6} ({:+.1} %)",
            measured * scale,
            (measured * scale / want - 1.0) * 100.0
        );
    }
    // The prefill terms are fitted jointly and trade off against each other (more linear, less
    // quadratic) when the debug build's own per-token handling adds to every sample; what the
    // scheduler uses is the modelled prefill time, so that is what must match, at every size.
    let prefill = |a: f64, b: f64, c: f64, tokens: f64| {
        let k = tokens / 1000.0;
        a + b * k + c * k * k
    };
    for tokens in [512.0, 2048.0, 4096.0, 8192.0, 12288.0] {
        let got = prefill(
            p.intercept_seconds,
            p.linear_seconds_per_1k_tokens,
            p.quadratic_seconds_per_1k_tokens_squared,
            tokens,
        ) * scale;
        let want = prefill(
            truth.prefill_intercept_seconds,
            truth.prefill_linear_seconds_per_1k_tokens,
            truth.prefill_quadratic_seconds_per_1k_tokens_squared,
            tokens,
        );
        let err = got / want - 1.0;
        eprintln!(
            "prefill({tokens}): {got:.4} vs {want:.4} ({:+.1} %)",
            err * 100.0
        );
        // 15 %, or 20 ms where the request handling of this debug build (absorbed by the
        // intercept) dominates a small prompt; a release build lands within 3 %.
        assert!(
            err.abs() < 0.15 || (got - want).abs() < 0.020,
            "prefill at {tokens} tokens: {got} vs {want}"
        );
    }
    for (name, measured, want) in checks {
        let got = measured * scale;
        if name == "linear" || name == "quadratic" {
            // Checked through the modelled prefill time above.
            continue;
        }
        if name == "intercept" {
            // The constant term also absorbs per-request handling that does not scale with tokens;
            // in this debug test build the in-process simulator adds a few ms of its own (a release
            // build lands within 3 %). Bound it absolutely.
            assert!(
                (got - want).abs() < 0.015,
                "{name}: measured {got} vs {want}"
            );
        } else {
            let err = got / want - 1.0;
            assert!(
                err.abs() < 0.10,
                "{name}: measured {got} vs {want} ({:+.1} %)",
                err * 100.0
            );
        }
    }
    assert!(
        c.fit.prefill_r2 > 0.99 && c.fit.decode_r2 > 0.99,
        "{:?}",
        c.fit
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    let cli = Cli::try_parse_from([
        "program-router",
        "calibrate",
        "--worker-url",
        "http://127.0.0.1:9",
        "--timeout-secs",
        "2",
    ])
    .expect("args");
    let Some(Command::Calibrate(args)) = cli.command else {
        panic!("calibrate")
    };
    let e = program_router::calibrate::run(&args)
        .await
        .expect_err("no server");
    assert!(e.contains("/v1/models"), "{e}");
}
