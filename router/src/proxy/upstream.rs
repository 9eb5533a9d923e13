//! Upstream HTTP/1.1 connections of one backend: a LIFO stack of idle keep-alive connections.
//!
//! Owns connecting (timeout, TCP_NODELAY), handing an idle connection to a request, and taking it
//! back once its response was read to the end. A connection is only returned by the relay when
//! the body completed; one whose response was abandoned is dropped, which closes it (that is how
//! the engine learns the client left). A request that could not be written on a reused
//! connection (the backend closed it while idle — vLLM closes idle keep-alive connections after
//! 5 s) is sent again on a fresh one, since no byte of it reached the backend.
//!
//! With I/O shards (one single-threaded runtime per core, [`crate::server`]) each shard has its
//! own stack: a connection's driver task runs on the shard that opened it, so handing it to a
//! request on another shard would cost two cross-thread wake-ups per request.
//!
//! Why not hyper-util's pooled client: per request it runs a checkout future, a keyed pool lock
//! and a spawned task that waits for the connection to become idle again; this stack needs one
//! uncontended lock on take and one on return (measured in docs/benchmarks.md, router overhead).

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::observe::sharded::Padded;

/// The sending half of one upstream connection.
pub type Sender = SendRequest<Full<Bytes>>;

/// Idle connections kept per backend; more are closed when returned.
const MAX_IDLE: usize = 1024;
/// An idle connection older than this is closed instead of reused. Below vLLM's own idle
/// keep-alive timeout (uvicorn's, 5 s): a connection the backend closes at the very moment a
/// request is written to it loses that request, and since the backend may have read it the
/// router cannot send it again. Reusing only connections younger than the backend's timeout
/// keeps requests out of that race; older ones would mostly be closed already anyway.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Why a request could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made: nothing reached the backend, safe to retry elsewhere.
    #[error("connect: {0}")]
    Connect(String),
    /// The request may have reached the backend: never replay it.
    #[error("{0}")]
    Failed(#[from] hyper::Error),
}

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

/// Sizes every pool created from now on for `shards` I/O shards. The first call in a process
/// wins (routers started in one test process share it; shards beyond it share stacks, which
/// is correct, only slower).
pub fn size_for_shards(shards: usize) {
    let _ = SLOTS.set(shards.max(1));
}

/// Idle stacks per pool.
fn slots() -> usize {
    *SLOTS.get_or_init(|| 1)
}

/// The idle connections of one backend, one stack per I/O shard, each on cache lines of its own
/// (a shard locks its stack twice a request; unpadded, two shards' locks shared a line).
pub struct ConnPool {
    idle: Box<[Padded<Mutex<Vec<Idle>>>]>,
}

/// The proxy's connection pools, one per backend address, following the applied targets: a
/// backend that stays keeps its idle connections across reloads, one that left is dropped.
#[derive(Default)]
pub struct Pools {
    by_addr: arc_swap::ArcSwap<rustc_hash::FxHashMap<String, std::sync::Arc<ConnPool>>>,
}

impl Pools {
    /// The pool of `addr`; an address not among the applied targets (a request admitted just
    /// before a reload removed it) gets a pool of its own that keeps nothing.
    pub fn get(&self, addr: &str) -> std::sync::Arc<ConnPool> {
        self.by_addr.load().get(addr).cloned().unwrap_or_default()
    }

    /// Keeps one pool per address in `addrs`: existing ones carry over, new ones start empty.
    pub fn follow<'a>(&self, addrs: impl IntoIterator<Item = &'a str>) {
        let cur = self.by_addr.load();
        let next = addrs
            .into_iter()
            .map(|a| (a.to_string(), cur.get(a).cloned().unwrap_or_default()))
            .collect();
        self.by_addr.store(std::sync::Arc::new(next));
    }

    /// How many backends have a pool.
    pub fn len(&self) -> usize {
        self.by_addr.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for ConnPool {
    fn default() -> Self {
        ConnPool {
            idle: (0..slots())
                .map(|_| Padded(Mutex::new(Vec::new())))
                .collect(),
        }
    }
}

impl ConnPool {
    /// This thread's stack.
    fn stack(&self) -> &Mutex<Vec<Idle>> {
        &self.idle[SHARD.with(Cell::get) % self.idle.len()].0
    }

    /// An idle connection younger than [`IDLE_TIMEOUT`] at `now`.
    fn take(&self, now: Instant) -> Option<Sender> {
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

    /// Idle connections held now.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.stack().lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Sends `req` (origin-form URI, `Host` set) to `addr`, on an idle connection when there is
    /// one at `now` (the attempt's start). Returns the response head and the connection, to be
    /// [`put`](Self::put) back once the body was read to the end.
    pub async fn send(
        &self,
        addr: &str,
        connect_timeout: Duration,
        mut req: Request<Full<Bytes>>,
        now: Instant,
    ) -> Result<(Response<Incoming>, Sender), SendError> {
        loop {
            let (mut sender, reused) = match self.take(now) {
                Some(s) => (s, true),
                // Boxed: a new connection is the rare case, and its future is large.
                None => (Box::pin(connect(addr, connect_timeout)).await?, false),
            };
            // A returned connection finished its response; the connection task may still be
            // settling into idle, which takes no more than a poll.
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(SendError::Connect(e.to_string()));
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, sender)),
                Err(mut e) => match e.take_message() {
                    // Not written: the idle connection had just been closed by the backend.
                    Some(back) if reused => req = back,
                    _ => return Err(SendError::Failed(e.into_error())),
                },
            }
        }
    }
}

async fn connect(addr: &str, timeout: Duration) -> Result<Sender, SendError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| SendError::Connect(format!("timed out after {timeout:?}")))?
        .map_err(|e| SendError::Connect(e.to_string()))?;
    crate::net::tune(&stream);
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| SendError::Connect(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper::service::service_fn;
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn each_shards_stack_lies_on_cache_lines_of_its_own() {
        let pool = ConnPool {
            idle: (0..3).map(|_| Padded(Mutex::new(Vec::new()))).collect(),
        };
        let at = |i: usize| std::ptr::from_ref(&pool.idle[i].0) as usize;
        assert!(at(1) - at(0) >= 128 && at(2) - at(1) >= 128);
        assert_eq!(at(0) % 128, 0);
    }

    /// A loopback HTTP/1.1 server counting connections and requests; `keep_alive: false` closes
    /// every connection after its first response (a backend that drops idle connections).
    async fn server(keep_alive: bool) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let conns = Arc::new(AtomicUsize::new(0));
        let reqs = Arc::new(AtomicUsize::new(0));
        let (c, r) = (conns.clone(), reqs.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |_req| {
                        r.fetch_add(1, Ordering::SeqCst);
                        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok")))) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (addr, conns, reqs)
    }

    fn request(addr: &str) -> Request<Full<Bytes>> {
        Request::builder()
            .uri("/v1/models")
            .header(http::header::HOST, addr)
            .body(Full::new(Bytes::new()))
            .expect("request")
    }

    async fn round_trip(pool: &ConnPool, addr: &str, read_all: bool) -> Sender {
        let (resp, sender) = pool
            .send(addr, Duration::from_secs(1), request(addr), Instant::now())
            .await
            .expect("send");
        assert_eq!(resp.status(), http::StatusCode::OK);
        if read_all {
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        sender
    }

    #[tokio::test]
    async fn a_returned_connection_is_reused() {
        let (addr, conns, reqs) = server(true).await;
        let pool = ConnPool::default();
        for _ in 0..5 {
            let s = round_trip(&pool, &addr, true).await;
            pool.put(s, Instant::now());
        }
        assert_eq!(reqs.load(Ordering::SeqCst), 5);
        assert_eq!(conns.load(Ordering::SeqCst), 1, "one keep-alive connection");
        assert_eq!(pool.idle(), 1);
    }

    #[tokio::test]
    async fn connections_closed_by_the_backend_are_replaced_without_duplicates() {
        let (addr, conns, reqs) = server(false).await;
        let pool = ConnPool::default();
        for i in 1..=5 {
            let s = round_trip(&pool, &addr, true).await;
            pool.put(s, Instant::now());
            // Each request was received exactly once, whichever way the stale connection was
            // noticed (closed while idle, or refused the write and handed the request back).
            assert_eq!(reqs.load(Ordering::SeqCst), i);
        }
        assert_eq!(conns.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn connections_idle_past_the_timeout_are_not_reused() {
        let (addr, conns, reqs) = server(true).await;
        let pool = ConnPool::default();
        let s = round_trip(&pool, &addr, true).await;
        pool.put(s, Instant::now());
        // Age the idle connection past the timeout (as if it had waited that long).
        for i in pool.stack().lock().expect("stack").iter_mut() {
            i.since -= IDLE_TIMEOUT;
        }
        let s = round_trip(&pool, &addr, true).await;
        pool.put(s, Instant::now());
        assert_eq!(reqs.load(Ordering::SeqCst), 2);
        assert_eq!(
            conns.load(Ordering::SeqCst),
            2,
            "the old connection was not reused"
        );
        assert_eq!(pool.idle(), 1);
        const { assert!(IDLE_TIMEOUT.as_secs() < 5, "below vLLM's 5 s keep-alive") };
    }

    #[tokio::test]
    async fn connections_not_returned_are_not_reused() {
        let (addr, conns, _) = server(true).await;
        let pool = ConnPool::default();
        let held = round_trip(&pool, &addr, false).await;
        let s = round_trip(&pool, &addr, true).await;
        assert_eq!(
            conns.load(Ordering::SeqCst),
            2,
            "a busy connection is not shared"
        );
        drop(held);
        pool.put(s, Instant::now());
        assert_eq!(pool.idle(), 1);
    }

    #[tokio::test]
    async fn connect_failures_say_so() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let pool = ConnPool::default();
        let err = pool
            .send(
                &addr,
                Duration::from_secs(1),
                request(&addr),
                Instant::now(),
            )
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, SendError::Connect(_)), "{err}");
    }
}
