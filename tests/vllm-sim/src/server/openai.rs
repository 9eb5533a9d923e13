//! Parsing and validation of OpenAI chat and completion requests into engine work.
//!
//! Owns the request schema the simulator accepts and every 4xx it answers for bad input; it never
//! touches an engine.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::tokenizer::{TemplateMessage, count_tokens, render_chat, render_chat_opening, tokenize};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
    /// Anthropic Messages (`/v1/messages`, see `super::apis`).
    Messages,
    /// OpenAI Responses (`/v1/responses`, see `super::apis`).
    Responses,
}

/// A validated request, ready for an engine.
#[derive(Debug, Clone)]
pub struct Job {
    pub endpoint: Endpoint,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub priority: i64,
    /// Responses API: the stored response this request continues, and whether to store this one.
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// A chat completion calls this tool (`vllm_xargs.sim_tool_call`): the simulator has no
    /// model to choose one, so the client names it.
    pub tool_call: Option<String>,
    /// The request is its Program's last (`vllm_xargs.sim_end_program`, a non-zero number, on a
    /// chat completion): the leading prompt tokens other Programs may share (its system message
    /// and the next message's role header; 0 without a system message). Under `--end-hint` the
    /// blocks past them are evicted first once it finishes.
    pub ends_program: Option<usize>,
}

/// What validation needs to know about the server.
pub struct Limits<'a> {
    pub model: &'a str,
    pub default_max_tokens: u32,
    pub accept_nested_xargs: bool,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
    #[serde(default)]
    continuous_usage_stats: Option<bool>,
}

#[derive(Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    vllm_xargs: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    #[serde(default)]
    prompt: Option<Value>,
}

/// Parses and validates a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8], limits: &Limits<'_>) -> Result<Job, ApiError> {
    let mut system_tokens = 0;
    let (common, prompt) = match endpoint {
        Endpoint::Messages => return super::apis::parse_messages(body, limits),
        Endpoint::Responses => return super::apis::parse_responses(body, limits),
        Endpoint::Chat => {
            let b: ChatBody = from_json(body)?;
            let messages = b.messages.ok_or_else(|| {
                ApiError::bad_request("Field required: messages").with_param("messages")
            })?;
            if messages.is_empty() {
                return Err(
                    ApiError::bad_request("messages must contain at least one message")
                        .with_param("messages"),
                );
            }
            let (prompt, system) = chat_prompt(&messages)?;
            system_tokens = system;
            (b.common, prompt)
        }
        Endpoint::Completion => {
            let b: CompletionBody = from_json(body)?;
            let prompt = b.prompt.ok_or_else(|| {
                ApiError::bad_request("Field required: prompt").with_param("prompt")
            })?;
            (b.common, completion_prompt(&prompt)?)
        }
    };
    if let Some(m) = &common.model
        && m != limits.model
    {
        return Err(ApiError::new(
            http::StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        )
        .with_param("model"));
    }
    if let Some(n) = common.n
        && n != 1
    {
        return Err(
            ApiError::bad_request(format!("n must be 1 in the simulator (got {n})"))
                .with_param("n"),
        );
    }
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => limits.default_max_tokens,
        Some(v) if v >= 1 => u32::try_from(v).unwrap_or(u32::MAX),
        Some(v) => {
            return Err(
                ApiError::bad_request(format!("max_tokens must be at least 1, got {v}."))
                    .with_param("max_tokens"),
            );
        }
    };
    if let Some(x) = &common.vllm_xargs {
        check_xargs(x, limits.accept_nested_xargs)?;
    }
    let stream = common.stream.unwrap_or(false);
    let opts = common.stream_options.as_ref();
    if opts.is_some() && !stream {
        return Err(ApiError::bad_request(
            "Stream options can only be defined when `stream=True`.",
        )
        .with_param("stream_options"));
    }
    let include_usage = opts.and_then(|o| o.include_usage).unwrap_or(false);
    Ok(Job {
        endpoint,
        prompt,
        max_tokens,
        stream,
        include_usage,
        // As vLLM: per-chunk usage only together with include_usage.
        continuous_usage: include_usage
            && opts.and_then(|o| o.continuous_usage_stats).unwrap_or(false),
        priority: common.priority.unwrap_or(0),
        previous_response_id: None,
        store: false,
        tool_call: common
            .vllm_xargs
            .as_ref()
            .and_then(|x| x.get("sim_tool_call"))
            .and_then(Value::as_str)
            .filter(|_| endpoint == Endpoint::Chat)
            .map(str::to_string),
        ends_program: common
            .vllm_xargs
            .as_ref()
            .and_then(|x| x.get("sim_end_program"))
            .and_then(Value::as_f64)
            .filter(|n| *n != 0.0 && endpoint == Endpoint::Chat)
            .map(|_| system_tokens),
    })
}

/// Token ids of a `POST /tokenize` body, as vLLM reads it: `messages` (rendered with the chat
/// template, like a chat request) or `prompt` (like a completion request).
pub fn tokenize_body(body: &[u8], model: &str) -> Result<Vec<u32>, ApiError> {
    #[derive(Deserialize)]
    struct TokenizeBody {
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        messages: Option<Vec<ChatMessage>>,
        #[serde(default)]
        prompt: Option<Value>,
    }
    let b: TokenizeBody = from_json(body)?;
    if let Some(m) = &b.model
        && m != model
    {
        return Err(ApiError::new(
            http::StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        )
        .with_param("model"));
    }
    match (&b.messages, &b.prompt) {
        (Some(m), None) => chat_prompt(m).map(|(tokens, _)| tokens),
        (None, Some(p)) => completion_prompt(p),
        _ => Err(ApiError::bad_request(
            "give exactly one of `prompt` and `messages`",
        )),
    }
}

fn from_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })
}

/// The prompt's tokens, and how many leading ones every prompt that opens with the same system
/// message has too (0 without one): the message and the next role header.
fn chat_prompt(messages: &[ChatMessage]) -> Result<(Vec<u32>, usize), ApiError> {
    let mut texts = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let mut text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::bad_request(format!(
                                "messages[{i}]: a text content part needs `text`"
                            )));
                        }
                        (other, _) => {
                            return Err(ApiError::bad_request(format!(
                                "messages[{i}]: content part type `{other}` is not supported by the simulator"
                            )));
                        }
                    }
                }
                s
            }
        };
        if let Some(tc) = &m.tool_calls {
            text.push_str(&tc.to_string());
        }
        texts.push(text);
    }
    let rendered = render_chat(messages.iter().zip(&texts).map(|(m, t)| TemplateMessage {
        role: &m.role,
        content: t,
    }));
    let system = match (messages.first(), texts.first()) {
        (Some(m), Some(t)) if m.role == "system" => count_tokens(&render_chat_opening(
            TemplateMessage {
                role: &m.role,
                content: t,
            },
            messages.get(1).map(|next| next.role.as_str()),
        )),
        _ => 0,
    };
    Ok((tokenize(&rendered), system))
}

fn completion_prompt(prompt: &Value) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "prompt must be a string, a list with one string, or a list of token ids",
        )
        .with_param("prompt")
    };
    match prompt {
        Value::String(s) => Ok(tokenize(s)),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            Ok(tokenize(items[0].as_str().unwrap_or_default()))
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_u64) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect(),
        Value::Array(items) if items.len() > 1 => Err(ApiError::bad_request(
            "batched prompts are not supported by the simulator: send one prompt per request",
        )
        .with_param("prompt")),
        _ => Err(bad()),
    }
}

/// As stock vLLM: `vllm_xargs` values must be str, int, float or a list of those.
fn check_xargs(x: &serde_json::Map<String, Value>, accept_nested: bool) -> Result<(), ApiError> {
    if accept_nested {
        return Ok(());
    }
    let scalar = |v: &Value| v.is_string() || v.is_number();
    for (k, v) in x {
        let ok = scalar(v) || v.as_array().is_some_and(|a| a.iter().all(scalar));
        if !ok {
            return Err(ApiError::bad_request(format!(
                "vllm_xargs.{k}: values must be str, int, float or a list of those; nested objects are not accepted"
            ))
            .with_param("vllm_xargs"));
        }
    }
    Ok(())
}

/// The server limits the parsing tests use (here and in `super::apis`).
#[cfg(test)]
pub(super) const TEST_LIMITS: Limits<'static> = Limits {
    model: "sim-model",
    default_max_tokens: 16,
    accept_nested_xargs: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits<'static> = TEST_LIMITS;

    fn chat(body: &str) -> Result<Job, ApiError> {
        parse(Endpoint::Chat, body.as_bytes(), &LIMITS)
    }

    #[test]
    fn a_plain_chat_request() {
        let j = chat(r#"{"model":"sim-model","messages":[{"role":"user","content":"hi there"}],"max_tokens":4}"#)
            .expect("valid");
        assert_eq!(j.max_tokens, 4);
        assert!(!j.stream);
        assert!(!j.prompt.is_empty());
        let j =
            chat(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}]}"#)
                .expect("valid, model omitted");
        assert_eq!(j.max_tokens, 16);
    }

    #[test]
    fn a_programs_last_request_names_the_prefix_it_shares() {
        let body = |system: bool, end: &str| {
            let sys = if system {
                r#"{"role":"system","content":" you are a helpful agent"},"#
            } else {
                ""
            };
            format!(
                r#"{{"messages":[{sys}{{"role":"user","content":" fix the build"}}],"vllm_xargs":{{"sim_end_program":{end}}}}}"#
            )
        };
        let j = chat(&body(true, "1")).expect("valid");
        // `<|system|>` (2 tokens), 5 words, `<|end|>`, then `\n<|user|` and `>`.
        assert_eq!(j.ends_program, Some(10));
        let t = tokenize(&render_chat([TemplateMessage {
            role: "system",
            content: " you are a helpful agent",
        }]));
        assert_eq!(
            j.prompt[..8],
            t[..8],
            "the system message's tokens lead the prompt"
        );
        assert_eq!(
            chat(&body(false, "1")).expect("valid").ends_program,
            Some(0)
        );
        assert_eq!(chat(&body(true, "0")).expect("valid").ends_program, None);
        let plain = r#"{"messages":[{"role":"user","content":"a"}]}"#;
        assert_eq!(chat(plain).expect("valid").ends_program, None);
        let completion = r#"{"prompt":"a b","vllm_xargs":{"sim_end_program":1}}"#;
        let j = parse(Endpoint::Completion, completion.as_bytes(), &LIMITS).expect("valid");
        assert_eq!(
            j.ends_program, None,
            "only chat requests carry a system message"
        );
    }

    #[test]
    fn bad_inputs_are_clear_400s() {
        let cases = [
            ("{", "malformed JSON"),
            (r#"{"messages":"x"}"#, "invalid request"),
            (r#"{"model":"sim-model"}"#, "messages"),
            (r#"{"messages":[]}"#, "at least one"),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":"5"}"#,
                "invalid request",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"n":2}"#,
                "n must be 1",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"stream_options":{"include_usage":true}}"#,
                "stream",
            ),
            (
                r#"{"messages":[{"role":"user","content":"a"}],"vllm_xargs":{"agentic_context":{"program_id":"p"}}}"#,
                "nested objects",
            ),
        ];
        for (body, want) in cases {
            let e = chat(body).expect_err(body);
            assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{body}");
            assert!(e.message.contains(want), "{body}: {}", e.message);
        }
    }

    #[test]
    fn unknown_model_is_404() {
        let e = chat(r#"{"model":"gpt-x","messages":[{"role":"user","content":"a"}]}"#)
            .expect_err("404");
        assert_eq!(e.status, http::StatusCode::NOT_FOUND);
    }

    #[test]
    fn xargs_json_string_is_accepted_and_nested_only_with_the_flag() {
        let body = r#"{"messages":[{"role":"user","content":"a"}],"vllm_xargs":{"agentic_context":"{\"program_id\":\"p\"}","k":[1,2]}}"#;
        assert!(chat(body).is_ok());
        let nested = r#"{"messages":[{"role":"user","content":"a"}],"vllm_xargs":{"agentic_context":{"program_id":"p"}}}"#;
        let lenient = Limits {
            accept_nested_xargs: true,
            ..LIMITS
        };
        assert!(parse(Endpoint::Chat, nested.as_bytes(), &lenient).is_ok());
    }

    #[test]
    fn completion_prompts() {
        let p = |body: &str| parse(Endpoint::Completion, body.as_bytes(), &LIMITS);
        assert_eq!(
            p(r#"{"prompt":[5,6,7]}"#).expect("ids").prompt,
            vec![5, 6, 7]
        );
        assert_eq!(p(r#"{"prompt":"a b c"}"#).expect("text").prompt.len(), 3);
        assert_eq!(p(r#"{"prompt":["a b"]}"#).expect("one").prompt.len(), 2);
        assert!(
            p(r#"{"prompt":["a","b"]}"#)
                .unwrap_err()
                .message
                .contains("batched")
        );
        assert!(p(r#"{"prompt":{"x":1}}"#).is_err());
        assert!(p(r#"{}"#).unwrap_err().message.contains("prompt"));
    }
}
