//! OpenAI-style error responses, shaped as vLLM returns them.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use super::Body;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// The OpenAI error type name for the status, as vLLM reports it.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLarge",
            s if s.is_server_error() => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        let mut resp = Response::new(super::full(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}
