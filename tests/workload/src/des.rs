//! Discrete-event harness: the production scheduler core and vllm-sim's engine model, driven in
//! virtual time with no HTTP, so that a workload of hours replays in seconds and every run is
//! deterministic.
//!
//! Owns the event loop (turn arrivals, engine steps, scheduler timers, periodic backend
//! observations), the token content of each Program (shared system prompts, appends, the engine's
//! own generated tokens), and the report (token hit rate from the engines' counters, JCT, queue
//! wait, scheduler cost per event).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use program_router::config::ProgramSchedulingConfig;
use program_router::program::identity::Identity;
use program_router::program::scheduler::{
    Arrival, Decision, Observation, Scheduler, ToolCall, Usage,
};
use rustc_hash::FxHashMap;
use serde::Serialize;
use vllm_sim::engine::{Engine, EngineEvent, EngineParams, SeqRequest};
use vllm_sim::kv::extend_block_hashes;
use vllm_sim::tokenizer::splitmix;

use crate::workload::{SPAWN_DELAY_SECONDS, Turn, programs};

/// How requests are placed.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Each Program hashed to one rank, dispatched at once (the request-level baseline).
    ConsistentHash,
    /// The Program scheduler with this configuration.
    Program(Box<ProgramSchedulingConfig>),
}

impl Mode {
    pub fn name(&self) -> String {
        match self {
            Mode::ConsistentHash => "consistent_hash".into(),
            Mode::Program(c) if c.binding_only => "program binding_only".into(),
            Mode::Program(_) => "program scheduling".into(),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: String,
    pub programs: usize,
    pub programs_completed: usize,
    pub programs_truncated: usize,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub token_hit_rate: f64,
    pub mean_jct_seconds: f64,
    pub p50_jct_seconds: f64,
    pub p90_jct_seconds: f64,
    pub p99_jct_seconds: f64,
    pub mean_queue_wait_seconds: f64,
    pub p99_queue_wait_seconds: f64,
    pub makespan_seconds: f64,
    pub preemptions: u64,
    /// KV demand: the contexts of all live Programs (running, queued or in a tool call) over
    /// the cluster's KV capacity, sampled over the run — its 90th percentile, and the share of
    /// the run during which it exceeded 1 (when no placement or admission could keep every
    /// live Program's prefix cached).
    pub kv_demand_p90: f64,
    pub kv_demand_over_capacity: f64,
    /// KV blocks held by running requests over the cluster's KV, mean over the run's samples
    /// (cached blocks no request holds do not count, as in vLLM's `kv_cache_usage_perc`).
    pub mean_kv_usage: f64,
    /// Where the reusable tokens of later turns were lost, in tokens.
    pub missed: MissedHit,
    /// The offline bound replayed on this run's own timeline (when each request was dispatched
    /// and finished) with the ranks' KV pooled: what one shared cache would have kept of this
    /// very run, by eviction rule. Its gap to `token_hit_rate` is what partitioned ranks and
    /// the engine's LRU cost; its gap to the bound on the oracle's timeline is what this run's
    /// timing (queueing, batching) cost.
    pub pooled_on_run: crate::kv_bound::KvBound,
    pub queue_timeouts: u64,
    pub force_resumes: u64,
    pub scheduler_events: u64,
    pub scheduler_median_us: f64,
    pub scheduler_p99_us: f64,
    pub wall_seconds: f64,
    /// Distributions and time series for the HTML report.
    #[serde(skip)]
    pub series: Series,
}

/// Where reusable tokens were lost: for each turn after a Program's first, its previous context
/// (what H* counts as reusable) less what the engine found cached, by what happened between the
/// two turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MissedHit {
    /// The turn ran on another rank than the Program's previous turn (a cross-rank resume).
    pub moved: u64,
    /// Same rank, after a tool gap under 2 s, of 2–10 s, and of 10 s or more.
    pub gap_under_2s: u64,
    pub gap_2_to_10s: u64,
    pub gap_10s_or_more: u64,
}

impl MissedHit {
    fn add(&mut self, moved: bool, gap: f64, tokens: u64) {
        let bucket = if moved {
            &mut self.moved
        } else if gap < 2.0 {
            &mut self.gap_under_2s
        } else if gap < 10.0 {
            &mut self.gap_2_to_10s
        } else {
            &mut self.gap_10s_or_more
        };
        *bucket += tokens;
    }
}

/// What the report plots: ascending JCTs and queue waits, and samples over time of the token
/// cache hit so far and each rank's KV usage.
#[derive(Debug, Clone, Default)]
pub struct Series {
    pub jcts: Vec<f64>,
    pub waits: Vec<f64>,
    /// (seconds, cumulative token hit rate)
    pub hit: Vec<(f64, f64)>,
    /// Per rank: (seconds, KV usage 0..1)
    pub kv_usage: Vec<Vec<(f64, f64)>>,
    /// Legend of each `kv_usage` line (default: "rank i").
    pub kv_names: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Observe,
    Arrive(usize),
}

struct Prog {
    turns: Vec<Turn>,
    next: usize,
    /// The context so far (moved into the engine while a request runs, and back with its output).
    history: Vec<u32>,
    /// Chained block hashes of `history`'s full blocks, extended turn by turn (the engine would
    /// otherwise rehash the whole context on every request).
    hashes: Vec<u64>,
    prompt: Vec<u32>,
    rank: usize,
    /// The latest dispatch went to another rank than the one before it.
    moved: bool,
    /// Dispatch and finish time of each turn so far (finish NaN while it runs).
    times: Vec<(f64, f64)>,
    started: f64,
    arrived_at: f64,
    done: bool,
    /// Subagents: the parent's index and whether the parent waits for this one.
    parent: Option<usize>,
    blocks_parent: bool,
    /// Subagents to start when the turn with this step completes.
    children_after: FxHashMap<u32, Vec<usize>>,
    /// Blocking subagents still running, and when the parent's own tool gap ends.
    blockers: u32,
    ready_at: f64,
    /// Tokens its context holds: the last prompt plus the output asked for (0 before its first
    /// turn).
    context: usize,
}

fn token(a: u64, b: u64, i: u64) -> u32 {
    (splitmix(a.wrapping_mul(0x9E37_79B9).wrapping_add(b) ^ i.wrapping_mul(0xC2B2_AE3D)) >> 32)
        as u32
}

/// The mean of `v`; 0 when empty.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The `q` quantile of ascending `sorted` (nearest rank); 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A request's scheduler ticket: unique per (Program, turn), as the router's are per request —
/// a reused ticket would let a timer armed for an earlier turn (force resume, queue timeout)
/// act on a later one.
fn ticket_of(program: usize, step: u32) -> u64 {
    (program as u64) << 20 | u64::from(step)
}

/// The Program a ticket belongs to.
fn program_of(ticket: u64) -> usize {
    (ticket >> 20) as usize
}

fn rank_of(program: &str, ranks: usize) -> usize {
    (0..ranks)
        .max_by_key(|r| program_router::policies::stable_hash(format!("{program}#r{r}").as_bytes()))
        .unwrap_or(0)
}

/// The block chain the router would compute for a prompt: token ids as little-endian bytes, so
/// a 64-byte block is 16 tokens.
fn prefix_chain(prompt: &[u32]) -> Vec<u64> {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    program_router::policies::prefix_index::PrefixIndex::chain(&bytes)
}

/// The prompt's lead key, as the router computes it from the bytes it is sent (of the system
/// prompt alone, its kind's key).
fn prompt_lead(prompt: &[u32]) -> Option<u64> {
    let n = prompt
        .len()
        .min(program_router::program::scheduler::LEAD_BYTES / 4);
    let bytes: Vec<u8> = prompt[..n].iter().flat_map(|t| t.to_le_bytes()).collect();
    program_router::program::scheduler::lead_key(&bytes)
}

pub use crate::clients::{Clients, clairvoyant_ttl};

/// Replays `turns` on `ranks` simulated ranks shaped by `engine`.
pub fn run(turns: &[Turn], ranks: usize, engine: &EngineParams, mode: &Mode) -> Report {
    run_with(turns, ranks, engine, mode, &Clients::default())
}

/// [`run`] with clients that send more than the workload says.
pub fn run_with(
    turns: &[Turn],
    ranks: usize,
    engine: &EngineParams,
    mode: &Mode,
    clients: &Clients,
) -> Report {
    let wall = Instant::now();
    let classes = match clients.work_left {
        crate::clients::WorkLeft::ClassMean => crate::clients::Classes::new(turns),
        _ => crate::clients::Classes::default(),
    };
    let mut engines: Vec<Engine> = (0..ranks)
        .map(|_| {
            let mut e = Engine::new(engine.clone());
            e.set_token_events(false);
            e
        })
        .collect();
    // When each engine next has something to report (its step in progress ends, or it has work
    // and no step), kept current after every advance and submit: only engines due are advanced.
    let mut next_at: Vec<f64> = vec![f64::INFINITY; ranks];
    let mut sched = match mode {
        Mode::Program(c) => Some(Scheduler::new(
            (**c).clone(),
            (0..ranks).map(|r| format!("r{r}")).collect(),
        )),
        Mode::ConsistentHash => None,
    };
    let interval = match mode {
        Mode::Program(c) => c.metrics_interval_seconds,
        Mode::ConsistentHash => f64::INFINITY,
    };
    let cache_binding = matches!(mode, Mode::Program(c)
        if c.binding_strategy == program_router::config::program::BindingStrategy::CacheAware);
    let mut progs: Vec<Prog> = programs(turns)
        .into_iter()
        .map(|t| Prog {
            rank: 0,
            moved: false,
            times: Vec::new(),
            started: t[0].program_arrival,
            arrived_at: 0.0,
            turns: t,
            next: 0,
            history: Vec::new(),
            hashes: Vec::new(),
            prompt: Vec::new(),
            done: false,
            parent: None,
            blocks_parent: false,
            children_after: FxHashMap::default(),
            blockers: 0,
            ready_at: 0.0,
            context: 0,
        })
        .collect();
    // Subagents start when their parent's turn completes, not at their arrival time.
    let index: FxHashMap<String, usize> = progs
        .iter()
        .enumerate()
        .map(|(i, p)| (p.turns[0].program_id.clone(), i))
        .collect();
    for i in 0..progs.len() {
        let t = &progs[i].turns[0];
        let (parent, step, blocks) = (
            t.parent_program_id
                .as_ref()
                .and_then(|x| index.get(x).copied()),
            t.spawned_after_step.unwrap_or(0),
            t.blocks_parent,
        );
        if let Some(pi) = parent {
            progs[i].parent = Some(pi);
            progs[i].blocks_parent = blocks;
            progs[pi].children_after.entry(step).or_default().push(i);
        }
    }
    let mut heap: BinaryHeap<Reverse<(i64, Ev)>> = BinaryHeap::new();
    let at = |t: f64| (t * 1e6).round() as i64;
    for (i, p) in progs.iter().enumerate() {
        if p.parent.is_none() {
            heap.push(Reverse((at(p.started), Ev::Arrive(i))));
        }
    }
    // Programs that ended this instant (their parents and unspawned children need attention).
    let mut ended: Vec<usize> = Vec::new();
    if interval.is_finite() {
        heap.push(Reverse((0, Ev::Observe)));
    }
    // (rank, engine seq id) → program; ticket → program.
    let mut seqs: FxHashMap<(usize, u64), usize> = FxHashMap::default();
    let mut sched_ns: Vec<u32> = Vec::new();
    let mut missed = MissedHit::default();
    let (mut jcts, mut waits) = (Vec::new(), Vec::new());
    let (mut requests, mut truncated, mut completed, mut open) =
        (0u64, 0usize, 0usize, progs.len());
    let mut events = Vec::new();
    let mut happened: Vec<(usize, EngineEvent)> = Vec::new();
    let mut now = 0.0f64;
    let timed = |ns: &mut Vec<u32>, start: Instant| {
        ns.push(start.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32)
    };

    macro_rules! dispatch {
        ($ds:expr, $now:expr) => {
            for d in $ds {
                match d {
                    Decision::Dispatch { ticket, rank } => {
                        let i = program_of(ticket);
                        let p = &mut progs[i];
                        p.moved = p.next > 0 && p.rank != rank;
                        p.times.push(($now, f64::NAN));
                        p.rank = rank;
                        waits.push($now - p.arrived_at);
                        let turn = &p.turns[p.next];
                        let seed = splitmix((i as u64) << 20 | u64::from(turn.step));
                        extend_block_hashes(&p.prompt, engine.block_size, &mut p.hashes);
                        let id = engines[rank].submit(
                            SeqRequest {
                                prompt: std::mem::take(&mut p.prompt),
                                max_tokens: turn.output_tokens,
                                priority: 0,
                                output_seed: seed,
                                prefix_hashes: p.hashes.clone(),
                            },
                            $now,
                        );
                        next_at[rank] = engines[rank].next_event_time().unwrap_or(f64::INFINITY);
                        seqs.insert((rank, id), i);
                        requests += 1;
                    }
                    Decision::Reject { ticket, .. } => {
                        // Queue timeout: the Program gives up (counted, not completed).
                        let p = &mut progs[program_of(ticket)];
                        p.done = true;
                        open -= 1;
                        ended.push(program_of(ticket));
                    }
                }
            }
        };
    }

    // Samples for the report, about 200 over the run.
    let horizon = progs
        .iter()
        .map(|p| {
            p.turns.iter().map(|t| t.gap_after).sum::<f64>()
                + p.turns.first().map_or(0.0, |t| t.program_arrival)
        })
        .fold(0.0, f64::max)
        .max(1.0);
    let sample_every = horizon / 200.0;
    let mut next_sample = 0.0f64;
    let mut hit_series: Vec<(f64, f64)> = Vec::new();
    let mut kv_series: Vec<Vec<(f64, f64)>> = vec![Vec::new(); engines.len()];
    // Live Programs' contexts over the cluster's KV, per sample.
    let mut demand: Vec<f64> = Vec::new();

    while open > 0 {
        if now >= next_sample {
            for (r, e) in engines.iter_mut().enumerate() {
                e.sync(now);
                next_at[r] = e.next_event_time().unwrap_or(f64::INFINITY);
            }
            let (p, c) = engines.iter().fold((0usize, 0usize), |(p, c), e| {
                let s = e.stats();
                (
                    p + s.prompt_tokens as usize,
                    c + s.prompt_tokens_cached as usize,
                )
            });
            if p > 0 {
                hit_series.push((now, c as f64 / p as f64));
            }
            for (r, e) in engines.iter().enumerate() {
                kv_series[r].push((now, e.load().kv_usage));
            }
            let live: usize = progs.iter().filter(|p| !p.done).map(|p| p.context).sum();
            demand.push(live as f64 / (engine.token_capacity() * ranks) as f64);
            next_sample = now + sample_every;
        }
        // The next instant anything happens.
        let mut next = heap.peek().map(|Reverse((t, _))| *t as f64 / 1e6);
        let due = next_at.iter().copied().fold(f64::INFINITY, f64::min);
        if due.is_finite() {
            next = Some(next.map_or(due, |n: f64| n.min(due)));
        }
        if let Some(s) = &sched
            && let Some(t) = s.next_deadline()
        {
            next = Some(next.map_or(t, |n: f64| n.min(t)));
        }
        let Some(t) = next else { break };
        now = t.max(now);

        // Engine steps that end now: completions.
        happened.clear();
        for (r, e) in engines.iter_mut().enumerate() {
            if next_at[r] > now {
                continue;
            }
            e.advance(now, &mut events);
            next_at[r] = e.next_event_time().unwrap_or(f64::INFINITY);
            happened.extend(events.drain(..).map(|ev| (r, ev)));
        }
        {
            for (r, ev) in happened.drain(..) {
                match ev {
                    EngineEvent::Token { .. } => {}
                    EngineEvent::Finished {
                        id,
                        outcome,
                        tokens,
                    } => {
                        let Some(i) = seqs.remove(&(r, id)) else {
                            continue;
                        };
                        let p = &mut progs[i];
                        if let Some(last) = p.times.last_mut() {
                            last.1 = now;
                        }
                        if p.next > 0 {
                            let turn = &p.turns[p.next];
                            // Whole blocks only, never the last prompt token (as H* counts).
                            let prompt = outcome.prompt_tokens as u64;
                            let bs = engine.block_size as u64;
                            let reusable = prompt
                                .saturating_sub(u64::from(turn.append_tokens))
                                .min(prompt.saturating_sub(1))
                                / bs
                                * bs;
                            missed.add(
                                p.moved,
                                p.turns[p.next - 1].gap_after,
                                reusable.saturating_sub(outcome.cached_tokens as u64),
                            );
                        }
                        let done_ticket = ticket_of(i, p.turns[p.next].step);
                        p.history = tokens;
                        let gap = p.turns[p.next].gap_after;
                        let step = p.turns[p.next].step;
                        let tool = p.turns[p.next].tool.clone();
                        p.next += 1;
                        // Subagents spawned after this turn start now; blocking ones hold the
                        // parent's next turn.
                        let kids = p.children_after.remove(&step).unwrap_or_default();
                        let mut blocking = 0;
                        for c in kids {
                            let start = now + SPAWN_DELAY_SECONDS;
                            progs[c].started = start;
                            blocking += u32::from(progs[c].blocks_parent);
                            heap.push(Reverse((at(start), Ev::Arrive(c))));
                        }
                        let p = &mut progs[i];
                        p.blockers += blocking;
                        p.ready_at = now + gap;
                        let finished = p.next >= p.turns.len();
                        if let Some(s) = sched.as_mut() {
                            let u = Usage {
                                prompt_tokens: outcome.prompt_tokens as u64,
                                completion_tokens: u64::from(outcome.completion_tokens),
                                cached_tokens: outcome.cached_tokens as u64,
                            };
                            let start = Instant::now();
                            // The engine's whole response is known here: no tool is none.
                            let called = tool.as_deref().map_or(ToolCall::None, ToolCall::Named);
                            let ds = s.on_complete_with_tool(now, done_ticket, Some(u), called);
                            timed(&mut sched_ns, start);
                            dispatch!(ds, now);
                        }
                        let p = &mut progs[i];
                        if finished {
                            // Its blocks past the shared system prompt (an engine told of the
                            // end evicts them first; others ignore it). A subagent's copy of its
                            // parent's prompt counts as its own, so there the bound is pessimistic.
                            let shared = p.turns[0].system_tokens as usize / engine.block_size;
                            engines[r].program_ended(p.hashes.get(shared..).unwrap_or(&[]));
                            p.done = true;
                            open -= 1;
                            completed += 1;
                            jcts.push(now - p.started);
                            ended.push(i);
                        } else if p.blockers == 0 {
                            heap.push(Reverse((at(now + gap), Ev::Arrive(i))));
                        }
                    }
                }
            }
        }

        // Arrivals and observations due now.
        while let Some(Reverse((t_ev, ev))) = heap.peek().copied() {
            if t_ev > at(now) {
                break;
            }
            heap.pop();
            match ev {
                Ev::Observe => {
                    if let Some(s) = sched.as_mut() {
                        let loads: Vec<Observation> = engines
                            .iter_mut()
                            .enumerate()
                            .map(|(r, e)| {
                                e.sync(now);
                                next_at[r] = e.next_event_time().unwrap_or(f64::INFINITY);
                                let l = e.load();
                                Observation {
                                    waiting: l.waiting as f64,
                                    running: l.running as f64,
                                    kv_usage: l.kv_usage,
                                    token_capacity: Some(e.params().token_capacity() as u64),
                                }
                            })
                            .collect();
                        for (r, obs) in loads.into_iter().enumerate() {
                            let start = Instant::now();
                            let ds = s.on_observation(now, r, obs);
                            timed(&mut sched_ns, start);
                            dispatch!(ds, now);
                        }
                        if open > 0 {
                            heap.push(Reverse((at(now + interval), Ev::Observe)));
                        }
                    }
                }
                Ev::Arrive(i) => {
                    let p = &mut progs[i];
                    if p.done {
                        continue;
                    }
                    let turn = &p.turns[p.next];
                    if p.history.is_empty() {
                        p.history.extend(
                            (0..turn.system_tokens)
                                .map(|k| token(1, u64::from(turn.system_prompt), u64::from(k))),
                        );
                    }
                    let pid = i as u64 + 1_000;
                    // Room for the append and the output, so neither the extension nor the
                    // engine's sequence reallocates.
                    p.history
                        .reserve(turn.append_tokens as usize + turn.output_tokens as usize);
                    p.history.extend(
                        (0..turn.append_tokens)
                            .map(|k| token(pid, u64::from(turn.step), u64::from(k))),
                    );
                    if p.history.len() + turn.output_tokens as usize > engine.max_model_len {
                        // The context outgrew the model: the Program ends here.
                        p.done = true;
                        open -= 1;
                        truncated += 1;
                        jcts.push(now - p.started);
                        ended.push(i);
                        continue;
                    }
                    p.prompt = std::mem::take(&mut p.history);
                    p.context = p.prompt.len() + turn.output_tokens as usize;
                    p.arrived_at = now;
                    match sched.as_mut() {
                        Some(s) => {
                            let identity = Identity {
                                program_id: turn.program_id.clone(),
                                parent_program_id: turn.parent_program_id.clone(),
                                blocks_parent: p.blocks_parent,
                                root_program_id: Some(turn.root_program_id().to_string()),
                                task_id: (!clients.headers_only).then(|| turn.task_id.clone()),
                                step_id: (!clients.headers_only).then_some(u64::from(turn.step)),
                                expected_resume: clients.headers_only || p.next + 1 < p.turns.len(),
                                resume_stated: !clients.headers_only,
                                kv_retention_ttl_seconds: clients.ttl(
                                    p.context,
                                    turn.gap_after,
                                    engine,
                                    mode,
                                ),
                                priority: clients.priority(&p.turns, p.next, &classes),
                                ..Default::default()
                            };
                            let a = Arrival {
                                ticket: ticket_of(i, turn.step),
                                model: "sim".into(),
                                identity,
                                prompt_tokens: p.prompt.len() as u64,
                                tenant: None,
                                prefix: if cache_binding {
                                    prefix_chain(&p.prompt)
                                } else {
                                    Vec::new()
                                },
                                lead: prompt_lead(&p.prompt),
                                system: prompt_lead(
                                    &p.prompt[..p.prompt.len().min(turn.system_tokens as usize)],
                                ),
                            };
                            let start = Instant::now();
                            let ds = s.on_arrival(now, a);
                            timed(&mut sched_ns, start);
                            dispatch!(ds, now);
                        }
                        None => {
                            let rank = rank_of(&turn.program_id, ranks);
                            dispatch!(
                                [Decision::Dispatch {
                                    ticket: ticket_of(i, turn.step),
                                    rank
                                }],
                                now
                            );
                        }
                    }
                }
            }
        }

        if let Some(s) = sched.as_mut() {
            let start = Instant::now();
            let ds = s.on_tick(now);
            timed(&mut sched_ns, start);
            dispatch!(ds, now);
        }

        // Dependencies of what ended: a parent waiting on its last blocking subagent resumes
        // (after its own tool gap); subagents a parent never reached are abandoned.
        while let Some(i) = ended.pop() {
            // Its context is no longer needed (a long replay would otherwise keep every one).
            let p = &mut progs[i];
            (p.history, p.hashes, p.prompt) = (Vec::new(), Vec::new(), Vec::new());
            if let (Some(pi), true) = (progs[i].parent, progs[i].blocks_parent) {
                let parent = &mut progs[pi];
                parent.blockers = parent.blockers.saturating_sub(1);
                if parent.blockers == 0 && !parent.done {
                    heap.push(Reverse((at(parent.ready_at.max(now)), Ev::Arrive(pi))));
                }
            }
            let orphans: Vec<usize> = progs[i]
                .children_after
                .drain()
                .flat_map(|(_, v)| v)
                .collect();
            for c in orphans {
                if !progs[c].done {
                    progs[c].done = true;
                    open -= 1;
                    truncated += 1;
                    ended.push(c);
                }
            }
        }
    }

    let (mut prompt, mut cached, mut output, mut preempt) = (0, 0, 0, 0);
    for e in &engines {
        let s = e.stats();
        prompt += s.prompt_tokens;
        cached += s.prompt_tokens_cached;
        output += s.generation_tokens;
        preempt += s.preemptions;
    }
    jcts.sort_by(f64::total_cmp);
    waits.sort_by(f64::total_cmp);
    demand.sort_by(f64::total_cmp);
    let mut ns: Vec<f64> = sched_ns.iter().map(|x| f64::from(*x) / 1000.0).collect();
    ns.sort_by(f64::total_cmp);
    let counters = sched
        .as_ref()
        .map(|s| s.counters.clone())
        .unwrap_or_default();
    // The replay's own time, without the bound below.
    let wall_seconds = wall.elapsed().as_secs_f64();
    let pooled_on_run = crate::kv_bound::on_timeline(
        turns,
        engine,
        ranks,
        progs
            .iter_mut()
            .map(|p| std::mem::take(&mut p.times))
            .collect(),
    );
    Report {
        mode: mode.name(),
        programs: progs.len(),
        programs_completed: completed,
        programs_truncated: truncated,
        requests,
        prompt_tokens: prompt,
        cached_tokens: cached,
        output_tokens: output,
        token_hit_rate: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        mean_jct_seconds: mean(&jcts),
        p50_jct_seconds: percentile(&jcts, 0.5),
        p90_jct_seconds: percentile(&jcts, 0.9),
        p99_jct_seconds: percentile(&jcts, 0.99),
        mean_queue_wait_seconds: mean(&waits),
        p99_queue_wait_seconds: percentile(&waits, 0.99),
        makespan_seconds: now,
        preemptions: preempt,
        kv_demand_p90: percentile(&demand, 0.9),
        kv_demand_over_capacity: demand.iter().filter(|d| **d > 1.0).count() as f64
            / demand.len().max(1) as f64,
        mean_kv_usage: mean(
            &kv_series
                .iter()
                .flatten()
                .map(|(_, u)| *u)
                .collect::<Vec<f64>>(),
        ),
        missed,
        pooled_on_run,
        queue_timeouts: counters.queue_timeouts,
        force_resumes: counters.force_resumes,
        scheduler_events: ns.len() as u64,
        scheduler_median_us: percentile(&ns, 0.5),
        scheduler_p99_us: percentile(&ns, 0.99),
        wall_seconds,
        series: Series {
            jcts: jcts.clone(),
            waits: waits.clone(),
            hit: hit_series,
            kv_usage: kv_series,
            kv_names: Vec::new(),
        },
    }
}
