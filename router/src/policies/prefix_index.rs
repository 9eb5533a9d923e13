//! An approximate prefix index over targets, shared by the `cache_aware` request policy and the
//! `cache_aware` Program binding.
//!
//! A prompt's bytes are cut into 64-byte blocks; block i is identified by hash(block i−1's id,
//! bytes), so a prompt is a chain of ids. A map records which targets (by id) saw each block and
//! when. Walking a chain finds, per target, how many leading blocks it has seen — what a radix
//! tree answers, at block granularity, without storing text. Memory is bounded per target (a
//! block budget); the least recently used blocks are evicted first.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

/// Bytes per block.
pub const BLOCK: usize = 64;

#[derive(Default)]
pub struct PrefixIndex {
    /// block id → (target slot, last use stamp)
    pub(super) blocks: FxHashMap<u64, Vec<(u16, u64)>>,
    /// per target slot: insertion log (block id, stamp) for LRU eviction, and live block count
    pub(super) logs: Vec<(VecDeque<(u64, u64)>, usize)>,
    slots: FxHashMap<String, u16>,
    stamp: u64,
}

impl PrefixIndex {
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

impl PrefixIndex {
    /// The block chain of `prompt`.
    pub fn chain(prompt: &[u8]) -> Vec<u64> {
        let mut out = Vec::with_capacity(prompt.len() / BLOCK + 1);
        let mut parent = 0x9e37_79b9_7f4a_7c15u64;
        for block in prompt.chunks(BLOCK) {
            let mut h = parent;
            for b in block {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            parent = crate::hash::stable_hash(&h.to_le_bytes());
            out.push(parent);
        }
        out
    }

    /// How many leading blocks of `chain` each of `ids` holds.
    pub fn matched(&mut self, chain: &[u64], ids: &[&str]) -> Vec<usize> {
        let slots: Vec<u16> = ids.iter().map(|id| self.slot(id)).collect();
        let mut matched = vec![0usize; ids.len()];
        let mut alive = vec![true; ids.len()];
        for (depth, id) in chain.iter().enumerate() {
            let Some(holders) = self.blocks.get(id) else {
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
        matched
    }

    /// Blocks `id` holds.
    pub fn cached_blocks(&mut self, id: &str) -> usize {
        let slot = self.slot(id);
        self.logs[slot as usize].1
    }

    /// Records that `id` saw `chain`, keeping at most `budget_blocks` blocks for it.
    pub fn record(&mut self, id: &str, chain: &[u64], budget_blocks: usize) {
        let slot = self.slot(id);
        self.insert(slot, chain, budget_blocks);
    }

    /// Drops everything `id` holds (a target that left).
    pub fn forget(&mut self, id: &str) {
        let Some(slot) = self.slots.get(id).copied() else {
            return;
        };
        self.blocks.retain(|_, holders| {
            holders.retain(|(s, _)| *s != slot);
            !holders.is_empty()
        });
        self.logs[slot as usize] = (VecDeque::new(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_blocks_per_target_and_forgetting() {
        let mut ix = PrefixIndex::default();
        let a = PrefixIndex::chain(&[b'a'; 640]);
        let mut b_bytes = vec![b'a'; 320];
        b_bytes.extend_from_slice(&[b'b'; 320]);
        let b = PrefixIndex::chain(&b_bytes);
        ix.record("t0", &a, 1000);
        ix.record("t1", &b, 1000);
        // b shares a's first 5 blocks: t0 matches 5 of b, t1 all 10.
        assert_eq!(ix.matched(&b, &["t0", "t1", "t2"]), vec![5, 10, 0]);
        assert_eq!(ix.cached_blocks("t0"), 10);
        ix.forget("t0");
        assert_eq!(ix.matched(&b, &["t0", "t1"]), vec![0, 10]);
        assert_eq!(ix.cached_blocks("t0"), 0);
        // The budget evicts the oldest blocks.
        ix.record("t2", &a, 4);
        assert_eq!(ix.cached_blocks("t2"), 4);
    }
}
