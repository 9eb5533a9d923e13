//! Targets (base URL + GLOBAL DP rank) and the backends (base URLs) behind them.
//!
//! Owns per-target runtime state — in-flight count, circuit breaker, metric handles — and
//! per-backend health, observations and idle connections ([`idle`]). A [`TargetSet`] is an immutable snapshot swapped as a
//! whole on reload; state of targets that survive a reload is carried over.

pub mod breaker;
pub mod health;
pub mod idle;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderValue;
use rustc_hash::FxHashMap;

use crate::config::{CircuitBreakerConfig, RouterConfig, TargetSpec};
use crate::observe::metrics::{Metrics, TargetMetrics};
use crate::observe::scrape::EngineSample;
use breaker::{Breaker, CircuitState};

/// One scrape of a backend's `/metrics`: what each engine said, and when.
#[derive(Debug, Clone)]
pub struct Scrape {
    pub at: Instant,
    pub engines: FxHashMap<u32, EngineSample>,
}

/// One base URL: health (checked once per URL, not per rank) and observations.
pub struct Backend {
    pub url: String,
    /// The `Host` of proxied requests (`url`'s authority), built once.
    pub host: Option<HeaderValue>,
    /// `host:port` to connect to (port defaulted from the scheme).
    pub addr: String,
    healthy: AtomicBool,
    checked: AtomicBool,
    ok_streak: AtomicU32,
    fail_streak: AtomicU32,
    observation: Mutex<Option<Scrape>>,
    /// Keep-alive connections to it that no request is using, per I/O shard.
    pub idle: idle::IdleConnections,
}

impl Backend {
    pub fn new(url: String) -> Self {
        let parts = url.parse::<http::Uri>().ok().map(http::Uri::into_parts);
        // Worker URLs are validated as http:// (config), so the default port is 80.
        let addr = parts
            .as_ref()
            .and_then(|p| p.authority.as_ref())
            .map(|a| format!("{}:{}", a.host(), a.port_u16().unwrap_or(80)))
            .unwrap_or_default();
        Backend {
            addr,
            host: parts
                .and_then(|p| p.authority)
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
            url,
            healthy: AtomicBool::new(false),
            checked: AtomicBool::new(false),
            ok_streak: AtomicU32::new(0),
            fail_streak: AtomicU32::new(0),
            observation: Mutex::new(None),
            idle: Default::default(),
        }
    }

    /// Routable: healthy, or not checked yet (the first check runs at once).
    pub fn routable(&self) -> bool {
        self.healthy.load(Ordering::Relaxed) || !self.checked.load(Ordering::Relaxed)
    }

    /// Passed its health checks.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Records a health check; returns the new health if it changed.
    pub fn record_check(
        &self,
        ok: bool,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<bool> {
        let first = !self.checked.swap(true, Ordering::Relaxed);
        let was = self.healthy.load(Ordering::Relaxed);
        let now = if ok {
            self.fail_streak.store(0, Ordering::Relaxed);
            let s = self.ok_streak.fetch_add(1, Ordering::Relaxed) + 1;
            was || first || s >= success_threshold
        } else {
            self.ok_streak.store(0, Ordering::Relaxed);
            let f = self.fail_streak.fetch_add(1, Ordering::Relaxed) + 1;
            was && !first && f < failure_threshold
        };
        self.healthy.store(now, Ordering::Relaxed);
        (first || now != was).then_some(now)
    }

    /// Stores a new observation, deriving each engine's recent time per output token from the
    /// growth of its latency histogram since the previous one.
    pub fn set_observation(&self, mut obs: Scrape) {
        let mut g = self.observation.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = g.as_ref() {
            for (engine, s) in obs.engines.iter_mut() {
                if let Some(p) = prev.engines.get(engine) {
                    let tokens = s.itl_count - p.itl_count;
                    s.recent_tpot = (tokens > 0.0).then(|| (s.itl_sum - p.itl_sum) / tokens);
                }
            }
        }
        *g = Some(obs);
    }

    /// The latest observation of `engine`, with its age.
    pub fn observed(&self, engine: u32) -> Option<(EngineSample, Duration)> {
        let g = self.observation.lock().unwrap_or_else(|p| p.into_inner());
        let o = g.as_ref()?;
        Some((o.engines.get(&engine).copied()?, o.at.elapsed()))
    }

    pub fn observation_age(&self) -> Option<Duration> {
        let g = self.observation.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|o| o.at.elapsed())
    }
}

/// One routing target.
pub struct TargetState {
    pub spec: TargetSpec,
    pub id: String,
    pub backend: Arc<Backend>,
    /// Value of `X-data-parallel-rank`, if pinned.
    pub rank_header: Option<HeaderValue>,
    in_flight: Arc<AtomicU64>,
    pub breaker: Breaker,
    pub metrics: TargetMetrics,
    cb_config: CircuitBreakerConfig,
}

impl TargetState {
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts a request in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            target: self.clone(),
        }
    }

    /// Whether the router may send to this target now.
    pub fn available(&self, now: Instant) -> bool {
        self.backend.routable() && self.breaker.allows(now)
    }

    /// Waiting requests reported by the backend for this rank, if observed within `fresh`.
    pub fn observed_waiting(&self, fresh: Duration) -> Option<f64> {
        let (s, age) = self.backend.observed(self.spec.dp_rank.unwrap_or(0))?;
        (age <= fresh).then_some(s.waiting)
    }

    /// Records an upstream outcome in the breaker and its metrics.
    pub fn record_outcome(&self, success: bool) {
        if success {
            self.metrics.cb_success.inc();
        } else {
            self.metrics.cb_failure.inc();
        }
        // The clock is read only when the outcome can move the circuit.
        if self.breaker.unchanged_by(success) {
            return;
        }
        if let Some(state) = self.breaker.record(success, Instant::now()) {
            self.metrics.cb_state.set(state.metric());
            match state {
                CircuitState::Open => tracing::warn!(target_id = %self.id, "circuit opened"),
                _ => {
                    tracing::info!(target_id = %self.id, state = state.as_str(), "circuit state changed")
                }
            }
        }
    }
}

/// Decrements the in-flight count when dropped.
pub struct InFlight {
    target: Arc<TargetState>,
}

impl InFlight {
    pub fn target(&self) -> &Arc<TargetState> {
        &self.target
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.target.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The targets and backends of one applied configuration.
pub struct TargetSet {
    pub targets: Vec<Arc<TargetState>>,
    pub backends: Vec<Arc<Backend>>,
}

impl TargetSet {
    /// Builds the set for `cfg`, carrying over state of targets and backends in `previous`.
    pub fn build(cfg: &RouterConfig, previous: Option<&TargetSet>, metrics: &Metrics) -> TargetSet {
        let now = Instant::now();
        let mut backends: Vec<Arc<Backend>> = Vec::new();
        let mut targets = Vec::new();
        for spec in cfg.targets() {
            let backend = match backends.iter().find(|b| b.url == spec.url) {
                Some(b) => b.clone(),
                None => {
                    let b = previous
                        .and_then(|p| p.backends.iter().find(|b| b.url == spec.url).cloned())
                        .unwrap_or_else(|| Arc::new(Backend::new(spec.url.clone())));
                    backends.push(b.clone());
                    b
                }
            };
            let id = spec.id();
            let old = previous.and_then(|p| p.targets.iter().find(|t| t.id == id));
            if let Some(old) = old.filter(|o| o.cb_config == cfg.circuit_breaker) {
                targets.push(old.clone());
                continue;
            }
            let metrics = TargetMetrics::new(metrics, &id);
            metrics.health.set(i64::from(backend.healthy()));
            metrics.cb_state.set(0);
            targets.push(Arc::new(TargetState {
                rank_header: spec.dp_rank.map(HeaderValue::from),
                in_flight: old.map(|o| o.in_flight.clone()).unwrap_or_default(),
                breaker: Breaker::new(cfg.circuit_breaker.clone(), now),
                cb_config: cfg.circuit_breaker.clone(),
                backend,
                metrics,
                id,
                spec,
            }));
        }
        if let Some(p) = previous {
            for t in &p.targets {
                if !targets.iter().any(|n| n.id == t.id) {
                    metrics.remove_worker(&t.id);
                }
            }
        }
        metrics.active_workers.set(targets.len() as i64);
        TargetSet { targets, backends }
    }

    /// Targets of `backend`.
    pub fn of_backend<'a>(
        &'a self,
        backend: &'a Arc<Backend>,
    ) -> impl Iterator<Item = &'a Arc<TargetState>> + 'a {
        self.targets
            .iter()
            .filter(move |t| Arc::ptr_eq(&t.backend, backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;

    #[test]
    fn backends_connect_to_host_and_port() {
        for (url, addr) in [
            ("http://127.0.0.1:8000", "127.0.0.1:8000"),
            ("http://[::1]:8000/", "[::1]:8000"),
            ("http://vllm-0.vllm.ml.svc", "vllm-0.vllm.ml.svc:80"),
        ] {
            assert_eq!(Backend::new(url.into()).addr, addr, "{url}");
        }
    }

    #[test]
    fn health_thresholds() {
        let b = Backend::new("http://x".into());
        assert!(
            b.routable() && !b.healthy(),
            "unchecked backends are routable"
        );
        assert_eq!(
            b.record_check(true, 2, 3),
            Some(true),
            "first success marks healthy"
        );
        assert_eq!(b.record_check(false, 2, 3), None);
        assert_eq!(b.record_check(false, 2, 3), None);
        assert_eq!(b.record_check(false, 2, 3), Some(false));
        assert!(!b.routable());
        assert_eq!(b.record_check(true, 2, 3), None);
        assert_eq!(b.record_check(true, 2, 3), Some(true));
    }

    #[test]
    fn reload_keeps_surviving_targets_and_forgets_removed_ones() {
        let m = Metrics::new().expect("metrics");
        let mut cfg = RouterConfig {
            workers: vec![WorkerConfig {
                url: "http://a:1".into(),
                dp_rank: None,
            }],
            intra_node_data_parallel_size: 2,
            ..Default::default()
        };
        let first = TargetSet::build(&cfg, None, &m);
        assert_eq!(first.targets.len(), 2);
        assert_eq!(first.backends.len(), 1, "one backend per URL");
        let _busy = first.targets[0].begin();
        cfg.intra_node_data_parallel_size = 1;
        cfg.workers.push(WorkerConfig {
            url: "http://a:1".into(),
            dp_rank: Some(0),
        });
        cfg.workers.remove(0);
        let second = TargetSet::build(&cfg, Some(&first), &m);
        assert_eq!(second.targets.len(), 1);
        assert!(
            Arc::ptr_eq(&second.targets[0], &first.targets[0]),
            "a@0 survives with its state"
        );
        assert_eq!(second.targets[0].in_flight(), 1);
        // The backend stays, and with it its idle connections.
        assert!(Arc::ptr_eq(&second.backends[0], &first.backends[0]));
        let text = String::from_utf8(m.render()).expect("utf8");
        assert!(
            !text.contains("http://a:1@1"),
            "removed target's series are gone"
        );
    }

    #[test]
    fn recent_tpot_comes_from_histogram_growth_between_observations() {
        let b = Backend::new("http://127.0.0.1:1".into());
        let obs = |sum: f64, count: f64| Scrape {
            at: Instant::now(),
            engines: [(
                0,
                EngineSample {
                    itl_sum: sum,
                    itl_count: count,
                    ..Default::default()
                },
            )]
            .into_iter()
            .collect(),
        };
        b.set_observation(obs(10.0, 100.0));
        assert_eq!(
            b.observed(0).expect("seen").0.recent_tpot,
            None,
            "no previous"
        );
        b.set_observation(obs(12.0, 110.0));
        let t = b.observed(0).expect("seen").0.recent_tpot.expect("tpot");
        assert!((t - 0.2).abs() < 1e-9, "{t}");
        b.set_observation(obs(12.0, 110.0));
        assert_eq!(
            b.observed(0).expect("seen").0.recent_tpot,
            None,
            "nothing decoded"
        );
    }
}
