//! Cross-rank resume (`global_queue`): headroom and the break-even wait.

use super::*;

/// Two ranks of 1000 tokens, one Program each; rank 1 frees up while "c" (about 510 tokens with
/// its estimate) waits on full rank 0. Returns the decisions of rank 1's completion.
fn cross_rank_case(headroom: f64) -> (Vec<Decision>, Scheduler) {
    let c = ProgramSchedulingConfig {
        global_queue: true,
        cross_rank_headroom_ratio: headroom,
        binding_strategy: BindingStrategy::LeastProgramCount,
        ..cfg()
    };
    let mut s = sched(c, 2);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 900), 100.0));
    s.on_arrival(0.0, arrival(2, "b", 900));
    s.on_complete(1.0, 1, usage(900, 10));
    assert!(dispatched(&s.on_arrival(2.0, arrival(3, "c", 500))).is_empty());
    let d = s.on_complete(3.0, 2, usage(900, 10));
    (d, s)
}

#[test]
fn the_default_headroom_does_not_move_a_program_unless_the_destination_has_room_to_spare() {
    // Free 1000 on rank 1 against ~90 on rank 0: 1.2 × demand fits, 3 × demand does not — c
    // stays for its own rank (and its cache) rather than trading one full queue for another.
    assert_eq!(
        ProgramSchedulingConfig::default().cross_rank_headroom_ratio,
        3.0
    );
    let (d, s) = cross_rank_case(3.0);
    assert!(dispatched(&d).is_empty(), "{d:?}");
    assert_eq!(s.counters.cross_rank_migrations, 0);
    s.check_invariants().expect("ledger");
}

#[test]
fn global_queue_moves_a_waiting_program_to_a_rank_with_headroom() {
    let (d, s) = cross_rank_case(1.2);
    assert_eq!(d, vec![Decision::Dispatch { ticket: 3, rank: 1 }]);
    assert_eq!(s.counters.cross_rank_migrations, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_break_even_wait_keeps_a_returning_program_home_until_the_wait_is_worth_the_move() {
    // Re-prefilling c's 310-token context costs 3.1 s (10 s per 1k tokens, alpha 1): with
    // `cross_rank_min_wait_ratio` 1 it moves only once it has waited that long; with 0 (the
    // spec) as soon as the other rank has room.
    let run = |ratio: Option<f64>| {
        let c = ProgramSchedulingConfig {
            global_queue: true,
            cross_rank_headroom_ratio: 1.2,
            cross_rank_min_wait_ratio: ratio,
            binding_strategy: BindingStrategy::LeastProgramCount,
            prefill_cost_model: PrefillCostModel {
                intercept_seconds: 0.0,
                linear_seconds_per_1k_tokens: 10.0,
                quadratic_seconds_per_1k_tokens_squared: 0.0,
                decode_throughput_alpha: 1.0,
            },
            ..cfg()
        };
        let mut s = sched(c, 2);
        assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "c", 300))), [1]);
        s.on_complete(0.5, 1, usage(300, 10));
        assert_eq!(dispatched(&s.on_arrival(0.6, arrival(2, "b", 900))), [2]);
        let a = with_ttl(arrival(3, "a", 900), 100.0);
        assert_eq!(dispatched(&s.on_arrival(0.7, a)), [3]);
        s.on_complete(1.0, 3, usage(900, 10));
        // c returns to its full rank 0 (a holds it); rank 1 frees up at 3.0.
        assert!(dispatched(&s.on_arrival(2.0, arrival(4, "c", 320))).is_empty());
        let at_3 = s.on_complete(3.0, 2, usage(900, 10));
        let at_5 = s.on_observation(5.5, 1, Observation::default());
        s.check_invariants().expect("ledger");
        (at_3, at_5, s.counters.cross_rank_migrations)
    };
    let (at_3, at_5, moves) = run(Some(0.0));
    assert_eq!(at_3, vec![Decision::Dispatch { ticket: 4, rank: 1 }]);
    assert!(at_5.is_empty() && moves == 1);
    let (at_3, at_5, moves) = run(Some(1.0));
    assert!(dispatched(&at_3).is_empty(), "waited 1 s of 3.1: {at_3:?}");
    assert_eq!(at_5, vec![Decision::Dispatch { ticket: 4, rank: 1 }]);
    assert_eq!(moves, 1);
    // Null, even on two ranks: the break-even wait.
    assert_eq!(run(None), (at_3, at_5, moves));
}

#[test]
fn a_null_min_wait_ratio_waits_to_break_even_at_every_cluster_size() {
    let ratio = |k: Option<f64>, ranks: usize| {
        let c = ProgramSchedulingConfig {
            cross_rank_min_wait_ratio: k,
            ..cfg()
        };
        sched(c, ranks).min_wait_ratio()
    };
    for ranks in [1, 2, 4, 8, 16, 64] {
        assert_eq!(ratio(None, ranks), 1.0, "{ranks} ranks");
    }
    assert_eq!(
        ratio(Some(0.0), 4),
        0.0,
        "an explicit 0 is the spec's move at once"
    );
    assert_eq!(ratio(Some(2.5), 64), 2.5);
}

/// Issue 32, bug 3: cross-rank resume moves Program "p"'s first waiting request to the rank that
/// freed up; its second, queued behind it on the full rank, goes with it. Then "p" completes
/// into a tool call with its TTL, and its next request finds it holding its place: dispatched at
/// once, with no pause and no `ttl_expired`.
#[test]
fn an_acting_program_is_not_paused_by_its_own_next_request() {
    let c = ProgramSchedulingConfig {
        global_queue: true,
        cross_rank_headroom_ratio: 1.2,
        cross_rank_min_wait_ratio: Some(0.0),
        binding_strategy: BindingStrategy::LeastProgramCount,
        ..cfg()
    };
    let mut s = sched(c, 2);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 900), 100.0));
    s.on_arrival(0.0, arrival(2, "b", 900));
    s.on_complete(1.0, 1, usage(900, 10));
    let full = find(&s, "a").rank;
    assert!(dispatched(&s.on_arrival(2.0, with_ttl(arrival(3, "p", 200), 100.0))).is_empty());
    assert!(dispatched(&s.on_arrival(2.1, with_ttl(arrival(4, "p", 200), 100.0))).is_empty());
    let p_rank = find(&s, "p").rank;
    // "b" ends: its rank is free, and "p" moves there with both of its requests.
    let d = s.on_complete(3.0, 2, usage(900, 10));
    let mut moved = dispatched(&d);
    moved.sort();
    assert_eq!(
        moved,
        vec![3, 4],
        "{d:?} (p waited on rank {p_rank}, a holds {full})"
    );
    s.check_invariants().expect("ledger");
    s.on_complete(4.0, 3, usage(200, 10));
    s.on_complete(4.0, 4, usage(200, 10));
    let reserved = find(&s, "p").reserved;
    let expired = s.counters.pauses.get("ttl_expired").copied();
    s.take_notes();
    let d = s.on_arrival(5.0, arrival(5, "p", 250));
    assert_eq!(dispatched(&d), vec![5], "{d:?}");
    let notes = s.take_notes();
    assert!(
        !notes.iter().any(|n| matches!(n, Note::Pause { .. })),
        "{notes:?}"
    );
    assert_eq!(s.counters.pauses.get("ttl_expired").copied(), expired);
    assert!(find(&s, "p").reserved >= reserved);
    s.check_invariants().expect("ledger");
}

/// The spec's resume order holds across ranks too: forced first, then higher priority, and FCFS
/// only within a tier — an older head does not beat a higher-priority one from another rank.
#[test]
fn cross_rank_resume_takes_the_higher_priority_head_before_the_older_one() {
    let c = ProgramSchedulingConfig {
        global_queue: true,
        cross_rank_headroom_ratio: 1.2,
        cross_rank_min_wait_ratio: Some(0.0),
        ..cfg()
    };
    let mut s = sched(c, 3);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 900), 100.0));
    s.on_arrival(0.0, with_ttl(arrival(2, "b", 900), 100.0));
    s.on_arrival(0.0, arrival(3, "c", 900));
    s.on_complete(0.5, 1, usage(900, 10));
    s.on_complete(0.5, 2, usage(900, 10));
    assert!(dispatched(&s.on_arrival(1.0, arrival(4, "old", 550))).is_empty());
    let urgent = with(arrival(5, "urgent", 550), |i| i.priority = 5);
    assert!(dispatched(&s.on_arrival(2.0, urgent)).is_empty());
    let (c_rank, old_rank, urgent_rank) = (
        find(&s, "c").rank,
        find(&s, "old").rank,
        find(&s, "urgent").rank,
    );
    assert!(
        old_rank != urgent_rank && c_rank != old_rank && c_rank != urgent_rank,
        "each waits on its own full rank: {c_rank} {old_rank} {urgent_rank}"
    );
    // "c" ends without a TTL: its rank is free and takes the urgent head first.
    let d = s.on_complete(3.0, 3, usage(900, 10));
    assert_eq!(dispatched(&d), vec![5], "{d:?}");
    assert_eq!(rank_of(&d, 5), Some(c_rank), "{d:?}");
    s.check_invariants().expect("ledger");
}
