//! The Program scheduler: a pure state machine — events with an explicit `now` in, decisions out.
//!
//! Owns Program lifecycle (reasoning → acting with a Progress-TTL → paused → released), the
//! RequestPool (per-rank retained requests, queue timeouts, force resume), admission (token
//! capacity with watermarks, Program-count guard, vLLM waiting gate), resume ordering, cross-rank
//! resume, segment yield and capacity repair. No I/O, no clock reads, no async: the data plane
//! calls it under a lock and acts on the returned [`Decision`]s.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use rustc_hash::FxHashMap;

use super::cost::{cache_miss_impact_seconds, decode_throughput};
use super::identity::Identity;
use super::window::{RequestWindows, Throughput, Window, best_ttl};
use crate::config::ProgramSchedulingConfig;
use crate::config::program::ResumeOrder;
use crate::policies::prefix_index::PrefixIndex;

/// The data plane's id for one request.
pub type Ticket = u64;
/// Index of a rank (target) in the scheduler.
pub type Rank = usize;

/// A request entering Program scheduling.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub ticket: Ticket,
    pub model: String,
    pub identity: Identity,
    /// Estimated prompt tokens of this request.
    pub prompt_tokens: u64,
    /// Tenant and share weight, when fair queueing is configured: among retained requests of
    /// equal force/priority/yield tier, tenants are served in start-time fair queueing order.
    pub tenant: Option<(String, f64)>,
    /// The prompt's block chain ([`PrefixIndex::chain`]) for `cache_aware` binding; empty
    /// otherwise.
    pub prefix: Vec<u64>,
}

/// `cache_aware` binding follows a rank that holds at least this share of the prompt's blocks...
const CACHE_AFFINITY: f64 = 0.3;
/// ...unless it runs more than this many active Programs beyond the least loaded rank.
const AFFINITY_SLACK: u32 = 2;
/// Prompt blocks remembered per rank for `cache_aware` binding (64 bytes each: 4 MiB of prompt).
const PREFIX_BUDGET_BLOCKS: usize = 1 << 16;

/// What the data plane must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Dispatch {
        ticket: Ticket,
        rank: Rank,
    },
    Reject {
        ticket: Ticket,
        reason: RejectReason,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// Retained longer than `queue_timeout_seconds` (or the request's deadline).
    QueueTimeout,
    /// The scheduler has no rank at all (an empty target set).
    NoTarget,
}

/// Usage of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

/// A backend observation of one rank.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observation {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    /// KV token capacity from `vllm:cache_config_info`.
    pub token_capacity: Option<u64>,
}

/// Why a Program left the active set (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    TtlExpired,
    NoResumeExpected,
    SegmentYield,
    CapacityRepair,
    Cancelled,
    /// Its rank left the target set; it was re-homed and resumes through admission.
    TargetRemoved,
    /// Another router replica took it over (`peers`), or handed it here.
    HandedOver,
}

impl PauseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::TtlExpired => "ttl_expired",
            PauseReason::NoResumeExpected => "no_resume_expected",
            PauseReason::SegmentYield => "max_segment_yield",
            PauseReason::CapacityRepair => "capacity_repair",
            PauseReason::Cancelled => "cancelled",
            PauseReason::TargetRemoved => "target_removed",
            PauseReason::HandedOver => "handed_over",
        }
    }
}

/// Where a rank's capacity comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacitySource {
    Configured,
    Observed,
    /// No token capacity: the Program-count guard alone.
    ProgramCount,
}

impl CapacitySource {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacitySource::Configured => "configured",
            CapacitySource::Observed => "backend_cache_config",
            CapacitySource::ProgramCount => "program_count",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Phase {
    New,
    Reasoning,
    Acting { until: f64 },
    Paused { since: f64, reason: PauseReason },
}

#[derive(Debug, Clone)]
pub(crate) struct Program {
    pub key: (String, String),
    pub rank: Rank,
    pub phase: Phase,
    pub in_flight: u32,
    pub retained: u32,
    pub context_tokens: u64,
    /// Tokens this Program holds in its rank's ledger while active.
    pub reserved: u64,
    pub last_step: Option<u64>,
    pub last_activity: f64,
    pub last_complete: Option<f64>,
    pub placed_at: f64,
    pub rounds: u32,
    pub yielded: bool,
    pub pause_on_complete: bool,
    pub timer_gen: u64,
    pub identity: Identity,
    pub armed_ttl: f64,
    /// Prompt tokens that were already cached when this Program first ran on its rank (a prefix
    /// shared with other Programs, e.g. a system prompt), and when that was observed.
    pub shared_prefix: u64,
    pub shared_at: f64,
    /// The next completion is the first on this placement: its cached tokens measure sharing.
    pub fresh_start: bool,
    /// Times it moved to another rank (cross-rank resume, re-home), and how it got its rank.
    pub generation: u32,
    pub placement: &'static str,
    /// The rank its latest request was dispatched to.
    pub last_rank: Option<Rank>,
    /// Its latest measured return (tool gap) and output length.
    pub last_return: Option<f64>,
    pub last_output: Option<u64>,
    /// Completions since its last TTL-expiry pause.
    pub rounds_since_ttl_pause: u32,
}

impl Program {
    pub(crate) fn active(&self) -> bool {
        matches!(self.phase, Phase::Reasoning | Phase::Acting { .. })
    }

    /// Its last request said no further request follows (`expected_resume: false`) and nothing
    /// of it is queued or in flight: a finished Program. Its binding is kept for the paused
    /// retention (a late request still finds its KV rank) but it no longer counts as load.
    pub(crate) fn finished(&self) -> bool {
        !self.identity.expected_resume
            && !self.active()
            && self.in_flight == 0
            && self.retained == 0
    }

    /// The root of its Program tree (router replicas own trees, `peers`).
    pub(crate) fn root(&self) -> &str {
        self.identity
            .root_program_id
            .as_deref()
            .unwrap_or(&self.key.1)
    }
}

/// A Program as one router replica hands it to another (`peers`): enough to keep it on its
/// rank. Field names are the wire format of `/peers/hand-over` and `/peers/adopt`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HandedOver {
    pub model: String,
    pub program_id: String,
    pub root: String,
    /// The target (rank) id it runs on.
    pub target: String,
    pub context_tokens: u64,
    pub idle_seconds: f64,
}

#[derive(Debug, Clone)]
struct Retained {
    program: usize,
    rank: Rank,
    key: QueueKey,
    demand: u64,
    /// The growth-reserve part of `demand` (what batch-gain admission may bypass).
    growth: u64,
    /// When the request becomes forced.
    force_at: f64,
    /// Which arrival this is (the scheduler's arrival count), so that a timer armed for an
    /// earlier request that reused the ticket cannot act on this one.
    arrival: u64,
}

impl Retained {
    /// Past its force-resume deadline.
    fn forced(&self) -> bool {
        !self.key.not_forced
    }
}

/// Order within a rank's queue: forced first, then higher priority, then not-yielded, then the
/// tenant's fair-queueing start tag (0 without fair queueing), then MRU/FCFS; the ticket breaks
/// ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    not_forced: bool,
    neg_priority: i64,
    yielded: bool,
    fair_tag: u64,
    order: i64,
    ticket: Ticket,
}

#[derive(Debug, Clone)]
struct InFlight {
    program: usize,
    rank: Rank,
    kv_retention_ttl: Option<f64>,
    /// When it was dispatched and how long it waited in the pool first.
    dispatched_at: f64,
    queued: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    // Order matters for equal times: force resume before queue timeout.
    ForceResume,
    QueueTimeout,
    TtlExpiry,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at_us: i64,
    kind: TimerKind,
    id: u64,
    generation: u64,
}

/// Per-rank state.
#[derive(Debug, Clone)]
pub(crate) struct RankState {
    pub id: String,
    pub used_tokens: u64,
    pub active_programs: u32,
    pub queue: BTreeSet<QueueKey>,
    pub observation: Option<(f64, Observation)>,
    pub intervals: Window,
    pub growth: Window,
    /// Program slots bound to this rank (so per-rank work never scans every Program).
    pub members: rustc_hash::FxHashSet<usize>,
    /// Capacity repair flagged Programs at the last observation.
    pub repairing: bool,
    /// Completions (request and token throughput), for shared-prefix freshness, the
    /// force-resume deadline and batch gain.
    pub throughput: Throughput,
    /// Rounds Programs ran per activation before pausing.
    pub segment_rounds: Window,
    /// The largest shared prefix observed on this rank and when: Programs reserve only their
    /// private tokens, so admission counts this prefix once for the whole rank while fresh.
    pub shared_prefix: Option<(u64, f64)>,
    /// The router's ledger when the last observation arrived (diagnostics).
    pub used_at_observation: u64,
    /// Per-request measurements of the latest completions (diagnostics).
    pub requests: RequestWindows,
}

impl RankState {
    fn new(id: String, window: usize) -> Self {
        RankState {
            id,
            used_tokens: 0,
            active_programs: 0,
            queue: BTreeSet::new(),
            observation: None,
            intervals: Window::new(window),
            growth: Window::new(window),
            members: Default::default(),
            repairing: false,
            throughput: Throughput::new(window),
            segment_rounds: Window::new(window),
            shared_prefix: None,
            used_at_observation: 0,
            requests: RequestWindows::new(window),
        }
    }
}

/// Counters exposed as metrics.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub queue_timeouts: u64,
    pub force_resumes: u64,
    pub cross_rank_migrations: u64,
    /// Admissions that bypassed the growth reserve on modelled batch gain.
    pub batch_gain_admissions: u64,
    pub pauses: FxHashMap<&'static str, u64>,
}

/// Something worth logging or counting that happened during an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    Admit {
        program: String,
        rank: Rank,
        forced: bool,
        /// Tokens the admission reserved for the Program.
        demand: u64,
        /// The rank's ledger after admission over its token capacity (when one is known).
        used_ratio: Option<f64>,
    },
    /// Context growth of a Program between two of its completions (tokens).
    ContextGrowth {
        rank: Rank,
        tokens: f64,
    },
    Pause {
        program: String,
        rank: Rank,
        reason: PauseReason,
    },
    TtlArmed {
        program: String,
        rank: Rank,
        seconds: f64,
    },
    QueueWait {
        rank: Rank,
        seconds: f64,
    },
    Interval {
        rank: Rank,
        seconds: f64,
    },
    CacheMissImpact {
        rank: Rank,
        seconds: f64,
    },
    /// Prompt tokens found cached on a Program's first run on a rank: shared with others.
    SharedPrefix {
        rank: Rank,
        tokens: u64,
    },
    /// An admission bypassed the growth reserve because the modelled batch gain covered the
    /// risk (`benefit` and `cost` in seconds).
    BatchGain {
        rank: Rank,
        benefit: f64,
        cost: f64,
    },
}

/// The scheduler.
pub struct Scheduler {
    pub(crate) cfg: ProgramSchedulingConfig,
    pub(crate) ranks: Vec<RankState>,
    pub(crate) programs: Vec<Option<Program>>,
    free_slots: Vec<usize>,
    index: FxHashMap<(String, String), usize>,
    retained: FxHashMap<Ticket, Retained>,
    retained_at: FxHashMap<Ticket, f64>,
    in_flight: FxHashMap<Ticket, InFlight>,
    timers: BinaryHeap<Reverse<Timer>>,
    arrivals: i64,
    rr: usize,
    pub counters: Counters,
    pub notes: Vec<Note>,
    /// All ranks' intervals, for `ttl_evidence: pooled`.
    pub(crate) pooled_intervals: Window,
    /// Start-time fair queueing: each tenant's last finish tag, and the virtual time (start tag
    /// of the latest request to enter service), in weighted tokens.
    tenant_finish: FxHashMap<String, u64>,
    virtual_time: u64,
    /// Which prompt blocks each rank has seen (`cache_aware` binding only).
    prefix: PrefixIndex,
}

/// Microseconds, rounded so that `us(x as f64 / 1e6) == x`: a timer read back through
/// `next_deadline` must fire at exactly that time.
fn us(t: f64) -> i64 {
    (t * 1e6).round() as i64
}

impl Scheduler {
    /// A scheduler for ranks named `rank_ids` (indices are the data plane's).
    pub fn new(cfg: ProgramSchedulingConfig, rank_ids: Vec<String>) -> Self {
        let w = cfg.stats_window_size as usize;
        let ranks = rank_ids
            .into_iter()
            .map(|id| RankState::new(id, w))
            .collect();
        Scheduler {
            cfg,
            ranks,
            programs: Vec::new(),
            free_slots: Vec::new(),
            index: FxHashMap::default(),
            retained: FxHashMap::default(),
            retained_at: FxHashMap::default(),
            in_flight: FxHashMap::default(),
            timers: BinaryHeap::new(),
            arrivals: 0,
            rr: 0,
            counters: Counters::default(),
            notes: Vec::new(),
            pooled_intervals: Window::new(w),
            tenant_finish: FxHashMap::default(),
            virtual_time: 0,
            prefix: PrefixIndex::default(),
        }
    }

    pub fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    /// Requests waiting in the RequestPool.
    pub fn retained_requests(&self) -> usize {
        self.retained.len()
    }

    /// Token capacity of `rank` and where it comes from.
    pub fn capacity(&self, rank: Rank) -> (Option<u64>, CapacitySource) {
        if let Some(c) = self.cfg.token_capacity_per_dp_rank {
            return (Some(c), CapacitySource::Configured);
        }
        match self.ranks[rank]
            .observation
            .and_then(|(_, o)| o.token_capacity)
        {
            Some(c) => (Some(c), CapacitySource::Observed),
            None => (None, CapacitySource::ProgramCount),
        }
    }

    fn timer(&mut self, at: f64, kind: TimerKind, id: u64, generation: u64) {
        self.timers.push(Reverse(Timer {
            at_us: us(at),
            kind,
            id,
            generation,
        }));
    }

    fn program(&self, slot: usize) -> &Program {
        self.programs[slot].as_ref().expect("live program slot")
    }

    fn program_mut(&mut self, slot: usize) -> &mut Program {
        self.programs[slot].as_mut().expect("live program slot")
    }

    /// Initial home rank of a new Program (`chain`: its prompt's blocks, for `cache_aware`).
    fn bind(&mut self, program_id: &str, chain: &[u64]) -> Rank {
        use crate::config::program::BindingStrategy as B;
        let n = self.ranks.len();
        match self.cfg.binding_strategy {
            B::CacheAware => self.bind_cache_aware(chain),
            B::ConsistentHash => {
                // Rendezvous hashing: stable, and adding a rank moves only its share.
                (0..n)
                    .max_by_key(|r| {
                        crate::policies::stable_hash(
                            format!("{program_id}#{}", self.ranks[*r].id).as_bytes(),
                        )
                    })
                    .unwrap_or(0)
            }
            B::ProgramRoundRobin => {
                self.rr = (self.rr + 1) % n.max(1);
                self.rr
            }
            // Programs bound to the rank that have not finished (active, waiting, or paused in a
            // tool call), then active Programs plus requests waiting there. A finished Program's
            // KV is the first the rank can give up; counting it steered new Programs away from
            // ranks that had room (−2 % / −5 % excess JCT on swe-agent / mixed, 48 seeds).
            B::LeastProgramCount => (0..n)
                .min_by_key(|r| {
                    let x = &self.ranks[*r];
                    (
                        x.members
                            .iter()
                            .filter(|s| self.programs[**s].as_ref().is_some_and(|p| !p.finished()))
                            .count(),
                        x.active_programs as usize + x.queue.len(),
                        *r,
                    )
                })
                .unwrap_or(0),
            B::ReasoningTokenBalance => (0..n)
                .min_by_key(|r| (self.ranks[*r].used_tokens, *r))
                .unwrap_or(0),
        }
    }

    /// `cache_aware` binding: the rank holding the longest leading part of the prompt (a shared
    /// system prompt, a parent's context) when it covers at least [`CACHE_AFFINITY`] of it and
    /// the rank is not more than [`AFFINITY_SLACK`] active Programs busier than the least loaded
    /// one; otherwise the least loaded rank by reserved tokens, then active Programs.
    fn bind_cache_aware(&mut self, chain: &[u64]) -> Rank {
        let n = self.ranks.len();
        let load = |r: &RankState| (r.used_tokens, r.active_programs);
        let least = (0..n)
            .min_by_key(|r| (load(&self.ranks[*r]), *r))
            .unwrap_or(0);
        if chain.is_empty() {
            return least;
        }
        let ids: Vec<&str> = self.ranks.iter().map(|r| r.id.as_str()).collect();
        let matched = self.prefix.matched(chain, &ids);
        let best = (0..n)
            .max_by(|a, b| {
                matched[*a]
                    .cmp(&matched[*b])
                    .then(load(&self.ranks[*b]).cmp(&load(&self.ranks[*a])))
            })
            .unwrap_or(least);
        let covers = matched[best] as f64 / chain.len() as f64;
        let slack = self.ranks[least].active_programs + AFFINITY_SLACK;
        if matched[best] > 0
            && covers >= CACHE_AFFINITY
            && self.ranks[best].active_programs <= slack
        {
            best
        } else {
            least
        }
    }

    /// Tokens a Program needs on its rank — (context or prompt estimate, less a fresh shared
    /// prefix) + output allowance + growth reserve — and the growth-reserve part of it.
    fn demand(
        &self,
        p: &Program,
        prompt_tokens: u64,
        expected_output: Option<u64>,
        now: f64,
    ) -> (u64, u64) {
        let growth = if self.ranks[p.rank].growth.complete() {
            self.ranks[p.rank].growth.mean().unwrap_or(0.0).max(0.0) as u64
        } else {
            0
        };
        let logical = p.context_tokens.max(prompt_tokens);
        let private = logical - self.fresh_shared(p, now).min(logical);
        (
            private + expected_output.unwrap_or(self.cfg.decode_buffer_tokens) + growth,
            growth,
        )
    }

    /// How long a shared-prefix observation on `rank` stays valid: the warm-up lifetime until
    /// the rank's interval window is mature (or when no estimate exists), then the time for
    /// `shared_prefix_freshness_kv_turnovers` whole-KV-pool turnovers at the rank's measured
    /// token throughput.
    pub fn shared_prefix_freshness(&self, rank: Rank) -> f64 {
        let warmup = self.cfg.shared_prefix_freshness_warmup_seconds;
        let r = &self.ranks[rank];
        if !r.intervals.complete() {
            return warmup;
        }
        match (self.capacity(rank).0, r.throughput.tokens_per_second()) {
            (Some(cap), Some(rate)) if rate > 0.0 => {
                self.cfg.shared_prefix_freshness_kv_turnovers * cap as f64 / rate
            }
            _ => warmup,
        }
    }

    /// Tokens of the rank's shared prefix, counted once in admission while fresh.
    fn shared_floor(&self, rank: Rank, now: f64) -> u64 {
        match self.ranks[rank].shared_prefix {
            Some((tokens, at))
                if self.ranks[rank].growth.complete()
                    && now - at <= self.shared_prefix_freshness(rank) =>
            {
                tokens
            }
            _ => 0,
        }
    }

    /// The Program's shared prefix if its observation is still fresh, else 0. Until the rank's
    /// growth window is complete there is no growth reserve, and the double-counted prefix is
    /// the ledger's only margin for decode growth: nothing is discounted then.
    pub(crate) fn fresh_shared(&self, p: &Program, now: f64) -> u64 {
        if p.shared_prefix > 0
            && self.ranks[p.rank].growth.complete()
            && now - p.shared_at <= self.shared_prefix_freshness(p.rank)
        {
            p.shared_prefix
        } else {
            0
        }
    }

    /// Seconds `rank` needs to serve the work already there — retained requests, one more, and
    /// the rounds its active Programs are expected to run (mean rounds per activation) — at its
    /// measured request throughput; `None` until enough completions are measured.
    pub fn drain_seconds(&self, rank: Rank) -> Option<f64> {
        let r = &self.ranks[rank];
        let min_samples = (self.cfg.stats_window_size as usize).clamp(2, 16);
        let rate = r
            .throughput
            .requests_per_second()
            .filter(|x| *x > 0.0 && r.throughput.len() >= min_samples)?;
        let rounds = r.segment_rounds.mean().unwrap_or(1.0).max(1.0);
        let work = r.queue.len() as f64 + 1.0 + f64::from(r.active_programs) * rounds;
        Some(work / rate)
    }

    /// Seconds after which a request queued now on `rank` is forced. With
    /// `force_resume_workload_factor` > 0, that factor × [`Self::drain_seconds`] within
    /// [`metrics_interval_seconds`, `force_resume_timeout_seconds`] (the spec's workload-derived
    /// deadline); otherwise, or before throughput is measured, `force_resume_timeout_seconds`.
    pub fn force_resume_after(&self, rank: Rank) -> f64 {
        let limit = self.cfg.force_resume_timeout_seconds;
        let k = self.cfg.force_resume_workload_factor;
        match self.drain_seconds(rank) {
            Some(d) if k > 0.0 => {
                (k * d).clamp(self.cfg.metrics_interval_seconds.min(limit), limit)
            }
            _ => limit,
        }
    }

    /// Batch-gain admission: when only the growth reserve keeps a candidate out, admit it if the
    /// decode throughput it adds over its expected wait covers the risk of running out of
    /// growth room. Benefit = η · W, with η the marginal efficiency of one more request in the
    /// modelled decode batch (`decode_throughput_model`) and W the candidate's expected wait
    /// ([`Self::drain_seconds`]). Cost = P(overflow) · (cache-miss impact of the candidate +
    /// of an average active Program on the rank), P(overflow) the share of the growth reserve
    /// that would be missing. Returns (benefit, cost) when the bypass is taken.
    fn batch_gain(
        &self,
        rank: Rank,
        base: u64,
        growth: u64,
        now: f64,
        cap: u64,
    ) -> Option<(f64, f64)> {
        if !self.cfg.enable_batch_gain_admission || growth == 0 {
            return None;
        }
        let r = &self.ranks[rank];
        let room = cap as f64 * self.cfg.low_watermark_ratio;
        let used = (r.used_tokens + self.shared_floor(rank, now)) as f64;
        if used + base as f64 > room {
            return None; // immediate capacity is never bypassed
        }
        // No throughput measured yet: nothing to model the gain with.
        let wait = self.drain_seconds(rank)?;
        let batch = match self.observation_fresh(rank, now) {
            Some(o) => o.running.max(0.0) as u64,
            None => u64::from(r.active_programs),
        };
        let m = &self.cfg.decode_throughput_model;
        let efficiency = if batch == 0 {
            1.0
        } else {
            let t0 = decode_throughput(m, batch, r.used_tokens);
            let t1 = decode_throughput(m, batch + 1, r.used_tokens + base);
            if t1 <= 0.0 {
                0.0
            } else {
                ((t1 - t0) / (t1 / (batch + 1) as f64)).clamp(0.0, 1.0)
            }
        };
        let benefit = efficiency * wait;
        let shortfall = used + (base + growth) as f64 - room;
        let p_overflow = (shortfall / growth as f64).clamp(0.0, 1.0);
        let mean_context = if r.active_programs > 0 {
            r.used_tokens / u64::from(r.active_programs)
        } else {
            0
        };
        let pc = &self.cfg.prefill_cost_model;
        let cost = p_overflow
            * (cache_miss_impact_seconds(pc, base) + cache_miss_impact_seconds(pc, mean_context));
        (benefit >= cost).then_some((benefit, cost))
    }

    fn observation_fresh(&self, rank: Rank, now: f64) -> Option<Observation> {
        let (at, o) = self.ranks[rank].observation?;
        (now - at <= 3.0 * self.cfg.metrics_interval_seconds).then_some(o)
    }

    /// How many tokens `rank` would reserve for a retained request, if it can take it now: its
    /// whole demand, or its demand less the growth reserve when batch gain pays for the bypass.
    fn admission(&self, rank: Rank, r: &Retained, now: f64) -> Option<(u64, Option<(f64, f64)>)> {
        if self.can_admit(rank, r.demand, now, r.forced()) {
            return Some((r.demand, None));
        }
        let base = r.demand - r.growth;
        if r.forced() || !self.can_admit(rank, base, now, false) {
            return None;
        }
        let cap = self.capacity(rank).0?;
        self.batch_gain(rank, base, r.growth, now, cap)
            .map(|g| (base, Some(g)))
    }

    /// Whether `rank` can take a Program needing `demand` more tokens. A forced resume skips the
    /// Program-count guard and the waiting gate, but not token capacity (physical KV), unless the
    /// rank holds no active Program at all (a demand larger than the rank would never run).
    fn can_admit(&self, rank: Rank, demand: u64, now: f64, forced: bool) -> bool {
        let r = &self.ranks[rank];
        if forced {
            return self.fits(rank, demand, now);
        }
        if self.cfg.admission_waiting_request_threshold > 0
            && let Some(o) = self.observation_fresh(rank, now)
            && o.waiting >= f64::from(self.cfg.admission_waiting_request_threshold)
        {
            return false;
        }
        if r.active_programs >= self.cfg.max_active_programs_per_target {
            return false;
        }
        self.fits(rank, demand, now)
    }

    /// Token capacity: the rank's ledger, its shared prefix (counted once) and `demand` within
    /// capacity × `low_watermark_ratio`. A rank that holds no active Program takes any demand:
    /// one larger than the rank would otherwise wait for nothing until its force-resume deadline
    /// (vLLM chunks and preempts). Without a known capacity, always.
    fn fits(&self, rank: Rank, demand: u64, now: f64) -> bool {
        let r = &self.ranks[rank];
        r.active_programs == 0
            || self.capacity(rank).0.is_none_or(|cap| {
                (r.used_tokens + self.shared_floor(rank, now) + demand) as f64
                    <= cap as f64 * self.cfg.low_watermark_ratio
            })
    }

    fn activate(&mut self, slot: usize, rank: Rank, demand: u64, now: f64) {
        let p = self.program_mut(slot);
        let was_active = p.active();
        let old_rank = p.rank;
        let old_reserved = p.reserved;
        if old_rank != rank {
            self.ranks[old_rank].members.remove(&slot);
            self.ranks[rank].members.insert(slot);
        }
        let p = self.program_mut(slot);
        p.rank = rank;
        p.phase = Phase::Reasoning;
        p.reserved = demand;
        p.last_activity = now;
        if !was_active || old_rank != rank {
            p.placed_at = now;
        }
        if old_rank != rank {
            // A shared prefix observed on the old rank says nothing about this one.
            p.fresh_start = true;
            p.shared_prefix = 0;
            p.generation += 1;
            p.placement = "cross_rank";
        }
        if was_active {
            self.ranks[old_rank].used_tokens = self.ranks[old_rank]
                .used_tokens
                .saturating_sub(old_reserved);
            self.ranks[old_rank].active_programs =
                self.ranks[old_rank].active_programs.saturating_sub(1);
        }
        self.ranks[rank].used_tokens += demand;
        self.ranks[rank].active_programs += 1;
    }

    fn pause(&mut self, slot: usize, reason: PauseReason, now: f64) {
        let p = self.program(slot);
        if !p.active() {
            return;
        }
        let (rank, reserved, rounds) = (p.rank, p.reserved, p.rounds);
        let r = &mut self.ranks[rank];
        r.used_tokens = r.used_tokens.saturating_sub(reserved);
        r.active_programs = r.active_programs.saturating_sub(1);
        if rounds > 0 {
            r.segment_rounds.push(f64::from(rounds));
        }
        self.park(slot, reason, now);
    }

    /// The Program side of a pause (its rank's ledger is the caller's): paused, nothing
    /// reserved, counted, noted, and forgotten after `paused_retention_ttl_seconds`.
    fn park(&mut self, slot: usize, reason: PauseReason, now: f64) {
        let p = self.program_mut(slot);
        p.phase = Phase::Paused { since: now, reason };
        p.reserved = 0;
        p.rounds = 0;
        if reason == PauseReason::TtlExpired {
            p.rounds_since_ttl_pause = 0;
        }
        p.yielded = reason == PauseReason::SegmentYield;
        p.pause_on_complete = false;
        p.timer_gen += 1;
        let (generation, rank, name) = (p.timer_gen, p.rank, p.key.1.clone());
        *self.counters.pauses.entry(reason.as_str()).or_default() += 1;
        self.notes.push(Note::Pause {
            program: name,
            rank,
            reason,
        });
        let release_at = now + self.cfg.paused_retention_ttl_seconds;
        self.timer(release_at, TimerKind::Release, slot as u64, generation);
    }

    /// A new Program `key` bound to `rank`, in phase `New`; its slot.
    fn insert_program(
        &mut self,
        key: (String, String),
        rank: Rank,
        identity: Identity,
        now: f64,
    ) -> usize {
        let p = Program {
            key: key.clone(),
            rank,
            phase: Phase::New,
            in_flight: 0,
            retained: 0,
            context_tokens: 0,
            reserved: 0,
            last_step: None,
            last_activity: now,
            last_complete: None,
            placed_at: now,
            rounds: 0,
            yielded: false,
            pause_on_complete: false,
            timer_gen: 0,
            identity,
            armed_ttl: 0.0,
            shared_prefix: 0,
            shared_at: now,
            fresh_start: true,
            generation: 0,
            placement: "binding",
            last_rank: None,
            last_return: None,
            last_output: None,
            rounds_since_ttl_pause: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.programs[s] = Some(p);
                s
            }
            None => {
                self.programs.push(Some(p));
                self.programs.len() - 1
            }
        };
        self.index.insert(key, slot);
        self.ranks[rank].members.insert(slot);
        slot
    }

    /// A request with Program identity arrives.
    pub fn on_arrival(&mut self, now: f64, a: Arrival) -> Vec<Decision> {
        if self.ranks.is_empty() {
            return vec![Decision::Reject {
                ticket: a.ticket,
                reason: RejectReason::NoTarget,
            }];
        }
        self.arrivals += 1;
        let key = (a.model.clone(), a.identity.program_id.clone());
        let slot = match self.index.get(&key) {
            Some(s) => *s,
            None => {
                let rank = self.bind(&a.identity.program_id, &a.prefix);
                self.insert_program(key, rank, a.identity.clone(), now)
            }
        };
        if !a.prefix.is_empty() {
            let home = self.program(slot).rank;
            self.prefix
                .record(&self.ranks[home].id, &a.prefix, PREFIX_BUDGET_BLOCKS);
        }
        let mut out = Vec::new();
        let binding_only = self.cfg.binding_only;
        let p = self.program_mut(slot);
        let step = a
            .identity
            .step_id
            .unwrap_or_else(|| p.last_step.map_or(0, |s| s + 1));
        p.last_step = Some(step);
        p.identity = Identity {
            step_id: Some(step),
            ..a.identity.clone()
        };
        let interval = p.last_complete.map(|t| now - t);
        if interval.is_some() {
            p.last_return = interval;
        }
        let (rank, phase) = (p.rank, p.phase);
        if let Some(iv) = interval {
            self.ranks[rank].intervals.push(iv);
            self.pooled_intervals.push(iv);
            self.notes.push(Note::Interval { rank, seconds: iv });
        }
        let inflight = InFlight {
            program: slot,
            rank,
            kv_retention_ttl: a.identity.kv_retention_ttl_seconds,
            dispatched_at: now,
            queued: 0.0,
        };
        if binding_only {
            let p = self.program_mut(slot);
            p.in_flight += 1;
            p.last_activity = now;
            p.last_rank = Some(rank);
            self.in_flight.insert(a.ticket, inflight);
            out.push(Decision::Dispatch {
                ticket: a.ticket,
                rank,
            });
            return out;
        }
        let holds_capacity = match phase {
            Phase::Reasoning => true,
            Phase::Acting { until } if until >= now => true,
            _ => false,
        };
        if holds_capacity && self.program(slot).retained == 0 {
            // Acting and reasoning Programs keep their place: never reclaimed by admission.
            let (demand, _) = self.demand(
                self.program(slot),
                a.prompt_tokens,
                a.identity.expected_output_length,
                now,
            );
            let p = self.program_mut(slot);
            p.phase = Phase::Reasoning;
            p.in_flight += 1;
            p.timer_gen += 1;
            p.last_activity = now;
            p.last_rank = Some(rank);
            let grow = demand.saturating_sub(p.reserved);
            p.reserved += grow;
            self.ranks[rank].used_tokens += grow;
            self.in_flight.insert(a.ticket, inflight);
            out.push(Decision::Dispatch {
                ticket: a.ticket,
                rank,
            });
            return out;
        }
        if let Phase::Acting { .. } = phase {
            // The TTL passed but its timer has not fired yet.
            self.pause(slot, PauseReason::TtlExpired, now);
        }
        // New or paused: through the RequestPool, in resume order.
        let (demand, growth) = self.demand(
            self.program(slot),
            a.prompt_tokens,
            a.identity.expected_output_length,
            now,
        );
        let order = match self.cfg.resume_order {
            ResumeOrder::Fcfs => self.arrivals,
            ResumeOrder::Mru => -self.arrivals,
        };
        // Start-time fair queueing over tenants: a request's tag is where its tenant's previous
        // request ends in virtual service (or the current virtual time, for a tenant that was
        // idle), so a heavy tenant's backlog cannot keep a light tenant's request behind it.
        if self.tenant_finish.len() > 4096 {
            // A tenant whose finish tag is behind virtual time starts there anyway.
            let v = self.virtual_time;
            self.tenant_finish.retain(|_, f| *f > v);
        }
        let fair_tag = match &a.tenant {
            Some((tenant, weight)) => {
                let start = self
                    .tenant_finish
                    .get(tenant)
                    .copied()
                    .unwrap_or(0)
                    .max(self.virtual_time);
                let cost = (demand as f64 / weight.max(1e-9)).ceil() as u64;
                self.tenant_finish
                    .insert(tenant.clone(), start.saturating_add(cost.max(1)));
                start
            }
            None => 0,
        };
        let p = self.program_mut(slot);
        p.retained += 1;
        let yielded = p.yielded;
        let key = QueueKey {
            not_forced: true,
            neg_priority: -a.identity.priority,
            yielded,
            fair_tag,
            order,
            ticket: a.ticket,
        };
        let deadline = a.identity.deadline_seconds;
        let queue_limit = deadline.map_or(self.cfg.queue_timeout_seconds, |d| {
            d.min(self.cfg.queue_timeout_seconds)
        });
        // Workload-derived, bounded by `force_resume_timeout_seconds`; a request deadline can
        // only shorten it.
        let workload = self.force_resume_after(rank);
        let force_limit = deadline.map_or(workload, |d| d.min(workload));
        self.ranks[rank].queue.insert(key);
        self.retained.insert(
            a.ticket,
            Retained {
                program: slot,
                rank,
                key,
                demand,
                growth,
                force_at: now + force_limit,
                arrival: self.arrivals as u64,
            },
        );
        self.retained_at.insert(a.ticket, now);
        let arrival = self.arrivals as u64;
        self.timer(now + force_limit, TimerKind::ForceResume, a.ticket, arrival);
        self.timer(
            now + queue_limit,
            TimerKind::QueueTimeout,
            a.ticket,
            arrival,
        );
        self.pump(rank, now, &mut out);
        if self.cfg.global_queue && self.retained.contains_key(&a.ticket) {
            for r in 0..self.ranks.len() {
                if r != rank {
                    self.pump(r, now, &mut out);
                }
            }
        }
        out
    }

    /// Takes a changed configuration (a tuning reload: cost models, capacities, watermarks,
    /// TTL limits, timeouts, binding strategy, ...) keeping every Program, binding, TTL, window
    /// and retained request. New values govern decisions from now on; timers already armed (a
    /// TTL, a retained request's force-resume and queue deadlines) keep their times. Every rank
    /// is then pumped, so a looser limit admits waiting requests at once. A change of
    /// `binding_only` or `stats_window_size` changes the shape of the state itself: `None`,
    /// nothing taken, and the caller starts afresh.
    pub fn reconfigure(
        &mut self,
        now: f64,
        cfg: &ProgramSchedulingConfig,
    ) -> Option<Vec<Decision>> {
        if cfg.binding_only != self.cfg.binding_only
            || cfg.stats_window_size != self.cfg.stats_window_size
        {
            return None;
        }
        self.cfg = cfg.clone();
        let mut out = Vec::new();
        for rank in 0..self.ranks.len() {
            self.pump(rank, now, &mut out);
        }
        Some(out)
    }

    /// The target set changed to `rank_ids` (the data plane's new order). A rank whose id stays
    /// keeps everything — ledger, queue, windows, observation, bound Programs — under its new
    /// index; a new id starts empty. Programs bound to a removed rank are re-homed with the
    /// binding strategy: an active one is paused (`target_removed`, its KV is gone), a paused or
    /// new one just moves, and its retained requests move to the new home's queue with their
    /// place (key and deadlines) intact. In-flight requests on a removed rank are forgotten:
    /// their completion is ignored. Every rank is then pumped. An empty `rank_ids` is refused
    /// (nothing to re-home to); the caller retires the scheduler instead.
    pub fn retarget(&mut self, now: f64, rank_ids: Vec<String>) -> Vec<Decision> {
        let mut out = Vec::new();
        if rank_ids.is_empty() {
            return out;
        }
        let w = self.cfg.stats_window_size as usize;
        let old_len = self.ranks.len();
        let mut old: FxHashMap<String, (Rank, RankState)> = std::mem::take(&mut self.ranks)
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), (i, r)))
            .collect();
        let mut remap: Vec<Option<Rank>> = vec![None; old_len];
        self.ranks = rank_ids
            .into_iter()
            .enumerate()
            .map(|(new, id)| match old.remove(&id) {
                Some((i, r)) => {
                    remap[i] = Some(new);
                    r
                }
                None => RankState::new(id, w),
            })
            .collect();
        for id in old.keys() {
            self.prefix.forget(id);
        }
        // What is left in `old` was removed; its members need a new home.
        let mut orphans: Vec<usize> = old
            .into_values()
            .flat_map(|(_, r)| r.members.into_iter())
            .collect();
        orphans.sort_unstable();
        let n = self.ranks.len();
        self.rr %= n;
        // Surviving Programs and requests follow their rank's new index.
        for p in self.programs.iter_mut().flatten() {
            p.last_rank = p.last_rank.and_then(|l| remap.get(l).copied().flatten());
            if let Some(Some(r)) = remap.get(p.rank) {
                p.rank = *r;
            }
        }
        let mut lost: Vec<usize> = Vec::new();
        self.in_flight
            .retain(|_, f| match remap.get(f.rank).copied().flatten() {
                Some(r) => {
                    f.rank = r;
                    true
                }
                None => {
                    lost.push(f.program);
                    false
                }
            });
        for slot in lost {
            let p = self.program_mut(slot);
            p.in_flight = p.in_flight.saturating_sub(1);
        }
        for slot in orphans {
            let name = self.program(slot).key.1.clone();
            let home = self.bind(&name, &[]);
            self.ranks[home].members.insert(slot);
            let p = self.program_mut(slot);
            let was_active = p.active();
            p.rank = home;
            p.fresh_start = true;
            p.shared_prefix = 0;
            p.generation += 1;
            p.placement = "target_removed";
            if was_active {
                // Its ledger went with the removed rank; its KV is gone with the engine.
                self.park(slot, PauseReason::TargetRemoved, now);
            }
        }
        // Retained requests on a removed rank queue at their Program's (new) home.
        let programs = &self.programs;
        let ranks = &mut self.ranks;
        for r in self.retained.values_mut() {
            match remap.get(r.rank).copied().flatten() {
                Some(new) => r.rank = new,
                None => {
                    let home = programs[r.program].as_ref().map_or(0, |p| p.rank);
                    r.rank = home;
                    ranks[home].queue.insert(r.key);
                }
            }
        }
        for rank in 0..n {
            self.pump(rank, now, &mut out);
        }
        out
    }

    /// Admits retained requests on `rank` in order while capacity allows; with `global_queue`,
    /// then takes movable requests from other ranks.
    fn pump(&mut self, rank: Rank, now: f64, out: &mut Vec<Decision>) {
        while let Some(&head) = self.ranks[rank].queue.first() {
            let ticket = head.ticket;
            let Some(r) = self.retained.get(&ticket).cloned() else {
                self.ranks[rank].queue.remove(&head);
                continue;
            };
            let holds = self.program(r.program).active();
            let reserve = if holds {
                Some((r.demand, None))
            } else {
                self.admission(rank, &r, now)
            };
            let Some((reserve, gain)) = reserve else {
                break;
            };
            if let Some((benefit, cost)) = gain {
                self.counters.batch_gain_admissions += 1;
                self.notes.push(Note::BatchGain {
                    rank,
                    benefit,
                    cost,
                });
            }
            self.admit(ticket, rank, reserve, now, out);
        }
        if !self.cfg.global_queue {
            return;
        }
        // Cross-rank resume: FCFS over the other ranks' heads, gated by headroom and residence.
        let Some(cap) = self.capacity(rank).0 else {
            return;
        };
        let k = self.min_wait_ratio();
        loop {
            let mut best: Option<(f64, Ticket)> = None;
            for (src, rs) in self.ranks.iter().enumerate() {
                if src == rank {
                    continue;
                }
                let Some(head) = rs.queue.first() else {
                    continue;
                };
                let ticket = head.ticket;
                let Some(r) = self.retained.get(&ticket) else {
                    continue;
                };
                let p = self.program(r.program);
                if p.active()
                    || now - p.placed_at < self.cfg.metrics_interval_seconds && p.context_tokens > 0
                {
                    continue;
                }
                let src_cap = self.capacity(src).0.unwrap_or(cap);
                let src_free = src_cap.saturating_sub(rs.used_tokens) as f64;
                let dst_free = cap.saturating_sub(self.ranks[rank].used_tokens) as f64;
                let needed = src_free + self.cfg.cross_rank_headroom_ratio * r.demand as f64;
                if dst_free < needed || !self.can_admit(rank, r.demand, now, r.forced()) {
                    continue;
                }
                let at = self.retained_at.get(&ticket).copied().unwrap_or(now);
                // Break-even gate: wait at home until the wait so far is worth the move.
                if k > 0.0
                    && !r.forced()
                    && now - at
                        < k * super::cost::cache_miss_impact_seconds(
                            &self.cfg.prefill_cost_model,
                            p.context_tokens,
                        )
                {
                    continue;
                }
                if best.is_none_or(|(t, _)| at < t) {
                    best = Some((at, ticket));
                }
            }
            let Some((_, ticket)) = best else { break };
            self.counters.cross_rank_migrations += 1;
            let demand = self.retained.get(&ticket).map_or(0, |r| r.demand);
            self.admit(ticket, rank, demand, now, out);
        }
    }

    /// `cross_rank_min_wait_ratio`, with null resolved by the current number of ranks.
    pub fn min_wait_ratio(&self) -> f64 {
        self.cfg.cross_rank_min_wait_ratio.unwrap_or(
            if self.ranks.len() >= crate::config::program::AUTO_MIN_WAIT_RANKS {
                1.0
            } else {
                0.0
            },
        )
    }

    /// Dispatches retained `ticket` on `rank`, reserving `reserve` tokens for its Program.
    fn admit(
        &mut self,
        ticket: Ticket,
        rank: Rank,
        reserve: u64,
        now: f64,
        out: &mut Vec<Decision>,
    ) {
        let Some(r) = self.retained.remove(&ticket) else {
            return;
        };
        self.ranks[r.rank].queue.remove(&r.key);
        // Virtual time follows the start tag of what enters service.
        self.virtual_time = self.virtual_time.max(r.key.fair_tag);
        let since = self.retained_at.remove(&ticket).unwrap_or(now);
        let p = self.program(r.program);
        // An active Program (another of its requests was admitted meanwhile, maybe on another
        // rank) keeps its place: this request joins it there and never moves it.
        let active = p.active();
        let rank = if active { p.rank } else { rank };
        self.notes.push(Note::QueueWait {
            rank,
            seconds: now - since,
        });
        if active {
            let p = self.program_mut(r.program);
            p.phase = Phase::Reasoning;
            p.timer_gen += 1;
        } else {
            self.activate(r.program, rank, reserve, now);
        }
        let p = self.program_mut(r.program);
        p.retained -= 1;
        p.in_flight += 1;
        // A successful resume clears the one-shot yield marker.
        p.yielded = false;
        p.last_rank = Some(rank);
        let name = p.key.1.clone();
        let kv_ttl = p.identity.kv_retention_ttl_seconds;
        self.in_flight.insert(
            ticket,
            InFlight {
                program: r.program,
                rank,
                kv_retention_ttl: kv_ttl,
                dispatched_at: now,
                queued: now - since,
            },
        );
        if r.forced() {
            self.counters.force_resumes += 1;
        }
        let used_ratio = self
            .capacity(rank)
            .0
            .filter(|c| *c > 0)
            .map(|c| self.ranks[rank].used_tokens as f64 / c as f64);
        self.notes.push(Note::Admit {
            program: name,
            rank,
            forced: r.forced(),
            demand: reserve,
            used_ratio,
        });
        out.push(Decision::Dispatch { ticket, rank });
    }

    /// A dispatched request finished with `usage` (`None` if the backend reported none).
    pub fn on_complete(&mut self, now: f64, ticket: Ticket, usage: Option<Usage>) -> Vec<Decision> {
        let mut out = Vec::new();
        let Some(f) = self.in_flight.remove(&ticket) else {
            return out;
        };
        let rank = f.rank;
        let binding_only = self.cfg.binding_only;
        let queue_pressure = !self.ranks[rank].queue.is_empty();
        let p = self.program_mut(f.program);
        p.in_flight = p.in_flight.saturating_sub(1);
        p.last_complete = Some(now);
        p.last_activity = now;
        let prev_context = p.context_tokens;
        let mut shared = None;
        p.rounds_since_ttl_pause += 1;
        if let Some(u) = usage {
            p.last_output = Some(u.completion_tokens);
            p.context_tokens = u.prompt_tokens + u.completion_tokens;
            if std::mem::take(&mut p.fresh_start) {
                // First run on this placement: whatever was cached came from other Programs.
                p.shared_prefix = u.cached_tokens.min(u.prompt_tokens);
                p.shared_at = now;
                shared = Some(p.shared_prefix);
            }
        }
        let context = p.context_tokens;
        if let Some(u) = usage {
            let r = &mut self.ranks[rank];
            r.throughput
                .push(now, u.prompt_tokens + u.completion_tokens);
            r.requests.push(
                u.prompt_tokens,
                u.completion_tokens,
                u.cached_tokens,
                (now - f.dispatched_at).max(0.0),
                f.queued.max(0.0),
            );
        }
        if let Some(tokens) = shared {
            self.notes.push(Note::SharedPrefix { rank, tokens });
            if tokens > 0 && tokens >= self.shared_floor(rank, now) {
                self.ranks[rank].shared_prefix = Some((tokens, now));
            }
        }
        if usage.is_some() && prev_context > 0 {
            let growth = context as f64 - prev_context as f64;
            self.ranks[rank].growth.push(growth);
            self.notes.push(Note::ContextGrowth {
                rank,
                tokens: growth,
            });
        }
        if binding_only {
            // Nothing to schedule, but the binding is forgotten after the paused retention like
            // any idle Program's (or a long-running router would keep every Program forever).
            if self.program(f.program).in_flight == 0 {
                self.release_later(f.program, now);
            }
            return out;
        }
        if self.program(f.program).in_flight > 0 {
            return out;
        }
        // Hold exactly the context just computed, less a prefix other Programs keep cached.
        let shared = self.fresh_shared(self.program(f.program), now).min(context);
        let held = context - shared + self.cfg.decode_buffer_tokens;
        let p = self.program_mut(f.program);
        if p.active() {
            let before = p.reserved;
            p.reserved = held;
            let r = &mut self.ranks[rank];
            r.used_tokens = (r.used_tokens + held).saturating_sub(before);
        }
        let p = self.program(f.program);
        let reason = if !p.identity.expected_resume {
            Some(PauseReason::NoResumeExpected)
        } else if p.pause_on_complete {
            Some(PauseReason::CapacityRepair)
        } else if p.rounds + 1 >= self.cfg.max_segment_rounds && queue_pressure {
            Some(PauseReason::SegmentYield)
        } else {
            None
        };
        let ttl = match (reason, f.kv_retention_ttl) {
            (Some(_), _) => 0.0,
            (None, Some(t)) => t,
            (None, None) => self.auto_ttl(rank, context),
        };
        let p = self.program_mut(f.program);
        p.rounds += 1;
        if ttl > 0.0 {
            p.phase = Phase::Acting { until: now + ttl };
            p.armed_ttl = ttl;
            p.timer_gen += 1;
            let generation = p.timer_gen;
            let name = p.key.1.clone();
            self.timer(
                now + ttl,
                TimerKind::TtlExpiry,
                f.program as u64,
                generation,
            );
            self.notes.push(Note::TtlArmed {
                program: name,
                rank,
                seconds: ttl,
            });
        } else {
            p.armed_ttl = 0.0;
            self.pause(f.program, reason.unwrap_or(PauseReason::TtlExpired), now);
        }
        self.pump(rank, now, &mut out);
        out
    }

    /// The automatic acting TTL for a Program with `context` tokens on `rank`.
    fn auto_ttl(&mut self, rank: Rank, context: u64) -> f64 {
        let impact = cache_miss_impact_seconds(&self.cfg.prefill_cost_model, context);
        self.notes.push(Note::CacheMissImpact {
            rank,
            seconds: impact,
        });
        self.fitted_ttl(rank, context)
    }

    /// The automatic acting TTL `rank`'s evidence gives a Program with `context` tokens now.
    pub(crate) fn fitted_ttl(&self, rank: Rank, context: u64) -> f64 {
        let impact = cache_miss_impact_seconds(&self.cfg.prefill_cost_model, context);
        let w = match self.cfg.ttl_evidence {
            crate::config::program::TtlEvidence::Rank => &self.ranks[rank].intervals,
            crate::config::program::TtlEvidence::Pooled => &self.pooled_intervals,
        };
        let needed = self
            .cfg
            .ttl_min_samples
            .unwrap_or(self.cfg.stats_window_size) as usize;
        if w.len() < needed {
            return 0.0;
        }
        best_ttl(&w.sorted(), impact, self.cfg.max_acting_ttl_seconds)
    }

    /// The client went away: a retained request leaves the pool; an in-flight one releases its
    /// Program's capacity (no TTL: nobody is coming back for it on this request).
    pub fn on_cancel(&mut self, now: f64, ticket: Ticket) -> Vec<Decision> {
        let mut out = Vec::new();
        if let Some(r) = self.retained.remove(&ticket) {
            self.retained_at.remove(&ticket);
            self.ranks[r.rank].queue.remove(&r.key);
            self.program_mut(r.program).retained -= 1;
            self.maybe_forget(r.program);
            return out;
        }
        let Some(f) = self.in_flight.remove(&ticket) else {
            return out;
        };
        let p = self.program_mut(f.program);
        p.in_flight = p.in_flight.saturating_sub(1);
        if p.in_flight > 0 {
            return out;
        }
        if self.cfg.binding_only {
            self.release_later(f.program, now);
        } else {
            self.pause(f.program, PauseReason::Cancelled, now);
            self.pump(f.rank, now, &mut out);
        }
        out
    }

    /// `binding_only`: forget an idle Program's binding after the paused retention.
    fn release_later(&mut self, slot: usize, now: f64) {
        let at = now + self.cfg.paused_retention_ttl_seconds;
        let p = self.program_mut(slot);
        p.timer_gen += 1;
        let generation = p.timer_gen;
        self.timer(at, TimerKind::Release, slot as u64, generation);
    }

    /// Whether a Program `key` (model, Program id) is known here.
    pub fn knows(&self, key: &(String, String)) -> bool {
        self.index.contains_key(key)
    }

    /// Every Program known here, as another router replica would take it over (`peers`).
    pub fn held(&self, now: f64) -> Vec<HandedOver> {
        self.index
            .values()
            .map(|slot| self.handed_over(*slot, now))
            .collect()
    }

    fn handed_over(&self, slot: usize, now: f64) -> HandedOver {
        let p = self.program(slot);
        HandedOver {
            model: p.key.0.clone(),
            program_id: p.key.1.clone(),
            root: p.root().to_string(),
            target: self.ranks[p.rank].id.clone(),
            context_tokens: p.context_tokens,
            idle_seconds: (now - p.last_activity).max(0.0),
        }
    }

    /// Gives up Program `key` (model, Program id) when it has no request in flight or waiting,
    /// for the replica that now owns it (`peers`): it leaves this scheduler, its reservation
    /// freed, and comes back with its rank's id so that it keeps running where its KV is.
    pub fn hand_over(
        &mut self,
        now: f64,
        key: &(String, String),
    ) -> (Option<HandedOver>, Vec<Decision>) {
        let mut out = Vec::new();
        let Some(&slot) = self.index.get(key) else {
            return (None, out);
        };
        let p = self.program(slot);
        if p.in_flight > 0 || p.retained > 0 {
            return (None, out);
        }
        let active = p.active();
        self.pause(slot, PauseReason::HandedOver, now);
        let given = self.handed_over(slot, now);
        let rank = self.remove_program(slot);
        if active {
            self.pump(rank, now, &mut out);
        }
        (Some(given), out)
    }

    /// Takes Programs another replica handed over (`peers`): each one not known here whose
    /// target is in the set is bound to it and waits paused for its next request — resumed
    /// through admission like any paused Program, and forgotten after the paused retention if
    /// none comes. Returns how many were taken.
    pub fn adopt(&mut self, now: f64, programs: &[HandedOver]) -> usize {
        let mut taken = 0;
        for h in programs {
            let key = (h.model.clone(), h.program_id.clone());
            let Some(rank) = self.ranks.iter().position(|r| r.id == h.target) else {
                continue;
            };
            if self.index.contains_key(&key) {
                continue;
            }
            let identity = Identity {
                program_id: h.program_id.clone(),
                root_program_id: (h.root != h.program_id).then(|| h.root.clone()),
                ..Identity::default()
            };
            let slot = self.insert_program(key, rank, identity, now);
            let since = now - h.idle_seconds.clamp(0.0, 86_400.0);
            let p = self.program_mut(slot);
            p.context_tokens = h.context_tokens;
            p.last_activity = since;
            // Its KV is already on the rank: the first completion here measures no sharing.
            p.fresh_start = false;
            p.placement = "handed_over";
            p.phase = Phase::Paused {
                since,
                reason: PauseReason::HandedOver,
            };
            p.timer_gen += 1;
            let generation = p.timer_gen;
            let release_at = now + self.cfg.paused_retention_ttl_seconds;
            self.timer(release_at, TimerKind::Release, slot as u64, generation);
            taken += 1;
        }
        taken
    }

    fn maybe_forget(&mut self, slot: usize) {
        let p = self.program(slot);
        if p.phase == Phase::New && p.retained == 0 && p.in_flight == 0 {
            self.remove_program(slot);
        }
    }

    /// Forgets the Program in `slot` (its ledger entries are the caller's); its rank.
    fn remove_program(&mut self, slot: usize) -> Rank {
        let p = self.programs[slot].take().expect("live program slot");
        self.ranks[p.rank].members.remove(&slot);
        self.index.remove(&p.key);
        self.free_slots.push(slot);
        p.rank
    }

    /// A backend observation of `rank`.
    pub fn on_observation(&mut self, now: f64, rank: Rank, obs: Observation) -> Vec<Decision> {
        let mut out = Vec::new();
        if rank >= self.ranks.len() {
            return out;
        }
        self.ranks[rank].observation = Some((now, obs));
        self.ranks[rank].used_at_observation = self.ranks[rank].used_tokens;
        // Capacity repair: above the high watermark, reasoning Programs pause when they finish.
        if let (Some(cap), false) = (self.capacity(rank).0, self.cfg.binding_only) {
            let observed = (obs.kv_usage * cap as f64).max(self.ranks[rank].used_tokens as f64);
            let repair = observed > cap as f64 * self.cfg.high_watermark_ratio;
            let low = cap as f64 * self.cfg.low_watermark_ratio;
            let mut excess = observed - low;
            let r = &self.ranks[rank];
            if repair || r.repairing {
                for slot in r.members.iter() {
                    if let Some(p) = self.programs[*slot].as_mut()
                        && p.phase == Phase::Reasoning
                    {
                        p.pause_on_complete = repair && excess > 0.0;
                        if p.pause_on_complete {
                            excess -= p.reserved as f64;
                        }
                    }
                }
            }
            self.ranks[rank].repairing = repair;
        }
        self.pump(rank, now, &mut out);
        out
    }

    /// Fires every timer due by `now`.
    pub fn on_tick(&mut self, now: f64) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut pumps: Vec<Rank> = Vec::new();
        while let Some(Reverse(t)) = self.timers.peek().copied() {
            if t.at_us > us(now) {
                break;
            }
            self.timers.pop();
            match t.kind {
                TimerKind::ForceResume => {
                    let ticket = t.id;
                    if let Some(r) = self.retained.get_mut(&ticket)
                        && r.arrival == t.generation
                    {
                        let old = r.key;
                        r.key.not_forced = false;
                        let (rank, new) = (r.rank, r.key);
                        self.ranks[rank].queue.remove(&old);
                        self.ranks[rank].queue.insert(new);
                        // Admit now, before a queue timeout due at the same instant fires.
                        self.pump(rank, now, &mut out);
                    }
                }
                TimerKind::QueueTimeout => {
                    let ticket = t.id;
                    if self.retained.get(&ticket).map(|r| r.arrival) == Some(t.generation)
                        && let Some(r) = self.retained.remove(&ticket)
                    {
                        self.retained_at.remove(&ticket);
                        self.ranks[r.rank].queue.remove(&r.key);
                        self.program_mut(r.program).retained -= 1;
                        self.counters.queue_timeouts += 1;
                        out.push(Decision::Reject {
                            ticket,
                            reason: RejectReason::QueueTimeout,
                        });
                        self.maybe_forget(r.program);
                    }
                }
                TimerKind::TtlExpiry => {
                    let slot = t.id as usize;
                    if let Some(Some(p)) = self.programs.get(slot)
                        && p.timer_gen == t.generation
                        && matches!(p.phase, Phase::Acting { .. })
                    {
                        let rank = p.rank;
                        self.pause(slot, PauseReason::TtlExpired, now);
                        pumps.push(rank);
                    }
                }
                TimerKind::Release => {
                    let slot = t.id as usize;
                    if let Some(Some(p)) = self.programs.get(slot)
                        && p.timer_gen == t.generation
                        && (matches!(p.phase, Phase::Paused { .. })
                            || self.cfg.binding_only && p.phase == Phase::New)
                        && p.retained == 0
                        && p.in_flight == 0
                    {
                        self.remove_program(slot);
                    }
                }
            }
        }
        pumps.sort_unstable();
        pumps.dedup();
        for r in pumps {
            self.pump(r, now, &mut out);
        }
        out
    }

    /// The next time `on_tick` has work (for the driver's sleep).
    pub fn next_deadline(&self) -> Option<f64> {
        self.timers.peek().map(|Reverse(t)| t.at_us as f64 / 1e6)
    }

    /// Each Program's earliest force-resume time among its waiting requests (diagnostics).
    pub(crate) fn force_deadlines(&self) -> FxHashMap<usize, f64> {
        let mut m: FxHashMap<usize, f64> = FxHashMap::default();
        for r in self.retained.values() {
            let at = if r.forced() { f64::MIN } else { r.force_at };
            m.entry(r.program)
                .and_modify(|x| *x = x.min(at))
                .or_insert(at);
        }
        m
    }

    /// Each Program's longest wait among its retained requests, in seconds at `now`
    /// (diagnostics).
    pub(crate) fn oldest_waits(&self, now: f64) -> FxHashMap<usize, f64> {
        let mut m: FxHashMap<usize, f64> = FxHashMap::default();
        for (ticket, r) in &self.retained {
            let waited = self
                .retained_at
                .get(ticket)
                .map_or(0.0, |at| (now - at).max(0.0));
            m.entry(r.program)
                .and_modify(|x| *x = x.max(waited))
                .or_insert(waited);
        }
        m
    }

    /// Drains the notes gathered since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }

    /// Checks the ledger against the Programs (tests and debug builds).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (i, r) in self.ranks.iter().enumerate() {
            let (used, active) = self
                .programs
                .iter()
                .flatten()
                .filter(|p| p.rank == i && p.active())
                .fold((0u64, 0u32), |(u, a), p| (u + p.reserved, a + 1));
            if used != r.used_tokens || active != r.active_programs {
                return Err(format!(
                    "rank {i}: ledger {}/{} but Programs hold {used}/{active}",
                    r.used_tokens, r.active_programs
                ));
            }
            let bound = self
                .programs
                .iter()
                .flatten()
                .filter(|p| p.rank == i)
                .count();
            if bound != r.members.len() {
                return Err(format!(
                    "rank {i}: {} members but {bound} Programs bound",
                    r.members.len()
                ));
            }
            let queued = self.retained.values().filter(|x| x.rank == i).count();
            if queued != r.queue.len() {
                return Err(format!(
                    "rank {i}: queue {} vs retained {queued}",
                    r.queue.len()
                ));
            }
        }
        for (slot, p) in self.programs.iter().enumerate() {
            if let Some(p) = p
                && !self
                    .ranks
                    .get(p.rank)
                    .is_some_and(|r| r.members.contains(&slot))
            {
                return Err(format!(
                    "Program {:?} bound to rank {} that does not list it",
                    p.key, p.rank
                ));
            }
        }
        for (t, f) in &self.in_flight {
            if f.rank >= self.ranks.len() || self.programs[f.program].is_none() {
                return Err(format!(
                    "ticket {t} in flight on rank {} or for a released Program",
                    f.rank
                ));
            }
        }
        for (t, r) in &self.retained {
            if self.in_flight.contains_key(t) {
                return Err(format!("ticket {t} both retained and in flight"));
            }
            if self.programs[r.program].is_none() {
                return Err(format!("ticket {t} retained for a released Program"));
            }
        }
        Ok(())
    }
}
