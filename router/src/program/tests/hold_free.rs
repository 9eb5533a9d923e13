//! Hold-free slack: on a rank where none of the latest resumed Programs held its place, a queued
//! request is admitted once all but `hold_free_admission_slack_ratio` of its demand fits; one
//! held resume in the window, or a ratio of 0, keeps admission within the ledger.

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
    let mut s = sched(c, 1);
    let mut t = 0.0;
    for (i, name) in ["p", "q", "r", "s"].into_iter().enumerate() {
        let ttl = if i < held { 100.0 } else { 0.0 };
        let first = 10 + 2 * i as u64;
        assert_eq!(
            dispatched(&s.on_arrival(t, with_ttl(arrival(first, name, 100), ttl))),
            [first]
        );
        s.on_complete(t + 1.0, first, usage(100, 10));
        assert_eq!(
            dispatched(&s.on_arrival(t + 60.0, with_ttl(arrival(first + 1, name, 130), 0.0))),
            [first + 1]
        );
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
