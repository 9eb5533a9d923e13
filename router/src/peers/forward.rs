//! Handing a Program request to the replica that owns it, and relaying the answer.
//!
//! Owns the forward itself — the client's request, body and headers unchanged, to the owner's
//! API listener, the answer (streamed or not) relayed back with the sender's place among the
//! requests in progress held until it ends — and the owner's refusal while it shuts down, which
//! the sender answers by serving the request itself.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};

use super::{Member, PeerClient, Peers};
use crate::error::ApiError;
use crate::net::body::{Body, BoxError};

/// On a 503 from a replica that declined a forwarded request before doing anything with it (it
/// is shutting down): the sender serves the request itself.
pub static DECLINED: HeaderName = HeaderName::from_static("x-program-router-peer-declined");

/// Why a replica declines a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decline {
    /// It is shutting down.
    Draining,
    /// The request is addressed to another member (this replica has a departed member's
    /// address, or is not in the sender's list under this name).
    Misaddressed,
}

/// The answer of a replica that declines a forwarded request, untouched: the sender serves it.
pub fn decline(why: Decline) -> Response<Body> {
    let (code, message, value) = match why {
        Decline::Draining => (
            "shutting_down",
            "this router replica is shutting down; the sending replica serves the request",
            "draining",
        ),
        Decline::Misaddressed => (
            "misaddressed",
            "this router replica is not the one the request was forwarded to",
            "misaddressed",
        ),
    };
    let mut r = ApiError::new(http::StatusCode::SERVICE_UNAVAILABLE, code, message).into_response();
    r.headers_mut()
        .insert(DECLINED.clone(), HeaderValue::from_static(value));
    r
}

/// Why a forward did not produce an answer.
pub enum ForwardError {
    /// The owner could not be reached before anything was sent, or declined the request before
    /// doing anything with it: serve the request here.
    Unreachable(String),
    /// It failed after the request may have reached the owner (never sent again): the answer.
    Failed(ApiError),
    /// The owner closed the connection without answering anything: it closed an idle
    /// keep-alive connection as the request arrived (it began to shut down; it would have
    /// declined the request anyway), or it died while serving the request (its own upstream
    /// request then closed, so the engine aborted it). Either way nothing reached the client and
    /// the owner's answer will never come: the request may be sent again.
    Closed(String),
}

/// Whether `e` says the connection closed before any part of the response arrived (the
/// request written, or being written, into a connection the other end closed).
fn closed_unanswered(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && h.is_incomplete_message()
        {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionAborted
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// One request to hand to its owner.
pub struct Handoff<'a> {
    pub method: Method,
    pub path_and_query: &'a http::uri::PathAndQuery,
    pub headers: &'a HeaderMap,
    /// The client's body exactly as received.
    pub body: Bytes,
    pub request_id: &'a HeaderValue,
    /// Deadline for the owner's response headers.
    pub timeout: Duration,
}

/// Sends `h` to `member` and returns its answer, body streamed through.
pub async fn forward(
    client: &PeerClient,
    peers: &Peers,
    member: &Member,
    h: Handoff<'_>,
) -> Result<Response<Body>, ForwardError> {
    let uri = Uri::builder()
        .scheme("http")
        .authority(member.authority.clone())
        .path_and_query(h.path_and_query.clone())
        .build()
        .map_err(|e| ForwardError::Failed(ApiError::upstream(format!("peer URL: {e}"))))?;
    let mut req = Request::builder().method(h.method).uri(uri);
    if let Some(out) = req.headers_mut() {
        crate::net::headers::copy_end_to_end(h.headers, out);
        member.address(peers, out);
        out.insert(
            crate::net::headers::X_REQUEST_ID.clone(),
            h.request_id.clone(),
        );
        if !h.body.is_empty() {
            out.insert(header::CONTENT_LENGTH, HeaderValue::from(h.body.len()));
        }
    }
    let req = req
        .body(Full::new(h.body))
        .map_err(|e| ForwardError::Failed(ApiError::upstream(format!("peer request: {e}"))))?;
    let resp = match tokio::time::timeout(h.timeout, client.request(req)).await {
        Err(_) => {
            return Err(ForwardError::Failed(ApiError::new(
                http::StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "router replica {} sent no response headers within {:?}",
                    member.name, h.timeout
                ),
            )));
        }
        Ok(Err(e)) if e.is_connect() => {
            peers.mark_down(member);
            return Err(ForwardError::Unreachable(format!(
                "router replica {} ({}): {e}",
                member.name, member.url
            )));
        }
        Ok(Err(e)) if closed_unanswered(&e) => {
            return Err(ForwardError::Closed(format!(
                "router replica {} closed the connection without an answer: {e}",
                member.name
            )));
        }
        Ok(Err(e)) => {
            return Err(ForwardError::Failed(ApiError::upstream(format!(
                "router replica {} failed: {e}",
                member.name
            ))));
        }
        Ok(Ok(r)) => r,
    };
    let answered = member.answered(resp.headers());
    if answered {
        // The member's answer says which member list it has.
        peers.hear(&member.name, resp.headers(), None);
    }
    if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE
        && resp.headers().contains_key(&DECLINED)
    {
        // Declined before anyone did anything with it (the owner is shutting down, or the
        // address now belongs to another replica): safe to serve here, and its Programs go to
        // the next owner for a while.
        peers.mark_down(member);
        return Err(ForwardError::Unreachable(format!(
            "router replica {} declined: {:?}",
            member.name,
            resp.headers().get(&DECLINED)
        )));
    }
    if !answered {
        // Something else answers at the member's address; it may have acted on the request, so
        // it is not sent again.
        peers.mark_down(member);
        return Err(ForwardError::Failed(ApiError::upstream(format!(
            "{} did not answer as router replica {}",
            member.url, member.name
        ))));
    }
    let (mut parts, body) = resp.into_parts();
    let mut headers = HeaderMap::with_capacity(parts.headers.len());
    crate::net::headers::copy_end_to_end(&parts.headers, &mut headers);
    parts.headers = headers;
    let body = body.map_err(|e| Box::new(e) as BoxError).boxed_unsync();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    // A replica killed mid-stream: the client gets an error event, not a cut.
    let body = if sse {
        let errors = crate::proxy::sse::ErrorEvent::for_route(h.path_and_query.path());
        crate::proxy::sse::EndsWithEvent::new(body, errors).boxed_unsync()
    } else {
        body
    };
    Ok(Response::from_parts(parts, body))
}
