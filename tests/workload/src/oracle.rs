//! Oracle bounds of a workload: what is physically possible, against which excess JCT and missing
//! hit are measured.
//!
//! * `H*` — token hit if every turn found its whole previous context cached (the system prompt is
//!   cold only the first time each group is used, and a turn's new tokens are always computed),
//!   with the engine's block granularity and its rule that the last prompt token is computed.
//! * `JCT*` — per Program, no queueing, every turn a full hit, decode at batch 1: the sum over turns
//!   of the cold prefill of the uncached tokens, the decode steps of its output, and the tool gaps.

use serde::Serialize;
use vllm_sim::engine::EngineParams;

use crate::workload::{Turn, programs};

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

/// Bounds for `turns` on engines shaped like `engine` (chat-template tokens are ignored).
pub fn bounds(turns: &[Turn], engine: &EngineParams) -> Oracle {
    let bs = engine.block_size as u64;
    let mut seen_system = std::collections::BTreeSet::new();
    let (mut prompt, mut cached) = (0u64, 0u64);
    let mut jcts = Vec::new();
    let progs = programs(turns);
    // A blocking subagent's parent waits for it: per (parent, step), the longest of them.
    let mut waits: std::collections::HashMap<(String, u32), f64> = Default::default();
    let mut own: Vec<f64> = Vec::new();
    for p in &progs {
        let lens = prompt_lengths(p, engine.max_model_len as u64);
        let mut jct = 0.0;
        for (k, (turn, &context)) in p.iter().zip(&lens).enumerate() {
            let reusable = if k == 0 {
                if seen_system.insert(turn.system_prompt) {
                    0
                } else {
                    u64::from(turn.system_tokens)
                }
            } else {
                lens[k - 1] + u64::from(p[k - 1].output_tokens)
            };
            // Whole blocks only, and never the last prompt token.
            let hit = (reusable.min(context - 1) / bs) * bs;
            prompt += context;
            cached += hit;
            jct += unloaded_service_seconds(engine, context, hit, u64::from(turn.output_tokens));
            jct += turn.gap_after;
        }
        own.push(jct);
    }
    for (p, jct) in progs.iter().zip(&own) {
        let t = &p[0];
        if let (Some(parent), Some(step), true) =
            (&t.parent_program_id, t.spawned_after_step, t.blocks_parent)
        {
            let w = waits.entry((parent.clone(), step)).or_default();
            *w = w.max(crate::workload::SPAWN_DELAY_SECONDS + jct);
        }
    }
    for (p, jct) in progs.iter().zip(own) {
        // The parent's next turn starts after max(its own gap, its blocking subagents).
        let extra: f64 = p
            .iter()
            .filter_map(|turn| {
                waits
                    .get(&(turn.program_id.clone(), turn.step))
                    .map(|w| (w - turn.gap_after).max(0.0))
            })
            .sum();
        jcts.push(jct + extra);
    }
    Oracle {
        token_hit: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        mean_jct_seconds: if jcts.is_empty() {
            0.0
        } else {
            jcts.iter().sum::<f64>() / jcts.len() as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: u32, append: u32, output: u32, gap: f64) -> Turn {
        Turn {
            program_id: "p".into(),
            task_id: "t".into(),
            step,
            program_arrival: 0.0,
            system_prompt: 0,
            system_tokens: 32,
            append_tokens: append,
            output_tokens: output,
            gap_after: gap,
            parent_program_id: None,
            spawned_after_step: None,
            blocks_parent: false,
        }
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
}
