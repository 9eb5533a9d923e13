//! Binding strategies and `binding_only`.

use super::*;

#[test]
fn binding_only_dispatches_everything_to_the_home_rank() {
    let mut s = sched(
        ProgramSchedulingConfig {
            binding_only: true,
            ..cfg()
        },
        3,
    );
    let mut homes = Vec::new();
    for t in 0..10 {
        let d = s.on_arrival(t as f64, arrival(t, "same", 5000));
        let Decision::Dispatch { rank, .. } = d[0] else {
            panic!("dispatch")
        };
        homes.push(rank);
    }
    assert!(homes.windows(2).all(|w| w[0] == w[1]), "{homes:?}");
    assert_eq!(s.retained_requests(), 0);
}

#[test]
fn cache_aware_binding_follows_a_shared_prefix_within_the_balance_slack() {
    use crate::policies::prefix_index::PrefixIndex;
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::CacheAware,
        token_capacity_per_dp_rank: Some(100_000),
        ..cfg()
    };
    let mut s = sched(c, 3);
    // Same 4 KiB system prompt, then a task of its own.
    let prompt = |task: &str| {
        let mut p = vec![b's'; 4096];
        p.extend_from_slice(format!("task {task}").as_bytes());
        PrefixIndex::chain(&p)
    };
    let with_prefix = |t, name: &str| Arrival {
        prefix: prompt(name),
        ..arrival(t, name, 1000)
    };
    let ranks: Vec<Rank> = (1..=4)
        .map(|t| {
            rank_of(&s.on_arrival(0.0, with_prefix(t, &format!("p{t}"))), t).expect("dispatched")
        })
        .collect();
    // The first lands on the least loaded rank; the next two follow its cached system prompt;
    // the fourth would make that rank 3 Programs busier than the idle ones: balance wins.
    assert_eq!(&ranks[..3], &[ranks[0]; 3], "{ranks:?}");
    assert_ne!(ranks[3], ranks[0], "{ranks:?}");
    // Without a prompt chain: the least loaded rank by reserved tokens.
    let free = rank_of(&s.on_arrival(0.0, arrival(9, "plain", 10)), 9).expect("dispatched");
    assert!(free != ranks[0] && free != ranks[3], "{free} {ranks:?}");
    s.check_invariants().expect("ledger");
}

#[test]
fn binding_only_balances_bound_programs_and_forgets_idle_ones() {
    let c = ProgramSchedulingConfig {
        binding_only: true,
        binding_strategy: BindingStrategy::LeastProgramCount,
        paused_retention_ttl_seconds: 60.0,
        ..cfg()
    };
    let mut s = sched(c, 2);
    // Nobody is ever active in binding_only: bound Programs are what least_program_count counts.
    let r1 = rank_of(&s.on_arrival(0.0, arrival(1, "a", 10)), 1).expect("dispatched");
    s.on_complete(1.0, 1, usage(10, 1));
    let r2 = rank_of(&s.on_arrival(2.0, arrival(2, "b", 10)), 2).expect("dispatched");
    assert_ne!(r1, r2, "the second Program goes to the other rank");
    s.on_cancel(3.0, 2);
    // Both are forgotten after the retention; a returning "a" binds afresh.
    s.on_tick(70.0);
    assert!(
        s.programs.iter().flatten().next().is_none(),
        "bindings released"
    );
    s.check_invariants().expect("ledger");
}

#[test]
fn least_program_count_spreads_a_burst_of_new_programs() {
    // One rank's worth of capacity per Program: the burst queues, and must not all queue on
    // the same idle rank.
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::LeastProgramCount,
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let mut s = sched(c, 2);
    for t in 1..=6 {
        s.on_arrival(0.0, arrival(t, &format!("p{t}"), 10));
    }
    assert_eq!(s.ranks[0].active_programs + s.ranks[1].active_programs, 2);
    assert_eq!(s.ranks[0].queue.len(), 2);
    assert_eq!(s.ranks[1].queue.len(), 2);
}

#[test]
fn least_program_count_does_not_count_finished_programs() {
    for binding_only in [false, true] {
        let c = ProgramSchedulingConfig {
            binding_only,
            binding_strategy: BindingStrategy::LeastProgramCount,
            ..cfg()
        };
        let mut s = sched(c, 2);
        let last = |t, p: &str| with(arrival(t, p, 10), |i| i.expected_resume = false);
        assert_eq!(rank_of(&s.on_arrival(0.0, last(1, "done1")), 1), Some(0));
        assert_eq!(
            rank_of(&s.on_arrival(0.1, arrival(2, "live", 10)), 2),
            Some(1)
        );
        assert_eq!(rank_of(&s.on_arrival(0.2, last(3, "done2")), 3), Some(0));
        for t in 1..=3 {
            s.on_complete(1.0, t, usage(10, 1));
        }
        assert_eq!((s.ranks[0].finished, s.ranks[1].finished), (2, 0));
        // Rank 0 holds two finished Programs, rank 1 one that will be back after its tool
        // call: the new Program goes where nothing live is bound.
        assert_eq!(
            rank_of(&s.on_arrival(2.0, arrival(4, "new", 10)), 4),
            Some(0),
            "binding_only: {binding_only}"
        );
        // A finished Program that comes back anyway still finds its rank.
        assert_eq!(
            rank_of(&s.on_arrival(3.0, arrival(5, "done1", 10)), 5),
            Some(0)
        );
        assert_eq!(s.ranks[0].finished, 1, "done1 is live again");
        s.check_invariants().expect("ledger");
        // Forgotten after the paused retention, finished or not.
        s.on_complete(4.0, 4, usage(10, 1));
        s.on_complete(4.0, 5, usage(10, 1));
        s.on_tick(4.0 + cfg().paused_retention_ttl_seconds + 1.0);
        assert!(s.programs.iter().flatten().next().is_none());
        assert_eq!((s.ranks[0].finished, s.ranks[1].finished), (0, 0));
    }
}

/// A request of a client that never says `expected_resume: false`, asking for no acting TTL
/// (so its completion pauses the Program).
fn header_turn(ticket: Ticket, program: &str) -> Arrival {
    with_ttl(arrival(ticket, program, 10), 0.0)
}

/// One rank; Program "a" served twice (one 1 s interval, the evidence `ttl_min_samples: 1`
/// needs) and paused at 3 s, so it is presumed finished from 4 s.
fn idle_a_from_3s_with_a_1s_horizon(c: ProgramSchedulingConfig) -> Scheduler {
    let mut s = sched(c, 1);
    s.on_arrival(0.0, header_turn(1, "a"));
    s.on_complete(1.0, 1, usage(10, 1));
    s.on_arrival(2.0, header_turn(2, "a"));
    s.on_complete(3.0, 2, usage(20, 1));
    s
}

#[test]
fn a_program_idle_past_the_longest_interval_is_presumed_finished() {
    for ratio in [0.0, 1.0] {
        let c = ProgramSchedulingConfig {
            binding_strategy: BindingStrategy::LeastProgramCount,
            ttl_min_samples: Some(2),
            finished_idle_ratio: ratio,
            ..cfg()
        };
        let mut s = sched(c, 2);
        // Header-only clients: every request expects a next one; each asks for no acting TTL,
        // so each completion pauses its Program.
        let turn = header_turn;
        let ra = rank_of(&s.on_arrival(0.0, turn(1, "a")), 1).expect("dispatched");
        let rb = rank_of(&s.on_arrival(0.0, turn(2, "b")), 2).expect("dispatched");
        assert_ne!(ra, rb);
        s.on_complete(1.0, 1, usage(10, 1));
        s.on_complete(1.0, 2, usage(10, 1));
        // Two intervals (2 s and 5 s) mature the evidence: the horizon is 5 s × ratio.
        s.on_arrival(3.0, turn(3, "a"));
        s.on_arrival(6.0, turn(4, "b"));
        s.on_complete(7.0, 3, usage(20, 1));
        s.on_complete(7.5, 4, usage(20, 1));
        s.on_tick(11.9);
        assert_eq!((s.ranks[ra].finished, s.ranks[rb].finished), (0, 0));
        s.take_notes();
        s.on_tick(12.2);
        let noted: Vec<Note> = s
            .take_notes()
            .into_iter()
            .filter(|n| matches!(n, Note::IdleFinish { .. }))
            .collect();
        if ratio == 0.0 {
            assert_eq!((s.ranks[ra].finished, s.ranks[rb].finished), (0, 0));
            assert_eq!(s.counters.idle_finishes, 0);
            assert!(noted.is_empty());
            continue;
        }
        // "a" has idled 5.2 s, longer than any interval seen; "b" 4.7 s.
        assert_eq!((s.ranks[ra].finished, s.ranks[rb].finished), (1, 0));
        assert_eq!(
            noted,
            [Note::IdleFinish {
                program: "a".into(),
                rank: ra
            }]
        );
        assert!(find(&s, "a").finished && !find(&s, "b").finished);
        // A new Program goes where nothing live is bound.
        assert_eq!(rank_of(&s.on_arrival(12.2, turn(5, "c")), 5), Some(ra));
        // "b" returns before its horizon: the timer armed at its pause no longer counts, and
        // the one armed at its next pause (at 12.6) runs 5 s from there.
        s.on_arrival(12.4, turn(6, "b"));
        s.on_complete(12.6, 6, usage(30, 1));
        s.on_tick(17.5);
        assert!(!find(&s, "b").finished);
        s.on_tick(17.7);
        assert!(find(&s, "b").finished);
        assert_eq!(s.counters.idle_finishes, 2);
        // A presumed-finished Program that returns is live again, on its rank.
        assert_eq!(rank_of(&s.on_arrival(20.0, turn(7, "a")), 7), Some(ra));
        assert!(!find(&s, "a").finished);
        s.check_invariants().expect("ledger");
    }
}

#[test]
fn a_program_with_a_queued_request_is_never_presumed_finished() {
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::LeastProgramCount,
        ttl_min_samples: Some(1),
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let mut s = idle_a_from_3s_with_a_1s_horizon(c);
    // "b" takes the only place and "a" queues behind it.
    assert_eq!(rank_of(&s.on_arrival(3.5, header_turn(3, "b")), 3), Some(0));
    assert!(dispatched(&s.on_arrival(3.6, header_turn(4, "a"))).is_empty());
    s.on_tick(10.0);
    assert!(!find(&s, "a").finished, "waiting for admission is not idle");
    assert_eq!(s.counters.idle_finishes, 0);
    s.check_invariants().expect("ledger");
}

/// [`idle_a_from_3s_with_a_1s_horizon`] with `finished_idle_ratio` `from`, reloaded at 3.5 s
/// with `to` (the timer armed at the pause, if any, is due at 4 s).
fn idle_a_reloaded(from: f64, to: f64) -> Scheduler {
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::LeastProgramCount,
        ttl_min_samples: Some(1),
        finished_idle_ratio: from,
        ..cfg()
    };
    let mut s = idle_a_from_3s_with_a_1s_horizon(c.clone());
    let reloaded = ProgramSchedulingConfig {
        finished_idle_ratio: to,
        ..c
    };
    s.reconfigure(3.5, &reloaded).expect("a tuning change");
    s
}

#[test]
fn turning_the_idle_rule_off_by_reload_stops_timers_already_armed() {
    let mut s = idle_a_reloaded(1.0, 0.0);
    s.on_tick(10.0);
    assert!(!find(&s, "a").finished);
    assert_eq!(s.counters.idle_finishes, 0);
}

#[test]
fn a_program_paused_before_the_evidence_matured_is_presumed_finished_once_it_has() {
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::LeastProgramCount,
        ttl_min_samples: Some(2),
        ..cfg()
    };
    let mut s = sched(c, 1);
    // "a" is served once and paused at 1 s, when no interval has been observed yet.
    s.on_arrival(0.0, header_turn(1, "a"));
    s.on_complete(1.0, 1, usage(10, 1));
    // "b" supplies the evidence: intervals of 2 s (at 3 s) and 1 s (at 5 s, the second sample).
    s.on_arrival(0.0, header_turn(2, "b"));
    s.on_complete(1.0, 2, usage(10, 1));
    s.on_arrival(3.0, header_turn(3, "b"));
    s.on_complete(4.0, 3, usage(20, 1));
    s.on_tick(4.9);
    assert!(
        !find(&s, "a").finished,
        "no horizon before the evidence has its samples"
    );
    s.on_arrival(5.0, header_turn(4, "b"));
    // "a" has been idle 4 s by then, past the 2 s horizon.
    s.on_tick(5.0);
    assert!(find(&s, "a").finished);
    assert_eq!((s.ranks[0].finished, s.counters.idle_finishes), (1, 1));
    // "b" was mid-request when the evidence matured; it pauses at 6 s and is due at 8 s.
    s.on_complete(6.0, 4, usage(30, 1));
    s.on_tick(7.9);
    assert!(!find(&s, "b").finished);
    s.on_tick(8.1);
    assert!(find(&s, "b").finished);
    assert_eq!(s.counters.idle_finishes, 2);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_reload_that_turns_the_idle_rule_on_reaches_programs_already_paused() {
    // Paused at 3 s with the rule off (no timer), turned on at 3.5 s: due at 4 s.
    let mut s = idle_a_reloaded(0.0, 1.0);
    s.on_tick(3.9);
    assert!(!find(&s, "a").finished);
    s.on_tick(4.1);
    assert!(find(&s, "a").finished);
    assert_eq!(s.counters.idle_finishes, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_reload_that_raises_the_idle_ratio_defers_timers_already_armed() {
    // Armed for 4 s at the pause; at 3.5 s the ratio becomes 3: due at 6 s.
    let mut s = idle_a_reloaded(1.0, 3.0);
    s.on_tick(5.9);
    assert!(
        !find(&s, "a").finished,
        "the timer armed for 4 s reads the new ratio"
    );
    s.on_tick(6.1);
    assert!(find(&s, "a").finished);
    // Two timers were armed (at the pause and at the reload); the Program is counted once.
    assert_eq!(s.counters.idle_finishes, 1);
    s.check_invariants().expect("ledger");
}

/// The spec's `consistent_hash` binding: a ring with `hash_virtual_nodes` points per rank, so the
/// knob changes where Programs land and more points spread them more evenly.
#[test]
fn consistent_hash_binding_uses_hash_virtual_nodes_points_per_rank() {
    let place = |vnodes: u32| -> Vec<Rank> {
        let c = ProgramSchedulingConfig {
            binding_strategy: BindingStrategy::ConsistentHash,
            hash_virtual_nodes: vnodes,
            token_capacity_per_dp_rank: None,
            ..cfg()
        };
        let mut s = sched(c, 4);
        (0..200u32)
            .map(|i| {
                let name = format!("p{i}");
                s.on_arrival(f64::from(i), arrival(u64::from(i) + 1, &name, 10));
                find(&s, &name).rank
            })
            .collect()
    };
    let ring = crate::hash::Ring::new(["r0", "r1", "r2", "r3"], 160);
    let many = place(160);
    for (i, r) in many.iter().enumerate() {
        let owner = ring.walk(format!("p{i}").as_bytes()).next();
        assert_eq!(Some(*r), owner, "p{i}");
    }
    let one = place(1);
    assert_ne!(many, one, "hash_virtual_nodes is honoured");
    let spread = |v: &[Rank]| {
        let mut n = [0usize; 4];
        v.iter().for_each(|r| n[*r] += 1);
        n.iter().max().copied().unwrap_or(0) - n.iter().min().copied().unwrap_or(0)
    };
    assert!(spread(&many) < 60, "{:?}", spread(&many));
}

/// A rank the data plane cannot reach (failing health checks, open breaker) gets no new
/// Program under any strategy while another rank can take it; with none reachable, binding
/// still picks a rank.
#[test]
fn new_programs_bind_only_to_available_ranks() {
    for strategy in [
        BindingStrategy::ConsistentHash,
        BindingStrategy::ProgramRoundRobin,
        BindingStrategy::LeastProgramCount,
        BindingStrategy::ReasoningTokenBalance,
        BindingStrategy::CacheAware,
    ] {
        let c = ProgramSchedulingConfig {
            binding_strategy: strategy,
            ..cfg()
        };
        let mut s = sched(c, 3);
        s.set_available(0.0, 0, false);
        s.set_available(0.0, 2, false);
        for i in 0..12u32 {
            let name = format!("p{i}");
            s.on_arrival(f64::from(i), arrival(u64::from(i) + 1, &name, 10));
            assert_eq!(find(&s, &name).rank, 1, "{strategy:?} {name}");
        }
        s.set_available(20.0, 1, false);
        s.on_arrival(20.0, arrival(100, "q", 10));
        assert!(find(&s, "q").rank < 3, "{strategy:?}");
        s.check_invariants().expect("ledger");
    }
}

#[test]
fn programs_of_a_rank_that_cannot_be_reached_move_to_one_that_can() {
    let c = ProgramSchedulingConfig {
        binding_strategy: BindingStrategy::ProgramRoundRobin,
        token_capacity_per_dp_rank: Some(1000),
        ..cfg()
    };
    let mut s = sched(c, 2);
    // Everything binds to rank 0 while rank 1 is down.
    s.set_available(0.0, 1, false);
    for (t, name) in [(1, "idle"), (2, "busy"), (3, "waiting")] {
        s.on_arrival(0.0, arrival(t, name, 300));
        assert_eq!(find(&s, name).rank, 0);
    }
    s.on_complete(1.0, 1, usage(300, 10));
    // A request of "waiting" beyond rank 0's capacity is retained there.
    s.on_complete(1.0, 3, usage(300, 10));
    let held = s.on_arrival(1.5, arrival(4, "waiting", 900));
    assert!(dispatched(&held).is_empty(), "{held:?}");
    assert_eq!(s.retained_requests(), 1);
    s.set_available(2.0, 1, true);
    // Rank 0 goes down: idle and waiting Programs move at once, the retained request with
    // them (and is admitted there); the one with a request in flight moves when it ends.
    let moved = s.set_available(3.0, 0, false);
    assert_eq!(find(&s, "idle").rank, 1);
    assert_eq!(find(&s, "waiting").rank, 1);
    assert_eq!(dispatch_rank(&moved, 4), Some(1), "{moved:?}");
    assert_eq!(find(&s, "busy").rank, 0);
    s.check_invariants().expect("ledger");
    s.on_complete(4.0, 2, None);
    assert_eq!(find(&s, "busy").rank, 1);
    s.check_invariants().expect("ledger");
    // Nothing moves while no rank can be reached.
    s.set_available(5.0, 1, false);
    assert_eq!(find(&s, "idle").rank, 1);
    s.check_invariants().expect("ledger");
}
