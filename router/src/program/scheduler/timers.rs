//! Timers (TTL expiry, force resume, queue timeout, release) and the deadlines diagnostics
//! read from them.

use super::*;

/// The heap is first swept of timers that can no longer act at this size.
pub(super) const MIN_TIMER_SWEEP: usize = 1024;

impl Scheduler {
    pub(super) fn timer(&mut self, at: f64, kind: TimerKind, id: u64, generation: u64) {
        // Timers are dropped lazily when they fire; one whose request or Program moved on stays
        // until then (a pooled request's two for `queue_timeout_seconds`). When the heap has
        // doubled since it was last compacted, such timers are swept, so it stays proportional
        // to what is live rather than to the request rate.
        if self.timers.len() >= self.timers_compact_at {
            self.sweep_timers();
        }
        self.timers.push(Reverse(Timer {
            at_us: us(at),
            kind,
            id,
            generation,
        }));
    }

    /// Drops every timer that can no longer act; the next push sweeps again at twice the rest.
    fn sweep_timers(&mut self) {
        let heap = std::mem::take(&mut self.timers);
        self.timers = heap.into_iter().filter(|Reverse(t)| self.live(t)).collect();
        self.timers_compact_at = (self.timers.len() * 2).max(MIN_TIMER_SWEEP);
        self.timers_swept_len = self.timers.len();
    }

    /// Whether timer `t` can still act when it fires (what `on_tick` checks, without acting).
    fn live(&self, t: &Timer) -> bool {
        match t.kind {
            TimerKind::ForceResume | TimerKind::QueueTimeout => {
                self.retained.get(&t.id).map(|r| r.arrival) == Some(t.generation)
            }
            TimerKind::TtlExpiry | TimerKind::Release | TimerKind::IdleFinish => self
                .programs
                .get(t.id as usize)
                .and_then(Option::as_ref)
                .is_some_and(|p| p.timer_gen == t.generation),
        }
    }

    /// Timers pending (live or not yet swept).
    pub fn pending_timers(&self) -> usize {
        self.timers.len()
    }

    /// Fires every timer due by `now`.
    pub fn on_tick(&mut self, now: f64) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut pumps: Vec<Rank> = Vec::new();
        // Once a burst's Programs are gone no new timer triggers the sweep in `timer`: a tick
        // sweeps when the heap holds more than twice what can still act (two per waiting
        // request, three per Program) and has changed since it was last swept.
        let can_act = 2 * self.retained.len() + 3 * self.index.len();
        if self.timers.len() > 2 * can_act + MIN_TIMER_SWEEP
            && self.timers.len() != self.timers_swept_len
        {
            self.sweep_timers();
        }
        // After a burst of Programs the heap gives its memory back (a quarter full at most).
        if self.timers.capacity() > 4096 && self.timers.len() * 4 < self.timers.capacity() {
            self.timers.shrink_to(self.timers.len() * 2);
        }
        while let Some(Reverse(t)) = self.timers.peek().copied() {
            if t.at_us > us(now) {
                break;
            }
            self.timers.pop();
            match t.kind {
                TimerKind::ForceResume => {
                    let ticket = t.id;
                    if let Some(r) = self.retained.get_mut(&ticket)
                        && r.arrival == t.generation
                    {
                        let old = r.key;
                        r.key.not_forced = false;
                        // Forced requests go oldest first, whatever their kind: MRU (or a
                        // smaller kind) among them would starve again.
                        r.key.size_tier = 0;
                        r.key.order = r.arrival as i64;
                        let (rank, new) = (r.rank, r.key);
                        self.ranks[rank].queue.remove(&old);
                        self.ranks[rank].queue.insert(new);
                        // Admit now, before a queue timeout due at the same instant fires.
                        self.pump(rank, now, &mut out);
                    }
                }
                TimerKind::QueueTimeout => {
                    let ticket = t.id;
                    if self.retained.get(&ticket).map(|r| r.arrival) == Some(t.generation)
                        && let Some(r) = self.retained.remove(&ticket)
                    {
                        self.ranks[r.rank].dequeue(&r);
                        self.program_mut(r.program).retained -= 1;
                        self.counters.queue_timeouts += 1;
                        out.push(Decision::Reject {
                            ticket,
                            reason: RejectReason::QueueTimeout,
                        });
                        self.maybe_forget(r.program);
                    }
                }
                TimerKind::TtlExpiry => {
                    let slot = t.id as usize;
                    if let Some(Some(p)) = self.programs.get(slot)
                        && p.timer_gen == t.generation
                        && matches!(p.phase, Phase::Acting { .. })
                    {
                        let rank = p.rank;
                        self.pause(slot, PauseReason::TtlExpired, now);
                        pumps.push(rank);
                    }
                }
                TimerKind::Release => {
                    if self.still_idle(&t).is_some() {
                        self.learn_size(t.id as usize);
                        self.remove_program(t.id as usize);
                    }
                }
                TimerKind::IdleFinish => {
                    let slot = t.id as usize;
                    if self.still_idle(&t).is_none() {
                        continue;
                    }
                    // Read again: a reload may have changed the ratio (or turned the rule off)
                    // and the evidence may have moved since the timer was armed.
                    match self.idle_finish_due(slot) {
                        Some(due) if us(due) <= us(now) => {
                            let p = self.program(slot);
                            let (program, rank) = (p.key.1.clone(), p.rank);
                            self.set_finished(slot, true);
                            self.counters.idle_finishes += 1;
                            self.notes.push(Note::IdleFinish { program, rank });
                        }
                        Some(due) => self.timer(due, TimerKind::IdleFinish, t.id, t.generation),
                        None => {}
                    }
                }
            }
        }
        pumps.sort_unstable();
        pumps.dedup();
        for r in pumps {
            self.pump(r, now, &mut out);
        }
        out
    }

    /// The Program timer `t` was armed for, if nothing has happened to it since (same timer
    /// generation) and it is still idle: paused (or, under `binding_only`, bound) with nothing
    /// queued or in flight.
    fn still_idle(&self, t: &Timer) -> Option<&Program> {
        self.programs
            .get(t.id as usize)
            .and_then(Option::as_deref)
            .filter(|p| p.timer_gen == t.generation && self.is_idle(p))
    }

    /// The next time `on_tick` has work (for the driver's sleep).
    pub fn next_deadline(&self) -> Option<f64> {
        self.timers.peek().map(|Reverse(t)| t.at_us as f64 / 1e6)
    }

    /// Each Program's earliest force-resume time among its waiting requests (diagnostics).
    pub(crate) fn force_deadlines(&self) -> FxHashMap<usize, f64> {
        let mut m: FxHashMap<usize, f64> = FxHashMap::default();
        for r in self.retained.values() {
            let at = if r.forced() { f64::MIN } else { r.force_at };
            m.entry(r.program)
                .and_modify(|x| *x = x.min(at))
                .or_insert(at);
        }
        m
    }

    /// Each Program's longest wait among its retained requests, in seconds at `now`
    /// (diagnostics).
    pub(crate) fn oldest_waits(&self, now: f64) -> FxHashMap<usize, f64> {
        let mut m: FxHashMap<usize, f64> = FxHashMap::default();
        for r in self.retained.values() {
            let waited = (now - r.since).max(0.0);
            m.entry(r.program)
                .and_modify(|x| *x = x.max(waited))
                .or_insert(waited);
        }
        m
    }
}
