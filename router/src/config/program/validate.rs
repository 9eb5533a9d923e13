//! Validation of the `program_scheduling` config: every constraint of the spec and of our
//! extensions, each error naming its field.

use super::*;
use crate::config::ConfigError;

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("program_scheduling.{field}"), message)
}

fn finite_min(field: &str, v: f64, min: f64, strict: bool) -> Result<(), ConfigError> {
    let ok = v.is_finite() && if strict { v > min } else { v >= min };
    if ok {
        Ok(())
    } else {
        let op = if strict { ">" } else { ">=" };
        Err(err(
            field,
            format!("must be finite and {op} {min} (got {v})"),
        ))
    }
}

impl ProgramSchedulingConfig {
    /// Checks every constraint of the spec; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MAX_STATS_WINDOW: u32 = 100_000;
        // Each kept tool holds a window of `stats_window_size` samples.
        const MAX_TOOLS: u32 = 1_024;
        // A day: far beyond any queue timeout, and far from overflowing the queue's order key.
        const MAX_DEMAND_AGING_SECONDS: f64 = 86_400.0;
        // Tiers are kinds' sizes over the fleet's: at a million to one every kind is the fleet's.
        const MAX_KIND_SIZE_TIER_RATIO: f64 = 1e6;
        // Queues a thousand ranks deep: the queue timeout ends them long before.
        const MAX_QUEUED_RATIO: f64 = 1_000.0;
        finite_min(
            "cross_rank_headroom_ratio",
            self.cross_rank_headroom_ratio,
            0.0,
            false,
        )?;
        if let Some(k) = self.cross_rank_min_wait_ratio {
            finite_min("cross_rank_min_wait_ratio", k, 0.0, false)?;
        }
        if self.queue_backfill_depth > MAX_QUEUE_BACKFILL_DEPTH {
            return Err(err(
                "queue_backfill_depth",
                format!("must be at most {MAX_QUEUE_BACKFILL_DEPTH}"),
            ));
        }
        if !(1..=crate::config::MAX_VIRTUAL_NODES).contains(&self.hash_virtual_nodes) {
            return Err(err(
                "hash_virtual_nodes",
                format!("must be between 1 and {}", crate::config::MAX_VIRTUAL_NODES),
            ));
        }
        if self.token_capacity_per_dp_rank == Some(0) {
            return Err(err("token_capacity_per_dp_rank", "must be > 0 or null"));
        }
        if self.max_active_programs_per_target == 0 {
            return Err(err("max_active_programs_per_target", "must be >= 1"));
        }
        if self.max_retained_requests == 0 {
            return Err(err("max_retained_requests", "must be >= 1"));
        }
        if self.max_programs == 0 {
            return Err(err("max_programs", "must be >= 1"));
        }
        finite_min(
            "metrics_interval_seconds",
            self.metrics_interval_seconds,
            0.0,
            true,
        )?;
        finite_min(
            "queue_timeout_seconds",
            self.queue_timeout_seconds,
            0.0,
            true,
        )?;
        finite_min(
            "force_resume_timeout_seconds",
            self.force_resume_timeout_seconds,
            0.0,
            true,
        )?;
        if self.force_resume_timeout_seconds > self.queue_timeout_seconds {
            return Err(err(
                "force_resume_timeout_seconds",
                format!(
                    "must be <= queue_timeout_seconds ({} > {})",
                    self.force_resume_timeout_seconds, self.queue_timeout_seconds
                ),
            ));
        }
        finite_min(
            "paused_retention_ttl_seconds",
            self.paused_retention_ttl_seconds,
            0.0,
            true,
        )?;
        finite_min(
            "shared_prefix_freshness_warmup_seconds",
            self.shared_prefix_freshness_warmup_seconds,
            0.0,
            true,
        )?;
        finite_min(
            "shared_prefix_freshness_kv_turnovers",
            self.shared_prefix_freshness_kv_turnovers,
            0.0,
            true,
        )?;
        finite_min(
            "max_acting_ttl_seconds",
            self.max_acting_ttl_seconds,
            0.0,
            false,
        )?;
        finite_min("low_watermark_ratio", self.low_watermark_ratio, 0.0, true)?;
        finite_min(
            "adaptive_overcommit_max_ratio",
            self.adaptive_overcommit_max_ratio,
            0.0,
            false,
        )?;
        finite_min(
            "adaptive_overcommit_step_ratio",
            self.adaptive_overcommit_step_ratio,
            0.0,
            false,
        )?;
        finite_min(
            "adaptive_overcommit_wait_ratio",
            self.adaptive_overcommit_wait_ratio,
            0.0,
            false,
        )?;
        finite_min(
            "adaptive_overcommit_max_rounds",
            self.adaptive_overcommit_max_rounds,
            0.0,
            false,
        )?;
        finite_min(
            "hold_free_admission_slack_ratio",
            self.hold_free_admission_slack_ratio,
            0.0,
            false,
        )?;
        if self.hold_free_admission_slack_ratio > 1.0 {
            return Err(err("hold_free_admission_slack_ratio", "must be at most 1"));
        }
        finite_min(
            "growth_reserve_min_rounds",
            self.growth_reserve_min_rounds,
            0.0,
            false,
        )?;
        finite_min(
            "new_program_demand_aging_seconds",
            self.new_program_demand_aging_seconds,
            0.0,
            false,
        )?;
        if self.new_program_demand_aging_seconds > MAX_DEMAND_AGING_SECONDS {
            return Err(err(
                "new_program_demand_aging_seconds",
                format!("must be at most {MAX_DEMAND_AGING_SECONDS}"),
            ));
        }
        finite_min(
            "resume_most_turns_first_min_queued_ratio",
            self.resume_most_turns_first_min_queued_ratio,
            0.0,
            false,
        )?;
        if self.resume_most_turns_first_min_queued_ratio > MAX_QUEUED_RATIO {
            return Err(err(
                "resume_most_turns_first_min_queued_ratio",
                format!("must be at most {MAX_QUEUED_RATIO}"),
            ));
        }
        if !(self.kind_size_tier_ratio.is_finite()
            && self.kind_size_tier_ratio > 1.0
            && self.kind_size_tier_ratio <= MAX_KIND_SIZE_TIER_RATIO)
        {
            return Err(err(
                "kind_size_tier_ratio",
                format!("must be a number above 1 and at most {MAX_KIND_SIZE_TIER_RATIO}"),
            ));
        }
        finite_min("high_watermark_ratio", self.high_watermark_ratio, 0.0, true)?;
        if self.high_watermark_ratio < self.low_watermark_ratio {
            return Err(err(
                "high_watermark_ratio",
                format!(
                    "must be >= low_watermark_ratio ({} < {})",
                    self.high_watermark_ratio, self.low_watermark_ratio
                ),
            ));
        }
        if self.max_segment_rounds == 0 {
            return Err(err("max_segment_rounds", "must be >= 1"));
        }
        finite_min(
            "segment_yield_max_context_ratio",
            self.segment_yield_max_context_ratio,
            0.0,
            true,
        )?;
        // Each rank keeps windows of this many samples, allocated up front.
        if !(1..=MAX_STATS_WINDOW).contains(&self.stats_window_size) {
            return Err(err(
                "stats_window_size",
                format!("must be between 1 and {MAX_STATS_WINDOW}"),
            ));
        }
        finite_min(
            "force_resume_workload_factor",
            self.force_resume_workload_factor,
            0.0,
            false,
        )?;
        finite_min(
            "force_resume_engine_grace_seconds",
            self.force_resume_engine_grace_seconds,
            0.0,
            false,
        )?;
        finite_min("finished_idle_ratio", self.finished_idle_ratio, 0.0, false)?;
        finite_min(
            "miss_impact_backlog_weight",
            self.miss_impact_backlog_weight,
            0.0,
            false,
        )?;
        if let Some(n) = self.ttl_min_samples
            && (n == 0 || n > self.stats_window_size)
        {
            return Err(err(
                "ttl_min_samples",
                "must be within 1..=stats_window_size",
            ));
        }
        if self.tool_ttl_min_samples > self.stats_window_size {
            return Err(err(
                "tool_ttl_min_samples",
                "must be within 0..=stats_window_size",
            ));
        }
        if self.max_tools > MAX_TOOLS {
            return Err(err("max_tools", format!("must be at most {MAX_TOOLS}")));
        }
        if self.binding_strategy == BindingStrategy::ReasoningTokenBalance
            && self.token_capacity_per_dp_rank.is_none()
        {
            return Err(err(
                "binding_strategy",
                "reasoning_token_balance requires token_capacity_per_dp_rank",
            ));
        }
        let p = &self.prefill_cost_model;
        finite_min(
            "prefill_cost_model.intercept_seconds",
            p.intercept_seconds,
            0.0,
            false,
        )?;
        finite_min(
            "prefill_cost_model.linear_seconds_per_1k_tokens",
            p.linear_seconds_per_1k_tokens,
            0.0,
            false,
        )?;
        finite_min(
            "prefill_cost_model.quadratic_seconds_per_1k_tokens_squared",
            p.quadratic_seconds_per_1k_tokens_squared,
            0.0,
            false,
        )?;
        if !p.decode_throughput_alpha.is_finite()
            || !(0.0..=1.0).contains(&p.decode_throughput_alpha)
        {
            return Err(err(
                "prefill_cost_model.decode_throughput_alpha",
                format!("must be within [0, 1] (got {})", p.decode_throughput_alpha),
            ));
        }
        let d = &self.decode_throughput_model;
        finite_min(
            "decode_throughput_model.fixed_step_seconds",
            d.fixed_step_seconds,
            0.0,
            true,
        )?;
        finite_min(
            "decode_throughput_model.batch_step_seconds_per_request",
            d.batch_step_seconds_per_request,
            0.0,
            false,
        )?;
        finite_min(
            "decode_throughput_model.context_step_seconds_per_token",
            d.context_step_seconds_per_token,
            0.0,
            false,
        )?;
        Ok(())
    }
}
