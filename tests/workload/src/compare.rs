//! `progbench compare`: the same workload through each router under test, side by side.
//!
//! Owns the orchestration that makes a comparison trustworthy: fresh simulators for every run
//! (cold caches), free ports checked before start, the router under test started from a known
//! binary and verified alive (process and `/health`) before and after its replay, token hit read
//! from the simulators' own counters, and equal input/output token totals across runs checked — a
//! run that cannot prove what it measured is reported as failed, not as a number.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::des::percentile;
use crate::replay::{ContextMode, ReplayConfig, replay};
use crate::workload::Turn;

/// One router configuration to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[value(rename_all = "kebab-case")]
pub enum Variant {
    /// program-router, consistent_hash, no Program scheduling.
    PrHash,
    /// program-router, Program scheduling with binding_only.
    PrBinding,
    /// program-router, full Program scheduling.
    PrProgram,
    /// program-router, full Program scheduling with `program_scheduling_enable_key: auto`,
    /// driven with session headers only (a client that sends no `agentic_context`).
    PrAuto,
    /// vllm-router 0.1.17, consistent_hash.
    VrHash,
    /// vllm-router 0.1.17 with --enable-program-scheduling.
    VrProgram,
}

#[derive(Debug, Clone)]
pub struct Setup {
    pub servers: usize,
    pub dp: usize,
    pub num_gpu_blocks: usize,
    pub max_model_len: usize,
    pub time_scale: f64,
    pub limit: Duration,
    pub bin_dir: PathBuf,
    pub vllm_router: Option<PathBuf>,
    pub program_config: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub variant: Variant,
    pub ok: bool,
    pub failure: Option<String>,
    pub requests: usize,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub server_token_hit: f64,
    pub mean_jct: f64,
    pub p50_jct: f64,
    pub p90_jct: f64,
    pub p99_jct: f64,
    pub programs_completed: usize,
    /// Program admissions the router counted (its `..._transitions_total` admit and
    /// force_resume): proof that Program scheduling engaged; 0 for plain routing.
    pub program_admissions: f64,
    pub wall_seconds: f64,
}

pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The peer vllm-router installed in `$PROGSCHED_VENV` (default `~/.cache/progsched/venv`).
pub fn venv_vllm_router() -> Option<PathBuf> {
    let venv = std::env::var("PROGSCHED_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/progsched/venv")
        });
    Some(venv.join("bin/vllm-router")).filter(|p| p.exists())
}

/// For the suites that run real binaries: the folder of the workspace's binaries as seen from a
/// test binary (`target/<profile>/deps/<test>` → `target/<profile>`), checked to hold vllm-sim
/// and program-router, and the peer vllm-router (required when `CI` is set).
pub fn test_binaries() -> (PathBuf, Option<PathBuf>) {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
        .unwrap_or_default();
    for b in ["vllm-sim", "program-router"] {
        assert!(
            dir.join(b).exists(),
            "{b} must be built (cargo build --workspace --bins) in {}",
            dir.display()
        );
    }
    let vllm_router = venv_vllm_router();
    assert!(
        vllm_router.is_some() || std::env::var("CI").is_err(),
        "vllm-router must be installed in CI (pip install vllm-router==0.1.17 into $PROGSCHED_VENV)"
    );
    (dir, vllm_router)
}

pub(crate) fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

pub(crate) fn get(url: &str) -> Option<(u16, String)> {
    // A blocking one-shot GET over loopback, for readiness and scrapes.
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let mut s = std::net::TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

pub(crate) fn wait_ok(url: &str, secs: f64) -> bool {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        if matches!(get(url), Some((200, _))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Sums a counter over every series of an exposition (chunked bodies included: lines with a
/// sample of `name` anywhere).
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

/// Program admissions in a router's exposition (admit and force_resume transitions).
fn admissions(text: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with("vllm_router_agent_aware_transitions_total{")
                && (l.contains("transition=\"admit\"") || l.contains("transition=\"force_resume\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

pub(crate) fn spawn(bin: &Path, args: &[String]) -> Result<Child, String> {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))
}

/// Runs one variant on fresh simulators.
pub async fn run_variant(turns: &[Turn], v: Variant, s: &Setup) -> RunResult {
    let started = Instant::now();
    let mut r = RunResult {
        variant: v,
        ok: false,
        failure: None,
        requests: 0,
        errors: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        server_token_hit: 0.0,
        mean_jct: 0.0,
        p50_jct: 0.0,
        p90_jct: 0.0,
        p99_jct: 0.0,
        programs_completed: 0,
        program_admissions: 0.0,
        wall_seconds: 0.0,
    };
    match run_inner(turns, v, s, &mut r).await {
        Ok(()) => r.ok = true,
        Err(e) => r.failure = Some(e),
    }
    r.wall_seconds = started.elapsed().as_secs_f64();
    r
}

async fn run_inner(turns: &[Turn], v: Variant, s: &Setup, r: &mut RunResult) -> Result<(), String> {
    let mut procs = Procs(Vec::new());
    let mut sims = Vec::new();
    for _ in 0..s.servers {
        let port = free_port()?;
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--data-parallel-size",
            &s.dp.to_string(),
            "--num-gpu-blocks",
            &s.num_gpu_blocks.to_string(),
            "--max-model-len",
            &s.max_model_len.to_string(),
            "--time-scale",
            &s.time_scale.to_string(),
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        procs.0.push(spawn(&s.bin_dir.join("vllm-sim"), &args)?);
        let url = format!("http://127.0.0.1:{port}");
        if !wait_ok(&format!("{url}/health"), 20.0) {
            return Err(format!("simulator on {port} did not start"));
        }
        sims.push(url);
    }
    let (port, prom) = (free_port()?, free_port()?);
    let capacity = (s.num_gpu_blocks * 16) as u64;
    let mut ps = s.program_config.clone();
    if ps.get("token_capacity_per_dp_rank").is_none() {
        ps["token_capacity_per_dp_rank"] = serde_json::json!(capacity);
    }
    let mut binding = ps.clone();
    binding["binding_only"] = serde_json::json!(true);
    let mut auto = ps.clone();
    auto["program_scheduling_enable_key"] = serde_json::json!("auto");
    let mut args: Vec<String> = vec![
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ];
    args.push("--worker-urls".into());
    args.extend(sims.iter().cloned());
    args.extend([
        "--intra-node-data-parallel-size".into(),
        s.dp.to_string(),
        "--policy".into(),
        "consistent_hash".into(),
    ]);
    args.extend([
        "--prometheus-host".into(),
        "127.0.0.1".into(),
        "--prometheus-port".into(),
        prom.to_string(),
    ]);
    let (bin, context, health) = match v {
        Variant::PrHash | Variant::PrBinding | Variant::PrProgram | Variant::PrAuto => {
            args.extend(["--log-level".into(), "warn".into()]);
            match v {
                Variant::PrBinding => args.extend([
                    "--enable-program-scheduling".into(),
                    "--program-scheduling-config-json".into(),
                    binding.to_string(),
                ]),
                Variant::PrProgram => args.extend([
                    "--enable-program-scheduling".into(),
                    "--program-scheduling-config-json".into(),
                    ps.to_string(),
                ]),
                Variant::PrAuto => args.extend([
                    "--enable-program-scheduling".into(),
                    "--program-scheduling-config-json".into(),
                    auto.to_string(),
                ]),
                _ => {}
            }
            let context = if v == Variant::PrAuto {
                ContextMode::Headers
            } else {
                ContextMode::Object
            };
            (s.bin_dir.join("program-router"), context, "/readiness")
        }
        Variant::VrHash | Variant::VrProgram => {
            let bin = s
                .vllm_router
                .clone()
                .ok_or("vllm-router is not installed (pip install vllm-router==0.1.17)")?;
            // Intra-node DP needs an API key in vllm-router; the simulators accept any.
            args.extend([
                "--api-key".into(),
                "bench".into(),
                "--log-level".into(),
                "warning".into(),
            ]);
            if v == Variant::VrProgram {
                args.extend([
                    "--enable-program-scheduling".into(),
                    "--program-scheduling-config-json".into(),
                    ps.to_string(),
                ]);
            }
            // vllm-router forwards the canonical object unchanged, which vLLM rejects: use the
            // JSON-string form it can carry.
            (bin, ContextMode::String, "/health")
        }
    };
    let mut router = spawn(&bin, &args)?;
    let url = format!("http://127.0.0.1:{port}");
    if !wait_ok(&format!("{url}{health}"), 60.0) {
        let _ = router.kill();
        return Err(format!("{v:?}: router did not become ready"));
    }
    let pid_alive = |c: &mut Child| matches!(c.try_wait(), Ok(None));
    let cfg = ReplayConfig {
        url: url.clone(),
        model: "sim-model".into(),
        context,
        time_scale: s.time_scale,
        max_model_len: s.max_model_len,
        limit: s.limit,
    };
    let rep = replay(turns, cfg).await;
    let alive = pid_alive(&mut router) && matches!(get(&format!("{url}/health")), Some((200, _)));
    r.program_admissions =
        get(&format!("http://127.0.0.1:{prom}/metrics")).map_or(0.0, |(_, text)| admissions(&text));
    let mut prompt = 0.0;
    let mut cached = 0.0;
    for sim in &sims {
        let (_, text) = get(&format!("{sim}/metrics")).ok_or("cannot scrape a simulator")?;
        prompt += counter(&text, "vllm:prompt_tokens_total");
        cached += counter(&text, "vllm:prompt_tokens_cached_total");
    }
    let _ = router.kill();
    let _ = router.wait();
    drop(procs);
    r.requests = rep.requests.len();
    r.errors = rep.errors;
    r.prompt_tokens = rep.prompt_tokens();
    r.completion_tokens = rep.completion_tokens();
    r.server_token_hit = if prompt > 0.0 { cached / prompt } else { 0.0 };
    let mut j: Vec<f64> = rep.jct.iter().map(|x| x.1).collect();
    j.sort_by(f64::total_cmp);
    r.programs_completed = j.len();
    r.mean_jct = if j.is_empty() {
        0.0
    } else {
        j.iter().sum::<f64>() / j.len() as f64
    };
    r.p50_jct = percentile(&j, 0.5);
    r.p90_jct = percentile(&j, 0.9);
    r.p99_jct = percentile(&j, 0.99);
    if !alive {
        return Err("the router under test was not alive and healthy after the replay".into());
    }
    if rep.timed_out {
        return Err(format!("the replay hit its {:?} limit", s.limit));
    }
    if rep.errors > 0 {
        return Err(format!("{} requests failed", rep.errors));
    }
    Ok(())
}

/// Marks runs whose token totals differ from the first successful one (not comparable).
pub fn check_comparable(results: &mut [RunResult]) {
    let Some(base) = results
        .iter()
        .find(|r| r.ok)
        .map(|r| (r.requests, r.completion_tokens))
    else {
        return;
    };
    for r in results.iter_mut().filter(|r| r.ok) {
        if (r.requests, r.completion_tokens) != base {
            r.ok = false;
            r.failure = Some(format!(
                "served {} requests / {} output tokens, the first run {} / {}: not comparable",
                r.requests, r.completion_tokens, base.0, base.1
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_over_series_only_for_the_exact_name() {
        let t = "vllm:prompt_tokens_total{engine=\"0\"} 10\nvllm:prompt_tokens_total{engine=\"1\"} 5\nvllm:prompt_tokens_cached_total{engine=\"0\"} 7\n";
        assert_eq!(counter(t, "vllm:prompt_tokens_total"), 15.0);
        assert_eq!(counter(t, "vllm:prompt_tokens_cached_total"), 7.0);
    }

    #[test]
    fn admissions_count_admit_and_force_resume_only() {
        let t = "vllm_router_agent_aware_transitions_total{transition=\"admit\"} 4\nvllm_router_agent_aware_transitions_total{transition=\"force_resume\"} 1\nvllm_router_agent_aware_transitions_total{transition=\"ttl_expired\"} 9\n";
        assert_eq!(admissions(t), 5.0);
    }
}
