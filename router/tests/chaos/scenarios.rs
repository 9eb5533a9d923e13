//! The fault scenarios: each starts real processes on loopback, puts a load through the router,
//! injects one fault, and reports what the load's requests became ([`Report`]).

use std::path::Path;
use std::time::{Duration, Instant};

use program_router::config::fairness::{FairnessConfig, PriorityClass};
use program_router::config::peers::{PeerMember, PeersConfig};
use program_router::config::{PolicyKind, ProgramSchedulingConfig, RouterConfig};

use crate::client::{self, Tally, chat};
use crate::procs::{self, Proc};

/// What one scenario found.
pub struct Report {
    pub name: &'static str,
    pub load: String,
    pub fault: String,
    pub tally: Tally,
    /// Time from the fault to normal service, where the scenario measures one.
    pub recovery: String,
    pub notes: Vec<String>,
}

const CHAT: &str = "/v1/chat/completions";

fn program_config(capacity: u64) -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(capacity),
        ..Default::default()
    }
}

/// SIGTERM to a router holding 200 streams: some running, some retained in the RequestPool
/// (Program requests beyond the ranks' token capacity), some in fair queues (plain requests of
/// four tenants while the engines report a waiting queue). Every one of them is served before
/// the router exits.
pub async fn sigterm_drains_200_streams(dir: &Path) -> Report {
    let sim_flags = ["--max-num-seqs", "6", "--time-scale", "4"];
    let (a, b) = (
        procs::sim(dir, "sim-a", &sim_flags),
        procs::sim(dir, "sim-b", &sim_flags),
    );
    let mut cfg = procs::config(&[&a, &b]);
    cfg.program_scheduling = Some(program_config(3000));
    cfg.fairness = Some(FairnessConfig {
        classes: vec![PriorityClass {
            name: "standard".into(),
            max_waiting_requests: 1,
            only_when_idle: false,
            max_tpot_seconds: None,
        }],
        default_class: "standard".into(),
        metrics_max_age_seconds: 2.0,
        ..Default::default()
    });
    cfg.limits.drain_timeout_secs = 90.0;
    cfg.limits.request_timeout_secs = 120.0;
    let file = procs::write_config(dir, "router", &cfg);
    let mut router = procs::router(dir, "router", &file, &[]);
    let c = client::client();
    let base = router.base.clone();
    let load: Vec<_> = (0..200)
        .map(|i| {
            let tenant = format!("t{}", i % 4);
            if i % 2 == 0 {
                chat(Some(&format!("p{}", i % 50)), &tenant, 1200, 24)
            } else {
                chat(None, &tenant, 400, 24)
            }
        })
        .collect();
    let tasks = client::launch(&c, &format!("{base}{CHAT}"), load, Duration::from_secs(120));
    // SIGTERM once the 200 streams are connected and requests wait in both places (or after
    // 10 s, whatever is held then). A client still connecting as the listener closes is the
    // other race, the one a shutdown delay covers (the operator sets 5 s; here it is 0).
    let metrics_url = router.metrics_url();
    let (mut pooled, mut queued, mut open) = (0.0, 0.0, 0.0);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let m = client::get_text(&c, &metrics_url).await;
        pooled = client::metric(&m, "vllm_router_agent_aware_rank_queue_size");
        queued = client::metric(&m, "program_router_fair_queue_depth");
        open = program_router::observe::scrape::sum(
            &m,
            "program_router_connections_open",
            &[("listener", "api")],
        );
        if pooled > 0.0 && queued > 0.0 && open >= 200.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let signalled = Instant::now();
    router.signal("TERM");
    let tally = client::collect(tasks).await;
    let exit = router.wait_exit(Duration::from_secs(100));
    let drained = signalled.elapsed();
    let mut notes = vec![format!(
        "at SIGTERM: {open} client connections, {pooled} requests in the RequestPool, {queued} in fair queues"
    )];
    match exit {
        Ok(code) => notes.push(format!("router exit code {code:?}")),
        Err(e) => notes.push(format!("router did not exit: {e}")),
    }
    Report {
        name: "sigterm_drains_200_streams",
        load: "200 streams at once (100 Program, 100 plain; 4 tenants) over 2 sims".into(),
        fault: "SIGTERM to the router".into(),
        tally,
        recovery: format!(
            "drained and exited {:.1} s after SIGTERM",
            drained.as_secs_f64()
        ),
        notes,
    }
}

/// The burst is on its way, in every stage of connecting, when the signal goes out.
const BURST_LEAD_MS: u64 = 3;

/// SIGTERM while clients keep opening connections (no shutdown delay, the router's default):
/// 64 clients send short streams, each on a new connection, before and after the signal, and a
/// burst of 200 more connects as it goes out. A client connects and is served, or is refused
/// (never accepted, safe to retry); none is reset after its connection was accepted.
pub async fn sigterm_while_connecting(dir: &Path) -> Report {
    let a = procs::sim(dir, "sim-a", &["--time-scale", "20"]);
    let cfg = procs::config(&[&a]);
    let file = procs::write_config(dir, "router", &cfg);
    let mut router = procs::router(dir, "router", &file, &[]);
    // No idle connection is kept: every request opens its own.
    let c: client::HttpClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build_http();
    let url = format!("{}{CHAT}", router.base);
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(4);
    let clients: Vec<_> = (0..64)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let mut t = Tally::default();
                let req = chat(None, &format!("t{}", i % 4), 200, 4);
                while Instant::now() < stop_at {
                    let o = match client::send(&c, &url, &req, Duration::from_secs(20)).await {
                        // When, against the signal's time in the notes.
                        client::Outcome::Lost(w) => client::Outcome::Lost(format!(
                            "{w} (a looping client, {:.3} s into the load)",
                            started.elapsed().as_secs_f64()
                        )),
                        o => o,
                    };
                    let refused = matches!(o, client::Outcome::NotAccepted(_));
                    t.add(o);
                    if refused {
                        // The listener is gone: a real client retries elsewhere.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                t
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // And a burst of 200 more connecting at once as the signal goes out.
    let burst = client::launch(
        &c,
        &url,
        (0..200)
            .map(|i| chat(None, &format!("t{}", i % 4), 200, 4))
            .collect(),
        Duration::from_secs(20),
    );
    tokio::time::sleep(Duration::from_millis(BURST_LEAD_MS)).await;
    let signalled = Instant::now();
    router.signal("TERM");
    let exited = tokio::task::spawn_blocking(move || {
        let code = router.wait_exit(Duration::from_secs(30));
        (code, signalled.elapsed())
    });
    let mut tally = client::collect(burst).await;
    for task in clients {
        match task.await {
            Ok(t) => tally.merge(&t),
            Err(e) => tally.add(client::Outcome::Lost(format!("client task: {e}"))),
        }
    }
    let mut notes = vec![format!(
        "SIGTERM {:.3} s into the load, {BURST_LEAD_MS} ms after a burst of 200 connections",
        (signalled - started).as_secs_f64()
    )];
    let mut took = Duration::ZERO;
    match exited.await {
        Ok((Ok(code), t)) => {
            took = t;
            notes.push(format!("router exit code {code:?}"));
        }
        Ok((Err(e), _)) => notes.push(format!("router did not exit: {e}")),
        Err(e) => notes.push(format!("router exit not observed: {e}")),
    }
    Report {
        name: "sigterm_while_connecting",
        load: "64 clients, each request on a new connection, and a burst of 200 at the signal"
            .into(),
        fault: "SIGTERM to the router (no shutdown delay)".into(),
        tally,
        recovery: format!(
            "drained and exited {:.1} s after SIGTERM",
            took.as_secs_f64()
        ),
        notes,
    }
}

/// SIGKILL of one of two vllm-sim servers while 100 streams run on both: the streams on the
/// killed server end with an error event; the others complete. Then each Program keeps sending:
/// the time until every Program is served again is the recovery.
pub async fn sim_killed_midstream(dir: &Path) -> Report {
    let sim_flags = ["--time-scale", "2"];
    let (a, b) = (
        procs::sim(dir, "sim-a", &sim_flags),
        procs::sim(dir, "sim-b", &sim_flags),
    );
    let mut cfg = procs::config(&[&a, &b]);
    cfg.program_scheduling = Some(program_config(200_000));
    cfg.health.interval_secs = 0.5;
    let file = procs::write_config(dir, "router", &cfg);
    let router = procs::router(dir, "router", &file, &[]);
    let c = client::client();
    let url = format!("{}{CHAT}", router.base);
    let programs: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let load: Vec<_> = (0..100)
        .map(|i| chat(Some(&programs[i % 20]), "t", 400, 120))
        .collect();
    let tasks = client::launch(&c, &url, load, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(800)).await;
    a.signal("KILL");
    let killed = Instant::now();
    let mut tally = client::collect(tasks).await;
    // Every Program sends again until one request of each completes.
    let mut pending: Vec<String> = programs.clone();
    let mut after = Tally::default();
    while !pending.is_empty() && killed.elapsed() < Duration::from_secs(30) {
        let load: Vec<_> = pending.iter().map(|p| chat(Some(p), "t", 400, 4)).collect();
        let outcomes: Vec<_> = futures_util::future::join_all(
            load.iter()
                .map(|r| client::send(&c, &url, r, Duration::from_secs(20))),
        )
        .await;
        let mut still = Vec::new();
        for (p, o) in pending.iter().zip(outcomes) {
            if o != client::Outcome::Completed {
                still.push(p.clone());
            }
            after.add(o);
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let recovered = killed.elapsed();
    tally.merge(&after);
    let mut notes = vec![format!(
        "after the kill: {} requests until every Program was served again ({} completed, {} errored)",
        after.accepted(),
        after.completed,
        after.errored
    )];
    if !pending.is_empty() {
        notes.push(format!(
            "{} Programs never served again within 30 s",
            pending.len()
        ));
    }
    drop(b);
    Report {
        name: "sim_killed_midstream",
        load: "100 streams of 20 Programs over 2 sims, then each Program again".into(),
        fault: "SIGKILL of one sim mid-stream".into(),
        tally,
        recovery: if pending.is_empty() {
            format!(
                "every Program served again {:.1} s after the kill",
                recovered.as_secs_f64()
            )
        } else {
            "not recovered".into()
        },
        notes,
    }
}

/// A backend that stalls mid-stream (holds the connection, sends nothing) and one that is
/// frozen before answering (SIGSTOP): streams end with an error event after the upstream idle
/// timeout, requests to the frozen one get 504 at the request timeout.
pub async fn stalled_backends(dir: &Path) -> Report {
    let stall = procs::sim(
        dir,
        "sim-stall",
        &[
            "--fail-rate",
            "1",
            "--fail-after-tokens",
            "3",
            "--fail-stall",
            "--instant",
        ],
    );
    let mut cfg = procs::config(&[&stall]);
    cfg.limits.upstream_idle_timeout_secs = Some(1.0);
    cfg.limits.request_timeout_secs = 3.0;
    cfg.circuit_breaker.enabled = false;
    let file = procs::write_config(dir, "router", &cfg);
    let router = procs::router(dir, "router", &file, &[]);
    let c = client::client();
    let url = format!("{}{CHAT}", router.base);
    let start = Instant::now();
    let load: Vec<_> = (0..20)
        .map(|i| chat(Some(&format!("p{i}")), "t", 200, 30))
        .collect();
    let mut tally = client::run_load(&c, &url, load, 20, Duration::from_secs(30)).await;
    let stalled_in = start.elapsed();
    // The same router, its one backend frozen before it answers anything.
    stall.signal("STOP");
    let start = Instant::now();
    let load: Vec<_> = (0..10).map(|_| chat(None, "t", 200, 4)).collect();
    let frozen = client::run_load(&c, &url, load, 10, Duration::from_secs(30)).await;
    let frozen_in = start.elapsed();
    stall.signal("CONT");
    tally.merge(&frozen);
    Report {
        name: "stalled_backends",
        load: "20 streams to a backend that stalls after 3 tokens; 10 requests to a frozen one"
            .into(),
        fault: "stall mid-stream (idle timeout 1 s); SIGSTOP (request timeout 3 s)".into(),
        tally,
        recovery: format!(
            "all answered in {:.1} s (stalls) and {:.1} s (frozen)",
            stalled_in.as_secs_f64(),
            frozen_in.as_secs_f64()
        ),
        notes: vec![],
    }
}

/// What a misbehaving backend sends, one behaviour per connection in turn.
const GARBAGE: &[&str] = &[
    // CRLF events, a usage chunk with negative counts, then [DONE].
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    // An oversized usage (beyond u64) in a CRLF stream.
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    // A stream that ends cleanly without [DONE].
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    // Not HTTP at all.
    "\x00\x01garbage garbage\r\n\r\n",
    // A JSON body whose usage is garbage.
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n",
    // Headers, then the connection closes.
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
];

fn chunk(s: &str) -> String {
    format!("{:x}\r\n{s}\r\n", s.len())
}

/// A loopback backend that answers each connection with the next behaviour of [`GARBAGE`].
fn garbage_backend() -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", l.local_addr().expect("addr"));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let turn = std::sync::Arc::new(AtomicUsize::new(0));
    l.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            let Ok((mut s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            let turn = turn.clone();
            std::thread::spawn(move || {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 65536];
                // Read the request head and body (small JSON); enough to answer.
                let n = s.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                if req.starts_with("GET") {
                    // Health checks pass: the garbage is in the generations.
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
                    return;
                }
                // A non-streamed request gets the JSON behaviour, a stream one of the others.
                let i = if req.contains("\"stream\":false") {
                    4
                } else {
                    [0, 1, 2, 3, 5][turn.fetch_add(1, Ordering::Relaxed) % 5]
                };
                let mut out = GARBAGE[i].to_string();
                let delta = r#"data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
                match i {
                    0 => {
                        out += &chunk(&format!("{delta}\r\n\r\n"));
                        out += &chunk(
                            "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":-5,\"completion_tokens\":-1}}\r\n\r\n",
                        );
                        out += &chunk("data: [DONE]\r\n\r\n");
                        out += "0\r\n\r\n";
                    }
                    1 => {
                        out += &chunk(&format!("{delta}\r\n\r\n"));
                        out += &chunk(
                            "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1e400,\"completion_tokens\":18446744073709551616}}\r\n\r\n",
                        );
                        out += &chunk("data: [DONE]\r\n\r\n");
                        out += "0\r\n\r\n";
                    }
                    2 => {
                        out += &chunk(&format!("{delta}\n\n"));
                        out += "0\r\n\r\n";
                    }
                    4 => {
                        let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":"many","completion_tokens":{"a":1}}}"#;
                        out += &format!("content-length: {}\r\n\r\n{body}", body.len());
                    }
                    _ => {}
                }
                let _ = s.write_all(out.as_bytes());
                let _ = s.flush();
                let _ = s.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (base, stop)
}

/// A backend that sends garbage: negative and oversized usage in CRLF-delimited events, a stream
/// ending without [DONE], bytes that are not HTTP, a JSON body with garbage usage, headers and
/// then nothing. Every request completes or gets an error; the router keeps serving.
pub async fn garbage_backend_answers(dir: &Path) -> Report {
    let (base, stop) = garbage_backend();
    let mut cfg = RouterConfig {
        host: "127.0.0.1".into(),
        port: 0,
        prometheus_host: "127.0.0.1".into(),
        prometheus_port: Some(0),
        workers: vec![program_router::config::WorkerConfig {
            url: base,
            dp_rank: None,
        }],
        ..Default::default()
    };
    cfg.health.interval_secs = 0.2;
    cfg.circuit_breaker.enabled = false;
    cfg.retry.max_retries = 1;
    cfg.program_scheduling = Some(program_config(100_000));
    let file = procs::write_config(dir, "router", &cfg);
    let mut router = procs::router(dir, "router", &file, &[]);
    let c = client::client();
    let url = format!("{}{CHAT}", router.base);
    let mut load = Vec::new();
    for i in 0..60 {
        let mut r = chat(Some(&format!("p{}", i % 7)), "t", 100, 4);
        if i % GARBAGE.len() == 4 {
            r.body = r.body.replace("\"stream\":true", "\"stream\":false");
        }
        load.push(r);
    }
    let mut tally = Tally::default();
    let mut seq = Vec::new();
    for r in &load {
        let o = client::send(&c, &url, r, Duration::from_secs(20)).await;
        seq.push(format!("{o:?}").chars().take(60).collect::<String>());
        tally.add(o);
    }
    if std::env::var_os("CHAOS_KEEP").is_some() {
        for s in &seq {
            println!("      {s}");
        }
    }
    let alive = router.child.try_wait().ok().flatten().is_none();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    Report {
        name: "garbage_backend",
        load: "60 requests (streams and one JSON in six) one at a time".into(),
        fault: "negative/oversized usage, CRLF SSE, no [DONE], non-HTTP bytes, garbage JSON usage, headers then close".into(),
        tally,
        recovery: if alive { "router kept serving".into() } else { "ROUTER DIED".into() },
        notes: vec![],
    }
}

/// Valid and invalid config files alternate every 200 ms for 8 s while 400 requests run:
/// every request is served, valid files apply, invalid ones are refused and counted.
pub async fn reload_storm(dir: &Path) -> Report {
    let sim = procs::sim(dir, "sim", &["--time-scale", "20"]);
    let mut cfg = procs::config(&[&sim]);
    cfg.program_scheduling = Some(program_config(200_000));
    let file = procs::write_config(dir, "router", &cfg);
    let router = procs::router(dir, "router", &file, &[]);
    let c = client::client();
    let url = format!("{}{CHAT}", router.base);
    let storm = {
        let (dir, cfg) = (dir.to_path_buf(), cfg.clone());
        std::thread::spawn(move || {
            let policies = [
                PolicyKind::CacheAware,
                PolicyKind::RoundRobin,
                PolicyKind::PowerOfTwo,
            ];
            for i in 0..30 {
                if i % 2 == 0 {
                    let mut next = cfg.clone();
                    next.policy.kind = policies[i / 2 % policies.len()];
                    next.limits.max_concurrent_requests = Some(16 + i as u32);
                    procs::write_config(&dir, "router", &next);
                } else {
                    let bad = dir.join(".router.json.tmp");
                    let text = if i % 4 == 1 {
                        r#"{"workers": "not a list"}"#.to_string()
                    } else {
                        r#"{"host": "127.0.0.1", "limits": {"request_timeout_secs": -1}"#
                            .to_string()
                    };
                    let _ = std::fs::write(&bad, text);
                    let _ = std::fs::rename(&bad, dir.join("router.json"));
                }
                // Every third file stays longer than the watcher's poll and debounce (0.5 s +
                // 0.1 s), so valid and invalid files are both read whatever the machine's load.
                std::thread::sleep(Duration::from_millis(if i % 3 == 2 { 800 } else { 200 }));
            }
            procs::write_config(&dir, "router", &cfg);
        })
    };
    let load: Vec<_> = (0..400)
        .map(|i| {
            chat(
                if i % 2 == 0 { Some("p") } else { None }
                    .map(|p| format!("{p}{}", i % 30))
                    .as_deref(),
                "t",
                200,
                8,
            )
        })
        .collect();
    let tally = client::run_load(&c, &url, load, 24, Duration::from_secs(30)).await;
    let _ = storm.join();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = client::get_text(&c, &router.metrics_url()).await;
    let ok = program_router::observe::scrape::sum(
        &m,
        "vllm_router_config_reloads_total",
        &[("result", "applied")],
    );
    let bad = program_router::observe::scrape::sum(
        &m,
        "vllm_router_config_reloads_total",
        &[("result", "rejected")],
    );
    let final_ok = client::send(&c, &url, &chat(None, "t", 10, 2), Duration::from_secs(10)).await
        == client::Outcome::Completed;
    Report {
        name: "reload_storm",
        load: "400 requests, 24 at a time".into(),
        fault: "valid and invalid config files alternating every 200 ms (every third held 800 ms) for 12 s".into(),
        tally,
        recovery: format!(
            "reloads applied {ok}, rejected {bad}; serving after the storm: {final_ok}{}",
            if ok > 0.0 && bad > 0.0 && final_ok {
                ""
            } else {
                " (not recovered)"
            }
        ),
        notes: vec![],
    }
}

/// Two router replicas with peers on; SIGKILL of one while streams it serves for the other run:
/// those streams end with an error event at the surviving replica, and every Program it owned
/// is served by the survivor from then on.
pub async fn router_replica_killed(dir: &Path) -> Report {
    let sim = procs::sim(dir, "sim", &["--time-scale", "2", "-d", "2"]);
    let secret = dir.join("peer-secret");
    std::fs::write(&secret, "chaos-peer-secret-0123456789abcdef0123456789").expect("secret");
    // Each replica's listeners on ports the kernel picks; the member list, which names the
    // peer listeners, follows as a hot reload once both have printed theirs.
    let mut routers: Vec<Proc> = Vec::new();
    let mut configs = Vec::new();
    for i in 0..2 {
        let mut cfg = procs::config(&[&sim]);
        cfg.policy.kind = PolicyKind::CacheAware;
        cfg.program_scheduling = Some(program_config(200_000));
        cfg.peer_host = "127.0.0.1".into();
        cfg.peer_port = Some(0);
        cfg.peer_secret_file = Some(secret.display().to_string());
        cfg.peers = Some(PeersConfig {
            self_name: Some(format!("r{i}")),
            ..Default::default()
        });
        let file = procs::write_config(dir, &format!("router-{i}"), &cfg);
        routers.push(procs::router(dir, &format!("router-{i}"), &file, &[]));
        configs.push(cfg);
    }
    let members: Vec<PeerMember> = routers
        .iter()
        .enumerate()
        .map(|(i, r)| PeerMember {
            name: format!("r{i}"),
            url: r.peer.clone().expect("a peer listener"),
        })
        .collect();
    for (i, cfg) in configs.iter_mut().enumerate() {
        if let Some(p) = cfg.peers.as_mut() {
            p.members = members.clone();
        }
        procs::write_config(dir, &format!("router-{i}"), cfg);
    }
    let c = client::client();
    for r in &routers {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let status = client::get_text(&c, &format!("{}/status", r.base)).await;
            let st: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
            if st["peers"]["members"] == serde_json::json!(["r0", "r1"]) {
                break;
            }
            assert!(Instant::now() < until, "member list not applied: {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let survivor = format!("{}{CHAT}", routers[1].base);
    let programs: Vec<String> = (0..30).map(|i| format!("p{i}")).collect();
    // Long streams through the survivor; about half are forwarded to their owner, r0.
    let load: Vec<_> = programs
        .iter()
        .map(|p| chat(Some(p), "t", 300, 200))
        .collect();
    let tasks = client::launch(&c, &survivor, load, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    routers[0].signal("KILL");
    let killed = Instant::now();
    let mut tally = client::collect(tasks).await;
    let load: Vec<_> = programs
        .iter()
        .map(|p| chat(Some(p), "t", 300, 4))
        .collect();
    let after = client::run_load(&c, &survivor, load, 30, Duration::from_secs(30)).await;
    let recovered = killed.elapsed();
    let m = client::get_text(&c, &routers[1].metrics_url()).await;
    let forwarded = client::metric(&m, "program_router_peer_forwards_total");
    let notes = vec![
        format!(
            "after the kill, every Program again through the survivor: {} completed, {} errored, {} lost",
            after.completed, after.errored, after.lost
        ),
        format!("the survivor's forwards counter: {forwarded}"),
    ];
    tally.merge(&after);
    Report {
        name: "router_replica_killed",
        load: "30 long streams of 30 Programs through replica r1 (r0 owns about half)".into(),
        fault: "SIGKILL of replica r0".into(),
        tally,
        recovery: format!(
            "every Program served by r1 {:.1} s after the kill",
            recovered.as_secs_f64()
        ),
        notes,
    }
}
