//! Binding: the home rank of a new Program by `binding_strategy`.

use super::*;

/// `cache_aware` binding follows a rank that holds at least this share of the prompt's blocks...
const CACHE_AFFINITY: f64 = 0.3;
/// ...unless it runs more than this many active Programs beyond the least loaded rank.
const AFFINITY_SLACK: u32 = 2;

impl Scheduler {
    /// Which ranks a new Program may bind to: the available ones, or all when none is (the
    /// request then fails or waits where it lands, as it would anywhere).
    fn bindable(&self) -> Vec<bool> {
        let any = self.ranks.iter().any(|r| r.available);
        self.ranks.iter().map(|r| r.available || !any).collect()
    }

    /// Marks `rank` reachable or not (health checks, breaker). New Programs bind only to
    /// reachable ranks; when `rank` becomes unreachable, its Programs with nothing in flight
    /// move to reachable ones at once (their KV went with the engine, or cannot be used), with
    /// their retained requests, and the others when their last request there ends or their
    /// next one arrives.
    pub fn set_available(&mut self, now: f64, rank: Rank, available: bool) -> Vec<Decision> {
        let mut out = Vec::new();
        let Some(r) = self.ranks.get_mut(rank) else {
            return out;
        };
        let lost = r.available && !available;
        r.available = available;
        if lost {
            let mut members: Vec<usize> = self.ranks[rank].members.iter().copied().collect();
            members.sort_unstable();
            let mut homes: Vec<Rank> = members
                .into_iter()
                .filter_map(|slot| self.rehome(slot, now))
                .collect();
            homes.sort_unstable();
            homes.dedup();
            for home in homes {
                self.pump(home, now, &mut out);
            }
        }
        out
    }

    /// Moves Program `slot` off its rank when that rank cannot be reached and another can, and
    /// nothing of it is in flight: paused as when its rank is removed (`target_removed`; its
    /// reservation there freed), bound afresh, its retained requests queued at the new home
    /// with their place. Returns the new home.
    pub(super) fn rehome(&mut self, slot: usize, now: f64) -> Option<Rank> {
        let p = self.programs.get(slot)?.as_ref()?;
        let old = p.rank;
        if self.ranks[old].available || p.in_flight > 0 || !self.ranks.iter().any(|r| r.available) {
            return None;
        }
        self.pause(slot, PauseReason::TargetRemoved, now);
        let (name, finished) = (
            self.program(slot).key.1.clone(),
            self.program(slot).finished,
        );
        let home = self.bind(&name, &[]);
        let r = &mut self.ranks[old];
        r.members.remove(&slot);
        if finished {
            r.finished = r.finished.saturating_sub(1);
        }
        let r = &mut self.ranks[home];
        r.members.insert(slot);
        if finished {
            r.finished += 1;
        }
        let p = self.program_mut(slot);
        p.rank = home;
        p.fresh_start = true;
        p.shared_prefix = 0;
        p.generation += 1;
        p.placement = "target_removed";
        let ranks = &mut self.ranks;
        for q in self.retained.values_mut().filter(|q| q.program == slot) {
            ranks[q.rank].dequeue(q);
            q.rank = home;
            ranks[home].enqueue(q);
        }
        Some(home)
    }

    /// Initial home rank of a new Program (`chain`: its prompt's blocks, for `cache_aware`).
    pub(super) fn bind(&mut self, program_id: &str, chain: &[u64]) -> Rank {
        use crate::config::program::BindingStrategy as B;
        let n = self.ranks.len();
        let ok = self.bindable();
        match self.cfg.binding_strategy {
            B::CacheAware => self.bind_cache_aware(chain),
            // The spec's ring: `hash_virtual_nodes` points per rank; adding a rank moves only
            // the Programs it takes, and an unavailable one passes its keys to the next.
            B::ConsistentHash => self
                .ring
                .walk(program_id.as_bytes())
                .find(|r| ok[*r])
                .unwrap_or(0),
            B::ProgramRoundRobin => {
                for _ in 0..n {
                    self.rr = (self.rr + 1) % n.max(1);
                    if ok[self.rr] {
                        break;
                    }
                }
                self.rr
            }
            // Programs bound to the rank that have not finished (active, waiting, or paused in a
            // tool call), then active Programs plus requests waiting there. A finished Program's
            // KV is the first the rank can give up, so it does not count (docs/benchmarks.md,
            // "Binding strategies").
            B::LeastProgramCount => (0..n)
                .filter(|r| ok[*r])
                .min_by_key(|r| {
                    let x = &self.ranks[*r];
                    (
                        x.members.len().saturating_sub(x.finished as usize),
                        x.active_programs as usize + x.queue.len(),
                        *r,
                    )
                })
                .unwrap_or(0),
            B::ReasoningTokenBalance => (0..n)
                .filter(|r| ok[*r])
                .min_by_key(|r| (self.ranks[*r].used_tokens, *r))
                .unwrap_or(0),
        }
    }

    /// `cache_aware` binding: the rank holding the longest leading part of the prompt (a shared
    /// system prompt, a parent's context) when it covers at least [`CACHE_AFFINITY`] of it and
    /// the rank is not more than [`AFFINITY_SLACK`] active Programs busier than the least loaded
    /// one; otherwise the least loaded rank by reserved tokens, then active Programs.
    pub(super) fn bind_cache_aware(&mut self, chain: &[u64]) -> Rank {
        let n = self.ranks.len();
        let ok = self.bindable();
        let load = |r: &RankState| (r.used_tokens, r.active_programs);
        let least = (0..n)
            .filter(|r| ok[*r])
            .min_by_key(|r| (load(&self.ranks[*r]), *r))
            .unwrap_or(0);
        if chain.is_empty() {
            return least;
        }
        let ids: Vec<&str> = self.ranks.iter().map(|r| r.id.as_str()).collect();
        let matched = self.prefix.matched(chain, &ids);
        let best = (0..n)
            .filter(|r| ok[*r])
            .max_by(|a, b| {
                matched[*a]
                    .cmp(&matched[*b])
                    .then(load(&self.ranks[*b]).cmp(&load(&self.ranks[*a])))
            })
            .unwrap_or(least);
        let covers = matched[best] as f64 / chain.len() as f64;
        let slack = self.ranks[least].active_programs + AFFINITY_SLACK;
        if matched[best] > 0
            && covers >= CACHE_AFFINITY
            && self.ranks[best].active_programs <= slack
        {
            best
        } else {
            least
        }
    }
}
