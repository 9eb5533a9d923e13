//! The Helm chart against the real control plane with real helm and kubectl: lint, server-side
//! dry-run of the rendered manifests in both RBAC modes, install, least privilege proven with
//! `kubectl auth can-i --as=system:serviceaccount:...`, the operator running with ONLY its
//! ServiceAccount's token until the minimal example is Ready, a no-op upgrade, and an uninstall
//! that keeps the CRD.

mod harness;
mod monitoring;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::kubelet::Kubelet;
use harness::{ControlPlane, Operator, Scratch, chart_dir, crds_dir, free_port, run, wait_for};
use kube::api::Api;
use program_operator::crd::ProgramScheduling;

const NS: &str = "ps-system";
const RELEASE: &str = "ps";
const FULLNAME: &str = "ps-program-scheduling";

fn chart() -> String {
    chart_dir().to_str().expect("path").to_string()
}

#[test]
fn chart_crds_are_the_generated_crds() {
    for entry in std::fs::read_dir(crds_dir()).expect("crds/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name");
        let copy = chart_dir().join("crds").join(name);
        assert_eq!(
            std::fs::read_to_string(&path).expect("crd"),
            std::fs::read_to_string(&copy).unwrap_or_default(),
            "{} differs from {}: copy crds/ into the chart",
            copy.display(),
            path.display()
        );
    }
}

fn can_i(cp: &ControlPlane, who: &str, args: &[&str]) -> bool {
    let mut a = vec!["auth", "can-i"];
    a.extend_from_slice(args);
    let as_ = format!("--as=system:serviceaccount:{who}");
    a.push(&as_);
    let out = cp.kubectl(&a);
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("can-i {args:?}: {other:?} {}", out.stderr),
    }
}

/// resourceVersions of what the chart installs.
fn chart_versions(cp: &ControlPlane) -> String {
    cp.kubectl(&[
        "get",
        "deployment,serviceaccount,service,poddisruptionbudget,role,rolebinding",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/instance=ps",
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}",
    ])
    .expect_ok("get chart objects")
        + &cp
            .kubectl(&[
                "get",
                "clusterrole,clusterrolebinding",
                "-l",
                "app.kubernetes.io/instance=ps",
                "-o",
                "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}",
            ])
            .expect_ok("get cluster objects")
}

#[test]
fn chart_installs_with_least_privilege_runs_the_example_and_upgrades_cleanly() {
    run(async {
        let cp = ControlPlane::start();
        let chart = chart();
        cp.helm(&["lint", &chart]).expect_ok("helm lint");
        cp.helm(&[
            "lint",
            &chart,
            "--set",
            "rbac.scope=namespaces",
            "--set",
            "rbac.namespaces={team-a}",
        ])
        .expect_ok("helm lint (namespaces)");
        let bad = cp.helm(&["lint", &chart, "--set", "rbac.scope=everything"]);
        assert!(!bad.ok, "values.schema.json rejects an unknown scope");
        let bad = cp.helm(&[
            "template",
            RELEASE,
            &chart,
            "--kube-version",
            "1.37.2",
            "--set",
            "rbac.scope=namespaces",
        ]);
        assert!(
            !bad.ok && bad.stderr.contains("rbac.namespaces"),
            "namespaces mode without namespaces fails with the value's name: {}",
            bad.stderr
        );

        // The ServiceMonitor appears only when asked for AND the cluster serves its API.
        let sm = |extra: &[&str]| {
            let mut a = vec![
                "template",
                RELEASE,
                chart.as_str(),
                "--kube-version",
                "1.37.2",
                "--set",
                "metrics.serviceMonitor.enabled=true",
            ];
            a.extend_from_slice(extra);
            cp.helm(&a)
                .expect_ok("template")
                .contains("kind: ServiceMonitor")
        };
        assert!(!sm(&[]), "no ServiceMonitor without its CRD");
        assert!(sm(&[
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor"
        ]));

        for ns in [NS, "team-a", "team-b"] {
            cp.kubectl(&["create", "namespace", ns])
                .expect_ok("namespace");
        }

        // Rendered manifests pass the real API server's validation in both modes.
        for extra in [
            vec![],
            vec![
                "--set",
                "rbac.scope=namespaces",
                "--set",
                "rbac.namespaces={team-a,team-b}",
            ],
            vec![
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "argocd.healthCheckConfigMap=true",
                "--set",
                "metrics.serviceMonitor.enabled=true",
            ],
        ] {
            let mut args = vec![
                "template",
                RELEASE,
                chart.as_str(),
                "-n",
                NS,
                "--kube-version",
                "1.37.2",
            ];
            args.extend(extra.iter().copied());
            let manifests = cp.helm(&args).expect_ok("helm template");
            cp.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], Some(&manifests))
                .expect_ok("server-side dry run");
        }

        // Install (CRDs come from the chart's crds/).
        cp.helm(&[
            "install",
            RELEASE,
            &chart,
            "-n",
            NS,
            "--set",
            "image.tag=e2e",
        ])
        .expect_ok("helm install");
        cp.kubectl(&[
            "get",
            "crd",
            "programschedulings.scheduling.program-router.dev",
        ])
        .expect_ok("CRD installed by the chart");
        for obj in [
            format!("deployment/{FULLNAME}"),
            format!("serviceaccount/{FULLNAME}"),
            format!("service/{FULLNAME}-metrics"),
            format!("poddisruptionbudget/{FULLNAME}"),
            format!("role/{FULLNAME}-leader-election"),
        ] {
            cp.kubectl(&["get", &obj, "-n", NS]).expect_ok(&obj);
        }
        cp.kubectl(&["get", &format!("clusterrole/{FULLNAME}")])
            .expect_ok("clusterrole");
        let deploy = cp
            .kubectl(&["get", "deployment", FULLNAME, "-n", NS, "-o", "json"])
            .expect_ok("deployment");
        let deploy: serde_json::Value = serde_json::from_str(&deploy).expect("json");
        let pod = &deploy["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(deploy["spec"]["replicas"], 2);
        // Routers default to the program-router image of the chart's appVersion.
        let app_version = env!("CARGO_PKG_VERSION");
        let args = c["args"].to_string();
        assert!(
            args.contains(&format!(
                "--router-image=ghcr.io/program-scheduling/program-router:{app_version}"
            )),
            "{args}"
        );
        // No image reference anywhere in the chart, the CRD or the examples ends in :latest.
        let everything = [
            cp.helm(&["template", RELEASE, &chart, "--kube-version", "1.37.2"])
                .expect_ok("template"),
            std::fs::read_to_string(crds_dir().join("programscheduling.yaml")).expect("crd"),
        ]
        .into_iter()
        .chain(
            std::fs::read_dir(chart_dir().join("examples"))
                .expect("examples")
                .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("example")),
        )
        .collect::<String>();
        assert!(
            !everything.contains(":latest"),
            "an image pinned to :latest"
        );

        // Least privilege, as the API server's authorizer sees it.
        let op = format!("{NS}:{FULLNAME}");
        for (args, want) in [
            (vec!["list", "pods", "-A"], true),
            (
                vec![
                    "watch",
                    "programschedulings.scheduling.program-router.dev",
                    "-A",
                ],
                true,
            ),
            (
                vec![
                    "patch",
                    "programschedulings.scheduling.program-router.dev/status",
                    "-n",
                    "team-a",
                    "--subresource=status",
                ],
                true,
            ),
            (vec!["create", "deployments.apps", "-n", "team-a"], true),
            (vec!["patch", "configmaps", "-n", "team-a"], true),
            (vec!["create", "events.events.k8s.io", "-n", "team-a"], true),
            (vec!["patch", "leases.coordination.k8s.io", "-n", NS], true),
            (
                vec![
                    "patch",
                    "programschedulings.scheduling.program-router.dev",
                    "-n",
                    "team-a",
                ],
                false,
            ),
            (vec!["delete", "pods", "-n", "team-a"], false),
            (vec!["delete", "deployments.apps", "-n", "team-a"], false),
            (vec!["get", "secrets", "-n", "team-a"], false),
            (
                vec!["create", "clusterroles.rbac.authorization.k8s.io"],
                false,
            ),
            (
                vec!["create", "leases.coordination.k8s.io", "-n", "team-a"],
                false,
            ),
            (vec!["create", "pods", "-n", "team-a"], false),
        ] {
            assert_eq!(can_i(&cp, &op, &args), want, "operator can-i {args:?}");
        }

        // Play the kubelet for one operator pod: run the binary with the pod's arguments and
        // ONLY its ServiceAccount token.
        let scratch = Scratch::new("chart");
        let token = cp
            .kubectl(&["create", "token", FULLNAME, "-n", NS, "--duration=1h"])
            .expect_ok("token");
        let admin: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig"))
                .expect("yaml");
        let sa_kubeconfig = scratch.0.join("operator.kubeconfig");
        let kc = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "cp", "cluster": {
                "server": cp.server,
                "certificate-authority-data": admin["clusters"][0]["cluster"]["certificate-authority-data"].as_str().expect("ca"),
            }}],
            "users": [{"name": "operator", "user": {"token": token.trim()}}],
            "contexts": [{"name": "operator", "context": {"cluster": "cp", "user": "operator"}}],
            "current-context": "operator",
        });
        std::fs::write(&sa_kubeconfig, serde_yaml::to_string(&kc).expect("yaml")).expect("write");
        let args: Vec<String> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .filter(|a| !a.starts_with("--listen"))
            .collect();
        assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let operator = Operator::start_as(
            &sa_kubeconfig,
            &[("POD_NAMESPACE", NS), ("POD_NAME", "ps-operator-0")],
            &scratch.0,
            &args,
        );

        // The minimal example in team-a, with this machine's free ports.
        let client = cp.client().await;
        let worker_port = free_port();
        let kubelet = Kubelet::new(client.clone(), "team-a", scratch.0.clone());
        let routers = kubelet.run_routers();
        kubelet
            .add_worker(
                "vllm-0",
                BTreeMap::from([("app".to_string(), "vllm".to_string())]),
                worker_port,
                2,
                0,
            )
            .await;
        let example = std::fs::read_to_string(chart_dir().join("examples/minimal.yaml"))
            .expect("example")
            .replace("workerPort: 8000", &format!("workerPort: {worker_port}"))
            .replace(
                "  programScheduling: {}\n",
                &format!(
                    "  programScheduling: {{}}\n  router:\n    replicas: 1\n    port: {}\n    \
                         metricsPort: {}\n",
                    free_port(),
                    free_port()
                ),
            );
        assert!(example.contains("replicas: 1"), "{example}");
        cp.kubectl_stdin(&["apply", "-n", "team-a", "-f", "-"], Some(&example))
            .expect_ok("apply the minimal example");
        // Every other example passes the real API server's schema, CEL rules and strict
        // field validation (a server-side dry run: they name workers this test does not run);
        // the HTTPRoute against Gateway API's own CRDs.
        cp.install_crd_files(
            &harness::gateway_crds(),
            "gateway.networking.k8s.io",
            &["gateways", "httproutes"],
        );
        for example in [
            "production.yaml",
            "agents.yaml",
            "fairness.yaml",
            "httproute.yaml",
        ] {
            let path = chart_dir().join("examples").join(example);
            cp.kubectl(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-n",
                "team-a",
                "-f",
                path.to_str().expect("utf-8 path"),
            ])
            .expect_ok(example);
        }
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), "team-a");
        let ready = wait_for(Duration::from_secs(90), || async {
            let ps = api.get("agents").await.ok()?;
            ps.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "example not Ready: {:?}\noperator:\n{}",
            api.get("agents").await.ok().and_then(|p| p.status),
            operator.log_tail()
        );
        let holder = cp
            .kubectl(&[
                "get",
                "lease",
                "program-operator",
                "-n",
                NS,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .expect_ok("lease");
        assert_eq!(holder, "ps-operator-0");
        let described = cp
            .kubectl(&["describe", "psched", "agents", "-n", "team-a"])
            .expect_ok("describe");
        assert!(
            described.contains("Events:") && described.contains("Discovered"),
            "{described}"
        );
        // The router pods' ServiceAccount has no API permissions.
        let router_sa = "team-a:agents-router";
        for args in [
            vec!["list", "pods", "-n", "team-a"],
            vec!["get", "configmaps", "-n", "team-a"],
            vec!["get", "secrets", "-n", "team-a"],
        ] {
            assert!(!can_i(&cp, router_sa, &args), "router can-i {args:?}");
        }
        routers.abort();
        kubelet.shutdown().await;
        operator.stop();

        // Upgrade with the same values: nothing changes.
        let before = chart_versions(&cp);
        cp.helm(&[
            "upgrade",
            RELEASE,
            &chart,
            "-n",
            NS,
            "--set",
            "image.tag=e2e",
        ])
        .expect_ok("helm upgrade");
        assert_eq!(
            chart_versions(&cp),
            before,
            "a same-values upgrade changed objects"
        );

        // Namespaces mode: permissions only where asked.
        cp.helm(&[
            "install",
            "ps2",
            &chart,
            "-n",
            "team-b",
            "--set",
            "rbac.scope=namespaces",
            "--set",
            "rbac.namespaces={team-b}",
            "--set",
            "leaderElection.enabled=false",
        ])
        .expect_ok("helm install (namespaces)");
        let op2 = "team-b:ps2-program-scheduling";
        assert!(can_i(&cp, op2, &["list", "pods", "-n", "team-b"]));
        assert!(!can_i(&cp, op2, &["list", "pods", "-n", "team-a"]));
        assert!(!can_i(&cp, op2, &["list", "pods", "-A"]));
        assert!(!can_i(
            &cp,
            op2,
            &["patch", "leases.coordination.k8s.io", "-n", "team-b"]
        ));
        let args = cp
            .kubectl(&[
                "get",
                "deployment",
                "ps2-program-scheduling",
                "-n",
                "team-b",
                "-o",
                "jsonpath={.spec.template.spec.containers[0].args}",
            ])
            .expect_ok("args");
        assert!(args.contains("--namespace=team-b"), "{args}");

        // Uninstall keeps the CRD (and so every ProgramScheduling).
        cp.helm(&["uninstall", RELEASE, "-n", NS])
            .expect_ok("uninstall");
        cp.helm(&["uninstall", "ps2", "-n", "team-b"])
            .expect_ok("uninstall");
        cp.kubectl(&[
            "get",
            "crd",
            "programschedulings.scheduling.program-router.dev",
        ])
        .expect_ok("CRD kept");
        assert!(!cp.kubectl(&["get", "deployment", FULLNAME, "-n", NS]).ok);
        cp.kubectl(&["get", "psched", "agents", "-n", "team-a"])
            .expect_ok("resources kept");
    });
}
