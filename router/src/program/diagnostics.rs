//! `GET /scheduling/diagnostics`: a typed snapshot of the scheduler, field names compatible with
//! the reference router's where the meaning matches, plus capacity source and per-Program state.
//!
//! Pure: built from scheduler state and an explicit `now`.

use serde::Serialize;

use super::scheduler::{CapacitySource, Phase, Scheduler};

#[derive(Debug, Serialize)]
pub struct Diagnostics {
    pub enabled: bool,
    pub binding_only: bool,
    pub global_queue: bool,
    pub resume_order: &'static str,
    pub cross_rank_headroom_ratio: f64,
    pub retained_requests: usize,
    pub token_estimate_coefficient: f64,
    /// Totals since the scheduler started (ours).
    pub counters: CounterDiagnostics,
    pub ranks: Vec<RankDiagnostics>,
}

#[derive(Debug, Serialize)]
pub struct CounterDiagnostics {
    pub queue_timeouts: u64,
    pub force_resumes: u64,
    pub cross_rank_migrations: u64,
    pub batch_gain_admissions: u64,
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
    pub router_in_flight_requests: u32,
    pub router_queued_requests: usize,
    pub rolling: Rolling,
    pub programs: Vec<ProgramDiagnostics>,
}

#[derive(Debug, Serialize)]
pub struct Rolling {
    pub request_samples: usize,
    pub request_window_complete: bool,
    pub avg_request_interval_seconds: Option<f64>,
    pub growth_samples: usize,
    pub avg_context_growth_tokens: Option<f64>,
    /// Completions per second and tokens (prompt + completion) per second over the window.
    pub request_throughput_per_second: Option<f64>,
    pub token_throughput_per_second: Option<f64>,
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
    pub step_id: Option<u64>,
    pub context_tokens: u64,
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
    pub rounds_in_segment: u32,
    pub armed_ttl_seconds: f64,
    pub ttl_remaining_seconds: Option<f64>,
    /// Time until its earliest waiting request is forced (absent when none waits).
    pub force_resume_remaining_seconds: Option<f64>,
    pub idle_seconds: f64,
}

/// Static facts about a rank the scheduler does not keep.
pub struct RankInfo {
    pub base_url: String,
    pub dp_rank: Option<u32>,
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
            let mut listed: Vec<ProgramDiagnostics> = programs
                .iter()
                .map(|(slot, p)| {
                    let logical = p.context_tokens + cfg.decode_buffer_tokens;
                    let shared = s.fresh_shared(p, now).min(p.context_tokens);
                    let (state, status, reason, remaining) = match p.phase {
                        Phase::New => ("queued", "new", None, None),
                        Phase::Reasoning => ("active", "reasoning", None, None),
                        Phase::Acting { until } => {
                            ("active", "acting", None, Some((until - now).max(0.0)))
                        }
                        Phase::Paused { reason, .. } => {
                            ("paused", "paused", Some(reason.as_str()), None)
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
                        step_id: p.last_step,
                        context_tokens: p.context_tokens,
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
                        rounds_in_segment: p.rounds,
                        armed_ttl_seconds: p.armed_ttl,
                        ttl_remaining_seconds: remaining,
                        force_resume_remaining_seconds: force
                            .get(slot)
                            .map(|at| (at - now).max(0.0)),
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
                router_in_flight_requests: programs.iter().map(|(_, p)| p.in_flight).sum(),
                router_queued_requests: r.queue.len(),
                rolling: Rolling {
                    request_samples: r.intervals.len(),
                    request_window_complete: r.intervals.complete(),
                    avg_request_interval_seconds: r.intervals.mean(),
                    growth_samples: r.growth.len(),
                    avg_context_growth_tokens: r.growth.mean(),
                    request_throughput_per_second: r.throughput.requests_per_second(),
                    token_throughput_per_second: r.throughput.tokens_per_second(),
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
        },
        cross_rank_headroom_ratio: cfg.cross_rank_headroom_ratio,
        retained_requests: s.retained_requests(),
        token_estimate_coefficient: coefficient,
        counters: CounterDiagnostics {
            queue_timeouts: s.counters.queue_timeouts,
            force_resumes: s.counters.force_resumes,
            cross_rank_migrations: s.counters.cross_rank_migrations,
            batch_gain_admissions: s.counters.batch_gain_admissions,
        },
        ranks,
    }
}
