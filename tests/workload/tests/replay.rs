//! The real-time replay driver against an in-process vllm-sim on loopback: streamed requests with
//! their time to first token, the request budget, and the `progbench replay` command end to end.
//! No timing assertions beyond ordering.

use std::time::Duration;

use progbench::replay::{ContextMode, Endpoints, ReplayConfig, replay};
use progbench::workload::{Preset, generate};

async fn simulator() -> vllm_sim::server::Spawned {
    // 50 simulated seconds per wall second, as the replays below assume.
    vllm_sim::server::spawn_with_flags(&["--time-scale", "50"], Duration::from_secs(5))
        .await
        .expect("simulator")
}

fn config(url: String, stream: bool, max_requests: Option<u64>) -> ReplayConfig {
    ReplayConfig {
        endpoints: Endpoints::one(url),
        model: "sim-model".into(),
        context: ContextMode::String,
        time_scale: 50.0,
        max_model_len: 32768,
        limit: Duration::from_secs(60),
        stream,
        max_requests,
        api_key: None,
        clairvoyant_capacity: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_endpoints_take_turns_within_each_program() {
    // As behind a load balancer without affinity: each Program's consecutive turns go to
    // consecutive endpoints, so every Program meets both.
    let (a, b) = (simulator().await, simulator().await);
    let turns = generate(Preset::Chat, 2, 1.0, 3);
    let mut cfg = config(a.base(), false, None);
    cfg.endpoints = Endpoints::new(vec![a.base(), b.base()]);
    let report = replay(&turns, cfg).await;
    assert_eq!(report.errors, 0);
    let c = testkit::client();
    let mut per_sim = Vec::new();
    for s in [&a, &b] {
        let text = testkit::get(&c, &format!("{}/metrics", s.base()))
            .await
            .text();
        per_sim.push(testkit::metric_value(
            &text,
            "vllm:request_success_total",
            &[],
            true,
        ));
    }
    let total = report.requests.len() as f64;
    assert_eq!(per_sim[0] + per_sim[1], total, "{per_sim:?}");
    // Two Programs, turns alternating from different starts: the split is even within one turn
    // per Program.
    assert!(
        (per_sim[0] - per_sim[1]).abs() <= 2.0,
        "{per_sim:?} of {total}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_replay_records_first_tokens_and_rebuilds_the_history() {
    let sim = simulator().await;
    let turns = generate(Preset::Chat, 2, 1.0, 3);
    let report = replay(&turns, config(sim.base(), true, None)).await;
    assert_eq!(report.errors, 0, "{:?}", report.requests);
    assert_eq!(report.requests.len(), turns.len());
    assert_eq!(report.completed, 2);
    for r in &report.requests {
        assert_eq!(r.status, 200);
        let ttft = r.ttft_seconds.expect("streamed: a first token");
        assert!(ttft > 0.0 && ttft <= r.latency_seconds, "{r:?}");
        assert!(
            r.completion_tokens > 0 && r.prompt_tokens > 0,
            "usage from the last chunk"
        );
    }
    // Every later turn reuses its Program's context, generated text included: the replies were
    // rebuilt from the streamed chunks exactly, or the prefix would break at the first reply.
    for r in report.requests.iter().filter(|r| r.step > 0) {
        let previous = report
            .requests
            .iter()
            .find(|q| q.program == r.program && q.step + 1 == r.step)
            .expect("previous turn");
        assert!(
            r.cached_tokens >= previous.prompt_tokens + previous.completion_tokens - 32,
            "{previous:?} then {r:?}"
        );
    }
    // Unstreamed: no time to first token.
    let plain = replay(&turns, config(sim.base(), false, None)).await;
    assert!(plain.requests.iter().all(|r| r.ttft_seconds.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_endpoint_is_replayed_with_the_api_key() {
    let sim = vllm_sim::server::spawn_with_flags(
        &["--time-scale", "50", "--api-key", "secret"],
        Duration::from_secs(5),
    )
    .await
    .expect("simulator");
    let turns = generate(Preset::Chat, 1, 1.0, 5);
    let refused = replay(&turns, config(sim.base(), false, None)).await;
    assert_eq!(refused.errors, 1, "{:?}", refused.requests);
    assert_eq!(refused.requests[0].status, 401);
    let mut cfg = config(sim.base(), false, None);
    cfg.api_key = Some("secret".into());
    let served = replay(&turns, cfg).await;
    assert_eq!(served.errors, 0, "{:?}", served.requests);
    assert_eq!(served.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_budget_stops_programs_where_they_are() {
    let sim = simulator().await;
    let turns = generate(Preset::Chat, 3, 1.0, 4);
    assert!(turns.len() > 4);
    let report = replay(&turns, config(sim.base(), false, Some(4))).await;
    assert_eq!(report.errors, 0);
    assert_eq!(report.requests.len(), 4);
    assert!(report.stopped >= 1, "{report:?}");
    assert_eq!(report.completed + report.stopped + report.truncated, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_command_summarizes_a_run_and_refuses_remote_urls() {
    let sim = simulator().await;
    let dir = std::env::temp_dir().join(format!("progbench-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("replay.json");
    let bin = env!("CARGO_BIN_EXE_progbench");
    let (url, out) = (sim.base(), json.clone());
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args([
                "replay",
                "--preset",
                "chat",
                "--programs",
                "2",
                "--rate",
                "1",
            ])
            .args(["--url", &url, "--context", "string", "--stream"])
            .args(["--time-scale", "50", "--limit-secs", "60", "--json"])
            .arg(&out)
            .output()
            .expect("run progbench")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("token hit") && stdout.contains("TTFT p50"),
        "{stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    let s = &doc["summary"];
    assert_eq!(s["errors"], 0);
    assert_eq!(s["programs_completed"], 2);
    assert!(s["token_hit"].as_f64().expect("hit") > 0.0);
    assert!(s["oracle_token_hit"].as_f64().expect("H*") > 0.0);
    assert!(s["p50_ttft"].as_f64().is_some());
    assert_eq!(
        doc["report"]["requests"].as_array().map(Vec::len),
        s["requests"].as_u64().map(|n| n as usize)
    );
    std::fs::remove_dir_all(&dir).ok();

    // A remote URL is refused before anything is sent.
    let remote = std::process::Command::new(bin)
        .args(["replay", "--programs", "1", "--url", "http://10.0.0.1:8000"])
        .output()
        .expect("run progbench");
    assert!(!remote.status.success());
    assert!(String::from_utf8_lossy(&remote.stderr).contains("not on loopback"));
    let zero = std::process::Command::new(bin)
        .args([
            "replay",
            "--url",
            "http://127.0.0.1:9",
            "--max-requests",
            "0",
        ])
        .output()
        .expect("run progbench");
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--max-requests"));
}
