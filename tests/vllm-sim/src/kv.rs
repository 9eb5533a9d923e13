//! The KV block pool of one DP rank, with vLLM-style automatic prefix caching.
//!
//! Owns: a fixed pool of blocks, their reference counts, the hash → block map of cached full
//! blocks, and the free queue (blocks with no reference, least recently freed first). Mirrors the
//! behaviour of vLLM's KV cache manager that matters to scheduling:
//!
//! * a full block is identified by a chained hash (parent block's hash + the block's tokens);
//! * freed blocks keep their hash and stay reusable until allocation evicts them in LRU order;
//! * a sequence frees its blocks tail first, so its prefix is evicted last;
//! * usage is `1 − free / total`, counting cached-but-unreferenced blocks as free.
//!
//! It knows nothing about requests or time; the engine drives it.

use rustc_hash::FxHashMap;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Hash of the first block's parent.
pub const ROOT_HASH: u64 = 0x005E_ED0F_B10C;

/// Chained hash of one full block.
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    std::hash::Hasher::write_u64(&mut h, parent);
    for t in tokens {
        std::hash::Hasher::write_u32(&mut h, *t);
    }
    crate::tokenizer::splitmix(std::hash::Hasher::finish(&h))
}

/// Fills `out` with the chained hashes of the full blocks of `tokens`, starting after the
/// `out.len()` blocks already hashed.
pub fn extend_block_hashes(tokens: &[u32], block_size: usize, out: &mut Vec<u64>) {
    let full = tokens.len() / block_size;
    while out.len() < full {
        let i = out.len();
        let parent = out.last().copied().unwrap_or(ROOT_HASH);
        out.push(block_hash(
            parent,
            &tokens[i * block_size..(i + 1) * block_size],
        ));
    }
}

/// The block pool.
#[derive(Debug)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    hash: Vec<Option<u64>>,
    // Intrusive doubly linked free queue over block ids.
    prev: Vec<u32>,
    next: Vec<u32>,
    in_free: Vec<bool>,
    head: u32,
    tail: u32,
    free_len: usize,
    cached: FxHashMap<u64, BlockId>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` free, unhashed blocks.
    pub fn new(num_blocks: usize) -> Self {
        let n = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1) as usize;
        let mut pool = BlockPool {
            ref_count: vec![0; n],
            hash: vec![None; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            in_free: vec![false; n],
            head: NIL,
            tail: NIL,
            free_len: 0,
            cached: FxHashMap::default(),
            evictions: 0,
        };
        for b in 0..n as u32 {
            pool.push_free(b);
        }
        pool
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_count.len()
    }

    /// Blocks with no reference (free, whether or not they still hold cached content).
    pub fn num_free(&self) -> usize {
        self.free_len
    }

    /// Fraction of blocks referenced by sequences, as vLLM reports `kv_cache_usage_perc`.
    pub fn usage(&self) -> f64 {
        if self.num_blocks() == 0 {
            return 0.0;
        }
        1.0 - self.free_len as f64 / self.num_blocks() as f64
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Number of blocks currently holding a cached hash (referenced or not).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// The longest prefix of `hashes` whose blocks are cached, at most `max_blocks` long.
    pub fn lookup(&self, hashes: &[u64], max_blocks: usize) -> Vec<BlockId> {
        let mut hit = Vec::new();
        for h in hashes.iter().take(max_blocks) {
            match self.cached.get(h) {
                Some(b) => hit.push(*b),
                None => break,
            }
        }
        hit
    }

    /// How many of `blocks` are unreferenced (taking them consumes free blocks).
    pub fn count_unreferenced(&self, blocks: &[BlockId]) -> usize {
        blocks
            .iter()
            .filter(|b| self.ref_count[**b as usize] == 0)
            .count()
    }

    /// Takes a reference on cached blocks found by [`lookup`](Self::lookup).
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let i = *b as usize;
            if self.ref_count[i] == 0 {
                self.unlink(*b);
            }
            self.ref_count[i] += 1;
        }
    }

    /// Allocates `n` new blocks, evicting cached content in LRU order. `None` if fewer than `n`
    /// blocks are free; then nothing is allocated.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free_len {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            if let Some(h) = self.hash[b as usize].take() {
                if self.cached.get(&h) == Some(&b) {
                    self.cached.remove(&h);
                }
                self.evictions += 1;
            }
            self.ref_count[b as usize] = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Records that `block` now holds the full block identified by `hash`. A block whose content
    /// is already cached elsewhere stays unhashed (the first copy wins, as in vLLM).
    pub fn register(&mut self, block: BlockId, hash: u64) {
        if self.hash[block as usize].is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(block);
            self.hash[block as usize] = Some(hash);
        }
    }

    /// Drops one reference on each block of a sequence, tail first, so that the sequence's
    /// prefix is the last to be evicted.
    pub fn free(&mut self, blocks: &[BlockId]) {
        for b in blocks.iter().rev() {
            let i = *b as usize;
            debug_assert!(self.ref_count[i] > 0, "double free of block {b}");
            self.ref_count[i] = self.ref_count[i].saturating_sub(1);
            if self.ref_count[i] == 0 {
                self.push_free(*b);
            }
        }
    }

    /// Whether the block with `hash` is cached (for tests and diagnostics).
    pub fn is_cached(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    fn push_free(&mut self, b: BlockId) {
        let i = b as usize;
        debug_assert!(!self.in_free[i]);
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.in_free[i] = true;
        self.free_len += 1;
    }

    fn unlink(&mut self, b: BlockId) {
        let i = b as usize;
        debug_assert!(self.in_free[i]);
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_free[i] = false;
        self.free_len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(tokens: &[u32], bs: usize) -> Vec<u64> {
        let mut v = Vec::new();
        extend_block_hashes(tokens, bs, &mut v);
        v
    }

    #[test]
    fn chained_hash_depends_on_prefix() {
        let a = hashes(&[1, 2, 3, 4, 5, 6, 7, 8], 4);
        let b = hashes(&[9, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_eq!(a.len(), 2);
        assert_ne!(
            a[1], b[1],
            "same block content under another parent must differ"
        );
    }

    #[test]
    fn freed_blocks_stay_cached_until_evicted_lru() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate(2).expect("2 free");
        pool.register(a[0], 10);
        pool.register(a[1], 11);
        pool.free(&a);
        assert_eq!(pool.num_free(), 4);
        assert!(pool.is_cached(10) && pool.is_cached(11));
        // Two never-used blocks are at the head of the queue: allocating them evicts nothing.
        let b = pool.allocate(2).expect("2 free");
        assert_eq!(pool.evictions(), 0);
        // The next allocation evicts the tail block of `a` first (freed first), keeping its prefix.
        let c = pool.allocate(1).expect("1 free");
        assert_eq!(c, vec![a[1]]);
        assert!(pool.is_cached(10) && !pool.is_cached(11));
        assert_eq!(pool.evictions(), 1);
        assert!(pool.allocate(2).is_none());
        pool.free(&b);
        pool.free(&c);
        assert_eq!(pool.num_free(), 4);
    }

    #[test]
    fn touching_a_free_cached_block_takes_it_off_the_free_queue() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(1).expect("free");
        pool.register(a[0], 7);
        pool.free(&a);
        let hit = pool.lookup(&[7, 8], 2);
        assert_eq!(hit, a);
        assert_eq!(pool.count_unreferenced(&hit), 1);
        pool.touch(&hit);
        assert_eq!(pool.num_free(), 1);
        assert!((pool.usage() - 0.5).abs() < 1e-12);
        pool.free(&hit);
        assert_eq!(pool.num_free(), 2);
    }

    #[test]
    fn duplicate_content_keeps_the_first_copy() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(2).expect("free");
        pool.register(a[0], 5);
        pool.register(a[1], 5);
        assert_eq!(pool.num_cached(), 1);
        assert_eq!(pool.lookup(&[5], 1), vec![a[0]]);
    }
}
