//! What clients see of Program scheduling: diagnostics, per-key Programs, Claude Code and Codex sessions.

use super::*;

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
    assert!(
        rank["router_queued_demand_tokens"].as_u64().expect("ours") > 0,
        "{rank}"
    );
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
        ..roomy()
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
        ttl_min_samples: Some(1),
        max_acting_ttl_seconds: 0.0,
        ..roomy()
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
            &[("reason", "idle_finish")]
        ),
        1.0
    );
    // Its next request makes it live again, on the same rank.
    turn().await;
    let d = diagnostics(&c, &r).await;
    assert_eq!(finished(&d), (Some(0), Some(1)), "{d}");
}
