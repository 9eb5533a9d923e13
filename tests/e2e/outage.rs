//! The API server down for a minute while a worker dies: the routers keep serving on their last
//! config (0 requests lost; the dead worker's Programs move to the live one), and once the API
//! server is back the operator converges on the changed workers — timed.

use super::*;

/// What a request became, judged as a client would (issue 33's counting).
#[derive(Default, Debug)]
struct Tally {
    completed: usize,
    errored: usize,
    lost: usize,
    why: Vec<String>,
}

async fn one(c: &testkit::HttpClient, url: &str, program: &str) -> Result<bool, String> {
    let body = json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": "keep serving"}],
        "max_tokens": 4,
        "vllm_xargs": {"agentic_context": {"program_id": program}},
    })
    .to_string();
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), async {
        let resp = c
            .request(req)
            .await
            .map_err(|e| format!("no response: {e}"))?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map_err(|e| format!("body cut: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, body))
    })
    .await
    .map_err(|_| "no answer within 30 s".to_string())??;
    let v: serde_json::Value =
        serde_json::from_slice(&resp.1).map_err(|_| format!("{} without JSON", resp.0))?;
    match (
        resp.0.is_success(),
        v["choices"].is_array(),
        v["error"]["message"].is_string(),
    ) {
        (true, true, _) => Ok(true),
        (false, _, true) => Ok(false),
        _ => Err(format!("{}: {v}", resp.0)),
    }
}

#[test]
fn routers_keep_serving_through_an_api_server_outage_and_the_operator_converges_after() {
    run(async {
        let outage = Duration::from_secs(
            std::env::var("PROGSCHED_OUTAGE_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(60),
        );
        let cp = ControlPlane::start();
        cp.install_crds();
        let client = cp.client().await;
        let ns = "outage";
        cp.namespace(&client, ns).await;
        let scratch = Scratch::new("outage");
        let kubelet = Kubelet::new(client.clone(), ns, scratch.0.clone());
        let routers_task = kubelet.run_routers();
        let worker_port = free_port();
        kubelet
            .add_worker("vllm-0", worker_labels(), worker_port, 1, 0)
            .await;
        let dead_ip = kubelet
            .add_worker("vllm-1", worker_labels(), worker_port, 1, 1)
            .await;
        let op = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
        let (manifest, router_port) =
            harness::fleet_manifest(ns, worker_port, 1, "  programScheduling: {}\n");
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest))
            .expect_ok("apply ProgramScheduling");
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), ns);
        let ready = wait_for(Duration::from_secs(60), || async {
            let ps = api.get("fleet").await.ok()?;
            let one = ps.status.as_ref()?.ready_routers == Some(1);
            (condition(&ps, "Ready")?.0 == "True" && one).then_some(())
        })
        .await;
        assert!(ready.is_some(), "Ready:\n{}", op.log_tail());
        let (pod, ip) = kubelet.routers().await.remove(0);
        let url = format!("http://{ip}:{router_port}/v1/chat/completions");
        let state = kubelet.router_state(&pod).await.expect("router state");
        let targets = || {
            let a = state.applied.load();
            let mut v: Vec<String> = a
                .targets
                .targets
                .iter()
                .map(|t| t.spec.url.clone())
                .collect();
            v.sort();
            v
        };
        assert_eq!(targets().len(), 2);

        // Load for the whole story: 4 clients, each a Program of its own, one request after
        // another.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
        let clients: Vec<_> = (0..4)
            .map(|i| {
                let (stop, tally, url) = (stop.clone(), tally.clone(), url.clone());
                tokio::spawn(async move {
                    let c = testkit::client();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let o = one(&c, &url, &format!("p{i}")).await;
                        {
                            let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                            match o {
                                Ok(true) => t.completed += 1,
                                Ok(false) => t.errored += 1,
                                Err(why) => {
                                    t.lost += 1;
                                    if t.why.len() < 5 {
                                        t.why.push(why);
                                    }
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(3)).await;

        cp.freeze(true);
        let down = Instant::now();
        tokio::time::sleep(outage / 6).await;
        // A worker's process dies while nobody can tell the API server.
        kubelet.kill_worker_process("vllm-1").await;
        tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
        let served_during = tally.lock().map(|t| t.completed).unwrap_or(0);
        cp.freeze(false);
        let up = Instant::now();
        // The kubelet reports the dead worker and its replacement.
        kubelet.delete_worker("vllm-1").await;
        let new_ip = kubelet
            .add_worker("vllm-2", worker_labels(), worker_port, 1, 1)
            .await;
        let converged = wait_for(Duration::from_secs(120), || async {
            let t = targets();
            (t.iter().any(|u| u.contains(&new_ip)) && !t.iter().any(|u| u.contains(&dead_ip)))
                .then(|| up.elapsed())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in clients {
            let _ = c.await;
        }
        let t = std::mem::take(&mut *tally.lock().unwrap_or_else(|p| p.into_inner()));
        eprintln!(
            "api-server outage {:.0} s: accepted {} completed {} errored {} lost {}; \
             completed by the end of the outage {served_during}; converged {:.1} s after it ended",
            outage.as_secs_f64(),
            t.completed + t.errored + t.lost,
            t.completed,
            t.errored,
            t.lost,
            converged.map_or(f64::NAN, |d| d.as_secs_f64()),
        );
        assert_eq!(t.lost, 0, "lost requests: {:?}", t.why);
        assert!(served_during > 0, "the router served during the outage");
        let converged = converged.unwrap_or_else(|| {
            panic!(
                "the operator did not converge after the outage:\n{}",
                op.log_tail()
            )
        });
        assert!(converged < Duration::from_secs(120), "{converged:?}");
        routers_task.abort();
        kubelet.shutdown().await;
        op.stop();
    });
}
