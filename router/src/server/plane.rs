//! Which listener a request came in on, and what each listener lets through.
//!
//! The API listener serves clients: it serves no `/peers/*` route and drops every header that
//! only replicas send each other, so a client cannot pass as one. The peer listener serves only
//! the fleet's other replicas: a request without the peer secret is refused before anything
//! reads it, and only the routes replicas call are served there.

use std::sync::Arc;

use http::{HeaderValue, Method, Request, StatusCode};
use hyper::body::Incoming;
use tokio::net::TcpListener;

use super::GENERATE_ROUTES;
use crate::error::ApiError;
use crate::state::RouterState;

/// Which listener a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// Clients.
    Api,
    /// Other router replicas, holding the peer secret.
    Peer,
}

/// Serves the peer listener (router ↔ router) until the API listener stops accepting, then
/// drains what is in flight on it with the API listener's deadline. Connections on it are
/// served on the shared runtime.
pub async fn serve_peers(state: Arc<RouterState>, listener: TcpListener) {
    let st = state.clone();
    let shutdown = async move { st.accepting_stopped().await };
    super::accept_loop(state, listener, None, shutdown, Plane::Peer).await
}

/// The headers only replicas send each other: a client's are removed on the API listener.
const PEER_HEADERS: [&http::header::HeaderName; 6] = [
    &crate::peers::FORWARDED_BY,
    &crate::peers::ADDRESSED_TO,
    &crate::peers::ANSWERED_BY,
    &crate::peers::gossip::REVISION,
    &crate::peers::gossip::SENDER_URL,
    &crate::peers::PEER_KEY,
];

/// What every name in [`PEER_HEADERS`] starts with (tested).
const PEER_PREFIX: &str = "x-program-router-peer";

/// Lets `req` through `plane`'s gate, or says why not. A request admitted on the peer listener
/// carries no peer secret any more and is always marked as from a peer.
pub(super) fn admit(
    state: &RouterState,
    plane: Plane,
    req: &mut Request<Incoming>,
    remote: Option<std::net::IpAddr>,
) -> Result<(), ApiError> {
    if plane == Plane::Api {
        // One pass over the names, not six lookups: a client rarely sends any of them.
        let peerlike = |k: &http::header::HeaderName| k.as_str().starts_with(PEER_PREFIX);
        if req.headers().keys().any(peerlike) {
            for h in PEER_HEADERS {
                req.headers_mut().remove(h);
            }
        }
        return Ok(());
    }
    let known = state
        .peer_key
        .as_ref()
        .is_some_and(|k| k.check_and_remove(req.headers_mut()));
    if !known {
        // Counted, and logged at debug only: anyone who reaches the port can send these.
        state.peer_metrics.auth_failures.inc();
        tracing::debug!(remote = ?remote, path = %req.uri().path(),
            "peer listener: request without the peer secret refused");
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "peer_unauthorized",
            "the peer listener serves only router replicas presenting the peer secret",
        ));
    }
    if !peer_route(req.method(), req.uri().path()) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "{} is not served on the peer listener (clients use the API port)",
                req.uri().path()
            ),
        ));
    }
    if !req.headers().contains_key(&crate::peers::FORWARDED_BY) {
        req.headers_mut().insert(
            crate::peers::FORWARDED_BY.clone(),
            HeaderValue::from_static("unnamed"),
        );
    }
    Ok(())
}

/// What the peer listener serves: the replicas' own endpoints, the diagnostics they gather for
/// `?replicas=all`, and the Program requests they hand to their owner.
fn peer_route(method: &Method, path: &str) -> bool {
    match (method, path) {
        (&Method::GET | &Method::POST, p) if p.starts_with("/peers/") => true,
        (&Method::GET, "/scheduling/diagnostics") => true,
        (&Method::POST, p) => GENERATE_ROUTES.iter().any(|(r, _)| *r == p),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_listener_serves_only_what_replicas_call() {
        for (m, p) in [
            (Method::GET, "/peers/usage"),
            (Method::POST, "/peers/adopt"),
            (Method::GET, "/scheduling/diagnostics"),
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/messages"),
        ] {
            assert!(peer_route(&m, p), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, "/v1/models"),
            (Method::GET, "/status"),
            (Method::GET, "/metrics"),
            (Method::POST, "/tokenize"),
            (Method::GET, "/v1/chat/completions"),
            (Method::DELETE, "/peers/usage"),
        ] {
            assert!(!peer_route(&m, p), "{m} {p}");
        }
    }

    #[test]
    fn every_peer_header_has_the_prefix_the_api_gate_looks_for() {
        for h in PEER_HEADERS {
            assert!(h.as_str().starts_with(PEER_PREFIX), "{h}");
        }
    }
}
