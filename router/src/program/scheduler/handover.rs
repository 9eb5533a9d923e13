//! Programs handed between router replicas (`peers`): what this replica holds, handing one
//! over, and adopting the ones another replica hands here.

use super::*;

impl Scheduler {
    /// Whether a Program `key` (model, Program id) is known here.
    pub fn knows(&self, key: &(String, String)) -> bool {
        self.index.contains_key(key)
    }

    /// Every Program known here, as another router replica would take it over (`peers`).
    pub fn held(&self, now: f64) -> Vec<HandedOver> {
        self.index
            .values()
            .map(|slot| self.handed_over(*slot, now))
            .collect()
    }

    pub(super) fn handed_over(&self, slot: usize, now: f64) -> HandedOver {
        let p = self.program(slot);
        HandedOver {
            model: p.key.0.clone(),
            program_id: p.key.1.clone(),
            root: p.root().to_string(),
            target: self.ranks[p.rank].id.clone(),
            context_tokens: p.context_tokens,
            idle_seconds: (now - p.last_activity).max(0.0),
            finished: p.finished,
            called_tool: p.called_tool,
        }
    }

    /// Gives up Program `key` (model, Program id) when it has no request in flight or waiting,
    /// for the replica that now owns it (`peers`): it leaves this scheduler, its reservation
    /// freed, and comes back with its rank's id so that it keeps running where its KV is.
    pub fn hand_over(
        &mut self,
        now: f64,
        key: &(String, String),
    ) -> (Option<HandedOver>, Vec<Decision>) {
        let mut out = Vec::new();
        let Some(&slot) = self.index.get(key) else {
            return (None, out);
        };
        let p = self.program(slot);
        if p.in_flight > 0 || p.retained > 0 {
            return (None, out);
        }
        let active = p.active();
        self.pause(slot, PauseReason::HandedOver, now);
        let given = self.handed_over(slot, now);
        let rank = self.remove_program(slot);
        if active {
            self.pump(rank, now, &mut out);
        }
        (Some(given), out)
    }

    /// Takes Programs another replica handed over (`peers`): each one not known here whose
    /// target is in the set is bound to it and waits paused for its next request — resumed
    /// through admission like any paused Program, and forgotten after the paused retention if
    /// none comes. Returns how many were taken.
    pub fn adopt(&mut self, now: f64, programs: &[HandedOver]) -> usize {
        let mut taken = 0;
        for h in programs {
            let key = (h.model.clone(), h.program_id.clone());
            let Some(rank) = self.ranks.iter().position(|r| r.id == h.target) else {
                continue;
            };
            if self.index.contains_key(&key) || !self.make_room() {
                continue;
            }
            let identity = Identity {
                program_id: h.program_id.clone(),
                root_program_id: (h.root != h.program_id).then(|| h.root.clone()),
                ..Identity::default()
            };
            let slot = self.insert_program(key, rank, identity, now);
            let since = now - h.idle_seconds.clamp(0.0, 86_400.0);
            let p = self.program_mut(slot);
            p.context_tokens = h.context_tokens.min(super::MAX_TOKENS);
            p.last_activity = since;
            // Its KV is already on the rank: the first completion here measures no sharing.
            p.fresh_start = false;
            p.called_tool = h.called_tool;
            p.placement = "handed_over";
            p.phase = Phase::Paused {
                since,
                reason: PauseReason::HandedOver,
            };
            p.timer_gen += 1;
            let generation = p.timer_gen;
            let release_at = now + self.cfg.paused_retention_ttl_seconds;
            self.timer(release_at, TimerKind::Release, slot as u64, generation);
            self.set_finished(slot, h.finished);
            self.arm_idle_finish(slot, now);
            taken += 1;
        }
        taken
    }
}
