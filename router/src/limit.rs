//! The router-wide cap on requests in progress: vllm-router's `--max-concurrent-requests`,
//! `--queue-size` and `--queue-timeout-secs`, with the same meaning.
//!
//! Owns the count of proxied requests in progress and the bounded wait for a free place. A
//! request beyond `limits.max_concurrent_requests` waits, at most `limits.queue_size` of them
//! and each for up to `limits.queue_timeout_secs`; otherwise 429 `router_queue_full`, or 504
//! `queue_timeout` when the wait runs out (503 `shutting_down` once a drain closes the queues).
//! A place is held until the response body ends; a request waiting here has its body still
//! unread in the socket, so waiting costs no memory. Program scheduling's RequestPool and the
//! fair queue come after it: they wait inside their place.
//!
//! Also owns the count of a listener's open connections ([`Connections`]), capped per listener.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use http::StatusCode;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// One configuration's cap (rebuilt only when `max_concurrent_requests` changes).
pub struct Limiter {
    places: Arc<Semaphore>,
    max: u32,
    waiting: AtomicU32,
}

/// A place among the requests in progress, freed on drop.
pub type Place = OwnedSemaphorePermit;

/// Keeps the waiting count right however the wait ends.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Limiter {
    pub fn new(max: u32) -> Arc<Self> {
        Arc::new(Limiter {
            places: Arc::new(Semaphore::new(max as usize)),
            max,
            waiting: AtomicU32::new(0),
        })
    }

    pub fn max(&self) -> u32 {
        self.max
    }

    /// Requests in progress now.
    pub fn in_progress(&self) -> u32 {
        self.max - self.places.available_permits() as u32
    }

    /// Requests waiting for a place now.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// A place, at once or after waiting (see the module documentation); `closed` ends every
    /// wait with 503 `shutting_down`.
    pub async fn enter(
        &self,
        queue_size: u32,
        timeout: Duration,
        closed: impl Future<Output = ()>,
    ) -> Result<Place, ApiError> {
        if let Ok(p) = self.places.clone().try_acquire_owned() {
            return Ok(p);
        }
        let queued = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                (w < queue_size).then_some(w + 1)
            });
        if queued.is_err() {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "router_queue_full",
                format!(
                    "{} requests in progress and {queue_size} waiting; retry later",
                    self.max
                ),
            ));
        }
        let _waiting = Waiting(&self.waiting);
        tokio::select! {
            p = tokio::time::timeout(timeout, self.places.clone().acquire_owned()) => match p {
                Ok(Ok(p)) => Ok(p),
                // The semaphore is never closed; treat it like a timeout all the same.
                Ok(Err(_)) | Err(_) => Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "queue_timeout",
                    format!(
                        "the request waited longer than the queue timeout ({} s) for one of \
                         the router's {} places",
                        timeout.as_secs_f64(),
                        self.max
                    ),
                )),
            },
            _ = closed => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the router is shutting down; retry on another replica",
            )),
        }
    }
}

/// The request bytes the router holds in memory at once: bodies read and not yet answered
/// (waiting in the RequestPool or a fair queue, or in flight). `limits.max_buffered_bytes`.
#[derive(Debug, Default)]
pub struct ByteBudget {
    used: std::sync::atomic::AtomicU64,
}

/// Bytes taken from a [`ByteBudget`], given back when dropped (when the response ends).
pub struct BodyBytes(Arc<ByteBudget>, u64);

impl Drop for BodyBytes {
    fn drop(&mut self) {
        self.0.used.fetch_sub(self.1, Ordering::AcqRel);
    }
}

impl ByteBudget {
    /// Takes `n` bytes unless that would pass `max` (`None`: no budget).
    pub fn take(self: &Arc<Self>, n: u64, max: Option<u64>) -> Option<BodyBytes> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let after = used.saturating_add(n);
            if max.is_some_and(|m| after > m) {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Acquire)
            {
                // What was added (less than `n` only where the count saturated).
                Ok(_) => return Some(BodyBytes(self.clone(), after - used)),
                Err(now) => used = now,
            }
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

/// The open connections of one listener.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    closed: Notify,
}

/// One open connection; closing it (dropping this) frees its place.
pub struct Open(Arc<Connections>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.closed.notify_waiters();
    }
}

impl Connections {
    /// A place for one more connection, unless `max` are open.
    pub fn open(self: &Arc<Self>, max: Option<usize>) -> Option<Open> {
        let mut n = self.open.load(Ordering::Acquire);
        loop {
            if max.is_some_and(|m| n >= m) {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(Open(self.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// How many are open.
    pub fn count(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Resolves once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            closed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn places_then_a_bounded_queue_then_429_and_504() {
        let l = Limiter::new(1);
        let never = || std::future::pending::<()>();
        let first = l
            .enter(1, Duration::from_secs(5), never())
            .await
            .expect("a free place");
        assert_eq!((l.in_progress(), l.waiting()), (1, 0));
        // One may wait; the next is refused at once.
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            l2.enter(1, Duration::from_secs(5), std::future::pending::<()>())
                .await
        });
        while l.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        let full = l
            .enter(1, Duration::from_secs(5), never())
            .await
            .expect_err("queue full");
        assert_eq!(
            (full.status.as_u16(), full.code),
            (429, "router_queue_full")
        );
        drop(first);
        let second = waiter.await.expect("task").expect("got the freed place");
        assert_eq!((l.in_progress(), l.waiting()), (1, 0));
        // A wait that outlasts the timeout, and one ended by a drain.
        let late = l
            .enter(1, Duration::from_millis(20), never())
            .await
            .expect_err("timeout");
        assert_eq!((late.status.as_u16(), late.code), (504, "queue_timeout"));
        let closed = l
            .enter(1, Duration::from_secs(5), async {})
            .await
            .expect_err("draining");
        assert_eq!(closed.code, "shutting_down");
        assert_eq!(l.waiting(), 0, "every ended wait left the queue");
        drop(second);
        assert_eq!(l.in_progress(), 0);
        // No queue at all: 429 at once (vllm-router's queue_size 0).
        let _p = l
            .enter(0, Duration::from_secs(5), never())
            .await
            .expect("free");
        let e = l
            .enter(0, Duration::from_secs(5), never())
            .await
            .expect_err("no queue");
        assert_eq!(e.status.as_u16(), 429);
    }

    #[tokio::test]
    async fn caps_and_counts_open_connections_and_waits_for_the_last() {
        let c = Arc::new(Connections::default());
        let a = c.open(Some(2)).expect("first");
        let b = c.open(Some(2)).expect("second");
        assert!(c.open(Some(2)).is_none(), "at the cap");
        assert_eq!(c.count(), 2);
        let unbounded = c.open(None).expect("no cap");
        drop(unbounded);
        drop(a);
        assert!(c.open(Some(2)).is_some(), "a place freed");
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { c.all_closed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("resolves once the last closes")
            .expect("task");
    }

    #[test]
    fn the_byte_budget_refuses_past_its_bound_and_frees_on_drop() {
        let b = Arc::new(ByteBudget::default());
        let first = b.take(60, Some(100)).expect("fits");
        assert!(b.take(50, Some(100)).is_none(), "110 > 100");
        let second = b.take(40, Some(100)).expect("exactly 100");
        assert_eq!(b.used(), 100);
        drop(first);
        assert_eq!(b.used(), 40);
        assert!(
            b.take(u64::MAX, None).is_some(),
            "no budget: saturates, never wraps"
        );
        drop(second);
        assert_eq!(b.used(), 0);
    }
}
