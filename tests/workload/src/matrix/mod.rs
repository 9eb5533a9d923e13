//! `progbench matrix`: every workload family × KV pressure level × seed in virtual time, consistent
//! hashing against Program scheduling, each measured above the cell's own floor.
//!
//! Owns the pressure levels, how a cell's KV size is derived from its floor, the runs of one
//! (family, seed) pair, the aggregation of seeds into cells and the goals each cell is held to.
//! The floor of a (family, seed) pair is consistent hashing with KV no workload can fill: what no
//! scheduler can improve on, because nothing is ever evicted. Pressure is KV demand (the contexts
//! of all live Programs) at its 90th percentile on the floor's timeline over the cell's KV.

use std::sync::Mutex;

use program_router::config::ProgramSchedulingConfig;
use serde::Serialize;
use vllm_sim::engine::EngineParams;

use crate::clients::WorkLeft;
use crate::des::{self, Mode, Report};
use crate::engines::EngineProfile;
use crate::families::Family;
use crate::workload::Turn;

/// A KV pressure level: the floor's KV demand at p90 over the cell's KV capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Pressure {
    /// 0.5×: every live Program fits twice over.
    None,
    /// 1.2×
    Moderate,
    /// 1.8×
    Heavy,
    /// 3×
    Overload,
}

impl Pressure {
    pub const ALL: [Pressure; 4] = [
        Pressure::None,
        Pressure::Moderate,
        Pressure::Heavy,
        Pressure::Overload,
    ];

    /// KV demand at p90 over capacity.
    pub fn demand(self) -> f64 {
        match self {
            Pressure::None => 0.5,
            Pressure::Moderate => 1.2,
            Pressure::Heavy => 1.8,
            Pressure::Overload => 3.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pressure::None => "none",
            Pressure::Moderate => "moderate",
            Pressure::Heavy => "heavy",
            Pressure::Overload => "overload",
        }
    }
}

/// Which seeds a run uses: defaults are chosen on the tuning half and reported on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Half {
    /// Odd seeds 1, 3, 5, 7, 9: where scheduler defaults may be chosen.
    Tuning,
    /// Even seeds 2, 4, 6, 8, 10: held out, what the reference reports.
    Report,
}

impl Half {
    pub fn seeds(self) -> Vec<u64> {
        match self {
            Half::Tuning => vec![1, 3, 5, 7, 9],
            Half::Report => vec![2, 4, 6, 8, 10],
        }
    }
}

/// Families whose traffic may set scheduler defaults (with the tuning seeds); the others are
/// held out entirely. Documents chose one, `hold_free_admission_slack_ratio`, after the rest.
pub const TUNING_FAMILIES: [Family; 5] = [
    Family::Coding,
    Family::SharedPrompt,
    Family::ShortMany,
    Family::Subagents,
    Family::Documents,
];

/// What to run.
#[derive(Debug, Clone)]
pub struct Setup {
    pub families: Vec<Family>,
    pub pressures: Vec<Pressure>,
    pub seeds: Vec<u64>,
    /// DP ranks (the cluster: 2 servers × 2).
    pub ranks: usize,
    /// Each family's Programs × this (its rate unchanged).
    pub scale: f64,
    pub max_model_len: usize,
    pub program: ProgramSchedulingConfig,
    /// The engines' step-time model ([`EngineProfile`]); the reference unless asked.
    pub engine: EngineProfile,
    /// The router keeps its reference cost models on another engine (not calibrated to it).
    pub uncalibrated: bool,
    /// Also run both modes under free retention (see [`SeedRun::bound_hash`]).
    pub bounds: bool,
    /// Ours and affinity only are driven by clients that identify Programs by headers alone
    /// ([`des::Clients::headers_only`]); the bounds keep full clients.
    pub headers_only: bool,
    /// Worker threads over (family, seed) pairs.
    pub threads: usize,
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RunStats {
    pub mean_jct: f64,
    pub p90_jct: f64,
    pub p99_jct: f64,
    pub token_hit: f64,
    pub kv_demand_p90: f64,
    pub mean_kv_usage: f64,
    pub preemptions: u64,
    pub queue_timeouts: u64,
    pub programs_completed: usize,
    pub programs_truncated: usize,
}

impl From<&Report> for RunStats {
    fn from(r: &Report) -> Self {
        RunStats {
            mean_jct: r.mean_jct_seconds,
            p90_jct: r.p90_jct_seconds,
            p99_jct: r.p99_jct_seconds,
            token_hit: r.token_hit_rate,
            kv_demand_p90: r.kv_demand_p90,
            mean_kv_usage: r.mean_kv_usage,
            preemptions: r.preemptions,
            queue_timeouts: r.queue_timeouts,
            programs_completed: r.programs_completed,
            programs_truncated: r.programs_truncated,
        }
    }
}

/// One family × pressure × seed.
#[derive(Debug, Clone, Serialize)]
pub struct SeedRun {
    pub family: Family,
    pub pressure: Pressure,
    pub seed: u64,
    pub programs: usize,
    pub blocks_per_rank: usize,
    /// The floor's KV demand p90 over this cell's KV (the target unless the KV had to be raised
    /// to hold one `max_model_len` context per rank).
    pub demand: f64,
    pub floor: RunStats,
    pub hash: RunStats,
    pub program: RunStats,
    /// Program scheduling with `binding_only`: the same Program-to-rank affinity with nothing
    /// held back or queued for it. Where ours is slower than this, holding did not pay.
    pub affinity: RunStats,
    /// With `--bounds`, under pressure: hashing and Program scheduling on engines where every
    /// prefix ever computed stays a hit at no KV cost (`EngineParams::free_retention`) — what
    /// keeping prefixes could win at best, whatever tells the router where they are.
    pub bound_hash: Option<RunStats>,
    pub bound_program: Option<RunStats>,
    /// With `--bounds`, under pressure: Program scheduling on engines told when a Program ends
    /// (`EngineParams::end_hint`), which evict ended Programs' blocks first — what a router
    /// could win at most by keeping paused prefixes ahead of ended ones in the engine's LRU.
    pub bound_end_hint: Option<RunStats>,
    /// With `--bounds`, under pressure: the end hint, and clients that know each tool gap in
    /// advance and hold a paused Program's KV exactly when that costs less than re-prefilling
    /// it (`des::clairvoyant_ttl`) — what retention decided with every gap known wins on a real
    /// engine, where a held prefix takes KV from the running batch (a strong rule, not an optimum).
    pub bound_clairvoyant: Option<RunStats>,
    /// With `--bounds`, under pressure: Program scheduling on stock engines with clients that
    /// know each Program's remaining work and ask to go shortest-remaining first
    /// (`WorkLeft::Known`) — what ordering alone could win with that known.
    pub bound_order: Option<RunStats>,
    /// The same with each Program's remaining work estimated from its class's lengths and what
    /// it has done (`WorkLeft::ClassMean`) — what a router that learned those could win.
    pub bound_order_class: Option<RunStats>,
}

/// The floor of `turns` on `ranks` ranks shaped like `base` (consistent hashing, KV nothing
/// fills) and the live KV demand at p90 on its timeline, in tokens.
pub fn floor(turns: &[Turn], ranks: usize, base: &EngineParams) -> (Report, f64) {
    let engine = EngineParams {
        // Every Program's whole context at once, on any one rank: nothing is ever evicted.
        num_gpu_blocks: crate::oracle::blocks_for_no_kv_pressure(turns, base.block_size)
            .max(base.max_model_len.div_ceil(base.block_size)),
        ..base.clone()
    };
    let floor = des::run(turns, ranks, &engine, &Mode::ConsistentHash);
    let demand = floor.kv_demand_p90 * (engine.token_capacity() * ranks) as f64;
    (floor, demand)
}

/// KV blocks per rank that put `demand_tokens` at `pressure`, but never fewer than one
/// `max_model_len` context needs.
pub fn blocks_at(
    demand_tokens: f64,
    ranks: usize,
    base: &EngineParams,
    pressure: Pressure,
) -> usize {
    ((demand_tokens / pressure.demand() / (ranks * base.block_size) as f64).round() as usize)
        .max(base.max_model_len.div_ceil(base.block_size))
}

/// KV blocks per rank that put `turns` on `ranks` ranks at `pressure` on `engine`, sized as a
/// matrix cell is (from its floor's live KV demand at p90); `progbench compare --pressure` sizes
/// its runs so.
pub fn cell_blocks(
    turns: &[Turn],
    ranks: usize,
    max_model_len: usize,
    pressure: Pressure,
    engine: EngineProfile,
) -> usize {
    let base = EngineParams {
        max_model_len,
        timing: engine.timing(),
        ..EngineParams::default()
    };
    blocks_at(floor(turns, ranks, &base).1, ranks, &base, pressure)
}

/// Every pressure level of one (family, seed) pair: the floor once, then both modes per level.
pub fn run_pair(setup: &Setup, family: Family, seed: u64) -> Vec<SeedRun> {
    let turns = family.generate(setup.scale, seed);
    let base = EngineParams {
        max_model_len: setup.max_model_len,
        timing: setup.engine.timing(),
        ..EngineParams::default()
    };
    let (floor, demand_tokens) = self::floor(&turns, setup.ranks, &base);
    let mut program = setup.program.clone();
    if !setup.uncalibrated {
        crate::engines::calibrate(&mut program, &base.timing);
    }
    let program_mode = Mode::Program(Box::new(program.clone()));
    let affinity_mode = Mode::Program(Box::new(ProgramSchedulingConfig {
        binding_only: true,
        ..program.clone()
    }));
    setup
        .pressures
        .iter()
        .map(|&pressure| {
            let blocks = blocks_at(demand_tokens, setup.ranks, &base, pressure);
            let engine = EngineParams {
                num_gpu_blocks: blocks,
                ..base.clone()
            };
            let hash = des::run(&turns, setup.ranks, &engine, &Mode::ConsistentHash);
            let clients = des::Clients {
                headers_only: setup.headers_only,
                ..des::Clients::default()
            };
            let program = des::run_with(&turns, setup.ranks, &engine, &program_mode, &clients);
            let affinity = des::run_with(&turns, setup.ranks, &engine, &affinity_mode, &clients);
            let free = EngineParams {
                free_retention: true,
                ..engine.clone()
            };
            let bounded = setup.bounds && pressure != Pressure::None;
            let bound = |mode: &Mode| {
                bounded.then(|| RunStats::from(&des::run(&turns, setup.ranks, &free, mode)))
            };
            let hinted = EngineParams {
                end_hint: true,
                ..engine.clone()
            };
            let ordered = |work_left| {
                let clients = des::Clients {
                    work_left,
                    ..des::Clients::default()
                };
                RunStats::from(&des::run_with(
                    &turns,
                    setup.ranks,
                    &engine,
                    &program_mode,
                    &clients,
                ))
            };
            SeedRun {
                family,
                pressure,
                seed,
                programs: floor.programs,
                blocks_per_rank: blocks,
                demand: demand_tokens / (engine.token_capacity() * setup.ranks) as f64,
                floor: RunStats::from(&floor),
                hash: RunStats::from(&hash),
                program: RunStats::from(&program),
                affinity: RunStats::from(&affinity),
                bound_hash: bound(&Mode::ConsistentHash),
                bound_program: bound(&program_mode),
                bound_end_hint: bounded.then(|| {
                    RunStats::from(&des::run(&turns, setup.ranks, &hinted, &program_mode))
                }),
                bound_clairvoyant: bounded.then(|| {
                    let clients = des::Clients {
                        clairvoyant: true,
                        ..des::Clients::default()
                    };
                    let r = des::run_with(&turns, setup.ranks, &hinted, &program_mode, &clients);
                    RunStats::from(&r)
                }),
                bound_order: bounded.then(|| ordered(WorkLeft::Known)),
                bound_order_class: bounded.then(|| ordered(WorkLeft::ClassMean)),
            }
        })
        .collect()
}

/// Every (family, seed) pair on `setup.threads` threads; `progress` hears each pair as it ends.
pub fn run(setup: &Setup, progress: &(dyn Fn(Family, u64) + Sync)) -> Vec<SeedRun> {
    let jobs: Vec<(Family, u64)> = setup
        .families
        .iter()
        .flat_map(|&f| setup.seeds.iter().map(move |&s| (f, s)))
        .collect();
    let next = Mutex::new(jobs.into_iter());
    let out = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..setup.threads.max(1) {
            scope.spawn(|| {
                loop {
                    let job = next.lock().map(|mut it| it.next()).ok().flatten();
                    let Some((family, seed)) = job else { break };
                    let runs = run_pair(setup, family, seed);
                    progress(family, seed);
                    if let Ok(mut o) = out.lock() {
                        o.extend(runs);
                    }
                }
            });
        }
    });
    let mut runs = out.into_inner().unwrap_or_default();
    runs.sort_by_key(|r| (r.family, r.pressure, r.seed));
    runs
}

/// Within this share of the floor, an excess is noise: nothing is left to win.
pub const NEGLIGIBLE_EXCESS: f64 = 0.01;
/// "Never worse": within this share (the virtual-time runs are deterministic; this absorbs the
/// order of simultaneous events, not run-to-run noise).
pub const WORSE_TOLERANCE: f64 = 0.01;

/// Seeds of one cell aggregated, with the goals it is held to.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub family: Family,
    pub pressure: Pressure,
    pub seeds: Vec<u64>,
    /// The family took no part in choosing defaults (see [`TUNING_FAMILIES`]).
    pub held_out: bool,
    pub demand: f64,
    pub floor_mean_jct: f64,
    /// Mean over seeds of each mode's mean JCT above the floor, seconds.
    pub hash_excess: f64,
    pub program_excess: f64,
    /// Mean over seeds of each mode's excess under free retention (with `--bounds`).
    pub bound_hash_excess: Option<f64>,
    pub bound_program_excess: Option<f64>,
    /// Mean over seeds of Program scheduling's excess with the engine's end hint (`--bounds`).
    pub bound_end_hint_excess: Option<f64>,
    /// Mean over seeds of Program scheduling's excess under clairvoyant retention (`--bounds`).
    pub bound_clairvoyant_excess: Option<f64>,
    /// Mean over seeds of Program scheduling's excess with each Program's remaining work known,
    /// and estimated by its class (`--bounds`).
    pub bound_order_excess: Option<f64>,
    pub bound_order_class_excess: Option<f64>,
    /// Program scheduling's excess over hashing's, pooled over seeds, and its range per seed.
    pub excess_ratio: Option<f64>,
    pub excess_ratio_range: Option<(f64, f64)>,
    /// Program scheduling ÷ hashing, geometric mean over seeds and (min, max).
    pub mean_ratio: (f64, f64, f64),
    pub p90_ratio: (f64, f64, f64),
    pub p99_ratio: (f64, f64, f64),
    pub hash_hit: f64,
    pub program_hit: f64,
    /// Mean over seeds of affinity-only's excess (see [`SeedRun::affinity`]).
    pub affinity_excess: f64,
    /// Program scheduling ÷ affinity only, mean JCT, geometric mean over seeds and (min, max):
    /// above 1, holding KV and requests back cost more than it won. Not one of the goals.
    pub affinity_mean_ratio: (f64, f64, f64),
    pub goals: Vec<Goal>,
}

/// One goal of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub name: &'static str,
    pub met: bool,
}

fn geo(v: &[f64]) -> (f64, f64, f64) {
    let g = (v.iter().map(|x| x.max(1e-12).ln()).sum::<f64>() / v.len().max(1) as f64).exp();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (g, lo, hi)
}

/// The cells of `runs`, in family then pressure order.
pub fn cells(runs: &[SeedRun]) -> Vec<Cell> {
    let mut keys: Vec<(Family, Pressure)> = runs.iter().map(|r| (r.family, r.pressure)).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|(family, pressure)| {
            let rs: Vec<&SeedRun> = runs
                .iter()
                .filter(|r| r.family == family && r.pressure == pressure)
                .collect();
            cell(family, pressure, &rs)
        })
        .collect()
}

/// Mean over seeds of a bound run's excess above the floor, when every seed has it.
fn bound_excess(rs: &[&SeedRun], run: impl Fn(&SeedRun) -> Option<RunStats>) -> Option<f64> {
    let v: Option<Vec<f64>> = rs
        .iter()
        .map(|r| run(r).map(|b| b.mean_jct - r.floor.mean_jct))
        .collect();
    v.filter(|v| !v.is_empty())
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
}

fn cell(family: Family, pressure: Pressure, rs: &[&SeedRun]) -> Cell {
    let n = rs.len().max(1) as f64;
    let avg = |f: &dyn Fn(&SeedRun) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
    let floor = avg(&|r| r.floor.mean_jct);
    let hash_excess = avg(&|r| r.hash.mean_jct - r.floor.mean_jct);
    let program_excess = avg(&|r| r.program.mean_jct - r.floor.mean_jct);
    let affinity_means: Vec<f64> = rs
        .iter()
        .map(|r| r.program.mean_jct / r.affinity.mean_jct.max(1e-9))
        .collect();
    let negligible = NEGLIGIBLE_EXCESS * floor;
    let excess_ratio = (hash_excess > negligible).then(|| program_excess / hash_excess);
    let per_seed: Vec<f64> = rs
        .iter()
        .filter(|r| r.hash.mean_jct - r.floor.mean_jct > NEGLIGIBLE_EXCESS * r.floor.mean_jct)
        .map(|r| (r.program.mean_jct - r.floor.mean_jct) / (r.hash.mean_jct - r.floor.mean_jct))
        .collect();
    let excess_ratio_range = (!per_seed.is_empty()).then(|| {
        (
            per_seed.iter().copied().fold(f64::INFINITY, f64::min),
            per_seed.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    });
    let ratio = |f: &dyn Fn(&RunStats) -> f64| -> Vec<f64> {
        rs.iter()
            .map(|r| f(&r.program) / f(&r.hash).max(1e-9))
            .collect()
    };
    let means = ratio(&|s| s.mean_jct);
    let p90s = ratio(&|s| s.p90_jct);
    let p99s = ratio(&|s| s.p99_jct);
    let never_worse = |v: &[f64]| v.iter().all(|x| *x <= 1.0 + WORSE_TOLERANCE);
    // A Program that timed out in the queue leaves the means; without this goal a setting that
    // drops the slowest Programs would read as faster.
    let mut goals = vec![Goal {
        name: "every Program completed (no queue timeouts)",
        met: rs.iter().all(|r| {
            r.program.queue_timeouts == 0
                && r.program.programs_completed == r.hash.programs_completed
        }),
    }];
    if pressure == Pressure::None {
        goals.push(Goal {
            name: "no regression without pressure (mean, p90, p99 ≤ hashing)",
            met: never_worse(&means) && never_worse(&p90s) && never_worse(&p99s),
        });
    } else {
        goals.push(Goal {
            name: "excess ≤ 0.5× hashing's",
            met: program_excess <= negligible.max(0.5 * hash_excess),
        });
        goals.push(Goal {
            name: "p90 and p99 never worse than hashing",
            met: never_worse(&p90s) && never_worse(&p99s),
        });
        if matches!(pressure, Pressure::Heavy | Pressure::Overload) {
            goals.push(Goal {
                name: "mean never worse than hashing",
                met: never_worse(&means),
            });
        }
    }
    Cell {
        family,
        pressure,
        seeds: rs.iter().map(|r| r.seed).collect(),
        held_out: !TUNING_FAMILIES.contains(&family),
        demand: avg(&|r| r.demand),
        floor_mean_jct: floor,
        hash_excess,
        program_excess,
        bound_hash_excess: bound_excess(rs, |r| r.bound_hash),
        bound_program_excess: bound_excess(rs, |r| r.bound_program),
        bound_end_hint_excess: bound_excess(rs, |r| r.bound_end_hint),
        bound_clairvoyant_excess: bound_excess(rs, |r| r.bound_clairvoyant),
        bound_order_excess: bound_excess(rs, |r| r.bound_order),
        bound_order_class_excess: bound_excess(rs, |r| r.bound_order_class),
        excess_ratio,
        excess_ratio_range,
        mean_ratio: geo(&means),
        p90_ratio: geo(&p90s),
        p99_ratio: geo(&p99s),
        hash_hit: avg(&|r| r.hash.token_hit),
        program_hit: avg(&|r| r.program.token_hit),
        affinity_excess: avg(&|r| r.affinity.mean_jct - r.floor.mean_jct),
        affinity_mean_ratio: geo(&affinity_means),
        goals,
    }
}

#[cfg(test)]
mod tests;
