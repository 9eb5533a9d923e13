//! program-router against vllm-sim over loopback: placement, DP pinning, streaming, cancel,
//! retries, breaker, limits, bad input, reload, drain and /status.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use program_router::config::{AgenticContextMode, PolicyKind, RouterConfig, WorkerConfig};
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

async fn sim_metric(
    c: &HttpClient,
    s: &vllm_sim::server::Spawned,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    metric(c, &s.base(), name, labels).await
}

#[tokio::test]
async fn round_robin_spreads_over_every_rank_and_pins_the_dp_header() {
    let s = sim(&["--instant", "-d", "2"]).await;
    let mut cfg = workers(&[s.base()], 2);
    cfg.policy.kind = PolicyKind::RoundRobin;
    let r = router(cfg).await;
    let c = client();
    for i in 0..8 {
        let resp = post(&c, &r.url(CHAT), &chat(&format!("hello {i}"), 2)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert!(resp.headers.contains_key("x-request-id"));
    }
    for e in ["0", "1"] {
        assert_eq!(
            sim_metric(
                &c,
                &s,
                "vllm:request_success_total",
                &[("engine", e), ("finished_reason", "length")]
            )
            .await,
            4.0
        );
    }
}

#[tokio::test]
async fn request_ids_are_unique_across_router_replicas_and_client_ids_are_kept() {
    let s = sim(&["--instant"]).await;
    let (a, b) = (
        router(workers(&[s.base()], 1)).await,
        router(workers(&[s.base()], 1)).await,
    );
    let c = client();
    let mut ids = std::collections::BTreeSet::new();
    for r in [&a, &b] {
        for _ in 0..3 {
            let resp = post(&c, &r.url(CHAT), &chat("id", 1)).await;
            let id = resp.headers["x-request-id"]
                .to_str()
                .expect("ascii")
                .to_string();
            let (prefix, n) = id.rsplit_once('-').expect("pr-<random>-<n>");
            assert!(prefix.starts_with("pr-") && prefix.len() == 19, "{id}");
            assert!(u64::from_str_radix(n, 16).is_ok(), "{id}");
            ids.insert(id);
        }
    }
    // Two replicas each serving their first requests: the same counters, never the same id
    // (vLLM takes the id as its request key).
    assert_eq!(ids.len(), 6, "{ids:?}");
    let resp = send(
        &c,
        "POST",
        &a.url(CHAT),
        &chat("id", 1),
        &[("x-request-id", "mine-1")],
    )
    .await;
    assert_eq!(resp.headers["x-request-id"], "mine-1");
}

#[tokio::test]
async fn explicit_global_ranks_reach_a_server_owning_4_to_7() {
    let s = sim(&["--instant", "-d", "4", "--data-parallel-start-rank", "4"]).await;
    let cfg = RouterConfig {
        workers: (4..8)
            .map(|r| WorkerConfig {
                url: s.base(),
                dp_rank: Some(r),
            })
            .collect(),
        policy: program_router::config::PolicyConfig {
            kind: PolicyKind::RoundRobin,
            ..Default::default()
        },
        ..Default::default()
    };
    let r = router(cfg).await;
    let c = client();
    for i in 0..8 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat(&format!("x{i}"), 1))
                .await
                .status,
            200
        );
    }
    for e in ["4", "5", "6", "7"] {
        assert_eq!(
            sim_metric(
                &c,
                &s,
                "vllm:request_success_total",
                &[("engine", e), ("finished_reason", "length")]
            )
            .await,
            2.0,
            "rank {e}"
        );
    }
}

/// Asserts that exactly one of the simulator's four ranks finished `n` requests.
async fn assert_one_rank_served_all(c: &HttpClient, s: &vllm_sim::server::Spawned, n: f64) {
    let mut per_rank = Vec::new();
    for e in ["0", "1", "2", "3"] {
        per_rank.push(
            sim_metric(
                c,
                s,
                "vllm:request_success_total",
                &[("engine", e), ("finished_reason", "length")],
            )
            .await,
        );
    }
    assert_eq!(
        per_rank.iter().filter(|x| **x == n).count(),
        1,
        "{per_rank:?}"
    );
}

#[tokio::test]
async fn anthropic_messages_stick_by_metadata_user_id() {
    // Claude Code sends its session in the body's `metadata.user_id`: a plain /v1/messages
    // request (no Program scheduling) keeps to one rank by it under consistent_hash.
    let s = sim(&["--instant", "-d", "4"]).await;
    let mut cfg = workers(&[s.base()], 4);
    cfg.policy.kind = PolicyKind::ConsistentHash;
    let r = router(cfg).await;
    let c = client();
    let body = json!({"model": "sim-model", "max_tokens": 1,
        "metadata": {"user_id": "user_abc_account_1_session_42"},
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    for _ in 0..6 {
        let resp = post(&c, &r.url("/v1/messages"), &body).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.json()["type"], "message");
    }
    assert_one_rank_served_all(&c, &s, 6.0).await;
    // The router's own errors there take the Anthropic shape (vLLM's on that route), the
    // Responses and chat routes keep OpenAI's.
    for (body, status, kind) in [
        ("{not json", 400, "invalid_request_error"),
        (r#"{"stream": 1}"#, 400, "invalid_request_error"),
    ] {
        let resp = post(&c, &r.url("/v1/messages"), body).await;
        assert_eq!(resp.status, status, "{}", resp.text());
        let v = resp.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert_eq!(v["error"]["code"], "invalid_request");
    }
    let wrong = send(&c, "GET", &r.url("/v1/messages"), "", &[]).await;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.json()["error"]["type"], "invalid_request_error");
    for path in ["/v1/responses", CHAT] {
        let v = post(&c, &r.url(path), "{not json").await.json();
        assert!(v.get("type").is_none(), "{path}: {v}");
        assert_eq!(v["error"]["param"], serde_json::Value::Null, "{path}: {v}");
    }
    let mut keyed = workers(&[s.base()], 4);
    keyed.client_api_keys = Some(vec!["team".into()]);
    let keyed = router(keyed).await;
    let refused = post(&c, &keyed.url("/v1/messages"), &body).await;
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"]["type"], "authentication_error");
}

#[tokio::test]
async fn stored_responses_are_followed_up_on_the_server_that_stored_them() {
    // Two servers, each with its own response store (as vLLM keeps them): a follow-up naming a
    // stored response, or reading it back, must reach the one that stored it, whatever the
    // policy would pick; round robin alone would send half of them to the other server (404).
    let (a, b) = (sim(&["--instant"]).await, sim(&["--instant"]).await);
    let mut cfg = workers(&[a.base(), b.base()], 1);
    cfg.policy.kind = PolicyKind::RoundRobin;
    let r = router(cfg).await;
    let c = client();
    let mut ids = Vec::new();
    for i in 0..4 {
        let body = json!({"model": "sim-model", "input": format!("turn {i}"),
            "max_output_tokens": 1, "stream": i % 2 == 1});
        let resp = post(&c, &r.url("/v1/responses"), &body.to_string()).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let text = resp.text();
        let id = if i % 2 == 1 {
            let done = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .next_back()
                .expect("events");
            serde_json::from_str::<serde_json::Value>(done).expect("json")["response"]["id"]
                .as_str()
                .map(str::to_string)
        } else {
            resp.json()["id"].as_str().map(str::to_string)
        };
        ids.push(id.expect("a response id"));
    }
    assert_eq!(
        r.state.response_homes.len(),
        4,
        "streamed and plain ids learned"
    );
    for id in &ids {
        for _ in 0..2 {
            let next = json!({"model": "sim-model", "input": "go on", "max_output_tokens": 1,
                "previous_response_id": id});
            let resp = post(&c, &r.url("/v1/responses"), &next.to_string()).await;
            assert_eq!(resp.status, 200, "{id}: {}", resp.text());
        }
        let got = get(&c, &r.url(&format!("/v1/responses/{id}"))).await;
        assert_eq!(got.status, 200, "{id}: {}", got.text());
        assert_eq!(got.json()["id"], id.as_str());
    }
    // An id the router never saw takes the normal route; the backend answers for itself.
    let unknown = json!({"input": "x", "previous_response_id": "resp_unknown"});
    let resp = post(&c, &r.url("/v1/responses"), &unknown.to_string()).await;
    assert_eq!(resp.status, 404, "{}", resp.text());
}

#[tokio::test]
async fn consistent_hash_keeps_a_session_on_one_rank() {
    let s = sim(&["--instant", "-d", "4"]).await;
    let mut cfg = workers(&[s.base()], 4);
    cfg.policy.kind = PolicyKind::ConsistentHash;
    let r = router(cfg).await;
    let c = client();
    for _ in 0..6 {
        let resp = send(
            &c,
            "POST",
            &r.url(CHAT),
            &chat("sticky", 1),
            &[("x-session-id", "agent-42")],
        )
        .await;
        assert_eq!(resp.status, 200);
    }
    assert_one_rank_served_all(&c, &s, 6.0).await;
    // Many sessions spread over all ranks.
    for i in 0..40 {
        let key = format!("s{i}");
        send(
            &c,
            "POST",
            &r.url(CHAT),
            &chat("x", 1),
            &[("x-session-id", key.as_str())],
        )
        .await;
    }
    for e in ["0", "1", "2", "3"] {
        assert!(sim_metric(&c, &s, "vllm:request_success_total", &[("engine", e)]).await > 0.0);
    }
}

#[tokio::test]
async fn cache_aware_follows_a_growing_conversation() {
    let s = sim(&["--instant", "-d", "4"]).await;
    let r = router(workers(&[s.base()], 4)).await;
    let c = client();
    let mut history = vec![json!({"role": "user", "content": "x ".repeat(300)})];
    let mut cached = Vec::new();
    for turn in 0..5 {
        let body = json!({"messages": history, "max_tokens": 8}).to_string();
        let resp = post(&c, &r.url(CHAT), &body).await.json();
        cached.push(
            resp["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached"),
        );
        let reply = resp["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_string();
        history.push(json!({"role": "assistant", "content": reply}));
        history.push(json!({"role": "user", "content": format!("turn {turn}")}));
    }
    assert!(
        cached[1..].iter().all(|c| *c > 250),
        "every later turn hits its prefix: {cached:?}"
    );
}

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
    assert!(failed, "the client sees the cut: {got}");
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

#[tokio::test]
async fn hot_reload_adds_removes_and_refuses_bad_files() {
    let a = sim(&["--instant"]).await;
    let b = sim(&["--instant"]).await;
    let dir = std::env::temp_dir().join(format!("router-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("router.json");
    let write = |cfg: &serde_json::Value| {
        let mut cfg = cfg.clone();
        // Listener fields as the harness sets them (changing them needs a restart).
        cfg["port"] = json!(0);
        cfg["prometheus_port"] = json!(0);
        let tmp = dir.join("router.json.tmp");
        std::fs::write(&tmp, cfg.to_string()).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    };
    write(&json!({"workers": [{"url": a.base()}], "policy": {"kind": "round_robin"}}));
    let flags = program_router::config::cli::Flags {
        config: Some(path.clone()),
        ..Default::default()
    };
    let file = program_router::config::cli::load_file(&path).expect("file");
    let r = router_with(flags.effective(Some(file)).expect("valid"), flags).await;
    let c = client();
    let hash0 = get(&c, &r.url("/status")).await.json()["config"]["hash"].clone();

    // A long request in flight on `a` survives a reload that removes `a`.
    let url = r.url(CHAT);
    let c2 = client();
    let slow_sim_body = chat("in flight", 3);
    let inflight = tokio::spawn(async move { post(&c2, &url, &slow_sim_body).await });
    write(
        &json!({"workers": [{"url": a.base()}, {"url": b.base()}], "policy": {"kind": "round_robin"}}),
    );
    assert!(
        eventually(5.0, || async {
            r.state.applied.load().targets.targets.len() == 2
        })
        .await,
        "added"
    );
    for i in 0..6 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat(&format!("n{i}"), 1))
                .await
                .status,
            200
        );
    }
    assert!(sim_metric(&c, &b, "vllm:request_success_total", &[]).await >= 3.0);
    write(&json!({"workers": [{"url": b.base()}], "policy": {"kind": "round_robin"}}));
    assert!(
        eventually(5.0, || async {
            r.state.applied.load().targets.targets.len() == 1
        })
        .await,
        "removed"
    );
    assert_eq!(inflight.await.expect("join").status, 200);
    let before = sim_metric(&c, &a, "vllm:request_success_total", &[]).await;
    for i in 0..4 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat(&format!("m{i}"), 1))
                .await
                .status,
            200
        );
    }
    assert_eq!(
        sim_metric(&c, &a, "vllm:request_success_total", &[]).await,
        before,
        "removed target gets nothing"
    );

    // /status names the exact file content in force, as the operator compares it.
    let bytes = std::fs::read(&path).expect("read");
    let in_force = program_router::config::file_hash(&bytes);
    let st = get(&c, &r.url("/status")).await.json();
    assert_eq!(st["config"]["file_hash"], json!(in_force));
    assert_eq!(
        st["config"]["settings_hash"],
        json!(program_router::config::settings_hash(&bytes))
    );

    // An invalid file is refused; the applied config stays and /status says why.
    let applied = get(&c, &r.url("/status")).await.json()["config"]["hash"].clone();
    assert_ne!(applied, hash0);
    std::fs::write(&path, r#"{"workers": [{"url": "not a url"}]}"#).expect("write");
    assert!(
        eventually(5.0, || async {
            !get(&c, &r.url("/status")).await.json()["last_reload_error"].is_null()
        })
        .await,
        "error reported"
    );
    let st = get(&c, &r.url("/status")).await.json();
    assert_eq!(st["config"]["hash"], applied);
    assert_eq!(
        st["config"]["file_hash"],
        json!(in_force),
        "refused file is not in force"
    );
    assert!(
        st["last_reload_error"]["message"]
            .as_str()
            .expect("message")
            .contains("workers[0].url"),
        "{st}"
    );
    assert_eq!(post(&c, &r.url(CHAT), &chat("still", 1)).await.status, 200);

    // A valid file that changes what only a restart can change is refused the same way.
    write(
        &json!({"workers": [{"url": b.base()}], "policy": {"kind": "round_robin"}, "io_threads": 7}),
    );
    assert!(
        eventually(5.0, || async {
            get(&c, &r.url("/status")).await.json()["last_reload_error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("io_threads"))
        })
        .await,
        "io_threads change refused"
    );
    assert_eq!(
        get(&c, &r.url("/status")).await.json()["config"]["hash"],
        applied
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn slow_or_silent_client_connections_are_closed_after_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.client_header_timeout_secs = Some(0.3);
    let r = router(cfg).await;
    let addr = r.server.addr;
    // Connects and sends nothing.
    let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert!(
        closed_within(&mut silent, 3.0).await,
        "silent connection kept open"
    );
    // Sends half a request head and stalls.
    let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    assert!(closed_within(&mut slow, 3.0).await, "half a head kept open");
    // A kept-alive connection idle after its response.
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    assert!(
        closed_within(&mut idle, 3.0).await,
        "idle keep-alive kept open"
    );
    // Requests themselves are unaffected, and a client that keeps sending keeps its connection.
    let c = client();
    for _ in 0..3 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat("still fine", 1)).await.status,
            200
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Without the limit, a silent connection stays open.
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.client_header_timeout_secs = None;
    let r = router(cfg).await;
    let mut silent = tokio::net::TcpStream::connect(r.server.addr)
        .await
        .expect("connect");
    assert!(
        !closed_within(&mut silent, 1.0).await,
        "closed without a limit"
    );

    // A silent connection does not hold up a shutdown until its (default, 60 s) header timeout.
    let mut r = router(workers(&[s.base()], 1)).await;
    let mut silent = tokio::net::TcpStream::connect(r.server.addr)
        .await
        .expect("connect");
    let mut idle = tokio::net::TcpStream::connect(r.server.addr)
        .await
        .expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    r.server.stop();
    let done = r.server.done.take().expect("task");
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("shutdown waited for a silent connection")
        .expect("serve task");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(closed_within(&mut silent, 1.0).await);
    assert!(closed_within(&mut idle, 1.0).await);
}

#[tokio::test]
async fn drain_finishes_requests_in_flight_and_turns_readiness_off() {
    let s = sim(&["--time-scale", "10"]).await;
    let mut r = router(workers(&[s.base()], 1)).await;
    let url = r.url(CHAT);
    let c2 = client();
    let inflight = tokio::spawn(async move { post(&c2, &url, &chat("drain", 40)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    r.server.stop();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(r.state.is_draining());
    let resp = inflight.await.expect("join");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["usage"]["completion_tokens"], 40);
    r.server.stopped().await;
    // New connections are refused once drained.
    let refused = tokio::net::TcpStream::connect(r.server.addr).await;
    assert!(refused.is_err());
}

#[tokio::test]
async fn a_shutdown_delay_keeps_serving_with_readiness_off_before_the_drain() {
    let s = sim(&[]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.shutdown_delay_secs = 1.0;
    let mut r = router(cfg).await;
    let c = client();
    assert!(
        eventually(5.0, || async {
            get(&c, &r.url("/readiness")).await.status == 200
        })
        .await
    );
    let started = std::time::Instant::now();
    r.server.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Not ready, yet new connections are still served while load balancers catch up.
    assert_eq!(get(&client(), &r.url("/readiness")).await.status, 503);
    let served = post(&client(), &r.url(CHAT), &chat("late", 2)).await;
    assert_eq!(served.status, 200, "{}", served.text());
    r.server.stopped().await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the listener closed only after the delay ({:?})",
        started.elapsed()
    );
    assert!(tokio::net::TcpStream::connect(r.server.addr).await.is_err());
}

#[tokio::test]
async fn every_io_thread_setting_serves_concurrent_streams_and_drains() {
    let s = sim(&["--time-scale", "10", "-d", "2"]).await;
    for io_threads in [Some(0), Some(1), Some(3)] {
        let mut r = router(RouterConfig {
            io_threads,
            ..workers(&[s.base()], 2)
        })
        .await;
        if io_threads == Some(3) {
            let names: Vec<String> = std::fs::read_dir("/proc/self/task")
                .map(|d| {
                    d.flatten()
                        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                        .collect()
                })
                .unwrap_or_default();
            let io = names.iter().filter(|n| n.starts_with("router-io-")).count();
            assert!(io >= 3, "{io_threads:?}: {names:?}");
        }
        // Concurrent requests on separate connections, streamed and not.
        let mut calls = Vec::new();
        for i in 0..12 {
            let url = r.url(CHAT);
            calls.push(tokio::spawn(async move {
                let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": format!("io {i}")}],
                    "max_tokens": 5, "stream": i % 2 == 0})
                .to_string();
                post(&client(), &url, &body).await
            }));
        }
        for (i, call) in calls.into_iter().enumerate() {
            let resp = call.await.expect("join");
            assert_eq!(
                resp.status,
                200,
                "{io_threads:?} request {i}: {}",
                resp.text()
            );
            if i % 2 == 0 {
                assert!(resp.text().ends_with("data: [DONE]\n\n"));
            } else {
                assert_eq!(resp.json()["usage"]["completion_tokens"], 5);
            }
        }
        // A request in flight at shutdown finishes; then the port is closed.
        let url = r.url(CHAT);
        let inflight = tokio::spawn(async move { post(&client(), &url, &chat("drain", 30)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.server.stop();
        let resp = inflight.await.expect("join");
        assert_eq!(resp.status, 200, "{io_threads:?}");
        assert_eq!(resp.json()["usage"]["completion_tokens"], 30);
        r.server.stopped().await;
        assert!(
            tokio::net::TcpStream::connect(r.server.addr).await.is_err(),
            "{io_threads:?}: still accepting after the drain"
        );
    }
}

#[tokio::test]
async fn status_reports_config_targets_and_observations() {
    let s = sim(&["--instant", "-d", "2"]).await;
    let mut cfg = workers(&[s.base()], 2);
    cfg.policy.kind = PolicyKind::PowerOfTwo;
    cfg.observation.interval_secs = 0.1;
    let r = router(cfg).await;
    let c = client();
    let ok = eventually(3.0, || async {
        let st = get(&c, &r.url("/status")).await.json();
        st["targets"]
            .as_array()
            .is_some_and(|t| t.iter().all(|t| t["observation_fresh"] == true))
    })
    .await;
    assert!(ok, "power_of_two polls backend metrics");
    let st = get(&c, &r.url("/status")).await.json();
    assert_eq!(st["ready"], true);
    assert_eq!(st["config"]["policy"], "power_of_two");
    assert_eq!(st["config"]["source"], "flags");
    assert_eq!(st["config"]["hash"].as_str().map(str::len), Some(16));
    let t = st["targets"].as_array().expect("targets");
    assert_eq!(t.len(), 2);
    assert_eq!(t[1]["id"], format!("{}@1", s.base()));
    assert_eq!(t[1]["dp_rank"], 1);
    assert_eq!(t[1]["healthy"], true);
    assert_eq!(t[1]["circuit"], "closed");
    for i in 0..4 {
        assert_eq!(
            post(&c, &r.url(CHAT), &chat(&format!("p{i}"), 1))
                .await
                .status,
            200
        );
    }
}
