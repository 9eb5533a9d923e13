//! `progbench compare`: the same workload through each router under test, side by side.
//!
//! Owns the orchestration that makes a comparison trustworthy: fresh simulators for every run
//! (cold caches), free ports checked before start, the router under test started from a known
//! binary and verified alive (process and `/health`) before and after its replay, token hit read
//! from the simulators' own counters, and equal input/output token totals across runs checked — a
//! run that cannot prove what it measured is reported as failed, not as a number.

mod calibration;
mod ports;
mod procs;
mod rounds;
mod router_config;
mod sample;

pub use calibration::{CALIBRATION_TIME_SCALE, Calibrated, calibrate};
pub(crate) use ports::free_port;
use ports::sim_port;
pub(crate) use procs::*;
pub use rounds::{Pooled, Spread, excess_ratios, spread};
use router_config::*;
use sample::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::des::{Series, percentile};
use crate::engines::EngineProfile;
use crate::oracle::unloaded_service_seconds;
use crate::replay::{ContextMode, Endpoints, ReplayConfig, replay};
use crate::workload::Turn;
use vllm_sim::engine::EngineParams;

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
    /// A reference, not a competitor: program-router with full Program scheduling on simulators
    /// whose KV holds the whole workload at once (no KV pressure, every prefix stays cached). Its
    /// excess JCT is what remains without KV pressure — batching slowdown and the harness's
    /// timing — which no placement or retention policy can remove.
    PrUnboundedKv,
    /// Issue 35's floor, also a reference: program-router with consistent hashing and no
    /// Program scheduling on simulators whose KV holds the whole workload at once. Excess above
    /// it is what the goals compare (ours ÷ the peer's); `pr-unbounded-kv` sits lower by
    /// what Program scheduling's placement wins without pressure, so excess above that one is
    /// the stricter reading.
    PrHashUnboundedKv,
    /// program-router, full Program scheduling with `--program-config-b`'s fields over
    /// `--program-config`'s: an A/B of two settings of ours in one run, paired round by round
    /// with `pr-program` (`scripts/compare-pool.py --ours pr-program-b`). Not in the default set.
    PrProgramB,
    /// A bound, not a competitor: `pr-program` with clients that know each coming tool gap
    /// (each request's `kv_retention_ttl_seconds` is [`crate::clients::clairvoyant_ttl`], plus
    /// the trips' slack) on simulators told when a Program ends (`--end-hint`: its own blocks
    /// are evicted first) — `progbench matrix --bounds`' clairvoyant run, over HTTP. Not in the
    /// default set.
    PrClairvoyant,
    /// Two program-router replicas with full Program scheduling behind a load balancer without
    /// affinity (the replay sends a Program's consecutive turns to alternate replicas), each
    /// scheduling what it sees. Not in the default set.
    PrSplit2,
    /// The same two replicas as each other's `peers`: each Program is scheduled by its owner
    /// replica, which the other forwards its turns to. Not in the default set.
    PrPeers2,
    /// `pr-peers2` through a rolling update: during the second half of the arrivals each
    /// replica in turn is replaced (a new one joins the members and the load balancer, then the
    /// old one leaves the load balancer, is stopped with SIGTERM and leaves the members), with
    /// Programs handed over to their new owners. Not in the default set.
    PrRoll,
    /// The same rolling update with `peers.hand_over: false`: a moved Program is bound afresh by
    /// its new owner. Not in the default set.
    PrRollCold,
    /// `pr-roll` with each member list reaching each replica after its own delay, uniform up to
    /// `--member-skew-secs` of workload time (a ConfigMap volume's kubelet sync, a minute by
    /// default; a new replica starts with
    /// the list that does not name it yet), the lists numbered as the operator renders them
    /// (`peers.revision`), so replicas take a newer list from each other. Not in the default
    /// set.
    PrRollSkew,
    /// The same skewed delivery with unnumbered lists: each replica waits for its own copy, and
    /// replicas that disagree about the members split Programs between them meanwhile. Both
    /// skewed variants run with the workers' `api_key` set (so a list can be taken from a
    /// replica not listed yet, signed). Not in the default set.
    PrRollSkewNorev,
    /// vllm-router 0.1.17, consistent_hash.
    VrHash,
    /// vllm-router 0.1.17 with --enable-program-scheduling.
    VrProgram,
}

impl Variant {
    /// Whether the router runs Program scheduling (and so uses the cost models).
    pub fn schedules_programs(self) -> bool {
        !matches!(
            self,
            Variant::PrHash | Variant::PrHashUnboundedKv | Variant::VrHash
        )
    }
}

/// The workers' `api_key` of the variants that set one (the simulators accept any key).
const BENCH_KEY: &str = "bench";

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
    /// `pr-program-b`'s fields over `program_config` (top-level keys replace).
    pub program_config_b: serde_json::Value,
    /// The cost models both routers get ([`calibrate`]); `None` leaves the routers' defaults,
    /// which are in the workload's seconds and so `time_scale` times too slow for the
    /// simulators.
    pub calibration: Option<Calibrated>,
    /// `pr-roll-skew(-norev)`: the longest a changed member list takes to reach a router
    /// replica, workload seconds.
    pub member_skew_secs: f64,
    /// Seeds those delays; every variant of one comparison gets the same.
    pub member_skew_seed: u64,
    /// The simulators' step timing (`--engine`); calibrate against the same profile.
    pub engine: EngineProfile,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub variant: Variant,
    /// Which round of `--rounds` this run belongs to (1-based).
    pub round: u32,
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
    /// Forced resumes and segment yields the router counted (either router's transition metric).
    pub force_resumes: f64,
    pub segment_yields: f64,
    /// Forced requests program-router admitted on the engine's own KV report
    /// (`force_resume_engine_grace_seconds`); 0 for the peer, which has no such rule.
    pub engine_room_admissions: f64,
    /// Requests program-router admitted past the ledger on a hold-free rank
    /// (`hold_free_admission_slack_ratio`); 0 for the peer.
    pub hold_free_admissions: f64,
    /// Requests and output tokens per workload second, over the replay's duration.
    pub request_throughput: f64,
    pub output_token_throughput: f64,
    /// Queue wait per request, estimated as its latency minus its unloaded service time (cold
    /// prefill of its uncached tokens, decode at batch 1, by the simulator's cost model): the
    /// time it spent waiting in the router or the engine, or slowed by batching.
    pub mean_queue_wait: f64,
    pub p90_queue_wait: f64,
    pub p99_queue_wait: f64,
    pub wall_seconds: f64,
    /// Router processes started for the run (a rolling update starts more than it ends with).
    pub router_replicas: usize,
    /// With `peers`: Program hand-overs (`handover:claimed|given|pushed|adopted`) and forwards
    /// (`forward:forwarded|received|unreachable|closed|failed`) counted by every replica; a
    /// replica that left during the run as last read, every 50 ms until it exited (what it
    /// counted in its last moments may be missing: compare `pushed` with `adopted`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub peer_counts: BTreeMap<String, f64>,
    /// The skewed rolling variants: for each member-list change, the workload seconds between
    /// the first and the last staying replica taking it (`None`: one did not within twice the
    /// delivery's longest delay).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub member_spreads: Vec<Option<f64>>,
    /// Turns served per Program (status 200): every run of one comparison must serve the same,
    /// and the oracle is computed over exactly these.
    #[serde(skip)]
    pub served: crate::oracle::Served,
    /// Distributions and the simulators' samples over time, for the HTML report.
    #[serde(skip)]
    pub series: Series,
}

impl RunResult {
    /// A run of `variant` that has measured nothing yet.
    pub fn empty(variant: Variant) -> Self {
        RunResult {
            variant,
            round: 1,
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
            force_resumes: 0.0,
            segment_yields: 0.0,
            engine_room_admissions: 0.0,
            hold_free_admissions: 0.0,
            request_throughput: 0.0,
            output_token_throughput: 0.0,
            mean_queue_wait: 0.0,
            p90_queue_wait: 0.0,
            p99_queue_wait: 0.0,
            wall_seconds: 0.0,
            router_replicas: 0,
            peer_counts: BTreeMap::new(),
            member_spreads: Vec::new(),
            served: Default::default(),
            series: Series::default(),
        }
    }

    /// The run's name in tables and plots: its variant, and its round from the second on.
    pub fn label(&self) -> String {
        if self.round > 1 {
            format!("{:?} #{}", self.variant, self.round)
        } else {
            format!("{:?}", self.variant)
        }
    }
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

/// The flags of a simulator for a run of `v` with `num_gpu_blocks` per rank.
fn sim_flags(s: &Setup, v: Variant, num_gpu_blocks: usize) -> Vec<(&'static str, String)> {
    let mut flags = vec![
        ("data-parallel-size", s.dp.to_string()),
        ("num-gpu-blocks", num_gpu_blocks.to_string()),
        ("max-model-len", s.max_model_len.to_string()),
        ("time-scale", s.time_scale.to_string()),
    ];
    flags.extend(s.engine.sim_flags());
    if v == Variant::PrClairvoyant {
        flags.push(("end-hint", String::new()));
    }
    flags
}

/// Runs one variant on fresh simulators.
pub async fn run_variant(turns: &[Turn], v: Variant, s: &Setup) -> RunResult {
    let started = Instant::now();
    let mut r = RunResult::empty(v);
    match run_inner(turns, v, s, &mut r).await {
        Ok(()) => r.ok = true,
        Err(e) => r.failure = Some(e),
    }
    r.wall_seconds = started.elapsed().as_secs_f64();
    r
}

/// The Program scheduling JSON `v` starts from, in workload seconds: `--program-config`, and
/// for `pr-program-b` its `--program-config-b` fields over it.
fn program_config_of(s: &Setup, v: Variant) -> serde_json::Value {
    let mut ps = s.program_config.clone();
    if v == Variant::PrProgramB
        && let (Some(base), Some(b)) = (ps.as_object_mut(), s.program_config_b.as_object())
    {
        for (k, value) in b {
            base.insert(k.clone(), value.clone());
        }
    }
    ps
}

async fn run_inner(turns: &[Turn], v: Variant, s: &Setup, r: &mut RunResult) -> Result<(), String> {
    let mut procs = Procs(Vec::new());
    let mut sims = Vec::new();
    let block_size = EngineParams::default().block_size;
    let num_gpu_blocks = if matches!(v, Variant::PrUnboundedKv | Variant::PrHashUnboundedKv) {
        crate::oracle::blocks_for_no_kv_pressure(turns, block_size).max(s.num_gpu_blocks)
    } else {
        s.num_gpu_blocks
    };
    let flags = sim_flags(s, v, num_gpu_blocks);
    for i in 0..s.servers {
        let port = sim_port(i)?;
        sims.push(start_sim(&mut procs, &s.bin_dir, port, &flags)?);
    }
    let capacity_tokens = num_gpu_blocks * block_size;
    let capacity = capacity_tokens as u64;
    let mut ps = program_config_of(s, v);
    if ps.get("token_capacity_per_dp_rank").is_none() {
        ps["token_capacity_per_dp_rank"] = serde_json::json!(capacity);
    }
    // Our defaults for cross-rank resume differ from the spec's (and vllm-router's): on, with
    // headroom 3 (the spec: off, 1.2, and it recommends on). Say them explicitly so both routers
    // run the same mode.
    if ps.get("global_queue").is_none() {
        ps["global_queue"] = serde_json::json!(true);
    }
    if ps.get("cross_rank_headroom_ratio").is_none() {
        ps["cross_rank_headroom_ratio"] = serde_json::json!(3.0);
    }
    to_workload_time(&mut ps, s.time_scale, SECONDS_FIELDS);
    if let Some(c) = &s.calibration {
        c.apply(&mut ps);
    }
    // What the peer gets (the spec's durations scaled); ours adds its own extensions' scaled.
    let peer = peer_config(&ps);
    let extensions = extension_seconds_fields();
    to_workload_time(
        &mut ps,
        s.time_scale,
        extensions.iter().map(|(k, v)| (k.as_str(), *v)),
    );
    let mut binding = ps.clone();
    binding["binding_only"] = serde_json::json!(true);
    let mut auto = ps.clone();
    auto["program_scheduling_enable_key"] = serde_json::json!("auto");
    let mut args: Vec<String> = vec!["--host".into(), "127.0.0.1".into()];
    args.push("--worker-urls".into());
    args.extend(sims.iter().cloned());
    args.extend([
        "--intra-node-data-parallel-size".into(),
        s.dp.to_string(),
        "--policy".into(),
        "consistent_hash".into(),
        "--prometheus-host".into(),
        "127.0.0.1".into(),
    ]);
    // The skewed rolling variants run with the workers' key, as a platform that keeps its
    // router replicas' lists signed does (both variants alike: the comparison stays paired).
    let keyed = matches!(v, Variant::PrRollSkew | Variant::PrRollSkewNorev);
    let (bin, context, health) = match v {
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
                    peer.to_string(),
                ]);
            }
            // vllm-router forwards the canonical object unchanged, which vLLM rejects: use the
            // JSON-string form it can carry.
            (bin, ContextMode::String, "/health")
        }
        _ => {
            args.extend(["--log-level".into(), "warn".into()]);
            if keyed {
                args.extend(["--api-key".into(), BENCH_KEY.into()]);
            }
            let json = match v {
                Variant::PrHash | Variant::PrHashUnboundedKv => None,
                Variant::PrBinding => Some(binding.to_string()),
                Variant::PrAuto => Some(auto.to_string()),
                _ => Some(ps.to_string()),
            };
            if let Some(json) = json {
                args.extend([
                    "--enable-program-scheduling".into(),
                    "--program-scheduling-config-json".into(),
                    json,
                ]);
            }
            let context = if v == Variant::PrAuto {
                ContextMode::Headers
            } else {
                ContextMode::Object
            };
            (s.bin_dir.join("program-router"), context, "/readiness")
        }
    };
    // The replicas: two behind a load balancer without affinity for the multi-replica variants
    // (each other's peers except in `pr-split2`), one otherwise.
    let together = |hand_over| crate::fleet::PeerSetup {
        hand_over,
        numbered: true,
        skew: None,
    };
    let skewed = |numbered| crate::fleet::PeerSetup {
        hand_over: true,
        numbered,
        skew: Some(Duration::from_secs_f64(s.member_skew_secs / s.time_scale)),
    };
    let (replicas, peers) = match v {
        Variant::PrSplit2 => (2, None),
        Variant::PrPeers2 | Variant::PrRoll => (2, Some(together(true))),
        Variant::PrRollCold => (2, Some(together(false))),
        Variant::PrRollSkew => (2, Some(skewed(true))),
        Variant::PrRollSkewNorev => (2, Some(skewed(false))),
        _ => (1, None),
    };
    // The same delivery delays for every variant of a comparison (paired).
    let mut fleet = crate::fleet::Fleet::start(
        &format!("{v:?}"),
        &bin,
        args,
        health,
        replicas,
        peers,
        s.member_skew_seed,
    )
    .map_err(|e| format!("{v:?}: {e}"))?;
    let endpoints = Endpoints::new(fleet.urls());
    let cfg = ReplayConfig {
        endpoints: endpoints.clone(),
        model: "sim-model".into(),
        context,
        time_scale: s.time_scale,
        max_model_len: s.max_model_len,
        limit: s.limit,
        stream: false,
        max_requests: None,
        api_key: keyed.then(|| BENCH_KEY.to_string()),
        clairvoyant_capacity: (v == Variant::PrClairvoyant).then_some(capacity_tokens),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (sims, stop) = (sims.clone(), stop.clone());
        // About 400 samples over the run's time limit, 0.1 s to 2 s apart.
        let every = Duration::from_secs_f64((s.limit.as_secs_f64() / 400.0).clamp(0.1, 2.0));
        let scale = s.time_scale;
        std::thread::spawn(move || sample(sims, every, scale, stop))
    };
    let replay_started = Instant::now();
    // The rolling variants replace every replica while the Programs arrive.
    let roll_at = if matches!(
        v,
        Variant::PrRoll | Variant::PrRollCold | Variant::PrRollSkew | Variant::PrRollSkewNorev
    ) {
        roll_times(turns, s.time_scale, replicas)
    } else {
        Vec::new()
    };
    let roll = {
        let endpoints = endpoints.clone();
        std::thread::spawn(move || {
            for t in roll_at {
                std::thread::sleep(t.saturating_sub(replay_started.elapsed()));
                fleet.replace(0, &endpoints)?;
            }
            Ok::<_, String>(fleet)
        })
    };
    let rep = replay(turns, cfg).await;
    let replay_seconds = replay_started.elapsed().as_secs_f64() * s.time_scale;
    stop.store(true, Ordering::Relaxed);
    let (hit_series, kv_series) = sampler.join().map_err(|_| "the sampler panicked")?;
    let mut fleet = roll
        .join()
        .map_err(|_| "the rolling update panicked")?
        .map_err(|e| format!("rolling update: {e}"))?;
    let alive = fleet.healthy();
    let mut t = BTreeMap::new();
    for text in fleet.expositions() {
        for (k, n) in transitions(&text) {
            *t.entry(k).or_default() += n;
        }
        if peers.is_some() {
            for (metric, label, prefix) in [
                ("program_router_peer_handovers_total", "event", "handover"),
                ("program_router_peer_forwards_total", "outcome", "forward"),
                (
                    "program_router_peer_member_lists_total",
                    "outcome",
                    "members",
                ),
            ] {
                for (k, n) in crate::fleet::by_label(&text, metric, &[label]) {
                    *r.peer_counts.entry(format!("{prefix}:{k}")).or_default() += n;
                }
            }
        }
    }
    r.router_replicas = fleet.started();
    r.member_spreads = fleet
        .member_spreads()
        .into_iter()
        .map(|w| w.map(|secs| secs * s.time_scale))
        .collect();
    r.program_admissions = admissions(&t);
    r.force_resumes = sum_of(&t, &["force_resume"]);
    r.segment_yields = sum_of(&t, &["max_segment_yield", "segment_yield"]);
    r.engine_room_admissions = sum_of(&t, &["engine_room_admit"]);
    r.hold_free_admissions = sum_of(&t, &["hold_free_admit"]);
    let mut prompt = 0.0;
    let mut cached = 0.0;
    for sim in &sims {
        let (_, text) = get(&format!("{sim}/metrics")).ok_or("cannot scrape a simulator")?;
        prompt += counter(&text, "vllm:prompt_tokens_total");
        cached += counter(&text, "vllm:prompt_tokens_cached_total");
    }
    drop(fleet);
    drop(procs);
    r.requests = rep.requests.len();
    r.errors = rep.errors;
    r.prompt_tokens = rep.prompt_tokens();
    r.completion_tokens = rep.completion_tokens();
    r.server_token_hit = if prompt > 0.0 { cached / prompt } else { 0.0 };
    r.served = rep.served();
    // Every Program that started, a Program stopped by max_model_len until that point (the
    // oracle's JCT* counts the same Programs the same way).
    let mut j: Vec<f64> = rep.jct.iter().map(|x| x.1).collect();
    j.sort_by(f64::total_cmp);
    r.programs_completed = usize::try_from(rep.completed).unwrap_or(usize::MAX);
    r.mean_jct = crate::des::mean(&j);
    r.p50_jct = percentile(&j, 0.5);
    r.p90_jct = percentile(&j, 0.9);
    r.p99_jct = percentile(&j, 0.99);
    if replay_seconds > 0.0 {
        r.request_throughput = r.requests as f64 / replay_seconds;
        r.output_token_throughput = r.completion_tokens as f64 / replay_seconds;
    }
    let engine = EngineParams {
        num_gpu_blocks: s.num_gpu_blocks,
        max_model_len: s.max_model_len,
        timing: s.engine.timing(),
        ..Default::default()
    };
    let mut waits: Vec<f64> = rep
        .requests
        .iter()
        .filter(|q| q.status == 200)
        .map(|q| {
            let service = unloaded_service_seconds(
                &engine,
                q.prompt_tokens,
                q.cached_tokens,
                q.completion_tokens,
            );
            (q.latency_seconds - service).max(0.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    r.mean_queue_wait = crate::des::mean(&waits);
    r.p90_queue_wait = percentile(&waits, 0.9);
    r.p99_queue_wait = percentile(&waits, 0.99);
    r.series = Series {
        jcts: j,
        waits,
        hit: hit_series,
        kv_usage: kv_series.iter().map(|(_, pts)| pts.clone()).collect(),
        kv_names: kv_series.into_iter().map(|(name, _)| name).collect(),
    };
    if !alive {
        return Err(
            "a router replica under test was not alive and healthy after the replay".into(),
        );
    }
    if rep.timed_out {
        return Err(format!("the replay hit its {:?} limit", s.limit));
    }
    if rep.errors > 0 {
        return Err(format!("{} requests failed", rep.errors));
    }
    Ok(())
}

/// When a rolling update replaces each of `replicas` router replicas, as wall-clock offsets from
/// the replay's start: evenly over the second half of the Programs' arrivals, when the most
/// Programs are in flight and KV is fullest.
fn roll_times(turns: &[Turn], time_scale: f64, replicas: usize) -> Vec<Duration> {
    let span = turns.iter().map(|t| t.program_arrival).fold(0.0, f64::max) / time_scale;
    (0..replicas)
        .map(|i| Duration::from_secs_f64(span * (1.0 + i as f64 / replicas as f64) / 2.0))
        .collect()
}

/// Marks runs whose token totals differ from the first successful one (not comparable).
pub fn check_comparable(results: &mut [RunResult]) {
    let Some((requests, tokens, served)) = results
        .iter()
        .find(|r| r.ok)
        .map(|r| (r.requests, r.completion_tokens, r.served.clone()))
    else {
        return;
    };
    for r in results.iter_mut().filter(|r| r.ok) {
        if (r.requests, r.completion_tokens) != (requests, tokens) {
            r.ok = false;
            r.failure = Some(format!(
                "served {} requests / {} output tokens, the first run {requests} / {tokens}: \
                 not comparable",
                r.requests, r.completion_tokens
            ));
        } else if r.served != served {
            r.ok = false;
            r.failure = Some(
                "served the same totals as the first run but other turns of other Programs: \
                 not comparable"
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests;
