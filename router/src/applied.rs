//! One applied configuration: the validated config with everything built from it (targets,
//! policy, the features' runtimes, keys, limiter, peers), swapped whole on reload.
//!
//! Owns what a request reads of the configuration in force (through a [`Handle`] of its
//! thread's own) and the publishing of backend observations to the features that subscribe to
//! them; building the next one from the previous is `crate::state`'s reload.

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::config::RouterConfig;
use crate::fair::runtime::{FairMetrics, FairRuntime};
use crate::policies::Policy;
use crate::program::metrics::ProgramMetrics;
use crate::program::runtime::ProgramRuntime;
use crate::workers::TargetSet;

/// One applied configuration.
pub struct Applied {
    pub config: RouterConfig,
    pub hash: String,
    pub targets: TargetSet,
    pub policy: Arc<dyn Policy>,
    pub loaded_at: SystemTime,
    pub generation: u64,
    /// Program scheduling over `targets` (indices are target positions), when enabled.
    pub program: Option<Arc<ProgramRuntime>>,
    /// Fair multi-tenant queueing, when enabled.
    pub fair: Option<Arc<FairRuntime>>,
    /// `Authorization` sent to workers (`Bearer <api_key>`), built once per configuration.
    pub authorization: Option<http::HeaderValue>,
    /// Keys from `api_key` or `client_api_keys` a client may present on proxied routes; `None`:
    /// none (see [`crate::auth::authorize`], which adds the key directory's).
    pub client_keys: Option<Arc<[crate::auth::ClientKey]>>,
    /// Clients have keys of their own (`client_api_keys` or a key directory), so a key names
    /// one client; with only `api_key`, every client presents the same key.
    pub named_clients: bool,
    /// The cap on requests in progress, when `limits.max_concurrent_requests` sets one.
    pub limiter: Option<Arc<crate::limit::Limiter>>,
    /// The other router replicas Program requests are forwarded to, when `peers` is set.
    pub peers: Option<Arc<crate::peers::Peers>>,
}

/// A request's hold on the configuration it runs under: a reference to a thread's own handle,
/// so that taking and dropping it writes a count only that thread writes, where cloning the
/// snapshot itself would write one count that every I/O thread shares twice a request.
pub type Handle = Arc<Arc<Applied>>;

thread_local! {
    static HANDLE_OF_THREAD: std::cell::RefCell<Option<Handle>> =
        const { std::cell::RefCell::new(None) };
}

/// The configuration in force in `current`, through this thread's handle
/// ([`crate::observe::sharded::handle_here`]): kept alive by the thread until its next call
/// after a reload ([`refresh_here`]).
pub fn here(current: &ArcSwap<Applied>) -> Handle {
    crate::observe::sharded::handle_here(&HANDLE_OF_THREAD, &current.load())
}

/// Points this thread's handle at the configuration in force, so that a thread without requests
/// does not keep a replaced configuration alive (each I/O thread calls it on every reload).
pub fn refresh_here(current: &ArcSwap<Applied>) {
    drop(here(current));
}

/// The limiter for `config`: `prev`'s when the cap is unchanged (its places and waiters carry
/// over a reload), a new one otherwise.
pub fn limiter(
    config: &RouterConfig,
    prev: Option<&Arc<crate::limit::Limiter>>,
) -> Option<Arc<crate::limit::Limiter>> {
    let max = config.limits.max_concurrent_requests?;
    match prev {
        Some(l) if l.max() == max => Some(l.clone()),
        _ => Some(crate::limit::Limiter::new(max)),
    }
}

/// The workers' `Authorization` header for `config`, if it names an API key that is a valid
/// header value (validation rejects one that is not).
pub fn authorization(config: &RouterConfig) -> Option<http::HeaderValue> {
    let key = config.api_key.as_ref()?;
    http::HeaderValue::from_str(&format!("Bearer {key}")).ok()
}

impl Applied {
    /// Publishes what `backend`'s `/metrics` said to the features that read it: Program
    /// scheduling takes each of its targets' engine counts.
    pub fn publish(&self, backend: &Arc<crate::workers::Backend>, obs: &crate::workers::Scrape) {
        let Some(rt) = &self.program else {
            return;
        };
        for t in self.targets.targets.iter() {
            if !Arc::ptr_eq(&t.backend, backend) {
                continue;
            }
            if let Some(e) = obs.engines.get(&t.spec.dp_rank.unwrap_or(0)) {
                rt.observe(
                    &t.id,
                    crate::program::scheduler::Observation {
                        waiting: e.waiting,
                        running: e.running,
                        kv_usage: e.kv_usage,
                        token_capacity: e.token_capacity,
                    },
                );
            }
        }
    }

    /// Publishes which targets can be reached now (health, breaker) to the features that bind
    /// work to targets: Program scheduling binds new Programs to reachable ones.
    pub fn publish_availability(&self) {
        let Some(rt) = &self.program else {
            return;
        };
        let now = std::time::Instant::now();
        for t in self.targets.targets.iter() {
            rt.set_available(&t.id, t.available(now));
        }
    }

    /// Tells the features that read backend load that a round of observations is complete:
    /// fair queueing re-reads the ranks' room.
    pub fn observed(&self) {
        if let Some(f) = &self.fair {
            f.observed();
        }
    }

    /// This configuration as forwarding reads it.
    pub fn route(&self) -> crate::proxy::Route<'_> {
        crate::proxy::Route {
            config: &self.config,
            targets: &self.targets,
            policy: self.policy.as_ref(),
            authorization: self.authorization.as_ref(),
            strip_client_key: self.client_keys.is_some()
                || self.config.client_api_keys_dir.is_some(),
        }
    }

    /// The keys in force for a request under this configuration and the key directory `dir`.
    pub fn keys<'a>(&'a self, dir: Option<&'a crate::auth::DirKeys>) -> crate::auth::Keys<'a> {
        crate::auth::Keys {
            listed: self.client_keys.as_deref(),
            dir: self.config.client_api_keys_dir.as_ref().and(dir),
            named: self.named_clients,
            workers_key: self.config.api_key.as_deref(),
            any_listed: self
                .config
                .client_api_keys
                .as_ref()
                .is_some_and(|k| !k.is_empty()),
        }
    }

    /// Whether anything reads backend `/metrics`.
    pub fn needs_observation(&self) -> bool {
        self.policy.needs_observation()
            || self.config.program_scheduling.is_some()
            || self.config.fairness.is_some()
    }
}

pub fn fair_runtime(
    config: &RouterConfig,
    targets: &TargetSet,
    metrics: &FairMetrics,
    observe: &Arc<Notify>,
) -> Option<Arc<FairRuntime>> {
    let cfg = config.fairness.clone()?;
    Some(FairRuntime::new(
        cfg,
        targets.targets.clone(),
        metrics.clone(),
        observe.clone(),
    ))
}

pub fn program_runtime(
    config: &RouterConfig,
    targets: &TargetSet,
    metrics: &ProgramMetrics,
) -> Option<Arc<ProgramRuntime>> {
    let ps = config.program_scheduling.clone()?;
    Some(ProgramRuntime::new(
        ps,
        &program_targets(targets),
        metrics.clone(),
    ))
}

pub fn program_targets(targets: &TargetSet) -> Vec<crate::program::runtime::TargetInfo> {
    targets
        .targets
        .iter()
        .map(|t| (t.id.clone(), t.spec.url.clone(), t.spec.dp_rank))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(generation: u64) -> Arc<Applied> {
        let config = RouterConfig::default();
        let metrics = crate::observe::metrics::Metrics::new().expect("metrics");
        let targets = TargetSet::build(&config, None, &metrics);
        let policy = crate::policies::build(&config, &targets).into();
        Arc::new(Applied {
            authorization: None,
            client_keys: None,
            named_clients: false,
            limiter: None,
            peers: None,
            config,
            hash: String::new(),
            targets,
            policy,
            loaded_at: SystemTime::now(),
            generation,
            program: None,
            fair: None,
        })
    }

    #[test]
    fn a_thread_reuses_its_handle_until_a_reload_and_then_lets_the_old_configuration_go() {
        let first = applied(1);
        let old = Arc::downgrade(&first);
        let current = ArcSwap::new(first);
        let (a, b) = (here(&current), here(&current));
        // One handle per thread and configuration: a request clones the thread's own.
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.generation, 1);
        let other = std::thread::scope(|s| s.spawn(|| here(&current)).join().expect("thread"));
        assert!(
            !Arc::ptr_eq(&a, &other),
            "another thread has a handle of its own"
        );
        assert!(Arc::ptr_eq(&*a, &*other), "on the same configuration");
        drop((a, b, other));
        current.store(applied(2));
        assert!(
            old.upgrade().is_some(),
            "the thread's handle still holds it"
        );
        refresh_here(&current);
        assert!(
            old.upgrade().is_none(),
            "refreshed: nothing holds the replaced one"
        );
        assert_eq!(here(&current).generation, 2);
    }
}
