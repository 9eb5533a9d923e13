//! Handing Programs between replicas: on a new member, at shutdown, to the next owner, and what never crosses to a worker.

use super::*;
use crate::member_lists::keyed_sim;

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
