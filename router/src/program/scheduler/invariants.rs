//! Invariant checks over the scheduler's ledgers, queues and indexes (tests and the
//! virtual-time harness call them after every event).

use super::*;

impl Scheduler {
    /// Checks the ledger against the Programs (tests and debug builds).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (i, r) in self.ranks.iter().enumerate() {
            let (used, active) = self
                .programs
                .iter()
                .flatten()
                .filter(|p| p.rank == i && p.active())
                .fold((0u64, 0u32), |(u, a), p| (u + p.reserved, a + 1));
            if used != r.used_tokens || active != r.active_programs {
                return Err(format!(
                    "rank {i}: ledger {}/{} but Programs hold {used}/{active}",
                    r.used_tokens, r.active_programs
                ));
            }
            let bound = self
                .programs
                .iter()
                .flatten()
                .filter(|p| p.rank == i)
                .count();
            if bound != r.members.len() {
                return Err(format!(
                    "rank {i}: {} members but {bound} Programs bound",
                    r.members.len()
                ));
            }
            let finished = r
                .members
                .iter()
                .filter(|s| self.programs[**s].as_ref().is_some_and(|p| p.finished))
                .count();
            if finished != r.finished as usize {
                return Err(format!(
                    "rank {i}: {} finished counted but {finished} finished members",
                    r.finished
                ));
            }
            let (queued, demand) = self
                .retained
                .values()
                .filter(|x| x.rank == i)
                .fold((0usize, 0u64), |(n, d), x| (n + 1, d + x.demand));
            if queued != r.queue.len() || queued != r.by_arrival.len() {
                return Err(format!(
                    "rank {i}: queue {} and arrival index {} vs retained {queued}",
                    r.queue.len(),
                    r.by_arrival.len()
                ));
            }
            if demand != r.queued_demand {
                return Err(format!(
                    "rank {i}: queued demand {} but its requests ask for {demand}",
                    r.queued_demand
                ));
            }
            for (arrival, t) in &r.by_arrival {
                let listed = self.retained.get(t).is_some_and(|x| {
                    x.rank == i && x.arrival == *arrival && r.queue.contains(&x.key)
                });
                if !listed {
                    return Err(format!(
                        "rank {i}: arrival {arrival} (ticket {t}) indexed but not queued here"
                    ));
                }
            }
        }
        for p in self.programs.iter().flatten() {
            if p.finished && (p.active() || p.in_flight > 0 || p.retained > 0) {
                return Err(format!("Program {:?} finished but still running", p.key));
            }
            if p.active() && p.retained > 0 {
                return Err(format!(
                    "Program {:?} is active with {} requests still waiting",
                    p.key, p.retained
                ));
            }
        }
        for (slot, p) in self.programs.iter().enumerate() {
            if let Some(p) = p
                && !self
                    .ranks
                    .get(p.rank)
                    .is_some_and(|r| r.members.contains(&slot))
            {
                return Err(format!(
                    "Program {:?} bound to rank {} that does not list it",
                    p.key, p.rank
                ));
            }
        }
        for (t, f) in &self.in_flight {
            if f.rank >= self.ranks.len() || self.programs[f.program].is_none() {
                return Err(format!(
                    "ticket {t} in flight on rank {} or for a released Program",
                    f.rank
                ));
            }
        }
        for (t, r) in &self.retained {
            if self.in_flight.contains_key(t) {
                return Err(format!("ticket {t} both retained and in flight"));
            }
            if self.programs[r.program].is_none() {
                return Err(format!("ticket {t} retained for a released Program"));
            }
        }
        Ok(())
    }
}
