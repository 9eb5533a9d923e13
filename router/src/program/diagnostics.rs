//! `GET /scheduling/diagnostics`: a typed snapshot of the scheduler, field names compatible with
//! the reference router's where the meaning matches, plus capacity source and per-Program state.
//!
//! Pure: built from scheduler state and an explicit `now`.
//!
//! Every field the reference router reports is present (the test `diagnostics_cover_the_peers_fields`
//! holds the list). Its output-length and return-time predictors have no counterpart here (this
//! router chooses TTLs from each rank's measured returns): `prediction_mode` says `off` and the
//! `predicted_*`/`*_prediction_*` fields are null, except `predicted_ttl_seconds`, which is the
//! TTL this router armed.

use serde::Serialize;

use super::scheduler::{CapacitySource, PauseReason, Phase, Scheduler};

#[derive(Debug, Serialize)]
pub struct Diagnostics {
    pub enabled: bool,
    pub binding_only: bool,
    pub global_queue: bool,
    pub resume_order: &'static str,
    /// Kinds of Program (model and system prompt) whose sizes (`resume_order: kind_size`) or
    /// resumes (`hold_free_admission_by_kind`) the scheduler keeps, at most `MAX_KINDS` (ours).
    pub program_kinds: usize,
    /// Of those, the kinds whose tier is not the fleet's: the ones `kind_size` reorders (ours).
    pub program_kinds_apart: usize,
    /// Of those, the kinds none of whose latest resumed Programs had held its place: their
    /// requests take the hold-free slack on any rank (`hold_free_admission_by_kind`, ours).
    pub program_kinds_hold_free: usize,
    /// The mean final context (tokens) of the latest Programs that ended, all kinds: what a
    /// kind's mean is compared with (ours; null before any ended).
    pub program_size_mean_tokens: Option<f64>,
    pub cross_rank_headroom_ratio: f64,
    /// The break-even wait in effect (ours; a null setting resolved by the rank count).
    pub cross_rank_min_wait_ratio: f64,
    pub retained_requests: usize,
    pub token_estimate_coefficient: f64,
    /// Return-time / output-length predictors: none here (`off`).
    pub prediction_mode: &'static str,
    /// Tools whose return intervals are kept (`tool_ttl_min_samples`, ours).
    pub return_time_profile_keys: u32,
    pub output_length_profile_keys: u32,
    /// How prompt tokens are estimated from request bytes before the backend reports usage.
    pub token_estimation: Vec<TokenEstimation>,
    /// Totals since the scheduler started (ours).
    pub counters: CounterDiagnostics,
    pub ranks: Vec<RankDiagnostics>,
}

impl Diagnostics {
    /// Keeps only the Programs of client `name` (their ids are `name/...`, see
    /// `Identity::scope`); rank figures stay whole.
    pub fn only_client(&mut self, name: &str) {
        let prefix = format!("{name}/");
        for r in &mut self.ranks {
            r.programs.retain(|p| p.program.starts_with(&prefix));
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TokenEstimation {
    pub model_pool: &'static str,
    pub endpoint: &'static str,
    pub tokens_per_byte: f64,
}

#[derive(Debug, Serialize)]
pub struct CounterDiagnostics {
    pub queue_timeouts: u64,
    pub force_resumes: u64,
    pub cross_rank_migrations: u64,
    pub batch_gain_admissions: u64,
    /// Requests admitted past a queue head that did not fit (`queue_backfill_depth`, ours).
    pub backfill_admissions: u64,
    /// Forced requests admitted on the engine's KV report past the ledger
    /// (`force_resume_engine_grace_seconds`, ours).
    pub engine_room_admissions: u64,
    /// Requests admitted past the ledger on a hold-free rank
    /// (`hold_free_admission_slack_ratio`, ours).
    pub hold_free_admissions: u64,
    /// Paused Programs presumed finished after idling past `finished_idle_ratio` (ours).
    pub idle_finishes: u64,
}

#[derive(Debug, Serialize)]
pub struct RankDiagnostics {
    pub target_id: String,
    pub base_url: String,
    pub dp_rank: Option<u32>,
    pub configured_token_capacity: Option<u64>,
    /// Capacity used for admission and where it came from (ours).
    pub token_capacity: Option<u64>,
    pub capacity_source: &'static str,
    pub router_estimated_used_tokens: u64,
    pub router_estimated_headroom_tokens: Option<u64>,
    /// Admission's share of capacity past `low_watermark_ratio` now (adaptive overcommit, ours).
    pub overcommit_ratio: f64,
    /// Share of the rank's latest resumed Programs that had held their place; 0 makes it
    /// hold-free (`hold_free_admission_slack_ratio`); null until enough came back (ours).
    pub held_resume_share: Option<f64>,
    /// vLLM's KV usage × capacity, and the router's ledger minus it.
    pub vllm_usage_scaled_tokens: Option<u64>,
    pub router_minus_vllm_used_tokens: Option<i64>,
    /// Ledger tokens of reasoning Programs and of all active Programs, and the requests in flight
    /// for reasoning Programs (now; `observed_*` counts are the same figures).
    pub observed_active_reasoning_tokens: u64,
    pub observed_active_program_tokens: u64,
    pub tracked_active_reasoning_requests: u32,
    pub observed_router_active_reasoning_programs: u32,
    pub observed_router_active_reasoning_requests: u32,
    /// Ledger change since the last backend observation.
    pub active_program_token_delta_since_observation: f64,
    /// Tokens that Programs marked by capacity repair release when their request finishes.
    pub future_pause_relief_tokens: u64,
    /// Ledger tokens held by acting Programs (their private part: shared prefixes count once).
    pub active_acting_private_tokens: u64,
    pub vllm_kv_cache_usage: Option<f64>,
    pub vllm_running_requests: Option<f64>,
    pub vllm_waiting_requests: Option<f64>,
    pub observation_age_seconds: Option<f64>,
    pub observation_fresh: bool,
    pub capacity_accounting_source: &'static str,
    pub router_active_programs: u32,
    pub router_active_reasoning_programs: u32,
    pub router_active_acting_programs: u32,
    pub router_paused_programs: u32,
    /// Paused by capacity repair (while reasoning) vs. after acting (TTL expiry and the rest).
    pub router_paused_reasoning_programs: u32,
    pub router_paused_acting_programs: u32,
    pub router_in_flight_requests: u32,
    pub router_queued_requests: usize,
    /// The KV the queued requests ask for, summed (ours): `resume_most_turns_first`'s gate.
    pub router_queued_demand_tokens: u64,
    /// Programs with at least one retained request.
    pub router_queued_programs: u32,
    /// Bound Programs whose last request said no further request follows (ours): kept for a
    /// late request, left out of `least_program_count`.
    pub router_finished_programs: u32,
    pub rolling: Rolling,
    pub programs: Vec<ProgramDiagnostics>,
}

#[derive(Debug, Serialize)]
pub struct Rolling {
    /// Completed requests in the window, and means over them.
    pub request_samples: usize,
    pub request_window_complete: bool,
    pub avg_prompt_tokens: Option<f64>,
    pub avg_completion_tokens: Option<f64>,
    pub avg_cached_prompt_tokens: Option<f64>,
    pub avg_cached_prompt_ratio: Option<f64>,
    pub avg_e2e_seconds: Option<f64>,
    /// Decode time alone is not measured by the router (null).
    pub avg_decode_seconds: Option<f64>,
    pub avg_router_queue_seconds: Option<f64>,
    /// Return intervals (the acting-TTL evidence) in the window.
    pub continuity_samples: usize,
    pub continuity_window_complete: bool,
    pub avg_request_interval_seconds: Option<f64>,
    /// Activations that ended in a pause, and their mean rounds (same as `avg_segment_rounds`).
    pub ttl_pause_samples: usize,
    pub avg_rounds_since_ttl_pause: Option<f64>,
    /// The automatic acting TTL for a Program of the rank's mean context, from this evidence.
    pub fitted_acting_ttl_seconds: f64,
    pub growth_samples: usize,
    pub avg_context_growth_tokens: Option<f64>,
    /// Completions per second over the window, and the KV they newly wrote per second
    /// (uncached prompt and output tokens), which sets the shared-prefix freshness.
    pub request_throughput_per_second: Option<f64>,
    pub kv_write_tokens_per_second: Option<f64>,
    /// Mean rounds a Program runs per activation before it pauses.
    pub avg_segment_rounds: Option<f64>,
    /// Lifetime of a shared-prefix observation on this rank right now.
    pub shared_prefix_freshness_seconds: f64,
    /// The force-resume deadline a request queued now would get, and the modelled time the rank
    /// needs to serve its queued and active work (null until throughput is measured).
    pub force_resume_deadline_seconds: f64,
    pub drain_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct ProgramDiagnostics {
    pub program: String,
    pub model: String,
    pub state: &'static str,
    pub status: &'static str,
    pub pause_reason: Option<&'static str>,
    pub task_id: Option<String>,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub parent_program_id: Option<String>,
    pub root_program_id: Option<String>,
    pub expected_resume: bool,
    pub blocks_parent: bool,
    pub agent_role: Option<String>,
    pub spawn_reason: Option<String>,
    /// Workflow profiles belong to the reference router's predictors: always null here.
    pub workflow_profile_id: Option<String>,
    pub profile_version: Option<String>,
    pub step_id: Option<u64>,
    /// Request-scoped fields of its latest request.
    pub request_id: Option<String>,
    pub request_priority: i64,
    pub request_deadline_seconds: Option<f64>,
    pub expected_output_tokens: Option<u64>,
    pub kv_retention_ttl_seconds: Option<f64>,
    /// Times it moved rank, its rank, where its latest request went, and how it got its rank
    /// (`binding`, `cross_rank`, `target_removed`, `handed_over` — from another router replica).
    pub generation: u32,
    pub home_target: String,
    pub last_target: Option<String>,
    pub placement: &'static str,
    /// Under `resume_order: kind_size`, its kind's tier in steps from the fleet's: negative goes
    /// ahead (a kind that runs smaller), 0 is the fleet's (ours; null under other orders).
    pub kind_tier: Option<i64>,
    pub context_tokens: u64,
    pub estimated_context_tokens: u64,
    /// Prompt tokens shared with other Programs (observed on its first run on this rank) and
    /// how long that observation stays valid (0 when stale: the prefix counts as private).
    pub shared_prefix_tokens: u64,
    pub shared_prefix_freshness_remaining_seconds: f64,
    /// Context plus the decode buffer, and the part of it not covered by a fresh shared prefix.
    pub logical_tokens: u64,
    pub private_tokens: u64,
    pub reserved_tokens: u64,
    pub in_flight_requests: u32,
    pub queued_requests: u32,
    pub waiting_requests: u32,
    pub rounds_in_segment: u32,
    pub segment_served_rounds: u32,
    pub rounds_since_activation: u32,
    pub rounds_since_ttl_pause: u32,
    /// Capacity repair marked it to pause when its request finishes.
    pub pause_when_idle: bool,
    pub armed_ttl_seconds: f64,
    pub predicted_ttl_seconds: Option<f64>,
    pub ttl_remaining_seconds: Option<f64>,
    /// Seconds in the current acting period, and the oldest wait of its retained requests.
    pub acting_seconds: Option<f64>,
    pub queued_seconds: Option<f64>,
    /// Time until its earliest waiting request is forced (absent when none waits), the deadline
    /// a request queued now would get, and that deadline's inputs on its rank (requests waiting
    /// and in flight there, and the rank's request throughput).
    pub force_resume_remaining_seconds: Option<f64>,
    pub force_resume_timeout_seconds: Option<f64>,
    pub force_resume_active_remaining_rounds: f64,
    pub force_resume_pool_remaining_rounds: f64,
    pub force_resume_request_throughput_per_second: f64,
    /// Its latest measured return (tool gap) and output length.
    pub last_return_actual_seconds: Option<f64>,
    pub last_output_actual_tokens: Option<u64>,
    /// No predictors here: null (see the module doc).
    pub predicted_return_probability: Option<f64>,
    pub return_prediction_support: Option<u64>,
    pub return_prediction_online_support: Option<u64>,
    pub return_prediction_backoff_level: Option<u32>,
    pub return_prediction_source: Option<&'static str>,
    pub predicted_output_tokens: Option<u64>,
    pub predicted_output_p50: Option<u64>,
    pub predicted_output_p95: Option<u64>,
    pub predicted_output_p99: Option<u64>,
    pub output_prediction_support: Option<u64>,
    pub output_prediction_online_support: Option<u64>,
    pub output_prediction_backoff_level: Option<u32>,
    pub output_prediction_source: Option<&'static str>,
    pub output_prediction_mature: Option<bool>,
    pub idle_seconds: f64,
}

/// Static facts about a rank the scheduler does not keep.
pub struct RankInfo {
    pub base_url: String,
    pub dp_rank: Option<u32>,
}

/// A rank's rolling windows as the peer's gauges report them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RollingGauges {
    pub request_samples: usize,
    pub continuity_samples: usize,
    /// The automatic TTL for a Program of the rank's mean context.
    pub fitted_ttl_seconds: f64,
    /// The cache-miss impact of a Program of the rank's mean context.
    pub miss_impact_seconds: f64,
    pub context_growth_tokens: f64,
    /// How far past `low_watermark_ratio` the rank admits now (adaptive overcommit).
    pub overcommit_ratio: f64,
    /// Share of the latest resumed Programs that had held their place (`None`: too few yet).
    pub held_resume_share: Option<f64>,
}

/// [`RollingGauges`] of `rank`.
pub fn rolling_gauges(s: &Scheduler, rank: usize, now: f64) -> Option<RollingGauges> {
    let r = s.ranks.get(rank)?;
    let contexts: Vec<u64> = r
        .members
        .iter()
        .filter_map(|slot| s.programs[*slot].as_ref().map(|p| p.context_tokens))
        .collect();
    let mean_context = match contexts.len() {
        0 => 0,
        n => contexts.iter().sum::<u64>() / n as u64,
    };
    Some(RollingGauges {
        request_samples: r.requests.prompt_tokens.len(),
        continuity_samples: r.intervals.len(),
        fitted_ttl_seconds: s.fitted_ttl(rank, mean_context, now),
        miss_impact_seconds: super::cost::cache_miss_impact_seconds(
            &s.cfg.prefill_cost_model,
            mean_context,
        ),
        context_growth_tokens: r.growth.mean().unwrap_or(0.0),
        overcommit_ratio: r.overcommit,
        held_resume_share: s.held_resume_share(rank),
    })
}

/// Builds the snapshot; `max_programs` bounds the per-rank Program lists.
pub fn snapshot(
    s: &Scheduler,
    now: f64,
    info: &[RankInfo],
    coefficient: f64,
    max_programs: usize,
) -> Diagnostics {
    let cfg = &s.cfg;
    let force = s.force_deadlines();
    let waits = s.oldest_waits(now);
    let target = |r: usize| s.ranks.get(r).map(|x| x.id.clone());
    let ranks = s
        .ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let (cap, source) = s.capacity(i);
            let freshness = s.shared_prefix_freshness(i);
            let obs = r.observation;
            let fresh = obs.is_some_and(|(at, _)| now - at <= 3.0 * cfg.metrics_interval_seconds);
            let programs: Vec<_> = r
                .members
                .iter()
                .filter_map(|slot| s.programs[*slot].as_ref().map(|p| (*slot, p)))
                .collect();
            let count = |f: &dyn Fn(&Phase) -> bool| {
                programs.iter().filter(|(_, p)| f(&p.phase)).count() as u32
            };
            let reserved_where = |f: &dyn Fn(&Phase) -> bool| -> u64 {
                programs
                    .iter()
                    .filter(|(_, p)| f(&p.phase))
                    .map(|(_, p)| p.reserved)
                    .sum()
            };
            let reasoning = |p: &Phase| matches!(p, Phase::Reasoning);
            let reasoning_requests: u32 = programs
                .iter()
                .filter(|(_, p)| reasoning(&p.phase))
                .map(|(_, p)| p.in_flight)
                .sum();
            let scaled = match (obs, cap) {
                (Some((_, o)), Some(c)) => Some((o.kv_usage * c as f64).round() as u64),
                _ => None,
            };
            let force_after = s.force_resume_after(i);
            let in_flight: u32 = programs.iter().map(|(_, p)| p.in_flight).sum();
            let rate = r.throughput.requests_per_second().unwrap_or(0.0);
            let mean_context = if programs.is_empty() {
                0
            } else {
                programs.iter().map(|(_, p)| p.context_tokens).sum::<u64>() / programs.len() as u64
            };
            let mut listed: Vec<ProgramDiagnostics> = programs
                .iter()
                .map(|(slot, p)| {
                    let logical = p.context_tokens + cfg.decode_buffer_tokens;
                    let shared = s.fresh_shared(p, now).min(p.context_tokens);
                    let acting_for = match p.phase {
                        Phase::Acting { until } => Some((now - (until - p.armed_ttl)).max(0.0)),
                        _ => None,
                    };
                    let (state, status, reason, remaining) = match p.phase {
                        Phase::New => ("queued", "new", None, None),
                        Phase::Reasoning => ("active", "reasoning", None, None),
                        Phase::Acting { until } => {
                            ("active", "acting", None, Some((until - now).max(0.0)))
                        }
                        // As the peer reports it: the phase the Program paused from —
                        // reasoning for capacity repair, acting otherwise (it paused after a
                        // completion); `state` and `pause_reason` say it is paused and why.
                        Phase::Paused { reason, .. } => {
                            let from = if reason == PauseReason::CapacityRepair {
                                "reasoning"
                            } else {
                                "acting"
                            };
                            ("paused", from, Some(reason.as_str()), None)
                        }
                    };
                    ProgramDiagnostics {
                        program: p.key.1.clone(),
                        model: p.key.0.clone(),
                        state,
                        status,
                        pause_reason: reason,
                        task_id: p.identity.task_id.clone(),
                        session_id: p.identity.session_id.clone(),
                        agent_id: p.identity.agent_id.clone(),
                        parent_program_id: p.identity.parent_program_id.clone(),
                        root_program_id: p.identity.root_program_id.clone(),
                        expected_resume: p.identity.expected_resume,
                        blocks_parent: p.identity.blocks_parent,
                        agent_role: p.identity.agent_role.clone(),
                        spawn_reason: p.identity.spawn_reason.clone(),
                        workflow_profile_id: None,
                        profile_version: None,
                        step_id: p.last_step,
                        request_id: p.identity.request_id.clone(),
                        request_priority: p.identity.priority,
                        request_deadline_seconds: p.identity.deadline_seconds,
                        expected_output_tokens: p.identity.expected_output_length,
                        kv_retention_ttl_seconds: p.identity.kv_retention_ttl_seconds,
                        generation: p.generation,
                        home_target: r.id.clone(),
                        last_target: p.last_rank.and_then(target),
                        placement: p.placement,
                        kind_tier: (cfg.resume_order
                            == crate::config::program::ResumeOrder::KindSize)
                            .then(|| s.kind_tier_steps(*slot)),
                        context_tokens: p.context_tokens,
                        estimated_context_tokens: p.context_tokens,
                        shared_prefix_tokens: p.shared_prefix,
                        shared_prefix_freshness_remaining_seconds: if p.shared_prefix > 0 {
                            (p.shared_at + freshness - now).max(0.0)
                        } else {
                            0.0
                        },
                        logical_tokens: logical,
                        private_tokens: logical - shared,
                        reserved_tokens: p.reserved,
                        in_flight_requests: p.in_flight,
                        queued_requests: p.retained,
                        waiting_requests: p.retained,
                        rounds_in_segment: p.rounds,
                        segment_served_rounds: p.rounds,
                        rounds_since_activation: if p.active() { p.rounds } else { 0 },
                        rounds_since_ttl_pause: p.rounds_since_ttl_pause,
                        pause_when_idle: p.pause_on_complete,
                        armed_ttl_seconds: p.armed_ttl,
                        predicted_ttl_seconds: p.last_complete.map(|_| p.armed_ttl),
                        ttl_remaining_seconds: remaining,
                        acting_seconds: acting_for,
                        queued_seconds: waits.get(slot).copied(),
                        force_resume_remaining_seconds: force
                            .get(slot)
                            .map(|at| (at - now).max(0.0)),
                        force_resume_timeout_seconds: (p.retained > 0).then_some(force_after),
                        force_resume_active_remaining_rounds: f64::from(in_flight),
                        force_resume_pool_remaining_rounds: r.queue.len() as f64,
                        force_resume_request_throughput_per_second: rate,
                        last_return_actual_seconds: p.last_return,
                        last_output_actual_tokens: p.last_output,
                        predicted_return_probability: None,
                        return_prediction_support: None,
                        return_prediction_online_support: None,
                        return_prediction_backoff_level: None,
                        return_prediction_source: None,
                        predicted_output_tokens: None,
                        predicted_output_p50: None,
                        predicted_output_p95: None,
                        predicted_output_p99: None,
                        output_prediction_support: None,
                        output_prediction_online_support: None,
                        output_prediction_backoff_level: None,
                        output_prediction_source: None,
                        output_prediction_mature: None,
                        idle_seconds: (now - p.last_activity).max(0.0),
                    }
                })
                .collect();
            listed.sort_by(|a, b| a.idle_seconds.total_cmp(&b.idle_seconds));
            listed.truncate(max_programs);
            RankDiagnostics {
                target_id: r.id.clone(),
                base_url: info.get(i).map(|x| x.base_url.clone()).unwrap_or_default(),
                dp_rank: info.get(i).and_then(|x| x.dp_rank),
                configured_token_capacity: cfg.token_capacity_per_dp_rank,
                token_capacity: cap,
                capacity_source: source.as_str(),
                router_estimated_used_tokens: r.used_tokens,
                router_estimated_headroom_tokens: cap.map(|c| c.saturating_sub(r.used_tokens)),
                overcommit_ratio: r.overcommit,
                held_resume_share: s.held_resume_share(i),
                vllm_usage_scaled_tokens: scaled,
                router_minus_vllm_used_tokens: scaled.map(|v| r.used_tokens as i64 - v as i64),
                observed_active_reasoning_tokens: reserved_where(&reasoning),
                observed_active_program_tokens: reserved_where(&|p| {
                    matches!(p, Phase::Reasoning | Phase::Acting { .. })
                }),
                tracked_active_reasoning_requests: reasoning_requests,
                observed_router_active_reasoning_programs: count(&reasoning),
                observed_router_active_reasoning_requests: reasoning_requests,
                active_program_token_delta_since_observation: r.used_tokens as f64
                    - r.used_at_observation as f64,
                future_pause_relief_tokens: programs
                    .iter()
                    .filter(|(_, p)| p.pause_on_complete)
                    .map(|(_, p)| p.reserved)
                    .sum(),
                active_acting_private_tokens: reserved_where(&|p| matches!(p, Phase::Acting { .. })),
                vllm_kv_cache_usage: obs.map(|(_, o)| o.kv_usage),
                vllm_running_requests: obs.map(|(_, o)| o.running),
                vllm_waiting_requests: obs.map(|(_, o)| o.waiting),
                observation_age_seconds: obs.map(|(at, _)| (now - at).max(0.0)),
                observation_fresh: fresh,
                capacity_accounting_source: match (source, fresh) {
                    (CapacitySource::ProgramCount, _) => "program_count",
                    (_, true) => "backend_observation",
                    (_, false) => "router_ledger",
                },
                router_active_programs: r.active_programs,
                router_active_reasoning_programs: count(&|p| matches!(p, Phase::Reasoning)),
                router_active_acting_programs: count(&|p| matches!(p, Phase::Acting { .. })),
                router_paused_programs: count(&|p| matches!(p, Phase::Paused { .. })),
                router_paused_reasoning_programs: count(&|p| {
                    matches!(p, Phase::Paused { reason, .. } if *reason == PauseReason::CapacityRepair)
                }),
                router_paused_acting_programs: count(&|p| {
                    matches!(p, Phase::Paused { reason, .. } if *reason != PauseReason::CapacityRepair)
                }),
                router_in_flight_requests: in_flight,
                router_queued_requests: r.queue.len(),
                router_queued_demand_tokens: r.queued_demand,
                router_finished_programs: r.finished,
                router_queued_programs: programs.iter().filter(|(_, p)| p.retained > 0).count()
                    as u32,
                rolling: Rolling {
                    request_samples: r.requests.prompt_tokens.len(),
                    request_window_complete: r.requests.prompt_tokens.complete(),
                    avg_prompt_tokens: r.requests.prompt_tokens.mean(),
                    avg_completion_tokens: r.requests.completion_tokens.mean(),
                    avg_cached_prompt_tokens: r.requests.cached_tokens.mean(),
                    avg_cached_prompt_ratio: r.requests.cached_ratio.mean(),
                    avg_e2e_seconds: r.requests.e2e_seconds.mean(),
                    avg_decode_seconds: None,
                    avg_router_queue_seconds: r.requests.queue_seconds.mean(),
                    continuity_samples: r.intervals.len(),
                    continuity_window_complete: r.intervals.complete(),
                    avg_request_interval_seconds: r.intervals.mean(),
                    ttl_pause_samples: r.segment_rounds.len(),
                    avg_rounds_since_ttl_pause: r.segment_rounds.mean(),
                    fitted_acting_ttl_seconds: s.fitted_ttl(i, mean_context, now),
                    growth_samples: r.growth.len(),
                    avg_context_growth_tokens: r.growth.mean(),
                    request_throughput_per_second: r.throughput.requests_per_second(),
                    kv_write_tokens_per_second: r.throughput.tokens_per_second(),
                    avg_segment_rounds: r.segment_rounds.mean(),
                    shared_prefix_freshness_seconds: freshness,
                    force_resume_deadline_seconds: s.force_resume_after(i),
                    drain_seconds: s.drain_seconds(i),
                },
                programs: listed,
            }
        })
        .collect();
    Diagnostics {
        enabled: true,
        binding_only: cfg.binding_only,
        global_queue: cfg.global_queue,
        resume_order: match cfg.resume_order {
            crate::config::program::ResumeOrder::Mru => "mru",
            crate::config::program::ResumeOrder::Fcfs => "fcfs",
            crate::config::program::ResumeOrder::LastUse => "last_use",
            crate::config::program::ResumeOrder::KindSize => "kind_size",
        },
        program_kinds: s.kinds_kept(),
        program_kinds_apart: s.kinds_apart(),
        program_kinds_hold_free: s.kinds_hold_free(),
        program_size_mean_tokens: s.program_size_mean(),
        cross_rank_headroom_ratio: cfg.cross_rank_headroom_ratio,
        cross_rank_min_wait_ratio: s.min_wait_ratio(),
        retained_requests: s.retained_requests(),
        token_estimate_coefficient: coefficient,
        prediction_mode: "off",
        return_time_profile_keys: u32::try_from(s.tools.len()).unwrap_or(u32::MAX),
        output_length_profile_keys: 0,
        token_estimation: vec![TokenEstimation {
            model_pool: "all",
            endpoint: "all",
            tokens_per_byte: coefficient,
        }],
        counters: CounterDiagnostics {
            queue_timeouts: s.counters.queue_timeouts,
            force_resumes: s.counters.force_resumes,
            cross_rank_migrations: s.counters.cross_rank_migrations,
            batch_gain_admissions: s.counters.batch_gain_admissions,
            backfill_admissions: s.counters.backfill_admissions,
            engine_room_admissions: s.counters.engine_room_admissions,
            hold_free_admissions: s.counters.hold_free_admissions,
            idle_finishes: s.counters.idle_finishes,
        },
        ranks,
    }
}
