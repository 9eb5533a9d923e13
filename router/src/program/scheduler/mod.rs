//! The Program scheduler: a pure state machine — events with an explicit `now` in, decisions out.
//!
//! Owns Program lifecycle (reasoning → acting with a Progress-TTL → paused → released), the
//! RequestPool (per-rank retained requests, queue timeouts, force resume), admission (token
//! capacity with watermarks, Program-count guard, vLLM waiting gate), resume ordering, cross-rank
//! resume, segment yield and capacity repair. No I/O, no clock reads, no async: the data plane
//! calls it under a lock and acts on the returned [`Decision`]s.
//!
//! This file holds the types, construction and the arrival, cancellation and observation
//! events; the submodules hold the rest of `impl Scheduler` by concern (binding, admission,
//! lifecycle, completion, timers, target changes, hand-over between replicas, invariants,
//! adaptive overcommit).

mod admission;
mod binding;
mod completion;
mod events;
mod handover;
mod invariants;
mod kinds;
mod lifecycle;
mod overcommit;
mod targets;
mod timers;
mod tools;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rustc_hash::FxHashMap;

use super::cost::{cache_miss_impact_seconds, decode_throughput};
use super::identity::Identity;
use super::window::{RequestWindows, Throughput, Window, best_ttl};
use crate::config::ProgramSchedulingConfig;
use crate::config::program::{ActingTtlCost, ActingTtlHold, ResumeOrder};
use crate::policies::prefix_index::PrefixIndex;

/// The data plane's id for one request.
pub type Ticket = u64;
/// Index of a rank (target) in the scheduler.
pub type Rank = usize;
pub use kinds::MAX_KINDS;
pub use tools::{MAX_TOOL_NAME_BYTES, ToolId};

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
    /// A hash of the prompt's leading bytes ([`lead_key`]): requests with the same key start
    /// with the same shared prefix (a system prompt); `None` when unknown.
    pub lead: Option<u64>,
    /// A hash of the system prompt's leading bytes alone ([`lead_key`] of them; of the first
    /// message without a system prompt): its Program's kind for `resume_order: kind_size`;
    /// `None` when the request has neither.
    pub system: Option<u64>,
}

/// Bytes of a prompt that [`lead_key`] hashes: two prompts equal this far are taken to start
/// with the same shared prefix.
pub const LEAD_BYTES: usize = 1024;

/// The [`Arrival::lead`] key of `prompt`: a hash of its first [`LEAD_BYTES`] bytes. It stays in
/// the process (admission only compares keys).
pub fn lead_key(prompt: &[u8]) -> Option<u64> {
    (!prompt.is_empty()).then(|| crate::hash::stable_hash(&prompt[..prompt.len().min(LEAD_BYTES)]))
}

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
    /// The RequestPool holds `max_retained_requests` already.
    PoolFull,
    /// `max_programs` Programs are held and none is idle to make room.
    ProgramsFull,
}

/// Usage of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

/// What the data plane read of a finished response's tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCall<'a> {
    /// Its first tool call named this tool.
    Named(&'a str),
    /// It called no tool: searched whole, or its ending (`finish_reason`) says it answered.
    None,
    /// Not known: tools were not looked for, or a body longer than the part kept ended in a
    /// call whose name was lost, or for a reason not known.
    Unknown,
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

/// The largest token count the scheduler takes from outside (a client's expected output, a
/// backend's usage or capacity, a peer's context): larger values are read as this, so no sum or
/// product of the ledger can overflow (a trillion tokens is far beyond any engine).
pub const MAX_TOKENS: u64 = 1 << 40;

impl Usage {
    /// This usage with every count at most [`MAX_TOKENS`].
    fn bounded(self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens.min(MAX_TOKENS),
            completion_tokens: self.completion_tokens.min(MAX_TOKENS),
            cached_tokens: self.cached_tokens.min(MAX_TOKENS),
        }
    }
}

impl Observation {
    /// This observation with what a backend cannot mean removed: non-finite or negative counts
    /// read as 0, KV usage held to [0, 1], capacity at most [`MAX_TOKENS`] (0 is none).
    fn bounded(self) -> Observation {
        let count = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        Observation {
            waiting: count(self.waiting),
            running: count(self.running),
            kv_usage: count(self.kv_usage).min(1.0),
            token_capacity: self
                .token_capacity
                .filter(|c| *c > 0)
                .map(|c| c.min(MAX_TOKENS)),
        }
    }
}

/// Why a Program left the active set (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseReason {
    TtlExpired,
    NoResumeExpected,
    SegmentYield,
    CapacityRepair,
    Cancelled,
    /// Its rank left the target set or could no longer be reached; it was re-homed and
    /// resumes through admission.
    TargetRemoved,
    /// Another router replica took it over (`peers`), or handed it here.
    HandedOver,
    /// Its response called no tool after earlier ones did (`answer_ends_program`).
    Answered,
}

impl PauseReason {
    pub const ALL: [PauseReason; 8] = [
        PauseReason::TtlExpired,
        PauseReason::NoResumeExpected,
        PauseReason::SegmentYield,
        PauseReason::CapacityRepair,
        PauseReason::Cancelled,
        PauseReason::TargetRemoved,
        PauseReason::HandedOver,
        PauseReason::Answered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::TtlExpired => "ttl_expired",
            PauseReason::NoResumeExpected => "no_resume_expected",
            PauseReason::SegmentYield => "max_segment_yield",
            PauseReason::CapacityRepair => "capacity_repair",
            PauseReason::Cancelled => "cancelled",
            PauseReason::TargetRemoved => "target_removed",
            PauseReason::HandedOver => "handed_over",
            PauseReason::Answered => "answered",
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
    /// Its latest request's [`Arrival::lead`] key.
    pub lead: Option<u64>,
    /// The [`Arrival::system`] key of its first request that had one.
    pub system: Option<u64>,
    /// Its kind ([`kinds::kind_of`] of its model, `system` and role), kept current wherever
    /// either changes (its requests' arrivals) so that queueing and admission do not rehash it.
    pub kind: Option<u64>,
    /// The next completion is the first on this placement: its cached tokens measure sharing.
    pub fresh_start: bool,
    /// Times it moved to another rank (cross-rank resume, re-home), and how it got its rank.
    pub generation: u32,
    pub placement: &'static str,
    /// The rank its latest request was dispatched to.
    pub last_rank: Option<Rank>,
    /// Its latest measured return (tool gap) and output length.
    pub last_return: Option<f64>,
    /// Its measured returns, and how many of them outlasted `max_acting_ttl_seconds`.
    pub returns: u32,
    pub long_returns: u32,
    pub last_output: Option<u64>,
    /// Its latest completion reported cached prompt tokens (an observed cache hit).
    pub last_hit: bool,
    /// Completions since its last TTL-expiry pause.
    pub rounds_since_ttl_pause: u32,
    /// Finished: its last request said no further request follows (`expected_resume: false`)
    /// and completed with nothing else of it queued or in flight, or it has been paused and
    /// idle for longer than `finished_idle_ratio` × the longest completion-to-next-request
    /// interval observed (clients that send no `expected_resume`). Its binding is kept for the
    /// paused retention (a late request still finds its KV rank and clears this), but it no
    /// longer counts as load ([`RankState::finished`]).
    pub finished: bool,
    /// The tool its latest completion called (`tool_ttl_min_samples`).
    pub last_tool: Option<ToolId>,
    /// One of its responses called a tool (an agent, for `answer_ends_program`).
    pub called_tool: bool,
    /// Its total was learned for `resume_order: kind_size` (once per Program).
    pub size_learned: bool,
}

impl Program {
    pub(crate) fn active(&self) -> bool {
        matches!(self.phase, Phase::Reasoning | Phase::Acting { .. })
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
    /// Its last request said no further request follows ([`Program::finished`]); left out
    /// when false, and false when missing (a replica of an earlier version).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finished: bool,
    /// It has called a tool ([`Program::called_tool`]: an answer then ends its turn, under
    /// `answer_ends_program`); optional on the wire like `finished`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub called_tool: bool,
}

#[derive(Debug, Clone)]
struct Retained {
    program: usize,
    rank: Rank,
    key: QueueKey,
    demand: u64,
    /// The growth-reserve part of `demand` (what batch-gain admission may bypass).
    growth: u64,
    /// When it entered the pool, and when it becomes forced.
    since: f64,
    force_at: f64,
    /// Which arrival this is (the scheduler's arrival count), so that a timer armed for an
    /// earlier request that reused the ticket cannot act on this one.
    arrival: u64,
    /// This request's own `kv_retention_ttl_seconds` (request-scoped: a later request of the
    /// same Program does not change it).
    kv_retention_ttl: Option<f64>,
}

impl Retained {
    /// Past its force-resume deadline.
    fn forced(&self) -> bool {
        !self.key.not_forced
    }
}

/// Order within a rank's queue: forced first, then higher priority, then not-yielded, then the
/// tenant's fair-queueing start tag (0 without fair queueing), then the Program's kind's size
/// tier (`resume_order: kind_size`; 0 otherwise), then MRU/FCFS; the ticket breaks ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    not_forced: bool,
    neg_priority: i64,
    yielded: bool,
    fair_tag: u64,
    size_tier: u64,
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
    /// Dispatched while its Program held its place since its previous completion (acting or
    /// reasoning, never paused in between): its context should still be cached.
    held: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    // Order matters for equal times: force resume before queue timeout.
    ForceResume,
    QueueTimeout,
    TtlExpiry,
    Release,
    IdleFinish,
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
    /// The data plane can reach it (health checks pass, breaker closed): new Programs bind to
    /// available ranks while there is one.
    pub available: bool,
    pub used_tokens: u64,
    pub active_programs: u32,
    pub queue: BTreeSet<QueueKey>,
    /// The same requests by arrival (ticket by the scheduler's arrival count): the
    /// longest-waiting first, so `reserved_share` need not scan the queue.
    pub by_arrival: BTreeMap<u64, Ticket>,
    /// The KV the queued requests ask for (their `demand`s summed).
    pub queued_demand: u64,
    pub observation: Option<(f64, Observation)>,
    pub intervals: Window,
    pub growth: Window,
    /// Program slots bound to this rank (so per-rank work never scans every Program).
    pub members: rustc_hash::FxHashSet<usize>,
    /// How many of `members` are finished (`least_program_count` leaves them out).
    pub finished: u32,
    /// Capacity repair flagged Programs at the last observation.
    pub repairing: bool,
    /// Completions and the KV each newly wrote (uncached prompt and output tokens): requests per
    /// second for the force-resume deadline and batch gain, KV per second for shared-prefix
    /// freshness.
    pub throughput: Throughput,
    /// Rounds Programs ran per activation before pausing.
    pub segment_rounds: Window,
    /// The largest shared prefix observed on this rank and when: Programs reserve only their
    /// private tokens, so admission counts this prefix once for the whole rank while fresh.
    pub shared_prefix: Option<(u64, f64)>,
    /// The lead key of the Program that made that observation.
    pub shared_lead: Option<u64>,
    /// The router's ledger when the last observation arrived (diagnostics).
    pub used_at_observation: u64,
    /// Adaptive overcommit: how far past `low_watermark_ratio` admission goes now
    /// (`overcommit.rs`).
    pub overcommit: f64,
    /// A Program came back to this rank to find its prefix evicted since the last observation.
    pub resume_miss: bool,
    /// 1 for each request of a Program coming back to this rank that had held its place since
    /// its previous completion, 0 for one whose Program had paused: all 0 is a hold-free rank.
    pub held_resumes: Window,
    /// Per-request measurements of the latest completions (diagnostics).
    pub requests: RequestWindows,
}

impl RankState {
    fn new(id: String, window: usize) -> Self {
        RankState {
            available: true,
            id,
            used_tokens: 0,
            active_programs: 0,
            queue: BTreeSet::new(),
            by_arrival: BTreeMap::new(),
            queued_demand: 0,
            observation: None,
            intervals: Window::new(window),
            growth: Window::new(window),
            members: Default::default(),
            finished: 0,
            repairing: false,
            throughput: Throughput::new(window),
            segment_rounds: Window::new(window),
            shared_prefix: None,
            shared_lead: None,
            used_at_observation: 0,
            overcommit: 0.0,
            resume_miss: false,
            held_resumes: Window::new(window),
            requests: RequestWindows::new(window),
        }
    }

    /// Queues retained request `r` here: in queue order and in the arrival index.
    fn enqueue(&mut self, r: &Retained) {
        if self.queue.insert(r.key) {
            self.queued_demand = self.queued_demand.saturating_add(r.demand);
        }
        self.by_arrival.insert(r.arrival, r.key.ticket);
    }

    /// Takes retained request `r` out of this rank's queue and arrival index.
    fn dequeue(&mut self, r: &Retained) {
        if self.queue.remove(&r.key) {
            self.queued_demand = self.queued_demand.saturating_sub(r.demand);
        }
        self.by_arrival.remove(&r.arrival);
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
    /// Requests admitted past a queue head that did not fit (`queue_backfill_depth`).
    pub backfill_admissions: u64,
    /// Forced requests admitted on the engine's KV report (`force_resume_engine_grace_seconds`).
    pub engine_room_admissions: u64,
    /// Requests admitted past the ledger on a hold-free rank (`hold_free_admission_slack_ratio`).
    pub hold_free_admissions: u64,
    /// Paused Programs presumed finished after idling past `finished_idle_ratio` × the longest
    /// observed interval.
    pub idle_finishes: u64,
    pub pauses: FxHashMap<&'static str, u64>,
}

/// A rank as an admission saw it: what was reserved and what the ledger and the backend said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmitSnapshot {
    /// Tokens the admission reserved for the Program.
    pub required: u64,
    /// The growth-reserve part of `required`.
    pub growth_reserve: u64,
    /// The rank's ledger before the admission.
    pub used_before: u64,
    /// The rank's token capacity, when one is known.
    pub capacity: Option<u64>,
    /// The rank's latest backend observation and its age in seconds, when there is one.
    pub observation: Option<(f64, Observation)>,
}

/// Where an acting TTL came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlSource {
    /// The request's `kv_retention_ttl_seconds`.
    Request,
    /// The automatic TTL fitted to the rank's return intervals.
    Fitted,
}

impl TtlSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TtlSource::Request => "request",
            TtlSource::Fitted => "fitted",
        }
    }
}

/// Something worth logging or counting that happened during an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    Admit {
        program: String,
        rank: Rank,
        forced: bool,
        /// What the rank looked like when it admitted.
        at: AdmitSnapshot,
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
    /// The acting TTL armed on a completion (0: the automatic TTL chose not to hold the KV).
    TtlArmed {
        program: String,
        rank: Rank,
        seconds: f64,
        /// The request's own `kv_retention_ttl_seconds`, or the automatic (fitted) TTL.
        source: TtlSource,
    },
    /// A bound shed something: a request refused (`request_pool_full`, `programs_full`), an
    /// idle Program forgotten to make room (`program_evicted`), a tool call left unlabeled
    /// past `max_tools` (`tool_unlabeled`) or a kind's sizes forgotten for a new kind
    /// (`kind_replaced`; `kind_replaced_unsettled` for a kind short of the samples that could
    /// set it apart).
    Shed {
        reason: &'static str,
    },
    /// A paused Program idled past `finished_idle_ratio` and now counts as finished.
    IdleFinish {
        program: String,
        rank: Rank,
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
    /// A Program that held its place since its previous completion, whose previous completion
    /// reported a cache hit, got less than half of its previous context from the cache: the
    /// backend evicted what the router kept (`unexpected_cache_discontinuity`).
    CacheDiscontinuity {
        program: String,
        rank: Rank,
        /// The previous context, which should have been cached, and what was.
        expected: u64,
        cached: u64,
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
    /// A request passed the head of its rank's queue, which did not fit
    /// (`queue_backfill_depth`).
    Backfill {
        rank: Rank,
    },
    /// A forced request was admitted on the engine's KV report, past the ledger
    /// (`force_resume_engine_grace_seconds`).
    EngineRoom {
        rank: Rank,
    },
    /// A request was admitted past the ledger on a hold-free rank
    /// (`hold_free_admission_slack_ratio`).
    HoldFree {
        rank: Rank,
    },
}

/// The scheduler.
pub struct Scheduler {
    pub(crate) cfg: ProgramSchedulingConfig,
    pub(crate) ranks: Vec<RankState>,
    pub(crate) programs: Vec<Option<Box<Program>>>,
    free_slots: Vec<usize>,
    index: FxHashMap<(String, String), usize>,
    retained: FxHashMap<Ticket, Retained>,
    in_flight: FxHashMap<Ticket, InFlight>,
    timers: BinaryHeap<Reverse<Timer>>,
    /// The heap size at which timers that can no longer act are swept out.
    timers_compact_at: usize,
    /// The heap's length after its last sweep (a tick does not sweep it again unchanged).
    timers_swept_len: usize,
    arrivals: i64,
    rr: usize,
    pub counters: Counters,
    pub notes: Vec<Note>,
    /// All ranks' intervals, for `ttl_evidence: pooled`.
    pub(crate) pooled_intervals: Window,
    /// Intervals per tool called (`tool_ttl_min_samples`).
    pub(crate) tools: tools::Tools,
    /// Ended Programs' totals per kind (`resume_order: kind_size`).
    kinds: kinds::Kinds,
    /// Start-time fair queueing: each tenant's last finish tag, and the virtual time (start tag
    /// of the latest request to enter service), in weighted tokens.
    tenant_finish: FxHashMap<String, u64>,
    virtual_time: u64,
    /// Which prompt blocks each rank has seen (`cache_aware` binding only).
    prefix: PrefixIndex,
    /// The highest timer generation of any Program removed: a Program placed in a freed slot
    /// starts above it, so a timer armed for the slot's previous occupant never fires on it.
    retired_gen: u64,
    /// The `consistent_hash` binding's ring over the ranks.
    ring: crate::hash::Ring,
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
        let tools = tools::Tools::new(cfg.max_tools, w);
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
            in_flight: FxHashMap::default(),
            timers: BinaryHeap::new(),
            timers_compact_at: timers::MIN_TIMER_SWEEP,
            timers_swept_len: 0,
            arrivals: 0,
            rr: 0,
            counters: Counters::default(),
            notes: Vec::new(),
            pooled_intervals: Window::new(w),
            tools,
            kinds: kinds::Kinds::new(w),
            tenant_finish: FxHashMap::default(),
            virtual_time: 0,
            prefix: PrefixIndex::default(),
            retired_gen: 0,
            ring: crate::hash::Ring::default(),
        }
        .with_ring()
    }

    /// Rebuilds the `consistent_hash` binding ring over the ranks (`hash_virtual_nodes` each).
    fn with_ring(mut self) -> Self {
        self.rebuild_ring();
        self
    }

    pub(super) fn rebuild_ring(&mut self) {
        let ids = self.ranks.iter().map(|r| r.id.as_str());
        self.ring = crate::hash::Ring::new(ids, self.cfg.hash_virtual_nodes);
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

    fn program(&self, slot: usize) -> &Program {
        self.programs[slot].as_ref().expect("live program slot")
    }

    fn program_mut(&mut self, slot: usize) -> &mut Program {
        self.programs[slot].as_mut().expect("live program slot")
    }

    /// Drains the notes gathered since the last call.
    pub fn take_notes(&mut self) -> Vec<Note> {
        std::mem::take(&mut self.notes)
    }
}
