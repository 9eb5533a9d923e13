//! Table tests of [`plan`]: what one reconcile writes for what it read.

use super::*;
use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::{ProgramSchedulingSpec, RouterSpec};

fn ps(router: RouterSpec) -> ProgramScheduling {
    let mut p = ProgramScheduling::new(
        "fleet",
        ProgramSchedulingSpec {
            worker_selector: Default::default(),
            worker_port: 8000,
            data_parallel: None,
            router,
            program_scheduling: None,
            api_key_secret_ref: None,
            client_api_keys_secret_ref: None,
            client_api_keys_secret: None,
            fairness: None,
        },
    );
    p.metadata.namespace = Some("agents".into());
    p.metadata.uid = Some("uid-1".into());
    p.metadata.generation = Some(3);
    p
}

fn pod(name: &str, ip: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(Default::default()),
        status: Some(PodStatus {
            pod_ip: Some(ip.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn deployment(available: i32) -> Deployment {
    Deployment {
        status: Some(DeploymentStatus {
            available_replicas: Some(available),
            ready_replicas: Some(available),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn observed() -> Observed {
    Observed {
        worker_pods: Ok(vec![pod("vllm-0", "10.0.0.1"), pod("vllm-1", "10.0.0.2")]),
        router_pods: Vec::new(),
        reports: Vec::new(),
        config_map: None,
        deployment: None,
        network_policy: false,
        allowed_images: Vec::new(),
        router_image: crate::controller::DEFAULT_ROUTER_IMAGE.into(),
        router_tracing: None,
        now_ms: 1_000,
        now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

fn kinds(p: &Plan) -> Vec<&'static str> {
    p.objects
        .iter()
        .map(|d| match d {
            Desired::ServiceAccount(_) => "ServiceAccount",
            Desired::Service(_) => "Service",
            Desired::PodDisruptionBudget(_) => "PodDisruptionBudget",
            Desired::ConfigMap(_) => "ConfigMap",
            Desired::Deployment(_) => "Deployment",
            Desired::NetworkPolicy(_) => "NetworkPolicy",
        })
        .collect()
}

fn condition<'a>(p: &'a Plan, t: &str) -> (&'a str, &'a str) {
    let s = p.status.as_ref().expect("a status to write");
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} in {:?}", s.conditions));
    (c.status.as_str(), c.reason.as_str())
}

/// The report of a router running `hash`.
fn current(pod: &str, hash: &str, settings: &str) -> RouterReport {
    RouterReport::Status {
        pod: pod.into(),
        file_hash: Some(hash.into()),
        settings_hash: Some(settings.into()),
        targets: 2,
        healthy_targets: 2,
        last_reload_error: None,
        client_keys_error: None,
    }
}

#[test]
fn a_new_resource_gets_every_object_and_a_close_requeue() {
    let p = plan(&ps(RouterSpec::default()), &observed()).expect("plan");
    assert_eq!(
        kinds(&p),
        [
            "ServiceAccount",
            "Service",
            "PodDisruptionBudget",
            "ConfigMap",
            "Deployment",
            "NetworkPolicy"
        ]
    );
    assert_eq!(p.render_error, None);
    assert!(!p.delete_network_policy);
    assert_eq!(condition(&p, "WorkersDiscovered"), ("True", "Discovered"));
    assert_eq!(condition(&p, "RouterAvailable"), ("False", "Unavailable"));
    assert_eq!(condition(&p, "Ready").0, "False");
    let status = p.status.as_ref().expect("status");
    assert_eq!(status.ranks, Some(2));
    assert_eq!(status.observed_generation, Some(3));
    assert!(status.config_hash.is_some());
    // Every condition appears: one Event each.
    assert_eq!(p.events.len(), status.conditions.len());
    assert_eq!(p.requeue, Duration::from_secs(1), "config not applied yet");
}

#[test]
fn routers_on_the_rendered_config_make_it_ready_and_a_second_pass_writes_no_status() {
    let spec = ps(RouterSpec::default());
    let first = plan(&spec, &observed()).expect("plan");
    let status = first.status.expect("status");
    let hash = status.config_hash.clone().expect("hash");
    let Some(Desired::ConfigMap(cm)) = first
        .objects
        .iter()
        .find(|d| matches!(d, Desired::ConfigMap(_)))
    else {
        panic!("no ConfigMap")
    };
    let settings = cm["metadata"]["annotations"][objects::SETTINGS_HASH]
        .as_str()
        .expect("settings hash")
        .to_string();
    let mut obs = observed();
    obs.deployment = Some(deployment(1));
    obs.reports = vec![current("router-0", &hash, &settings)];
    let ready = plan(&spec, &obs).expect("plan");
    assert_eq!(condition(&ready, "Ready"), ("True", "Ready"));
    assert_eq!(condition(&ready, "ConfigApplied"), ("True", "Applied"));
    assert_eq!(ready.requeue, Duration::from_secs(30));
    // The resource now carries that status: nothing changes, nothing is written.
    let mut settled = spec.clone();
    settled.status = ready.status.clone();
    let again = plan(&settled, &obs).expect("plan");
    assert_eq!(again.status, None);
    assert!(again.events.is_empty());
}

#[test]
fn a_spec_that_cannot_render_keeps_the_last_config_and_waits_for_an_edit() {
    let mut obs = observed();
    obs.allowed_images = vec!["registry.example/program-router:".into()];
    obs.config_map = Some(ConfigMap {
        metadata: ObjectMeta {
            annotations: Some(
                [
                    (objects::CONFIG_HASH.to_string(), "last-good".to_string()),
                    (objects::SETTINGS_HASH.to_string(), "s".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    });
    let p = plan(&ps(RouterSpec::default()), &obs).expect("plan");
    assert_eq!(
        kinds(&p),
        ["ServiceAccount", "Service", "PodDisruptionBudget"]
    );
    assert!(
        p.render_error
            .as_deref()
            .is_some_and(|e| e.contains("image")),
        "{:?}",
        p.render_error
    );
    assert_eq!(condition(&p, "Ready"), ("False", "InvalidSpec"));
    let status = p.status.as_ref().expect("status");
    assert_eq!(status.config_hash.as_deref(), Some("last-good"));
    assert_eq!(p.requeue, Duration::from_secs(60));
}

#[test]
fn a_bad_selector_is_a_discovery_failure_not_a_spec_error() {
    let mut obs = observed();
    obs.worker_pods = Err("workerSelector: bad".into());
    let p = plan(&ps(RouterSpec::default()), &obs).expect("plan");
    assert_eq!(p.render_error, None);
    assert_eq!(
        condition(&p, "WorkersDiscovered"),
        ("False", "DiscoveryFailed")
    );
    assert!(!kinds(&p).contains(&"ConfigMap"));
    assert_eq!(p.status.as_ref().and_then(|s| s.ranks), None);
}

#[test]
fn a_network_policy_turned_off_is_deleted_only_when_one_exists() {
    let mut router = RouterSpec::default();
    router.network_policy.enabled = false;
    let spec = ps(router);
    let mut obs = observed();
    let p = plan(&spec, &obs).expect("plan");
    assert!(!kinds(&p).contains(&"NetworkPolicy"));
    assert!(!p.delete_network_policy);
    obs.network_policy = true;
    assert!(plan(&spec, &obs).expect("plan").delete_network_policy);
}

#[test]
fn peer_forwarding_creates_the_peer_secret_and_lists_ready_router_pods() {
    let spec = ps(RouterSpec {
        replicas: 2,
        peer_forwarding: true,
        ..Default::default()
    });
    let mut obs = observed();
    obs.router_pods = vec![pod("router-a", "10.1.0.1"), pod("router-b", "10.1.0.2")];
    let p = plan(&spec, &obs).expect("plan");
    assert!(p.peer_secret);
    let Some(Desired::ConfigMap(cm)) = p
        .objects
        .iter()
        .find(|d| matches!(d, Desired::ConfigMap(_)))
    else {
        panic!("no ConfigMap")
    };
    let file = cm["data"][objects::CONFIG_KEY].as_str().expect("config");
    assert!(
        file.contains("router-a") && file.contains("router-b"),
        "{file}"
    );
    assert_eq!(condition(&p, "ProgramAffinity").1, "NotUsed");
}

#[test]
fn routers_run_the_operators_router_image_unless_the_resource_names_one() {
    let image_of = |p: &Plan| {
        p.objects
            .iter()
            .find_map(|d| match d {
                Desired::Deployment(v) => v["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .map(str::to_string),
                _ => None,
            })
            .expect("a Deployment")
    };
    let obs = observed();
    let p = plan(&ps(RouterSpec::default()), &obs).expect("plan");
    assert_eq!(image_of(&p), crate::controller::DEFAULT_ROUTER_IMAGE);
    assert!(!image_of(&p).ends_with(":latest"));
    let named = ps(RouterSpec {
        image: Some("registry.example/program-router:9.9.9".into()),
        ..Default::default()
    });
    assert_eq!(
        image_of(&plan(&named, &obs).expect("plan")),
        "registry.example/program-router:9.9.9"
    );
    // The allow-list applies to the operator's own image too.
    let mut strict = observed();
    strict.allowed_images = vec!["registry.example/".into()];
    let refused = plan(&ps(RouterSpec::default()), &strict).expect("plan");
    assert!(refused.render_error.is_some());
}

#[test]
fn routers_trace_to_the_operators_collector_unless_the_resource_says_otherwise() {
    use crate::crd::TracingSpec;
    let rendered = |p: &Plan| -> (RouterConfig, String) {
        let cm = p
            .objects
            .iter()
            .find_map(|d| match d {
                Desired::ConfigMap(v) => v["data"][objects::CONFIG_KEY].as_str().map(String::from),
                _ => None,
            })
            .expect("a ConfigMap");
        let restart = p
            .objects
            .iter()
            .find_map(|d| match d {
                Desired::Deployment(v) => v["spec"]["template"]["metadata"]["annotations"]
                    [objects::RESTART_HASH]
                    .as_str()
                    .map(String::from),
                _ => None,
            })
            .expect("a Deployment");
        (serde_json::from_str(&cm).expect("config"), restart)
    };
    let plain = observed();
    let (off, off_hash) = rendered(&plan(&ps(RouterSpec::default()), &plain).expect("plan"));
    assert!(!off.enable_trace);
    let mut traced = observed();
    traced.router_tracing = Some(TracingSpec {
        enabled: true,
        otlp_traces_endpoint: Some("http://otel.monitoring:4317".into()),
        sampling_ratio: Some(0.25),
    });
    let (on, on_hash) = rendered(&plan(&ps(RouterSpec::default()), &traced).expect("plan"));
    assert!(on.enable_trace);
    assert_eq!(
        on.otlp_traces_endpoint.as_deref(),
        Some("http://otel.monitoring:4317")
    );
    assert_eq!(on.otel_sampling_ratio, 0.25);
    assert_ne!(
        off_hash, on_hash,
        "the routers read tracing at start: a change restarts them"
    );
    // The resource's own setting wins, including turning it off.
    let own = |t: TracingSpec| {
        ps(RouterSpec {
            tracing: Some(t),
            ..Default::default()
        })
    };
    let (mine, _) = rendered(
        &plan(
            &own(TracingSpec {
                enabled: true,
                otlp_traces_endpoint: Some("http://mine:4317".into()),
                sampling_ratio: None,
            }),
            &traced,
        )
        .expect("plan"),
    );
    assert_eq!(
        mine.otlp_traces_endpoint.as_deref(),
        Some("http://mine:4317")
    );
    assert_eq!(mine.otel_sampling_ratio, 1.0);
    let (none, none_hash) = rendered(
        &plan(
            &own(TracingSpec {
                enabled: false,
                otlp_traces_endpoint: None,
                sampling_ratio: None,
            }),
            &traced,
        )
        .expect("plan"),
    );
    assert!(!none.enable_trace);
    assert_eq!(none_hash, off_hash);
    // Enabled without a collector is a spec error, reported, not rendered.
    let missing = plan(
        &own(TracingSpec {
            enabled: true,
            otlp_traces_endpoint: None,
            sampling_ratio: None,
        }),
        &plain,
    )
    .expect("plan");
    assert!(
        missing
            .render_error
            .as_deref()
            .is_some_and(|e| e.contains("otlpTracesEndpoint")),
        "{:?}",
        missing.render_error
    );
}
