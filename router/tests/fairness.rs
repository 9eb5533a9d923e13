//! Fair multi-tenant queueing through the router against vllm-sim: backpressure from the
//! simulator's `vllm:num_requests_waiting` keeps requests in the router, where a light tenant
//! overtakes a power user's backlog; stale metrics hold everything; full tenant queues get 429
//! with Retry-After, waits past the queue timeout get 504, and a client that leaves is removed.

mod common;

use std::time::{Duration, Instant};

use common::*;
use program_router::config::FairnessConfig;
use program_router::config::fairness::PriorityClass;

fn fairness(max_waiting: u32) -> FairnessConfig {
    FairnessConfig {
        classes: vec![PriorityClass {
            name: "standard".into(),
            max_waiting_requests: max_waiting,
            only_when_idle: false,
            max_tpot_seconds: None,
        }],
        default_class: "standard".into(),
        ..Default::default()
    }
}

/// Fairness that holds every request: no observation is ever this fresh, so every target
/// counts as saturated.
fn holding() -> FairnessConfig {
    FairnessConfig {
        metrics_max_age_seconds: 1e-6,
        ..fairness(3)
    }
}

/// Sends one request of tenant "acme" in the background; returns once it waits in the queue.
async fn queue_one(r: &Router) -> tokio::task::JoinHandle<Reply> {
    let (c, url) = (client(), r.url("/v1/chat/completions"));
    let waiting = tokio::spawn(async move { chat_as(&c, &url, "acme", 4).await });
    assert!(eventually(5.0, || async { depth(&client(), r).await == 1.0 }).await);
    waiting
}

/// Requests waiting in the router's fair queue, all classes.
async fn depth(c: &HttpClient, r: &Router) -> f64 {
    let m = format!("http://{}", r.metrics_addr);
    metric(c, &m, "program_router_fair_queue_depth", &[]).await
}

async fn chat_as(c: &HttpClient, url: &str, tenant: &str, tokens: u32) -> Reply {
    send(
        c,
        "POST",
        url,
        &chat(&format!("from {tenant}"), tokens),
        &[("x-tenant-id", tenant)],
    )
    .await
}

/// A power tenant's 16 requests of 24 tokens to `url`, each reporting its status and when it
/// finished after `started`.
fn power_backlog(url: &str, started: Instant) -> Vec<tokio::task::JoinHandle<(u16, Duration)>> {
    (0..16)
        .map(|_| {
            let (c, url) = (client(), url.to_string());
            tokio::spawn(async move {
                let reply = chat_as(&c, &url, "power", 24).await;
                (reply.status, started.elapsed())
            })
        })
        .collect()
}

/// How many of the power requests finished (all with 200) before `light_done`.
async fn finished_before(
    power: Vec<tokio::task::JoinHandle<(u16, Duration)>>,
    light_done: Duration,
) -> usize {
    let mut n = 0;
    for p in power {
        let (status, done) = p.await.expect("join");
        assert_eq!(status, 200);
        n += usize::from(done < light_done);
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_holds_the_backlog_in_the_router_and_a_light_tenant_overtakes_it() {
    // One rank that runs two sequences at a time: everything beyond waits somewhere.
    let sim = sim(&["--max-num-seqs", "2"]).await;
    let mut cfg = workers(&[sim.base()], 1);
    cfg.fairness = Some(fairness(1));
    let r = router(cfg).await;
    let url = r.url("/v1/chat/completions");
    let started = Instant::now();

    let power = power_backlog(&url, started);
    // Let the backlog form, then the light tenant asks once.
    let c = client();
    assert!(
        eventually(5.0, || async { depth(&c, &r).await >= 8.0 }).await,
        "the router holds the backlog"
    );
    let sim_waiting = metric(&c, &sim.base(), "vllm:num_requests_waiting", &[]).await;
    assert!(
        sim_waiting <= 3.0,
        "the backend queue stays short: {sim_waiting}"
    );
    let light = chat_as(&c, &url, "light", 24).await;
    assert_eq!(light.status, 200, "{}", light.text());
    let power_before_light = finished_before(power, started.elapsed()).await;
    // FIFO would serve all 16 first; the fair queue lets light in after the few already sent.
    assert!(
        power_before_light <= 8,
        "{power_before_light} of 16 power requests finished before the light one"
    );
    let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    assert_eq!(
        metric_in(
            &text,
            "program_router_fair_requests_total",
            &[("outcome", "dispatched")]
        ),
        17.0
    );
    assert_eq!(
        metric_in(&text, "program_router_fair_queue_depth", &[]),
        0.0
    );
    let jain = metric_in(&text, "program_router_fair_jain_index", &[]);
    assert!(jain > 0.0 && jain <= 1.0, "jain {jain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenant_on_another_replica_overtakes_the_backlog_held_by_the_first() {
    // Two router replicas in front of one engine, each tenant reaching only one of them (as
    // with ClientIP affinity): each replica orders only its own queue, but both send only into
    // the room the engine reports, so the power tenant's backlog stays in its replica and the
    // light tenant's request waits behind the few already in the engine, not behind all 16.
    let sim = sim(&["--max-num-seqs", "2"]).await;
    let mut cfg = workers(&[sim.base()], 1);
    cfg.fairness = Some(fairness(1));
    let (a, b) = (router(cfg.clone()).await, router(cfg).await);
    let started = Instant::now();
    let power = power_backlog(&a.url("/v1/chat/completions"), started);
    let c = client();
    assert!(
        eventually(5.0, || async { depth(&c, &a).await >= 8.0 }).await,
        "replica a holds the backlog"
    );
    let light = chat_as(&c, &b.url("/v1/chat/completions"), "light", 24).await;
    assert_eq!(light.status, 200, "{}", light.text());
    let power_before_light = finished_before(power, started.elapsed()).await;
    // Without fairness on replica a all 16 would sit in the engine's queue ahead of it. Each
    // replica counts only what it sent since the engine's last report, so together they may put
    // one request each into that queue between two polls: a few ahead of the light one, at most.
    // (Measured: 1.)
    assert!(
        power_before_light <= 6,
        "{power_before_light} of 16 power requests finished before the light one"
    );
    assert_eq!(depth(&c, &a).await, 0.0);
    assert_eq!(depth(&c, &b).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_metrics_hold_requests_full_queues_get_429_and_waits_time_out_with_504() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    let mut f = holding();
    f.max_queue_per_tenant = 2;
    f.queue_timeout_seconds = 1.0;
    cfg.fairness = Some(f);
    let r = router(cfg).await;
    let url = r.url("/v1/chat/completions");
    let (c1, c2, u1, u2) = (client(), client(), url.clone(), url.clone());
    let a = tokio::spawn(async move { chat_as(&c1, &u1, "acme", 4).await });
    let b = tokio::spawn(async move { chat_as(&c2, &u2, "acme", 4).await });
    let c = client();
    assert!(eventually(5.0, || async { depth(&c, &r).await == 2.0 }).await);
    let full = chat_as(&c, &url, "acme", 4).await;
    assert_eq!(full.status, 429, "{}", full.text());
    assert_eq!(full.json()["error"]["code"], "tenant_queue_full");
    assert_eq!(
        full.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // Another tenant still gets in line.
    let other = chat_as(&c, &url, "globex", 4).await;
    assert_eq!(other.status, 504);
    for h in [a, b] {
        let reply = h.await.expect("join");
        assert_eq!(reply.status, 504, "{}", reply.text());
        assert_eq!(reply.json()["error"]["code"], "queue_timeout");
    }
    assert_eq!(
        metric(&c, &sim.base(), "vllm:request_success_total", &[]).await,
        0.0
    );
    let text = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    assert_eq!(
        metric_in(
            &text,
            "program_router_fair_requests_total",
            &[("outcome", "timeout")]
        ),
        3.0
    );
    assert_eq!(
        metric_in(
            &text,
            "program_router_fair_requests_total",
            &[("outcome", "queue_full")]
        ),
        1.0
    );
    assert_eq!(
        metric_in(&text, "program_router_fair_queue_depth", &[]),
        0.0
    );
    assert_eq!(
        metric_in(&text, "program_router_fair_tenant_queue_depth", &[]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_is_removed_from_the_queue() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    cfg.fairness = Some(holding());
    let r = router(cfg).await;
    let url = r.url("/v1/chat/completions");
    let c = client();
    let gone = tokio::time::timeout(Duration::from_millis(300), chat_as(&c, &url, "acme", 4)).await;
    assert!(gone.is_err(), "held in the queue");
    let m = format!("http://{}", r.metrics_addr);
    assert!(
        eventually(5.0, || async {
            metric(
                &c,
                &m,
                "program_router_fair_requests_total",
                &[("outcome", "cancelled")],
            )
            .await
                == 1.0
        })
        .await,
        "the abandoned request was cancelled"
    );
    assert_eq!(depth(&c, &r).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_requests_still_queued_at_its_midpoint_with_503() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    let mut f = holding();
    f.queue_timeout_seconds = 60.0;
    cfg.fairness = Some(f);
    cfg.limits.drain_timeout_secs = 1.0;
    let mut r = router(cfg).await;
    let waiting = queue_one(&r).await;
    let started = Instant::now();
    r.server.stop();
    let reply = waiting.await.expect("join");
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.json()["error"]["code"], "shutting_down");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "answered at half the 1 s drain timeout, after {waited:?}"
    );
    r.server.stopped().await;
    let text = String::from_utf8(r.state.metrics.render()).expect("utf-8");
    assert_eq!(
        metric_in(
            &text,
            "program_router_fair_requests_total",
            &[("outcome", "shutting_down")]
        ),
        1.0
    );
    assert_eq!(
        metric_in(&text, "program_router_fair_queue_depth", &[]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuning_reload_keeps_queued_requests() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    let mut f = holding();
    f.queue_timeout_seconds = 60.0;
    cfg.fairness = Some(f);
    let r = router(cfg).await;
    let c = client();
    let waiting = queue_one(&r).await;
    // A weight change keeps the request in line (not 503 `reconfigured`).
    let mut cfg = r.state.applied.load().config.clone();
    if let Some(f) = cfg.fairness.as_mut() {
        f.tenant_weights.insert("acme".into(), 3.0);
    }
    assert!(r.state.apply(cfg).expect("valid"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "still queued after the reload");
    assert_eq!(depth(&c, &r).await, 1.0);
    // Trusting observations again releases it.
    let mut cfg = r.state.applied.load().config.clone();
    if let Some(f) = cfg.fairness.as_mut() {
        f.metrics_max_age_seconds = 30.0;
    }
    assert!(r.state.apply(cfg).expect("valid"));
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("released after the reload")
        .expect("join");
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_class_is_a_400_naming_the_classes() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    cfg.fairness = Some(FairnessConfig::default());
    let r = router(cfg).await;
    let c = client();
    let reply = send(
        &c,
        "POST",
        &r.url("/v1/chat/completions"),
        &chat("hi", 2),
        &[("x-priority-class", "platinum")],
    )
    .await;
    assert_eq!(reply.status, 400);
    let msg = reply.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("platinum") && msg.contains("interactive, standard, batch"),
        "{msg}"
    );
    // The default class works.
    let ok = send(
        &c,
        "POST",
        &r.url("/v1/chat/completions"),
        &chat("hi", 2),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn program_requests_use_the_request_pool_and_plain_ones_the_fair_queue() {
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    cfg.fairness = Some(FairnessConfig::default());
    cfg.program_scheduling = Some(Default::default());
    cfg.agentic_context = program_router::config::AgenticContextMode::Strip;
    let r = router(cfg).await;
    let c = client();
    let program = serde_json::json!({
        "model": "sim-model", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
        "vllm_xargs": {"agentic_context": {"program_id": "agent-1"}},
    })
    .to_string();
    let reply = send(
        &c,
        "POST",
        &r.url("/v1/chat/completions"),
        &program,
        &[("x-tenant-id", "acme")],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let m = format!("http://{}", r.metrics_addr);
    let dispatched = || async {
        metric(
            &client(),
            &m,
            "program_router_fair_requests_total",
            &[("outcome", "dispatched")],
        )
        .await
    };
    assert_eq!(
        dispatched().await,
        0.0,
        "a Program request is scheduled by the RequestPool"
    );
    let plain = chat_as(&c, &r.url("/v1/chat/completions"), "acme", 2).await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(
        dispatched().await,
        1.0,
        "a plain request waits its turn in the fair queue"
    );
}

/// Writes `keys` into `dir` as the kubelet writes a Secret volume (each key with a newline).
fn secret_volume(dir: &std::path::Path, generation: u32, keys: &[(&str, &str)]) {
    let lines: Vec<(&str, Vec<u8>)> = keys
        .iter()
        .map(|(n, k)| (*n, format!("{k}\n").into_bytes()))
        .collect();
    let data: Vec<(&str, &[u8])> = lines.iter().map(|(n, k)| (*n, k.as_slice())).collect();
    testkit::secret_volume::write(dir, generation, &data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_keys_from_a_directory_are_tenants_rotate_without_restart_and_cap_classes() {
    use program_router::config::fairness::TenantSource;
    let sim = sim(&[]).await;
    let keys = tempfile::tempdir().expect("tmp");
    secret_volume(
        keys.path(),
        1,
        &[("search-team", "sk-search"), ("evals", "sk-evals")],
    );
    let mut cfg = workers(&[sim.base()], 1);
    cfg.client_api_keys_dir = Some(keys.path().display().to_string());
    let mut fair = FairnessConfig {
        tenant_source: TenantSource::ApiKey,
        max_class: Some("standard".into()),
        ..Default::default()
    };
    fair.tenant_max_classes
        .insert("search-team".into(), "interactive".into());
    fair.tenant_max_classes
        .insert("evals".into(), "batch".into());
    fair.tenant_classes.insert("evals".into(), "batch".into());
    cfg.fairness = Some(fair);
    let r = router(cfg).await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let ask = |key: Option<&'static str>, class: Option<&'static str>| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let auth = key.map(|k| format!("Bearer {k}"));
            let mut h: Vec<(&str, &str)> = Vec::new();
            if let Some(a) = &auth {
                h.push(("authorization", a));
            }
            if let Some(class) = class {
                h.push(("x-priority-class", class));
            }
            send(&c, "POST", &url, &chat("hi", 2), &h).await
        }
    };

    assert_eq!(ask(None, None).await.status, 401);
    assert_eq!(ask(Some("sk-other"), None).await.status, 401);
    assert_eq!(
        ask(Some("sk-search"), Some("interactive")).await.status,
        200
    );
    assert_eq!(ask(Some("sk-evals"), None).await.status, 200);
    // The key's name is the tenant: each team's service is counted under its name.
    let m = format!("http://{}", r.metrics_addr);
    for team in ["search-team", "evals"] {
        let served = metric(
            &c,
            &m,
            "program_router_fair_served_tokens",
            &[("tenant", team)],
        )
        .await;
        assert!(served > 0.0, "{team}: {served}");
    }
    // A class above the team's highest is refused, not quietly granted.
    let refused = ask(Some("sk-evals"), Some("standard")).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "class_not_allowed");
    assert_eq!(refused.json()["error"]["type"], "permission_error");
    let status = get(&c, &r.url("/status")).await;
    assert_eq!(
        status.json()["config"]["client_auth"],
        "client_api_keys_dir"
    );
    assert_eq!(
        status.json()["client_api_keys_dir"]["names"],
        serde_json::json!(["evals", "search-team"])
    );
    assert!(!status.text().contains("sk-"), "no key in /status");

    // Rotation: a new key for one team, one team gone, one new; no restart.
    secret_volume(
        keys.path(),
        2,
        &[("search-team", "sk-search-2"), ("docs-team", "sk-docs")],
    );
    assert!(
        eventually(10.0, || async {
            ask(Some("sk-search-2"), None).await.status == 200
                && ask(Some("sk-evals"), None).await.status == 401
        })
        .await,
        "the rotated keys apply"
    );
    assert_eq!(ask(Some("sk-search"), None).await.status, 401);
    assert_eq!(ask(Some("sk-docs"), None).await.status, 200);

    // An emptied Secret keeps the keys in force and says why on /status.
    secret_volume(keys.path(), 3, &[]);
    assert!(
        eventually(10.0, || async {
            get(&c, &r.url("/status")).await.json()["client_api_keys_dir"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("holds no key"))
        })
        .await
    );
    assert_eq!(ask(Some("sk-search-2"), None).await.status, 200);

    // A reload naming a directory that cannot be read is refused, naming the field.
    let mut moved = r.state.applied.load().config.clone();
    moved.client_api_keys_dir = Some(keys.path().join("missing").display().to_string());
    let err = r.state.apply(moved).expect_err("refused");
    assert_eq!(err.field, "client_api_keys_dir");
    assert_eq!(ask(Some("sk-search-2"), None).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_quotas_refuse_with_retry_after_even_when_the_backend_is_idle() {
    use program_router::config::fairness::RateLimitConfig;
    let sim = sim(&[]).await;
    let mut cfg = workers(&[sim.base()], 1);
    let mut fair = FairnessConfig {
        default_rate_limit: Some(RateLimitConfig {
            requests_per_minute: Some(2.0),
            tokens_per_minute: None,
        }),
        ..Default::default()
    };
    fair.tenant_rate_limits.insert(
        "metered".into(),
        RateLimitConfig {
            requests_per_minute: None,
            tokens_per_minute: Some(60.0),
        },
    );
    cfg.fairness = Some(fair);
    let r = router(cfg).await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    // Requests per minute: two, then 429 with a real Retry-After (one comes back every 30 s).
    for _ in 0..2 {
        assert_eq!(chat_as(&c, &url, "acme", 2).await.status, 200);
    }
    let refused = chat_as(&c, &url, "acme", 2).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "tenant_rate_limited");
    let retry: u64 = refused
        .headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((29..=30).contains(&retry), "{retry}");
    assert_eq!(
        chat_as(&c, &url, "other", 2).await.status,
        200,
        "each tenant has its own quota"
    );
    // Tokens per minute: the first request's real usage (a short prompt + 80 generated)
    // overdraws the minute's 60 tokens; the next waits for the debt to be paid.
    assert_eq!(chat_as(&c, &url, "metered", 80).await.status, 200);
    let refused = chat_as(&c, &url, "metered", 1).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tokens per minute")),
        "{}",
        refused.text()
    );
    let m = format!("http://{}", r.metrics_addr);
    assert_eq!(
        metric(
            &c,
            &m,
            "vllm_router_request_errors_total",
            &[("error", "tenant_rate_limited")]
        )
        .await,
        2.0
    );
}
