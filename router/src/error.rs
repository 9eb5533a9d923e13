//! OpenAI-style errors the router answers with: `{"error":{"message","type","param","code"}}`,
//! and on the Anthropic Messages API route the shape vLLM answers there with,
//! `{"type":"error","error":{"type","message"}}` (plus the router's `code`).
//!
//! Owns the mapping from each router failure to its HTTP status and error code; the `code` is
//! also the bounded `error` label of `vllm_router_request_errors_total`.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::net::body::{Body, full};

/// A shared state's lock (`what` names it). One left poisoned by a panic is never used again,
/// except by code already unwinding from that failure: the caller panics too, and the HTTP front
/// answers that request 500 and stops the router for a restart ([`crate::state::RouterState::fail`]).
pub fn locked<'a, T>(m: &'a std::sync::Mutex<T>, what: &str) -> std::sync::MutexGuard<'a, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) if std::thread::panicking() => poisoned.into_inner(),
        Err(_) => panic!("{what} was left half-updated by a panic"),
    }
}

/// A request the router answers itself.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code (bounded set).
    pub code: &'static str,
    pub message: String,
    /// The methods a 405 answer lists in its `Allow` header.
    pub allow: Option<&'static str>,
    /// Seconds for `Retry-After` on a 429/503 (default 1).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            allow: None,
            retry_after: None,
        }
    }

    /// Sets the `Retry-After` seconds of a 429 or 503.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 405 for a path that only takes `allow` (sent in the `Allow` header, as HTTP requires).
    pub fn method_not_allowed(allow: &'static str) -> Self {
        ApiError {
            allow: Some(allow),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("use {allow}"),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body is larger than the limit of {limit} bytes"),
        )
    }

    /// A proxied route without one of the client keys (see `RouterConfig::client_api_keys`).
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "missing or incorrect API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)",
        )
    }

    pub fn no_target() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_healthy_target",
            "no healthy target is available",
        )
    }

    pub fn upstream_timeout(secs: f64) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            format!("the backend did not answer within {secs} s"),
        )
    }

    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message)
    }

    /// OpenAI error `type` for the status.
    pub fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 401 | 404 | 405 | 413 => "invalid_request_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            503 => "service_unavailable",
            504 => "timeout",
            _ => "api_error",
        }
    }

    /// Anthropic Messages API error `type` for the status (the names vLLM's `/v1/messages`
    /// and Anthropic's clients use).
    pub fn anthropic_kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 405 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The OpenAI-shaped answer.
    pub fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": {
                "message": self.message, "type": self.kind(), "param": null, "code": self.code
            }
        });
        self.respond(body)
    }

    /// The answer in the Anthropic Messages API's shape, for `/v1/messages` (Claude Code and
    /// Anthropic's SDKs read `error.type` and `error.message` there).
    pub fn into_anthropic_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "type": "error",
            "error": { "type": self.anthropic_kind(), "message": self.message, "code": self.code }
        });
        self.respond(body)
    }

    fn respond(self, body: serde_json::Value) -> Response<Body> {
        let mut r = Response::new(full(Bytes::from(body.to_string())));
        *r.status_mut() = self.status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(allow) = self.allow {
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            // Queue-full and reconfiguration answers are transient: tell clients when to retry.
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(self.retry_after.unwrap_or(1)),
            );
        }
        r
    }
}
