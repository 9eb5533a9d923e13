//! The metrics listener: `GET /metrics` for Prometheus, nothing else, open to whoever reaches
//! the port (keep it off the Service a client can reach, or behind a NetworkPolicy).
//!
//! Bounded like the API listener, with fixed limits a scraper never comes near: at most
//! [`MAX_CONNECTIONS`] at once (more are closed at once and counted), [`HEADER_TIMEOUT`] to send
//! a request's headers (also the idle keep-alive limit), and a growing pause after a failed
//! accept (a full file table must not spin the loop).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::{Body, Connections, full};
use crate::error::ApiError;
use crate::state::RouterState;

/// Scrapers connected at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Longest a scraper may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest pause after failed accepts in a row (the first is 10 ms, doubling).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves Prometheus metrics on their own listener until `shutdown`.
pub async fn serve_metrics(
    state: Arc<RouterState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let connections = Arc::new(Connections::default());
    let mut backoff = Duration::from_millis(10);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => {
                    backoff = Duration::from_millis(10);
                    s
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let Some(open) = connections.open(Some(MAX_CONNECTIONS)) else {
            state
                .metrics
                .connections_shed
                .with_label_values(&["metrics"])
                .inc();
            continue;
        };
        let st = state.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let st = st.clone();
            async move { Ok::<_, Infallible>(answer(&st, &req)) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), svc);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(open);
        });
    }
}

fn answer(st: &RouterState, req: &Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/metrics" {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "only /metrics is served here",
        )
        .into_response();
    }
    let m = &st.metrics;
    let applied = st.applied.load();
    for t in &applied.targets.targets {
        t.metrics
            .running
            .set(i64::try_from(t.in_flight()).unwrap_or(i64::MAX));
    }
    let limiter = applied.limiter.clone();
    let (max, busy, waiting) = limiter
        .map(|l| (l.max(), l.in_progress(), l.waiting()))
        .unwrap_or_default();
    m.concurrency_limit.set(i64::from(max));
    m.concurrency_in_progress.set(i64::from(busy));
    m.concurrency_waiting.set(i64::from(waiting));
    m.backlog.set_unread(i64::from(waiting));
    let dropped = crate::observe::log_writer::dropped();
    m.log_lines_dropped
        .inc_by(dropped.saturating_sub(m.log_lines_dropped.get()));
    for (listener, c) in [("api", &st.api_connections), ("peer", &st.peer_connections)] {
        m.connections_open
            .with_label_values(&[listener])
            .set(i64::try_from(c.count()).unwrap_or(i64::MAX));
    }
    m.buffered_bytes
        .set(i64::try_from(st.buffered.used()).unwrap_or(i64::MAX));
    let mut r = Response::new(full(m.render()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
