//! A backend's idle upstream connections: one LIFO stack of keep-alive HTTP/1.1 connections per
//! I/O shard, each on cache lines of its own.
//!
//! Owns which idle connection a request may take (open, and younger than [`IDLE_TIMEOUT`]) and
//! the bound on those kept (1,024 per stack). Connecting and sending are the proxy's
//! (`crate::proxy::upstream`); the relay returns a connection only once its response was read to
//! the end. The stacks live in their [`super::Backend`], so they follow it across reloads: a
//! backend that stays keeps its connections, one that leaves drops them.
//!
//! With I/O shards (one single-threaded runtime per core, `crate::server`) a connection's driver
//! task runs on the shard that opened it, so each shard takes from its own stack: handing a
//! connection to a request on another shard would cost two cross-thread wake-ups per request.
//! A shard locks its stack twice a request (take, return); padded, no two shards' locks share a
//! line.

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;

use crate::observe::sharded::Padded;

/// The sending half of one upstream connection.
pub type Sender = SendRequest<Full<Bytes>>;

/// Idle connections kept per stack; more are closed when returned.
const MAX_IDLE: usize = 1024;
/// An idle connection older than this is closed instead of reused. Below vLLM's own idle
/// keep-alive timeout (uvicorn's, 5 s): a connection the backend closes at the very moment a
/// request is written to it loses that request, and since the backend may have read it the
/// router cannot send it again. Reusing only connections younger than the backend's timeout
/// keeps requests out of that race; older ones would mostly be closed already anyway.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

struct Idle {
    sender: Sender,
    since: Instant,
}

thread_local! {
    /// The I/O shard this thread runs (0 outside shards).
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as I/O shard `i`: its requests use that shard's idle stack.
pub fn enter_shard(i: usize) {
    SHARD.with(|s| s.set(i));
}

static SLOTS: OnceLock<usize> = OnceLock::new();

/// Sizes every backend's stacks created from now on for `shards` I/O shards. The first call in a
/// process wins (routers started in one test process share it; shards beyond it share stacks,
/// which is correct, only slower).
pub fn size_for_shards(shards: usize) {
    let _ = SLOTS.set(shards.max(1));
}

/// Stacks per backend.
fn slots() -> usize {
    *SLOTS.get_or_init(|| 1)
}

/// The idle connections of one backend, one stack per I/O shard.
pub struct IdleConnections {
    stacks: Box<[Padded<Mutex<Vec<Idle>>>]>,
}

impl Default for IdleConnections {
    fn default() -> Self {
        IdleConnections {
            stacks: (0..slots())
                .map(|_| Padded(Mutex::new(Vec::new())))
                .collect(),
        }
    }
}

impl IdleConnections {
    /// This thread's stack.
    fn stack(&self) -> &Mutex<Vec<Idle>> {
        &self.stacks[SHARD.with(Cell::get) % self.stacks.len()].0
    }

    /// An idle connection younger than [`IDLE_TIMEOUT`] at `now`.
    pub fn take(&self, now: Instant) -> Option<Sender> {
        let mut idle = self.stack().lock().unwrap_or_else(|p| p.into_inner());
        while let Some(i) = idle.pop() {
            if !i.sender.is_closed() && now.saturating_duration_since(i.since) < IDLE_TIMEOUT {
                return Some(i.sender);
            }
        }
        None
    }

    /// Takes back a connection whose response was read to the end at `now` (the caller's
    /// clock reading: one fewer per request).
    pub fn put(&self, sender: Sender, now: Instant) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.stack().lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= MAX_IDLE {
            idle.retain(|i| !i.sender.is_closed());
            if idle.len() >= MAX_IDLE {
                return;
            }
        }
        idle.push(Idle { sender, since: now });
    }

    /// Idle connections held now on this thread's stack.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.stack().lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shards_stack_lies_on_cache_lines_of_its_own() {
        let idle = IdleConnections {
            stacks: (0..3).map(|_| Padded(Mutex::new(Vec::new()))).collect(),
        };
        let at = |i: usize| std::ptr::from_ref(&idle.stacks[i].0) as usize;
        assert!(at(1) - at(0) >= 128 && at(2) - at(1) >= 128);
        assert_eq!(at(0) % 128, 0);
    }
}
