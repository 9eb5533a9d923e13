//! What the simulated clients send beyond the workload itself: their own KV-retention TTL,
//! or, as bounds, the TTL a client that knows each coming tool gap would ask for and the
//! priority of one that knows how much work its Program has left.

use vllm_sim::engine::EngineParams;

use crate::des::Mode;
use crate::workload::Turn;

/// What the clients send beyond the workload itself.
#[derive(Debug, Clone, Default)]
pub struct Clients {
    /// `kv_retention_ttl_seconds` on every request (the client's own TTL, which replaces the
    /// automatic one) — for asking what holding every paused Program's KV would buy.
    pub retention_ttl_seconds: Option<f64>,
    /// Clients that know each tool gap in advance (a bound, `progbench matrix --bounds`): every
    /// request's TTL is the gap that follows it when holding the context through the gap costs
    /// its rank less than re-prefilling it ([`clairvoyant_ttl`]), else 0. Replaces
    /// `retention_ttl_seconds`.
    pub clairvoyant: bool,
    /// Clients that know how much work each Program has left (a bound, `progbench matrix
    /// --bounds`): every request's `priority` is minus the tokens its Program still has to
    /// send and receive, this turn's included ([`Clients::priority`]), so the scheduler resumes
    /// the Program with the least work left first — shortest remaining work first, across work
    /// in progress and new Programs alike. No router knows this; it measures how far ordering
    /// alone could go.
    pub remaining_work_known: bool,
    /// Clients that identify Programs by headers only (Claude Code's session, agent and parent
    /// ids): no task or step id, and never `expected_resume: false`.
    pub headers_only: bool,
}

impl Clients {
    /// Clients sending `retention_ttl_seconds` (a finite number of seconds ≥ 0) on every
    /// request; the error names the command-line flag.
    pub fn with_retention_ttl(retention_ttl_seconds: Option<f64>) -> Result<Self, String> {
        if retention_ttl_seconds.is_some_and(|t| !(t.is_finite() && t >= 0.0)) {
            return Err("--client-retention-ttl must be a finite number of seconds >= 0".into());
        }
        Ok(Clients {
            retention_ttl_seconds,
            ..Clients::default()
        })
    }

    /// The `priority` a request asks for when `remaining` are its Program's turns from this
    /// one on: minus their appended and output tokens with `remaining_work_known`, else 0.
    pub(crate) fn priority(&self, remaining: &[Turn]) -> i64 {
        if !self.remaining_work_known {
            return 0;
        }
        -remaining
            .iter()
            .map(|t| i64::from(t.append_tokens) + i64::from(t.output_tokens))
            .sum::<i64>()
    }

    /// The TTL a request with `context` tokens followed by `gap` seconds asks for.
    pub(crate) fn ttl(
        &self,
        context: usize,
        gap: f64,
        engine: &EngineParams,
        mode: &Mode,
    ) -> Option<f64> {
        if !self.clairvoyant {
            return self.retention_ttl_seconds;
        }
        let model = match mode {
            Mode::Program(c) => c.prefill_cost_model,
            Mode::ConsistentHash => Default::default(),
        };
        Some(clairvoyant_ttl(
            context,
            gap,
            engine.token_capacity(),
            &model,
        ))
    }
}

/// The retention a client that knows the coming tool gap would ask for: hold a context of
/// `context` tokens through `gap` seconds when that costs the rank less than re-prefilling it.
/// Held, the context takes `context ÷ capacity` of the rank's KV — of its decode batch, on a
/// rank whose batch KV bounds — for the gap; dropped, the rank spends the prefill time again.
/// The TTL is the gap plus a margin for the next request's arrival (the scheduler's TTL expires
/// at the instant it is due).
pub fn clairvoyant_ttl(
    context: usize,
    gap: f64,
    capacity: usize,
    model: &program_router::config::program::PrefillCostModel,
) -> f64 {
    let hold = context as f64 / capacity.max(1) as f64 * gap;
    let recompute = program_router::program::cost::prefill_seconds(model, context as u64);
    if hold <= recompute { gap + 0.05 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(step: u32, append: u32, output: u32) -> Turn {
        Turn {
            program_id: "p".into(),
            task_id: "t".into(),
            step,
            program_arrival: 0.0,
            system_prompt: 0,
            system_tokens: 512,
            append_tokens: append,
            output_tokens: output,
            gap_after: 1.0,
            tool: None,
            parent_program_id: None,
            spawned_after_step: None,
            blocks_parent: false,
        }
    }

    #[test]
    fn knowing_the_work_left_asks_the_least_left_first() {
        let turns = [turn(0, 300, 20), turn(1, 100, 10), turn(2, 50, 5)];
        let knowing = Clients {
            remaining_work_known: true,
            ..Clients::default()
        };
        // This turn's tokens and every later turn's; the system prompt is not work left.
        assert_eq!(knowing.priority(&turns), -485);
        assert_eq!(knowing.priority(&turns[2..]), -55);
        // Less left is a higher priority, which the scheduler resumes first.
        assert!(knowing.priority(&turns[1..]) < knowing.priority(&turns[2..]));
        assert_eq!(knowing.priority(&[]), 0);
        // Clients that do not know send the default.
        assert_eq!(Clients::default().priority(&turns), 0);
    }
}
