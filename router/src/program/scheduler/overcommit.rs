//! Adaptive overcommit: how far past `low_watermark_ratio` a rank admits.
//!
//! The ledger reserves each admitted Program's whole context plus its output and growth
//! allowances, and keeps paused Programs' KV for their TTL, so under heavy load part of the KV
//! it counts as taken is idle. Admitting past it trades paused Programs' cached prefixes for less
//! waiting. That pays when the wait is long next to what a lost prefix costs, and stops paying
//! once prefixes are actually lost. Once per observation of a rank: when the request next in
//! line has waited longer than `adaptive_overcommit_wait_ratio` × the cache-miss impact of the
//! rank's mean Program, the overcommit grows by `adaptive_overcommit_step_ratio` up to
//! `adaptive_overcommit_max_ratio`; a Program that came back to find its prefix evicted resets
//! it to 0. It grows only where Programs run at most `adaptive_overcommit_max_rounds` rounds per
//! activation: what it admits then leaves soon, while a long activation would hold the excess
//! for a whole session and cost the prefixes it displaces.
//!
//! Hold-free slack: on a rank where none of the latest resumed Programs had held its place (a
//! person's think time, tool calls longer than any hold), the ledger's margin protects no held
//! prefix, only what the engine's LRU happens to keep. There a queued request is admitted once
//! all but `hold_free_admission_slack_ratio` of its demand fits: the engine starts its prefill in
//! the free blocks while running requests finish, instead of leaving them idle until the whole
//! demand is free. With `hold_free_admission_by_kind`, so is a request on any rank whose
//! Program's kind is hold-free (chat beside agents): the request would not have been held
//! either way, and admitting it takes no more than the slack past the watermark.

use super::*;

impl Scheduler {
    /// `low_watermark_ratio` plus the rank's adaptive overcommit: admission's share of capacity.
    pub fn low_ratio(&self, rank: Rank) -> f64 {
        self.cfg.low_watermark_ratio + self.ranks[rank].overcommit
    }

    /// The rank's adaptive overcommit now (0 for a rank that does not exist).
    pub fn overcommit(&self, rank: Rank) -> f64 {
        self.ranks.get(rank).map_or(0.0, |r| r.overcommit)
    }

    /// One step of the controller for `rank`, at an observation.
    pub(super) fn adapt_overcommit(&mut self, rank: Rank, now: f64) {
        let max = self.cfg.adaptive_overcommit_max_ratio;
        let r = &self.ranks[rank];
        let head_wait = r
            .queue
            .first()
            .and_then(|h| self.retained.get(&h.ticket))
            .map(|h| now - h.since);
        let mean_context = match r.active_programs {
            0 => 0,
            n => r.used_tokens / u64::from(n),
        };
        let miss = cache_miss_impact_seconds(&self.cfg.prefill_cost_model, mean_context);
        // With no activation measured yet, one round (as the force-resume deadline assumes).
        let rounds = r.segment_rounds.mean().unwrap_or(1.0);
        let grow = head_wait.is_some_and(|w| w > self.cfg.adaptive_overcommit_wait_ratio * miss)
            && rounds <= self.cfg.adaptive_overcommit_max_rounds;
        let step = self.cfg.adaptive_overcommit_step_ratio;
        let r = &mut self.ranks[rank];
        if std::mem::take(&mut r.resume_miss) {
            r.overcommit = 0.0;
        } else if grow {
            r.overcommit = (r.overcommit + step).min(max);
        }
        // A lowered maximum (a reload) applies at once.
        r.overcommit = r.overcommit.min(max);
    }

    /// Completions a rank's windows need before the scheduler reads them (throughput for the
    /// force-resume deadline, held resumes for hold-free slack).
    pub(super) fn min_samples(&self) -> usize {
        (self.cfg.stats_window_size as usize).clamp(2, 16)
    }

    /// Share of the rank's latest resumed Programs that had held their place; `None` until
    /// [`Self::min_samples`] have resumed.
    pub fn held_resume_share(&self, rank: Rank) -> Option<f64> {
        let w = &self.ranks.get(rank)?.held_resumes;
        (w.len() >= self.min_samples()).then(|| w.mean()).flatten()
    }

    /// Tokens past capacity × the low watermark that a request of the Program in `slot`
    /// needing `demand` may take on `rank`: `hold_free_admission_slack_ratio` × `demand` on a
    /// hold-free rank (no held resume in its window) or, with `hold_free_admission_by_kind`,
    /// for a Program of a hold-free kind ([`Self::kind_hold_free`]); else 0.
    pub(super) fn hold_free_slack(&self, rank: Rank, demand: u64, slot: usize) -> u64 {
        let rank_free = self
            .held_resume_share(rank)
            .is_some_and(|share| share <= 0.0);
        if rank_free || self.cfg.hold_free_admission_by_kind && self.kind_hold_free(slot) {
            (self.cfg.hold_free_admission_slack_ratio * demand as f64) as u64
        } else {
            0
        }
    }

    /// Whether none of the latest `stats_window_size` resumed Programs of the kind of the
    /// Program in `slot` had held its place, once [`Self::min_samples`] of them resumed.
    pub(super) fn kind_hold_free(&self, slot: usize) -> bool {
        let window = self.cfg.stats_window_size as usize;
        self.kinds
            .hold_free(self.kind(slot), window, self.min_samples())
    }

    /// Kinds of Program kept that are hold-free (diagnostics).
    pub fn kinds_hold_free(&self) -> usize {
        let window = self.cfg.stats_window_size as usize;
        self.kinds.hold_free_count(window, self.min_samples())
    }
}
