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

/// One block's bookkeeping, kept together so that touching a block costs one cache miss (a
/// replay over many ranks touches thousands of random blocks per request).
#[derive(Debug, Clone, Copy)]
struct Block {
    hash: Option<u64>,
    ref_count: u32,
    // Intrusive doubly linked free queue over block ids.
    prev: u32,
    next: u32,
    in_free: bool,
}

/// The block pool.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free_len: usize,
    cached: FxHashMap<u64, BlockId>,
    evictions: u64,
    /// Every hash ever registered, when kept (the free-retention bound; unbounded).
    ever: Option<rustc_hash::FxHashSet<u64>>,
}

impl BlockPool {
    /// A pool of `num_blocks` free, unhashed blocks.
    pub fn new(num_blocks: usize) -> Self {
        let n = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1) as usize;
        let mut pool = BlockPool {
            blocks: vec![
                Block {
                    hash: None,
                    ref_count: 0,
                    prev: NIL,
                    next: NIL,
                    in_free: false,
                };
                n
            ],
            head: NIL,
            tail: NIL,
            free_len: 0,
            cached: FxHashMap::default(),
            evictions: 0,
            ever: None,
        };
        for b in 0..n as u32 {
            pool.push_free(b);
        }
        pool
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
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
            .filter(|b| self.blocks[**b as usize].ref_count == 0)
            .count()
    }

    /// Takes a reference on cached blocks found by [`lookup`](Self::lookup).
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let i = *b as usize;
            if self.blocks[i].ref_count == 0 {
                self.unlink(*b);
            }
            self.blocks[i].ref_count += 1;
        }
    }

    /// Allocates `n` new blocks, evicting cached content in LRU order. `None` if fewer than `n`
    /// blocks are free; then nothing is allocated.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let mut out = Vec::with_capacity(n);
        self.allocate_into(n, &mut out).then_some(out)
    }

    /// [`allocate`](Self::allocate), appending the blocks to `out` (a sequence's own block list).
    /// `false` if fewer than `n` blocks are free; then nothing is allocated.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<BlockId>) -> bool {
        if n > self.free_len {
            return false;
        }
        out.reserve(n);
        for _ in 0..n {
            let b = self.head;
            self.unlink(b);
            if let Some(h) = self.blocks[b as usize].hash.take() {
                if self.cached.get(&h) == Some(&b) {
                    self.cached.remove(&h);
                }
                self.evictions += 1;
            }
            self.blocks[b as usize].ref_count = 1;
            out.push(b);
        }
        true
    }

    /// Remembers every hash registered from now on (see [`ever_computed`](Self::ever_computed)).
    pub fn keep_ever_computed(&mut self) {
        self.ever.get_or_insert_with(Default::default);
    }

    /// How many leading `hashes` were ever registered (0 unless they are kept).
    pub fn ever_computed(&self, hashes: &[u64]) -> usize {
        match &self.ever {
            Some(ever) => hashes.iter().take_while(|h| ever.contains(h)).count(),
            None => 0,
        }
    }

    /// Records that `block` now holds the full block identified by `hash`. A block whose content
    /// is already cached elsewhere stays unhashed (the first copy wins, as in vLLM).
    pub fn register(&mut self, block: BlockId, hash: u64) {
        if let Some(ever) = &mut self.ever {
            ever.insert(hash);
        }
        if self.blocks[block as usize].hash.is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(block);
            self.blocks[block as usize].hash = Some(hash);
        }
    }

    /// Drops one reference on each block of a sequence, tail first, so that the sequence's
    /// prefix is the last to be evicted.
    pub fn free(&mut self, blocks: &[BlockId]) {
        for b in blocks.iter().rev() {
            let i = *b as usize;
            debug_assert!(self.blocks[i].ref_count > 0, "double free of block {b}");
            self.blocks[i].ref_count = self.blocks[i].ref_count.saturating_sub(1);
            if self.blocks[i].ref_count == 0 {
                self.push_free(*b);
            }
        }
    }

    /// Whether the block with `hash` is cached (for tests and diagnostics).
    pub fn is_cached(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Moves the free cached blocks of `hashes` (a chain, prefix first) to the front of the
    /// free queue, so that they are evicted before anything else, the chain's tail first.
    pub fn demote(&mut self, hashes: &[u64]) {
        for h in hashes {
            let Some(&b) = self.cached.get(h) else {
                continue;
            };
            let i = b as usize;
            if self.blocks[i].ref_count != 0 {
                continue;
            }
            self.unlink(b);
            self.link(b, true);
        }
    }

    fn push_free(&mut self, b: BlockId) {
        self.link(b, false);
    }

    /// Puts unreferenced block `b` in the free queue: at the back (evicted last) or the front.
    fn link(&mut self, b: BlockId, front: bool) {
        let i = b as usize;
        debug_assert!(!self.blocks[i].in_free);
        if front {
            self.blocks[i].prev = NIL;
            self.blocks[i].next = self.head;
            match self.head {
                NIL => self.tail = b,
                h => self.blocks[h as usize].prev = b,
            }
            self.head = b;
        } else {
            self.blocks[i].prev = self.tail;
            self.blocks[i].next = NIL;
            match self.tail {
                NIL => self.head = b,
                t => self.blocks[t as usize].next = b,
            }
            self.tail = b;
        }
        self.blocks[i].in_free = true;
        self.free_len += 1;
    }

    fn unlink(&mut self, b: BlockId) {
        let i = b as usize;
        debug_assert!(self.blocks[i].in_free);
        let (p, n) = (self.blocks[i].prev, self.blocks[i].next);
        if p == NIL {
            self.head = n;
        } else {
            self.blocks[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.blocks[n as usize].prev = p;
        }
        self.blocks[i].prev = NIL;
        self.blocks[i].next = NIL;
        self.blocks[i].in_free = false;
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
    fn demoted_blocks_are_evicted_first_and_referenced_ones_stay() {
        let mut pool = BlockPool::new(6);
        let a = pool.allocate(2).expect("2 free");
        pool.register(a[0], 10);
        pool.register(a[1], 11);
        pool.free(&a);
        let b = pool.allocate(2).expect("2 free");
        pool.register(b[0], 20);
        pool.register(b[1], 21);
        pool.free(&b);
        let held = pool.allocate(1).expect("1 free");
        pool.register(held[0], 30);
        // b was freed last, so LRU would evict a first; the hint puts b in front, tail first.
        pool.demote(&[20, 21, 30, 99]);
        assert_eq!(
            pool.num_free(),
            5,
            "a referenced block is not freed by a hint"
        );
        pool.allocate(1).expect("1 free");
        assert!(pool.is_cached(20) && !pool.is_cached(21), "the tail first");
        pool.allocate(2).expect("2 free");
        assert!(!pool.is_cached(20), "demoted: evicted before older blocks");
        assert!(pool.is_cached(10) && pool.is_cached(11), "older, kept");
        assert!(pool.is_cached(30), "referenced, untouched");
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
