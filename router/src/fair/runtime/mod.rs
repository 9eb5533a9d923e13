//! Fair queueing wired to the data plane: tenant and class of a request, the waiting room, and the
//! dispatcher that opens each class's gate from the backends' own metrics.
//!
//! A request waits in the [`FairQueue`] until the dispatcher releases it. The dispatcher wakes on
//! every arrival, completion and observation round (and every 20 ms for timeouts), and lets a
//! class send while its allowance lasts: for every available target with a fresh observation,
//! `max_waiting_requests − vllm:num_requests_waiting` (0 while the target's recent time per output
//! token exceeds the class's `max_tpot_seconds`, and 0 for an `only_when_idle` class unless every
//! target's queue is empty), minus what was sent since that observation, plus what completed since
//! (a finished request freed its seat). A target without a fresh observation contributes nothing:
//! stale metrics count as saturated. While requests wait for room the dispatcher asks for a new
//! observation every `POLL` so the gate follows the backend closely.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use tokio::sync::{Notify, oneshot};

use super::{Discipline, Dispatched, FairParams, FairQueue, QueueTicket, Refused};
use crate::config::fairness::{FairDiscipline, FairnessConfig, TenantSource};
pub use crate::fair::metrics::FairMetrics;
use crate::workers::TargetState;

/// How often the dispatcher asks for fresh backend metrics while requests wait for room.
const POLL: Duration = Duration::from_millis(100);
/// Tenants in the served-tokens account (Jain's index) before the least served half is dropped.
const MAX_SERVED_TENANTS: usize = 4096;

/// Why a request did not get through.
#[derive(Debug, Clone, PartialEq)]
pub enum FairError {
    /// The tenant already has `max_queue_per_tenant` requests waiting in this class.
    QueueFull { tenant: String },
    /// Waited longer than `queue_timeout_seconds`.
    Timeout { seconds: f64 },
    /// The class header names no configured class.
    UnknownClass(String),
    /// The class header names a class above the tenant's highest (`max_class`,
    /// `tenant_max_classes`).
    ClassNotAllowed { class: String, max: String },
    /// The fairness configuration changed while the request waited.
    Reconfigured,
    /// The router's drain closed the queues while the request waited (or before it would).
    ShuttingDown,
}

enum Outcome {
    Go(Dispatched),
    TimedOut,
}

struct Inner {
    queue: FairQueue,
    waiters: FxHashMap<QueueTicket, oneshot::Sender<Outcome>>,
    /// Per tenant and class: requests waiting (for the bounded tenant series).
    depth: FxHashMap<String, usize>,
    /// Weighted tokens served per tenant (Jain's index).
    served: FxHashMap<String, f64>,
    sent_since_observation: u64,
    completed_since_observation: u64,
    /// `served` changed since the Jain/served series were last published (by the dispatcher,
    /// off the request path).
    served_changed: bool,
}

/// The queue's parameters from a fairness configuration.
fn params(cfg: &FairnessConfig) -> FairParams {
    FairParams {
        discipline: match cfg.discipline {
            FairDiscipline::Vtc => Discipline::Vtc,
            FairDiscipline::RoundRobin => Discipline::RoundRobin,
        },
        classes: cfg.classes.iter().map(|c| c.name.clone()).collect(),
        input_weight: cfg.input_weight,
        output_weight: cfg.output_weight,
        tenant_weights: cfg
            .tenant_weights
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        max_queue_per_tenant: cfg.max_queue_per_tenant as usize,
        queue_timeout: cfg.queue_timeout_seconds,
    }
}

/// The fair queue of one applied configuration.
pub struct FairRuntime {
    cfg: ArcSwap<FairnessConfig>,
    inner: Mutex<Inner>,
    targets: ArcSwap<Vec<Arc<TargetState>>>,
    wake: Notify,
    /// Asks the observation loop for a fresh round.
    observe: Arc<Notify>,
    epoch: Instant,
    next: AtomicU64,
    retired: AtomicBool,
    metrics: FairMetrics,
    /// Per-tenant quotas (`fairness.tenant_rate_limits`); kept across tuning reloads.
    rate: Mutex<super::rate::RateLimiter>,
    /// Names this quota state for the other replicas (a new one means its totals started over).
    rate_epoch: u64,
}

/// A request's charge against its tenant's token quota, settled with the real usage.
pub struct RateCharge {
    rt: Arc<FairRuntime>,
    tenant: String,
    estimate: u64,
}

impl RateCharge {
    /// Charges the tokens the request really used (prompt plus output).
    pub fn settle(self, used: u64) {
        let Some(l) = self.rt.rate_limits(&self.tenant) else {
            return;
        };
        crate::error::locked(&self.rt.rate, "the quota state").settle(
            &self.tenant,
            &l,
            self.estimate,
            used,
            Instant::now(),
        );
    }
}

impl FairRuntime {
    pub fn new(
        cfg: FairnessConfig,
        targets: Vec<Arc<TargetState>>,
        metrics: FairMetrics,
        observe: Arc<Notify>,
    ) -> Arc<Self> {
        Arc::new(FairRuntime {
            inner: Mutex::new(Inner {
                queue: FairQueue::new(params(&cfg)),
                waiters: FxHashMap::default(),
                depth: FxHashMap::default(),
                served: FxHashMap::default(),
                sent_since_observation: 0,
                completed_since_observation: 0,
                served_changed: false,
            }),
            cfg: ArcSwap::from_pointee(cfg),
            targets: ArcSwap::from_pointee(targets),
            wake: Notify::new(),
            observe,
            epoch: Instant::now(),
            next: AtomicU64::new(1),
            retired: AtomicBool::new(false),
            metrics,
            rate: Default::default(),
            rate_epoch: rand::random(),
        })
    }

    /// The quota of `tenant`, if it has one.
    fn rate_limits(&self, tenant: &str) -> Option<super::rate::Limits> {
        let cfg = self.cfg();
        cfg.tenant_rate_limits
            .get(tenant)
            .or(cfg.default_rate_limit.as_ref())
            .map(crate::fair::rate::Limits::from)
    }

    /// Admits a request of `tenant` under its quota, charging one request and `estimate`
    /// prompt tokens; `Ok(None)` when the tenant has no quota.
    pub fn rate_admit(
        self: &Arc<Self>,
        tenant: &str,
        estimate: u64,
    ) -> Result<Option<RateCharge>, super::rate::OverQuota> {
        let Some(l) = self.rate_limits(tenant) else {
            return Ok(None);
        };
        crate::error::locked(&self.rate, "the quota state").admit(
            tenant,
            &l,
            estimate,
            Instant::now(),
        )?;
        Ok(Some(RateCharge {
            rt: self.clone(),
            tenant: tenant.to_string(),
            estimate,
        }))
    }

    /// Requests and tokens charged to each tenant's quota here (for the other replicas).
    pub fn rate_totals(&self) -> Vec<(String, f64, f64)> {
        crate::error::locked(&self.rate, "the quota state")
            .totals()
            .map(|(t, r, k)| (t.to_string(), r, k))
            .collect()
    }

    /// Charges `tenant`'s quota here with what another replica admitted.
    pub fn rate_absorb(&self, tenant: &str, requests: f64, tokens: f64) {
        let Some(l) = self.rate_limits(tenant) else {
            return;
        };
        crate::error::locked(&self.rate, "the quota state").absorb(
            tenant,
            &l,
            requests,
            tokens,
            Instant::now(),
        );
    }

    /// The id of this quota state (see [`crate::peers::usage_document`]).
    pub fn rate_epoch(&self) -> u64 {
        self.rate_epoch
    }

    /// Seconds since this quota state was made.
    pub fn rate_age_secs(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Whether any tenant has a quota.
    pub fn has_rate_limits(&self) -> bool {
        let cfg = self.cfg();
        !cfg.tenant_rate_limits.is_empty() || cfg.default_rate_limit.is_some()
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::error::locked(&self.inner, "the fair queue's state")
    }

    /// The targets whose metrics gate dispatch (after a reload that keeps this runtime).
    pub fn set_targets(&self, targets: Vec<Arc<TargetState>>) {
        self.targets.store(Arc::new(targets));
        self.wake.notify_one();
    }

    /// A new observation round finished: the gate starts from fresh numbers.
    pub fn observed(&self) {
        let mut g = self.lock();
        g.sent_since_observation = 0;
        g.completed_since_observation = 0;
        drop(g);
        self.wake.notify_one();
    }

    /// Fails every waiting request with [`FairError::Reconfigured`] and stops the dispatcher.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.lock().waiters.clear();
        self.wake.notify_one();
    }

    /// The configuration in effect.
    pub fn cfg(&self) -> arc_swap::Guard<Arc<FairnessConfig>> {
        self.cfg.load()
    }

    /// Takes a changed fairness configuration in place — tenant weights, token weights,
    /// headers, defaults, limits, timeouts, a class's gates — keeping every queued request and
    /// each tenant's service so far; false when the change needs a fresh queue (other classes,
    /// or another discipline). A new per-tenant limit applies to requests queued from now on,
    /// a new queue timeout to every queued request (counted from when it was queued).
    pub fn reconfigure(&self, cfg: &FairnessConfig) -> bool {
        let names = |c: &FairnessConfig| -> Vec<String> {
            c.classes.iter().map(|c| c.name.clone()).collect()
        };
        let now = self.cfg();
        if names(cfg) != names(&now) || cfg.discipline != now.discipline {
            return false;
        }
        let mut g = self.lock();
        g.queue.set_params(params(cfg));
        self.cfg.store(Arc::new(cfg.clone()));
        self.publish_depth(&g);
        drop(g);
        tracing::info!(
            event = "fairness_reconfigured",
            "fair queueing took the new configuration; queued requests carry over"
        );
        self.wake.notify_one();
        true
    }

    /// The tenant of a request (see [`TenantSource`]); `client` is the name of the key the
    /// client presented when the router checks keys ([`crate::auth::authorize`]).
    pub fn tenant(
        &self,
        headers: &http::HeaderMap,
        user: Option<&str>,
        client: Option<&str>,
    ) -> String {
        let found = match self.cfg().tenant_source {
            TenantSource::Header => headers
                .get(self.cfg().tenant_header.as_str())
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            // A checked key's name; without a check, a name keyed per process (never a plain
            // hash of the key).
            TenantSource::ApiKey => client
                .map(str::to_string)
                .or_else(|| crate::auth::presented_key(headers).map(crate::auth::opaque_name)),
            TenantSource::User => user.map(str::to_string),
        };
        found
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty() && t.len() <= 256)
            .unwrap_or_else(|| self.cfg().default_tenant.clone())
    }

    /// The class of a request: its class header, else its tenant's default, else the default.
    pub fn class(&self, headers: &http::HeaderMap, tenant: &str) -> String {
        headers
            .get(self.cfg().class_header.as_str())
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .or_else(|| self.cfg().tenant_classes.get(tenant).cloned())
            .unwrap_or_else(|| self.cfg().default_class.clone())
    }

    /// Whether `tenant` may use `class` (see `FairnessConfig::max_class`). An unknown class
    /// passes here and is refused by [`FairRuntime::admit`].
    pub fn check_class(&self, tenant: &str, class: &str) -> Result<(), FairError> {
        let cfg = self.cfg();
        let Some(max) = cfg
            .tenant_max_classes
            .get(tenant)
            .or(cfg.max_class.as_ref())
        else {
            return Ok(());
        };
        let index = |c: &str| cfg.classes.iter().position(|k| k.name == c);
        match (index(class), index(max)) {
            (Some(c), Some(m)) if c < m => Err(FairError::ClassNotAllowed {
                class: class.to_string(),
                max: max.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Waits until the dispatcher releases the request, or until `shutdown` resolves (the
    /// router's drain closed its queues: [`FairError::ShuttingDown`]). Dropping the future
    /// (the client left) removes it from the queue.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &str,
        class: &str,
        input_tokens: u64,
        shutdown: impl Future<Output = ()>,
    ) -> Result<FairPermit, FairError> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut g = self.lock();
            let now = self.now();
            if let Err(e) = g.queue.push(now, ticket, tenant, class, input_tokens) {
                return Err(match e {
                    Refused::TenantQueueFull(t) => {
                        self.metrics
                            .outcomes
                            .with_label_values(&[class, "queue_full"])
                            .inc();
                        FairError::QueueFull { tenant: t }
                    }
                    Refused::UnknownClass(c) => FairError::UnknownClass(c),
                });
            }
            g.waiters.insert(ticket, tx);
            *g.depth.entry(tenant.to_string()).or_default() += 1;
            self.publish_depth(&g);
        }
        self.wake.notify_one();
        let mut guard = Queued {
            rt: self.clone(),
            ticket,
            tenant: tenant.to_string(),
            class: class.to_string(),
            armed: true,
            outcome: "cancelled",
        };
        let released = tokio::select! {
            biased;
            r = rx => r,
            _ = shutdown => {
                // The guard takes it out of the queue and counts it.
                guard.outcome = "shutting_down";
                return Err(FairError::ShuttingDown);
            }
        };
        match released {
            Ok(Outcome::Go(d)) => {
                guard.armed = false;
                Ok(FairPermit {
                    rt: self.clone(),
                    d: Some(d),
                })
            }
            Ok(Outcome::TimedOut) => {
                guard.armed = false;
                let mut g = self.lock();
                self.forget(&mut g, tenant);
                self.publish_depth(&g);
                drop(g);
                self.metrics
                    .outcomes
                    .with_label_values(&[class, "timeout"])
                    .inc();
                Err(FairError::Timeout {
                    seconds: self.cfg().queue_timeout_seconds,
                })
            }
            Err(_) => {
                guard.armed = false;
                Err(FairError::Reconfigured)
            }
        }
    }

    fn publish_depth(&self, g: &Inner) {
        for (i, c) in self.cfg().classes.iter().enumerate() {
            self.metrics
                .depth
                .with_label_values(&[c.name.as_str()])
                .set(g.queue.queued(i) as i64);
        }
        let mut tenants: Vec<(&String, &usize)> = g.depth.iter().filter(|(_, n)| **n > 0).collect();
        tenants.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let top = self.cfg().metrics_top_tenants as usize;
        self.metrics.tenant_depth.reset();
        let mut other = 0usize;
        for (i, (t, n)) in tenants.iter().enumerate() {
            if i < top {
                self.metrics
                    .tenant_depth
                    .with_label_values(&[t.as_str()])
                    .set(**n as i64);
            } else {
                other += **n;
            }
        }
        if other > 0 {
            self.metrics
                .tenant_depth
                .with_label_values(&["other"])
                .set(other as i64);
        }
    }

    fn forget(&self, g: &mut Inner, tenant: &str) {
        if let Some(n) = g.depth.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.depth.remove(tenant);
            }
        }
    }

    /// Room per class right now (see the module doc).
    fn allowances(&self, g: &Inner) -> Vec<i64> {
        let fresh = crate::config::duration(self.cfg().metrics_max_age_seconds);
        let now = Instant::now();
        let targets = self.targets.load();
        let samples: Vec<Option<crate::observe::scrape::EngineSample>> = targets
            .iter()
            .filter(|t| t.available(now))
            .map(|t| {
                t.backend
                    .observed(t.spec.dp_rank.unwrap_or(0))
                    .filter(|(_, age)| *age <= fresh)
                    .map(|(s, _)| s)
            })
            .collect();
        let all_idle =
            !samples.is_empty() && samples.iter().all(|s| s.is_some_and(|s| s.waiting < 1.0));
        let credit = g.completed_since_observation as i64 - g.sent_since_observation as i64;
        self.cfg()
            .classes
            .iter()
            .map(|c| {
                if c.only_when_idle && !all_idle {
                    return 0;
                }
                let room: i64 = samples
                    .iter()
                    .flatten()
                    .filter(|s| match (c.max_tpot_seconds, s.recent_tpot) {
                        (Some(limit), Some(tpot)) => tpot <= limit,
                        _ => true,
                    })
                    .map(|s| (i64::from(c.max_waiting_requests) - s.waiting.ceil() as i64).max(0))
                    .sum();
                room + credit
            })
            .collect()
    }

    /// One dispatcher pass: expire, then release what the gates allow. Returns whether requests
    /// are still waiting.
    fn pass(&self) -> bool {
        let mut g = self.lock();
        let now = self.now();
        for ticket in g.queue.expire(now) {
            if let Some(tx) = g.waiters.remove(&ticket) {
                let _ = tx.send(Outcome::TimedOut);
            }
        }
        // An expired request's tenant count is dropped by its waiter, which sees TimedOut.
        let cfg = self.cfg();
        let mut room = self.allowances(&g);
        let mut sent = 0u64;
        while let Some(d) = g.queue.pop(now, |ci| room.get(ci).is_some_and(|r| *r > 0)) {
            if let Some(r) = room.get_mut(d.class) {
                *r -= 1;
            }
            let class = cfg.classes[d.class].name.as_str();
            self.metrics
                .wait
                .with_label_values(&[class])
                .observe(d.waited);
            self.metrics
                .outcomes
                .with_label_values(&[class, "dispatched"])
                .inc();
            let tenant = d.tenant.clone();
            self.forget(&mut g, &tenant);
            // A closed channel means the client left between pop and send: nothing was sent.
            if let Some(tx) = g.waiters.remove(&d.ticket)
                && tx.send(Outcome::Go(d)).is_ok()
            {
                sent += 1;
            }
        }
        g.sent_since_observation += sent;
        if sent > 0 {
            self.publish_depth(&g);
        }
        if g.served_changed {
            self.publish_served(&mut g);
        }
        (0..cfg.classes.len()).any(|c| g.queue.queued(c) > 0)
    }

    /// Jain's index and the top tenants' served tokens; bounds the account to
    /// `MAX_SERVED_TENANTS` by dropping the least served half.
    fn publish_served(&self, g: &mut Inner) {
        g.served_changed = false;
        if g.served.len() > MAX_SERVED_TENANTS {
            let mut v: Vec<f64> = g.served.values().copied().collect();
            v.sort_by(f64::total_cmp);
            let cut = v[v.len() / 2];
            g.served.retain(|_, x| *x >= cut);
        }
        let (n, s, s2) = g
            .served
            .values()
            .fold((0.0, 0.0, 0.0), |(n, a, b), x| (n + 1.0, a + x, b + x * x));
        if s2 > 0.0 {
            self.metrics.jain.set(s * s / (n * s2));
        }
        let mut top: Vec<(&String, &f64)> = g.served.iter().collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1));
        // Only the current top tenants keep a series (bounded label set).
        self.metrics.served.reset();
        for (t, v) in top
            .into_iter()
            .take(self.cfg().metrics_top_tenants as usize)
        {
            self.metrics.served.with_label_values(&[t.as_str()]).set(*v);
        }
    }

    /// Runs until retired or `stop` changes.
    pub async fn dispatch_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last_poll = Instant::now();
        loop {
            if self.retired.load(Ordering::Relaxed) {
                return;
            }
            let waiting = self.pass();
            if waiting && last_poll.elapsed() >= POLL {
                // Requests wait for room: ask for fresh numbers rather than wait a full interval.
                self.observe.notify_one();
                last_poll = Instant::now();
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// A tenant's share weight (default 1).
    pub fn weight(&self, tenant: &str) -> f64 {
        self.cfg()
            .tenant_weights
            .get(tenant)
            .copied()
            .unwrap_or(1.0)
    }

    /// Frees a released request's seat and charges its real tokens to its tenant.
    fn finish(&self, d: &Dispatched, input_tokens: u64, output_tokens: u64) {
        let mut g = self.lock();
        g.queue.complete(d, output_tokens);
        g.completed_since_observation += 1;
        let cost = (self.cfg().input_weight * input_tokens as f64
            + self.cfg().output_weight * output_tokens as f64)
            / self.weight(&d.tenant);
        *g.served.entry(d.tenant.clone()).or_default() += cost;
        g.served_changed = true;
        drop(g);
        self.wake.notify_one();
    }
}

/// Removes a still-queued request when its client leaves.
struct Queued {
    rt: Arc<FairRuntime>,
    ticket: QueueTicket,
    tenant: String,
    class: String,
    armed: bool,
    /// The `outcome` label counted if it is dropped while still queued.
    outcome: &'static str,
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut g = self.rt.lock();
        // Not in `waiters` any more: the dispatcher released it (and counted it) already.
        if g.waiters.remove(&self.ticket).is_none() {
            return;
        }
        g.queue.cancel(self.ticket);
        self.rt.forget(&mut g, &self.tenant);
        self.rt.publish_depth(&g);
        drop(g);
        self.rt
            .metrics
            .outcomes
            .with_label_values(&[self.class.as_str(), self.outcome])
            .inc();
    }
}

/// A released request; completing it (or dropping it) frees its seat and charges its tokens.
pub struct FairPermit {
    rt: Arc<FairRuntime>,
    d: Option<Dispatched>,
}

impl FairPermit {
    /// The request finished with `prompt_tokens` in and `completion_tokens` out.
    pub fn complete(mut self, prompt_tokens: u64, completion_tokens: u64) {
        if let Some(d) = self.d.take() {
            self.rt.finish(&d, prompt_tokens, completion_tokens);
        }
    }
}

impl Drop for FairPermit {
    fn drop(&mut self) {
        if let Some(d) = self.d.take() {
            self.rt.finish(&d, 0, 0);
        }
    }
}

#[cfg(test)]
mod tests;
