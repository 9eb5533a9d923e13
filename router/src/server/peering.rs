//! The steps of a request that involve the other router replicas (`peers`): the `/peers/*`
//! endpoints they read, handing a Program request to the replica that owns it, finding which
//! server stored a Responses API response, and `/scheduling/diagnostics?replicas=all`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;

use super::{Body, json};
use crate::applied::Applied;
use crate::error::ApiError;
use crate::program::identity::Identity;
use crate::state::RouterState;

/// `GET /peers/...`: what the other replicas read here (only on the peer listener, which
/// authenticated the request); 404 without `peers`.
pub(super) fn endpoint(state: &RouterState, path: &str) -> Result<Response<Body>, ApiError> {
    let applied = state.applied.load_full();
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for {path} (this router has no peers)"),
        )
    };
    if applied.peers.is_none() {
        return Err(not_found());
    }
    if path == "/peers/members" {
        // The member list in force and its revision (signed), for a replica whose list is older.
        return Ok(json(
            StatusCode::OK,
            &crate::peers::gossip::members_document(&applied.config, applied.peers.as_deref()),
        ));
    }
    if path == "/peers/usage" {
        // What this replica charged to tenants' quotas.
        return Ok(json(
            StatusCode::OK,
            &crate::peers::usage_document(applied.fair.as_deref()),
        ));
    }
    if let Some(id) = path.strip_prefix("/peers/response-home/") {
        // Which worker stored a Responses API response this replica relayed.
        let url = state.forwarder.response_homes.get(id);
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "url": url.as_deref() }),
        ));
    }
    Err(not_found())
}

/// The largest body `/peers/*` takes (a replica holding 100,000 Programs sends about 15 MB).
const PEER_BODY_LIMIT: u64 = 64 * 1024 * 1024;

/// `POST /peers/hand-over` (`{"model", "program_id"}`: this replica gives up that Program, when
/// idle, to the replica asking, which owns it now) and `POST /peers/adopt` (`{"programs"}`: a replica
/// shutting down gives this one the Programs it owns next). Only on the peer listener.
pub(super) async fn post_endpoint(
    state: &RouterState,
    path: &str,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<Response<Body>, ApiError> {
    let applied = state.applied.load_full();
    if applied.peers.is_none() || !matches!(path, "/peers/hand-over" | "/peers/adopt") {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route for POST {path}"),
        ));
    }
    // A list of Programs, not a prompt: far below the payload limit for generations.
    let limit = applied.config.limits.max_payload_size.min(PEER_BODY_LIMIT);
    let (_, body, _held) =
        super::pipeline::read_body(state, &applied.config.limits, limit, req).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let count = |event: &str, n: usize| {
        state
            .peer_metrics
            .handovers
            .with_label_values(&[event])
            .inc_by(n as u64)
    };
    let rt = applied.program.as_ref();
    if path == "/peers/hand-over" {
        let field = |k: &str| {
            v[k].as_str()
                .ok_or_else(|| ApiError::bad_request(format!("{k}: a string is required")))
        };
        let (model, program_id) = (field("model")?, field("program_id")?);
        let given = rt.and_then(|rt| rt.hand_over(model, program_id));
        count("given", usize::from(given.is_some()));
        return Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "program": given }),
        ));
    }
    // The error names the field's path (`programs[0].finished: invalid type ...`).
    let programs: Vec<crate::program::scheduler::HandedOver> =
        serde_path_to_error::deserialize(v["programs"].clone()).map_err(|e| {
            let at = e.path().to_string();
            let at = if at == "." { String::new() } else { at };
            ApiError::bad_request(format!("programs{at}: {}", e.into_inner()))
        })?;
    let adopted = rt.map_or(0, |rt| rt.adopt(&programs));
    count("adopted", adopted);
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "adopted": adopted }),
    ))
}

/// Before this replica schedules Program `id` for the first time: when the member list changed
/// or this replica started within the paused retention (so another replica may have held the
/// Program), the other members are asked for it, and what one held keeps its rank here. A
/// request that says it is the Program's first step (`step_id` 0) is not asked about.
pub(super) async fn take_over(state: &RouterState, applied: &Applied, id: &Identity, model: &str) {
    let (Some(peers), Some(rt)) = (&applied.peers, &applied.program) else {
        return;
    };
    let window = applied
        .config
        .program_scheduling
        .as_ref()
        .map_or(0.0, |p| p.paused_retention_ttl_seconds);
    if !peers.hand_over
        || id.step_id == Some(0)
        || peers.members.len() < 2
        || !peers.recently_changed(crate::config::duration(window))
        || rt.knows(model, &id.program_id)
    {
        return;
    }
    // Concurrent first requests of this Program: one asks, the others find it adopted.
    let _turn = state.claims.turn(model, &id.program_id).await;
    if rt.knows(model, &id.program_id) {
        return;
    }
    let claimed = crate::peers::handover::claim(&state.peer_client, peers, model, &id.program_id);
    if let Some(h) = claimed.await {
        let n = rt.adopt(std::slice::from_ref(&h));
        state
            .peer_metrics
            .handovers
            .with_label_values(&["claimed"])
            .inc_by(n as u64);
        tracing::info!(program = %id.program_id, target = %h.target,
            "took over a Program from another replica");
    }
}

/// The parts of a client request a hand-off sends on unchanged.
pub(super) struct Request<'a> {
    pub method: &'a Method,
    pub path_and_query: &'a http::uri::PathAndQuery,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
}

/// What became of a Program request with respect to its owner replica.
pub(super) enum Owner {
    /// Answered: by the owner (relayed), or with an error (never sent twice).
    Answered(Result<Response<Body>, ApiError>),
    /// This replica schedules it (it owns the Program, the request came from a peer, or the
    /// owner is unreachable or shutting down); the place among the requests in progress is
    /// handed back.
    Here(Option<crate::limit::Place>),
}

/// Forwards of one request tried at most (to its owner, then the next owners) before this
/// replica serves it itself.
const MAX_FORWARD_ATTEMPTS: usize = 4;

/// Hands a request of Program `id` to the replica that owns its tree, unless that is this one.
pub(super) async fn to_owner(
    state: &RouterState,
    applied: &Applied,
    peers: &crate::peers::Peers,
    id: &Identity,
    req: Request<'_>,
    place: Option<crate::limit::Place>,
) -> Owner {
    let count = |outcome: &str| {
        state
            .peer_metrics
            .forwards
            .with_label_values(&[outcome])
            .inc()
    };
    if req.headers.contains_key(&crate::peers::FORWARDED_BY) {
        use crate::peers::forward::Decline;
        // The sender serves it instead when this replica declines: nothing was done with it.
        let declined = if state.is_draining() {
            Some(Decline::Draining)
        } else if !peers.addressed_here(req.headers) {
            Some(Decline::Misaddressed)
        } else {
            None
        };
        if let Some(why) = declined {
            return Owner::Answered(Ok(hold(crate::peers::decline(why), place)));
        }
        count("received");
        return Owner::Here(place);
    }
    let root = id.root_program_id.as_deref().unwrap_or(&id.program_id);
    // Members that could not be reached or declined this request: the next owner in every
    // replica's order serves it (the one a departing member handed its Programs to), this
    // replica when that is itself.
    let mut passed: Vec<&str> = Vec::new();
    // The member whose connection closed without an answer, sent the request once more.
    let mut resent: Option<&str> = None;
    let mut attempts = 0;
    while let Some(owner) = peers.next_owner(root, Instant::now(), &passed) {
        // Members that all fail in turn (a partition): serve it here rather than wait on each.
        attempts += 1;
        if attempts > MAX_FORWARD_ATTEMPTS {
            break;
        }
        let handoff = crate::peers::Handoff {
            method: req.method.clone(),
            path_and_query: req.path_and_query,
            headers: req.headers,
            body: req.body.clone(),
            request_id: req.request_id,
            timeout: crate::config::duration(applied.config.limits.request_timeout_secs),
        };
        match crate::peers::forward(&state.peer_client, peers, owner, handoff).await {
            Ok(resp) => {
                count("forwarded");
                return Owner::Answered(Ok(hold(resp, place)));
            }
            Err(crate::peers::ForwardError::Failed(e)) => {
                count("failed");
                return Owner::Answered(Err(e));
            }
            Err(crate::peers::ForwardError::Unreachable(why)) => {
                // Nothing was sent; every replica skips this owner for a while, so they agree
                // on the next one.
                count("unreachable");
                tracing::warn!(error = %why, "Program owner unreachable; trying the next owner");
                passed.push(owner.name.as_str());
            }
            Err(crate::peers::ForwardError::Closed(why)) => {
                // Once more to the same member (on another connection: a replica that is stopping
                // declines it or refuses the connection, and then the next owner serves it);
                // a second time, the next owner serves it.
                count("closed");
                tracing::warn!(error = %why, "Program owner closed the connection unanswered");
                if resent == Some(owner.name.as_str()) {
                    passed.push(owner.name.as_str());
                } else {
                    resent = Some(owner.name.as_str());
                }
            }
        }
    }
    Owner::Here(place)
}

/// The target for a request about stored response `id`: on the server that stored it, as this
/// replica knows or, with `peers`, as another replica that relayed it does (then remembered).
pub(super) async fn stored_home(state: &RouterState, applied: &Applied, id: &str) -> Option<usize> {
    let targets = &applied.targets.targets;
    if let Some(i) = state.forwarder.response_homes.home(id, targets) {
        return Some(i);
    }
    let peers = applied.peers.as_ref()?;
    let url = crate::peers::response_home(&state.peer_client, peers, id).await?;
    state.forwarder.response_homes.insert(id, &url);
    crate::proxy::stored::pick(&url, targets)
}

/// `/scheduling/diagnostics?replicas=all`: this replica's document `own` and every peer's, as
/// `{"replicas": [{"name", "url", "self", "diagnostics" | "error"}]}`.
pub(super) async fn all_replicas(
    state: &RouterState,
    applied: &Applied,
    headers: &http::HeaderMap,
    own: serde_json::Value,
) -> serde_json::Value {
    let me = applied.peers.as_ref().and_then(|p| p.self_name.clone());
    let mut replicas = vec![serde_json::json!({
        "name": me, "url": null, "self": true, "diagnostics": own,
    })];
    if let Some(peers) = &applied.peers {
        let others = crate::peers::member_diagnostics(
            &state.peer_client,
            peers,
            headers,
            Duration::from_secs(2),
        )
        .await;
        for (name, url, got) in others {
            replicas.push(match got {
                Ok(d) => {
                    serde_json::json!({"name": name, "url": url, "self": false, "diagnostics": d})
                }
                Err(e) => serde_json::json!({"name": name, "url": url, "self": false, "error": e}),
            });
        }
    }
    serde_json::json!({ "replicas": replicas })
}

/// `resp` with `place` (a place among the requests in progress) held until its body ends.
fn hold(resp: Response<Body>, place: Option<crate::limit::Place>) -> Response<Body> {
    match place {
        Some(p) => resp.map(|b| crate::net::body::Holding::new(b, p).boxed_unsync()),
        None => resp,
    }
}
