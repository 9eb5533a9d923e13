//! program-operator against a real control plane: CRD install and CEL rejection through kubectl,
//! discovery of worker Pods into DP ranks, router rollout through the real Deployment →
//! ReplicaSet → Pod chain, API keys from Secrets enforced by the router pods, Ready status with
//! Events in `kubectl describe`, worker removal
//! reaching the routers, no writes after an operator restart, and garbage collection on delete.
//! Each test starts its own control plane; tests run one at a time.

mod crd_rules;
mod harness;
mod leader;
mod outage;
mod scaling;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::kubelet::Kubelet;
use harness::{ControlPlane, Operator, Scratch, free_port, run, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource};
use program_operator::crd::ProgramScheduling;
use serde_json::json;

fn condition(ps: &ProgramScheduling, t: &str) -> Option<(String, String)> {
    ps.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn worker_labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), "vllm".to_string())])
}

#[test]
fn operator_discovers_workers_rolls_out_routers_and_reports_status() {
    run(async {
        let cp = ControlPlane::start();
        cp.install_crds();
        let client = cp.client().await;
        let ns = "agents";
        cp.namespace(&client, ns).await;
        let scratch = Scratch::new("story");
        let kubelet = Kubelet::new(client.clone(), ns, scratch.0.clone());
        let routers_task = kubelet.run_routers();

        // Two worker pods × 2 DP ranks each (global ranks 0-1 and 2-3).
        let worker_port = free_port();
        let w0 = kubelet
            .add_worker("vllm-0", worker_labels(), worker_port, 2, 0)
            .await;
        let w1 = kubelet
            .add_worker("vllm-1", worker_labels(), worker_port, 2, 2)
            .await;

        let op = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
        // The workers' key and two client keys, from Secrets.
        let secrets = r#"
apiVersion: v1
kind: Secret
metadata: {name: vllm-key, namespace: agents}
stringData: {token: worker-secret}
---
apiVersion: v1
kind: Secret
metadata: {name: client-keys, namespace: agents}
stringData: {keys: "team-a\nteam-b\n"}
---
apiVersion: v1
kind: Secret
metadata: {name: team-keys, namespace: agents}
stringData: {search-team: sk-search-1}
"#;
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(secrets))
            .expect_ok("apply Secrets");
        let (manifest, router_port) = harness::fleet_manifest(
            ns,
            worker_port,
            2,
            "  programScheduling: {globalQueue: true}\n  \
             apiKeySecretRef: {name: vllm-key, key: token}\n  \
             clientApiKeysSecretRef: {name: client-keys, key: keys}\n  \
             clientApiKeysSecret: {name: team-keys}\n",
        );
        cp.kubectl_stdin(&["apply", "-f", "-"], Some(&manifest))
            .expect_ok("apply ProgramScheduling");

        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), ns);
        let ready = wait_for(Duration::from_secs(60), || async {
            let ps = api.get("fleet").await.ok()?;
            let both = ps.status.as_ref()?.ready_routers == Some(2);
            (condition(&ps, "Ready")?.0 == "True" && both).then_some(ps)
        })
        .await;
        let Some(ps) = ready else {
            let ps = api.get("fleet").await.expect("get");
            panic!(
                "not Ready within 60 s: {:#?}\noperator log:\n{}",
                ps.status,
                op.log_tail()
            );
        };
        let status = ps.status.clone().expect("status");
        assert_eq!(status.ranks, Some(4));
        assert_eq!(status.ready_routers, Some(2));
        assert_eq!(status.observed_generation, ps.metadata.generation);
        assert_eq!(
            condition(&ps, "Calibrated"),
            Some(("False".into(), "ReferenceCoefficients".into()))
        );
        // Two router replicas with Program scheduling: they forward Programs to each other.
        assert_eq!(
            condition(&ps, "ProgramAffinity"),
            Some(("True".into(), "PeerForwarding".into()))
        );
        for t in [
            "WorkersDiscovered",
            "ConfigApplied",
            "RouterAvailable",
            "BackendsObserved",
        ] {
            assert_eq!(condition(&ps, t).map(|c| c.0), Some("True".into()), "{t}");
        }

        // The rendered config holds exactly the four global ranks, and routers run it.
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm = cms.get("fleet-router").await.expect("configmap");
        let cfg: program_router::config::RouterConfig =
            serde_json::from_str(&cm.data.expect("data")["config.json"]).expect("router config");
        let mut targets: Vec<(String, Option<u32>)> = cfg
            .workers
            .iter()
            .map(|w| (w.url.clone(), w.dp_rank))
            .collect();
        targets.sort();
        assert_eq!(
            targets,
            vec![
                (format!("http://{w0}:{worker_port}"), Some(0)),
                (format!("http://{w0}:{worker_port}"), Some(1)),
                (format!("http://{w1}:{worker_port}"), Some(2)),
                (format!("http://{w1}:{worker_port}"), Some(3)),
            ]
        );
        assert!(cfg.program_scheduling.expect("on").global_queue);
        let routers = kubelet.routers().await;
        assert_eq!(routers.len(), 2, "the ReplicaSet made two router pods");

        // Traffic through a router pod reaches the workers (pinned to global rank 3).
        let c = testkit::client();
        let url = format!("http://{}:{router_port}/v1/chat/completions", routers[0].1);
        let body = json!({"model": "sim-model", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}]})
        .to_string();
        let r = testkit::send(
            &c,
            "POST",
            &url,
            &body,
            &[
                ("x-data-parallel-rank", "3"),
                ("authorization", "Bearer team-b"),
            ],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());

        // Program forwarding: the config lists both router pods as peers, each pod runs it
        // under its own name, and every Program is scheduled by one of them whichever pod its
        // turns reach.
        let members = wait_for(Duration::from_secs(30), || async {
            let cm = cms.get("fleet-router").await.ok()?;
            let cfg: program_router::config::RouterConfig =
                serde_json::from_str(cm.data?.get("config.json")?).ok()?;
            let peers = cfg.peers?;
            let m: Vec<(String, String)> =
                peers.members.into_iter().map(|m| (m.name, m.url)).collect();
            (m.len() == 2).then_some((m, peers.revision?))
        })
        .await
        .expect("both router pods become peers, the list numbered");
        let (members, first_revision) = members;
        // Members are named by their peer listener (router.peerPort, default 8081), which
        // answers only the peer secret the operator put in the Secret fleet-router-peer.
        let want: Vec<(String, String)> = routers
            .iter()
            .map(|(name, ip)| (name.clone(), format!("http://{ip}:8081")))
            .collect();
        assert_eq!(members, want);
        let refused =
            testkit::send(&c, "GET", &format!("{}/peers/usage", want[0].1), "", &[]).await;
        assert_eq!(refused.status, 401, "{}", refused.text());
        let on_api = testkit::send(
            &c,
            "GET",
            &format!("http://{}:{router_port}/peers/usage", routers[0].1),
            "",
            &[],
        )
        .await;
        assert_eq!(on_api.status, 404, "no peer route on the API port");
        for (name, _) in &routers {
            let knows = wait_for(Duration::from_secs(20), || async {
                let p = kubelet
                    .router_state(name)
                    .await?
                    .applied
                    .load()
                    .peers
                    .clone()?;
                (p.is_member() && p.self_name.as_deref() == Some(name) && p.members.len() == 2)
                    .then_some(())
            })
            .await;
            assert!(
                knows.is_some(),
                "{name} runs the peer list under its own name"
            );
        }
        let ids: Vec<String> = (0..12).map(|i| format!("agent-{i}")).collect();
        for turn in 0..2 {
            for (i, id) in ids.iter().enumerate() {
                let ip = &routers[(i + turn) % 2].1;
                let body = json!({"model": "sim-model", "max_tokens": 2,
                    "messages": [{"role": "user", "content": format!("turn {turn}")}],
                    "vllm_xargs": {"agentic_context": {"program_id": id}}})
                .to_string();
                let url = format!("http://{ip}:{router_port}/v1/chat/completions");
                let r = testkit::send(
                    &c,
                    "POST",
                    &url,
                    &body,
                    &[("authorization", "Bearer team-b")],
                )
                .await;
                assert_eq!(r.status, 200, "{id}: {}", r.text());
            }
        }
        let mut owned = Vec::new();
        for (name, _) in &routers {
            let st = kubelet.router_state(name).await.expect("running");
            let d = serde_json::to_value(
                st.applied
                    .load()
                    .program
                    .as_ref()
                    .expect("on")
                    .diagnostics(),
            )
            .expect("diagnostics");
            let programs: std::collections::BTreeSet<String> = d["ranks"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|r| r["programs"].as_array().into_iter().flatten())
                .filter_map(|p| p["program"].as_str())
                // Scoped to the client's key: `<key name>/<id>`.
                .filter_map(|p| p.rsplit('/').next().map(String::from))
                .collect();
            owned.push(programs);
        }
        assert!(owned[0].is_disjoint(&owned[1]), "{owned:?}");
        let all: std::collections::BTreeSet<String> = owned[0].union(&owned[1]).cloned().collect();
        assert_eq!(
            all,
            ids.iter().cloned().collect(),
            "each Program has one owner"
        );

        // The keys came from the Secrets: a client without one of them is refused, the workers'
        // key included (it stays with the router).
        for key in [None, Some("Bearer worker-secret")] {
            let h: Vec<(&str, &str)> = key.map(|k| ("authorization", k)).into_iter().collect();
            let r = testkit::send(&c, "POST", &url, &body, &h).await;
            assert_eq!(r.status, 401, "{key:?}: {}", r.text());
        }
        // Named keys from the mounted Secret count too, and rotate without a restart.
        let ask = |key: &'static str| {
            let (c, url, body) = (c.clone(), url.clone(), body.clone());
            async move {
                let auth = format!("Bearer {key}");
                testkit::send(&c, "POST", &url, &body, &[("authorization", &auth)])
                    .await
                    .status
            }
        };
        assert_eq!(ask("sk-search-1").await, 200);
        let rotated = r#"
apiVersion: v1
kind: Secret
metadata: {name: team-keys, namespace: agents}
stringData: {search-team: sk-search-2, docs-team: sk-docs}
"#;
        cp.kubectl_stdin(&["replace", "-f", "-"], Some(rotated))
            .expect_ok("rotate the named keys");
        let applied = wait_for(Duration::from_secs(20), || async {
            (ask("sk-search-2").await == 200
                && ask("sk-docs").await == 200
                && ask("sk-search-1").await == 401)
                .then_some(())
        })
        .await;
        assert!(applied.is_some(), "the rotated keys apply");
        assert_eq!(
            kubelet.routers().await,
            routers,
            "no router pod was replaced to rotate keys"
        );
        let names = kubelet
            .router_state(&routers[0].0)
            .await
            .and_then(|st| st.client_dir.load_full())
            .map(|d| {
                d.keys
                    .iter()
                    .map(|k| k.name.to_string())
                    .collect::<Vec<_>>()
            });
        assert_eq!(
            names,
            Some(vec!["docs-team".to_string(), "search-team".to_string()])
        );
        assert_eq!(
            condition(&api.get("fleet").await.expect("get"), "ClientKeys"),
            Some(("True".into(), "Loaded".into()))
        );
        // A Secret emptied by mistake: the routers keep the keys in force, and the resource says
        // why (the operator re-reads router status every 30 s when Ready; an edit is sooner).
        let emptied =
            "apiVersion: v1\nkind: Secret\nmetadata: {name: team-keys, namespace: agents}\n";
        cp.kubectl_stdin(&["replace", "-f", "-"], Some(emptied))
            .expect_ok("empty the named keys");
        let refused = wait_for(Duration::from_secs(20), || async {
            let st = kubelet.router_state(&routers[0].0).await?;
            st.client_dir.load_full()?.error.clone()
        })
        .await;
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("holds no key")),
            "{refused:?}"
        );
        assert_eq!(ask("sk-search-2").await, 200, "the keys in force stay");
        poke(&cp, ns, "1");
        let said = wait_for(Duration::from_secs(20), || async {
            let ps = api.get("fleet").await.ok()?;
            let (status, reason) = condition(&ps, "ClientKeys")?;
            (status == "False" && reason == "KeysRefused").then_some(ps)
        })
        .await;
        assert!(said.is_some(), "ClientKeys turns False with the reason");
        let ps = said.expect("checked");
        assert_eq!(
            condition(&ps, "Ready").map(|c| c.0),
            Some("True".into()),
            "refused keys do not make the routers unready"
        );

        // kubectl describe tells the story: conditions and the events of each transition.
        let described = cp
            .kubectl(&["describe", "psched", "fleet", "-n", ns])
            .expect_ok("describe");
        for needle in [
            "Ready",
            "WorkersDiscovered",
            "ConfigApplied",
            "ReferenceCoefficients",
            "PeerForwarding",
            "Events:",
            "Discovered",
        ] {
            assert!(
                described.contains(needle),
                "{needle} missing from:\n{described}"
            );
        }
        let printed = cp.kubectl(&["get", "psched", "-n", ns]).expect_ok("get");
        assert!(
            printed.contains("READY") && printed.contains("RANKS") && printed.contains("True"),
            "{printed}"
        );

        // The documented calibration flow: `program-router calibrate --format crd` output,
        // applied to the resource, reaches every router and turns Calibrated True.
        let fit = program_router::calibrate::Calibration {
            prefill_cost_model: program_router::calibrate::PrefillFit {
                intercept_seconds: 0.045,
                linear_seconds_per_1k_tokens: 0.031,
                quadratic_seconds_per_1k_tokens_squared: 0.0021,
            },
            decode_throughput_model: program_router::calibrate::DecodeFit {
                fixed_step_seconds: 0.011,
                batch_step_seconds_per_request: 0.00042,
                context_step_seconds_per_token: 1.4e-7,
            },
            fit: program_router::calibrate::FitReport {
                prefill_r2: 0.999,
                decode_r2: 0.998,
                prefill_samples: vec![],
                decode_samples: vec![],
            },
        };
        let models: serde_json::Value =
            serde_yaml::from_str(&fit.crd_yaml().expect("yaml")).expect("calibrate output");
        let patch = json!({"spec": {"programScheduling": models}}).to_string();
        cp.kubectl(&[
            "patch", "psched", "fleet", "-n", ns, "--type", "merge", "-p", &patch,
        ])
        .expect_ok("patch in the calibration");
        let calibrated = wait_for(Duration::from_secs(30), || async {
            let ps = api.get("fleet").await.ok()?;
            (condition(&ps, "Calibrated")? == ("True".into(), "Configured".into())).then_some(())?;
            for (pod, _) in kubelet.routers().await {
                let st = kubelet.router_state(&pod).await?;
                let cfg = &st.applied.load().config;
                let p = cfg.program_scheduling.as_ref()?;
                let seen = (
                    p.prefill_cost_model.linear_seconds_per_1k_tokens,
                    p.decode_throughput_model.context_step_seconds_per_token,
                );
                (seen == (0.031, 1.4e-7)).then_some(())?;
            }
            Some(())
        })
        .await;
        assert!(
            calibrated.is_some(),
            "calibration did not reach the routers: {:?}\noperator log:\n{}",
            api.get("fleet").await.ok().and_then(|p| p.status),
            op.log_tail()
        );

        // Deleting a worker pod removes its ranks from every router within 3 s.
        let t0 = Instant::now();
        kubelet.delete_worker("vllm-1").await;
        let gone = wait_for(Duration::from_secs(10), || async {
            for (pod, _) in kubelet.routers().await {
                let st = kubelet.router_state(&pod).await?;
                let urls: Vec<String> = st
                    .applied
                    .load()
                    .targets
                    .targets
                    .iter()
                    .map(|t| t.spec.url.clone())
                    .collect();
                if urls.iter().any(|u| u.contains(&w1)) || urls.is_empty() {
                    return None;
                }
            }
            Some(t0.elapsed())
        })
        .await
        .expect("routers dropped the deleted worker's ranks");
        eprintln!(
            "worker delete → routers applied: {:.0} ms",
            gone.as_secs_f64() * 1e3
        );
        assert!(gone <= Duration::from_secs(3), "took {gone:?}");
        let ps = wait_for(Duration::from_secs(10), || async {
            let ps = api.get("fleet").await.ok()?;
            (ps.status.as_ref()?.ranks == Some(2) && condition(&ps, "Ready")?.0 == "True")
                .then_some(ps)
        })
        .await
        .expect("status shows 2 ranks and Ready");
        assert_eq!(ps.status.expect("s").ranks, Some(2));

        // Readiness loss removes ranks; readiness back restores them.
        kubelet.set_worker_ready("vllm-0", false).await;
        let ranks = |n: i32| {
            let api = api.clone();
            async move {
                wait_for(Duration::from_secs(10), || async {
                    let ps = api.get("fleet").await.ok()?;
                    (ps.status?.ranks == Some(n)).then_some(())
                })
                .await
            }
        };
        assert!(ranks(0).await.is_some(), "not-Ready worker dropped");
        kubelet.set_worker_ready("vllm-0", true).await;
        assert!(ranks(2).await.is_some(), "Ready worker back");
        // A selector that no longer matches drops the workers; restoring it brings them back.
        let select = |app: &str| json!({"spec": {"workerSelector": {"matchLabels": {"app": app}}}});
        api.patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(select("other")),
        )
        .await
        .expect("patch selector");
        assert!(
            ranks(0).await.is_some(),
            "selector change dropped the workers"
        );
        let ps = api.get("fleet").await.expect("get");
        assert_eq!(
            condition(&ps, "WorkersDiscovered"),
            Some(("False".into(), "NoWorkers".into()))
        );
        api.patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(select("vllm")),
        )
        .await
        .expect("patch selector");
        assert!(ranks(2).await.is_some(), "selector restored");
        assert!(
            wait_for(Duration::from_secs(15), || async {
                let ps = api.get("fleet").await.ok()?;
                (condition(&ps, "Ready")?.0 == "True").then_some(())
            })
            .await
            .is_some(),
            "Ready again"
        );

        // An operator restart makes no write: resourceVersions stay, the write counter stays 0.
        // First let the status settle: every router sees every target healthy (a target turning
        // healthy raises no Kubernetes event), then one more reconcile records that.
        let settled = wait_for(Duration::from_secs(20), || async {
            for (pod, _) in kubelet.routers().await {
                let st = kubelet.router_state(&pod).await?;
                let applied = st.applied.load();
                let all = &applied.targets.targets;
                (!all.is_empty() && all.iter().all(|t| t.backend.healthy())).then_some(())?;
            }
            Some(())
        })
        .await;
        assert!(settled.is_some(), "router health settles");
        poke(&cp, ns, "2");
        let mut versions = owned_versions(&client, ns).await;
        let mut stable_since = Instant::now();
        while stable_since.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = owned_versions(&client, ns).await;
            if now != versions {
                versions = now;
                stable_since = Instant::now();
            }
        }
        op.stop();
        let op2 = Operator::start(&cp, &scratch.0, &["--namespace", ns]);
        let reconciled = wait_for(Duration::from_secs(30), || async {
            (op2.counter("program_operator_reconciles_total").await >= 1.0).then_some(())
        })
        .await;
        // Let any follow-up reconcile (pod events replayed by the fresh watches) run too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            reconciled.is_some(),
            "restarted operator reconciled:\n{}",
            op2.log_tail()
        );
        assert_eq!(
            op2.counter("program_operator_api_writes_total").await,
            0.0,
            "{}",
            op2.log_tail()
        );
        assert_eq!(
            owned_versions(&client, ns).await,
            versions,
            "no spurious writes"
        );

        // A router pod that goes leaves the peer list, and the ReplicaSet's new pod joins it
        // (with the team keys back: a router does not start on an empty key Secret).
        let restored = "apiVersion: v1\nkind: Secret\nmetadata: {name: team-keys, namespace: agents}\n\
                        stringData: {search-team: sk-search-2}\n";
        cp.kubectl_stdin(&["replace", "-f", "-"], Some(restored))
            .expect_ok("restore the named keys");
        let before = kubelet.routers().await;
        let gone = before[0].0.clone();
        cp.kubectl(&[
            "delete",
            "pod",
            &gone,
            "-n",
            ns,
            "--grace-period=0",
            "--force",
        ])
        .expect_ok("delete a router pod");
        let replaced = wait_for(Duration::from_secs(30), || async {
            let now = kubelet.routers().await;
            let cm = cms.get("fleet-router").await.ok()?;
            let cfg: program_router::config::RouterConfig =
                serde_json::from_str(cm.data?.get("config.json")?).ok()?;
            let peers = cfg.peers?;
            let members: Vec<String> = peers.members.into_iter().map(|m| m.name).collect();
            let names: Vec<String> = now.iter().map(|(n, _)| n.clone()).collect();
            // Each change of the list numbers it higher, so routers tell a newer list apart.
            (now.len() == 2
                && !names.contains(&gone)
                && members == names
                && peers.revision > Some(first_revision))
            .then_some(names)
        })
        .await;
        assert!(
            replaced.is_some(),
            "peers after replacing {gone}: {:?}\noperator log:\n{}",
            kubelet.routers().await,
            op2.log_tail()
        );
        assert!(
            wait_for(Duration::from_secs(20), || async {
                let ps = api.get("fleet").await.ok()?;
                (condition(&ps, "Ready")?.0 == "True"
                    && condition(&ps, "ProgramAffinity")?.1 == "PeerForwarding")
                    .then_some(())
            })
            .await
            .is_some(),
            "Ready with the new router pod"
        );

        // A semantic error the schema cannot catch: Ready=False, last good config kept.
        let cm_before = cms
            .get("fleet-router")
            .await
            .expect("cm")
            .metadata
            .resource_version;
        api.patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"programScheduling": {"statsWindowSize": 0}}})),
        )
        .await
        .expect("patch");
        let invalid = wait_for(Duration::from_secs(15), || async {
            let ps = api.get("fleet").await.ok()?;
            let (s, reason) = condition(&ps, "Ready")?;
            (s == "False" && reason == "InvalidSpec").then_some(())
        })
        .await;
        assert!(
            invalid.is_some(),
            "{:#?}",
            api.get("fleet").await.ok().and_then(|p| p.status)
        );
        assert_eq!(
            cms.get("fleet-router")
                .await
                .expect("cm")
                .metadata
                .resource_version,
            cm_before
        );

        // Deleting the resource garbage-collects every owned object.
        api.delete("fleet", &DeleteParams::default())
            .await
            .expect("delete");
        let collected = wait_for(Duration::from_secs(60), || async {
            let v = owned_versions(&client, ns).await;
            v.iter().all(|(_, rv)| rv.is_none()).then_some(())
        })
        .await;
        assert!(
            collected.is_some(),
            "left: {:?}",
            owned_versions(&client, ns).await
        );

        routers_task.abort();
        kubelet.shutdown().await;
        op2.stop();
    });
}

/// resourceVersion of the resource and each owned object (None when absent).
/// Annotates the resource (`poke=<n>`): an edit, so the operator reconciles it now.
fn poke(cp: &ControlPlane, ns: &str, n: &str) {
    cp.kubectl(&[
        "annotate",
        "psched",
        "fleet",
        "-n",
        ns,
        &format!("poke={n}"),
        "--overwrite",
    ])
    .expect_ok("annotate");
}

async fn owned_versions(client: &Client, ns: &str) -> Vec<(&'static str, Option<String>)> {
    async fn rv<K>(client: &Client, ns: &str, name: &str) -> Option<String>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|o| o.meta().resource_version.clone())
    }
    vec![
        (
            "ProgramScheduling",
            rv::<ProgramScheduling>(client, ns, "fleet").await,
        ),
        (
            "ConfigMap",
            rv::<ConfigMap>(client, ns, "fleet-router").await,
        ),
        (
            "Deployment",
            rv::<Deployment>(client, ns, "fleet-router").await,
        ),
        ("Service", rv::<Service>(client, ns, "fleet-router").await),
        (
            "ServiceAccount",
            rv::<ServiceAccount>(client, ns, "fleet-router").await,
        ),
        (
            "PodDisruptionBudget",
            rv::<PodDisruptionBudget>(client, ns, "fleet-router").await,
        ),
    ]
}
