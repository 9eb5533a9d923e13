//! The body type of every response the router writes or relays, its one constructor, and a
//! wrapper that keeps something alive for as long as a body is.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

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

/// A response body that keeps `T` (a place among the requests in progress, an access-log record)
/// until the body ends or is dropped.
pub struct Holding<T> {
    inner: Body,
    _held: T,
}

impl<T> Holding<T> {
    pub fn new(inner: Body, held: T) -> Self {
        Holding { inner, _held: held }
    }
}

impl<T: Unpin> HttpBody for Holding<T> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
