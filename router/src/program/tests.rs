//! Scheduler behaviour, one spec rule per test, plus a property test over random event sequences.

use super::identity::Identity;
use super::scheduler::*;
use crate::config::ProgramSchedulingConfig;
use crate::config::program::{BindingStrategy, PrefillCostModel, ResumeOrder};

fn cfg() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(1000),
        decode_buffer_tokens: 0,
        binding_strategy: BindingStrategy::ProgramRoundRobin,
        // Rank-local unless a test is about cross-rank resume.
        global_queue: false,
        ..Default::default()
    }
}

fn sched(c: ProgramSchedulingConfig, ranks: usize) -> Scheduler {
    Scheduler::new(c, (0..ranks).map(|i| format!("r{i}")).collect())
}

fn arrival(ticket: Ticket, program: &str, prompt: u64) -> Arrival {
    Arrival {
        ticket,
        model: "m".into(),
        identity: Identity {
            program_id: program.into(),
            expected_resume: true,
            ..Default::default()
        },
        prompt_tokens: prompt,
        tenant: None,
        prefix: Vec::new(),
    }
}

fn with(mut a: Arrival, f: impl FnOnce(&mut Identity)) -> Arrival {
    f(&mut a.identity);
    a
}

fn usage(prompt: u64, completion: u64) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: 0,
    })
}

/// One rank on which Program "a" (900 tokens) holds its place through a 100 s tool call.
fn held_by_acting(c: ProgramSchedulingConfig) -> Scheduler {
    let mut s = sched(c, 1);
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        }),
    );
    s.on_complete(0.5, 1, usage(900, 10));
    s
}

fn dispatched(d: &[Decision]) -> Vec<Ticket> {
    d.iter()
        .filter_map(|x| {
            if let Decision::Dispatch { ticket, .. } = x {
                Some(*ticket)
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn admits_while_tokens_fit_then_retains_and_releases_on_pause() {
    let mut s = sched(cfg(), 1);
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "a", 600))), [1]);
    assert!(
        dispatched(&s.on_arrival(0.1, arrival(2, "b", 600))).is_empty(),
        "600 + 600 > 1000"
    );
    assert_eq!(s.retained_requests(), 1);
    // The window is immature, so the automatic TTL is 0: `a` pauses on completion and `b` runs.
    assert_eq!(dispatched(&s.on_complete(1.0, 1, usage(600, 10))), [2]);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_demand_larger_than_the_rank_runs_when_the_rank_is_empty() {
    let mut s = sched(cfg(), 1);
    // 1,500 tokens never fit 1,000: admitted at once on the empty rank, not at the force deadline.
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "big", 1500))), [1]);
    // While it runs, the rank is not empty: the next one waits.
    assert!(dispatched(&s.on_arrival(0.1, arrival(2, "b", 10))).is_empty());
    assert_eq!(dispatched(&s.on_complete(1.0, 1, usage(1500, 10))), [2]);
    s.check_invariants().expect("ledger");
}

#[test]
fn program_count_guard_without_token_capacity() {
    let c = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: None,
        max_active_programs_per_target: 2,
        ..cfg()
    };
    let mut s = sched(c, 1);
    assert_eq!(s.capacity(0), (None, CapacitySource::ProgramCount));
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "a", 10))), [1]);
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(2, "b", 10))), [2]);
    assert!(dispatched(&s.on_arrival(0.0, arrival(3, "c", 10))).is_empty());
    assert_eq!(dispatched(&s.on_complete(1.0, 1, usage(10, 1))), [3]);
}

#[test]
fn an_acting_program_keeps_its_place_through_the_tool_call() {
    let mut s = sched(cfg(), 1);
    let a = |t| {
        with(arrival(t, "a", 600), |i| {
            i.kv_retention_ttl_seconds = Some(5.0)
        })
    };
    assert_eq!(dispatched(&s.on_arrival(0.0, a(1))), [1]);
    s.on_complete(1.0, 1, usage(600, 50));
    // `b` arrives during a's tool call and must wait: a still holds its KV.
    assert!(dispatched(&s.on_arrival(2.0, arrival(2, "b", 600))).is_empty());
    // a returns within its TTL: dispatched at once, ahead of the waiting b.
    assert_eq!(dispatched(&s.on_arrival(3.0, a(3))), [3]);
    s.check_invariants().expect("ledger");
}

#[test]
fn ttl_expiry_pauses_and_resumes_the_next() {
    let mut s = sched(cfg(), 1);
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 600), |i| {
            i.kv_retention_ttl_seconds = Some(5.0)
        }),
    );
    s.on_complete(1.0, 1, usage(600, 50));
    s.on_arrival(2.0, arrival(2, "b", 600));
    assert!(dispatched(&s.on_tick(5.9)).is_empty());
    assert_eq!(s.next_deadline(), Some(6.0));
    assert_eq!(dispatched(&s.on_tick(6.0)), [2]);
    // a comes back after its TTL: paused, so it queues like anyone else.
    assert!(dispatched(&s.on_arrival(7.0, arrival(3, "a", 650))).is_empty());
    s.check_invariants().expect("ledger");
}

#[test]
fn forced_requests_still_need_token_room_and_time_out_without_it() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 8.0,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = held_by_acting(c);
    s.on_arrival(1.0, arrival(2, "b", 900));
    assert!(
        s.on_tick(6.5).is_empty(),
        "forced at 6 s, but 900 + 910 tokens do not fit"
    );
    assert_eq!(
        s.on_tick(9.0),
        vec![Decision::Reject {
            ticket: 2,
            reason: RejectReason::QueueTimeout
        }]
    );
    assert_eq!(s.counters.queue_timeouts, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_reused_ticket_answers_only_to_its_own_timers() {
    // Tickets are meant to be unique, but an embedder (a harness replaying turns) may reuse one
    // once its request is done: the earlier request's force-resume and queue-timeout timers
    // must not act on the new one.
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 8.0,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = held_by_acting(c);
    assert_eq!(dispatched(&s.on_arrival(1.0, arrival(2, "b", 50))), [2]);
    s.on_complete(2.0, 2, usage(50, 1));
    assert!(
        s.on_arrival(3.0, arrival(2, "c", 900)).is_empty(),
        "no room"
    );
    assert!(
        s.on_tick(9.5).is_empty(),
        "the first request's deadline (1 s + 8 s) is not the second's"
    );
    assert_eq!(
        s.on_tick(11.0),
        vec![Decision::Reject {
            ticket: 2,
            reason: RejectReason::QueueTimeout
        }]
    );
    assert_eq!(s.counters.queue_timeouts, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_request_deadline_shortens_the_queue_limit_but_never_extends_it() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 8.0,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = held_by_acting(c.clone());
    s.on_arrival(
        1.0,
        with(arrival(2, "b", 900), |i| i.deadline_seconds = Some(2.0)),
    );
    assert_eq!(
        s.on_tick(3.0),
        vec![Decision::Reject {
            ticket: 2,
            reason: RejectReason::QueueTimeout
        }]
    );
    let mut s = held_by_acting(c);
    s.on_arrival(
        1.0,
        with(arrival(2, "b", 900), |i| i.deadline_seconds = Some(60.0)),
    );
    assert_eq!(
        s.on_tick(9.0),
        vec![Decision::Reject {
            ticket: 2,
            reason: RejectReason::QueueTimeout
        }]
    );
}

#[test]
fn force_resume_admits_over_the_guard_in_deadline_order() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 5.0,
        force_resume_timeout_seconds: 5.0,
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 10), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        }),
    );
    s.on_complete(0.5, 1, usage(10, 1));
    s.on_arrival(1.0, arrival(2, "b", 10));
    s.on_arrival(1.2, arrival(3, "c", 10));
    // a holds the only Program slot through its long TTL; at their force deadlines b and c are
    // admitted anyway, in deadline order: nobody starves and nothing times out.
    assert_eq!(dispatched(&s.on_tick(6.0)), [2]);
    assert_eq!(dispatched(&s.on_tick(6.2)), [3]);
    assert_eq!(s.counters.queue_timeouts, 0);
    assert_eq!(s.counters.force_resumes, 2);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_demand_larger_than_the_rank_runs_at_its_force_deadline() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 5.0,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    let mut ev = s.on_arrival(0.0, arrival(1, "a", 2000));
    // A demand above the whole capacity on an empty rank waits for force resume, then runs.
    ev.extend(s.on_tick(5.0));
    assert_eq!(dispatched(&ev), [1]);
}

#[test]
fn resume_order_priority_then_mru_or_fcfs() {
    for (order, want) in [
        (ResumeOrder::Mru, [4, 3, 2]),
        (ResumeOrder::Fcfs, [4, 2, 3]),
    ] {
        let c = ProgramSchedulingConfig {
            resume_order: order,
            max_active_programs_per_target: 1,
            ..cfg()
        };
        let mut s = sched(c, 1);
        s.on_arrival(0.0, arrival(1, "a", 10));
        s.on_arrival(1.0, arrival(2, "b", 10));
        s.on_arrival(2.0, arrival(3, "c", 10));
        s.on_arrival(3.0, with(arrival(4, "d", 10), |i| i.priority = 5));
        let mut got = Vec::new();
        let mut next = 1;
        for t in 0..3 {
            let d = s.on_complete(10.0 + f64::from(t), next, usage(10, 1));
            let ids = dispatched(&d);
            assert_eq!(ids.len(), 1);
            next = ids[0];
            got.push(next);
        }
        assert_eq!(got, want, "{order:?}");
    }
}

#[test]
fn tenants_resume_fairly_within_a_tier_and_weights_scale_shares() {
    // One Program slot: retained requests resume one at a time, in the order asked.
    let c = ProgramSchedulingConfig {
        resume_order: ResumeOrder::Fcfs,
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let tenant = |a: Arrival, t: &str, w: f64| Arrival {
        tenant: Some((t.into(), w)),
        ..a
    };
    let order = |heavy_weight: f64| {
        let mut s = sched(c.clone(), 1);
        s.on_arrival(0.0, tenant(arrival(1, "first", 10), "heavy", heavy_weight));
        // The heavy tenant's backlog arrives before the light tenant's two requests.
        for (i, t) in (2..=5).zip(1..) {
            s.on_arrival(
                f64::from(t),
                tenant(arrival(i, &format!("h{i}"), 10), "heavy", heavy_weight),
            );
        }
        s.on_arrival(9.0, tenant(arrival(6, "l6", 10), "light", 1.0));
        s.on_arrival(9.5, tenant(arrival(7, "l7", 10), "light", 1.0));
        let mut got = Vec::new();
        let mut next = 1;
        for t in 0..6 {
            let d = s.on_complete(10.0 + f64::from(t), next, usage(10, 1));
            let ids = dispatched(&d);
            assert_eq!(ids.len(), 1, "{d:?}");
            next = ids[0];
            got.push(next);
        }
        got
    };
    // FCFS alone would give 2, 3, 4, 5, 6, 7. The heavy tenant was already served once (ticket
    // 1), so the light tenant goes next, then the two alternate (ties resolve FCFS).
    assert_eq!(order(1.0), vec![6, 2, 7, 3, 4, 5]);
    // A heavy tenant with weight 2 gets two turns per light turn.
    assert_eq!(order(2.0), vec![6, 2, 3, 7, 4, 5]);
    // Without tenants nothing changes: the spec's FCFS.
    let mut s = sched(c.clone(), 1);
    s.on_arrival(0.0, arrival(1, "first", 10));
    for i in 2..=7 {
        s.on_arrival(i as f64, arrival(i, &format!("p{i}"), 10));
    }
    let mut got = Vec::new();
    let mut next = 1;
    for t in 0..6 {
        let d = s.on_complete(10.0 + f64::from(t), next, usage(10, 1));
        next = dispatched(&d)[0];
        got.push(next);
    }
    assert_eq!(got, vec![2, 3, 4, 5, 6, 7]);
}

#[test]
fn step_ids_default_to_previous_plus_one() {
    let mut s = sched(
        ProgramSchedulingConfig {
            binding_only: true,
            ..cfg()
        },
        1,
    );
    s.on_arrival(0.0, arrival(1, "a", 10));
    s.on_arrival(1.0, arrival(2, "a", 10));
    s.on_arrival(2.0, with(arrival(3, "a", 10), |i| i.step_id = Some(9)));
    s.on_arrival(3.0, arrival(4, "a", 10));
    let p = s.programs.iter().flatten().next().expect("program");
    assert_eq!(p.identity.step_id, Some(10));
}

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
fn waiting_gate_holds_until_vllm_drains() {
    let c = ProgramSchedulingConfig {
        admission_waiting_request_threshold: 2,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_observation(
        0.0,
        0,
        Observation {
            waiting: 3.0,
            ..Default::default()
        },
    );
    assert!(dispatched(&s.on_arrival(0.1, arrival(1, "a", 10))).is_empty());
    let d = s.on_observation(
        0.5,
        0,
        Observation {
            waiting: 0.0,
            ..Default::default()
        },
    );
    assert_eq!(dispatched(&d), [1]);
    // A stale observation (older than 3 intervals) does not gate.
    let mut s = sched(
        ProgramSchedulingConfig {
            admission_waiting_request_threshold: 2,
            ..cfg()
        },
        1,
    );
    s.on_observation(
        0.0,
        0,
        Observation {
            waiting: 9.0,
            ..Default::default()
        },
    );
    assert_eq!(dispatched(&s.on_arrival(10.0, arrival(1, "a", 10))), [1]);
}

#[test]
fn capacity_comes_from_cache_config_when_not_configured() {
    let c = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: None,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_observation(
        0.0,
        0,
        Observation {
            token_capacity: Some(500),
            ..Default::default()
        },
    );
    assert_eq!(s.capacity(0), (Some(500), CapacitySource::Observed));
    assert_eq!(dispatched(&s.on_arrival(0.1, arrival(1, "a", 400))), [1]);
    assert!(dispatched(&s.on_arrival(0.1, arrival(2, "b", 400))).is_empty());
}

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
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        }),
    );
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
fn automatic_ttl_after_the_window_matures() {
    let c = ProgramSchedulingConfig {
        stats_window_size: 5,
        max_acting_ttl_seconds: 10.0,
        token_capacity_per_dp_rank: Some(1_000_000),
        ..cfg()
    };
    let run = |context: u64| {
        let mut s = sched(c.clone(), 1);
        let (mut t, mut ticket) = (0.0, 0);
        let mut armed = Vec::new();
        for _ in 0..7 {
            ticket += 1;
            s.on_arrival(t, arrival(ticket, "a", context));
            t += 0.5;
            s.on_complete(t, ticket, usage(context, 10));
            armed.push(
                s.programs
                    .iter()
                    .flatten()
                    .next()
                    .expect("program")
                    .armed_ttl,
            );
            t += 1.0; // 1 s tool calls
        }
        armed
    };
    // 20k-token context: a miss costs ~5.5 s, so holding through 1 s tool calls pays.
    let armed = run(20_000);
    assert!(
        armed[..5].iter().all(|x| *x == 0.0),
        "0 until the window is full: {armed:?}"
    );
    assert!(
        (1.0..=1.01).contains(&armed[6]),
        "covers the 1 s gaps: {armed:?}"
    );
    // 100-token context: re-prefill (~0.13 s) is cheaper than waiting 1 s.
    assert!(run(100).iter().all(|x| *x == 0.0));
}

#[test]
fn pooled_evidence_and_min_samples_arm_the_ttl_sooner() {
    use crate::config::program::TtlEvidence;
    let c = ProgramSchedulingConfig {
        stats_window_size: 100,
        ttl_evidence: TtlEvidence::Pooled,
        ttl_min_samples: Some(4),
        token_capacity_per_dp_rank: Some(10_000_000),
        binding_strategy: BindingStrategy::ProgramRoundRobin,
        ..cfg()
    };
    let mut s = sched(c, 4);
    // Four Programs on four ranks, two turns each with a 1 s tool call: four pooled samples.
    let (mut t, mut ticket) = (0.0, 0u64);
    for turn in 0..3 {
        for p in 0..4 {
            ticket += 1;
            s.on_arrival(t, arrival(ticket, &format!("p{p}"), 20_000));
            s.on_complete(t + 0.5, ticket, usage(20_000, 10));
        }
        t += 1.5;
        let _ = turn;
    }
    let armed: Vec<f64> = s.programs.iter().flatten().map(|p| p.armed_ttl).collect();
    assert!(
        armed.iter().any(|x| *x > 0.0),
        "pooled evidence armed a TTL: {armed:?}"
    );
}

#[test]
fn segment_yield_under_queue_pressure() {
    let c = ProgramSchedulingConfig {
        max_segment_rounds: 2,
        ..cfg()
    };
    let mut s = sched(c, 1);
    let a = |t| {
        with(arrival(t, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        })
    };
    s.on_arrival(0.0, a(1));
    s.on_complete(1.0, 1, usage(900, 10)); // round 1: TTL armed
    s.on_arrival(1.5, arrival(2, "b", 900)); // b waits
    s.on_arrival(2.0, a(3));
    let d = s.on_complete(3.0, 3, usage(900, 10)); // round 2 with b waiting: a yields
    assert_eq!(dispatched(&d), [2]);
    assert_eq!(s.counters.pauses.get("max_segment_yield"), Some(&1));
}

#[test]
fn cancel_of_retained_and_in_flight_requests() {
    let mut s = sched(cfg(), 1);
    s.on_arrival(0.0, arrival(1, "a", 600));
    s.on_arrival(0.0, arrival(2, "b", 600));
    assert!(s.on_cancel(0.5, 2).is_empty());
    assert_eq!(s.retained_requests(), 0);
    s.on_arrival(0.6, arrival(3, "c", 600));
    // Cancelling a's in-flight request releases its capacity for c.
    assert_eq!(dispatched(&s.on_cancel(1.0, 1)), [3]);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_timer_read_back_through_next_deadline_fires() {
    let mut s = sched(cfg(), 1);
    // 0.1 + 0.2 is not representable exactly; the TTL timer must still fire at next_deadline().
    s.on_arrival(
        0.1,
        with(arrival(1, "a", 10), |i| {
            i.kv_retention_ttl_seconds = Some(0.2)
        }),
    );
    s.on_complete(0.1, 1, usage(10, 1));
    let t = s.next_deadline().expect("ttl timer");
    s.on_tick(t);
    let p = s.programs.iter().flatten().next().expect("program");
    assert!(
        matches!(p.phase, super::scheduler::Phase::Paused { .. }),
        "{:?}",
        p.phase
    );
}

#[test]
fn paused_programs_are_released_after_retention() {
    let c = ProgramSchedulingConfig {
        paused_retention_ttl_seconds: 10.0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_arrival(0.0, arrival(1, "a", 10));
    s.on_complete(1.0, 1, usage(10, 1));
    assert_eq!(s.programs.iter().flatten().count(), 1);
    s.on_tick(11.0);
    assert_eq!(s.programs.iter().flatten().count(), 0);
}

fn rank_of(d: &[Decision], ticket: Ticket) -> Option<Rank> {
    d.iter().find_map(|x| match x {
        Decision::Dispatch { ticket: t, rank } if *t == ticket => Some(*rank),
        _ => None,
    })
}

#[test]
fn retarget_keeps_surviving_ranks_state_under_their_new_index() {
    // r0 and r1; "a" acts on r1 with a 100 s TTL, "b" waits behind it there.
    let mut s = sched(cfg(), 2);
    let a = |t| {
        with(arrival(t, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        })
    };
    // Round robin binds the first Program to r1.
    assert_eq!(rank_of(&s.on_arrival(0.0, a(1)), 1), Some(1));
    s.on_complete(0.5, 1, usage(900, 10));
    s.on_arrival(0.6, arrival(2, "x", 10)); // binds r0
    // "b" binds r1 and waits there: 910 + 500 > 1000.
    assert!(dispatched(&s.on_arrival(0.7, arrival(3, "b", 500))).is_empty());
    assert_eq!(s.ranks[1].queue.len(), 1);
    let queued_before = s.retained_requests();
    // r0 leaves, r9 joins in front: r1 is now index 1 of ["r9", "r1"].
    s.retarget(1.0, vec!["r9".into(), "r1".into()]);
    s.check_invariants().expect("ledger after retarget");
    assert_eq!(s.ranks[1].id, "r1");
    assert_eq!(s.ranks[1].active_programs, 1, "a still acts on r1");
    assert_eq!(s.retained_requests(), queued_before, "nobody was dropped");
    // a comes back within its TTL: dispatched at once, on r1's new index.
    assert_eq!(rank_of(&s.on_arrival(2.0, a(4)), 4), Some(1));
    s.check_invariants().expect("ledger");
}

#[test]
fn retarget_rehomes_programs_of_a_removed_rank_and_forgets_their_in_flight() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 500.0,
        ..cfg()
    };
    let mut s = sched(c, 2);
    let long = |t, p: &str| {
        with(arrival(t, p, 600), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        })
    };
    // Round robin: "a" on r1 acts; "b" on r0 is in flight; "c" on r1 waits (610 + 600 > 1000).
    assert_eq!(rank_of(&s.on_arrival(0.0, long(1, "a")), 1), Some(1));
    s.on_complete(0.5, 1, usage(600, 10));
    assert_eq!(rank_of(&s.on_arrival(0.6, long(2, "b")), 2), Some(0));
    assert!(dispatched(&s.on_arrival(0.7, long(3, "c"))).is_empty());
    assert_eq!(s.ranks[1].queue.len(), 1, "c waits on r1");
    s.take_notes();
    // r1 leaves: a (acting) is paused as target_removed and re-homed; c follows its Program to
    // r0, keeping its place, and waits there behind b (600 + 600 > 1000).
    let d = s.retarget(1.0, vec!["r0".into()]);
    s.check_invariants().expect("ledger after retarget");
    assert!(dispatched(&d).is_empty());
    assert_eq!(s.num_ranks(), 1);
    assert_eq!(s.retained_requests(), 1);
    assert_eq!(s.ranks[0].queue.len(), 1);
    assert_eq!(s.counters.pauses.get("target_removed"), Some(&1));
    assert!(s.take_notes().iter().any(|n| matches!(
        n,
        Note::Pause {
            program,
            reason: PauseReason::TargetRemoved,
            rank: 0,
        } if program == "a"
    )));
    // b finishes and holds r0 through its 100 s TTL; c is served when it lapses.
    assert!(dispatched(&s.on_complete(2.0, 2, usage(600, 10))).is_empty());
    assert_eq!(dispatched(&s.on_tick(102.0)), [3]);
    s.check_invariants().expect("ledger");
    // a comes back: paused, so through admission on its new home (held by c now).
    assert!(dispatched(&s.on_arrival(103.0, long(4, "a"))).is_empty());
    s.check_invariants().expect("ledger");
}

#[test]
fn retarget_ignores_completion_of_a_request_on_a_removed_rank() {
    let mut s = sched(cfg(), 2);
    assert_eq!(
        rank_of(&s.on_arrival(0.0, arrival(1, "a", 600)), 1),
        Some(1)
    );
    s.retarget(1.0, vec!["r0".into()]);
    s.check_invariants().expect("ledger");
    assert!(s.on_complete(2.0, 1, usage(600, 10)).is_empty());
    s.check_invariants()
        .expect("ledger after the stale completion");
    assert_eq!(s.ranks[0].used_tokens, 0);
    // A scheduler with no rank rejects at once instead of indexing nothing.
    let mut empty = sched(cfg(), 0);
    assert!(matches!(
        empty.on_arrival(0.0, arrival(9, "z", 1))[..],
        [Decision::Reject {
            reason: RejectReason::NoTarget,
            ..
        }]
    ));
    // An empty new set is refused: nothing changes.
    s.retarget(3.0, vec![]);
    assert_eq!(s.num_ranks(), 1);
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
        s.check_invariants().expect("ledger");
    }
}

fn find<'a>(s: &'a Scheduler, program: &str) -> &'a Program {
    s.programs
        .iter()
        .flatten()
        .find(|p| p.key.1 == program)
        .expect("program exists")
}

#[test]
fn a_shared_prefix_is_reserved_once_per_rank_while_its_observation_is_fresh() {
    let c = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(2000),
        stats_window_size: 1,
        ..cfg()
    };
    let mut s = sched(c, 1);
    // The growth window is complete (mean 0): the discount is active.
    s.ranks[0].growth.push(0.0);
    let hold = |t, p: &str| {
        with(arrival(t, p, 600), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        })
    };
    assert_eq!(dispatched(&s.on_arrival(0.0, hold(1, "a"))), [1]);
    assert_eq!(dispatched(&s.on_arrival(0.0, hold(2, "c"))), [2]);
    // 400 of each 600-token prompt were already cached: a system prompt both share.
    let u = Usage {
        prompt_tokens: 600,
        completion_tokens: 10,
        cached_tokens: 400,
    };
    s.on_complete(1.0, 1, Some(u));
    s.on_complete(1.0, 2, Some(u));
    assert!(s.take_notes().contains(&Note::SharedPrefix {
        rank: 0,
        tokens: 400
    }));
    assert_eq!(
        s.ranks[0].used_tokens, 420,
        "each holds its 210 private tokens"
    );
    // The prefix itself is still counted once: e (1,200) would fit beside the private tokens
    // alone (1,620) but not with the prefix (2,020 > 2,000).
    assert!(dispatched(&s.on_arrival(2.0, arrival(5, "e", 1200))).is_empty());
    s.on_cancel(2.0, 5);
    // d (1,100) fits beside 420 private + the 400 shared prefix counted once (1,920 ≤ 2,000);
    // counting the prefix per Program (1,220 + 1,100) it would not.
    assert_eq!(dispatched(&s.on_arrival(2.0, arrival(3, "d", 1100))), [3]);
    assert_eq!(s.fresh_shared(find(&s, "a"), 50.0), 400);
    // The interval window is immature: observations live `shared_prefix_freshness_warmup_seconds`.
    assert_eq!(s.shared_prefix_freshness(0), 100.0);
    assert_eq!(
        s.fresh_shared(find(&s, "a"), 102.0),
        0,
        "stale: counted as private"
    );
    // A later run on the same placement does not re-measure sharing (its own KV is cached).
    s.on_complete(3.0, 3, usage(1100, 10));
    s.on_tick(150.0);
    s.on_arrival(150.0, arrival(4, "a", 620));
    s.on_complete(
        151.0,
        4,
        Some(Usage {
            cached_tokens: 610,
            ..u
        }),
    );
    assert_eq!(find(&s, "a").shared_prefix, 400);
    s.check_invariants().expect("ledger");
}

#[test]
fn no_shared_prefix_discount_before_the_growth_window_is_complete() {
    let mut s = sched(cfg(), 1);
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 600), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        }),
    );
    let u = Usage {
        prompt_tokens: 600,
        completion_tokens: 10,
        cached_tokens: 400,
    };
    s.on_complete(1.0, 1, Some(u));
    // Observed and reported, but the whole context stays reserved: no growth reserve exists yet.
    assert_eq!(find(&s, "a").shared_prefix, 400);
    assert_eq!(s.ranks[0].used_tokens, 610);
}

#[test]
fn shared_prefix_freshness_follows_kv_turnover_once_mature() {
    let c = ProgramSchedulingConfig {
        stats_window_size: 2,
        shared_prefix_freshness_kv_turnovers: 2.0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.ranks[0].intervals.push(1.0);
    s.ranks[0].intervals.push(1.0);
    // 500 tokens/s through a 1,000-token rank: one turnover every 2 s, two in 4 s.
    s.ranks[0].throughput.push(0.0, 500);
    s.ranks[0].throughput.push(1.0, 500);
    assert_eq!(s.shared_prefix_freshness(0), 4.0);
}

#[test]
fn the_force_resume_deadline_follows_queued_work_and_measured_throughput() {
    let c = ProgramSchedulingConfig {
        force_resume_timeout_seconds: 300.0,
        queue_timeout_seconds: 600.0,
        metrics_interval_seconds: 1.0,
        force_resume_workload_factor: 1.0,
        ..cfg()
    };
    let mut s = sched(c.clone(), 1);
    assert_eq!(s.force_resume_after(0), 300.0, "no throughput measured yet");
    // Two completions per second over the window.
    for i in 0..16 {
        s.ranks[0].throughput.push(f64::from(i - 16) * 0.5, 100);
    }
    assert_eq!(s.force_resume_after(0), 1.0, "an empty rank: the floor");
    // One acting Program holding the rank (one round per activation so far) and two waiting.
    s.on_arrival(
        0.0,
        with(arrival(1, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        }),
    );
    s.on_complete(0.5, 1, usage(900, 10));
    s.on_arrival(1.0, arrival(2, "b", 500));
    s.on_arrival(1.0, arrival(3, "c", 500));
    // (2 queued + itself + 1 active × 1 round) / measured requests per second (≈ 2).
    let rate = s.ranks[0].throughput.requests_per_second().expect("rate");
    assert!((s.force_resume_after(0) - 4.0 / rate).abs() < 1e-9);
    assert!(s.force_resume_after(0) < 3.0);
    // The waiting requests carry their own deadlines, shorter than the configured 300 s.
    let d = super::diagnostics::snapshot(&s, 1.0, &[], 0.25, 10);
    let waiting = d.ranks[0]
        .programs
        .iter()
        .filter_map(|p| p.force_resume_remaining_seconds)
        .collect::<Vec<_>>();
    assert_eq!(waiting.len(), 2);
    assert!(waiting.iter().all(|x| *x < 3.0), "{waiting:?}");
    // Forced at their deadline, yet still bound by physical room: nothing runs while a holds
    // the rank; when its TTL ends the forced requests go first.
    s.on_tick(5.0);
    let d = super::diagnostics::snapshot(&s, 5.0, &[], 0.25, 10);
    assert!(
        d.ranks[0]
            .programs
            .iter()
            .filter_map(|p| p.force_resume_remaining_seconds)
            .all(|x| x == 0.0)
    );
    assert_eq!(s.counters.force_resumes, 0);
    let mut got = dispatched(&s.on_tick(101.0));
    got.sort_unstable();
    assert_eq!(got, [2, 3]);
    assert_eq!(s.counters.force_resumes, 2);
    s.check_invariants().expect("ledger");
    // The factor scales the estimate (1 request / 2 per s × 3); 0 keeps the configured timeout.
    for (factor, expect) in [(3.0, 1.5), (0.0, 300.0)] {
        let mut s = sched(
            ProgramSchedulingConfig {
                force_resume_workload_factor: factor,
                ..c.clone()
            },
            1,
        );
        for i in 0..16 {
            s.ranks[0].throughput.push(f64::from(i) * 0.5, 100);
        }
        assert_eq!(s.force_resume_after(0), expect);
    }
}

fn batch_gain_setup(enable: bool) -> (Scheduler, Vec<Decision>) {
    let c = ProgramSchedulingConfig {
        stats_window_size: 2,
        enable_batch_gain_admission: enable,
        ..cfg()
    };
    let mut s = sched(c, 1);
    // Three rounds of "a" fill the windows: growth mean 100 tokens, intervals 1 s, throughput.
    let mut t = 0.0;
    for (ticket, prompt) in [(1, 100), (2, 200), (3, 300)] {
        s.on_arrival(t, arrival(ticket, "a", prompt));
        s.on_complete(t + 1.0, ticket, usage(prompt, 100));
        t += 2.0;
    }
    assert!(s.ranks[0].growth.complete());
    // "big" holds 850 + 100 growth; "c" needs 40 + 100: only its growth reserve does not fit.
    assert_eq!(dispatched(&s.on_arrival(t, arrival(4, "big", 850))), [4]);
    let d = s.on_arrival(t + 0.1, arrival(5, "c", 40));
    (s, d)
}

#[test]
fn batch_gain_admission_bypasses_only_the_growth_reserve() {
    let (mut s, d) = batch_gain_setup(true);
    assert_eq!(
        dispatched(&d),
        [5],
        "the modelled gain covers the overflow risk"
    );
    assert_eq!(s.counters.batch_gain_admissions, 1);
    assert_eq!(
        s.ranks[0].used_tokens,
        950 + 40,
        "c reserved its demand less the growth reserve"
    );
    assert!(
        s.take_notes()
            .iter()
            .any(|n| matches!(n, Note::BatchGain { benefit, cost, .. } if benefit >= cost))
    );
    // Immediate capacity is never bypassed: 20 more tokens than the rank has stay out.
    assert!(dispatched(&s.on_arrival(7.0, arrival(6, "d", 20))).is_empty());
    s.check_invariants().expect("ledger");

    let (s, d) = batch_gain_setup(false);
    assert!(
        dispatched(&d).is_empty(),
        "disabled: the growth reserve holds"
    );
    assert_eq!(s.counters.batch_gain_admissions, 0);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Ev {
        Arrive {
            program: u8,
            prompt: u16,
            ttl: Option<u8>,
            priority: i8,
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
            fcfs: bool,
            binding: u8,
        },
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0u8..12, 1u16..900, proptest::option::of(0u8..20), -2i8..3).prop_map(
                |(program, prompt, ttl, priority)| Ev::Arrive {
                    program,
                    prompt,
                    ttl,
                    priority
                }
            ),
            (any::<u8>(), 0u16..300).prop_map(|(pick, growth)| Ev::Complete { pick, growth }),
            any::<u8>().prop_map(|pick| Ev::Cancel { pick }),
            (0u8..3, 0u8..4).prop_map(|(rank, waiting)| Ev::Observe { rank, waiting }),
            (0u8..40).prop_map(|dt| Ev::Tick { dt }),
            (1u8..32, 0u8..5).prop_map(|(mask, rotate)| Ev::Retarget { mask, rotate }),
            (0u8..4, 1u8..5, any::<bool>(), any::<bool>(), 0u8..4).prop_map(
                |(capacity, programs, global, fcfs, binding)| Ev::Reconfigure {
                    capacity,
                    programs,
                    global,
                    fcfs,
                    binding
                }
            ),
        ]
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
                } => {
                    next += 1;
                    outcome.insert(next, "pending");
                    let mut a = with(
                        arrival(next, &format!("p{program}"), u64::from(*prompt)),
                        |i| {
                            i.kv_retention_ttl_seconds = ttl.map(f64::from);
                            i.priority = i64::from(*priority);
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
                    fcfs,
                    binding,
                } => {
                    let tuned = ProgramSchedulingConfig {
                        token_capacity_per_dp_rank: [None, Some(300), Some(1000), Some(3000)]
                            [*capacity as usize % 4],
                        max_active_programs_per_target: u32::from(*programs),
                        global_queue: *global,
                        resume_order: if *fcfs {
                            ResumeOrder::Fcfs
                        } else {
                            ResumeOrder::Mru
                        },
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
        fn every_request_ends_exactly_once_and_the_ledger_holds(events in proptest::collection::vec(ev(), 1..120), global in any::<bool>(), fcfs in any::<bool>(), binding in 0u8..4, only in proptest::bool::weighted(0.1)) {
            let c = ProgramSchedulingConfig {
                binding_strategy: strategy(binding),
                binding_only: only,
                global_queue: global,
                resume_order: if fcfs { ResumeOrder::Fcfs } else { ResumeOrder::Mru },
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
        let a = with(arrival(3, "a", 900), |i| {
            i.kv_retention_ttl_seconds = Some(100.0)
        });
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
    // Null on two ranks: the spec's move at once.
    assert_eq!(run(None), (at_3, at_5, moves));
    let (at_3, at_5, moves) = run(Some(1.0));
    assert!(dispatched(&at_3).is_empty(), "waited 1 s of 3.1: {at_3:?}");
    assert_eq!(at_5, vec![Decision::Dispatch { ticket: 4, rank: 1 }]);
    assert_eq!(moves, 1);
}

#[test]
fn a_null_min_wait_ratio_waits_to_break_even_on_large_clusters_only() {
    use crate::config::program::AUTO_MIN_WAIT_RANKS;
    let ratio = |k: Option<f64>, ranks: usize| {
        let c = ProgramSchedulingConfig {
            cross_rank_min_wait_ratio: k,
            ..cfg()
        };
        sched(c, ranks).min_wait_ratio()
    };
    assert_eq!(ratio(None, 4), 0.0);
    assert_eq!(ratio(None, AUTO_MIN_WAIT_RANKS - 1), 0.0);
    assert_eq!(ratio(None, AUTO_MIN_WAIT_RANKS), 1.0);
    assert_eq!(ratio(None, 64), 1.0);
    assert_eq!(
        ratio(Some(0.0), 64),
        0.0,
        "an explicit 0 is the spec's rule at any size"
    );
    assert_eq!(ratio(Some(2.5), 4), 2.5);
    // Ranks added by a hot reload count from then on.
    let mut s = sched(cfg(), 4);
    s.retarget(
        0.0,
        (0..AUTO_MIN_WAIT_RANKS).map(|r| format!("r{r}")).collect(),
    );
    assert_eq!(s.min_wait_ratio(), 1.0);
}

#[test]
fn a_tuning_reconfigure_keeps_state_and_admits_what_now_fits() {
    let mut s = held_by_acting(cfg());
    assert!(dispatched(&s.on_arrival(1.0, arrival(2, "b", 600))).is_empty());
    assert_eq!(s.retained_requests(), 1);
    // Twice the capacity: b fits next to the acting a, at once.
    let wider = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(2000),
        ..cfg()
    };
    let ds = s
        .reconfigure(2.0, &wider)
        .expect("a tuning change carries over");
    assert_eq!(dispatched(&ds), [2]);
    assert_eq!(s.retained_requests(), 0);
    assert_eq!(s.capacity(0), (Some(2000), CapacitySource::Configured));
    // a is still bound and acting: its next turn is admitted without waiting.
    assert_eq!(dispatched(&s.on_arrival(3.0, arrival(3, "a", 950))), [3]);
    s.check_invariants().expect("ledger");
    // Changes to the state's shape are handed back.
    for changed in [
        ProgramSchedulingConfig {
            stats_window_size: 7,
            ..cfg()
        },
        ProgramSchedulingConfig {
            binding_only: true,
            ..cfg()
        },
    ] {
        assert!(s.reconfigure(4.0, &changed).is_none());
    }
}

fn dispatch_rank(d: &[Decision], t: Ticket) -> Option<Rank> {
    d.iter().find_map(|x| match x {
        Decision::Dispatch { ticket, rank } if *ticket == t => Some(*rank),
        _ => None,
    })
}

#[test]
fn a_program_handed_over_frees_its_place_and_keeps_its_rank_where_it_is_adopted() {
    // Replica A (round robin from r1): Program "p" (600 tokens) in a tool call on r0 holds its
    // place; "q", bound to r0 too, waits for it.
    let mut a = sched(cfg(), 2);
    a.on_arrival(0.0, arrival(1, "filler", 10));
    let p = |t| {
        with(arrival(t, "p", 600), |i| {
            i.kv_retention_ttl_seconds = Some(100.0);
            i.root_program_id = Some("tree".into());
        })
    };
    assert_eq!(dispatch_rank(&a.on_arrival(0.0, p(2)), 2), Some(0));
    a.on_complete(1.0, 2, usage(600, 50));
    a.on_arrival(1.5, arrival(4, "filler-2", 10));
    assert!(dispatched(&a.on_arrival(2.0, arrival(3, "q", 600))).is_empty());
    let key = |p: &str| ("m".to_string(), p.to_string());
    assert!(a.hand_over(3.0, &key("unknown")).0.is_none());
    let (given, ds) = a.hand_over(3.0, &key("p"));
    let h = &given.expect("p is idle");
    assert_eq!(
        (h.program_id.as_str(), h.root.as_str(), h.target.as_str()),
        ("p", "tree", "r0")
    );
    assert_eq!(h.context_tokens, 650);
    assert!((h.idle_seconds - 2.0).abs() < 1e-9, "{h:?}");
    assert_eq!(dispatched(&ds), [3], "q takes the freed place");
    assert!(!a.knows(&key("p")));
    // A Program with a request in flight stays.
    assert!(a.hand_over(3.0, &key("q")).0.is_none());
    assert!(a.knows(&key("q")));
    a.check_invariants().expect("ledger");

    // Replica B would bind a new Program to r1 (round robin), but the adopted p stays on r0.
    let mut b = sched(cfg(), 2);
    let unknown_target = HandedOver {
        target: "r9".into(),
        program_id: "gone".into(),
        ..h.clone()
    };
    assert_eq!(b.adopt(3.0, &[h.clone(), unknown_target]), 1);
    assert_eq!(b.adopt(3.0, std::slice::from_ref(h)), 0, "known already");
    assert_eq!(dispatch_rank(&b.on_arrival(4.0, p(10)), 10), Some(0));
    b.check_invariants().expect("ledger");
    // What B holds is what it would hand on.
    let held = b.held(5.0);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].target, "r0");
}

#[test]
fn an_adopted_program_nobody_asks_for_is_forgotten_after_the_paused_retention() {
    let mut s = sched(cfg(), 2);
    let h = HandedOver {
        model: "m".into(),
        program_id: "p".into(),
        root: "p".into(),
        target: "r1".into(),
        context_tokens: 100,
        idle_seconds: 1.0,
    };
    assert_eq!(s.adopt(0.0, &[h]), 1);
    let key = ("m".to_string(), "p".to_string());
    assert!(s.knows(&key));
    s.on_tick(cfg().paused_retention_ttl_seconds + 1.0);
    assert!(!s.knows(&key));
    s.check_invariants().expect("ledger");
}
