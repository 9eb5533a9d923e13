//! The bounds every listener keeps by default, against real routers over loopback: body size and
//! body time, connection caps, idle connections, a backend that stalls mid-stream, and the
//! metrics listener's own limits, and `/status`, which nothing derived from a key reaches. Each
//! test acts as the client (or backend) a bound is there for and checks what it gets and what
//! is counted.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads from `conn` until the text read so far contains `want` or `secs` pass.
async fn read_until_text(conn: &mut TcpStream, want: &str, secs: f64) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    while !String::from_utf8_lossy(&got).contains(want) {
        match tokio::time::timeout_at(deadline, conn.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_100_mib_body_gets_413_by_default_without_being_read() {
    let s = sim(&["--instant"]).await;
    let r = router(workers(&[s.base()], 1)).await;
    assert_eq!(
        r.state.applied.load().config.limits.max_payload_size,
        64 * 1024 * 1024
    );
    for (how, extra) in [
        ("declared", "content-length: 104857600\r\n"),
        ("chunked", "transfer-encoding: chunked\r\n"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(r.server.addr)
            .await
            .expect("connect");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}\r\n"
        );
        conn.write_all(head.as_bytes()).await.expect("head");
        if how == "chunked" {
            // 65 MiB in 1 MiB chunks: the answer comes once the limit is passed, not at the end.
            let chunk = vec![b' '; 1024 * 1024];
            let mut sent = 0usize;
            for _ in 0..65 {
                let framed =
                    [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
                if conn.write_all(&framed).await.is_err() {
                    break;
                }
                sent += 1;
            }
            assert!(sent <= 65, "{sent}");
        }
        // The declared body is never sent: the answer comes without it.
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("answered without the body")
            .expect("read");
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 413"), "{how}: {text}");
        assert!(text.contains("payload_too_large"), "{how}: {text}");
    }
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.client_body_timeout_secs = Some(0.3);
    let r = router(cfg).await;
    let mut conn = TcpStream::connect(r.server.addr).await.expect("connect");
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"model\":",
    )
    .await
    .expect("write");
    let text = read_until_text(&mut conn, "body_timeout", 5.0).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        closed_within(&mut conn, 5.0).await,
        "then the connection closes"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once_and_counted() {
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.max_client_connections = Some(2);
    let r = router(cfg).await;
    // The readiness checks' pooled connection closes in the background: start from none open.
    let idle = eventually(5.0, || async { r.state.api_connections.count() == 0 }).await;
    assert!(idle);
    let first = TcpStream::connect(r.server.addr).await.expect("connect");
    let _second = TcpStream::connect(r.server.addr).await.expect("connect");
    // connect() returns once the kernel queued the connection; the I/O shards accept in their
    // own time, so the third is the one over the cap only once both are held.
    let held = eventually(5.0, || async { r.state.api_connections.count() == 2 }).await;
    assert!(held, "both connections accepted");
    let mut third = TcpStream::connect(r.server.addr).await.expect("connect");
    assert!(closed_within(&mut third, 5.0).await, "over the cap");
    let c = client();
    let base = format!("http://{}", r.metrics_addr);
    let by_listener = |name: &'static str| metric(&c, &base, name, &[("listener", "api")]);
    assert_eq!(
        by_listener("program_router_connections_shed_total").await,
        1.0
    );
    assert_eq!(by_listener("program_router_connections_open").await, 2.0);
    // A place freed is a place to take.
    drop(first);
    let served = eventually(5.0, || async {
        let mut conn = TcpStream::connect(r.server.addr).await.expect("connect");
        if conn
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .is_err()
        {
            return false;
        }
        read_until_text(&mut conn, "OK", 2.0)
            .await
            .starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(served);
}

#[tokio::test]
async fn an_idle_connection_is_closed_over_http1_and_http2() {
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    // The header timeout would close an idle HTTP/1 connection first: take it out of the way.
    cfg.limits.client_header_timeout_secs = None;
    cfg.limits.client_idle_timeout_secs = Some(0.5);
    let r = router(cfg).await;

    let mut h1 = TcpStream::connect(r.server.addr).await.expect("connect");
    h1.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let text = read_until_text(&mut h1, "OK", 5.0).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed_within(&mut h1, 5.0).await, "HTTP/1 idle connection");

    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(r.server.addr).await.expect("c"));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .expect("HTTP/2 handshake");
    let driver = tokio::spawn(conn);
    let req = http::Request::get(r.url("/health"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("answered");
    assert_eq!(resp.status(), 200);
    let ended = tokio::time::timeout(Duration::from_secs(5), driver).await;
    assert!(
        ended.is_ok(),
        "the server closed the idle HTTP/2 connection"
    );
}

#[tokio::test]
async fn a_backend_that_stalls_mid_stream_ends_the_stream_with_an_error_event_and_trips_its_breaker()
 {
    // Every request streams two tokens and then holds its connection open, silent.
    let s = sim(&[
        "--fail-rate",
        "1",
        "--fail-after-tokens",
        "2",
        "--fail-stall",
    ])
    .await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.upstream_idle_timeout_secs = Some(0.5);
    cfg.circuit_breaker.failure_threshold = 1;
    let r = router(cfg).await;
    let c = client();
    let body = serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 20,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let started = std::time::Instant::now();
    let resp = post(&c, &r.url("/v1/chat/completions"), &body).await;
    assert_eq!(resp.status, 200);
    let text = resp.text();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended, not held"
    );
    assert!(
        text.contains("\"delta\""),
        "the tokens sent before the stall: {text}"
    );
    assert!(
        text.contains("\"code\":\"upstream_idle_timeout\""),
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    let st = get(&c, &r.url("/status")).await.json();
    assert_eq!(st["targets"][0]["circuit"], "open", "{st}");
}

#[tokio::test]
async fn the_metrics_listener_serves_only_metrics_and_closes_slow_scrapers() {
    let s = sim(&["--instant"]).await;
    let r = router(workers(&[s.base()], 1)).await;
    let c = client();
    let other = get(&c, &format!("http://{}/status", r.metrics_addr)).await;
    assert_eq!(other.status, 404);
    // A scraper that never finishes its headers is closed after the fixed header timeout.
    let mut slow = TcpStream::connect(r.metrics_addr).await.expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\n")
        .await
        .expect("write");
    let limit = program_router::server::metrics_listener::HEADER_TIMEOUT.as_secs_f64();
    assert!(closed_within(&mut slow, limit + 5.0).await);
}

#[tokio::test]
async fn two_configs_that_differ_only_in_their_keys_give_the_same_status() {
    let s = sim(&["--instant"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let c = client();
    let mut docs = Vec::new();
    for (i, key) in ["sk-first-0123456789", "sk-second-9876543210"]
        .iter()
        .enumerate()
    {
        let path = dir.path().join(format!("router-{i}.json"));
        let file = serde_json::json!({
            "workers": [{"url": s.base()}],
            "api_key": key,
            "client_api_keys": [format!("{key}-client")],
        });
        std::fs::write(&path, file.to_string()).expect("write");
        let flags = program_router::config::flags::Flags {
            config: Some(path.clone()),
            ..Default::default()
        };
        let cfg = flags
            .effective(Some(
                program_router::config::flags::load_file(&path).expect("file"),
            ))
            .expect("valid");
        let r = router_with(cfg, flags).await;
        let mut doc = get(&c, &r.url("/status")).await.json();
        // What differs between any two routers: where the file is, when it loaded, timings.
        doc["config"]["source"] = serde_json::Value::Null;
        doc["config"]["loaded_at_unix"] = serde_json::Value::Null;
        for t in doc["targets"].as_array_mut().expect("targets") {
            t["observation_age_seconds"] = serde_json::Value::Null;
        }
        let text = doc.to_string();
        assert!(!text.contains(key), "{text}");
        docs.push(doc);
    }
    assert_eq!(docs[0], docs[1]);
}

#[tokio::test]
async fn request_bytes_past_the_budget_get_503_and_are_given_back_when_responses_end() {
    // Streams that stall after a token: each response stays open, holding its request's bytes.
    let s = sim(&[
        "--fail-rate",
        "1",
        "--fail-after-tokens",
        "1",
        "--fail-stall",
    ])
    .await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.limits.max_payload_size = 4096;
    cfg.limits.max_buffered_bytes = Some(5000);
    cfg.limits.upstream_idle_timeout_secs = None;
    let r = router(cfg).await;
    let body = |pad: usize| {
        serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 5,
            "messages": [{"role": "user", "content": "x".repeat(pad)}]})
        .to_string()
    };
    // Two 2,000-byte requests held open: 4,000 of 5,000 bytes.
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut conn = TcpStream::connect(r.server.addr).await.expect("connect");
        let b = body(1900);
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            b.len()
        );
        conn.write_all(head.as_bytes()).await.expect("head");
        conn.write_all(b.as_bytes()).await.expect("body");
        let text = read_until_text(&mut conn, "data:", 5.0).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        open.push(conn);
    }
    let c = client();
    let refused = post(&c, &r.url("/v1/chat/completions"), &body(1900)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "overloaded");
    assert!(refused.headers.contains_key("retry-after"));
    let base = format!("http://{}", r.metrics_addr);
    let shed = metric(&c, &base, "program_router_buffered_bytes_shed_total", &[]).await;
    assert_eq!(shed, 1.0);
    assert!(metric(&c, &base, "program_router_buffered_request_bytes", &[]).await >= 3800.0);
    // A client that leaves gives its bytes back.
    drop(open);
    let back = eventually(5.0, || async { r.state.buffered.used() == 0 }).await;
    assert!(back, "{} bytes still held", r.state.buffered.used());
}

#[tokio::test]
async fn the_routers_log_holds_no_key_even_at_debug() {
    let s = sim(&["--instant"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let (worker_key, client_key) = ("wk-5d1c7a9e3f2b8046", "ck-8e4b2f6a1d9c3075");
    let peer_secret = "ps-3f9a1c7e5b2d8046aa71c3e9f5b2d804";
    let secret_file = dir.path().join("peer");
    std::fs::write(&secret_file, peer_secret).expect("secret");
    let args = [
        "--host",
        "127.0.0.1",
        "--prometheus-host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--peer-port",
        "0",
        "--peer-host",
        "127.0.0.1",
        "--peer-secret-file",
        secret_file.to_str().expect("utf-8 path"),
        "--worker-urls",
        &s.base(),
        "--api-key",
        worker_key,
        "--client-api-keys",
        client_key,
        "--log-level",
        "debug",
    ]
    .map(String::from);
    let router = start_binary(&args);
    let c = client();
    let url = |p: &str| format!("{}{p}", router.base);
    let chat = chat("hello", 2);
    for key in [client_key, worker_key, "wrong-key"] {
        let auth = format!("Bearer {key}");
        send(
            &c,
            "POST",
            &url("/v1/chat/completions"),
            &chat,
            &[("authorization", &auth)],
        )
        .await;
        send(
            &c,
            "GET",
            &url("/scheduling/diagnostics"),
            "",
            &[("authorization", &auth)],
        )
        .await;
    }
    let peer = router.peer.as_deref().expect("a peer listener");
    let peer_url = format!("{peer}/peers/usage");
    send(
        &c,
        "GET",
        &peer_url,
        "",
        &[("x-program-router-peer-key", "guess")],
    )
    .await;
    get(&c, &url("/status")).await;
    // The metrics listener's port came back on stdout, beside the API's and the peers'.
    let metrics = router.metrics.as_deref().expect("a metrics listener");
    assert_eq!(get(&c, &format!("{metrics}/metrics")).await.status, 200);
    let log = stop_binary(router.child);
    assert!(log.contains("program-router listening"), "{log}");
    for key in [worker_key, client_key, peer_secret] {
        assert!(!log.contains(key), "the log holds a key: {key}");
    }
}
