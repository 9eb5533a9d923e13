//! Adaptive overcommit: grows past the ledger only while the request next in line waits long
//! next to a lost prefix's cost, admits what the ledger alone would not, and resets when a
//! Program comes back to an evicted prefix.

use super::*;
use crate::program::cost::cache_miss_impact_seconds;

/// One observation of rank 0 with nothing waiting in vLLM.
fn observe(s: &mut Scheduler, now: f64) -> Vec<Decision> {
    s.on_observation(now, 0, Observation::default())
}

/// "a" holds 900 of the rank's 1,000 tokens through a 100 s tool call; "b" (200) waits from
/// t = 1. Returns the wait after which the overcommit may grow (the ratio × the miss impact of
/// the rank's mean Program, "a").
fn b_waits_behind_a(c: ProgramSchedulingConfig) -> (Scheduler, f64) {
    // "a" reserves its context, 910 tokens (the tests' config has no decode buffer).
    let threshold =
        c.adaptive_overcommit_wait_ratio * cache_miss_impact_seconds(&c.prefill_cost_model, 910);
    let mut s = held_by_acting(c);
    assert!(dispatched(&s.on_arrival(1.0, arrival(2, "b", 200))).is_empty());
    (s, threshold)
}

#[test]
fn a_long_wait_grows_the_overcommit_until_the_head_fits_past_the_ledger() {
    let (mut s, threshold) = b_waits_behind_a(cfg());
    assert_eq!(find(&s, "a").reserved, 910);
    let mut t = 1.0;
    let mut admitted_at = None;
    while t < 1.0 + threshold + 60.0 {
        t += 1.0;
        if dispatched(&observe(&mut s, t)) == [2] {
            admitted_at = Some(t);
            break;
        }
        if t - 1.0 <= threshold {
            assert_eq!(
                s.overcommit(0),
                0.0,
                "no growth before the wait passes {threshold} s"
            );
        }
    }
    let at = admitted_at.expect("b is admitted past the ledger");
    // 910 + 200 ≤ 1,000 × (1 + overcommit) needs 0.11: eleven or twelve 0.01 steps (rounding)
    // after the threshold.
    assert!(
        at - 1.0 > threshold + 10.0,
        "admitted at {at}, threshold {threshold}"
    );
    let o = s.overcommit(0);
    assert!((0.11 - 1e-9..=0.12 + 1e-9).contains(&o), "{o}");
    s.check_invariants().expect("ledger");
}

#[test]
fn the_overcommit_stops_at_its_maximum_and_is_off_at_zero() {
    let c = ProgramSchedulingConfig {
        adaptive_overcommit_max_ratio: 0.05,
        ..cfg()
    };
    let (mut s, threshold) = b_waits_behind_a(c);
    for i in 0..(threshold as usize + 60) {
        assert!(dispatched(&observe(&mut s, 2.0 + i as f64)).is_empty());
    }
    assert!((s.overcommit(0) - 0.05).abs() < 1e-9, "{}", s.overcommit(0));
    assert_eq!(
        s.retained_requests(),
        1,
        "0.05 never makes room for 1,110 tokens"
    );

    let off = ProgramSchedulingConfig {
        adaptive_overcommit_max_ratio: 0.0,
        ..cfg()
    };
    let (mut s, threshold) = b_waits_behind_a(off);
    for i in 0..(threshold as usize + 60) {
        assert!(dispatched(&observe(&mut s, 2.0 + i as f64)).is_empty());
    }
    assert_eq!(s.overcommit(0), 0.0);
}

#[test]
fn a_short_wait_does_not_grow_the_overcommit() {
    let c = ProgramSchedulingConfig {
        adaptive_overcommit_wait_ratio: 1e6,
        ..cfg()
    };
    let (mut s, _) = b_waits_behind_a(c);
    for i in 0..200 {
        observe(&mut s, 2.0 + f64::from(i));
    }
    assert_eq!(s.overcommit(0), 0.0);
    assert_eq!(s.retained_requests(), 1);
}

/// [`b_waits_behind_a`] observed every second until "b" is admitted past the ledger; then b's
/// first run (160 tokens) ends and, its window immature, it pauses (TTL 0) and frees its KV; b
/// comes back with a short follow-up (ticket 3) that fits at once within the grown share.
/// Returns the scheduler, the time of b's return and the overcommit then.
fn b_returns_after_an_overcommitted_run() -> (Scheduler, f64, f64) {
    let (mut s, threshold) = b_waits_behind_a(cfg());
    let mut t = 1.0;
    while s.retained_requests() > 0 {
        t += 1.0;
        assert!(t < threshold + 100.0, "b was never admitted");
        observe(&mut s, t);
    }
    let grown = s.overcommit(0);
    assert!(grown > 0.0);
    s.on_complete(t + 0.5, 2, usage(150, 10));
    assert_eq!(dispatched(&s.on_arrival(t + 1.0, arrival(3, "b", 40))), [3]);
    (s, t + 1.0, grown)
}

#[test]
fn a_program_back_to_an_evicted_prefix_resets_the_overcommit() {
    let (mut s, t, grown) = b_returns_after_an_overcommitted_run();
    observe(&mut s, t + 0.5);
    assert!(
        (s.overcommit(0) - grown).abs() < 1e-9,
        "nothing waits and nothing was lost yet"
    );
    // None of b's 160 tokens were cached: overcommitting cost a prefix.
    s.on_complete(t + 1.0, 3, usage(200, 10));
    observe(&mut s, t + 2.0);
    assert_eq!(s.overcommit(0), 0.0);
}

#[test]
fn a_program_that_finds_its_prefix_keeps_the_overcommit() {
    let (mut s, t, grown) = b_returns_after_an_overcommitted_run();
    let hit = Some(Usage {
        prompt_tokens: 200,
        completion_tokens: 10,
        cached_tokens: 160,
    });
    s.on_complete(t + 1.0, 3, hit);
    observe(&mut s, t + 2.0);
    assert!((s.overcommit(0) - grown).abs() < 1e-9);
}

/// "c" ran four rounds in one activation (held through 1 s tool calls) before its TTL ran out,
/// then "b" waits behind "a" as in [`b_waits_behind_a`]: the rank's Programs run long
/// activations.
fn b_waits_where_activations_are_long(c: ProgramSchedulingConfig) -> Scheduler {
    let mut s = sched(c, 1);
    let mut t = 0.0;
    for ticket in 10..14 {
        let d = s.on_arrival(t, with_ttl(arrival(ticket, "c", 50), 2.0));
        assert_eq!(dispatched(&d), [ticket], "c keeps its place between rounds");
        s.on_complete(t + 0.5, ticket, usage(50, 10));
        t += 1.5;
    }
    s.on_tick(t + 5.0);
    assert_eq!(s.retained_requests(), 0);
    let t = t + 10.0;
    s.on_arrival(t, with_ttl(arrival(1, "a", 900), 1000.0));
    s.on_complete(t + 0.5, 1, usage(900, 10));
    assert!(dispatched(&s.on_arrival(t + 1.0, arrival(2, "b", 200))).is_empty());
    s
}

#[test]
fn the_overcommit_grows_only_where_activations_are_short() {
    let long_wait = |s: &mut Scheduler| {
        for i in 0..600 {
            observe(s, 30.0 + f64::from(i));
        }
    };
    let mut s = b_waits_where_activations_are_long(cfg());
    long_wait(&mut s);
    assert_eq!(s.overcommit(0), 0.0, "4 rounds per activation > 2.5");
    assert_eq!(s.retained_requests(), 1, "b still waits for room");

    let c = ProgramSchedulingConfig {
        adaptive_overcommit_max_rounds: 4.0,
        ..cfg()
    };
    let mut s = b_waits_where_activations_are_long(c);
    long_wait(&mut s);
    assert!(s.overcommit(0) > 0.0, "4 rounds is within the limit");
    assert_eq!(s.retained_requests(), 0, "b admitted past the ledger");
    s.check_invariants().expect("ledger");
}
