//! Program scheduling's Prometheus series (`vllm_router_agent_aware_*`), registered once per
//! router and shared by every runtime a reload builds.
//!
//! Every family vllm-router 0.1.17 exposes for Program scheduling has the peer's name, type,
//! label names and buckets here (router/tests/program/metrics_parity.rs diffs them against its
//! captured exposition), so dashboards built for it keep working; series of our own carry the
//! `program_router_` prefix.

use std::sync::Arc;

use crate::observe::metrics::register;
use crate::observe::summary::SummaryVec;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Program-scheduling series (registered once per process; ranks are labelled by target id).
#[derive(Clone)]
pub struct ProgramMetrics {
    /// `{target, reason}`: `program_admit`, `force_resume`, the pause reasons, ours
    /// (`idle_finish`, `batch_gain_admit`, `backfill_admit`, `engine_room_admit`).
    pub(crate) transitions: IntCounterVec,
    pub(crate) queue_size: IntGaugeVec,
    pub(crate) active_programs: IntGaugeVec,
    pub(crate) used_tokens: IntGaugeVec,
    pub(crate) observation_fresh: IntGaugeVec,
    pub(crate) queue_wait: Arc<SummaryVec>,
    /// `{target, source}`: `fitted` (the automatic TTL) or `request`.
    pub(crate) armed_ttl: HistogramVec,
    pub(crate) interval: HistogramVec,
    pub(crate) miss_impact: HistogramVec,
    /// Ours: every context growth between two completions (the peer's gauge is the mean).
    pub(crate) growth: prometheus::Histogram,
    pub(crate) shared_prefix: HistogramVec,
    pub(crate) admission: Admission,
    /// Per target: the rolling windows' state, refreshed once an interval.
    pub(crate) rolling_samples: IntGaugeVec,
    pub(crate) fitted_ttl: GaugeVec,
    pub(crate) miss_impact_mean: GaugeVec,
    pub(crate) context_growth: GaugeVec,
    pub(crate) overcommit: GaugeVec,
    pub(crate) held_resumes: GaugeVec,
    /// `{model_pool, endpoint}`: prompt tokens per request byte (one estimate over all).
    pub(crate) coefficient: GaugeVec,
    /// `{model_pool, endpoint, outcome}`: `observed` (usage fed the estimate) or `missing`.
    pub(crate) feedback: IntCounterVec,
    /// Ours, `{model_pool, endpoint}`: each request's admission-time estimate ÷ the engine's
    /// prompt tokens.
    pub(crate) estimate_error: HistogramVec,
    pub(crate) shed: IntCounterVec,
}

/// What each admission saw, per target (the peer's `admission_*` histograms).
#[derive(Clone)]
pub(crate) struct Admission {
    pub(crate) required: HistogramVec,
    pub(crate) growth_reserve: HistogramVec,
    pub(crate) used: HistogramVec,
    pub(crate) capacity_pressure: HistogramVec,
    pub(crate) projected_pressure: HistogramVec,
    pub(crate) kv_usage: HistogramVec,
    pub(crate) running: HistogramVec,
    pub(crate) waiting: HistogramVec,
    pub(crate) observation_age: HistogramVec,
}

/// The one label of the estimate's series: one estimate for every Program (the peer's pools).
pub const MODEL_POOL: &str = "program:all";

/// The peer's buckets.
const TOKENS: &[f64] = &[
    0.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0,
    262144.0, 524288.0, 1048576.0,
];
const RATIOS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0];
const COUNTS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
const SECONDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
const TTL_SECONDS: &[f64] = &[
    0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
const MISS_SECONDS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0];
/// Ours: the token estimate over the engine's count (1 is exact).
const ESTIMATE_RATIOS: &[f64] = &[
    0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 1.0, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2.0,
];
/// Ours: context growth between completions.
const GROWTH_TOKENS: &[f64] = &[
    0.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
];

fn per_target(
    registry: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<HistogramVec, prometheus::Error> {
    register(
        registry,
        HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
            &["target"],
        )?,
    )
}

fn gauges(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<GaugeVec, prometheus::Error> {
    register(registry, GaugeVec::new(Opts::new(name, help), labels)?)
}

fn int_gauges(
    registry: &Registry,
    name: &str,
    help: &str,
) -> Result<IntGaugeVec, prometheus::Error> {
    register(
        registry,
        IntGaugeVec::new(Opts::new(name, help), &["target"])?,
    )
}

impl Admission {
    fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let p = "vllm_router_agent_aware_admission_";
        Ok(Admission {
            required: per_target(
                r,
                &format!("{p}required_tokens"),
                "Tokens an admission reserved for its Program.",
                TOKENS,
            )?,
            growth_reserve: per_target(
                r,
                &format!("{p}growth_reserve_tokens"),
                "The growth-reserve part of an admission's tokens.",
                TOKENS,
            )?,
            used: per_target(
                r,
                &format!("{p}used_tokens"),
                "The rank's ledger tokens before an admission.",
                TOKENS,
            )?,
            capacity_pressure: per_target(
                r,
                &format!("{p}capacity_pressure_ratio"),
                "The rank's ledger over its token capacity before an admission.",
                RATIOS,
            )?,
            projected_pressure: per_target(
                r,
                &format!("{p}projected_pressure_ratio"),
                "The rank's ledger over its token capacity after an admission.",
                RATIOS,
            )?,
            kv_usage: per_target(
                r,
                &format!("{p}backend_kv_usage_ratio"),
                "The backend's reported KV usage at an admission, when observed.",
                RATIOS,
            )?,
            running: per_target(
                r,
                &format!("{p}backend_running_requests"),
                "The backend's running requests at an admission, when observed.",
                COUNTS,
            )?,
            waiting: per_target(
                r,
                &format!("{p}backend_waiting_requests"),
                "The backend's waiting requests at an admission, when observed.",
                COUNTS,
            )?,
            observation_age: per_target(
                r,
                &format!("{p}capacity_observation_age_seconds"),
                "Age of the backend observation an admission saw.",
                SECONDS,
            )?,
        })
    }

    /// Records what an admission on `target` saw.
    pub(crate) fn observe(&self, target: &str, at: &crate::program::scheduler::AdmitSnapshot) {
        let l = &[target];
        self.required
            .with_label_values(l)
            .observe(at.required as f64);
        self.growth_reserve
            .with_label_values(l)
            .observe(at.growth_reserve as f64);
        self.used
            .with_label_values(l)
            .observe(at.used_before as f64);
        if let Some(cap) = at.capacity.filter(|c| *c > 0) {
            let cap = cap as f64;
            self.capacity_pressure
                .with_label_values(l)
                .observe(at.used_before as f64 / cap);
            self.projected_pressure
                .with_label_values(l)
                .observe((at.used_before + at.required) as f64 / cap);
        }
        if let Some((age, o)) = &at.observation {
            self.kv_usage.with_label_values(l).observe(o.kv_usage);
            self.running.with_label_values(l).observe(o.running);
            self.waiting.with_label_values(l).observe(o.waiting);
            self.observation_age.with_label_values(l).observe(*age);
        }
    }

    /// Deletes the series of a target that left.
    pub(crate) fn remove(&self, target: &str) {
        for h in [
            &self.required,
            &self.growth_reserve,
            &self.used,
            &self.capacity_pressure,
            &self.projected_pressure,
            &self.kv_usage,
            &self.running,
            &self.waiting,
            &self.observation_age,
        ] {
            let _ = h.remove_label_values(&[target]);
        }
    }
}

impl ProgramMetrics {
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let p = "vllm_router_agent_aware_";
        let queue_wait = Arc::new(SummaryVec::new(
            &format!("{p}queue_wait_seconds"),
            "Time requests spent in the RequestPool before dispatch.",
            "target",
        )?);
        r.register(Box::new(SharedSummary(queue_wait.clone())))?;
        Ok(ProgramMetrics {
            transitions: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        format!("{p}transitions_total"),
                        "Program scheduling transitions by target and reason.",
                    ),
                    &["target", "reason"],
                )?,
            )?,
            queue_size: int_gauges(
                r,
                &format!("{p}rank_queue_size"),
                "Requests retained in the RequestPool per rank.",
            )?,
            active_programs: int_gauges(
                r,
                &format!("{p}rank_active_programs"),
                "Active (reasoning or acting) Programs per rank.",
            )?,
            used_tokens: int_gauges(
                r,
                &format!("{p}rank_used_tokens"),
                "Router-ledger tokens held by active Programs per rank.",
            )?,
            observation_fresh: int_gauges(
                r,
                &format!("{p}capacity_observation_fresh"),
                "1 when the rank's backend observation is fresh.",
            )?,
            queue_wait,
            armed_ttl: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        format!("{p}armed_ttl_seconds"),
                        "Acting TTLs armed on completion, by source (fitted or request).",
                    )
                    .buckets(TTL_SECONDS.to_vec()),
                    &["target", "source"],
                )?,
            )?,
            interval: per_target(
                r,
                &format!("{p}request_interval_seconds"),
                "Completion-to-next-request intervals of Programs (tool-call time).",
                SECONDS,
            )?,
            miss_impact: per_target(
                r,
                &format!("{p}cache_miss_impact_seconds"),
                "Modelled cost of losing a Program's KV, prefill * (2 - alpha).",
                MISS_SECONDS,
            )?,
            growth: register(
                r,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "program_router_program_context_growth_tokens",
                        "Growth of a Program's context between two of its completions, in tokens.",
                    )
                    .buckets(GROWTH_TOKENS.to_vec()),
                )?,
            )?,
            shared_prefix: per_target(
                r,
                &format!("{p}shared_prefix_observed_tokens"),
                "Prompt tokens found cached on a Program's first run on a rank (shared with other Programs).",
                TOKENS,
            )?,
            admission: Admission::new(r)?,
            rolling_samples: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        format!("{p}rolling_samples"),
                        "Samples in a rank's rolling windows: request (completions) and continuity (return intervals).",
                    ),
                    &["target", "window"],
                )?,
            )?,
            fitted_ttl: gauges(
                r,
                &format!("{p}fitted_ttl_seconds"),
                "The automatic acting TTL for a Program of the rank's mean context.",
                &["target"],
            )?,
            miss_impact_mean: gauges(
                r,
                &format!("{p}cache_miss_impact_rolling_mean_seconds"),
                "Cache-miss impact of a Program of the rank's mean context.",
                &["target"],
            )?,
            context_growth: gauges(
                r,
                &format!("{p}context_growth_tokens"),
                "Mean context growth between two completions on the rank, in tokens.",
                &["target"],
            )?,
            overcommit: gauges(
                r,
                "program_router_program_overcommit_ratio",
                "How far past low_watermark_ratio the rank admits now (adaptive overcommit).",
                &["target"],
            )?,
            held_resumes: gauges(
                r,
                "program_router_program_held_resume_ratio",
                "Share of the rank's latest resumed Programs that had held their place; 0 = hold-free.",
                &["target"],
            )?,
            coefficient: gauges(
                r,
                &format!("{p}token_estimate_coefficient"),
                "Learned prompt tokens per request byte (one estimate, reported per endpoint that fed it).",
                &["model_pool", "endpoint"],
            )?,
            feedback: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        format!("{p}token_estimate_feedback_total"),
                        "Completions that fed the token estimate (observed) or brought no usage (missing).",
                    ),
                    &["model_pool", "endpoint", "outcome"],
                )?,
            )?,
            estimate_error: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "program_router_program_token_estimate_error_ratio",
                        "A request's prompt-token estimate at admission over the prompt tokens the \
                     engine reported (1 is exact; below 1 the ledger under-reserved).",
                    )
                    .buckets(ESTIMATE_RATIOS.to_vec()),
                    &["model_pool", "endpoint"],
                )?,
            )?,
            shed: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "program_router_program_scheduling_shed_total",
                        "What Program scheduling's bounds shed, by reason: requests refused because \
                     the RequestPool held max_retained_requests (request_pool_full) or \
                     max_programs Programs were held and none was idle (programs_full), and idle \
                     Programs forgotten to make room for a new one (program_evicted); tool calls \
                     left unlabeled because max_tools tool names were kept (tool_unlabeled); \
                     kinds of Program whose sizes were forgotten for a new kind (kind_replaced; \
                     kind_replaced_unsettled for a kind with fewer than 5 Programs ended).",
                    ),
                    &["reason"],
                )?,
            )?,
        })
    }

    /// Deletes every per-target series of a target that left.
    pub(crate) fn remove_target(&self, id: &str) {
        for v in [
            &self.queue_size,
            &self.active_programs,
            &self.used_tokens,
            &self.observation_fresh,
        ] {
            let _ = v.remove_label_values(&[id]);
        }
        for h in [&self.interval, &self.miss_impact, &self.shared_prefix] {
            let _ = h.remove_label_values(&[id]);
        }
        for g in [
            &self.fitted_ttl,
            &self.miss_impact_mean,
            &self.context_growth,
            &self.overcommit,
            &self.held_resumes,
        ] {
            let _ = g.remove_label_values(&[id]);
        }
        for w in ["request", "continuity"] {
            let _ = self.rolling_samples.remove_label_values(&[id, w]);
        }
        for s in ["fitted", "request"] {
            let _ = self.armed_ttl.remove_label_values(&[id, s]);
        }
        let admits = [
            "program_admit",
            "force_resume",
            "idle_finish",
            "batch_gain_admit",
            "backfill_admit",
            "engine_room_admit",
        ];
        let pauses = crate::program::scheduler::PauseReason::ALL.map(|r| r.as_str());
        for reason in admits.into_iter().chain(pauses) {
            let _ = self.transitions.remove_label_values(&[id, reason]);
        }
        self.queue_wait.remove(id);
        self.admission.remove(id);
    }
}

/// The registry owns its collectors; the metrics keep a handle to the same summary.
struct SharedSummary(Arc<SummaryVec>);

impl prometheus::core::Collector for SharedSummary {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.0.collect()
    }
}
