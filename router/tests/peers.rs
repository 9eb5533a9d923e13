//! Program forwarding between router replicas (`peers`), against vllm-sim over loopback: each
//! Program is scheduled by one owner replica whichever replica the client reached.

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

/// Gives `r` (named `me`) the member list `members` with `revision` (a hot reload).
fn set_list(r: &Router, me: &str, members: &[(&Router, &str)], revision: u64) {
    let mut cfg = r.state.applied.load().config.clone();
    cfg.peers = Some(PeersConfig {
        self_name: Some(me.into()),
        members: members
            .iter()
            .map(|(m, name)| PeerMember {
                name: (*name).into(),
                url: m.peer_base(),
            })
            .collect(),
        unreachable_backoff_secs: 30.0,
        revision: Some(revision),
        ..Default::default()
    });
    cfg.validate().expect("valid");
    assert!(r.state.apply(cfg).expect("applied"));
}

/// The revision and member names `r` has in force, as its `/status` says.
async fn list_of(c: &HttpClient, r: &Router) -> (serde_json::Value, serde_json::Value) {
    let st = get(c, &r.url("/status")).await.json();
    (
        st["peers"]["revision"].clone(),
        st["peers"]["members"].clone(),
    )
}

/// Waits until `r` has revision `revision` with member names `names` in force.
async fn takes_list(c: &HttpClient, r: &Router, revision: u64, names: &serde_json::Value) {
    let want = (json!(revision), names.clone());
    assert!(
        eventually(5.0, || async { list_of(c, r).await == want }).await,
        "{:?}",
        list_of(c, r).await
    );
}

async fn member_lists(c: &HttpClient, r: &Router, outcome: &str) -> f64 {
    peer_metric(
        c,
        r,
        "program_router_peer_member_lists_total",
        ("outcome", outcome),
    )
    .await
}

#[tokio::test]
async fn a_replica_with_an_older_member_list_takes_the_newer_one_from_a_peer_that_has_it() {
    // A third replica c joined: a's copy of the file has the new list (revision 2), b's and c's
    // copies have not arrived yet.
    let s = sim(&["--time-scale", "50"]).await;
    let base = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 1)
    };
    let (a, b, r3) = (
        router(base.clone()).await,
        router(base.clone()).await,
        router(base).await,
    );
    let all = [(&a, "router-a"), (&b, "router-b"), (&r3, "router-c")];
    set_list(&a, "router-a", &all, 2);
    set_list(&b, "router-b", &all[..2], 1);
    set_list(&r3, "router-c", &[all[0], all[2]], 1);
    let c = client();
    let names = json!(["router-a", "router-b", "router-c"]);

    // A request a forwards to b tells b of revision 2: b reads a's list.
    let view = a.state.applied.load().peers.clone().expect("peers");
    let now = std::time::Instant::now();
    let to_b = (0..1000)
        .map(|i| format!("p{i}"))
        .find(|p| view.owner(p, now).is_some_and(|m| m.name == "router-b"))
        .expect("b owns some");
    let resp = post(&c, &a.url(CHAT), &program_body(&to_b, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    takes_list(&c, &b, 2, &names).await;
    let st = get(&c, &b.url("/status")).await.json();
    assert_eq!(st["peers"]["members_from"], "router-a", "{st}");
    assert_eq!(member_lists(&c, &b, "adopted").await, 1.0);

    // c's list has only a and c: a's answer to what c forwards tells c of revision 2.
    let view = r3.state.applied.load().peers.clone().expect("peers");
    let to_a = (0..1000)
        .map(|i| format!("q{i}"))
        .find(|p| view.owner(p, now).is_some())
        .expect("a owns some");
    let resp = post(&c, &r3.url(CHAT), &program_body(&to_a, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    takes_list(&c, &r3, 2, &names).await;
    assert_eq!(member_lists(&c, &r3, "adopted").await, 1.0);
    assert_eq!(member_lists(&c, &a, "adopted").await, 0.0, "a's was newest");

    // c's own copy of the file arrives late, still at revision 1 with another setting changed:
    // the setting is taken, the newer member list stays.
    let mut file = r3.state.applied.load().config.clone();
    if let Some(p) = file.peers.as_mut() {
        p.members.retain(|m| m.name != "router-b");
        p.revision = Some(1);
    }
    file.limits.request_timeout_secs = 123.0;
    let bytes = serde_json::to_vec(&file).expect("json");
    assert!(r3.state.reload(&bytes).expect("reloaded"));
    assert_eq!(list_of(&c, &r3).await, (json!(2), names.clone()));
    let applied = r3.state.applied.load();
    assert_eq!(applied.config.limits.request_timeout_secs, 123.0);
    let st = get(&c, &r3.url("/status")).await.json();
    assert_eq!(st["peers"]["members_from"], "router-a", "{st}");
    // Revision 2 arrives: the file's list is in force again.
    if let Some(p) = file.peers.as_mut() {
        p.members = applied
            .config
            .peers
            .as_ref()
            .expect("peers")
            .members
            .clone();
        p.revision = Some(2);
    }
    let bytes = serde_json::to_vec(&file).expect("json");
    r3.state.reload(&bytes).expect("reloaded");
    let st = get(&c, &r3.url("/status")).await.json();
    assert_eq!(st["peers"]["members_from"], json!(null), "{st}");
    assert_eq!(st["peers"]["revision"], 2, "{st}");

    // A claim of a higher revision is checked with the member named: a has 2, so nothing
    // changes; one from a name that is not a member is not followed at all.
    let claim = |sender: &'static str| {
        let (c, url) = (c.clone(), r3.peer_url("/peers/members"));
        async move {
            let headers = [
                ("x-program-router-peer", sender),
                ("x-program-router-peer-to", "router-c"),
                ("x-program-router-peer-revision", "99"),
                PEER_KEY_HEADER,
            ];
            let resp = send(&c, "GET", &url, "", &headers).await;
            assert_eq!(resp.status, 200, "{}", resp.text());
            assert_eq!(
                resp.headers
                    .get("x-program-router-peer-revision")
                    .and_then(|v| v.to_str().ok()),
                Some("2"),
                "an answer to a peer says which list answered"
            );
        }
    };
    claim("router-a").await;
    assert!(
        eventually(2.0, || async {
            member_lists(&c, &r3, "stale").await == 1.0
        })
        .await
    );
    // The same claim on the API port is a client's request: its peer headers are dropped, so
    // nothing is read.
    let headers = [
        ("x-program-router-peer", "router-a"),
        ("x-program-router-peer-revision", "99"),
    ];
    let resp = send(&c, "GET", &r3.url("/v1/models"), "", &headers).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(resp.headers.get("x-program-router-peer-revision").is_none());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(member_lists(&c, &r3, "stale").await, 1.0, "not read");
    assert_eq!(member_lists(&c, &r3, "error").await, 0.0);
    assert_eq!(list_of(&c, &r3).await, (json!(2), names));
}

/// A request to `r`'s peer listener from a replica `name` that is not in its list, presenting
/// `secret`, claiming member-list `revision` and to be reachable at `url`; returns its status.
async fn unlisted_claim(
    c: &HttpClient,
    r: &Router,
    secret: &str,
    name: &str,
    revision: u64,
    url: &str,
) -> u16 {
    let revision = revision.to_string();
    let headers = vec![
        ("x-program-router-peer", name),
        ("x-program-router-peer-revision", revision.as_str()),
        ("x-program-router-peer-url", url),
        ("x-program-router-peer-key", secret),
    ];
    send(c, "GET", &r.peer_url("/peers/members"), "", &headers)
        .await
        .status
}

/// A simulator that wants the workers' key `worker`, and a router config for it with that key.
async fn keyed_sim() -> (vllm_sim::server::Spawned, RouterConfig) {
    let s = sim(&["--time-scale", "50", "--api-key", "worker"]).await;
    let cfg = RouterConfig {
        api_key: Some("worker".into()),
        ..workers(&[s.base()], 1)
    };
    (s, cfg)
}

#[tokio::test]
async fn peer_routes_answer_only_the_peer_secret_on_the_peer_listener() {
    let (_s, keyed) = keyed_sim().await;
    let cfg = RouterConfig {
        peers: Some(PeersConfig::default()),
        client_api_keys: Some(vec!["sk-client".into()]),
        ..keyed
    };
    let r = router(cfg).await;
    let c = client();
    let adopt = r#"{"programs": [{"model": "m", "program_id": "p", "root": "p", "target": "t",
        "context_tokens": 1, "idle_seconds": 0}]}"#;
    let hand_over = r#"{"model": "m", "program_id": "p"}"#;
    let calls = [
        ("GET", "/peers/usage", ""),
        ("GET", "/peers/members", ""),
        ("GET", "/peers/response-home/x", ""),
        ("POST", "/peers/adopt", adopt),
        ("POST", "/peers/hand-over", hand_over),
    ];
    let nobody: [(&str, &str); 0] = [];
    let workers_key = [("authorization", "Bearer worker")];
    let client_key = [("authorization", "Bearer sk-client")];
    let peer_mark = [("x-program-router-peer", "router-a")];
    let wrong = [(
        "x-program-router-peer-key",
        "not-the-secret-0123456789abcdef012345",
    )];
    for (method, path, body) in calls {
        // The API port serves no peer route, whoever asks.
        for h in [
            &nobody[..],
            &workers_key,
            &client_key,
            &peer_mark,
            &[PEER_KEY_HEADER],
        ] {
            let resp = send(&c, method, &r.url(path), body, h).await;
            assert_eq!(resp.status, 404, "{method} {path} {h:?}: {}", resp.text());
        }
        // The peer listener answers only the peer secret: not the workers' key, not a client's.
        for h in [&nobody[..], &workers_key, &client_key, &peer_mark, &wrong] {
            let resp = send(&c, method, &r.peer_url(path), body, h).await;
            assert_eq!(resp.status, 401, "{method} {path} {h:?}: {}", resp.text());
            assert_eq!(resp.json()["error"]["code"], "peer_unauthorized");
        }
        let ok = send(&c, method, &r.peer_url(path), body, &[PEER_KEY_HEADER]).await;
        assert_eq!(ok.status, 200, "{method} {path}: {}", ok.text());
    }
    let refused = metric(
        &c,
        &format!("http://{}", r.metrics_addr),
        "program_router_peer_auth_failures_total",
        &[],
    )
    .await;
    assert_eq!(refused, 25.0);
    // The member list, signed with the peer secret when it has a revision.
    let ok = peer_get(&c, &r, "/peers/members").await;
    assert_eq!(
        ok.json(),
        json!({"revision": null, "members": [], "signature": null})
    );
    // The peer listener serves nothing a client would call.
    for path in ["/v1/models", "/status", "/health", "/metrics"] {
        let resp = send(&c, "GET", &r.peer_url(path), "", &[PEER_KEY_HEADER]).await;
        assert_eq!(resp.status, 404, "{path}");
    }
}

#[tokio::test]
async fn a_new_replica_not_yet_listed_is_believed_for_a_list_signed_with_the_peer_secret() {
    // A rolling update: a is the new pod, whose list (revision 2) already has a and b; b's copy
    // still lists the departing pod instead (revision 1), so b does not know a.
    let (s, keyed) = keyed_sim().await;
    let base = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..keyed
    };
    let (a, b) = (router(base.clone()).await, router(base).await);
    let departing = router(workers(&[s.base()], 1)).await;
    set_list(&a, "router-a", &[(&a, "router-a"), (&b, "router-b")], 2);
    set_list(
        &b,
        "router-b",
        &[(&departing, "router-old"), (&b, "router-b")],
        1,
    );
    let c = client();
    let key = [("authorization", "Bearer worker")];

    // a forwards a Program b owns (in a's list) to b: b reads a's list at the URL a gives (the
    // address of the authenticated request) and takes it because it is signed with the secret.
    let view = a.state.applied.load().peers.clone().expect("peers");
    let now = std::time::Instant::now();
    let to_b = (0..1000)
        .map(|i| format!("p{i}"))
        .find(|p| view.owner(p, now).is_some())
        .expect("b owns some");
    let resp = send(&c, "POST", &a.url(CHAT), &program_body(&to_b, false), &key).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let names = json!(["router-a", "router-b"]);
    takes_list(&c, &b, 2, &names).await;
    let st = get(&c, &b.url("/status")).await.json();
    assert_eq!(st["peers"]["members_from"], "router-a", "{st}");

    // A URL other than the address the request came from is never called.
    let elsewhere = "http://10.255.255.1:9";
    let status = unlisted_claim(&c, &b, common::PEER_SECRET, "elsewhere", 9, elsewhere).await;
    assert_eq!(status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for outcome in ["error", "stale"] {
        assert_eq!(member_lists(&c, &b, outcome).await, 0.0, "not read");
    }

    // A router of another fleet (another secret), or anyone, claims a newer list: the peer
    // listener refuses it, so nothing is read and b keeps its own list.
    let other_secret = std::env::temp_dir().join(format!("other-fleet-{}", std::process::id()));
    std::fs::write(&other_secret, "another-fleet-secret-0123456789abcdef01").expect("write");
    let intruder = router(RouterConfig {
        peer_secret_file: Some(other_secret.display().to_string()),
        ..workers(&[s.base()], 1)
    })
    .await;
    set_list(
        &intruder,
        "intruder",
        &[(&intruder, "intruder"), (&b, "router-b")],
        9,
    );
    let intruder_url = intruder.peer_base();
    let status = unlisted_claim(
        &c,
        &b,
        "another-fleet-secret-0123456789abcdef01",
        "intruder",
        9,
        &intruder_url,
    )
    .await;
    assert_eq!(status, 401);
    // Its Program requests forwarded to b are refused too, so it serves them itself.
    let view = intruder.state.applied.load().peers.clone().expect("peers");
    let to_b = (0..1000)
        .map(|i| format!("q{i}"))
        .find(|p| view.owner(p, now).is_some())
        .expect("b owns some");
    let resp = post(&c, &intruder.url(CHAT), &program_body(&to_b, false)).await;
    assert_eq!(resp.status, 401, "b refuses it: {}", resp.text());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(member_lists(&c, &b, "error").await, 0.0);
    assert_eq!(list_of(&c, &b).await, (json!(2), names));
    assert_eq!(member_lists(&c, &b, "adopted").await, 1.0);
    let _ = std::fs::remove_file(&other_secret);
}

#[tokio::test]
async fn a_stored_response_is_followed_up_through_any_replica() {
    // Two servers, each with its own response store; two replicas, round robin. A response
    // relayed by one replica is read back and continued through the other: that one asks its
    // peers which server stored it (round robin alone would miss half the time).
    let (s1, s2) = (sim(&["--instant"]).await, sim(&["--instant"]).await);
    let mut base = workers(&[s1.base(), s2.base()], 1);
    base.policy.kind = program_router::config::PolicyKind::RoundRobin;
    let a = router(base.clone()).await;
    let b = router(base).await;
    join(&a, &b);
    let c = client();
    for i in 0..4 {
        let body =
            json!({"model": "sim-model", "input": format!("turn {i}"), "max_output_tokens": 1});
        let made = post(&c, &a.url("/v1/responses"), &body.to_string()).await;
        assert_eq!(made.status, 200, "{}", made.text());
        let id = made.json()["id"].as_str().expect("id").to_string();
        for _ in 0..2 {
            let read = get(&c, &b.url(&format!("/v1/responses/{id}"))).await;
            assert_eq!(read.status, 200, "{id}: {}", read.text());
            assert_eq!(read.json()["id"], json!(id));
        }
        let next = json!({"model": "sim-model", "input": "more", "max_output_tokens": 1,
            "previous_response_id": id});
        let resp = post(&c, &b.url("/v1/responses"), &next.to_string()).await;
        assert_eq!(resp.status, 200, "{id}: {}", resp.text());
    }
    // The endpoint the replicas ask.
    let home = peer_get(&c, &a, "/peers/response-home/nope").await.json();
    assert_eq!(home["url"], serde_json::Value::Null);
}

#[test]
fn the_peer_name_flag_names_this_replica_only_with_peers() {
    let flags = <program_router::config::cli::Cli as clap::Parser>::try_parse_from([
        "program-router",
        "--peer-name",
        "router-7",
    ])
    .expect("flags")
    .flags;
    let with = RouterConfig {
        peers: Some(PeersConfig::default()),
        peer_port: Some(0),
        peer_secret_file: Some(peer_secret_file()),
        ..Default::default()
    };
    let cfg = flags.effective(Some(with)).expect("valid");
    assert_eq!(
        cfg.peers.and_then(|p| p.self_name).as_deref(),
        Some("router-7")
    );
    let cfg = flags
        .effective(Some(RouterConfig::default()))
        .expect("valid");
    assert!(cfg.peers.is_none());
}

/// Program `p`'s home target on `r` and how it got it, from `r`'s diagnostics.
async fn home(c: &HttpClient, r: &Router, p: &str) -> Option<(String, String)> {
    let text = |x: &serde_json::Value, k: &str| x[k].as_str().unwrap_or_default().to_string();
    program_entries(c, r, &[])
        .await
        .iter()
        .find(|x| x["program"] == p)
        .map(|x| (text(x, "home_target"), text(x, "placement")))
}

async fn handovers(c: &HttpClient, r: &Router, event: &str) -> f64 {
    peer_metric(
        c,
        r,
        "program_router_peer_handovers_total",
        ("event", event),
    )
    .await
}

/// Two replicas over one simulator with four DP ranks, not yet peers.
async fn four_rank_pair(
    extra: impl Fn(&mut RouterConfig),
) -> (vllm_sim::server::Spawned, Router, Router) {
    let s = sim(&["--time-scale", "50", "-d", "4"]).await;
    let mut base = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 4)
    };
    extra(&mut base);
    let a = router(base.clone()).await;
    let b = router(base).await;
    (s, a, b)
}

/// Program ids that `router-b` owns once it joins `router-a` ([`join`]).
fn owned_by_b_once_joined_iter() -> impl Iterator<Item = String> {
    let view = program_router::peers::Peers::new(
        &PeersConfig {
            self_name: Some("router-a".into()),
            members: ["router-a", "router-b"]
                .iter()
                .map(|n| PeerMember {
                    name: (*n).into(),
                    url: "http://127.0.0.1:1".into(),
                })
                .collect(),
            ..Default::default()
        },
        None,
        None,
    );
    let now = std::time::Instant::now();
    (0..1000)
        .map(|i| format!("moved-{i}"))
        .filter(move |k| view.owner(k, now).is_some())
}

fn owned_by_b_once_joined() -> String {
    owned_by_b_once_joined_iter().next().expect("b owns some")
}

#[tokio::test]
async fn a_program_keeps_its_rank_when_a_new_member_takes_it_over() {
    // Replica a schedules alone; then b joins and owns Program p. Fresh, b would bind p to
    // the least loaded rank (its first); instead it asks a, which gives p up with its rank.
    let (_s, a, b) = four_rank_pair(|_| {}).await;
    let c = client();
    let mut moving = owned_by_b_once_joined_iter();
    let (p, s) = (
        moving.next().expect("b owns some"),
        moving.next().expect("two"),
    );
    // Three Programs first: p lands on a's fourth rank.
    for f in ["f0", "f1", "f2"] {
        let resp = post(&c, &a.url(CHAT), &program_body(f, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let resp = post(&c, &a.url(CHAT), &program_body(&p, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = post(&c, &a.url(CHAT), &program_body(&s, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let (target, _) = home(&c, &a, &p).await.expect("p on a");
    let first = a.state.applied.load().targets.targets[0].id.clone();
    assert_ne!(target, first, "p is not on the rank a fresh binding picks");

    join(&a, &b);
    // The client reaches a, which forwards p's next turn to its new owner b.
    let resp = post(&c, &a.url(CHAT), &program_body(&p, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &a, "forwarded").await, 1.0);
    assert_eq!(
        home(&c, &b, &p).await,
        Some((target, "handed_over".to_string()))
    );
    assert_eq!(home(&c, &a, &p).await, None, "a gave p up");
    assert_eq!(handovers(&c, &a, "given").await, 1.0);
    assert_eq!(handovers(&c, &b, "claimed").await, 1.0);
    // A Program nobody held before is bound as usual.
    let q = owned_elsewhere(&a, 2)
        .into_iter()
        .find(|x| *x != p)
        .expect("another");
    let resp = post(&c, &a.url(CHAT), &program_body(&q, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(home(&c, &b, &q).await.map(|h| h.1), Some("binding".into()));
    assert_eq!(handovers(&c, &b, "claimed").await, 1.0);
    // A request that says it is its Program's first step is not asked about (s stays on a).
    let first_step = json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "again"}],
        "max_tokens": 3,
        "vllm_xargs": {"agentic_context": {"program_id": s, "step_id": 0}},
    });
    let resp = post(&c, &a.url(CHAT), &first_step.to_string()).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(home(&c, &b, &s).await.map(|h| h.1), Some("binding".into()));
    assert!(home(&c, &a, &s).await.is_some());
    assert_eq!(handovers(&c, &a, "given").await, 1.0);
}

/// A listener on a free loopback port and its base URL, for a hand-written member.
async fn member_listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    (listener, url)
}

/// Reads from `conn` until `done` says the bytes so far are enough; `None` if it closed first.
async fn read_until(
    conn: &mut tokio::net::TcpStream,
    done: impl Fn(&[u8]) -> bool,
) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = Vec::new();
    while !done(&got) {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    Some(got)
}

fn has_head(got: &[u8]) -> bool {
    got.windows(4).any(|w| w == b"\r\n\r\n")
}

/// A member named `router-a` that held Program `held` idle: the first ask for it is answered
/// with the Program after `delay`, every later one at once with nothing (it gave the Program
/// away), as a replica answers asks that cross. Counts the asks.
async fn holding_member(
    held: serde_json::Value,
    delay: std::time::Duration,
    asks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> String {
    let (listener, url) = member_listener().await;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let n = asks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let held = held.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                // The ask's head and its small JSON body.
                let Some(got) = read_until(&mut conn, |g| has_head(g) && g.ends_with(b"}")).await
                else {
                    return;
                };
                assert!(got.starts_with(b"POST /peers/hand-over "), "only asks");
                let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
                let presented = format!("x-program-router-peer-key: {}", common::PEER_SECRET);
                assert!(head.contains(&presented), "asks present the peer secret");
                let program = if n == 0 {
                    tokio::time::sleep(delay).await;
                    held
                } else {
                    serde_json::Value::Null
                };
                let body = json!({ "program": program }).to_string();
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     x-program-router-peer-answered-by: router-a\r\nconnection: close\r\n\
                     content-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test]
async fn concurrent_first_requests_of_a_moved_program_all_keep_its_rank() {
    // Router b has just joined and owns Program p, which router-a held on b's last rank. Four
    // turns of p reach b at once. router-a gives p to the first ask only, and answers it last:
    // asked four times, the three empty answers would come back first and their requests bind
    // p afresh, and the adoption of a Program already bound is refused. b asks once; the other
    // requests wait for that ask and find p adopted.
    let s = sim(&["--time-scale", "50", "-d", "4"]).await;
    let b = router(RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 4)
    })
    .await;
    let c = client();
    let p = owned_by_b_once_joined();
    let target = b.state.applied.load().targets.targets[3].id.clone();
    let held = json!({"model": "sim-model", "program_id": p, "root": p, "target": target,
        "context_tokens": 40, "idle_seconds": 1.0});
    let asks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let a_url = holding_member(held, std::time::Duration::from_millis(100), asks.clone()).await;
    let mut cfg = b.state.applied.load().config.clone();
    cfg.peers = Some(PeersConfig {
        self_name: Some("router-b".into()),
        members: vec![
            PeerMember {
                name: "router-a".into(),
                url: a_url,
            },
            PeerMember {
                name: "router-b".into(),
                url: b.url(""),
            },
        ],
        ..Default::default()
    });
    assert!(b.state.apply(cfg).expect("applied"));
    let turns = (0..4).map(|_| {
        let (c, url) = (c.clone(), b.url(CHAT));
        let body = program_body(&p, false);
        async move { post(&c, &url, &body).await }
    });
    for resp in futures_util::future::join_all(turns).await {
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert_eq!(
        home(&c, &b, &p).await,
        Some((target, "handed_over".to_string()))
    );
    assert_eq!(handovers(&c, &b, "claimed").await, 1.0);
    assert_eq!(
        asks.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked once"
    );
    assert!(b.state.claims.is_empty(), "no claim left behind");
}

#[tokio::test]
async fn a_replica_shutting_down_hands_its_programs_to_the_next_owner() {
    let (_s, a, b) = four_rank_pair(|c| c.limits.shutdown_delay_secs = 30.0).await;
    join(&a, &b);
    let c = client();
    // Four Programs b owns, scheduled there: the last one lands on b's fourth rank.
    let theirs = owned_elsewhere(&a, 4);
    for p in &theirs {
        let resp = post(&c, &b.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let p = &theirs[3];
    let (target, _) = home(&c, &b, p).await.expect("p on b");
    let first = b.state.applied.load().targets.targets[0].id.clone();
    assert_ne!(target, first);

    let bs = b.state.clone();
    tokio::spawn(async move { bs.begin_shutdown().await });
    assert!(eventually(3.0, || async { handovers(&c, &a, "adopted").await == 4.0 }).await);
    assert_eq!(handovers(&c, &b, "pushed").await, 4.0);
    assert_eq!(
        home(&c, &a, p).await,
        Some((target.clone(), "handed_over".to_string()))
    );
    // p's next turn reaches a; b declines it (shutting down), and a runs it where its KV is.
    let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &a, "unreachable").await, 1.0, "declined");
    assert_eq!(home(&c, &a, p).await.map(|h| h.0), Some(target));
}

/// Three replicas over one simulator with four DP ranks, peers as router-a, -b and -c.
async fn four_rank_trio(hand_over: bool) -> (vllm_sim::server::Spawned, Router, Router, Router) {
    let (s, a, b) = four_rank_pair(|c| c.limits.shutdown_delay_secs = 30.0).await;
    let base = a.state.applied.load().config.clone();
    let c = router(base).await;
    join_all(
        &[(&a, "router-a"), (&b, "router-b"), (&c, "router-c")],
        hand_over,
    );
    (s, a, b, c)
}

/// Programs `b` owns as `a` sees the members, and that `c` owns once `b` is passed over.
fn owned_by_then(a: &Router, b: &str, c: &str, n: usize) -> Vec<String> {
    let peers = a.state.applied.load().peers.clone().expect("peers");
    let now = std::time::Instant::now();
    let name = |m: Option<&program_router::peers::Member>| m.map(|m| m.name.clone());
    let ids: Vec<String> = (0..2000)
        .map(|i| format!("p{i}"))
        .filter(|p| {
            name(peers.owner(p, now)).as_deref() == Some(b)
                && name(peers.next_owner(p, now, &[b])).as_deref() == Some(c)
        })
        .take(n)
        .collect();
    assert_eq!(ids.len(), n);
    ids
}

#[tokio::test]
async fn a_request_the_owner_declines_goes_to_the_next_owner_which_holds_the_program() {
    // b shuts down and hands its Programs to their next owners. The client reaches a, which
    // still lists b: b declines, and the request goes on to c, which took the Program with its
    // rank (a would have bound it afresh).
    let (_s, a, mut b, c3) = four_rank_trio(true).await;
    let c = client();
    let moving = owned_by_then(&a, "router-b", "router-c", 4);
    for p in &moving {
        let resp = post(&c, &b.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let p = &moving[3];
    let (target, _) = home(&c, &b, p).await.expect("p on b");
    let bs = b.state.clone();
    tokio::spawn(async move { bs.begin_shutdown().await });
    assert!(eventually(3.0, || async { handovers(&c, &c3, "adopted").await == 4.0 }).await);
    let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &a, "unreachable").await, 1.0, "b declined");
    assert_eq!(forwards(&c, &a, "forwarded").await, 1.0, "then c served it");
    assert_eq!(forwards(&c, &c3, "received").await, 1.0);
    assert_eq!(home(&c, &c3, p).await.map(|h| h.0), Some(target));
    assert_eq!(home(&c, &a, p).await, None, "a did not bind it");
    // An owner that refuses connections is passed over the same way.
    b.server.stopped().await;
    let q = &moving[2];
    let resp = post(&c, &c3.url(CHAT), &program_body(q, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &c3, "forwarded").await, 0.0, "c owns q next");
    assert_eq!(
        home(&c, &c3, q).await.map(|h| h.1),
        Some("handed_over".into())
    );
}

/// A member that reads every request and closes the connection without a byte of answer (a
/// replica closing its idle connections as it stops, or dying mid-request); counts the Program
/// requests it got (not the hand-over asks).
async fn closing_member(seen: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> String {
    let (listener, url) = member_listener().await;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let got = read_until(&mut conn, has_head).await.unwrap_or_default();
            if got.starts_with(format!("POST {CHAT} ").as_bytes()) {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            drop(conn);
        }
    });
    url
}

#[tokio::test]
async fn an_owner_that_closes_the_connection_unanswered_gets_the_request_once_more_then_the_next_owner()
 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let s = sim(&["--time-scale", "50"]).await;
    let a = router(RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 1)
    })
    .await;
    // Three members that close every connection unanswered, beside a.
    let seen: Vec<std::sync::Arc<AtomicUsize>> = (0..3).map(|_| Default::default()).collect();
    let mut members = vec![PeerMember {
        name: "router-a".into(),
        url: a.peer_base(),
    }];
    for (i, n) in seen.iter().enumerate() {
        members.push(PeerMember {
            name: format!("closing-{i}"),
            url: closing_member(n.clone()).await,
        });
    }
    let mut cfg = a.state.applied.load().config.clone();
    cfg.peers = Some(PeersConfig {
        self_name: Some("router-a".into()),
        members,
        ..Default::default()
    });
    assert!(a.state.apply(cfg).expect("applied"));
    let peers = a.state.applied.load().peers.clone().expect("peers");
    let now = std::time::Instant::now();
    // In p's order a comes after two closing members (one try each plus one more), and in q's
    // after all three: q is forwarded four times, the most, and then served by a.
    let order = |p: &str| {
        let mut passed: Vec<String> = Vec::new();
        while let Some(m) = peers.next_owner(
            p,
            now,
            &passed.iter().map(String::as_str).collect::<Vec<_>>(),
        ) {
            passed.push(m.name.clone());
        }
        passed
    };
    let pick = |n: usize| {
        (0..5000)
            .map(|i| format!("p{i}"))
            .find(|p| order(p).len() == n)
            .expect("such a Program")
    };
    let c = client();
    let total = |seen: &[std::sync::Arc<AtomicUsize>]| -> usize {
        seen.iter().map(|n| n.load(Ordering::SeqCst)).sum()
    };
    // p: twice to each of two closing members, then a. q: twice to each of two, then no
    // more (four forwards in all), so a serves it where it landed.
    for (program, closed) in [(pick(2), 4), (pick(3), 8)] {
        let resp = post(&c, &a.url(CHAT), &program_body(&program, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(forwards(&c, &a, "closed").await, closed as f64, "{program}");
        assert_eq!(total(&seen), closed, "{program}");
        assert!(
            programs(&c, &a, &[]).await.contains(&program),
            "{program} on a"
        );
    }
    assert_eq!(forwards(&c, &a, "failed").await, 0.0);
}

/// A request on its own client connection to `addr`: (status, body).
async fn on_own_connection(addr: std::net::SocketAddr, body: String) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::post(CHAT)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let resp = send.send_request(req).await.expect("response head");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_in_flight_outlives_the_drain_of_the_io_thread_that_opened_its_connection() {
    // A connection to a peer is driven by the I/O thread whose request opened it, and any
    // thread's request may reuse it. When the router stops, a thread with nothing in flight
    // drains at once; its connections must keep running until every thread has drained.
    // Which thread serves a client connection is up to the kernel: several rounds.
    for round in 0..4 {
        let (_s, mut a, b) = pair_on(&["--time-scale", "5"], |c| c.io_threads = Some(2)).await;
        let theirs = owned_elsewhere(&a, 2);
        let quick = program_body(&theirs[0], false);
        // Idle client connections whose requests left one connection to b in a's pool.
        for _ in 0..3 {
            let (status, text) = on_own_connection(a.server.addr, quick.clone()).await;
            assert_eq!(status, 200, "{text}");
        }
        let slow = json!({
            "model": "sim-model",
            "messages": [{"role": "user", "content": "a long answer"}],
            "max_tokens": 400,
            "ignore_eos": true,
            "vllm_xargs": {"agentic_context": {"program_id": theirs[1]}},
        })
        .to_string();
        let in_flight = tokio::spawn(on_own_connection(a.server.addr, slow));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        a.server.stop();
        let (status, text) = in_flight.await.expect("task");
        assert_eq!(status, 200, "round {round}: {text}");
        assert!(
            text.contains("\"completion_tokens\":400"),
            "round {round}: {text}"
        );
        drop(b);
    }
}

#[tokio::test]
async fn without_hand_over_a_moved_program_is_bound_afresh() {
    let (_s, a, b, c3) = four_rank_trio(false).await;
    let c = client();
    let moving = owned_by_then(&a, "router-b", "router-c", 2);
    for p in &moving {
        let resp = post(&c, &b.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    let bs = b.state.clone();
    tokio::spawn(async move { bs.begin_shutdown().await });
    assert!(eventually(2.0, || async { b.state.is_draining() }).await);
    let p = &moving[1];
    let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(forwards(&c, &a, "forwarded").await, 1.0);
    assert_eq!(home(&c, &c3, p).await.map(|h| h.1), Some("binding".into()));
    assert!(home(&c, &b, p).await.is_some(), "b kept it");
    for (r, event) in [(&b, "pushed"), (&c3, "adopted"), (&c3, "claimed")] {
        assert_eq!(handovers(&c, r, event).await, 0.0, "{event}");
    }
}

#[tokio::test]
async fn the_hand_over_endpoints_refuse_bad_input_with_clear_errors() {
    let (s, keyed) = keyed_sim().await;
    let cfg = RouterConfig {
        peers: Some(PeersConfig::default()),
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..keyed
    };
    let r = router(cfg).await;
    let c = client();
    let key = [PEER_KEY_HEADER];
    let call = |path: &'static str, body: &'static str, auth: bool| {
        let c = &c;
        let url = r.peer_url(path);
        async move { send(c, "POST", &url, body, if auth { &key[..] } else { &[] }).await }
    };
    let ask = r#"{"model":"sim-model","program_id":"p"}"#;
    assert_eq!(call("/peers/hand-over", ask, false).await.status, 401);
    let cases = [
        ("/peers/hand-over", "not json", "invalid JSON"),
        ("/peers/hand-over", r#"{"model": "m"}"#, "program_id"),
        (
            "/peers/hand-over",
            r#"{"model": 3, "program_id": "p"}"#,
            "model",
        ),
        (
            "/peers/adopt",
            r#"{"programs": [{"model": "m"}]}"#,
            "programs",
        ),
        (
            "/peers/adopt",
            r#"{"programs":[{"model":"m","program_id":"p","root":"p","target":"t","context_tokens":1,"idle_seconds":0,"finished":"yes"}]}"#,
            "programs[0].finished",
        ),
        (
            "/peers/adopt",
            r#"{"programs": 3}"#,
            "programs: invalid type",
        ),
    ];
    for (path, body, names) in cases {
        let resp = call(path, body, true).await;
        assert_eq!(resp.status, 400, "{path} {body}: {}", resp.text());
        let msg = resp.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(msg.contains(names), "{path} {body}: {msg}");
    }
    let unknown = call("/peers/nothing", "{}", true).await;
    assert_eq!(unknown.status, 404);
    // Well-formed: nothing held here, and an adopted Program on a target not in the set is
    // skipped.
    let given = call("/peers/hand-over", ask, true).await;
    assert_eq!(given.status, 200);
    assert_eq!(given.json()["program"], json!(null));
    let adopted = call(
        "/peers/adopt",
        r#"{"programs":[{"model":"m","program_id":"p","root":"p","target":"elsewhere","context_tokens":1,"idle_seconds":0}]}"#,
        true,
    )
    .await;
    assert_eq!(adopted.status, 200);
    assert_eq!(adopted.json()["adopted"], 0);
    // Without peers the routes do not exist.
    let plain = router(RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[s.base()], 1)
    })
    .await;
    let resp = send(&c, "POST", &plain.url("/peers/adopt"), "{}", &[]).await;
    assert_eq!(resp.status, 404);
    let resp = send(&c, "POST", &plain.peer_url("/peers/adopt"), "{}", &key).await;
    assert_eq!(resp.status, 404);
}

/// A worker that answers every generation with a fixed completion and records the headers of
/// each request it receives.
async fn recording_worker() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<http::HeaderMap>>>,
) {
    use hyper::service::service_fn;
    let seen: std::sync::Arc<std::sync::Mutex<Vec<http::HeaderMap>>> = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let generation = req.uri().path() == CHAT;
                        if generation && let Ok(mut l) = log.lock() {
                            l.push(req.headers().clone());
                        }
                        let _ = req.into_body().collect().await;
                        let body = json!({"id": "x", "object": "chat.completion",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "ok"}}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                "total_tokens": 4}});
                        let mut resp =
                            hyper::Response::new(Full::new(Bytes::from(body.to_string())));
                        resp.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/json"),
                        );
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
                let io = hyper_util::rt::TokioIo::new(conn);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn the_peer_secret_never_reaches_a_worker() {
    let (url, seen) = recording_worker().await;
    let mut base = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig::default()),
        ..workers(&[url], 1)
    };
    base.observation.interval_secs = 60.0;
    let a = router(base.clone()).await;
    let b = router(base).await;
    join(&a, &b);
    let c = client();
    let theirs = owned_elsewhere(&a, 3);
    let mine = owned_elsewhere(&b, 3);
    for p in theirs.iter().chain(&mine) {
        let resp = post(&c, &a.url(CHAT), &program_body(p, false)).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
    assert_eq!(forwards(&c, &a, "forwarded").await, 3.0, "b's went to b");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 6);
    for h in &seen {
        assert!(
            h.get("x-program-router-peer-key").is_none(),
            "the peer secret reached a worker: {h:?}"
        );
        for v in h.values() {
            assert!(
                !v.as_bytes()
                    .windows(PEER_SECRET.len())
                    .any(|w| w == PEER_SECRET.as_bytes()),
                "{h:?}"
            );
        }
    }
}
