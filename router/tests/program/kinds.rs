//! Kinds of Program (`resume_order: kind_size`) are named by the system prompt the router reads
//! from the request, not by the session's own messages: chat sessions of one app share a kind
//! however short its system prompt is. Without a system prompt the first message names it.

use super::*;

/// A one-request session (it says it ends) with `system` as its system message, if any.
fn session(program: &str, system: Option<&str>, user: &str) -> String {
    let mut body: Value =
        serde_json::from_str(&program_body(program, 0, json!({"expected_resume": false})))
            .expect("json");
    let mut messages = vec![json!({"role": "user", "content": user})];
    if let Some(s) = system {
        messages.insert(0, json!({"role": "system", "content": s}));
    }
    body["messages"] = json!(messages);
    body.to_string()
}

#[tokio::test]
async fn sessions_of_one_system_prompt_are_one_kind_whatever_their_messages() {
    let (_s, r) = setup(roomy()).await;
    let c = client();
    let kinds = |d: Value| d["program_kinds"].as_u64();
    assert_eq!(kinds(diagnostics(&c, &r).await), Some(0));
    let send = |body: String| {
        let (c, url) = (c.clone(), r.url(CHAT));
        async move {
            let reply = post(&c, &url, &body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
    };
    for (i, question) in ["What is KV?", "Summarize this.", "Translate: hola"]
        .iter()
        .enumerate()
    {
        send(session(&format!("chat-{i}"), Some("Be brief."), question)).await;
    }
    assert_eq!(
        kinds(diagnostics(&c, &r).await),
        Some(1),
        "three sessions of one short system prompt"
    );
    send(session(
        "agent-0",
        Some("You are a coding agent."),
        "fix it",
    ))
    .await;
    assert_eq!(kinds(diagnostics(&c, &r).await), Some(2), "another app");
    // A long system prompt whose `content` comes before its `role` (`json!` sorts the keys).
    let long = "Follow the repository's conventions. ".repeat(100);
    send(session("long-0", Some(&long), "a")).await;
    send(session("long-1", Some(&long), "b")).await;
    assert_eq!(kinds(diagnostics(&c, &r).await), Some(3));
    // No system prompt: the first message names the kind. An agent that keeps its instructions
    // in a template before the task is one kind; two chats that open differently are two.
    let template = "You are an agent. Work in the repository below. ".repeat(30);
    send(session(
        "tpl-0",
        None,
        &format!("{template}Task: fix bug 1"),
    ))
    .await;
    send(session(
        "tpl-1",
        None,
        &format!("{template}Task: fix bug 2"),
    ))
    .await;
    assert_eq!(kinds(diagnostics(&c, &r).await), Some(4), "one template");
    send(session("bare-0", None, "hi")).await;
    send(session("bare-1", None, "hello")).await;
    let d = diagnostics(&c, &r).await;
    assert_eq!(kinds(d.clone()), Some(6));
    // None has the 5 ended Programs that could set it apart from the fleet's mean.
    assert_eq!(d["program_kinds_apart"].as_u64(), Some(0));
    assert!(
        d["program_size_mean_tokens"]
            .as_f64()
            .is_some_and(|m| m > 0.0),
        "{d}"
    );
}
