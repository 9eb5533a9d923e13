//! What the router reads from a request body, and the only edits it makes to it.
//!
//! Owns a borrowing peek at a few top-level fields (no copy of the body) and the byte splices
//! for `vllm_xargs.agentic_context` (strip / JSON string / pass through) and for asking the backend
//! for stream usage. Everything else is forwarded byte for byte.

use std::ops::Range;

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::AgenticContextMode;
use crate::error::ApiError;

#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow, default)]
    agent_hint: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
    /// Kept even when it is `null` (a plain `Option` would read that as absent, and the usage
    /// request would then be added as a second `stream_options` key).
    #[serde(borrow, default, deserialize_with = "raw_even_if_null")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    /// Anthropic Messages: the system prompt, outside `messages`.
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    /// OpenAI Responses: the conversation and the system prompt.
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    /// Responses: the stored response this request continues.
    #[serde(default)]
    previous_response_id: Option<String>,
    /// Anthropic Messages: `metadata.user_id` (Claude Code puts its session in it).
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(borrow, default)]
    vllm_xargs: Option<&'a RawValue>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    session_params: Option<SessionParams>,
    #[serde(borrow, default)]
    tool_choice: Option<&'a RawValue>,
}

fn raw_even_if_null<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    user_id: Option<String>,
}

#[derive(Deserialize)]
struct SessionParams {
    #[serde(default)]
    session_id: Option<String>,
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// What the router knows about a generation request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peeked {
    pub model: Option<String>,
    agent_hint: Option<Range<usize>>,
    pub stream: bool,
    /// The client asked for the usage chunk.
    pub client_wants_usage: bool,
    stream_options: Option<Range<usize>>,
    xargs: Option<Range<usize>>,
    /// Byte range of the prompt: `messages` (chat), `prompt` (completions), or from the first to
    /// the last of `system` and `messages` (Anthropic Messages) or `instructions` and `input`
    /// (Responses), so that a shared system prompt is part of the prefix.
    pub prompt: Option<Range<usize>>,
    /// Where the system prompt is, read by [`Peeked::system`] only when asked.
    system: Option<SystemAt>,
    /// Session-like key from the body (`session_params.session_id` > `user` > `session_id` >
    /// `user_id` > `metadata.user_id`).
    pub body_key: Option<String>,
    /// The OpenAI `user` field.
    pub user: Option<String>,
    /// Responses API: the stored response this request continues.
    pub previous_response_id: Option<String>,
    /// `tool_choice` makes the model call a tool (`required`, `any`, a named tool): vLLM then
    /// ends such a response with `finish_reason: "stop"`, as it ends an answer.
    pub forces_tool: bool,
}

fn span(body: &[u8], raw: &RawValue) -> Range<usize> {
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    start..start + raw.get().len()
}

/// Reads the fields the router needs; a body that is not a JSON object is a 400.
pub fn peek(body: &[u8]) -> Result<Peeked, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    // Validated once here, so the parser does not check each string again.
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: not UTF-8 ({e})")))?;
    let p: Peek<'_> = serde_json::from_str(text).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })?;
    let client_wants_usage = match p.stream_options {
        Some(raw) if raw.get() == "null" => false,
        Some(raw) => {
            let o: StreamOptions = serde_json::from_str(raw.get())
                .map_err(|e| ApiError::bad_request(format!("invalid stream_options: {e}")))?;
            o.include_usage.unwrap_or(false)
        }
        None => false,
    };
    let user = p.user.clone().filter(|u| !u.is_empty());
    // The first of these fields present says where a system prompt would be.
    let system = [
        (p.system, false),
        (p.instructions, false),
        (p.messages, true),
        (p.input, true),
        (p.prompt, false),
    ]
    .into_iter()
    .find_map(|(raw, messages)| {
        let at = span(body, raw?);
        Some(if messages {
            SystemAt::FirstMessage(at)
        } else {
            SystemAt::Whole(at)
        })
    });
    let body_key = p
        .session_params
        .and_then(|s| s.session_id)
        .or(p.user)
        .or(p.session_id)
        .or(p.user_id)
        .or(p.metadata.and_then(|m| m.user_id))
        .filter(|k| !k.is_empty());
    let prompt = [p.system, p.instructions, p.messages, p.input, p.prompt]
        .into_iter()
        .flatten()
        .map(|r| span(body, r))
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end));
    Ok(Peeked {
        model: p.model,
        agent_hint: p.agent_hint.map(|r| span(body, r)),
        stream: p.stream.unwrap_or(false),
        client_wants_usage,
        stream_options: p.stream_options.map(|r| span(body, r)),
        xargs: p.vllm_xargs.map(|r| span(body, r)),
        prompt,
        system,
        body_key,
        user,
        previous_response_id: p.previous_response_id.filter(|id| !id.is_empty()),
        forces_tool: p.tool_choice.is_some_and(forces_tool),
    })
}

/// Whether a `tool_choice` makes the model call a tool: anything but `"auto"`, `"none"`, `null`,
/// Anthropic's `{"type": "auto"}` / `{"type": "none"}` and OpenAI's `allowed_tools` in mode
/// `auto` (the Responses API's flat shape, and chat completions' nested one).
fn forces_tool(raw: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, default, rename = "type")]
        kind: Option<&'a str>,
        #[serde(borrow, default)]
        mode: Option<&'a str>,
        #[serde(borrow, default)]
        allowed_tools: Option<Mode<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Mode<'a> {
        #[serde(borrow, default)]
        mode: Option<&'a str>,
    }
    match raw.get().trim() {
        "null" | r#""auto""# | r#""none""# => false,
        v if v.starts_with('{') => {
            serde_json::from_str::<Typed<'_>>(v).map_or(true, |t| match t.kind {
                Some("auto" | "none") => false,
                Some("allowed_tools") => {
                    let mode = t.mode.or(t.allowed_tools.and_then(|a| a.mode));
                    mode != Some("auto")
                }
                _ => true,
            })
        }
        _ => true,
    }
}

/// Where a body's system prompt is: a whole field (Messages `system`, Responses `instructions`,
/// or for completions the `prompt`), or the first message of a list (`messages`, `input`): the
/// system message, or without one the first user message (an agent's template).
#[derive(Debug, Clone, PartialEq)]
enum SystemAt {
    Whole(Range<usize>),
    FirstMessage(Range<usize>),
}

impl Peeked {
    /// The leading bytes (at most [`super::system_prompt::SCAN_BYTES`]) of the system prompt of
    /// `body` (the body this was peeked from), or of its first message without one, as a range
    /// of it; `None` when the body has neither.
    pub fn system(&self, body: &[u8]) -> Option<Range<usize>> {
        use super::system_prompt::{SCAN_BYTES, first_message};
        match self.system.as_ref()? {
            SystemAt::Whole(r) => Some(r.start..r.end.min(r.start + SCAN_BYTES)),
            SystemAt::FirstMessage(r) => {
                first_message(body.get(r.clone())?).map(|m| r.start + m.start..r.start + m.end)
            }
        }
    }

    /// The value of `vllm_xargs.agentic_context`, if present.
    pub fn agentic_context(&self, body: &[u8]) -> Result<Option<serde_json::Value>, ApiError> {
        let Some(r) = &self.xargs else {
            return Ok(None);
        };
        let raw = &body[r.clone()];
        if memchr::memmem::find(raw, b"agentic_context").is_none() {
            return Ok(None);
        }
        let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(raw)
            .map_err(|e| ApiError::bad_request(format!("vllm_xargs must be an object: {e}")))?;
        Ok(map.remove("agentic_context"))
    }

    /// The body's `agent_hint`, if present.
    pub fn agent_hint(&self, body: &[u8]) -> Result<Option<serde_json::Value>, ApiError> {
        let Some(r) = &self.agent_hint else {
            return Ok(None);
        };
        serde_json::from_slice(&body[r.clone()])
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("agent_hint: {e}")))
    }
}

/// The headers that key consistent hashing, in vllm-router's order.
static HASH_KEY_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("x-session-id"),
    HeaderName::from_static("x-user-id"),
    HeaderName::from_static("x-tenant-id"),
    HeaderName::from_static(crate::net::headers::X_REQUEST_ID_NAME),
    HeaderName::from_static("x-correlation-id"),
    HeaderName::from_static("x-trace-id"),
];

/// Consistent-hash key: headers in vllm-router's order, then the body's key.
pub fn hash_key<'a>(headers: &'a HeaderMap, peeked: &'a Peeked) -> Option<&'a str> {
    HASH_KEY_HEADERS
        .iter()
        .find_map(|h| {
            headers
                .get(h)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
        })
        .or(peeked.body_key.as_deref())
}

/// The body to send upstream, and whether the router added the usage request.
pub struct Outgoing {
    pub body: Bytes,
    pub usage_injected: bool,
}

/// Applies the documented edits; returns the original bytes untouched when none applies.
pub fn rewrite(
    body: Bytes,
    peeked: &Peeked,
    mode: AgenticContextMode,
    want_stream_usage: bool,
) -> Result<Outgoing, ApiError> {
    let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    if let (Some(r), false) = (&peeked.xargs, mode == AgenticContextMode::Passthrough) {
        let raw = &body[r.clone()];
        if memchr::memmem::find(raw, b"agentic_context").is_some() {
            let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(raw)
                .map_err(|e| {
                ApiError::bad_request(format!("vllm_xargs must be an object: {e}"))
            })?;
            let changed = match (mode, map.get("agentic_context")) {
                (_, None) => false,
                (AgenticContextMode::Strip, Some(_)) => {
                    map.remove("agentic_context");
                    true
                }
                (AgenticContextMode::JsonString, Some(v)) if !v.is_string() => {
                    let s = v.to_string();
                    map.insert("agentic_context".into(), serde_json::Value::String(s));
                    true
                }
                _ => false,
            };
            if changed {
                edits.push((
                    r.clone(),
                    serde_json::to_vec(&map).unwrap_or_else(|_| b"{}".to_vec()),
                ));
            }
        }
    }
    let usage_injected = want_stream_usage && peeked.stream && !peeked.client_wants_usage;
    if usage_injected {
        match &peeked.stream_options {
            Some(r) => {
                let raw = &body[r.clone()];
                let mut map: serde_json::Map<String, serde_json::Value> = if raw == b"null" {
                    serde_json::Map::new()
                } else {
                    serde_json::from_slice(raw).map_err(|e| {
                        ApiError::bad_request(format!("stream_options must be an object: {e}"))
                    })?
                };
                map.insert("include_usage".into(), serde_json::Value::Bool(true));
                // vLLM sends per-chunk usage only when include_usage is also set: the client who
                // asked for it without include_usage gets none, and must still get none.
                if map.contains_key("continuous_usage_stats") {
                    map.insert(
                        "continuous_usage_stats".into(),
                        serde_json::Value::Bool(false),
                    );
                }
                edits.push((r.clone(), serde_json::to_vec(&map).unwrap_or_default()));
            }
            None => {
                let end = body.iter().rposition(|b| *b == b'}').unwrap_or(body.len());
                edits.push((
                    end..end,
                    br#","stream_options":{"include_usage":true}"#.to_vec(),
                ));
            }
        }
    }
    if edits.is_empty() {
        return Ok(Outgoing {
            body,
            usage_injected,
        });
    }
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut at = 0;
    for (r, bytes) in edits {
        out.extend_from_slice(&body[at..r.start]);
        out.extend_from_slice(&bytes);
        at = r.end;
    }
    out.extend_from_slice(&body[at..]);
    Ok(Outgoing {
        body: Bytes::from(out),
        usage_injected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(body: &str, mode: AgenticContextMode, usage: bool) -> (String, bool) {
        let b = Bytes::from(body.to_string());
        let p = peek(&b).expect("peek");
        let o = rewrite(b, &p, mode, usage).expect("rewrite");
        (
            String::from_utf8(o.body.to_vec()).expect("utf8"),
            o.usage_injected,
        )
    }

    const CTX: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"vllm_xargs":{"agentic_context":{"program_id":"p"},"k":1}}"#;

    fn system(body: &str) -> Option<String> {
        let p = peek(body.as_bytes()).expect("peek");
        p.system(body.as_bytes()).map(|r| body[r].to_string())
    }

    #[test]
    fn a_tool_choice_that_forces_a_call_is_seen_in_each_apis_shape() {
        let forces = |choice: &str| {
            let body = format!(r#"{{"model":"m","messages":[],"tool_choice":{choice}}}"#);
            peek(body.as_bytes()).expect("peek").forces_tool
        };
        for choice in [
            r#""required""#,
            r#"{"type":"function","function":{"name":"f"}}"#,
            r#"{"type":"function","name":"f"}"#,
            r#"{"type":"any"}"#,
            r#"{"type":"tool","name":"f"}"#,
            r#"{"type":"allowed_tools","mode":"required","tools":[]}"#,
            r#"{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[]}}"#,
            // Not read as a word this knows: taken as forcing (the answer is then unknown).
            r#""\u0061uto""#,
        ] {
            assert!(forces(choice), "{choice}");
        }
        for choice in [
            r#""auto""#,
            r#""none""#,
            "null",
            r#"{"type":"auto"}"#,
            r#"{"type":"none"}"#,
            r#"{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"f"}]}"#,
            r#"{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}"#,
        ] {
            assert!(!forces(choice), "{choice}");
        }
        assert!(
            !peek(br#"{"model":"m","messages":[]}"#)
                .expect("peek")
                .forces_tool
        );
    }

    #[test]
    fn the_system_prompt_of_each_api() {
        let chat = |user: &str| {
            format!(
                r#"{{"model":"m","messages":[{{"role":"system","content":"Be brief."}},{{"role":"user","content":"{user}"}}]}}"#
            )
        };
        let sys = r#"{"role":"system","content":"Be brief."}"#;
        assert_eq!(system(&chat("a")).as_deref(), Some(sys));
        assert_eq!(
            system(&chat("b")),
            system(&chat("a")),
            "not the user's words"
        );
        assert_eq!(
            system(CTX).as_deref(),
            Some(r#"{"role":"user","content":"hi"}"#),
            "no system message: the first message"
        );
        assert_eq!(system(r#"{"model":"m","messages":[]}"#), None);
        assert_eq!(system(r#"{"model":"m"}"#), None);
        let messages = r#"{"model":"m","system":[{"type":"text","text":"S"}],"messages":[]}"#;
        assert_eq!(
            system(messages).as_deref(),
            Some(r#"[{"type":"text","text":"S"}]"#)
        );
        let responses = r#"{"model":"m","instructions":"I","input":"hi"}"#;
        assert_eq!(system(responses).as_deref(), Some(r#""I""#));
        let input = r#"{"model":"m","input":[{"role":"developer","content":"D"},{"role":"user","content":"u"}]}"#;
        assert_eq!(
            system(input).as_deref(),
            Some(r#"{"role":"developer","content":"D"}"#)
        );
        // Completions: the prompt's first bytes, all there is.
        let long = format!(r#"{{"model":"m","prompt":"{}"}}"#, "p".repeat(3000));
        let s = system(&long).expect("a prompt");
        assert_eq!(s.len(), crate::proxy::system_prompt::SCAN_BYTES);
        assert!(s.starts_with(r#""ppp"#));
    }

    #[test]
    fn agentic_context_modes() {
        let (s, _) = edit(CTX, AgenticContextMode::Strip, false);
        assert_eq!(
            s,
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"vllm_xargs":{"k":1}}"#
        );
        let (s, _) = edit(CTX, AgenticContextMode::JsonString, false);
        let v: serde_json::Value = serde_json::from_str(&s).expect("json");
        assert_eq!(v["vllm_xargs"]["agentic_context"], r#"{"program_id":"p"}"#);
        assert_eq!(v["vllm_xargs"]["k"], 1);
        assert_eq!(edit(CTX, AgenticContextMode::Passthrough, false).0, CTX);
    }

    #[test]
    fn a_body_that_is_not_utf8_is_a_400_naming_it() {
        let e = peek(b"{\"model\":\"m\xff\",\"messages\":[]}").expect_err("not UTF-8");
        assert_eq!(e.status, http::StatusCode::BAD_REQUEST);
        assert!(e.message.contains("not UTF-8"), "{}", e.message);
        let e = peek(b"{\"model\":").expect_err("cut");
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
    }

    #[test]
    fn bodies_without_edits_are_forwarded_byte_for_byte() {
        let body = "{ \"model\" : \"m\",\n \"messages\": [], \"extra\": {\"a\": [1, 2.50]} }";
        let b = Bytes::from(body);
        let p = peek(&b).expect("peek");
        let o = rewrite(b.clone(), &p, AgenticContextMode::Strip, true).expect("rewrite");
        assert_eq!(o.body.as_ptr(), b.as_ptr(), "same buffer, no copy");
        assert!(!o.usage_injected);
    }

    #[test]
    fn stream_usage_is_requested_only_when_the_client_did_not() {
        let (s, injected) = edit(
            r#"{"stream":true,"messages":[]}"#,
            AgenticContextMode::Strip,
            true,
        );
        assert!(injected);
        assert_eq!(
            s,
            r#"{"stream":true,"messages":[],"stream_options":{"include_usage":true}}"#
        );
        // (client's stream_options, what the backend gets; None: the body is left as it is)
        let cases = [
            (r#"{"include_usage":true}"#, None),
            (
                r#"{"continuous_usage_stats":false}"#,
                Some(r#"{"continuous_usage_stats":false,"include_usage":true}"#),
            ),
            // Per-chunk usage asked for without include_usage: vLLM would send none, so the
            // router's request for the final chunk must not turn it on.
            (
                r#"{"continuous_usage_stats":true}"#,
                Some(r#"{"continuous_usage_stats":false,"include_usage":true}"#),
            ),
            // An explicit null is replaced, never followed by a second `stream_options` key.
            ("null", Some(r#"{"include_usage":true}"#)),
        ];
        for (options, sent) in cases {
            let body = format!(r#"{{"stream":true,"stream_options":{options},"messages":[]}}"#);
            let (s, injected) = edit(&body, AgenticContextMode::Strip, true);
            assert_eq!(injected, sent.is_some(), "{options}");
            let want = sent.map_or(body.clone(), |o| {
                format!(r#"{{"stream":true,"stream_options":{o},"messages":[]}}"#)
            });
            let (got, want): (serde_json::Value, serde_json::Value) = (
                serde_json::from_str(&s).expect("json"),
                serde_json::from_str(&want).expect("json"),
            );
            assert_eq!(got, want, "{options}");
            assert_eq!(s.matches("stream_options").count(), 1, "{s}");
        }
        let p = peek(br#"{"stream":true,"stream_options":null}"#).expect("peek");
        assert!(!p.client_wants_usage);
    }

    #[test]
    fn bad_bodies_are_400() {
        for b in [
            "",
            "[1]",
            "{",
            r#"{"stream":"yes"}"#,
            r#"{"stream_options":5}"#,
            "null",
        ] {
            let e = peek(b.as_bytes()).expect_err(b);
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{b}");
        }
    }

    #[test]
    fn hash_key_order() {
        let b = br#"{"user":"u1","session_params":{"session_id":"s1"}}"#;
        let p = peek(b).expect("peek");
        let mut h = HeaderMap::new();
        assert_eq!(hash_key(&h, &p), Some("s1"));
        h.insert("x-request-id", "r".parse().expect("hv"));
        assert_eq!(hash_key(&h, &p), Some("r"));
        h.insert("x-session-id", "hs".parse().expect("hv"));
        assert_eq!(hash_key(&h, &p), Some("hs"));
    }
}
