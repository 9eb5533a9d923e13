//! The chart's monitoring objects against prometheus-operator's own CRDs: the ServiceMonitor,
//! the routers' PodMonitor, the PrometheusRule and the Grafana dashboard install; the PodMonitor
//! selects the router pods; every alert and panel query parses as PromQL and names only series
//! that the running binaries export (router pods, the operator and a vLLM simulator, scraped
//! live after traffic); every alert's runbook is a section of docs/operations.md.

use super::*;
use std::collections::BTreeSet;

/// The metric names a PromQL expression selects.
fn selected(expr: &promql_parser::parser::Expr, out: &mut BTreeSet<String>) {
    use promql_parser::parser::Expr;
    match expr {
        Expr::Aggregate(a) => {
            selected(&a.expr, out);
            if let Some(p) = &a.param {
                selected(p, out);
            }
        }
        Expr::Unary(u) => selected(&u.expr, out),
        Expr::Binary(b) => {
            selected(&b.lhs, out);
            selected(&b.rhs, out);
        }
        Expr::Paren(p) => selected(&p.expr, out),
        Expr::Subquery(s) => selected(&s.expr, out),
        Expr::VectorSelector(v) => out.extend(v.name.clone()),
        Expr::MatrixSelector(m) => out.extend(m.vs.name.clone()),
        Expr::Call(c) => c.args.args.iter().for_each(|a| selected(a, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// Series names in a Prometheus text scrape (histogram and summary parts as their family too).
fn exported(scrape: &str, out: &mut BTreeSet<String>) {
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty()) else {
            continue;
        };
        out.insert(name.to_string());
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(family) = name.strip_suffix(suffix) {
                out.insert(family.to_string());
            }
        }
    }
}

/// The anchor GitHub gives a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn monitoring_objects_pass_the_real_crds_and_query_only_exported_series() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crd_files(
            &harness::monitoring_crds(),
            "monitoring.coreos.com",
            &["podmonitors", "servicemonitors", "prometheusrules"],
        );
        let team = "team-a";
        for ns in [NS, team] {
            cp.kubectl(&["create", "namespace", ns])
                .expect_ok("namespace");
        }
        let chart = chart();
        cp.helm(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            NS,
            "--set",
            "image.tag=e2e",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.routerPodMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.dashboard.enabled=true",
        ])
        .expect_ok("helm install with the monitoring objects");
        let get_json = |kind: &str, name: &str| -> serde_json::Value {
            let out = cp
                .kubectl(&["get", kind, name, "-n", NS, "-o", "json"])
                .expect_ok(kind);
            serde_json::from_str(&out).expect("json")
        };
        get_json("servicemonitor", FULLNAME);
        let pod_monitor = get_json("podmonitor", &format!("{FULLNAME}-routers"));
        let rule = get_json("prometheusrule", FULLNAME);
        let dashboard = get_json("configmap", &format!("{FULLNAME}-dashboard"));
        assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");

        // The binaries the queries are about, running: an operator, two router pods with
        // Program scheduling and fairness, and a vLLM simulator.
        let scratch = Scratch::new("monitoring");
        let op = Operator::start(&cp, &scratch.0, &["--namespace", team]);
        let client = cp.client().await;
        let kubelet = Kubelet::new(client.clone(), team, scratch.0.clone());
        let routers_task = kubelet.run_routers();
        let worker_port = free_port();
        let worker = kubelet
            .add_worker(
                "vllm-0",
                BTreeMap::from([("app".to_string(), "vllm".to_string())]),
                worker_port,
                2,
                0,
            )
            .await;
        let (manifest, router_port) = harness::fleet_manifest(
            team,
            worker_port,
            2,
            "  programScheduling: {}\n  fairness: {}\n",
        );
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest))
            .expect_ok("apply the fleet");
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), team);
        let ready = wait_for(Duration::from_secs(90), || async {
            let ps = api.get("fleet").await.ok()?;
            let s = ps.status.as_ref()?;
            let ready = s
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ready && s.ready_routers == Some(2)).then_some(ps)
        })
        .await;
        let Some(ps) = ready else {
            panic!("fleet not Ready:\n{}", op.log_tail());
        };
        let metrics_port = ps.spec.router.metrics_port;

        // Traffic that makes each family appear: Programs over both replicas (forwards,
        // RequestPool, transitions), tenants through the fair queue, an error.
        let routers = kubelet.routers().await;
        let c = testkit::client();
        for turn in 0..2 {
            for i in 0..6 {
                let ip = &routers[(i + turn) % 2].1;
                let body = serde_json::json!({"model": "sim-model", "max_tokens": 2,
                        "messages": [{"role": "user", "content": format!("turn {turn}")}],
                        "vllm_xargs": {"agentic_context": {"program_id": format!("agent-{i}")}}})
                .to_string();
                let url = format!("http://{ip}:{router_port}/v1/chat/completions");
                let r = testkit::send(&c, "POST", &url, &body, &[("x-tenant-id", "t1")]).await;
                assert_eq!(r.status, 200, "{}", r.text());
            }
        }
        let plain = serde_json::json!({"model": "sim-model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "hello"}]})
        .to_string();
        let url = format!("http://{}:{router_port}/v1/chat/completions", routers[0].1);
        let r = testkit::send(&c, "POST", &url, &plain, &[("x-tenant-id", "t2")]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let r = testkit::send(&c, "POST", &url, "{not json", &[]).await;
        assert_eq!(r.status, 400, "{}", r.text());

        let mut have = BTreeSet::from(["up".to_string()]);
        for (_, ip) in &routers {
            let text = testkit::get(&c, &format!("http://{ip}:{metrics_port}/metrics"))
                .await
                .text();
            exported(&text, &mut have);
        }
        exported(&testkit::get(&c, &op.metrics_url).await.text(), &mut have);
        exported(
            &testkit::get(&c, &format!("http://{worker}:{worker_port}/metrics"))
                .await
                .text(),
            &mut have,
        );

        // Every query of the alerts and the dashboard.
        let mut queries: Vec<(String, String)> = Vec::new();
        let ops = std::fs::read_to_string(chart_dir().join("../../docs/operations.md"))
            .expect("docs/operations.md");
        let anchors: BTreeSet<String> = ops
            .lines()
            .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
            .map(anchor)
            .collect();
        let mut alerts = 0;
        for group in rule["spec"]["groups"].as_array().expect("groups") {
            for r in group["rules"].as_array().expect("rules") {
                let name = r["alert"].as_str().expect("alert name").to_string();
                let runbook = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
                let (page, section) = runbook.split_once('#').unwrap_or_default();
                assert!(
                    page.ends_with("docs/operations.md") && anchors.contains(section),
                    "{name}: runbook {runbook:?} is not a section of docs/operations.md"
                );
                queries.push((name, r["expr"].as_str().expect("expr").to_string()));
                alerts += 1;
            }
        }
        assert!(alerts >= 7, "{alerts} alerts");
        let board: serde_json::Value = serde_json::from_str(
            dashboard["data"]["program-scheduling.json"]
                .as_str()
                .expect("dashboard json"),
        )
        .expect("the dashboard is JSON");
        for panel in board["panels"].as_array().expect("panels") {
            for t in panel["targets"].as_array().into_iter().flatten() {
                let title = panel["title"].as_str().unwrap_or_default().to_string();
                queries.push((title, t["expr"].as_str().expect("expr").to_string()));
            }
        }
        for v in board["templating"]["list"].as_array().expect("variables") {
            if let Some(q) = v["query"]["query"].as_str()
                && let Some(inner) = q.strip_prefix("label_values(")
            {
                let series = inner.split([',', '{']).next().unwrap_or_default().trim();
                queries.push((format!("variable {}", v["name"]), series.to_string()));
            }
        }
        let mut names = 0;
        for (what, expr) in &queries {
            // Grafana's variables, as Grafana substitutes them.
            let promql = expr
                .replace("$__rate_interval", "1m")
                .replace("$namespace", ".*")
                .replace("$pod", ".*");
            let parsed = promql_parser::parser::parse(&promql)
                .unwrap_or_else(|e| panic!("{what}: {expr:?} is not PromQL: {e}"));
            let mut used = BTreeSet::new();
            selected(&parsed, &mut used);
            assert!(!used.is_empty(), "{what}: {expr:?} selects no series");
            for name in used {
                names += 1;
                assert!(
                    have.contains(&name),
                    "{what} queries {name}, which no running binary exports"
                );
            }
        }
        assert!(names > 40, "{names} series checked");

        // The PodMonitor selects exactly the router pods, on a port they have.
        let labels: Vec<String> = pod_monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        let pods = cp
            .kubectl(&[
                "get",
                "pods",
                "-n",
                team,
                "-l",
                &labels.join(","),
                "-o",
                "json",
            ])
            .expect_ok("pods the PodMonitor selects");
        let pods: serde_json::Value = serde_json::from_str(&pods).expect("json");
        let pods = pods["items"].as_array().expect("items");
        assert_eq!(pods.len(), 2, "the two router pods, not the worker");
        let port = pod_monitor["spec"]["podMetricsEndpoints"][0]["port"].clone();
        for p in pods {
            let ports = &p["spec"]["containers"][0]["ports"];
            assert!(
                ports
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|q| q["name"] == port),
                "{port} on {ports}"
            );
        }

        routers_task.abort();
        kubelet.shutdown().await;
        op.stop();
    });
}
