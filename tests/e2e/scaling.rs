//! Router pods as production pods and as a scale target: the pod knobs of `spec.router` reach the
//! real Deployment, a new `logLevel` reaches running routers without a restart, `kubectl scale`
//! resizes the routers through the scale subresource, and the autoscaling example passes the API
//! server.

use super::*;

#[test]
fn routers_carry_the_pod_knobs_and_scale_through_the_scale_subresource() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let client = cp.client().await;
        let ns = "scaling";
        cp.namespace(&client, ns).await;
        let scratch = Scratch::new("scaling");
        let kubelet = Kubelet::new(client.clone(), ns, scratch.0.clone());
        let routers_task = kubelet.run_routers();
        let worker_port = free_port();
        kubelet
            .add_worker("vllm-0", worker_labels(), worker_port, 1, 0)
            .await;
        let op = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
        cp.kubectl_stdin(
            &["apply", "-f", "-"],
            Some("apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: routers-high}\nvalue: 100000\n"),
        )
        .expect_ok("a PriorityClass");
        let (manifest, _) = harness::fleet_manifest(ns, worker_port, 1, "");
        let knobs = "router: {logLevel: debug, priorityClassName: routers-high, \
                     imagePullSecrets: [{name: registry}], nodeSelector: {pool: routers}, \
                     tolerations: [{key: dedicated, operator: Equal, value: routers, effect: NoSchedule}], \
                     topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway}], \
                     podAnnotations: {example.com/team: ml}, podLabels: {team: ml}, \
                     serviceAnnotations: {example.com/lb: internal}, ";
        let manifest = manifest.replace("router: {", knobs);
        cp.kubectl_stdin(&["apply", "--validate=strict", "-f", "-"], Some(&manifest))
            .expect_ok("apply a ProgramScheduling with pod knobs");
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), ns);
        let ready = |n: i32| {
            let api = api.clone();
            move || {
                let api = api.clone();
                async move {
                    let ps = api.get("fleet").await.ok()?;
                    let s = ps.status.as_ref()?;
                    let ok = condition(&ps, "Ready")?.0 == "True"
                        && s.ready_routers == Some(n)
                        && s.replicas == Some(n);
                    ok.then_some(ps)
                }
            }
        };
        let ps = wait_for(Duration::from_secs(60), ready(1)).await;
        assert!(
            ps.is_some(),
            "not Ready with one router:\n{}",
            op.log_tail()
        );

        // The live pod template carries every knob, and the operator's labels still select it.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let d = deployments.get("fleet-router").await.expect("deployment");
        let template = d.spec.template;
        let pod = template.spec.expect("pod spec");
        assert_eq!(pod.priority_class_name.as_deref(), Some("routers-high"));
        assert_eq!(
            pod.image_pull_secrets.expect("pull secrets")[0].name,
            "registry"
        );
        assert_eq!(pod.node_selector.expect("node selector")["pool"], "routers");
        assert_eq!(pod.tolerations.expect("tolerations").len(), 1);
        let spread = pod.topology_spread_constraints.expect("spread");
        let selector = spread[0]
            .label_selector
            .clone()
            .and_then(|s| s.match_labels);
        assert_eq!(
            selector.expect("filled in")["app.kubernetes.io/instance"],
            "fleet"
        );
        let meta = template.metadata.expect("metadata");
        assert_eq!(meta.labels.expect("labels")["team"], "ml");
        assert_eq!(
            meta.annotations.expect("annotations")["example.com/team"],
            "ml"
        );
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let svc = services.get("fleet-router").await.expect("service");
        assert_eq!(
            svc.metadata.annotations.expect("annotations")["example.com/lb"],
            "internal"
        );
        let routers = kubelet.routers().await;
        let level = |name: String| {
            let kubelet = kubelet.clone();
            async move {
                let st = kubelet.router_state(&name).await?;
                Some(st.applied.load().config.log_level.clone())
            }
        };
        assert_eq!(level(routers[0].0.clone()).await.as_deref(), Some("debug"));

        // A new log level reaches the running router without replacing its pod.
        let patch = json!({"spec": {"router": {"logLevel": "warn"}}});
        api.patch("fleet", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch logLevel");
        let applied = wait_for(Duration::from_secs(30), || {
            let name = routers[0].0.clone();
            async move { (level(name).await.as_deref() == Some("warn")).then_some(()) }
        })
        .await;
        assert!(applied.is_some(), "the router runs at warn");
        assert_eq!(
            kubelet.routers().await,
            routers,
            "no router pod was replaced"
        );

        // kubectl scale goes through the scale subresource to spec.router.replicas.
        cp.kubectl(&["scale", "psched", "fleet", "-n", ns, "--replicas=2"])
            .expect_ok("kubectl scale");
        let ps = wait_for(Duration::from_secs(60), ready(2)).await;
        assert!(
            ps.is_some(),
            "not Ready with two routers:\n{}",
            op.log_tail()
        );
        let scale = cp
            .kubectl(&[
                "get",
                "--raw",
                &format!(
                    "/apis/scheduling.program-router.dev/v1alpha1/namespaces/{ns}/programschedulings/fleet/scale"
                ),
            ])
            .expect_ok("the scale subresource");
        let scale: serde_json::Value = serde_json::from_str(&scale).expect("json");
        assert_eq!(scale["spec"]["replicas"], 2, "{scale}");
        assert_eq!(scale["status"]["replicas"], 2, "{scale}");
        let selector = scale["status"]["selector"].as_str().unwrap_or_default();
        assert!(
            selector.contains("app.kubernetes.io/instance=fleet")
                && selector.contains("app.kubernetes.io/component=router"),
            "{scale}"
        );
        assert_eq!(kubelet.routers().await.len(), 2);

        // The autoscaling example, aimed at this resource, passes the API server.
        let hpa =
            std::fs::read_to_string(harness::chart_dir().join("examples/autoscaling-routers.yaml"))
                .expect("example")
                .replace("name: agents\n", "name: fleet\n");
        cp.kubectl_stdin(
            &[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-n",
                ns,
                "-f",
                "-",
            ],
            Some(&hpa),
        )
        .expect_ok("the HPA example");

        routers_task.abort();
        kubelet.shutdown().await;
        op.stop();
    });
}
