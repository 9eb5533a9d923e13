//! One DP rank served in real time: the engine behind a mutex, a driver task that advances it
//! to `wall clock × time scale`, and per-request subscriptions for its events.
//!
//! Owns the mapping between simulated and wall-clock time and the delivery of engine events to
//! the request handlers; it never parses HTTP.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::sync::{Notify, mpsc};

use crate::engine::{Engine, EngineEvent, EngineParams, Load, Outcome, SeqId, SeqRequest};

/// Simulated time: seconds since start × scale.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    start: Instant,
    scale: f64,
}

impl SimClock {
    pub fn new(scale: f64) -> Self {
        SimClock {
            start: Instant::now(),
            scale,
        }
    }

    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.scale
    }

    /// The wall-clock instant at which simulated time reaches `t`.
    pub fn wall_at(&self, t: f64) -> Instant {
        let secs = (t / self.scale).clamp(0.0, 1e9);
        self.start + Duration::from_secs_f64(secs)
    }
}

/// What a request handler receives.
#[derive(Debug)]
pub enum RankMsg {
    Token { index: u32 },
    Done(Outcome),
}

struct Subscriber {
    tx: mpsc::UnboundedSender<RankMsg>,
    tokens: bool,
    /// The request is its Program's last; its first this many prompt tokens may be shared.
    ends_program: Option<usize>,
}

struct Inner {
    engine: Engine,
    subs: FxHashMap<SeqId, Subscriber>,
    scratch: Vec<EngineEvent>,
}

impl Inner {
    fn advance(&mut self, now: f64) {
        let mut events = std::mem::take(&mut self.scratch);
        self.engine.advance(now, &mut events);
        for ev in events.drain(..) {
            match ev {
                EngineEvent::Token { id, index, .. } => {
                    if let Some(s) = self.subs.get(&id)
                        && s.tokens
                    {
                        let _ = s.tx.send(RankMsg::Token { index });
                    }
                }
                EngineEvent::Finished {
                    id,
                    outcome,
                    tokens,
                } => {
                    if let Some(s) = self.subs.remove(&id) {
                        if let Some(shared) = s.ends_program {
                            self.program_ended(&tokens, shared);
                        }
                        let _ = s.tx.send(RankMsg::Done(outcome));
                    }
                }
            }
        }
        self.scratch = events;
    }

    /// A Program's last request finished with `tokens` (prompt and output): the blocks past
    /// those filled by its `shared` leading tokens are the Program's own, and an engine told of
    /// ends (`--end-hint`) evicts them first. A block that mixes shared and own tokens is the
    /// Program's: no other Program has it.
    fn program_ended(&mut self, tokens: &[u32], shared: usize) {
        if !self.engine.params().end_hint {
            return;
        }
        let block_size = self.engine.params().block_size;
        let mut hashes = Vec::with_capacity(tokens.len() / block_size);
        crate::kv::extend_block_hashes(tokens, block_size, &mut hashes);
        let own = shared / block_size;
        self.engine.program_ended(hashes.get(own..).unwrap_or(&[]));
    }
}

/// A rank and its driver.
pub struct Rank {
    pub global_rank: u32,
    clock: SimClock,
    inner: Mutex<Inner>,
    wake: Notify,
}

impl Rank {
    pub fn new(global_rank: u32, params: EngineParams, clock: SimClock) -> Arc<Self> {
        Arc::new(Rank {
            global_rank,
            clock,
            inner: Mutex::new(Inner {
                engine: Engine::new(params),
                subs: FxHashMap::default(),
                scratch: Vec::new(),
            }),
            wake: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is a bug; keep serving with the state as it is.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submits a request; `stream_tokens` asks for one message per generated token;
    /// `ends_program`: the request is its Program's last, whose first that many prompt tokens
    /// other Programs may share.
    pub fn submit(
        self: &Arc<Self>,
        req: SeqRequest,
        stream_tokens: bool,
        ends_program: Option<usize>,
    ) -> (Submission, mpsc::UnboundedReceiver<RankMsg>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut g = self.lock();
            let now = self.clock.now();
            g.advance(now);
            let id = g.engine.submit(req, now);
            g.subs.insert(
                id,
                Subscriber {
                    tx,
                    tokens: stream_tokens,
                    ends_program,
                },
            );
            id
        };
        self.wake.notify_one();
        (
            Submission {
                rank: self.clone(),
                id,
                done: false,
            },
            rx,
        )
    }

    pub fn load(&self) -> Load {
        self.lock().engine.load()
    }

    /// Runs `f` on the engine (for metrics snapshots).
    pub fn with_engine<T>(&self, f: impl FnOnce(&Engine) -> T) -> T {
        f(&self.lock().engine)
    }

    fn abort(&self, id: SeqId) {
        let mut g = self.lock();
        g.subs.remove(&id);
        let now = self.clock.now();
        g.engine.abort(id, now);
        drop(g);
        self.wake.notify_one();
    }

    /// Advances the engine in real time until `shutdown` resolves.
    pub async fn drive(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            let next = {
                let mut g = self.lock();
                g.advance(self.clock.now());
                g.engine.next_event_time()
            };
            let sleep = async {
                match next {
                    Some(t) => tokio::time::sleep_until(self.clock.wall_at(t).into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = sleep => {}
                _ = self.wake.notified() => {}
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { return; }
                }
            }
        }
    }
}

/// A submitted request; dropping it before completion aborts the request in the engine (the
/// client went away), as vLLM does when a connection closes.
pub struct Submission {
    rank: Arc<Rank>,
    id: SeqId,
    done: bool,
}

impl Submission {
    /// Marks the request finished so that drop does not abort it.
    pub fn finish(&mut self) {
        self.done = true;
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.done {
            self.rank.abort(self.id);
        }
    }
}
