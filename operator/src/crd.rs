//! The `ProgramScheduling` custom resource (`scheduling.program-router.dev/v1alpha1`).
//!
//! Owns the user-facing schema: which pods are vLLM workers, how their DP ranks are found, how the
//! router is deployed, and every Program scheduling field of the spec (camelCase, optional: an
//! omitted field takes the router's default). CEL rules reject what the schema alone cannot.
//! The router's own `ProgramSchedulingConfig` stays the source of truth for defaults and
//! validation; `crate::render::mapping` converts.

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, SecretKeySelector, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Annotation giving a worker pod's DP size when its container args do not.
pub const DP_SIZE_ANNOTATION: &str = "scheduling.program-router.dev/data-parallel-size";
/// Annotation giving a worker pod's first GLOBAL DP rank.
pub const DP_START_ANNOTATION: &str = "scheduling.program-router.dev/data-parallel-start-rank";

/// Routes agentic traffic over the vLLM data-parallel ranks of the selected worker pods.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "scheduling.program-router.dev",
    version = "v1alpha1",
    kind = "ProgramScheduling",
    namespaced,
    shortname = "psched",
    status = "ProgramSchedulingStatus",
    doc = "A fleet of program-router replicas in front of the vLLM worker pods that `spec.workerSelector` selects: the operator discovers the pods' data-parallel ranks, renders the routers' configuration (policy, Program scheduling for agentic sessions, fair multi-tenant queueing, peer forwarding) and runs the routers as a Deployment behind a Service; status tells whether they serve the current configuration.",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Ranks","type":"integer","jsonPath":".status.ranks"}"#,
    printcolumn = r#"{"name":"Routers","type":"integer","jsonPath":".status.readyRouters"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    scale(
        spec_replicas_path = ".spec.router.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProgramSchedulingSpec {
    /// Selects the vLLM worker pods (in this namespace).
    pub worker_selector: LabelSelector,
    /// Port of the workers' OpenAI API.
    #[serde(default = "default_worker_port")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("workerPort must be a TCP port"))]
    pub worker_port: i32,
    /// DP ranks per worker pod; when absent, read from each pod (annotation or vLLM args).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallelSpec>,
    /// The router Deployment.
    #[serde(default)]
    pub router: RouterSpec,
    /// Program scheduling; absent = request-level routing only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_scheduling: Option<ProgramSchedulingParams>,
    /// Secret key holding the workers' API key (sent as Bearer by the router). Unless
    /// clientApiKeysSecretRef is set, clients must present this key too, as with vLLM itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
    /// Secret key holding the keys clients must present instead (comma- or newline-separated);
    /// the router then authenticates to the workers with apiKeySecretRef's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_api_keys_secret_ref: Option<SecretKeySelector>,
    /// Secret whose every data key is one client key, named by the data key (a team name): it
    /// is mounted into the routers, which re-read it, so keys rotate without a restart. The name
    /// is the tenant under fairness.tenantSource api_key. Counts together with
    /// clientApiKeysSecretRef's keys; clients then never present apiKeySecretRef's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_api_keys_secret: Option<LocalObjectReference>,
    /// Fair multi-tenant queueing in the router; absent = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FairnessParams>,
}

/// Fair multi-tenant queueing (the router's `fairness`, camelCase; omitted fields take its
/// defaults). Tenant names in `tenantClasses`/`tenantWeights` are kept exactly as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct FairnessParams {
    /// Where a request's tenant comes from: `header` (the `tenantHeader` request header; default),
    /// `api_key` (a hash of the client's bearer key; the key is never kept) or `user` (the body's
    /// `user` field).
    #[schemars(extend("enum" = ["header", "api_key", "user"]))]
    #[schemars(extend("default" = "header"))]
    pub tenant_source: Option<String>,
    /// Request header that names the tenant when `tenantSource` is `header` (default
    /// `x-tenant-id`).
    #[schemars(extend("default" = "x-tenant-id"))]
    pub tenant_header: Option<String>,
    /// Tenant of requests that name none (default `default`).
    #[schemars(extend("default" = "default"))]
    pub default_tenant: Option<String>,
    /// How queued tenants take turns: `vtc` (default; the tenant that has been served the fewest
    /// weighted tokens goes next) or `round_robin` (one request per tenant in turn).
    #[schemars(extend("enum" = ["vtc", "round_robin"]))]
    #[schemars(extend("default" = "vtc"))]
    pub discipline: Option<String>,
    /// Priority classes, highest priority first (default: `interactive`, `standard`, `batch`). A
    /// request waits in its class's queue while the backends are saturated for that class.
    pub classes: Option<Vec<PriorityClassParams>>,
    /// Request header that names the request's priority class (default `x-priority-class`).
    #[schemars(extend("default" = "x-priority-class"))]
    pub class_header: Option<String>,
    /// Class of requests that name none and whose tenant has no `tenantClasses` entry (default
    /// `standard`); must be one of `classes`.
    pub default_class: Option<String>,
    /// Tenant → its default class (tenant names are matched exactly).
    pub tenant_classes: Option<std::collections::BTreeMap<String, String>>,
    /// Highest class a request may name (403 above it) unless its tenant has its own entry.
    pub max_class: Option<String>,
    /// Tenant → highest class its requests may name.
    pub tenant_max_classes: Option<std::collections::BTreeMap<String, String>>,
    /// Tenant → share weight (> 0; default 1): a weight-2 tenant is served twice the weighted
    /// tokens of a weight-1 tenant while both wait.
    pub tenant_weights: Option<std::collections::BTreeMap<String, f64>>,
    /// Tenant → quota (requests and tokens per minute); more gets 429 with Retry-After.
    pub tenant_rate_limits: Option<std::collections::BTreeMap<String, RateLimitParams>>,
    /// Quota of tenants without their own entry.
    pub default_rate_limit: Option<RateLimitParams>,
    /// Weight of one prompt token in a tenant's served total (default 1.0).
    pub input_weight: Option<f64>,
    /// Weight of one generated token in a tenant's served total (default 2.0).
    pub output_weight: Option<f64>,
    /// Most requests one tenant may have waiting per class (≥ 1; default 256); one more gets
    /// 429 with `Retry-After`.
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("fairness.maxQueuePerTenant must be at least 1"))]
    pub max_queue_per_tenant: Option<u32>,
    /// Longest a request waits in a fair queue, in seconds (default 120); then 504
    /// `queue_timeout`.
    pub queue_timeout_seconds: Option<f64>,
    /// Backend metrics older than this many seconds count as saturated, so nothing is sent on
    /// stale data (default 5).
    pub metrics_max_age_seconds: Option<f64>,
    /// Tenants with a queue-depth and served-tokens series of their own (default 10); the others
    /// are summed as `other`.
    pub metrics_top_tenants: Option<u32>,
}

/// One tenant's quota (the router's `RateLimitConfig`); an absent field is unlimited.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitParams {
    /// Requests per minute (> 0; absent: unlimited).
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("requestsPerMinute must be positive"))]
    pub requests_per_minute: Option<f64>,
    /// Prompt plus generated tokens per minute (> 0; absent: unlimited).
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("tokensPerMinute must be positive"))]
    pub tokens_per_minute: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PriorityClassParams {
    /// The class's name, as requests give it in `classHeader`.
    pub name: String,
    /// Send this class's requests only while a backend reports fewer waiting requests than this
    /// (`vllm:num_requests_waiting`; default 1).
    pub max_waiting_requests: Option<u32>,
    /// Send only while every backend with fresh metrics reports an empty waiting queue (for
    /// batch work; default false).
    pub only_when_idle: Option<bool>,
    /// Hold this class's requests while a backend's recent time per output token exceeds this many
    /// seconds (default: no limit).
    pub max_tpot_seconds: Option<f64>,
}

fn default_worker_port() -> i32 {
    8000
}

/// Data parallelism of each worker pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DataParallelSpec {
    /// DP ranks served by each pod (its local ranks).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("dataParallel.size must be at least 1"))]
    pub size: Option<i32>,
}

/// How the router is deployed (every field optional).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    /// The router image. Absent: the operator's own router image (`--router-image`; the chart
    /// sets it to the program-router image of its appVersion), so that routers and the
    /// operator that renders their config are one version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Router replicas (≥ 0; default 2). With Program scheduling and `peerForwarding`, replicas
    /// forward each Program to the replica that owns it.
    #[serde(default = "d::replicas")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("router.replicas must not be negative"))]
    pub replicas: i32,
    /// Router container resources. Absent: requests of 250m CPU and 256Mi memory and a 1Gi
    /// memory limit (no CPU limit, which would throttle the proxy), so router pods are never
    /// BestEffort; given: used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Port of the routers' OpenAI API (default 8080; a change restarts the router pods).
    #[serde(default = "d::port")]
    pub port: i32,
    /// Port of the routers' Prometheus metrics (default 9090; a change restarts the router pods).
    #[serde(default = "d::metrics_port")]
    pub metrics_port: i32,
    /// Request-level policy for requests without Program identity.
    #[serde(default = "d::policy")]
    #[schemars(extend("enum" = ["round_robin", "random", "consistent_hash", "power_of_two", "cache_aware"]))]
    pub policy: String,
    /// Service type of the router Service.
    #[serde(default = "d::service_type")]
    #[schemars(extend("enum" = ["ClusterIP", "NodePort", "LoadBalancer"]))]
    pub service_type: String,
    /// Extra command-line arguments for program-router.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Service session affinity: `ClientIP` keeps a client on one router replica, so one
    /// scheduler sees all of a Program's requests when each agent is one client.
    #[serde(default = "d::session_affinity")]
    #[schemars(extend("enum" = ["None", "ClientIP"]))]
    pub session_affinity: String,
    /// Most proxied requests one router replica holds at once (vllm-router's
    /// --max-concurrent-requests); absent = no cap. Applied without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("router.maxConcurrentRequests must be at least 1"))]
    pub max_concurrent_requests: Option<i64>,
    /// Requests that may wait for a place beyond the cap (then 429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("router.queueSize must not be negative"))]
    pub queue_size: Option<i64>,
    /// Longest wait for a place (then 504).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("router.queueTimeoutSeconds must be positive"))]
    pub queue_timeout_seconds: Option<f64>,
    /// With several replicas, the replicas know each other (the router's `peers`): each Program
    /// is scheduled by one owner replica, which the others forward its requests to, tenants'
    /// quotas hold across the replicas, and a Responses API follow-up finds the server that
    /// stored its response through any replica.
    #[serde(default = "d::peer_forwarding")]
    pub peer_forwarding: bool,
    /// Port of the routers' peer listener, which only the other router pods of this resource
    /// call, presenting the peer secret the operator keeps in the Secret `<name>-router-peer`
    /// (with `peerForwarding`; never part of the Service).
    #[serde(default = "d::peer_port")]
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("router.peerPort must be a TCP port"))]
    pub peer_port: i32,
    /// With `peerForwarding`, hand Programs over when their owner changes (a router pod joins
    /// or leaves): the new owner asks the others for a Program it does not know and a stopping
    /// pod gives its Programs to their next owners, so a moved Program keeps the DP rank that
    /// holds its KV. `false`: a moved Program is bound afresh by its new owner.
    #[serde(default = "d::peer_hand_over")]
    pub peer_hand_over: bool,
    /// The NetworkPolicy over this resource's router pods (`<name>-router`): the peer port only
    /// from the same resource's router pods, the metrics port only from `metricsFrom`, the API
    /// port from `apiFrom`. It holds only where the cluster's network plugin enforces
    /// NetworkPolicies.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    /// What the routers log: `error`, `warn`, `info` (default: starts, stops, configuration
    /// changes, errors), `debug` or `trace`. Applied without a restart.
    #[serde(default)]
    pub log_level: LogLevel,
    /// One `info` log line per request when its response ends (request id, path, status, tenant,
    /// Program, backend, queue wait, tokens, duration); default true. Applied without a restart.
    #[serde(default = "d::access_log")]
    pub access_log: bool,
    /// OpenTelemetry traces of the routers' requests (vllm-router's `--enable-trace`,
    /// `--otlp-traces-endpoint`, `--otel-sampling-ratio`). Absent: the operator's default
    /// (`--router-otlp-traces-endpoint`; none unless the chart's `routerTracing` sets one). A
    /// change restarts the router pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingSpec>,
    /// Secrets in this namespace holding the registry credentials to pull `image`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Node labels a router pod's node must carry (the pod's `nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the router pods tolerate (the pod's `tolerations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Node and pod (anti-)affinity of the router pods. Absent: the scheduler places them freely;
    /// set a pod anti-affinity on `app.kubernetes.io/instance` to keep replicas on different
    /// nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// How router pods spread over zones or nodes (the pod's `topologySpreadConstraints`; a
    /// constraint without `labelSelector` gets this resource's router pod labels).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// PriorityClass of the router pods; absent: the cluster's default. Routers sit in front of
    /// every request, so a class above the workloads that call them keeps them from preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Extra annotations on the router pods (e.g. for a service mesh or a log shipper). A change
    /// restarts the router pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(k, !k.startsWith('scheduling.program-router.dev/'))")
        .message("router.podAnnotations must not set the operator's scheduling.program-router.dev/ annotations"))]
    pub pod_annotations: BTreeMap<String, String>,
    /// Extra labels on the router pods. The operator's own `app.kubernetes.io/name`, `instance`,
    /// `component` and `managed-by` labels select the pods and cannot be set here. A change
    /// restarts the router pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = kube::core::Rule::new(
        "self.all(k, !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/managed-by']))"
    ).message("router.podLabels must not set app.kubernetes.io/name, instance, component or managed-by (they select the router pods)"))]
    pub pod_labels: BTreeMap<String, String>,
    /// Extra annotations on the router Service (e.g. a cloud load balancer's settings with
    /// `serviceType: LoadBalancer`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(k, !k.startsWith('scheduling.program-router.dev/'))")
        .message("router.serviceAnnotations must not set the operator's scheduling.program-router.dev/ annotations"))]
    pub service_annotations: BTreeMap<String, String>,
}

/// `router.tracing`: where the routers export request spans.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracingSpec {
    /// Export traces (default true); false turns off the operator's default too.
    #[serde(default = "d::tracing_enabled")]
    pub enabled: bool,
    /// The OTLP/gRPC collector, an `http://` URL, e.g. `http://otel-collector.monitoring:4317`.
    /// Required when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.startsWith('http://')")
        .message("router.tracing.otlpTracesEndpoint must be an http:// URL of an OTLP/gRPC collector"))]
    pub otlp_traces_endpoint: Option<String>,
    /// Share of the traces that start at the routers that are exported, 0 to 1 (default 1); a
    /// client's sampled `traceparent` is always followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 1.0")
        .message("router.tracing.samplingRatio must be within 0 and 1"))]
    pub sampling_ratio: Option<f64>,
}

/// `router.logLevel`: the least severe level the routers log.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The router's `log_level` filter.
    pub fn filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `router.networkPolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Render the NetworkPolicy (default true); false deletes one rendered before.
    #[serde(default = "d::network_policy_enabled")]
    pub enabled: bool,
    /// Who may reach the API port (NetworkPolicy peers). Absent: anyone, in the cluster or not
    /// (clients still need a key when keys are configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_from: Option<Vec<NetworkPolicyPeer>>,
    /// Who may reach the metrics port (NetworkPolicy peers, e.g. the monitoring namespace).
    /// Absent: any pod of the cluster, nothing from outside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_from: Option<Vec<NetworkPolicyPeer>>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        NetworkPolicySpec {
            enabled: d::network_policy_enabled(),
            api_from: None,
            metrics_from: None,
        }
    }
}

/// Defaults of [`RouterSpec`], per field so that a partial `router:` is complete.
mod d {
    pub fn replicas() -> i32 {
        2
    }
    pub fn port() -> i32 {
        8080
    }
    pub fn metrics_port() -> i32 {
        9090
    }
    pub fn policy() -> String {
        "cache_aware".into()
    }
    pub fn session_affinity() -> String {
        "None".into()
    }
    pub fn service_type() -> String {
        "ClusterIP".into()
    }
    pub fn peer_forwarding() -> bool {
        true
    }
    pub fn peer_port() -> i32 {
        8081
    }
    pub fn peer_hand_over() -> bool {
        true
    }
    pub fn network_policy_enabled() -> bool {
        true
    }
    pub fn access_log() -> bool {
        true
    }
    pub fn tracing_enabled() -> bool {
        true
    }
}

impl Default for RouterSpec {
    fn default() -> Self {
        RouterSpec {
            image: None,
            replicas: d::replicas(),
            resources: None,
            port: d::port(),
            metrics_port: d::metrics_port(),
            policy: d::policy(),
            service_type: d::service_type(),
            extra_args: Vec::new(),
            session_affinity: d::session_affinity(),
            max_concurrent_requests: None,
            queue_size: None,
            queue_timeout_seconds: None,
            peer_forwarding: d::peer_forwarding(),
            peer_port: d::peer_port(),
            peer_hand_over: d::peer_hand_over(),
            network_policy: NetworkPolicySpec::default(),
            log_level: LogLevel::default(),
            access_log: d::access_log(),
            tracing: None,
            image_pull_secrets: Vec::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            topology_spread_constraints: Vec::new(),
            priority_class_name: None,
            pod_annotations: BTreeMap::new(),
            pod_labels: BTreeMap::new(),
            service_annotations: BTreeMap::new(),
        }
    }
}

/// Program scheduling fields (the router's `program_scheduling`, camelCase). Omitted fields take the
/// router's defaults.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.lowWatermarkRatio) || !has(self.highWatermarkRatio) || self.lowWatermarkRatio <= self.highWatermarkRatio"
).message("programScheduling.lowWatermarkRatio must not exceed highWatermarkRatio"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.bindingStrategy) || self.bindingStrategy != 'reasoning_token_balance' || has(self.tokenCapacityPerDpRank)"
).message("programScheduling.bindingStrategy reasoning_token_balance requires tokenCapacityPerDpRank"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.forceResumeTimeoutSeconds) || !has(self.queueTimeoutSeconds) || self.forceResumeTimeoutSeconds <= self.queueTimeoutSeconds"
).message("programScheduling.forceResumeTimeoutSeconds must not exceed queueTimeoutSeconds"))]
pub struct ProgramSchedulingParams {
    /// Which requests are Program requests: `vllm_xargs.agentic_context` (default; only requests
    /// carrying that object) or `auto` (also `agent_hint` and the session headers of Claude Code,
    /// Codex and other agent frameworks; see docs/program-scheduling.md).
    #[schemars(extend("enum" = ["vllm_xargs.agentic_context", "auto"]))]
    #[schemars(extend("default" = "vllm_xargs.agentic_context"))]
    pub program_scheduling_enable_key: Option<String>,
    /// Keep Programs on their bound rank but skip admission, pauses and resumes (default false):
    /// an A/B switch that isolates the effect of affinity alone.
    pub binding_only: Option<bool>,
    /// Let a paused Program resume on another rank when its own is full and the other passes
    /// the headroom checks (default true); false keeps every Program on its bound rank.
    pub global_queue: Option<bool>,
    /// Order of resumes on a rank among equally urgent Programs: `kind_size` (default; as
    /// `mru`, with Programs of a kind — a system prompt; subagents apart — that runs far
    /// smaller than the fleet's average first, learned from Programs that ended), `mru` (the
    /// spec's default; Programs that have run go first, latest first, as their KV is the
    /// likeliest to be cached, and new Programs follow oldest first), `fcfs`, or `last_use`
    /// (Programs that have run go first, the one whose KV was used last first; long-idle
    /// Programs wait behind busy ones).
    #[schemars(extend("enum" = ["kind_size", "mru", "fcfs", "last_use"]))]
    pub resume_order: Option<String>,
    /// Extension, for `resumeOrder: kind_size`: the factor between two tiers of Program size (a
    /// kind's tier is its mean size over the fleet's, rounded on a log scale of this base);
    /// default 3, above 1 and at most 1000000.
    #[x_kube(validation = kube::core::Rule::new("self > 1.0 && self <= 1000000.0").message("kindSizeTierRatio must be above 1 and at most 1000000"))]
    pub kind_size_tier_ratio: Option<f64>,
    /// Extension, for `resumeOrder: mru` and within each `kind_size` tier: work in progress
    /// that has completed more turns resumes first, latest arrival first among equals, while
    /// the rank's queue is long (default true; false: latest arrival first).
    pub resume_most_turns_first: Option<bool>,
    /// Extension, for `resumeMostTurnsFirst`: it orders a request only while its rank's queue
    /// asks for at least this many times the rank's KV capacity; default 1.5, 0 = always, at
    /// most 1000.
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 1000.0").message("resumeMostTurnsFirstMinQueuedRatio must be at least 0 and at most 1000"))]
    pub resume_most_turns_first_min_queued_ratio: Option<f64>,
    /// How much free KV a rank needs before a Program moves to it: the source rank's free
    /// capacity plus this multiple of the Program's context (≥ 0; default 3.0). Higher moves
    /// less. No effect with `globalQueue: false`.
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("crossRankHeadroomRatio must be >= 0"))]
    pub cross_rank_headroom_ratio: Option<f64>,
    /// Extension: queue wait before a cross-rank move, as a multiple of the move's cost (the
    /// Program's cache-miss impact); 0 = move at once (the spec), 1 = break even; unset = 1.
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("crossRankMinWaitRatio must be >= 0"))]
    pub cross_rank_min_wait_ratio: Option<f64>,
    /// Extension: while the head of a rank's queue does not fit, up to this many requests
    /// behind it (of its priority) may go first when they fit, if the head has nothing of its
    /// own cached (a new Program, or one back from a call longer than the rank's prefix
    /// freshness) or their Program's tool calls mostly outlast `maxActingTtlSeconds` (human
    /// chat, slow tools); unset = 16, 0 = strict queue order, at most 1024.
    #[x_kube(validation = kube::core::Rule::new("self <= 1024").message("queueBackfillDepth must be at most 1024"))]
    pub queue_backfill_depth: Option<u32>,
    /// Home rank of a new Program: `least_program_count` (default; the rank with the fewest
    /// live Programs), `consistent_hash`, `program_round_robin`, `reasoning_token_balance` (needs
    /// `tokenCapacityPerDpRank`) or `cache_aware` (follows a rank that holds the prompt's prefix).
    #[schemars(extend("enum" = ["consistent_hash", "program_round_robin", "least_program_count", "reasoning_token_balance", "cache_aware"]))]
    pub binding_strategy: Option<String>,
    /// Points per rank on the `consistent_hash` ring (1–10000; default 160); ignored by the
    /// other strategies.
    pub hash_virtual_nodes: Option<u32>,
    /// KV-cache capacity of one DP rank, in tokens (> 0). Absent: read from each backend's
    /// `vllm:cache_config_info`, else Programs are limited by count only
    /// (`maxActiveProgramsPerTarget`).
    #[x_kube(validation = kube::core::Rule::new("self > 0").message("tokenCapacityPerDpRank must be > 0"))]
    pub token_capacity_per_dp_rank: Option<u64>,
    /// Most Programs active at once on one rank (default 64): the capacity guard without a token
    /// capacity, and a count guard beside it; a forced resume may exceed it.
    pub max_active_programs_per_target: Option<u32>,
    /// Seconds between backend metric reads and scheduling rounds (> 0; default 1.0); also how
    /// long an observation counts as fresh.
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("metricsIntervalSeconds must be > 0"))]
    pub metrics_interval_seconds: Option<f64>,
    /// A rank whose vLLM reports this many waiting requests admits and resumes nothing more
    /// until it drops (default 1; 0 turns the check off).
    pub admission_waiting_request_threshold: Option<u32>,
    /// Longest a request waits in the RequestPool, in seconds (default 600); then 504. A
    /// request's own deadline can only shorten it.
    pub queue_timeout_seconds: Option<f64>,
    /// A waiting Program is resumed regardless of capacity after at most this many seconds
    /// (default 300; ≤ `queueTimeoutSeconds`), sooner when the rank's queued work is short.
    pub force_resume_timeout_seconds: Option<f64>,
    /// A paused Program with nothing waiting is forgotten after this many seconds (default
    /// 1800); its next request binds it afresh.
    pub paused_retention_ttl_seconds: Option<f64>,
    /// How long, in seconds, an observation of a prefix shared between Programs counts before the
    /// rank's statistics are mature, and whenever they cannot say (default 100).
    pub shared_prefix_freshness_warmup_seconds: Option<f64>,
    /// Once statistics are mature, a shared-prefix observation lasts as long as the rank takes to
    /// turn over its whole KV cache this many times with newly written tokens (default 1.5).
    /// Higher trusts older observations.
    pub shared_prefix_freshness_kv_turnovers: Option<f64>,
    /// Tokens reserved for a request's output when it gives no `expected_output_length`
    /// (default 100); counted in admission and in the rank's occupancy.
    pub decode_buffer_tokens: Option<u64>,
    /// Longest a finished request's Program keeps its KV reserved while it runs a tool, in
    /// seconds (default 10); the automatic TTL picks up to this, a request's
    /// `kv_retention_ttl_seconds` overrides it.
    pub max_acting_ttl_seconds: Option<f64>,
    /// Fraction of the token capacity above which running Programs are paused to repair
    /// occupancy (> 0, ≥ `lowWatermarkRatio`; default 1.0).
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("highWatermarkRatio must be > 0"))]
    pub high_watermark_ratio: Option<f64>,
    /// Fraction of the token capacity that admission and resumes fill up to, and that repair
    /// brings occupancy back to (> 0; default 1.0). Lower leaves KV headroom free.
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("lowWatermarkRatio must be > 0"))]
    pub low_watermark_ratio: Option<f64>,
    /// Most rounds a Program is served back to back before it yields to waiting Programs on its
    /// rank (default 32; the spec's is 14); a Program that yielded resumes behind the others once.
    pub max_segment_rounds: Option<u32>,
    /// Extension: only a Program whose context is at most this share of its rank's token
    /// capacity yields at `maxSegmentRounds`, or a larger one when a forced request at the head
    /// of its rank's queue would fit once it releases its KV (> 0; default 0.1; 1 = every
    /// Program, the spec).
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("segmentYieldMaxContextRatio must be > 0"))]
    pub segment_yield_max_context_ratio: Option<f64>,
    /// Samples in the rolling windows of request growth and tool intervals (1–100000; default
    /// 100); until a window is full its estimate is off (no growth reserve, no automatic TTL).
    pub stats_window_size: Option<u32>,
    /// Admit a request past the growth reserve when the modelled decode batch gain outweighs
    /// the cost (default true); never past the capacity or the Program count.
    pub enable_batch_gain_admission: Option<bool>,
    /// Extension: `rank` (each rank's own tool-interval window, the spec) or `pooled`.
    #[schemars(extend("enum" = ["rank", "pooled"]))]
    pub ttl_evidence: Option<String>,
    /// Extension: samples before the automatic TTL acts (1..=statsWindowSize).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("ttlMinSamples must be at least 1"))]
    pub ttl_min_samples: Option<u32>,
    /// Extension: a Program whose response called a tool may be held longer (never shorter)
    /// by the intervals that followed that tool's earlier calls, once there are this many
    /// (0..=statsWindowSize; default 50; 0 = tools are not told apart).
    pub tool_ttl_min_samples: Option<u32>,
    /// Extension: distinct tool names kept for `toolTtlMinSamples` (0–1024; default 64);
    /// calls of tools beyond them count as calling none.
    #[x_kube(validation = kube::core::Rule::new("self <= 1024").message("maxTools must be at most 1024"))]
    pub max_tools: Option<u32>,
    /// Extension: what a second of holding a Program's KV costs in the automatic TTL:
    /// `kv_share` (the default: the Program's share of its rank's KV, scaled up by the rank's
    /// backlog) or `seconds` (the spec).
    #[schemars(extend("enum" = ["seconds", "kv_share"]))]
    pub acting_ttl_cost: Option<String>,
    /// Extension: how long a hold is charged for in the automatic TTL: `expected` (the default:
    /// the hold's expected length, blended toward the whole TTL as the rank's longest-waiting
    /// request nears its force-resume deadline) or `reserved` (the whole TTL, the spec).
    #[schemars(extend("enum" = ["reserved", "expected"]))]
    pub acting_ttl_hold: Option<String>,
    /// Extension: multiple of the modelled drain time used as the force-resume deadline (0 =
    /// always forceResumeTimeoutSeconds).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("forceResumeWorkloadFactor must be >= 0"))]
    pub force_resume_workload_factor: Option<f64>,
    /// Extension: a forced request that the router's KV ledger still keeps out this many seconds
    /// past its force-resume deadline is admitted once the engine's own KV report shows room for
    /// it (default 60; queueTimeoutSeconds or more: never).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("forceResumeEngineGraceSeconds must be >= 0"))]
    pub force_resume_engine_grace_seconds: Option<f64>,
    /// Extension: a paused Program idle for longer than this multiple of the longest observed
    /// completion-to-next-request interval counts as finished for `least_program_count`
    /// binding (0 = only `expected_resume: false` marks it).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("finishedIdleRatio must be >= 0"))]
    pub finished_idle_ratio: Option<f64>,
    /// Extension: a Program that has called a tool, whose client leaves `expected_resume`
    /// unsaid (session headers), ends its turn when a response calls no tool: it pauses without
    /// a hold and counts as finished until its next request (default true).
    pub answer_ends_program: Option<bool>,
    /// Extension: the automatic TTL's cache-miss impact is multiplied by 1 + this × (requests
    /// queued for the rank ÷ its active Programs): a re-prefill delays what waits behind it
    /// (0 = the spec's impact).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("missImpactBacklogWeight must be >= 0"))]
    pub miss_impact_backlog_weight: Option<f64>,
    /// Extension: requests that may wait in each router's RequestPool at once; one more gets
    /// 429 `request_pool_full` (default 10000).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxRetainedRequests must be at least 1"))]
    pub max_retained_requests: Option<i64>,
    /// Extension: Programs each router holds at once; a new one takes the place of the idle
    /// Programs that waited longest (the oldest 1% of the cap at once), else gets 429
    /// `program_capacity` (default 100000).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("maxPrograms must be at least 1"))]
    pub max_programs: Option<i64>,
    /// Extension: a rank admits up to this share of its capacity past `lowWatermarkRatio` while
    /// the request next in line has waited long next to what a lost prefix costs; reset when a
    /// Program comes back to an evicted prefix (default 0.3; 0 = never).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("adaptiveOvercommitMaxRatio must be >= 0"))]
    pub adaptive_overcommit_max_ratio: Option<f64>,
    /// Extension: what the overcommit grows by per observation of a rank (default 0.01).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("adaptiveOvercommitStepRatio must be >= 0"))]
    pub adaptive_overcommit_step_ratio: Option<f64>,
    /// Extension: the overcommit grows only while the request next in line has waited longer
    /// than this many times the cache-miss impact of the rank's mean Program (default 10).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("adaptiveOvercommitWaitRatio must be >= 0"))]
    pub adaptive_overcommit_wait_ratio: Option<f64>,
    /// Extension: the overcommit grows only on a rank whose Programs ran at most this many
    /// rounds per activation on average, so what it admits leaves soon (default 2.5; 32 or more:
    /// every rank).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("adaptiveOvercommitMaxRounds must be >= 0"))]
    pub adaptive_overcommit_max_rounds: Option<f64>,
    /// Extension: on a rank where none of the latest resumed Programs had held its place (people
    /// thinking between turns), a request is admitted once all but this share of its demand
    /// fits (default 0.5; 0 = never; at most 1).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 1.0").message("holdFreeAdmissionSlackRatio must be between 0 and 1"))]
    pub hold_free_admission_slack_ratio: Option<f64>,
    /// Extension: the hold-free slack also applies, on any rank, to requests of a kind (model
    /// and system prompt) none of whose latest resumed Programs had held its place (default
    /// true).
    pub hold_free_admission_by_kind: Option<bool>,
    /// Extension: an admission reserves the rank's mean context growth only on a rank whose
    /// Programs ran more than this many rounds per activation on average (default 2.5; 0:
    /// always, the spec's behaviour).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("growthReserveMinRounds must be >= 0"))]
    pub growth_reserve_min_rounds: Option<f64>,
    /// Extension: new Programs queue behind work in progress by arrival time plus this many
    /// seconds × the share of the rank's KV they ask for: a lower mean, a longer tail (default
    /// 0: by arrival, the spec's behaviour; at most 86400).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 86400.0").message("newProgramDemandAgingSeconds must be between 0 and 86400"))]
    pub new_program_demand_aging_seconds: Option<f64>,
    /// Cost of a cold prefill, for the TTL and batch-gain decisions. Fit it with
    /// `program-router calibrate`; omitted coefficients take reference values (Calibrated=False).
    pub prefill_cost_model: Option<PrefillCostModelParams>,
    /// Time of one decode step, for the TTL and batch-gain decisions. Fit it with
    /// `program-router calibrate`; omitted coefficients take reference values.
    pub decode_throughput_model: Option<DecodeThroughputModelParams>,
}

/// The coefficients `program-router calibrate` fits, as spec paths below `programScheduling`
/// (`decodeThroughputAlpha` is not fitted).
pub const FITTED_COEFFICIENTS: [&str; 6] = [
    "prefillCostModel.interceptSeconds",
    "prefillCostModel.linearSecondsPer1kTokens",
    "prefillCostModel.quadraticSecondsPer1kTokensSquared",
    "decodeThroughputModel.fixedStepSeconds",
    "decodeThroughputModel.batchStepSecondsPerRequest",
    "decodeThroughputModel.contextStepSecondsPerToken",
];

impl ProgramSchedulingParams {
    /// The [`FITTED_COEFFICIENTS`] this spec leaves unset (they take reference values).
    pub fn uncalibrated(&self) -> Vec<&'static str> {
        let p = self.prefill_cost_model.clone().unwrap_or_default();
        let d = self.decode_throughput_model.clone().unwrap_or_default();
        let set = [
            p.intercept_seconds,
            p.linear_seconds_per_1k_tokens,
            p.quadratic_seconds_per_1k_tokens_squared,
            d.fixed_step_seconds,
            d.batch_step_seconds_per_request,
            d.context_step_seconds_per_token,
        ];
        FITTED_COEFFICIENTS
            .iter()
            .zip(set)
            .filter(|(_, v)| v.is_none())
            .map(|(f, _)| *f)
            .collect()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrefillCostModelParams {
    /// Fixed part of a cold prefill, in seconds.
    pub intercept_seconds: Option<f64>,
    /// Seconds per 1,000 uncached prompt tokens.
    pub linear_seconds_per_1k_tokens: Option<f64>,
    /// Seconds per (1,000 uncached prompt tokens)², for long prompts.
    pub quadratic_seconds_per_1k_tokens_squared: Option<f64>,
    /// Share of decode throughput kept while a prefill runs in the same batch (0–1; default
    /// 0.15); lower makes a cache miss cost more.
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 1.0").message("decodeThroughputAlpha must be within [0, 1]"))]
    pub decode_throughput_alpha: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DecodeThroughputModelParams {
    /// Fixed part of one decode step, in seconds.
    pub fixed_step_seconds: Option<f64>,
    /// Seconds added to a decode step per request in the batch.
    pub batch_step_seconds_per_request: Option<f64>,
    /// Seconds added to a decode step per context token in the batch.
    pub context_step_seconds_per_token: Option<f64>,
}

/// Observed state, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgramSchedulingStatus {
    /// The `metadata.generation` this status describes.
    pub observed_generation: Option<i64>,
    #[serde(default)]
    /// Ready, WorkersDiscovered, ConfigApplied, RouterAvailable, BackendsObserved, Calibrated and
    /// ProgramAffinity, each with a reason and message (docs/operator.md).
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// DP ranks currently routed to.
    pub ranks: Option<i32>,
    /// Router pods that are Ready (the Deployment's ready replicas).
    pub ready_routers: Option<i32>,
    /// Router pods that exist (the Deployment's replicas): the scale subresource's current
    /// replicas, which a HorizontalPodAutoscaler compares with `spec.router.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Label selector of the router pods (`key=value,...`), which a HorizontalPodAutoscaler uses
    /// to find their CPU and memory use through the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Hash of the rendered router config.
    pub config_hash: Option<String>,
}
