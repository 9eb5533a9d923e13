//! An agent's answer without a tool call ends its turn (`answer_ends_program`) when its client
//! leaves `expected_resume` unsaid: the Program pauses without a hold and counts as finished
//! until its next request.

use super::*;

/// A Program whose client names it by headers only (`expected_resume` assumed true): a response
/// that called `bash`, then one read whole that called nothing.
fn agent_then_answer(c: ProgramSchedulingConfig, last: ToolCall<'_>) -> Scheduler {
    let mut s = sched(c, 1);
    s.on_arrival(0.0, arrival(1, "a", 100));
    s.on_complete_with_tool(0.5, 1, usage(100, 10), ToolCall::Named("bash"));
    s.on_arrival(1.0, arrival(2, "a", 150));
    s.on_complete_with_tool(1.5, 2, usage(150, 10), last);
    s.check_invariants().expect("ledger");
    s
}

fn paused_by(s: &Scheduler, program: &str) -> Option<PauseReason> {
    match find(s, program).phase {
        Phase::Paused { reason, .. } => Some(reason),
        _ => None,
    }
}

#[test]
fn an_agents_answer_without_a_tool_ends_its_program() {
    let s = agent_then_answer(cfg(), ToolCall::None);
    let p = find(&s, "a");
    assert_eq!(paused_by(&s, "a"), Some(PauseReason::Answered));
    assert!(p.finished, "counted as finished for binding");
    assert_eq!(p.reserved, 0, "nothing held for it");
    assert_eq!(s.ranks[0].used_tokens, 0);
    assert_eq!(s.ranks[0].finished, 1);
}

#[test]
fn an_ended_program_that_comes_back_is_live_again() {
    let mut s = agent_then_answer(cfg(), ToolCall::None);
    // A person answers a minute later: the same Program, on its rank, admitted again.
    let d = s.on_arrival(61.5, arrival(3, "a", 200));
    assert_eq!(dispatched(&d), vec![3]);
    let p = find(&s, "a");
    assert!(!p.finished);
    assert_eq!(s.ranks[0].finished, 0);
    // It calls a tool again: held as any agent is.
    s.on_complete_with_tool(62.0, 3, usage(200, 10), ToolCall::Named("bash"));
    assert_ne!(paused_by(&s, "a"), Some(PauseReason::Answered));
    s.check_invariants().expect("ledger");
}

#[test]
fn only_what_is_known_to_be_an_agents_answer_ends_it() {
    // Not known (tools not looked for, or a long body that ended in a call whose name was lost).
    let s = agent_then_answer(cfg(), ToolCall::Unknown);
    assert!(!find(&s, "a").finished);
    assert_ne!(paused_by(&s, "a"), Some(PauseReason::Answered));
    // A Program that never called a tool (a chat) keeps the usual TTL after every answer.
    let mut s = sched(cfg(), 1);
    for (t, ticket) in [(0.0, 1), (10.0, 2)] {
        s.on_arrival(t, arrival(ticket, "chat", 100));
        s.on_complete_with_tool(t + 0.5, ticket, usage(100, 10), ToolCall::None);
        assert!(!find(&s, "chat").finished);
    }
    // Off.
    let off = agent_then_answer(
        ProgramSchedulingConfig {
            answer_ends_program: false,
            ..cfg()
        },
        ToolCall::None,
    );
    assert!(!find(&off, "a").finished);
}

#[test]
fn a_client_that_says_whether_it_resumes_is_taken_at_its_word() {
    let run = |f: fn(&mut Identity)| {
        let mut s = sched(cfg(), 1);
        s.on_arrival(0.0, with(arrival(1, "a", 100), f));
        s.on_complete_with_tool(0.5, 1, usage(100, 10), ToolCall::Named("bash"));
        s.on_arrival(1.0, with(arrival(2, "a", 150), f));
        s.on_complete_with_tool(1.5, 2, usage(150, 10), ToolCall::None);
        s
    };
    // `expected_resume: true` said outright: the client will be back, so the automatic TTL
    // decides (with no evidence yet it holds nothing, but the Program is not over).
    let s = run(|i| i.resume_stated = true);
    assert!(!find(&s, "a").finished);
    assert_eq!(paused_by(&s, "a"), Some(PauseReason::TtlExpired));
    // A retention TTL of its own on the request: the client expects to return within it.
    let s = run(|i| i.kv_retention_ttl_seconds = Some(30.0));
    assert!(matches!(find(&s, "a").phase, Phase::Acting { .. }));
    assert!(!find(&s, "a").finished);
}

#[test]
fn a_replica_that_takes_an_agent_over_knows_it_is_one() {
    let mut a = sched(cfg(), 1);
    a.on_arrival(0.0, arrival(1, "a", 100));
    a.on_complete_with_tool(0.5, 1, usage(100, 10), ToolCall::Named("bash"));
    let key = ("m".to_string(), "a".to_string());
    let (given, _) = a.hand_over(1.0, &key);
    let given = given.expect("nothing in flight: handed over");
    assert!(given.called_tool);
    let wire = serde_json::to_string(&given).expect("json");
    let mut b = sched(cfg(), 1);
    let back: HandedOver = serde_json::from_str(&wire).expect("parses");
    assert_eq!(b.adopt(1.0, &[back]), 1);
    // Its first answer on the new owner, with no tool called there yet, ends its turn.
    b.on_arrival(2.0, arrival(2, "a", 150));
    b.on_complete_with_tool(2.5, 2, usage(150, 10), ToolCall::None);
    assert_eq!(paused_by(&b, "a"), Some(PauseReason::Answered));
    b.check_invariants().expect("ledger");
    // A replica of an earlier version sends no mark: a chat as far as this one knows.
    let older = wire.replace(r#","called_tool":true"#, "");
    assert!(!older.contains("called_tool"), "{older}");
    let mut c = sched(cfg(), 1);
    let back: HandedOver = serde_json::from_str(&older).expect("parses");
    assert_eq!(c.adopt(1.0, &[back]), 1);
    c.on_arrival(2.0, arrival(2, "a", 150));
    c.on_complete_with_tool(2.5, 2, usage(150, 10), ToolCall::None);
    assert!(!find(&c, "a").finished);
}
