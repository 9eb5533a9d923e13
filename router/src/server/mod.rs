//! The HTTP front: routes, body limits, request ids, the metrics and peer listeners and graceful
//! drain.
//!
//! Owns how a client request becomes an [`Outbound`] (or an error answer); forwarding itself is
//! in [`crate::proxy`]. Never panics on input: every failure is an OpenAI-style error.
//! The API and peer listeners share the request pipeline behind their own gates (`plane`).

mod admission;
mod conn;
pub mod metrics_listener;
mod peering;
mod plane;
mod shards;
pub mod status;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tracing::Instrument;

use crate::error::ApiError;
pub use crate::limit::Connections;
pub use crate::net::body::{Body, BoxError, full};
use crate::policies::RequestInfo;
use crate::proxy::{self, Outbound, request};
use crate::state::RouterState;
use admission::{fair_admission, program_admission, program_identity, rate_limited};
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
/// [`crate::proxy::upstream`]). Background work (health checks, scrapes, the Program
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
    tokio::pin!(shutdown);
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
            _ = &mut shutdown => break,
        }
    }
    if let Some(h) = handoff.as_mut() {
        for (stream, live) in h.close() {
            serve(stream, Some(live));
        }
    }
    drop(listener);
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
    state: Arc<RouterState>,
    mut req: Request<Incoming>,
    remote: Option<std::net::IpAddr>,
    plane: Plane,
) -> Response<Body> {
    if let Err(refused) = plane::admit(&state, plane, &mut req, remote) {
        return refused.into_response();
    }
    let received = Instant::now();
    let request_id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&state.request_id()).unwrap_or(HeaderValue::from_static("pr"))
        });
    let path = req.uri().path().to_string();
    let span =
        tracing::info_span!("request", id = ?request_id, method = %req.method(), path = %path);
    // A request from another replica gets this replica's name on its answer (`peers`).
    let from_peer = req.headers().contains_key(&crate::peers::FORWARDED_BY);
    if let Some(sender) = req.headers().get(&crate::peers::FORWARDED_BY)
        && let Ok(sender) = sender.to_str()
        && let Some(peers) = state.applied.load().peers.as_ref()
    {
        // A sender with a newer member list: this replica reads it.
        peers.hear(sender, req.headers(), remote);
    }
    async move {
        let route = route_label(req.method(), &path);
        state.metrics.route(route).requests.inc();
        let mut resp = match dispatch(&state, req, route, &request_id, received).await {
            Ok(r) => r,
            Err(e) => {
                state.metrics.request_errors.with_label_values(&[route, e.code]).inc();
                if e.status.is_server_error() {
                    tracing::warn!(status = e.status.as_u16(), code = e.code, message = %e.message, "request failed");
                } else {
                    tracing::debug!(status = e.status.as_u16(), code = e.code, message = %e.message, "request refused");
                }
                state.metrics.route(route).duration.observe(received.elapsed().as_secs_f64());
                // Each API's clients read errors in that API's shape.
                if route == "/v1/messages" {
                    e.into_anthropic_response()
                } else {
                    e.into_response()
                }
            }
        };
        resp.headers_mut().insert("x-request-id", request_id);
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
        resp
    }
    .instrument(span)
    .await
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

/// A request's head, its whole body, and the body's place in the router's byte budget.
type ReadBody = (http::request::Parts, Bytes, Option<crate::limit::BodyBytes>);

/// The request's head and whole body, refused above `limit` bytes (413), when it takes longer
/// than `limits.client_body_timeout_secs` (408), or when it would pass the router's budget of
/// buffered bytes (503, before reading it when its length is declared).
async fn read_body(
    state: &RouterState,
    limits: &crate::config::LimitsConfig,
    limit: u64,
    req: Request<Incoming>,
) -> Result<ReadBody, ApiError> {
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let budget = |n: u64| -> Result<Option<crate::limit::BodyBytes>, ApiError> {
        if n == 0 {
            return Ok(None);
        }
        match state.buffered.take(n, limits.max_buffered_bytes) {
            Some(held) => Ok(Some(held)),
            None => {
                state.metrics.buffered_bytes_shed.inc();
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    "the router holds as many request bytes as it may; retry shortly",
                )
                .retry_after(1))
            }
        }
    };
    let early = match declared {
        Some(n) => budget(n)?,
        None => None,
    };
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let read = Limited::new(body, limit_usize).collect();
    let read = match limits.client_body_timeout_secs.map(crate::config::duration) {
        Some(t) => match tokio::time::timeout(t, read).await {
            Ok(r) => r,
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!(
                        "the request body did not arrive within {} s",
                        t.as_secs_f64()
                    ),
                ));
            }
        },
        None => read.await,
    };
    match read {
        Ok(c) => {
            let bytes = c.to_bytes();
            let held = match early {
                Some(h) => Some(h),
                None => budget(bytes.len() as u64)?,
            };
            Ok((parts, bytes, held))
        }
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

async fn dispatch(
    state: &Arc<RouterState>,
    req: Request<Incoming>,
    route: &'static str,
    request_id: &HeaderValue,
    received: Instant,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    match (&method, req.uri().path()) {
        // `/ping` is the health path of SageMaker-style hosts (vLLM answers it too).
        (&Method::GET, "/health" | "/liveness" | "/ping") => {
            return Ok(Response::new(full("OK")));
        }
        (&Method::GET, "/readiness") => {
            let ok = status::ready(state);
            let code = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            return Ok(json(code, &serde_json::json!({ "ready": ok })));
        }
        (&Method::GET, "/status") => return Ok(json(StatusCode::OK, &status::status(state))),
        (&Method::GET, "/scheduling/diagnostics") => {
            let applied = state.applied.load_full();
            // With per-client keys a client sees its own Programs (the workers' key sees all).
            let dir = state.client_dir.load_full();
            let scope =
                crate::auth::diagnostics_scope(&applied.keys(dir.as_deref()), req.headers())?;
            let v = match &applied.program {
                Some(rt) => {
                    let mut d = rt.diagnostics();
                    if let Some(name) = &scope {
                        d.only_client(name);
                    }
                    serde_json::to_value(d).unwrap_or_default()
                }
                None => serde_json::json!({ "enabled": false }),
            };
            // `?replicas=all`: every peer's view beside this one's (each Program is in the view
            // of the replica that owns it).
            let all = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "replicas=all"));
            if all && !req.headers().contains_key(&crate::peers::FORWARDED_BY) {
                return Ok(json(
                    StatusCode::OK,
                    &peering::all_replicas(state, &applied, req.headers(), v).await,
                ));
            }
            return Ok(json(StatusCode::OK, &v));
        }
        // Only on the peer listener, which every request reaches authenticated and marked
        // as from a peer (the API listener removed the mark from clients' requests).
        (&Method::GET, p)
            if p.starts_with("/peers/")
                && req.headers().contains_key(&crate::peers::FORWARDED_BY) =>
        {
            return peering::endpoint(state, p);
        }
        (&Method::POST, p)
            if p.starts_with("/peers/")
                && req.headers().contains_key(&crate::peers::FORWARDED_BY) =>
        {
            let p = p.to_string();
            return peering::post_endpoint(state, &p, req).await;
        }
        (
            _,
            "/health"
            | "/liveness"
            | "/ping"
            | "/readiness"
            | "/status"
            | "/scheduling/diagnostics",
        ) => {
            return Err(ApiError::method_not_allowed("GET"));
        }
        _ => {}
    }
    let path = req.uri().path().to_string();
    if !path.starts_with("/v1/") && !VLLM_ROUTES.contains(&path.as_str()) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {path}"),
        ));
    }
    let generate = GENERATE_ROUTES.iter().any(|(r, _)| *r == path);
    if generate && method != Method::POST {
        return Err(ApiError::method_not_allowed("POST"));
    }
    // Before the body is read, and before any queue or scheduler sees the request.
    let mut applied = state.applied.load_full();
    // The name of the key the client presented, when clients must present one.
    let dir = state.client_dir.load_full();
    let client = crate::auth::authorize(&applied.keys(dir.as_deref()), req.headers())?;
    // A place among the requests in progress, held until the response ends (crate::limit).
    let place = match &applied.limiter {
        Some(l) => {
            let limits = &applied.config.limits;
            let wait = crate::config::duration(limits.queue_timeout_secs);
            Some(
                l.enter(limits.queue_size, wait, state.queues_closed())
                    .await?,
            )
        }
        None => None,
    };
    let path_and_query = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let limits = &applied.config.limits;
    let (parts, body, held) = read_body(state, limits, limits.max_payload_size, req).await?;
    if !generate {
        // A stored response's own endpoints go to the server that stored it.
        let pin = match crate::proxy::stored::id_in_path(&path) {
            Some(id) => peering::stored_home(state, &applied, id).await,
            None => None,
        };
        // Other /v1/* endpoints (models, embeddings, ...) and vLLM's own request-level
        // endpoints (tokenize, score, ...) pass through unchanged.
        return proxy::forward(
            &state.forwarder,
            Outbound {
                applied,
                route,
                method,
                path_and_query,
                headers: &parts.headers,
                body,
                info: RequestInfo::default(),
                sse: false,
                filter_usage_chunk: false,
                request_id,
                received,
                pin,
                ticket: None,
                fair: None,
                place,
                bytes: held,
                rate: None,
            },
        )
        .await;
    }
    let peeked = request::peek(&body)?;
    // Zero-copy view of the prompt in the client's buffer (edits never touch it).
    let prompt = peeked
        .prompt
        .clone()
        .map(|r| body.slice(r))
        .unwrap_or_default();
    let original = body.clone();
    // A Responses request that continues a stored response must reach the server that stored
    // it; Program scheduling could place it anywhere, so it steps aside for this request.
    let stored_home = match peeked
        .previous_response_id
        .as_deref()
        .filter(|_| path == "/v1/responses")
    {
        Some(id) => peering::stored_home(state, &applied, id).await,
        None => None,
    };
    let identity = match stored_home {
        Some(_) => None,
        None => program_identity(
            &applied,
            client.as_deref(),
            &peeked,
            &original,
            &parts.headers,
        )?,
    };
    // A Program another router replica owns is scheduled there (`peers`); the quota, queues
    // and scheduler of that replica apply, not this one's.
    let place = match (&applied.peers, &identity) {
        (Some(peers), Some(id)) => {
            let here = peering::Request {
                method: &method,
                path_and_query: &path_and_query,
                headers: &parts.headers,
                body: &original,
                request_id,
            };
            match peering::to_owner(state, &applied, peers, id, here, place).await {
                peering::Owner::Answered(r) => {
                    // The body stays held (in the budget) until the owner's answer ends.
                    return r.map(|resp| {
                        resp.map(|b| crate::peers::Holding::new(b, held).boxed_unsync())
                    });
                }
                peering::Owner::Here(place) => {
                    // Another replica may have held it before the member list changed.
                    let model = peeked.model.as_deref().unwrap_or("");
                    peering::take_over(state, &applied, id, model).await;
                    place
                }
            }
        }
        _ => place,
    };
    // With fair queueing, the request's tenant (one for its quota, its queue and its Program).
    let tenant = applied
        .fair
        .as_ref()
        .map(|f| f.tenant(&parts.headers, peeked.user.as_deref(), client.as_deref()));
    // The tenant's quota, before the request waits anywhere (Program scheduling included).
    let rate = match (&applied.fair, &tenant) {
        // About four bytes of JSON text per token, as the fair queue estimates.
        (Some(f), Some(t)) => f
            .rate_admit(t, (prompt.len() / 4) as u64)
            .map_err(|r| rate_limited(t, r))?,
        _ => None,
    };
    let outgoing = request::rewrite(
        body,
        &peeked,
        applied.config.agentic_context,
        applied.config.inject_stream_usage && takes_stream_options(&path),
    )?;
    let (pin, ticket) = match (&applied.program, identity) {
        _ if stored_home.is_some() => (stored_home, None),
        (Some(rt), Some(id)) => {
            let rt = rt.clone();
            let (placed, ticket) = program_admission(
                state,
                &rt,
                &applied,
                tenant.as_deref(),
                id,
                peeked.model.as_deref(),
                &prompt,
            )
            .await?;
            match placed {
                Some(id) => {
                    // The decision names a target id: a reload while the request waited may have
                    // re-ordered or changed the targets, so find it by id (the request's snapshot
                    // first, then the newest configuration).
                    let (fresh, index) = resolve_target(state, applied, &id)?;
                    applied = fresh;
                    (Some(index), ticket)
                }
                None => (None, ticket),
            }
        }
        _ => (None, None),
    };
    // Requests outside Program scheduling (which has its own RequestPool) wait their turn in the
    // fair queue, when one is configured.
    let fair = match (&applied.fair, tenant.as_deref(), &ticket) {
        (Some(f), Some(tenant), None) => {
            Some(fair_admission(state, f, &parts.headers, tenant, prompt.len()).await?)
        }
        _ => None,
    };
    let info = RequestInfo {
        hash_key: request::hash_key(&parts.headers, &peeked),
        prompt: &prompt,
    };
    proxy::forward(
        &state.forwarder,
        Outbound {
            applied,
            route,
            method,
            path_and_query,
            headers: &parts.headers,
            body: outgoing.body.clone(),
            info,
            sse: peeked.stream,
            filter_usage_chunk: outgoing.usage_injected,
            request_id,
            received,
            pin,
            ticket,
            fair,
            place,
            bytes: held,
            rate,
        },
    )
    .await
}

/// The applied configuration to forward under and the index of target `id` in it: the request's
/// own snapshot when it still holds the target, else the newest one; 503 if neither does (the
/// target was removed between the decision and now).
fn resolve_target(
    state: &Arc<RouterState>,
    applied: Arc<crate::applied::Applied>,
    id: &str,
) -> Result<(Arc<crate::applied::Applied>, usize), ApiError> {
    let find = |a: &crate::applied::Applied| a.targets.targets.iter().position(|t| t.id == id);
    if let Some(i) = find(&applied) {
        return Ok((applied, i));
    }
    let newest = state.applied.load_full();
    match find(&newest) {
        Some(i) => Ok((newest, i)),
        None => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "reconfigured",
            format!("target {id} left the configuration while the request waited; retry"),
        )),
    }
}
