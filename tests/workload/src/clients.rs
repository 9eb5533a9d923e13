//! What the simulated clients send beyond the workload itself: their own KV-retention TTL,
//! or, as a bound, the TTL a client that knows each coming tool gap would ask for.

use vllm_sim::engine::EngineParams;

use crate::des::Mode;

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
