//! Upstream HTTP/1.1 requests: connecting (timeout, TCP_NODELAY) and sending on a backend's idle
//! keep-alive connection when it has one ([`crate::workers::idle`]), a new one otherwise. A
//! connection is only returned by the relay when the body completed; one whose response was
//! abandoned is dropped, which closes it (that is how the engine learns the client left). A
//! request that could not be written on a reused connection (the backend closed it while idle —
//! vLLM closes idle keep-alive connections after 5 s) is sent again on a fresh one, since no byte
//! of it reached the backend.
//!
//! Why not hyper-util's pooled client: per request it runs a checkout future, a keyed pool lock
//! and a spawned task that waits for the connection to become idle again; the backend's stack
//! needs one uncontended lock on take and one on return (measured in docs/benchmarks.md, router
//! overhead).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::workers::Backend;
pub use crate::workers::idle::Sender;

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

/// Sends `req` (origin-form URI, `Host` set) to `backend`, on one of its idle connections when
/// it has one at `now` (the attempt's start). Returns the response head and the connection, to
/// be returned to the backend's idle ones once the body was read to the end.
pub async fn send(
    backend: &Backend,
    connect_timeout: Duration,
    mut req: Request<Full<Bytes>>,
    now: Instant,
) -> Result<(Response<Incoming>, Sender), SendError> {
    loop {
        let (mut sender, reused) = match backend.idle.take(now) {
            Some(s) => (s, true),
            // Boxed: a new connection is the rare case, and its future is large.
            None => (
                Box::pin(connect(&backend.addr, connect_timeout)).await?,
                false,
            ),
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
    use crate::workers::idle::IDLE_TIMEOUT;

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

    async fn round_trip(pool: &Backend, addr: &str, read_all: bool) -> Sender {
        let (resp, sender) = send(pool, Duration::from_secs(1), request(addr), Instant::now())
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
        let pool = Backend::new(format!("http://{addr}"));
        for _ in 0..5 {
            let s = round_trip(&pool, &addr, true).await;
            pool.idle.put(s, Instant::now());
        }
        assert_eq!(reqs.load(Ordering::SeqCst), 5);
        assert_eq!(conns.load(Ordering::SeqCst), 1, "one keep-alive connection");
        assert_eq!(pool.idle.len(), 1);
    }

    #[tokio::test]
    async fn connections_closed_by_the_backend_are_replaced_without_duplicates() {
        let (addr, conns, reqs) = server(false).await;
        let pool = Backend::new(format!("http://{addr}"));
        for i in 1..=5 {
            let s = round_trip(&pool, &addr, true).await;
            pool.idle.put(s, Instant::now());
            // Each request was received exactly once, whichever way the stale connection was
            // noticed (closed while idle, or refused the write and handed the request back).
            assert_eq!(reqs.load(Ordering::SeqCst), i);
        }
        assert_eq!(conns.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn connections_idle_past_the_timeout_are_not_reused() {
        let (addr, conns, reqs) = server(true).await;
        let pool = Backend::new(format!("http://{addr}"));
        let s = round_trip(&pool, &addr, true).await;
        // Returned as if it had idled as long as the timeout already.
        let long_ago = Instant::now().checked_sub(IDLE_TIMEOUT).expect("uptime");
        pool.idle.put(s, long_ago);
        let s = round_trip(&pool, &addr, true).await;
        pool.idle.put(s, Instant::now());
        assert_eq!(reqs.load(Ordering::SeqCst), 2);
        assert_eq!(
            conns.load(Ordering::SeqCst),
            2,
            "the old connection was not reused"
        );
        assert_eq!(pool.idle.len(), 1);
        const { assert!(IDLE_TIMEOUT.as_secs() < 5, "below vLLM's 5 s keep-alive") };
    }

    #[tokio::test]
    async fn connections_not_returned_are_not_reused() {
        let (addr, conns, _) = server(true).await;
        let pool = Backend::new(format!("http://{addr}"));
        let held = round_trip(&pool, &addr, false).await;
        let s = round_trip(&pool, &addr, true).await;
        assert_eq!(
            conns.load(Ordering::SeqCst),
            2,
            "a busy connection is not shared"
        );
        drop(held);
        pool.idle.put(s, Instant::now());
        assert_eq!(pool.idle.len(), 1);
    }

    #[tokio::test]
    async fn connect_failures_say_so() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let pool = Backend::new(format!("http://{addr}"));
        let err = send(
            &pool,
            Duration::from_secs(1),
            request(&addr),
            Instant::now(),
        )
        .await
        .expect_err("nothing listens");
        assert!(matches!(err, SendError::Connect(_)), "{err}");
    }
}
