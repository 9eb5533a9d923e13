//! `progbench demo`: a verdict a newcomer can read. Coding-agent sessions at a moderate and a
//! heavy KV pressure, over HTTP on fresh simulators, program-router's Program scheduling against
//! vllm-router 0.1.17's (when installed) and consistent hashing, two seeds each; then the same
//! points in virtual time over five seeds. The answer comes first, the detail after.

use std::path::PathBuf;

use progbench::compare::{self, RunResult, Variant};
use progbench::engines::EngineProfile;
use progbench::matrix::{self, Pressure};
use progbench::verdict;
use progbench::workload::{self, Preset, Turn};
use vllm_sim::engine::EngineParams;

use super::{bin_dir, write_report};

/// Sessions per run, and the HTTP seeds (the virtual-time spread uses [`SIM_SEEDS`]).
const SESSIONS: usize = 24;
const HTTP_SEEDS: [u64; 2] = [1, 2];
const SIM_SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
const POINTS: [Pressure; 2] = [Pressure::Moderate, Pressure::Heavy];
const TIME_SCALE: f64 = 40.0;
const RANKS: usize = 2;
const MAX_MODEL_LEN: usize = 32768;

/// `SESSIONS` coding-agent sessions whose whole context fits the model, so every session the
/// demo starts also finishes (longer ones would end at `max_model_len`).
fn sessions(seed: u64) -> Vec<Turn> {
    let all = workload::generate(Preset::SweAgent, 3 * SESSIONS as u32, 0.2, seed);
    let fits = |p: &Vec<Turn>| {
        let t = p[0].system_tokens as usize
            + p.iter()
                .map(|t| (t.append_tokens + t.output_tokens) as usize)
                .sum::<usize>();
        // Headroom for the chat template around the words.
        t + 256 <= MAX_MODEL_LEN
    };
    workload::programs(&all)
        .into_iter()
        .filter(fits)
        .take(SESSIONS)
        .flatten()
        .collect()
}

fn base() -> EngineParams {
    EngineParams {
        max_model_len: MAX_MODEL_LEN,
        ..EngineParams::default()
    }
}

/// The variants in the order the table shows them, with their names in words.
fn name(v: Variant) -> &'static str {
    match v {
        Variant::PrProgram => "program-router, Program scheduling",
        Variant::VrProgram => "vllm-router 0.1.17, Program scheduling",
        Variant::PrHash => "consistent hashing (program-router)",
        _ => "other",
    }
}

/// One point's runs: per variant, one result per HTTP seed.
struct Point {
    pressure: Pressure,
    blocks: Vec<usize>,
    runs: Vec<(Variant, Vec<RunResult>)>,
    /// Virtual time: mean JCT of hashing and of Program scheduling per seed.
    sim_hash: Vec<f64>,
    sim_program: Vec<f64>,
}

impl Point {
    fn jcts(&self, v: Variant) -> Vec<f64> {
        self.runs
            .iter()
            .find(|(x, _)| *x == v)
            .map(|(_, rs)| {
                rs.iter()
                    .map(|r| if r.ok { r.mean_jct } else { 0.0 })
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn describe(p: Pressure) -> String {
    format!(
        "{} KV pressure (the sessions' live context needs {}× the KV cache)",
        match p {
            Pressure::None => "no",
            Pressure::Moderate => "moderate",
            Pressure::Heavy => "heavy",
            Pressure::Overload => "overload",
        },
        p.demand()
    )
}

fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if v.len() < 2 {
        format!("{lo:.0} s")
    } else {
        format!(
            "{:.0} s ({lo:.0}–{hi:.0})",
            v.iter().sum::<f64>() / v.len() as f64
        )
    }
}

pub(crate) async fn demo(html: Option<PathBuf>) -> Result<bool, String> {
    let dir = bin_dir()?;
    for b in ["program-router", "vllm-sim"] {
        if !dir.join(b).exists() {
            return Err(format!(
                "{b} is not built next to progbench in {}: run `cargo build --release -p progbench \
                 -p program-router -p vllm-sim` first",
                dir.display()
            ));
        }
    }
    let vllm_router = compare::venv_vllm_router();
    let mut variants = vec![Variant::PrProgram];
    match &vllm_router {
        Some(_) => variants.push(Variant::VrProgram),
        None => eprintln!(
            "note: vllm-router 0.1.17 is not installed in $PROGSCHED_VENV (default \
             ~/.cache/progsched/venv), so the demo compares with consistent hashing only; \
             `python3 -m venv ~/.cache/progsched/venv && ~/.cache/progsched/venv/bin/pip install \
             vllm-router==0.1.17` adds it"
        ),
    }
    variants.push(Variant::PrHash);
    eprintln!(
        "{SESSIONS} coding-agent sessions per run on one simulated server with {RANKS} ranks, \
         {TIME_SCALE} simulated seconds per wall second; {} runs over HTTP, about 2 minutes ...",
        POINTS.len() * HTTP_SEEDS.len() * variants.len()
    );
    let calibration = compare::calibrate(&dir, TIME_SCALE, EngineProfile::Reference).await?;
    let mut points = Vec::new();
    for pressure in POINTS {
        let mut point = Point {
            pressure,
            blocks: Vec::new(),
            runs: variants.iter().map(|v| (*v, Vec::new())).collect(),
            sim_hash: Vec::new(),
            sim_program: Vec::new(),
        };
        for seed in SIM_SEEDS {
            let turns = sessions(seed);
            let (_, demand) = matrix::floor(&turns, RANKS, &base());
            let blocks = matrix::blocks_at(demand, RANKS, &base(), pressure);
            let engine = EngineParams {
                num_gpu_blocks: blocks,
                ..base()
            };
            let program = progbench::des::Mode::Program(Box::default());
            point.sim_hash.push(
                progbench::des::run(
                    &turns,
                    RANKS,
                    &engine,
                    &progbench::des::Mode::ConsistentHash,
                )
                .mean_jct_seconds,
            );
            point
                .sim_program
                .push(progbench::des::run(&turns, RANKS, &engine, &program).mean_jct_seconds);
            if !HTTP_SEEDS.contains(&seed) {
                continue;
            }
            point.blocks.push(blocks);
            let setup = compare::Setup {
                servers: 1,
                dp: RANKS,
                num_gpu_blocks: blocks,
                max_model_len: MAX_MODEL_LEN,
                time_scale: TIME_SCALE,
                limit: std::time::Duration::from_secs(120),
                bin_dir: dir.clone(),
                vllm_router: vllm_router.clone(),
                program_config: serde_json::json!({}),
                program_config_b: serde_json::json!({}),
                calibration: Some(calibration.clone()),
                member_skew_secs: 0.0,
                member_skew_seed: 1,
                engine: EngineProfile::Reference,
            };
            let mut results = Vec::new();
            for v in &variants {
                let r = compare::run_variant(&turns, *v, &setup).await;
                eprintln!(
                    "  {} pressure, seed {seed}: {} — {} in {:.0} s",
                    pressure.name(),
                    name(*v),
                    if r.ok { "done" } else { "FAILED" },
                    r.wall_seconds
                );
                if let Some(f) = &r.failure {
                    eprintln!("    {f}");
                }
                results.push(r);
            }
            compare::check_comparable(&mut results);
            for r in results {
                if let Some((_, rs)) = point.runs.iter_mut().find(|(v, _)| *v == r.variant) {
                    rs.push(r);
                }
            }
        }
        points.push(point);
    }
    let text = render(&points, &variants);
    print!("{text}");
    let html = html.unwrap_or_else(|| std::env::temp_dir().join("progbench-demo.html"));
    write_report(&html, &page(&text, &points))?;
    Ok(points
        .iter()
        .all(|p| p.runs.iter().all(|(_, rs)| rs.iter().all(|r| r.ok))))
}

/// The verdict, the table, the virtual-time check and the glossary, in that order.
fn render(points: &[Point], variants: &[Variant]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nVERDICT — {SESSIONS} coding-agent sessions on one simulated server with {RANKS} GPUs' \
         worth of KV cache, {} seeds per point:",
        HTTP_SEEDS.len()
    );
    for p in points {
        let ours = p.jcts(Variant::PrProgram);
        let mut parts = Vec::new();
        if variants.contains(&Variant::VrProgram) {
            parts.push(verdict::sentence(
                &ours,
                &p.jcts(Variant::VrProgram),
                "vllm-router's Program scheduling",
            ));
        }
        parts.push(verdict::sentence(
            &ours,
            &p.jcts(Variant::PrHash),
            "consistent hashing",
        ));
        let _ = writeln!(
            s,
            "  {}: program-router's Program scheduling {}.",
            capitalize(&describe(p.pressure)),
            parts.join(", and ")
        );
    }
    let _ = writeln!(
        s,
        "\nMean time to finish a session (first request to last response, in simulated seconds; \
         mean over seeds, range in brackets), and the share of prompt tokens served from cache:\n"
    );
    let _ = write!(s, "{:<42}", "router");
    for p in points {
        let _ = write!(
            s,
            " {:>24} {:>7}",
            format!("{} pressure", p.pressure.name()),
            "cached"
        );
    }
    s.push('\n');
    for v in variants {
        let _ = write!(s, "{:<42}", name(*v));
        for p in points {
            let (time, hit) = match p.runs.iter().find(|(x, _)| x == v) {
                Some((_, rs)) if !rs.is_empty() && rs.iter().all(|r| r.ok) => (
                    spread(&rs.iter().map(|r| r.mean_jct).collect::<Vec<_>>()),
                    format!(
                        "{:.0}%",
                        100.0 * rs.iter().map(|r| r.server_token_hit).sum::<f64>()
                            / rs.len() as f64
                    ),
                ),
                _ => ("failed".into(), "-".into()),
            };
            let _ = write!(s, " {time:>24} {hit:>7}");
        }
        s.push('\n');
    }
    let done: Vec<String> = points
        .iter()
        .flat_map(|p| p.runs.iter().flat_map(|(_, rs)| rs.iter()))
        .map(|r| r.programs_completed.to_string())
        .collect();
    let _ = writeln!(
        s,
        "\nEvery run finished all {SESSIONS} sessions: {}.",
        if done.iter().all(|d| *d == SESSIONS.to_string()) {
            "yes".to_string()
        } else {
            format!("no — sessions finished per run: {}", done.join(", "))
        }
    );
    let _ = writeln!(
        s,
        "\nThe same points in virtual time (the same scheduler code and engine model, no HTTP), \
         {} seeds — Program scheduling's mean time to finish over consistent hashing's:",
        SIM_SEEDS.len()
    );
    for p in points {
        if let Some((g, lo, hi)) = verdict::ratios(&p.sim_program, &p.sim_hash) {
            let _ = writeln!(
                s,
                "  {} pressure: {g:.2}× (seeds range {lo:.2}–{hi:.2}×)",
                p.pressure.name()
            );
        }
    }
    let blocks: Vec<String> = points
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p.pressure.name(),
                p.blocks
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\nWhat the words mean:\n\
         - session: one agent's task (a Program): model calls with tool calls in between, each \
         call carrying the whole conversation so far.\n\
         - time to finish: from a session's first request to its last response. The simulators \
         run {TIME_SCALE}× faster than real time, so a 250 s session takes about 6 wall seconds.\n\
         - KV pressure: how much KV cache the contexts of every session alive at once need, at \
         its 90th percentile, over the cache there is; above 1× something must be evicted or held \
         back. Cache size per rank, in 16-token blocks (seed 1/seed 2): {}.\n\
         - consistent hashing: each session pinned to one rank by a hash of its id, every request \
         sent at once — the usual baseline.\n\
         - Program scheduling: the router keeps a session's KV while its tool call runs and holds \
         new requests back when a rank's cache is full, instead of letting the engine evict and \
         recompute.\n\
         Details and the goals per workload: docs/benchmarks.md (`progbench matrix`, `progbench \
         compare`).",
        blocks.join(", ")
    );
    s
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// The HTML page: the same text first, then each point's per-run figures.
fn page(text: &str, points: &[Point]) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut s = format!(
        "<!doctype html><meta charset=utf-8><title>progbench demo</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:70em}}pre{{white-space:pre-wrap}}\
         table{{border-collapse:collapse}}td,th{{border:1px solid #999;padding:.3em .6em}}</style>\
         <h1>progbench demo</h1><pre>{}</pre><h2>Every run</h2><table><tr><th>pressure</th>\
         <th>seed</th><th>router</th><th>sessions finished</th><th>mean time to finish (s)</th>\
         <th>p90 (s)</th><th>p99 (s)</th><th>prompt tokens cached</th><th>mean wait (s)</th></tr>",
        esc(text)
    );
    for p in points {
        for (v, rs) in &p.runs {
            for (r, seed) in rs.iter().zip(HTTP_SEEDS) {
                s.push_str(&format!(
                    "<tr><td>{}</td><td>{seed}</td><td>{}</td><td>{}</td><td>{:.1}</td>\
                     <td>{:.1}</td><td>{:.1}</td><td>{:.1}%</td><td>{:.2}</td></tr>",
                    p.pressure.name(),
                    esc(name(*v)),
                    if r.ok {
                        r.programs_completed.to_string()
                    } else {
                        format!("failed: {}", esc(r.failure.as_deref().unwrap_or("?")))
                    },
                    r.mean_jct,
                    r.p90_jct,
                    r.p99_jct,
                    r.server_token_hit * 100.0,
                    r.mean_queue_wait
                ));
            }
        }
    }
    s.push_str(
        "</table><p>Mean wait: each request's latency less its unloaded service time (cold \
         prefill of its uncached tokens and decode alone), whether it waited in the router, in \
         the engine, or in a larger batch.</p>",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(v: Variant, jct: f64, hit: f64) -> RunResult {
        RunResult {
            ok: true,
            mean_jct: jct,
            server_token_hit: hit,
            programs_completed: SESSIONS,
            ..RunResult::empty(v)
        }
    }

    #[test]
    fn the_verdict_comes_first_in_words_and_every_label_is_named() {
        let point = |pressure, ours: [f64; 2], peer: [f64; 2], hash: [f64; 2]| Point {
            pressure,
            blocks: vec![4000, 4100],
            runs: vec![
                (
                    Variant::PrProgram,
                    ours.map(|j| run(Variant::PrProgram, j, 0.9)).to_vec(),
                ),
                (
                    Variant::VrProgram,
                    peer.map(|j| run(Variant::VrProgram, j, 0.85)).to_vec(),
                ),
                (
                    Variant::PrHash,
                    hash.map(|j| run(Variant::PrHash, j, 0.5)).to_vec(),
                ),
            ],
            sim_hash: vec![300.0; 5],
            sim_program: vec![200.0; 5],
        };
        let points = [
            point(
                Pressure::Moderate,
                [170.0, 180.0],
                [175.0, 176.0],
                [190.0, 200.0],
            ),
            point(
                Pressure::Heavy,
                [200.0, 210.0],
                [240.0, 250.0],
                [300.0, 320.0],
            ),
        ];
        let variants = [Variant::PrProgram, Variant::VrProgram, Variant::PrHash];
        let text = render(&points, &variants);
        let verdict = text.find("VERDICT").expect("a verdict");
        let table = text.find("Mean time to finish").expect("a table");
        assert!(verdict < table, "the answer comes before the detail");
        assert!(text.contains(
            "Moderate KV pressure (the sessions' live context needs 1.2× the KV cache): \
             program-router's Program scheduling ended level with vllm-router's"
        ));
        assert!(text.contains("Heavy KV pressure"));
        assert!(text.contains("finished sessions 16% sooner on average than vllm-router's"));
        for label in [
            "PrHash",
            "PrProgram",
            "VrProgram",
            "forced",
            "yield",
            "status",
        ] {
            assert!(!text.contains(label), "{label} is jargon:\n{text}");
        }
        for word in [
            "session:",
            "time to finish:",
            "KV pressure:",
            "consistent hashing:",
        ] {
            assert!(text.contains(word), "{word} is explained");
        }
        assert!(text.contains("Every run finished all 24 sessions: yes."));
        assert!(text.contains("40× faster than real time"));
        assert!(text.contains("moderate pressure: 0.67× (seeds range 0.67–0.67×)"));
        let html = page(&text, &points);
        assert_eq!(html.matches("<tr><td>").count(), 12, "one row per run");
    }
}
