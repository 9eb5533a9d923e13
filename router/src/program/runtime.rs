//! The driver of Program scheduling: the only place where the pure scheduler meets time, locks,
//! waiting requests, metrics and logs.
//!
//! Owns the ticket → waiter map, the clock (seconds since start), the tick loop that fires TTLs,
//! force resumes and queue timeouts, the bytes → tokens estimate learned from usage, and the
//! `vllm_router_agent_aware_*` series. Holds its lock only around scheduler calls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::sync::{Notify, oneshot};

use super::metrics::{MODEL_POOL, ProgramMetrics};
use crate::config::ProgramSchedulingConfig;
use crate::policies::prefix_index::PrefixIndex;
use crate::program::diagnostics::{Diagnostics, RankInfo, snapshot};
use crate::program::identity::Identity;
use crate::program::scheduler::{
    Arrival, Decision, HandedOver, Note, Observation, Rank, RejectReason, Scheduler, Ticket,
    ToolCall, Usage, lead_key,
};

/// The scheduler's ranks as the data plane knows them: target ids (what a decision names), base
/// URLs for diagnostics, per-rank gauges and observation freshness. Changes with `retarget`.
struct Layout {
    ids: Vec<String>,
    info: Vec<RankInfo>,
    /// Per-rank gauges (queue size, active Programs, used tokens), resolved once per layout.
    gauges: Vec<[prometheus::IntGauge; 3]>,
    /// Whether each rank's backend observation is fresh; `None` until known (see `freshness`).
    fresh: Vec<Option<bool>>,
    /// When each rank joined (scheduler seconds): one that never reports is stale from then.
    joined: Vec<f64>,
}

/// A target as Program scheduling sees it: id, base URL, DP rank.
pub type TargetInfo = (String, String, Option<u32>);

impl Layout {
    /// The layout of `targets` at scheduler time `now`; targets of `old` keep their state.
    fn new(
        targets: &[TargetInfo],
        metrics: &ProgramMetrics,
        old: Option<&Layout>,
        now: f64,
    ) -> Self {
        let ids: Vec<String> = targets.iter().map(|t| t.0.clone()).collect();
        let info = targets
            .iter()
            .map(|t| RankInfo {
                base_url: t.1.clone(),
                dp_rank: t.2,
            })
            .collect();
        let gauges = ids
            .iter()
            .map(|id| {
                metrics.queue_wait.touch(id);
                [
                    metrics.queue_size.with_label_values(&[id]),
                    metrics.active_programs.with_label_values(&[id]),
                    metrics.used_tokens.with_label_values(&[id]),
                ]
            })
            .collect();
        // A surviving target keeps its freshness, so fallback/recovery events stay one each.
        let kept: Vec<Option<usize>> = ids
            .iter()
            .map(|id| old.and_then(|o| o.ids.iter().position(|x| x == id)))
            .collect();
        let fresh = kept
            .iter()
            .map(|k| k.and_then(|i| old.and_then(|o| o.fresh[i])))
            .collect();
        let joined = kept
            .iter()
            .map(|k| k.and_then(|i| old.map(|o| o.joined[i])).unwrap_or(now))
            .collect();
        Layout {
            ids,
            info,
            gauges,
            fresh,
            joined,
        }
    }
}

struct Inner {
    sched: Scheduler,
    waiters: FxHashMap<Ticket, oneshot::Sender<Placement>>,
    tokens_per_byte: f64,
    layout: Layout,
    /// When the rolling windows' gauges are published next (scheduler seconds).
    rolling_at: f64,
}

/// Where a request goes, named by target id so that it stays meaningful across a reload that
/// re-orders or changes the targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Dispatch to this target.
    Target(String),
    /// Retained longer than the queue timeout (or the request's deadline).
    QueueTimeout,
    /// No target is configured.
    NoTarget,
    /// The RequestPool is full (`max_retained_requests`).
    PoolFull,
    /// `max_programs` Programs are held, none idle.
    ProgramsFull,
}

/// How a request was admitted.
pub enum Admission {
    /// Decided at once.
    Now(Placement),
    /// Retained: the placement arrives on the receiver (closed if the runtime is retired).
    Wait(oneshot::Receiver<Placement>),
}

/// Program scheduling for one Program-scheduling configuration; its target set follows reloads.
pub struct ProgramRuntime {
    inner: Mutex<Inner>,
    epoch: Instant,
    next_ticket: AtomicU64,
    wake: Notify,
    retired: AtomicBool,
    metrics: ProgramMetrics,
    interval: Duration,
    /// `cache_aware` binding: arrivals carry their prompt's block chain.
    cache_binding: bool,
}

impl ProgramRuntime {
    pub fn new(
        cfg: ProgramSchedulingConfig,
        targets: &[TargetInfo],
        metrics: ProgramMetrics,
    ) -> Arc<Self> {
        let layout = Layout::new(targets, &metrics, None, 0.0);
        let interval = crate::config::duration(cfg.metrics_interval_seconds);
        let cache_binding =
            cfg.binding_strategy == crate::config::program::BindingStrategy::CacheAware;
        Arc::new(ProgramRuntime {
            inner: Mutex::new(Inner {
                sched: Scheduler::new(cfg, layout.ids.clone()),
                waiters: FxHashMap::default(),
                tokens_per_byte: 0.25,
                layout,
                rolling_at: 0.0,
            }),
            epoch: Instant::now(),
            next_ticket: AtomicU64::new(1),
            wake: Notify::new(),
            retired: AtomicBool::new(false),
            metrics,
            interval,
            cache_binding,
        })
    }

    /// The target set changed (same Program-scheduling configuration): Programs, TTLs, windows
    /// and retained requests carry over by target id (see `Scheduler::retarget`). Series of
    /// removed targets are deleted. An empty set is the caller's to handle (retire).
    pub fn retarget(&self, targets: &[TargetInfo]) {
        let mut g = self.lock();
        let layout = Layout::new(targets, &self.metrics, Some(&g.layout), self.now());
        for id in g.layout.ids.iter().filter(|id| !layout.ids.contains(id)) {
            self.metrics.remove_target(id);
            tracing::info!(event = "program_target_removed", target = %id,
                "target left the set; its Programs are re-homed");
        }
        let now = self.now();
        let ds = g.sched.retarget(now, layout.ids.clone());
        g.layout = layout;
        self.deliver(&mut g, ds, None);
        drop(g);
        self.wake.notify_one();
    }

    /// Takes a changed Program-scheduling configuration in place, keeping Programs, TTLs,
    /// windows and retained requests (see `Scheduler::reconfigure`); false when the change
    /// needs a fresh runtime (`binding_only`, `stats_window_size`, `metrics_interval_seconds`,
    /// or a switch to or from `cache_aware` binding).
    pub fn reconfigure(&self, cfg: &ProgramSchedulingConfig) -> bool {
        let cache_binding =
            cfg.binding_strategy == crate::config::program::BindingStrategy::CacheAware;
        if cache_binding != self.cache_binding
            || crate::config::duration(cfg.metrics_interval_seconds) != self.interval
        {
            return false;
        }
        let mut g = self.lock();
        let now = self.now();
        let Some(ds) = g.sched.reconfigure(now, cfg) else {
            return false;
        };
        self.deliver(&mut g, ds, None);
        drop(g);
        tracing::info!(
            event = "program_scheduling_reconfigured",
            "Program scheduling took the new configuration; Programs, TTLs and retained requests carry over"
        );
        self.wake.notify_one();
        true
    }

    /// The scheduler's state. One left poisoned by a panic is never used again: the caller
    /// panics too, and the HTTP front answers 500 and stops the router ([`RouterState::fail`]).
    ///
    /// [`RouterState::fail`]: crate::state::RouterState::fail
    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::error::locked(&self.inner, "the Program scheduler's state")
    }

    /// Leaves the scheduler's lock poisoned, as a panic while holding it would.
    #[cfg(test)]
    pub(crate) fn poison(&self) {
        std::thread::scope(|s| {
            let _ = s
                .spawn(|| {
                    let _held = self.inner.lock();
                    panic!("a test poisons the scheduler");
                })
                .join();
        });
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Sends decisions to their waiters; returns the one for `own`, if any.
    fn deliver(
        &self,
        g: &mut Inner,
        decisions: Vec<Decision>,
        own: Option<Ticket>,
    ) -> Option<Placement> {
        let mut mine = None;
        for d in decisions {
            let (t, placement) = match d {
                Decision::Dispatch { ticket, rank } => (
                    ticket,
                    match g.layout.ids.get(rank) {
                        Some(id) => {
                            tracing::debug!(event = "request_dispatch", target = %id, ticket);
                            Placement::Target(id.clone())
                        }
                        None => Placement::NoTarget,
                    },
                ),
                Decision::Reject { ticket, reason } => (
                    ticket,
                    match reason {
                        RejectReason::QueueTimeout => Placement::QueueTimeout,
                        RejectReason::NoTarget => Placement::NoTarget,
                        RejectReason::PoolFull => Placement::PoolFull,
                        RejectReason::ProgramsFull => Placement::ProgramsFull,
                    },
                ),
            };
            if Some(t) == own {
                mine = Some(placement);
            } else if let Some(w) = g.waiters.remove(&t) {
                let _ = w.send(placement);
            }
        }
        for note in g.sched.take_notes() {
            self.record(&g.layout.ids, note);
        }
        for (r, g) in g.sched.ranks.iter().zip(&g.layout.gauges) {
            g[0].set(r.queue.len() as i64);
            g[1].set(i64::from(r.active_programs));
            g[2].set(r.used_tokens as i64);
        }
        mine
    }

    fn record(&self, ids: &[String], note: Note) {
        let m = &self.metrics;
        let id = |rank: Rank| ids.get(rank).map_or("", String::as_str);
        match note {
            Note::Admit {
                program,
                rank,
                forced,
                at,
            } => {
                m.admission.observe(id(rank), &at);
                let reason = if forced {
                    "force_resume"
                } else {
                    "program_admit"
                };
                m.transitions.with_label_values(&[id(rank), reason]).inc();
                tracing::info!(event = "program_admit", program = %program, target = %id(rank), forced);
            }
            Note::Pause {
                program,
                rank,
                reason,
            } => {
                m.transitions
                    .with_label_values(&[id(rank), reason.as_str()])
                    .inc();
                tracing::info!(event = "program_pause", program = %program, target = %id(rank), reason = reason.as_str());
            }
            Note::TtlArmed {
                program,
                rank,
                seconds,
                source,
            } => {
                m.armed_ttl
                    .with_label_values(&[id(rank), source.as_str()])
                    .observe(seconds);
                tracing::debug!(event = "ttl_armed", program = %program, target = %id(rank), seconds);
            }
            Note::Shed { reason } => {
                m.shed.with_label_values(&[reason]).inc();
                tracing::debug!(event = "program_scheduling_shed", reason);
            }
            Note::IdleFinish { program, rank } => {
                m.transitions
                    .with_label_values(&[id(rank), "idle_finish"])
                    .inc();
                tracing::debug!(event = "idle_finish", program = %program, target = %id(rank));
            }
            Note::QueueWait { rank, seconds } => m.queue_wait.observe(id(rank), seconds),
            Note::Interval { rank, seconds } => {
                m.interval.with_label_values(&[id(rank)]).observe(seconds);
                tracing::debug!(event = "continuity_sample", target = %id(rank), seconds);
            }
            Note::CacheDiscontinuity {
                program,
                rank,
                expected,
                cached,
            } => {
                tracing::info!(
                    event = "unexpected_cache_discontinuity",
                    program = %program,
                    target = %id(rank),
                    expected_cached_tokens = expected,
                    cached_tokens = cached,
                    "a Program that held its place got less than half of its context from the \
                     cache: the backend evicted it (check the growth reserve and capacity)"
                );
            }
            Note::CacheMissImpact { rank, seconds } => m
                .miss_impact
                .with_label_values(&[id(rank)])
                .observe(seconds),
            Note::ContextGrowth { tokens, .. } => m.growth.observe(tokens.max(0.0)),
            Note::SharedPrefix { rank, tokens } => {
                m.shared_prefix
                    .with_label_values(&[id(rank)])
                    .observe(tokens as f64);
                tracing::debug!(event = "cache_observation", target = %id(rank), shared_prefix_tokens = tokens);
            }
            Note::Backfill { rank } => {
                m.transitions
                    .with_label_values(&[id(rank), "backfill_admit"])
                    .inc();
                tracing::debug!(event = "backfill_admit", target = %id(rank));
            }
            Note::EngineRoom { rank } => {
                m.transitions
                    .with_label_values(&[id(rank), "engine_room_admit"])
                    .inc();
                tracing::debug!(event = "engine_room_admit", target = %id(rank));
            }
            Note::HoldFree { rank } => {
                m.transitions
                    .with_label_values(&[id(rank), "hold_free_admit"])
                    .inc();
                tracing::debug!(event = "hold_free_admit", target = %id(rank));
            }
            Note::BatchGain {
                rank,
                benefit,
                cost,
            } => {
                m.transitions
                    .with_label_values(&[id(rank), "batch_gain_admit"])
                    .inc();
                tracing::debug!(event = "batch_gain_admit", target = %id(rank), benefit_seconds = benefit, cost_seconds = cost);
            }
        }
    }

    /// Admits a request with Program identity; `prompt` (the request's messages or prompt, as
    /// sent) sizes its token estimate and, for `cache_aware` binding, locates cached prefixes;
    /// `system` (its system prompt's leading bytes, or empty) names its Program's kind.
    pub fn admit(
        self: &Arc<Self>,
        model: &str,
        endpoint: &'static str,
        identity: Identity,
        (prompt, system): (&[u8], &[u8]),
        tenant: Option<(String, f64)>,
    ) -> (ProgramTicket, Admission) {
        let prompt_bytes = prompt.len();
        let (lead, system) = (lead_key(prompt), lead_key(system));
        let prefix = if self.cache_binding {
            PrefixIndex::chain(prompt)
        } else {
            Vec::new()
        };
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        let prompt_tokens = (prompt_bytes as f64 * g.tokens_per_byte) as u64;
        let guard = ProgramTicket {
            rt: self.clone(),
            ticket,
            prompt_bytes,
            prompt_tokens,
            endpoint,
            wants_tool: g.sched.cfg.tool_ttl_min_samples > 0 || g.sched.cfg.answer_ends_program,
            done: false,
        };
        let now = self.now();
        let ds = g.sched.on_arrival(
            now,
            Arrival {
                ticket,
                model: model.to_string(),
                identity,
                prompt_tokens,
                tenant,
                prefix,
                lead,
                system,
            },
        );
        let admission = match self.deliver(&mut g, ds, Some(ticket)) {
            Some(p) => Admission::Now(p),
            None => {
                let (tx, rx) = oneshot::channel();
                g.waiters.insert(ticket, tx);
                Admission::Wait(rx)
            }
        };
        drop(g);
        self.wake.notify_one();
        (guard, admission)
    }

    fn complete(&self, t: &ProgramTicket, usage: Option<Usage>, tool: ToolCall<'_>) {
        let (ticket, prompt_bytes, endpoint) = (t.ticket, t.prompt_bytes, t.endpoint);
        let fed = usage.filter(|u| prompt_bytes > 0 && u.prompt_tokens > 0);
        // The series that need no scheduler state are written before taking its lock.
        let outcome = if fed.is_some() { "observed" } else { "missing" };
        self.metrics
            .feedback
            .with_label_values(&[MODEL_POOL, endpoint, outcome])
            .inc();
        if let Some(u) = fed {
            self.metrics
                .estimate_error
                .with_label_values(&[MODEL_POOL, endpoint])
                .observe(t.prompt_tokens as f64 / u.prompt_tokens as f64);
        }
        let mut g = self.lock();
        if let Some(u) = fed {
            let ratio = (u.prompt_tokens as f64 / prompt_bytes as f64).clamp(0.01, 4.0);
            g.tokens_per_byte = 0.95 * g.tokens_per_byte + 0.05 * ratio;
            self.metrics
                .coefficient
                .with_label_values(&[MODEL_POOL, endpoint])
                .set(g.tokens_per_byte);
        }
        let now = self.now();
        let ds = g.sched.on_complete_with_tool(now, ticket, usage, tool);
        self.deliver(&mut g, ds, None);
        drop(g);
        self.wake.notify_one();
    }

    fn cancel(&self, ticket: Ticket) {
        let mut g = self.lock();
        g.waiters.remove(&ticket);
        let now = self.now();
        let ds = g.sched.on_cancel(now, ticket);
        self.deliver(&mut g, ds, None);
        drop(g);
        self.wake.notify_one();
    }

    /// Feeds a backend observation of the target `id` (ignored if it is not in the set).
    pub fn observe(&self, id: &str, obs: Observation) {
        let mut g = self.lock();
        let Some(rank) = g.layout.ids.iter().position(|x| x == id) else {
            return;
        };
        let now = self.now();
        tracing::debug!(
            event = "capacity_observation",
            target = %id,
            waiting = obs.waiting,
            running = obs.running,
            kv_usage = obs.kv_usage,
            token_capacity = obs.token_capacity,
        );
        let ds = g.sched.on_observation(now, rank, obs);
        self.deliver(&mut g, ds, None);
        self.freshness(&mut g, rank, true);
    }

    /// Marks target `id` reachable or not: new Programs bind to reachable ones, and the
    /// Programs of one that became unreachable move (see `Scheduler::set_available`).
    pub fn set_available(&self, id: &str, available: bool) {
        let mut g = self.lock();
        if let Some(rank) = g.layout.ids.iter().position(|x| x == id) {
            let now = self.now();
            let ds = g.sched.set_available(now, rank, available);
            self.deliver(&mut g, ds, None);
        }
    }

    /// Sets the per-target gauges of the rolling windows (once an interval, off the request path).
    fn publish_rolling(&self, g: &Inner) {
        let m = &self.metrics;
        let now = self.now();
        for (i, id) in g.layout.ids.iter().enumerate() {
            let Some(r) = super::diagnostics::rolling_gauges(&g.sched, i, now) else {
                continue;
            };
            let samples = [
                ("request", r.request_samples),
                ("continuity", r.continuity_samples),
            ];
            for (window, n) in samples {
                m.rolling_samples
                    .with_label_values(&[id, window])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            m.fitted_ttl
                .with_label_values(&[id])
                .set(r.fitted_ttl_seconds);
            m.miss_impact_mean
                .with_label_values(&[id])
                .set(r.miss_impact_seconds);
            m.context_growth
                .with_label_values(&[id])
                .set(r.context_growth_tokens);
            m.overcommit
                .with_label_values(&[id])
                .set(r.overcommit_ratio);
            // Unknown until enough Programs came back: no sample rather than a made-up share.
            match r.held_resume_share {
                Some(share) => m.held_resumes.with_label_values(&[id]).set(share),
                None => {
                    let _ = m.held_resumes.remove_label_values(&[id]);
                }
            }
        }
    }

    /// Logs the fallback/recovery transitions of a rank's capacity observation, once each.
    fn freshness(&self, g: &mut Inner, rank: Rank, fresh: bool) {
        let was = g.layout.fresh[rank].replace(fresh);
        let id = &g.layout.ids[rank];
        self.metrics
            .observation_fresh
            .with_label_values(&[id])
            .set(i64::from(fresh));
        match (was, fresh) {
            // Stale, or never reported within three intervals of joining.
            (Some(true) | None, false) => {
                tracing::warn!(event = "capacity_observation_fallback", target = %id,
                    "backend observation is stale or missing; admission falls back to the router ledger")
            }
            // Only a recovery from a fallback is news (not the first report at start).
            (Some(false), true) => {
                tracing::info!(event = "capacity_observation_recovered", target = %id)
            }
            _ => {}
        }
    }

    /// Fires scheduler timers until the runtime is retired or `stop` changes.
    pub async fn tick_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if self.retired.load(Ordering::Relaxed) {
                return;
            }
            let next = {
                let mut g = self.lock();
                let now = self.now();
                let ds = g.sched.on_tick(now);
                self.deliver(&mut g, ds, None);
                if now >= g.rolling_at {
                    g.rolling_at = now + self.interval.as_secs_f64();
                    self.publish_rolling(&g);
                }
                let stale_after = 3.0 * self.interval.as_secs_f64();
                for r in 0..g.layout.ids.len() {
                    let fresh = g.sched.ranks[r]
                        .observation
                        .is_some_and(|(at, _)| now - at <= stale_after);
                    let silent =
                        g.layout.fresh[r].is_none() && now - g.layout.joined[r] > stale_after;
                    if !fresh && (g.layout.fresh[r] == Some(true) || silent) {
                        self.freshness(&mut g, r, false);
                    }
                }
                g.sched.next_deadline().map(|t| (t - now).max(0.0))
            };
            // Wake at the next timer, and at least once an interval for staleness checks.
            let wait = next.map_or(self.interval, |s| {
                crate::config::duration(s).min(self.interval)
            });
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Stops the tick loop and fails every waiting request (their receivers see a closed channel).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.lock().waiters.clear();
        self.wake.notify_one();
    }

    /// Whether Program `program_id` of `model` is known here (`peers`: else another replica
    /// may hold it).
    pub fn knows(&self, model: &str, program_id: &str) -> bool {
        self.lock()
            .sched
            .knows(&(model.to_string(), program_id.to_string()))
    }

    /// Every Program known here, for the replicas that take over when this one leaves.
    pub fn held(&self) -> Vec<HandedOver> {
        let g = self.lock();
        g.sched.held(self.now())
    }

    /// Gives up Program `program_id` of `model`, when idle, to the replica that now owns it (see
    /// `Scheduler::hand_over`); requests waiting for the capacity it held are placed.
    pub fn hand_over(&self, model: &str, program_id: &str) -> Option<HandedOver> {
        let mut g = self.lock();
        let now = self.now();
        let key = (model.to_string(), program_id.to_string());
        let (given, ds) = g.sched.hand_over(now, &key);
        self.deliver(&mut g, ds, None);
        drop(g);
        self.wake.notify_one();
        given
    }

    /// Takes Programs another replica handed over (see `Scheduler::adopt`); how many.
    pub fn adopt(&self, programs: &[HandedOver]) -> usize {
        let mut g = self.lock();
        let now = self.now();
        g.sched.adopt(now, programs)
    }

    pub fn diagnostics(&self) -> Diagnostics {
        let g = self.lock();
        snapshot(&g.sched, self.now(), &g.layout.info, g.tokens_per_byte, 200)
    }
}

/// One request's place in Program scheduling. Finish it with usage, or drop it to cancel.
pub struct ProgramTicket {
    rt: Arc<ProgramRuntime>,
    ticket: Ticket,
    prompt_bytes: usize,
    /// The prompt tokens estimated at admission (what the ledger reserved for the prompt).
    prompt_tokens: u64,
    /// The route the request came on (labels the token estimate's series).
    endpoint: &'static str,
    /// The scheduler tells tools apart (`tool_ttl_min_samples`) or ends a Program's turn on an
    /// answer without one (`answer_ends_program`): the response's tool calls are worth reading.
    wants_tool: bool,
    done: bool,
}

impl ProgramTicket {
    /// Finishes the request with what the backend reported and what was read of the
    /// response's tool calls.
    pub fn complete(mut self, usage: Option<Usage>, tool: ToolCall<'_>) {
        self.done = true;
        self.rt.complete(&self, usage, tool);
    }

    pub fn wants_tool(&self) -> bool {
        self.wants_tool
    }
}

impl Drop for ProgramTicket {
    fn drop(&mut self) {
        if !self.done {
            self.rt.cancel(self.ticket);
        }
    }
}
