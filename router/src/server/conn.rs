//! One client connection from accept to close, and the count of a listener's open connections.
//!
//! Owns the bounds on a connection: the cap on open connections per listener (one more is
//! closed as soon as it is accepted, and counted), the time to send the first bytes and each
//! request's headers, HTTP/2 keep-alive pings, the idle timeout (no new request for that long
//! closes the connection gracefully: requests in progress finish first) and the graceful close
//! when the listener stops accepting — except for a connection taken from the listen backlog
//! after that, whose one request is served before it closes. The drain waits for every
//! connection of the listener.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;

use super::{Plane, handle};
use crate::limit::Open;
use crate::state::RouterState;

/// How long an HTTP/2 keep-alive ping may go unanswered before the connection is closed.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Connections the peer listener holds at once (replicas keep a few pooled connections each).
pub const MAX_PEER_CONNECTIONS: usize = 1024;

/// When the last request of a connection arrived, in milliseconds since the connection opened.
#[derive(Default)]
struct Activity {
    last_ms: AtomicU64,
    /// Requests that arrived on the connection.
    requests: AtomicU64,
}

/// How long a connection that has not delivered its first request yet may still do so after
/// the listener stopped accepting: its client connected before that, and its request is on the
/// wire (closing it would reset a request the client already sent).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// The most the future answering one request may take (checked in debug builds).
const REQUEST_FUTURE_MAX_BYTES: usize = 4096;

/// Serves one accepted connection on `plane` until it closes; `open` is its place among the
/// listener's connections, `hold` anything else held as long as the connection (a shard's
/// share of connections).
pub(super) async fn serve<H: Send + 'static>(
    state: Arc<RouterState>,
    stream: TcpStream,
    plane: Plane,
    open: Open,
    hold: H,
) {
    crate::net::tune(&stream);
    // Taken from the listen backlog after the listener stopped accepting: its client connected
    // before that and has sent (or is sending) a request, which is served; then it closes.
    let late = state.accepting_has_stopped();
    let remote = stream.peer_addr().ok().map(|a| a.ip());
    // Read per connection, so a reload applies to the connections accepted after it.
    let limits = state.applied.load().config.limits.clone();
    let header_timeout = limits
        .client_header_timeout_secs
        .map(crate::config::duration);
    if let Some(t) = header_timeout {
        // The auto builder reads the first bytes to tell HTTP/1 from HTTP/2 before hyper's own
        // header timer runs: a client that connects and sends nothing is bounded here (and let
        // go when the listeners stop).
        let mut first = [0u8; 1];
        tokio::select! {
            biased;
            // `peek` waits for a byte without taking it (`readable` may wake early).
            r = tokio::time::timeout(t, stream.peek(&mut first)) => if r.is_err() {
                tracing::debug!("client sent nothing within the header timeout; closed");
                return;
            },
            _ = async {
                state.accepting_stopped().await;
                tokio::time::sleep(FIRST_REQUEST_GRACE).await;
            }, if !late => return,
        }
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(!late);
    if let Some(every) = limits
        .http2_keep_alive_interval_secs
        .map(crate::config::duration)
    {
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(every)
            .keep_alive_timeout(PING_TIMEOUT);
    }
    let idle = limits.client_idle_timeout_secs.map(crate::config::duration);
    let opened = tokio::time::Instant::now();
    let activity = Arc::new(Activity::default());
    let seen = activity.clone();
    // A handle of this connection's own: each request clones it, not the state's shared count,
    // which every I/O thread would write twice a request.
    let st = Arc::new(state.clone());
    let svc = service_fn(move |req| {
        if idle.is_some() {
            let ms = u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
            seen.last_ms.store(ms, Ordering::Relaxed);
        }
        seen.requests.fetch_add(1, Ordering::Relaxed);
        let st = st.clone();
        let request = async move {
            use futures_util::FutureExt;
            // A panic answers its own request with a 500 and stops the router for a restart:
            // the state it was changing may be half-updated.
            let answer = std::panic::AssertUnwindSafe(handle(&st, req, remote, plane))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    st.fail(panic_message(panic.as_ref()));
                    crate::error::ApiError::new(
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        "internal_error",
                        "the router hit an internal error and restarts; retry the request",
                    )
                    .into_response()
                });
            Ok::<_, Infallible>(answer)
        };
        // hyper moves this future by value several times per request: the pipeline's state is
        // boxed inside `handle` so that it stays small (docs/benchmarks.md, router overhead).
        debug_assert!(
            std::mem::size_of_val(&request) <= REQUEST_FUTURE_MAX_BYTES,
            "the request future grew to {} bytes: box the large part (docs/benchmarks.md)",
            std::mem::size_of_val(&request)
        );
        request
    });
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
        .into_owned();
    tokio::pin!(conn);
    // Polled only when they woke the task themselves, not on each of the connection's wakes.
    let stopped = super::quiet::Quiet::new(state.accepting_stopped());
    let idle_due = super::quiet::Quiet::new(idle_for(idle, opened, &activity));
    tokio::pin!(stopped, idle_due);
    let mut closing = false;
    // Set when the listener stopped before this connection's first request arrived.
    let mut close_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "client connection ended with an error");
                }
                break;
            }
            // Each of these completes at most once: its branch then turns itself off.
            _ = &mut stopped, if !closing && !late && close_at.is_none() => {
                if activity.requests.load(Ordering::Relaxed) == 0 {
                    close_at = Some(tokio::time::Instant::now() + FIRST_REQUEST_GRACE);
                } else {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
            _ = async {
                if let Some(at) = close_at {
                    tokio::time::sleep_until(at).await;
                }
            }, if !closing && close_at.is_some() => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = &mut idle_due, if !closing && idle.is_some() => {
                tracing::debug!("client connection idle past the idle timeout; closing");
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
    drop(hold);
    drop(open);
}

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Resolves once no request has arrived on the connection for `idle` (never without one).
async fn idle_for(idle: Option<Duration>, opened: tokio::time::Instant, a: &Activity) {
    let Some(idle) = idle else {
        return std::future::pending().await;
    };
    loop {
        let last = opened + Duration::from_millis(a.last_ms.load(Ordering::Relaxed));
        let due = last + idle;
        if tokio::time::Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}
