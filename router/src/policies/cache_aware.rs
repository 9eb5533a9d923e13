//! cache_aware: send a prompt where its longest prefix was sent before, unless load is imbalanced.
//!
//! The "approximate prefix tree" is a chain of block hashes: the prompt's bytes are cut into
//! 64-byte blocks, block i is identified by hash(block i−1's id, bytes), and a map records which
//! targets saw each block and when. Walking a prompt's chain finds, per target, how many leading
//! blocks it has seen — the same answer a radix tree gives, at block granularity, without storing
//! text. Memory is bounded per target (`max_tree_size` bytes of prompt); the least recently used
//! blocks are evicted first.
//!
//! Decision, per request: if `max_load − min_load > balance_abs_threshold` and
//! `max_load > min_load × balance_rel_threshold` (load = requests in flight), take the least
//! loaded target. Otherwise, if the best match covers more than `cache_threshold` of the prompt,
//! take the target with the longest match; else the target with the least cached content.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use super::{Policy, RequestInfo};
use crate::config::PolicyConfig;
use crate::workers::TargetState;

const BLOCK: usize = 64;

#[derive(Default)]
struct Tree {
    /// block id → (target slot, last use stamp)
    blocks: FxHashMap<u64, Vec<(u16, u64)>>,
    /// per target slot: insertion log (block id, stamp) for LRU eviction, and live block count
    logs: Vec<(VecDeque<(u64, u64)>, usize)>,
    slots: FxHashMap<String, u16>,
    stamp: u64,
}

impl Tree {
    fn slot(&mut self, id: &str) -> u16 {
        if let Some(s) = self.slots.get(id) {
            return *s;
        }
        let s = u16::try_from(self.logs.len()).unwrap_or(u16::MAX);
        self.slots.insert(id.to_string(), s);
        self.logs.push((VecDeque::new(), 0));
        s
    }

    fn insert(&mut self, slot: u16, chain: &[u64], budget_blocks: usize) {
        for id in chain {
            self.stamp += 1;
            let stamp = self.stamp;
            let holders = self.blocks.entry(*id).or_default();
            match holders.iter_mut().find(|(s, _)| *s == slot) {
                Some(h) => h.1 = stamp,
                None => {
                    holders.push((slot, stamp));
                    self.logs[slot as usize].1 += 1;
                }
            }
            self.logs[slot as usize].0.push_back((*id, stamp));
        }
        self.evict(slot, budget_blocks);
    }

    fn evict(&mut self, slot: u16, budget_blocks: usize) {
        let (log, live) = &mut self.logs[slot as usize];
        while *live > budget_blocks {
            let Some((id, stamp)) = log.pop_front() else {
                break;
            };
            let Some(holders) = self.blocks.get_mut(&id) else {
                continue;
            };
            // Only the newest log record of a block for this slot removes it.
            if let Some(pos) = holders
                .iter()
                .position(|(s, st)| *s == slot && *st == stamp)
            {
                holders.swap_remove(pos);
                *live -= 1;
                if holders.is_empty() {
                    self.blocks.remove(&id);
                }
            }
        }
        // Refreshed blocks leave stale records behind; compact when they dominate.
        if log.len() > 2 * *live + 1024 {
            let blocks = &self.blocks;
            log.retain(|(id, stamp)| {
                blocks
                    .get(id)
                    .is_some_and(|h| h.iter().any(|(s, st)| *s == slot && st == stamp))
            });
        }
    }
}

pub struct CacheAware {
    cfg: PolicyConfig,
    tree: Mutex<Tree>,
}

impl CacheAware {
    pub fn new(cfg: &PolicyConfig) -> Self {
        CacheAware {
            cfg: cfg.clone(),
            tree: Mutex::new(Tree::default()),
        }
    }

    fn chain(prompt: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(prompt.len() / BLOCK + 1);
        let mut parent = 0x9e37_79b9_7f4a_7c15u64;
        for block in prompt.chunks(BLOCK) {
            let mut h = parent;
            for b in block {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            parent = super::stable_hash(&h.to_le_bytes());
            out.push(parent);
        }
        out
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
        let chain = Self::chain(req.prompt);
        let mut tree = self.tree.lock().unwrap_or_else(|p| p.into_inner());
        let slots: Vec<u16> = candidates.iter().map(|t| tree.slot(&t.id)).collect();
        let choice = if imbalanced || chain.is_empty() {
            min_i
        } else {
            // Leading blocks each candidate holds.
            let mut matched = vec![0usize; candidates.len()];
            let mut alive = vec![true; candidates.len()];
            for (depth, id) in chain.iter().enumerate() {
                let Some(holders) = tree.blocks.get(id) else {
                    break;
                };
                let mut any = false;
                for (c, slot) in slots.iter().enumerate() {
                    if alive[c] && holders.iter().any(|(s, _)| s == slot) {
                        matched[c] = depth + 1;
                        any = true;
                    } else {
                        alive[c] = false;
                    }
                }
                if !any {
                    break;
                }
            }
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
                    .min_by_key(|c| (tree.logs[slots[*c] as usize].1, loads[*c]))
                    .unwrap_or(0)
            }
        };
        let budget = self.budget_blocks();
        tree.insert(slots[choice], &chain, budget);
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
