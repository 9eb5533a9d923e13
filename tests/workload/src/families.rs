//! The workload families of `progbench matrix`: eight agentic traffic shapes in the default run
//! and two added after its defaults were set and run by name, each its own generator with its own
//! parameters (turn counts, context growth, tool gaps, arrivals, system prompts), so that a
//! scheduler default has to hold across shapes rather than on one preset.
//!
//! Owns each family's parameters and its default size (Programs and arrival rate, chosen so that
//! the family keeps enough Programs live for the matrix's pressure levels to be reachable on four
//! ranks). The Programs are [`Turn`]s, as every other progbench workload.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;

use crate::workload::{self, Arrivals, Gaps, Preset, Root, Shape, Turn};

/// One family of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum Family {
    /// Coding agents (swe-agent-like): 12–40 turns, large tool results, mostly short tool calls.
    Coding,
    /// A fleet of agents sharing one 6K-token system prompt with modest appends.
    SharedPrompt,
    /// Tool gaps drawn from a Pareto tail (index 1.2, 0.5 s minimum, capped at 10 minutes).
    HeavyGaps,
    /// Many short Programs: 2–5 turns each, arriving fast.
    ShortMany,
    /// Few very long Programs: 40–90 turns of small appends.
    LongFew,
    /// Lead agents spawning subagents that share the lead's prompt, most blocking the lead.
    Subagents,
    /// CI-style fan-out: Programs arrive in bursts of about ten.
    Bursty,
    /// Human chat mixed with coding agents and long-tool agents.
    MixedChat,
    /// Agents on a reasoning model: 4–14 turns, each decoding about 700 tokens (outputs larger
    /// than appends, unlike the eight above). Outside the default run (run it by name) and held
    /// out of every choice of a default.
    Reasoning,
    /// Questions about a long document (retrieval, file upload): a first turn of ~9K tokens,
    /// 2–6 turns in all, short follow-ups, a person's think time between them. Outside the
    /// default run like reasoning; its odd seeds chose `hold_free_admission_slack_ratio`.
    Documents,
}

impl Family {
    /// The matrix's default families. [`Family::Reasoning`] and [`Family::Documents`] are left
    /// out: they came after the eight's defaults were set, as shapes none of those was chosen on.
    pub const ALL: [Family; 8] = [
        Family::Coding,
        Family::SharedPrompt,
        Family::HeavyGaps,
        Family::ShortMany,
        Family::LongFew,
        Family::Subagents,
        Family::Bursty,
        Family::MixedChat,
    ];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Coding => "coding",
            Family::SharedPrompt => "shared-prompt",
            Family::HeavyGaps => "heavy-gaps",
            Family::ShortMany => "short-many",
            Family::LongFew => "long-few",
            Family::Subagents => "subagents",
            Family::Bursty => "bursty",
            Family::MixedChat => "mixed-chat",
            Family::Reasoning => "reasoning",
            Family::Documents => "documents",
        }
    }

    /// Programs and arrivals per second at full size.
    pub fn size(self) -> (u32, f64) {
        match self {
            Family::Coding => (240, 0.2),
            Family::SharedPrompt => (320, 0.4),
            Family::HeavyGaps => (360, 0.3),
            Family::ShortMany => (1500, 2.5),
            Family::LongFew => (120, 0.15),
            Family::Subagents => (160, 0.12),
            Family::Bursty => (320, 0.3),
            Family::MixedChat => (400, 0.4),
            Family::Reasoning => (300, 0.3),
            Family::Documents => (400, 0.5),
        }
    }

    /// The family's own shape (for the families generated here).
    fn shape(self) -> Shape {
        match self {
            Family::SharedPrompt => Shape {
                turns: (8, 24),
                system_tokens: 6144,
                system_prompts: 1,
                first_append_median: 400.0,
                append_median: 250.0,
                append_sigma: 0.7,
                output_median: 150.0,
                output_sigma: 0.8,
                gaps: Gaps::Mixture([(0.7, 1.0, 0.6), (0.25, 5.0, 0.5), (0.05, 15.0, 0.4)]),
                gap_cap: 30.0,
                tools: Some(workload::AGENT_TOOLS),
            },
            Family::HeavyGaps => Shape {
                turns: (10, 30),
                system_tokens: 2048,
                system_prompts: 2,
                first_append_median: 1200.0,
                append_median: 400.0,
                append_sigma: 0.8,
                output_median: 100.0,
                output_sigma: 0.8,
                gaps: Gaps::Pareto {
                    min: 0.5,
                    alpha: 1.2,
                },
                gap_cap: 600.0,
                // One distribution, no tool to tell apart.
                tools: None,
            },
            Family::ShortMany => Shape {
                turns: (2, 5),
                system_tokens: 1024,
                system_prompts: 4,
                first_append_median: 800.0,
                append_median: 300.0,
                append_sigma: 0.7,
                output_median: 200.0,
                output_sigma: 0.7,
                gaps: Gaps::Mixture([(0.8, 1.5, 0.5), (0.15, 6.0, 0.5), (0.05, 20.0, 0.4)]),
                gap_cap: 60.0,
                tools: Some(workload::AGENT_TOOLS),
            },
            Family::LongFew => Shape {
                turns: (40, 90),
                system_tokens: 2048,
                system_prompts: 1,
                first_append_median: 1000.0,
                append_median: 180.0,
                append_sigma: 0.6,
                output_median: 60.0,
                output_sigma: 0.7,
                gaps: Gaps::Mixture([(0.8, 0.6, 0.5), (0.18, 3.0, 0.5), (0.02, 15.0, 0.4)]),
                gap_cap: 30.0,
                tools: Some(workload::AGENT_TOOLS),
            },
            Family::Bursty => Shape {
                turns: (6, 20),
                system_tokens: 3072,
                system_prompts: 3,
                first_append_median: 1500.0,
                append_median: 500.0,
                append_sigma: 0.8,
                output_median: 150.0,
                output_sigma: 0.8,
                gaps: Gaps::Mixture([(0.6, 1.0, 0.6), (0.3, 5.0, 0.5), (0.1, 15.0, 0.4)]),
                gap_cap: 60.0,
                tools: Some(workload::AGENT_TOOLS),
            },
            Family::Reasoning => Shape {
                turns: (4, 14),
                system_tokens: 2048,
                system_prompts: 2,
                first_append_median: 1200.0,
                append_median: 350.0,
                append_sigma: 0.8,
                output_median: 700.0,
                output_sigma: 0.7,
                gaps: Gaps::Mixture([(0.6, 1.0, 0.6), (0.3, 5.0, 0.5), (0.1, 20.0, 0.4)]),
                gap_cap: 60.0,
                tools: Some(workload::AGENT_TOOLS),
            },
            // A person reads each answer and asks again: a chat's think time, no tool.
            Family::Documents => Shape {
                turns: (2, 6),
                system_prompts: 3,
                first_append_median: 9000.0,
                append_median: 120.0,
                append_sigma: 0.6,
                ..Preset::Chat.shape()
            },
            Family::Coding | Family::Subagents | Family::MixedChat => Preset::SweAgent.shape(),
        }
    }

    /// How Programs arrive.
    fn arrivals(self) -> Arrivals {
        match self {
            Family::Bursty => Arrivals::Bursty {
                mean_size: 10.0,
                spacing: 0.5,
            },
            _ => Arrivals::Poisson,
        }
    }

    /// The family's workload: `scale` × its Programs at its rate (so a smaller run is the same
    /// traffic for a shorter time), seeded.
    pub fn generate(self, scale: f64, seed: u64) -> Vec<Turn> {
        let (programs, rate) = self.size();
        let programs = ((f64::from(programs) * scale).round() as u32).max(4);
        match self {
            Family::Coding => workload::generate(Preset::SweAgent, programs, rate, seed),
            Family::Subagents => workload::generate(Preset::MultiAgent, programs, rate, seed),
            Family::MixedChat => workload::generate(Preset::Mixed, programs, rate, seed),
            _ => generate_shape(&self.shape(), programs, rate, seed, self.arrivals()),
        }
    }
}

/// `programs` root Programs of one shape.
fn generate_shape(
    shape: &Shape,
    programs: u32,
    rate: f64,
    seed: u64,
    arrivals: Arrivals,
) -> Vec<Turn> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6661_6d69_6c79);
    let starts: Vec<f64> = match arrivals {
        Arrivals::Poisson => {
            let inter = Exp::new(rate.max(1e-9))
                .unwrap_or_else(|_| Exp::new(1.0).expect("rate 1 is valid"));
            let mut t = 0.0;
            (0..programs)
                .map(|_| {
                    t += inter.sample(&mut rng);
                    t
                })
                .collect()
        }
        Arrivals::Bursty { mean_size, spacing } => workload::burst_times(
            programs as usize,
            rate,
            seed ^ 0x6275_7273_7479,
            mean_size,
            spacing,
        ),
    };
    let mut out = Vec::new();
    for (p, t) in starts.into_iter().enumerate() {
        let turns = rng.random_range(shape.turns.0..=shape.turns.1);
        let system_prompt = rng.random_range(0..shape.system_prompts);
        workload::push_program(
            &mut out,
            &mut rng,
            shape,
            Root {
                program_id: &format!("p{p:05}"),
                task: p as u32,
                turns,
                arrival: t,
                system_prompt,
            },
            None,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::programs;

    #[test]
    fn every_family_is_seeded_valid_and_its_own_shape() {
        for f in Family::ALL {
            let a = f.generate(0.25, 3);
            assert!(a == f.generate(0.25, 3), "{f:?}: same seed, same workload");
            assert!(
                a != f.generate(0.25, 4),
                "{f:?}: another seed, another workload"
            );
            let rows: Vec<(usize, Turn)> = a.iter().cloned().enumerate().collect();
            workload::validate(&rows).unwrap_or_else(|e| panic!("{f:?}: {e}"));
        }
        let turns = |f: Family| {
            let p = programs(&f.generate(1.0, 1));
            p.iter().map(Vec::len).sum::<usize>() as f64 / p.len() as f64
        };
        assert!(turns(Family::ShortMany) < 5.0 && turns(Family::LongFew) > 40.0);
        // One system prompt for the whole fleet.
        let fleet = Family::SharedPrompt.generate(0.5, 1);
        assert!(
            fleet
                .iter()
                .all(|t| t.system_prompt == 0 && t.system_tokens == 6144)
        );
        // Pareto gaps: a tail the lognormal mixtures do not have.
        let long_gaps = |f: Family| {
            let w = f.generate(1.0, 2);
            let gaps: Vec<f64> = w
                .iter()
                .filter(|t| t.gap_after > 0.0)
                .map(|t| t.gap_after)
                .collect();
            gaps.iter().filter(|g| **g > 60.0).count()
        };
        // P(gap > 60 s) = (0.5 / 60)^1.2 ≈ 0.3 % of about 7,000 gaps.
        assert!(
            long_gaps(Family::HeavyGaps) >= 5,
            "heavy-gaps has a tail past 60 s"
        );
        assert!(
            long_gaps(Family::Coding) == 0,
            "coding gaps are capped at 30 s"
        );
        // Subagents have parents; bursts cluster.
        assert!(
            Family::Subagents
                .generate(0.5, 1)
                .iter()
                .any(|t| t.parent_program_id.is_some())
        );
        let starts: Vec<f64> = programs(&Family::Bursty.generate(1.0, 1))
            .iter()
            .map(|p| p[0].program_arrival)
            .collect();
        let close = starts.windows(2).filter(|w| w[1] - w[0] < 1.0).count();
        assert!(
            close * 2 > starts.len(),
            "most bursty Programs start within 1 s of another"
        );
    }

    /// Agents' gaps name the tool behind them, each tool with its own durations; a human's
    /// gap and heavy-gaps' single tail name none; the last turn has no gap and no tool.
    #[test]
    fn agent_gaps_name_their_tool_and_human_ones_none() {
        use std::collections::BTreeMap;
        let w = Family::Coding.generate(1.0, 2);
        let mut by_tool: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for t in &w {
            match &t.tool {
                Some(name) => by_tool.entry(name).or_default().push(t.gap_after),
                None => assert_eq!(t.gap_after, 0.0, "only the last turn names no tool"),
            }
        }
        assert_eq!(
            by_tool.keys().copied().collect::<Vec<_>>(),
            ["read_file", "run_command", "run_tests"]
        );
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let read = median(by_tool.get_mut("read_file").expect("read_file"));
        let tests = median(by_tool.get_mut("run_tests").expect("run_tests"));
        assert!(read < 1.5 && tests > 10.0, "{read} {tests}");
        assert!(
            Family::HeavyGaps
                .generate(0.3, 1)
                .iter()
                .all(|t| t.tool.is_none())
        );
        let chat = workload::generate(Preset::Chat, 40, 1.0, 1);
        assert!(chat.iter().all(|t| t.tool.is_none()));
    }

    /// The added families: seeded and valid like the rest, outside the default set, each a
    /// shape no default family has. Reasoning agents decode more than they append.
    #[test]
    fn added_families_are_their_own_shapes() {
        for f in [Family::Reasoning, Family::Documents] {
            assert!(!Family::ALL.contains(&f));
            let w = f.generate(0.25, 3);
            assert!(w == f.generate(0.25, 3) && w != f.generate(0.25, 4));
            let rows: Vec<(usize, Turn)> = w.iter().cloned().enumerate().collect();
            workload::validate(&rows).unwrap_or_else(|e| panic!("{f:?}: {e}"));
        }
        let f = Family::Reasoning;
        let ratio = |f: Family| {
            let w = f.generate(1.0, 1);
            let later = w.iter().filter(|t| t.step > 0);
            let (out, app) = later.fold((0u64, 0u64), |(o, a), t| {
                (
                    o + u64::from(t.output_tokens),
                    a + u64::from(t.append_tokens),
                )
            });
            out as f64 / app as f64
        };
        assert!(ratio(f) > 1.5, "reasoning: {}", ratio(f));
        for other in Family::ALL {
            assert!(ratio(other) < 1.0, "{other:?}: {}", ratio(other));
        }
        // Documents: a first turn tens of times its follow-ups, and a person (no tool) between.
        let w = Family::Documents.generate(1.0, 1);
        let mean = |first: bool| {
            let v: Vec<f64> = w
                .iter()
                .filter(|t| (t.step == 0) == first)
                .map(|t| f64::from(t.append_tokens))
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        assert!(
            mean(true) > 30.0 * mean(false),
            "{} {}",
            mean(true),
            mean(false)
        );
        assert!(w.iter().all(|t| t.tool.is_none()));
    }
}
