//! `resume_order: kind_size`: Programs of a kind far smaller than the fleet's go first, once
//! their kind's size is learned from Programs that ended; subagents are a kind apart from their
//! lead's; the map of kinds is bounded.

use super::*;

/// Runs five single-request Programs of kind `lead` to their end, each `tokens` long.
fn end_programs(s: &mut Scheduler, t: &mut f64, ticket: &mut Ticket, lead: u64, tokens: u64) {
    end_as(s, t, ticket, (lead, false), tokens);
}

/// [`end_programs`] as leads or (`kind.1`) as subagents of a Program "parent".
fn end_as(s: &mut Scheduler, t: &mut f64, ticket: &mut Ticket, kind: (u64, bool), tokens: u64) {
    let (lead, subagent) = kind;
    for _ in 0..5 {
        *ticket += 1;
        let name = format!("done-{ticket}");
        let last = with(arrival(*ticket, &name, tokens - 10), |i| {
            i.expected_resume = false;
            if subagent {
                i.parent_program_id = Some("parent".into());
            }
        });
        assert_eq!(dispatched(&s.on_arrival(*t, led(last, lead))), [*ticket]);
        s.on_complete(*t + 0.5, *ticket, usage(tokens - 10, 10));
        *t += 1.0;
    }
}

/// One slot: "hold" runs; an agent-kind Program arrives before a chat-kind one (with `forced`,
/// both wait past their force-resume deadline, and the rank has room for one of them only once
/// "hold" ends). Which is dispatched when "hold" completes?
fn first_after_hold(order: ResumeOrder, learn: bool, forced: bool) -> Ticket {
    let c = ProgramSchedulingConfig {
        resume_order: order,
        max_active_programs_per_target: 1,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    let (mut t, mut ticket) = (0.0, 0);
    if learn {
        // Chat sessions end at ~100 tokens, agents at ~900, with some spread.
        for (chat, agent) in [(100, 900), (110, 880), (90, 920), (105, 910), (95, 890)] {
            end_programs(&mut s, &mut t, &mut ticket, 1, chat);
            end_programs(&mut s, &mut t, &mut ticket, 2, agent);
        }
    }
    let (held, asked) = if forced { (600, 550) } else { (50, 50) };
    let hold = arrival(100, "hold", held);
    assert_eq!(dispatched(&s.on_arrival(t, hold)), [100]);
    s.on_arrival(t + 1.0, led(arrival(101, "agent", asked), 2));
    s.on_arrival(t + 2.0, led(arrival(102, "chat", asked), 1));
    let end = if forced {
        assert!(dispatched(&s.on_tick(t + 10.0)).is_empty(), "no room yet");
        let deadlines = s.force_deadlines();
        assert_eq!(deadlines.len(), 2);
        assert!(deadlines.values().all(|d| *d == f64::MIN), "both forced");
        t + 11.0
    } else {
        t + 3.0
    };
    let d = dispatched(&s.on_complete(end, 100, usage(held, 1)));
    assert_eq!(d.len(), 1, "{d:?}");
    s.check_invariants().expect("ledger");
    d[0]
}

#[test]
fn a_smaller_kind_passes_a_larger_one_once_learned() {
    assert_eq!(first_after_hold(ResumeOrder::KindSize, true, false), 102);
    // Nothing ended yet, or ordered as the spec's `mru`: new Programs oldest first.
    assert_eq!(first_after_hold(ResumeOrder::KindSize, false, false), 101);
    assert_eq!(first_after_hold(ResumeOrder::Mru, true, false), 101);
}

#[test]
fn subagents_are_a_kind_apart_from_their_leads() {
    let c = ProgramSchedulingConfig {
        resume_order: ResumeOrder::KindSize,
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let mut s = sched(c, 1);
    let (mut t, mut ticket) = (0.0, 0);
    // Leads and their subagents share a system prompt (lead key 2); leads end at ~900 tokens,
    // subagents at ~100.
    for (sub, lead) in [(100, 900), (110, 880), (90, 920), (105, 910), (95, 890)] {
        end_as(&mut s, &mut t, &mut ticket, (2, true), sub);
        end_as(&mut s, &mut t, &mut ticket, (2, false), lead);
    }
    assert_eq!(
        dispatched(&s.on_arrival(t, arrival(100, "hold", 50))),
        [100]
    );
    s.on_arrival(t + 1.0, led(arrival(101, "lead", 50), 2));
    let sub = with(arrival(102, "sub", 50), |i| {
        i.parent_program_id = Some("parent".into());
    });
    s.on_arrival(t + 2.0, led(sub, 2));
    // The diagnostics show it: two kinds apart from the fleet (mean ~500 tokens), each waiting
    // Program's tier, and the fleet's tier (0) for one without a system prompt.
    let d = crate::program::diagnostics::snapshot(&s, t + 2.0, &[], 0.25, 10);
    assert_eq!((d.program_kinds, d.program_kinds_apart), (2, 2));
    assert_eq!(d.program_size_mean_tokens, Some(500.0));
    let tier = |name: &str| {
        d.ranks[0]
            .programs
            .iter()
            .find(|p| p.program == name)
            .and_then(|p| p.kind_tier)
    };
    assert_eq!(
        (tier("sub"), tier("lead"), tier("hold")),
        (Some(-1), Some(1), Some(0))
    );
    // Were subagents their lead's kind, both would share a tier and the older go first.
    assert_eq!(
        dispatched(&s.on_complete(t + 3.0, 100, usage(50, 1))),
        [102]
    );
    s.check_invariants().expect("ledger");
}

#[test]
fn a_program_keeps_the_kind_its_first_request_named() {
    let c = ProgramSchedulingConfig {
        resume_order: ResumeOrder::KindSize,
        ..cfg()
    };
    let mut s = sched(c, 1);
    let (mut t, mut ticket) = (0.0, 0);
    // Chats of system prompt 1: their second request names another (as a Responses turn that
    // continues a stored response names its own input); agents of prompt 2 end far larger.
    for (i, size) in [100, 110, 90, 105, 95].into_iter().enumerate() {
        let name = format!("chat-{i}");
        ticket += 1;
        assert_eq!(
            dispatched(&s.on_arrival(t, led(arrival(ticket, &name, 40), 1))),
            [ticket]
        );
        s.on_complete(t + 0.5, ticket, usage(40, 10));
        ticket += 1;
        let last = with(arrival(ticket, &name, size - 10), |i| {
            i.expected_resume = false
        });
        assert_eq!(
            dispatched(&s.on_arrival(t + 1.0, led(last, 1000 + ticket))),
            [ticket]
        );
        s.on_complete(t + 1.5, ticket, usage(size - 10, 10));
        t += 2.0;
    }
    end_programs(&mut s, &mut t, &mut ticket, 2, 900);
    let d = crate::program::diagnostics::snapshot(&s, t, &[], 0.25, 10);
    assert_eq!(
        (d.program_kinds, d.program_kinds_apart),
        (2, 2),
        "the chats taught kind 1, not five kinds of one"
    );
}

#[test]
fn forced_requests_go_oldest_first_whatever_their_kind() {
    assert_eq!(first_after_hold(ResumeOrder::KindSize, true, true), 101);
}

#[test]
fn kinds_are_bounded_and_replacing_one_is_counted() {
    let mut s = sched(cfg(), 1);
    let mut replaced = 0;
    for k in 0..=(MAX_KINDS as u64) {
        let name = format!("p{k}");
        let a = with(arrival(k + 1, &name, 10), |i| i.expected_resume = false);
        s.on_arrival(k as f64, led(a, k));
        s.on_complete(k as f64 + 0.5, k + 1, usage(10, 1));
        replaced += s
            .take_notes()
            .iter()
            .filter(|n| {
                matches!(
                    n,
                    Note::Shed {
                        reason: "kind_replaced_unsettled"
                    }
                )
            })
            .count();
    }
    assert_eq!(s.kinds_kept(), MAX_KINDS);
    assert_eq!(
        replaced, 1,
        "the kind that learned least recently made room (one Program each: unsettled)"
    );
}
