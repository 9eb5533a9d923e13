//! Request-level routing policies for requests without Program identity.
//!
//! Each policy picks one target among the available candidates for a request; it never sends
//! anything. One file per policy; [`build`] makes the configured one.

mod cache_aware;
mod consistent_hash;
mod power_of_two;
pub mod prefix_index;
mod random;
mod round_robin;

use std::sync::Arc;

use crate::config::{PolicyKind, RouterConfig};
use crate::workers::{TargetSet, TargetState};

pub use cache_aware::CacheAware;
pub use consistent_hash::ConsistentHash;
pub use power_of_two::PowerOfTwo;
pub use random::Random;
pub use round_robin::RoundRobin;

/// What a policy may look at.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestInfo<'a> {
    /// Session-like key for consistent hashing (see [`crate::proxy::request::hash_key`]).
    pub hash_key: Option<&'a str>,
    /// The prompt (raw `messages` or `prompt` JSON) for prefix-affinity policies.
    pub prompt: &'a [u8],
}

/// A routing policy.
pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Index into `candidates` (never empty) of the target to use.
    fn pick(&self, req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize;
    /// Whether the policy reads backend observations (the router then polls `/metrics`).
    fn needs_observation(&self) -> bool {
        false
    }
    /// Whether the policy reads [`RequestInfo::hash_key`] (the router looks it up only then).
    fn reads_hash_key(&self) -> bool {
        false
    }
}

/// Builds the configured policy for `targets`.
pub fn build(cfg: &RouterConfig, targets: &TargetSet) -> Box<dyn Policy> {
    let p = &cfg.policy;
    match p.kind {
        PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
        PolicyKind::Random => Box::new(Random),
        PolicyKind::ConsistentHash => Box::new(ConsistentHash::new(
            targets.targets.iter().map(|t| t.id.as_str()),
            p.virtual_nodes,
        )),
        PolicyKind::PowerOfTwo => Box::new(PowerOfTwo::new(cfg.observation.interval_secs)),
        PolicyKind::CacheAware => Box::new(CacheAware::new(p)),
    }
}

pub use crate::hash::stable_hash;

#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::config::WorkerConfig;
    use crate::observe::metrics::Metrics;

    /// A target set of `n` unpinned targets `http://t{i}:1`.
    pub fn targets(n: usize) -> TargetSet {
        let cfg = RouterConfig {
            workers: (0..n)
                .map(|i| WorkerConfig {
                    url: format!("http://t{i}:1"),
                    dp_rank: None,
                })
                .collect(),
            ..Default::default()
        };
        let m = Metrics::new().expect("metrics");
        TargetSet::build(&cfg, None, &m)
    }

    pub fn all(set: &TargetSet) -> Vec<&Arc<TargetState>> {
        set.targets.iter().collect()
    }
}
