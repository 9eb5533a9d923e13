//! The HTTP front: routes, body limits, request ids, the metrics and peer listeners and graceful
//! drain.
//!
//! Owns how a client request becomes an [`Outbound`] (or an error answer); forwarding itself is
//! in [`crate::proxy`]. Never panics on input: every failure is an OpenAI-style error.
//! The API and peer listeners share the request pipeline behind their own gates (`plane`).

mod admission;
mod conn;
mod local;
pub mod metrics_listener;
mod peering;
mod pipeline;
mod plane;
mod quiet;
mod shards;
pub mod status;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tracing::Instrument;

pub use crate::limit::Connections;
pub use crate::net::body::{Body, BoxError, full};
use crate::state::RouterState;
pub use metrics_listener::serve_metrics;
pub use plane::{Plane, serve_peers};

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Serves `listener` until `shutdown` resolves, then shuts down as
/// [`RouterState::begin_shutdown`] says (delay, drain) and returns.
///
/// With `io_threads` of 1 or more the listener is shared by that many I/O shards, each a
/// single-threaded runtime on its own thread that accepts, serves and proxies its connections
/// from start to end (the kernel wakes whichever shard is free; a shard that gets more than its
/// share hands new connections to the least loaded one, see `shards`). A request never changes
/// threads, and its upstream connection lives on the same shard (per-shard idle stacks in
/// [`crate::workers::idle`]). Background work (health checks, scrapes, the Program
/// scheduler's timers, config reloads) stays on the main runtime. With 0, connections are
/// served on the calling (shared, work-stealing) runtime.
pub async fn serve_api(
    state: Arc<RouterState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    io_threads: usize,
) {
    let st = state.clone();
    // Every accept loop stops only after this, so the drain's timeline exists when they drain.
    let shutdown = async move {
        shutdown.await;
        st.begin_shutdown().await;
    };
    if io_threads == 0 {
        return accept_loop(state, listener, None, shutdown, Plane::Api).await;
    }
    shards::serve(state, listener, shutdown, io_threads).await
}

/// Accepts and serves connections on the current runtime until `shutdown`, then drains.
async fn accept_loop(
    state: Arc<RouterState>,
    listener: TcpListener,
    mut handoff: Option<shards::Handoff>,
    shutdown: impl Future<Output = ()>,
    plane: Plane,
) {
    let (connections, max, listener_label) = match plane {
        Plane::Api => (
            state.api_connections.clone(),
            state
                .applied
                .load()
                .config
                .limits
                .max_client_connections
                .map(|n| n as usize),
            "api",
        ),
        Plane::Peer => (
            state.peer_connections.clone(),
            Some(conn::MAX_PEER_CONNECTIONS),
            "peer",
        ),
    };
    let serve = |stream: tokio::net::TcpStream, live: Option<shards::Live>| {
        let Some(open) = connections.open(max) else {
            // Over the cap: closed before any byte is read, so no request is lost.
            state
                .metrics
                .connections_shed
                .with_label_values(&[listener_label])
                .inc();
            tracing::debug!(
                listener = listener_label,
                "connection cap reached; closed a new connection"
            );
            return;
        };
        tokio::spawn(conn::serve(state.clone(), stream, plane, open, live));
    };
    {
        // Before the loop ends, no new handshake starts and those under way complete and are
        // served (crate::net::listen); the accept queue is drained below.
        let listening = &listener;
        let stopped = async move {
            shutdown.await;
            if crate::net::listen::refuse_new_handshakes(listening) {
                match listening.local_addr() {
                    Ok(a) => crate::net::listen::handshakes_completed(a.port()).await,
                    Err(_) => tokio::time::sleep(crate::net::listen::HANDSHAKE_GRACE).await,
                }
            }
        };
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((s, _)) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    match &handoff {
                        None => serve(stream, None),
                        Some(h) => {
                            if let Some((stream, live)) = h.place(stream) {
                                serve(stream, Some(live));
                            }
                        }
                    }
                }
                Some((stream, live)) = async {
                    match handoff.as_mut() {
                        Some(h) => h.next().await,
                        None => std::future::pending().await,
                    }
                } => serve(stream, Some(live)),
                () = &mut stopped => break,
            }
        }
    }
    // Connections the kernel completed before the listener closes (its backlog) belong to
    // clients that sent, or are sending, a request: they are served like those in progress
    // rather than reset when the listener closes.
    let mut backlog = 0;
    if let Ok(std_listener) = listener.into_std() {
        while let Ok((stream, _)) = std_listener.accept() {
            let Ok(stream) = stream
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(stream))
            else {
                continue;
            };
            backlog += 1;
            serve(stream, None);
        }
    }
    if backlog > 0 {
        tracing::info!(
            listener = listener_label,
            connections = backlog,
            "served the connections waiting in the listen backlog"
        );
    }
    if let Some(h) = handoff.as_mut() {
        for (stream, live) in h.close().await {
            serve(stream, Some(live));
        }
    }
    // serve_api fixed the drain's timeline before any accept loop stops.
    let deadline = state
        .drain_deadline()
        .unwrap_or_else(tokio::time::Instant::now);
    tracing::info!(
        seconds = (deadline - tokio::time::Instant::now()).as_secs_f64(),
        "draining requests in flight"
    );
    if tokio::time::timeout_at(deadline, connections.all_closed())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout reached; closing remaining connections");
    }
}

const GENERATE_ROUTES: [(&str, &str); 4] = [
    ("/v1/chat/completions", "/v1/chat/completions"),
    ("/v1/completions", "/v1/completions"),
    // vLLM's Anthropic Messages API (Claude Code) and OpenAI Responses API (Codex): generations
    // like the two above, so they take the policy, Program scheduling and the fair queue.
    ("/v1/messages", "/v1/messages"),
    ("/v1/responses", "/v1/responses"),
];

/// Routes whose requests take OpenAI's `stream_options` (the other two always report usage).
fn takes_stream_options(path: &str) -> bool {
    matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// vLLM's own request-level endpoints outside `/v1/`: any one target answers them as well as
/// another, so they are passed through like other `/v1/*` paths. Endpoints that act on one
/// engine's state (`/reset_prefix_cache`, `/sleep`, `/wake_up`, ...) are deliberately absent:
/// sent to one target they would silently miss every other one.
const VLLM_ROUTES: [&str; 9] = [
    "/tokenize",
    "/detokenize",
    "/version",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
    "/v2/rerank",
    "/invocations",
];

/// Serves one request; `remote` is the address its connection came from.
async fn handle(
    state: &Arc<RouterState>,
    mut req: Request<Incoming>,
    remote: Option<std::net::IpAddr>,
    plane: Plane,
) -> Response<Body> {
    if let Err(refused) = plane::admit(state, plane, &mut req, remote) {
        return refused.into_response();
    }
    let received = Instant::now();
    let request_id = req
        .headers()
        .get(&crate::net::headers::X_REQUEST_ID)
        .cloned()
        .unwrap_or_else(|| state.request_id());
    let path = req.uri().path();
    let route = route_label(req.method(), path);
    // The request's trace span (when tracing is on), in which every span of the request path
    // starts, and what its log lines say about it.
    let trace = crate::observe::trace::request(req.method(), route, path, req.headers());
    let logged_as = crate::observe::log_context::RequestLog::new(
        request_id.to_str().unwrap_or("-"),
        req.method().as_str(),
        path,
    );
    let traced = trace.clone();
    // A request from another replica gets this replica's name on its answer (`peers`). Only
    // the peer listener lets the marker through (`plane::admit`): no lookup on the API one.
    let sender = match plane {
        Plane::Peer => req.headers().get(&crate::peers::FORWARDED_BY),
        Plane::Api => None,
    };
    let from_peer = sender.is_some();
    if let Some(sender) = sender
        && let Ok(sender) = sender.to_str()
        && let Some(peers) = state.applied.load().peers.as_ref()
    {
        // A sender with a newer member list: this replica reads it.
        peers.hear(sender, req.headers(), remote);
    }
    // The access log's record of this request (written when the response body is gone); not
    // for the probes and /status, which the kubelet and the operator call every few seconds.
    // It shares the request's log context, which exists only when `info` lines may be written.
    let probe = matches!(route, "/health" | "/readiness" | "/status");
    let access = logged_as
        .as_ref()
        .filter(|_| !probe && state.applied.load().config.access_log)
        .map(|r| crate::observe::access::Access::new(received, r.clone()));
    let answer = async move {
        state.metrics.route(route).requests.inc();
        // Boxed: hyper moves the request future by value, which then carries a pointer instead
        // of the whole pipeline's state through each move; conn.rs checks its size. Written
        // into the box in place: `Box::pin` built it on the stack and copied all of it.
        let dispatched = Box::into_pin(Box::write(
            Box::new_uninit(),
            pipeline::dispatch(
                state,
                req,
                route,
                &request_id,
                received,
                access.as_ref(),
                &trace,
            ),
        ))
        .await;
        if let Some(a) = &access {
            match &dispatched {
                Ok(r) => a.answered(r.status().as_u16(), None),
                Err(e) => a.answered(e.status.as_u16(), Some(e.code)),
            }
        }
        let status = match &dispatched {
            Ok(r) => r.status(),
            Err(e) => {
                trace.record("program_router.error", e.code);
                e.status
            }
        };
        trace.record("http.response.status_code", status.as_u16());
        trace.record(
            "program_router.request_id",
            request_id.to_str().unwrap_or("-"),
        );
        if status.is_server_error() {
            trace.record("otel.status_code", "ERROR");
        }
        let mut resp = match dispatched {
            Ok(r) => r,
            Err(e) => {
                state
                    .metrics
                    .request_errors
                    .with_label_values(&[route, e.code])
                    .inc();
                if e.status.is_server_error() {
                    tracing::warn!(status = e.status.as_u16(), code = e.code, detail = %e.message, "request failed");
                } else {
                    tracing::debug!(status = e.status.as_u16(), code = e.code, detail = %e.message, "request refused");
                }
                state
                    .metrics
                    .route(route)
                    .duration
                    .observe(received.elapsed());
                // Each API's clients read errors in that API's shape.
                if route == "/v1/messages" {
                    e.into_anthropic_response()
                } else {
                    e.into_response()
                }
            }
        };
        resp.headers_mut()
            .insert(crate::net::headers::X_REQUEST_ID.clone(), request_id);
        if from_peer && let Some(peers) = state.applied.load().peers.as_ref() {
            if let Some(name) = peers.answer_header() {
                resp.headers_mut()
                    .insert(crate::peers::ANSWERED_BY.clone(), name);
            }
            // Which member list answered, so that a sender with an older one reads this one.
            if let Some(r) = peers.revision_header() {
                resp.headers_mut()
                    .insert(crate::peers::gossip::REVISION.clone(), r);
            }
        }
        // The access record and the request's trace span last as long as the response body.
        if access.is_some() || !trace.is_none() {
            resp.map(|b| {
                http_body_util::BodyExt::boxed_unsync(crate::net::body::Holding::new(
                    b,
                    (access, trace),
                ))
            })
        } else {
            resp
        }
    };
    // Each wrapper only where it does something: the trace span without tracing would only be
    // entered and left at every poll, and either wrapper moves the whole future once more.
    use crate::observe::log_context::in_request;
    match (logged_as, traced.is_none()) {
        (None, true) => answer.await,
        (Some(r), true) => in_request(r, answer).await,
        (None, false) => answer.instrument(traced).await,
        (Some(r), false) => in_request(r, answer).instrument(traced).await,
    }
}

/// Bounded `route` label.
fn route_label(method: &Method, path: &str) -> &'static str {
    match (method, path) {
        (_, "/health" | "/liveness" | "/ping") => "/health",
        (_, "/readiness") => "/readiness",
        (_, "/status") => "/status",
        (_, "/scheduling/diagnostics") => "/scheduling/diagnostics",
        (_, "/v1/models") => "/v1/models",
        (_, p) => GENERATE_ROUTES
            .iter()
            .find(|(r, _)| *r == p)
            .map(|(_, l)| *l)
            .unwrap_or(if p.starts_with("/v1/") {
                "/v1/other"
            } else if VLLM_ROUTES.contains(&p) {
                "vllm_api"
            } else {
                "other"
            }),
    }
}
