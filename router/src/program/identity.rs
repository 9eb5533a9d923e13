//! Program identity: which Program a request belongs to, from the configured inputs.
//!
//! Owns parsing of the canonical `vllm_xargs.agentic_context` (an object, or the JSON string that
//! stock vLLM accepts) and, under `program_scheduling_enable_key: auto`, of `agent_hint`, the
//! Claude Code headers, the Codex/OpenCode headers and `x-session-id`, with the spec's strict
//! precedence (canonical > agent_hint > one header schema; schemas are never mixed). Pure: no
//! state, no I/O. `step_id` defaulting needs history and lives in the scheduler.

use http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;

use crate::config::program::EnableKey;

/// Where the identity came from (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    AgenticContext,
    AgentHint,
    ClaudeCode,
    Codex,
    SessionHeader,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::AgenticContext => "agentic_context",
            Source::AgentHint => "agent_hint",
            Source::ClaudeCode => "claude_code",
            Source::Codex => "codex",
            Source::SessionHeader => "x_session_id",
        }
    }
}

/// A request's Program identity and its request-scoped hints.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Identity {
    pub program_id: String,
    pub task_id: Option<String>,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub parent_program_id: Option<String>,
    pub root_program_id: Option<String>,
    pub blocks_parent: bool,
    pub expected_resume: bool,
    /// The client said `expected_resume` itself (otherwise it is assumed: true, or false for a
    /// blocking `agent_hint`).
    pub resume_stated: bool,
    pub agent_role: Option<String>,
    pub spawn_reason: Option<String>,
    // Request-scoped.
    pub request_id: Option<String>,
    pub step_id: Option<u64>,
    pub priority: i64,
    pub deadline_seconds: Option<f64>,
    pub expected_output_length: Option<u64>,
    pub kv_retention_ttl_seconds: Option<f64>,
    pub source: Option<Source>,
}

impl Identity {
    /// Puts the Program and its parent and root into `client`'s namespace (`client/id`), so
    /// that the same id from two clients names two Programs.
    pub fn scope(&mut self, client: &str) {
        let scoped = |id: &str| format!("{client}/{id}");
        self.program_id = scoped(&self.program_id);
        for id in [&mut self.parent_program_id, &mut self.root_program_id]
            .into_iter()
            .flatten()
        {
            *id = scoped(id);
        }
    }
}

/// An identity input that is present but wrong: the client opted in, so this is a 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct IdentityError {
    pub field: String,
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> IdentityError {
    IdentityError {
        field: field.to_string(),
        message: message.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Canonical {
    #[serde(default)]
    program_id: Option<String>,
    #[serde(default)]
    task_id: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    parent_program_id: Option<String>,
    #[serde(default)]
    root_program_id: Option<String>,
    #[serde(default)]
    blocks_parent: Option<bool>,
    #[serde(default)]
    expected_resume: Option<bool>,
    #[serde(default)]
    agent_role: Option<String>,
    #[serde(default)]
    spawn_reason: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    step_id: Option<u64>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    deadline_seconds: Option<f64>,
    #[serde(default)]
    expected_output_length: Option<u64>,
    #[serde(default)]
    kv_retention_ttl_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentHint {
    session_id: Option<String>,
    #[serde(default)]
    parent_session_id: Option<String>,
    #[serde(default)]
    blocks_parent: Option<bool>,
    #[serde(default)]
    expected_resume: Option<bool>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    expected_output_length: Option<u64>,
    #[serde(default)]
    kv_retention_ttl_seconds: Option<f64>,
}

fn non_negative(field: &str, v: Option<f64>) -> Result<Option<f64>, IdentityError> {
    match v {
        Some(x) if !x.is_finite() || x < 0.0 => Err(err(
            field,
            format!("must be a finite number >= 0 (got {x})"),
        )),
        other => Ok(other),
    }
}

fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Parses the canonical context (`raw` is the value of `vllm_xargs.agentic_context`).
pub fn from_agentic_context(raw: &Value) -> Result<Identity, IdentityError> {
    const F: &str = "vllm_xargs.agentic_context";
    let parsed: Value;
    let obj = match raw {
        Value::String(s) => {
            parsed = serde_json::from_str(s)
                .map_err(|e| err(F, format!("is a string but not JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    if !obj.is_object() {
        return Err(err(F, "must be an object (or a JSON string of one)"));
    }
    let c: Canonical = serde_json::from_value(obj.clone()).map_err(|e| err(F, e.to_string()))?;
    let program_id =
        nonempty(c.program_id).ok_or_else(|| err(&format!("{F}.program_id"), "is required"))?;
    Ok(Identity {
        program_id,
        task_id: nonempty(c.task_id),
        session_id: nonempty(c.session_id),
        agent_id: nonempty(c.agent_id),
        parent_program_id: nonempty(c.parent_program_id),
        root_program_id: nonempty(c.root_program_id),
        blocks_parent: c.blocks_parent.unwrap_or(false),
        expected_resume: c.expected_resume.unwrap_or(true),
        resume_stated: c.expected_resume.is_some(),
        agent_role: nonempty(c.agent_role),
        spawn_reason: nonempty(c.spawn_reason),
        request_id: nonempty(c.request_id),
        step_id: c.step_id,
        priority: c.priority.unwrap_or(0),
        deadline_seconds: non_negative(&format!("{F}.deadline_seconds"), c.deadline_seconds)?,
        expected_output_length: c.expected_output_length,
        kv_retention_ttl_seconds: non_negative(
            &format!("{F}.kv_retention_ttl_seconds"),
            c.kv_retention_ttl_seconds,
        )?,
        source: Some(Source::AgenticContext),
    })
}

fn from_agent_hint(raw: &Value) -> Result<Identity, IdentityError> {
    const F: &str = "agent_hint";
    let h: AgentHint = serde_json::from_value(raw.clone()).map_err(|e| err(F, e.to_string()))?;
    let session =
        nonempty(h.session_id).ok_or_else(|| err("agent_hint.session_id", "is required"))?;
    let blocks_parent = h.blocks_parent.unwrap_or(true);
    let parent = nonempty(h.parent_session_id);
    if blocks_parent && parent.is_none() {
        return Err(err(
            "agent_hint.parent_session_id",
            "is required for a blocking hint (blocks_parent defaults to true)",
        ));
    }
    Ok(Identity {
        program_id: session.clone(),
        session_id: Some(session),
        parent_program_id: parent,
        blocks_parent,
        // A blocking subagent returns to its parent rather than resuming, unless told otherwise.
        expected_resume: h.expected_resume.unwrap_or(!blocks_parent),
        resume_stated: h.expected_resume.is_some(),
        priority: h.priority.unwrap_or(0),
        request_id: nonempty(h.request_id),
        expected_output_length: h.expected_output_length,
        kv_retention_ttl_seconds: non_negative(
            "agent_hint.kv_retention_ttl_seconds",
            h.kv_retention_ttl_seconds,
        )?,
        source: Some(Source::AgentHint),
        ..Default::default()
    })
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

fn from_headers(h: &HeaderMap) -> Option<Identity> {
    if let Some(session) = header(h, "x-claude-code-session-id") {
        let agent = header(h, "x-claude-code-agent-id");
        let parent = header(h, "x-claude-code-parent-agent-id");
        let program_id = match &agent {
            Some(a) => format!("{session}:{a}"),
            None => session.clone(),
        };
        return Some(Identity {
            program_id,
            parent_program_id: parent.map(|p| format!("{session}:{p}")),
            root_program_id: Some(session.clone()),
            session_id: Some(session),
            agent_id: agent,
            expected_resume: true,
            source: Some(Source::ClaudeCode),
            ..Default::default()
        });
    }
    let session = header(h, "session-id");
    let thread = header(h, "thread-id");
    if session.is_some() || thread.is_some() {
        let program_id = thread.clone().or(session.clone()).unwrap_or_default();
        return Some(Identity {
            program_id,
            session_id: session,
            agent_id: thread,
            expected_resume: true,
            source: Some(Source::Codex),
            ..Default::default()
        });
    }
    header(h, "x-session-id").map(|s| Identity {
        program_id: s.clone(),
        session_id: Some(s),
        expected_resume: true,
        source: Some(Source::SessionHeader),
        ..Default::default()
    })
}

/// Resolves a request's identity. `agentic_context` is the value of `vllm_xargs.agentic_context`
/// and `agent_hint` the body's `agent_hint`, when present. `Ok(None)`: the request takes the native
/// path.
pub fn resolve(
    key: EnableKey,
    agentic_context: Option<&Value>,
    agent_hint: Option<&Value>,
    headers: &HeaderMap,
) -> Result<Option<Identity>, IdentityError> {
    if let Some(ctx) = agentic_context {
        return from_agentic_context(ctx).map(Some);
    }
    if key == EnableKey::AgenticContext {
        return Ok(None);
    }
    if let Some(h) = agent_hint {
        return from_agent_hint(h).map(Some);
    }
    Ok(from_headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn canonical_object_and_json_string_are_equal() {
        let ctx = json!({"program_id": "task-a:researcher", "task_id": "task-a", "session_id": "session-a",
            "agent_id": "researcher", "parent_program_id": "task-a:lead", "root_program_id": "task-a:lead",
            "blocks_parent": false, "expected_resume": true, "agent_role": "subagent", "spawn_reason": "research",
            "request_id": "request-a", "step_id": 7, "priority": 10, "deadline_seconds": 30,
            "expected_output_length": 2048, "kv_retention_ttl_seconds": 5});
        let a = from_agentic_context(&ctx).expect("object");
        let b = from_agentic_context(&Value::String(ctx.to_string())).expect("string");
        assert_eq!(a, b);
        assert_eq!(a.program_id, "task-a:researcher");
        assert_eq!(
            (a.step_id, a.priority, a.expected_output_length),
            (Some(7), 10, Some(2048))
        );
        assert_eq!(a.kv_retention_ttl_seconds, Some(5.0));
        assert_eq!(a.source, Some(Source::AgenticContext));
    }

    #[test]
    fn canonical_errors_name_the_field() {
        let cases = [
            (json!({"task_id": "t"}), "program_id"),
            (json!({"program_id": 5}), "agentic_context"),
            (
                json!({"program_id": "p", "priority": "high"}),
                "agentic_context",
            ),
            (
                json!({"program_id": "p", "deadline_seconds": -1}),
                "deadline_seconds",
            ),
            (json!({"program_id": "p", "surprise": 1}), "unknown field"),
            (json!(["p"]), "must be an object"),
            (Value::String("{not json".into()), "not JSON"),
        ];
        for (v, want) in cases {
            let e = from_agentic_context(&v).expect_err("error");
            assert!(e.to_string().contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn default_key_ignores_everything_but_the_canonical_context() {
        let h = headers(&[("x-session-id", "s"), ("x-claude-code-session-id", "c")]);
        let hint = json!({"session_id": "h", "blocks_parent": false});
        assert_eq!(
            resolve(EnableKey::AgenticContext, None, Some(&hint), &h).expect("ok"),
            None
        );
    }

    #[test]
    fn auto_precedence_canonical_then_hint_then_one_header_schema() {
        let h = headers(&[
            ("x-session-id", "generic"),
            ("session-id", "codex-s"),
            ("thread-id", "codex-t"),
            ("x-claude-code-session-id", "cc"),
            ("x-claude-code-agent-id", "sub1"),
            ("x-claude-code-parent-agent-id", "main"),
        ]);
        let ctx = json!({"program_id": "canon"});
        let hint = json!({"session_id": "hinted", "blocks_parent": false});
        let id = |c, a, h: &HeaderMap| {
            resolve(EnableKey::Auto, c, a, h)
                .expect("ok")
                .expect("identity")
        };
        assert_eq!(id(Some(&ctx), Some(&hint), &h).program_id, "canon");
        assert_eq!(id(None, Some(&hint), &h).program_id, "hinted");
        let cc = id(None, None, &h);
        assert_eq!(
            (cc.program_id.as_str(), cc.parent_program_id.as_deref()),
            ("cc:sub1", Some("cc:main"))
        );
        assert_eq!(cc.source, Some(Source::ClaudeCode));
        // Without Claude Code headers, Codex wins over the generic header, and nothing is mixed in.
        let h2 = headers(&[
            ("x-session-id", "generic"),
            ("session-id", "codex-s"),
            ("thread-id", "codex-t"),
        ]);
        let cx = id(None, None, &h2);
        assert_eq!(
            (cx.program_id.as_str(), cx.session_id.as_deref()),
            ("codex-t", Some("codex-s"))
        );
        let h3 = headers(&[("x-session-id", "generic")]);
        assert_eq!(id(None, None, &h3).program_id, "generic");
        assert_eq!(
            resolve(EnableKey::Auto, None, None, &HeaderMap::new()).expect("ok"),
            None
        );
    }

    #[test]
    fn agent_hint_blocking_rules() {
        let blocking = json!({"session_id": "child", "parent_session_id": "parent"});
        let i = from_agent_hint(&blocking).expect("valid");
        assert!(
            i.blocks_parent && !i.expected_resume,
            "blocking by default, no resume by default"
        );
        assert_eq!(
            (
                i.program_id.as_str(),
                i.session_id.as_deref(),
                i.task_id.as_deref()
            ),
            ("child", Some("child"), None)
        );
        let explicit =
            json!({"session_id": "child", "parent_session_id": "parent", "expected_resume": true});
        assert!(from_agent_hint(&explicit).expect("valid").expected_resume);
        let missing_parent = json!({"session_id": "child"});
        assert!(
            from_agent_hint(&missing_parent)
                .expect_err("needs parent")
                .field
                .contains("parent_session_id")
        );
        let free = json!({"session_id": "solo", "blocks_parent": false});
        assert!(from_agent_hint(&free).expect("valid").expected_resume);
    }

    #[test]
    fn scope_puts_the_program_tree_in_the_clients_namespace() {
        let mut id = Identity {
            program_id: "s1".into(),
            parent_program_id: Some("root".into()),
            root_program_id: Some("root".into()),
            task_id: Some("t".into()),
            ..Default::default()
        };
        id.scope("team-a");
        assert_eq!(id.program_id, "team-a/s1");
        assert_eq!(id.parent_program_id.as_deref(), Some("team-a/root"));
        assert_eq!(id.root_program_id.as_deref(), Some("team-a/root"));
        assert_eq!(id.task_id.as_deref(), Some("t"), "hints are not ids");
    }
}
