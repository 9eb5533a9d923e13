//! Program scheduling through the data plane, against vllm-sim over loopback.

#[path = "../common/mod.rs"]
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

/// Program scheduling with room for every request the tests send (100K tokens per rank).
fn roomy() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(100_000),
        ..Default::default()
    }
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
            &[("reason", "ttl_expired")]
        ) >= 1.0
    );
    assert!(
        metric_in(
            &text,
            "vllm_router_agent_aware_queue_wait_seconds_count",
            &[]
        ) >= 2.0
    );
    // Admission capacity snapshots: one per admission, the ledger ratio within the capacity.
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_admission_required_tokens_count",
            &[]
        ),
        2.0
    );
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_admission_projected_pressure_ratio_count",
            &[]
        ),
        2.0
    );
    let within: f64 = program_router::observe::scrape::samples(&text)
        .filter(|s| s.name == "vllm_router_agent_aware_admission_projected_pressure_ratio_bucket")
        .filter(|s| s.label("le") == Some("1"))
        .map(|s| s.value)
        .sum();
    assert_eq!(within, 2.0, "no admission overfilled the rank");
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
    let (_s, r) = setup(roomy()).await;
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

async fn get_metrics(c: &HttpClient, r: &Router) -> String {
    get(c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text()
}

mod clients;
mod estimate;
mod events;
mod kinds;
mod metrics_parity;
mod reloads;
mod tools;
