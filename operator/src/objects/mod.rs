//! The objects the operator owns for one `ProgramScheduling`, as pure functions of the resource
//! and its rendered router config: ServiceAccount, ConfigMap, Deployment, Service and
//! PodDisruptionBudget, all named `<name>-router` and controlled by the resource (so deleting it
//! garbage-collects them).
//!
//! Each object carries `scheduling.program-router.dev/applied-hash`, a hash of its own desired
//! content: the controller compares it with the live object and sends no write when they match.
//! The Deployment's pod template carries `scheduling.program-router.dev/restart-hash`, a hash of
//! only the settings the router cannot take through hot reload (listeners), so editing anything
//! else updates the ConfigMap without restarting a router pod (tracing settings, which the
//! router reads at start, are part of that hash).

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
    // Only with tracing on, so that routers without it keep their hash across upgrades.
    if config.enable_trace
        && let Some(k) = key.as_array_mut()
    {
        k.extend([
            json!(config.otlp_traces_endpoint),
            json!(config.otel_sampling_ratio),
        ]);
    }
    format!(
        "{:016x}",
        program_router::hash::fnv1a(key.to_string().as_bytes())
    )
}

pub fn deployment(ps: &ProgramScheduling, config: &RouterConfig, image: &str) -> Value {
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
        "image": image,
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
    let mut pod_labels = json!(r.pod_labels);
    let mut pod_annotations = json!(r.pod_annotations);
    // The operator's own keys win (the CRD's rules already refuse them in the spec).
    merge(&mut pod_labels, labels(ps));
    merge(
        &mut pod_annotations,
        json!({ RESTART_HASH: restart_hash(config) }),
    );
    let mut pod = json!({
        "serviceAccountName": name,
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": grace_seconds(config),
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    });
    // Only what is set, so that routers of a spec without these fields keep their pod template.
    if !r.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = json!(r.image_pull_secrets);
    }
    if !r.node_selector.is_empty() {
        pod["nodeSelector"] = json!(r.node_selector);
    }
    if !r.tolerations.is_empty() {
        pod["tolerations"] = json!(r.tolerations);
    }
    if let Some(a) = &r.affinity {
        pod["affinity"] = json!(a);
    }
    if !r.topology_spread_constraints.is_empty() {
        let constraints: Vec<Value> = r
            .topology_spread_constraints
            .iter()
            .map(|c| {
                let mut c = json!(c);
                if c.get("labelSelector").is_none_or(Value::is_null) {
                    c["labelSelector"] = json!({ "matchLabels": selector_labels(ps) });
                }
                c
            })
            .collect();
        pod["topologySpreadConstraints"] = json!(constraints);
    }
    if let Some(p) = &r.priority_class_name {
        pod["priorityClassName"] = json!(p);
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
                "metadata": { "labels": pod_labels, "annotations": pod_annotations },
                "spec": pod,
            },
        },
    }))
}

/// Sets every key of the object `over` in the object `into`.
fn merge(into: &mut Value, over: Value) {
    if let (Some(into), Value::Object(over)) = (into.as_object_mut(), over) {
        into.extend(over);
    }
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
    let mut m = meta(ps);
    if !r.service_annotations.is_empty() {
        m["annotations"] = json!(r.service_annotations);
    }
    stamped(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": m,
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
mod tests;
