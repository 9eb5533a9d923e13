//! Every router series that something we ship queries (the chart's alerts, dashboard and autoscaling
//! examples) is exported by a running router after a little traffic, so a renamed series cannot
//! silently blank a query. The chart e2e checks the same against live router pods, the operator and
//! a simulator, parsing the PromQL.

use super::*;

/// The router series (`program_router_*`, `vllm_router_*`) named in `text`.
fn router_series(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for prefix in ["program_router_", "vllm_router_"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let before = rest[..i].chars().next_back();
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.insert(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
    }
    out
}

/// Series names in a scrape (histogram and summary parts folded into their family).
fn exported(scrape: &str) -> std::collections::BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .flat_map(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            [name.to_string(), family.to_string()]
        })
        .collect()
}

#[tokio::test]
async fn every_router_series_the_chart_queries_is_exported() {
    let s = sim(&["--instant"]).await;
    let mut cfg = workers(&[s.base()], 1);
    cfg.program_scheduling = Some(Default::default());
    cfg.fairness = Some(Default::default());
    cfg.limits.max_concurrent_requests = Some(8);
    let r = router(cfg).await;
    let c = client();
    // A request through the fair queue, a Program's turn, and an error.
    assert_eq!(post(&c, &r.url(CHAT), &chat("hello", 2)).await.status, 200);
    let mut turn: serde_json::Value = serde_json::from_str(&chat("turn", 2)).expect("json");
    turn["vllm_xargs"] = json!({"agentic_context": {"program_id": "p1"}});
    assert_eq!(post(&c, &r.url(CHAT), &turn.to_string()).await.status, 200);
    assert_eq!(post(&c, &r.url(CHAT), "{not json").await.status, 400);
    let scrape = get(&c, &format!("http://{}/metrics", r.metrics_addr))
        .await
        .text();
    let have = exported(&scrape);
    let chart =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/program-scheduling");
    let mut queried = 0;
    for dir in ["examples", "templates", "files", "dashboards"] {
        for entry in std::fs::read_dir(chart.join(dir)).expect("chart directory") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("text file");
            for series in router_series(&text) {
                queried += 1;
                assert!(
                    have.contains(&series),
                    "{} queries {series}, which a running router does not export",
                    path.display()
                );
            }
        }
    }
    assert!(queried > 0, "the KEDA example queries the router's backlog");
}

#[test]
fn series_names_are_read_whole_and_only_at_a_word_start() {
    let got = router_series(
        "sum(program_router_backlog_requests{model=\"\"}) + rate(vllm_router_requests_total[5m]) \
         my_program_router_x",
    );
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        [
            "program_router_backlog_requests",
            "vllm_router_requests_total"
        ]
    );
}
