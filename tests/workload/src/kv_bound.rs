//! The best token hit a workload can reach at a given KV size without holding any request back:
//! an offline bound beside the oracle's H* (which assumes unlimited KV).
//!
//! Requests run on the oracle's timeline (no queueing, every turn a full hit, batch-1 decode,
//! subagents and blocked parents as in JCT*), the fastest possible, so Programs overlap least.
//! The ranks' KV is pooled (as if every Program could run anywhere and move for free), shared
//! system prompts are always cached at no cost, and a running request's whole context is
//! resident. Between turns, blocks go by Belady's rule: the idle Program whose next turn is
//! furthest away loses blocks first, from the end of its context (a prefix cache can only use a
//! context from its start). On unit-sized blocks whose future use is known that rule misses the
//! fewest, and every relaxation above favours the bound: no placement, retention or eviction
//! policy reaches a higher hit at this KV unless it delays requests.

use std::collections::BTreeSet;

use serde::Serialize;
use vllm_sim::engine::EngineParams;

use crate::oracle::{Served, model_lengths, served_lengths, timeline};
use crate::workload::{Turn, programs};

#[derive(Debug, Clone, Serialize)]
pub struct KvBound {
    /// The bound on token hit at `blocks_per_rank × ranks` pooled blocks.
    pub token_hit: f64,
    /// The same pooled KV and timeline with least-recently-used eviction (what vLLM does) instead
    /// of Belady's: the gap to `token_hit` is what knowing when Programs return is worth, the
    /// gap below it what partitioned ranks, a slower timeline and the router's choices cost.
    pub lru_token_hit: f64,
    /// LRU that drops the blocks of Programs that will not come back (their last turn is done)
    /// before anyone else's: what an engine hint "this Program is finished" would be worth
    /// (stock vLLM has no such hint; the spec lists Router-to-engine KV hints as future work).
    pub lru_release_token_hit: f64,
    /// Share of the timeline during which the running requests alone needed more than the
    /// pooled KV (the engine would preempt; 0 unless the KV is tiny).
    pub pinned_over_capacity: f64,
}

/// Which idle blocks go first when the pooled KV is full.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Evict {
    /// Belady: the Program whose next turn is furthest away (never again first).
    FurthestNextUse,
    /// The Program whose last turn ended longest ago.
    LeastRecentlyUsed,
    /// Finished Programs first, then least recently used.
    LeastRecentlyUsedReleasing,
}

/// The Programs of `turns` and the prompt length of each turn that fits the engine.
fn programs_and_prompts(turns: &[Turn], engine: &EngineParams) -> (Vec<Vec<Turn>>, Vec<Vec<u64>>) {
    let progs = programs(turns);
    let lens = model_lengths(&progs, engine);
    (progs, lens)
}

/// The bound for `turns` on `ranks` ranks shaped like `engine`.
pub fn bound(turns: &[Turn], engine: &EngineParams, ranks: usize) -> KvBound {
    let (progs, lens) = programs_and_prompts(turns, engine);
    on_oracle_timeline(&progs, &lens, engine, ranks)
}

/// [`bound`] over exactly the turns a measured run served (see [`crate::oracle::bounds_served`]).
pub fn bound_served(
    turns: &[Turn],
    engine: &EngineParams,
    ranks: usize,
    served: &Served,
) -> KvBound {
    let progs = programs(turns);
    let lens = served_lengths(&progs, served);
    on_oracle_timeline(&progs, &lens, engine, ranks)
}

/// The three eviction rules replayed on the oracle's timeline of `progs` with `lens`.
fn on_oracle_timeline(
    progs: &[Vec<Turn>],
    lens: &[Vec<u64>],
    engine: &EngineParams,
    ranks: usize,
) -> KvBound {
    let times = timeline(progs, lens, engine).turns;
    evict_all_ways(progs, lens, &times, engine, ranks)
}

/// The same replay on a measured timeline instead of the oracle's: `times[i][k]` is when turn
/// `k` of the `i`-th Program of [`programs`]`(turns)` was dispatched and when it finished (turns
/// that never ran left out). With a run's own timeline it answers: given how this run's requests
/// actually overlapped, what would one pooled cache have kept?
pub fn on_timeline(
    turns: &[Turn],
    engine: &EngineParams,
    ranks: usize,
    mut times: Vec<Vec<(f64, f64)>>,
) -> KvBound {
    let (progs, lens) = programs_and_prompts(turns, engine);
    times.resize(progs.len(), Vec::new());
    for (t, l) in times.iter_mut().zip(&lens) {
        t.truncate(l.len());
        if let Some(cut) = t
            .iter()
            .position(|(s, e)| !(s.is_finite() && e.is_finite()))
        {
            t.truncate(cut);
        }
    }
    evict_all_ways(&progs, &lens, &times, engine, ranks)
}

fn evict_all_ways(
    progs: &[Vec<Turn>],
    lens: &[Vec<u64>],
    times: &[Vec<(f64, f64)>],
    engine: &EngineParams,
    ranks: usize,
) -> KvBound {
    let capacity = (engine.num_gpu_blocks as u64).saturating_mul(ranks as u64);
    let run = |rule| replay(progs, lens, times, engine.block_size, capacity, rule);
    let (token_hit, pinned_over_capacity) = run(Evict::FurthestNextUse);
    let (lru_token_hit, _) = run(Evict::LeastRecentlyUsed);
    let (lru_release_token_hit, _) = run(Evict::LeastRecentlyUsedReleasing);
    KvBound {
        token_hit,
        lru_token_hit,
        lru_release_token_hit,
        pinned_over_capacity,
    }
}

/// Token hit and the share of the timeline over capacity, replaying the timeline on `capacity`
/// pooled blocks with `rule`.
fn replay(
    progs: &[Vec<Turn>],
    lens: &[Vec<u64>],
    times: &[Vec<(f64, f64)>],
    block_size: usize,
    capacity: u64,
    rule: Evict,
) -> (f64, f64) {
    let bs = block_size.max(1) as u64;
    // Events: (time, 0 = a turn ends / 1 = a turn starts, program, turn); ends first at a tie.
    let mut events: Vec<(f64, u8, usize, usize)> = Vec::new();
    for (i, ts) in times.iter().enumerate() {
        for (k, (s, e)) in ts.iter().enumerate() {
            events.push((*s, 1, i, k));
            events.push((*e, 0, i, k));
        }
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let sys_blocks: Vec<u64> = progs
        .iter()
        .map(|p| u64::from(p[0].system_tokens) / bs)
        .collect();
    // Blocks beyond the system prompt each Program has resident, and the idle ones that hold
    // some, ordered so that the first is evicted first: (class, time bits, program).
    let mut resident = vec![0u64; progs.len()];
    let mut idle: BTreeSet<(u8, u64, usize)> = BTreeSet::new();
    let mut idle_key: Vec<Option<(u8, u64, usize)>> = vec![None; progs.len()];
    let mut used = 0u64;
    let mut seen_system = BTreeSet::new();
    let (mut prompt_total, mut hit_total) = (0u64, 0u64);
    let (mut over_since, mut over_time) = (None::<f64>, 0.0);
    for &(t, kind, i, k) in &events {
        if kind == 0 {
            // Idle until its next turn (times are ≥ 0, so their bits order like the numbers).
            let next = times[i].get(k + 1).map(|x| x.0);
            let key = match (rule, next) {
                (Evict::FurthestNextUse, Some(n)) => (1, u64::MAX - n.to_bits(), i),
                (Evict::FurthestNextUse, None) => (0, 0, i),
                (Evict::LeastRecentlyUsedReleasing, None) => (0, 0, i),
                _ => (1, t.max(0.0).to_bits(), i),
            };
            if resident[i] > 0 {
                idle.insert(key);
                idle_key[i] = Some(key);
            }
            continue;
        }
        if let Some(key) = idle_key[i].take() {
            idle.remove(&key);
        }
        let turn = &progs[i][k];
        let prompt = lens[i][k];
        let usable = prompt.saturating_sub(1);
        let hit_blocks = if k == 0 {
            if seen_system.insert(turn.system_prompt) {
                0
            } else {
                u64::from(turn.system_tokens).min(usable) / bs
            }
        } else {
            let reusable = lens[i][k - 1] + u64::from(progs[i][k - 1].output_tokens);
            (reusable.min(usable) / bs).min(sys_blocks[i] + resident[i])
        };
        prompt_total += prompt;
        hit_total += hit_blocks * bs;
        // Of its own blocks, the request reuses those it hit; it then holds its whole context
        // and output while it runs.
        let kept = resident[i].min(hit_blocks.saturating_sub(sys_blocks[i]));
        used -= resident[i] - kept;
        let need = (prompt + u64::from(turn.output_tokens))
            .div_ceil(bs)
            .saturating_sub(sys_blocks[i])
            .max(kept);
        let mut short = (used + need - kept).saturating_sub(capacity);
        // Evict idle Programs' blocks in the rule's order, each from its context's end.
        while short > 0 {
            let Some(first) = idle.pop_first() else { break };
            let j = first.2;
            let take = resident[j].min(short);
            resident[j] -= take;
            used -= take;
            short -= take;
            if resident[j] > 0 {
                idle.insert(first);
            } else {
                idle_key[j] = None;
            }
        }
        used += need - kept;
        resident[i] = need;
        if used > capacity {
            over_since.get_or_insert(t);
        } else if let Some(s) = over_since.take() {
            over_time += t - s;
        }
    }
    let span = events.last().map_or(0.0, |e| e.0) - events.first().map_or(0.0, |e| e.0);
    (
        if prompt_total == 0 {
            0.0
        } else {
            hit_total as f64 / prompt_total as f64
        },
        if span > 0.0 { over_time / span } else { 0.0 },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Preset, generate};

    fn turn(program: &str, arrival: f64, step: u32, append: u32, gap: f64) -> Turn {
        Turn {
            program_id: program.into(),
            task_id: program.into(),
            step,
            program_arrival: arrival,
            system_prompt: 0,
            system_tokens: 0,
            append_tokens: append,
            output_tokens: 1,
            gap_after: gap,
            tool: None,
            parent_program_id: None,
            spawned_after_step: None,
            blocks_parent: false,
        }
    }

    #[test]
    fn with_room_for_everything_it_is_the_oracles_hit() {
        for preset in [Preset::SweAgent, Preset::MultiAgent, Preset::Mixed] {
            let turns = generate(preset, 30, 1.0, 7);
            let engine = EngineParams {
                num_gpu_blocks: crate::oracle::blocks_for_no_kv_pressure(&turns, 16),
                ..Default::default()
            };
            let h = crate::oracle::bounds(&turns, &engine).token_hit;
            let b = bound(&turns, &engine, 1);
            assert!(
                (b.token_hit - h).abs() < 1e-9,
                "{preset:?}: {} vs {h}",
                b.token_hit
            );
            assert!((b.lru_token_hit - h).abs() < 1e-9, "{preset:?}");
            assert!((b.lru_release_token_hit - h).abs() < 1e-9, "{preset:?}");
            assert_eq!(b.pinned_over_capacity, 0.0);
        }
    }

    #[test]
    fn on_the_oracles_timeline_it_is_the_bound() {
        let turns = generate(Preset::Mixed, 40, 0.5, 3);
        let engine = EngineParams {
            num_gpu_blocks: 1024,
            ..Default::default()
        };
        let (progs, lens) = programs_and_prompts(&turns, &engine);
        let times = timeline(&progs, &lens, &engine).turns;
        let a = bound(&turns, &engine, 2);
        let b = on_timeline(&turns, &engine, 2, times);
        assert_eq!(
            (a.token_hit, a.lru_token_hit, a.lru_release_token_hit),
            (b.token_hit, b.lru_token_hit, b.lru_release_token_hit)
        );
        // Under pressure, and ordered: LRU ≤ LRU told who is finished ≤ Belady < H*.
        assert!(a.lru_token_hit <= a.lru_release_token_hit + 1e-12, "{a:?}");
        assert!(a.lru_release_token_hit <= a.token_hit + 1e-12, "{a:?}");
        assert!(
            a.token_hit < crate::oracle::bounds(&turns, &engine).token_hit,
            "{a:?}"
        );
        // A turn that never finished is left out, with everything after it: a Program cut at
        // its first turn counts as if it were not in the workload.
        let mut cut = timeline(&progs, &lens, &engine).turns;
        cut[0] = vec![(cut[0][0].0, f64::NAN)];
        let with_cut = on_timeline(&turns, &engine, 2, cut);
        let first = &progs[0][0].program_id;
        let rest: Vec<Turn> = turns
            .iter()
            .filter(|t| &t.program_id != first)
            .cloned()
            .collect();
        let mut rest_times = timeline(&progs, &lens, &engine).turns;
        rest_times.remove(0);
        let without = on_timeline(&rest, &engine, 2, rest_times);
        assert_eq!(with_cut.token_hit, without.token_hit);
    }

    #[test]
    fn the_program_that_returns_first_keeps_its_context() {
        // A (t=0) comes back 5 s after its first turn; B (t=1) and C (t=2) never do. Each first
        // turn holds 161 tokens = 11 blocks; 22 blocks in all. When C arrives, B goes (never
        // needed again), not A (used less recently, but needed sooner): A's second turn hits its
        // 160 reusable tokens (10 whole blocks; its 161st token is in a partial block).
        let turns = vec![
            turn("a", 0.0, 0, 160, 5.0),
            turn("a", 0.0, 1, 16, 0.0),
            turn("b", 1.0, 0, 160, 0.0),
            turn("c", 2.0, 0, 160, 0.0),
        ];
        let engine = EngineParams {
            num_gpu_blocks: 22,
            ..Default::default()
        };
        let b = bound(&turns, &engine, 1);
        let want = 160.0 / (160.0 * 3.0 + 177.0);
        assert!(
            (b.token_hit - want).abs() < 1e-12,
            "{} vs {want}",
            b.token_hit
        );
        // LRU evicts A, the least recently used, and nothing hits; told that B is finished,
        // LRU drops B first, as Belady does.
        assert_eq!(b.lru_token_hit, 0.0);
        assert!((b.lru_release_token_hit - want).abs() < 1e-12);
        // With room for one context only, A's is gone by its second turn.
        let engine = EngineParams {
            num_gpu_blocks: 11,
            ..Default::default()
        };
        assert_eq!(bound(&turns, &engine, 1).token_hit, 0.0);
        // Two ranks pool their KV: the same as 22 blocks on one.
        assert!((bound(&turns, &engine, 2).token_hit - want).abs() < 1e-12);
    }
}
