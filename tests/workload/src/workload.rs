//! Synthetic agentic workloads: Programs (agent sessions) as sequences of turns whose context
//! grows as `I_k = I_{k-1} + O_{k-1} + A_k`, separated by tool calls.
//!
//! Owns the presets, their distributions and the `requests.jsonl` replay format (one line per
//! request, documented in docs/benchmarks.md). Seeded: the same preset, size and seed give the same
//! workload byte for byte.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One request of a Program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub program_id: String,
    pub task_id: String,
    /// 0-based turn index (the canonical `step_id`).
    pub step: u32,
    /// Seconds after the start when the Program's first turn arrives (same on every line).
    pub program_arrival: f64,
    /// Shared system prompt group and its length in tokens.
    pub system_prompt: u32,
    pub system_tokens: u32,
    /// New tokens this turn appends to the context (user message or tool result).
    pub append_tokens: u32,
    /// Tokens the model generates (`max_tokens`).
    pub output_tokens: u32,
    /// Tool or user time after this turn's completion before the next turn; 0 on the last turn.
    pub gap_after: f64,
    /// The tool this turn's response calls, whose run is `gap_after` (absent where a human
    /// fills the gap, or the gap's distribution has no tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// A subagent: the Program that spawned it (absent for root Programs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_program_id: Option<String>,
    /// A subagent starts when its parent's turn with this step completes (plus
    /// [`SPAWN_DELAY_SECONDS`]); `program_arrival` is then only the root's arrival.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_after_step: Option<u32>,
    /// The parent's next turn waits until this subagent has finished (and its own tool gap has
    /// passed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocks_parent: bool,
}

/// Seconds between a parent's turn completing and the subagents it spawned starting.
pub const SPAWN_DELAY_SECONDS: f64 = 0.1;

impl Turn {
    /// The Program's root (itself for a root Program).
    pub fn root_program_id(&self) -> &str {
        self.parent_program_id
            .as_deref()
            .unwrap_or(&self.program_id)
    }

    /// A test's turn `step` of Program "p" (32 system tokens, no tool, no parent).
    #[cfg(test)]
    pub(crate) fn for_test(step: u32, append: u32, output: u32, gap: f64) -> Turn {
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
            tool: None,
            parent_program_id: None,
            spawned_after_step: None,
            blocks_parent: false,
        }
    }
}

/// A workload preset, calibrated to published agentic statistics (see docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[value(rename_all = "kebab-case")]
pub enum Preset {
    /// Coding agents: long sessions, large appends, mostly short tool calls.
    SweAgent,
    /// Chat: few turns, human think time between them.
    Chat,
    /// Agents whose tool calls are long (tens of seconds): TTL should stay ~0.
    LongTools,
    /// A mix of the three.
    Mixed,
    /// Lead agents that spawn subagents (1–3 at a time after ~15 % of their turns), most of
    /// which block the lead until they finish; subagents share the lead's system prompt.
    MultiAgent,
}

/// Shape parameters of one preset.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub turns: (u32, u32),
    pub system_tokens: u32,
    pub system_prompts: u32,
    pub first_append_median: f64,
    pub append_median: f64,
    pub append_sigma: f64,
    pub output_median: f64,
    pub output_sigma: f64,
    pub gaps: Gaps,
    pub gap_cap: f64,
    /// The tool each gap component stands for (its response calls it), in the components'
    /// order; `None` where a human, not a tool, fills the gap.
    pub tools: Option<[&'static str; 3]>,
}

/// The tools of coding agents' gap components, short to long.
pub const AGENT_TOOLS: [&str; 3] = ["read_file", "run_command", "run_tests"];
/// The tools of long-tool agents' gap components.
pub const LONG_TOOLS: [&str; 3] = ["web_search", "run_build", "run_benchmark"];

/// How long the tool call (or the human) between two turns takes, before `gap_cap`.
#[derive(Debug, Clone, Copy)]
pub enum Gaps {
    /// A mixture of lognormals: (probability, median seconds, sigma) of each component.
    Mixture([(f64, f64, f64); 3]),
    /// Pareto with this minimum (seconds) and tail index: the heavier the smaller `alpha`.
    Pareto { min: f64, alpha: f64 },
}

impl Preset {
    pub fn shape(self) -> Shape {
        match self {
            // Scaled to simulator-sized KV pools: ~80 steps become 12–40, 6.5K appends become
            // ~600 tokens, keeping the ratios (appends ≫ outputs, most gaps short, heavy tail).
            Preset::SweAgent | Preset::Mixed | Preset::MultiAgent => Shape {
                turns: (12, 40),
                system_tokens: 2048,
                system_prompts: 2,
                first_append_median: 1500.0,
                append_median: 450.0,
                append_sigma: 0.8,
                output_median: 120.0,
                output_sigma: 0.9,
                gaps: Gaps::Mixture([(0.75, 0.8, 0.6), (0.2, 4.0, 0.5), (0.05, 20.0, 0.4)]),
                gap_cap: 30.0,
                tools: Some(AGENT_TOOLS),
            },
            Preset::Chat => Shape {
                turns: (2, 8),
                system_tokens: 512,
                system_prompts: 4,
                first_append_median: 300.0,
                append_median: 150.0,
                append_sigma: 0.7,
                output_median: 250.0,
                output_sigma: 0.6,
                gaps: Gaps::Mixture([(0.5, 15.0, 0.5), (0.4, 40.0, 0.4), (0.1, 90.0, 0.3)]),
                gap_cap: 120.0,
                // A human replies: no tool call.
                tools: None,
            },
            Preset::LongTools => Shape {
                turns: (6, 16),
                system_tokens: 1024,
                system_prompts: 2,
                first_append_median: 800.0,
                append_median: 400.0,
                append_sigma: 0.7,
                output_median: 100.0,
                output_sigma: 0.8,
                gaps: Gaps::Mixture([(0.5, 25.0, 0.3), (0.4, 45.0, 0.3), (0.1, 60.0, 0.2)]),
                gap_cap: 60.0,
                tools: Some(LONG_TOOLS),
            },
        }
    }
}

pub(crate) fn lognormal(rng: &mut StdRng, median: f64, sigma: f64) -> f64 {
    LogNormal::new(median.ln(), sigma)
        .map(|d| d.sample(rng))
        .unwrap_or(median)
}

/// One draw of a tool gap, uncapped, and which mixture component it came from.
fn gap(rng: &mut StdRng, gaps: Gaps) -> (f64, Option<usize>) {
    match gaps {
        Gaps::Mixture(components) => {
            let u: f64 = rng.random();
            let mut acc = 0.0;
            let mut k = 2;
            for (i, c) in components.iter().enumerate() {
                acc += c.0;
                if u < acc {
                    k = i;
                    break;
                }
            }
            let g = components[k];
            (lognormal(rng, g.1, g.2), Some(k))
        }
        Gaps::Pareto { min, alpha } => {
            // Inverse CDF; 1 − u is in (0, 1], so the power is finite.
            let u: f64 = rng.random();
            (min / (1.0 - u).powf(1.0 / alpha.max(1e-3)), None)
        }
    }
}

/// Generates `programs` Programs arriving as a Poisson process of `rate` per second.
pub fn generate(preset: Preset, programs: u32, rate: f64, seed: u64) -> Vec<Turn> {
    generate_with(preset, programs, rate, seed, Arrivals::Poisson)
}

/// How Program arrivals are spread over time; both keep the mean rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Arrivals {
    /// Independent arrivals (exponential gaps).
    Poisson,
    /// Bursts: burst starts are Poisson at `rate / mean_size`; a burst brings a geometric number
    /// of Programs (mean `mean_size`) spaced by exponential gaps of mean `spacing` seconds —
    /// a team kicking off many agents at once, a CI job fanning out.
    Bursty { mean_size: f64, spacing: f64 },
}

/// `n` ascending arrival times in bursts: burst starts are Poisson at `rate / mean_size`, a
/// burst brings a geometric number of arrivals (mean `mean_size`) spaced by exponential gaps of
/// mean `spacing` seconds.
pub(crate) fn burst_times(
    n: usize,
    rate: f64,
    seed: u64,
    mean_size: f64,
    spacing: f64,
) -> Vec<f64> {
    let exp =
        |r: f64| Exp::new(r.max(1e-9)).unwrap_or_else(|_| Exp::new(1.0).expect("rate 1 is valid"));
    let mut r2 = StdRng::seed_from_u64(seed);
    let size = mean_size.max(1.0);
    let (starts, within) = (exp(rate / size), exp(1.0 / spacing.max(1e-6)));
    let mut out = Vec::with_capacity(n);
    let mut t = 0.0;
    while out.len() < n {
        t += starts.sample(&mut r2);
        let mut at = t;
        out.push(at);
        // Geometric size with mean `size`: continue with probability 1 − 1/size.
        while out.len() < n && r2.random::<f64>() < 1.0 - 1.0 / size {
            at += within.sample(&mut r2);
            out.push(at);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// Like [`generate`] with an arrival pattern.
pub fn generate_with(
    preset: Preset,
    programs: u32,
    rate: f64,
    seed: u64,
    arrivals: Arrivals,
) -> Vec<Turn> {
    let mut rng = StdRng::seed_from_u64(seed);
    let exp =
        |r: f64| Exp::new(r.max(1e-9)).unwrap_or_else(|_| Exp::new(1.0).expect("rate 1 is valid"));
    // Bursty arrival times come from their own stream, so the Programs themselves (turns, sizes,
    // gaps) are the same as with Poisson arrivals for the same seed.
    let bursty: Option<Vec<f64>> = match arrivals {
        Arrivals::Poisson => None,
        Arrivals::Bursty { mean_size, spacing } => Some(burst_times(
            programs as usize,
            rate,
            seed ^ 0x6275_7273_7479,
            mean_size,
            spacing,
        )),
    };
    let inter = exp(rate);
    let mut t = 0.0;
    let mut out = Vec::new();
    for p in 0..programs {
        // The Poisson draw is taken either way, so the Programs' own draws stay aligned.
        let poisson = t + inter.sample(&mut rng);
        t = match &bursty {
            Some(times) => times[p as usize],
            None => poisson,
        };
        // Each kind of a mixed fleet has system prompts of its own (a chat app's differs from a
        // coding agent's): ids 0–15 for the first kind, 16–31 for the second, and so on.
        let (preset_here, kind) = match preset {
            Preset::Mixed => {
                let k = rng.random_range(0..3);
                (
                    [Preset::SweAgent, Preset::Chat, Preset::LongTools][k],
                    k as u32,
                )
            }
            other => (other, 0),
        };
        let s = preset_here.shape();
        let turns = rng.random_range(s.turns.0..=s.turns.1);
        let system_prompt = 16 * kind + rng.random_range(0..s.system_prompts);
        let program_id = format!("p{p:05}");
        let first = out.len();
        push_program(
            &mut out,
            &mut rng,
            &s,
            Root {
                program_id: &program_id,
                task: p,
                turns,
                arrival: t,
                system_prompt,
            },
            None,
        );
        if preset_here == Preset::MultiAgent {
            let lead: Vec<Turn> = out[first..].to_vec();
            let mut k = 0;
            for turn in lead.iter().filter(|x| x.gap_after > 0.0) {
                if rng.random::<f64>() >= 0.15 {
                    continue;
                }
                for _ in 0..rng.random_range(1..=3u32) {
                    let child = Shape {
                        turns: (3, 10),
                        first_append_median: 600.0,
                        ..s
                    };
                    let child_turns = rng.random_range(child.turns.0..=child.turns.1);
                    let blocks = rng.random::<f64>() < 0.8;
                    push_program(
                        &mut out,
                        &mut rng,
                        &child,
                        Root {
                            program_id: &format!("{program_id}-s{k}"),
                            task: p,
                            turns: child_turns,
                            arrival: t,
                            system_prompt,
                        },
                        Some((&program_id, turn.step, blocks)),
                    );
                    k += 1;
                }
            }
        }
    }
    out
}

/// Where a generated Program starts.
pub(crate) struct Root<'a> {
    pub(crate) program_id: &'a str,
    pub(crate) task: u32,
    pub(crate) turns: u32,
    pub(crate) arrival: f64,
    pub(crate) system_prompt: u32,
}

/// Appends one Program's turns; `parent` = (parent id, the step it spawns after, blocks).
pub(crate) fn push_program(
    out: &mut Vec<Turn>,
    rng: &mut StdRng,
    s: &Shape,
    root: Root<'_>,
    parent: Option<(&str, u32, bool)>,
) {
    let Root {
        program_id,
        task: p,
        turns,
        arrival: t,
        system_prompt,
    } = root;
    {
        for step in 0..turns {
            let median = if step == 0 {
                s.first_append_median
            } else {
                s.append_median
            };
            let append = lognormal(rng, median, s.append_sigma).clamp(8.0, 8.0 * median) as u32;
            let output = lognormal(rng, s.output_median, s.output_sigma).clamp(1.0, 2048.0) as u32;
            let (gap, tool) = if step + 1 == turns {
                (0.0, None)
            } else {
                let (g, k) = gap(rng, s.gaps);
                let tool = s.tools.zip(k).map(|(names, k)| names[k].to_string());
                (g.min(s.gap_cap), tool)
            };
            out.push(Turn {
                program_id: program_id.to_string(),
                task_id: format!("task-{p:05}"),
                step,
                program_arrival: t,
                system_prompt,
                system_tokens: s.system_tokens,
                append_tokens: append,
                output_tokens: output,
                gap_after: gap,
                tool,
                parent_program_id: parent.map(|x| x.0.to_string()),
                spawned_after_step: parent.map(|x| x.1),
                blocks_parent: parent.is_some_and(|x| x.2),
            });
        }
    }
}

/// Groups turns by Program, in arrival order.
pub fn programs(turns: &[Turn]) -> Vec<Vec<Turn>> {
    let mut out: Vec<Vec<Turn>> = Vec::new();
    for t in turns {
        match out.last_mut() {
            Some(p) if p[0].program_id == t.program_id => p.push(t.clone()),
            _ => out.push(vec![t.clone()]),
        }
    }
    out.sort_by(|a, b| a[0].program_arrival.total_cmp(&b[0].program_arrival));
    out
}

/// Writes `requests.jsonl`.
pub fn to_jsonl(turns: &[Turn]) -> String {
    turns
        .iter()
        .filter_map(|t| serde_json::to_string(t).ok())
        .map(|l| l + "\n")
        .collect()
}

/// Reads `requests.jsonl`; the error names the line. The file must describe a workload both
/// drivers run the same way (see [`validate`]).
pub fn from_jsonl(text: &str) -> Result<Vec<Turn>, String> {
    let rows = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map(|t| (i + 1, t))
                .map_err(|e| format!("line {}: {e}", i + 1))
        })
        .collect::<Result<Vec<(usize, Turn)>, String>>()?;
    validate(&rows)?;
    Ok(rows.into_iter().map(|(_, t)| t).collect())
}

/// Checks `(line, turn)` rows: each Program's lines together, steps 0, 1, 2, … in order, one
/// arrival and one parent link on all of them, finite non-negative times, and for a subagent a
/// parent that is in the file and has the step it follows, with no Program its own ancestor.
/// Anything else would make the drivers and the oracle disagree about what runs when.
pub fn validate(rows: &[(usize, Turn)]) -> Result<(), String> {
    // Program → (line and turn of its first row, number of turns).
    let mut first: HashMap<&str, (usize, &Turn, u32)> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut prev: Option<&Turn> = None;
    for (line, t) in rows {
        let id = t.program_id.as_str();
        let err = |m: String| Err(format!("line {line}: Program {id:?}: {m}"));
        if !(t.program_arrival.is_finite() && t.program_arrival >= 0.0) {
            return err("program_arrival must be a finite number of seconds >= 0".into());
        }
        if !(t.gap_after.is_finite() && t.gap_after >= 0.0) {
            return err("gap_after must be a finite number of seconds >= 0".into());
        }
        match prev {
            Some(p) if p.program_id == t.program_id => {
                if t.step != p.step.saturating_add(1) {
                    return err(format!(
                        "step {} follows step {} (steps go 0, 1, 2, ...)",
                        t.step, p.step
                    ));
                }
                if t.program_arrival != p.program_arrival {
                    return err("program_arrival differs from the Program's first line".into());
                }
                if (&t.parent_program_id, t.spawned_after_step, t.blocks_parent)
                    != (&p.parent_program_id, p.spawned_after_step, p.blocks_parent)
                {
                    return err(
                        "parent_program_id, spawned_after_step and blocks_parent must be \
                                the same on every line of a Program"
                            .into(),
                    );
                }
                if let Some(f) = first.get_mut(id) {
                    f.2 += 1;
                }
            }
            _ => {
                if first.contains_key(id) {
                    return err("its lines must be together (it appeared earlier)".into());
                }
                if t.step != 0 {
                    return err(format!("its first line has step {}, not 0", t.step));
                }
                first.insert(id, (*line, t, 1));
                order.push(id);
            }
        }
        prev = Some(t);
    }
    for id in &order {
        let Some((line, t, _)) = first.get(id) else {
            continue;
        };
        let err = |m: String| Err(format!("line {line}: Program {id:?}: {m}"));
        match (&t.parent_program_id, t.spawned_after_step) {
            (None, None) if t.blocks_parent => {
                return err("blocks_parent needs parent_program_id".into());
            }
            (None, None) => {}
            (Some(parent), Some(step)) => {
                let Some((_, _, turns)) = first.get(parent.as_str()) else {
                    return err(format!(
                        "parent_program_id {parent:?} is not a Program in this file"
                    ));
                };
                if step >= *turns {
                    return err(format!(
                        "spawned_after_step {step}, but Program {parent:?} has {turns} turns"
                    ));
                }
                // Walk up: a chain longer than the number of Programs has a cycle.
                let mut up = parent.as_str();
                for _ in 0..first.len() {
                    if up == *id {
                        return err("it is its own ancestor".into());
                    }
                    match first
                        .get(up)
                        .and_then(|(_, p, _)| p.parent_program_id.as_deref())
                    {
                        Some(next) => up = next,
                        None => break,
                    }
                }
            }
            _ => {
                return err("parent_program_id and spawned_after_step go together".into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_round_trips() {
        let a = generate(Preset::SweAgent, 20, 1.0, 7);
        assert!(
            a == generate(Preset::SweAgent, 20, 1.0, 7),
            "same seed, same workload"
        );
        assert!(
            a != generate(Preset::SweAgent, 20, 1.0, 8),
            "another seed, another workload"
        );
        assert!(
            from_jsonl(&to_jsonl(&a)).expect("parse") == a,
            "requests.jsonl round trip differs"
        );
        assert!(from_jsonl("{nope}").expect_err("bad").contains("line 1"));
    }

    #[test]
    fn a_file_the_drivers_would_read_differently_is_refused_with_its_line() {
        let line = |id: &str, step: u32, extra: &str| {
            format!(
                r#"{{"program_id":"{id}","task_id":"t","step":{step},"program_arrival":0.0,"system_prompt":0,"system_tokens":8,"append_tokens":8,"output_tokens":2,"gap_after":0.5{extra}}}"#
            )
        };
        let sub = |parent: &str, after: u32| {
            format!(
                r#","parent_program_id":"{parent}","spawned_after_step":{after},"blocks_parent":true"#
            )
        };
        for preset in [
            Preset::SweAgent,
            Preset::Chat,
            Preset::LongTools,
            Preset::Mixed,
            Preset::MultiAgent,
        ] {
            let w = generate(preset, 30, 0.5, 3);
            let rows: Vec<(usize, Turn)> = w.into_iter().enumerate().collect();
            validate(&rows).unwrap_or_else(|e| panic!("{preset:?}: {e}"));
        }
        let ok = [
            line("a", 0, ""),
            line("a", 1, ""),
            line("b", 0, &sub("a", 1)),
        ]
        .join("\n");
        assert_eq!(from_jsonl(&ok).expect("valid").len(), 3);
        let cases = [
            (vec![line("a", 1, "")], "line 1", "not 0"),
            (
                vec![line("a", 0, ""), line("a", 2, "")],
                "line 2",
                "follows step 0",
            ),
            (
                vec![line("a", 0, ""), line("b", 0, ""), line("a", 1, "")],
                "line 3",
                "together",
            ),
            (
                vec![line("a", 0, ""), line("b", 0, &sub("zz", 0))],
                "line 2",
                "not a Program",
            ),
            (
                vec![line("a", 0, ""), line("b", 0, &sub("a", 1))],
                "line 2",
                "has 1 turns",
            ),
            (
                vec![line("a", 0, &sub("b", 0)), line("b", 0, &sub("a", 0))],
                "line 1",
                "own ancestor",
            ),
            (vec![line("a", 0, &sub("a", 0))], "line 1", "own ancestor"),
            (
                vec![
                    line("a", 0, ""),
                    line("b", 0, r#","parent_program_id":"a""#),
                ],
                "line 2",
                "go together",
            ),
            (
                vec![line("a", 0, r#","blocks_parent":true"#)],
                "line 1",
                "needs parent",
            ),
            (
                vec![line("a", 0, "").replace("0.5", "-1")],
                "line 1",
                "gap_after",
            ),
            (
                vec![
                    line("a", 0, ""),
                    line("a", 1, "")
                        .replace(r#""program_arrival":0.0"#, r#""program_arrival":2.0"#),
                ],
                "line 2",
                "program_arrival differs",
            ),
            (
                vec![line("a", 0, ""), line("a", 1, &sub("a", 0))],
                "line 2",
                "every line",
            ),
        ];
        for (lines, at, what) in cases {
            let e = from_jsonl(&lines.join("\n")).expect_err(what);
            assert!(e.contains(at) && e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn statistics_follow_the_preset() {
        let t = generate(Preset::SweAgent, 400, 2.0, 1);
        let progs = programs(&t);
        assert_eq!(progs.len(), 400);
        let s = Preset::SweAgent.shape();
        assert!(
            progs
                .iter()
                .all(|p| (s.turns.0..=s.turns.1).contains(&(p.len() as u32)))
        );
        let mut appends: Vec<f64> = t
            .iter()
            .filter(|x| x.step > 0)
            .map(|x| f64::from(x.append_tokens))
            .collect();
        appends.sort_by(f64::total_cmp);
        let median = appends[appends.len() / 2];
        assert!(
            (median / s.append_median - 1.0).abs() < 0.1,
            "append median {median}"
        );
        let gaps: Vec<f64> = t
            .iter()
            .filter(|x| x.gap_after > 0.0)
            .map(|x| x.gap_after)
            .collect();
        let short = gaps.iter().filter(|g| **g < 2.0).count() as f64 / gaps.len() as f64;
        assert!(
            (0.65..0.85).contains(&short),
            "share of short tool calls {short}"
        );
        assert!(gaps.iter().all(|g| *g <= s.gap_cap));
        // Poisson arrivals at 2/s: mean inter-arrival 0.5 s.
        let last = progs.last().expect("programs")[0].program_arrival;
        assert!(
            (last / 400.0 - 0.5).abs() < 0.08,
            "mean inter-arrival {}",
            last / 400.0
        );
    }

    #[test]
    fn bursty_arrivals_keep_the_rate_and_the_programs_but_cluster() {
        let cv = |turns: &[Turn]| {
            let starts: Vec<f64> = programs(turns)
                .iter()
                .map(|p| p[0].program_arrival)
                .collect();
            let gaps: Vec<f64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            (1.0 / mean, var.sqrt() / mean)
        };
        let poisson = generate(Preset::Chat, 4000, 2.0, 9);
        let bursty = generate_with(
            Preset::Chat,
            4000,
            2.0,
            9,
            Arrivals::Bursty {
                mean_size: 8.0,
                spacing: 0.05,
            },
        );
        let (rp, cvp) = cv(&poisson);
        let (rb, cvb) = cv(&bursty);
        assert!(
            (rp - 2.0).abs() < 0.15 && (rb - 2.0).abs() < 0.3,
            "rates {rp} {rb}"
        );
        assert!((cvp - 1.0).abs() < 0.1, "Poisson gaps have CV ≈ 1: {cvp}");
        assert!(cvb > 2.0, "bursts make gaps far more variable: {cvb}");
        // The Programs themselves are the same; only when they start differs.
        let shape = |t: &[Turn]| -> Vec<(String, u32, u32, u32)> {
            t.iter()
                .map(|x| {
                    (
                        x.program_id.clone(),
                        x.step,
                        x.append_tokens,
                        x.output_tokens,
                    )
                })
                .collect()
        };
        assert!(shape(&poisson) == shape(&bursty), "the Programs differ");
    }
}
