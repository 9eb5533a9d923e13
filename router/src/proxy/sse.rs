//! Event streams: splitting one into its events as chunks arrive (LF or CRLF blank lines),
//! reading an event's data and usage, and the error event that ends a stream that broke off, in
//! the shape of its API (also for a stream relayed from another router replica).

use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame};
use memchr::memmem::Finder;
use serde::Deserialize;

use super::usage::TokenUsage;

/// The shape of the error event that ends a failed stream: each API's clients (the OpenAI and
/// Anthropic SDKs) raise it as an error rather than treating the stream as complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorEvent {
    /// Chat and completions: `data: {"error": {...}}`, as vLLM ends a failed stream.
    OpenAi,
    /// Anthropic Messages: `event: error` with `{"type": "error", "error": {...}}`.
    Anthropic,
    /// Responses: `event: error` with `{"type": "error", "code", "message"}`.
    Responses,
}

impl ErrorEvent {
    /// The shape for a request to `route`.
    pub fn for_route(route: &str) -> Self {
        match route {
            "/v1/messages" => ErrorEvent::Anthropic,
            "/v1/responses" => ErrorEvent::Responses,
            _ => ErrorEvent::OpenAi,
        }
    }

    /// Whether `event` ends a stream of this API normally: `[DONE]`, `message_stop`, a final
    /// `response.*` event, or an error event the model server sent itself.
    pub fn is_terminal(self, event: &[u8]) -> bool {
        let n = &*NEEDLES;
        let has = |needle: &Finder<'static>| needle.find(event).is_some();
        match self {
            // A byte search first: this runs on every event of every stream.
            ErrorEvent::OpenAi => has(&n.done) && sse_data(event) == Some("[DONE]"),
            ErrorEvent::Anthropic => has(&n.message_stop) || event.starts_with(b"event: error"),
            ErrorEvent::Responses => {
                has(&n.completed)
                    || has(&n.incomplete)
                    || has(&n.failed)
                    || event.starts_with(b"event: error")
            }
        }
    }

    /// The event that ends the stream, `code` naming why.
    pub fn render(self, code: &str, message: &str) -> Bytes {
        let text = match self {
            ErrorEvent::OpenAi => format!(
                "data: {}\n\n",
                serde_json::json!({"error": {"message": message, "type": "upstream_error", "code": code}})
            ),
            ErrorEvent::Anthropic => format!(
                "event: error\ndata: {}\n\n",
                serde_json::json!({"type": "error", "error": {"type": "api_error", "message": message}})
            ),
            ErrorEvent::Responses => format!(
                "event: error\ndata: {}\n\n",
                serde_json::json!({"type": "error", "code": code, "message": message, "param": null})
            ),
        };
        Bytes::from(text)
    }
}

/// An event stream relayed as it is (another router replica's answer): when it breaks off, it
/// ends with an error event in its API's shape instead of a cut, as [`super::relay::Relay`] ends its own.
pub struct EndsWithEvent {
    inner: crate::net::body::Body,
    errors: ErrorEvent,
    done: bool,
}

impl EndsWithEvent {
    pub fn new(inner: crate::net::body::Body, errors: ErrorEvent) -> Self {
        EndsWithEvent {
            inner,
            errors,
            done: false,
        }
    }
}

impl HttpBody for EndsWithEvent {
    type Data = Bytes;
    type Error = crate::net::body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                let event = self.errors.render(
                    "upstream_disconnected",
                    &format!("the stream broke off ({e}); the output is incomplete"),
                );
                // Ends whatever line was cut before the error event begins.
                Poll::Ready(Some(Ok(Frame::data(Bytes::from(
                    [&b"\n\n"[..], &event[..]].concat(),
                )))))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Splits an event stream into its events as chunks arrive, remembering how far it searched so
/// that a long event is scanned once, not once per chunk.
#[derive(Default)]
pub(crate) struct SseSplitter {
    pending: BytesMut,
    /// Where in `pending` no event end was found (the search resumes a few bytes before it: a
    /// CRLF blank line spans up to three bytes).
    scanned: usize,
}

impl SseSplitter {
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
    }

    /// The next complete event (with its blank line), taken out of the buffer.
    pub(crate) fn next_event(&mut self) -> Option<Bytes> {
        match event_len_from(&self.pending, self.scanned.saturating_sub(3)) {
            Some(len) => {
                self.scanned = 0;
                Some(self.pending.split_to(len).freeze())
            }
            None => {
                self.scanned = self.pending.len();
                None
            }
        }
    }

    /// What arrived after the last complete event.
    pub(crate) fn rest(&self) -> &[u8] {
        &self.pending
    }

    pub(crate) fn take_rest(&mut self) -> Bytes {
        self.scanned = 0;
        self.pending.split().freeze()
    }

    pub(super) fn clear(&mut self) {
        self.scanned = 0;
        self.pending.clear();
    }
}

/// The length of the first complete SSE event in `buf`, up to and including the blank line
/// that ends it: lines end with LF or CRLF (the event-stream format allows both).
pub(crate) fn event_len(buf: &[u8]) -> Option<usize> {
    event_len_from(buf, 0)
}

/// [`event_len`], with no event end before `from`.
fn event_len_from(buf: &[u8], mut from: usize) -> Option<usize> {
    while let Some(i) = memchr::memchr(b'\n', buf.get(from..)?).map(|i| from + i) {
        // The line this newline ends is empty when the byte before it (a CR aside) ends a line.
        let line_start = if i > 0 && buf[i - 1] == b'\r' {
            i - 1
        } else {
            i
        };
        if line_start > 0 && buf[line_start - 1] == b'\n' {
            return Some(i + 1);
        }
        from = i + 1;
    }
    None
}

/// Whether `event` holds a `"usage"` key, looked for in every event before [`sse_usage`] parses one.
pub fn names_usage(event: &[u8]) -> bool {
    NEEDLES.usage.find(event).is_some()
}

/// The byte searches run on every streamed event, built once (`memmem::find` builds its
/// searcher on each call, which costs more than searching one event).
struct Needles {
    done: Finder<'static>,
    message_stop: Finder<'static>,
    completed: Finder<'static>,
    incomplete: Finder<'static>,
    failed: Finder<'static>,
    usage: Finder<'static>,
}

static NEEDLES: LazyLock<Needles> = LazyLock::new(|| Needles {
    done: Finder::new(b"[DONE]"),
    message_stop: Finder::new(b"message_stop"),
    completed: Finder::new(b"response.completed"),
    incomplete: Finder::new(b"response.incomplete"),
    failed: Finder::new(b"response.failed"),
    usage: Finder::new(b"\"usage\""),
});

/// The usage of an SSE event, and whether the event is a usage-only chunk (`choices: []`).
pub(crate) fn sse_usage(event: &[u8]) -> Option<(TokenUsage, bool)> {
    #[derive(Deserialize)]
    struct Chunk {
        #[serde(default)]
        usage: Option<TokenUsage>,
        #[serde(default)]
        choices: Option<Vec<serde::de::IgnoredAny>>,
        /// Responses API: `response.completed` carries the response, usage inside.
        #[serde(default)]
        response: Option<Inner>,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(default)]
        usage: Option<TokenUsage>,
    }
    let c: Chunk = serde_json::from_str(sse_data(event)?).ok()?;
    let usage = c.usage.or(c.response.and_then(|r| r.usage))?;
    Some((usage, c.choices.is_none_or(|v| v.is_empty())))
}

/// Whether `event` is a usage chunk (`"choices": []` and a `usage` key), whatever its usage holds.
pub(super) fn usage_only_chunk(event: &[u8]) -> bool {
    sse_data(event)
        .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .is_some_and(|v| {
            v.get("usage").is_some() && v["choices"].as_array().is_some_and(|c| c.is_empty())
        })
}

/// The data of one SSE event (its first `data:` line).
pub(super) fn sse_data(event: &[u8]) -> Option<&str> {
    std::str::from_utf8(event)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_a_blank_line_of_lf_or_crlf() {
        assert_eq!(event_len(b"data: 1\n\ndata: 2\n\n"), Some(9));
        assert_eq!(event_len(b"data: 1\r\n\r\ndata: 2"), Some(11));
        assert_eq!(event_len(b"event: e\r\ndata: 1\r\n\n"), Some(20));
        assert_eq!(event_len(b"data: 1\r\ndata: 2\r\n"), None);
        assert_eq!(event_len(b"data: 1\n"), None);
        assert_eq!(event_len(b""), None);
        let (u, only) =
            sse_usage(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\r\n\r\n")
                .expect("usage in a CRLF event");
        assert_eq!((u.prompt_tokens, only), (3, true));
        // A usage chunk with counts that do not parse is still recognized (and filtered).
        let bad = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-5}}\r\n\r\n";
        assert!(sse_usage(bad).is_none() && usage_only_chunk(bad));
        assert!(!usage_only_chunk(
            b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n"
        ));
    }

    #[test]
    fn a_stream_in_any_chunks_splits_into_the_same_events_scanning_each_byte_once() {
        let stream = b"data: 1\r\n\r\ndata: 2\n\nevent: e\r\ndata: 3\r\n\ndata: 4";
        for size in 1..stream.len() {
            let mut s = SseSplitter::default();
            let mut events = Vec::new();
            for chunk in stream.chunks(size) {
                s.push(chunk);
                while let Some(e) = s.next_event() {
                    events.push(e);
                }
            }
            let events: Vec<&[u8]> = events.iter().map(|e| &e[..]).collect();
            assert_eq!(
                events,
                [
                    &b"data: 1\r\n\r\n"[..],
                    b"data: 2\n\n",
                    b"event: e\r\ndata: 3\r\n\n"
                ],
                "{size}"
            );
            assert_eq!(s.rest(), b"data: 4");
        }
        // A long event is searched once: after a chunk with no end, the search resumes where it
        // stopped (less the three bytes a CRLF blank line may span).
        let mut s = SseSplitter::default();
        s.push(&[b'x'; 1000]);
        assert!(s.next_event().is_none());
        assert_eq!(s.scanned, 1000);
    }

    #[test]
    fn error_events_take_each_apis_shape() {
        let data = |b: Bytes| {
            let text = String::from_utf8(b.to_vec()).expect("utf-8");
            assert!(text.ends_with("\n\n"), "{text}");
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            (
                text.clone(),
                serde_json::from_str::<serde_json::Value>(line).expect("json"),
            )
        };
        let (_, v) = data(ErrorEvent::OpenAi.render("c", "m"));
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["message"].as_str()),
            (Some("c"), Some("m"))
        );
        let (t, v) = data(ErrorEvent::Anthropic.render("c", "m"));
        assert!(t.starts_with("event: error\n"));
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some("api_error"))
        );
        let (t, v) = data(ErrorEvent::Responses.render("c", "m"));
        assert!(t.starts_with("event: error\n"));
        assert_eq!(
            (v["type"].as_str(), v["code"].as_str()),
            (Some("error"), Some("c"))
        );
        assert_eq!(ErrorEvent::for_route("/v1/messages"), ErrorEvent::Anthropic);
        assert_eq!(
            ErrorEvent::for_route("/v1/chat/completions"),
            ErrorEvent::OpenAi
        );
    }
}
