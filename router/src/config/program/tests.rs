//! Tests of the `program_scheduling` config: defaults, the spec's examples, the deprecated alias,
//! and every validation rule naming its field.

use super::*;

#[test]
fn a_coefficient_is_omitted_only_when_it_is_not_written() {
    assert_eq!(omitted_coefficients(None).len(), 7, "enabled without JSON");
    assert_eq!(omitted_coefficients(Some(&serde_json::json!({}))).len(), 7);
    // The six fitted ones, as `program-router calibrate` prints them; alpha is not fitted.
    let fitted = serde_json::json!({
        "prefill_cost_model": {"intercept_seconds": 0.05, "linear_seconds_per_1k_tokens": 0.06,
            "quadratic_seconds_per_1k_tokens_squared": 0.004},
        "decode_throughput_model": {"fixed_step_seconds": 0.01,
            "batch_step_seconds_per_request": 0.0004, "context_step_seconds_per_token": 1e-7}
    });
    assert_eq!(
        omitted_coefficients(Some(&fitted)),
        ["prefill_cost_model.decode_throughput_alpha"]
    );
    // Written at its reference value: configured on purpose, no longer omitted.
    let mut all = fitted;
    all["prefill_cost_model"]["decode_throughput_alpha"] = serde_json::json!(0.15);
    assert!(omitted_coefficients(Some(&all)).is_empty());
}

fn parse(json: &str) -> Result<ProgramSchedulingConfig, String> {
    let c: ProgramSchedulingConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

#[test]
fn empty_object_is_every_default() {
    assert_eq!(
        parse("{}").expect("valid"),
        ProgramSchedulingConfig::default()
    );
}

#[test]
fn the_specs_calibrated_example_loads() {
    let c = parse(
        r#"{"program_scheduling_enable_key":"vllm_xargs.agentic_context","global_queue":true,
        "resume_order":"mru","token_capacity_per_dp_rank":266864,"metrics_interval_seconds":1.0,
        "prefill_cost_model":{"intercept_seconds":0.066,"linear_seconds_per_1k_tokens":0.057,
        "quadratic_seconds_per_1k_tokens_squared":0.0044,"decode_throughput_alpha":0.15},
        "decode_throughput_model":{"fixed_step_seconds":0.0106,"batch_step_seconds_per_request":0.00042,
        "context_step_seconds_per_token":1.42e-7}}"#,
    )
    .expect("valid");
    assert!(c.global_queue);
    assert_eq!(c.token_capacity_per_dp_rank, Some(266_864));
}

#[test]
fn deprecated_alias_is_accepted_and_never_emitted() {
    let c = parse(r#"{"token_capacity_per_target": 4096}"#).expect("alias");
    assert_eq!(c.token_capacity_per_dp_rank, Some(4096));
    let out = serde_json::to_string(&c).expect("serialize");
    assert!(out.contains("\"token_capacity_per_dp_rank\":4096"));
    assert!(!out.contains("token_capacity_per_target"));
}

#[test]
fn invalid_values_name_the_field() {
    let cases = [
        (
            r#"{"low_watermark_ratio":0.9,"high_watermark_ratio":0.8}"#,
            "high_watermark_ratio",
        ),
        (
            r#"{"binding_strategy":"reasoning_token_balance"}"#,
            "binding_strategy",
        ),
        (
            r#"{"segment_yield_max_context_ratio":0}"#,
            "segment_yield_max_context_ratio",
        ),
        (
            r#"{"force_resume_timeout_seconds":700}"#,
            "force_resume_timeout_seconds",
        ),
        (
            r#"{"prefill_cost_model":{"decode_throughput_alpha":1.5}}"#,
            "decode_throughput_alpha",
        ),
        (
            r#"{"decode_throughput_model":{"fixed_step_seconds":0}}"#,
            "fixed_step_seconds",
        ),
        (
            r#"{"metrics_interval_seconds":0}"#,
            "metrics_interval_seconds",
        ),
        (
            r#"{"force_resume_workload_factor":-1}"#,
            "force_resume_workload_factor",
        ),
        (
            r#"{"force_resume_engine_grace_seconds":-1}"#,
            "force_resume_engine_grace_seconds",
        ),
        (
            r#"{"cross_rank_min_wait_ratio":-0.5}"#,
            "cross_rank_min_wait_ratio",
        ),
        (
            r#"{"miss_impact_backlog_weight":-1}"#,
            "miss_impact_backlog_weight",
        ),
        (r#"{"finished_idle_ratio":-0.5}"#, "finished_idle_ratio"),
        (
            r#"{"adaptive_overcommit_max_ratio":-0.1}"#,
            "adaptive_overcommit_max_ratio",
        ),
        (
            r#"{"adaptive_overcommit_step_ratio":-0.01}"#,
            "adaptive_overcommit_step_ratio",
        ),
        (
            r#"{"adaptive_overcommit_wait_ratio":-1}"#,
            "adaptive_overcommit_wait_ratio",
        ),
        (
            r#"{"adaptive_overcommit_max_rounds":-1}"#,
            "adaptive_overcommit_max_rounds",
        ),
        (
            r#"{"hold_free_admission_slack_ratio":-0.1}"#,
            "hold_free_admission_slack_ratio",
        ),
        (
            r#"{"hold_free_admission_slack_ratio":1.5}"#,
            "hold_free_admission_slack_ratio",
        ),
        (
            r#"{"growth_reserve_min_rounds":-1}"#,
            "growth_reserve_min_rounds",
        ),
        (
            r#"{"new_program_demand_aging_seconds":-1}"#,
            "new_program_demand_aging_seconds",
        ),
        (
            r#"{"new_program_demand_aging_seconds":1e9}"#,
            "new_program_demand_aging_seconds",
        ),
        (
            r#"{"resume_most_turns_first_min_queued_ratio":-0.5}"#,
            "resume_most_turns_first_min_queued_ratio",
        ),
        (
            r#"{"resume_most_turns_first_min_queued_ratio":1001}"#,
            "resume_most_turns_first_min_queued_ratio",
        ),
        (r#"{"queue_backfill_depth":1025}"#, "queue_backfill_depth"),
        (r#"{"kind_size_tier_ratio":1}"#, "kind_size_tier_ratio"),
        (r#"{"kind_size_tier_ratio":2e6}"#, "kind_size_tier_ratio"),
        (r#"{"resume_order":"lifo"}"#, "unknown variant"),
        (r#"{"acting_ttl_cost":"minutes"}"#, "unknown variant"),
        (r#"{"acting_ttl_hold":"always"}"#, "unknown variant"),
        (r#"{"no_such_field":1}"#, "no_such_field"),
    ];
    for (json, want) in cases {
        let e = parse(json).expect_err(json);
        assert!(e.contains(want), "{json}: {e}");
    }
}
