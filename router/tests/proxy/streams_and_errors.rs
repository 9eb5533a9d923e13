//! Streaming, cancellation, retries, limits, bad input and client keys through the router.

use super::*;

#[tokio::test]
async fn streamed_bytes_equal_the_direct_stream() {
    let direct = sim(&["--instant", "--seed", "7"]).await;
    let behind = sim(&["--instant", "--seed", "7"]).await;
    let r = router(workers(&[behind.base()], 1)).await;
    let c = client();
    let body = json!({"messages": [{"role": "user", "content": "same bytes"}], "max_tokens": 6, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let a = post(&c, &direct.url(CHAT), &body).await.text();
    let b = post(&c, &r.url(CHAT), &body).await.text();
    // Timestamps and ids (random per server) differ; every other byte is the same.
    let norm = |s: &str| {
        let s = s
            .split("\"created\":")
            .map(|p| p.trim_start_matches(char::is_numeric))
            .collect::<Vec<_>>()
            .join("");
        s.split("\"id\":\"")
            .map(|p| p.split_once('"').map_or(p, |(_, rest)| rest))
            .collect::<Vec<_>>()
            .join("")
    };
    assert!(a.contains("\"id\":\"chatcmpl_sim"), "{a}");
    assert_eq!(norm(&a), norm(&b));
    // A client that did not ask for usage gets no usage chunk, though the router asked for one.
    let body = json!({"messages": [{"role": "user", "content": "no usage"}], "max_tokens": 3, "stream": true}).to_string();
    let t = post(&c, &r.url(CHAT), &body).await.text();
    assert!(!t.contains("\"usage\""), "{t}");
    assert!(t.ends_with("data: [DONE]\n\n"));
    // However the client spells "no usage", it sees exactly what the backend would send it.
    let _ = post(&c, &direct.url(CHAT), &body).await; // keeps the two simulators' ids in step
    for options in [
        json!(null),
        json!({"include_usage": false}),
        json!({"continuous_usage_stats": true}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "options"}], "max_tokens": 2,
            "stream": true, "stream_options": options})
        .to_string();
        let a = post(&c, &direct.url(CHAT), &body).await.text();
        let b = post(&c, &r.url(CHAT), &body).await.text();
        assert!(!b.contains("\"usage\""), "{options}: {b}");
        assert_eq!(norm(&a), norm(&b), "{options}");
    }
    let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    assert_eq!(
        metric_in(&text, "vllm_router_tokens_total", &[("kind", "completion")]),
        15.0,
        "usage still counted"
    );
}

#[tokio::test]
async fn client_cancel_reaches_the_backend() {
    let s = sim(&[]).await; // real time: 1000 tokens take ~11 s
    let r = router(workers(&[s.base()], 1)).await;
    let c = client();
    let body = json!({"messages": [{"role": "user", "content": "long"}], "max_tokens": 1000, "stream": true}).to_string();
    let resp = c
        .request(
            hyper::Request::post(r.url(CHAT))
                .body(Full::new(Bytes::from(body)))
                .expect("req"),
        )
        .await
        .expect("resp");
    let mut b = resp.into_body();
    b.frame().await.expect("first chunk").expect("ok");
    assert_eq!(
        sim_metric(&c, &s, "vllm:num_requests_running", &[]).await,
        1.0
    );
    let running = || async {
        let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
            .await
            .text();
        metric_in(&text, "vllm_router_running_requests", &[])
    };
    assert_eq!(running().await, 1.0, "the stream is in flight");
    drop(b);
    let ok = eventually(3.0, || async {
        sim_metric(
            &c,
            &s,
            "vllm:request_success_total",
            &[("finished_reason", "abort")],
        )
        .await
            == 1.0
    })
    .await;
    assert!(ok, "the simulator saw the abort");
    assert_eq!(r.state.applied.load().targets.targets[0].in_flight(), 0);
    assert_eq!(running().await, 0.0);
}

#[tokio::test]
async fn retries_503_and_connect_errors_without_duplicating_generations() {
    let bad = sim(&["--instant", "--fail-rate", "1", "--fail-status", "503"]).await;
    let good = sim(&["--instant"]).await;
    let mut cfg = workers(&[bad.base(), good.base(), "http://127.0.0.1:9".into()], 1);
    cfg.policy.kind = PolicyKind::RoundRobin;
    cfg.retry.initial_backoff_ms = 1;
    cfg.retry.max_backoff_ms = 5;
    cfg.circuit_breaker.failure_threshold = 3;
    cfg.health.interval_secs = 3600.0;
    let r = router(cfg).await;
    let c = client();
    let circuit = |st: &serde_json::Value, id: &str| {
        st["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .find(|t| t["id"] == id)
            .expect("target")["circuit"]
            .clone()
    };
    let mut sent = 0;
    loop {
        let resp = post(&c, &r.url(CHAT), &chat(&format!("r{sent}"), 2)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        sent += 1;
        let st = get(&c, &r.url("/status")).await.json();
        let dead = st["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .find(|t| t["id"] == "http://127.0.0.1:9")
            .cloned();
        // The dead port is excluded by its health check or by its breaker, whichever comes first.
        let dead_out = dead.is_some_and(|d| d["routable"] == false);
        if circuit(&st, &bad.base()) == "open" && dead_out {
            break;
        }
        assert!(
            sent < 60,
            "the 503 target's circuit opens and the dead port leaves rotation: {st}"
        );
    }
    // Every request generated exactly once, on the good server.
    assert_eq!(
        sim_metric(
            &c,
            &good,
            "vllm:request_success_total",
            &[("finished_reason", "length")]
        )
        .await,
        f64::from(sent)
    );
    let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    assert!(metric_in(&text, "vllm_router_retries_total", &[]) > 0.0);
    assert_eq!(
        metric_in(&text, "vllm_router_cb_state", &[("worker", &bad.base())]),
        1.0
    );
    // With both circuits open, requests go straight to the good server.
    let retries = metric_in(&text, "vllm_router_retries_total", &[]);
    for i in 0..5 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat(&format!("after{i}"), 1))
                .await
                .status,
            200
        );
    }
    let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    assert_eq!(metric_in(&text, "vllm_router_retries_total", &[]), retries);
    let st = get(&c, &r.url("/status")).await.json();
    assert_eq!(circuit(&st, &good.base()), "closed");
}

#[tokio::test]
async fn a_stream_cut_after_it_started_is_not_replayed() {
    let cut = sim(&[
        "--fail-rate",
        "1",
        "--fail-after-tokens",
        "2",
        "--time-scale",
        "5",
    ])
    .await;
    let good = sim(&["--instant"]).await;
    // Targets are ordered by URL and round robin starts at the first: "127.0.0.1" sorts before
    // "localhost", so the first request goes to the cutting server.
    let good_url = format!("http://localhost:{}", good.addr.port());
    let mut cfg = workers(&[cut.base(), good_url], 1);
    cfg.policy.kind = PolicyKind::RoundRobin;
    let r = router(cfg).await;
    let c = client();
    let body =
        json!({"messages": [{"role": "user", "content": "cut"}], "max_tokens": 20, "stream": true})
            .to_string();
    let resp = c
        .request(
            hyper::Request::post(r.url(CHAT))
                .body(Full::new(Bytes::from(body)))
                .expect("req"),
        )
        .await
        .expect("headers");
    assert_eq!(resp.status(), 200);
    let mut b = resp.into_body();
    let mut got = String::new();
    let mut failed = false;
    while let Some(f) = b.frame().await {
        match f {
            Ok(f) => got.push_str(&String::from_utf8_lossy(
                f.data_ref().map(|d| d.as_ref()).unwrap_or_default(),
            )),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    // The stream ends cleanly with an error event, so no client takes it for a finished one.
    assert!(!failed, "the stream ends, not cut: {got}");
    assert!(got.contains(r#""code":"upstream_disconnected""#), "{got}");
    assert!(!got.contains("[DONE]"));
    assert_eq!(
        sim_metric(&c, &good, "vllm:request_success_total", &[]).await,
        0.0,
        "no replay on the other server"
    );
}

#[tokio::test]
async fn limits_and_bad_input_get_openai_errors() {
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.max_payload_size = 2048;
    let r = router(cfg).await;
    let c = client();
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", CHAT, "{oops".into(), 400, "invalid_request"),
        ("POST", CHAT, "[1,2]".into(), 400, "invalid_request"),
        (
            "POST",
            CHAT,
            r#"{"stream":"yes"}"#.into(),
            400,
            "invalid_request",
        ),
        (
            "POST",
            CHAT,
            chat(&"y ".repeat(2000), 1),
            413,
            "payload_too_large",
        ),
        ("GET", CHAT, String::new(), 405, "method_not_allowed"),
        ("GET", "/nope", String::new(), 404, "not_found"),
        ("POST", "/status", String::new(), 405, "method_not_allowed"),
    ];
    for (method, path, body, status, code) in cases {
        let resp = send(&c, method, &r.url(path), &body, &[]).await;
        assert_eq!(resp.status, status, "{method} {path}: {}", resp.text());
        let j = resp.json();
        assert_eq!(j["error"]["code"], code, "{j}");
        assert!(
            j["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(j["error"]["param"].is_null(), "{j}");
        if status == 405 {
            let allow = if path == CHAT { "POST" } else { "GET" };
            assert_eq!(
                resp.headers.get("allow").map(|v| v.as_bytes()),
                Some(allow.as_bytes())
            );
        }
    }
    // The backend's own 4xx pass through untouched.
    let resp = post(
        &c,
        &r.url(CHAT),
        r#"{"model":"other","messages":[{"role":"user","content":"a"}]}"#,
    )
    .await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json()["error"]["type"], "NotFoundError");
    // Still serving.
    assert_eq!(post(&c, &r.url(CHAT), &chat("fine", 1)).await.status, 200);
    assert_eq!(
        get(&c, &r.url("/v1/models")).await.json()["data"][0]["id"],
        "sim-model"
    );
}

#[tokio::test]
async fn vllm_endpoints_outside_v1_pass_through_and_admin_ones_do_not() {
    let s = sim(&["--instant", "-d", "2"]).await;
    let r = router(workers(&[s.base()], 2)).await;
    let c = client();
    let direct = post(&c, &s.url("/tokenize"), r#"{"prompt":"one two three"}"#).await;
    assert_eq!(direct.status, 200, "{}", direct.text());
    for body in [
        r#"{"prompt":"one two three"}"#,
        r#"{"model":"sim-model","messages":[{"role":"user","content":"hi there"}]}"#,
    ] {
        let via = post(&c, &r.url("/tokenize"), body).await;
        let direct = post(&c, &s.url("/tokenize"), body).await;
        assert_eq!(via.status, 200, "{}", via.text());
        assert_eq!(via.json(), direct.json());
        assert!(via.json()["count"].as_u64().is_some_and(|n| n >= 3));
    }
    let v = get(&c, &r.url("/version")).await;
    assert_eq!(v.status, 200);
    assert!(
        v.json()["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("vllm-sim"))
    );
    // The backend's own answers come back untouched (the simulator has no /score: its 404).
    let score = post(&c, &r.url("/score"), "{}").await;
    assert_eq!(score.status, 404);
    assert_eq!(score.json()["error"]["type"], "NotFoundError");
    // SageMaker-style liveness is answered by the router itself.
    assert_eq!(get(&c, &r.url("/ping")).await.status, 200);
    // Admin endpoints act on one engine's state: the router refuses them rather than reach one
    // target of many.
    for path in ["/reset_prefix_cache", "/sleep", "/collective_rpc"] {
        let resp = post(&c, &r.url(path), "{}").await;
        assert_eq!(resp.status, 404, "{path}");
        assert_eq!(resp.json()["error"]["code"], "not_found", "{path}");
    }
    let m = metric(
        &c,
        &format!("http://{}", r.metrics_addr),
        "vllm_router_requests_total",
        &[("route", "vllm_api")],
    )
    .await;
    assert_eq!(m, 4.0);
}

#[tokio::test]
async fn clients_need_the_api_key_as_with_vllm_unless_client_keys_say_otherwise() {
    let s = sim(&["--instant", "--api-key", "worker-key"]).await;
    let c = client();
    let bearer = |k: &str| format!("Bearer {k}");
    let chat_as = |r: &Router, key: Option<String>| {
        let (c, url) = (c.clone(), r.url(CHAT));
        async move {
            let h: Vec<(&str, String)> = key.map(|k| ("authorization", k)).into_iter().collect();
            let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
            send(&c, "POST", &url, &chat("auth", 1), &h).await
        }
    };
    // api_key alone: clients must present it (vLLM's rule; vllm-router forwards the client's
    // header, so the engine enforces the same). Refused by the router, before any backend.
    let mut cfg = workers(&[s.base()], 1);
    cfg.api_key = Some("worker-key".into());
    let r = router(cfg).await;
    for key in [None, Some(bearer("wrong")), Some("Basic worker-key".into())] {
        let resp = chat_as(&r, key.clone()).await;
        assert_eq!(resp.status, 401, "{key:?}: {}", resp.text());
        assert_eq!(resp.json()["error"]["code"], "invalid_api_key");
        assert_eq!(
            resp.headers.get("www-authenticate").map(|v| v.as_bytes()),
            Some(&b"Bearer"[..])
        );
    }
    assert_eq!(chat_as(&r, Some(bearer("worker-key"))).await.status, 200);
    assert_eq!(
        chat_as(&r, Some("bearer worker-key".into())).await.status,
        200
    );
    assert_eq!(get(&c, &r.url("/v1/models")).await.status, 401);
    assert_eq!(
        post(&c, &r.url("/tokenize"), r#"{"prompt":"a"}"#)
            .await
            .status,
        401
    );
    for open in ["/health", "/readiness", "/status"] {
        assert_eq!(get(&c, &r.url(open)).await.status, 200, "{open}");
    }
    let status = get(&c, &r.url("/status")).await;
    assert_eq!(status.json()["config"]["client_auth"], "api_key");
    assert!(!status.text().contains("worker-key"), "no key in /status");
    let served = metric(
        &c,
        &format!("http://{}", r.metrics_addr),
        "vllm_router_tokens_total",
        &[("kind", "completion")],
    )
    .await;
    assert_eq!(served, 2.0, "refused requests never reached a backend");

    // Client keys of their own: the router checks them and authenticates to the workers with
    // its key (clients never learn it).
    let mut cfg = workers(&[s.base()], 1);
    cfg.api_key = Some("worker-key".into());
    cfg.client_api_keys = Some(vec!["team-a".into(), "team-b".into()]);
    let r = router(cfg).await;
    assert_eq!(chat_as(&r, Some(bearer("team-a"))).await.status, 200);
    assert_eq!(chat_as(&r, Some(bearer("team-b"))).await.status, 200);
    assert_eq!(chat_as(&r, Some(bearer("worker-key"))).await.status, 401);
    assert_eq!(chat_as(&r, None).await.status, 401);
    // Anthropic's clients send `x-api-key` (Claude Code with ANTHROPIC_API_KEY).
    for (key, want) in [("team-a", 200), ("worker-key", 401)] {
        let resp = send(
            &c,
            "POST",
            &r.url(CHAT),
            &chat("x", 1),
            &[("x-api-key", key)],
        )
        .await;
        assert_eq!(resp.status, want, "{key}: {}", resp.text());
    }
    let status = get(&c, &r.url("/status")).await.json();
    assert_eq!(status["config"]["client_auth"], "client_api_keys");

    // `[]`: no check on purpose (behind an authenticating gateway).
    let mut cfg = workers(&[s.base()], 1);
    cfg.api_key = Some("worker-key".into());
    cfg.client_api_keys = Some(Vec::new());
    let r = router(cfg).await;
    assert_eq!(chat_as(&r, None).await.status, 200);
    let status = get(&c, &r.url("/status")).await.json();
    assert_eq!(status["config"]["client_auth"], "off");
    assert_eq!(
        get(&c, &r.url("/scheduling/diagnostics")).await.status,
        401,
        "checking off names no client, but a key is configured: diagnostics need it"
    );
    let platform = [("authorization", "Bearer worker-key")];
    let d = send(&c, "GET", &r.url("/scheduling/diagnostics"), "", &platform).await;
    assert_eq!(d.status, 200, "the workers' key reads them");

    // No keys at all: the client's own header goes to the backend, which decides.
    let r = router(workers(&[s.base()], 1)).await;
    assert_eq!(
        chat_as(&r, None).await.status,
        401,
        "the simulator's own 401"
    );
    assert_eq!(chat_as(&r, Some(bearer("worker-key"))).await.status, 200);
}

#[tokio::test]
async fn the_concurrency_cap_queues_then_refuses_and_frees_places_when_responses_end() {
    // ~100 decode steps of ~11 ms: each request holds its place for about a second.
    let s = sim(&[]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.max_concurrent_requests = Some(1);
    cfg.limits.queue_size = 1;
    let r = router(cfg).await;
    let c = client();
    let slow = || {
        let (c, url) = (c.clone(), r.url(CHAT));
        tokio::spawn(async move { post(&c, &url, &chat("slow", 100)).await })
    };
    let first = slow();
    let place_taken = eventually(5.0, || async {
        r.state
            .applied
            .load()
            .limiter
            .as_ref()
            .is_some_and(|l| l.in_progress() == 1)
    })
    .await;
    assert!(place_taken);
    let second = slow();
    assert!(
        eventually(5.0, || async {
            get(&c, &r.url("/status")).await.json()["limits"]["waiting"] == 1
        })
        .await
    );
    // The cap and the queue are full: refused at once, before the body is read.
    let third = post(&c, &r.url(CHAT), &chat("refused", 1)).await;
    assert_eq!(third.status, 429, "{}", third.text());
    assert_eq!(third.json()["error"]["code"], "router_queue_full");
    assert!(third.headers.contains_key("retry-after"));
    // Prometheus sees the same as /status.
    let m = format!("http://{}", r.metrics_addr);
    for (series, want) in [
        ("program_router_concurrency_limit", 1.0),
        ("program_router_concurrency_in_progress", 1.0),
        ("program_router_concurrency_waiting", 1.0),
    ] {
        assert_eq!(metric(&c, &m, series, &[]).await, want, "{series}");
    }
    let refused = metric(
        &c,
        &m,
        "vllm_router_request_errors_total",
        &[("error", "router_queue_full")],
    )
    .await;
    assert_eq!(refused, 1.0);
    // Both admitted requests finish; their places come back.
    assert_eq!(first.await.expect("task").status, 200);
    assert_eq!(second.await.expect("task").status, 200);
    let status = get(&c, &r.url("/status")).await.json();
    assert_eq!(status["limits"]["in_progress"], 0, "{status}");
    assert_eq!(status["limits"]["waiting"], 0);

    // A wait longer than the queue timeout is 504.
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.max_concurrent_requests = Some(1);
    cfg.limits.queue_timeout_secs = 0.2;
    let r = router(cfg).await;
    let busy = {
        let (c, url) = (c.clone(), r.url(CHAT));
        tokio::spawn(async move { post(&c, &url, &chat("slow", 100)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late = post(&c, &r.url(CHAT), &chat("late", 1)).await;
    assert_eq!(late.status, 504, "{}", late.text());
    assert_eq!(late.json()["error"]["code"], "queue_timeout");
    assert_eq!(busy.await.expect("task").status, 200);
}

#[tokio::test]
async fn no_target_is_503_and_a_slow_backend_is_504() {
    let r = router(RouterConfig::default()).await;
    let c = client();
    let resp = post(&c, &r.url(CHAT), &chat("x", 1)).await;
    assert_eq!(resp.status, 503);
    assert_eq!(resp.json()["error"]["code"], "no_healthy_target");
    assert_eq!(get(&c, &r.url("/readiness")).await.status, 503);

    let slow = sim(&[]).await; // a 20,000-token prompt takes ~3 s of prefill
    let mut cfg = workers(&[slow.base()], 1);
    cfg.limits.request_timeout_secs = 0.3;
    let r = router(cfg).await;
    let prompt: Vec<u32> = (0..20_000).collect();
    let resp = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"prompt": prompt, "max_tokens": 1}).to_string(),
    )
    .await;
    assert_eq!(resp.status, 504, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "upstream_timeout");
}

#[tokio::test]
async fn agentic_context_is_stripped_or_stringified_for_stock_backends() {
    let s = sim(&["--instant"]).await;
    let c = client();
    let body = json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 1,
        "vllm_xargs": {"agentic_context": {"program_id": "p1", "step_id": 0}}})
    .to_string();
    for (mode, want) in [
        (AgenticContextMode::Strip, 200),
        (AgenticContextMode::JsonString, 200),
        (AgenticContextMode::Passthrough, 400),
    ] {
        let mut cfg = workers(&[s.base()], 1);
        cfg.agentic_context = mode;
        let r = router(cfg).await;
        assert_eq!(post(&c, &r.url(CHAT), &body).await.status, want, "{mode:?}");
    }
}
