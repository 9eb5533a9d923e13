//! Forwarding: pick a target, send, retry what is safe to retry, relay the answer.
//!
//! Owns the upstream request (headers, DP-rank pin, worker auth), retries (only connect errors
//! and 503 answers, i.e. before any byte reached the client), timeouts, and the completion hook
//! that feeds the breaker and metrics. Never replays a generation that started. Knows no
//! feature: it reads the applied configuration through [`Route`] and tells the caller how a
//! response ended through its [`Hold`].

pub mod relay;
pub mod request;
pub mod sse;
pub mod stored;
pub mod system_prompt;
pub mod tool_call;
pub mod upstream;
pub mod usage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use rand::Rng;
use tracing::Instrument;

use crate::config::RouterConfig;
use crate::error::ApiError;
use crate::net::body::Body;
use crate::net::headers::{self, DP_RANK, is_hop_by_hop, nominated};
use crate::observe::metrics::Metrics;
use crate::policies::Policy;
use crate::policies::RequestInfo;
use crate::workers::{InFlight, TargetSet, TargetState};
pub use relay::End;
use relay::{Finish, Relay, Tapped};
use upstream::SendError;
pub use usage::TokenUsage;

/// Upper bound on a TCP connect to a backend.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What forwarding keeps for the router's life: its metrics and the homes of stored responses.
pub struct Forwarder {
    pub metrics: Arc<Metrics>,
    pub response_homes: stored::ResponseHomes,
}

impl Forwarder {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Forwarder {
            metrics,
            response_homes: Default::default(),
        }
    }

    /// `fw` through this thread's handle, which a response holds until it ends
    /// ([`crate::observe::sharded::handle_here`]; a router has one forwarder for its life).
    fn here(fw: &Arc<Forwarder>) -> ForwarderHandle {
        crate::observe::sharded::handle_here(&FORWARDER_OF_THREAD, fw)
    }
}

/// A reference to a thread's own handle on the forwarder (see [`Forwarder::here`]).
type ForwarderHandle = Arc<Arc<Forwarder>>;

thread_local! {
    static FORWARDER_OF_THREAD: std::cell::RefCell<Option<ForwarderHandle>> =
        const { std::cell::RefCell::new(None) };
}

/// The applied configuration as forwarding reads it (see `crate::applied::Applied::route`).
#[derive(Clone, Copy)]
pub struct Route<'a> {
    pub config: &'a RouterConfig,
    pub targets: &'a TargetSet,
    pub policy: &'a dyn Policy,
    /// `Authorization` sent to workers (`Bearer <api_key>`).
    pub authorization: Option<&'a HeaderValue>,
    /// The router checked the client's key, which then stays with the router.
    pub strip_client_key: bool,
}

/// What the caller holds for a request until its response ends (a place, body bytes, a queue
/// seat, a Program ticket, a quota charge), told how it ended.
pub trait Hold: Send + Unpin + 'static {
    /// How the response ended (see [`Ended`]).
    fn end(self, ended: Ended<'_>);
}

/// How a relayed response ended, told to its [`Hold`].
pub struct Ended<'a> {
    /// The response ran to its end with a success status.
    pub complete: bool,
    /// What the backend reported, when it did.
    pub usage: Option<TokenUsage>,
    /// Its tool calls, when [`Outbound::capture_tool`] asked for them.
    pub tool: relay::ToolRead,
    /// The target that served it (its id, `url@rank`).
    pub target: &'a str,
    pub ending: crate::observe::access::Ending,
}

/// Nothing held.
impl Hold for () {
    fn end(self, _: Ended<'_>) {}
}

/// One request to forward, with what its caller holds until the response ends.
pub struct Outbound<'a, H: Hold> {
    /// The configuration the request was admitted under (a pinned rank indexes its targets, so
    /// forwarding must not read a newer one).
    pub route_config: Route<'a>,
    pub route: &'static str,
    pub method: Method,
    pub path_and_query: http::uri::PathAndQuery,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
    pub info: RequestInfo<'a>,
    pub sse: bool,
    pub filter_usage_chunk: bool,
    pub request_id: &'a HeaderValue,
    pub received: Instant,
    /// Program scheduling chose this target (index into the applied targets): no policy, and
    /// retries stay on it.
    pub pin: Option<usize>,
    /// A generation (chat, completions, messages, responses): its duration is observed in
    /// `vllm_router_generate_duration_seconds`.
    pub generation: bool,
    /// Ended when the response ends, or dropped with the request.
    pub hold: Option<H>,
    /// Read the name of the response's first tool call for the hold ([`Ended::tool`]).
    pub capture_tool: bool,
    /// The request's `tool_choice` forces a call: a response's `finish_reason: "stop"` does
    /// not say it answered (see [`relay::Capture::tool_forced`]).
    pub tool_forced: bool,
}

/// The request one attempt sends to `target`, carrying `span`'s trace context when it has one.
fn upstream_request<H: Hold>(
    applied: Route<'_>,
    target: &TargetState,
    out: &Outbound<'_, H>,
    span: &tracing::Span,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let host = target.backend.host.as_ref().ok_or_else(|| {
        ApiError::upstream(format!("invalid upstream URL {}", target.backend.url))
    })?;
    // Origin-form: the connection is already to the backend.
    let mut req = Request::new(Full::new(out.body.clone()));
    *req.method_mut() = out.method.clone();
    *req.uri_mut() = Uri::from(out.path_and_query.clone());
    let h = req.headers_mut();
    h.reserve(out.headers.len() + 4);
    h.insert(header::HOST, host.clone());
    let connection_scoped = nominated(out.headers);
    // A client key the router checked stays with the router (the workers get `api_key`).
    let checked = applied.strip_client_key;
    let mut client_length = None;
    for (k, v) in out.headers {
        if k == header::CONTENT_LENGTH {
            client_length = Some(v);
        } else if !is_hop_by_hop(k)
            && !headers::internal(k)
            && !connection_scoped.contains(k)
            && !(checked && (k == header::AUTHORIZATION || *k == crate::auth::X_API_KEY))
        {
            h.append(k, v.clone());
        }
    }
    if let Some(rank) = &target.rank_header {
        h.insert(DP_RANK.clone(), rank.clone());
    }
    if let Some(v) = applied.authorization {
        h.insert(header::AUTHORIZATION, v.clone());
    }
    h.insert(headers::X_REQUEST_ID.clone(), out.request_id.clone());
    if !out.body.is_empty() {
        let length = headers::content_length(out.body.len(), client_length);
        h.insert(header::CONTENT_LENGTH, length);
    }
    if !span.is_none() {
        crate::observe::trace::inject(span, h);
    }
    Ok(req)
}

/// Records how an upstream attempt ended on its span (the caller skips this without tracing).
fn record_attempt<T>(
    span: &tracing::Span,
    result: &Result<
        Result<(Response<hyper::body::Incoming>, T), SendError>,
        tokio::time::error::Elapsed,
    >,
) {
    match result {
        Ok(Ok((resp, _))) => {
            span.record("http.response.status_code", resp.status().as_u16());
            if resp.status().is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
        }
        Ok(Err(SendError::Connect(_))) => {
            span.record("error.type", "connect");
            span.record("otel.status_code", "ERROR");
        }
        Ok(Err(_)) => {
            span.record("error.type", "send");
            span.record("otel.status_code", "ERROR");
        }
        Err(_) => {
            span.record("error.type", "timeout");
            span.record("otel.status_code", "ERROR");
        }
    }
}

fn backoff(cfg: &crate::config::RetryConfig, attempt: u32) -> Duration {
    let base = cfg.initial_backoff_ms as f64
        * cfg
            .backoff_multiplier
            .powi(attempt.saturating_sub(1) as i32);
    let capped = base.min(cfg.max_backoff_ms as f64);
    let jitter = if cfg.jitter_factor > 0.0 {
        rand::rng().random_range(-cfg.jitter_factor..=cfg.jitter_factor)
    } else {
        0.0
    };
    crate::config::duration((capped * (1.0 + jitter)).max(0.0) / 1000.0)
}

/// Sends `out` to a target chosen by the policy, retrying connect errors and 503s.
///
/// Not an `async fn`: that would copy `out` from the future's arguments into a local of its
/// own on the first poll, and keep room for both; the block below uses the captured one.
#[allow(clippy::manual_async_fn)]
pub fn forward<'a, H: Hold>(
    fw: &'a Arc<Forwarder>,
    mut out: Outbound<'a, H>,
) -> impl Future<Output = Result<Response<Body>, ApiError>> + 'a {
    async move {
        let applied = out.route_config;
        let cfg = applied.config;
        let timeout = crate::config::duration(cfg.limits.request_timeout_secs);
        let deadline = tokio::time::Instant::from_std(out.received) + timeout;
        // Targets tried before (filled only when an attempt is retried).
        let mut tried: Vec<usize> = Vec::new();
        let mut last_error = ApiError::no_target();
        for attempt in 1..=cfg.retry.max_retries {
            if attempt > 1 {
                fw.metrics.route(out.route).retries.inc();
                tokio::time::sleep(backoff(&cfg.retry, attempt - 1)).await;
            }
            let now = Instant::now();
            // Borrowed from the request's configuration (no reference count traffic on a line
            // every I/O thread shares); the in-flight guard holds it past the response head.
            let target: &Arc<TargetState> = if let Some(rank) = out.pin {
                match applied.targets.targets.get(rank) {
                    Some(t) if t.available(now) => t,
                    _ => return Err(ApiError::no_target()),
                }
            } else {
                let mut candidates: smallvec::SmallVec<[&Arc<TargetState>; 16]> = applied
                    .targets
                    .targets
                    .iter()
                    .filter(|t| t.available(now) && !tried.contains(&(Arc::as_ptr(t) as usize)))
                    .collect();
                if candidates.is_empty() {
                    // Every available target was tried: allow them again rather than fail early.
                    candidates = applied
                        .targets
                        .targets
                        .iter()
                        .filter(|t| t.available(now))
                        .collect();
                }
                if candidates.is_empty() {
                    return Err(last_error);
                }
                candidates[applied.policy.pick(&out.info, &candidates)]
            };
            let this = Arc::as_ptr(target) as usize;
            let guard = target.begin();
            // This attempt's span; the backend's spans become its children.
            let span = crate::observe::trace::attempt(&target.id, attempt);
            // Time to first byte counts from the attempt's start (one clock read fewer).
            let sent = now;
            // The request is built in place (a local would keep its slot in this future) and the
            // send wrapped in the span only when there is one: each wrapper copies the send.
            let send = tokio::time::timeout_at(
                deadline,
                upstream::send(
                    &target.backend,
                    CONNECT_TIMEOUT,
                    upstream_request(applied, target, &out, &span)?,
                    now,
                ),
            );
            let result = if span.is_none() {
                send.await
            } else {
                send.instrument(span.clone()).await
            };
            if !span.is_none() {
                record_attempt(&span, &result);
            }
            drop(span);
            let (resp, conn) = match result {
                Err(_) => {
                    target.record_outcome(false);
                    return Err(ApiError::upstream_timeout(cfg.limits.request_timeout_secs));
                }
                Ok(Err(e @ SendError::Connect(_))) => {
                    target.record_outcome(false);
                    tracing::warn!(target_id = %target.id, attempt, error = %e, "connect failed");
                    last_error = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "upstream_unavailable",
                        format!("could not connect to {}: {e}", target.id),
                    );
                    tried.push(this);
                    continue;
                }
                Ok(Err(e)) => {
                    // The request may have reached the engine: do not replay it.
                    target.record_outcome(false);
                    tracing::warn!(target_id = %target.id, error = %e, "upstream request failed");
                    return Err(ApiError::upstream(format!(
                        "upstream {} failed: {e}",
                        target.id
                    )));
                }
                Ok(Ok(sent)) => sent,
            };
            fw.metrics.ttfb.observe(sent.elapsed());
            let status = resp.status();
            target.metrics.status(status.as_u16());
            if status == StatusCode::SERVICE_UNAVAILABLE && attempt < cfg.retry.max_retries {
                target.record_outcome(false);
                tracing::warn!(target_id = %target.id, attempt, "upstream answered 503; retrying");
                // Drain the small error body so the connection can be reused.
                let drained =
                    tokio::time::timeout(Duration::from_secs(1), resp.into_body().collect());
                if let Ok(Ok(_)) = Box::pin(drained).await {
                    target.backend.idle.put(conn, Instant::now());
                }
                last_error = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream_unavailable",
                    "upstream answered 503",
                );
                tried.push(this);
                continue;
            }
            let (mut parts, body) = resp.into_parts();
            headers::strip_hop_by_hop(&mut parts.headers);
            let sse = out.sse
                && parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("text/event-stream"));
            if sse && out.filter_usage_chunk {
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let finish = Completion {
                span: crate::observe::trace::relay(),
                guard,
                conn: Some(conn),
                hold: out.hold.take(),
                status,
                fw: Forwarder::here(fw),
                route: out.route,
                generation: out.generation,
                received: out.received,
            };
            let relay = Relay::new(
                body,
                sse.then(|| sse::ErrorEvent::for_route(out.route)),
                sse && out.filter_usage_chunk,
                relay::Capture {
                    response_id: out.route == "/v1/responses" && status.is_success(),
                    tool: out.capture_tool && status.is_success(),
                    tool_forced: out.tool_forced,
                },
                Some(deadline),
                cfg.limits
                    .upstream_idle_timeout_secs
                    .map(crate::config::duration),
                finish,
            );
            let body: Body = relay.boxed_unsync();
            return Ok(Response::from_parts(parts, body));
        }
        Err(last_error)
    }
}

/// Runs when a relayed response ends: breaker, metrics, request duration.
struct Completion<H: Hold> {
    /// The relay's trace span (none without tracing), ended with the response.
    span: tracing::Span,
    guard: InFlight,
    /// The upstream connection, returned to its backend's idle ones when the body was read to
    /// the end.
    conn: Option<upstream::Sender>,
    hold: Option<H>,
    status: StatusCode,
    fw: ForwarderHandle,
    route: &'static str,
    generation: bool,
    received: Instant,
}

impl<H: Hold> Finish for Completion<H> {
    fn finish(mut self, end: End, tapped: Tapped) {
        let usage = tapped.usage;
        if !self.span.is_none() {
            self.span
                .record("program_router.end", format!("{end:?}").as_str());
            if let Some(u) = usage {
                self.span
                    .record("gen_ai.usage.input_tokens", u.prompt_tokens);
                self.span
                    .record("gen_ai.usage.output_tokens", u.completion_tokens);
            }
        }
        let target = self.guard.target();
        if let Some(hold) = self.hold.take() {
            use crate::observe::access::Ending;
            hold.end(Ended {
                complete: end == End::Complete && self.status.is_success(),
                usage,
                tool: tapped.tool,
                target: &target.id,
                ending: match end {
                    End::Complete => Ending::Complete,
                    End::Abandoned => Ending::Abandoned,
                    End::UpstreamError => Ending::UpstreamError,
                },
            });
        }
        if let (End::Complete, Some(id), true) =
            (end, &tapped.response_id, self.status.is_success())
        {
            // A follow-up naming this response must come back to this server (`stored`).
            self.fw.response_homes.insert(id, &target.spec.url);
        }
        let ended = Instant::now();
        if let (End::Complete, Some(conn)) = (end, self.conn.take()) {
            target.backend.idle.put(conn, ended);
        }
        match end {
            End::Complete => target.record_outcome(!self.status.is_server_error()),
            End::UpstreamError => target.record_outcome(false),
            // The client left (or the deadline passed): says nothing about the backend.
            End::Abandoned => {}
        }
        if let Some(u) = usage {
            target.metrics.prompt_tokens.inc_by(u.prompt_tokens);
            target.metrics.cached_tokens.inc_by(u.cached_tokens());
            target.metrics.completion_tokens.inc_by(u.completion_tokens);
        }
        let took = ended.saturating_duration_since(self.received);
        self.fw.metrics.route(self.route).duration.observe(took);
        if self.generation {
            self.fw.metrics.generate_duration.observe(took);
        }
        tracing::debug!(target_id = %target.id, status = self.status.as_u16(), ?end, ?usage, "request finished");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_marker_and_a_checked_client_key_stay_with_the_router() {
        let cfg = crate::config::RouterConfig {
            workers: vec![crate::config::WorkerConfig {
                url: "http://127.0.0.1:9".into(),
                dp_rank: Some(2),
            }],
            api_key: Some("worker".into()),
            client_api_keys: Some(vec!["team".into()]),
            ..Default::default()
        };
        let metrics = Metrics::new().expect("metrics");
        let targets = TargetSet::build(&cfg, None, &metrics);
        let policy = crate::policies::build(&cfg, &targets);
        let authorization = HeaderValue::from_static("Bearer worker");
        let route = Route {
            config: &cfg,
            targets: &targets,
            policy: policy.as_ref(),
            authorization: Some(&authorization),
            strip_client_key: true,
        };
        let mut h = HeaderMap::new();
        h.insert(
            headers::FORWARDED_BY.clone(),
            HeaderValue::from_static("router-a"),
        );
        h.insert(
            headers::ADDRESSED_TO.clone(),
            HeaderValue::from_static("router-b"),
        );
        h.insert(headers::REVISION.clone(), HeaderValue::from_static("7"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer team"),
        );
        h.insert("x-custom", HeaderValue::from_static("kept"));
        let id = HeaderValue::from_static("rid-1");
        let out = Outbound {
            route_config: route,
            route: "/v1/chat/completions",
            method: Method::POST,
            path_and_query: http::uri::PathAndQuery::from_static("/v1/chat/completions"),
            headers: &h,
            body: Bytes::from_static(b"{}"),
            info: RequestInfo::default(),
            sse: false,
            filter_usage_chunk: false,
            request_id: &id,
            received: Instant::now(),
            pin: None,
            generation: true,
            hold: None::<()>,
            capture_tool: false,
            tool_forced: false,
        };
        let req = upstream_request(route, &targets.targets[0], &out, &tracing::Span::none())
            .expect("request");
        let got = req.headers();
        assert!(got.get(&headers::FORWARDED_BY).is_none(), "{got:?}");
        assert!(got.get(&headers::ADDRESSED_TO).is_none(), "{got:?}");
        assert!(got.get(&headers::REVISION).is_none(), "{got:?}");
        assert_eq!(got[header::AUTHORIZATION], "Bearer worker");
        assert_eq!(got["x-custom"], "kept");
        assert_eq!(got[&DP_RANK], "2");
        assert_eq!(got["x-request-id"], "rid-1");
    }
}
