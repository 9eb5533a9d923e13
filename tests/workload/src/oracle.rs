//! Oracle bounds of a workload: what is physically possible, against which excess JCT and missing
//! hit are measured.
//!
//! * `H*` — token hit if every turn found its whole previous context cached (the system prompt is
//!   cold only the first time each group is used, and a turn's new tokens are always computed),
//!   with the engine's block granularity and its rule that the last prompt token is computed.
//! * `JCT*` — per Program, no queueing, every turn a full hit, decode at batch 1: the cold prefill
//!   of each turn's uncached tokens, the decode steps of its output, the tool gaps, and the time
//!   its blocking subagents (and theirs) hold it — scheduled event by event on the oracle's
//!   [`timeline`], which the KV bound replays too.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use serde::Serialize;
use vllm_sim::engine::EngineParams;

use crate::workload::{SPAWN_DELAY_SECONDS, Turn, programs};

#[derive(Debug, Clone, Serialize)]
pub struct Oracle {
    pub token_hit: f64,
    pub mean_jct_seconds: f64,
}

/// How long one request takes on an otherwise idle engine: the cold prefill of its uncached
/// prompt tokens, then its output decoded at batch 1 (the first output token comes with the
/// prefill).
pub fn unloaded_service_seconds(
    engine: &EngineParams,
    prompt: u64,
    cached: u64,
    output: u64,
) -> f64 {
    let t = &engine.timing;
    let mut s = t.cold_prefill_seconds(prompt.saturating_sub(cached));
    for k in 1..output {
        s += t.decode_step_seconds(1, prompt + k);
    }
    s
}

/// KV blocks (per rank) that hold every Program's whole context at once, so nothing is ever
/// evicted: the sum over Programs of their final context (system prompt, every append and every
/// output), rounded up to whole blocks, plus one block each for the last partial block.
pub fn blocks_for_no_kv_pressure(turns: &[Turn], block_size: usize) -> usize {
    let bs = block_size.max(1) as u64;
    let blocks: u64 = programs(turns)
        .iter()
        .map(|p| {
            let tokens = p.first().map_or(0, |t| u64::from(t.system_tokens))
                + p.iter()
                    .map(|t| u64::from(t.append_tokens) + u64::from(t.output_tokens))
                    .sum::<u64>();
            tokens.div_ceil(bs) + 1
        })
        .sum();
    usize::try_from(blocks).unwrap_or(usize::MAX)
}

/// The prompt length of each turn of one Program that fits `max_model_len` — its system prompt,
/// every append and every earlier output — stopping at the first turn whose prompt and output do
/// not fit (the Program cannot go on from there).
pub(crate) fn prompt_lengths(p: &[Turn], max_model_len: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut context = 0u64;
    for t in p {
        if t.step == 0 {
            context = u64::from(t.system_tokens);
        }
        context += u64::from(t.append_tokens);
        if context + u64::from(t.output_tokens) > max_model_len {
            break;
        }
        out.push(context);
        context += u64::from(t.output_tokens);
    }
    out
}

/// The cached tokens of a turn that finds `reusable` tokens of its prompt cached: whole blocks
/// only, and never the last prompt token (the engine always computes it).
fn turn_hit(reusable: u64, prompt: u64, block_size: u64) -> u64 {
    reusable.min(prompt.saturating_sub(1)) / block_size * block_size
}

/// The oracle's timeline: every Program alone on an idle engine with all its hits, subagents
/// started and parents held as the harnesses do it.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    /// Start and end of every turn that ran, per Program (in [`programs`] order).
    pub turns: Vec<Vec<(f64, f64)>>,
    /// Cached prompt tokens of every turn that ran.
    pub cached: Vec<Vec<u64>>,
    /// When each Program started and ended; `None` for a subagent that never started (its parent
    /// stopped before the turn that spawns it).
    pub span: Vec<Option<(f64, f64)>>,
}

/// Schedules `progs` (with `lens`, each turn's prompt length that fits) on the oracle's terms,
/// event by event, with the DES's rules: a root starts at its arrival; a subagent
/// [`SPAWN_DELAY_SECONDS`] after its parent's spawning turn completes; a turn starts after the
/// previous one completes, its tool gap passes and every blocking subagent it spawned has ended
/// (nested ones included); a Program ends when its last turn completes, or, when its next turn
/// does not fit the model, at the moment that turn would arrive. A shared system prompt is cold
/// only for the first turn to use it.
pub(crate) fn timeline(progs: &[Vec<Turn>], lens: &[Vec<u64>], engine: &EngineParams) -> Timeline {
    let bs = engine.block_size.max(1) as u64;
    let index: HashMap<&str, usize> = progs
        .iter()
        .enumerate()
        .map(|(i, p)| (p[0].program_id.as_str(), i))
        .collect();
    let n = progs.len();
    let mut children: HashMap<(usize, u32), Vec<usize>> = HashMap::new();
    let mut parent_of = vec![None; n];
    let mut ready = BinaryHeap::new();
    for (i, p) in progs.iter().enumerate() {
        let t = &p[0];
        match t.parent_program_id.as_deref().and_then(|x| index.get(x)) {
            Some(&q) if q != i => {
                children
                    .entry((q, t.spawned_after_step.unwrap_or(0)))
                    .or_default()
                    .push(i);
                if t.blocks_parent {
                    parent_of[i] = Some(q);
                }
            }
            _ => ready.push(Reverse((t.program_arrival.max(0.0).to_bits(), i))),
        }
    }
    let mut tl = Timeline {
        turns: lens.iter().map(|l| Vec::with_capacity(l.len())).collect(),
        cached: lens.iter().map(|l| Vec::with_capacity(l.len())).collect(),
        span: vec![None; n],
    };
    let mut seen_system = HashSet::new();
    let mut pending = vec![0usize; n];
    let mut resume_at = vec![0.0f64; n];
    while let Some(Reverse((bits, i))) = ready.pop() {
        let now = f64::from_bits(bits);
        let span = tl.span[i].get_or_insert((now, f64::NAN));
        let k = tl.turns[i].len();
        let end = if k == lens[i].len() {
            // The next turn does not fit the model: the Program ends as it arrives.
            span.1 = now;
            now
        } else {
            let turn = &progs[i][k];
            let prompt = lens[i][k];
            let reusable = if k > 0 {
                lens[i][k - 1] + u64::from(progs[i][k - 1].output_tokens)
            } else if seen_system.insert(turn.system_prompt) {
                0
            } else {
                u64::from(turn.system_tokens)
            };
            let hit = turn_hit(reusable, prompt, bs);
            let end =
                now + unloaded_service_seconds(engine, prompt, hit, u64::from(turn.output_tokens));
            tl.turns[i].push((now, end));
            tl.cached[i].push(hit);
            for &c in children.get(&(i, turn.step)).into_iter().flatten() {
                ready.push(Reverse(((end + SPAWN_DELAY_SECONDS).to_bits(), c)));
                pending[i] += usize::from(parent_of[c] == Some(i));
            }
            if k + 1 < progs[i].len() {
                resume_at[i] = resume_at[i].max(end + turn.gap_after);
                if pending[i] == 0 {
                    ready.push(Reverse((resume_at[i].to_bits(), i)));
                }
                continue;
            }
            span.1 = end;
            end
        };
        // Program `i` ended at `end`: a parent waiting on it may go on.
        if let Some(q) = parent_of[i] {
            resume_at[q] = resume_at[q].max(end);
            pending[q] = pending[q].saturating_sub(1);
            let open = tl.span[q].is_some_and(|(_, e)| e.is_nan());
            if pending[q] == 0 && open {
                ready.push(Reverse((resume_at[q].to_bits(), q)));
            }
        }
    }
    tl
}

/// How many turns of each Program a measured run served (a Program not named: none).
pub type Served = HashMap<String, usize>;

/// Each Program's prompt lengths for the turns that fit `engine.max_model_len`.
pub(crate) fn model_lengths(progs: &[Vec<Turn>], engine: &EngineParams) -> Vec<Vec<u64>> {
    progs
        .iter()
        .map(|p| prompt_lengths(p, engine.max_model_len as u64))
        .collect()
}

/// Each Program's prompt lengths for the turns a run served: where that run stopped a Program
/// (its client's estimate of the next prompt outgrew the model), the oracle stops it too.
pub(crate) fn served_lengths(progs: &[Vec<Turn>], served: &Served) -> Vec<Vec<u64>> {
    progs
        .iter()
        .map(|p| {
            let mut l = prompt_lengths(p, u64::MAX);
            l.truncate(served.get(&p[0].program_id).copied().unwrap_or(0));
            l
        })
        .collect()
}

/// Bounds for `turns` on engines shaped like `engine` (chat-template tokens are ignored), both
/// from the oracle's [`timeline`]: H* over the turns that run there, JCT* the mean over the
/// Programs that start of their end less their start.
pub fn bounds(turns: &[Turn], engine: &EngineParams) -> Oracle {
    let progs = programs(turns);
    let lens = model_lengths(&progs, engine);
    bounds_of(&progs, &lens, engine)
}

/// [`bounds`] over exactly the turns a measured run served, so that its mean JCT and hit compare
/// with JCT* and H* over the same Programs and requests.
pub fn bounds_served(turns: &[Turn], engine: &EngineParams, served: &Served) -> Oracle {
    let progs = programs(turns);
    let lens = served_lengths(&progs, served);
    bounds_of(&progs, &lens, engine)
}

fn bounds_of(progs: &[Vec<Turn>], lens: &[Vec<u64>], engine: &EngineParams) -> Oracle {
    let tl = timeline(progs, lens, engine);
    let (mut prompt, mut cached) = (0u64, 0u64);
    for (l, c) in lens.iter().zip(&tl.cached) {
        prompt += l[..c.len()].iter().sum::<u64>();
        cached += c.iter().sum::<u64>();
    }
    let jcts: Vec<f64> = tl.span.iter().flatten().map(|(s, e)| e - s).collect();
    Oracle {
        token_hit: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        mean_jct_seconds: crate::des::mean(&jcts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: u32, append: u32, output: u32, gap: f64) -> Turn {
        Turn::for_test(step, append, output, gap)
    }

    #[test]
    fn no_kv_pressure_holds_every_context() {
        // 32 system + (32 + 2) + (16 + 1) = 83 tokens → 6 blocks of 16, plus one.
        let one = [turn(0, 32, 2, 1.5), turn(1, 16, 1, 0.0)];
        assert_eq!(blocks_for_no_kv_pressure(&one, 16), 7);
        let mut two = one.to_vec();
        two.extend(one.iter().cloned().map(|mut t| {
            t.program_id = "q".into();
            t
        }));
        assert_eq!(blocks_for_no_kv_pressure(&two, 16), 14);
        assert_eq!(blocks_for_no_kv_pressure(&[], 16), 0);
    }

    #[test]
    fn a_hand_made_program() {
        let engine = EngineParams::default();
        // Turn 0: 32 system + 32 append = 64 tokens, all cold (first use of the system prompt).
        // Turn 1: 64 + 2 output + 16 append = 82 tokens; 66 reusable → 64 in whole blocks.
        let o = bounds(&[turn(0, 32, 2, 1.5), turn(1, 16, 1, 0.0)], &engine);
        assert!(
            (o.token_hit - 64.0 / 146.0).abs() < 1e-12,
            "{}",
            o.token_hit
        );
        let t = &engine.timing;
        let want = t.cold_prefill_seconds(64)
            + t.decode_step_seconds(1, 65)
            + 1.5
            + t.cold_prefill_seconds(18);
        assert!(
            (o.mean_jct_seconds - want).abs() < 1e-12,
            "{} vs {want}",
            o.mean_jct_seconds
        );
    }

    /// `turn` of Program `id`, a subagent of `parent` spawned after its `after` step when given.
    fn sub(id: &str, parent: Option<(&str, u32, bool)>, t: Turn) -> Turn {
        Turn {
            program_id: id.into(),
            parent_program_id: parent.map(|p| p.0.into()),
            spawned_after_step: parent.map(|p| p.1),
            blocks_parent: parent.is_some_and(|p| p.2),
            ..t
        }
    }

    /// Lead `p` (two turns, 1 s apart) spawns `c` after its first turn and waits for it; `c`
    /// (two turns, 0.5 s apart) spawns `g` after its own first turn and waits for it; `g` decodes
    /// long. `extra` is
    /// appended as given.
    fn nested(extra: &[Turn]) -> Vec<Turn> {
        let mut w = vec![
            sub("p", None, turn(0, 32, 2, 1.0)),
            sub("p", None, turn(1, 16, 1, 0.0)),
            sub("c", Some(("p", 0, true)), turn(0, 48, 4, 0.5)),
            sub("c", Some(("p", 0, true)), turn(1, 16, 1, 0.0)),
            sub("g", Some(("c", 0, true)), turn(0, 64, 400, 0.0)),
        ];
        w.extend_from_slice(extra);
        w
    }

    #[test]
    fn nested_blocking_subagents_hold_every_ancestor() {
        let engine = EngineParams::default();
        let run = |prompt: u64, cached: u64, output: u64| {
            unloaded_service_seconds(&engine, prompt, cached, output)
        };
        // p: 32 + 32 tokens cold; c and g find the shared system prompt cached (2 blocks).
        let p0 = run(64, 0, 2);
        let c_start = p0 + SPAWN_DELAY_SECONDS;
        let c0 = c_start + run(80, 32, 4);
        let g_start = c0 + SPAWN_DELAY_SECONDS;
        let g_end = g_start + run(96, 32, 400);
        assert!(g_end > c0 + 0.5, "the grandchild must outlast c's own gap");
        // c resumes when g ends (later than its 0.5 s gap): 84 + 16 = 100 tokens, 80 cached.
        let c_end = g_end + run(100, 80, 1);
        assert!(c_end > p0 + 1.0, "c must outlast p's own gap");
        // p resumes when c ends (later than its 1 s gap): 66 + 16 = 82 tokens, 64 cached.
        let p_end = c_end + run(82, 64, 1);
        let want = (p_end + (c_end - c_start) + (g_end - g_start)) / 3.0;
        let o = bounds(&nested(&[]), &engine);
        assert!(
            (o.mean_jct_seconds - want).abs() < 1e-9,
            "{} vs {want}",
            o.mean_jct_seconds
        );
    }

    #[test]
    fn a_blocking_subagent_after_the_last_turn_does_not_hold_its_parent() {
        let engine = EngineParams::default();
        let alone = bounds(&[turn(0, 32, 2, 0.0)], &engine).mean_jct_seconds;
        let late = sub("late", Some(("p", 0, true)), turn(0, 16, 300, 0.0));
        let with_late = bounds(&[turn(0, 32, 2, 0.0), late], &engine);
        let late_jct = unloaded_service_seconds(&engine, 48, 32, 300);
        assert!(
            (with_late.mean_jct_seconds - (alone + late_jct) / 2.0).abs() < 1e-9,
            "{} vs {}",
            with_late.mean_jct_seconds,
            (alone + late_jct) / 2.0
        );
    }

    #[test]
    fn a_subagent_never_spawned_counts_nowhere() {
        // p's second turn does not fit the model, so the subagent due after it never starts:
        // neither its JCT nor its tokens count, and p ends when that turn would have arrived.
        let engine = EngineParams {
            max_model_len: 120,
            ..Default::default()
        };
        let w = [
            turn(0, 32, 2, 3.0),
            turn(1, 90, 1, 0.0),
            sub("orphan", Some(("p", 1, false)), turn(0, 16, 1, 0.0)),
        ];
        let o = bounds(&w, &engine);
        let want = unloaded_service_seconds(&engine, 64, 0, 2) + 3.0;
        assert!(
            (o.mean_jct_seconds - want).abs() < 1e-9,
            "{}",
            o.mean_jct_seconds
        );
        assert_eq!(o.token_hit, 0.0);
    }

    #[test]
    fn with_nothing_queued_the_des_takes_the_oracles_time() {
        // One rank, room for everything, and Programs that never run at the same time: the
        // simulator's engine and the oracle's arithmetic must agree on every Program's JCT.
        let engine = EngineParams::default();
        let w = nested(&[sub(
            "q",
            None,
            Turn {
                program_arrival: 1_000.0,
                ..turn(0, 40, 30, 0.0)
            },
        )]);
        let o = bounds(&w, &engine);
        let r = crate::des::run(&w, 1, &engine, &crate::des::Mode::ConsistentHash);
        assert_eq!(r.programs_completed, 4);
        let rel = (r.mean_jct_seconds - o.mean_jct_seconds).abs() / o.mean_jct_seconds;
        assert!(
            rel < 1e-3,
            "DES {} vs JCT* {}",
            r.mean_jct_seconds,
            o.mean_jct_seconds
        );
        assert!(
            (r.token_hit_rate - o.token_hit).abs() < 1e-9,
            "{} vs {}",
            r.token_hit_rate,
            o.token_hit
        );
    }

    #[test]
    fn bounds_over_the_turns_a_run_served() {
        let turns = crate::workload::generate(crate::workload::Preset::MultiAgent, 12, 0.2, 4);
        let engine = EngineParams {
            max_model_len: 12_000,
            ..Default::default()
        };
        let progs = programs(&turns);
        let cut = model_lengths(&progs, &engine);
        assert!(
            cut.iter().zip(&progs).any(|(l, p)| l.len() < p.len()),
            "the test needs Programs the model length stops"
        );
        // A run that stopped each Program where the model length does: the same bounds.
        let served: Served = progs
            .iter()
            .zip(&cut)
            .map(|(p, l)| (p[0].program_id.clone(), l.len()))
            .collect();
        let (a, b) = (
            bounds(&turns, &engine),
            bounds_served(&turns, &engine, &served),
        );
        assert_eq!(
            (a.token_hit, a.mean_jct_seconds),
            (b.token_hit, b.mean_jct_seconds)
        );
        // A run that stopped one lead with no subagents a turn earlier: it ends sooner.
        let parents: std::collections::HashSet<&str> = turns
            .iter()
            .filter_map(|t| t.parent_program_id.as_deref())
            .collect();
        let (victim, n) = progs
            .iter()
            .filter(|p| p[0].parent_program_id.is_none())
            .map(|p| (p[0].program_id.clone(), served[&p[0].program_id]))
            .find(|(p, n)| *n > 1 && !parents.contains(p.as_str()))
            .expect("a Program with two turns");
        let mut fewer = served.clone();
        fewer.insert(victim, n - 1);
        assert!(bounds_served(&turns, &engine, &fewer).mean_jct_seconds < a.mean_jct_seconds);
    }
}
