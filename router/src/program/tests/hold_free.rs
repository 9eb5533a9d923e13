//! Hold-free slack: on a rank where none of the latest resumed Programs held its place, a queued
//! request is admitted once all but `hold_free_admission_slack_ratio` of its demand fits; one
//! held resume in the window, or a ratio of 0, keeps admission within the ledger. By kind: on a
//! rank where some Programs hold, a request of a kind that never held is admitted the same way.

use super::*;

/// A window of 4 resumes (the smallest the scheduler reads is 2; the default 100 reads 16).
fn cfg4() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        stats_window_size: 4,
        ..cfg()
    }
}

/// Four Programs run one 100-token round each, pause (TTL 0: nothing held) and come back 60 s
/// later to a lost prefix; `held` of them instead come back within a 100 s hold. Then "a" runs
/// 900 of the rank's 1,000 tokens. Returns the scheduler and the time.
fn four_resumes_then_a(c: ProgramSchedulingConfig, held: usize) -> (Scheduler, f64) {
    let plan: Vec<(&str, Option<u64>, bool)> = ["p", "q", "r", "s"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, None, i < held))
        .collect();
    resumes_then_a(c, &plan)
}

/// [`four_resumes_then_a`] for any `(name, system prompt key, held)` plan.
fn resumes_then_a(
    c: ProgramSchedulingConfig,
    plan: &[(&str, Option<u64>, bool)],
) -> (Scheduler, f64) {
    let mut s = sched(c, 1);
    let mut t = 0.0;
    for (i, &(name, system, held)) in plan.iter().enumerate() {
        let ttl = if held { 100.0 } else { 0.0 };
        let first = 10 + 2 * i as u64;
        let of_kind = |mut a: Arrival| {
            a.system = system;
            a
        };
        assert_eq!(
            dispatched(&s.on_arrival(t, of_kind(with_ttl(arrival(first, name, 100), ttl)))),
            [first]
        );
        s.on_complete(t + 1.0, first, usage(100, 10));
        let back = of_kind(with_ttl(arrival(first + 1, name, 130), 0.0));
        assert_eq!(dispatched(&s.on_arrival(t + 60.0, back)), [first + 1]);
        s.on_complete(t + 61.0, first + 1, usage(130, 10));
        s.on_tick(t + 62.0);
        t += 100.0;
    }
    assert_eq!(dispatched(&s.on_arrival(t, arrival(1, "a", 900))), [1]);
    (s, t)
}

#[test]
fn a_hold_free_rank_admits_a_request_once_half_its_demand_fits() {
    let (mut s, t) = four_resumes_then_a(cfg4(), 0);
    assert_eq!(s.held_resume_share(0), Some(0.0));
    // 900 + 200 = 1,100 ≤ 1,000 + 0.5 × 200.
    assert_eq!(
        dispatched(&s.on_arrival(t + 1.0, arrival(2, "b", 200))),
        [2]
    );
    assert_eq!(s.counters.hold_free_admissions, 1);
    // 1,100 + 250 is past 1,000 + 125: a second one waits.
    assert!(dispatched(&s.on_arrival(t + 2.0, arrival(3, "c", 250))).is_empty());
    assert_eq!(s.counters.hold_free_admissions, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn one_held_resume_or_a_zero_ratio_keeps_admission_within_the_ledger() {
    let (mut s, t) = four_resumes_then_a(cfg4(), 1);
    assert_eq!(s.held_resume_share(0), Some(0.25));
    assert!(dispatched(&s.on_arrival(t + 1.0, arrival(2, "b", 200))).is_empty());

    let off = ProgramSchedulingConfig {
        hold_free_admission_slack_ratio: 0.0,
        ..cfg4()
    };
    let (mut s, t) = four_resumes_then_a(off, 0);
    assert!(dispatched(&s.on_arrival(t + 1.0, arrival(2, "b", 200))).is_empty());
    assert_eq!(s.counters.hold_free_admissions, 0);
}

#[test]
fn too_few_resumes_say_nothing() {
    let c = ProgramSchedulingConfig {
        stats_window_size: 8,
        ..cfg()
    };
    let (mut s, t) = four_resumes_then_a(c, 0);
    assert_eq!(s.held_resume_share(0), None, "4 of the 8 needed");
    assert!(dispatched(&s.on_arrival(t + 1.0, arrival(2, "b", 200))).is_empty());
}

#[test]
fn the_slack_never_takes_a_rank_more_than_half_a_request_past_its_watermark() {
    let (mut s, t) = four_resumes_then_a(cfg4(), 0);
    // New Programs of 50–400 tokens keep arriving while "a" runs: each admission counts the
    // whole demand of those before it, so the ledger stays within 1,000 + half the largest.
    let (mut largest, mut past) = (0, false);
    for i in 0..40u64 {
        let prompt = 50 + (i * 97) % 351;
        s.on_arrival(
            t + 1.0 + i as f64,
            arrival(100 + i, &format!("n{i}"), prompt),
        );
        largest = largest.max(prompt);
        let used = s.ranks[0].used_tokens;
        assert!(used <= 1000 + largest / 2, "ledger {used} after {i}");
        past |= used > 1000;
    }
    assert!(past, "the slack took the rank past its watermark");
    assert!(s.counters.hold_free_admissions >= 1);
    s.check_invariants().expect("ledger");
}

/// Chats (system prompt 1) never held, an agent (system prompt 2) did: the rank is not hold-free,
/// the chat kind is.
fn chats_beside_an_agent(c: ProgramSchedulingConfig) -> (Scheduler, f64) {
    let plan = [
        ("c1", Some(1), false),
        ("c2", Some(1), false),
        ("c3", Some(1), false),
        ("c4", Some(1), false),
        ("agent", Some(2), true),
    ];
    resumes_then_a(c, &plan)
}

/// A new Program of system prompt `system`.
fn new_of(ticket: Ticket, name: &str, prompt: u64, system: u64) -> Arrival {
    let mut a = arrival(ticket, name, prompt);
    a.system = Some(system);
    a
}

#[test]
fn a_hold_free_kind_takes_the_slack_on_a_rank_where_others_hold() {
    let (mut s, t) = chats_beside_an_agent(cfg4());
    assert_eq!(s.held_resume_share(0), Some(0.25), "the agent held");
    assert_eq!(s.kinds_hold_free(), 1, "chat, not the agent (one resume)");
    // An agent's new Program waits for the ledger; a chat's is admitted at half its demand.
    assert!(dispatched(&s.on_arrival(t + 1.0, new_of(2, "agent2", 200, 2))).is_empty());
    assert_eq!(
        dispatched(&s.on_arrival(t + 2.0, new_of(3, "chat5", 200, 1))),
        [3]
    );
    assert_eq!(s.counters.hold_free_admissions, 1);
    s.check_invariants().expect("ledger");

    let off = ProgramSchedulingConfig {
        hold_free_admission_by_kind: false,
        ..cfg4()
    };
    let (mut s, t) = chats_beside_an_agent(off);
    assert!(dispatched(&s.on_arrival(t + 1.0, new_of(3, "chat5", 200, 1))).is_empty());
    assert_eq!(s.counters.hold_free_admissions, 0);
}

#[test]
fn one_held_resume_of_a_kind_ends_its_slack() {
    let mut plan = vec![
        ("c1", Some(1), false),
        ("c2", Some(1), false),
        ("c3", Some(1), false),
        ("c4", Some(1), false),
    ];
    plan.push(("c5", Some(1), true));
    let (mut s, t) = resumes_then_a(cfg4(), &plan);
    assert_eq!(s.kinds_hold_free(), 0);
    assert!(dispatched(&s.on_arrival(t + 1.0, new_of(2, "chat6", 200, 1))).is_empty());
}
