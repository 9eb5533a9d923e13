//! program-router against vllm-sim over loopback: placement, DP pinning, streaming, cancel,
//! retries, breaker, limits, bad input, reload, drain and /status.

#[path = "../common/mod.rs"]
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
        r.state.forwarder.response_homes.len(),
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

/// A backend answering every request with hop-by-hop headers of every kind beside an
/// end-to-end one.
async fn hop_by_hop_backend() -> String {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    let resp = http::Response::builder()
                        .header("connection", "keep-alive, x-hop")
                        .header("x-hop", "connection-scoped")
                        .header("keep-alive", "timeout=5")
                        .header("proxy-connection", "keep-alive")
                        .header("x-kept", "end-to-end")
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(b"{}")))
                        .expect("response");
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_backends_hop_by_hop_headers_stay_behind_and_end_to_end_ones_pass() {
    let url = hop_by_hop_backend().await;
    let mut cfg = workers(&[url], 1);
    cfg.policy.kind = PolicyKind::RoundRobin;
    let r = router(cfg).await;
    let c = client();
    for path in [CHAT, "/v1/models"] {
        let resp = if path == CHAT {
            post(&c, &r.url(path), &chat("hi", 1)).await
        } else {
            get(&c, &r.url(path)).await
        };
        assert_eq!(resp.status, 200, "{path}: {}", resp.text());
        let h = &resp.headers;
        assert_eq!(h["x-kept"], "end-to-end", "{path}: {h:?}");
        for gone in ["x-hop", "keep-alive", "proxy-connection"] {
            assert!(!h.contains_key(gone), "{path}: {gone} passed: {h:?}");
        }
    }
}

mod access_log;
mod exported;
mod lifecycle;
mod streams_and_errors;
mod traces;
