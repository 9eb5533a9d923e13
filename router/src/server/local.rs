//! The router's own routes: health, readiness, `/status`, `/scheduling/diagnostics` and, on the
//! peer listener, `/peers/*`. Everything else is a proxied route ([`super::pipeline`]).

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{full, json, peering, status};
use crate::error::ApiError;
use crate::net::body::Body;
use crate::state::RouterState;

/// The answer when `req` is for one of the router's own routes; else the request back.
pub(super) async fn answer(
    state: &Arc<RouterState>,
    req: Request<Incoming>,
) -> Result<Result<Response<Body>, ApiError>, Request<Incoming>> {
    let method = req.method().clone();
    match (&method, req.uri().path()) {
        // `/ping` is the health path of SageMaker-style hosts (vLLM answers it too).
        (&Method::GET, "/health" | "/liveness" | "/ping") => Ok(Ok(Response::new(full("OK")))),
        (&Method::GET, "/readiness") => {
            let ok = status::ready(state);
            let code = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Ok(Ok(json(code, &serde_json::json!({ "ready": ok }))))
        }
        (&Method::GET, "/status") => Ok(Ok(json(StatusCode::OK, &status::status(state)))),
        (&Method::GET, "/scheduling/diagnostics") => {
            let applied = state.applied.load_full();
            // With per-client keys a client sees its own Programs (the workers' key sees all).
            let dir = state.client_dir.load_full();
            let scope = match crate::auth::diagnostics_scope(
                &applied.keys(dir.as_deref()),
                req.headers(),
            ) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
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
                return Ok(Ok(json(
                    StatusCode::OK,
                    &peering::all_replicas(state, &applied, req.headers(), v).await,
                )));
            }
            Ok(Ok(json(StatusCode::OK, &v)))
        }
        // Only on the peer listener, which every request reaches authenticated and marked
        // as from a peer (the API listener removed the mark from clients' requests).
        (&Method::GET, p)
            if p.starts_with("/peers/")
                && req.headers().contains_key(&crate::peers::FORWARDED_BY) =>
        {
            Ok(peering::endpoint(state, p))
        }
        (&Method::POST, p)
            if p.starts_with("/peers/")
                && req.headers().contains_key(&crate::peers::FORWARDED_BY) =>
        {
            let p = p.to_string();
            Ok(peering::post_endpoint(state, &p, req).await)
        }
        (
            _,
            "/health"
            | "/liveness"
            | "/ping"
            | "/readiness"
            | "/status"
            | "/scheduling/diagnostics",
        ) => Ok(Err(ApiError::method_not_allowed("GET"))),
        _ => Err(req),
    }
}
