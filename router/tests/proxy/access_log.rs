//! The access log of the binary: one JSON line per request when its response ends, with the
//! tenant, Program, backend, queue wait, status, tokens and duration; none for probes and
//! /status; no key in it; off after a reload that says `access_log: false`. In text, piped (not a
//! terminal): no colour, and a client's control characters escaped.

use super::*;

/// The access lines of a JSON log.
fn access_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "access")
        .map(|v| v["fields"].clone())
        .collect()
}

#[tokio::test]
async fn every_request_gets_one_access_line_when_its_response_ends() {
    let s = sim(&["--instant"]).await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("router.json");
    let key = "ck-4f1d9a7c2e8b6035";
    let config = |access_log: bool| {
        json!({
            "host": "127.0.0.1", "port": 0, "prometheus_port": null,
            "workers": [{"url": s.base()}], "log_format": "json",
            "client_api_keys": [key], "access_log": access_log,
            "program_scheduling": {}, "fairness": {},
        })
    };
    let write = |cfg: serde_json::Value| {
        let tmp = dir.path().join("router.json.tmp");
        std::fs::write(&tmp, cfg.to_string()).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    };
    write(config(true));
    let router = start_binary(&["--config".into(), path.display().to_string()]);
    let c = client();
    let url = format!("{}{CHAT}", router.base);
    let auth = format!("Bearer {key}");
    let mut turn: serde_json::Value = serde_json::from_str(&chat("turn", 3)).expect("json");
    turn["vllm_xargs"] = json!({"agentic_context": {"program_id": "agent-7"}});
    turn["stream"] = json!(true);
    let r = send(
        &c,
        "POST",
        &url,
        &turn.to_string(),
        &[
            ("authorization", &auth),
            ("x-tenant-id", "acme"),
            ("x-request-id", "req-1"),
        ],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("[DONE]"));
    let refused = send(
        &c,
        "POST",
        &url,
        &chat("no key", 1),
        &[("x-request-id", "req-2")],
    )
    .await;
    assert_eq!(refused.status, 401);

    // Switched off by a reload: no line for what follows.
    write(config(false));
    let off = eventually(5.0, || async {
        let st = get(&c, &format!("{}/status", router.base)).await.json();
        st["last_reload_error"].is_null() && st["config"]["generation"].as_u64() > Some(1)
    })
    .await;
    assert!(off, "the reload applied");
    let quiet = send(
        &c,
        "POST",
        &url,
        &chat("quiet", 1),
        &[("authorization", &auth), ("x-request-id", "req-3")],
    )
    .await;
    assert_eq!(quiet.status, 200);

    let log = stop_binary(router.child);
    let lines = access_lines(&log);
    let by_id = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no access line for {id}:\n{log}"))
            .clone()
    };
    let ok = by_id("req-1");
    assert_eq!(ok["status"], 200, "{ok}");
    assert_eq!(ok["method"], "POST");
    assert_eq!(ok["path"], CHAT);
    assert_eq!(ok["tenant"], "acme");
    // Scoped to the client key's name, as the scheduler and /scheduling/diagnostics know it.
    assert_eq!(ok["program"], "key-0/agent-7");
    assert_eq!(ok["backend"], s.base(), "{ok}");
    assert_eq!(ok["end"], "complete");
    assert!(ok["prompt_tokens"].as_u64() > Some(0), "{ok}");
    assert_eq!(ok["completion_tokens"], 3, "{ok}");
    assert!(
        ok["duration_ms"].as_f64() >= ok["queue_wait_ms"].as_f64(),
        "{ok}"
    );
    let no = by_id("req-2");
    assert_eq!(
        (no["status"].as_u64(), no["error"].as_str()),
        (Some(401), Some("invalid_api_key")),
        "{no}"
    );
    assert!(no.get("backend").is_none(), "{no}");
    assert!(
        lines.iter().all(|l| l["request_id"] != "req-3"),
        "a line after access_log: false"
    );
    assert_eq!(lines.len(), 2, "one line per request: {lines:?}");
    assert!(!log.contains(key), "the log holds the client key");
}

/// The binary's flags: the API and metrics on ports the kernel picks, one worker, then `more`.
fn flags(worker: &str, more: &[&str]) -> Vec<String> {
    let base = [
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "0",
        "--worker-urls",
        worker,
    ];
    base.iter().chain(more).map(|a| a.to_string()).collect()
}

#[tokio::test]
async fn a_piped_text_log_has_no_escape_codes_and_a_client_cannot_break_a_line() {
    let s = sim(&["--instant"]).await;
    let router = start_binary(&flags(
        &s.base(),
        &["--enable-program-scheduling", "--log-format", "text"],
    ));
    let c = client();
    let url = format!("{}{CHAT}", router.base);
    // A Program id is the client's to choose: an escape sequence and a forged second line.
    let forged = "agent\u{1b}[31m-7\n2026-01-01T00:00:00.000000Z  INFO access: request status=200";
    let mut turn: serde_json::Value = serde_json::from_str(&chat("turn", 2)).expect("json");
    turn["vllm_xargs"] = json!({"agentic_context": {"program_id": forged}});
    let r = send(
        &c,
        "POST",
        &url,
        &turn.to_string(),
        &[("x-request-id", "req-t")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let log = stop_binary(router.child);
    assert!(
        !log.contains('\u{1b}'),
        "an escape character in the log:\n{log}"
    );
    // Lines that start as access lines (the forged one would, after a line break).
    let access: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.split_once(' ')
                .is_some_and(|(_, rest)| rest.starts_with(" INFO access: "))
        })
        .collect();
    assert_eq!(access.len(), 1, "one access line, none forged:\n{log}");
    let line = access[0];
    assert!(line.contains("request_id=req-t"), "{line}");
    assert!(
        line.contains(r#"program="agent\u{1b}[31m-7\n2026"#),
        "{line}"
    );
}

#[tokio::test]
async fn a_client_that_leaves_before_its_answer_gets_an_abandoned_line() {
    let s = sim(&[]).await; // real time: 1000 tokens take ~11 s
    let router = start_binary(&flags(&s.base(), &["--log-format", "json"]));
    let api: std::net::SocketAddr = router
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("listening address");
    let body = chat("long", 1000);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: req-gone\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conn = tokio::net::TcpStream::connect(api).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut conn, head.as_bytes())
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(conn);
    let c = client();
    let logged = eventually(5.0, || async {
        // The line is written when the router lets the request go; a second request's line
        // after it shows the log has moved on.
        send(&c, "GET", &format!("{}/v1/models", router.base), "", &[])
            .await
            .status
            == 200
    })
    .await;
    assert!(logged);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = stop_binary(router.child);
    let gone = access_lines(&log)
        .into_iter()
        .find(|l| l["request_id"] == "req-gone")
        .unwrap_or_else(|| panic!("no access line for the request:\n{log}"));
    assert_eq!(gone["status"], 499, "{gone}");
    assert_eq!(gone["end"], "abandoned", "{gone}");
    assert!(gone["duration_ms"].as_f64() < Some(5_000.0), "{gone}");
}
