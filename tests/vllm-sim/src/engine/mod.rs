//! The engine model of one DP rank, stepped by explicit time.
//!
//! Owns continuous batching (`max_num_seqs`, chunked prefill under `max_num_batched_tokens`),
//! the waiting queue (FCFS or priority), KV allocation through [`BlockPool`], preemption by
//! recompute, step timing from [`TimingModel`] and the engine's counters.
//!
//! There is no clock and no I/O here: callers [`submit`](Engine::submit) at a time, then
//! [`advance`](Engine::advance) to a later time and collect the [`EngineEvent`]s of every step
//! that ended by then. The HTTP server drives it with wall-clock time × `--time-scale`; a
//! discrete-event harness drives the same code in virtual time.
//!
//! Without per-token events ([`Engine::set_token_events`]), a run of plain decode steps reports
//! nothing until a sequence finishes, so [`Engine::next_event_time`] looks ahead to that step
//! (the decode-run horizon) and a caller in virtual time wakes once per run instead of once per
//! step. The steps in between are still simulated one by one, with the same arithmetic, when the
//! caller advances or submits; [`Engine::sync`] brings the engine to a time before reading it.

mod seq;
pub mod stats;

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::kv::{BlockPool, extend_block_hashes};
use crate::timing::TimingModel;
use seq::Seq;
pub use seq::{FinishReason, SeqId, SeqRequest};
pub use stats::{EngineStats, Histogram};

/// Waiting-queue order, as vLLM's `--scheduling-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    #[default]
    Fcfs,
    Priority,
}

/// Shape of one engine.
#[derive(Debug, Clone)]
pub struct EngineParams {
    pub block_size: usize,
    pub num_gpu_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub policy: SchedulingPolicy,
    pub timing: TimingModel,
    /// A bound, not an engine: every prefix block ever computed stays a cache hit at no KV cost
    /// (a request still needs room for its whole context while it runs). What keeping prefixes
    /// could win at best, for benchmarks (`progbench matrix --bounds`); never in the server.
    pub free_retention: bool,
    /// A bound, not vLLM: the engine is told when a Program has ended
    /// ([`Engine::program_ended`]) and evicts its blocks before any other's. Stock vLLM's LRU
    /// cannot tell an ended Program from a paused one; for `progbench matrix --bounds` only.
    pub end_hint: bool,
}

impl Default for EngineParams {
    fn default() -> Self {
        EngineParams {
            block_size: 16,
            num_gpu_blocks: 8192,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 32768,
            policy: SchedulingPolicy::Fcfs,
            timing: TimingModel::default(),
            free_retention: false,
            end_hint: false,
        }
    }
}

impl EngineParams {
    /// KV token capacity (num_gpu_blocks × block_size).
    pub fn token_capacity(&self) -> usize {
        self.num_gpu_blocks * self.block_size
    }

    /// Checks a request against the engine's limits before it is submitted.
    pub fn check(&self, prompt_len: usize, max_tokens: u32) -> Result<(), String> {
        if prompt_len == 0 {
            return Err("the prompt is empty".into());
        }
        let total = prompt_len + max_tokens as usize;
        if total > self.max_model_len {
            return Err(format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                self.max_model_len, total, prompt_len, max_tokens
            ));
        }
        Ok(())
    }

    /// Checks the shape; the error names the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.block_size == 0 {
            return Err("block-size must be > 0".into());
        }
        if self.num_gpu_blocks == 0 {
            return Err("num-gpu-blocks must be > 0".into());
        }
        if self.max_num_seqs == 0 {
            return Err("max-num-seqs must be > 0".into());
        }
        if self.max_num_batched_tokens == 0 {
            return Err("max-num-batched-tokens must be > 0".into());
        }
        if self.max_model_len < 2 {
            return Err("max-model-len must be >= 2".into());
        }
        if self.max_model_len > self.token_capacity() {
            return Err(format!(
                "max-model-len ({}) is larger than the KV cache can hold (num-gpu-blocks × block-size = {})",
                self.max_model_len,
                self.token_capacity()
            ));
        }
        self.timing.validate()
    }
}

/// Something that happened at the end of a step.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Sequence `id` produced its `index`-th output token at `time`.
    Token {
        id: SeqId,
        index: u32,
        token: u32,
        time: f64,
    },
    /// Sequence `id` finished (after its last `Token` event, if any). `tokens` is the whole
    /// sequence, prompt then output: a replay continues the context from it without copying.
    Finished {
        id: SeqId,
        outcome: Outcome,
        tokens: Vec<u32>,
    },
}

/// The end of a sequence, with what usage reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: u32,
    pub cached_tokens: usize,
    pub arrival: f64,
    pub first_token: Option<f64>,
    pub finished: f64,
}

/// Instantaneous load, as the `/metrics` gauges report it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
}

struct Step {
    end: f64,
    scheduled: Vec<(SeqId, usize)>,
}

/// One DP rank's engine.
pub struct Engine {
    params: EngineParams,
    pool: BlockPool,
    seqs: FxHashMap<SeqId, Seq>,
    waiting: BTreeSet<(i64, u64, SeqId)>,
    running: Vec<SeqId>,
    step: Option<Step>,
    clock: f64,
    next_id: SeqId,
    next_order: u64,
    stats: EngineStats,
    token_events: bool,
    /// End of the step in which the current decode run's first sequence finishes (see the module
    /// doc); `None` when the next step's end is the next event.
    horizon: Option<f64>,
    /// Events of steps simulated by [`sync`](Self::sync), reported by the next `advance`.
    pending: Vec<EngineEvent>,
    /// The last completed step's list, reused by the next (no allocation per step).
    spare: Vec<(SeqId, usize)>,
}

impl Engine {
    /// A new engine at time 0. `params` must be valid ([`EngineParams::validate`]).
    pub fn new(params: EngineParams) -> Self {
        let mut pool = BlockPool::new(params.num_gpu_blocks);
        if params.free_retention {
            pool.keep_ever_computed();
        }
        Engine {
            pool,
            params,
            seqs: FxHashMap::default(),
            waiting: BTreeSet::new(),
            running: Vec::new(),
            step: None,
            clock: 0.0,
            next_id: 1,
            next_order: 0,
            stats: EngineStats::default(),
            token_events: true,
            horizon: None,
            pending: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Whether [`advance`](Self::advance) reports a [`EngineEvent::Token`] per generated token
    /// (default on, for streaming). A caller that needs only whole outputs turns them off and
    /// reads [`EngineEvent::Finished`]'s `tokens`.
    pub fn set_token_events(&mut self, on: bool) {
        self.token_events = on;
    }

    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// A Program has ended; `hashes` are the blocks no other Program shares. Under
    /// [`EngineParams::end_hint`] the free ones among them are evicted first; otherwise nothing.
    pub fn program_ended(&mut self, hashes: &[u64]) {
        if self.params.end_hint {
            self.pool.demote(hashes);
        }
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Time up to which the engine has been simulated.
    pub fn clock(&self) -> f64 {
        self.clock
    }

    pub fn load(&self) -> Load {
        Load {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_usage: self.pool.usage(),
        }
    }

    /// Whether any sequence is running or waiting.
    pub fn is_busy(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// The next time `advance` has something to report: the end of the step in progress, or of
    /// the decode run's finishing step when token events are off; now if work waits for a step.
    pub fn next_event_time(&self) -> Option<f64> {
        if !self.pending.is_empty() {
            return Some(self.clock);
        }
        match &self.step {
            Some(s) => Some(self.horizon.unwrap_or(s.end)),
            None if !self.waiting.is_empty() || !self.running.is_empty() => Some(self.clock),
            None => None,
        }
    }

    /// Simulates the steps that end at or before `now` without reporting them yet (the next
    /// `advance` does), so that [`load`](Self::load) and [`stats`](Self::stats) describe `now`.
    /// Like `advance` at each of those step ends, it starts the step that follows each of them;
    /// with no step in progress it does nothing (requests submitted at one instant share a step).
    pub fn sync(&mut self, now: f64) {
        if self.step.is_none() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        self.run_until(now, &mut pending);
        self.pending = pending;
    }

    /// Adds a request at time `now` (at or after the engine's clock). It joins the next step.
    pub fn submit(&mut self, req: SeqRequest, now: f64) -> SeqId {
        self.sync(now);
        self.horizon = None;
        if self.step.is_none() && now > self.clock {
            self.clock = now;
        }
        let id = self.next_id;
        self.next_id += 1;
        let order = self.next_order;
        self.next_order += 1;
        let seq = Seq::new(req, self.params.block_size, order, now.max(self.clock));
        self.waiting.insert(seq.wait_key(self.by_priority(), id));
        self.seqs.insert(id, seq);
        id
    }

    /// Removes a request wherever it is and frees its blocks. Returns its outcome, or `None` if
    /// the id is unknown (already finished).
    pub fn abort(&mut self, id: SeqId, now: f64) -> Option<Outcome> {
        self.sync(now);
        let seq = self.seqs.remove(&id)?;
        self.horizon = None;
        if seq.running {
            self.running.retain(|r| *r != id);
        } else {
            self.waiting.remove(&seq.wait_key(self.by_priority(), id));
        }
        self.pool.free(&seq.blocks);
        self.stats.finished_abort += 1;
        Some(outcome(&seq, FinishReason::Abort, now.max(self.clock)))
    }

    /// Simulates every step that ends at or before `until`, appending what happened to `events`.
    pub fn advance(&mut self, until: f64, events: &mut Vec<EngineEvent>) {
        events.append(&mut self.pending);
        self.run_until(until, events);
    }

    fn run_until(&mut self, until: f64, events: &mut Vec<EngineEvent>) {
        loop {
            if let Some(step) = &self.step {
                if step.end > until {
                    break;
                }
                let step = self.step.take().expect("checked above");
                self.clock = step.end;
                if self.horizon.is_some_and(|h| step.end >= h) {
                    self.horizon = None;
                }
                self.complete(step, events);
                continue;
            }
            if self.clock > until {
                break;
            }
            match self.schedule() {
                Some(step) => {
                    if self.horizon.is_none() {
                        self.horizon = self.decode_run_horizon(&step);
                    }
                    self.step = Some(step);
                }
                None => break,
            }
        }
        if self.step.is_none() && until > self.clock {
            self.clock = until;
        }
    }

    fn by_priority(&self) -> bool {
        self.params.policy == SchedulingPolicy::Priority
    }

    fn cdiv(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.params.block_size)
    }

    /// Picks what runs in the next step and how long it takes; `None` when there is nothing.
    fn schedule(&mut self) -> Option<Step> {
        let mut budget = self.params.max_num_batched_tokens;
        let mut scheduled = std::mem::take(&mut self.spare);
        scheduled.clear();
        let mut preempted_any = false;

        // Running sequences first: one decode token each, or the next prefill chunk.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (k, need) = {
                let s = &self.seqs[&id];
                let k = (s.tokens.len() - s.num_computed).min(budget);
                (
                    k,
                    self.cdiv(s.num_computed + k).saturating_sub(s.blocks.len()),
                )
            };
            let mut self_preempted = false;
            let mut shifted = false;
            loop {
                let blocks = &mut self.seqs.get_mut(&id).expect("running seq exists").blocks;
                if self.pool.allocate_into(need, blocks) {
                    break;
                }
                let victim = self.pick_victim();
                if victim == id {
                    self.preempt(id);
                    self_preempted = true;
                    break;
                }
                if let Some(pos) = scheduled.iter().position(|(s, _)| *s == victim) {
                    budget += scheduled.remove(pos).1;
                }
                self.preempt(victim);
                preempted_any = true;
                shifted = true;
            }
            if self_preempted {
                preempted_any = true;
                // `running[i]` is now the next sequence.
                continue;
            }
            if shifted {
                // A victim before `i` (priority policy) moves this sequence left.
                i = self.running.iter().position(|r| *r == id).unwrap_or(i);
            }
            scheduled.push((id, k));
            budget -= k;
            i += 1;
        }

        // Then waiting sequences, in queue order, while nothing was preempted in this step.
        while !preempted_any && budget > 0 && self.running.len() < self.params.max_num_seqs {
            let Some(&key) = self.waiting.first() else {
                break;
            };
            let id = key.2;
            let bs = self.params.block_size;
            let s = self.seqs.get_mut(&id).expect("waiting seq exists");
            extend_block_hashes(&s.tokens, bs, &mut s.hashes);
            let max_hit = (s.tokens.len() - 1) / bs;
            let hit = self.pool.lookup(&s.hashes, max_hit);
            // Under free retention, blocks computed before and evicted since count as hits too
            // (recomputed for free into fresh blocks).
            let ghosts = if self.params.free_retention {
                self.pool.ever_computed(&s.hashes[hit.len()..max_hit])
            } else {
                0
            };
            let computed = (hit.len() + ghosts) * bs;
            let k = (s.tokens.len() - computed).min(budget);
            let need = (computed + k).div_ceil(bs) - hit.len();
            let available = self.pool.num_free() - self.pool.count_unreferenced(&hit);
            if need > available {
                break;
            }
            self.pool.touch(&hit);
            let s = self.seqs.get_mut(&id).expect("waiting seq exists");
            s.blocks = hit;
            let allocated = self.pool.allocate_into(need, &mut s.blocks);
            assert!(allocated, "checked free blocks");
            s.num_computed = computed;
            // Resident hits are registered already; recovered ghosts are registered when their
            // step completes, as computed blocks are.
            s.registered = s.blocks.len().min(computed / bs - ghosts);
            s.prefill_done = 0;
            s.running = true;
            self.stats.prefix_cache_queries += s.tokens.len() as u64;
            self.stats.prefix_cache_hits += computed as u64;
            if s.cached_tokens.is_none() {
                s.cached_tokens = Some(computed.min(s.prompt_len));
            }
            if s.first_scheduled.is_none() {
                s.first_scheduled = Some(self.clock);
                self.stats.queue_time.observe(self.clock - s.arrival);
            }
            self.waiting.remove(&key);
            self.running.push(id);
            scheduled.push((id, k));
            budget -= k;
        }

        if scheduled.is_empty() {
            self.spare = scheduled;
            return None;
        }
        let timing = self.params.timing;
        let (mut prefill, mut batch, mut context) = (0.0, 0u64, 0u64);
        for (id, k) in &scheduled {
            let s = &self.seqs[id];
            if s.is_decode(*k) {
                batch += 1;
                context += s.tokens.len() as u64;
            } else {
                prefill += timing.prefill_chunk_seconds(s.prefill_done, *k as u64);
            }
        }
        let decode = timing.decode_step_seconds(batch, context);
        let dur = timing.mixed_step_seconds(prefill, decode);
        self.stats.steps += 1;
        Some(Step {
            end: self.clock + dur,
            scheduled,
        })
    }

    /// When token events are off and `step` starts a run of plain decode steps that nothing can
    /// change until a sequence finishes (every running sequence decodes, none waits, the free
    /// blocks cover the run's growth so nothing is preempted), the end of that finishing step,
    /// computed with exactly the arithmetic of [`schedule`](Self::schedule). `None` otherwise.
    fn decode_run_horizon(&self, step: &Step) -> Option<f64> {
        if self.token_events
            || !self.waiting.is_empty()
            || step.scheduled.len() != self.running.len()
        {
            return None;
        }
        let mut steps = u32::MAX;
        let mut context = 0u64;
        for (id, k) in &step.scheduled {
            let s = &self.seqs[id];
            if !s.is_decode(*k) {
                return None;
            }
            steps = steps.min(s.max_tokens.saturating_sub(s.outputs));
            context += s.tokens.len() as u64;
        }
        if steps <= 1 {
            return None;
        }
        let grow: usize = step
            .scheduled
            .iter()
            .map(|(id, _)| {
                let s = &self.seqs[id];
                self.cdiv(s.num_computed + steps as usize)
                    .saturating_sub(s.blocks.len())
            })
            .sum();
        if grow > self.pool.num_free() {
            return None;
        }
        let timing = self.params.timing;
        let batch = step.scheduled.len() as u64;
        let mut end = step.end;
        for _ in 1..steps {
            context += batch;
            let decode = timing.decode_step_seconds(batch, context);
            end += timing.mixed_step_seconds(0.0, decode);
        }
        Some(end)
    }

    /// The running sequence to preempt: the last admitted (FCFS) or the lowest priority.
    fn pick_victim(&self) -> SeqId {
        if self.by_priority() {
            *self
                .running
                .iter()
                .max_by_key(|id| {
                    let s = &self.seqs[*id];
                    (s.priority, s.order)
                })
                .expect("running is not empty while a running seq allocates")
        } else {
            *self.running.last().expect("running is not empty")
        }
    }

    fn preempt(&mut self, id: SeqId) {
        self.running.retain(|r| *r != id);
        let by_priority = self.by_priority();
        let s = self.seqs.get_mut(&id).expect("preempted seq exists");
        self.pool.free(&s.blocks);
        s.blocks.clear();
        s.num_computed = 0;
        s.prefill_done = 0;
        s.registered = 0;
        s.running = false;
        let key = s.wait_key(by_priority, id);
        self.waiting.insert(key);
        self.stats.preemptions += 1;
    }

    fn complete(&mut self, step: Step, events: &mut Vec<EngineEvent>) {
        let end = self.clock;
        let bs = self.params.block_size;
        // Inter-token latencies, run-length grouped: decoding sequences usually share one value.
        let mut itl: (f64, u64) = (0.0, 0);
        let mut finished: Vec<SeqId> = Vec::new();
        for &(id, k) in &step.scheduled {
            let Some(s) = self.seqs.get_mut(&id) else {
                continue;
            };
            if !s.running {
                continue;
            }
            let decode = s.is_decode(k);
            s.num_computed += k;
            if !decode {
                s.prefill_done += k as u64;
            }
            // Register every block whose tokens are now all computed.
            let full = s.num_computed / bs;
            if full > s.registered {
                extend_block_hashes(&s.tokens[..full * bs], bs, &mut s.hashes);
                for j in s.registered..full.min(s.blocks.len()) {
                    self.pool.register(s.blocks[j], s.hashes[j]);
                }
                s.registered = full;
            }
            if s.num_computed < s.tokens.len() {
                continue; // a prefill chunk that did not reach the end
            }
            let index = s.outputs;
            let token = crate::tokenizer::output_token_id(s.output_seed, index);
            s.tokens.push(token);
            s.outputs += 1;
            s.prefill_done = 0;
            self.stats.generation_tokens += 1;
            if s.first_token.is_none() {
                s.first_token = Some(end);
                self.stats.ttft.observe(end - s.arrival);
                self.stats.prompt_tokens += s.prompt_len as u64;
                self.stats.prompt_tokens_cached += s.cached_tokens.unwrap_or(0) as u64;
            } else {
                let gap = end - s.last_token;
                if itl.1 > 0 && gap != itl.0 {
                    self.stats.inter_token.observe_n(itl.0, itl.1);
                    itl.1 = 0;
                }
                itl = (gap, itl.1 + 1);
            }
            s.last_token = end;
            if self.token_events {
                events.push(EngineEvent::Token {
                    id,
                    index,
                    token,
                    time: end,
                });
            }
            if s.outputs >= s.max_tokens {
                finished.push(id);
            }
        }
        self.stats.inter_token.observe_n(itl.0, itl.1);
        if !finished.is_empty() {
            self.running.retain(|r| !finished.contains(r));
        }
        for id in finished {
            let Some(s) = self.seqs.remove(&id) else {
                continue;
            };
            self.pool.free(&s.blocks);
            self.stats.finished_length += 1;
            self.stats.e2e.observe(end - s.arrival);
            events.push(EngineEvent::Finished {
                id,
                outcome: outcome(&s, FinishReason::Length, end),
                tokens: s.tokens,
            });
        }
        self.spare = step.scheduled;
    }
}

fn outcome(s: &Seq, reason: FinishReason, now: f64) -> Outcome {
    Outcome {
        reason,
        prompt_tokens: s.prompt_len,
        completion_tokens: s.outputs,
        cached_tokens: s.cached_tokens.unwrap_or(0),
        arrival: s.arrival,
        first_token: s.first_token,
        finished: now,
    }
}

#[cfg(test)]
mod tests;
