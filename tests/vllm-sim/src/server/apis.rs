//! The two other request shapes vLLM serves for agents: the Anthropic Messages API
//! (`POST /v1/messages`, what Claude Code speaks) and the OpenAI Responses API
//! (`POST /v1/responses`, what Codex speaks). Both become the same engine work as a chat request.
//!
//! Owns their parsing and 4xx answers, and the store of Responses API responses (kept as vLLM
//! keeps them with `VLLM_ENABLE_RESPONSES_API_STORE=1`: in this server's memory only). Text is
//! taken from every text field of a content block or item (tool calls and results included, as
//! their JSON), which is all the engine's cost model needs.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::openai::{Endpoint, Job, Limits};
use crate::tokenizer::{TemplateMessage, render_chat, tokenize};

#[derive(Deserialize)]
struct MessagesBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<Turn>>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct ResponsesBody {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    store: Option<bool>,
}

#[derive(Deserialize)]
struct Turn {
    role: String,
    #[serde(default)]
    content: Value,
}

/// The text of a content value: a string, or the text of each block (`text`, nested `content`,
/// `output`), anything else as its JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(text_of).collect(),
        Value::Object(o) => {
            for key in ["text", "content", "output"] {
                if let Some(inner) = o.get(key) {
                    return text_of(inner);
                }
            }
            v.to_string()
        }
        other => other.to_string(),
    }
}

fn from_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

fn check_model(model: &Option<String>, limits: &Limits<'_>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != limits.model => Err(ApiError::new(
            http::StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
        )
        .with_param("model")),
        _ => Ok(()),
    }
}

fn max_tokens(v: Option<i64>, field: &'static str, default: u32) -> Result<u32, ApiError> {
    match v {
        None => Ok(default),
        Some(v) if v >= 1 => Ok(u32::try_from(v).unwrap_or(u32::MAX)),
        Some(v) => Err(
            ApiError::bad_request(format!("{field} must be at least 1, got {v}."))
                .with_param(field),
        ),
    }
}

/// Stored responses by id, the oldest forgotten beyond `STORED`.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

const STORED: usize = 10_000;

impl ResponseStore {
    pub fn insert(&self, id: String, json: String) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.insert(id.clone(), json).is_none() {
            g.1.push_back(id);
        }
        while g.1.len() > STORED {
            if let Some(old) = g.1.pop_front() {
                g.0.remove(&old);
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<String> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get(id).cloned()
    }

    /// 404 in vLLM's words for an id this server does not hold.
    pub fn check(&self, id: &str) -> Result<(), ApiError> {
        match self.get(id) {
            Some(_) => Ok(()),
            None => Err(ApiError::new(
                http::StatusCode::NOT_FOUND,
                format!("Response with id '{id}' not found."),
            )),
        }
    }
}

fn job(endpoint: Endpoint, turns: &[(String, String)], max_tokens: u32, stream: bool) -> Job {
    let rendered = render_chat(
        turns
            .iter()
            .map(|(role, content)| TemplateMessage { role, content }),
    );
    Job {
        endpoint,
        prompt: tokenize(&rendered),
        max_tokens,
        stream,
        // Both APIs always report usage (in the body, or in the stream's last event).
        include_usage: true,
        continuous_usage: false,
        priority: 0,
        previous_response_id: None,
        store: false,
        tool_call: None,
        ends_program: None,
    }
}

/// `POST /v1/messages`: `max_tokens` and `messages` are required, as in Anthropic's API.
pub fn parse_messages(body: &[u8], limits: &Limits<'_>) -> Result<Job, ApiError> {
    let b: MessagesBody = from_json(body)?;
    check_model(&b.model, limits)?;
    let Some(messages) = b.messages.filter(|m| !m.is_empty()) else {
        return Err(
            ApiError::bad_request("messages: at least one message is required")
                .with_param("messages"),
        );
    };
    if b.max_tokens.is_none() {
        return Err(ApiError::bad_request("max_tokens: Field required").with_param("max_tokens"));
    }
    let max = max_tokens(b.max_tokens, "max_tokens", limits.default_max_tokens)?;
    let mut turns = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = &b.system {
        turns.push(("system".to_string(), text_of(system)));
    }
    turns.extend(
        messages
            .iter()
            .map(|m| (m.role.clone(), text_of(&m.content))),
    );
    Ok(job(
        Endpoint::Messages,
        &turns,
        max,
        b.stream.unwrap_or(false),
    ))
}

/// `POST /v1/responses`: `input` is a string or a list of items; `store` defaults to true and
/// `previous_response_id` must name a stored response (checked by the server).
pub fn parse_responses(body: &[u8], limits: &Limits<'_>) -> Result<Job, ApiError> {
    let b: ResponsesBody = from_json(body)?;
    check_model(&b.model, limits)?;
    let mut turns = Vec::new();
    if let Some(i) = &b.instructions {
        turns.push(("system".to_string(), i.clone()));
    }
    match &b.input {
        Some(Value::String(s)) => turns.push(("user".to_string(), s.clone())),
        Some(Value::Array(items)) if !items.is_empty() => {
            for item in items {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .unwrap_or("tool")
                    .to_string();
                turns.push((role, text_of(item)));
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "input: a string or a non-empty list of items is required",
            )
            .with_param("input"));
        }
    }
    let max = max_tokens(
        b.max_output_tokens,
        "max_output_tokens",
        limits.default_max_tokens,
    )?;
    let mut j = job(Endpoint::Responses, &turns, max, b.stream.unwrap_or(false));
    j.previous_response_id = b.previous_response_id;
    j.store = b.store.unwrap_or(true);
    Ok(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits<'static> = super::super::openai::TEST_LIMITS;

    #[test]
    fn messages_take_the_system_prompt_and_every_block() {
        let with_system = parse_messages(
            br#"{"model":"sim-model","max_tokens":5,"system":[{"type":"text","text":"be brief"}],
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"},
                {"type":"tool_result","tool_use_id":"t1","content":"42"}]}]}"#,
            &LIMITS,
        )
        .expect("valid");
        let without = parse_messages(
            br#"{"max_tokens":5,"messages":[{"role":"user","content":"hi42"}]}"#,
            &LIMITS,
        )
        .expect("valid");
        assert_eq!(with_system.max_tokens, 5);
        assert!(
            with_system.prompt.len() > without.prompt.len(),
            "system counted"
        );
        assert_eq!(with_system.endpoint, Endpoint::Messages);
        for (body, param) in [
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (r#"{"max_tokens":3,"messages":[]}"#, "messages"),
            (
                r#"{"max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
        ] {
            let e = parse_messages(body.as_bytes(), &LIMITS).expect_err(body);
            assert_eq!(e.param, Some(param), "{body}");
        }
    }

    #[test]
    fn responses_take_a_string_or_items() {
        let s = parse_responses(br#"{"input":"hello","max_output_tokens":7}"#, &LIMITS)
            .expect("string");
        assert_eq!((s.max_tokens, s.endpoint), (7, Endpoint::Responses));
        let items = parse_responses(
            br#"{"instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]},
                {"type":"function_call_output","call_id":"c1","output":"done"}]}"#,
            &LIMITS,
        )
        .expect("items");
        assert_eq!(items.max_tokens, 16, "the server default");
        assert!(items.prompt.len() > s.prompt.len());
        let e = parse_responses(br#"{"input":[]}"#, &LIMITS).expect_err("empty");
        assert_eq!(e.param, Some("input"));
        let next = parse_responses(
            br#"{"input":"x","previous_response_id":"resp_1","store":false}"#,
            &LIMITS,
        )
        .expect("continues");
        assert_eq!(next.previous_response_id.as_deref(), Some("resp_1"));
        assert!(!next.store && s.store, "store defaults to true");
        let kept = ResponseStore::default();
        kept.insert("resp_1".into(), "{}".into());
        assert!(kept.check("resp_1").is_ok());
        assert_eq!(
            kept.check("resp_2").expect_err("unknown").status,
            http::StatusCode::NOT_FOUND
        );
    }
}
