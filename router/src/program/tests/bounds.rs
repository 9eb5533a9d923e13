//! The scheduler's own bounds: the RequestPool's size, the number of Programs held (idle ones
//! make room, oldest first; hand-overs obey it too), timers that outlive a Program's slot, and
//! numbers from clients at the ends of their range.

use super::*;

/// Program `id` completes its only request at `t` and pauses once its 1 s TTL has run out.
fn paused(s: &mut Scheduler, ticket: Ticket, id: &str, t: f64) {
    s.on_arrival(t, with_ttl(arrival(ticket, id, 100), 1.0));
    s.on_complete(t + 0.1, ticket, usage(100, 1));
    s.on_tick(t + 2.0);
    assert!(
        matches!(find(s, id).phase, Phase::Paused { .. }),
        "{id} paused"
    );
}

fn known(s: &Scheduler, id: &str) -> bool {
    s.programs.iter().flatten().any(|p| p.key.1 == id)
}

fn shed(s: &Scheduler, reason: &str) -> usize {
    s.notes
        .iter()
        .filter(|n| matches!(n, Note::Shed { reason: r } if *r == reason))
        .count()
}

#[test]
fn a_full_request_pool_refuses_the_next_request_until_one_leaves() {
    let mut s = held_by_acting(ProgramSchedulingConfig {
        max_retained_requests: 2,
        ..cfg()
    });
    assert!(s.on_arrival(1.0, arrival(2, "b", 900)).is_empty(), "waits");
    assert!(s.on_arrival(1.0, arrival(3, "c", 900)).is_empty(), "waits");
    assert_eq!(
        s.on_arrival(1.0, arrival(4, "d", 900)),
        vec![Decision::Reject {
            ticket: 4,
            reason: RejectReason::PoolFull
        }]
    );
    assert_eq!(shed(&s, "request_pool_full"), 1);
    assert!(!known(&s, "d"), "a refused request leaves nothing behind");
    s.on_cancel(2.0, 2);
    assert!(
        s.on_arrival(2.0, arrival(5, "e", 900)).is_empty(),
        "room again"
    );
    assert_eq!(s.retained_requests(), 2);
    s.check_invariants().expect("ledger");
}

#[test]
fn at_the_program_cap_the_longest_idle_program_makes_room_and_none_idle_refuses() {
    let mut s = sched(
        ProgramSchedulingConfig {
            max_programs: 3,
            ..cfg()
        },
        2,
    );
    paused(&mut s, 1, "old", 0.0);
    paused(&mut s, 2, "newer", 5.0);
    s.on_arrival(10.0, arrival(3, "busy", 100));
    // At the cap: the Program idle longest goes.
    s.on_arrival(11.0, arrival(4, "fresh", 100));
    assert!(!known(&s, "old") && known(&s, "newer") && known(&s, "fresh"));
    assert_eq!(shed(&s, "program_evicted"), 1);
    s.on_arrival(12.0, arrival(5, "fresh-2", 100));
    assert!(!known(&s, "newer"));
    // Nothing idle left: refused, and a hand-over is not taken either.
    assert_eq!(
        s.on_arrival(13.0, arrival(6, "one-more", 100)),
        vec![Decision::Reject {
            ticket: 6,
            reason: RejectReason::ProgramsFull
        }]
    );
    assert_eq!(shed(&s, "programs_full"), 1);
    let handed = HandedOver {
        model: "m".into(),
        program_id: "moved".into(),
        root: "moved".into(),
        target: "r0".into(),
        context_tokens: 10,
        idle_seconds: 1.0,
        finished: false,
        called_tool: false,
    };
    assert_eq!(s.adopt(13.0, std::slice::from_ref(&handed)), 0);
    // A known Program's next request is never refused by the cap.
    s.on_complete(14.0, 3, usage(100, 1));
    assert!(!dispatched(&s.on_arrival(14.5, arrival(7, "busy", 100))).is_empty());
    s.check_invariants().expect("ledger");
}

#[test]
fn a_timer_of_a_removed_program_never_fires_on_the_next_one_in_its_slot() {
    let mut s = sched(
        ProgramSchedulingConfig {
            binding_only: true,
            paused_retention_ttl_seconds: 10.0,
            ..cfg()
        },
        1,
    );
    s.on_arrival(0.0, arrival(1, "x", 10));
    s.on_complete(1.0, 1, usage(10, 1));
    // x's release timer is due at 11 s; x leaves at 2 s and y takes its slot.
    let (given, _) = s.hand_over(2.0, &("m".to_string(), "x".to_string()));
    assert!(given.is_some());
    s.on_arrival(3.0, arrival(2, "y", 10));
    s.on_complete(4.0, 2, usage(10, 1));
    s.on_tick(12.0);
    assert!(known(&s, "y"), "y keeps its binding until its own 14 s");
    s.on_tick(14.5);
    assert!(!known(&s, "y"));
}

#[test]
fn the_lowest_priority_a_client_can_send_queues_without_overflow() {
    let mut s = held_by_acting(cfg());
    for (t, p) in [(2, i64::MIN), (3, i64::MAX), (4, 0)] {
        s.on_arrival(
            1.0,
            with(arrival(t, &format!("p{t}"), 900), |i| i.priority = p),
        );
    }
    assert_eq!(s.retained_requests(), 3);
    s.check_invariants().expect("ledger");
}

/// One event with values from the whole range a client, a backend or a peer can send.
#[derive(Debug, Clone)]
enum Extreme {
    Arrive {
        program: u8,
        prompt: u64,
        priority: i64,
        output: Option<u64>,
        deadline: Option<f64>,
        ttl: Option<f64>,
    },
    Complete {
        pick: u8,
        usage: (u64, u64, u64),
    },
    Observe {
        rank: u8,
        values: (f64, f64, f64),
        capacity: Option<u64>,
    },
    Adopt {
        program: u8,
        context: u64,
        idle: f64,
    },
    Tick {
        dt: u8,
    },
}

fn any_f64() -> impl proptest::strategy::Strategy<Value = f64> {
    use proptest::prelude::*;
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-1.0),
        Just(f64::MAX),
        any::<f64>(),
        0.0..10.0f64,
    ]
}

/// Finite, non-negative seconds (the identity parser refuses anything else), up to f64::MAX.
fn seconds() -> impl proptest::strategy::Strategy<Value = f64> {
    use proptest::prelude::*;
    prop_oneof![Just(0.0), Just(f64::MAX), 0.0..1e300f64, 0.0..100.0f64]
}

fn extreme() -> impl proptest::strategy::Strategy<Value = Extreme> {
    use proptest::prelude::*;
    let big = || prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>(), 0u64..2000];
    prop_oneof![
        (
            0u8..8,
            big(),
            prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>()],
            proptest::option::of(big()),
            proptest::option::of(seconds()),
            proptest::option::of(seconds()),
        )
            .prop_map(|(program, prompt, priority, output, deadline, ttl)| {
                Extreme::Arrive {
                    program,
                    prompt,
                    priority,
                    output,
                    deadline,
                    ttl,
                }
            }),
        (any::<u8>(), (big(), big(), big()))
            .prop_map(|(pick, usage)| Extreme::Complete { pick, usage }),
        (
            0u8..2,
            (any_f64(), any_f64(), any_f64()),
            proptest::option::of(big())
        )
            .prop_map(|(rank, values, capacity)| Extreme::Observe {
                rank,
                values,
                capacity
            }),
        (0u8..8, big(), seconds()).prop_map(|(program, context, idle)| Extreme::Adopt {
            program,
            context,
            idle
        }),
        (0u8..60).prop_map(|dt| Extreme::Tick { dt }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 300, ..Default::default() })]

    /// No value from outside makes the scheduler panic (debug builds check every overflow) or
    /// breaks its ledger, with the bounds small enough to be hit.
    #[test]
    fn numbers_from_outside_at_their_extremes_keep_the_ledger(
        events in proptest::collection::vec(extreme(), 1..80),
        capacity in proptest::option::of(proptest::prelude::prop_oneof![
            proptest::strategy::Just(u64::MAX), 1u64..5000]),
    ) {
        let mut s = sched(
            ProgramSchedulingConfig {
                token_capacity_per_dp_rank: capacity,
                max_retained_requests: 4,
                max_programs: 5,
                ..cfg()
            },
            2,
        );
        let (mut now, mut next, mut in_flight) = (0.0, 0u64, Vec::new());
        for e in &events {
            let d = match e {
                Extreme::Arrive { program, prompt, priority, output, deadline, ttl } => {
                    next += 1;
                    let mut a = arrival(next, &format!("p{program}"), *prompt);
                    a.identity.priority = *priority;
                    a.identity.expected_output_length = *output;
                    a.identity.deadline_seconds = *deadline;
                    a.identity.kv_retention_ttl_seconds = *ttl;
                    s.on_arrival(now, a)
                }
                Extreme::Complete { pick, usage: (p, c, cached) } if !in_flight.is_empty() => {
                    let t = in_flight.remove(*pick as usize % in_flight.len());
                    let u = Usage { prompt_tokens: *p, completion_tokens: *c, cached_tokens: *cached };
                    s.on_complete(now, t, Some(u))
                }
                Extreme::Complete { .. } => continue,
                Extreme::Observe { rank, values: (w, r, kv), capacity } => s.on_observation(
                    now,
                    *rank as usize,
                    Observation { waiting: *w, running: *r, kv_usage: *kv, token_capacity: *capacity },
                ),
                Extreme::Adopt { program, context, idle } => {
                    let h = HandedOver {
                        model: "m".into(),
                        program_id: format!("p{program}"),
                        root: format!("p{program}"),
                        target: "r0".into(),
                        context_tokens: *context,
                        idle_seconds: *idle,
                        finished: false,
                        called_tool: false,
                    };
                    s.adopt(now, std::slice::from_ref(&h));
                    Vec::new()
                }
                Extreme::Tick { dt } => {
                    now += f64::from(*dt);
                    s.on_tick(now)
                }
            };
            for x in d {
                if let Decision::Dispatch { ticket, .. } = x {
                    in_flight.push(ticket);
                }
            }
            s.check_invariants().map_err(proptest::test_runner::TestCaseError::fail)?;
        }
    }
}

#[test]
fn timers_of_requests_long_admitted_do_not_pile_up() {
    // Every new Program passes through the RequestPool (two timers each, due after the queue
    // timeout) and is admitted at once; those timers can no longer act.
    let mut s = sched(cfg(), 2);
    for i in 0..20_000u64 {
        let t = i as f64 * 0.001;
        s.on_arrival(t, arrival(i, &format!("p{}", i % 5000), 10));
        s.on_complete(t, i, usage(10, 1));
    }
    assert!(
        s.pending_timers() < 4 * timers_bound(&s),
        "{} timers pending",
        s.pending_timers()
    );
    s.check_invariants().expect("ledger");
}

#[test]
fn timers_of_a_burst_that_left_are_swept_without_new_arrivals() {
    // A burst of short Programs, then silence: once the paused retention has forgotten them,
    // the timers they left behind (queue timeouts far in the future) go with them on a tick,
    // not when each would have fired.
    let mut s = sched(
        ProgramSchedulingConfig {
            paused_retention_ttl_seconds: 5.0,
            ..cfg()
        },
        2,
    );
    for i in 0..20_000u64 {
        let t = i as f64 * 0.001;
        s.on_arrival(t, arrival(i, &format!("p{i}"), 10));
        s.on_complete(t, i, usage(10, 1));
    }
    let mut now = 20.0;
    while now < 40.0 {
        now += 0.5;
        s.on_tick(now);
    }
    assert_eq!(s.programs.iter().flatten().count(), 0, "retention passed");
    assert!(
        s.pending_timers() <= 1024,
        "{} timers pending with nothing left to act on",
        s.pending_timers()
    );
    s.check_invariants().expect("ledger");
}

/// What may legitimately be pending: two per waiting request and a few per Program.
fn timers_bound(s: &Scheduler) -> usize {
    (2 * s.retained_requests() + 3 * s.programs.iter().flatten().count()).max(1024)
}
