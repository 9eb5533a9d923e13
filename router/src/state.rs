//! The router's shared state: the applied configuration (swapped atomically on reload), the
//! upstream client, metrics, drain flag and the wake-ups of the background loops.
//!
//! Owns `apply` — turning a validated config into targets and a policy — and the reload rules.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::{Notify, watch};

use crate::applied::{
    Applied, authorization, fair_runtime, limiter, program_runtime, program_targets,
};
use crate::config::flags::Flags;
use crate::config::{ConfigError, RouterConfig};
use crate::fair::runtime::FairMetrics;
use crate::net::client::{self, UpstreamClient};
use crate::observe::metrics::Metrics;
use crate::policies::{self, Policy};
use crate::program::metrics::ProgramMetrics;
use crate::workers::TargetSet;

/// A reload that was refused.
#[derive(Debug, Clone)]
pub struct ReloadError {
    pub at: SystemTime,
    pub message: String,
}

/// The shutdown's timeline, fixed when it begins.
#[derive(Debug, Clone, Copy)]
struct DrainPlan {
    /// The listeners stop accepting (the shutdown delay is over).
    accept_stop: tokio::time::Instant,
    queues_close: tokio::time::Instant,
    deadline: tokio::time::Instant,
}

/// Shared router state.
pub struct RouterState {
    pub applied: ArcSwap<Applied>,
    pub metrics: Arc<Metrics>,
    /// The peers feature's series.
    pub peer_metrics: crate::peers::metrics::PeerMetrics,
    /// Forwarding's own state: route metrics, stored responses' homes.
    pub forwarder: Arc<crate::proxy::Forwarder>,
    pub program_metrics: ProgramMetrics,
    pub fair_metrics: FairMetrics,
    pub client: UpstreamClient,
    /// Carries Program requests to the replica that owns them (`peers`).
    pub peer_client: crate::peers::PeerClient,
    /// From the shutdown signal on: when the router's queues close and when the drain ends
    /// (see [`RouterState::begin_shutdown`]).
    drain: watch::Sender<Option<DrainPlan>>,
    pub last_reload_error: Mutex<Option<ReloadError>>,
    pub health_wake: Notify,
    pub observe_wake: Arc<Notify>,
    /// Flags given at start; they keep overriding the file on every reload.
    pub flags: Flags,
    /// Where the config came from, for `/status`.
    pub source: String,
    /// [`crate::config::file_hash`] and [`crate::config::settings_hash`] of the config file
    /// content last applied (or accepted as unchanged); the operator compares them with the
    /// ConfigMap it rendered.
    pub file_hash: Mutex<Option<(String, String)>>,
    /// The member that the `peers` member list in force was read from, when it was not the
    /// config file's ([`crate::peers::gossip`]).
    peer_list_source: Mutex<Option<String>>,
    /// Held by whoever reads the applied configuration to apply a changed one (the file reload,
    /// a member list read from a peer), so that neither undoes the other.
    config_writer: Mutex<()>,
    /// Hand-over claims in progress ([`crate::peers::handover::Claims`]).
    pub claims: crate::peers::handover::Claims,
    /// The keys of `client_api_keys_dir`, when the applied configuration names one.
    pub client_dir: ArcSwapOption<crate::auth::DirKeys>,
    /// The peer plane's credential (`peer_secret_file`, read at start).
    pub peer_key: Option<Arc<crate::peers::PeerKey>>,
    /// The first internal failure reported ([`RouterState::fail`]), and its notice.
    failure: std::sync::OnceLock<String>,
    failure_notice: Notify,
    /// Open connections of the API and the peer listener (capped per listener).
    pub api_connections: Arc<crate::limit::Connections>,
    /// Request bytes held in memory ([`crate::config::LimitsConfig::max_buffered_bytes`]).
    pub buffered: Arc<crate::limit::ByteBudget>,
    pub peer_connections: Arc<crate::limit::Connections>,
    stop: watch::Sender<bool>,
    /// The generation of the configuration in force, sent once it is (I/O threads refresh their
    /// handle on it: [`crate::applied::refresh_here`]).
    generation: watch::Sender<u64>,
    request_ids: RequestIds,
    /// `pr-<random>-`: ids stay unique across replicas and restarts (vLLM uses the id as its
    /// request key, and two in flight with the same id break engines before vLLM 0.12).
    request_prefix: String,
}

impl RouterState {
    /// The state for `config`; fails on a metrics registry error or an unreadable key directory.
    pub fn new(config: RouterConfig, flags: Flags) -> Result<Arc<Self>, String> {
        let client_dir = match &config.client_api_keys_dir {
            Some(d) => Some(Arc::new(
                crate::auth::DirKeys::load(std::path::Path::new(d))
                    .map_err(|e| format!("client_api_keys_dir: {e}"))?,
            )),
            None => None,
        };
        let peer_key = match &config.peer_secret_file {
            Some(f) => Some(Arc::new(
                crate::peers::PeerKey::load(std::path::Path::new(f))
                    .map_err(|e| format!("peer_secret_file: {e}"))?,
            )),
            None => None,
        };
        Self::with_metrics(config, flags, client_dir, peer_key).map_err(|e| e.to_string())
    }

    fn with_metrics(
        config: RouterConfig,
        flags: Flags,
        client_dir: Option<Arc<crate::auth::DirKeys>>,
        peer_key: Option<Arc<crate::peers::PeerKey>>,
    ) -> Result<Arc<Self>, prometheus::Error> {
        let metrics = Arc::new(Metrics::new()?);
        let forwarder = Arc::new(crate::proxy::Forwarder::new(metrics.clone()));
        let peer_metrics = crate::peers::metrics::PeerMetrics::new(&metrics.registry)?;
        let program_metrics = ProgramMetrics::new(&metrics.registry)?;
        let fair_metrics = FairMetrics::new(&metrics.registry)?;
        let observe_wake = Arc::new(Notify::new());
        let targets = TargetSet::build(&config, None, &metrics);
        let policy: Arc<dyn Policy> = Arc::from(policies::build(&config, &targets));
        let program = program_runtime(&config, &targets, &program_metrics);
        let fair = fair_runtime(&config, &targets, &fair_metrics, &observe_wake);
        let source = match &flags.config {
            Some(p) => format!("file:{}", p.display()),
            None => "flags".to_string(),
        };
        let applied = Applied {
            hash: config.hash(),
            authorization: authorization(&config),
            client_keys: crate::auth::client_keys(&config),
            named_clients: crate::auth::named_clients(&config),
            limiter: limiter(&config, None),
            peers: config
                .peers
                .as_ref()
                .map(|p| Arc::new(crate::peers::Peers::new(p, None, peer_key.clone()))),
            config,
            targets,
            policy,
            loaded_at: SystemTime::now(),
            generation: 1,
            program,
            fair,
        };
        let (stop, _) = watch::channel(false);
        Ok(Arc::new(RouterState {
            applied: ArcSwap::from_pointee(applied),
            metrics,
            peer_metrics,
            forwarder,
            program_metrics,
            fair_metrics,
            client: client::client(),
            peer_client: crate::peers::client(),
            peer_key,
            failure: std::sync::OnceLock::new(),
            failure_notice: Notify::new(),
            api_connections: Arc::default(),
            buffered: Arc::default(),
            peer_connections: Arc::default(),
            drain: watch::channel(None).0,
            last_reload_error: Mutex::new(None),
            health_wake: Notify::new(),
            observe_wake,
            flags,
            source,
            file_hash: Mutex::new(None),
            peer_list_source: Mutex::new(None),
            config_writer: Mutex::new(()),
            client_dir: ArcSwapOption::new(client_dir),
            claims: Default::default(),
            stop,
            generation: watch::channel(1).0,
            request_ids: RequestIds::new(),
            request_prefix: format!("pr-{:016x}-", rand::random::<u64>()),
        }))
    }

    /// A receiver that changes when the router stops.
    pub fn stop_rx(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Starts the shutdown with the limits in effect now (a reload may have changed them since
    /// the start): readiness turns false at once; the listener keeps accepting for
    /// `limits.shutdown_delay_secs` (while load balancers stop sending), then closes and requests
    /// in flight have up to `limits.drain_timeout_secs` to finish. Requests waiting in the
    /// router's queues (Program scheduling's RequestPool, the fair queue) may still be
    /// dispatched until half the drain has passed; those still waiting then, and any that
    /// arrives and would wait from then on, are answered 503 `shutting_down` — never cut by the
    /// deadline while they wait — and requests dispatched have the second half to finish.
    /// Resolves when the listener should close. A second call changes nothing and returns at once.
    pub async fn begin_shutdown(&self) {
        let limits = self.applied.load().config.limits.clone();
        let delay = crate::config::duration(limits.shutdown_delay_secs);
        let drain = crate::config::duration(limits.drain_timeout_secs);
        let now = tokio::time::Instant::now();
        let plan = DrainPlan {
            accept_stop: now + delay,
            queues_close: now + delay + drain / 2,
            deadline: now + delay + drain,
        };
        let begun = self.drain.send_if_modified(|d| {
            if d.is_some() {
                return false;
            }
            *d = Some(plan);
            true
        });
        if begun {
            self.hand_over_on_shutdown().await;
        }
        if begun && !delay.is_zero() {
            tracing::info!(?delay, "shutting down: readiness off, still accepting");
            tokio::time::sleep(delay).await;
        }
    }

    /// With `peers` and Program scheduling: gives every Program this replica knows to the member
    /// that owns it once this replica is gone, so that it keeps its rank (and cached KV).
    async fn hand_over_on_shutdown(&self) {
        let applied = self.applied.load_full();
        let (Some(peers), Some(rt)) = (&applied.peers, &applied.program) else {
            return;
        };
        // After a failure the Programs' state cannot be trusted: nothing is handed over.
        if self.failure().is_some() {
            return;
        }
        if !peers.hand_over || peers.members.len() < 2 || !peers.is_member() {
            return;
        }
        let held = rt.held();
        if held.is_empty() {
            return;
        }
        let n = held.len();
        let taken = crate::peers::handover::push(&self.peer_client, peers, held).await;
        self.peer_metrics
            .handovers
            .with_label_values(&["pushed"])
            .inc_by(taken as u64);
        tracing::info!(
            programs = n,
            taken,
            "handed Programs to the replicas that own them next"
        );
    }

    /// Reports that a panic left shared state half-updated: the router answers what follows
    /// with errors, stops accepting and exits non-zero once drained, for a restart
    /// ([`RouterState::failed`]). The first report is kept.
    pub fn fail(&self, what: String) {
        if self.failure.set(what.clone()).is_ok() {
            tracing::error!(event = "router_failed", error = %what,
                "internal error: the router stops and exits for a restart");
        }
        self.failure_notice.notify_waiters();
    }

    /// Resolves once [`RouterState::fail`] was called; the first report.
    pub async fn failed(&self) -> String {
        loop {
            let notice = self.failure_notice.notified();
            if let Some(what) = self.failure.get() {
                return what.clone();
            }
            notice.await;
        }
    }

    /// The failure reported, if any.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    pub fn is_draining(&self) -> bool {
        self.drain.borrow().is_some()
    }

    /// When requests in flight are cut, once the drain has begun.
    pub fn drain_deadline(&self) -> Option<tokio::time::Instant> {
        self.drain.borrow().map(|p| p.deadline)
    }

    /// Resolves when the drain closes the router's queues (see [`RouterState::begin_shutdown`]).
    pub async fn queues_closed(&self) {
        self.at_plan(|p| p.queues_close).await
    }

    /// Whether the listeners have stopped accepting (see [`RouterState::begin_shutdown`]).
    pub fn accepting_has_stopped(&self) -> bool {
        self.drain
            .borrow()
            .as_ref()
            .is_some_and(|p| tokio::time::Instant::now() >= p.accept_stop)
    }

    /// Resolves when the listeners stop accepting (see [`RouterState::begin_shutdown`]).
    pub async fn accepting_stopped(&self) {
        self.at_plan(|p| p.accept_stop).await
    }

    /// Sleeps until the instant `at` picks from the drain's plan, once there is one.
    async fn at_plan(&self, at: impl Fn(&DrainPlan) -> tokio::time::Instant) {
        let mut rx = self.drain.subscribe();
        let when = match rx.wait_for(Option::is_some).await {
            Ok(p) => p.as_ref().map(&at),
            Err(_) => None,
        };
        match when {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    }

    /// Stops the background loops.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// The configuration in force, through this thread's handle ([`crate::applied::here`]).
    pub fn applied_here(&self) -> crate::applied::Handle {
        crate::applied::here(&self.applied)
    }

    /// A receiver that changes after each reload applied.
    pub fn reloads(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A fresh request id: the replica's prefix and a counter in hex, as a header value.
    pub fn request_id(&self) -> http::HeaderValue {
        request_id(&self.request_prefix, self.request_ids.next())
    }

    /// Reloads from new file content: parse, merge the start-up flags, validate, apply. On error
    /// the applied configuration stays and the error is kept for `/status`.
    pub fn reload(&self, bytes: &[u8]) -> Result<bool, ConfigError> {
        let _one_writer = self.config_writer();
        let result = crate::config::flags::parse_config(bytes)
            .and_then(|file| self.flags.effective(Some(file)))
            .and_then(|mut c| {
                // A member list read from a peer stays until the file's revision reaches it.
                let kept =
                    crate::peers::gossip::keep_newer_members(&mut c, &self.applied.load().config);
                let applied = self.apply(c)?;
                if !kept {
                    self.set_peer_list_source(None);
                }
                Ok(applied)
            });
        let mut err = self
            .last_reload_error
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(changed) => {
                *err = None;
                self.set_file_hash(bytes);
                self.metrics
                    .config_reloads
                    .with_label_values(&["applied"])
                    .inc();
                if *changed {
                    tracing::info!(hash = %self.applied.load().hash, "configuration reloaded");
                }
            }
            Err(e) => {
                self.metrics
                    .config_reloads
                    .with_label_values(&["rejected"])
                    .inc();
                tracing::error!(error = %e, "configuration reload rejected; keeping the applied configuration");
                *err = Some(ReloadError {
                    at: SystemTime::now(),
                    message: e.to_string(),
                });
            }
        }
        result
    }

    /// Takes one read of the key directory `dir` (see [`crate::run::loops::key_dir`]): a stable,
    /// changed key set replaces the one in force; an error is kept for `/status` and logged once,
    /// and the keys in force stay. `Ok(None)`: the directory changed between two reads.
    pub fn update_client_dir(
        &self,
        dir: &std::path::Path,
        read: Result<Option<Vec<crate::auth::ClientKey>>, String>,
    ) {
        let Some(cur) = self.client_dir.load_full() else {
            return;
        };
        if cur.dir != dir {
            return; // a reload named another directory meanwhile
        }
        let next = match read {
            Ok(None) => return,
            Ok(Some(keys)) if *cur.keys == *keys => {
                if cur.error.is_none() {
                    return;
                }
                tracing::info!(dir = %dir.display(), "client key directory readable again");
                crate::auth::DirKeys {
                    error: None,
                    ..(*cur).clone()
                }
            }
            Ok(Some(keys)) => {
                let names = |k: &[crate::auth::ClientKey]| -> std::collections::BTreeSet<Arc<str>> {
                    k.iter().map(|k| k.name.clone()).collect()
                };
                let (old, new) = (names(&cur.keys), names(&keys));
                let list = |s: std::collections::BTreeSet<&Arc<str>>| {
                    s.into_iter().map(|n| &**n).collect::<Vec<_>>().join(",")
                };
                tracing::info!(
                    event = "client_keys_reloaded",
                    dir = %dir.display(),
                    keys = keys.len(),
                    added = %list(new.difference(&old).collect()),
                    removed = %list(old.difference(&new).collect()),
                    "client keys reloaded"
                );
                crate::auth::DirKeys {
                    dir: dir.to_path_buf(),
                    keys: keys.into(),
                    loaded_at: SystemTime::now(),
                    error: None,
                }
            }
            Err(e) => {
                if cur.error.as_ref() == Some(&e) {
                    return;
                }
                tracing::error!(error = %e, "client key directory refused; keeping the keys in force");
                crate::auth::DirKeys {
                    error: Some(e),
                    ..(*cur).clone()
                }
            }
        };
        self.client_dir.store(Some(Arc::new(next)));
    }

    /// Serializes the read-modify-apply of the configuration (file reloads, member lists read
    /// from peers).
    pub fn config_writer(&self) -> std::sync::MutexGuard<'_, ()> {
        self.config_writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records where the `peers` member list in force came from: `Some(member)` when it was
    /// read from that member, `None` when it is the config file's.
    pub fn set_peer_list_source(&self, member: Option<String>) {
        *self
            .peer_list_source
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = member;
    }

    /// The member the `peers` member list in force was read from (`None`: the config file).
    pub fn peer_list_source(&self) -> Option<String> {
        self.peer_list_source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the content of the config file now in force.
    pub fn set_file_hash(&self, bytes: &[u8]) {
        *self.file_hash.lock().unwrap_or_else(|p| p.into_inner()) = Some((
            crate::config::file_hash(bytes),
            crate::config::settings_hash(bytes),
        ));
    }

    /// Records that the config file cannot be read.
    pub fn reload_unreadable(&self, message: String) {
        tracing::error!(error = %message, "configuration file unreadable; keeping the applied configuration");
        *self
            .last_reload_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(ReloadError {
            at: SystemTime::now(),
            message,
        });
    }

    /// Applies the member list in `doc` (another replica's `/peers/members`, read from `from`)
    /// when it is signed with the peer secret and newer than the one in force.
    pub fn adopt_members(
        &self,
        from: &str,
        doc: &serde_json::Value,
    ) -> Result<crate::peers::gossip::Adoption, String> {
        let _one_writer = self.config_writer();
        let applied = self.applied.load_full();
        let Some(config) =
            crate::peers::gossip::adoptable(&applied.config, applied.peers.as_deref(), doc)?
        else {
            return Ok(crate::peers::gossip::Adoption::Stale);
        };
        self.apply(config).map_err(|e| e.to_string())?;
        self.set_peer_list_source(Some(from.to_string()));
        Ok(crate::peers::gossip::Adoption::Adopted)
    }

    /// Applies a validated configuration; `Ok(false)` when it equals the applied one. One apply
    /// at a time: `reload` and `adopt_members` hold the config writer's lock around it.
    pub fn apply(&self, config: RouterConfig) -> Result<bool, ConfigError> {
        let prev = self.applied.load_full();
        // Compared whole: the hash leaves the keys out, and a new key must still apply.
        if config == prev.config {
            return Ok(false);
        }
        let hash = config.hash();
        for (field, same) in [
            ("host", config.host == prev.config.host),
            ("port", config.port == prev.config.port),
            ("io_threads", config.io_threads == prev.config.io_threads),
            (
                "prometheus_host",
                config.prometheus_host == prev.config.prometheus_host,
            ),
            (
                "prometheus_port",
                config.prometheus_port == prev.config.prometheus_port,
            ),
            ("peer_host", config.peer_host == prev.config.peer_host),
            ("peer_port", config.peer_port == prev.config.peer_port),
            (
                "peer_secret_file",
                config.peer_secret_file == prev.config.peer_secret_file,
            ),
            ("log_format", config.log_format == prev.config.log_format),
            (
                "enable_trace",
                config.enable_trace == prev.config.enable_trace,
            ),
            (
                "otlp_traces_endpoint",
                config.otlp_traces_endpoint == prev.config.otlp_traces_endpoint,
            ),
            (
                "otel_sampling_ratio",
                config.otel_sampling_ratio == prev.config.otel_sampling_ratio,
            ),
        ] {
            if !same {
                return Err(ConfigError::new(
                    field,
                    "listener and thread changes need a restart; not applied",
                ));
            }
        }
        // A different key directory is read now: one that cannot be used refuses the reload.
        let new_dir = match &config.client_api_keys_dir {
            Some(d) if prev.config.client_api_keys_dir.as_ref() != Some(d) => Some(Some(Arc::new(
                crate::auth::DirKeys::load(std::path::Path::new(d))
                    .map_err(|e| ConfigError::new("client_api_keys_dir", e))?,
            ))),
            Some(_) => None,
            None => Some(None),
        };
        if config.log_level != prev.config.log_level {
            crate::observe::log::set_level(&config.log_level)
                .map_err(|e| ConfigError::new("log_level", e))?;
        }
        if let Some(d) = new_dir {
            self.client_dir.store(d);
        }
        let targets = TargetSet::build(&config, Some(&prev.targets), &self.metrics);
        let same_ids = targets.targets.iter().map(|t| &t.id).eq(prev
            .targets
            .targets
            .iter()
            .map(|t| &t.id));
        let policy = if same_ids && config.policy == prev.config.policy {
            prev.policy.clone()
        } else {
            Arc::from(policies::build(&config, &targets))
        };
        let same_ps = config.program_scheduling == prev.config.program_scheduling;
        let program = if same_ps && same_ids {
            prev.program.clone()
        } else if let (Some(rt), Some(ps), false) = (
            &prev.program,
            &config.program_scheduling,
            targets.targets.is_empty(),
        ) && (same_ps || rt.reconfigure(ps))
        {
            // The targets changed (a worker pod came or went) and/or a tuning value did:
            // Programs, TTLs, windows and retained requests carry over, by target id.
            if !same_ids {
                rt.retarget(&program_targets(&targets));
            }
            Some(rt.clone())
        } else {
            if let Some(old) = &prev.program {
                // Requests it still retains get 503 and may retry against the new configuration.
                old.retire();
            }
            let rt = program_runtime(&config, &targets, &self.program_metrics);
            if let Some(rt) = &rt {
                tokio::spawn(rt.clone().tick_loop(self.stop_rx()));
            }
            rt
        };
        let fair = if let Some(f) = &prev.fair
            && let Some(fc) = &config.fairness
            && (config.fairness == prev.config.fairness || f.reconfigure(fc))
        {
            // Same queue: its requests and each tenant's service carry over.
            f.set_targets(targets.targets.clone());
            prev.fair.clone()
        } else {
            if let Some(old) = &prev.fair {
                // Requests still queued get 503 and may retry against the new configuration.
                old.retire();
            }
            let rt = fair_runtime(&config, &targets, &self.fair_metrics, &self.observe_wake);
            if let Some(rt) = &rt {
                tokio::spawn(rt.clone().dispatch_loop(self.stop_rx()));
            }
            rt
        };
        // Read here, sent once the configuration is in force (below).
        let generation = *self.generation.borrow() + 1;
        self.applied.store(Arc::new(Applied {
            authorization: authorization(&config),
            client_keys: crate::auth::client_keys(&config),
            named_clients: crate::auth::named_clients(&config),
            limiter: limiter(&config, prev.limiter.as_ref()),
            peers: config.peers.as_ref().map(|p| {
                Arc::new(crate::peers::Peers::new(
                    p,
                    prev.peers.as_deref(),
                    self.peer_key.clone(),
                ))
            }),
            config,
            hash,
            targets,
            policy,
            loaded_at: SystemTime::now(),
            generation,
            program,
            fair,
        }));
        self.generation.send_replace(generation);
        self.health_wake.notify_one();
        self.observe_wake.notify_one();
        Ok(true)
    }
}

/// Request numbers, unique within one router state: each thread takes a block of the state's
/// counter and numbers from it, so I/O threads do not write one shared counter per request.
struct RequestIds {
    /// Tells states apart in a thread's block (tests run several routers on one thread).
    key: u64,
    next_block: AtomicU64,
}

/// Numbers a thread takes from its state's counter at a time.
const ID_BLOCK: u64 = 256;

static NEXT_STATE_KEY: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's block: its state's key, the next number, the end of the block.
    static ID_BLOCK_OF_THREAD: std::cell::Cell<(u64, u64, u64)> =
        const { std::cell::Cell::new((0, 0, 0)) };
}

impl RequestIds {
    fn new() -> Self {
        RequestIds {
            key: NEXT_STATE_KEY.fetch_add(1, Ordering::Relaxed),
            next_block: AtomicU64::new(1),
        }
    }

    fn next(&self) -> u64 {
        ID_BLOCK_OF_THREAD.with(|b| {
            let (key, next, end) = b.get();
            let (next, end) = if key == self.key && next < end {
                (next, end)
            } else {
                let start = self.next_block.fetch_add(ID_BLOCK, Ordering::Relaxed);
                (start, start.saturating_add(ID_BLOCK))
            };
            b.set((self.key, next + 1, end));
            next
        })
    }
}

/// `prefix` and `n` in lower-case hex, written without the formatting machinery (it runs for
/// every request without an id of its own).
fn request_id(prefix: &str, n: u64) -> http::HeaderValue {
    let digits = (64 - n.leading_zeros()).div_ceil(4).max(1);
    // Exactly as long as the id: `Bytes` then owns the vector's buffer with no header of its own.
    let mut id = Vec::with_capacity(prefix.len() + digits as usize);
    id.extend_from_slice(prefix.as_bytes());
    for i in (0..digits).rev() {
        id.push(b"0123456789abcdef"[((n >> (i * 4)) & 0xf) as usize]);
    }
    // The prefix is `pr-<hex>-`, so the value is always valid.
    http::HeaderValue::from_maybe_shared(bytes::Bytes::from(id))
        .unwrap_or(http::HeaderValue::from_static("pr"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::{ID_BLOCK, RequestIds};

    #[test]
    fn request_numbers_are_unique_per_state_across_threads_and_states_sharing_one() {
        let (a, b) = (RequestIds::new(), RequestIds::new());
        // Each state numbers from its own counter, even when a thread serves both.
        assert_eq!((a.next(), b.next(), a.next()), (1, 1, 1 + ID_BLOCK));
        let per_thread = 3 * ID_BLOCK as usize + 7;
        let seen: Vec<(Vec<u64>, Vec<u64>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|k| {
                    let (a, b) = (&a, &b);
                    s.spawn(move || {
                        // Two routers on one thread: alternating on some, in runs on others.
                        let mut ids = (Vec::new(), Vec::new());
                        for i in 0..per_thread {
                            if k % 2 == 0 || i % 100 < 50 {
                                ids.0.push(a.next());
                            }
                            ids.1.push(b.next());
                        }
                        ids
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        assert_eq!(seen.len(), 4);
        for first in [true, false] {
            let ids: Vec<u64> = seen
                .iter()
                .flat_map(|(a, b)| if first { a } else { b })
                .copied()
                .collect();
            let unique: HashSet<u64> = ids.iter().copied().collect();
            assert_eq!(unique.len(), ids.len(), "no number twice in one state");
            assert!(!unique.contains(&0), "numbers start at 1");
        }
    }

    #[test]
    fn request_ids_are_the_prefix_and_the_counter_in_hex() {
        for n in [0, 1, 15, 16, 255, 4096, 0xdead_beef, u64::MAX] {
            let id = super::request_id("pr-00ff-", n);
            assert_eq!(id.to_str().ok(), Some(format!("pr-00ff-{n:x}").as_str()));
        }
    }
}
