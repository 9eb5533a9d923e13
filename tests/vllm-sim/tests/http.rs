//! The simulator over real HTTP on loopback: API shapes, DP ranks, auth, bad input, metrics,
//! failure injection, cancellation and drain.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn chat_completion_reports_usage_and_prefix_reuse() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let body = chat_body(&words(1, 100), 7);
    let first = post(&c, &sim.url(CHAT), &body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let j = first.json();
    assert_eq!(j["object"], "chat.completion");
    assert_eq!(j["choices"][0]["finish_reason"], "length");
    assert_eq!(j["usage"]["completion_tokens"], 7);
    let prompt = j["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert_eq!(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = post(&c, &sim.url(CHAT), &body).await.json();
    // The same prompt again hits every full block but never the last token.
    let want = (prompt - 1) / 16 * 16;
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        want
    );
    assert_eq!(
        second["choices"][0]["message"]["content"],
        j["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn messages_and_responses_apis_answer_in_their_own_shapes() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let text = words(1, 50);
    let chat = post(&c, &sim.url(CHAT), &chat_body(&text, 3)).await.json();
    let prompt = chat["usage"]["prompt_tokens"].as_u64().expect("prompt");

    let m = json!({"model": "sim-model", "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]});
    let j = post(&c, &sim.url("/v1/messages"), &m.to_string())
        .await
        .json();
    assert_eq!(j["type"], "message");
    assert_eq!(j["stop_reason"], "max_tokens");
    assert_eq!(
        j["usage"]["input_tokens"], prompt,
        "the same prompt as chat"
    );
    assert_eq!(j["usage"]["output_tokens"], 3);
    let mut streamed = m.clone();
    streamed["stream"] = json!(true);
    let events = post(&c, &sim.url("/v1/messages"), &streamed.to_string())
        .await
        .text();
    let names: Vec<&str> = events
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );

    let r = json!({"model": "sim-model", "max_output_tokens": 2, "input": text, "stream": true});
    let events = post(&c, &sim.url("/v1/responses"), &r.to_string())
        .await
        .text();
    let last = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .next_back()
        .expect("events");
    let done: serde_json::Value = serde_json::from_str(last).expect("json");
    assert_eq!(done["type"], "response.completed");
    assert_eq!(done["response"]["usage"]["output_tokens"], 2);
    assert_eq!(
        done["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .map(|c| c > 0),
        Some(true),
        "the chat request above left the prefix cached"
    );
    assert!(events.starts_with("event: response.created\n"), "{events}");
}

#[tokio::test]
async fn tokenize_counts_the_prompt_a_request_would_have() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let body = chat_body(&words(3, 40), 1);
    let usage = post(&c, &sim.url(CHAT), &body).await.json()["usage"]["prompt_tokens"].clone();
    let t = post(&c, &sim.url("/tokenize"), &body).await;
    assert_eq!(t.status, 200, "{}", t.text());
    let j = t.json();
    assert_eq!(j["count"], usage);
    assert_eq!(
        j["tokens"].as_array().map(Vec::len),
        usage.as_u64().map(|n| n as usize)
    );
    assert_eq!(j["max_model_len"], 32768);
    for (body, status) in [
        (r#"{"prompt":"a","messages":[]}"#, 400),
        (r#"{}"#, 400),
        (r#"{"model":"other","prompt":"a"}"#, 404),
        ("{oops", 400),
    ] {
        assert_eq!(
            post(&c, &sim.url("/tokenize"), body).await.status,
            status,
            "{body}"
        );
    }
    let v = get(&c, &sim.url("/version")).await.json();
    assert!(
        v["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("vllm-sim "))
    );
}

#[tokio::test]
async fn multi_turn_with_the_echoed_reply_hits_prompt_and_output() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let user = words(2, 60);
    let r1 = post(&c, &sim.url(CHAT), &chat_body(&user, 40)).await.json();
    let reply = r1["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string();
    let p1 = r1["usage"]["prompt_tokens"].as_u64().expect("p1");
    let body = json!({"messages": [
        {"role": "user", "content": user},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and now?"}
    ], "max_tokens": 1})
    .to_string();
    let r2 = post(&c, &sim.url(CHAT), &body).await.json();
    let cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    // Prompt and all but the last output token were computed: their full blocks are cached.
    assert_eq!(cached, (p1 + 40 - 1) / 16 * 16);
}

#[tokio::test]
async fn streaming_sse_shape_and_usage_chunk() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}})
        .to_string();
    let r = post(&c, &sim.url(CHAT), &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let text = r.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert!(events.iter().all(|e| e.starts_with("data: ")), "{text}");
    assert_eq!(*events.last().expect("events"), "data: [DONE]");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(&e[6..]).expect("chunk json"))
        .collect();
    assert_eq!(chunks.len(), 5, "3 tokens + finish + usage");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 3);
    // Without include_usage there is no usage chunk.
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true})
            .to_string();
    let text = post(&c, &sim.url(CHAT), &body).await.text();
    assert!(!text.contains("\"usage\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    // Per-chunk usage, as vLLM: only together with include_usage.
    let stream = |options: serde_json::Value| {
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true,
            "stream_options": options})
        .to_string()
    };
    let text = post(
        &c,
        &sim.url(CHAT),
        &stream(json!({"continuous_usage_stats": true})),
    )
    .await
    .text();
    assert!(!text.contains("\"usage\""), "{text}");
    let both = json!({"continuous_usage_stats": true, "include_usage": true});
    let text = post(&c, &sim.url(CHAT), &stream(both)).await.text();
    assert_eq!(
        text.matches("\"usage\"").count(),
        3,
        "2 tokens + the final chunk: {text}"
    );
}

#[tokio::test]
async fn completions_endpoint_streams_and_counts_token_ids() {
    let sim = start(&["--instant"]).await;
    let c = client();
    let r = post(
        &c,
        &sim.url("/v1/completions"),
        r#"{"prompt":[1,2,3,4],"max_tokens":2}"#,
    )
    .await
    .json();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["prompt_tokens"], 4);
    let r = post(
        &c,
        &sim.url("/v1/completions"),
        r#"{"prompt":"a b c","max_tokens":2,"stream":true}"#,
    )
    .await;
    assert_eq!(r.text().matches("\"text\":\" w").count(), 2);
}

#[tokio::test]
async fn dp_rank_header_selects_global_ranks_and_rejects_others() {
    let sim = start(&["--instant", "-d", "4", "--data-parallel-start-rank", "4"]).await;
    let c = client();
    let body = chat_body(&words(3, 50), 1);
    for rank in ["4", "7"] {
        let r = send(
            &c,
            "POST",
            &sim.url(CHAT),
            &body,
            &[("X-data-parallel-rank", rank)],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // The same prompt on rank 7 does not hit rank 4's cache (ranks are isolated).
    assert_eq!(
        metric(
            &c,
            &sim,
            "vllm:prompt_tokens_cached_total",
            &[("engine", "7")]
        )
        .await,
        0.0
    );
    let r = send(
        &c,
        "POST",
        &sim.url(CHAT),
        &body,
        &[("X-data-parallel-rank", "4")],
    )
    .await
    .json();
    assert!(
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached")
            > 0
    );
    for bad in ["0", "3", "8", "x", "-1"] {
        let r = send(
            &c,
            "POST",
            &sim.url(CHAT),
            &body,
            &[("X-data-parallel-rank", bad)],
        )
        .await;
        assert_eq!(r.status, 400, "rank {bad}");
        assert_eq!(r.json()["error"]["param"], "x-data-parallel-rank");
    }
    // Without the header requests are balanced over the server's own ranks.
    for _ in 0..8 {
        assert_eq!(post(&c, &sim.url(CHAT), &body).await.status, 200);
    }
    for e in ["4", "5", "6", "7"] {
        assert!(
            metric(&c, &sim, "vllm:prompt_tokens_total", &[("engine", e)]).await > 0.0,
            "engine {e}"
        );
    }
}

#[tokio::test]
async fn api_key_guards_v1_only() {
    let sim = start(&["--instant", "--api-key", "s3cret"]).await;
    let c = client();
    let body = chat_body("hi", 1);
    assert_eq!(post(&c, &sim.url(CHAT), &body).await.status, 401);
    let wrong = send(
        &c,
        "POST",
        &sim.url(CHAT),
        &body,
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["error"]["type"], "AuthenticationError");
    let ok = send(
        &c,
        "POST",
        &sim.url(CHAT),
        &body,
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(get(&c, &sim.url("/v1/models")).await.status, 401);
    assert_eq!(get(&c, &sim.url("/metrics")).await.status, 200);
    assert_eq!(get(&c, &sim.url("/health")).await.status, 200);
}

#[tokio::test]
async fn bad_input_gets_clear_errors_and_the_server_keeps_serving() {
    let sim = start(&[
        "--instant",
        "--max-model-len",
        "64",
        "--max-body-bytes",
        "4096",
    ])
    .await;
    let c = client();
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "malformed JSON"),
        (r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":"x"}"#.into(), 400, "invalid request"),
        (r#"{"model":"sim-model"}"#.into(), 400, "messages"),
        (r#"{"model":"other","messages":[{"role":"user","content":"a"}]}"#.into(), 404, "does not exist"),
        (r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":0}"#.into(), 400, "max_tokens"),
        (r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":-3}"#.into(), 400, "max_tokens"),
        (chat_body(&words(4, 80), 1), 400, "maximum context length is 64"),
        (chat_body(&"x ".repeat(3000), 1), 413, "larger than the limit"),
        (r#"{"messages":[{"role":"user","content":"a"}],"vllm_xargs":{"agentic_context":{"program_id":"p"}}}"#.into(), 400, "vllm_xargs"),
    ];
    for (body, status, want) in &cases {
        let r = post(&c, &sim.url(CHAT), body).await;
        assert_eq!(r.status, *status, "{body}: {}", r.text());
        let j = r.json();
        assert!(
            j["error"]["message"]
                .as_str()
                .expect("message")
                .contains(want),
            "{body}: {j}"
        );
        assert_eq!(j["error"]["code"], *status);
    }
    assert_eq!(get(&c, &sim.url("/v1/nothing")).await.status, 404);
    assert_eq!(get(&c, &sim.url(CHAT)).await.status, 405);
    assert_eq!(
        post(&c, &sim.url(CHAT), &chat_body("still here", 1))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn metrics_parse_and_agree_with_served_requests() {
    let sim = start(&["--instant", "-d", "2"]).await;
    let c = client();
    let mut prompt_total = 0;
    for i in 0..6 {
        let r = send(
            &c,
            "POST",
            &sim.url(CHAT),
            &chat_body(&words(i % 2, 40), 5),
            &[("x-data-parallel-rank", "1")],
        )
        .await;
        prompt_total += r.json()["usage"]["prompt_tokens"].as_u64().expect("p");
    }
    let m = |n: &'static str| metric(&c, &sim, n, &[("engine", "1")]);
    assert_eq!(m("vllm:prompt_tokens_total").await, prompt_total as f64);
    assert_eq!(m("vllm:generation_tokens_total").await, 30.0);
    assert!(m("vllm:prompt_tokens_cached_total").await > 0.0);
    assert_eq!(m("vllm:num_requests_running").await, 0.0);
    assert_eq!(
        metric(
            &c,
            &sim,
            "vllm:request_success_total",
            &[("engine", "1"), ("finished_reason", "length")]
        )
        .await,
        6.0
    );
    assert_eq!(
        metric(&c, &sim, "vllm:generation_tokens_total", &[("engine", "0")]).await,
        0.0
    );
    let info = metric(
        &c,
        &sim,
        "vllm:cache_config_info",
        &[
            ("engine", "0"),
            ("num_gpu_blocks", "8192"),
            ("block_size", "16"),
        ],
    )
    .await;
    assert_eq!(info, 1.0);
    let text = get(&c, &sim.url("/metrics")).await.text();
    assert!(
        text.contains(
            "vllm:time_to_first_token_seconds_count{model_name=\"sim-model\",engine=\"1\"} 6"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn failure_injection_status_and_cut_stream() {
    let sim = start(&["--instant", "--fail-rate", "1", "--fail-status", "503"]).await;
    let c = client();
    let r = post(&c, &sim.url(CHAT), &chat_body("x", 3)).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["message"], "injected failure");

    let sim = start(&["--fail-rate", "1", "--fail-after-tokens", "2"]).await;
    let body =
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 20, "stream": true})
            .to_string();
    let req = hyper::Request::post(sim.url(CHAT))
        .body(Full::new(Bytes::from(body)))
        .expect("req");
    let resp = c.request(req).await.expect("headers arrive");
    assert_eq!(resp.status(), 200);
    let mut b = resp.into_body();
    let mut got = String::new();
    let err = loop {
        match b.frame().await {
            Some(Ok(f)) => got.push_str(&String::from_utf8_lossy(f.data_ref().expect("data"))),
            Some(Err(e)) => break Some(e),
            None => break None,
        }
    };
    assert!(err.is_some(), "the stream must be cut, got: {got}");
    assert_eq!(got.matches("\"content\"").count(), 2, "{got}");
    assert!(!got.contains("[DONE]"));
    // The cut request is aborted in the engine.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        metric(&c, &sim, "vllm:num_requests_running", &[]).await,
        0.0
    );
}

/// Polls the abort counter until it reaches `want` (1 s at most); returns the last value.
async fn aborts_reach(c: &HttpClient, sim: &Sim, want: f64) -> f64 {
    let mut aborted = 0.0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        aborted = metric(
            c,
            sim,
            "vllm:request_success_total",
            &[("finished_reason", "abort")],
        )
        .await;
        if aborted == want {
            break;
        }
    }
    aborted
}

#[tokio::test]
async fn client_disconnect_aborts_the_request() {
    // 1000 tokens at ~11 ms each would take 11 s of simulated time; we leave after the first.
    let sim = start(&[]).await;
    let c = client();
    let body =
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000, "stream": true})
            .to_string();
    let req = hyper::Request::post(sim.url(CHAT))
        .body(Full::new(Bytes::from(body)))
        .expect("req");
    let resp = c.request(req).await.expect("headers");
    let mut b = resp.into_body();
    let _first = b.frame().await.expect("a chunk").expect("ok");
    assert_eq!(
        metric(&c, &sim, "vllm:num_requests_running", &[]).await,
        1.0
    );
    drop(b);
    assert_eq!(aborts_reach(&c, &sim, 1.0).await, 1.0);
    assert_eq!(
        metric(&c, &sim, "vllm:num_requests_running", &[]).await,
        0.0
    );
    assert_eq!(metric(&c, &sim, "vllm:kv_cache_usage_perc", &[]).await, 0.0);

    // A non-streaming request whose client goes away is aborted too.
    let c2 = client();
    let url = sim.url(CHAT);
    let pending = tokio::spawn(async move {
        post(&c2, &url, &chat_body("y", 1000)).await;
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        metric(&c, &sim, "vllm:num_requests_running", &[]).await,
        1.0
    );
    pending.abort();
    assert_eq!(aborts_reach(&c, &sim, 2.0).await, 2.0);
}

#[tokio::test]
async fn shutdown_drains_requests_in_flight() {
    let mut sim = start(&["--time-scale", "20"]).await;
    let c = client();
    let url = sim.url(CHAT);
    let inflight = tokio::spawn(async move { post(&c, &url, &chat_body("drain me", 50)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    sim.stop();
    let r = inflight.await.expect("join");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["completion_tokens"], 50);
    tokio::time::timeout(Duration::from_secs(5), sim.done.take().expect("task"))
        .await
        .expect("server exits")
        .expect("task ok")
        .expect("serve ok");
}

#[tokio::test]
async fn virtual_ttft_through_http_matches_the_formula() {
    // At time scale 1 a 2000-token cold prompt's TTFT is intercept + linear*2 + quadratic*4.
    let sim = start(&[]).await;
    let c = client();
    let started = std::time::Instant::now();
    let r = post(
        &c,
        &sim.url("/v1/completions"),
        &json!({"prompt": (0..2000).collect::<Vec<u32>>(), "max_tokens": 1}).to_string(),
    )
    .await;
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(r.status, 200);
    let model = vllm_sim::timing::TimingModel::default();
    let want = model.cold_prefill_seconds(2000);
    let ttft_sum = metric(&c, &sim, "vllm:time_to_first_token_seconds_sum", &[]).await;
    assert!(
        (ttft_sum - want).abs() < 0.02,
        "ttft {ttft_sum} want {want}"
    );
    assert!(
        wall >= want * 0.9,
        "the HTTP layer waited in real time ({wall} s)"
    );
}

/// `--end-hint` (a benchmark bound): a Program's last request, marked `sim_end_program`, has
/// its own blocks evicted before older ones once it finishes; the system prompt it shares
/// with other Programs stays. Without the flag the marker changes nothing: LRU evicts the
/// older Program's blocks first.
#[tokio::test]
async fn an_ended_programs_own_blocks_go_first_under_the_end_hint() {
    async fn older_programs_cached_tokens(hint: bool) -> (u64, u64) {
        let mut args = vec![
            "--instant",
            "--num-gpu-blocks",
            "16",
            "--max-model-len",
            "256",
        ];
        if hint {
            args.push("--end-hint");
        }
        let sim = start(&args).await;
        let c = client();
        let system = words(1, 60);
        let session = |user: String, end: bool| {
            let mut b = json!({"model": "sim-model", "max_tokens": 1, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user}]});
            if end {
                b["vllm_xargs"] = json!({"sim_end_program": 1});
            }
            b.to_string()
        };
        let b = session(words(2, 60), false);
        assert_eq!(post(&c, &sim.url(CHAT), &b).await.status, 200);
        // The later Program ends: under the hint its own blocks move ahead of the older one's.
        let a = post(&c, &sim.url(CHAT), &session(words(3, 60), true)).await;
        assert_eq!(a.status, 200, "{}", a.text());
        // An unrelated prompt needs more blocks than are free, so some cached ones are evicted.
        let other = post(&c, &sim.url(CHAT), &chat_body(&words(4, 100), 1)).await;
        assert_eq!(other.status, 200, "{}", other.text());
        let cached = |r: serde_json::Value| {
            r["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .expect("cached_tokens")
        };
        let older = cached(post(&c, &sim.url(CHAT), &b).await.json());
        let fresh = cached(
            post(&c, &sim.url(CHAT), &session(words(5, 60), false))
                .await
                .json(),
        );
        (older, fresh)
    }
    let (with_hint, shared_with_hint) = older_programs_cached_tokens(true).await;
    let (without, _) = older_programs_cached_tokens(false).await;
    assert!(
        with_hint > without,
        "the older Program keeps more of its prefix when the ended one goes first: {with_hint} vs {without}"
    );
    // The system prompt and the user header after it (the first four 16-token blocks) survive
    // the hint: a new Program still finds them.
    assert!(
        shared_with_hint >= 64,
        "the shared system prompt stayed cached: {shared_with_hint}"
    );
}
