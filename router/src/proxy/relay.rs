//! Relays an upstream response body to the client as it arrives, reading usage on the way.
//!
//! Owns the response-side tap: SSE events are scanned for the usage chunk (and that chunk is
//! dropped when the router, not the client, asked for it); JSON bodies keep a bounded tail in
//! which the final `usage` object is found. Nothing is buffered beyond the current SSE event.
//! When the body ends, fails or is dropped (client gone), the [`Finish`] hook runs exactly once.
//! A stream that cannot end normally — the upstream failed or went silent for longer than the
//! idle timeout after its first byte, or the request deadline passed — ends with an error event
//! in its API's shape, so a client never takes a cut stream for a finished one; a JSON body is cut.

use std::pin::Pin;
use std::task::{Context, Poll};

use super::sse::{ErrorEvent, SseSplitter, sse_usage, usage_only_chunk};
use super::tool_call::{Call, Ending, ending_in_json_tail, tool_call_in_json};
use super::usage::{TokenUsage, usage_in_json_tail};
use crate::net::body::BoxError;
use bytes::{Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame, Incoming};

/// How a relayed body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The whole body was delivered.
    Complete,
    /// The upstream body failed mid-way (the client sees a cut stream).
    UpstreamError,
    /// The client went away (or the request deadline passed) before the end.
    Abandoned,
}

/// What the relay read from a response on the way through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tapped {
    pub usage: Option<TokenUsage>,
    /// The Responses API response's id, when asked for (see `super::stored`).
    pub response_id: Option<String>,
    /// Its tool calls, when asked for (see `super::tool_call`).
    pub tool: ToolRead,
}

/// What the relay read of a response's tool calls ([`Capture::tool`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolRead {
    /// Not asked for, not run to its end, or not told: a JSON body whose start is gone and
    /// whose ending does not say it answered.
    #[default]
    Unknown,
    /// Its first tool call named this tool.
    Named(String),
    /// It called none: every event of a stream was searched, or a JSON body was searched whole
    /// or ends with a reason that is not a tool call.
    None,
}

/// What the relay looks for beyond usage.
#[derive(Debug, Clone, Copy, Default)]
pub struct Capture {
    /// The Responses API response's id (see `super::stored`).
    pub response_id: bool,
    /// The first tool call's name (see `super::tool_call`).
    pub tool: bool,
    /// The request forced a tool call (`tool_choice`): vLLM ends such a response as it ends an
    /// answer (`finish_reason: "stop"`), so a body whose start is gone is not known to answer.
    pub tool_forced: bool,
}

/// Called once when the relay ends.
pub trait Finish: Send + Unpin + 'static {
    fn finish(self, end: End, tapped: Tapped);
}

const TAIL: usize = 16 * 1024;
const MAX_EVENT: usize = 4 * 1024 * 1024;

enum Tap {
    Sse {
        pending: SseSplitter,
        filter: bool,
        errors: ErrorEvent,
        /// The stream's last event was seen (see [`ErrorEvent::is_terminal`]).
        terminated: bool,
    },
    Json(JsonTail),
}

/// The last chunks of a JSON body (shared, not copied): at least `TAIL` bytes when available.
#[derive(Debug, Default)]
struct JsonTail {
    /// A body's only chunk so far (most bodies come in one): kept without the deque's buffer.
    one: Option<Bytes>,
    chunks: std::collections::VecDeque<Bytes>,
    len: usize,
    /// Bytes went by that the tail no longer holds.
    partial: bool,
}

impl JsonTail {
    /// A tail that starts part-way through a body.
    fn partial() -> Self {
        JsonTail {
            partial: true,
            ..JsonTail::default()
        }
    }

    fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        if self.one.is_none() && self.chunks.is_empty() {
            self.one = Some(chunk);
            return;
        }
        if let Some(first) = self.one.take() {
            self.chunks.push_back(first);
        }
        self.chunks.push_back(chunk);
        while self
            .chunks
            .front()
            .is_some_and(|f| self.len - f.len() >= TAIL)
        {
            if let Some(f) = self.chunks.pop_front() {
                self.len -= f.len();
                self.partial = true;
            }
        }
    }

    /// What `tail` (the kept bytes, [`Self::read`]) says of the body's tool calls: its first
    /// call's name; a call whose name cannot be read, or an ending that says a tool was called,
    /// is a call of an unknown tool; else none when searched whole, and with its start gone,
    /// none only if its ending says it answered and the request did not force a call
    /// (`forced`: vLLM ends a forced call with `stop`).
    fn tool_call(&self, tail: &[u8], forced: bool) -> ToolRead {
        match tool_call_in_json(tail) {
            Call::Named(name) => return ToolRead::Named(name),
            Call::Unnamed => return ToolRead::Unknown,
            Call::None => {}
        }
        match ending_in_json_tail(tail) {
            Some(Ending::Tool) => ToolRead::Unknown,
            Some(Ending::Answer) if !forced => ToolRead::None,
            _ if !self.partial => ToolRead::None,
            _ => ToolRead::Unknown,
        }
    }

    /// `f` of the kept bytes, in one slice.
    fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if let Some(one) = &self.one {
            return f(one);
        }
        match self.chunks.len() {
            0 => f(&[]),
            1 => f(&self.chunks[0]),
            _ => f(&self
                .chunks
                .iter()
                .flat_map(|b| b.iter().copied())
                .collect::<Vec<u8>>()),
        }
    }
}

/// The relaying body; `F` runs when it ends (kept inline: the body is boxed once, with it).
pub struct Relay<F: Finish> {
    inner: Incoming,
    tap: Tap,
    usage: Option<TokenUsage>,
    /// What to look for beyond usage.
    capture: Capture,
    /// For the response id: the start of a JSON body, kept until the end.
    head: Option<Bytes>,
    response_id: Option<String>,
    tool: Option<String>,
    /// An event carried a tool call whose name could not be read (none was read before it).
    tool_unnamed: bool,
    finish: Option<F>,
    deadline: Option<tokio::time::Instant>,
    /// Armed only once the body has to wait (most short bodies never do).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Longest silence of the upstream after its first body byte.
    idle: Option<std::time::Duration>,
    /// When the last body byte arrived (`None` before the first), stamped when the upstream
    /// next makes the relay wait: a body that ends with its frame never reads the clock.
    last_data: Option<tokio::time::Instant>,
    /// Data came since `last_data` was stamped.
    unstamped: bool,
    /// Armed, like `timer`, only once the body has to wait; moved to the latest deadline when
    /// it fires early.
    idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The error that cuts the client's stream.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("upstream body failed: {0}")]
    Upstream(#[from] hyper::Error),
    #[error("request deadline passed while streaming")]
    Deadline,
    #[error("the upstream sent nothing for {0:?}")]
    Idle(std::time::Duration),
    #[error("the upstream ended the stream without its last event")]
    Incomplete,
}

impl<F: Finish> Relay<F> {
    /// `sse`: the body is an event stream whose failures end with this error event.
    pub fn new(
        inner: Incoming,
        sse: Option<ErrorEvent>,
        filter_usage_chunk: bool,
        capture: Capture,
        deadline: Option<tokio::time::Instant>,
        idle: Option<std::time::Duration>,
        finish: F,
    ) -> Self {
        let tap = if let Some(errors) = sse {
            Tap::Sse {
                pending: SseSplitter::default(),
                filter: filter_usage_chunk,
                errors,
                terminated: false,
            }
        } else {
            Tap::Json(JsonTail::default())
        };
        Relay {
            inner,
            tap,
            usage: None,
            capture,
            head: None,
            response_id: None,
            tool: None,
            tool_unnamed: false,
            finish: Some(finish),
            deadline,
            timer: None,
            idle,
            last_data: None,
            unstamped: false,
            idle_timer: None,
        }
    }

    /// Whether the upstream has been silent for the idle timeout since its last byte; arms (or
    /// moves) the idle timer otherwise, so the task wakes when it would be.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let (Some(idle), Some(last)) = (self.idle, self.last_data) else {
            return false;
        };
        let due = last + idle;
        let t = self
            .idle_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if t.deadline() != due {
            t.as_mut().reset(due);
        }
        t.as_mut().poll(cx).is_ready()
    }

    /// Ends the relay on `error`: a stream's client gets what is left of the event in progress
    /// dropped, then an error event in its API's shape, then the end (`finish` is taken, so the
    /// next poll returns it); any other body is cut.
    fn fail(
        &mut self,
        end: End,
        error: RelayError,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        self.end(end);
        let Tap::Sse {
            errors,
            pending,
            filter,
            ..
        } = &mut self.tap
        else {
            return Poll::Ready(Some(Err(error)));
        };
        // The error event starts after a blank line: an event cut half-way was either held
        // back (filtering) and is dropped, or already passed on and is ended here.
        let lead: &[u8] = if !*filter && !pending.rest().is_empty() {
            b"\n\n"
        } else {
            b""
        };
        pending.clear();
        let errors = *errors;
        let code = match &error {
            RelayError::Upstream(_) => "upstream_disconnected",
            RelayError::Deadline => "request_timeout",
            RelayError::Idle(_) => "upstream_idle_timeout",
            RelayError::Incomplete => "upstream_incomplete",
        };
        let message = match &error {
            RelayError::Idle(d) => format!(
                "the model server sent nothing for {} s; the stream was ended",
                d.as_secs_f64()
            ),
            RelayError::Upstream(e) => {
                format!("the model server's stream broke off ({e}); the output is incomplete")
            }
            RelayError::Deadline => {
                "the request timeout passed while streaming; the output is incomplete".to_string()
            }
            RelayError::Incomplete => {
                "the model server ended the stream before its last event; the output is incomplete"
                    .to_string()
            }
        };
        let event = errors.render(code, &message);
        let event = if lead.is_empty() {
            event
        } else {
            Bytes::from([lead, &event[..]].concat())
        };
        Poll::Ready(Some(Ok(Frame::data(event))))
    }

    /// An event stream that ended without its last event (the upstream closed it early).
    fn unterminated(&self) -> bool {
        matches!(
            self.tap,
            Tap::Sse {
                terminated: false,
                ..
            }
        )
    }

    fn end(&mut self, end: End) {
        let searched = self.capture.tool && end == End::Complete;
        let mut tool = match self.tool.take() {
            Some(name) => ToolRead::Named(name),
            None if searched && !self.tool_unnamed => ToolRead::None,
            None => ToolRead::Unknown,
        };
        if let Tap::Json(t) = &self.tap
            && end == End::Complete
        {
            let forced = self.capture.tool_forced;
            let (usage, called) = t.read(|tail| {
                let usage = (!tail.is_empty())
                    .then(|| usage_in_json_tail(tail))
                    .flatten();
                (usage, searched.then(|| t.tool_call(tail, forced)))
            });
            self.usage = usage;
            // A name read from the events before the stream turned out not to be SSE stands.
            if let Some(called) = called
                && !matches!(tool, ToolRead::Named(_))
            {
                tool = called;
            }
        }
        if end == End::Complete
            && self.response_id.is_none()
            && let Some(head) = &self.head
        {
            self.response_id = super::stored::id_in_json_head(head);
        }
        if let Some(f) = self.finish.take() {
            f.finish(
                end,
                Tapped {
                    usage: self.usage,
                    response_id: self.response_id.take(),
                    tool,
                },
            );
        }
    }

    /// Processes one upstream chunk; returns what goes to the client.
    fn process(&mut self, chunk: Bytes) -> Bytes {
        match &mut self.tap {
            Tap::Json(tail) => {
                if self.capture.response_id && self.head.is_none() {
                    self.head = Some(chunk.slice(..chunk.len().min(super::stored::HEAD)));
                }
                tail.push(chunk.clone());
                chunk
            }
            Tap::Sse {
                pending,
                filter,
                errors,
                terminated,
            } => {
                let filter = *filter;
                pending.push(&chunk);
                let mut out = if filter {
                    BytesMut::with_capacity(chunk.len())
                } else {
                    BytesMut::new()
                };
                while let Some(event) = pending.next_event() {
                    let event = &event[..];
                    if !*terminated && errors.is_terminal(event) {
                        *terminated = true;
                    }
                    if self.capture.response_id && self.response_id.is_none() {
                        self.response_id = super::stored::id_in_event(event);
                    }
                    if self.capture.tool && self.tool.is_none() {
                        match tool_call_in_json(event) {
                            Call::Named(name) => self.tool = Some(name),
                            // A call named too long to read: its later events still say it
                            // is one (argument deltas, a Messages `stop_reason: tool_use`).
                            Call::Unnamed => self.tool_unnamed = true,
                            Call::None => {}
                        }
                    }
                    let is_usage_chunk = if super::sse::names_usage(event) {
                        match sse_usage(event) {
                            Some((u, no_choices)) => {
                                self.usage = Some(u);
                                no_choices
                            }
                            // A usage chunk whose counts do not parse (negative, beyond u64)
                            // is still the chunk the client did not ask for.
                            None => usage_only_chunk(event),
                        }
                    } else {
                        false
                    };
                    if filter && !is_usage_chunk {
                        out.extend_from_slice(event);
                    }
                }
                if pending.rest().len() > MAX_EVENT {
                    // Not SSE as we know it: stop inspecting, keep relaying.
                    if filter {
                        out.extend_from_slice(pending.rest());
                    }
                    pending.clear();
                    self.tap = Tap::Json(JsonTail::partial());
                    return if filter { out.freeze() } else { chunk };
                }
                if filter { out.freeze() } else { chunk }
            }
        }
    }
}

/// Its errors are boxed here, on the error path, so that the body needs no `MapErr` wrapper
/// (one copy of the relay less per response, and one call less per frame).
impl<F: Finish> HttpBody for Relay<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn is_end_stream(&self) -> bool {
        self.finish.is_none()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match &self.tap {
            // Filtering changes the length; otherwise it is the upstream's.
            Tap::Sse { filter: true, .. } => hyper::body::SizeHint::default(),
            _ => self.inner.size_hint(),
        }
    }

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.as_mut()
            .get_mut()
            .poll_relay(cx)
            .map(|frame| frame.map(|r| r.map_err(|e| Box::new(e) as BoxError)))
    }
}

impl<F: Finish> Relay<F> {
    /// The next frame for the client, or the error that cuts its body.
    fn poll_relay(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self;
        if this.finish.is_none() {
            return Poll::Ready(None);
        }
        if let Some(t) = &mut this.timer
            && t.as_mut().poll(cx).is_ready()
        {
            return this.fail(End::Abandoned, RelayError::Deadline);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if this.unstamped {
                        this.unstamped = false;
                        this.last_data = Some(tokio::time::Instant::now());
                    }
                    if this.idle_expired(cx) {
                        let idle = this.idle.unwrap_or_default();
                        return this.fail(End::UpstreamError, RelayError::Idle(idle));
                    }
                    if this.timer.is_none()
                        && let Some(d) = this.deadline
                    {
                        let mut t = Box::pin(tokio::time::sleep_until(d));
                        if t.as_mut().poll(cx).is_ready() {
                            return this.fail(End::Abandoned, RelayError::Deadline);
                        }
                        this.timer = Some(t);
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    if let Tap::Sse {
                        pending,
                        filter: true,
                        ..
                    } = &mut this.tap
                        && !pending.rest().is_empty()
                    {
                        let rest = pending.take_rest();
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    if this.unterminated() {
                        return this.fail(End::UpstreamError, RelayError::Incomplete);
                    }
                    this.end(End::Complete);
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    return this.fail(End::UpstreamError, RelayError::Upstream(e));
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.unstamped = this.idle.is_some();
                        let mut out = this.process(data);
                        if this.inner.is_end_stream() {
                            // A sized body is complete once its last byte is read; hyper may not
                            // poll again, so finish now.
                            if let Tap::Sse {
                                pending,
                                filter: true,
                                ..
                            } = &mut this.tap
                                && !pending.rest().is_empty()
                            {
                                let mut all = BytesMut::from(&out[..]);
                                all.extend_from_slice(&pending.take_rest());
                                out = all.freeze();
                            }
                            if this.unterminated() {
                                let mut all = BytesMut::from(&out[..]);
                                if let Poll::Ready(Some(Ok(f))) =
                                    this.fail(End::UpstreamError, RelayError::Incomplete)
                                    && let Ok(event) = f.into_data()
                                {
                                    all.extend_from_slice(&event);
                                }
                                out = all.freeze();
                            } else {
                                this.end(End::Complete);
                            }
                        }
                        if out.is_empty() {
                            if this.finish.is_none() {
                                return Poll::Ready(None);
                            }
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
            }
        }
    }
}

impl<F: Finish> Drop for Relay<F> {
    fn drop(&mut self) {
        if self.finish.is_some() {
            let end = if self.inner.is_end_stream() {
                End::Complete
            } else {
                End::Abandoned
            };
            self.end(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_usage_at_the_end_of_json() {
        let body = br#"{"id":"x","choices":[{"message":{"content":"usage"}}],"usage":{"prompt_tokens":9,"total_tokens":14,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        let u = usage_in_json_tail(body).expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
            (9, 5, 4)
        );
        assert_eq!(usage_in_json_tail(br#"{"usage":null}"#), None);
    }

    #[test]
    fn reads_usage_in_the_messages_and_responses_shapes() {
        let messages = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"usage"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"output_tokens":3}}"#;
        let u = usage_in_json_tail(messages).expect("usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (12, 3));
        let responses = br#"{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":2,"total_tokens":11}}"#;
        let u = usage_in_json_tail(responses).expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens()),
            (9, 2, 4)
        );
        let delta = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":7,\"output_tokens\":5}}\n\n";
        let (u, _) = sse_usage(delta).expect("message_delta usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 5));
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":0}}}\n\n";
        assert!(
            sse_usage(start).is_none(),
            "the opening event is not the final usage"
        );
        let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}}\n\n";
        let (u, _) = sse_usage(done).expect("response.completed usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (9, 4));
        let created = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"usage\":null}}\n\n";
        assert!(sse_usage(created).is_none());
    }

    #[test]
    fn a_json_tail_knows_whether_it_holds_the_whole_body() {
        let mut one = JsonTail::default();
        one.push(Bytes::from(vec![b' '; 3 * TAIL]));
        assert!(
            !one.partial,
            "a body in one chunk is kept whole, however long"
        );
        let mut many = JsonTail::default();
        for _ in 0..2 {
            many.push(Bytes::from(vec![b' '; TAIL / 2]));
        }
        assert!(!many.partial, "exactly TAIL: every chunk is still needed");
        many.push(Bytes::from(vec![b' '; TAIL / 2]));
        assert!(many.partial, "1.5 × TAIL: the first chunk left");
        assert_eq!(many.read(<[u8]>::len), TAIL);
        assert!(
            JsonTail::partial().partial,
            "after a stream that was not SSE"
        );
    }

    #[test]
    fn a_long_bodys_ending_says_whether_it_called_a_tool() {
        let long = |ending: &str| {
            let mut t = JsonTail::default();
            t.push(Bytes::from_static(
                br#"{"choices":[{"message":{"content":""#,
            ));
            for _ in 0..3 {
                t.push(Bytes::from(vec![b'w'; TAIL / 2]));
            }
            t.push(Bytes::from(format!(r#""}},{ending}}}],"usage":{{}}}}"#)));
            assert!(t.partial);
            (
                t.read(|tail| t.tool_call(tail, false)),
                t.read(|tail| t.tool_call(tail, true)),
            )
        };
        // It answered, unless the request forced a call (vLLM says "stop" for those too).
        let (auto, forced) = long(r#""finish_reason":"stop""#);
        assert_eq!((auto, forced), (ToolRead::None, ToolRead::Unknown));
        assert_eq!(long(r#""finish_reason":"tool_calls""#).0, ToolRead::Unknown);
        assert_eq!(
            long(r#""finish_reason":null"#).0,
            ToolRead::Unknown,
            "not known"
        );
        // Bodies in one chunk, searched whole.
        let whole = |body: &'static [u8], forced| {
            let mut t = JsonTail::default();
            t.push(Bytes::from_static(body));
            t.read(|tail| t.tool_call(tail, forced))
        };
        let answer =
            br#"{"choices":[{"message":{"content":"x","tool_calls":[]},"finish_reason":"stop"}]}"#;
        assert_eq!(whole(answer, true), ToolRead::None, "searched whole");
        // A call whose name this cannot read is a call, not an answer.
        let unread = br#"{"choices":[{"message":{"tool_calls":[{"function":{"name":42}}]},"finish_reason":"tool_calls"}]}"#;
        assert_eq!(whole(unread, false), ToolRead::Unknown);
        // A forced call ends with `stop`: its unreadable name still makes it a call.
        let forced = br#"{"choices":[{"message":{"tool_calls":[{"function":{"name":42}}]},"finish_reason":"stop"}]}"#;
        assert_eq!(whole(forced, true), ToolRead::Unknown);
        let named = br#"{"content":[{"type":"tool_use","name":"edit","input":{}}],"stop_reason":"tool_use"}"#;
        assert_eq!(whole(named, false), ToolRead::Named("edit".into()));
    }

    #[test]
    fn recognises_the_usage_only_chunk() {
        let ev =
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
        let (u, only) = sse_usage(ev).expect("usage");
        assert!(only);
        assert_eq!(u.prompt_tokens, 3);
        let ev = b"data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
        assert!(
            !sse_usage(ev).expect("usage").1,
            "continuous usage on a content chunk is kept"
        );
    }
}
