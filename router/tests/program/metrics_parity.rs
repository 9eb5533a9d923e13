//! Drop-in metrics: after Program traffic, every `vllm_router_*` family vllm-router 0.1.17
//! exposes (tests/reference/, its predictor-only `vllm_router_workflow_*` families aside) exists
//! in ours with the same type and label names, and the label values dashboards filter on.

use super::*;
use std::collections::{BTreeMap, BTreeSet};

/// family → (type, label names without `le` / `quantile`).
type Families = BTreeMap<String, (String, BTreeSet<String>)>;

fn families(text: &str) -> Families {
    let mut out = Families::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                out.insert(name.to_string(), (kind.to_string(), BTreeSet::new()));
            }
        }
    }
    for s in program_router::observe::scrape::samples(text) {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                let base = s.name.strip_suffix(suffix)?;
                out.contains_key(base).then_some(base)
            })
            .unwrap_or(s.name);
        if let Some((_, labels)) = out.get_mut(family) {
            for pair in s.labels.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, _)) = pair.split_once('=') {
                    let k = k.trim();
                    if k != "le" && k != "quantile" {
                        labels.insert(k.to_string());
                    }
                }
            }
        }
    }
    out
}

/// The values label `label` takes in `family`.
fn values(text: &str, family: &str, label: &str) -> BTreeSet<String> {
    program_router::observe::scrape::samples(text)
        .filter(|s| s.name == family)
        .filter_map(|s| s.label(label).map(String::from))
        .collect()
}

#[tokio::test]
async fn every_peer_family_is_exposed_with_its_type_and_labels() {
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/reference/vllm-router-0.1.17-metrics.sample.txt"
    ))
    .expect("reference exposition");
    let want: Families = families(&reference)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("vllm_router_workflow_"))
        .collect();
    assert_eq!(want.len(), 31, "{:?}", want.keys());

    // As the reference was captured: one server with 2 DP ranks, capacity 8192, global queue,
    // three Programs of three turns each.
    let s = sim(&["--time-scale", "20", "--data-parallel-size", "2"]).await;
    let cfg = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig {
            token_capacity_per_dp_rank: Some(8192),
            global_queue: true,
            metrics_interval_seconds: 0.2,
            ..Default::default()
        }),
        agentic_context: AgenticContextMode::Strip,
        ..workers(&[s.base()], 2)
    };
    let r = router(cfg).await;
    let c = client();
    for turn in 0..3 {
        for p in ["p1", "p2", "p3"] {
            let body = program_body(p, 40 + turn * 10, json!({"step_id": turn}));
            let reply = post(&c, &r.url(CHAT), &body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        // A tool call between turns, past the observation interval.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let text = get_metrics(&c, &r).await;
    let ours = families(&text);

    let mut wrong = Vec::new();
    for (name, (kind, labels)) in &want {
        match ours.get(name) {
            None => wrong.push(format!("{name}: missing")),
            Some((k, l)) if k != kind || l != labels => wrong.push(format!(
                "{name}: ours {k} {l:?}, the peer's {kind} {labels:?}"
            )),
            Some(_) => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of 31 families differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );

    let reasons = values(&text, "vllm_router_agent_aware_transitions_total", "reason");
    assert!(reasons.contains("program_admit"), "{reasons:?}");
    let windows = values(&text, "vllm_router_agent_aware_rolling_samples", "window");
    assert_eq!(
        windows,
        ["continuity", "request"].map(String::from).into(),
        "{windows:?}"
    );
    let pools = values(
        &text,
        "vllm_router_agent_aware_token_estimate_coefficient",
        "model_pool",
    );
    assert_eq!(pools, ["program:all".to_string()].into(), "{pools:?}");
    let targets = values(
        &text,
        "vllm_router_agent_aware_armed_ttl_seconds_count",
        "target",
    );
    assert!(
        targets
            .iter()
            .all(|t| t.ends_with("@0") || t.ends_with("@1")),
        "per-target series name the target as the peer does: {targets:?}"
    );
}
