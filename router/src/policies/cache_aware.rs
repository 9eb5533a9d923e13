//! cache_aware: send a prompt where its longest prefix was sent before, unless load is imbalanced.
//!
//! The "approximate prefix tree" is [`PrefixIndex`] (block-hash chains per target), bounded per
//! target by `max_tree_size` bytes of prompt.
//!
//! Decision, per request: if `max_load − min_load > balance_abs_threshold` and
//! `max_load > min_load × balance_rel_threshold` (load = requests in flight), take the least
//! loaded target. Otherwise, if the best match covers more than `cache_threshold` of the prompt,
//! take the target with the longest match; else the target with the least cached content.

use std::sync::{Arc, Mutex};

use super::prefix_index::{BLOCK, PrefixIndex};
use super::{Policy, RequestInfo};
use crate::config::PolicyConfig;
use crate::workers::TargetState;

pub struct CacheAware {
    cfg: PolicyConfig,
    tree: Mutex<PrefixIndex>,
}

impl CacheAware {
    pub fn new(cfg: &PolicyConfig) -> Self {
        CacheAware {
            cfg: cfg.clone(),
            tree: Mutex::new(PrefixIndex::default()),
        }
    }

    fn budget_blocks(&self) -> usize {
        usize::try_from(self.cfg.max_tree_size / BLOCK as u64)
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn pick(&self, req: &RequestInfo<'_>, candidates: &[&Arc<TargetState>]) -> usize {
        let loads: Vec<u64> = candidates.iter().map(|t| t.in_flight()).collect();
        let (min_i, min_load) = loads
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|(_, l)| *l)
            .unwrap_or((0, 0));
        let max_load = loads.iter().copied().max().unwrap_or(0);
        let imbalanced = max_load.saturating_sub(min_load) > self.cfg.balance_abs_threshold
            && max_load as f64 > min_load as f64 * self.cfg.balance_rel_threshold;
        let chain = PrefixIndex::chain(req.prompt);
        let ids: Vec<&str> = candidates.iter().map(|t| t.id.as_str()).collect();
        let mut tree = self.tree.lock().unwrap_or_else(|p| p.into_inner());
        let choice = if imbalanced || chain.is_empty() {
            min_i
        } else {
            let matched = tree.matched(&chain, &ids);
            let best = (0..candidates.len())
                .max_by(|a, b| {
                    matched[*a]
                        .cmp(&matched[*b])
                        .then(loads[*b].cmp(&loads[*a]))
                })
                .unwrap_or(0);
            let ratio = matched[best] as f64 / chain.len() as f64;
            if matched[best] > 0 && ratio > self.cfg.cache_threshold {
                best
            } else {
                // Little to reuse anywhere: grow the smallest cache.
                (0..candidates.len())
                    .min_by_key(|c| (tree.cached_blocks(ids[*c]), loads[*c]))
                    .unwrap_or(0)
            }
        };
        let budget = self.budget_blocks();
        tree.record(ids[choice], &chain, budget);
        choice
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::testing::*;

    fn prompt(tag: &str, len: usize) -> Vec<u8> {
        format!("{tag}:{}", "x".repeat(len)).into_bytes()
    }

    #[test]
    fn follows_the_longest_prefix_and_spreads_new_prompts() {
        let set = targets(3);
        let c = all(&set);
        let p = CacheAware::new(&PolicyConfig::default());
        let pick = |pr: &[u8]| {
            p.pick(
                &RequestInfo {
                    hash_key: None,
                    prompt: pr,
                },
                &c,
            )
        };
        let a = pick(&prompt("alpha", 2000));
        let b = pick(&prompt("beta", 2000));
        let g = pick(&prompt("gamma", 2000));
        let mut distinct = vec![a, b, g];
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "new prompts go to the emptiest cache");
        // A longer prompt sharing alpha's prefix follows it.
        let mut longer = prompt("alpha", 2000);
        longer.extend_from_slice(b"and a new turn");
        assert_eq!(pick(&longer), a);
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let set = targets(2);
        let c = all(&set);
        let cfg = PolicyConfig {
            balance_abs_threshold: 2,
            balance_rel_threshold: 1.5,
            ..Default::default()
        };
        let p = CacheAware::new(&cfg);
        let pr = prompt("same", 1000);
        let first = p.pick(
            &RequestInfo {
                hash_key: None,
                prompt: &pr,
            },
            &c,
        );
        let _busy: Vec<_> = (0..5).map(|_| set.targets[first].begin()).collect();
        assert_eq!(
            p.pick(
                &RequestInfo {
                    hash_key: None,
                    prompt: &pr
                },
                &c
            ),
            1 - first
        );
    }

    #[test]
    fn memory_is_bounded_per_target() {
        let set = targets(1);
        let c = all(&set);
        let cfg = PolicyConfig {
            max_tree_size: 64 * 100,
            ..Default::default()
        };
        let p = CacheAware::new(&cfg);
        for i in 0..50 {
            let pr = prompt(&format!("p{i}"), 64 * 20);
            p.pick(
                &RequestInfo {
                    hash_key: None,
                    prompt: &pr,
                },
                &c,
            );
        }
        let tree = p.tree.lock().expect("lock");
        assert!(tree.logs[0].1 <= 100, "live blocks {}", tree.logs[0].1);
        assert!(tree.blocks.len() <= 100);
        assert!(tree.logs[0].0.len() <= 2 * 100 + 1024);
    }
}
