//! Reloads, connection timeouts, drain and shutdown delay, I/O threads and /status.

use super::*;

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
    let flags = program_router::config::flags::Flags {
        config: Some(path.clone()),
        ..Default::default()
    };
    let file = program_router::config::flags::load_file(&path).expect("file");
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
async fn a_connection_whose_request_is_on_the_wire_when_the_listener_stops_is_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = sim(&["--time-scale", "10"]).await;
    let mut r = router(workers(&[s.base()], 1)).await;
    // A request in flight keeps the drain going.
    let url = r.url(CHAT);
    let c = client();
    let inflight = tokio::spawn(async move { post(&c, &url, &chat("drain", 40)).await });
    // A client connected before the listener stops, and sends its request just after.
    let mut raw = tokio::net::TcpStream::connect(r.server.addr)
        .await
        .expect("connect");
    tokio::time::sleep(Duration::from_millis(100)).await;
    r.server.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(r.state.is_draining());
    let body = chat("late", 2);
    let req = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.write_all(req.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(inflight.await.expect("join").status, 200);
    r.server.stopped().await;
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
            // A thread names itself once it runs, so a just-spawned shard may briefly carry
            // its parent's name: wait for the names rather than read them once.
            let names = || -> Vec<String> {
                std::fs::read_dir("/proc/self/task")
                    .map(|d| {
                        d.flatten()
                            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let io = || {
                names()
                    .iter()
                    .filter(|n| n.starts_with("router-io-"))
                    .count()
            };
            let named = eventually(5.0, || async { io() >= 3 }).await;
            // All thread names on failure: a shard still under its parent's name shows there.
            assert!(named, "{io_threads:?}: {:?}", names());
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
        if io_threads == Some(3) {
            // Each I/O thread that served keeps a handle on the configuration; a reload lets
            // the replaced one go without waiting for a request on every thread.
            let replaced = std::sync::Arc::downgrade(&r.state.applied.load_full());
            let mut next = r.state.applied.load().config.clone();
            next.policy.kind = PolicyKind::Random;
            assert!(r.state.apply(next).expect("applied"));
            let gone = eventually(5.0, || async { replaced.upgrade().is_none() }).await;
            assert!(gone, "a replaced configuration outlived the reload");
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

/// The binary's log filter follows a reloaded `log_level` at once; a new `log_format` is refused
/// (the subscriber's format is fixed at start) and the applied configuration stays.
#[tokio::test]
async fn a_reloaded_log_level_applies_at_once_and_a_new_log_format_is_refused() {
    let s = sim(&["--instant"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("router.json");
    let base = json!({
        "host": "127.0.0.1", "port": 0, "prometheus_port": null,
        "workers": [{"url": s.base()}], "log_format": "json",
    });
    let write = |changes: serde_json::Value| {
        let mut cfg = base.clone();
        for (k, v) in changes.as_object().expect("object") {
            cfg[k] = v.clone();
        }
        let tmp = dir.path().join("router.json.tmp");
        std::fs::write(&tmp, cfg.to_string()).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
        cfg
    };
    write(json!({"log_level": "warn"}));
    let router = start_binary(&["--config".into(), path.display().to_string()]);
    let c = client();
    let status_url = format!("{}/status", router.base);
    let status = |c: &HttpClient| {
        let (c, url) = (c.clone(), status_url.clone());
        async move { get(&c, &url).await.json() }
    };
    let applied = |policy: &'static str| {
        let c = c.clone();
        move || {
            let c = c.clone();
            async move { status(&c).await["config"]["policy"] == policy }
        }
    };
    // Applied at `warn`: the reload's info line is filtered out.
    write(json!({"log_level": "warn", "policy": {"kind": "random"}}));
    assert!(eventually(5.0, applied("random")).await, "first reload");
    // Applied with `info`: the new filter already holds for this reload's own line.
    write(json!({"log_level": "info", "policy": {"kind": "round_robin"}}));
    assert!(
        eventually(5.0, applied("round_robin")).await,
        "second reload"
    );
    write(json!({"log_level": "info", "log_format": "text", "policy": {"kind": "random"}}));
    let refused = eventually(5.0, || async {
        status(&c).await["last_reload_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("log_format"))
    })
    .await;
    assert!(refused, "{}", status(&c).await);
    assert_eq!(status(&c).await["config"]["policy"], "round_robin");
    let log = stop_binary(router.child);
    assert_eq!(log.matches("configuration reloaded").count(), 1, "{log}");
    assert!(log.contains("configuration reload rejected"), "{log}");
}
