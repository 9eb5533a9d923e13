//! Several rounds of one comparison (`progbench compare --rounds`): each variant's spread over
//! the rounds, and one router's excess above each round's own floor over another's, per round
//! and pooled. One run of a router moves by a few percent from the next (the machine, the
//! timing of thousands of requests), so a ratio of single runs does not rank two routers.

use serde::Serialize;

use super::{RunResult, Variant};

/// A figure of one variant over the rounds in which it ran cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub runs: usize,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// `figure` of `variant` over its successful runs; `None` when it has none.
pub fn spread(
    results: &[RunResult],
    variant: Variant,
    figure: impl Fn(&RunResult) -> f64,
) -> Option<Spread> {
    let v: Vec<f64> = results
        .iter()
        .filter(|r| r.ok && r.variant == variant)
        .map(figure)
        .collect();
    if v.is_empty() {
        return None;
    }
    Some(Spread {
        runs: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    })
}

/// `ours`' mean JCT above `floor`'s over `peer`'s, each round against its own floor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pooled {
    /// (round, ratio) for every round where all three ran cleanly and the peer was above the
    /// floor.
    pub per_round: Vec<(u32, f64)>,
    /// The sum of ours' excess over those rounds ÷ the sum of the peer's.
    pub pooled: f64,
}

/// The excess ratio of `ours` to `peer` above `floor`, per round and pooled; `None` when no
/// round has all three.
pub fn excess_ratios(
    results: &[RunResult],
    ours: Variant,
    peer: Variant,
    floor: Variant,
) -> Option<Pooled> {
    let mut rounds: Vec<u32> = results.iter().map(|r| r.round).collect();
    rounds.sort_unstable();
    rounds.dedup();
    let (mut per_round, mut sum_ours, mut sum_peer) = (Vec::new(), 0.0, 0.0);
    for round in rounds {
        let jct = |v: Variant| {
            results
                .iter()
                .find(|r| r.ok && r.round == round && r.variant == v)
                .map(|r| r.mean_jct)
        };
        let (Some(o), Some(p), Some(f)) = (jct(ours), jct(peer), jct(floor)) else {
            continue;
        };
        if p > f {
            per_round.push((round, (o - f) / (p - f)));
            sum_ours += o - f;
            sum_peer += p - f;
        }
    }
    (!per_round.is_empty()).then(|| Pooled {
        per_round,
        pooled: sum_ours / sum_peer,
    })
}
