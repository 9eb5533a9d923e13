//! The operator's trust boundaries against a real control plane: the peer Secret and the
//! NetworkPolicy it owns (server-side applied and stored by the API server), router pods known
//! by ownership rather than labels, and owned objects changed by hand put back within a resync.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::kubelet::Kubelet;
use harness::{ControlPlane, Operator, Scratch, free_port, run, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use program_operator::crd::ProgramScheduling;

/// A TCP relay on a loopback port to `target` (`host:port`); sending `true` on the returned
/// channel stops it accepting and cuts every connection through it (a network partition).
async fn relay(target: String) -> (u16, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    let mut stop = cut_rx.clone();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = tokio::select! {
                a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
                _ = stop.changed() => return,
            };
            let target = target.clone();
            let mut cut = cut_rx.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut.changed() => {}
                }
            });
        }
    });
    (port, cut)
}

/// The members of the rendered router config, by name.
async fn members(cms: &Api<ConfigMap>) -> Option<Vec<String>> {
    let cm = cms.get("fleet-router").await.ok()?;
    let cfg: program_router::config::RouterConfig =
        serde_json::from_str(cm.data?.get("config.json")?).ok()?;
    Some(cfg.peers?.members.into_iter().map(|m| m.name).collect())
}

#[test]
fn the_operator_owns_the_peer_secret_and_network_policy_trusts_no_label_and_undoes_hand_edits() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let client = cp.client().await;
        let ns = "trust";
        cp.namespace(&client, ns).await;
        let scratch = Scratch::new("trust");
        let kubelet = Kubelet::new(client.clone(), ns, scratch.0.clone());
        let _routers = kubelet.run_routers();
        let worker_port = free_port();
        let labels = BTreeMap::from([("app".to_string(), "vllm".to_string())]);
        kubelet
            .add_worker("vllm-0", labels, worker_port, 2, 0)
            .await;
        let op = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
        // Keys whose text must appear nowhere but in their Secrets.
        let (worker_key, client_key) = ("wk-7f3a9c1e5b2d4f60", "ck-2b8e6d4a0c9f1e37");
        let secrets = format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: vllm-key, namespace: {ns}}}\n\
             stringData: {{token: {worker_key}}}\n---\napiVersion: v1\nkind: Secret\n\
             metadata: {{name: client-keys, namespace: {ns}}}\nstringData: {{keys: {client_key}}}\n"
        );
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(&secrets))
            .expect_ok("apply Secrets");
        let (manifest, router_port) = harness::fleet_manifest(
            ns,
            worker_port,
            2,
            "  programScheduling: {}\n  apiKeySecretRef: {name: vllm-key, key: token}\n  \
             clientApiKeysSecretRef: {name: client-keys, key: keys}\n",
        );
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest))
            .expect_ok("apply ProgramScheduling");
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), ns);
        let ps = wait_for(Duration::from_secs(90), || async {
            let ps = api.get("fleet").await.ok()?;
            (ps.status.as_ref()?.ready_routers == Some(2)).then_some(ps)
        })
        .await
        .unwrap_or_else(|| panic!("two routers not ready:\n{}", op.log_tail()));
        let uid = ps.metadata.uid.clone().expect("uid");
        let controlled =
            |refs: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
                refs.into_iter()
                    .flatten()
                    .any(|r| r.uid == uid && r.controller == Some(true))
            };

        // The peer secret: created once, owned by the resource, 64 hex digits.
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let secret = secrets.get("fleet-router-peer").await.expect("peer Secret");
        assert!(controlled(secret.metadata.owner_references.clone()));
        let value = secret.data.expect("data")["secret"].0.clone();
        assert_eq!(value.len(), 64);

        // The NetworkPolicy, as the API server stored it: the peer port from router pods only.
        let nps: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
        let np = nps.get("fleet-router").await.expect("NetworkPolicy");
        assert!(controlled(np.metadata.owner_references.clone()));
        let rules = np.spec.expect("spec").ingress.expect("ingress");
        let peer_rule = rules
            .iter()
            .find(|r| {
                r.ports
                    .iter()
                    .flatten()
                    .any(|p| serde_json::to_value(&p.port).ok() == Some(serde_json::json!(8081)))
            })
            .expect("a rule for the peer port");
        let from = peer_rule.from.as_ref().expect("sources");
        assert_eq!(from.len(), 1);
        let sel = from[0].pod_selector.as_ref().expect("router pods");
        assert_eq!(
            sel.match_labels.as_ref().expect("labels")["app.kubernetes.io/instance"],
            "fleet"
        );

        // No key, and nothing of the peer secret, in what anyone can read: the operator's log,
        // the ConfigMaps, the Events, each router's /status and /metrics.
        let c = testkit::client();
        let metrics_port = ps.spec.router.metrics_port;
        let mut seen = std::fs::read_to_string(&op.log).unwrap_or_default();
        for what in ["configmaps", "events"] {
            seen += &cp
                .kubectl(&["-n", ns, "get", what, "-o", "yaml"])
                .expect_ok(what);
        }
        for (_, ip) in kubelet.routers().await {
            seen += &testkit::get(&c, &format!("http://{ip}:{router_port}/status"))
                .await
                .text();
            seen += &testkit::get(&c, &format!("http://{ip}:{metrics_port}/metrics"))
                .await
                .text();
        }
        let peer_secret = String::from_utf8_lossy(&value).into_owned();
        for key in [worker_key, client_key, peer_secret.as_str()] {
            assert!(!seen.contains(key), "a key leaked: {key}");
        }
        assert!(seen.len() > 10_000, "read what there was to read");

        // A pod labelled like a router, Ready with an IP, is not a router: the member list
        // stays the two pods the Deployment runs.
        let impostor = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: impostor\n  namespace: trust\n  \
            labels: {app.kubernetes.io/name: program-router, app.kubernetes.io/instance: fleet, \
            app.kubernetes.io/component: router}\nspec:\n  containers: [{name: c, image: x}]\n";
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(impostor))
            .expect_ok("impostor pod");
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let status = serde_json::json!({"status": {"podIP": "127.0.0.250",
            "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status("impostor", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("impostor Ready");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let before = members(&cms).await.expect("members");
        assert_eq!(before.len(), 2);
        // Several reconciles (pod events trigger them at once).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = members(&cms).await.expect("members");
        assert_eq!(after, before, "the impostor never becomes a peer");
        assert!(!after.iter().any(|m| m == "impostor"));
        let ps = api.get("fleet").await.expect("get");
        assert_eq!(ps.status.expect("status").ready_routers, Some(2));

        // `kubectl set image` on the router Deployment is put back.
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let image = |d: &Deployment| {
            d.spec
                .template
                .spec
                .as_ref()
                .and_then(|p| p.containers[0].image.clone())
        };
        let want = image(&deployments.get("fleet-router").await.expect("deployment"));
        cp.kubectl(&[
            "-n",
            ns,
            "set",
            "image",
            "deployment/fleet-router",
            "router=evil:1",
        ])
        .expect_ok("set image");
        let restored = wait_for(Duration::from_secs(60), || async {
            let d = deployments.get("fleet-router").await.ok()?;
            (image(&d) == want).then_some(())
        })
        .await;
        assert!(restored.is_some(), "image put back:\n{}", op.log_tail());

        // An edit of the ConfigMap is put back (the member list numbered anew: the routers may
        // have read the edited file, so the restored list must count as newer).
        let settings = |cm: &ConfigMap| -> Option<program_router::config::RouterConfig> {
            let mut cfg: program_router::config::RouterConfig =
                serde_json::from_str(cm.data.as_ref()?.get("config.json")?).ok()?;
            if let Some(p) = cfg.peers.as_mut() {
                p.revision = None;
            }
            Some(cfg)
        };
        let want = settings(&cms.get("fleet-router").await.expect("cm")).expect("config");
        let edit = serde_json::json!({"data": {"config.json": "{}"}});
        cms.patch(
            "fleet-router",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await
        .expect("edit");
        let restored = wait_for(Duration::from_secs(60), || async {
            let cm = cms.get("fleet-router").await.ok()?;
            (settings(&cm).as_ref() == Some(&want)).then_some(())
        })
        .await;
        assert!(restored.is_some(), "config put back:\n{}", op.log_tail());

        // Turned off, the NetworkPolicy goes.
        let off = serde_json::json!({"spec": {"router": {"networkPolicy": {"enabled": false}}}});
        api.patch("fleet", &PatchParams::default(), &Patch::Merge(&off))
            .await
            .expect("turn off");
        let gone = wait_for(Duration::from_secs(30), || async {
            nps.get_opt("fleet-router")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
        assert!(gone.is_some(), "NetworkPolicy deleted:\n{}", op.log_tail());
    });
}

#[test]
fn a_leader_cut_off_from_the_api_server_stops_before_the_standby_takes_over() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let scratch = Scratch::new("fence");
        // Operator A reaches the API server only through a relay that the test can cut.
        let target = cp
            .server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let (port, cut) = relay(target.clone()).await;
        let kubeconfig = std::fs::read_to_string(&cp.kubeconfig)
            .expect("kubeconfig")
            .replace(&target, &format!("127.0.0.1:{port}"));
        let relayed = scratch.0.join("relayed.kubeconfig");
        std::fs::write(&relayed, kubeconfig).expect("write");
        let args = [
            "--leader-elect",
            "--lease-namespace",
            "default",
            "--lease-duration-secs",
            "6",
        ];
        let mut a = Operator::start_as(
            &relayed,
            &[],
            &scratch.0,
            &[&args[..], &["--identity", "op-a"]].concat(),
        );
        let leads = wait_for(Duration::from_secs(30), || async {
            (a.counter("program_operator_leader").await == 1.0).then_some(())
        })
        .await;
        assert!(leads.is_some(), "A leads:\n{}", a.log_tail());
        let b = Operator::start(
            &cp,
            &scratch.0,
            &[&args[..], &["--identity", "op-b"]].concat(),
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            b.counter("program_operator_leader").await,
            0.0,
            "B stands by"
        );

        let t0 = std::time::Instant::now();
        let _ = cut.send(true);
        // A stops on its own (it exits so that its pod restarts as a standby) ...
        let a_stopped = wait_for(Duration::from_secs(30), || {
            let stopped = a.exited();
            async move { stopped.then(|| t0.elapsed()) }
        })
        .await
        .unwrap_or_else(|| panic!("A kept leading while cut off:\n{}", a.log_tail()));
        // ... and B takes over only after that.
        let b_leads = wait_for(Duration::from_secs(30), || async {
            (b.counter("program_operator_leader").await == 1.0).then(|| t0.elapsed())
        })
        .await
        .unwrap_or_else(|| panic!("B took over:\n{}", b.log_tail()));
        eprintln!(
            "cut-off leader stopped after {:.1} s, standby led after {:.1} s",
            a_stopped.as_secs_f64(),
            b_leads.as_secs_f64()
        );
        assert!(a_stopped < b_leads, "{a_stopped:?} vs {b_leads:?}");
        assert!(
            a.log_tail().contains("not renewed in time"),
            "{}",
            a.log_tail()
        );
    });
}
