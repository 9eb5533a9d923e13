//! The body type of every response the router writes or relays, and its one constructor.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

/// Error type of a relayed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Response body type of every route.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A complete body of `b`.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}
