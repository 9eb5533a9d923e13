//! The tool-aware TTL (`tool_ttl_min_samples`): a tool's own return intervals may lengthen a
//! hold, never shorten it, and give way to a request past its force-resume deadline.

use super::*;

/// Ten-interval windows, a held second costing a second, the whole TTL charged: the TTL is
/// then the plain break-even of the evidence (a miss on 20k tokens costs ~5.5 s).
fn tool_window(min: u32) -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        stats_window_size: 10,
        tool_ttl_min_samples: min,
        max_acting_ttl_seconds: 10.0,
        token_capacity_per_dp_rank: Some(1_000_000),
        acting_ttl_cost: ActingTtlCost::Seconds,
        acting_ttl_hold: crate::config::program::ActingTtlHold::Reserved,
        ..cfg()
    }
}

/// Program "a" calls `read` (back after 1 s), `test` (4 s) and `slow` (30 s) in turn, twelve
/// times; the TTL armed after the last call of each.
fn armed_after_each(c: ProgramSchedulingConfig) -> [f64; 3] {
    let mut s = sched(c, 1);
    let tools = [("read", 1.0), ("test", 4.0), ("slow", 30.0)];
    let (mut t, mut ticket, mut armed) = (0.0, 0, [0.0; 3]);
    for _ in 0..12 {
        for (i, (name, gap)) in tools.iter().enumerate() {
            ticket += 1;
            s.on_arrival(t, arrival(ticket, "a", 20_000));
            t += 0.5;
            s.on_complete_with_tool(t, ticket, usage(20_000, 10), ToolCall::Named(name));
            armed[i] = find(&s, "a").armed_ttl;
            t += gap;
        }
    }
    s.check_invariants().expect("ledger");
    armed
}

#[test]
fn a_tools_own_returns_lengthen_its_hold_but_never_shorten_it() {
    // The rank's evidence mixes the three: a third back within 1 s pays for 1 s, not for 4 s.
    let [read, test, slow] = armed_after_each(tool_window(0));
    assert!((1.0..=1.01).contains(&read), "{read}");
    assert!((1.0..=1.01).contains(&test), "tools not told apart: {test}");
    assert!((1.0..=1.01).contains(&slow), "{slow}");
    // Told apart: `test` calls are all back within 4 s, which pays; `slow` calls never are
    // within 10 s, but their hold is not cut below the rank's.
    let [read, test, slow] = armed_after_each(tool_window(5));
    assert!((1.0..=1.01).contains(&read), "{read}");
    assert!((4.0..=4.01).contains(&test), "{test}");
    assert!((1.0..=1.01).contains(&slow), "never shorter: {slow}");
    assert_eq!(
        ProgramSchedulingConfig::default().tool_ttl_min_samples,
        50,
        "on by default"
    );
}

#[test]
fn a_request_past_its_deadline_stops_the_lengthening() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 8.0,
        force_resume_timeout_seconds: 5.0,
        tool_ttl_min_samples: 2,
        stats_window_size: 4,
        max_acting_ttl_seconds: 10.0,
        acting_ttl_cost: ActingTtlCost::Seconds,
        ..cfg()
    };
    let mut s = held_by_acting(c);
    for _ in 0..4 {
        s.ranks[0].intervals.push(30.0);
    }
    let test = s.tools.label("test");
    for _ in 0..2 {
        s.tools.push(test.expect("kept"), 2.0);
    }
    // A miss on 20k tokens costs more than the 2 s the `test` evidence asks to hold.
    assert_eq!(s.fitted_ttl_after(0, 20_000, 1.0, None), 0.0, "rank alone");
    let lengthened = s.fitted_ttl_after(0, 20_000, 1.0, test);
    assert!((2.0..=2.01).contains(&lengthened), "{lengthened}");
    // "b" cannot fit beside "a" and waits; forced at 6 s, the tool no longer lengthens holds.
    s.on_arrival(1.0, arrival(2, "b", 900));
    assert!(
        s.fitted_ttl_after(0, 20_000, 3.0, test) > 0.0,
        "not yet forced"
    );
    assert!(s.on_tick(6.5).is_empty(), "forced, still no room");
    assert_eq!(s.fitted_ttl_after(0, 20_000, 6.5, test), 0.0);
}

#[test]
fn tool_names_past_the_cap_go_unlabeled_and_are_counted() {
    let mut s = sched(
        ProgramSchedulingConfig {
            max_tools: 2,
            ..tool_window(5)
        },
        1,
    );
    for (ticket, name) in [(1, "a"), (2, "b"), (3, "c"), (4, "a")] {
        s.on_arrival(f64::from(ticket as u32), arrival(ticket, "p", 100));
        s.on_complete_with_tool(
            f64::from(ticket as u32) + 0.5,
            ticket,
            usage(100, 1),
            ToolCall::Named(name),
        );
    }
    let shed: Vec<_> = s
        .take_notes()
        .into_iter()
        .filter_map(|n| match n {
            Note::Shed { reason } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(shed, ["tool_unlabeled"], "only `c` was refused");
    assert_eq!(s.tools.len(), 2);
    // Off, names are not even kept.
    let mut off = sched(tool_window(0), 1);
    off.on_arrival(0.0, arrival(1, "p", 100));
    off.on_complete_with_tool(0.5, 1, usage(100, 1), ToolCall::Named("a"));
    assert_eq!(off.tools.len(), 0);
}
