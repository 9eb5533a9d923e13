//! The request pipeline of a proxied route, as named steps: route check, admission (key, place,
//! body), then for generations: peek, stored-response home, Program identity, owner replica,
//! tenant and quota, rewrite, Program scheduling, fair queue, and forwarding.
//!
//! Owns the order of the steps and what each hands to the next ([`Admitted`], [`Generation`]);
//! what a step decides lives with its feature (`admission`, `peering`, `crate::proxy`).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::admission::{
    ProgramRequest, fair_admission, program_admission, program_identity, rate_limited,
};
use super::{GENERATE_ROUTES, VLLM_ROUTES, local, peering, takes_stream_options};
use crate::applied::Applied;
use crate::error::ApiError;
use crate::net::body::Body;
use crate::observe::access::Access;
use crate::policies::RequestInfo;
use crate::program::identity::Identity;
use crate::program::scheduler::ToolCall;
use crate::proxy::relay::ToolRead;
use crate::proxy::request::{self, Outgoing, Peeked};
use crate::proxy::{self, Outbound};
use crate::state::RouterState;
use tracing::Instrument;

/// Serves one request: the router's own routes, else the proxied pipeline.
pub(super) async fn dispatch(
    state: &Arc<RouterState>,
    req: Request<Incoming>,
    route: &'static str,
    request_id: &HeaderValue,
    received: Instant,
    access: Option<&Arc<Access>>,
    trace: &tracing::Span,
) -> Result<Response<Body>, ApiError> {
    // None of the router's own routes is under `/v1/`: those go straight on. The rest are
    // answered in a future of their own (boxed), so the proxied path does not carry its size.
    let req = if req.uri().path().starts_with("/v1/") {
        req
    } else {
        match Box::pin(local::answer(state, req)).await {
            Ok(answer) => return answer,
            Err(req) => req,
        }
    };
    let generate = proxied_route(req.method(), req.uri().path())?;
    // In the admission span only when there is one: the wrapper would copy the admission. Built
    // where it is awaited: a local would be copied into the await's slot.
    let span = crate::observe::trace::admission();
    let mut admitted = if span.is_none() {
        Admitted::admit(state, req, route, request_id, received, access).await?
    } else {
        Admitted::admit(state, req, route, request_id, received, access)
            .instrument(span)
            .await?
    };
    if !generate {
        // Written into its box in place (as `handle` boxes this future), not copied there.
        return Box::into_pin(Box::write(Box::new_uninit(), admitted.pass_through(state))).await;
    }
    let mut g = Generation::peek(&mut admitted)?;
    let stored_home = g.stored_home(state).await;
    let identity = g.identity(stored_home)?;
    if let (Some(a), Some(id)) = (access, &identity) {
        a.program(&id.program_id);
    }
    if let Some(id) = &identity {
        trace.record("program_router.program", id.program_id.as_str());
    }
    if let Some(m) = &g.peeked.model {
        trace.record("gen_ai.request.model", m.as_str());
    }
    if let Some(answered) = g.owner_replica(state, identity.as_ref()).await {
        return answered;
    }
    let tenant = g.tenant();
    if let (Some(a), Some(t)) = (access, &tenant) {
        a.tenant(t);
    }
    if let Some(t) = &tenant {
        trace.record("program_router.tenant", t.as_str());
    }
    let rate = g.quota(tenant.as_deref())?;
    let outgoing = g.rewrite()?;
    let (pin, ticket) = g
        .schedule(state, identity, stored_home, tenant.as_deref())
        .await?;
    let fair = g
        .fair_queue(state, tenant.as_deref(), ticket.is_some())
        .await?;
    let placed = Placed {
        pin,
        ticket,
        fair,
        rate,
    };
    let sse = (g.peeked.stream, outgoing.usage_injected);
    let out = outbound(
        g.admitted,
        outgoing.body,
        Some(&g.peeked),
        &g.prompt,
        sse,
        placed,
    );
    // Awaited here, not in a helper future: each nested future level would copy the whole
    // forwarding state again on every request.
    proxy::forward(&state.forwarder, out).await
}

/// Whether `path` is a proxied route, and a generation (POST only); 404 / 405 otherwise.
fn proxied_route(method: &Method, path: &str) -> Result<bool, ApiError> {
    if !path.starts_with("/v1/") && !VLLM_ROUTES.contains(&path) {
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
    Ok(generate)
}

/// A request let in: its key checked, its place among the requests in progress taken, its body
/// read within the router's budget.
struct Admitted<'a> {
    applied: crate::applied::Handle,
    route: &'static str,
    request_id: &'a HeaderValue,
    received: Instant,
    /// The name of the key the client presented, when clients must present one.
    client: Option<Arc<str>>,
    place: Option<crate::limit::Place>,
    parts: http::request::Parts,
    path_and_query: http::uri::PathAndQuery,
    body: Bytes,
    held: Option<crate::limit::BodyBytes>,
    /// The request's access-log record, when the access log is on.
    access: Option<Arc<Access>>,
}

impl<'a> Admitted<'a> {
    /// Before the body is read, and before any queue or scheduler sees the request: the key,
    /// then a place (`limits.max_concurrent_requests`), then the body.
    async fn admit(
        state: &Arc<RouterState>,
        req: Request<Incoming>,
        route: &'static str,
        request_id: &'a HeaderValue,
        received: Instant,
        access: Option<&Arc<Access>>,
    ) -> Result<Self, ApiError> {
        let applied = state.applied_here();
        // A guard, not a clone: the directory's keys are read here only.
        let client = {
            let dir = state.client_dir.load();
            crate::auth::authorize(&applied.keys(dir.as_deref()), req.headers())?
        };
        let place = match &applied.limiter {
            Some(l) => {
                let limits = &applied.config.limits;
                let wait = crate::config::duration(limits.queue_timeout_secs);
                let started = Instant::now();
                let place = Box::pin(
                    l.enter(limits.queue_size, wait, state.queues_closed())
                        .instrument(crate::observe::trace::queue_wait("concurrency")),
                )
                .await;
                if let Some(a) = access {
                    a.queued(started.elapsed());
                }
                Some(place?)
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
        Ok(Admitted {
            applied,
            route,
            request_id,
            received,
            client,
            place,
            parts,
            path_and_query,
            body,
            held,
            access: access.cloned(),
        })
    }

    /// Other `/v1/*` endpoints (models, embeddings, ...) and vLLM's own request-level endpoints
    /// (tokenize, score, ...) pass through unchanged; a stored response's own endpoints go to
    /// the server that stored it.
    async fn pass_through(mut self, state: &Arc<RouterState>) -> Result<Response<Body>, ApiError> {
        let pin = match crate::proxy::stored::id_in_path(self.parts.uri.path()) {
            Some(id) => Box::pin(peering::stored_home(state, &self.applied, id)).await,
            None => None,
        };
        let body = self.body.clone();
        let placed = Placed {
            pin,
            ..Placed::default()
        };
        let out = outbound(&mut self, body, None, &[], (false, false), placed);
        proxy::forward(&state.forwarder, out).await
    }
}

/// What forwarding gets for `a` with what the pipeline decided: `peeked` and `prompt` inform
/// the policy; `sse` is (the client asked for a stream, the router added a usage chunk it must
/// filter out). What `a` holds until the response ends moves into the [`Held`]; the rest is
/// borrowed, so the caller keeps `a` until forwarding returns.
fn outbound<'s>(
    a: &'s mut Admitted<'_>,
    body: Bytes,
    peeked: Option<&'s Peeked>,
    prompt: &'s [u8],
    (sse, filter_usage_chunk): (bool, bool),
    placed: Placed,
) -> Outbound<'s, Held> {
    let capture_tool = placed.ticket.as_ref().is_some_and(|t| t.wants_tool());
    let hold = Held {
        ticket: placed.ticket,
        fair: placed.fair,
        rate: placed.rate,
        _place: a.place.take(),
        _bytes: a.held.take(),
        access: a.access.take(),
    };
    let path_and_query = std::mem::replace(
        &mut a.path_and_query,
        http::uri::PathAndQuery::from_static("/"),
    );
    let a = &*a;
    let route_config = a.applied.route();
    // Looked up only for a policy that reads it, and not for a request already placed.
    let hashed = route_config.policy.reads_hash_key() && placed.pin.is_none();
    let info = RequestInfo {
        hash_key: peeked
            .filter(|_| hashed)
            .and_then(|p| request::hash_key(&a.parts.headers, p)),
        prompt,
    };
    Outbound {
        route_config,
        route: a.route,
        method: a.parts.method.clone(),
        path_and_query,
        headers: &a.parts.headers,
        body,
        info,
        sse,
        filter_usage_chunk,
        request_id: a.request_id,
        received: a.received,
        pin: placed.pin,
        generation: peeked.is_some(),
        hold: Some(hold),
        capture_tool,
        tool_forced: peeked.is_some_and(|p| p.forces_tool),
    }
}

/// What a forwarded request holds until its response ends.
struct Held {
    ticket: Option<crate::program::runtime::ProgramTicket>,
    fair: Option<crate::fair::runtime::FairPermit>,
    rate: Option<crate::fair::runtime::RateCharge>,
    /// Freed when the response ended.
    _place: Option<crate::limit::Place>,
    _bytes: Option<crate::limit::BodyBytes>,
    access: Option<Arc<Access>>,
}

impl proxy::Hold for Held {
    fn end(mut self, ended: proxy::Ended<'_>) {
        let proxy::Ended {
            complete,
            usage,
            ref tool,
            ..
        } = ended;
        if let Some(a) = self.access.take() {
            let tokens = usage.map(|u| (u.prompt_tokens, u.completion_tokens, u.cached_tokens()));
            a.upstream(ended.target, ended.ending, tokens);
        }
        if let Some(ticket) = self.ticket.take()
            && complete
        {
            ticket.complete(
                usage.map(|u| crate::program::scheduler::Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens(),
                }),
                match tool {
                    ToolRead::Named(name) => ToolCall::Named(name),
                    ToolRead::None => ToolCall::None,
                    ToolRead::Unknown => ToolCall::Unknown,
                },
            );
        }
        if let (Some(permit), Some(u)) = (self.fair.take(), usage) {
            permit.complete(u.prompt_tokens, u.completion_tokens);
        }
        if let (Some(rate), Some(u)) = (self.rate.take(), usage) {
            rate.settle(u.prompt_tokens + u.completion_tokens);
        }
        // Otherwise the ticket (and fair permit) drop here: the request did not run to completion.
    }
}

/// Where the pipeline placed a request and what it holds until the response ends.
#[derive(Default)]
struct Placed {
    /// The target Program scheduling (or a stored response's home) chose.
    pin: Option<usize>,
    ticket: Option<crate::program::runtime::ProgramTicket>,
    fair: Option<crate::fair::runtime::FairPermit>,
    rate: Option<crate::fair::runtime::RateCharge>,
}

/// A generation request (chat, completions, messages, responses) with its body peeked.
struct Generation<'a, 'b> {
    /// Borrowed: `dispatch` keeps it in place instead of moving it into this.
    admitted: &'b mut Admitted<'a>,
    peeked: Peeked,
    /// Zero-copy view of the prompt in the client's buffer (edits never touch it).
    prompt: Bytes,
}

impl<'a, 'b> Generation<'a, 'b> {
    fn peek(admitted: &'b mut Admitted<'a>) -> Result<Self, ApiError> {
        let peeked = request::peek(&admitted.body)?;
        let prompt = peeked
            .prompt
            .clone()
            .map(|r| admitted.body.slice(r))
            .unwrap_or_default();
        Ok(Generation {
            admitted,
            peeked,
            prompt,
        })
    }

    fn path(&self) -> &str {
        self.admitted.parts.uri.path()
    }

    /// A Responses request that continues a stored response must reach the server that stored
    /// it; Program scheduling could place it anywhere, so it steps aside for this request.
    async fn stored_home(&self, state: &Arc<RouterState>) -> Option<usize> {
        let id = self.peeked.previous_response_id.as_deref();
        match id.filter(|_| self.path() == "/v1/responses") {
            Some(id) => Box::pin(peering::stored_home(state, &self.admitted.applied, id)).await,
            None => None,
        }
    }

    /// The request's Program, unless it goes to a stored response's home.
    fn identity(&self, stored_home: Option<usize>) -> Result<Option<Identity>, ApiError> {
        if stored_home.is_some() {
            return Ok(None);
        }
        let a = &self.admitted;
        program_identity(
            &a.applied,
            a.client.as_deref(),
            &self.peeked,
            &a.body,
            &a.parts.headers,
        )
    }

    /// A Program another router replica owns is scheduled there (`peers`): the quota, queues
    /// and scheduler of that replica apply, not this one's. `Some`: the owner's answer.
    async fn owner_replica(
        &mut self,
        state: &Arc<RouterState>,
        identity: Option<&Identity>,
    ) -> Option<Result<Response<Body>, ApiError>> {
        let a = &mut *self.admitted;
        let (Some(peers), Some(id)) = (a.applied.peers.clone(), identity) else {
            return None;
        };
        let here = peering::Request {
            method: &a.parts.method,
            path_and_query: &a.path_and_query,
            headers: &a.parts.headers,
            body: &a.body,
            request_id: a.request_id,
        };
        let place = a.place.take();
        match Box::pin(peering::to_owner(
            state, &a.applied, &peers, id, here, place,
        ))
        .await
        {
            peering::Owner::Answered(r) => {
                // The body stays held (in the budget) until the owner's answer ends.
                let held = a.held.take();
                Some(r.map(|resp| {
                    resp.map(|b| crate::net::body::Holding::new(b, held).boxed_unsync())
                }))
            }
            peering::Owner::Here(place) => {
                // Another replica may have held it before the member list changed.
                a.place = place;
                let model = self.peeked.model.as_deref().unwrap_or("");
                Box::pin(peering::take_over(state, &a.applied, id, model)).await;
                None
            }
        }
    }

    /// With fair queueing, the request's tenant (one for its quota, its queue and its Program).
    fn tenant(&self) -> Option<String> {
        let a = &self.admitted;
        let user = self.peeked.user.as_deref();
        let fair = a.applied.fair.as_ref()?;
        Some(fair.tenant(&a.parts.headers, user, a.client.as_deref()))
    }

    /// The tenant's quota, before the request waits anywhere (Program scheduling included);
    /// about four bytes of JSON text per token, as the fair queue estimates.
    fn quota(
        &self,
        tenant: Option<&str>,
    ) -> Result<Option<crate::fair::runtime::RateCharge>, ApiError> {
        match (&self.admitted.applied.fair, tenant) {
            (Some(f), Some(t)) => f
                .rate_admit(t, (self.prompt.len() / 4) as u64)
                .map_err(|r| rate_limited(t, r)),
            _ => Ok(None),
        }
    }

    /// The body the backend gets: `agentic_context` per the config, the usage chunk asked for.
    fn rewrite(&self) -> Result<Outgoing, ApiError> {
        let cfg = &self.admitted.applied.config;
        request::rewrite(
            self.admitted.body.clone(),
            &self.peeked,
            cfg.agentic_context,
            cfg.inject_stream_usage && takes_stream_options(self.path()),
        )
    }

    /// Program scheduling's decision: the target and the ticket held until the response ends
    /// (none without an identity; a stored response's home wins).
    async fn schedule(
        &mut self,
        state: &Arc<RouterState>,
        identity: Option<Identity>,
        stored_home: Option<usize>,
        tenant: Option<&str>,
    ) -> Result<
        (
            Option<usize>,
            Option<crate::program::runtime::ProgramTicket>,
        ),
        ApiError,
    > {
        if stored_home.is_some() {
            return Ok((stored_home, None));
        }
        let (Some(rt), Some(id)) = (self.admitted.applied.program.clone(), identity) else {
            return Ok((None, None));
        };
        let applied = &self.admitted.applied;
        let req = ProgramRequest {
            id,
            model: self.peeked.model.as_deref(),
            endpoint: self.admitted.route,
            prompt: &self.prompt,
            system: self
                .peeked
                .system(&self.admitted.body)
                .and_then(|r| self.admitted.body.get(r))
                .unwrap_or_default(),
            tenant,
        };
        let started = Instant::now();
        let admitted = program_admission(state, &rt, applied, req)
            .instrument(crate::observe::trace::queue_wait("program"))
            .await;
        if let Some(a) = &self.admitted.access {
            a.queued(started.elapsed());
        }
        let (placed, ticket) = admitted?;
        let Some(target) = placed else {
            return Ok((None, ticket));
        };
        // The decision names a target id: a reload while the request waited may have
        // re-ordered or changed the targets, so find it by id (the request's snapshot first,
        // then the newest configuration).
        let (fresh, index) = resolve_target(state, applied, &target)?;
        if let Some(fresh) = fresh {
            self.admitted.applied = fresh;
        }
        Ok((Some(index), ticket))
    }

    /// Requests outside Program scheduling (which has its own RequestPool) wait their turn in
    /// the fair queue, when one is configured.
    async fn fair_queue(
        &self,
        state: &Arc<RouterState>,
        tenant: Option<&str>,
        scheduled: bool,
    ) -> Result<Option<crate::fair::runtime::FairPermit>, ApiError> {
        let a = &self.admitted;
        match (&a.applied.fair, tenant, scheduled) {
            (Some(f), Some(tenant), false) => {
                let n = self.prompt.len();
                let model = self.peeked.model.as_deref();
                let _held =
                    (state.metrics.backlog).hold(model, crate::observe::backlog::Stage::Fair);
                let started = Instant::now();
                let permit = Box::pin(
                    fair_admission(state, f, &a.parts.headers, tenant, n)
                        .instrument(crate::observe::trace::queue_wait("fair")),
                )
                .await;
                if let Some(access) = &a.access {
                    access.queued(started.elapsed());
                }
                Ok(Some(permit?))
            }
            _ => Ok(None),
        }
    }
}

/// A request's head, its whole body, and the body's place in the router's byte budget.
type ReadBody = (http::request::Parts, Bytes, Option<crate::limit::BodyBytes>);

/// The request's head and whole body, refused above `limit` bytes (413), when it takes longer
/// than `limits.client_body_timeout_secs` (408), or when it would pass the router's budget of
/// buffered bytes (503, before reading it when its length is declared).
pub(super) async fn read_body(
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
    let mut read = std::pin::pin!(whole(Limited::new(body, limit_usize)));
    // A body that came with its head (most do) is read without arming the timer.
    let ready = futures_util::FutureExt::now_or_never(read.as_mut());
    let read = match ready {
        Some(r) => r,
        None => match limits.client_body_timeout_secs.map(crate::config::duration) {
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
        },
    };
    match read {
        Ok(bytes) => {
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

/// The whole of `body`: its one data frame as it came (no copy), or its frames joined.
async fn whole(mut body: Limited<Incoming>) -> Result<Bytes, crate::net::body::BoxError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        // Trailers are not forwarded.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if let Some(j) = &mut joined {
            j.extend_from_slice(&data);
        } else if let Some(f) = first.take() {
            let mut j = bytes::BytesMut::with_capacity(f.len() + data.len());
            j.extend_from_slice(&f);
            j.extend_from_slice(&data);
            joined = Some(j);
        } else {
            first = Some(data);
        }
    }
    Ok(joined
        .map(bytes::BytesMut::freeze)
        .or(first)
        .unwrap_or_default())
}

/// The index of target `id` in the request's own configuration, or else the newest
/// configuration (returned) and the index there; 503 if neither holds it (the target was
/// removed between the decision and now).
fn resolve_target(
    state: &Arc<RouterState>,
    applied: &Applied,
    id: &str,
) -> Result<(Option<crate::applied::Handle>, usize), ApiError> {
    let find = |a: &Applied| a.targets.targets.iter().position(|t| t.id == id);
    if let Some(i) = find(applied) {
        return Ok((None, i));
    }
    let newest = state.applied_here();
    match find(&newest) {
        Some(i) => Ok((Some(newest), i)),
        None => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "reconfigured",
            format!("target {id} left the configuration while the request waited; retry"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_routes_are_v1_and_vllms_own_and_generations_take_post_only() {
        assert_eq!(
            proxied_route(&Method::POST, "/v1/chat/completions").ok(),
            Some(true)
        );
        assert_eq!(proxied_route(&Method::GET, "/v1/models").ok(), Some(false));
        assert_eq!(proxied_route(&Method::POST, "/tokenize").ok(), Some(false));
        let e = proxied_route(&Method::GET, "/v1/messages").expect_err("GET generation");
        assert_eq!(e.status, StatusCode::METHOD_NOT_ALLOWED);
        let e = proxied_route(&Method::POST, "/reset_prefix_cache").expect_err("admin");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
    }
}
