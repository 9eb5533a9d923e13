//! progbench's command line: subcommands and the workload flags they share.

use super::*;

#[derive(Parser)]
#[command(
    name = "progbench",
    version,
    about = "Agentic workloads and scheduling benchmarks"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Write a seeded workload as requests.jsonl.
    Gen {
        #[command(flatten)]
        w: WorkloadArgs,
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Replay a workload in real time against an endpoint already running on loopback (a router,
    /// a simulator, or a server reached through a port-forward); prints a summary.
    Replay {
        #[command(flatten)]
        w: WorkloadArgs,
        /// Replay this requests.jsonl instead of generating.
        #[arg(long)]
        input: Option<PathBuf>,
        /// Base URL of the OpenAI-compatible endpoint (loopback only).
        #[arg(long)]
        url: String,
        #[arg(long, default_value = "sim-model")]
        model: String,
        /// How requests carry Program identity.
        #[arg(long, value_enum, default_value = "object")]
        context: progbench::replay::ContextMode,
        /// Stream every response and record its time to first token.
        #[arg(long)]
        stream: bool,
        /// The backend's simulated seconds per wall second (1 for a real server).
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
        /// The model's context length: a Program whose next turn would not fit ends there.
        #[arg(long, default_value_t = 32768)]
        max_model_len: usize,
        /// Wall-clock limit, seconds.
        #[arg(long, default_value_t = 600.0)]
        limit_secs: f64,
        /// Send at most this many requests.
        #[arg(long)]
        max_requests: Option<u64>,
        /// API key sent as `Authorization: Bearer` (a router or server that requires one).
        #[arg(long, env = "PROGBENCH_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Write the summary, every request and every Program's JCT here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Run the same workload through each router side by side on fresh simulators (real time).
    Compare {
        #[command(flatten)]
        w: WorkloadArgs,
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "pr-hash,pr-binding,pr-program,vr-hash,vr-program"
        )]
        variants: Vec<progbench::compare::Variant>,
        #[arg(long, default_value_t = 2)]
        servers: usize,
        #[arg(long, default_value_t = 2)]
        dp: usize,
        /// KV blocks per rank (16 tokens each).
        #[arg(long, default_value_t = 6144)]
        num_gpu_blocks: usize,
        /// Size the KV as `progbench matrix` sizes a cell instead of --num-gpu-blocks: the
        /// blocks per rank at which the workload's live KV demand at p90 (consistent hashing,
        /// nothing evicted, virtual time) is this level's multiple of the capacity.
        #[arg(long, value_enum, conflicts_with = "num_gpu_blocks")]
        pressure: Option<progbench::matrix::Pressure>,
        #[arg(long, default_value_t = 32768)]
        max_model_len: usize,
        /// Simulated seconds per wall second.
        #[arg(long, default_value_t = 10.0)]
        time_scale: f64,
        /// Wall-clock limit of one run, seconds.
        #[arg(long, default_value_t = 600.0)]
        limit_secs: f64,
        /// Run every variant this many times (even rounds in reverse order) and report each
        /// variant's spread and the excess ratio per round and pooled (1–20).
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        /// Program scheduling JSON for both routers, in workload seconds: its durations
        /// (metrics interval, timeouts, TTL cap, retention) are divided by --time-scale. The
        /// cost models come from `program-router calibrate` against a simulator unless given
        /// here (then in wall seconds of the time-scaled simulators).
        #[arg(long, default_value = "{}")]
        program_config: String,
        /// `pr-program-b`'s Program scheduling fields over --program-config (same units), for an
        /// A/B of ours' settings in one run.
        #[arg(long, default_value = "{}")]
        program_config_b: String,
        /// The simulators' step-time model (as `progbench matrix --engine`): the spec's
        /// reference coefficients or another deployment's. The calibration runs against the
        /// same profile, so both routers get its cost models; --pressure sizes the KV from the
        /// floor on this engine.
        #[arg(long, value_enum, default_value = "reference")]
        engine: progbench::engines::EngineProfile,
        /// pr-roll-skew(-norev): the longest a changed member list takes to reach a router
        /// replica, workload seconds (each replica's delay is uniform up to it; the default is
        /// the kubelet's ConfigMap sync period).
        #[arg(long, default_value_t = 60.0)]
        member_skew_secs: f64,
        /// pr-roll-skew(-norev): seeds the delays (both variants of one run get the same).
        #[arg(long, default_value_t = 1)]
        member_skew_seed: u64,
        /// vllm-router binary (default: $PROGSCHED_VENV/bin/vllm-router, then PATH).
        #[arg(long)]
        vllm_router: Option<PathBuf>,
        #[arg(long)]
        json: Option<PathBuf>,
        /// The HTML report with plots (default: progbench-compare.html in the temp folder).
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// One power user against light tenants on one simulated rank: FIFO vs round robin vs VTC
    /// (program-router) and vllm-router for reference, side by side on fresh simulators.
    Fairness {
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "fifo,round-robin,vtc,vllm-router"
        )]
        variants: Vec<progbench::fairness::FairVariant>,
        #[arg(long, default_value_t = 200)]
        power_requests: usize,
        #[arg(long, default_value_t = 5)]
        light_tenants: usize,
        #[arg(long, default_value_t = 4)]
        light_requests: usize,
        /// Wall seconds between the power backlog and the light tenants' arrival.
        #[arg(long, default_value_t = 0.5)]
        light_delay_secs: f64,
        #[arg(long, default_value_t = 32)]
        max_tokens: u32,
        #[arg(long, default_value_t = 64)]
        prompt_words: usize,
        /// The simulated rank's batch size (vLLM's --max-num-seqs).
        #[arg(long, default_value_t = 16)]
        max_num_seqs: usize,
        /// Simulated seconds per wall second.
        #[arg(long, default_value_t = 10.0)]
        time_scale: f64,
        /// Fair queueing's max_waiting_requests.
        #[arg(long, default_value_t = 3)]
        max_waiting: u32,
        /// vllm-router binary (default: $PROGSCHED_VENV/bin/vllm-router).
        #[arg(long)]
        vllm_router: Option<PathBuf>,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The README demo: coding-agent sessions at a moderate and a heavy KV pressure, two seeds
    /// each, over HTTP on fresh simulators — program-router's Program scheduling against
    /// vllm-router 0.1.17's (when installed) and consistent hashing — then the same points in
    /// virtual time over five seeds; prints a verdict first. About 2 minutes; needs the release
    /// binaries of program-router and vllm-sim next to progbench.
    Demo {
        /// Where to write the HTML report (default: progbench-demo.html in the temp folder).
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Every workload family × KV pressure × seed in virtual time: consistent hashing against
    /// Program scheduling, each above the cell's floor (hashing with KV nothing fills), with the
    /// goals each cell is held to and an HTML heat map.
    Matrix {
        /// Families (default: the eight; reasoning and documents run by name).
        #[arg(long, value_delimiter = ',')]
        families: Vec<progbench::families::Family>,
        /// Pressure levels (default: all four).
        #[arg(long, value_delimiter = ',')]
        pressures: Vec<progbench::matrix::Pressure>,
        /// Seeds to run (overrides --half).
        #[arg(long, value_delimiter = ',')]
        seeds: Vec<u64>,
        /// Seed half: `report` (even seeds, held out from choosing defaults) or `tuning` (odd).
        #[arg(long, value_enum, default_value = "report")]
        half: progbench::matrix::Half,
        /// A CI-sized run: one seed of the chosen half, each family at a quarter of its size.
        #[arg(long)]
        quick: bool,
        /// Each family's Programs × this (its arrival rate unchanged).
        #[arg(long)]
        scale: Option<f64>,
        #[arg(long, default_value_t = 4)]
        ranks: usize,
        /// Program scheduling overrides (the router's program_scheduling JSON).
        #[arg(long, default_value = "{}")]
        program_config: String,
        /// The engines' step-time model: the spec's reference coefficients (every default was
        /// chosen on them) or another deployment's; the router is calibrated to it (its cost
        /// models replace any in --program-config).
        #[arg(long, value_enum, default_value = "reference")]
        engine: progbench::engines::EngineProfile,
        /// The router keeps the cost models --program-config gives (the reference's by
        /// default) whatever the engine: a deployment that did not calibrate.
        #[arg(long)]
        uncalibrated: bool,
        /// Worker threads (default: the machine's cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Every run's figures and every cell as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The heat map (default: progbench-matrix.html in the temp folder).
        #[arg(long)]
        html: Option<PathBuf>,
        /// Also run every pressured cell under free retention (every prefix ever computed stays
        /// a hit at no KV cost), how far keeping prefixes alone could take each mode; ours on
        /// engines told when a Program ends (its blocks evicted first); and ours with that end
        /// hint and clients that know every tool gap (clairvoyant retention); and ours with
        /// clients that know each Program's remaining work (shortest resumed first), and with it
        /// estimated from the lengths of Programs of its kind.
        #[arg(long)]
        bounds: bool,
        /// Drive ours and affinity only with clients that identify Programs by headers alone
        /// (Claude Code, Codex, `x-session-id`): no task or step ids, never `expected_resume:
        /// false`. Not with --bounds, whose runs keep full clients.
        #[arg(long, conflicts_with = "bounds")]
        headers_only_clients: bool,
    },
    /// Replay a workload through the scheduler core and simulated ranks in virtual time, side by
    /// side for each mode.
    Sim {
        #[command(flatten)]
        w: WorkloadArgs,
        /// Replay this requests.jsonl instead of generating.
        #[arg(long)]
        input: Option<PathBuf>,
        #[arg(long, default_value_t = 4)]
        ranks: usize,
        /// KV blocks per rank (16 tokens each): smaller means more pressure.
        #[arg(long, default_value_t = 4096)]
        num_gpu_blocks: usize,
        #[arg(long, default_value_t = 32768)]
        max_model_len: usize,
        /// Modes to compare: hash, binding, program.
        #[arg(long, value_delimiter = ',', default_value = "hash,binding,program")]
        modes: Vec<String>,
        /// Program scheduling overrides (the router's program_scheduling JSON).
        #[arg(long, default_value = "{}")]
        program_config: String,
        /// The engines' step-time model, as `progbench matrix --engine`; the router is
        /// calibrated to it (its cost models replace any in --program-config). Without it, the
        /// reference engine and --program-config's cost models (the reference's by default).
        #[arg(long, value_enum)]
        engine: Option<progbench::engines::EngineProfile>,
        /// With --engine: the router keeps the cost models --program-config gives.
        #[arg(long, requires = "engine")]
        uncalibrated: bool,
        /// Every request carries this client `kv_retention_ttl_seconds` (replacing the
        /// automatic TTL): what holding paused Programs' KV that long would buy.
        #[arg(long)]
        client_retention_ttl: Option<f64>,
        /// Clients identify Programs by headers only: no task or step ids, and no request
        /// says `expected_resume: false` (Claude Code, Codex or `x-session-id` under
        /// `program_scheduling_enable_key: auto`).
        #[arg(long)]
        headers_only_clients: bool,
        /// Also write the reports as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The HTML report with plots (default: progbench-report.html in the temp folder).
        #[arg(long)]
        html: Option<PathBuf>,
    },
}

#[derive(Args, Clone)]
pub(crate) struct WorkloadArgs {
    #[arg(long, value_enum, default_value_t = Preset::SweAgent)]
    pub(crate) preset: Preset,
    /// A `matrix` family at its full size instead (replaces --preset, --programs, --rate and
    /// --arrivals; --seed still applies).
    #[arg(long, value_enum)]
    pub(crate) family: Option<progbench::families::Family>,
    #[arg(long, default_value_t = 200)]
    pub(crate) programs: u32,
    /// Program arrivals per second (Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) rate: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Arrival pattern (both keep the mean rate).
    #[arg(long, value_enum, default_value_t = ArrivalArg::Poisson)]
    pub(crate) arrivals: ArrivalArg,
    /// Bursty arrivals: mean Programs per burst.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) burst_size: f64,
    /// Bursty arrivals: mean seconds between Programs within a burst.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) burst_spacing: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ArrivalArg {
    Poisson,
    Bursty,
}

impl WorkloadArgs {
    /// What the report calls the workload.
    pub(crate) fn label(&self) -> String {
        match self.family {
            Some(f) => format!("family {}", f.name()),
            None => format!("{:?}", self.preset),
        }
    }

    pub(crate) fn turns(&self) -> Vec<workload::Turn> {
        if let Some(f) = self.family {
            return f.generate(1.0, self.seed);
        }
        let arrivals = match self.arrivals {
            ArrivalArg::Poisson => workload::Arrivals::Poisson,
            ArrivalArg::Bursty => workload::Arrivals::Bursty {
                mean_size: self.burst_size,
                spacing: self.burst_spacing,
            },
        };
        workload::generate_with(self.preset, self.programs, self.rate, self.seed, arrivals)
    }
}
