//! The steps of a request that may hold it or refuse it before it is forwarded: the tenant's
//! quota, Program identity and Program scheduling's RequestPool, and the fair queue. Each answers
//! with the OpenAI-style error a client of that step should see.

use std::sync::Arc;

use http::StatusCode;

use crate::error::ApiError;
use crate::proxy::request;
use crate::state::RouterState;

/// 429 for a tenant over its quota (`fairness.tenant_rate_limits`).
pub(super) fn rate_limited(tenant: &str, r: crate::fair::rate::OverQuota) -> ApiError {
    let what = if r.tokens { "tokens" } else { "requests" };
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "tenant_rate_limited",
        format!(
            "tenant {tenant:?} used its {what} per minute; retry in {} s",
            r.retry_after_secs
        ),
    )
    .retry_after(r.retry_after_secs)
}

/// 503 for a request still waiting in a router queue when the drain closes the queues.
fn shutting_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "the router is shutting down and no longer queues requests; retry the request",
    )
}

/// Waits in the fair queue; errors are OpenAI-style 429 (tenant queue full), 504 (queue timeout),
/// 400 (unknown class), 403 (a class above the tenant's cap) or 503 (reconfigured, shutting
/// down).
pub(super) async fn fair_admission(
    state: &RouterState,
    f: &Arc<crate::fair::runtime::FairRuntime>,
    headers: &http::HeaderMap,
    tenant: &str,
    prompt_bytes: usize,
) -> Result<crate::fair::runtime::FairPermit, ApiError> {
    use crate::fair::runtime::FairError;
    let class = f.class(headers, tenant);
    let refused = |e: FairError| match e {
        FairError::ClassNotAllowed { class, max } => ApiError::new(
            StatusCode::FORBIDDEN,
            "class_not_allowed",
            format!("priority class {class:?} is above the highest this client may use ({max:?})"),
        ),
        FairError::QueueFull { tenant } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "tenant_queue_full",
            format!(
                "tenant {tenant:?} already has {} requests queued; retry later",
                f.cfg().max_queue_per_tenant
            ),
        ),
        FairError::Timeout { seconds } => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "queue_timeout",
            format!("the request waited longer than the queue timeout ({seconds} s) for capacity"),
        ),
        FairError::UnknownClass(c) => ApiError::bad_request(format!(
            "unknown priority class {c:?} (configured: {})",
            f.cfg()
                .classes
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        FairError::ShuttingDown => shutting_down(),
        FairError::Reconfigured => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "reconfigured",
            "fair queueing was reconfigured while the request waited; retry",
        ),
    };
    f.check_class(tenant, &class).map_err(refused)?;
    // About four bytes of JSON text per token: an estimate charged at dispatch; the real prompt
    // and completion counts are charged from the response's usage.
    let estimate = (prompt_bytes / 4) as u64;
    f.admit(tenant, &class, estimate, state.queues_closed())
        .await
        .map_err(refused)
}

/// The request's Program identity when Program scheduling is on and the request carries one,
/// scoped to the client that presented a key of its own.
pub(super) fn program_identity(
    applied: &crate::applied::Applied,
    client: Option<&str>,
    peeked: &request::Peeked,
    body: &[u8],
    headers: &http::HeaderMap,
) -> Result<Option<crate::program::identity::Identity>, ApiError> {
    use crate::program::identity;
    let Some(ps) = &applied.config.program_scheduling else {
        return Ok(None);
    };
    let ctx = peeked.agentic_context(body)?;
    let hint = if ps.program_scheduling_enable_key == crate::config::program::EnableKey::Auto {
        peeked.agent_hint(body)?
    } else {
        None
    };
    let id = identity::resolve(
        ps.program_scheduling_enable_key,
        ctx.as_ref(),
        hint.as_ref(),
        headers,
    )
    .map_err(|e| ApiError::bad_request(format!("invalid Program identity: {e}")))?;
    Ok(id.map(|mut id| {
        if let Some(client) = client {
            // Each client's Programs are its own: two teams that both call a session "s1" are
            // two Programs, and one cannot join, pin or pause the other's.
            id.scope(client);
        }
        id
    }))
}

/// A request with Program identity as Program scheduling takes it.
pub(super) struct ProgramRequest<'a> {
    pub id: crate::program::identity::Identity,
    pub model: Option<&'a str>,
    /// The route it came on.
    pub endpoint: &'static str,
    pub prompt: &'a [u8],
    /// The system prompt's leading bytes (empty when the request has none).
    pub system: &'a [u8],
    pub tenant: Option<&'a str>,
}

/// Program scheduling for a request that carries Program identity: waits in the RequestPool if
/// needed and returns the target to pin.
pub(super) async fn program_admission(
    state: &RouterState,
    rt: &Arc<crate::program::runtime::ProgramRuntime>,
    applied: &crate::applied::Applied,
    req: ProgramRequest<'_>,
) -> Result<
    (
        Option<String>,
        Option<crate::program::runtime::ProgramTicket>,
    ),
    ApiError,
> {
    use crate::observe::backlog::Stage;
    use crate::program::runtime::{Admission, Placement};
    let Some(ps) = &applied.config.program_scheduling else {
        return Ok((None, None));
    };
    let model = req.model.unwrap_or("");
    // With fair queueing configured, retained requests resume tenant-fairly within a tier.
    let tenant = applied
        .fair
        .as_ref()
        .zip(req.tenant)
        .map(|(f, t)| (t.to_string(), f.weight(t)));
    let (ticket, admission) = rt.admit(
        model,
        req.endpoint,
        req.id,
        (req.prompt, req.system),
        tenant,
    );
    let queue_timeout = || {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "queue_timeout",
            format!(
                "the request waited longer than the queue timeout ({} s) for capacity",
                ps.queue_timeout_seconds
            ),
        )
    };
    let placement = match admission {
        Admission::Now(p) => p,
        // Returning early drops `ticket`, which takes the request out of the RequestPool.
        Admission::Wait(rx) => {
            let _held = state.metrics.backlog.hold(Some(model), Stage::Program);
            tokio::select! {
                biased;
                p = rx => p.map_err(|_| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "reconfigured",
                        "Program scheduling was reconfigured while the request waited; retry",
                    )
                })?,
                _ = state.queues_closed() => return Err(shutting_down()),
            }
        }
    };
    match placement {
        Placement::Target(id) => Ok((Some(id), Some(ticket))),
        Placement::QueueTimeout => Err(queue_timeout()),
        Placement::NoTarget => Err(ApiError::no_target()),
        Placement::PoolFull => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "request_pool_full",
            format!(
                "the RequestPool already holds {} waiting requests; retry shortly",
                ps.max_retained_requests
            ),
        )
        .retry_after(1)),
        Placement::ProgramsFull => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "program_capacity",
            format!(
                "the router holds {} Programs and none is idle; retry shortly",
                ps.max_programs
            ),
        )
        .retry_after(1)),
    }
}
