//! One sequence (request) inside an engine: its tokens, KV blocks and progress.

use crate::kv::BlockId;

/// Engine-local sequence id.
pub type SeqId = u64;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Produced `max_tokens` tokens.
    Length,
    /// Aborted by the client (connection closed) or by the server.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What a caller submits.
#[derive(Debug, Clone)]
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    /// Lower runs earlier under the priority policy (vLLM's convention).
    pub priority: i64,
    /// Seeds the generated token ids (equal prompts and seeds give equal outputs).
    pub output_seed: u64,
    /// Chained hashes of the prompt's leading full blocks ([`crate::kv::extend_block_hashes`]),
    /// when the caller already has them: a replay that grows one context turn after turn hashes
    /// only what each turn adds. Any leading part of the list (or none); entries beyond the
    /// prompt's full blocks are ignored. Wrong hashes give wrong cache hits, so only pass hashes
    /// computed with the engine's block size.
    pub prefix_hashes: Vec<u64>,
}

#[derive(Debug)]
pub(crate) struct Seq {
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_tokens: u32,
    pub priority: i64,
    pub output_seed: u64,
    /// Arrival order, for FCFS and as a tie-break.
    pub order: u64,
    pub arrival: f64,
    pub first_scheduled: Option<f64>,
    pub first_token: Option<f64>,
    pub last_token: f64,
    pub outputs: u32,
    /// Tokens whose KV is computed (cache hits included).
    pub num_computed: usize,
    /// Uncached tokens computed since the last (re)start of prefill, for the chunk cost.
    pub prefill_done: u64,
    pub blocks: Vec<BlockId>,
    pub hashes: Vec<u64>,
    /// How many leading blocks are registered in the prefix cache.
    pub registered: usize,
    /// Cached prompt tokens at first scheduling (what usage reports).
    pub cached_tokens: Option<usize>,
    pub running: bool,
}

impl Seq {
    pub fn new(req: SeqRequest, block_size: usize, order: u64, arrival: f64) -> Self {
        let prompt_len = req.prompt.len();
        let mut hashes = req.prefix_hashes;
        hashes.truncate(prompt_len / block_size);
        let mut tokens = req.prompt;
        tokens.reserve(req.max_tokens as usize);
        Seq {
            tokens,
            prompt_len,
            max_tokens: req.max_tokens,
            priority: req.priority,
            output_seed: req.output_seed,
            order,
            arrival,
            first_scheduled: None,
            first_token: None,
            last_token: arrival,
            outputs: 0,
            num_computed: 0,
            prefill_done: 0,
            blocks: Vec::new(),
            hashes,
            registered: 0,
            cached_tokens: None,
            running: false,
        }
    }

    /// Key of the waiting queue: priority (only under the priority policy), then arrival.
    pub fn wait_key(&self, by_priority: bool, id: SeqId) -> (i64, u64, SeqId) {
        (if by_priority { self.priority } else { 0 }, self.order, id)
    }

    /// Whether scheduling `k` tokens now is a plain decode step (the last generated token only).
    pub fn is_decode(&self, k: usize) -> bool {
        self.outputs > 0
            && k == 1
            && self.num_computed + 1 == self.tokens.len()
            && self.prefill_done == 0
    }
}
