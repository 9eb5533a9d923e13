//! Program lifecycle transitions: activation on a rank, pause and parking, insertion,
//! release after the paused retention, and removal.

use super::*;

impl Scheduler {
    pub(super) fn activate(&mut self, slot: usize, rank: Rank, demand: u64, now: f64) {
        let p = self.program_mut(slot);
        let was_active = p.active();
        let old_rank = p.rank;
        let old_reserved = p.reserved;
        if old_rank != rank {
            self.ranks[old_rank].members.remove(&slot);
            self.ranks[rank].members.insert(slot);
        }
        let p = self.program_mut(slot);
        p.rank = rank;
        p.phase = Phase::Reasoning;
        p.reserved = demand;
        p.last_activity = now;
        if !was_active || old_rank != rank {
            p.placed_at = now;
        }
        if old_rank != rank {
            // A shared prefix observed on the old rank says nothing about this one.
            p.fresh_start = true;
            p.shared_prefix = 0;
            p.generation += 1;
            p.placement = "cross_rank";
        }
        if was_active {
            self.ranks[old_rank].used_tokens = self.ranks[old_rank]
                .used_tokens
                .saturating_sub(old_reserved);
            self.ranks[old_rank].active_programs =
                self.ranks[old_rank].active_programs.saturating_sub(1);
        }
        self.ranks[rank].used_tokens += demand;
        self.ranks[rank].active_programs += 1;
    }

    pub(super) fn pause(&mut self, slot: usize, reason: PauseReason, now: f64) {
        let p = self.program(slot);
        if !p.active() {
            return;
        }
        let (rank, reserved, rounds) = (p.rank, p.reserved, p.rounds);
        let r = &mut self.ranks[rank];
        r.used_tokens = r.used_tokens.saturating_sub(reserved);
        r.active_programs = r.active_programs.saturating_sub(1);
        if rounds > 0 {
            r.segment_rounds.push(f64::from(rounds));
        }
        self.park(slot, reason, now);
    }

    /// The Program side of a pause (its rank's ledger is the caller's): paused, nothing
    /// reserved, counted, noted, and forgotten after `paused_retention_ttl_seconds`.
    pub(super) fn park(&mut self, slot: usize, reason: PauseReason, now: f64) {
        let p = self.program_mut(slot);
        p.phase = Phase::Paused { since: now, reason };
        p.reserved = 0;
        p.rounds = 0;
        if reason == PauseReason::TtlExpired {
            p.rounds_since_ttl_pause = 0;
        }
        p.yielded = reason == PauseReason::SegmentYield;
        p.pause_on_complete = false;
        p.timer_gen += 1;
        let (generation, rank, name) = (p.timer_gen, p.rank, p.key.1.clone());
        *self.counters.pauses.entry(reason.as_str()).or_default() += 1;
        self.notes.push(Note::Pause {
            program: name,
            rank,
            reason,
        });
        let release_at = now + self.cfg.paused_retention_ttl_seconds;
        self.timer(release_at, TimerKind::Release, slot as u64, generation);
        self.arm_idle_finish(slot, now);
    }

    /// Whether `p` is idle: paused (or, under `binding_only`, bound) with nothing of it queued
    /// or in flight. The release and idle-finish timers wait for this.
    pub(super) fn is_idle(&self, p: &Program) -> bool {
        (matches!(p.phase, Phase::Paused { .. }) || self.cfg.binding_only && p.phase == Phase::New)
            && p.retained == 0
            && p.in_flight == 0
    }

    /// When the Program in `slot` counts as finished if it stays idle: its last completion or
    /// activation plus `finished_idle_ratio` × the longest interval in the automatic TTL's
    /// evidence. `None` while that evidence is short of its samples, with the ratio 0, or when
    /// the Program is already finished.
    pub(super) fn idle_finish_due(&self, slot: usize) -> Option<f64> {
        let p = self.program(slot);
        if p.finished {
            return None;
        }
        self.idle_horizon(p.rank).map(|h| p.last_activity + h)
    }

    /// Arms the timer that presumes the idle Program in `slot` finished at
    /// [`Self::idle_finish_due`] (no timer while that is `None`). It shares the current timer
    /// generation, so any later transition disarms it; when it fires, the due time is read
    /// again (the evidence or the ratio may have changed).
    pub(super) fn arm_idle_finish(&mut self, slot: usize, now: f64) {
        let Some(due) = self.idle_finish_due(slot) else {
            return;
        };
        let generation = self.program(slot).timer_gen;
        self.timer(due.max(now), TimerKind::IdleFinish, slot as u64, generation);
    }

    /// Arms the idle-finish timer of every idle Program not yet finished. For Programs that
    /// paused while the rule could not apply to them: before the evidence had its samples (the
    /// first intervals after a start), or while a reload had the ratio at 0. A Program that
    /// already has a timer gets a second one of the same generation; whichever fires later finds
    /// it finished and does nothing.
    pub(super) fn arm_idle_finishes(&mut self, now: f64) {
        let idle: Vec<usize> = (self.programs.iter().enumerate())
            .filter(|(_, p)| p.as_ref().is_some_and(|p| !p.finished && self.is_idle(p)))
            .map(|(slot, _)| slot)
            .collect();
        for slot in idle {
            self.arm_idle_finish(slot, now);
        }
    }

    /// A new Program `key` bound to `rank`, in phase `New`; its slot.
    pub(super) fn insert_program(
        &mut self,
        key: (String, String),
        rank: Rank,
        identity: Identity,
        now: f64,
    ) -> usize {
        let p = Program {
            key: key.clone(),
            rank,
            phase: Phase::New,
            in_flight: 0,
            retained: 0,
            context_tokens: 0,
            reserved: 0,
            last_step: None,
            last_activity: now,
            last_complete: None,
            placed_at: now,
            rounds: 0,
            yielded: false,
            pause_on_complete: false,
            timer_gen: self.retired_gen + 1,
            identity,
            armed_ttl: 0.0,
            shared_prefix: 0,
            shared_at: now,
            lead: None,
            system: None,
            kind: None,
            fresh_start: true,
            generation: 0,
            placement: "binding",
            last_rank: None,
            last_return: None,
            returns: 0,
            long_returns: 0,
            last_output: None,
            last_hit: false,
            rounds_since_ttl_pause: 0,
            finished: false,
            last_tool: None,
            called_tool: false,
            size_learned: false,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.programs[s] = Some(Box::new(p));
                s
            }
            None => {
                self.programs.push(Some(Box::new(p)));
                self.programs.len() - 1
            }
        };
        self.index.insert(key, slot);
        self.ranks[rank].members.insert(slot);
        slot
    }

    /// Marks the Program in `slot` finished or not, keeping its rank's count.
    pub(super) fn set_finished(&mut self, slot: usize, finished: bool) {
        let p = self.program_mut(slot);
        if p.finished == finished {
            return;
        }
        p.finished = finished;
        let rank = p.rank;
        let r = &mut self.ranks[rank];
        r.finished = if finished {
            r.finished + 1
        } else {
            r.finished.saturating_sub(1)
        };
        if finished {
            self.learn_size(slot);
        }
    }

    /// The Program in `slot` ended (finished, or forgotten idle): its final context teaches its
    /// kind's size (`resume_order: kind_size`), once per Program.
    pub(super) fn learn_size(&mut self, slot: usize) {
        let (kind, p) = (self.kind(slot), self.program_mut(slot));
        if p.size_learned || p.last_complete.is_none() {
            return;
        }
        p.size_learned = true;
        let total = p.context_tokens;
        if let Some(replaced) = self.kinds.learn(kind, total) {
            self.notes.push(Note::Shed {
                reason: replaced.reason(),
            });
        }
    }

    /// `binding_only`: forget an idle Program's binding after the paused retention.
    pub(super) fn release_later(&mut self, slot: usize, now: f64) {
        let at = now + self.cfg.paused_retention_ttl_seconds;
        let p = self.program_mut(slot);
        p.timer_gen += 1;
        let generation = p.timer_gen;
        self.timer(at, TimerKind::Release, slot as u64, generation);
        self.arm_idle_finish(slot, now);
    }

    pub(super) fn maybe_forget(&mut self, slot: usize) {
        let p = self.program(slot);
        if p.phase == Phase::New && p.retained == 0 && p.in_flight == 0 {
            self.remove_program(slot);
        }
    }

    /// Whether one more Program fits under `max_programs`: at the cap, the idle Programs that
    /// have waited longest are forgotten to make room (`false` when none is idle) — the oldest
    /// 1% of the cap at once, so that a scheduler full of client-chosen ids searches once per
    /// hundreds of new Programs, not once per Program.
    pub(super) fn make_room(&mut self) -> bool {
        let cap = self.cfg.max_programs as usize;
        if self.index.len() < cap {
            return true;
        }
        let mut idle: Vec<(f64, usize)> = self
            .programs
            .iter()
            .enumerate()
            .filter_map(|(slot, p)| p.as_ref().map(|p| (slot, p)))
            .filter(|(_, p)| self.is_idle(p))
            .map(|(slot, p)| (p.last_activity, slot))
            .collect();
        if idle.is_empty() {
            return false;
        }
        let batch = (cap / 100).clamp(1, idle.len());
        let by_age = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if batch < idle.len() {
            idle.select_nth_unstable_by(batch - 1, by_age);
        }
        for &(_, slot) in &idle[..batch] {
            self.learn_size(slot);
            self.remove_program(slot);
            self.notes.push(Note::Shed {
                reason: "program_evicted",
            });
        }
        true
    }

    /// Forgets the Program in `slot` (its ledger entries are the caller's); its rank.
    pub(super) fn remove_program(&mut self, slot: usize) -> Rank {
        let p = self.programs[slot].take().expect("live program slot");
        self.retired_gen = self.retired_gen.max(p.timer_gen);
        let r = &mut self.ranks[p.rank];
        r.members.remove(&slot);
        if r.members.capacity() > 4096 && r.members.len() * 4 < r.members.capacity() {
            r.members.shrink_to(r.members.len() * 2);
        }
        if p.finished {
            r.finished = r.finished.saturating_sub(1);
        }
        self.index.remove(&p.key);
        self.free_slots.push(slot);
        // After a burst of Programs the index gives its memory back (a quarter full at most).
        if self.index.capacity() > 4096 && self.index.len() * 4 < self.index.capacity() {
            self.index.shrink_to(self.index.len() * 2);
        }
        p.rank
    }
}
