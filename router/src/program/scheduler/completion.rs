//! Completion of a request: usage into the Program's context and the rank's windows, then
//! the Progress-TTL (acting) or a pause, with the automatic TTL's choice.

use super::*;

impl Scheduler {
    /// A dispatched request finished with `usage` (`None` if the backend reported none). A
    /// Program whose rank became unreachable moves once its last request there ended.
    pub fn on_complete(&mut self, now: f64, ticket: Ticket, usage: Option<Usage>) -> Vec<Decision> {
        self.on_complete_with_tool(now, ticket, usage, ToolCall::Unknown)
    }

    /// [`Scheduler::on_complete`] for a response of which the data plane read `tool`: the
    /// name of its first tool call, that it called none, or nothing known.
    pub fn on_complete_with_tool(
        &mut self,
        now: f64,
        ticket: Ticket,
        usage: Option<Usage>,
        tool: ToolCall<'_>,
    ) -> Vec<Decision> {
        let slot = self.in_flight.get(&ticket).map(|f| f.program);
        let labeled = match tool {
            ToolCall::Named(name) if slot.is_some() && self.cfg.tool_ttl_min_samples > 0 => {
                let id = self.tools.label(name);
                if id.is_none() {
                    self.notes.push(Note::Shed {
                        reason: "tool_unlabeled",
                    });
                }
                id
            }
            _ => None,
        };
        let mut out = self.complete(now, ticket, usage, (tool, labeled));
        if let Some(slot) = slot
            && let Some(home) = self.rehome(slot, now)
        {
            self.pump(home, now, &mut out);
        }
        out
    }

    /// `tool`: what was read of the response's tool calls, and the kept tool it called.
    fn complete(
        &mut self,
        now: f64,
        ticket: Ticket,
        usage: Option<Usage>,
        (called, tool): (ToolCall<'_>, Option<ToolId>),
    ) -> Vec<Decision> {
        let usage = usage.map(Usage::bounded);
        let mut out = Vec::new();
        let Some(f) = self.in_flight.remove(&ticket) else {
            return out;
        };
        let rank = f.rank;
        let binding_only = self.cfg.binding_only;
        let queue_pressure = !self.ranks[rank].queue.is_empty();
        let answer_ends = self.cfg.answer_ends_program;
        let p = self.program_mut(f.program);
        p.in_flight = p.in_flight.saturating_sub(1);
        p.last_complete = Some(now);
        p.last_activity = now;
        p.last_tool = tool;
        // An agent (it called a tool before) answering without one hands its turn back to a
        // person: the end of its loop, unless its client says whether it resumes.
        let answered = answer_ends
            && called == ToolCall::None
            && p.called_tool
            && !p.identity.resume_stated
            && f.kv_retention_ttl.is_none();
        p.called_tool |= matches!(called, ToolCall::Named(_));
        let prev_context = p.context_tokens;
        let mut shared = None;
        let mut rehit = None;
        p.rounds_since_ttl_pause += 1;
        let mut discontinuity = None;
        let mut resume_miss = false;
        let resumed = usage.is_some() && prev_context > 0 && !p.fresh_start;
        if let Some(u) = usage {
            // Less than half its context cached: its prefix was evicted (a miss on its rank
            // unless this is its first run there).
            let lost = prev_context > 0 && u.cached_tokens * 2 < prev_context;
            resume_miss = lost && !p.fresh_start;
            if f.held && p.last_hit && lost {
                discontinuity = Some((p.key.1.clone(), prev_context, u.cached_tokens));
            }
            p.last_hit = u.cached_tokens > 0;
            p.last_output = Some(u.completion_tokens);
            p.context_tokens = u.prompt_tokens + u.completion_tokens;
            if std::mem::take(&mut p.fresh_start) {
                // First run on this placement: whatever was cached came from other Programs.
                p.shared_prefix = u.cached_tokens.min(u.prompt_tokens);
                p.shared_at = now;
                shared = Some(p.shared_prefix);
            } else if p.shared_prefix > 0 && u.cached_tokens >= p.shared_prefix {
                rehit = Some((p.shared_prefix, p.lead));
            }
        }
        let context = p.context_tokens;
        if resume_miss {
            self.ranks[rank].resume_miss = true;
        }
        if resumed {
            self.ranks[rank]
                .held_resumes
                .push(if f.held { 1.0 } else { 0.0 });
            let kind = self.kind(f.program);
            if let Some(replaced) = self.kinds.resumed(kind, f.held) {
                self.notes.push(Note::Shed {
                    reason: replaced.reason(),
                });
            }
        }
        if let Some(u) = usage {
            let r = &mut self.ranks[rank];
            // KV newly written: the prompt's uncached part and the output. Cached prompt
            // tokens take no new blocks, so they do not turn the rank's KV over.
            r.throughput.push(
                now,
                u.prompt_tokens.saturating_sub(u.cached_tokens) + u.completion_tokens,
            );
            r.requests.push(
                u.prompt_tokens,
                u.completion_tokens,
                u.cached_tokens,
                (now - f.dispatched_at).max(0.0),
                f.queued.max(0.0),
            );
        }
        if let Some((program, expected, cached)) = discontinuity {
            self.notes.push(Note::CacheDiscontinuity {
                program,
                rank,
                expected,
                cached,
            });
        }
        if let Some(tokens) = shared {
            self.notes.push(Note::SharedPrefix { rank, tokens });
            if tokens > 0 && tokens >= self.shared_floor(rank, now) {
                let lead = self.program(f.program).lead;
                let r = &mut self.ranks[rank];
                r.shared_prefix = Some((tokens, now));
                r.shared_lead = lead;
            }
        }
        if let Some((tokens, lead)) = rehit {
            self.rehit_shared(f.program, rank, tokens, lead, now);
        }
        if usage.is_some() && prev_context > 0 {
            let growth = context as f64 - prev_context as f64;
            self.ranks[rank].growth.push(growth);
            self.notes.push(Note::ContextGrowth {
                rank,
                tokens: growth,
            });
        }
        if binding_only {
            // Nothing to schedule, but the binding is forgotten after the paused retention like
            // any idle Program's (or a long-running router would keep every Program forever).
            if self.program(f.program).in_flight == 0 {
                self.finish_if_done(f.program, answered);
                self.release_later(f.program, now);
            }
            return out;
        }
        if self.program(f.program).in_flight > 0 {
            return out;
        }
        // Hold exactly the context just computed, less a prefix other Programs keep cached.
        let shared = self.fresh_shared(self.program(f.program), now).min(context);
        let held = context - shared + self.cfg.decode_buffer_tokens;
        let p = self.program_mut(f.program);
        if p.active() {
            let before = p.reserved;
            p.reserved = held;
            let r = &mut self.ranks[rank];
            r.used_tokens = (r.used_tokens + held).saturating_sub(before);
        }
        let p = self.program(f.program);
        let reason = if !p.identity.expected_resume {
            Some(PauseReason::NoResumeExpected)
        } else if answered {
            Some(PauseReason::Answered)
        } else if p.pause_on_complete {
            Some(PauseReason::CapacityRepair)
        } else if p.rounds + 1 >= self.cfg.max_segment_rounds
            && queue_pressure
            && self.may_yield(f.program, rank, context, now)
        {
            Some(PauseReason::SegmentYield)
        } else {
            None
        };
        let (ttl, source) = match (reason, f.kv_retention_ttl) {
            (Some(_), _) => (0.0, None),
            (None, Some(t)) => (t, Some(TtlSource::Request)),
            (None, None) => (
                self.auto_ttl(rank, context, now, tool),
                Some(TtlSource::Fitted),
            ),
        };
        if let Some(source) = source {
            let program = self.program(f.program).key.1.clone();
            self.notes.push(Note::TtlArmed {
                program,
                rank,
                seconds: ttl,
                source,
            });
        }
        let p = self.program_mut(f.program);
        p.rounds += 1;
        if ttl > 0.0 {
            p.phase = Phase::Acting { until: now + ttl };
            p.armed_ttl = ttl;
            p.timer_gen += 1;
            let generation = p.timer_gen;
            self.timer(
                now + ttl,
                TimerKind::TtlExpiry,
                f.program as u64,
                generation,
            );
        } else {
            p.armed_ttl = 0.0;
            self.pause(f.program, reason.unwrap_or(PauseReason::TtlExpired), now);
        }
        self.finish_if_done(f.program, answered);
        self.pump(rank, now, &mut out);
        out
    }

    /// Marks the Program finished when its last request said no further request follows, or
    /// its response just `answered` (ended its turn, `answer_ends_program`), and nothing else
    /// of it is active, queued or in flight.
    fn finish_if_done(&mut self, slot: usize, answered: bool) {
        let p = self.program(slot);
        let ended = !p.identity.expected_resume || answered;
        if ended && !p.active() && p.in_flight == 0 && p.retained == 0 {
            self.set_finished(slot, true);
        }
    }

    /// The automatic acting TTL for a Program with `context` tokens on `rank`. The noted impact
    /// is the spec's (the calibrated re-prefill alone); the TTL weighs in the rank's backlog.
    pub(super) fn auto_ttl(
        &mut self,
        rank: Rank,
        context: u64,
        now: f64,
        tool: Option<ToolId>,
    ) -> f64 {
        let impact = cache_miss_impact_seconds(&self.cfg.prefill_cost_model, context);
        self.notes.push(Note::CacheMissImpact {
            rank,
            seconds: impact,
        });
        self.fitted_ttl_after(rank, context, now, tool)
    }

    /// The automatic acting TTL `rank`'s evidence gives a Program with `context` tokens at `now`.
    pub(crate) fn fitted_ttl(&self, rank: Rank, context: u64, now: f64) -> f64 {
        self.fitted_ttl_after(rank, context, now, None)
    }

    /// [`Scheduler::fitted_ttl`] after a call of `tool`. The tool's own intervals, once there
    /// are `tool_ttl_min_samples` of them, may lengthen the rank's TTL but never shorten it, and
    /// do not apply once a waiting request has reached its force-resume deadline: a longer
    /// hold would keep it waiting longer. Shortening was measured to lose
    /// (docs/generalization.md, "Holds by the tool called").
    pub(crate) fn fitted_ttl_after(
        &self,
        rank: Rank,
        context: u64,
        now: f64,
        tool: Option<ToolId>,
    ) -> f64 {
        let impact = cache_miss_impact_seconds(&self.cfg.prefill_cost_model, context)
            * self.backlog_factor(rank);
        let share = self.reserved_share(rank, now);
        let fit = |w: &Window| {
            best_ttl(
                &w.sorted(),
                impact,
                self.cfg.max_acting_ttl_seconds,
                self.hold_cost(rank, context),
                share,
            )
        };
        let by_rank = self.evidence(rank).map_or(0.0, fit);
        let needed = self.cfg.tool_ttl_min_samples as usize;
        match tool.and_then(|t| self.tools.evidence(t, needed)) {
            Some(w) if self.waiting_progress(rank, now) < 1.0 => fit(w).max(by_rank),
            _ => by_rank,
        }
    }

    /// The share of a hold on `rank` charged as the whole TTL in the automatic TTL's utility, the
    /// rest at the hold's expected length (`acting_ttl_hold`): 1 under `reserved`; under
    /// `expected`, how far the rank's longest-waiting request has come toward its force-resume
    /// deadline — 0 with nothing waiting, 1 once one is forced — so that longer holds give way
    /// as waiting requests near their deadline. Logarithmic in the queue (forced requests head
    /// it; the arrival index gives the longest-waiting).
    pub(crate) fn reserved_share(&self, rank: Rank, now: f64) -> f64 {
        if self.cfg.acting_ttl_hold == ActingTtlHold::Reserved {
            return 1.0;
        }
        self.waiting_progress(rank, now)
    }

    /// How far the longest-waiting request on `rank` has come toward its force-resume deadline:
    /// 0 with nothing waiting, 1 once one is forced.
    fn waiting_progress(&self, rank: Rank, now: f64) -> f64 {
        let r = &self.ranks[rank];
        if r.queue.first().is_some_and(|k| !k.not_forced) {
            return 1.0;
        }
        let Some(oldest) = r
            .by_arrival
            .values()
            .next()
            .and_then(|t| self.retained.get(t))
        else {
            return 0.0;
        };
        let span = oldest.force_at - oldest.since;
        if span <= 0.0 {
            1.0
        } else {
            ((now - oldest.since) / span).clamp(0.0, 1.0)
        }
    }

    /// Whether Program `slot` (`context` tokens on `rank`) may segment-yield: its context is at
    /// most `segment_yield_max_context_ratio` of the rank's capacity, no capacity is known, or
    /// it stands in the way of a forced request (below).
    fn may_yield(&self, slot: usize, rank: Rank, context: u64, now: f64) -> bool {
        let small = match self.capacity(rank).0 {
            Some(cap) => context as f64 <= self.cfg.segment_yield_max_context_ratio * cap as f64,
            None => true,
        };
        small || self.blocks_forced(slot, rank, now)
    }

    /// The request at the head of `rank`'s queue is past its force-resume deadline and would
    /// fit once Program `slot` gives up its KV. A forced request still needs room; a large
    /// Program served back to back would otherwise keep it waiting until its queue timeout.
    fn blocks_forced(&self, slot: usize, rank: Rank, now: f64) -> bool {
        let r = &self.ranks[rank];
        let Some(head) = r.queue.first().filter(|k| !k.not_forced) else {
            return false;
        };
        let Some(waiting) = self.retained.get(&head.ticket) else {
            return false;
        };
        // The last active Program leaving empties the rank, which takes any demand.
        r.active_programs <= 1
            || self.fits_releasing(rank, waiting.demand, self.program(slot).reserved, now)
    }

    /// What a second of holding `context` tokens on `rank` costs in the TTL's utility
    /// (`acting_ttl_cost`): 1, or the context's share of the rank's KV times the backlog factor
    /// (what waits for that KV pays for it too), at most 1.
    pub(crate) fn hold_cost(&self, rank: Rank, context: u64) -> f64 {
        match (self.cfg.acting_ttl_cost, self.capacity(rank).0) {
            (ActingTtlCost::KvShare, Some(cap)) if cap > 0 => {
                (context as f64 / cap as f64 * self.backlog_factor(rank)).min(1.0)
            }
            _ => 1.0,
        }
    }

    /// What a cache miss on `rank` costs beyond the Program's own re-prefill:
    /// 1 + `miss_impact_backlog_weight` × (requests queued for the rank ÷ its active Programs,
    /// at least 1). The re-prefill takes the rank's time from everything waiting behind it.
    fn backlog_factor(&self, rank: Rank) -> f64 {
        let r = &self.ranks[rank];
        let queued = r.queue.len() as f64;
        1.0 + self.cfg.miss_impact_backlog_weight * queued / f64::from(r.active_programs.max(1))
    }

    /// How long a Program bound to `rank` may idle before it is presumed finished
    /// (`finished_idle_ratio` × the longest interval in the evidence); `None` while the
    /// evidence is short of its samples or the ratio is 0.
    pub(crate) fn idle_horizon(&self, rank: Rank) -> Option<f64> {
        let ratio = self.cfg.finished_idle_ratio;
        if ratio <= 0.0 {
            return None;
        }
        self.evidence(rank).and_then(Window::max).map(|m| m * ratio)
    }

    /// The completion-to-next-request intervals the automatic TTL reads for `rank`
    /// (`ttl_evidence`), once they hold the samples it needs.
    pub(super) fn evidence(&self, rank: Rank) -> Option<&Window> {
        let w = match self.cfg.ttl_evidence {
            crate::config::program::TtlEvidence::Rank => &self.ranks[rank].intervals,
            crate::config::program::TtlEvidence::Pooled => &self.pooled_intervals,
        };
        let needed = self
            .cfg
            .ttl_min_samples
            .unwrap_or(self.cfg.stats_window_size) as usize;
        (w.len() >= needed && !w.is_empty()).then_some(w)
    }
}
