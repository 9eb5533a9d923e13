//! The router's own Prometheus series, named like vllm-router's where the meaning matches.
//!
//! Owns the registry and metric handles. Labels are bounded: `route` (a fixed set), `worker` (the
//! configured targets; removed when a target is removed), `outcome`/`error`/`class` (enums).

use std::sync::Arc;

use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use super::sharded::{Family, ShardedCounter, ShardedHistogram};

/// All router metrics.
pub struct Metrics {
    pub registry: Registry,
    /// Written on every request: per thread ([`super::sharded`]).
    requests: Arc<Family<ShardedCounter>>,
    request_duration: Arc<Family<ShardedHistogram>>,
    pub request_errors: IntCounterVec,
    pub retries: IntCounterVec,
    upstream_responses: Arc<Family<ShardedCounter>>,
    /// Set from each target's count of requests in flight when scraped.
    pub running: IntGaugeVec,
    pub worker_health: IntGaugeVec,
    pub cb_state: IntGaugeVec,
    cb_outcomes: Arc<Family<ShardedCounter>>,
    pub active_workers: IntGauge,
    tokens: Arc<Family<ShardedCounter>>,
    pub ttfb: Arc<ShardedHistogram>,
    /// Generation requests (chat, completions, messages, responses), received to finished.
    pub generate_duration: Arc<ShardedHistogram>,
    pub config_reloads: IntCounterVec,
    /// The cap on requests in progress (`limits.max_concurrent_requests`), read at scrape time.
    pub concurrency_limit: IntGauge,
    pub concurrency_in_progress: IntGauge,
    pub concurrency_waiting: IntGauge,
    /// Connections closed on accept because their listener was at its cap, by listener.
    pub connections_shed: IntCounterVec,
    /// Open connections by listener (set when scraped).
    pub connections_open: IntGaugeVec,
    /// Request bytes held in memory (set when scraped), and requests refused for the budget.
    pub buffered_bytes: IntGauge,
    pub buffered_bytes_shed: IntCounter,
    /// Requests held before any backend has them, by model and stage.
    pub backlog: super::backlog::Backlog,
    /// Log lines dropped because the log writer's queue was full (brought up to date when
    /// scraped).
    pub log_lines_dropped: IntCounter,
    routes: Vec<(&'static str, RouteMetrics)>,
}

/// The `route` label values (a closed set).
pub const ROUTES: [&str; 12] = [
    "/health",
    "/readiness",
    "/status",
    "/scheduling/diagnostics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/other",
    "vllm_api",
    "other",
];

/// Per-route handles, resolved once.
#[derive(Clone)]
pub struct RouteMetrics {
    pub requests: Arc<ShardedCounter>,
    pub duration: Arc<ShardedHistogram>,
    pub retries: IntCounter,
}

/// The request and upstream-header histograms' bucket bounds, in seconds.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 240.0,
];

/// Registers `m` with `registry` and returns it: the one way every metric of the router is
/// created, so a name registered twice fails at start with the registry's error.
pub fn register<M>(registry: &Registry, m: M) -> Result<M, prometheus::Error>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(m.clone()))?;
    Ok(m)
}

/// `counter` with a series at 0 for each value of its one label: a rate, a dashboard panel or
/// an alert then sees 0 instead of no series until the first event.
pub fn with_zeros(counter: IntCounterVec, values: &[&str]) -> IntCounterVec {
    for v in values {
        counter.with_label_values(&[v]);
    }
    counter
}

/// vllm-router's buckets for `vllm_router_generate_duration_seconds`.
const GENERATE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 240.0,
];

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        Ok(Metrics {
            requests: Family::new(
                "vllm_router_requests_total",
                "Requests received, by route.",
                &["route"],
                ShardedCounter::default,
            )?
            .register(&registry)?,
            request_duration: Family::new(
                "vllm_router_request_duration_seconds",
                "Time from request received to response finished, by route.",
                &["route"],
                || ShardedHistogram::new(DURATION_BUCKETS),
            )?
            .register(&registry)?,
            request_errors: register(&registry, IntCounterVec::new(
                Opts::new(
                    "vllm_router_request_errors_total",
                    "Requests answered with a router error, by route and error."
                ),
                &["route", "error"]
            )?)?,
            retries: register(&registry, IntCounterVec::new(
                Opts::new(
                    "vllm_router_retries_total",
                    "Upstream attempts retried on another attempt, by route."
                ),
                &["route"]
            )?)?,
            upstream_responses: Family::new(
                "vllm_router_upstream_responses_total",
                "Upstream responses by worker and status class.",
                &["worker", "class"],
                ShardedCounter::default,
            )?
            .register(&registry)?,
            running: register(&registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_running_requests",
                    "Requests in flight to each worker."
                ),
                &["worker"]
            )?)?,
            worker_health: register(&registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_worker_health",
                    "1 when the worker passes health checks."
                ),
                &["worker"]
            )?)?,
            cb_state: register(&registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_cb_state",
                    "Circuit breaker state: 0 closed, 1 open, 2 half-open."
                ),
                &["worker"]
            )?)?,
            cb_outcomes: Family::new(
                "vllm_router_cb_outcomes_total",
                "Outcomes recorded by each worker's circuit breaker.",
                &["worker", "outcome"],
                ShardedCounter::default,
            )?
            .register(&registry)?,
            active_workers: register(&registry, IntGauge::new(
                "vllm_router_active_workers",
                "Configured targets."
            )?)?,
            tokens: Family::new(
                "vllm_router_tokens_total",
                "Tokens reported in upstream usage, by worker and kind.",
                &["worker", "kind"],
                ShardedCounter::default,
            )?
            .register(&registry)?,
            generate_duration: Family::new(
                "vllm_router_generate_duration_seconds",
                "Time from a generation request received to its response finished.",
                &[],
                || ShardedHistogram::new(GENERATE_BUCKETS),
            )?
            .register(&registry)?
            .with_values(&[]),
            ttfb: Family::new(
                "vllm_router_upstream_header_seconds",
                "Time from dispatch to upstream response headers (time to first byte).",
                &[],
                || ShardedHistogram::new(DURATION_BUCKETS),
            )?
            .register(&registry)?
            .with_values(&[]),
            config_reloads: register(&registry, with_zeros(IntCounterVec::new(
                Opts::new(
                    "vllm_router_config_reloads_total",
                    "Configuration reloads by result."
                ),
                &["result"]
            )?, &["applied", "rejected"]))?,
            concurrency_limit: register(&registry, IntGauge::new(
                "program_router_concurrency_limit",
                "The cap on proxied requests in progress (limits.max_concurrent_requests); 0: none."
            )?)?,
            concurrency_in_progress: register(&registry, IntGauge::new(
                "program_router_concurrency_in_progress",
                "Proxied requests holding one of the cap's places (0 without a cap)."
            )?)?,
            concurrency_waiting: register(&registry, IntGauge::new(
                "program_router_concurrency_waiting",
                "Requests waiting for one of the cap's places (at most limits.queue_size)."
            )?)?,
            connections_shed: register(&registry, IntCounterVec::new(
                Opts::new(
                    "program_router_connections_shed_total",
                    "Connections closed as soon as they were accepted because their listener \
                     held its cap (api: limits.max_client_connections; peer: 1024; metrics: 64), \
                     by listener. No request was read from them."
                ),
                &["listener"]
            )?)?,
            buffered_bytes: register(&registry, IntGauge::new(
                "program_router_buffered_request_bytes",
                "Request body bytes the router holds in memory now (waiting in its queues or in \
                 flight; limits.max_buffered_bytes)."
            )?)?,
            buffered_bytes_shed: register(&registry, IntCounter::new(
                "program_router_buffered_bytes_shed_total",
                "Requests refused with 503 overloaded because their body would have passed \
                 limits.max_buffered_bytes."
            )?)?,
            connections_open: register(&registry, IntGaugeVec::new(
                Opts::new(
                    "program_router_connections_open",
                    "Open client connections of the API listener and of the peer listener."
                ),
                &["listener"]
            )?)?,
            backlog: super::backlog::Backlog::new(&registry)?,
            log_lines_dropped: register(&registry, IntCounter::new(
                "program_router_log_lines_dropped_total",
                "Log lines (access lines included) dropped because 4 MiB of lines were already \
                 waiting for the log writer: stderr is slower than the router logs."
            )?)?,
            routes: Vec::new(),
            registry,
        }
        .with_routes())
    }

    fn with_routes(mut self) -> Self {
        self.routes = ROUTES
            .iter()
            .map(|r| {
                (
                    *r,
                    RouteMetrics {
                        requests: self.requests.with_values(&[r]),
                        duration: self.request_duration.with_values(&[r]),
                        retries: self.retries.with_label_values(&[r]),
                    },
                )
            })
            .collect();
        self
    }

    /// Handles of `route` (one of [`ROUTES`]; anything else counts as `other`).
    pub fn route(&self, route: &str) -> &RouteMetrics {
        let i = self
            .routes
            .iter()
            .position(|(r, _)| *r == route)
            .unwrap_or(self.routes.len() - 1);
        &self.routes[i].1
    }

    /// Forgets every series of a removed target.
    pub fn remove_worker(&self, worker: &str) {
        let _ = self.running.remove_label_values(&[worker]);
        let _ = self.worker_health.remove_label_values(&[worker]);
        let _ = self.cb_state.remove_label_values(&[worker]);
        for outcome in ["success", "failure"] {
            self.cb_outcomes.remove(&[worker, outcome]);
        }
        for class in ["2xx", "4xx", "5xx", "other"] {
            self.upstream_responses.remove(&[worker, class]);
        }
        for kind in ["prompt", "cached", "completion"] {
            self.tokens.remove(&[worker, kind]);
        }
    }

    /// Text exposition.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(8192);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        buf
    }
}

/// Per-target handles, resolved once so the request path does no label lookups.
#[derive(Clone)]
pub struct TargetMetrics {
    pub running: IntGauge,
    pub health: IntGauge,
    pub cb_state: IntGauge,
    pub cb_success: Arc<ShardedCounter>,
    pub cb_failure: Arc<ShardedCounter>,
    pub class_2xx: Arc<ShardedCounter>,
    pub class_4xx: Arc<ShardedCounter>,
    pub class_5xx: Arc<ShardedCounter>,
    pub class_other: Arc<ShardedCounter>,
    pub prompt_tokens: Arc<ShardedCounter>,
    pub cached_tokens: Arc<ShardedCounter>,
    pub completion_tokens: Arc<ShardedCounter>,
}

impl TargetMetrics {
    pub fn new(m: &Metrics, worker: &str) -> Self {
        TargetMetrics {
            running: m.running.with_label_values(&[worker]),
            health: m.worker_health.with_label_values(&[worker]),
            cb_state: m.cb_state.with_label_values(&[worker]),
            cb_success: m.cb_outcomes.with_values(&[worker, "success"]),
            cb_failure: m.cb_outcomes.with_values(&[worker, "failure"]),
            class_2xx: m.upstream_responses.with_values(&[worker, "2xx"]),
            class_4xx: m.upstream_responses.with_values(&[worker, "4xx"]),
            class_5xx: m.upstream_responses.with_values(&[worker, "5xx"]),
            class_other: m.upstream_responses.with_values(&[worker, "other"]),
            prompt_tokens: m.tokens.with_values(&[worker, "prompt"]),
            cached_tokens: m.tokens.with_values(&[worker, "cached"]),
            completion_tokens: m.tokens.with_values(&[worker, "completion"]),
        }
    }

    pub fn status(&self, status: u16) {
        match status {
            200..=299 => self.class_2xx.inc(),
            400..=499 => self.class_4xx.inc(),
            500..=599 => self.class_5xx.inc(),
            _ => self.class_other.inc(),
        }
    }
}
