//! Tests of the owned objects: kinds, ownership, mounts, hashes and the network policy.

use super::*;
use crate::crd::{ProgramSchedulingSpec, RouterSpec};
use k8s_openapi::api::core::v1::SecretKeySelector;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The image the plan resolved for these resources.
const IMAGE: &str = "registry.example/program-router:1.2.3";

fn ps(router: RouterSpec) -> ProgramScheduling {
    let mut p = ProgramScheduling::new(
        "agents",
        ProgramSchedulingSpec {
            worker_selector: Default::default(),
            worker_port: 8000,
            data_parallel: None,
            router,
            program_scheduling: None,
            api_key_secret_ref: Some(SecretKeySelector {
                name: "vllm".into(),
                key: "token".into(),
                optional: None,
            }),
            client_api_keys_secret_ref: Some(SecretKeySelector {
                name: "clients".into(),
                key: "keys".into(),
                optional: None,
            }),
            client_api_keys_secret: None,
            fairness: None,
        },
    );
    p.metadata.namespace = Some("ml".into());
    p.metadata.uid = Some("uid-1".into());
    p
}

fn typed<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).expect("a valid object of its kind")
}

/// The Secret source of the pod's volume `name`.
fn secret_volume(
    pod: &k8s_openapi::api::core::v1::PodSpec,
    name: &str,
) -> k8s_openapi::api::core::v1::SecretVolumeSource {
    pod.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .and_then(|v| v.secret.clone())
        .unwrap_or_else(|| panic!("no secret volume {name}"))
}

#[test]
fn every_object_is_a_valid_owned_kind_controlled_by_the_resource() {
    let p = ps(RouterSpec::default());
    let cfg = RouterConfig::default();
    let file = ConfigFile::new(&cfg).expect("json");
    let objs = [
        (service_account(&p), "ServiceAccount"),
        (config_map(&p, &file), "ConfigMap"),
        (deployment(&p, &cfg, IMAGE), "Deployment"),
        (service(&p), "Service"),
        (pod_disruption_budget(&p), "PodDisruptionBudget"),
    ];
    for (o, kind) in objs {
        assert_eq!(o["kind"], kind);
        assert_eq!(o["metadata"]["name"], "agents-router");
        assert_eq!(o["metadata"]["namespace"], "ml");
        let owner = &o["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["uid"].as_str(), owner["controller"].as_bool()),
            (Some("uid-1"), Some(true))
        );
        assert_eq!(
            o["metadata"]["annotations"][APPLIED_HASH]
                .as_str()
                .map(str::len),
            Some(16)
        );
    }
    let _: ServiceAccount = typed(service_account(&p));
    let _: ConfigMap = typed(config_map(&p, &file));
    let svc: Service = typed(service(&p));
    assert_eq!(
        svc.spec.and_then(|s| s.session_affinity).as_deref(),
        Some("None")
    );
    let sticky = ps(RouterSpec {
        session_affinity: "ClientIP".into(),
        ..Default::default()
    });
    assert_eq!(service(&sticky)["spec"]["sessionAffinity"], "ClientIP");
    let _: PodDisruptionBudget = typed(pod_disruption_budget(&p));
    let d: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let pod = d.spec.template.spec.expect("pod");
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    let sc = c.security_context.as_ref().expect("hardened");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(pod.service_account_name.as_deref(), Some("agents-router"));
    let env = c.env.as_ref().expect("env");
    let key = env
        .iter()
        .find(|e| e.name == "PROGRAM_ROUTER_API_KEY")
        .expect("api key from the Secret");
    assert!(key.value.is_none(), "never inline");
    let clients = env
        .iter()
        .find(|e| e.name == "PROGRAM_ROUTER_CLIENT_API_KEYS")
        .expect("client keys from their Secret");
    assert!(clients.value.is_none(), "never inline");
    let from = clients
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref());
    assert_eq!(
        from.map(|s| (s.name.as_str(), s.key.as_str())),
        Some(("clients", "keys"))
    );
}

#[test]
fn named_client_keys_are_a_secret_volume_the_router_reads_by_its_flag() {
    let cfg = RouterConfig::default();
    let mut p = ps(RouterSpec {
        extra_args: vec!["--log-level=debug".into()],
        ..Default::default()
    });
    let plain: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let pod = plain.spec.template.spec.expect("pod");
    assert_eq!(pod.volumes.as_ref().map(Vec::len), Some(1), "config only");
    assert_eq!(
        pod.security_context.and_then(|s| s.fs_group),
        None,
        "no template change for routers without the volume"
    );
    p.spec.client_api_keys_secret = Some(k8s_openapi::api::core::v1::LocalObjectReference {
        name: "team-keys".into(),
    });
    let d: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let pod = d.spec.template.spec.expect("pod");
    let vol = secret_volume(&pod, "client-keys");
    assert_eq!(vol.secret_name.as_deref(), Some("team-keys"));
    assert_eq!(vol.default_mode, Some(0o440));
    assert_eq!(
        pod.security_context.and_then(|s| s.fs_group),
        Some(65532),
        "the router's group can read the keys"
    );
    let c = &pod.containers[0];
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "client-keys")
        .expect("mounted");
    assert_eq!(mount.mount_path, CLIENT_KEYS_DIR);
    assert_eq!(mount.read_only, Some(true));
    let args = c.args.clone().unwrap_or_default();
    let flag = format!("--client-api-keys-dir={CLIENT_KEYS_DIR}");
    assert!(args.contains(&flag), "{args:?}");
    // The router itself takes these arguments.
    let cli = <program_router::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("program-router".to_string()).chain(args),
    )
    .expect("the router parses its arguments");
    assert_eq!(
        cli.flags.client_api_keys_dir.as_deref(),
        Some(CLIENT_KEYS_DIR)
    );
}

#[test]
fn config_map_holds_the_exact_bytes_the_hash_names() {
    let p = ps(RouterSpec::default());
    let file = ConfigFile::new(&RouterConfig::default()).expect("json");
    let cm: ConfigMap = typed(config_map(&p, &file));
    let body = cm.data.expect("data")[CONFIG_KEY].clone();
    assert_eq!(
        program_router::config::file_hash(body.as_bytes()),
        file.hash
    );
    assert_eq!(
        cm.metadata.annotations.expect("ann")[CONFIG_HASH],
        file.hash
    );
    let back: RouterConfig = serde_json::from_str(&body).expect("router reads it");
    assert_eq!(back, RouterConfig::default());
}

#[test]
fn only_listener_changes_restart_router_pods() {
    let p = ps(RouterSpec::default());
    let a = RouterConfig::default();
    let mut hot = a.clone();
    hot.policy.kind = program_router::config::PolicyKind::RoundRobin;
    hot.workers.push(program_router::config::WorkerConfig {
        url: "http://10.0.0.9:8000".into(),
        dp_rank: Some(3),
    });
    let mut cold = a.clone();
    cold.port = 9999;
    let tmpl = |c: &RouterConfig| deployment(&p, c, IMAGE)["spec"]["template"].clone();
    assert_eq!(tmpl(&a), tmpl(&hot), "hot fields travel through the file");
    assert_ne!(tmpl(&a), tmpl(&cold));
}

#[test]
fn the_peer_secret_is_owned_random_and_mounted_only_with_a_peer_listener() {
    let p = ps(RouterSpec::default());
    let (a, b) = (new_peer_secret(), new_peer_secret());
    assert_ne!(a, b);
    assert_eq!(a.len(), 64);
    assert!(a.len() >= program_router::peers::key::MIN_SECRET_LEN);
    let s: k8s_openapi::api::core::v1::Secret = typed(peer_secret(&p, &a));
    assert_eq!(s.metadata.name.as_deref(), Some("agents-router-peer"));
    let owner = &s.metadata.owner_references.expect("owned")[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("uid-1", Some(true))
    );
    assert_eq!(
        s.string_data.expect("data")[crate::render::PEER_SECRET_KEY],
        a
    );

    let cfg = crate::render::render(&p.spec, Vec::new(), &[]).expect("renders");
    let d: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let pod = d.spec.template.spec.expect("pod");
    let secret = secret_volume(&pod, "peer-secret");
    assert_eq!(secret.secret_name.as_deref(), Some("agents-router-peer"));
    assert_eq!(secret.default_mode, Some(0o440), "the router's group only");
    let c = &pod.containers[0];
    let mount = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "peer-secret")
        .expect("mounted");
    assert_eq!(mount.mount_path, crate::render::PEER_SECRET_DIR);
    let peer_port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("peer"))
        .expect("peer port");
    assert_eq!(peer_port.container_port, 8081);
    // The Service never exposes the peer port.
    let svc: Service = typed(service(&p));
    let names: Vec<_> = svc.spec.expect("spec").ports.expect("ports");
    assert!(names.iter().all(|p| p.name.as_deref() != Some("peer")));

    let off = ps(RouterSpec {
        peer_forwarding: false,
        ..Default::default()
    });
    let cfg = crate::render::render(&off.spec, Vec::new(), &[]).expect("renders");
    let text = deployment(&off, &cfg, IMAGE).to_string();
    assert!(
        !text.contains("peer-secret") && !text.contains("\"peer\""),
        "{text}"
    );
}

#[test]
fn the_network_policy_opens_each_port_to_its_callers_only() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let p = ps(RouterSpec::default());
    let cfg = crate::render::render(&p.spec, Vec::new(), &[]).expect("renders");
    let np: NetworkPolicy = typed(network_policy(&p, &cfg));
    let spec = np.spec.expect("spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let routers = spec
        .pod_selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .expect("labels");
    assert_eq!(routers["app.kubernetes.io/instance"], "agents");
    let rules = spec.ingress.expect("rules");
    let port_of = |r: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
        serde_json::to_value(&r.ports.as_ref().expect("ports")[0].port).expect("port")
    };
    let ports: Vec<Value> = rules.iter().map(port_of).collect();
    assert_eq!(
        ports,
        [json!(8080), json!(9090), json!(8081)],
        "api, metrics, peer"
    );
    assert!(rules[0].from.is_none(), "the API port: anyone by default");
    let metrics = rules[1].from.as_ref().expect("metrics sources");
    assert_eq!(
        serde_json::to_value(metrics).expect("json"),
        json!([{ "namespaceSelector": {} }]),
        "any pod of the cluster, nothing outside it"
    );
    let peer = rules[2].from.as_ref().expect("peer sources");
    assert_eq!(
        peer[0]
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone()),
        Some(routers),
        "the peer port: the resource's own router pods only"
    );
    assert!(peer[0].namespace_selector.is_none(), "in its namespace");

    let mut narrowed = RouterSpec::default();
    let gateway: k8s_openapi::api::networking::v1::NetworkPolicyPeer =
        serde_json::from_value(json!({"namespaceSelector": {"matchLabels": {"name": "gw"}}}))
            .expect("peer");
    narrowed.network_policy.api_from = Some(vec![gateway.clone()]);
    narrowed.peer_forwarding = false;
    let p = ps(narrowed);
    let cfg = crate::render::render(&p.spec, Vec::new(), &[]).expect("renders");
    let np: NetworkPolicy = typed(network_policy(&p, &cfg));
    let rules = np.spec.expect("spec").ingress.expect("rules");
    assert_eq!(rules.len(), 2, "no peer listener, no peer rule");
    assert_eq!(rules[0].from, Some(vec![gateway]));
}

#[test]
fn content_ignores_only_the_servers_bookkeeping() {
    let p = ps(RouterSpec::default());
    let cfg = RouterConfig::default();
    let a: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let mut b = a.clone();
    b.metadata.resource_version = Some("42".into());
    b.metadata.generation = Some(7);
    b.status = Some(Default::default());
    assert!(same_content(&a, &b));
    let mut edited = a.clone();
    if let Some(spec) = edited.spec.template.spec.as_mut() {
        spec.containers[0].image = Some("evil:latest".into());
    }
    assert!(!same_content(&a, &edited), "kubectl set image is drift");
}

#[test]
fn router_pods_get_default_resources_unless_the_spec_gives_some() {
    let resources = |p: &ProgramScheduling| {
        let cfg = crate::render::render(&p.spec, Vec::new(), &[]).expect("renders");
        let d: Deployment = typed(deployment(p, &cfg, IMAGE));
        let pod = d.spec.template.spec.expect("pod");
        pod.containers[0].resources.clone().expect("resources")
    };
    let default = resources(&ps(RouterSpec::default()));
    let requests = default.requests.expect("requests");
    assert_eq!(requests["cpu"].0, "250m");
    assert_eq!(requests["memory"].0, "256Mi");
    let limits = default.limits.expect("limits");
    assert_eq!(limits["memory"].0, "1Gi");
    assert!(!limits.contains_key("cpu"), "no CPU throttling");
    let mine = k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some([("cpu".to_string(), Quantity("2".into()))].into()),
        ..Default::default()
    };
    let given = resources(&ps(RouterSpec {
        resources: Some(mine.clone()),
        ..Default::default()
    }));
    assert_eq!(given, mine, "used as is");
}

#[test]
fn the_grace_period_covers_the_shutdown_delay_and_the_drain() {
    let p = ps(RouterSpec::default());
    let cfg = crate::render::render(&p.spec, Vec::new(), &[]).expect("renders");
    let d = deployment(&p, &cfg, IMAGE);
    let grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_f64()
        .expect("grace");
    let l = &cfg.limits;
    assert_eq!(l.shutdown_delay_secs, crate::render::SHUTDOWN_DELAY_SECS);
    assert!(
        grace > l.shutdown_delay_secs + l.drain_timeout_secs,
        "{grace}"
    );
    assert_eq!(grace, 45.0);
}

#[test]
fn applied_hash_changes_with_content_and_reads_back() {
    let a = ps(RouterSpec::default());
    let b = ps(RouterSpec {
        replicas: 3,
        ..Default::default()
    });
    let cfg = RouterConfig::default();
    let (da, db) = (deployment(&a, &cfg, IMAGE), deployment(&b, &cfg, IMAGE));
    assert_ne!(
        da["metadata"]["annotations"][APPLIED_HASH],
        db["metadata"]["annotations"][APPLIED_HASH]
    );
    assert_eq!(da, deployment(&a, &cfg, IMAGE), "deterministic");
    let live: Deployment = typed(da.clone());
    assert_eq!(
        applied_hash(&live),
        da["metadata"]["annotations"][APPLIED_HASH].as_str()
    );
}

#[test]
fn router_pod_knobs_reach_the_pod_and_the_operators_labels_still_select_it() {
    let spec: RouterSpec = serde_json::from_value(json!({
        "imagePullSecrets": [{"name": "registry"}],
        "nodeSelector": {"pool": "routers"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "routers", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "agents"}}}}]}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"team": "ml"}}},
        ],
        "priorityClassName": "gateway-critical",
        "podAnnotations": {"sidecar.istio.io/inject": "false"},
        "podLabels": {"team": "ml"},
        "serviceAnnotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"},
        "logLevel": "debug",
    }))
    .expect("a valid router spec");
    let p = ps(spec);
    let cfg = RouterConfig::default();
    let d: Deployment = typed(deployment(&p, &cfg, IMAGE));
    let template = d.spec.template;
    let pod = template.spec.expect("pod spec");
    assert_eq!(
        pod.image_pull_secrets.expect("pull secrets")[0].name,
        "registry"
    );
    assert_eq!(pod.node_selector.expect("node selector")["pool"], "routers");
    assert_eq!(
        pod.tolerations.expect("tolerations")[0].key.as_deref(),
        Some("dedicated")
    );
    assert!(pod.affinity.expect("affinity").pod_anti_affinity.is_some());
    assert_eq!(pod.priority_class_name.as_deref(), Some("gateway-critical"));
    let spread = pod.topology_spread_constraints.expect("spread");
    // A constraint without a selector counts this resource's router pods; a given one is kept.
    let selector = |i: usize| {
        spread[i]
            .label_selector
            .clone()
            .and_then(|s| s.match_labels)
            .expect("selector")
    };
    assert_eq!(selector(0)["app.kubernetes.io/instance"], "agents");
    assert_eq!(selector(0)["app.kubernetes.io/component"], "router");
    assert_eq!(selector(1).get("team").map(String::as_str), Some("ml"));
    let meta = template.metadata.expect("pod metadata");
    let labels = meta.labels.expect("labels");
    assert_eq!(labels["team"], "ml");
    for (k, v) in selector_labels(&p).as_object().expect("labels") {
        assert_eq!(labels.get(k).map(String::as_str), v.as_str(), "{k}");
    }
    let annotations = meta.annotations.expect("annotations");
    assert_eq!(annotations["sidecar.istio.io/inject"], "false");
    assert!(annotations.contains_key(RESTART_HASH));
    let svc: Service = typed(service(&p));
    let svc_annotations = svc.metadata.annotations.expect("service annotations");
    assert_eq!(
        svc_annotations["service.beta.kubernetes.io/aws-load-balancer-internal"],
        "true"
    );
    assert!(svc_annotations.contains_key(APPLIED_HASH));
}

#[test]
fn a_spec_without_pod_knobs_renders_none_of_them() {
    // Routers of an older spec keep their pod template (and are not restarted) on upgrade.
    let p = ps(RouterSpec::default());
    let d = deployment(&p, &RouterConfig::default(), IMAGE);
    let pod = &d["spec"]["template"]["spec"];
    for key in [
        "imagePullSecrets",
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
    ] {
        assert!(pod.get(key).is_none(), "{key}: {}", pod[key]);
    }
    let annotations = d["spec"]["template"]["metadata"]["annotations"]
        .as_object()
        .expect("annotations");
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        vec![RESTART_HASH],
        "only the restart hash"
    );
    let svc = service(&p);
    assert_eq!(
        svc["metadata"]["annotations"]
            .as_object()
            .map(|a| a.keys().cloned().collect::<Vec<_>>()),
        Some(vec![APPLIED_HASH.to_string()])
    );
}
