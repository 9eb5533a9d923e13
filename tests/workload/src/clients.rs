//! What the simulated clients send beyond the workload itself: their own KV-retention TTL,
//! or, as bounds, the TTL a client that knows each coming tool gap would ask for and the
//! priority of one that knows how much work its Program has left.

use std::collections::HashMap;

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
    /// What the clients know of the work their Program has left, sent as each request's
    /// `priority` (bounds, `progbench matrix --bounds`; [`Clients::priority`]).
    pub work_left: WorkLeft,
    /// Clients that identify Programs by headers only (Claude Code's session, agent and parent
    /// ids): no task or step id, and never `expected_resume: false`.
    pub headers_only: bool,
}

/// How much work a Program has left, as its clients would tell the router: minus it is each
/// request's `priority`, so the scheduler resumes the Program with the least left first,
/// across work in progress and new Programs alike (shortest remaining work first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkLeft {
    /// Nothing: every request has the default priority.
    #[default]
    Unknown,
    /// Each Program's own: the tokens it still has to send and receive, this turn's included.
    /// No router knows this; it measures how far ordering alone could go.
    Known,
    /// What a router could learn from the Programs it saw end: the mean, over the workload's
    /// Programs of the same class that got further, of what they had left past the tokens this
    /// one has sent and received. The whole workload counts, this Program included, where a
    /// router would know only the Programs that ended before. The class is the system prompt's
    /// length, standing in for its hash (the workload's kinds of Program differ in it).
    ClassMean,
}

/// Every Program's total tokens (appended and output), by class, for [`WorkLeft::ClassMean`].
#[derive(Debug, Clone, Default)]
pub struct Classes(HashMap<u32, Vec<u64>>);

impl Classes {
    pub fn new(turns: &[Turn]) -> Self {
        let mut per: HashMap<&str, (u32, u64)> = HashMap::new();
        for t in turns {
            let e = per
                .entry(t.program_id.as_str())
                .or_insert((t.system_tokens, 0));
            e.1 += u64::from(t.append_tokens) + u64::from(t.output_tokens);
        }
        let mut classes: HashMap<u32, Vec<u64>> = HashMap::new();
        for (class, total) in per.into_values() {
            classes.entry(class).or_default().push(total);
        }
        Classes(classes)
    }

    /// The mean of `total − done` over `class`'s Programs whose total exceeds `done`; 0 when
    /// none does.
    pub fn expected_left(&self, class: u32, done: u64) -> u64 {
        let (n, sum) = self
            .0
            .get(&class)
            .into_iter()
            .flatten()
            .filter(|&&t| t > done)
            .fold((0u64, 0u64), |(n, sum), &t| (n + 1, sum + (t - done)));
        sum.checked_div(n).unwrap_or(0)
    }
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

    /// The `priority` of the request for turn `next` of the Program whose turns are `program`:
    /// minus the work left as [`Clients::work_left`] knows it (`classes` for
    /// [`WorkLeft::ClassMean`]), 0 when unknown.
    pub(crate) fn priority(&self, program: &[Turn], next: usize, classes: &Classes) -> i64 {
        let tokens = |ts: &[Turn]| {
            ts.iter()
                .map(|t| u64::from(t.append_tokens) + u64::from(t.output_tokens))
                .sum::<u64>()
        };
        let left = match self.work_left {
            WorkLeft::Unknown => 0,
            WorkLeft::Known => tokens(program.get(next..).unwrap_or_default()),
            WorkLeft::ClassMean => match program.first() {
                Some(first) => classes.expected_left(
                    first.system_tokens,
                    tokens(program.get(..next).unwrap_or_default()),
                ),
                None => 0,
            },
        };
        -i64::try_from(left).unwrap_or(i64::MAX)
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
        Turn::for_test(step, append, output, 1.0)
    }

    #[test]
    fn knowing_the_work_left_asks_the_least_left_first() {
        let turns = [turn(0, 300, 20), turn(1, 100, 10), turn(2, 50, 5)];
        let knowing = Clients {
            work_left: WorkLeft::Known,
            ..Clients::default()
        };
        let none = Classes::default();
        // This turn's tokens and every later turn's; the system prompt is not work left.
        assert_eq!(knowing.priority(&turns, 0, &none), -485);
        assert_eq!(knowing.priority(&turns, 2, &none), -55);
        // Less left is a higher priority, which the scheduler resumes first.
        assert!(knowing.priority(&turns, 1, &none) < knowing.priority(&turns, 2, &none));
        assert_eq!(knowing.priority(&turns, 3, &none), 0);
        // Clients that do not know send the default.
        assert_eq!(Clients::default().priority(&turns, 0, &none), 0);
    }

    #[test]
    fn a_class_mean_is_what_longer_programs_of_the_class_had_left() {
        let program = |id: &str, system: u32, sizes: &[(u32, u32)]| -> Vec<Turn> {
            sizes
                .iter()
                .enumerate()
                .map(|(i, &(a, o))| Turn {
                    program_id: id.into(),
                    system_tokens: system,
                    ..turn(i as u32, a, o)
                })
                .collect()
        };
        // Class 512: totals 100, 300 and 600; class 2048: one of 1000.
        let short = program("a", 512, &[(90, 10)]);
        let mid = program("b", 512, &[(100, 50), (100, 50)]);
        let long = program("c", 512, &[(200, 100), (200, 100)]);
        let other = program("d", 2048, &[(900, 100)]);
        let all: Vec<Turn> = [&short, &mid, &long, &other]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        let classes = Classes::new(&all);
        // Nothing done yet: the class's mean total; past 150 tokens only 300 and 600 count.
        assert_eq!(classes.expected_left(512, 0), 333);
        assert_eq!(classes.expected_left(512, 150), 300);
        assert_eq!(classes.expected_left(512, 600), 0);
        assert_eq!(classes.expected_left(2048, 0), 1000);
        assert_eq!(classes.expected_left(7, 0), 0);
        let learning = Clients {
            work_left: WorkLeft::ClassMean,
            ..Clients::default()
        };
        // The Program's own length is not used: only what it has done and its class.
        assert_eq!(learning.priority(&mid, 1, &classes), -300);
        assert_eq!(learning.priority(&long, 1, &classes), -300);
        assert_eq!(learning.priority(&other, 0, &classes), -1000);
    }
}
