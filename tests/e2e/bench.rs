//! Operator benchmark against the real control plane (numbers for docs/benchmarks.md):
//! - CR edit → every router runs the edited config (p50/p95 over N edits);
//! - worker Pod Ready → a request pinned to its new DP rank is routed (p50/p95 over N pods);
//! - steady state with 100 worker pods: operator reconciles and API writes per minute (goal 0).
//!
//! `PROGSCHED_BENCH_EDITS` (default 20) sets N; `PROGSCHED_BENCH_STEADY_SECS` (default 60) the
//! steady-state window. It asserts what must hold (every edit and every worker arrives, no
//! steady-state writes) and prints the latencies; it does not assert on speed.

mod harness;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use harness::kubelet::Kubelet;
use harness::{ControlPlane, Operator, Scratch, free_port, percentile, wait_for};
use kube::api::{Api, Patch, PatchParams};
use program_operator::crd::ProgramScheduling;
use serde_json::json;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn operator_latency_and_steady_state() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench());
}

async fn bench() {
    let edits = env_num("PROGSCHED_BENCH_EDITS", 20) as usize;
    let steady = Duration::from_secs(env_num("PROGSCHED_BENCH_STEADY_SECS", 60));
    let cp = ControlPlane::start();
    cp.install_crds();
    let client = cp.client().await;
    let ns = "bench";
    cp.namespace(&client, ns).await;

    let scratch = Scratch::new("bench");
    let kubelet = Kubelet::new(client.clone(), ns, scratch.0.clone());
    let routers_task = kubelet.run_routers();
    let labels = BTreeMap::from([("app".to_string(), "vllm".to_string())]);
    let worker_port = free_port();
    let op = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
    let (manifest, router_port) = harness::fleet_manifest(
        ns,
        worker_port,
        1,
        "  programScheduling: {queueTimeoutSeconds: 600}\n",
    );
    cp.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest))
        .expect_ok("apply");
    let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), ns);
    let router = wait_for(Duration::from_secs(60), || async {
        let (pod, ip) = kubelet.routers().await.into_iter().next()?;
        Some((kubelet.router_state(&pod).await?, ip))
    })
    .await
    .unwrap_or_else(|| panic!("no router pod ran:\n{}", op.log_tail()));
    let (state, router_ip) = router;

    // Worker Ready → routed, one new single-rank worker at a time.
    let c = testkit::client();
    let chat = json!({"model": "sim-model", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let url = format!("http://{router_ip}:{router_port}/v1/chat/completions");
    let mut routed = Vec::new();
    for i in 0..edits as u32 {
        let t0 = Instant::now();
        kubelet
            .add_worker(&format!("w-{i}"), labels.clone(), worker_port, 1, i)
            .await;
        let rank = i.to_string();
        let ok = wait_for(Duration::from_secs(30), || async {
            // Only ask once the router knows the rank (an unknown pinned rank is an error reply).
            let known = state
                .applied
                .load()
                .targets
                .targets
                .iter()
                .any(|t| t.spec.dp_rank == Some(i) && t.backend.healthy());
            if !known {
                return None;
            }
            let r =
                testkit::send(&c, "POST", &url, &chat, &[("x-data-parallel-rank", &rank)]).await;
            (r.status == 200).then_some(())
        })
        .await;
        assert!(ok.is_some(), "worker {i} never routed:\n{}", op.log_tail());
        routed.push(t0.elapsed().as_secs_f64());
    }

    // CR edit → the router runs the edited config.
    let mut applied = Vec::new();
    for i in 0..edits {
        let v = 700.0 + i as f64;
        let t0 = Instant::now();
        api.patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"programScheduling": {"queueTimeoutSeconds": v}}})),
        )
        .await
        .expect("edit");
        let ok = wait_for(Duration::from_secs(30), || async {
            let cfg = state.applied.load();
            let ps = cfg.config.program_scheduling.as_ref()?;
            (ps.queue_timeout_seconds == v).then_some(())
        })
        .await;
        assert!(ok.is_some(), "edit {i} never applied:\n{}", op.log_tail());
        applied.push(t0.elapsed().as_secs_f64());
    }

    // Steady state with 100 worker pods.
    for i in edits as u32..100 {
        kubelet
            .add_worker(&format!("w-{i}"), labels.clone(), worker_port, 1, i)
            .await;
    }
    let settled = wait_for(Duration::from_secs(60), || async {
        let ps = api.get("fleet").await.ok()?;
        let s = ps.status?;
        let ready = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (s.ranks == Some(100) && ready).then_some(())
    })
    .await;
    assert!(settled.is_some(), "100 ranks Ready:\n{}", op.log_tail());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (r0, w0) = (
        op.counter("program_operator_reconciles_total").await,
        op.counter("program_operator_api_writes_total").await,
    );
    tokio::time::sleep(steady).await;
    let (r1, w1) = (
        op.counter("program_operator_reconciles_total").await,
        op.counter("program_operator_api_writes_total").await,
    );
    let per_min = 60.0 / steady.as_secs_f64();
    let summary = json!({
        "edits": edits,
        "cr_edit_to_router_applied_s": {"p50": percentile(&applied, 50.0), "p95": percentile(&applied, 95.0), "max": percentile(&applied, 100.0)},
        "worker_ready_to_routed_s": {"p50": percentile(&routed, 50.0), "p95": percentile(&routed, 95.0), "max": percentile(&routed, 100.0)},
        "steady_state_100_workers": {"window_s": steady.as_secs(), "reconciles_per_min": (r1 - r0) * per_min, "writes_per_min": (w1 - w0) * per_min},
    });
    println!("OPERATOR_BENCH {summary}");
    if let Ok(dir) = std::env::var("PROGSCHED_BENCH_OUT") {
        let _ = std::fs::write(
            std::path::Path::new(&dir).join("operator.json"),
            serde_json::to_string_pretty(&summary).unwrap_or_default(),
        );
    }
    assert_eq!(
        w1 - w0,
        0.0,
        "API writes at steady state:\n{}",
        op.log_tail()
    );

    routers_task.abort();
    kubelet.shutdown().await;
    op.stop();
}
