//! The scheduler's entry points for a request's arrival, its cancellation and a rank's
//! observation: each updates the state and returns the decisions the runtime carries out.

use super::*;

impl Scheduler {
    /// A request with Program identity arrives.
    pub fn on_arrival(&mut self, now: f64, mut a: Arrival) -> Vec<Decision> {
        a.prompt_tokens = a.prompt_tokens.min(MAX_TOKENS);
        a.identity.expected_output_length =
            a.identity.expected_output_length.map(|n| n.min(MAX_TOKENS));
        if self.ranks.is_empty() {
            return vec![Decision::Reject {
                ticket: a.ticket,
                reason: RejectReason::NoTarget,
            }];
        }
        let reject = |reason| {
            vec![Decision::Reject {
                ticket: a.ticket,
                reason,
            }]
        };
        if self.retained.len() >= self.cfg.max_retained_requests as usize {
            self.notes.push(Note::Shed {
                reason: "request_pool_full",
            });
            return reject(RejectReason::PoolFull);
        }
        let key = (a.model.clone(), a.identity.program_id.clone());
        let slot = match self.index.get(&key).copied() {
            Some(s) => {
                // Bound to a rank that cannot be reached: it moves before it asks again.
                self.rehome(s, now);
                s
            }
            None => {
                if !self.make_room() {
                    self.notes.push(Note::Shed {
                        reason: "programs_full",
                    });
                    return reject(RejectReason::ProgramsFull);
                }
                let rank = self.bind(&a.identity.program_id, &a.prefix);
                self.insert_program(key, rank, a.identity.clone(), now)
            }
        };
        self.arrivals += 1;
        // A finished Program that is asked for again is live again.
        self.set_finished(slot, false);
        if !a.prefix.is_empty() {
            let home = self.program(slot).rank;
            self.prefix
                .record(&self.ranks[home].id, &a.prefix, PREFIX_BUDGET_BLOCKS);
        }
        let mut out = Vec::new();
        let binding_only = self.cfg.binding_only;
        let cap = self.cfg.max_acting_ttl_seconds;
        let p = self.program_mut(slot);
        let step = a
            .identity
            .step_id
            .unwrap_or_else(|| p.last_step.map_or(0, |s| s + 1));
        p.last_step = Some(step);
        p.lead = a.lead;
        // A Program's kind is set by its first request that names one: a later request may not
        // repeat it (a Responses turn that continues a stored response without `instructions`).
        p.system = p.system.or(a.system);
        p.identity = Identity {
            step_id: Some(step),
            ..a.identity.clone()
        };
        p.kind = kinds::kind_of(&p.key.0, p.system, p.identity.parent_program_id.is_some());
        let interval = p.last_complete.map(|t| now - t);
        if let Some(iv) = interval {
            p.last_return = interval;
            p.returns = p.returns.saturating_add(1);
            if iv > cap {
                p.long_returns = p.long_returns.saturating_add(1);
            }
        }
        let (rank, phase, tool) = (p.rank, p.phase, p.last_tool);
        if let Some(iv) = interval {
            if let Some(t) = tool {
                self.tools.push(t, iv);
            }
            let had_evidence = self.evidence(rank).is_some();
            self.ranks[rank].intervals.push(iv);
            self.pooled_intervals.push(iv);
            self.notes.push(Note::Interval { rank, seconds: iv });
            if !had_evidence && self.evidence(rank).is_some() {
                // The idle-finish rule applies from now on, also to Programs paused before.
                self.arm_idle_finishes(now);
            }
        }
        let inflight = InFlight {
            program: slot,
            rank,
            kv_retention_ttl: a.identity.kv_retention_ttl_seconds,
            dispatched_at: now,
            queued: 0.0,
            held: false,
        };
        if binding_only {
            let p = self.program_mut(slot);
            p.in_flight += 1;
            p.last_activity = now;
            p.last_rank = Some(rank);
            self.in_flight.insert(a.ticket, inflight);
            out.push(Decision::Dispatch {
                ticket: a.ticket,
                rank,
            });
            return out;
        }
        let holds_capacity = match phase {
            Phase::Reasoning => true,
            Phase::Acting { until } if until >= now => true,
            _ => false,
        };
        if holds_capacity && self.program(slot).retained == 0 {
            // Acting and reasoning Programs keep their place: never reclaimed by admission.
            let (demand, _) = self.demand(
                self.program(slot),
                a.prompt_tokens,
                a.identity.expected_output_length,
                now,
            );
            let p = self.program_mut(slot);
            p.phase = Phase::Reasoning;
            p.in_flight += 1;
            p.timer_gen += 1;
            p.last_activity = now;
            p.last_rank = Some(rank);
            let grow = demand.saturating_sub(p.reserved);
            p.reserved += grow;
            self.ranks[rank].used_tokens += grow;
            self.in_flight.insert(
                a.ticket,
                InFlight {
                    held: true,
                    ..inflight
                },
            );
            out.push(Decision::Dispatch {
                ticket: a.ticket,
                rank,
            });
            return out;
        }
        if let Phase::Acting { until } = phase
            && until < now
        {
            // The TTL passed but its timer has not fired yet.
            self.pause(slot, PauseReason::TtlExpired, now);
        }
        // New or paused: through the RequestPool, in resume order.
        let (demand, growth) = self.demand(
            self.program(slot),
            a.prompt_tokens,
            a.identity.expected_output_length,
            now,
        );
        // Work in progress first: a Program that has run (or a subagent its parent waits on)
        // resumes before new root Programs (LIFO over new Programs starves the oldest under
        // sustained load). `mru` orders work in progress by latest arrival; `last_use` by its
        // KV's last use (a subagent shares its parent's prompt, just used), the likeliest still
        // cached first; `resume_most_turns_first` orders `mru`'s by completed turns first (where
        // the rank's queue asks for `..._min_queued_ratio` × its capacity). New
        // Programs follow by arrival, which `new_program_demand_aging_seconds` ages by the KV
        // each asks for. `kind_size` puts both in tiers by their kind's size first.
        let p = self.program(slot);
        let started = p.last_complete.is_some()
            || a.identity.parent_program_id.is_some() && a.identity.blocks_parent;
        let order = match self.cfg.resume_order {
            ResumeOrder::Mru | ResumeOrder::KindSize if started => {
                let turns = if self.cfg.resume_most_turns_first && self.queue_is_long(rank) {
                    // Weighs above 2^40 arrivals (a year at 30k a second); capped so the
                    // shift cannot overflow.
                    i64::from(p.returns.min(1 << 20)) << 40
                } else {
                    0
                };
                -turns - self.arrivals
            }
            ResumeOrder::LastUse if started => -us(p.last_complete.unwrap_or(now)).max(0) - 1,
            ResumeOrder::Mru | ResumeOrder::LastUse | ResumeOrder::KindSize => {
                self.new_program_order(rank, demand, now)
            }
            ResumeOrder::Fcfs => self.arrivals,
        };
        let size_tier = match self.cfg.resume_order {
            ResumeOrder::KindSize => self.kind_tier(slot),
            _ => 0,
        };
        // Start-time fair queueing over tenants: a request's tag is where its tenant's previous
        // request ends in virtual service (or the current virtual time, for a tenant that was
        // idle), so a heavy tenant's backlog cannot keep a light tenant's request behind it.
        if self.tenant_finish.len() > 4096 {
            // A tenant whose finish tag is behind virtual time starts there anyway.
            let v = self.virtual_time;
            self.tenant_finish.retain(|_, f| *f > v);
        }
        let fair_tag = match &a.tenant {
            Some((tenant, weight)) => {
                let start = self
                    .tenant_finish
                    .get(tenant)
                    .copied()
                    .unwrap_or(0)
                    .max(self.virtual_time);
                let cost = (demand as f64 / weight.max(1e-9)).ceil() as u64;
                self.tenant_finish
                    .insert(tenant.clone(), start.saturating_add(cost.max(1)));
                start
            }
            None => 0,
        };
        let p = self.program_mut(slot);
        p.retained += 1;
        let yielded = p.yielded;
        let key = QueueKey {
            not_forced: true,
            neg_priority: a.identity.priority.saturating_neg(),
            yielded,
            fair_tag,
            size_tier,
            order,
            ticket: a.ticket,
        };
        let deadline = a.identity.deadline_seconds;
        let queue_limit = deadline.map_or(self.cfg.queue_timeout_seconds, |d| {
            d.min(self.cfg.queue_timeout_seconds)
        });
        // Workload-derived, bounded by `force_resume_timeout_seconds`; a request's deadline
        // overrides it (the spec), within the queue limit above.
        let force_limit =
            deadline.map_or_else(|| self.force_resume_after(rank), |d| d.min(queue_limit));
        let arrival = self.arrivals as u64;
        let retained = Retained {
            program: slot,
            rank,
            key,
            demand,
            growth,
            since: now,
            force_at: now + force_limit,
            arrival,
            kv_retention_ttl: a.identity.kv_retention_ttl_seconds,
        };
        self.ranks[rank].enqueue(&retained);
        self.retained.insert(a.ticket, retained);
        self.timer(now + force_limit, TimerKind::ForceResume, a.ticket, arrival);
        self.timer(
            now + queue_limit,
            TimerKind::QueueTimeout,
            a.ticket,
            arrival,
        );
        self.pump(rank, now, &mut out);
        if self.cfg.global_queue && self.retained.contains_key(&a.ticket) {
            for r in 0..self.ranks.len() {
                if r != rank {
                    self.pump(r, now, &mut out);
                }
            }
        }
        out
    }

    /// The client went away: a retained request leaves the pool; an in-flight one releases its
    /// Program's capacity (no TTL: nobody is coming back for it on this request).
    pub fn on_cancel(&mut self, now: f64, ticket: Ticket) -> Vec<Decision> {
        let mut out = Vec::new();
        if let Some(r) = self.retained.remove(&ticket) {
            self.ranks[r.rank].dequeue(&r);
            self.program_mut(r.program).retained -= 1;
            self.maybe_forget(r.program);
            return out;
        }
        let Some(f) = self.in_flight.remove(&ticket) else {
            return out;
        };
        let p = self.program_mut(f.program);
        p.in_flight = p.in_flight.saturating_sub(1);
        if p.in_flight > 0 {
            return out;
        }
        if self.cfg.binding_only {
            self.release_later(f.program, now);
        } else {
            self.pause(f.program, PauseReason::Cancelled, now);
            self.pump(f.rank, now, &mut out);
        }
        out
    }

    /// A backend observation of `rank`.
    pub fn on_observation(&mut self, now: f64, rank: Rank, obs: Observation) -> Vec<Decision> {
        let mut out = Vec::new();
        if rank >= self.ranks.len() {
            return out;
        }
        let obs = obs.bounded();
        self.ranks[rank].observation = Some((now, obs));
        self.ranks[rank].used_at_observation = self.ranks[rank].used_tokens;
        self.adapt_overcommit(rank, now);
        // Capacity repair: above the high watermark, reasoning Programs pause when they finish.
        if let (Some(cap), false) = (self.capacity(rank).0, self.cfg.binding_only) {
            let observed = (obs.kv_usage * cap as f64).max(self.ranks[rank].used_tokens as f64);
            let over = self.ranks[rank].overcommit;
            let repair = observed > cap as f64 * (self.cfg.high_watermark_ratio + over);
            let low = cap as f64 * self.low_ratio(rank);
            let mut excess = observed - low;
            if repair || self.ranks[rank].repairing {
                // The Program resume would take last goes first: lower priority, then the most
                // recently placed (the least work sunk into its KV); the slot breaks ties.
                let mut reasoning: Vec<(i64, f64, usize)> = self.ranks[rank]
                    .members
                    .iter()
                    .filter_map(|slot| {
                        let p = self.programs[*slot].as_ref()?;
                        (p.phase == Phase::Reasoning).then_some((
                            p.identity.priority,
                            -p.placed_at,
                            *slot,
                        ))
                    })
                    .collect();
                reasoning
                    .sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(b.2.cmp(&a.2)));
                for (_, _, slot) in reasoning {
                    let p = self.program_mut(slot);
                    p.pause_on_complete = repair && excess > 0.0;
                    if p.pause_on_complete {
                        excess -= p.reserved as f64;
                    }
                }
            }
            self.ranks[rank].repairing = repair;
        }
        self.pump(rank, now, &mut out);
        out
    }
}
