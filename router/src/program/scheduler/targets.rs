//! Configuration and target-set changes that keep the scheduler's state: tuning reloads and
//! re-targeting (ranks added, removed or re-ordered; Programs of removed ranks re-homed).

use super::*;

impl Scheduler {
    /// Takes a changed configuration (a tuning reload: cost models, capacities, watermarks,
    /// TTL limits, timeouts, binding strategy, ...) keeping every Program, binding, TTL, window
    /// and retained request. New values govern decisions from now on; timers already armed (a
    /// TTL, a retained request's force-resume and queue deadlines) keep their times, except that
    /// a change to the idle-finish rule (`finished_idle_ratio`, `ttl_evidence`,
    /// `ttl_min_samples`) reaches Programs already paused. Every rank is then pumped, so a
    /// looser limit admits waiting requests at once. A change of
    /// `binding_only` or `stats_window_size` changes the shape of the state itself: `None`,
    /// nothing taken, and the caller starts afresh.
    pub fn reconfigure(
        &mut self,
        now: f64,
        cfg: &ProgramSchedulingConfig,
    ) -> Option<Vec<Decision>> {
        if cfg.binding_only != self.cfg.binding_only
            || cfg.stats_window_size != self.cfg.stats_window_size
        {
            return None;
        }
        let idle_rule_changed = cfg.finished_idle_ratio != self.cfg.finished_idle_ratio
            || cfg.ttl_evidence != self.cfg.ttl_evidence
            || cfg.ttl_min_samples != self.cfg.ttl_min_samples;
        let ring_changed = cfg.hash_virtual_nodes != self.cfg.hash_virtual_nodes;
        self.cfg = cfg.clone();
        self.tools.set_cap(cfg.max_tools);
        if ring_changed {
            // New Programs bind on the new ring; bound ones stay where they are.
            self.rebuild_ring();
        }
        if idle_rule_changed {
            // Programs already paused follow the new rule (armed timers read it when they fire).
            self.arm_idle_finishes(now);
        }
        let mut out = Vec::new();
        for rank in 0..self.ranks.len() {
            self.pump(rank, now, &mut out);
        }
        Some(out)
    }

    /// The target set changed to `rank_ids` (the data plane's new order). A rank whose id stays
    /// keeps everything — ledger, queue, windows, observation, bound Programs — under its new
    /// index; a new id starts empty. Programs bound to a removed rank are re-homed with the
    /// binding strategy: an active one is paused (`target_removed`, its KV is gone), a paused or
    /// new one just moves, and its retained requests move to the new home's queue with their
    /// place (key and deadlines) intact. In-flight requests on a removed rank are forgotten:
    /// their completion is ignored. Every rank is then pumped. An empty `rank_ids` is refused
    /// (nothing to re-home to); the caller retires the scheduler instead.
    pub fn retarget(&mut self, now: f64, rank_ids: Vec<String>) -> Vec<Decision> {
        let mut out = Vec::new();
        if rank_ids.is_empty() {
            return out;
        }
        let w = self.cfg.stats_window_size as usize;
        let old_len = self.ranks.len();
        let mut old: FxHashMap<String, (Rank, RankState)> = std::mem::take(&mut self.ranks)
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), (i, r)))
            .collect();
        let mut remap: Vec<Option<Rank>> = vec![None; old_len];
        self.ranks = rank_ids
            .into_iter()
            .enumerate()
            .map(|(new, id)| match old.remove(&id) {
                Some((i, r)) => {
                    remap[i] = Some(new);
                    r
                }
                None => RankState::new(id, w),
            })
            .collect();
        for id in old.keys() {
            self.prefix.forget(id);
        }
        self.rebuild_ring();
        // What is left in `old` was removed; its members need a new home.
        let mut orphans: Vec<usize> = old
            .into_values()
            .flat_map(|(_, r)| r.members.into_iter())
            .collect();
        orphans.sort_unstable();
        let n = self.ranks.len();
        self.rr %= n;
        // Surviving Programs and requests follow their rank's new index.
        for p in self.programs.iter_mut().flatten() {
            p.last_rank = p.last_rank.and_then(|l| remap.get(l).copied().flatten());
            if let Some(Some(r)) = remap.get(p.rank) {
                p.rank = *r;
            }
        }
        let mut lost: Vec<usize> = Vec::new();
        self.in_flight
            .retain(|_, f| match remap.get(f.rank).copied().flatten() {
                Some(r) => {
                    f.rank = r;
                    true
                }
                None => {
                    lost.push(f.program);
                    false
                }
            });
        for slot in lost {
            let p = self.program_mut(slot);
            p.in_flight = p.in_flight.saturating_sub(1);
        }
        for slot in orphans {
            let name = self.program(slot).key.1.clone();
            let home = self.bind(&name, &[]);
            self.ranks[home].members.insert(slot);
            if self.program(slot).finished {
                self.ranks[home].finished += 1;
            }
            let p = self.program_mut(slot);
            let was_active = p.active();
            p.rank = home;
            p.fresh_start = true;
            p.shared_prefix = 0;
            p.generation += 1;
            p.placement = "target_removed";
            if was_active {
                // Its ledger went with the removed rank; its KV is gone with the engine.
                self.park(slot, PauseReason::TargetRemoved, now);
            }
        }
        // Retained requests on a removed rank queue at their Program's (new) home.
        let programs = &self.programs;
        let ranks = &mut self.ranks;
        for r in self.retained.values_mut() {
            match remap.get(r.rank).copied().flatten() {
                Some(new) => r.rank = new,
                None => {
                    let home = programs[r.program].as_ref().map_or(0, |p| p.rank);
                    r.rank = home;
                    ranks[home].enqueue(r);
                }
            }
        }
        for rank in 0..n {
            self.pump(rank, now, &mut out);
        }
        out
    }
}
