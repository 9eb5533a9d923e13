//! Member lists between replicas: numbered lists taken from a peer, signed with the peer secret, and the peer plane's gate.

use super::*;

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
pub(crate) async fn keyed_sim() -> (vllm_sim::server::Spawned, RouterConfig) {
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
    let flags = <program_router::cli::Cli as clap::Parser>::try_parse_from([
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
