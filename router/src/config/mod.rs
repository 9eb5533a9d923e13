//! The router's typed configuration: defaults, validation, targets, and its content hash.
//!
//! Owns `RouterConfig` (the JSON accepted by `--config`, with a JSON Schema) and the rules that make
//! it valid; flag merging lives in [`flags`], file watching in [`watch`]. Every error names the field.

pub mod fairness;
pub mod flags;
pub mod peers;
pub mod program;
mod validate;
pub mod watch;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use fairness::FairnessConfig;
pub use program::ProgramSchedulingConfig;

/// An invalid configuration value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// One backend endpoint: a vLLM API server URL and, optionally, the GLOBAL DP rank to pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// GLOBAL DP rank sent as `X-data-parallel-rank`. Without it the URL expands into ranks
    /// `0..intra_node_data_parallel_size` (or one unpinned target when that size is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
}

/// Request-level policy for requests without Program identity.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    RoundRobin,
    Random,
    ConsistentHash,
    PowerOfTwo,
    #[default]
    CacheAware,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::ConsistentHash => "consistent_hash",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::CacheAware => "cache_aware",
        }
    }
}

/// Policy selection and the cache-aware policy's knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
    /// cache_aware: minimum matched fraction of the prompt to follow the cache.
    pub cache_threshold: f64,
    /// cache_aware: balance when max_load − min_load > this ...
    pub balance_abs_threshold: u64,
    /// ... and max_load > min_load × this.
    pub balance_rel_threshold: f64,
    /// cache_aware: prompt bytes remembered per target (memory bound).
    pub max_tree_size: u64,
    /// consistent_hash: virtual nodes per target.
    pub virtual_nodes: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::default(),
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_size: 32 * 1024 * 1024,
            virtual_nodes: 160,
        }
    }
}

/// What happens to `vllm_xargs.agentic_context` on its way to the backend.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum AgenticContextMode {
    /// Remove it (stock vLLM rejects a nested object in `vllm_xargs`).
    #[default]
    Strip,
    /// Forward it as a JSON string (accepted by stock vLLM).
    JsonString,
    /// Forward it unchanged (engines that understand Program context).
    Passthrough,
}

/// Backend health checks (per base URL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    pub failure_threshold: u32,
    pub success_threshold: u32,
    pub timeout_secs: f64,
    pub interval_secs: f64,
    pub endpoint: String,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            failure_threshold: 3,
            success_threshold: 2,
            timeout_secs: 5.0,
            interval_secs: 60.0,
            endpoint: "/health".into(),
        }
    }
}

/// Retries of requests that failed before any byte reached the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in total, the first included (1 = no retry).
    pub max_retries: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub backoff_multiplier: f64,
    pub jitter_factor: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 5,
            initial_backoff_ms: 50,
            max_backoff_ms: 30_000,
            backoff_multiplier: 1.5,
            jitter_factor: 0.2,
        }
    }
}

/// Circuit breaker per target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitBreakerConfig {
    pub enabled: bool,
    /// Failures within the window that open the circuit.
    pub failure_threshold: u32,
    /// Successes in half-open state that close it again.
    pub success_threshold: u32,
    /// How long an open circuit rejects before probing (half-open).
    pub timeout_duration_secs: f64,
    /// Window over which failures are counted.
    pub window_duration_secs: f64,
}

impl Default for CircuitBreakerConfig {
    fn default() -> Self {
        CircuitBreakerConfig {
            enabled: true,
            failure_threshold: 10,
            success_threshold: 3,
            timeout_duration_secs: 60.0,
            window_duration_secs: 120.0,
        }
    }
}

/// Limits and timeouts of the data plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest accepted request body (413 above).
    pub max_payload_size: u64,
    /// Longest a request may take, response headers and body together (504 before headers).
    pub request_timeout_secs: f64,
    /// On SIGTERM, how long in-flight requests may take to finish.
    pub drain_timeout_secs: f64,
    /// On SIGTERM, how long to keep accepting with readiness false before the drain, while
    /// load balancers (Kubernetes endpoints) stop sending new connections.
    pub shutdown_delay_secs: f64,
    /// Longest a client connection may take to deliver a request's headers, counted from when
    /// the router starts waiting for them: on a new connection from the accept, on a kept-alive
    /// one from the previous response (so it is also the idle keep-alive timeout). The
    /// connection is closed after it. `null`: no limit.
    pub client_header_timeout_secs: Option<f64>,
    /// Proxied requests in progress at once (waiting in the router's own queues included);
    /// `null`: no cap. vllm-router's `--max-concurrent-requests`.
    pub max_concurrent_requests: Option<u32>,
    /// Requests that may wait for a place beyond the cap; more get 429 (0: no waiting).
    pub queue_size: u32,
    /// Longest wait for a place; then 504 `queue_timeout`.
    pub queue_timeout_secs: f64,
    /// Longest an upstream may send nothing once its response body has begun: the stream then
    /// ends with an error event (a cut for non-streamed bodies) and counts as a failure of that
    /// backend for its circuit breaker. `null`: no limit (the request deadline still applies).
    pub upstream_idle_timeout_secs: Option<f64>,
    /// Longest a client may take to send a request's body once its headers arrived; then 408
    /// `body_timeout`. `null`: no limit.
    pub client_body_timeout_secs: Option<f64>,
    /// How often an HTTP/2 client connection is pinged; a ping unanswered for 20 s closes it
    /// (a client that vanished). `null`: no pings.
    pub http2_keep_alive_interval_secs: Option<f64>,
    /// Longest a client connection may stay open with no request in progress (HTTP/1 and
    /// HTTP/2); it is then closed gracefully. `null`: no limit.
    pub client_idle_timeout_secs: Option<f64>,
    /// Client connections the API listener holds at once; one more is closed as soon as it is
    /// accepted (`program_router_connections_shed_total{listener="api"}`). `null`: no cap.
    pub max_client_connections: Option<u32>,
    /// Request bytes the router holds in memory at once (bodies read and not yet answered:
    /// waiting in its queues or in flight); a request whose body would pass it gets 503
    /// `overloaded` with `Retry-After`, before its body is read when it declares its length.
    /// At least `max_payload_size`. `null`: no budget.
    pub max_buffered_bytes: Option<u64>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_payload_size: 64 * 1024 * 1024,
            request_timeout_secs: 1800.0,
            drain_timeout_secs: 30.0,
            shutdown_delay_secs: 0.0,
            client_header_timeout_secs: Some(60.0),
            max_concurrent_requests: None,
            queue_size: 100,
            queue_timeout_secs: 60.0,
            upstream_idle_timeout_secs: Some(120.0),
            client_body_timeout_secs: Some(60.0),
            http2_keep_alive_interval_secs: Some(30.0),
            client_idle_timeout_secs: Some(300.0),
            max_client_connections: Some(10_000),
            max_buffered_bytes: Some(256 * 1024 * 1024),
        }
    }
}

/// Polling of each backend's `/metrics` (waiting/running/KV usage per rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ObservationConfig {
    /// Poll interval; an observation older than 3 intervals is stale.
    pub interval_secs: f64,
}

impl Default for ObservationConfig {
    fn default() -> Self {
        ObservationConfig { interval_secs: 1.0 }
    }
}

/// Log output.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The whole router configuration (`--config FILE`, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    pub host: String,
    pub port: u16,
    /// I/O threads: each accepts and serves its own client connections on a single-threaded
    /// runtime, and keeps every request and its upstream connection on that thread; `null` =
    /// one per core the process may use. 0 serves connections on the shared work-stealing
    /// runtime instead (`TOKIO_WORKER_THREADS` threads), which spreads one client's HTTP/2
    /// streams over cores. Needs a restart to change.
    pub io_threads: Option<u32>,
    /// Prometheus listener; `null` port disables it.
    pub prometheus_host: String,
    pub prometheus_port: Option<u16>,
    /// Address of the peer listener (router ↔ router traffic of `peers`).
    pub peer_host: String,
    /// Port of the peer listener, which serves only other router replicas (`/peers/*`, Program
    /// requests they hand over, diagnostics they gather) and answers only requests that carry
    /// the peer credential (`peer_secret_file`). `null`: no peer listener; `peers` needs one.
    /// Needs a restart to change.
    pub peer_port: Option<u16>,
    /// File holding the peer credential: a secret of at least 32 printable ASCII characters
    /// that every replica of one fleet shares (the operator generates one per
    /// ProgramScheduling). Required with `peer_port`; read at start (a restart picks up a new
    /// one). Clients' keys and `api_key` never authorize peer operations.
    pub peer_secret_file: Option<String>,
    pub workers: Vec<WorkerConfig>,
    /// DP ranks behind each worker URL that has no explicit `dp_rank`.
    pub intra_node_data_parallel_size: u32,
    /// Bearer token sent to workers (proxied requests, health checks and `/metrics` polls).
    pub api_key: Option<String>,
    /// Bearer tokens clients must present on the proxied routes (`/v1/*` and vLLM's own
    /// request endpoints). `null`: clients must present `api_key` when one is set (vLLM's own
    /// rule, and vllm-router's), nothing otherwise. `[]`: no check, even with `api_key`: every
    /// client reaches the workers with the router's key (only behind a gateway that
    /// authenticates).
    pub client_api_keys: Option<Vec<String>>,
    /// Directory of named client keys, one per file (a Kubernetes Secret mounted as a volume):
    /// the file name names the client (fair queueing's `api_key` tenant), the trimmed content is
    /// the key. Re-read every second, so keys rotate without a restart. With it, clients present
    /// one of its keys or of `client_api_keys`, never `api_key`.
    pub client_api_keys_dir: Option<String>,
    pub policy: PolicyConfig,
    pub agentic_context: AgenticContextMode,
    /// Ask the backend for usage on streamed requests so the router can account tokens; the extra
    /// usage chunk is removed before it reaches a client that did not ask for it.
    pub inject_stream_usage: bool,
    pub limits: LimitsConfig,
    pub health: HealthConfig,
    pub retry: RetryConfig,
    pub circuit_breaker: CircuitBreakerConfig,
    pub observation: ObservationConfig,
    /// Program scheduling; absent or null = disabled.
    pub program_scheduling: Option<ProgramSchedulingConfig>,
    /// Fair multi-tenant queueing; absent or null = disabled.
    pub fairness: Option<FairnessConfig>,
    /// Router replicas that forward each Program's requests to one owner replica (extension);
    /// absent or null = every replica schedules the Programs it sees.
    pub peers: Option<peers::PeersConfig>,
    pub log_level: String,
    pub log_format: LogFormat,
    /// One `info` line per request when its response ends (target `access`: request id, route,
    /// status, tenant, Program, target, queue wait, tokens, duration). Applied on reload.
    pub access_log: bool,
    /// Export OpenTelemetry traces of requests (vllm-router's `--enable-trace`): spans for
    /// admission, queue waits, each upstream attempt and the relay, continuing the client's W3C
    /// `traceparent` and passing each attempt's own to the backend. Needs a restart to change.
    pub enable_trace: bool,
    /// The OTLP/gRPC collector traces go to; `null` = `http://localhost:4317`, as vllm-router.
    /// Needs a restart to change.
    pub otlp_traces_endpoint: Option<String>,
    /// Share (0..=1) of the traces that start at the router that are exported; a client's
    /// sampled `traceparent` is always followed. Needs a restart to change.
    pub otel_sampling_ratio: f64,
}

/// The collector traces go to when `otlp_traces_endpoint` is unset (vllm-router's default).
pub const DEFAULT_OTLP_TRACES_ENDPOINT: &str = "http://localhost:4317";

/// More I/O threads than this is a typo, not a machine.
pub const MAX_IO_THREADS: u32 = 1024;
/// DP ranks behind one URL: more is a typo, and each becomes a target with its own state.
pub const MAX_DP_PER_URL: u32 = 1024;
/// Ring points per target: the ring holds targets × this many entries, built at every reload.
pub const MAX_VIRTUAL_NODES: u32 = 10_000;

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            host: "127.0.0.1".into(),
            port: 30000,
            io_threads: None,
            prometheus_host: "127.0.0.1".into(),
            prometheus_port: Some(29000),
            peer_host: "127.0.0.1".into(),
            peer_port: None,
            peer_secret_file: None,
            workers: Vec::new(),
            intra_node_data_parallel_size: 1,
            api_key: None,
            client_api_keys: None,
            client_api_keys_dir: None,
            policy: PolicyConfig::default(),
            agentic_context: AgenticContextMode::default(),
            inject_stream_usage: true,
            limits: LimitsConfig::default(),
            health: HealthConfig::default(),
            retry: RetryConfig::default(),
            circuit_breaker: CircuitBreakerConfig::default(),
            observation: ObservationConfig::default(),
            program_scheduling: None,
            fairness: None,
            peers: None,
            log_level: "info".into(),
            log_format: LogFormat::default(),
            access_log: true,
            enable_trace: false,
            otlp_traces_endpoint: None,
            otel_sampling_ratio: 1.0,
        }
    }
}

/// A concrete routing target: a base URL and the GLOBAL DP rank pinned on it (if any).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetSpec {
    pub url: String,
    pub dp_rank: Option<u32>,
}

impl TargetSpec {
    /// Stable id, as vllm-router names targets: `url@rank`, or the URL alone.
    pub fn id(&self) -> String {
        match self.dp_rank {
            Some(r) => format!("{}@{r}", self.url),
            None => self.url.clone(),
        }
    }
}

/// Longest value any `*_secs` or `*_seconds` field may hold: a year. More is a typo (or a way
/// of saying "never"), and would overflow the clocks it is added to.
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// `secs` as a `Duration`, clamped to `0..=MAX_SECONDS` (NaN: zero): no conversion at run time
/// can panic, whatever a caller computed.
pub fn duration(secs: f64) -> std::time::Duration {
    if secs.is_nan() {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::from_secs_f64(secs.clamp(0.0, MAX_SECONDS))
}

/// Configuration fields that hold secrets: no hash, document or log line derives from them.
pub const SECRET_FIELDS: [&str; 2] = ["api_key", "client_api_keys"];

/// Hash of a configuration file (hex), as `/status` reports it in `config.file_hash`: what an
/// operator that wrote the file compares against. The exact bytes of a file without secrets
/// (the operator never writes one); a file with a secret field hashes as its JSON without those
/// fields, so the hash cannot be used to test guesses of a key.
pub fn file_hash(bytes: &[u8]) -> String {
    match without_secrets(bytes) {
        Some(m) => plain_hash(&serde_json::to_vec(&m).unwrap_or_default()),
        None => plain_hash(bytes),
    }
}

fn plain_hash(bytes: &[u8]) -> String {
    format!("{:016x}", crate::hash::fnv1a(bytes))
}

/// The file as a JSON object without its secret fields, when it has any.
fn without_secrets(bytes: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let serde_json::Value::Object(mut m) = serde_json::from_slice(bytes).ok()? else {
        return None;
    };
    let mut had = false;
    for f in SECRET_FIELDS {
        had |= m.remove(f).is_some();
    }
    had.then_some(m)
}

/// `config.settings_hash`: [`file_hash`] of the file without its `peers` section, so an operator
/// can tell a router that runs every setting it wrote from one still missing a setting, while
/// the member list (which changes with every router pod) is still on its way. A file that is not
/// a JSON object hashes whole.
pub fn settings_hash(bytes: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(serde_json::Value::Object(mut m)) => {
            m.remove("peers");
            for f in SECRET_FIELDS {
                m.remove(f);
            }
            let canonical = serde_json::to_vec(&m).unwrap_or_default();
            plain_hash(&canonical)
        }
        _ => plain_hash(bytes),
    }
}

impl RouterConfig {
    /// The I/O threads to start: `io_threads`, or one per core the process may use.
    pub fn resolved_io_threads(&self) -> usize {
        self.io_threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| n as usize,
        )
    }

    /// Expands `workers` into concrete targets (sorted, for a stable order).
    pub fn targets(&self) -> Vec<TargetSpec> {
        let mut out = Vec::new();
        for w in &self.workers {
            let url = w.url.trim_end_matches('/').to_string();
            match (w.dp_rank, self.intra_node_data_parallel_size) {
                (Some(r), _) => out.push(TargetSpec {
                    url,
                    dp_rank: Some(r),
                }),
                (None, 1) => out.push(TargetSpec { url, dp_rank: None }),
                (None, n) => out.extend((0..n).map(|r| TargetSpec {
                    url: url.clone(),
                    dp_rank: Some(r),
                })),
            }
        }
        out.sort();
        out
    }

    /// Content hash of the effective configuration without its keys ([`SECRET_FIELDS`]; hex),
    /// reported on `/status`: two configurations that differ only in their keys hash alike.
    pub fn hash(&self) -> String {
        let mut shown = self.clone();
        shown.api_key = None;
        shown.client_api_keys = None;
        plain_hash(&serde_json::to_vec(&shown).unwrap_or_default())
    }

    /// The JSON Schema of the configuration file.
    pub fn schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(RouterConfig)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
