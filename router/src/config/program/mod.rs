//! `program_scheduling`: every field of the reference spec, with its default and constraint.
//!
//! Owns the typed configuration and its defaults; `validate.rs` checks it, `tests.rs` tests it.
//! The scheduler that acts on it lives in `crate::program`. Field names, defaults and the
//! deprecated input alias `token_capacity_per_target` follow the spec so that a vllm-router JSON
//! config loads unchanged.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;
mod validate;

/// Which request inputs opt a request into Program scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
pub enum EnableKey {
    /// Only the canonical `vllm_xargs.agentic_context`.
    #[default]
    #[serde(rename = "vllm_xargs.agentic_context")]
    AgenticContext,
    /// Also `agent_hint`, Claude Code / Codex / OpenCode headers and `x-session-id`.
    #[serde(rename = "auto")]
    Auto,
}

/// Order of Rank-local resume candidates within one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum ResumeOrder {
    /// Programs that have run first, latest arrival first; new Programs after, oldest first.
    #[default]
    Mru,
    Fcfs,
    /// Extension: Programs that have run first, the one whose KV was used last first (the
    /// likeliest still cached); new Programs after, oldest first. Long-idle Programs wait
    /// behind busy ones, which costs fleets that mix human chat with agents.
    LastUse,
    /// Extension: Programs of a kind (a system prompt, or the first message without one; its
    /// subagents a kind apart) that runs much smaller than the fleet's average first, work in
    /// progress and new alike, in tiers of `kind_size_tier_ratio` learned from the Programs that
    /// ended; as `mru` within a tier.
    /// Forced requests still go first.
    KindSize,
}

/// Initial home Rank of a new Program generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum BindingStrategy {
    /// The spec's default; ours is `least_program_count` (measured: see docs/benchmarks.md).
    ConsistentHash,
    ProgramRoundRobin,
    #[default]
    LeastProgramCount,
    ReasoningTokenBalance,
    CacheAware,
}

/// What holding a Program's KV through a tool call costs in the automatic TTL's utility,
/// `F(τ)·B − c·τ` (extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum ActingTtlCost {
    /// c = 1: a second held costs a second (the spec's behaviour).
    Seconds,
    /// c = the Program's context ÷ its rank's KV capacity: a second held costs the rank that
    /// share of a second of its KV. Times the rank's backlog factor (1 +
    /// `miss_impact_backlog_weight` × queued ÷ active, as for the miss impact), since requests
    /// waiting for that KV pay for it too; at most 1. Without a known capacity, 1. Our default
    /// (measured in docs/generalization.md).
    #[default]
    KvShare,
}

/// How long a hold through a tool call is charged for in the automatic TTL's utility
/// (extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum ActingTtlHold {
    /// The whole TTL, `F(τ)·B − c·τ`, as if every Program came back only when its hold ran out
    /// (the spec's behaviour).
    Reserved,
    /// What the hold is expected to last, `F(τ)·B − c·E[min(gap, τ)]`: a Program that comes back
    /// within the TTL is charged for its gap, not for the whole TTL, so holds cover more of the
    /// tool calls. Blended toward the whole TTL as the rank's longest-waiting request nears its
    /// force-resume deadline (`w·τ + (1 − w)·E[min(gap, τ)]`, `w` that request's share of its
    /// wait to the deadline, 1 once forced), so longer holds give way to requests that wait.
    /// Our default (measured in docs/generalization.md).
    #[default]
    Expected,
}

/// Which completion-to-next-request intervals the automatic TTL learns from (extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum TtlEvidence {
    /// Each rank's own window (the spec's behaviour).
    Rank,
    /// One window over all ranks (our default): tool-call time does not depend on the rank,
    /// and pooling matures the estimate `ranks` times sooner (docs/benchmarks.md).
    #[default]
    Pooled,
}

/// Cold-prefill cost model (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PrefillCostModel {
    pub intercept_seconds: f64,
    pub linear_seconds_per_1k_tokens: f64,
    pub quadratic_seconds_per_1k_tokens_squared: f64,
    /// Retained decode throughput while prefill is mixed into the batch, within [0, 1].
    pub decode_throughput_alpha: f64,
}

impl Default for PrefillCostModel {
    fn default() -> Self {
        PrefillCostModel {
            intercept_seconds: 0.066_000_619_071_329_26,
            linear_seconds_per_1k_tokens: 0.057_020_240_121_666_13,
            quadratic_seconds_per_1k_tokens_squared: 0.004_405_734_793_797_847_5,
            decode_throughput_alpha: 0.15,
        }
    }
}

/// Decode throughput surface (seconds per step).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DecodeThroughputModel {
    pub fixed_step_seconds: f64,
    pub batch_step_seconds_per_request: f64,
    pub context_step_seconds_per_token: f64,
}

impl Default for DecodeThroughputModel {
    fn default() -> Self {
        DecodeThroughputModel {
            fixed_step_seconds: 0.010_635_218_423_115_973,
            batch_step_seconds_per_request: 0.000_419_280_369_883_478_4,
            context_step_seconds_per_token: 1.420_458_414_996_201e-7,
        }
    }
}

/// The seven performance coefficients as (model, field) below `program_scheduling`.
pub const COEFFICIENTS: [(&str, &str); 7] = [
    ("prefill_cost_model", "intercept_seconds"),
    ("prefill_cost_model", "linear_seconds_per_1k_tokens"),
    (
        "prefill_cost_model",
        "quadratic_seconds_per_1k_tokens_squared",
    ),
    ("prefill_cost_model", "decode_throughput_alpha"),
    ("decode_throughput_model", "fixed_step_seconds"),
    ("decode_throughput_model", "batch_step_seconds_per_request"),
    ("decode_throughput_model", "context_step_seconds_per_token"),
];

/// The coefficients the `program_scheduling` object as written (`None`: Program scheduling
/// enabled with no JSON) leaves out, as `model.field`: they take the reference values. A field
/// given explicitly counts as configured even when its value is the reference one (the spec's
/// rule for the startup calibration warning).
pub fn omitted_coefficients(written: Option<&serde_json::Value>) -> Vec<String> {
    COEFFICIENTS
        .iter()
        .filter(|(model, field)| {
            written
                .and_then(|ps| ps.get(model))
                .and_then(|m| m.get(field))
                .is_none()
        })
        .map(|(model, field)| format!("{model}.{field}"))
        .collect()
}

/// The most requests behind a queue's head that `queue_backfill_depth` may look at (each
/// admission pass scans that many).
pub const MAX_QUEUE_BACKFILL_DEPTH: u32 = 1024;

/// What `cross_rank_min_wait_ratio: null` means: 1, the break-even wait, at every cluster size
/// (docs/generalization.md, "Cross-rank moves at break-even").
pub const DEFAULT_MIN_WAIT_RATIO: f64 = 1.0;

/// Program scheduling configuration (`RouterConfig.program_scheduling`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ProgramSchedulingConfig {
    pub program_scheduling_enable_key: EnableKey,
    pub binding_only: bool,
    pub global_queue: bool,
    pub resume_order: ResumeOrder,
    pub cross_rank_headroom_ratio: f64,
    /// Extension: a request queued on its Program's rank moves to another rank (`global_queue`)
    /// only once it has waited this multiple of what the move costs, its Program's cache-miss
    /// impact (re-prefilling its context there). 0 moves at once (the spec); 1 is the
    /// break-even rule, which keeps large clusters out of move storms and small ones out of
    /// moves that cost more than the wait. Null (the default) is [`DEFAULT_MIN_WAIT_RATIO`].
    pub cross_rank_min_wait_ratio: Option<f64>,
    /// Extension: while the head of a rank's queue does not fit and is not forced, up to this
    /// many requests behind it, of its priority, are admitted if they fit when the head's
    /// Program has no prefix of its own likely cached (new, or back from a tool call longer than
    /// the rank's shared-prefix freshness), or when their own Program came back from a tool
    /// call longer than `max_acting_ttl_seconds` and most of its calls were that long. 16 by
    /// default; 0 keeps strict queue order; at most [`MAX_QUEUE_BACKFILL_DEPTH`]
    /// (docs/generalization.md, "Passing a head that does not fit").
    pub queue_backfill_depth: u32,
    pub binding_strategy: BindingStrategy,
    pub hash_virtual_nodes: u32,
    /// Logical KV-token capacity of each DP rank; null falls back to the Program-count guard.
    #[serde(alias = "token_capacity_per_target")]
    pub token_capacity_per_dp_rank: Option<u64>,
    pub max_active_programs_per_target: u32,
    pub metrics_interval_seconds: f64,
    pub admission_waiting_request_threshold: u32,
    pub queue_timeout_seconds: f64,
    pub force_resume_timeout_seconds: f64,
    pub paused_retention_ttl_seconds: f64,
    pub shared_prefix_freshness_warmup_seconds: f64,
    pub shared_prefix_freshness_kv_turnovers: f64,
    pub decode_buffer_tokens: u64,
    pub max_acting_ttl_seconds: f64,
    pub high_watermark_ratio: f64,
    pub low_watermark_ratio: f64,
    pub max_segment_rounds: u32,
    /// Extension: a Program yields at `max_segment_rounds` only while its context is at most
    /// this share of its rank's token capacity (always on a rank without one, or when a forced
    /// request at the head of the rank's queue would fit once it releases its KV). A larger one
    /// would come back to a re-prefill of that context and wait for that much room at once.
    /// 1 = every Program yields (the spec).
    pub segment_yield_max_context_ratio: f64,
    pub stats_window_size: u32,
    pub enable_batch_gain_admission: bool,
    /// Extension: where the automatic TTL's interval evidence comes from.
    pub ttl_evidence: TtlEvidence,
    /// Extension: what a second of holding costs in the automatic TTL's utility.
    pub acting_ttl_cost: ActingTtlCost,
    /// Extension: how long a hold is charged for in the automatic TTL's utility.
    pub acting_ttl_hold: ActingTtlHold,
    /// Extension: samples needed before the automatic TTL is active; null = `stats_window_size`
    /// (the spec's rule).
    pub ttl_min_samples: Option<u32>,
    /// Extension: a Program whose latest response called a tool may be held longer than the
    /// rank's evidence (`ttl_evidence`) says, never shorter, by the intervals that followed
    /// that tool's earlier calls, once they number this many. 0 = tools are not told apart.
    pub tool_ttl_min_samples: u32,
    /// Extension: distinct tool names the scheduler keeps intervals for; calls of tools beyond
    /// it count as unlabeled.
    pub max_tools: u32,
    /// Extension: the workload-derived force-resume deadline is this many times the time the
    /// rank needs to serve the work already queued or active; 0 = always
    /// `force_resume_timeout_seconds`.
    pub force_resume_workload_factor: f64,
    /// Extension: a forced request that token capacity still keeps out this many seconds past
    /// its force-resume deadline is admitted once the engine's own KV report (fresh) shows room
    /// for it within `high_watermark_ratio`: KV reported in use, plus what was admitted since,
    /// plus its demand. The ledger reserves for Programs in tool calls and for output not yet
    /// written, which the engine does not hold; waiting on them can outlast the queue limit. `queue_timeout_seconds` or
    /// more turns it off.
    pub force_resume_engine_grace_seconds: f64,
    /// Extension: a paused Program idle for longer than this multiple of the longest
    /// completion-to-next-request interval in the automatic TTL's evidence counts as finished
    /// for `least_program_count` binding, as if its last request had said `expected_resume:
    /// false` (clients that identify Programs by headers only never say it). A new request
    /// makes it live again. 0 = only the explicit mark.
    pub finished_idle_ratio: f64,
    /// Extension: a Program whose client does not say `expected_resume` (headers only, or an
    /// `agentic_context` without it) and does not set `kv_retention_ttl_seconds`, and that has
    /// called a tool before, is taken to have ended its turn when a response is known to call
    /// none: an agent's loop hands control back to a person then. It pauses without a hold and
    /// counts as finished (a later request makes it live again), as `expected_resume: false`
    /// would have it. false = only the explicit mark and `finished_idle_ratio`.
    pub answer_ends_program: bool,
    /// Extension: the automatic TTL counts a cache miss on a rank with a backlog as costing the
    /// backlog too. Its miss impact is multiplied by 1 + this × (requests queued for the rank ÷
    /// the rank's active Programs, at least 1): a re-prefill there delays what waits behind it.
    /// 0 = the spec's impact.
    pub miss_impact_backlog_weight: f64,
    /// Extension: requests that may wait in the RequestPool at once; one more is refused with
    /// 429 `request_pool_full` (each holds its body in memory while it waits).
    pub max_retained_requests: u32,
    /// Extension: Programs the scheduler holds at once (client-chosen ids, kept for the paused
    /// retention). A new Program beyond it takes the place of the idle Programs that waited
    /// longest (the oldest 1% of the cap leave at once); with none idle it is refused with 429
    /// `program_capacity`. Hand-overs from other replicas obey it too.
    pub max_programs: u32,
    /// Extension: a rank admits up to this share of its capacity past `low_watermark_ratio`
    /// (capacity repair moves past `high_watermark_ratio` with it) while requests wait there
    /// long next to what a lost prefix costs; 0 = never. Reset to 0 when a Program comes back to
    /// find its prefix evicted.
    pub adaptive_overcommit_max_ratio: f64,
    /// Extension: what the overcommit grows by per observation of a rank (every
    /// `metrics_interval_seconds`).
    pub adaptive_overcommit_step_ratio: f64,
    /// Extension: the overcommit grows only while the request next in line has waited longer
    /// than this many times the cache-miss impact of the rank's mean Program.
    pub adaptive_overcommit_wait_ratio: f64,
    /// Extension: the overcommit grows only on a rank whose Programs ran at most this many
    /// rounds per activation on average (pause to pause): what it admits past the ledger then
    /// leaves within a few rounds. Long activations (agents held through short tool calls)
    /// would keep the excess for a session's length, at their prefixes' cost.
    pub adaptive_overcommit_max_rounds: f64,
    /// Extension: on a hold-free rank — none of its latest resumed Programs (a
    /// `stats_window_size` window, read once 16 came back) had its place held since its
    /// previous request, as when people think between turns — a queued request is admitted
    /// once all but this share of its demand fits under capacity × the low watermark. The
    /// engine starts its prefill in the blocks that are free while running requests finish, and
    /// no held Program's KV is at stake. 0 = never; at most 1.
    pub hold_free_admission_slack_ratio: f64,
    /// Extension: the hold-free slack also applies, on any rank, to a request whose Program's
    /// kind (model and system prompt) is hold-free — none of its latest resumed Programs had
    /// held its place — as people chatting beside agents that hold.
    pub hold_free_admission_by_kind: bool,
    /// Extension: an admission reserves the rank's mean context growth (the next round's
    /// append) only on a rank whose Programs ran more than this many rounds per activation on
    /// average, or none measured yet. Where activations are shorter, most admitted rounds are
    /// an activation's last, so the reserve mostly held KV the batch could use; 0 = always
    /// reserve (the spec's behaviour).
    pub growth_reserve_min_rounds: f64,
    /// Extension, off by default: new Programs wait behind work in progress ordered by arrival
    /// time plus this many seconds × the share of the rank's KV their first request asks for (a
    /// new Program asking for the whole rank queues as if it had arrived this much later).
    /// Smaller first shortens the mean wait where KV bounds the batch, and lengthens the large
    /// ones' tail. 0 = by arrival (the spec). Not applied under `resume_order: fcfs`.
    pub new_program_demand_aging_seconds: f64,
    /// Extension, for `resume_order: mru` and within each `kind_size` tier: work in progress
    /// that has completed more turns resumes first, the latest arrival first among equals: a
    /// session far along holds the most KV, which finishing it gives back (while the rank's
    /// queue is long: `resume_most_turns_first_min_queued_ratio`). false = the spec's `mru`.
    pub resume_most_turns_first: bool,
    /// Extension, for `resume_most_turns_first`: it orders a request only while the KV its
    /// rank's queue asks for (the queued requests' demand) is at least this many times the
    /// rank's capacity when the request arrives; shorter queues keep `mru`. 0 = always.
    pub resume_most_turns_first_min_queued_ratio: f64,
    /// Extension, for `resume_order: kind_size`: the factor between two tiers of Program size.
    /// A kind's tier is its mean size over the fleet's, rounded on a log scale of this base, so
    /// kinds within √ratio of the fleet's mean share its tier (as `mru` within it).
    pub kind_size_tier_ratio: f64,
    pub prefill_cost_model: PrefillCostModel,
    pub decode_throughput_model: DecodeThroughputModel,
}

impl Default for ProgramSchedulingConfig {
    fn default() -> Self {
        ProgramSchedulingConfig {
            program_scheduling_enable_key: EnableKey::default(),
            binding_only: false,
            // The spec's default is false; it recommends true for deployment, and true measured
            // better on mixed and multi-agent fleets (docs/benchmarks.md, cross-rank resume).
            global_queue: true,
            // The spec's `mru`, with kinds of Program far smaller than the fleet's average first:
            // identical where every kind is alike, shorter waits where chat mixes with agents
            // (docs/generalization.md, "Smaller kinds first").
            resume_order: ResumeOrder::KindSize,
            // The spec's 1.2 moved Programs too eagerly when every rank was full (a queue timeout
            // on a small overloaded cluster); 3 kept the gains elsewhere (docs/benchmarks.md).
            cross_rank_headroom_ratio: 3.0,
            cross_rank_min_wait_ratio: None,
            queue_backfill_depth: 16,
            binding_strategy: BindingStrategy::default(),
            hash_virtual_nodes: 160,
            token_capacity_per_dp_rank: None,
            max_active_programs_per_target: 64,
            metrics_interval_seconds: 1.0,
            admission_waiting_request_threshold: 1,
            queue_timeout_seconds: 600.0,
            force_resume_timeout_seconds: 300.0,
            paused_retention_ttl_seconds: 1800.0,
            shared_prefix_freshness_warmup_seconds: 100.0,
            // Turnovers of newly written KV; chosen on the tuning half (docs/generalization.md).
            shared_prefix_freshness_kv_turnovers: 1.5,
            decode_buffer_tokens: 100,
            max_acting_ttl_seconds: 10.0,
            high_watermark_ratio: 1.0,
            low_watermark_ratio: 1.0,
            // The spec's 14 made agents of 15-40 turns give up their KV mid-session under any
            // queue; chosen on the tuning half (docs/generalization.md).
            max_segment_rounds: 32,
            // Chosen on the tuning half (docs/generalization.md, "Segment yield by share").
            segment_yield_max_context_ratio: 0.1,
            stats_window_size: 100,
            enable_batch_gain_admission: true,
            ttl_evidence: TtlEvidence::default(),
            acting_ttl_cost: ActingTtlCost::default(),
            acting_ttl_hold: ActingTtlHold::default(),
            ttl_min_samples: None,
            // Chosen on the tuning half (docs/generalization.md, "Holds by the tool called").
            tool_ttl_min_samples: 50,
            max_tools: 64,
            force_resume_workload_factor: 0.0,
            force_resume_engine_grace_seconds: 60.0,
            finished_idle_ratio: 1.0,
            answer_ends_program: true,
            miss_impact_backlog_weight: 1.0,
            max_retained_requests: 10_000,
            max_programs: 100_000,
            // Chosen on the tuning half of `progbench matrix` (docs/generalization.md).
            adaptive_overcommit_max_ratio: 0.3,
            adaptive_overcommit_step_ratio: 0.01,
            adaptive_overcommit_wait_ratio: 10.0,
            adaptive_overcommit_max_rounds: 2.5,
            // Chosen on the tuning half (docs/generalization.md, "Hold-free ranks").
            hold_free_admission_slack_ratio: 0.5,
            hold_free_admission_by_kind: true,
            growth_reserve_min_rounds: 2.5,
            new_program_demand_aging_seconds: 0.0,
            // Chosen on the tuning half (docs/generalization.md, "Most turns first under long
            // queues").
            resume_most_turns_first: true,
            resume_most_turns_first_min_queued_ratio: 1.5,
            // Chosen on the tuning half (docs/generalization.md, "Smaller kinds first").
            kind_size_tier_ratio: 3.0,
            prefill_cost_model: PrefillCostModel::default(),
            decode_throughput_model: DecodeThroughputModel::default(),
        }
    }
}
