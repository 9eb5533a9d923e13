//! Program scheduling's Prometheus series (`vllm_router_agent_aware_*`), registered once per
//! router and shared by every runtime a reload builds.

use crate::observe::metrics::register;
use prometheus::{
    Gauge, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Program-scheduling series (registered once per process; ranks are labelled by target id).
#[derive(Clone)]
pub struct ProgramMetrics {
    pub(crate) transitions: IntCounterVec,
    pub(crate) queue_size: IntGaugeVec,
    pub(crate) active_programs: IntGaugeVec,
    pub(crate) used_tokens: IntGaugeVec,
    pub(crate) observation_fresh: IntGaugeVec,
    pub(crate) queue_wait: Histogram,
    pub(crate) armed_ttl: Histogram,
    pub(crate) interval: Histogram,
    pub(crate) miss_impact: Histogram,
    pub(crate) growth: Histogram,
    pub(crate) admission_demand: Histogram,
    pub(crate) admission_used_ratio: Histogram,
    pub(crate) shared_prefix: HistogramVec,
    pub(crate) coefficient: Gauge,
    pub(crate) shed: IntCounterVec,
}

const TOKENS: &[f64] = &[
    0.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];
/// The peer's buckets for shared-prefix observations (0, then 128 · 2^k up to 1 Mi).
const PREFIX_TOKENS: &[f64] = &[
    0.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0,
    262144.0, 524288.0, 1048576.0,
];
const RATIOS: &[f64] = &[0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0, 1.05, 1.2];

const SECONDS: &[f64] = &[
    0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

impl ProgramMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let h = |name: &str, help: &str| HistogramOpts::new(name, help).buckets(SECONDS.to_vec());
        Ok(ProgramMetrics {
            transitions: register(registry, IntCounterVec::new(
                Opts::new(
                    "vllm_router_agent_aware_transitions_total",
                    "Program scheduling transitions by kind."
                ),
                &["transition"]
            )?)?,
            queue_size: register(registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_agent_aware_rank_queue_size",
                    "Requests retained in the RequestPool per rank."
                ),
                &["target"]
            )?)?,
            shed: register(registry, IntCounterVec::new(
                Opts::new(
                    "program_router_program_scheduling_shed_total",
                    "What Program scheduling's bounds shed, by reason: requests refused because \
                     the RequestPool held max_retained_requests (request_pool_full) or \
                     max_programs Programs were held and none was idle (programs_full), and idle \
                     Programs forgotten to make room for a new one (program_evicted)."
                ),
                &["reason"]
            )?)?,
            active_programs: register(registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_agent_aware_rank_active_programs",
                    "Active (reasoning or acting) Programs per rank."
                ),
                &["target"]
            )?)?,
            used_tokens: register(registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_agent_aware_rank_used_tokens",
                    "Router-ledger tokens held by active Programs per rank."
                ),
                &["target"]
            )?)?,
            observation_fresh: register(registry, IntGaugeVec::new(
                Opts::new(
                    "vllm_router_agent_aware_capacity_observation_fresh",
                    "1 when the rank's backend observation is fresh."
                ),
                &["target"]
            )?)?,
            queue_wait: register(registry, Histogram::with_opts(h(
                "vllm_router_agent_aware_queue_wait_seconds",
                "Time requests spent in the RequestPool before dispatch."
            ))?)?,
            armed_ttl: register(registry, Histogram::with_opts(h(
                "vllm_router_agent_aware_armed_ttl_seconds",
                "Acting TTLs armed on completion."
            ))?)?,
            interval: register(registry, Histogram::with_opts(h(
                "vllm_router_agent_aware_request_interval_seconds",
                "Completion-to-next-request intervals of Programs (tool-call time)."
            ))?)?,
            miss_impact: register(registry, Histogram::with_opts(h(
                "vllm_router_agent_aware_cache_miss_impact_seconds",
                "Modelled cost of losing a Program's KV, prefill * (2 - alpha)."
            ))?)?,
            growth: register(registry, Histogram::with_opts(
                HistogramOpts::new(
                    "vllm_router_agent_aware_context_growth_tokens",
                    "Growth of a Program's context between two of its completions, in tokens."
                )
                .buckets(TOKENS.to_vec())
            )?)?,
            admission_demand: register(registry, Histogram::with_opts(
                HistogramOpts::new(
                    "vllm_router_agent_aware_admission_demand_tokens",
                    "Tokens reserved per admission (context, decode buffer and growth reserve)."
                )
                .buckets(TOKENS.to_vec())
            )?)?,
            admission_used_ratio: register(registry, Histogram::with_opts(
                HistogramOpts::new(
                    "vllm_router_agent_aware_admission_used_ratio",
                    "A rank's reserved tokens over its capacity right after an admission."
                )
                .buckets(RATIOS.to_vec())
            )?)?,
            shared_prefix: register(registry, HistogramVec::new(
                HistogramOpts::new(
                    "vllm_router_agent_aware_shared_prefix_observed_tokens",
                    "Prompt tokens found cached on a Program's first run on a rank (shared with other Programs)."
                )
                .buckets(PREFIX_TOKENS.to_vec()),
                &["target"]
            )?)?,
            coefficient: register(registry, Gauge::new(
                "vllm_router_agent_aware_token_estimate_coefficient",
                "Learned prompt tokens per request byte."
            )?)?,
        })
    }
}
