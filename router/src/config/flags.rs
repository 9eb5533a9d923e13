//! Flags: vllm-router-compatible flags plus ours, merged over the `--config` file.
//!
//! Owns flag definitions and the merge rule (flags override the file, on every reload too); the
//! command line around them (subcommands, `--help`) is [`crate::cli`]. It never starts anything.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{
    AgenticContextMode, ConfigError, LogFormat, PolicyKind, ProgramSchedulingConfig, RouterConfig,
    WorkerConfig,
};

/// Log levels as vllm-router spells them, plus `trace` and `warn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Warning,
    Error,
    Critical,
}

impl LogLevel {
    fn filter(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn | LogLevel::Warning => "warn",
            LogLevel::Error | LogLevel::Critical => "error",
        }
    }
}

/// Every flag is optional: a flag that is given overrides the file, one that is not leaves it.
#[derive(Debug, Default, Args)]
pub struct Flags {
    /// JSON RouterConfig file; watched and hot-reloaded (see `config schema`).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Address of the API listener. [config: host]
    #[arg(long)]
    pub host: Option<String>,
    /// Port of the API listener. [config: port]
    #[arg(long)]
    pub port: Option<u16>,
    /// Worker base URLs (each expands into --intra-node-data-parallel-size ranks); replaces the
    /// file's workers. [config: workers]
    #[arg(long, num_args = 1..)]
    pub worker_urls: Option<Vec<String>>,
    /// DP ranks behind each --worker-urls entry (each URL expands into ranks 0..N-1).
    /// [config: intra_node_data_parallel_size]
    #[arg(long)]
    pub intra_node_data_parallel_size: Option<u32>,
    /// Routing policy for requests without Program identity. [config: policy.kind]
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    /// Bearer token sent to workers. [config: api_key]
    #[arg(long, env = "PROGRAM_ROUTER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Bearer tokens clients must present (comma-separated in the environment variable);
    /// without it, clients must present --api-key when one is set. [config: client_api_keys]
    #[arg(
        long,
        num_args = 1..,
        env = "PROGRAM_ROUTER_CLIENT_API_KEYS",
        hide_env_values = true
    )]
    pub client_api_keys: Option<Vec<String>>,
    /// Directory of named client keys, one per file (a Secret volume); re-read every second.
    /// [config: client_api_keys_dir]
    #[arg(long, env = "PROGRAM_ROUTER_CLIENT_API_KEYS_DIR")]
    pub client_api_keys_dir: Option<String>,
    /// This replica's name in the config's `peers.members` (the operator passes the pod name);
    /// ignored without `peers`. [config: peers.self_name]
    #[arg(long, env = "PROGRAM_ROUTER_PEER_NAME")]
    pub peer_name: Option<String>,
    /// Address of the peer listener (router ↔ router). [config: peer_host]
    #[arg(long)]
    pub peer_host: Option<String>,
    /// Port of the peer listener, which serves only other router replicas holding the peer
    /// secret; `peers` needs it. [config: peer_port]
    #[arg(long, env = "PROGRAM_ROUTER_PEER_PORT")]
    pub peer_port: Option<u16>,
    /// File holding the secret the router replicas share and present to each other.
    /// [config: peer_secret_file]
    #[arg(long, env = "PROGRAM_ROUTER_PEER_SECRET_FILE")]
    pub peer_secret_file: Option<String>,
    /// Address of the metrics listener. [config: prometheus_host]
    #[arg(long)]
    pub prometheus_host: Option<String>,
    /// Port of the metrics listener (/metrics). [config: prometheus_port]
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    /// Whole-request deadline in seconds: 504 without response headers by then, a cut
    /// stream after. [config: limits.request_timeout_secs]
    #[arg(long)]
    pub request_timeout_secs: Option<f64>,
    /// Largest request body in bytes; larger gets 413. [config: limits.max_payload_size]
    #[arg(long)]
    pub max_payload_size: Option<u64>,
    /// On SIGTERM, seconds for requests in flight to finish. [config: limits.drain_timeout_secs]
    #[arg(long)]
    pub drain_timeout_secs: Option<f64>,
    /// Proxied requests in progress at once (as vllm-router's flag); more wait in a bounded
    /// queue. [config: limits.max_concurrent_requests]
    #[arg(long)]
    pub max_concurrent_requests: Option<u32>,
    /// Requests that may wait for a place beyond --max-concurrent-requests; more get 429.
    /// [config: limits.queue_size]
    #[arg(long)]
    pub queue_size: Option<u32>,
    /// Longest wait for a place, in seconds; then 504. [config: limits.queue_timeout_secs]
    #[arg(long)]
    pub queue_timeout_secs: Option<f64>,
    /// On SIGTERM, seconds to keep accepting with readiness false before draining.
    /// [config: limits.shutdown_delay_secs]
    #[arg(long)]
    pub shutdown_delay_secs: Option<f64>,
    /// I/O threads, each serving its own connections on a single-threaded runtime (default: one
    /// per core; 0: the shared multi-threaded runtime). [config: io_threads]
    #[arg(long)]
    pub io_threads: Option<u32>,
    /// cache_aware: follow the cache when the best prefix match covers more than this
    /// fraction of the prompt. [config: policy.cache_threshold]
    #[arg(long)]
    pub cache_threshold: Option<f64>,
    /// cache_aware: balance by load when max - min in-flight exceeds this...
    /// [config: policy.balance_abs_threshold]
    #[arg(long)]
    pub balance_abs_threshold: Option<u64>,
    /// ...and max > min x this. [config: policy.balance_rel_threshold]
    #[arg(long)]
    pub balance_rel_threshold: Option<f64>,
    /// cache_aware: prompt bytes remembered per target (LRU beyond).
    /// [config: policy.max_tree_size]
    #[arg(long)]
    pub max_tree_size: Option<u64>,
    /// Consecutive failed health checks that mark a backend unhealthy.
    /// [config: health.failure_threshold]
    #[arg(long)]
    pub health_failure_threshold: Option<u32>,
    /// Consecutive passed health checks that bring a backend back.
    /// [config: health.success_threshold]
    #[arg(long)]
    pub health_success_threshold: Option<u32>,
    /// Timeout of one health check, in seconds. [config: health.timeout_secs]
    #[arg(long)]
    pub health_check_timeout_secs: Option<f64>,
    /// Seconds between health checks (each base URL once, not per rank).
    /// [config: health.interval_secs]
    #[arg(long)]
    pub health_check_interval_secs: Option<f64>,
    /// Path of the health check. [config: health.endpoint]
    #[arg(long)]
    pub health_check_endpoint: Option<String>,
    /// Attempts in total; only connect errors and 503 answers are retried, before any byte
    /// reached the client. [config: retry.max_retries]
    #[arg(long)]
    pub retry_max_retries: Option<u32>,
    /// First retry backoff, in milliseconds. [config: retry.initial_backoff_ms]
    #[arg(long)]
    pub retry_initial_backoff_ms: Option<u64>,
    /// Retry backoff cap, in milliseconds. [config: retry.max_backoff_ms]
    #[arg(long)]
    pub retry_max_backoff_ms: Option<u64>,
    /// Backoff growth per attempt. [config: retry.backoff_multiplier]
    #[arg(long)]
    pub retry_backoff_multiplier: Option<f64>,
    /// Random jitter of each backoff, as a +- fraction. [config: retry.jitter_factor]
    #[arg(long)]
    pub retry_jitter_factor: Option<f64>,
    /// Same as --retry-max-retries 1.
    #[arg(long)]
    pub disable_retries: bool,
    /// Failures within the window that open a target's circuit.
    /// [config: circuit_breaker.failure_threshold]
    #[arg(long)]
    pub cb_failure_threshold: Option<u32>,
    /// Half-open successes that close it again. [config: circuit_breaker.success_threshold]
    #[arg(long)]
    pub cb_success_threshold: Option<u32>,
    /// Seconds an open circuit refuses before probing.
    /// [config: circuit_breaker.timeout_duration_secs]
    #[arg(long)]
    pub cb_timeout_duration_secs: Option<f64>,
    /// Failure-counting window, in seconds. [config: circuit_breaker.window_duration_secs]
    #[arg(long)]
    pub cb_window_duration_secs: Option<f64>,
    /// Turn the per-target circuit breakers off (config: circuit_breaker.enabled = false).
    #[arg(long)]
    pub disable_circuit_breaker: bool,
    /// How `vllm_xargs.agentic_context` is forwarded. [config: agentic_context]
    #[arg(long, value_enum)]
    pub agentic_context: Option<AgenticContextMode>,
    /// Seconds between polls of each backend's /metrics. [config: observation.interval_secs]
    #[arg(long)]
    pub metrics_interval_secs: Option<f64>,
    /// Log filter (vllm-router's warning and critical are accepted). [config: log_level]
    #[arg(long, value_enum)]
    pub log_level: Option<LogLevel>,
    /// Log line format. [config: log_format]
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// No access-log line per request. [config: access_log]
    #[arg(long)]
    pub no_access_log: bool,
    /// Export OpenTelemetry traces over OTLP/gRPC. [config: enable_trace]
    #[arg(long)]
    pub enable_trace: bool,
    /// OTLP/gRPC collector for traces (default http://localhost:4317). [config: otlp_traces_endpoint]
    #[arg(long)]
    pub otlp_traces_endpoint: Option<String>,
    /// Share of traces started here that are exported, 0..=1. [config: otel_sampling_ratio]
    #[arg(long)]
    pub otel_sampling_ratio: Option<f64>,
    /// Turn on Program scheduling (every field defaulted unless the JSON below overrides it).
    #[arg(long)]
    pub enable_program_scheduling: bool,
    /// JSON object overriding Program scheduling defaults; needs --enable-program-scheduling.
    #[arg(long)]
    pub program_scheduling_config_json: Option<String>,
}

/// Reads a RouterConfig file; errors name the file and the offending field path.
pub fn load_file(path: &Path) -> Result<RouterConfig, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| {
        ConfigError::new("--config", format!("cannot read {}: {e}", path.display()))
    })?;
    parse_config(&bytes)
        .map_err(|e| ConfigError::new(e.field, format!("{} (in {})", e.message, path.display())))
}

/// Parses RouterConfig JSON; the error's field is the JSON path of the problem.
pub fn parse_config(bytes: &[u8]) -> Result<RouterConfig, ConfigError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        // serde quotes the offending value; a key must not reach logs or `/status` that way.
        let message = if path.starts_with("api_key") || path.starts_with("client_api_keys") {
            "invalid value (not shown: it holds a key); `api_key` is a string, \
             `client_api_keys` a list of strings"
                .to_string()
        } else {
            e.into_inner().to_string()
        };
        ConfigError::new(if path == "." { "config".into() } else { path }, message)
    })
}

impl Flags {
    /// The effective configuration: `file` (or defaults) with every given flag applied, validated.
    pub fn effective(&self, file: Option<RouterConfig>) -> Result<RouterConfig, ConfigError> {
        let mut c = file.unwrap_or_default();
        macro_rules! set {
            ($flag:expr => $field:expr) => {
                if let Some(v) = $flag.clone() {
                    $field = v;
                }
            };
        }
        set!(self.host => c.host);
        set!(self.port => c.port);
        if let Some(n) = self.io_threads {
            c.io_threads = Some(n);
        }
        if let Some(urls) = &self.worker_urls {
            c.workers = urls
                .iter()
                .map(|u| WorkerConfig {
                    url: u.clone(),
                    dp_rank: None,
                })
                .collect();
        }
        set!(self.intra_node_data_parallel_size => c.intra_node_data_parallel_size);
        set!(self.policy => c.policy.kind);
        if let Some(k) = &self.api_key {
            c.api_key = Some(k.clone());
        }
        if let Some(keys) = &self.client_api_keys {
            // The one place a key list is split: commas or lines (a Secret may list one key per
            // line and end in a newline).
            let keys: Vec<String> = keys
                .iter()
                .flat_map(|k| k.split([',', '\n']))
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(String::from)
                .collect();
            if keys.is_empty() {
                // An empty Secret must not quietly turn client authentication off.
                return Err(ConfigError::new(
                    "--client-api-keys",
                    "no key given (to turn the check off on purpose, set `client_api_keys: []` \
                     in the configuration file)",
                ));
            }
            c.client_api_keys = Some(keys);
        }
        if let Some(d) = &self.client_api_keys_dir {
            c.client_api_keys_dir = Some(d.clone());
        }
        if let (Some(name), Some(peers)) = (&self.peer_name, c.peers.as_mut()) {
            peers.self_name = Some(name.clone());
        }
        set!(self.peer_host => c.peer_host);
        if let Some(p) = self.peer_port {
            c.peer_port = Some(p);
        }
        if let Some(f) = &self.peer_secret_file {
            c.peer_secret_file = Some(f.clone());
        }
        set!(self.prometheus_host => c.prometheus_host);
        if let Some(p) = self.prometheus_port {
            c.prometheus_port = Some(p);
        }
        set!(self.request_timeout_secs => c.limits.request_timeout_secs);
        set!(self.max_payload_size => c.limits.max_payload_size);
        set!(self.drain_timeout_secs => c.limits.drain_timeout_secs);
        set!(self.shutdown_delay_secs => c.limits.shutdown_delay_secs);
        if let Some(n) = self.max_concurrent_requests {
            c.limits.max_concurrent_requests = Some(n);
        }
        set!(self.queue_size => c.limits.queue_size);
        set!(self.queue_timeout_secs => c.limits.queue_timeout_secs);
        set!(self.cache_threshold => c.policy.cache_threshold);
        set!(self.balance_abs_threshold => c.policy.balance_abs_threshold);
        set!(self.balance_rel_threshold => c.policy.balance_rel_threshold);
        set!(self.max_tree_size => c.policy.max_tree_size);
        set!(self.health_failure_threshold => c.health.failure_threshold);
        set!(self.health_success_threshold => c.health.success_threshold);
        set!(self.health_check_timeout_secs => c.health.timeout_secs);
        set!(self.health_check_interval_secs => c.health.interval_secs);
        set!(self.health_check_endpoint => c.health.endpoint);
        set!(self.retry_max_retries => c.retry.max_retries);
        set!(self.retry_initial_backoff_ms => c.retry.initial_backoff_ms);
        set!(self.retry_max_backoff_ms => c.retry.max_backoff_ms);
        set!(self.retry_backoff_multiplier => c.retry.backoff_multiplier);
        set!(self.retry_jitter_factor => c.retry.jitter_factor);
        if self.disable_retries {
            c.retry.max_retries = 1;
        }
        set!(self.cb_failure_threshold => c.circuit_breaker.failure_threshold);
        set!(self.cb_success_threshold => c.circuit_breaker.success_threshold);
        set!(self.cb_timeout_duration_secs => c.circuit_breaker.timeout_duration_secs);
        set!(self.cb_window_duration_secs => c.circuit_breaker.window_duration_secs);
        if self.disable_circuit_breaker {
            c.circuit_breaker.enabled = false;
        }
        set!(self.agentic_context => c.agentic_context);
        set!(self.metrics_interval_secs => c.observation.interval_secs);
        if let Some(l) = self.log_level {
            c.log_level = l.filter().into();
        }
        set!(self.log_format => c.log_format);
        if self.no_access_log {
            c.access_log = false;
        }
        if self.enable_trace {
            c.enable_trace = true;
        }
        if let Some(e) = &self.otlp_traces_endpoint {
            c.otlp_traces_endpoint = Some(e.clone());
        }
        set!(self.otel_sampling_ratio => c.otel_sampling_ratio);
        match (
            &self.program_scheduling_config_json,
            self.enable_program_scheduling,
        ) {
            (Some(_), false) => {
                return Err(ConfigError::new(
                    "--program-scheduling-config-json",
                    "is only accepted together with --enable-program-scheduling",
                ));
            }
            (Some(json), true) => {
                let de = &mut serde_json::Deserializer::from_str(json);
                let ps: ProgramSchedulingConfig =
                    serde_path_to_error::deserialize(de).map_err(|e| {
                        let path = e.path().to_string();
                        let field = if path == "." {
                            "program_scheduling".to_string()
                        } else {
                            format!("program_scheduling.{path}")
                        };
                        ConfigError::new(field, e.into_inner().to_string())
                    })?;
                c.program_scheduling = Some(ps);
            }
            (None, true) => {
                if c.program_scheduling.is_none() {
                    c.program_scheduling = Some(ProgramSchedulingConfig::default());
                }
            }
            (None, false) => {}
        }
        c.validate()?;
        Ok(c)
    }

    /// Loads `--config` (if any) and applies the flags.
    pub fn load(&self) -> Result<RouterConfig, ConfigError> {
        let file = self.config.as_deref().map(load_file).transpose()?;
        self.effective(file)
    }

    /// The calibration coefficients the configuration as written leaves at their reference
    /// values ([`super::program::omitted_coefficients`]): from
    /// `--program-scheduling-config-json` when given (it replaces the file's object), else
    /// from `program_scheduling` in `--config`. For the startup warning only; call after
    /// [`Flags::load`] succeeded.
    pub fn omitted_coefficients(&self) -> Vec<String> {
        let written: Option<serde_json::Value> = match &self.program_scheduling_config_json {
            Some(json) => serde_json::from_str(json).ok(),
            None => self
                .config
                .as_deref()
                .and_then(|p| std::fs::read(p).ok())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|mut v| v.get_mut("program_scheduling").map(serde_json::Value::take)),
        };
        super::program::omitted_coefficients(written.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags alone, as the binary's command line parses them.
    #[derive(clap::Parser)]
    struct Line {
        #[command(flatten)]
        flags: Flags,
    }

    fn flags(args: &[&str]) -> Flags {
        let mut v = vec!["program-router"];
        v.extend_from_slice(args);
        <Line as clap::Parser>::try_parse_from(v)
            .expect("parse")
            .flags
    }

    #[test]
    fn the_calibration_warning_reads_the_coefficients_as_written() {
        // Enabled with no JSON: all seven at reference values.
        assert_eq!(
            flags(&["--enable-program-scheduling"])
                .omitted_coefficients()
                .len(),
            7
        );
        // The flag's JSON, even with values equal to the reference ones.
        let json = r#"{"prefill_cost_model":{"decode_throughput_alpha":0.15},
            "decode_throughput_model":{"fixed_step_seconds":0.02}}"#;
        let f = flags(&[
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            json,
        ]);
        let omitted = f.omitted_coefficients();
        assert_eq!(omitted.len(), 5, "{omitted:?}");
        assert!(!omitted.iter().any(|o| o.ends_with("alpha")), "{omitted:?}");
        // The file's object; the flag's JSON replaces it.
        let file = tempfile::NamedTempFile::new().expect("temp file");
        let all: serde_json::Map<String, serde_json::Value> = super::super::program::COEFFICIENTS
            .iter()
            .fold(serde_json::Map::new(), |mut m, (model, field)| {
                let entry = m.entry(*model).or_insert_with(|| serde_json::json!({}));
                entry[*field] = serde_json::json!(0.01);
                m
            });
        let cfg = serde_json::json!({"program_scheduling": all});
        std::fs::write(file.path(), cfg.to_string()).expect("write");
        let path = file.path().to_str().expect("utf-8 path");
        let f = flags(&["--config", path]);
        f.load().expect("valid file");
        assert!(f.omitted_coefficients().is_empty());
        let f = flags(&[
            "--config",
            path,
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            json,
        ]);
        assert_eq!(f.omitted_coefficients().len(), 5);
    }

    #[test]
    fn client_keys_split_on_commas_and_lines_and_an_empty_list_is_refused() {
        let c = flags(&["--client-api-keys", "a,b", "c\nd\n"])
            .effective(None)
            .expect("valid");
        assert_eq!(
            c.client_api_keys,
            Some(vec!["a".into(), "b".into(), "c".into(), "d".into()])
        );
        let e = flags(&["--client-api-keys", " ,\n"])
            .effective(None)
            .expect_err("empty");
        assert_eq!(e.field, "--client-api-keys");
    }

    #[test]
    fn a_mistyped_key_is_not_quoted_in_the_error() {
        for (doc, field) in [
            (r#"{"client_api_keys": "sk-secret-1"}"#, "client_api_keys"),
            (r#"{"api_key": ["sk-secret-1"]}"#, "api_key"),
        ] {
            let e = parse_config(doc.as_bytes()).expect_err(doc);
            assert_eq!(e.field, field);
            assert!(!e.to_string().contains("sk-secret-1"), "{e}");
        }
        let e = parse_config(br#"{"log_level": 5}"#).expect_err("type");
        assert!(e.message.contains("invalid type"), "{e}");
    }

    #[test]
    fn a_mistyped_program_scheduling_field_is_named_by_its_path() {
        for field in ["hold_free_admission_by_kind", "resume_most_turns_first"] {
            let doc = format!(r#"{{"program_scheduling": {{"{field}": "yes"}}}}"#);
            let e = parse_config(doc.as_bytes()).expect_err("a string for a bool");
            assert_eq!(e.field, format!("program_scheduling.{field}"));
            assert!(e.message.contains("expected a boolean"), "{e}");
        }
    }

    #[test]
    fn vllm_router_flags_are_accepted() {
        let c = flags(&[
            "--host",
            "0.0.0.0",
            "--port",
            "3001",
            "--worker-urls",
            "http://w0:8000",
            "http://w1:8000",
            "--intra-node-data-parallel-size",
            "2",
            "--policy",
            "consistent_hash",
            "--api-key",
            "k",
            "--prometheus-host",
            "0.0.0.0",
            "--prometheus-port",
            "29000",
            "--request-timeout-secs",
            "60",
            "--max-payload-size",
            "1000",
            "--health-check-interval-secs",
            "5",
            "--retry-max-retries",
            "3",
            "--cb-failure-threshold",
            "4",
            "--disable-circuit-breaker",
            "--log-level",
            "warning",
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            r#"{"global_queue":true}"#,
        ])
        .effective(None)
        .expect("valid");
        assert_eq!(c.targets().len(), 4);
        assert_eq!(c.policy.kind, PolicyKind::ConsistentHash);
        assert_eq!(c.log_level, "warn");
        assert!(!c.circuit_breaker.enabled);
        assert!(c.program_scheduling.expect("enabled").global_queue);
    }

    #[test]
    fn flags_override_the_file() {
        let file = parse_config(br#"{"port": 1234, "policy": {"kind": "random"}, "workers": [{"url": "http://a:1", "dp_rank": 3}]}"#)
            .expect("file");
        let c = flags(&["--port", "999"])
            .effective(Some(file))
            .expect("valid");
        assert_eq!(c.port, 999);
        assert_eq!(c.policy.kind, PolicyKind::Random);
        assert_eq!(c.targets()[0].id(), "http://a:1@3");
    }

    #[test]
    fn program_json_without_the_switch_names_both_flags() {
        let e = flags(&["--program-scheduling-config-json", "{}"])
            .effective(None)
            .expect_err("error");
        assert!(e.to_string().contains("--program-scheduling-config-json"));
        assert!(e.to_string().contains("--enable-program-scheduling"));
    }

    #[test]
    fn enable_alone_uses_every_default() {
        let c = flags(&["--enable-program-scheduling"])
            .effective(None)
            .expect("valid");
        assert_eq!(
            c.program_scheduling,
            Some(ProgramSchedulingConfig::default())
        );
        assert_eq!(
            flags(&[])
                .effective(None)
                .expect("valid")
                .program_scheduling,
            None
        );
    }

    #[test]
    fn json_errors_name_the_nested_field() {
        let e = flags(&[
            "--enable-program-scheduling",
            "--program-scheduling-config-json",
            r#"{"prefill_cost_model":{"intercept_seconds":"x"}}"#,
        ])
        .effective(None)
        .expect_err("type error");
        assert_eq!(
            e.field,
            "program_scheduling.prefill_cost_model.intercept_seconds"
        );
        let e = parse_config(br#"{"limits":{"max_payload_size":-1}}"#).expect_err("negative");
        assert_eq!(e.field, "limits.max_payload_size");
    }
}
