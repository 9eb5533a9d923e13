//! `progbench`: generate agentic workloads and replay them through the scheduler in virtual time.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use progbench::des::{self, Mode, Report};
use progbench::workload::{self, Preset};
use program_router::config::ProgramSchedulingConfig;
use vllm_sim::engine::EngineParams;

mod args;
mod demo;
mod matrix_cmd;
mod tables;

use args::*;
use tables::*;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Demo { html } = cli.cmd {
        return match tokio::runtime::Runtime::new()
            .map_err(|e| e.to_string())
            .and_then(|rt| rt.block_on(demo::demo(html)))
        {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("progbench: {e}");
                ExitCode::from(2)
            }
        };
    }
    if matches!(
        cli.cmd,
        Cmd::Compare { .. } | Cmd::Fairness { .. } | Cmd::Replay { .. }
    ) {
        let rt = match tokio::runtime::Runtime::new() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("progbench: {e}");
                return ExitCode::from(1);
            }
        };
        let work = async {
            match cli.cmd {
                Cmd::Fairness { .. } => fairness(cli.cmd).await,
                Cmd::Replay { .. } => replay(cli.cmd).await,
                _ => compare(cli.cmd).await,
            }
        };
        return match rt.block_on(work) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("progbench: {e}");
                ExitCode::from(2)
            }
        };
    }
    if matches!(cli.cmd, Cmd::Matrix { .. }) {
        return match matrix_cmd::matrix(cli.cmd) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("progbench: {e}");
                ExitCode::from(2)
            }
        };
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("progbench: {e}");
            ExitCode::from(2)
        }
    }
}

fn bin_dir() -> Result<PathBuf, String> {
    std::env::current_exe()
        .map_err(|e| e.to_string())?
        .parent()
        .map(std::path::Path::to_path_buf)
        .ok_or_else(|| "cannot locate the binaries' folder".to_string())
}

async fn fairness(cmd: Cmd) -> Result<bool, String> {
    let Cmd::Fairness {
        variants,
        power_requests,
        light_tenants,
        light_requests,
        light_delay_secs,
        max_tokens,
        prompt_words,
        max_num_seqs,
        time_scale,
        max_waiting,
        vllm_router,
        json,
    } = cmd
    else {
        return Ok(false);
    };
    let setup = progbench::fairness::FairSetup {
        power_requests,
        light_tenants,
        light_requests,
        light_delay: light_delay_secs,
        max_tokens,
        prompt_words,
        max_num_seqs,
        time_scale,
        max_waiting,
        bin_dir: bin_dir()?,
        vllm_router: vllm_router.or_else(progbench::compare::venv_vllm_router),
    };
    let mut results = Vec::new();
    for v in variants {
        eprintln!("running {v:?} ...");
        results.push(progbench::fairness::run(v, &setup).await);
    }
    let fifo = results
        .iter()
        .find(|r| r.ok && r.variant == progbench::fairness::FairVariant::Fifo)
        .cloned();
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>6} {:>9} {:>10} {:>10}  status",
        "variant",
        "light p50",
        "light p95",
        "power p50",
        "power p95",
        "Jain",
        "tok/s",
        "light p95",
        "tok/s"
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>6} {:>9} {:>10} {:>10}",
        "", "TTFT s", "TTFT s", "TTFT s", "TTFT s", "", "", "÷ FIFO", "÷ FIFO"
    );
    for r in &results {
        let (lr, tr) = match &fifo {
            Some(f) if f.light_ttft_p95 > 0.0 && f.tokens_per_second > 0.0 => (
                format!("{:.3}", r.light_ttft_p95 / f.light_ttft_p95),
                format!("{:.3}", r.tokens_per_second / f.tokens_per_second),
            ),
            _ => ("-".into(), "-".into()),
        };
        println!(
            "{:<12} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>6.3} {:>9.0} {:>10} {:>10}  {}",
            format!("{:?}", r.variant),
            r.light_ttft_p50,
            r.light_ttft_p95,
            r.power_ttft_p50,
            r.power_ttft_p95,
            r.jain,
            r.tokens_per_second,
            lr,
            tr,
            r.failure.as_deref().unwrap_or("ok")
        );
    }
    if let Some(path) = json {
        write_json(&path, &results)?;
    }
    Ok(results.iter().all(|r| r.ok))
}

async fn compare(cmd: Cmd) -> Result<bool, String> {
    let Cmd::Compare {
        w,
        variants,
        servers,
        dp,
        num_gpu_blocks,
        pressure,
        max_model_len,
        time_scale,
        limit_secs,
        rounds,
        program_config,
        program_config_b,
        engine: profile,
        member_skew_secs,
        member_skew_seed,
        vllm_router,
        json,
        html,
    } = cmd
    else {
        return Ok(false);
    };
    if !(1..=20).contains(&rounds) {
        return Err(format!("--rounds must be between 1 and 20 (got {rounds})"));
    }
    if !(member_skew_secs.is_finite() && member_skew_secs >= 0.0) {
        return Err(format!(
            "--member-skew-secs must be a number >= 0 (got {member_skew_secs})"
        ));
    }
    if servers == 0 || dp == 0 {
        return Err(format!(
            "--servers and --dp must be at least 1 (got {servers} and {dp})"
        ));
    }
    let engine_with = |num_gpu_blocks| vllm_sim::engine::EngineParams {
        num_gpu_blocks,
        max_model_len,
        timing: profile.timing(),
        ..Default::default()
    };
    // The simulators would refuse these; say so before starting anything (with --pressure, at
    // the least KV it gives: one max_model_len context per rank).
    let least = max_model_len.div_ceil(engine_with(1).block_size);
    engine_with(if pressure.is_some() {
        least
    } else {
        num_gpu_blocks
    })
    .validate()
    .map_err(|e| format!("--{e}"))?;
    let turns = w.turns();
    let num_gpu_blocks = match pressure {
        Some(p) => {
            let blocks =
                progbench::matrix::cell_blocks(&turns, servers * dp, max_model_len, p, profile);
            eprintln!(
                "KV: {blocks} blocks per rank ({}, seed {}, {} pressure, {} engine, as the matrix \
                 sizes it)",
                w.label(),
                w.seed,
                p.name(),
                profile.name()
            );
            blocks
        }
        None => num_gpu_blocks,
    };
    let bin_dir = bin_dir()?;
    let vllm_router = vllm_router.or_else(progbench::compare::venv_vllm_router);
    let program_config: serde_json::Value =
        serde_json::from_str(&program_config).map_err(|e| format!("--program-config: {e}"))?;
    let program_config_b: serde_json::Value =
        serde_json::from_str(&program_config_b).map_err(|e| format!("--program-config-b: {e}"))?;
    for (flag, v) in [
        ("--program-config", &program_config),
        ("--program-config-b", &program_config_b),
    ] {
        if !v.is_object() {
            return Err(format!("{flag} must be a JSON object (got {v})"));
        }
    }
    let calibration = if variants.iter().any(|v| v.schedules_programs()) {
        eprintln!("calibrating the cost models against a simulator (program-router calibrate) ...");
        let c = progbench::compare::calibrate(&bin_dir, time_scale, profile).await?;
        eprintln!(
            "  prefill R² {:.4}, decode R² {:.4}; both routers get these coefficients \
             (converted to {time_scale}× time) unless --program-config gives them",
            c.prefill_r2, c.decode_r2
        );
        Some(c)
    } else {
        None
    };
    let setup = progbench::compare::Setup {
        servers,
        dp,
        num_gpu_blocks,
        max_model_len,
        time_scale,
        limit: std::time::Duration::from_secs_f64(limit_secs),
        bin_dir,
        vllm_router,
        program_config,
        program_config_b,
        calibration,
        member_skew_secs,
        member_skew_seed,
        engine: profile,
    };
    let mut results = Vec::new();
    for round in 1..=rounds {
        // Even rounds in reverse: a drift of the machine over the rounds lands on every variant.
        let order: Vec<progbench::compare::Variant> = if round % 2 == 0 {
            variants.iter().rev().copied().collect()
        } else {
            variants.clone()
        };
        for v in order {
            results.push(run_one(&turns, v, &setup, round, rounds).await);
        }
    }
    progbench::compare::check_comparable(&mut results);
    print_runs(&results);
    let engine = engine_with(num_gpu_blocks);
    // Over the turns the runs served (each run served the same: `check_comparable`), so that
    // JCT* and H* count the Programs and requests the runs' JCT and hit count.
    let (oracle, kv) = match results.iter().find(|r| r.ok) {
        Some(r) => (
            progbench::oracle::bounds_served(&turns, &engine, &r.served),
            progbench::kv_bound::bound_served(&turns, &engine, servers * dp, &r.served),
        ),
        None => (
            progbench::oracle::bounds(&turns, &engine),
            progbench::kv_bound::bound(&turns, &engine, servers * dp),
        ),
    };
    print_oracle(
        &oracle,
        &kv,
        results
            .iter()
            .filter(|r| r.ok)
            .map(|r| (r.label(), r.server_token_hit, r.mean_jct, None)),
    );
    // What KV decisions can act on: each run's JCT above the same scheduler's with no KV
    // pressure (batching slowdown and the harness's timing are in both). Issue 35's reading:
    // above consistent hashing with no KV pressure, and ours over the peer's. Each round against
    // its own reference run.
    use progbench::compare::Variant;
    for round in 1..=rounds {
        let these: Vec<&progbench::compare::RunResult> =
            results.iter().filter(|r| r.round == round).collect();
        let of = if rounds > 1 {
            format!(" (round {round})")
        } else {
            String::new()
        };
        excess_above(
            &these,
            Variant::PrUnboundedKv,
            &format!("the reference without KV pressure{of}"),
        );
        let what = format!("the floor, consistent hashing without KV pressure{of}");
        excess_above(&these, Variant::PrHashUnboundedKv, &what);
    }
    let ratio = progbench::compare::excess_ratios(
        &results,
        Variant::PrProgram,
        Variant::VrProgram,
        Variant::PrHashUnboundedKv,
    );
    if rounds > 1 {
        print_spreads(&results, &variants, rounds);
    }
    if let Some(p) = &ratio {
        if rounds > 1 {
            let each: Vec<String> = p.per_round.iter().map(|(_, x)| format!("{x:.2}")).collect();
            println!(
                "PrProgram's excess ÷ VrProgram's, each round above its own floor: {}; pooled over {} rounds: {:.2}",
                each.join(", "),
                p.per_round.len(),
                p.pooled
            );
        } else {
            println!("PrProgram's excess ÷ VrProgram's: {:.2}", p.pooled);
        }
    }
    let html = html.unwrap_or_else(|| std::env::temp_dir().join("progbench-compare.html"));
    let calibrated = match &setup.calibration {
        Some(c) => format!(
            "cost models from program-router calibrate against a simulator (prefill R² {:.4}, \
             decode R² {:.4})",
            c.prefill_r2, c.decode_r2
        ),
        None => "no Program scheduling run, no calibration".into(),
    };
    let header = format!(
        "{} Programs ({}, seed {}), {} servers × {} DP ranks × {} KV blocks, {}× time, {} \
         engine\n\
         oracle: H* = {:.1}% token hit, JCT* = {:.1} s mean; times are the workload's seconds\n\
         {calibrated}",
        program_count(&turns),
        w.label(),
        w.seed,
        servers,
        dp,
        num_gpu_blocks,
        time_scale,
        profile.name(),
        oracle.token_hit * 100.0,
        oracle.mean_jct_seconds
    );
    write_report(&html, &progbench::report::compare_html(&header, &results))?;
    if let Some(p) = json {
        write_json(
            &p,
            &serde_json::json!({"oracle": oracle, "kv_bound": kv,
                "calibration": setup.calibration, "rounds": rounds, "engine": profile,
                "excess_ratio_vs_peer": ratio, "runs": results}),
        )?;
    }
    Ok(results.iter().all(|r| r.ok))
}

/// `progbench replay`: checks every setting before sending anything, then replays once.
async fn replay(cmd: Cmd) -> Result<bool, String> {
    let Cmd::Replay {
        w,
        input,
        url,
        model,
        context,
        stream,
        time_scale,
        max_model_len,
        limit_secs,
        max_requests,
        api_key,
        json,
    } = cmd
    else {
        return Err("not a replay".into());
    };
    progbench::replay_cmd::check_loopback(&url)?;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err("--time-scale must be a finite number > 0".into());
    }
    if !(limit_secs.is_finite() && limit_secs > 0.0) {
        return Err("--limit-secs must be a finite number of seconds > 0".into());
    }
    if max_requests == Some(0) {
        return Err("--max-requests must be >= 1".into());
    }
    let turns = load_turns(&w, input.as_deref())?;
    let report = progbench::replay::replay(
        &turns,
        progbench::replay::ReplayConfig {
            endpoints: progbench::replay::Endpoints::one(url),
            model,
            context,
            time_scale,
            max_model_len,
            limit: std::time::Duration::from_secs_f64(limit_secs),
            stream,
            max_requests,
            api_key,
            clairvoyant_capacity: None,
        },
    )
    .await;
    let engine = EngineParams {
        max_model_len,
        ..Default::default()
    };
    let summary = progbench::replay_cmd::summarize(&report, &turns, &engine);
    for line in summary.lines() {
        println!("{line}");
    }
    if let Some(p) = json {
        write_json(
            &p,
            &serde_json::json!({"summary": summary, "report": report}),
        )?;
    }
    Ok(summary.clean())
}

/// Writes `value` as pretty JSON to `path`; the error names the file.
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The workload: `input` (a requests.jsonl, checked) or the one `w` generates.
fn load_turns(
    w: &WorkloadArgs,
    input: Option<&std::path::Path>,
) -> Result<Vec<workload::Turn>, String> {
    match input {
        Some(p) => workload::from_jsonl(
            &std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        ),
        None => Ok(w.turns()),
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Compare { .. }
        | Cmd::Fairness { .. }
        | Cmd::Demo { .. }
        | Cmd::Replay { .. }
        | Cmd::Matrix { .. } => Ok(()),
        Cmd::Gen { w, out } => {
            let turns = w.turns();
            std::fs::write(&out, workload::to_jsonl(&turns))
                .map_err(|e| format!("{}: {e}", out.display()))?;
            println!(
                "wrote {} requests of {} programs to {}",
                turns.len(),
                w.programs,
                out.display()
            );
            Ok(())
        }
        Cmd::Sim {
            w,
            input,
            ranks,
            num_gpu_blocks,
            max_model_len,
            modes,
            program_config,
            engine: chosen,
            uncalibrated,
            client_retention_ttl,
            headers_only_clients,
            json,
            html,
        } => {
            if ranks == 0 {
                return Err("--ranks must be >= 1".into());
            }
            let clients = des::Clients {
                headers_only: headers_only_clients,
                ..des::Clients::with_retention_ttl(client_retention_ttl)?
            };
            let turns = load_turns(&w, input.as_deref())?;
            let mut ps: ProgramSchedulingConfig = serde_json::from_str(&program_config)
                .map_err(|e| format!("--program-config: {e}"))?;
            ps.validate()
                .map_err(|e| format!("--program-config: {e}"))?;
            let profile = chosen.unwrap_or_default();
            let engine = EngineParams {
                num_gpu_blocks,
                max_model_len,
                timing: profile.timing(),
                ..Default::default()
            };
            if chosen.is_some() && !uncalibrated {
                progbench::engines::calibrate(&mut ps, &engine.timing);
            }
            engine.validate().map_err(|e| format!("--{e}"))?;
            let mut reports: Vec<Report> = Vec::new();
            for m in &modes {
                let mode = match m.as_str() {
                    "hash" => Mode::ConsistentHash,
                    "binding" => Mode::Program(Box::new(ProgramSchedulingConfig {
                        binding_only: true,
                        ..ps.clone()
                    })),
                    "program" => Mode::Program(Box::new(ps.clone())),
                    other => {
                        return Err(format!(
                            "--modes: unknown mode {other:?} (hash, binding, program)"
                        ));
                    }
                };
                let r = des::run_with(&turns, ranks, &engine, &mode, &clients);
                eprintln!("{}: done in {:.1} s wall", r.mode, r.wall_seconds);
                reports.push(r);
            }
            print_table(&reports);
            let oracle = progbench::oracle::bounds(&turns, &engine);
            let kv = progbench::kv_bound::bound(&turns, &engine, ranks);
            print_oracle(
                &oracle,
                &kv,
                reports.iter().map(|r| {
                    (
                        r.mode.clone(),
                        r.token_hit_rate,
                        r.mean_jct_seconds,
                        Some((r.kv_demand_p90, r.kv_demand_over_capacity)),
                    )
                }),
            );
            print_missed(&reports);
            if let Some(p) = json {
                write_json(&p, &reports)?;
            }
            let html = html.unwrap_or_else(|| std::env::temp_dir().join("progbench-report.html"));
            let header = format!(
                "{} Programs ({}), {} ranks × {} KV blocks, {} engine\noracle: H* = {:.1}% token hit, JCT* = {:.1} s mean",
                program_count(&turns),
                w.label(),
                ranks,
                num_gpu_blocks,
                profile.name(),
                oracle.token_hit * 100.0,
                oracle.mean_jct_seconds
            );
            write_report(&html, &progbench::report::html(&header, &reports))?;
            Ok(())
        }
    }
}

/// Programs in a workload.
fn program_count(turns: &[progbench::workload::Turn]) -> usize {
    turns
        .iter()
        .map(|t| &t.program_id)
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Writes an HTML report and says where.
fn write_report(path: &std::path::Path, html: &str) -> Result<(), String> {
    std::fs::write(path, html).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("\nreport: {}", path.display());
    Ok(())
}

/// One run against the oracle: mode, token hit, mean JCT, and (virtual time only) the KV
/// demand's p90 and the share of the run it exceeded the cluster's KV.
type OracleRow = (String, f64, f64, Option<(f64, f64)>);

/// Prints each other run's mean JCT above that of `reference` (when it ran and succeeded) and
/// returns the reference's mean JCT.
fn excess_above(
    results: &[&progbench::compare::RunResult],
    reference: progbench::compare::Variant,
    what: &str,
) -> Option<f64> {
    let base = results.iter().find(|r| r.ok && r.variant == reference)?;
    println!("\nmean JCT above {what} ({:.1} s):", base.mean_jct);
    for r in results.iter().filter(|r| r.ok && r.variant != reference) {
        println!("{:<22} {:>11.1}s", r.label(), r.mean_jct - base.mean_jct);
    }
    Some(base.mean_jct)
}

/// Each variant's figures over the rounds: mean (min–max).
fn print_spreads(
    results: &[progbench::compare::RunResult],
    variants: &[progbench::compare::Variant],
    rounds: u32,
) {
    use progbench::compare::{RunResult, spread};
    println!(
        "\nover {rounds} rounds (even rounds in reverse order), mean (min–max) of the clean runs:"
    );
    println!(
        "{:<17} {:>4} {:>23} {:>23} {:>23} {:>19}",
        "variant", "runs", "JCT mean", "JCT p90", "JCT p99", "hit"
    );
    let secs = |x: Option<progbench::compare::Spread>| {
        x.map_or("—".into(), |s| {
            format!("{:.1} ({:.1}–{:.1})", s.mean, s.min, s.max)
        })
    };
    for &v in variants {
        let Some(jct) = spread(results, v, |r: &RunResult| r.mean_jct) else {
            println!("{:<17} {:>4}", format!("{v:?}"), 0);
            continue;
        };
        let hit = spread(results, v, |r: &RunResult| r.server_token_hit * 100.0)
            .map_or("—".into(), |s| {
                format!("{:.1}% ({:.1}–{:.1})", s.mean, s.min, s.max)
            });
        println!(
            "{:<17} {:>4} {:>23} {:>23} {:>23} {:>19}",
            format!("{v:?}"),
            jct.runs,
            secs(Some(jct)),
            secs(spread(results, v, |r: &RunResult| r.p90_jct)),
            secs(spread(results, v, |r: &RunResult| r.p99_jct)),
            hit
        );
    }
}

/// Runs one variant as round `round` of `rounds`, with its progress on stderr.
async fn run_one(
    turns: &[progbench::workload::Turn],
    v: progbench::compare::Variant,
    setup: &progbench::compare::Setup,
    round: u32,
    rounds: u32,
) -> progbench::compare::RunResult {
    if rounds > 1 {
        eprintln!("round {round} of {rounds}: running {v:?} ...");
    } else {
        eprintln!("running {v:?} ...");
    }
    let mut r = progbench::compare::run_variant(turns, v, setup).await;
    r.round = round;
    eprintln!(
        "  {:?}: {} in {:.0} s",
        v,
        if r.ok { "ok" } else { "FAILED" },
        r.wall_seconds
    );
    if !r.peer_counts.is_empty() {
        let counts: Vec<String> = r
            .peer_counts
            .iter()
            .map(|(k, n)| format!("{k} {n:.0}"))
            .collect();
        eprintln!(
            "  {} router replicas; {}",
            r.router_replicas,
            counts.join(", ")
        );
    }
    if !r.member_spreads.is_empty() {
        let spreads: Vec<String> = r
            .member_spreads
            .iter()
            .map(|w| w.map_or("not taken".into(), |s| format!("{s:.1} s")))
            .collect();
        eprintln!(
            "  each member-list change, first to last replica taking it (workload time): {}",
            spreads.join(", ")
        );
    }
    r
}

/// The table of every run of `progbench compare`.
fn print_runs(results: &[progbench::compare::RunResult]) {
    println!(
        "{:<17} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>10} {:>6} {:>6}  status",
        "variant",
        "requests",
        "hit",
        "JCT mean",
        "JCT p50",
        "JCT p90",
        "JCT p99",
        "wait",
        "wait p99",
        "req/s",
        "out tokens",
        "forced",
        "yield"
    );
    for r in results {
        println!(
            "{:<17} {:>9} {:>7.1}% {:>8.1}s {:>8.1}s {:>8.1}s {:>8.1}s {:>7.2}s {:>7.2}s {:>7.2} {:>10} {:>6.0} {:>6.0}  {}",
            r.label(),
            r.requests,
            r.server_token_hit * 100.0,
            r.mean_jct,
            r.p50_jct,
            r.p90_jct,
            r.p99_jct,
            r.mean_queue_wait,
            r.p99_queue_wait,
            r.request_throughput,
            r.completion_tokens,
            r.force_resumes,
            r.segment_yields,
            r.failure.as_deref().unwrap_or("ok"),
        );
    }
}
