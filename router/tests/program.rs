//! Program scheduling through the data plane, against vllm-sim over loopback.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use program_router::config::{AgenticContextMode, ProgramSchedulingConfig, RouterConfig};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

fn program_body(program: &str, words: usize, ctx_extra: Value) -> String {
    let mut ctx = json!({"program_id": program, "task_id": "t"});
    if let (Some(c), Some(extra)) = (ctx.as_object_mut(), ctx_extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "w ".repeat(words)}],
        "max_tokens": 4,
        "vllm_xargs": {"agentic_context": ctx},
    })
    .to_string()
}

async fn setup(ps: ProgramSchedulingConfig) -> (vllm_sim::server::Spawned, Router) {
    let s = sim(&["--time-scale", "20"]).await;
    let cfg = RouterConfig {
        program_scheduling: Some(ps),
        agentic_context: AgenticContextMode::Strip,
        ..workers(&[s.base()], 1)
    };
    let r = router(cfg).await;
    (s, r)
}

/// ~1,000-byte prompts estimate to ~250 tokens; capacity 400 fits one Program at a time.
fn one_program_fits() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(400),
        decode_buffer_tokens: 10,
        ..Default::default()
    }
}

async fn diagnostics(c: &HttpClient, r: &Router) -> Value {
    get(c, &r.url("/scheduling/diagnostics")).await.json()
}

/// Program "a" is served and keeps its KV for `ttl` seconds of tool time; "b" is then sent in the
/// background and is retained behind it (checked). Returns b's pending reply.
async fn hold_a_then_retain_b(
    c: &HttpClient,
    r: &Router,
    ttl: f64,
) -> tokio::task::JoinHandle<Reply> {
    let a = post(
        c,
        &r.url(CHAT),
        &program_body("prog-a", 500, json!({"kv_retention_ttl_seconds": ttl})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let url = r.url(CHAT);
    let c2 = client();
    let b =
        tokio::spawn(async move { post(&c2, &url, &program_body("prog-b", 500, json!({}))).await });
    assert!(
        eventually(2.0, || async {
            diagnostics(c, r).await["retained_requests"] == 1
        })
        .await,
        "b is retained"
    );
    b
}

#[tokio::test]
async fn retains_under_pressure_then_releases_when_the_ttl_ends() {
    let (_s, r) = setup(one_program_fits()).await;
    let c = client();
    // a holds its KV for 1 s of tool time; b must wait in the RequestPool.
    let b = hold_a_then_retain_b(&c, &r, 1.0).await;
    let d = diagnostics(&c, &r).await;
    let rank = &d["ranks"][0];
    assert_eq!(rank["router_active_acting_programs"], 1, "{d}");
    assert_eq!(rank["router_queued_requests"], 1);
    assert_eq!(rank["capacity_source"], "configured");
    let progs = rank["programs"].as_array().expect("programs");
    let pa = progs
        .iter()
        .find(|p| p["program"] == "prog-a")
        .expect("prog-a listed");
    assert_eq!(pa["status"], "acting");
    assert!(pa["ttl_remaining_seconds"].as_f64().expect("ttl") > 0.0);
    let started = std::time::Instant::now();
    let b = b.await.expect("join");
    assert_eq!(b.status, 200, "{}", b.text());
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "b waited for a's TTL"
    );
    let d = diagnostics(&c, &r).await;
    assert_eq!(d["retained_requests"], 0);
    let text = get_metrics(&c, &r).await;
    assert!(
        metric_in(
            &text,
            "vllm_router_agent_aware_transitions_total",
            &[("transition", "ttl_expired")]
        ) >= 1.0
    );
    assert!(metric_in(&text, "vllm_router_agent_aware_queue_wait_seconds", &[]) >= 2.0);
    // Admission capacity snapshots: one per admission, the ledger ratio within the capacity.
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_admission_demand_tokens_count",
            &[]
        ),
        2.0
    );
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_admission_used_ratio_count",
            &[]
        ),
        2.0
    );
    let overfill = text
        .lines()
        .find(|l| l.starts_with("vllm_router_agent_aware_admission_used_ratio_bucket{le=\"1\""));
    assert!(
        overfill.is_some_and(|l| l.ends_with(" 2")),
        "no admission overfilled the rank: {overfill:?}"
    );
}

#[tokio::test]
async fn queue_timeout_answers_504() {
    let ps = ProgramSchedulingConfig {
        queue_timeout_seconds: 0.5,
        force_resume_timeout_seconds: 0.3,
        ..one_program_fits()
    };
    let (_s, r) = setup(ps).await;
    let c = client();
    let a = post(
        &c,
        &r.url(CHAT),
        &program_body("prog-a", 500, json!({"kv_retention_ttl_seconds": 10.0})),
    )
    .await;
    assert_eq!(a.status, 200);
    let b = post(&c, &r.url(CHAT), &program_body("prog-b", 500, json!({}))).await;
    assert_eq!(b.status, 504, "{}", b.text());
    assert_eq!(b.json()["error"]["code"], "queue_timeout");
    // a's next turn inside its TTL is served at once.
    let a2 = post(
        &c,
        &r.url(CHAT),
        &program_body("prog-a", 520, json!({"kv_retention_ttl_seconds": 10.0})),
    )
    .await;
    assert_eq!(a2.status, 200);
}

#[tokio::test]
async fn a_drain_answers_requests_still_retained_at_its_midpoint_with_503() {
    let s = sim(&["--time-scale", "20"]).await;
    let mut cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig {
            // Nothing resumes b on its own for a while.
            force_resume_timeout_seconds: 20.0,
            force_resume_workload_factor: 0.0,
            ..one_program_fits()
        }),
        agentic_context: AgenticContextMode::Strip,
        ..workers(&[s.base()], 1)
    };
    cfg.limits.drain_timeout_secs = 1.0;
    let mut r = router(cfg).await;
    let c = client();
    // b waits behind a's 30 s TTL: the drain must answer it, not leave it to be cut.
    let b = hold_a_then_retain_b(&c, &r, 30.0).await;
    let started = std::time::Instant::now();
    r.server.stop();
    let b = b.await.expect("join");
    let waited = started.elapsed();
    assert_eq!(b.status, 503, "{}", b.text());
    assert_eq!(b.json()["error"]["code"], "shutting_down");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "answered at half the 1 s drain timeout, after {waited:?}"
    );
    r.server.stopped().await;
    let d = r
        .state
        .applied
        .load()
        .program
        .as_ref()
        .expect("on")
        .diagnostics();
    assert_eq!(d.retained_requests, 0, "b left the RequestPool");
}

#[tokio::test]
async fn a_tuning_reload_keeps_programs_and_admits_retained_requests_that_now_fit() {
    let (_s, r) = setup(one_program_fits()).await;
    let c = client();
    // b waits behind a's 30 s TTL in a rank that fits one Program.
    let b = hold_a_then_retain_b(&c, &r, 30.0).await;
    let mut cfg = r.state.applied.load().config.clone();
    if let Some(ps) = cfg.program_scheduling.as_mut() {
        ps.token_capacity_per_dp_rank = Some(4000);
        ps.max_acting_ttl_seconds = 45.0;
    }
    assert!(r.state.apply(cfg).expect("valid"));
    // Admitted at once under the new capacity, not refused as `reconfigured`.
    let b = tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .expect("b admitted by the reload")
        .expect("join");
    assert_eq!(b.status, 200, "{}", b.text());
    let d = diagnostics(&c, &r).await;
    let rank = &d["ranks"][0];
    assert_eq!(rank["configured_token_capacity"], 4000, "{d}");
    let pa = rank["programs"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["program"] == "prog-a"))
        .cloned()
        .unwrap_or_else(|| panic!("prog-a kept its binding and TTL: {d}"));
    assert_eq!(pa["status"], "acting", "{pa}");
    // A change to the state's shape starts afresh: what was held is gone.
    let mut cfg = r.state.applied.load().config.clone();
    if let Some(ps) = cfg.program_scheduling.as_mut() {
        ps.binding_only = true;
    }
    assert!(r.state.apply(cfg).expect("valid"));
    let d = diagnostics(&c, &r).await;
    assert_eq!(d["binding_only"], true, "{d}");
    assert_eq!(
        d["ranks"][0]["programs"].as_array().map(Vec::len),
        Some(0),
        "{d}"
    );
}

#[tokio::test]
async fn a_client_that_leaves_the_pool_is_forgotten() {
    let (_s, r) = setup(one_program_fits()).await;
    let c = client();
    post(
        &c,
        &r.url(CHAT),
        &program_body("prog-a", 500, json!({"kv_retention_ttl_seconds": 30.0})),
    )
    .await;
    let req = hyper::Request::post(r.url(CHAT))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(program_body(
            "prog-b",
            500,
            json!({}),
        ))))
        .expect("req");
    let waiting = tokio::spawn(async move { client().request(req).await.map(|r| r.status()) });
    assert!(
        eventually(2.0, || async {
            diagnostics(&c, &r).await["retained_requests"] == 1
        })
        .await
    );
    waiting.abort();
    assert!(
        eventually(2.0, || async {
            diagnostics(&c, &r).await["retained_requests"] == 0
        })
        .await,
        "the cancelled request left the pool"
    );
}

#[tokio::test]
async fn identity_free_requests_take_the_native_path_and_bad_identity_is_400() {
    let (s, r) = setup(ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(400),
        ..Default::default()
    })
    .await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(post(&c, &r.url(CHAT), &chat("plain", 2)).await.status, 200);
    }
    let d = diagnostics(&c, &r).await;
    assert!(
        d["ranks"][0]["programs"]
            .as_array()
            .expect("programs")
            .is_empty(),
        "{d}"
    );
    let bad = json!({"messages": [{"role": "user", "content": "x"}], "vllm_xargs": {"agentic_context": {"task_id": "no program id"}}});
    let resp = post(&c, &r.url(CHAT), &bad.to_string()).await;
    assert_eq!(resp.status, 400);
    assert!(resp.text().contains("program_id"), "{}", resp.text());
    // The JSON-string form of the context works too, and the simulator never sees the context.
    let s_form = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
        "vllm_xargs": {"agentic_context": json!({"program_id": "string-form"}).to_string()}});
    assert_eq!(
        post(&c, &r.url(CHAT), &s_form.to_string()).await.status,
        200
    );
    let d = diagnostics(&c, &r).await;
    let listed: Vec<&str> = d["ranks"][0]["programs"]
        .as_array()
        .expect("p")
        .iter()
        .filter_map(|p| p["program"].as_str())
        .collect();
    assert_eq!(listed, ["string-form"]);
    drop(s);
}

#[tokio::test]
async fn capacity_is_read_from_the_backend_when_not_configured() {
    let s = sim(&[
        "--time-scale",
        "20",
        "--num-gpu-blocks",
        "64",
        "--max-model-len",
        "1024",
    ])
    .await; // 1,024 tokens per rank
    let cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig {
            metrics_interval_seconds: 0.1,
            ..Default::default()
        }),
        ..workers(&[s.base()], 1)
    };
    let r = router(cfg).await;
    let c = client();
    let ok = eventually(3.0, || async {
        let d = diagnostics(&c, &r).await;
        d["ranks"][0]["capacity_source"] == "backend_cache_config"
            && d["ranks"][0]["token_capacity"] == 1024
    })
    .await;
    assert!(ok, "{}", diagnostics(&c, &r).await);
    assert_eq!(
        diagnostics(&c, &r).await["ranks"][0]["observation_fresh"],
        true
    );
}

#[tokio::test]
async fn streamed_program_requests_report_usage_to_the_scheduler() {
    let (_s, r) = setup(ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(100_000),
        ..Default::default()
    })
    .await;
    let c = client();
    let mut body: Value =
        serde_json::from_str(&program_body("streamer", 100, json!({}))).expect("json");
    body["stream"] = json!(true);
    let resp = c
        .request(
            hyper::Request::post(r.url(CHAT))
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("req"),
        )
        .await
        .expect("resp");
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec(),
    )
    .expect("utf8");
    assert!(!text.contains("\"usage\""));
    let d = diagnostics(&c, &r).await;
    let p = &d["ranks"][0]["programs"][0];
    assert_eq!(p["program"], "streamer");
    assert!(
        p["context_tokens"].as_u64().expect("context") > 100,
        "usage reached the scheduler: {p}"
    );
}

/// The rank of `d` whose target lives at `base`.
fn rank_at<'a>(d: &'a Value, base: &str) -> &'a Value {
    d["ranks"]
        .as_array()
        .and_then(|rs| rs.iter().find(|x| x["base_url"] == base))
        .unwrap_or_else(|| panic!("no rank at {base}: {d}"))
}

/// The router's applied configuration with `urls` as its workers (listeners unchanged).
fn with_workers(r: &Router, urls: &[String]) -> RouterConfig {
    RouterConfig {
        workers: workers(urls, 1).workers,
        ..r.state.applied.load().config.clone()
    }
}

async fn served(c: &HttpClient, base: &str) -> f64 {
    metric(c, base, "vllm:request_success_total", &[]).await
}

#[tokio::test]
async fn a_reload_that_changes_targets_keeps_programs_and_retained_requests() {
    let ps = ProgramSchedulingConfig {
        // 500-word prompts are ~510 tokens: a (held) and b (estimated at first) do not both fit.
        token_capacity_per_dp_rank: Some(700),
        decode_buffer_tokens: 10,
        // Rank-local: b must stay queued on s1 across the reload (with cross-rank resume the
        // new, empty rank would take it).
        global_queue: false,
        ..Default::default()
    };
    let s1 = sim(&["--time-scale", "20"]).await;
    let s2 = sim(&["--time-scale", "20"]).await;
    let config = |urls: &[String]| RouterConfig {
        program_scheduling: Some(ps.clone()),
        agentic_context: AgenticContextMode::Strip,
        ..workers(urls, 1)
    };
    let r = router(config(&[s1.base()])).await;
    let c = client();
    // a acts on s1 for 1.5 s of tool time; b waits behind it in the RequestPool.
    let b = hold_a_then_retain_b(&c, &r, 1.5).await;
    // A worker joins in front of s1, so s1's rank moves from index 0 to 1: nothing is lost.
    assert!(
        r.state
            .apply(with_workers(&r, &[s2.base(), s1.base()]))
            .expect("valid")
    );
    let d = diagnostics(&c, &r).await;
    assert_eq!(d["ranks"].as_array().map(Vec::len), Some(2), "{d}");
    assert_eq!(d["retained_requests"], 1, "b is still waiting: {d}");
    let on_s1 = rank_at(&d, &s1.base());
    assert_eq!(on_s1["router_active_acting_programs"], 1, "{d}");
    assert_eq!(on_s1["router_queued_requests"], 1, "{d}");
    // b is served on s1 (its home) once a's TTL lapses, not refused as `reconfigured`.
    let b = b.await.expect("join");
    assert_eq!(b.status, 200, "{}", b.text());
    assert_eq!(served(&c, &s1.base()).await, 2.0);
    assert_eq!(served(&c, &s2.base()).await, 0.0);
    // a's next turn holds s1 again, for 30 s of tool time.
    let a2 = post(
        &c,
        &r.url(CHAT),
        &program_body("prog-a", 520, json!({"kv_retention_ttl_seconds": 30.0})),
    )
    .await;
    assert_eq!(a2.status, 200, "{}", a2.text());
    assert_eq!(served(&c, &s1.base()).await, 3.0);
    // s1 leaves: a is re-homed to s2 and paused (its KV went with s1), visibly.
    assert!(
        r.state
            .apply(with_workers(&r, &[s2.base()]))
            .expect("valid")
    );
    let d = diagnostics(&c, &r).await;
    assert_eq!(d["ranks"].as_array().map(Vec::len), Some(1), "{d}");
    let pa = rank_at(&d, &s2.base())["programs"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["program"] == "prog-a"))
        .cloned()
        .unwrap_or_else(|| panic!("prog-a moved to s2: {d}"));
    assert_eq!(pa["status"], "paused", "{pa}");
    assert_eq!(pa["pause_reason"], "target_removed", "{pa}");
    let text = get_metrics(&c, &r).await;
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_transitions_total",
            &[("transition", "target_removed")]
        ),
        1.0
    );
    let target = format!("{}@0", s1.base());
    assert!(
        !text.contains(&format!("target=\"{target}\""))
            && !text.contains(&format!("target=\"{}\"", s1.base())),
        "series of the removed target are gone"
    );
    let a3 = post(
        &c,
        &r.url(CHAT),
        &program_body("prog-a", 540, json!({"kv_retention_ttl_seconds": 30.0})),
    )
    .await;
    assert_eq!(a3.status, 200, "{}", a3.text());
    assert_eq!(served(&c, &s2.base()).await, 1.0);
}

#[tokio::test]
async fn a_prefix_shared_between_programs_is_observed_and_reported() {
    let ps = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(100_000),
        ..Default::default()
    };
    let (_s, r) = setup(ps).await;
    let c = client();
    let system = "s ".repeat(400);
    let body = |program: &str| {
        json!({
            "model": "sim-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("task for {program}")},
            ],
            "max_tokens": 4,
            "vllm_xargs": {"agentic_context": {"program_id": program}},
        })
        .to_string()
    };
    for p in ["prog-a", "prog-b"] {
        let reply = post(&c, &r.url(CHAT), &body(p)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let d = diagnostics(&c, &r).await;
    let programs = d["ranks"][0]["programs"].as_array().expect("programs");
    let get = |name: &str| {
        programs
            .iter()
            .find(|p| p["program"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {d}"))
    };
    // a ran first: nothing was cached. b found the system prompt cached: shared, so not private.
    assert_eq!(get("prog-a")["shared_prefix_tokens"], 0, "{d}");
    let b = get("prog-b");
    let shared = b["shared_prefix_tokens"].as_u64().expect("shared");
    assert!(shared >= 300, "b shares the 400-token system prompt: {b}");
    assert!(b["shared_prefix_freshness_remaining_seconds"].as_f64() > Some(0.0));
    // Reported, but not yet discounted: the rank's growth window is still filling.
    assert_eq!(b["private_tokens"], b["logical_tokens"], "{b}");
    let rolling = &d["ranks"][0]["rolling"];
    assert_eq!(
        rolling["shared_prefix_freshness_seconds"], 100.0,
        "warm-up lifetime"
    );
    assert!(
        rolling["request_throughput_per_second"].as_f64() > Some(0.0),
        "{rolling}"
    );
    let text = get_metrics(&c, &r).await;
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_shared_prefix_observed_tokens_count",
            &[]
        ),
        2.0
    );
    assert!(
        metric_in(
            &text,
            "vllm_router_agent_aware_shared_prefix_observed_tokens_sum",
            &[]
        ) >= 300.0
    );
}

async fn get_metrics(c: &HttpClient, r: &Router) -> String {
    get(c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text()
}

#[tokio::test]
async fn a_program_request_with_no_worker_configured_gets_503() {
    let r = router(RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[], 1)
    })
    .await;
    let c = client();
    let reply = post(&c, &r.url(CHAT), &program_body("prog-a", 5, json!({}))).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert!(reply.json()["error"]["message"].is_string());
    // The router stays up and answers the next one the same way.
    let again = post(&c, &r.url(CHAT), &program_body("prog-b", 5, json!({}))).await;
    assert_eq!(again.status, 503);
}

/// Field names of vllm-router 0.1.17's `/scheduling/diagnostics` (from a captured sample), by
/// level: a user moving from it keeps every field.
const PEER_TOP: &[&str] = &[
    "enabled",
    "binding_only",
    "global_queue",
    "resume_order",
    "cross_rank_headroom_ratio",
    "retained_requests",
    "prediction_mode",
    "return_time_profile_keys",
    "output_length_profile_keys",
    "token_estimation",
    "ranks",
];
const PEER_RANK: &[&str] = &[
    "target_id",
    "base_url",
    "dp_rank",
    "configured_token_capacity",
    "router_estimated_used_tokens",
    "router_estimated_headroom_tokens",
    "vllm_usage_scaled_tokens",
    "observed_active_reasoning_tokens",
    "observed_active_program_tokens",
    "tracked_active_reasoning_requests",
    "observed_router_active_reasoning_programs",
    "observed_router_active_reasoning_requests",
    "active_program_token_delta_since_observation",
    "future_pause_relief_tokens",
    "active_acting_private_tokens",
    "router_minus_vllm_used_tokens",
    "router_active_programs",
    "router_active_reasoning_programs",
    "router_active_acting_programs",
    "router_paused_reasoning_programs",
    "router_paused_acting_programs",
    "router_in_flight_requests",
    "router_queued_programs",
    "router_queued_requests",
    "vllm_kv_cache_usage",
    "vllm_running_requests",
    "vllm_waiting_requests",
    "observation_age_seconds",
    "observation_fresh",
    "capacity_accounting_source",
    "rolling",
    "programs",
];
const PEER_ROLLING: &[&str] = &[
    "request_samples",
    "continuity_samples",
    "ttl_pause_samples",
    "request_window_complete",
    "continuity_window_complete",
    "avg_prompt_tokens",
    "avg_completion_tokens",
    "avg_cached_prompt_tokens",
    "avg_cached_prompt_ratio",
    "avg_context_growth_tokens",
    "avg_e2e_seconds",
    "avg_decode_seconds",
    "avg_router_queue_seconds",
    "avg_rounds_since_ttl_pause",
    "request_throughput_per_second",
    "fitted_acting_ttl_seconds",
];
const PEER_PROGRAM: &[&str] = &[
    "program",
    "generation",
    "state",
    "status",
    "expected_resume",
    "task_id",
    "session_id",
    "agent_id",
    "parent_program_id",
    "root_program_id",
    "blocks_parent",
    "agent_role",
    "spawn_reason",
    "workflow_profile_id",
    "profile_version",
    "step_id",
    "request_id",
    "request_priority",
    "request_deadline_seconds",
    "expected_output_tokens",
    "kv_retention_ttl_seconds",
    "home_target",
    "last_target",
    "placement",
    "estimated_context_tokens",
    "shared_prefix_tokens",
    "shared_prefix_freshness_remaining_seconds",
    "logical_tokens",
    "private_tokens",
    "in_flight_requests",
    "waiting_requests",
    "segment_served_rounds",
    "rounds_since_activation",
    "rounds_since_ttl_pause",
    "pause_when_idle",
    "pause_reason",
    "acting_seconds",
    "queued_seconds",
    "ttl_remaining_seconds",
    "force_resume_remaining_seconds",
    "force_resume_timeout_seconds",
    "force_resume_active_remaining_rounds",
    "force_resume_pool_remaining_rounds",
    "force_resume_request_throughput_per_second",
    "predicted_return_probability",
    "predicted_ttl_seconds",
    "return_prediction_support",
    "return_prediction_online_support",
    "return_prediction_backoff_level",
    "return_prediction_source",
    "last_return_actual_seconds",
    "predicted_output_tokens",
    "predicted_output_p50",
    "predicted_output_p95",
    "predicted_output_p99",
    "output_prediction_support",
    "output_prediction_online_support",
    "output_prediction_backoff_level",
    "output_prediction_source",
    "output_prediction_mature",
    "last_output_actual_tokens",
];

fn missing(v: &Value, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| v.get(**n).is_none())
        .map(|n| n.to_string())
        .collect()
}

#[tokio::test]
async fn diagnostics_cover_the_peers_fields() {
    let (_s, r) = setup(one_program_fits()).await;
    let c = client();
    // a acts for 30 s of tool time; b waits behind it.
    let b = hold_a_then_retain_b(&c, &r, 30.0).await;
    let d = diagnostics(&c, &r).await;
    assert_eq!(missing(&d, PEER_TOP), Vec::<String>::new(), "{d}");
    let rank = &d["ranks"][0];
    assert_eq!(missing(rank, PEER_RANK), Vec::<String>::new(), "{rank}");
    assert_eq!(
        missing(&rank["rolling"], PEER_ROLLING),
        Vec::<String>::new()
    );
    let progs = rank["programs"].as_array().expect("programs");
    assert_eq!(progs.len(), 2, "{rank}");
    for p in progs {
        assert_eq!(missing(p, PEER_PROGRAM), Vec::<String>::new(), "{p}");
    }
    // The values say what happened: a ran once (4 output tokens) and is acting on its TTL; b
    // waits; nothing is predicted here.
    assert_eq!(d["prediction_mode"], "off");
    assert_eq!(
        d["token_estimation"][0]["tokens_per_byte"],
        d["token_estimate_coefficient"]
    );
    assert_eq!(rank["router_queued_programs"], 1);
    assert_eq!(rank["rolling"]["request_samples"], 1);
    assert_eq!(rank["rolling"]["avg_completion_tokens"], 4.0);
    assert!(rank["rolling"]["avg_e2e_seconds"].as_f64().expect("e2e") > 0.0);
    assert_eq!(
        rank["active_acting_private_tokens"],
        rank["router_estimated_used_tokens"]
    );
    let find = |name: &str| {
        progs
            .iter()
            .find(|p| p["program"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {rank}"))
    };
    let a = find("prog-a");
    assert_eq!(a["status"], "acting");
    assert_eq!(a["kv_retention_ttl_seconds"], 30.0);
    assert_eq!(a["predicted_ttl_seconds"], 30.0);
    assert_eq!(a["last_output_actual_tokens"], 4);
    assert_eq!(a["home_target"], rank["target_id"]);
    assert_eq!(a["last_target"], rank["target_id"]);
    assert_eq!(a["placement"], "binding");
    assert!(a["acting_seconds"].as_f64().expect("acting") >= 0.0);
    assert!(a["predicted_output_tokens"].is_null());
    let wb = find("prog-b");
    assert_eq!(wb["waiting_requests"], 1);
    assert!(wb["queued_seconds"].as_f64().expect("queued") > 0.0);
    assert_eq!(wb["force_resume_timeout_seconds"], 300.0);
    assert_eq!(wb["force_resume_pool_remaining_rounds"], 1.0);
    b.abort();
}

#[tokio::test]
async fn each_client_key_has_its_own_programs() {
    // Two teams with keys of their own both call their session "s1"; the workers' key is
    // shared by everyone and so names no one.
    let s = sim(&["--time-scale", "20"]).await;
    let team_a = "sk-team-a";
    let cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        client_api_keys: Some(vec![team_a.into(), "sk-team-b".into()]),
        api_key: Some("platform-key".into()),
        ..workers(&[s.base()], 1)
    };
    let r = router(cfg).await;
    let c = client();
    let body = program_body("s1", 10, json!({"parent_program_id": "root"}));
    for key in [team_a, "sk-team-b"] {
        let auth = format!("Bearer {key}");
        let resp = send(&c, "POST", &r.url(CHAT), &body, &[("authorization", &auth)]).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    // Diagnostics: a team sees its own Programs, the platform's key (the workers') all of them,
    // and no key nothing.
    assert_eq!(get(&c, &r.url("/scheduling/diagnostics")).await.status, 401);
    let as_key = |key: &'static str| {
        let (c, url) = (c.clone(), r.url("/scheduling/diagnostics"));
        async move {
            let auth = format!("Bearer {key}");
            send(&c, "GET", &url, "", &[("authorization", &auth)])
                .await
                .json()
        }
    };
    let own = as_key(team_a).await;
    let own: Vec<&str> = own["ranks"][0]["programs"]
        .as_array()
        .expect("programs")
        .iter()
        .filter_map(|p| p["program"].as_str())
        .collect();
    // Keys listed without names go by their position in the list, never by their content.
    let name = |k: &str| if k == team_a { "key-0" } else { "key-1" };
    assert_eq!(own, [format!("{}/s1", name(team_a))]);
    let d = as_key("platform-key").await;
    let programs = d["ranks"][0]["programs"].as_array().expect("programs");
    let mut listed: Vec<(String, String)> = programs
        .iter()
        .map(|p| {
            (
                p["program"].as_str().unwrap_or_default().to_string(),
                p["parent_program_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    listed.sort();
    let mut want = vec![
        (
            format!("{}/s1", name(team_a)),
            format!("{}/root", name(team_a)),
        ),
        (
            format!("{}/s1", name("sk-team-b")),
            format!("{}/root", name("sk-team-b")),
        ),
    ];
    want.sort();
    assert_eq!(listed, want, "{d}");

    // With only the workers' key, ids stay as the client sent them.
    let keyed = sim(&["--time-scale", "20", "--api-key", "worker"]).await;
    let cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        api_key: Some("worker".into()),
        ..workers(&[keyed.base()], 1)
    };
    let r = router(cfg).await;
    let resp = send(
        &c,
        "POST",
        &r.url(CHAT),
        &body,
        &[("authorization", "Bearer worker")],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // With a key configured, diagnostics need one.
    assert_eq!(get(&c, &r.url("/scheduling/diagnostics")).await.status, 401);
    let platform = [("authorization", "Bearer worker")];
    let d = send(&c, "GET", &r.url("/scheduling/diagnostics"), "", &platform)
        .await
        .json();
    assert_eq!(d["ranks"][0]["programs"][0]["program"], "s1", "{d}");
}

#[tokio::test]
async fn claude_code_messages_and_codex_responses_are_program_scheduled() {
    // Claude Code speaks the Anthropic Messages API and Codex the Responses API; with `auto`
    // their session headers make Programs, and each API's own usage reaches the scheduler.
    let (_s, r) = setup(ProgramSchedulingConfig {
        program_scheduling_enable_key: program_router::config::program::EnableKey::Auto,
        token_capacity_per_dp_rank: Some(100_000),
        ..Default::default()
    })
    .await;
    let c = client();
    let words = "w ".repeat(100);
    let messages = json!({"model": "sim-model", "max_tokens": 4, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": words}]}]});
    let resp = send(
        &c,
        "POST",
        &r.url("/v1/messages"),
        &messages.to_string(),
        &[("x-claude-code-session-id", "cc-1")],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let text = resp.text();
    // Relayed as the backend sent it: the usage event stays (the client's API always has it).
    assert!(
        text.contains("event: message_delta") && text.contains("\"output_tokens\":4"),
        "{text}"
    );
    assert!(
        text.trim_end()
            .ends_with(r#"data: {"type":"message_stop"}"#),
        "{text}"
    );
    let responses = json!({"model": "sim-model", "max_output_tokens": 3,
        "instructions": "You are Codex.", "input": words});
    let resp = send(
        &c,
        "POST",
        &r.url("/v1/responses"),
        &responses.to_string(),
        &[("session-id", "codex-1")],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["usage"]["output_tokens"], 3);

    let d = diagnostics(&c, &r).await;
    let programs = d["ranks"][0]["programs"].as_array().expect("programs");
    for id in ["cc-1", "codex-1"] {
        let p = programs
            .iter()
            .find(|p| p["program"] == id)
            .unwrap_or_else(|| panic!("{id} is a Program: {d}"));
        assert!(
            p["context_tokens"].as_u64().expect("context") > 100,
            "{id}: its usage reached the scheduler: {p}"
        );
    }
    let m = get_metrics(&c, &r).await;
    for route in ["/v1/messages", "/v1/responses"] {
        assert_eq!(
            metric_in(&m, "vllm_router_requests_total", &[("route", route)]),
            1.0,
            "{route}"
        );
    }
    assert_eq!(
        metric_in(&m, "vllm_router_tokens_total", &[("kind", "completion")]),
        7.0,
        "both APIs' output tokens are counted"
    );
}

#[tokio::test]
async fn a_session_header_program_idle_past_every_tool_call_counts_as_finished() {
    // `auto` with `x-session-id`: the client never says `expected_resume: false`. One interval
    // of ~0.4 s matures the evidence (`ttl_min_samples: 1`); no acting TTL, so each completion
    // pauses the Program, which then counts as finished once idle for longer than that.
    let (_s, r) = setup(ProgramSchedulingConfig {
        program_scheduling_enable_key: program_router::config::program::EnableKey::Auto,
        token_capacity_per_dp_rank: Some(100_000),
        ttl_min_samples: Some(1),
        max_acting_ttl_seconds: 0.0,
        ..Default::default()
    })
    .await;
    let c = client();
    let turn = || async {
        let resp = send(
            &c,
            "POST",
            &r.url(CHAT),
            &chat("tool result", 2),
            &[("x-session-id", "s1")],
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    };
    turn().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    turn().await;
    let finished = |d: &Value| {
        (
            d["ranks"][0]["router_finished_programs"].as_u64(),
            d["counters"]["idle_finishes"].as_u64(),
        )
    };
    assert!(
        eventually(5.0, || async {
            finished(&diagnostics(&c, &r).await) == (Some(1), Some(1))
        })
        .await,
        "{}",
        diagnostics(&c, &r).await
    );
    let m = get_metrics(&c, &r).await;
    assert_eq!(
        metric_in(
            &m,
            "vllm_router_agent_aware_transitions_total",
            &[("transition", "idle_finish")]
        ),
        1.0
    );
    // Its next request makes it live again, on the same rank.
    turn().await;
    let d = diagnostics(&c, &r).await;
    assert_eq!(finished(&d), (Some(0), Some(1)), "{d}");
}
