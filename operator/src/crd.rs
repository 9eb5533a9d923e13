//! The `ProgramScheduling` custom resource (`scheduling.program-router.dev/v1alpha1`).
//!
//! Owns the user-facing schema: which pods are vLLM workers, how their DP ranks are found, how the
//! router is deployed, and every Program scheduling field of the spec (camelCase, optional: an
//! omitted field takes the router's default). CEL rules reject what the schema alone cannot.
//! The router's own `ProgramSchedulingConfig` stays the source of truth for defaults and
//! validation; `crate::render::mapping` converts.

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements, SecretKeySelector};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

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
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Ranks","type":"integer","jsonPath":".status.ranks"}"#,
    printcolumn = r#"{"name":"Routers","type":"integer","jsonPath":".status.readyRouters"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
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
    #[x_kube(validation = kube::core::Rule::new("self in ['header', 'api_key', 'user']")
        .message("fairness.tenantSource must be header, api_key or user"))]
    pub tenant_source: Option<String>,
    pub tenant_header: Option<String>,
    pub default_tenant: Option<String>,
    #[x_kube(validation = kube::core::Rule::new("self in ['vtc', 'round_robin']")
        .message("fairness.discipline must be vtc or round_robin"))]
    pub discipline: Option<String>,
    /// Highest priority first.
    pub classes: Option<Vec<PriorityClassParams>>,
    pub class_header: Option<String>,
    pub default_class: Option<String>,
    pub tenant_classes: Option<std::collections::BTreeMap<String, String>>,
    /// Highest class a request may name (403 above it) unless its tenant has its own entry.
    pub max_class: Option<String>,
    /// Tenant → highest class its requests may name.
    pub tenant_max_classes: Option<std::collections::BTreeMap<String, String>>,
    pub tenant_weights: Option<std::collections::BTreeMap<String, f64>>,
    /// Tenant → quota (requests and tokens per minute); more gets 429 with Retry-After.
    pub tenant_rate_limits: Option<std::collections::BTreeMap<String, RateLimitParams>>,
    /// Quota of tenants without their own entry.
    pub default_rate_limit: Option<RateLimitParams>,
    pub input_weight: Option<f64>,
    pub output_weight: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("fairness.maxQueuePerTenant must be at least 1"))]
    pub max_queue_per_tenant: Option<u32>,
    pub queue_timeout_seconds: Option<f64>,
    pub metrics_max_age_seconds: Option<f64>,
    pub metrics_top_tenants: Option<u32>,
}

/// One tenant's quota (the router's `RateLimitConfig`); an absent field is unlimited.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitParams {
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("requestsPerMinute must be positive"))]
    pub requests_per_minute: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("tokensPerMinute must be positive"))]
    pub tokens_per_minute: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct PriorityClassParams {
    pub name: String,
    pub max_waiting_requests: Option<u32>,
    pub only_when_idle: Option<bool>,
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
    #[serde(default = "d::replicas")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("router.replicas must not be negative"))]
    pub replicas: i32,
    /// Router container resources. Absent: requests of 250m CPU and 256Mi memory and a 1Gi
    /// memory limit (no CPU limit, which would throttle the proxy), so router pods are never
    /// BestEffort; given: used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default = "d::port")]
    pub port: i32,
    #[serde(default = "d::metrics_port")]
    pub metrics_port: i32,
    /// Request-level policy for requests without Program identity.
    #[serde(default = "d::policy")]
    #[x_kube(validation = kube::core::Rule::new(
        "self in ['round_robin', 'random', 'consistent_hash', 'power_of_two', 'cache_aware']"
    ).message("router.policy must be round_robin, random, consistent_hash, power_of_two or cache_aware"))]
    pub policy: String,
    /// Service type of the router Service.
    #[serde(default = "d::service_type")]
    #[x_kube(validation = kube::core::Rule::new("self in ['ClusterIP', 'NodePort', 'LoadBalancer']")
        .message("router.serviceType must be ClusterIP, NodePort or LoadBalancer"))]
    pub service_type: String,
    /// Extra command-line arguments for program-router.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Service session affinity: `ClientIP` keeps a client on one router replica, so one
    /// scheduler sees all of a Program's requests when each agent is one client.
    #[serde(default = "d::session_affinity")]
    #[x_kube(validation = kube::core::Rule::new("self in ['None', 'ClientIP']")
        .message("router.sessionAffinity must be None or ClientIP"))]
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
    #[x_kube(validation = kube::core::Rule::new("self in ['vllm_xargs.agentic_context', 'auto']")
        .message("programSchedulingEnableKey must be vllm_xargs.agentic_context or auto"))]
    pub program_scheduling_enable_key: Option<String>,
    pub binding_only: Option<bool>,
    pub global_queue: Option<bool>,
    #[x_kube(validation = kube::core::Rule::new("self in ['mru', 'fcfs']").message("resumeOrder must be mru or fcfs"))]
    pub resume_order: Option<String>,
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("crossRankHeadroomRatio must be >= 0"))]
    pub cross_rank_headroom_ratio: Option<f64>,
    /// Extension: queue wait before a cross-rank move, as a multiple of the move's cost (the
    /// Program's cache-miss impact); 0 = move at once (the spec), 1 = break even; unset = 1 on
    /// 16 or more DP ranks, 0 below.
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("crossRankMinWaitRatio must be >= 0"))]
    pub cross_rank_min_wait_ratio: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new(
        "self in ['consistent_hash', 'program_round_robin', 'least_program_count', 'reasoning_token_balance', 'cache_aware']"
    ).message("bindingStrategy is not a known strategy"))]
    pub binding_strategy: Option<String>,
    pub hash_virtual_nodes: Option<u32>,
    #[x_kube(validation = kube::core::Rule::new("self > 0").message("tokenCapacityPerDpRank must be > 0"))]
    pub token_capacity_per_dp_rank: Option<u64>,
    pub max_active_programs_per_target: Option<u32>,
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("metricsIntervalSeconds must be > 0"))]
    pub metrics_interval_seconds: Option<f64>,
    pub admission_waiting_request_threshold: Option<u32>,
    pub queue_timeout_seconds: Option<f64>,
    pub force_resume_timeout_seconds: Option<f64>,
    pub paused_retention_ttl_seconds: Option<f64>,
    pub shared_prefix_freshness_warmup_seconds: Option<f64>,
    pub shared_prefix_freshness_kv_turnovers: Option<f64>,
    pub decode_buffer_tokens: Option<u64>,
    pub max_acting_ttl_seconds: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("highWatermarkRatio must be > 0"))]
    pub high_watermark_ratio: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new("self > 0.0").message("lowWatermarkRatio must be > 0"))]
    pub low_watermark_ratio: Option<f64>,
    pub max_segment_rounds: Option<u32>,
    pub stats_window_size: Option<u32>,
    pub enable_batch_gain_admission: Option<bool>,
    /// Extension: `rank` (each rank's own tool-interval window, the spec) or `pooled`.
    #[x_kube(validation = kube::core::Rule::new("self in ['rank', 'pooled']").message("ttlEvidence must be rank or pooled"))]
    pub ttl_evidence: Option<String>,
    /// Extension: samples before the automatic TTL acts (1..=statsWindowSize).
    #[x_kube(validation = kube::core::Rule::new("self >= 1").message("ttlMinSamples must be at least 1"))]
    pub ttl_min_samples: Option<u32>,
    /// Extension: multiple of the modelled drain time used as the force-resume deadline (0 =
    /// always forceResumeTimeoutSeconds).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("forceResumeWorkloadFactor must be >= 0"))]
    pub force_resume_workload_factor: Option<f64>,
    /// Extension: a paused Program idle for longer than this multiple of the longest observed
    /// completion-to-next-request interval counts as finished for `least_program_count`
    /// binding (0 = only `expected_resume: false` marks it).
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0").message("finishedIdleRatio must be >= 0"))]
    pub finished_idle_ratio: Option<f64>,
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
    pub prefill_cost_model: Option<PrefillCostModelParams>,
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
    pub intercept_seconds: Option<f64>,
    pub linear_seconds_per_1k_tokens: Option<f64>,
    pub quadratic_seconds_per_1k_tokens_squared: Option<f64>,
    #[x_kube(validation = kube::core::Rule::new("self >= 0.0 && self <= 1.0").message("decodeThroughputAlpha must be within [0, 1]"))]
    pub decode_throughput_alpha: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DecodeThroughputModelParams {
    pub fixed_step_seconds: Option<f64>,
    pub batch_step_seconds_per_request: Option<f64>,
    pub context_step_seconds_per_token: Option<f64>,
}

/// Observed state, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgramSchedulingStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[x_kube(merge_strategy = kube::core::ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// DP ranks currently routed to.
    pub ranks: Option<i32>,
    /// Router replicas that report the current config.
    pub ready_routers: Option<i32>,
    /// Hash of the rendered router config.
    pub config_hash: Option<String>,
}
