//! The objects the operator owns for one `ProgramScheduling`, as pure functions of the resource
//! and its rendered router config: ServiceAccount, ConfigMap, Deployment, Service and
//! PodDisruptionBudget, all named `<name>-router` and controlled by the resource (so deleting it
//! garbage-collects them).
//!
//! Each object carries `scheduling.program-router.dev/applied-hash`, a hash of its own desired
//! content: the controller compares it with the live object and sends no write when they match.
//! The Deployment's pod template carries `scheduling.program-router.dev/restart-hash`, a hash of
//! only the settings the router cannot take through hot reload (listeners), so editing anything
//! else updates the ConfigMap without restarting a router pod.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use program_router::config::RouterConfig;
use serde_json::{Value, json};

use crate::crd::ProgramScheduling;

/// Annotation holding the hash of an owned object's desired content.
pub const APPLIED_HASH: &str = "scheduling.program-router.dev/applied-hash";
/// Pod-template annotation: hash of the restart-requiring router settings.
pub const RESTART_HASH: &str = "scheduling.program-router.dev/restart-hash";
/// ConfigMap annotation: hash of the config file bytes (what the router reports as `file_hash`).
pub const CONFIG_HASH: &str = "scheduling.program-router.dev/config-hash";
/// [`ConfigFile::settings`] on the ConfigMap.
pub const SETTINGS_HASH: &str = "scheduling.program-router.dev/settings-hash";
/// ConfigMap key of the router config file.
pub const CONFIG_KEY: &str = "config.json";
/// Where the router container mounts the ConfigMap.
pub const CONFIG_DIR: &str = "/etc/program-router";
/// Where the router reads `clientApiKeysSecret` (a Secret volume; outside the ConfigMap's).
pub const CLIENT_KEYS_DIR: &str = "/var/run/secrets/program-router/client-keys";
/// The label telling router pods apart from worker pods.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// The label naming the owning resource.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Field manager of every write.
pub const FIELD_MANAGER: &str = "program-operator";

/// The router config file exactly as the ConfigMap holds it, and its hash.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    pub json: String,
    pub hash: String,
    /// The hash of every setting but the member list of `peers` (the router's
    /// `config.settings_hash`).
    pub settings: String,
}

impl ConfigFile {
    pub fn new(config: &RouterConfig) -> Result<Self, serde_json::Error> {
        let json = serde_json::to_string_pretty(config)?;
        let hash = program_router::config::file_hash(json.as_bytes());
        let settings = program_router::config::settings_hash(json.as_bytes());
        Ok(ConfigFile {
            json,
            hash,
            settings,
        })
    }
}

/// Name shared by every owned object.
pub fn router_name(ps: &ProgramScheduling) -> String {
    format!("{}-router", ps.metadata.name.as_deref().unwrap_or_default())
}

/// Labels selecting this resource's router pods.
pub fn selector_labels(ps: &ProgramScheduling) -> Value {
    json!({
        "app.kubernetes.io/name": "program-router",
        INSTANCE_LABEL: ps.metadata.name.as_deref().unwrap_or_default(),
        COMPONENT_LABEL: "router",
    })
}

/// `key=value,...` form of [`selector_labels`], for list calls.
pub fn router_pod_selector(ps: &ProgramScheduling) -> String {
    format!(
        "app.kubernetes.io/name=program-router,{INSTANCE_LABEL}={},{COMPONENT_LABEL}=router",
        ps.metadata.name.as_deref().unwrap_or_default()
    )
}

fn labels(ps: &ProgramScheduling) -> Value {
    let mut l = selector_labels(ps);
    l["app.kubernetes.io/managed-by"] = json!(FIELD_MANAGER);
    l
}

fn meta(ps: &ProgramScheduling) -> Value {
    json!({
        "name": router_name(ps),
        "namespace": ps.metadata.namespace,
        "labels": labels(ps),
        "ownerReferences": [ps.controller_owner_ref(&())],
    })
}

/// Stamps [`APPLIED_HASH`] over the object's content (computed without the stamp).
fn stamped(mut obj: Value) -> Value {
    let hash = format!(
        "{:016x}",
        program_router::hash::fnv1a(obj.to_string().as_bytes())
    );
    obj["metadata"]["annotations"][APPLIED_HASH] = json!(hash);
    obj
}

/// The hash an owned object was applied with, if any.
pub fn applied_hash<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta()
        .annotations
        .as_ref()?
        .get(APPLIED_HASH)
        .map(String::as_str)
}

/// Whether two versions of an object hold the same content: everything but the bookkeeping the
/// API server changes on every write (`resourceVersion`, `generation`, `managedFields`) and the
/// `status` controllers write.
pub fn same_content<K: serde::Serialize>(a: &K, b: &K) -> bool {
    let content = |k: &K| {
        let mut v = serde_json::to_value(k).unwrap_or_default();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in ["resourceVersion", "generation", "managedFields"] {
                m.remove(f);
            }
        }
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
        }
        v
    };
    content(a) == content(b)
}

/// The desired content of one owned kind.
pub trait Owned: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned {
    const KIND: &'static str;
}
impl Owned for ServiceAccount {
    const KIND: &'static str = "ServiceAccount";
}
impl Owned for ConfigMap {
    const KIND: &'static str = "ConfigMap";
}
impl Owned for Deployment {
    const KIND: &'static str = "Deployment";
}
impl Owned for Service {
    const KIND: &'static str = "Service";
}
impl Owned for k8s_openapi::api::networking::v1::NetworkPolicy {
    const KIND: &'static str = "NetworkPolicy";
}
impl Owned for PodDisruptionBudget {
    const KIND: &'static str = "PodDisruptionBudget";
}

/// The router pods' identity: no API permissions, no token mounted.
pub fn service_account(ps: &ProgramScheduling) -> Value {
    stamped(json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(ps),
        "automountServiceAccountToken": false,
    }))
}

pub fn config_map(ps: &ProgramScheduling, file: &ConfigFile) -> Value {
    let mut m = meta(ps);
    m["annotations"] = json!({ CONFIG_HASH: file.hash, SETTINGS_HASH: file.settings });
    stamped(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": m,
        "data": { CONFIG_KEY: file.json },
    }))
}

/// Hash of what a running router cannot change without a restart.
pub fn restart_hash(config: &RouterConfig) -> String {
    let mut key = json!([
        config.host,
        config.port,
        config.prometheus_host,
        config.prometheus_port
    ]);
    // Only with a peer listener, so that routers without one keep their hash across upgrades.
    if config.peer_port.is_some()
        && let Some(k) = key.as_array_mut()
    {
        k.extend([
            json!(config.peer_host),
            json!(config.peer_port),
            json!(config.peer_secret_file),
        ]);
    }
    format!(
        "{:016x}",
        program_router::hash::fnv1a(key.to_string().as_bytes())
    )
}

pub fn deployment(ps: &ProgramScheduling, config: &RouterConfig) -> Value {
    let r = &ps.spec.router;
    let name = router_name(ps);
    let mut args = vec![
        json!("--config"),
        json!(format!("{CONFIG_DIR}/{CONFIG_KEY}")),
    ];
    let mut mounts = vec![json!({ "name": "config", "mountPath": CONFIG_DIR, "readOnly": true })];
    let mut volumes = vec![json!({ "name": "config", "configMap": { "name": name } })];
    if let Some(secret) = &ps.spec.client_api_keys_secret {
        args.push(json!(format!("--client-api-keys-dir={CLIENT_KEYS_DIR}")));
        mounts
            .push(json!({ "name": "client-keys", "mountPath": CLIENT_KEYS_DIR, "readOnly": true }));
        // Readable by the router's group only (fsGroup below), not by every user.
        volumes.push(json!({
            "name": "client-keys",
            "secret": { "secretName": secret.name, "defaultMode": 0o440 },
        }));
    }
    if config.peer_port.is_some() {
        mounts.push(json!({
            "name": "peer-secret",
            "mountPath": crate::render::PEER_SECRET_DIR,
            "readOnly": true,
        }));
        volumes.push(json!({
            "name": "peer-secret",
            "secret": { "secretName": peer_secret_name(ps), "defaultMode": 0o440 },
        }));
    }
    args.extend(r.extra_args.iter().map(|a| json!(a)));
    let mut env = vec![
        json!({"name": "RUST_LOG", "value": "info"}),
        // The pod's name among the config's `peers.members` (set on every pod, so that turning
        // Program scheduling on or scaling past one replica does not restart the routers).
        json!({
            "name": "PROGRAM_ROUTER_PEER_NAME",
            "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } },
        }),
    ];
    for (var, secret) in [
        ("PROGRAM_ROUTER_API_KEY", &ps.spec.api_key_secret_ref),
        (
            "PROGRAM_ROUTER_CLIENT_API_KEYS",
            &ps.spec.client_api_keys_secret_ref,
        ),
    ] {
        if let Some(s) = secret {
            env.push(json!({
                "name": var,
                "valueFrom": { "secretKeyRef": { "name": s.name, "key": s.key } },
            }));
        }
    }
    let mut ports = vec![
        json!({ "name": "http", "containerPort": r.port, "protocol": "TCP" }),
        json!({ "name": "metrics", "containerPort": r.metrics_port, "protocol": "TCP" }),
    ];
    if let Some(p) = config.peer_port {
        ports.push(json!({ "name": "peer", "containerPort": p, "protocol": "TCP" }));
    }
    let mut container = json!({
        "name": "router",
        "image": r.image,
        "args": args,
        "env": env,
        "ports": ports,
        "readinessProbe": {
            "httpGet": { "path": "/readiness", "port": "http" },
            "periodSeconds": 2, "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": { "path": "/health", "port": "http" },
            "periodSeconds": 10, "failureThreshold": 3,
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] },
        },
        "volumeMounts": mounts,
    });
    container["resources"] = match &r.resources {
        Some(res) => json!(res),
        None => default_resources(),
    };
    let mut pod_security = json!({
        "runAsNonRoot": true,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": { "type": "RuntimeDefault" },
    });
    if ps.spec.client_api_keys_secret.is_some() || config.peer_port.is_some() {
        // The key files belong to the router's group (mode 0440). Only with such a volume, so
        // that an operator upgrade does not restart routers that do not use one.
        pod_security["fsGroup"] = json!(65532);
    }
    stamped(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(ps),
        "spec": {
            "replicas": r.replicas,
            "selector": { "matchLabels": selector_labels(ps) },
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": { "maxUnavailable": 0, "maxSurge": 1 },
            },
            "template": {
                "metadata": {
                    "labels": labels(ps),
                    "annotations": { RESTART_HASH: restart_hash(config) },
                },
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": grace_seconds(config),
                    "securityContext": pod_security,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }))
}

/// Router container resources when the spec gives none: Burstable, never BestEffort (the first
/// evicted); memory bounded by the router's own limits (64 MiB bodies, 10,000 connections),
/// no CPU limit (throttling a proxy adds latency to every stream).
fn default_resources() -> Value {
    json!({
        "requests": { "cpu": "250m", "memory": "256Mi" },
        "limits": { "memory": "1Gi" },
    })
}

/// The router pod's termination grace: its shutdown delay and drain, plus 10 s, so that the
/// router ends the drain itself (answering what waits in its queues) before the kubelet's
/// SIGKILL.
fn grace_seconds(config: &RouterConfig) -> u64 {
    let l = &config.limits;
    (l.shutdown_delay_secs + l.drain_timeout_secs).ceil() as u64 + 10
}

pub fn service(ps: &ProgramScheduling) -> Value {
    let r = &ps.spec.router;
    stamped(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(ps),
        "spec": {
            "type": r.service_type,
            "sessionAffinity": r.session_affinity,
            "selector": selector_labels(ps),
            "ports": [
                { "name": "http", "port": r.port, "targetPort": "http", "protocol": "TCP" },
                { "name": "metrics", "port": r.metrics_port, "targetPort": "metrics", "protocol": "TCP" },
            ],
        },
    }))
}

/// The NetworkPolicy over this resource's router pods, for `config`: the API port from
/// `router.networkPolicy.apiFrom` (anyone when absent), the metrics port from `metricsFrom` (any
/// pod of the cluster when absent), the peer port only from the resource's own router pods, and
/// nothing else.
pub fn network_policy(ps: &ProgramScheduling, config: &RouterConfig) -> Value {
    let np = &ps.spec.router.network_policy;
    let port = |p: u16| json!([{ "port": p, "protocol": "TCP" }]);
    let mut api = json!({ "ports": port(config.port) });
    if let Some(from) = &np.api_from {
        api["from"] = json!(from);
    }
    let metrics_from = match &np.metrics_from {
        Some(from) => json!(from),
        None => json!([{ "namespaceSelector": {} }]),
    };
    let mut ingress = vec![api];
    if let Some(p) = config.prometheus_port {
        ingress.push(json!({ "ports": port(p), "from": metrics_from }));
    }
    if let Some(p) = config.peer_port {
        ingress.push(json!({
            "ports": port(p),
            "from": [{ "podSelector": { "matchLabels": selector_labels(ps) } }],
        }));
    }
    stamped(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(ps),
        "spec": {
            "podSelector": { "matchLabels": selector_labels(ps) },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }))
}

/// Name of the Secret holding the routers' peer secret.
pub fn peer_secret_name(ps: &ProgramScheduling) -> String {
    format!("{}-peer", router_name(ps))
}

/// The Secret holding the peer secret `secret` that this resource's router pods share (and
/// nothing else mounts), controlled by the resource. Created once, never applied over: a new
/// value would lock running routers out of each other until they restart.
pub fn peer_secret(ps: &ProgramScheduling, secret: &str) -> Value {
    let mut m = meta(ps);
    m["name"] = json!(peer_secret_name(ps));
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": m,
        "type": "Opaque",
        "stringData": { crate::render::PEER_SECRET_KEY: secret },
    })
}

/// A fresh peer secret: 32 random bytes as 64 hex digits.
pub fn new_peer_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// At most one router pod voluntarily evicted at a time.
pub fn pod_disruption_budget(ps: &ProgramScheduling) -> Value {
    stamped(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(ps),
        "spec": {
            "maxUnavailable": 1,
            "selector": { "matchLabels": selector_labels(ps) },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ProgramSchedulingSpec, RouterSpec};
    use k8s_openapi::api::core::v1::SecretKeySelector;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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
            (deployment(&p, &cfg), "Deployment"),
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
        let d: Deployment = typed(deployment(&p, &cfg));
        let pod = d.spec.template.spec.expect("pod");
        let c = &pod.containers[0];
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
        let plain: Deployment = typed(deployment(&p, &cfg));
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
        let d: Deployment = typed(deployment(&p, &cfg));
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
        let cli = <program_router::config::cli::Cli as clap::Parser>::try_parse_from(
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
        let tmpl = |c: &RouterConfig| deployment(&p, c)["spec"]["template"].clone();
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
        let d: Deployment = typed(deployment(&p, &cfg));
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
        let text = deployment(&off, &cfg).to_string();
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
        let a: Deployment = typed(deployment(&p, &cfg));
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
            let d: Deployment = typed(deployment(p, &cfg));
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
        let d = deployment(&p, &cfg);
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
        let (da, db) = (deployment(&a, &cfg), deployment(&b, &cfg));
        assert_ne!(
            da["metadata"]["annotations"][APPLIED_HASH],
            db["metadata"]["annotations"][APPLIED_HASH]
        );
        assert_eq!(da, deployment(&a, &cfg), "deterministic");
        let live: Deployment = typed(da.clone());
        assert_eq!(
            applied_hash(&live),
            da["metadata"]["annotations"][APPLIED_HASH].as_str()
        );
    }
}
