//! Program scheduling across reloads that change targets, and shared prefixes observed.

use super::*;

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
    assert_eq!(pa["state"], "paused", "{pa}");
    assert_eq!(
        pa["status"], "acting",
        "the phase it paused from, as the peer reports it: {pa}"
    );
    assert_eq!(pa["pause_reason"], "target_removed", "{pa}");
    let text = get_metrics(&c, &r).await;
    assert_eq!(
        metric_in(
            &text,
            "vllm_router_agent_aware_transitions_total",
            &[("reason", "target_removed")]
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
    let (_s, r) = setup(roomy()).await;
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
