//! The spec's Program-scheduling events in the router's log: the capacity-observation fallback
//! for a rank that never reports (and no "recovered" for the first report at start), and the
//! DEBUG events `capacity_observation`, `request_dispatch` and `continuity_sample`.

use super::*;

/// The fields of the JSON log lines of `log` whose `event` is `event`, with their `level`.
fn events(log: &str, event: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["event"] == event)
        .map(|mut v| {
            let mut fields = v["fields"].take();
            fields["level"] = v["level"].take();
            fields
        })
        .collect()
}

/// A worker that answers every request 200 with an empty body: healthy, but its `/metrics`
/// never reports an engine. Serves on a thread for the rest of the test process.
fn silent_worker() -> String {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let url = format!("http://127.0.0.1:{}", l.local_addr().expect("addr").port());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    url
}

#[tokio::test]
async fn the_spec_events_are_logged_and_a_silent_rank_falls_back_once() {
    let s = sim(&["--time-scale", "20"]).await;
    let silent = silent_worker();
    let ps = r#"{"metrics_interval_seconds": 0.2, "token_capacity_per_dp_rank": 8192}"#;
    let args = [
        "--host",
        "127.0.0.1",
        "--prometheus-host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--worker-urls",
        &s.base(),
        &silent,
        "--enable-program-scheduling",
        "--program-scheduling-config-json",
        ps,
        "--log-level",
        "debug",
        "--log-format",
        "json",
    ]
    .map(String::from);
    let router = start_binary(&args);
    let c = client();
    let url = format!("{}{CHAT}", router.base);
    // Two turns of one Program with a tool call between them: one return interval.
    for turn in 0..2 {
        let reply = post(
            &c,
            &url,
            &program_body("prog-e", 20, json!({"step_id": turn})),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    let log = stop_binary(router.child);

    let fallback = events(&log, "capacity_observation_fallback");
    assert_eq!(
        fallback.len(),
        1,
        "one fallback, for the silent worker: {fallback:?}"
    );
    assert_eq!(fallback[0]["target"], silent.as_str(), "{fallback:?}");
    assert_eq!(fallback[0]["level"], "WARN", "{fallback:?}");
    assert!(
        events(&log, "capacity_observation_recovered").is_empty(),
        "the first report at start is no recovery"
    );
    let observed = events(&log, "capacity_observation");
    assert!(
        observed.iter().any(|e| e["target"] == s.base().as_str()),
        "{observed:?}"
    );
    assert!(!events(&log, "request_dispatch").is_empty(), "{log}");
    let samples = events(&log, "continuity_sample");
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert!(
        samples[0]["seconds"].as_f64().is_some_and(|s| s > 0.5),
        "{samples:?}"
    );
}

/// A worker that is down (connection refused) beside a live one: once the first health round
/// has run, new Programs bind to the live worker only, so every one of them is served (before,
/// a Program bound to the dead worker got 503 `no_healthy_target` on every turn).
#[tokio::test]
async fn new_programs_are_not_bound_to_a_worker_that_is_down() {
    let s = sim(&["--time-scale", "20"]).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        format!("http://127.0.0.1:{}", l.local_addr().expect("addr").port())
    };
    let cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        agentic_context: AgenticContextMode::Strip,
        ..workers(&[s.base(), dead.clone()], 1)
    };
    let r = router(cfg).await;
    let c = client();
    // The first health round runs at start; wait until the router knows the dead worker.
    let dead_known = eventually(10.0, || async {
        let st = get(&c, &r.url("/status")).await.json();
        st["targets"].as_array().is_some_and(|t| {
            t.iter()
                .any(|x| x["url"] == dead.as_str() && x["routable"] == false)
        })
    })
    .await;
    assert!(dead_known, "{}", get(&c, &r.url("/status")).await.text());
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..8 {
        let reply = post(
            &c,
            &r.url(CHAT),
            &program_body(&format!("p{i}"), 10, json!({})),
        )
        .await;
        assert_eq!(reply.status, 200, "p{i}: {}", reply.text());
    }
}
