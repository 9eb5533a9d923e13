//! Program forwarding between router replicas (`peers`), against vllm-sim over loopback: each
//! Program is scheduled by one owner replica whichever replica the client reached.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeSet;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use program_router::config::peers::{PeerMember, PeersConfig};
use program_router::config::{ProgramSchedulingConfig, RouterConfig};
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

fn program_body(program: &str, stream: bool) -> String {
    json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": format!("turn of {program}")}],
        "max_tokens": 3,
        "stream": stream,
        "vllm_xargs": {"agentic_context": {"program_id": program}},
    })
    .to_string()
}

/// Two replicas over one simulator, each told about both.
async fn pair(extra: impl Fn(&mut RouterConfig)) -> (vllm_sim::server::Spawned, Router, Router) {
    pair_on(&["--time-scale", "50"], extra).await
}

async fn pair_on(
    sim_args: &[&str],
    extra: impl Fn(&mut RouterConfig),
) -> (vllm_sim::server::Spawned, Router, Router) {
    let s = sim(sim_args).await;
    let mut base = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 1)
    };
    extra(&mut base);
    let a = router(base.clone()).await;
    let b = router(base.clone()).await;
    join(&a, &b);
    (s, a, b)
}

/// Makes `a` and `b` each other's peers, as `router-a` and `router-b` (a hot reload).
fn join(a: &Router, b: &Router) {
    join_all(&[(a, "router-a"), (b, "router-b")], true);
}

/// Makes the routers each other's peers under the names given (a hot reload), handing
/// Programs over or not.
fn join_all(rs: &[(&Router, &str)], hand_over: bool) {
    let members: Vec<PeerMember> = rs
        .iter()
        .map(|(r, name)| PeerMember {
            name: (*name).into(),
            url: r.peer_base(),
        })
        .collect();
    for (r, me) in rs {
        let mut cfg = r.state.applied.load().config.clone();
        cfg.peers = Some(PeersConfig {
            self_name: Some((*me).into()),
            members: members.clone(),
            unreachable_backoff_secs: 30.0,
            hand_over,
            revision: None,
        });
        cfg.validate().expect("valid");
        assert!(r.state.apply(cfg).expect("applied"));
    }
}

/// `n` Program ids that `r`'s peers own (none of them `r`'s), as `r` sees the members.
fn owned_elsewhere(r: &Router, n: usize) -> Vec<String> {
    let peers = r.state.applied.load().peers.clone().expect("peers");
    let now = std::time::Instant::now();
    let ids: Vec<String> = (0..1000)
        .map(|i| format!("p{i}"))
        .filter(|p| peers.owner(p, now).is_some())
        .take(n)
        .collect();
    assert_eq!(ids.len(), n);
    ids
}

/// Every Program entry of `r`'s diagnostics, as seen with `headers`.
async fn program_entries(
    c: &HttpClient,
    r: &Router,
    headers: &[(&str, &str)],
) -> Vec<serde_json::Value> {
    let d = send(c, "GET", &r.url("/scheduling/diagnostics"), "", headers)
        .await
        .json();
    d["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rank| rank["programs"].as_array().into_iter().flatten())
        .cloned()
        .collect()
}

async fn programs(c: &HttpClient, r: &Router, headers: &[(&str, &str)]) -> BTreeSet<String> {
    program_entries(c, r, headers)
        .await
        .iter()
        .filter_map(|p| p["program"].as_str().map(String::from))
        .collect()
}

/// `r`'s counter `name` with its one label set to `value`.
async fn peer_metric(c: &HttpClient, r: &Router, name: &str, label: (&str, &str)) -> f64 {
    metric(c, &format!("http://{}", r.metrics_addr), name, &[label]).await
}

/// `GET path` on `r`'s peer listener as a replica would (with the peer secret).
async fn peer_get(c: &HttpClient, r: &Router, path: &str) -> Reply {
    send(c, "GET", &r.peer_url(path), "", &[PEER_KEY_HEADER]).await
}

async fn forwards(c: &HttpClient, r: &Router, outcome: &str) -> f64 {
    peer_metric(
        c,
        r,
        "program_router_peer_forwards_total",
        ("outcome", outcome),
    )
    .await
}

#[tokio::test]
async fn each_program_is_scheduled_by_one_replica_whichever_the_client_reaches() {
    let (_s, a, b) = pair(|_| {}).await;
    let c = client();
    let ids: Vec<String> = (0..24).map(|i| format!("agent-{i}")).collect();
    // Every Program's turns alternate between the replicas, as a load balancer may send them;
    // half are streamed.
    for turn in 0..2 {
        for (i, id) in ids.iter().enumerate() {
            let r = if (i + turn) % 2 == 0 { &a } else { &b };
            let stream = i % 2 == 1;
            let resp = post(&c, &r.url(CHAT), &program_body(id, stream)).await;
            assert_eq!(resp.status, 200, "{id}: {}", resp.text());
            if stream {
                let text = resp.text();
                assert!(text.contains("data: [DONE]"), "{id}: {text}");
                assert!(text.contains("chat.completion.chunk"), "{id}: {text}");
            } else {
                assert_eq!(resp.json()["object"], "chat.completion", "{id}");
            }
        }
    }
    let (on_a, on_b) = (programs(&c, &a, &[]).await, programs(&c, &b, &[]).await);
    assert!(
        on_a.is_disjoint(&on_b),
        "a Program on both: {on_a:?} {on_b:?}"
    );
    let all: BTreeSet<String> = on_a.union(&on_b).cloned().collect();
    assert_eq!(
        all,
        ids.iter().cloned().collect(),
        "every Program has one owner"
    );
    assert!(!on_a.is_empty() && !on_b.is_empty(), "{on_a:?} {on_b:?}");
    // Each replica forwarded what the other owns and received what it owns.
    let (fa, fb) = (
        forwards(&c, &a, "forwarded").await,
        forwards(&c, &b, "forwarded").await,
    );
    let (ra, rb) = (
        forwards(&c, &a, "received").await,
        forwards(&c, &b, "received").await,
    );
    assert_eq!(fa + fb, ids.len() as f64, "half of 48 turns cross over");
    assert_eq!((fa, fb), (rb, ra), "what one sends the other receives");
    // The owner counted every turn: each Program has two completed requests there.
    for (r, owned) in [(&a, &on_a), (&b, &on_b)] {
        let d = get(&c, &r.url("/scheduling/diagnostics")).await.json();
        for p in d["ranks"][0]["programs"].as_array().expect("programs") {
            assert!(owned.contains(p["program"].as_str().unwrap_or_default()));
        }
    }

    // One call shows every replica's view: the Programs of both, each where it is owned.
    let all = get(&c, &b.url("/scheduling/diagnostics?replicas=all"))
        .await
        .json();
    let replicas = all["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 2, "{all}");
    assert_eq!(
        (&replicas[0]["name"], &replicas[0]["self"]),
        (&json!("router-b"), &json!(true))
    );
    assert_eq!(replicas[1]["name"], "router-a");
    assert_eq!(replicas[1]["url"], json!(a.peer_base()));
    let listed = |d: &serde_json::Value| -> BTreeSet<String> {
        d["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| r["programs"].as_array().into_iter().flatten())
            .filter_map(|p| p["program"].as_str().map(String::from))
            .collect()
    };
    assert_eq!(listed(&replicas[0]["diagnostics"]), on_b);
    assert_eq!(listed(&replicas[1]["diagnostics"]), on_a);

    // Requests without Program identity are served where they land.
    let before = forwards(&c, &a, "forwarded").await;
    for _ in 0..4 {
        assert_eq!(post(&c, &a.url(CHAT), &chat("plain", 2)).await.status, 200);
    }
    assert_eq!(forwards(&c, &a, "forwarded").await, before);

    // A client cannot pass as a replica on the API port: the peer mark is dropped there, so
    // b's Program still goes to b.
    let theirs = on_b.iter().next().expect("b owns one").clone();
    let before = forwards(&c, &a, "forwarded").await;
    let resp = send(
        &c,
        "POST",
        &a.url(CHAT),
        &program_body(&theirs, false),
        &[("x-program-router-peer", "router-b")],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &a, "forwarded").await, before + 1.0);
    assert!(!programs(&c, &a, &[]).await.contains(&theirs));
    // A request another replica forwarded (on the peer listener, with the secret) is served
    // here, even for a Program this replica does not own (replicas that briefly disagree never
    // bounce a request back and forth).
    let resp = send(
        &c,
        "POST",
        &a.peer_url(CHAT),
        &program_body(&theirs, false),
        &[("x-program-router-peer", "router-b"), PEER_KEY_HEADER],
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(programs(&c, &a, &[]).await.contains(&theirs));

    // Status names the members and this replica.
    let st = get(&c, &a.url("/status")).await.json();
    assert_eq!(st["peers"]["self_name"], "router-a", "{st}");
    assert_eq!(st["peers"]["member"], true);
    assert_eq!(st["peers"]["members"], json!(["router-a", "router-b"]));
    assert_eq!(st["peers"]["unreachable"], json!([]));
}

#[tokio::test]
async fn an_unreachable_owner_is_skipped_and_its_programs_served_here() {
    let (_s, a, mut b) = pair(|_| {}).await;
    let c = client();
    // Programs b owns, found through a's own view of the members.
    let theirs = owned_elsewhere(&a, 3);
    b.server.stopped().await;
    for p in &theirs {
        let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{p}: {}", resp.text());
    }
    // One refused connection, then b is skipped for the backoff: no more attempts.
    assert_eq!(forwards(&c, &a, "unreachable").await, 1.0);
    assert_eq!(forwards(&c, &a, "forwarded").await, 0.0);
    let on_a = programs(&c, &a, &[]).await;
    assert!(theirs.iter().all(|p| on_a.contains(p)), "{on_a:?}");
    let st = get(&c, &a.url("/status")).await.json();
    assert_eq!(st["peers"]["unreachable"], json!(["router-b"]), "{st}");
    // The all-replicas view says which replica did not answer.
    let all = get(&c, &a.url("/scheduling/diagnostics?replicas=all"))
        .await
        .json();
    assert_eq!(all["replicas"][1]["name"], "router-b", "{all}");
    assert!(all["replicas"][1]["error"].as_str().is_some(), "{all}");
    assert!(
        all["replicas"][0]["diagnostics"]["ranks"].is_array(),
        "{all}"
    );
}

#[tokio::test]
async fn a_replica_shutting_down_declines_forwarded_requests_and_the_sender_serves_them() {
    // A router pod told to stop keeps serving (readiness off) for its shutdown delay and then
    // drains, while the other replicas may still list it for a while (the config reaches them
    // later): it declines forwarded Program requests untouched, and the sender serves them.
    let (_s, a, b) = pair(|c| c.limits.shutdown_delay_secs = 30.0).await;
    let c = client();
    let theirs = owned_elsewhere(&a, 2);
    let bs = b.state.clone();
    tokio::spawn(async move { bs.begin_shutdown().await });
    assert!(eventually(2.0, || async { b.state.is_draining() }).await);
    for p in &theirs {
        let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{p}: {}", resp.text());
    }
    assert_eq!(forwards(&c, &a, "unreachable").await, 1.0, "declined once");
    assert_eq!(forwards(&c, &a, "forwarded").await, 0.0);
    assert_eq!(
        forwards(&c, &b, "received").await,
        0.0,
        "b did nothing with it"
    );
    let on_a = programs(&c, &a, &[]).await;
    assert!(theirs.iter().all(|p| on_a.contains(p)), "{on_a:?}");
    assert!(programs(&c, &b, &[]).await.is_empty());
}

#[tokio::test]
async fn only_the_addressed_member_is_believed() {
    // b now runs under another name than a's list gives for its address (a pod that took a
    // departed member's IP): it declines what a forwards, and a serves it.
    let (s, a, b) = pair(|_| {}).await;
    let mut cfg = b.state.applied.load().config.clone();
    if let Some(p) = cfg.peers.as_mut() {
        p.self_name = Some("router-x".into());
    }
    assert!(b.state.apply(cfg).expect("applied"));
    let c = client();
    for p in owned_elsewhere(&a, 2) {
        let resp = post(&c, &a.url(CHAT), &program_body(&p, false)).await;
        assert_eq!(resp.status, 200, "{p}: {}", resp.text());
        assert!(programs(&c, &a, &[]).await.contains(&p));
    }
    assert_eq!(forwards(&c, &a, "unreachable").await, 1.0, "declined once");
    assert_eq!(forwards(&c, &b, "received").await, 0.0);
    assert!(programs(&c, &b, &[]).await.is_empty());

    // Something that is not a router at a member's address (here a vLLM server) answers without
    // the member's name: its answer is not relayed (it may have generated, so the request is
    // not sent again either): 502, and the member is skipped from then on.
    let mut cfg = a.state.applied.load().config.clone();
    if let Some(p) = cfg.peers.as_mut() {
        p.members[1].url = s.base();
    }
    assert!(a.state.apply(cfg).expect("applied"));
    let p = owned_elsewhere(&a, 1).remove(0);
    let resp = post(&c, &a.url(CHAT), &program_body(&p, false)).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert!(
        resp.text()
            .contains("did not answer as router replica router-b")
    );
    let again = post(&c, &a.url(CHAT), &program_body(&p, false)).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(forwards(&c, &a, "failed").await, 1.0);
}

#[tokio::test]
async fn a_forwarded_request_keeps_the_clients_key_and_program_namespace() {
    // With per-client keys the owner checks the client's key again and scopes the Program to
    // that client, exactly as if the client had reached it directly.
    let (_s, a, b) = pair(|c| {
        c.client_api_keys = Some(vec!["sk-team".into()]);
        c.api_key = None;
    })
    .await;
    let c = client();
    let auth = [("authorization", "Bearer sk-team")];
    for i in 0..8 {
        let r = if i % 2 == 0 { &a } else { &b };
        let body = program_body(&format!("s{i}"), false);
        let resp = send(&c, "POST", &r.url(CHAT), &body, &auth).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        let wrong = [("authorization", "Bearer nope")];
        assert_eq!(
            send(&c, "POST", &r.url(CHAT), &body, &wrong).await.status,
            401
        );
    }
    let name = "key-0";
    let mut all: Vec<String> = programs(&c, &a, &auth).await.into_iter().collect();
    all.extend(programs(&c, &b, &auth).await);
    all.sort();
    let want: Vec<String> = {
        let mut v: Vec<String> = (0..8).map(|i| format!("{name}/s{i}")).collect();
        v.sort();
        v
    };
    assert_eq!(all, want);
    assert!(forwards(&c, &a, "forwarded").await + forwards(&c, &b, "forwarded").await > 0.0);
    // The all-replicas view asks each peer with the caller's key, and each applies its scope:
    // no key, no view.
    let all = send(
        &c,
        "GET",
        &a.url("/scheduling/diagnostics?replicas=all"),
        "",
        &auth,
    )
    .await
    .json();
    let n: usize = all["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| {
            r["diagnostics"]["ranks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|k| k["programs"].as_array().map_or(0, Vec::len))
                .sum::<usize>()
        })
        .sum();
    assert_eq!(n, 8, "{all}");
    let anonymous = get(&c, &a.url("/scheduling/diagnostics?replicas=all")).await;
    assert_eq!(anonymous.status, 401);
}

#[tokio::test]
async fn a_client_that_leaves_a_forwarded_stream_aborts_it_at_the_engine() {
    // Real time: 1000 tokens take about 11 s, so the stream is cut mid-generation.
    let (s, a, _b) = pair_on(&[], |c| c.limits.max_concurrent_requests = Some(8)).await;
    let c = client();
    let theirs = owned_elsewhere(&a, 1).remove(0);
    let body = json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 1000,
        "stream": true,
        "vllm_xargs": {"agentic_context": {"program_id": theirs}},
    })
    .to_string();
    let resp = c
        .request(
            hyper::Request::post(a.url(CHAT))
                .body(Full::new(Bytes::from(body)))
                .expect("request"),
        )
        .await
        .expect("response");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    stream.frame().await.expect("first chunk").expect("ok");
    assert_eq!(forwards(&c, &a, "forwarded").await, 1.0);
    let limits = |r: &Router| r.state.applied.load().limiter.clone().expect("cap");
    assert_eq!(
        limits(&a).in_progress(),
        1,
        "the forwarding replica holds a place"
    );
    drop(stream);
    let sim_aborts = || async {
        metric(
            &c,
            &s.base(),
            "vllm:request_success_total",
            &[("finished_reason", "abort")],
        )
        .await
    };
    assert!(
        eventually(3.0, || async { sim_aborts().await == 1.0 }).await,
        "the engine saw the abort"
    );
    assert!(
        eventually(3.0, || async { limits(&a).in_progress() == 0 }).await,
        "the place was released"
    );
}

#[tokio::test]
async fn a_tenant_quota_holds_across_the_replicas() {
    // 6 requests a minute for "team": without sharing, each of two replicas would admit 6.
    let (_s, a, mut b) = pair(|c| {
        let mut fair = program_router::config::FairnessConfig::default();
        for (tenant, rpm) in [("team", 6.0), ("big", 10.0)] {
            fair.tenant_rate_limits.insert(
                tenant.into(),
                program_router::config::fairness::RateLimitConfig {
                    requests_per_minute: Some(rpm),
                    tokens_per_minute: None,
                },
            );
        }
        c.fairness = Some(fair);
    })
    .await;
    let c = client();
    let as_tenant = |r: &Router, tenant: &'static str| {
        let (c, url) = (c.clone(), r.url(CHAT));
        async move {
            send(&c, "POST", &url, &chat("q", 1), &[("x-tenant-id", tenant)])
                .await
                .status
        }
    };
    for r in [&a, &b] {
        for _ in 0..3 {
            assert_eq!(as_tenant(r, "team").await, 200);
        }
    }
    let usage = peer_get(&c, &a, "/peers/usage").await.json();
    assert_eq!(usage["tenants"]["team"][0], 3.0, "{usage}");
    // The replicas read each other's use every second: then each knows the minute is spent.
    tokio::time::sleep(program_router::peers::USAGE_INTERVAL * 3).await;
    for r in [&a, &b] {
        let resp = send(
            &c,
            "POST",
            &r.url(CHAT),
            &chat("q", 1),
            &[("x-tenant-id", "team")],
        )
        .await;
        assert_eq!(resp.status, 429, "{}", resp.text());
        assert_eq!(resp.json()["error"]["code"], "tenant_rate_limited");
        assert_eq!(
            as_tenant(r, "other").await,
            200,
            "other tenants are not charged"
        );
    }
    // Later use travels too: 5 of "big"'s 10 on a, then b has 5 left.
    for _ in 0..5 {
        assert_eq!(as_tenant(&a, "big").await, 200);
    }
    tokio::time::sleep(program_router::peers::USAGE_INTERVAL * 3).await;
    for _ in 0..5 {
        assert_eq!(as_tenant(&b, "big").await, 200);
    }
    assert_eq!(as_tenant(&b, "big").await, 429, "10 of 10 used across both");
    let reads = |r: &Router, outcome: &'static str| {
        let (c, base) = (c.clone(), format!("http://{}", r.metrics_addr));
        async move {
            metric(
                &c,
                &base,
                "program_router_peer_usage_reads_total",
                &[("outcome", outcome)],
            )
            .await
        }
    };
    assert!(reads(&a, "ok").await >= 2.0);
    assert_eq!(reads(&a, "error").await, 0.0);
    // A replica whose use cannot be read is named on /status (and counted).
    b.server.stopped().await;
    let named = eventually(5.0, || async {
        let st = get(&c, &a.url("/status")).await.json();
        st["peers"]["usage_errors"]["router-b"].is_string()
    })
    .await;
    assert!(named, "{}", get(&c, &a.url("/status")).await.text());
    assert!(reads(&a, "error").await >= 1.0);
    // Without peers the endpoint does not exist, on either listener.
    let alone = router(workers(&[_s.base()], 1)).await;
    assert_eq!(get(&c, &alone.url("/peers/usage")).await.status, 404);
    let peer = peer_get(&c, &alone, "/peers/usage").await;
    assert_eq!(peer.status, 404);
}

mod handover;
mod member_lists;
