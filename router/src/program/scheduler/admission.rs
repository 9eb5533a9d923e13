//! Admission and the RequestPool's pump: a Program's demand, the rank's capacity gates
//! (ledger and watermarks, Program-count guard, vLLM waiting gate), shared-prefix discount,
//! batch-gain admission, force-resume deadlines (and a forced request admitted on the engine's
//! own KV report past its grace), new Programs' queue order, passing a head that does not fit
//! (`queue_backfill_depth`), and cross-rank resume.

use super::*;

impl Scheduler {
    /// Tokens a Program needs on its rank — (context or prompt estimate, less a fresh shared
    /// prefix) + output allowance + growth reserve — and the growth-reserve part of it. The
    /// growth reserve is the rank's mean growth between completions, taken only where
    /// activations run longer than `growth_reserve_min_rounds` on average (or none has been
    /// measured): elsewhere most rounds end their activation, and the next one is admitted
    /// afresh with its grown context.
    pub(super) fn demand(
        &self,
        p: &Program,
        prompt_tokens: u64,
        expected_output: Option<u64>,
        now: f64,
    ) -> (u64, u64) {
        let r = &self.ranks[p.rank];
        let long_activations = r
            .segment_rounds
            .mean()
            .is_none_or(|rounds| rounds > self.cfg.growth_reserve_min_rounds);
        let growth = if r.growth.complete() && long_activations {
            r.growth.mean().unwrap_or(0.0).max(0.0) as u64
        } else {
            0
        };
        let logical = p.context_tokens.max(prompt_tokens);
        let private = logical - self.fresh_shared(p, now).min(logical);
        (
            private + expected_output.unwrap_or(self.cfg.decode_buffer_tokens) + growth,
            growth,
        )
    }

    /// Queue order of a new Program's request on `rank` (work in progress sorts before it):
    /// its arrival in microseconds, aged by `new_program_demand_aging_seconds` × the share of
    /// the rank's KV it asks for (at most the whole). By arrival alone while the capacity is
    /// unknown.
    pub(super) fn new_program_order(&self, rank: Rank, demand: u64, now: f64) -> i64 {
        let aging = match self.capacity(rank).0 {
            Some(cap) if cap > 0 => {
                self.cfg.new_program_demand_aging_seconds * (demand as f64 / cap as f64).min(1.0)
            }
            _ => 0.0,
        };
        us(now + aging).max(0)
    }

    /// Whether `rank`'s queue asks for at least `resume_most_turns_first_min_queued_ratio` × its
    /// capacity (always at 0; never while the capacity is unknown).
    pub(super) fn queue_is_long(&self, rank: Rank) -> bool {
        let ratio = self.cfg.resume_most_turns_first_min_queued_ratio;
        ratio <= 0.0
            || self
                .capacity(rank)
                .0
                .is_some_and(|cap| self.ranks[rank].queued_demand as f64 >= ratio * cap as f64)
    }

    /// A later completion of the Program in `slot` found its `tokens`-long shared prefix cached
    /// again: fresh evidence that the prefix is resident. When the rank's floor counts the same
    /// prefix (the same lead key), or counts none any more, the floor and the Program's discount
    /// are both renewed. A Program whose prefix differs from the floor's keeps its discount only
    /// until its first observation ages out, since the floor does not count its prefix.
    pub(super) fn rehit_shared(
        &mut self,
        slot: usize,
        rank: Rank,
        tokens: u64,
        lead: Option<u64>,
        now: f64,
    ) {
        let Some(lead) = lead else {
            return;
        };
        let floor = self.shared_floor(rank, now);
        let r = &self.ranks[rank];
        let counted = match r.shared_prefix {
            Some((floor_tokens, at))
                if r.shared_lead == Some(lead)
                    && now - at <= self.shared_prefix_freshness(rank) =>
            {
                floor_tokens.max(tokens)
            }
            _ if floor == 0 => tokens,
            _ => return,
        };
        let r = &mut self.ranks[rank];
        r.shared_prefix = Some((counted, now));
        r.shared_lead = Some(lead);
        self.program_mut(slot).shared_at = now;
    }

    /// How long a shared-prefix observation on `rank` stays valid: the warm-up lifetime until
    /// the rank's interval window is mature (or when no estimate exists), then the time for
    /// `shared_prefix_freshness_kv_turnovers` whole-KV-pool turnovers at the rate the rank
    /// writes new KV (uncached prompt and output tokens; cached ones take no new blocks).
    pub fn shared_prefix_freshness(&self, rank: Rank) -> f64 {
        let warmup = self.cfg.shared_prefix_freshness_warmup_seconds;
        let r = &self.ranks[rank];
        if !r.intervals.complete() {
            return warmup;
        }
        match (self.capacity(rank).0, r.throughput.tokens_per_second()) {
            (Some(cap), Some(rate)) if rate > 0.0 => {
                self.cfg.shared_prefix_freshness_kv_turnovers * cap as f64 / rate
            }
            _ => warmup,
        }
    }

    /// Tokens of the rank's shared prefix, counted once in admission while fresh.
    pub(crate) fn shared_floor(&self, rank: Rank, now: f64) -> u64 {
        match self.ranks[rank].shared_prefix {
            Some((tokens, at))
                if self.ranks[rank].growth.complete()
                    && now - at <= self.shared_prefix_freshness(rank) =>
            {
                tokens
            }
            _ => 0,
        }
    }

    /// The Program's shared prefix if its observation is still fresh, else 0. Until the rank's
    /// growth window is complete there is no growth reserve, and the double-counted prefix is
    /// the ledger's only margin for decode growth: nothing is discounted then.
    pub(crate) fn fresh_shared(&self, p: &Program, now: f64) -> u64 {
        if p.shared_prefix > 0
            && self.ranks[p.rank].growth.complete()
            && now - p.shared_at <= self.shared_prefix_freshness(p.rank)
        {
            p.shared_prefix
        } else {
            0
        }
    }

    /// Seconds `rank` needs to serve the work already there — retained requests, one more, and
    /// the rounds its active Programs are expected to run (mean rounds per activation) — at its
    /// measured request throughput; `None` until enough completions are measured.
    pub fn drain_seconds(&self, rank: Rank) -> Option<f64> {
        let r = &self.ranks[rank];
        let min_samples = self.min_samples();
        let rate = r
            .throughput
            .requests_per_second()
            .filter(|x| *x > 0.0 && r.throughput.len() >= min_samples)?;
        // A Program yields after `max_segment_rounds` while others wait, so no activation is
        // expected to run longer than that with work queued.
        let cap = f64::from(self.cfg.max_segment_rounds.max(1));
        let rounds = r.segment_rounds.mean().unwrap_or(1.0).clamp(1.0, cap);
        let work = r.queue.len() as f64 + 1.0 + f64::from(r.active_programs) * rounds;
        Some(work / rate)
    }

    /// Seconds after which a request queued now on `rank` is forced. With
    /// `force_resume_workload_factor` > 0, that factor × [`Self::drain_seconds`] within
    /// [`metrics_interval_seconds`, `force_resume_timeout_seconds`] (the spec's workload-derived
    /// deadline); otherwise, or before throughput is measured, `force_resume_timeout_seconds`.
    pub fn force_resume_after(&self, rank: Rank) -> f64 {
        let limit = self.cfg.force_resume_timeout_seconds;
        let k = self.cfg.force_resume_workload_factor;
        match self.drain_seconds(rank) {
            Some(d) if k > 0.0 => {
                (k * d).clamp(self.cfg.metrics_interval_seconds.min(limit), limit)
            }
            _ => limit,
        }
    }

    /// Batch-gain admission: when only the growth reserve keeps a candidate out, admit it if the
    /// decode throughput it adds over its expected wait covers the risk of running out of
    /// growth room. Benefit = η · W, with η the marginal efficiency of one more request in the
    /// modelled decode batch (`decode_throughput_model`) and W the candidate's expected wait
    /// ([`Self::drain_seconds`]). Cost = P(overflow) · (cache-miss impact of the candidate +
    /// of an average active Program on the rank), P(overflow) the share of the growth reserve
    /// that would be missing. Returns (benefit, cost) when the bypass is taken.
    pub(super) fn batch_gain(
        &self,
        rank: Rank,
        base: u64,
        growth: u64,
        now: f64,
        cap: u64,
    ) -> Option<(f64, f64)> {
        if !self.cfg.enable_batch_gain_admission || growth == 0 {
            return None;
        }
        let r = &self.ranks[rank];
        let room = cap as f64 * self.low_ratio(rank);
        let used = (r.used_tokens + self.shared_floor(rank, now)) as f64;
        if used + base as f64 > room {
            return None; // immediate capacity is never bypassed
        }
        // No throughput measured yet: nothing to model the gain with.
        let wait = self.drain_seconds(rank)?;
        let batch = match self.observation_fresh(rank, now) {
            Some(o) => o.running.max(0.0) as u64,
            None => u64::from(r.active_programs),
        };
        let m = &self.cfg.decode_throughput_model;
        let efficiency = if batch == 0 {
            1.0
        } else {
            let t0 = decode_throughput(m, batch, r.used_tokens);
            let t1 = decode_throughput(m, batch + 1, r.used_tokens + base);
            if t1 <= 0.0 {
                0.0
            } else {
                ((t1 - t0) / (t1 / (batch + 1) as f64)).clamp(0.0, 1.0)
            }
        };
        let benefit = efficiency * wait;
        let shortfall = used + (base + growth) as f64 - room;
        let p_overflow = (shortfall / growth as f64).clamp(0.0, 1.0);
        let mean_context = if r.active_programs > 0 {
            r.used_tokens / u64::from(r.active_programs)
        } else {
            0
        };
        let pc = &self.cfg.prefill_cost_model;
        let cost = p_overflow
            * (cache_miss_impact_seconds(pc, base) + cache_miss_impact_seconds(pc, mean_context));
        (benefit >= cost).then_some((benefit, cost))
    }

    pub(super) fn observation_fresh(&self, rank: Rank, now: f64) -> Option<Observation> {
        let (at, o) = self.ranks[rank].observation?;
        (now - at <= 3.0 * self.cfg.metrics_interval_seconds).then_some(o)
    }

    /// How many tokens `rank` would reserve for a retained request, if it can take it now, and
    /// on what grounds: its whole demand within the ledger, or past it by the hold-free slack
    /// ([`Self::hold_free_slack`]), its whole demand on the engine's own report for a forced
    /// request past its grace ([`Self::engine_has_room`]), or its demand less the growth
    /// reserve when batch gain pays for the bypass.
    pub(super) fn admission(&self, rank: Rank, r: &Retained, now: f64) -> Option<(u64, Via)> {
        if let Some(via) = self.ledger_or_slack(rank, r, now) {
            return Some((r.demand, via));
        }
        if r.forced() {
            let overdue = now - r.force_at >= self.cfg.force_resume_engine_grace_seconds;
            return (overdue && self.engine_has_room(rank, r.demand, now))
                .then_some((r.demand, Via::EngineRoom));
        }
        let base = r.demand - r.growth;
        if !self.can_admit(rank, base, now, false) {
            return None;
        }
        let cap = self.capacity(rank).0?;
        self.batch_gain(rank, base, r.growth, now, cap)
            .map(|(benefit, cost)| (base, Via::BatchGain { benefit, cost }))
    }

    /// Whether the engine's own KV report for `rank` leaves room for `demand`: KV it reported in
    /// use, plus what the ledger took on since that report, plus `demand`, within capacity ×
    /// `high_watermark_ratio`. vLLM counts the blocks of running and waiting requests, not the
    /// cached prefixes of Programs in tool calls that the ledger reserves for. False without a
    /// fresh report or a known capacity.
    pub(super) fn engine_has_room(&self, rank: Rank, demand: u64, now: f64) -> bool {
        let Some(cap) = self.capacity(rank).0 else {
            return false;
        };
        let Some(reported) = self.reported_used(rank, now, cap) else {
            return false;
        };
        let r = &self.ranks[rank];
        let since = r.used_tokens.saturating_sub(r.used_at_observation);
        let need = reported.saturating_add(since).saturating_add(demand);
        need as f64 <= cap as f64 * self.cfg.high_watermark_ratio
    }

    /// Whether `rank` can take a Program needing `demand` more tokens within the ledger. A
    /// forced resume skips the Program-count guard and the waiting gate, but not token capacity
    /// (physical KV), unless the rank holds no active Program at all (a demand larger than the
    /// rank would never run); past its grace, [`Self::admission`] also reads capacity from the
    /// engine's own report.
    pub(super) fn can_admit(&self, rank: Rank, demand: u64, now: f64, forced: bool) -> bool {
        self.can_admit_past(rank, demand, 0, now, forced)
    }

    /// Whether `rank` can take retained request `r`'s whole demand within the ledger
    /// ([`Via::Ledger`]), or only past it by the hold-free slack ([`Via::HoldFree`],
    /// [`Self::hold_free_slack`]).
    fn ledger_or_slack(&self, rank: Rank, r: &Retained, now: f64) -> Option<Via> {
        let (demand, forced) = (r.demand, r.forced());
        if self.can_admit(rank, demand, now, forced) {
            return Some(Via::Ledger);
        }
        let slack = self.hold_free_slack(rank, demand, r.program);
        (slack > 0 && self.can_admit_past(rank, demand, slack, now, forced))
            .then_some(Via::HoldFree)
    }

    /// [`Self::can_admit`] with `slack` tokens allowed past capacity × the low watermark.
    fn can_admit_past(&self, rank: Rank, demand: u64, slack: u64, now: f64, forced: bool) -> bool {
        let r = &self.ranks[rank];
        if forced {
            return self.fits_within(rank, demand, 0, slack, now);
        }
        if self.cfg.admission_waiting_request_threshold > 0
            && let Some(o) = self.observation_fresh(rank, now)
            && o.waiting >= f64::from(self.cfg.admission_waiting_request_threshold)
        {
            return false;
        }
        if r.active_programs >= self.cfg.max_active_programs_per_target {
            return false;
        }
        self.fits_within(rank, demand, 0, slack, now)
    }

    /// Whether `rank` has token capacity for `demand` once `released` tokens of its ledger are
    /// given up (a Program that would yield its place): see [`Self::fits_within`].
    pub(super) fn fits_releasing(&self, rank: Rank, demand: u64, released: u64, now: f64) -> bool {
        self.fits_within(rank, demand, released, 0, now)
    }

    /// Token capacity: the rank's ledger less `released`, its shared prefix (counted once) and
    /// `demand` within capacity × [`Self::low_ratio`] (`low_watermark_ratio` + the rank's
    /// adaptive overcommit) + `slack` (hold-free slack). A rank that holds no active Program
    /// takes any demand: one larger than the rank would otherwise wait for nothing until its
    /// force-resume deadline (vLLM chunks and preempts). Without a known capacity, always.
    fn fits_within(&self, rank: Rank, demand: u64, released: u64, slack: u64, now: f64) -> bool {
        let r = &self.ranks[rank];
        r.active_programs == 0
            || self.capacity(rank).0.is_none_or(|cap| {
                let need = self
                    .accounted_used(rank, now, cap)
                    .saturating_sub(released)
                    .saturating_add(self.shared_floor(rank, now))
                    .saturating_add(demand);
                need as f64 <= cap as f64 * self.low_ratio(rank) + slack as f64
            })
    }

    /// The rank's used tokens as admission counts them: the router's ledger, or — while the
    /// backend's observation is fresh — what the backend reported plus what the ledger changed
    /// since, when that is more (KV the router does not know of: other replicas' or native
    /// requests, decode growth past the estimate). Never less than the ledger.
    pub(super) fn accounted_used(&self, rank: Rank, now: f64, cap: u64) -> u64 {
        let r = &self.ranks[rank];
        let Some(observed) = self.reported_used(rank, now, cap) else {
            return r.used_tokens;
        };
        let since = r.used_tokens as i128 - r.used_at_observation as i128;
        let estimate = (observed as i128 + since).clamp(0, i128::from(u64::MAX)) as u64;
        r.used_tokens.max(estimate)
    }

    /// Tokens of `cap` the backend's fresh observation of `rank` reports in use.
    fn reported_used(&self, rank: Rank, now: f64, cap: u64) -> Option<u64> {
        let o = self.observation_fresh(rank, now)?;
        Some((o.kv_usage.clamp(0.0, 1.0) * cap as f64) as u64)
    }

    /// Admits retained requests on `rank` in order while capacity allows; with `global_queue`,
    /// then takes movable requests from other ranks.
    pub(super) fn pump(&mut self, rank: Rank, now: f64, out: &mut Vec<Decision>) {
        while let Some(&head) = self.ranks[rank].queue.first() {
            let ticket = head.ticket;
            let Some(r) = self.retained.get(&ticket).cloned() else {
                self.ranks[rank].queue.remove(&head);
                continue;
            };
            let holds = self.program(r.program).active();
            let reserve = if holds {
                Some((r.demand, Via::Ledger))
            } else {
                self.admission(rank, &r, now)
            };
            let Some((reserve, via)) = reserve else {
                break;
            };
            match via {
                Via::Ledger => {}
                Via::BatchGain { benefit, cost } => {
                    self.counters.batch_gain_admissions += 1;
                    self.notes.push(Note::BatchGain {
                        rank,
                        benefit,
                        cost,
                    });
                }
                Via::EngineRoom => {
                    self.counters.engine_room_admissions += 1;
                    self.notes.push(Note::EngineRoom { rank });
                }
                Via::HoldFree => {
                    self.counters.hold_free_admissions += 1;
                    self.notes.push(Note::HoldFree { rank });
                }
            }
            self.admit(ticket, rank, reserve, now, out);
        }
        self.backfill(rank, now, out);
        if !self.cfg.global_queue {
            return;
        }
        // Cross-rank resume over the other ranks' heads, gated by headroom and residence: forced
        // first, then higher priority, FCFS within a tier (the spec's order across ranks).
        let Some(cap) = self.capacity(rank).0 else {
            return;
        };
        let k = self.min_wait_ratio();
        loop {
            let mut best: Option<((bool, i64), f64, Ticket)> = None;
            for (src, rs) in self.ranks.iter().enumerate() {
                if src == rank {
                    continue;
                }
                let Some(head) = rs.queue.first() else {
                    continue;
                };
                let ticket = head.ticket;
                let Some(r) = self.retained.get(&ticket) else {
                    continue;
                };
                let p = self.program(r.program);
                if p.active()
                    || now - p.placed_at < self.cfg.metrics_interval_seconds && p.context_tokens > 0
                {
                    continue;
                }
                let src_cap = self.capacity(src).0.unwrap_or(cap);
                let src_free = src_cap.saturating_sub(rs.used_tokens) as f64;
                let dst_free = cap.saturating_sub(self.ranks[rank].used_tokens) as f64;
                let needed = src_free + self.cfg.cross_rank_headroom_ratio * r.demand as f64;
                if dst_free < needed || !self.can_admit(rank, r.demand, now, r.forced()) {
                    continue;
                }
                let at = r.since;
                // Break-even gate: wait at home until the wait so far is worth the move.
                if k > 0.0
                    && !r.forced()
                    && now - at
                        < k * cache_miss_impact_seconds(
                            &self.cfg.prefill_cost_model,
                            p.context_tokens,
                        )
                {
                    continue;
                }
                let tier = (r.key.not_forced, r.key.neg_priority);
                if best.is_none_or(|(bt, ba, _)| tier < bt || tier == bt && at < ba) {
                    best = Some((tier, at, ticket));
                }
            }
            let Some((_, _, ticket)) = best else { break };
            self.counters.cross_rank_migrations += 1;
            let demand = self.retained.get(&ticket).map_or(0, |r| r.demand);
            self.admit(ticket, rank, demand, now, out);
        }
    }

    /// `queue_backfill_depth`: while the head of `rank`'s queue does not fit and is not forced,
    /// requests among the next `depth` behind it, of the head's priority, are admitted if they
    /// fit when either
    /// - the head has no prefix of its own to lose ([`Self::head_is_cold`]): whatever passes it
    ///   delays it but cannot evict its cache; or
    /// - the passer's Program is back from a tool call longer than `max_acting_ttl_seconds` and
    ///   most of its tool calls were that long: it pauses after its request whatever the wait
    ///   (no hold covers its gaps), so admitting it takes its KV for one request.
    ///
    /// Passing a warm head would let the passers' new blocks evict the head's cached prefix in
    /// the engine's LRU, which costs the head a re-prefill on top of the wait.
    fn backfill(&mut self, rank: Rank, now: f64, out: &mut Vec<Decision>) {
        let depth = self.cfg.queue_backfill_depth as usize;
        if depth == 0 {
            return;
        }
        let queue = &self.ranks[rank].queue;
        let Some(&head) = queue.first() else {
            return;
        };
        // Forced requests sort first: behind a head that is not forced, none is.
        if self.retained.get(&head.ticket).is_none_or(Retained::forced) {
            return;
        }
        let behind: Vec<QueueKey> = queue
            .iter()
            .skip(1)
            .take(depth)
            .take_while(|k| k.neg_priority == head.neg_priority)
            .copied()
            .collect();
        let cold = self.head_is_cold(rank, head.ticket);
        let cap = self.cfg.max_acting_ttl_seconds;
        for key in behind {
            let Some(q) = self.retained.get(&key.ticket) else {
                continue;
            };
            let p = self.program(q.program);
            let long_gaps = p.last_return.is_some_and(|gap| gap > cap)
                && 2 * u64::from(p.long_returns) > u64::from(p.returns);
            let demand = q.demand;
            if !(cold || long_gaps) || p.active() {
                continue;
            }
            // Behind a head that is not forced none is: `q` is not either.
            let Some(via) = self.ledger_or_slack(rank, q, now) else {
                continue;
            };
            self.counters.backfill_admissions += 1;
            self.notes.push(Note::Backfill { rank });
            // A passer that only the slack let in is counted as a hold-free admission too.
            if via == Via::HoldFree {
                self.counters.hold_free_admissions += 1;
                self.notes.push(Note::HoldFree { rank });
            }
            self.admit(key.ticket, rank, demand, now, out);
        }
    }

    /// Whether the Program of queued request `ticket` has no prefix of its own likely cached on
    /// `rank`: it has not completed a request yet, or its latest tool call outlasted the
    /// rank's shared-prefix freshness (the time the rank takes to write
    /// `shared_prefix_freshness_kv_turnovers` times its KV anew), so the engine's LRU has
    /// turned over since it was last used.
    fn head_is_cold(&self, rank: Rank, ticket: Ticket) -> bool {
        let Some(q) = self.retained.get(&ticket) else {
            return false;
        };
        let p = self.program(q.program);
        match p.phase {
            Phase::New => true,
            Phase::Paused { .. } => {
                p.last_complete.is_none()
                    || p.last_return
                        .is_some_and(|gap| gap > self.shared_prefix_freshness(rank))
            }
            Phase::Reasoning | Phase::Acting { .. } => false,
        }
    }

    /// `cross_rank_min_wait_ratio`, with null resolved to its default.
    pub fn min_wait_ratio(&self) -> f64 {
        self.cfg
            .cross_rank_min_wait_ratio
            .unwrap_or(crate::config::program::DEFAULT_MIN_WAIT_RATIO)
    }

    /// Dispatches retained `ticket` on `rank`, reserving `reserve` tokens for its Program.
    pub(super) fn admit(
        &mut self,
        ticket: Ticket,
        rank: Rank,
        reserve: u64,
        now: f64,
        out: &mut Vec<Decision>,
    ) {
        let Some(r) = self.retained.remove(&ticket) else {
            return;
        };
        self.ranks[r.rank].dequeue(&r);
        // Virtual time follows the start tag of what enters service.
        self.virtual_time = self.virtual_time.max(r.key.fair_tag);
        let since = r.since;
        let snapshot_rank = if self.program(r.program).active() {
            self.program(r.program).rank
        } else {
            rank
        };
        let at = AdmitSnapshot {
            required: reserve,
            growth_reserve: r.growth.min(reserve),
            used_before: self.ranks[snapshot_rank].used_tokens,
            capacity: self.capacity(snapshot_rank).0,
            observation: self.ranks[snapshot_rank]
                .observation
                .map(|(t, o)| ((now - t).max(0.0), o)),
        };
        let p = self.program(r.program);
        // An active Program (another of its requests was admitted meanwhile, maybe on another
        // rank) keeps its place: this request joins it there and never moves it.
        let active = p.active();
        let rank = if active { p.rank } else { rank };
        self.notes.push(Note::QueueWait {
            rank,
            seconds: now - since,
        });
        if active {
            // It joins its Program where it runs, and the reservation grows to what this
            // request needs, as on an arrival while the Program is active.
            let p = self.program_mut(r.program);
            p.phase = Phase::Reasoning;
            p.timer_gen += 1;
            let grow = r.demand.saturating_sub(p.reserved);
            p.reserved += grow;
            self.ranks[rank].used_tokens += grow;
        } else {
            self.activate(r.program, rank, reserve, now);
        }
        let p = self.program_mut(r.program);
        p.retained -= 1;
        p.in_flight += 1;
        // A successful resume clears the one-shot yield marker.
        p.yielded = false;
        p.last_rank = Some(rank);
        let name = p.key.1.clone();
        self.in_flight.insert(
            ticket,
            InFlight {
                program: r.program,
                rank,
                kv_retention_ttl: r.kv_retention_ttl,
                dispatched_at: now,
                queued: now - since,
                held: active,
            },
        );
        if r.forced() {
            self.counters.force_resumes += 1;
        }
        self.notes.push(Note::Admit {
            program: name,
            rank,
            forced: r.forced(),
            at,
        });
        out.push(Decision::Dispatch { ticket, rank });
        if self.program(r.program).retained > 0 {
            // The Program is active now: its other waiting requests need no new capacity and
            // go with it, in queue order, wherever they wait (behind a blocked head, or on the
            // rank it left by cross-rank resume). An active Program never has one waiting.
            let mut more: Vec<(QueueKey, Ticket)> = self
                .retained
                .iter()
                .filter(|(_, x)| x.program == r.program)
                .map(|(t, x)| (x.key, *t))
                .collect();
            more.sort();
            for (_, t) in more {
                let demand = self.retained.get(&t).map_or(0, |x| x.demand);
                self.admit(t, rank, demand, now, out);
            }
        }
    }
}

/// What an admission rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Via {
    /// The ledger has room for the whole demand.
    Ledger,
    /// The growth reserve was bypassed on modelled batch gain (seconds).
    BatchGain { benefit: f64, cost: f64 },
    /// A forced request past `force_resume_engine_grace_seconds`, on the engine's KV report.
    EngineRoom,
    /// Past the ledger by `hold_free_admission_slack_ratio` of its demand, on a hold-free rank.
    HoldFree,
}
