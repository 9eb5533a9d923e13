//! A property test over random event sequences: the scheduler's invariants hold after every
//! event.

use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Ev {
    Arrive {
        program: u8,
        prompt: u16,
        ttl: Option<u8>,
        priority: i8,
        /// The Program's last request (`expected_resume: false`).
        last: bool,
    },
    Complete {
        pick: u8,
        growth: u16,
    },
    Cancel {
        pick: u8,
    },
    Observe {
        rank: u8,
        waiting: u8,
    },
    Tick {
        dt: u8,
    },
    /// A rank's reachability changes (health checks, circuit breaker); its Programs move off it
    /// with their queued requests when it goes down (`rank` modulo the ranks there are).
    Available {
        rank: u8,
        up: bool,
    },
    /// A reload: the ids whose bit is set in `mask` (of r0..r4, never none), rotated.
    Retarget {
        mask: u8,
        rotate: u8,
    },
    /// A tuning reload: capacity (none, 300, 1,000 or 3,000 tokens), Program cap,
    /// cross-rank resume, resume order and binding strategy change; the state carries over.
    Reconfigure {
        capacity: u8,
        programs: u8,
        global: bool,
        order: u8,
        binding: u8,
    },
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (
            0u8..12,
            1u16..900,
            proptest::option::of(0u8..20),
            -2i8..3,
            proptest::bool::weighted(0.25)
        )
            .prop_map(|(program, prompt, ttl, priority, last)| Ev::Arrive {
                program,
                prompt,
                ttl,
                priority,
                last
            }),
        (any::<u8>(), 0u16..300).prop_map(|(pick, growth)| Ev::Complete { pick, growth }),
        any::<u8>().prop_map(|pick| Ev::Cancel { pick }),
        (0u8..3, 0u8..4).prop_map(|(rank, waiting)| Ev::Observe { rank, waiting }),
        (0u8..40).prop_map(|dt| Ev::Tick { dt }),
        (0u8..5, any::<bool>()).prop_map(|(rank, up)| Ev::Available { rank, up }),
        (1u8..32, 0u8..5).prop_map(|(mask, rotate)| Ev::Retarget { mask, rotate }),
        (0u8..4, 1u8..5, any::<bool>(), 0u8..3, 0u8..4).prop_map(
            |(capacity, programs, global, order, binding)| Ev::Reconfigure {
                capacity,
                programs,
                global,
                order,
                binding
            }
        ),
    ]
}

fn resume_order(i: u8) -> ResumeOrder {
    match i % 4 {
        0 => ResumeOrder::Mru,
        1 => ResumeOrder::Fcfs,
        2 => ResumeOrder::LastUse,
        _ => ResumeOrder::KindSize,
    }
}

fn strategy(i: u8) -> BindingStrategy {
    match i % 4 {
        0 => BindingStrategy::ProgramRoundRobin,
        1 => BindingStrategy::LeastProgramCount,
        2 => BindingStrategy::ConsistentHash,
        _ => BindingStrategy::CacheAware,
    }
}

/// Runs a sequence; returns the decisions and the final per-ticket outcomes.
fn run(
    c: ProgramSchedulingConfig,
    events: &[Ev],
) -> (
    Vec<Decision>,
    std::collections::BTreeMap<Ticket, &'static str>,
) {
    let mut s = sched(c.clone(), 3);
    let mut now = 0.0;
    let mut next = 0u64;
    let mut in_flight: Vec<Ticket> = Vec::new();
    let mut outcome = std::collections::BTreeMap::new();
    let mut all = Vec::new();
    for e in events {
        let d = match e {
            Ev::Arrive {
                program,
                prompt,
                ttl,
                priority,
                last,
            } => {
                next += 1;
                outcome.insert(next, "pending");
                let mut a = with(
                    arrival(next, &format!("p{program}"), u64::from(*prompt)),
                    |i| {
                        i.kv_retention_ttl_seconds = ttl.map(f64::from);
                        i.priority = i64::from(*priority);
                        i.expected_resume = !*last;
                    },
                );
                // Tenant-fair resume takes part in every invariant: three tenants (one
                // weighted), and some requests without a tenant.
                a.tenant = match program % 4 {
                    0 => None,
                    1 => Some(("t1".into(), 1.0)),
                    2 => Some(("t2".into(), 2.0)),
                    _ => Some(("t3".into(), 0.5)),
                };
                // Three kinds of Program (system prompts) for `kind_size`, and some without.
                a.lead = (program % 4 != 3).then(|| u64::from(program % 4));
                a.system = a.lead;
                s.on_arrival(now, a)
            }
            Ev::Complete { pick, growth } if !in_flight.is_empty() => {
                let t = in_flight.remove(*pick as usize % in_flight.len());
                outcome.insert(t, "completed");
                // Some completions report cached tokens, so shared-prefix observations and
                // the reservations they shrink take part too.
                let u = Usage {
                    prompt_tokens: 500,
                    completion_tokens: u64::from(*growth),
                    cached_tokens: u64::from(*growth) * 7 % 500,
                };
                s.on_complete(now, t, Some(u))
            }
            Ev::Cancel { pick } => {
                let pending: Vec<Ticket> = outcome
                    .iter()
                    .filter(|(_, v)| **v == "pending")
                    .map(|(k, _)| *k)
                    .collect();
                let all_open: Vec<Ticket> =
                    pending.iter().chain(in_flight.iter()).copied().collect();
                if all_open.is_empty() {
                    continue;
                }
                let t = all_open[*pick as usize % all_open.len()];
                in_flight.retain(|x| *x != t);
                outcome.insert(t, "cancelled");
                s.on_cancel(now, t)
            }
            Ev::Observe { rank, waiting } => s.on_observation(
                now,
                *rank as usize,
                Observation {
                    waiting: f64::from(*waiting),
                    ..Default::default()
                },
            ),
            Ev::Tick { dt } => {
                now += f64::from(*dt) * 0.5;
                s.on_tick(now)
            }
            Ev::Available { rank, up } => {
                let n = s.ranks.len();
                s.set_available(now, *rank as usize % n, *up)
            }
            Ev::Retarget { mask, rotate } => {
                let mut ids: Vec<String> = (0..5)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| format!("r{i}"))
                    .collect();
                let k = *rotate as usize % ids.len();
                ids.rotate_left(k);
                s.retarget(now, ids)
            }
            Ev::Reconfigure {
                capacity,
                programs,
                global,
                order,
                binding,
            } => {
                let tuned = ProgramSchedulingConfig {
                    token_capacity_per_dp_rank: [None, Some(300), Some(1000), Some(3000)]
                        [*capacity as usize % 4],
                    max_active_programs_per_target: u32::from(*programs),
                    global_queue: *global,
                    resume_order: resume_order(*order),
                    binding_strategy: strategy(*binding),
                    ..c.clone()
                };
                s.reconfigure(now, &tuned)
                    .expect("a tuning change carries over")
            }
            Ev::Complete { .. } => continue,
        };
        for x in &d {
            match x {
                Decision::Dispatch { ticket, .. } => {
                    assert_eq!(
                        outcome.get(ticket),
                        Some(&"pending"),
                        "dispatch of a non-pending ticket {ticket}"
                    );
                    outcome.insert(*ticket, "dispatched");
                    in_flight.push(*ticket);
                }
                Decision::Reject { ticket, .. } => {
                    assert_eq!(
                        outcome.get(ticket),
                        Some(&"pending"),
                        "reject of a non-pending ticket {ticket}"
                    );
                    outcome.insert(*ticket, "rejected");
                }
            }
        }
        s.check_invariants()
            .unwrap_or_else(|e| panic!("after {e:?}: {e}"));
        all.extend(d);
    }
    // Drain: finish everything in flight and let time pass; every pending request must end.
    for _ in 0..200 {
        for t in std::mem::take(&mut in_flight) {
            outcome.insert(t, "completed");
            let d = s.on_complete(now, t, usage(500, 1));
            for x in d {
                if let Decision::Dispatch { ticket, .. } = x {
                    outcome.insert(ticket, "dispatched");
                    in_flight.push(ticket);
                } else if let Decision::Reject { ticket, .. } = x {
                    outcome.insert(ticket, "rejected");
                }
            }
        }
        now += 50.0;
        for x in s.on_tick(now) {
            match x {
                Decision::Dispatch { ticket, .. } => {
                    outcome.insert(ticket, "dispatched");
                    in_flight.push(ticket);
                }
                Decision::Reject { ticket, .. } => {
                    outcome.insert(ticket, "rejected");
                }
            }
        }
        if in_flight.is_empty() && s.retained_requests() == 0 {
            break;
        }
    }
    (all, outcome)
}

/// The counterexample proptest found: with `global_queue`, one of a Program's two queued
/// requests was admitted on another rank and the other pulled the Program back home while a
/// request was in flight, splitting its ledger.
#[test]
fn regression_second_request_of_a_migrated_program() {
    use Ev::*;
    let a = |program, prompt, ttl: Option<u8>, priority| Arrive {
        program,
        prompt,
        ttl,
        priority,
        last: false,
    };
    let events = [
        a(5, 1, None, 0),
        Complete { pick: 0, growth: 0 },
        a(0, 1, None, 0),
        a(0, 250, None, 0),
        a(1, 1, Some(1), 0),
        a(6, 1, None, 0),
        Complete { pick: 0, growth: 0 },
        Complete {
            pick: 64,
            growth: 0,
        },
        a(2, 751, None, 0),
        Complete { pick: 5, growth: 0 },
        Observe {
            rank: 1,
            waiting: 1,
        },
        a(0, 768, None, 0),
        a(2, 233, None, 1),
        Complete { pick: 0, growth: 0 },
        a(5, 1, None, 0),
        Tick { dt: 2 },
        Cancel { pick: 186 },
        Complete {
            pick: 103,
            growth: 0,
        },
        Complete { pick: 0, growth: 0 },
    ];
    let c = ProgramSchedulingConfig {
        global_queue: true,
        resume_order: ResumeOrder::Mru,
        queue_timeout_seconds: 30.0,
        force_resume_timeout_seconds: 20.0,
        max_active_programs_per_target: 3,
        stats_window_size: 4,
        ..cfg()
    };
    let (_, outcome) = run(c, &events);
    assert!(
        outcome
            .values()
            .all(|o| *o != "pending" && *o != "dispatched")
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_request_ends_exactly_once_and_the_ledger_holds(events in proptest::collection::vec(ev(), 1..120), global in any::<bool>(), order in 0u8..4, binding in 0u8..4, only in proptest::bool::weighted(0.1), backfill in any::<bool>(), grace in 0u8..3) {
        let c = ProgramSchedulingConfig {
            queue_backfill_depth: if backfill { 8 } else { 0 },
            // At the deadline, within the queue limit, or past it (never used).
            force_resume_engine_grace_seconds: [0.0, 5.0, 60.0][usize::from(grace)],
            binding_strategy: strategy(binding),
            binding_only: only,
            global_queue: global,
            resume_order: resume_order(order),
            queue_timeout_seconds: 30.0,
            force_resume_timeout_seconds: 20.0,
            max_active_programs_per_target: 3,
            stats_window_size: 4,
            ..cfg()
        };
        let (_, outcome) = run(c.clone(), &events);
        for (t, o) in &outcome {
            prop_assert!(*o != "pending" && *o != "dispatched", "ticket {} left {}", t, o);
        }
        // Same events, same decisions.
        let (a, _) = run(c.clone(), &events);
        let (b, _) = run(c, &events);
        prop_assert_eq!(a, b);
    }
}
