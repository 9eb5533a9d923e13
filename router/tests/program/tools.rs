//! The tool a response called reaches the scheduler (`tool_ttl_min_samples`,
//! `answer_ends_program`): read from non-streamed and streamed chat completions on the way
//! through, the body left as it was.

use super::*;

/// A tool name longer than the relay reads (`tool_call::MAX_NAME_BYTES`).
const LONG_TOOL: &str = concat!(
    "a_tool_name_far_longer_than_any_real_one_________________________________________________",
    "________________________________________________________________________________________",
    "________________________________________________________________________________________",
);

/// A Program request whose response calls `tool` (vllm-sim calls the tool it is told to).
fn calling(program: &str, tool: Option<&str>, stream: bool) -> String {
    let mut body: Value =
        serde_json::from_str(&program_body(program, 50, json!({}))).expect("json");
    if let Some(t) = tool {
        body["vllm_xargs"]["sim_tool_call"] = json!(t);
    }
    if stream {
        body["stream"] = json!(true);
    }
    body.to_string()
}

async fn send(c: &HttpClient, r: &Router, body: String) -> String {
    let reply = post(c, &r.url(CHAT), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.text()
}

fn roomy_with(tool_ttl_min_samples: u32) -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        tool_ttl_min_samples,
        ..roomy()
    }
}

#[tokio::test]
async fn the_tool_a_response_calls_is_read_streamed_or_not() {
    let (_s, r) = setup(roomy_with(50)).await;
    let c = client();
    let keys = |d: Value| d["return_time_profile_keys"].as_u64();
    assert_eq!(keys(diagnostics(&c, &r).await), Some(0));
    let text = send(&c, &r, calling("p", Some("read_file"), false)).await;
    let reply: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "read_file",
        "the client gets the tool call as the engine wrote it: {text}"
    );
    assert_eq!(keys(diagnostics(&c, &r).await), Some(1));
    let text = send(&c, &r, calling("p", Some("run_tests"), true)).await;
    assert!(text.contains(r#""name":"run_tests""#), "{text}");
    assert_eq!(keys(diagnostics(&c, &r).await), Some(2));
    // A response without a tool call names none, and a known tool is not counted twice.
    send(&c, &r, calling("p", None, false)).await;
    send(&c, &r, calling("p", Some("read_file"), true)).await;
    assert_eq!(keys(diagnostics(&c, &r).await), Some(2));
}

#[tokio::test]
async fn with_tools_not_told_apart_responses_are_not_read_for_them() {
    let (_s, r) = setup(roomy_with(0)).await;
    let c = client();
    send(&c, &r, calling("p", Some("read_file"), false)).await;
    send(&c, &r, calling("p", Some("run_tests"), true)).await;
    assert_eq!(
        diagnostics(&c, &r).await["return_time_profile_keys"].as_u64(),
        Some(0)
    );
}

/// A session named by a header alone (`auto`, `x-session-id`): its client never says
/// `expected_resume`. A turn that calls a tool, then one that answers without one — streamed
/// or not, or a JSON answer far longer than the tail the relay keeps — ends the Program
/// (`answer_ends_program`); a session that never calls a tool (a chat) is not ended by its
/// answers.
#[tokio::test]
async fn an_answer_without_a_tool_ends_a_session_header_program() {
    let (_s, r) = setup(ProgramSchedulingConfig {
        program_scheduling_enable_key: program_router::config::program::EnableKey::Auto,
        ..roomy()
    })
    .await;
    let c = client();
    let turn_of = |session: &'static str, tool: Option<&'static str>, stream: bool, tokens| {
        let (c, url) = (c.clone(), r.url(CHAT));
        async move {
            let mut body: Value = serde_json::from_str(&chat("w w w", tokens)).expect("json");
            if let Some(t) = tool {
                body["vllm_xargs"] = json!({"sim_tool_call": t});
            }
            body["stream"] = json!(stream);
            let reply = common::send(
                &c,
                "POST",
                &url,
                &body.to_string(),
                &[("x-session-id", session)],
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
    };
    let turn = |session, tool, stream| turn_of(session, tool, stream, 4);
    let ended = || async {
        let m = get_metrics(&c, &r).await;
        let d = diagnostics(&c, &r).await;
        (
            metric_in(
                &m,
                "vllm_router_agent_aware_transitions_total",
                &[("reason", "answered")],
            ),
            d["ranks"][0]["router_finished_programs"].as_u64(),
        )
    };
    for (session, stream) in [("agent-1", false), ("agent-2", true)] {
        turn(session, Some("bash"), stream).await;
        turn(session, None, stream).await;
    }
    // ~55 KB of JSON: the relay keeps its last 16 KiB, and reads that it ended without a call.
    turn("agent-3", Some("bash"), false).await;
    turn_of("agent-3", None, false, 8_000).await;
    assert!(
        eventually(5.0, || async { ended().await == (3.0, Some(3)) }).await,
        "{:?}",
        ended().await
    );
    // A streamed call whose name is too long to read is still a call, so the turn is not an
    // answer; the next one is.
    turn("agent-4", Some("bash"), true).await;
    turn("agent-4", Some(LONG_TOOL), true).await;
    turn("chat", None, false).await;
    assert_eq!(ended().await, (3.0, Some(3)), "a call is not an answer");
    turn("agent-4", None, true).await;
    assert!(
        eventually(5.0, || async { ended().await == (4.0, Some(4)) }).await,
        "{:?}",
        ended().await
    );
    turn("chat", None, false).await;
    assert_eq!(
        ended().await,
        (4.0, Some(4)),
        "a chat's answers end nothing"
    );
    // The agent's person answers: live again.
    turn("agent-1", Some("bash"), false).await;
    assert_eq!(ended().await.1, Some(3));
}
