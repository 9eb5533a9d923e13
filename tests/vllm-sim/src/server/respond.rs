//! Response bodies: non-streaming JSON and the SSE stream, in vLLM's shapes (OpenAI chat and
//! completions, Anthropic Messages, OpenAI Responses).
//!
//! Owns how engine messages become bytes on the wire, including the usage object and the
//! injected mid-stream failure; it never decides scheduling.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame};
use tokio::sync::mpsc;

use super::openai::Endpoint;
use super::rank::{RankMsg, Submission};
use crate::engine::Outcome;
use crate::tokenizer::output_token_text;

/// Everything a response needs to name itself.
#[derive(Debug, Clone)]
pub struct RespCtx {
    pub id: String,
    pub created: u64,
    /// The model name as a JSON string literal (quotes included).
    pub model_json: Arc<str>,
    pub endpoint: Endpoint,
    pub output_seed: u64,
    /// The name of the tool the chat completion calls, as a JSON string literal
    /// (`Job::tool_call`).
    pub tool_call: Option<String>,
}

impl RespCtx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Completion, _) => "text_completion",
            (Endpoint::Messages, _) => "message",
            (Endpoint::Responses, _) => "response",
        }
    }

    fn head(&self, chunk: bool) -> String {
        format!(
            r#"{{"id":"{}","object":"{}","created":{},"model":{}"#,
            self.id,
            self.object(chunk),
            self.created,
            self.model_json
        )
    }

    /// The tool call object: a streamed delta's carries its index.
    fn tool_call_json(&self, streamed: bool) -> Option<String> {
        let name = self.tool_call.as_deref()?;
        let index = if streamed { r#""index":0,"# } else { "" };
        Some(format!(
            r#"{{{index}"id":"call_{}","type":"function","function":{{"name":{name},"arguments":"{{}}"}}}}"#,
            self.id
        ))
    }

    /// The whole generated text.
    pub fn text(&self, tokens: u32) -> String {
        (0..tokens)
            .map(|i| output_token_text(self.output_seed, i))
            .collect()
    }
}

/// The usage object (`prompt_tokens_details.cached_tokens` always present).
pub fn usage_json(prompt: usize, completion: u32, cached: usize) -> String {
    format!(
        r#"{{"prompt_tokens":{prompt},"total_tokens":{},"completion_tokens":{completion},"prompt_tokens_details":{{"cached_tokens":{cached}}}}}"#,
        prompt + completion as usize
    )
}

/// The non-streaming response.
pub fn full_json(ctx: &RespCtx, o: &Outcome) -> String {
    let text = serde_json::Value::String(ctx.text(o.completion_tokens)).to_string();
    let reason = o.reason.as_str();
    let choice = match ctx.endpoint {
        Endpoint::Messages => {
            let stop = if reason == "length" {
                "max_tokens"
            } else {
                "end_turn"
            };
            return format!(
                r#"{{"id":"{}","type":"message","role":"assistant","content":[{{"type":"text","text":{text}}}],"model":{},"stop_reason":"{stop}","stop_sequence":null,"usage":{{"input_tokens":{},"output_tokens":{}}}}}"#,
                ctx.id, ctx.model_json, o.prompt_tokens, o.completion_tokens
            );
        }
        Endpoint::Responses => return response_json(ctx, Some(o)),
        Endpoint::Chat => {
            let (calls, reason) = match ctx.tool_call_json(false) {
                Some(call) => (call, "tool_calls"),
                None => (String::new(), reason),
            };
            format!(
                r#"{{"index":0,"message":{{"role":"assistant","content":{text},"tool_calls":[{calls}]}},"logprobs":null,"finish_reason":"{reason}","stop_reason":null}}"#
            )
        }
        Endpoint::Completion => format!(
            r#"{{"index":0,"text":{text},"logprobs":null,"finish_reason":"{reason}","stop_reason":null}}"#
        ),
    };
    format!(
        r#"{},"choices":[{choice}],"usage":{}}}"#,
        ctx.head(false),
        usage_json(o.prompt_tokens, o.completion_tokens, o.cached_tokens)
    )
}

/// A Responses API `response` object: in progress (no outcome yet) or finished.
fn response_json(ctx: &RespCtx, o: Option<&Outcome>) -> String {
    let (status, output, usage) = match o {
        None => ("in_progress", String::new(), "null".to_string()),
        Some(o) => {
            let text = serde_json::Value::String(ctx.text(o.completion_tokens)).to_string();
            let status = if o.reason.as_str() == "length" {
                "incomplete"
            } else {
                "completed"
            };
            (
                status,
                format!(
                    r#"{{"type":"message","id":"msg_{}","status":"completed","role":"assistant","content":[{{"type":"output_text","text":{text},"annotations":[]}}]}}"#,
                    ctx.id
                ),
                format!(
                    r#"{{"input_tokens":{},"input_tokens_details":{{"cached_tokens":{}}},"output_tokens":{},"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{}}}"#,
                    o.prompt_tokens,
                    o.cached_tokens,
                    o.completion_tokens,
                    o.prompt_tokens + o.completion_tokens as usize
                ),
            )
        }
    };
    format!(
        r#"{{"id":"{}","object":"response","created_at":{},"model":{},"status":"{status}","output":[{output}],"usage":{usage}}}"#,
        ctx.id, ctx.created, ctx.model_json
    )
}

/// One named SSE event (`event:` line, then the data), as the Messages and Responses streams
/// send them.
fn named_event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// SSE stream of one request. Dropping it before the end aborts the request in the engine.
pub struct SseBody {
    pub ctx: RespCtx,
    pub rx: mpsc::UnboundedReceiver<RankMsg>,
    pub submission: Submission,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub prompt_tokens: usize,
    /// Cut the connection after this many tokens (failure injection).
    pub fail_after: Option<u32>,
    pub sent: u32,
    pub finished: bool,
    pub buf: VecDeque<Bytes>,
    /// Set once an injected cut is due: the tokens already produced are written first, and the
    /// connection drops when this timer fires, so a client reliably sees exactly `fail_after`
    /// tokens before the cut (an error right after a data frame can overtake its flush).
    pub cut: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the cut is due, hold the stream open and silent instead (`--fail-stall`).
    pub stall: bool,
    /// Where a finished Responses API response is kept, when it is to be stored.
    pub store: Option<Arc<super::apis::ResponseStore>>,
}

/// How long an injected cut waits after the last delivered token.
const CUT_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// The error that cuts a stream on purpose.
#[derive(Debug, thiserror::Error)]
#[error("injected failure after {0} tokens")]
pub struct InjectedFailure(pub u32);

impl SseBody {
    fn chunk(&self, delta: &str, reason: Option<&str>, usage: Option<String>) -> String {
        let reason = reason.map_or("null".to_string(), |r| format!("\"{r}\""));
        let choice = match self.ctx.endpoint {
            Endpoint::Chat => {
                format!(r#"{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{reason}}}"#)
            }
            _ => format!(
                r#"{{"index":0,"text":{delta},"logprobs":null,"finish_reason":{reason},"stop_reason":null}}"#
            ),
        };
        let usage = usage
            .map(|u| format!(r#","usage":{u}"#))
            .unwrap_or_default();
        format!(
            "data: {},\"choices\":[{choice}]{usage}}}\n\n",
            self.ctx.head(true)
        )
    }

    /// The events that open a Messages or Responses stream.
    fn open_events(&self, out: &mut String) {
        match self.ctx.endpoint {
            Endpoint::Messages => {
                out.push_str(&named_event(
                    "message_start",
                    &format!(
                        r#"{{"type":"message_start","message":{{"id":"{}","type":"message","role":"assistant","content":[],"model":{},"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":{},"output_tokens":0}}}}}}"#,
                        self.ctx.id, self.ctx.model_json, self.prompt_tokens
                    ),
                ));
                out.push_str(&named_event(
                    "content_block_start",
                    r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                ));
            }
            Endpoint::Responses => out.push_str(&named_event(
                "response.created",
                &format!(
                    r#"{{"type":"response.created","sequence_number":0,"response":{}}}"#,
                    response_json(&self.ctx, None)
                ),
            )),
            Endpoint::Chat | Endpoint::Completion => {}
        }
    }

    fn token_frame(&mut self, index: u32, out: &mut String) {
        let text = output_token_text(self.ctx.output_seed, index);
        if matches!(self.ctx.endpoint, Endpoint::Messages | Endpoint::Responses) {
            if index == 0 {
                self.open_events(out);
            }
            let data = match self.ctx.endpoint {
                Endpoint::Messages => format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#
                ),
                _ => format!(
                    r#"{{"type":"response.output_text.delta","sequence_number":{},"item_id":"msg_{}","output_index":0,"content_index":0,"delta":"{text}"}}"#,
                    index + 1,
                    self.ctx.id
                ),
            };
            let name = match self.ctx.endpoint {
                Endpoint::Messages => "content_block_delta",
                _ => "response.output_text.delta",
            };
            out.push_str(&named_event(name, &data));
            self.sent += 1;
            return;
        }
        let delta = match self.ctx.endpoint {
            Endpoint::Chat if index == 0 => format!(r#"{{"role":"assistant","content":"{text}"}}"#),
            Endpoint::Chat => format!(r#"{{"content":"{text}"}}"#),
            _ => format!("\"{text}\""),
        };
        let usage = self
            .continuous_usage
            .then(|| usage_json(self.prompt_tokens, index + 1, 0));
        out.push_str(&self.chunk(&delta, None, usage));
        self.sent += 1;
    }

    fn done_frame(&mut self, o: &Outcome, out: &mut String) {
        if matches!(self.ctx.endpoint, Endpoint::Messages | Endpoint::Responses) {
            if self.sent == 0 {
                self.open_events(out);
            }
            if self.ctx.endpoint == Endpoint::Messages {
                let stop = if o.reason.as_str() == "length" {
                    "max_tokens"
                } else {
                    "end_turn"
                };
                out.push_str(&named_event(
                    "content_block_stop",
                    r#"{"type":"content_block_stop","index":0}"#,
                ));
                out.push_str(&named_event(
                    "message_delta",
                    &format!(
                        r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}},"usage":{{"input_tokens":{},"output_tokens":{}}}}}"#,
                        o.prompt_tokens, o.completion_tokens
                    ),
                ));
                out.push_str(&named_event("message_stop", r#"{"type":"message_stop"}"#));
            } else {
                let response = response_json(&self.ctx, Some(o));
                out.push_str(&named_event(
                    "response.completed",
                    &format!(
                        r#"{{"type":"response.completed","sequence_number":{},"response":{response}}}"#,
                        self.sent + 1,
                    ),
                ));
                if let Some(store) = &self.store {
                    store.insert(self.ctx.id.clone(), response);
                }
            }
            self.finished = true;
            self.submission.finish();
            return;
        }
        let empty = match self.ctx.endpoint {
            Endpoint::Chat => "{}",
            _ => "\"\"",
        };
        let mut reason = o.reason.as_str();
        if let Some(call) = self.ctx.tool_call_json(true) {
            out.push_str(&self.chunk(&format!(r#"{{"tool_calls":[{call}]}}"#), None, None));
            reason = "tool_calls";
        }
        out.push_str(&self.chunk(empty, Some(reason), None));
        if self.include_usage {
            out.push_str(&format!(
                "data: {},\"choices\":[],\"usage\":{}}}\n\n",
                self.ctx.head(true),
                usage_json(o.prompt_tokens, o.completion_tokens, o.cached_tokens)
            ));
        }
        out.push_str("data: [DONE]\n\n");
        self.finished = true;
        self.submission.finish();
    }
}

impl HttpBody for SseBody {
    type Data = Bytes;
    type Error = InjectedFailure;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(b) = this.buf.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        if let Some(t) = this.cut.as_mut() {
            return match t.as_mut().poll(cx) {
                // A stall never wakes again: the stream stays open until the client leaves.
                Poll::Ready(()) if this.stall => Poll::Pending,
                Poll::Ready(()) => Poll::Ready(Some(Err(InjectedFailure(this.sent)))),
                Poll::Pending => Poll::Pending,
            };
        }
        if this.finished {
            return Poll::Ready(None);
        }
        let mut out = String::new();
        // Drain everything the engine produced so far into one frame.
        loop {
            let msg = match this.rx.poll_recv(cx) {
                Poll::Ready(Some(m)) => m,
                // The rank dropped the request without finishing it: cut the stream.
                Poll::Ready(None) => return Poll::Ready(Some(Err(InjectedFailure(this.sent)))),
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => break,
            };
            if let Some(n) = this.fail_after
                && this.sent >= n
            {
                this.cut = Some(Box::pin(tokio::time::sleep(CUT_DELAY)));
                if !out.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
                // Nothing left to deliver: wait out the timer (polled on the next call).
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match msg {
                RankMsg::Token { index } => this.token_frame(index, &mut out),
                RankMsg::Done(o) => {
                    this.done_frame(&o, &mut out);
                    break;
                }
            }
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
    }
}
