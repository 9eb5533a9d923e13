//! The RequestPool: force resume and queue timeouts, request deadlines, resume order (priority,
//! MRU/FCFS, tenants), the workload-derived force-resume deadline, cancellation and timers.

use super::*;

/// Requests time out after 8 s in the pool and are forced after 5 s.
fn short_timeouts() -> ProgramSchedulingConfig {
    ProgramSchedulingConfig {
        queue_timeout_seconds: 8.0,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    }
}

/// What the scheduler answers when `ticket` times out in the pool.
fn timed_out(ticket: Ticket) -> Vec<Decision> {
    vec![Decision::Reject {
        ticket,
        reason: RejectReason::QueueTimeout,
    }]
}

/// `force_resume_engine_grace_seconds`: a forced request the ledger keeps out (a Program holds
/// 910 tokens through its tool call) is admitted once it is that long past its deadline and a
/// fresh report of the engine's KV shows room for it; not within its grace, not on a busy
/// report.
#[test]
fn a_forced_request_past_its_grace_is_admitted_on_the_engines_own_report() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 30.0,
        force_resume_timeout_seconds: 5.0,
        force_resume_engine_grace_seconds: 4.0,
        metrics_interval_seconds: 1.0,
        ..cfg()
    };
    let mut s = held_by_acting(c);
    s.on_arrival(1.0, arrival(2, "b", 300));
    let report = |kv_usage| Observation {
        kv_usage,
        ..Default::default()
    };
    assert!(s.on_tick(6.0).is_empty(), "forced, but 910 + 300 > 1,000");
    let within = s.on_observation(9.5, 0, report(0.1));
    assert!(dispatched(&within).is_empty(), "3.5 s past its deadline");
    let busy = s.on_observation(10.5, 0, report(0.8));
    assert!(dispatched(&busy).is_empty(), "800 reported + 300 > 1,000");
    s.take_notes();
    assert_eq!(dispatched(&s.on_observation(11.0, 0, report(0.1))), [2]);
    assert_eq!(s.counters.engine_room_admissions, 1);
    assert_eq!(s.counters.force_resumes, 1);
    assert!(s.take_notes().contains(&Note::EngineRoom { rank: 0 }));
    // "a" keeps its reservation: the ledger is over capacity, and nothing else fits it.
    assert!(dispatched(&s.on_arrival(11.5, arrival(3, "c", 10))).is_empty());
    s.check_invariants().expect("ledger");
}

#[test]
fn forced_requests_still_need_token_room_and_time_out_without_it() {
    // The engine-room grace (60 s by default) lies past this queue limit.
    let mut s = held_by_acting(short_timeouts());
    s.on_arrival(1.0, arrival(2, "b", 900));
    assert!(
        s.on_tick(6.5).is_empty(),
        "forced at 6 s, but 900 + 910 tokens do not fit"
    );
    assert_eq!(s.on_tick(9.0), timed_out(2));
    assert_eq!(s.counters.queue_timeouts, 1);
    s.check_invariants().expect("ledger");
}

/// `acting_ttl_hold: expected` (the default) charges holds more as the whole TTL the nearer the rank's
/// longest-waiting request is to its force-resume deadline, and wholly once it is forced.
#[test]
fn waiting_requests_turn_the_expected_hold_back_toward_the_whole_ttl() {
    use crate::config::program::ActingTtlHold;
    let mut s = held_by_acting(short_timeouts());
    assert_eq!(
        s.cfg.acting_ttl_hold,
        ActingTtlHold::Expected,
        "the default"
    );
    assert_eq!(s.reserved_share(0, 1.0), 0.0, "nothing waits");
    s.on_arrival(1.0, arrival(2, "b", 900));
    assert_eq!(s.reserved_share(0, 1.0), 0.0);
    s.on_arrival(2.0, arrival(3, "c", 900));
    assert!(
        (s.reserved_share(0, 3.5) - 0.5).abs() < 1e-9,
        "the longest-waiting request is half way to 6 s"
    );
    assert!(s.on_cancel(3.5, 2).is_empty());
    assert!(
        (s.reserved_share(0, 4.5) - 0.5).abs() < 1e-9,
        "then the next: half way from 2 s to 7 s"
    );
    assert!(s.on_tick(7.5).is_empty(), "forced at 7 s, still no room");
    assert_eq!(s.reserved_share(0, 7.5), 1.0);
    s.check_invariants().expect("queue and arrival index agree");
    let spec = held_by_acting(ProgramSchedulingConfig {
        acting_ttl_hold: ActingTtlHold::Reserved,
        ..short_timeouts()
    });
    assert_eq!(
        spec.reserved_share(0, 1.0),
        1.0,
        "the spec charges the whole TTL"
    );
}

#[test]
fn a_reused_ticket_answers_only_to_its_own_timers() {
    // Tickets are meant to be unique, but an embedder (a harness replaying turns) may reuse one
    // once its request is done: the earlier request's force-resume and queue-timeout timers
    // must not act on the new one.
    let mut s = held_by_acting(short_timeouts());
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
    assert_eq!(s.on_tick(11.0), timed_out(2));
    assert_eq!(s.counters.queue_timeouts, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_request_deadline_shortens_the_queue_limit_but_never_extends_it() {
    let mut s = held_by_acting(short_timeouts());
    s.on_arrival(
        1.0,
        with(arrival(2, "b", 900), |i| i.deadline_seconds = Some(2.0)),
    );
    assert_eq!(s.on_tick(3.0), timed_out(2));
    let mut s = held_by_acting(short_timeouts());
    s.on_arrival(
        1.0,
        with(arrival(2, "b", 900), |i| i.deadline_seconds = Some(60.0)),
    );
    assert_eq!(s.on_tick(9.0), timed_out(2));
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
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 10), 100.0));
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

/// `program`'s request `ticket` arrives and runs at once, completes, and the Program pauses.
fn run_and_pause(s: &mut Scheduler, (arrive, done): (f64, f64), ticket: Ticket, program: &str) {
    assert_eq!(
        dispatched(&s.on_arrival(arrive, arrival(ticket, program, 10))),
        [ticket]
    );
    assert!(dispatched(&s.on_complete(done, ticket, usage(10, 1))).is_empty());
}

#[test]
fn resume_order_priority_then_work_in_progress_then_new_programs_fcfs() {
    for (order, want) in [
        // Priority first; then Programs that have run, and a subagent its parent waits on,
        // latest arrival first; then new root Programs oldest first.
        (ResumeOrder::Mru, [9, 8, 7, 5, 4, 6]),
        // The same, but work in progress by its KV's last use: r2 completed after r1, though
        // r1 came back later; the subagent shares its parent's prompt, used as it arrives.
        (ResumeOrder::LastUse, [9, 8, 5, 7, 4, 6]),
        (ResumeOrder::Fcfs, [9, 4, 5, 6, 7, 8]),
        // Before any Program ended every kind is the fleet's size: as `mru`.
        (ResumeOrder::KindSize, [9, 8, 7, 5, 4, 6]),
    ] {
        let c = ProgramSchedulingConfig {
            resume_order: order,
            max_active_programs_per_target: 1,
            ..cfg()
        };
        let mut s = sched(c, 1);
        // r1 and r2 run once and pause (no TTL before the statistics window fills).
        run_and_pause(&mut s, (0.0, 1.0), 1, "r1");
        run_and_pause(&mut s, (1.5, 2.0), 2, "r2");
        // "a" takes the only slot; everything after it waits.
        assert_eq!(dispatched(&s.on_arrival(3.0, arrival(3, "a", 10))), [3]);
        s.on_arrival(4.0, arrival(4, "n1", 10));
        s.on_arrival(5.0, arrival(5, "r2", 10));
        s.on_arrival(6.0, arrival(6, "n2", 10));
        s.on_arrival(7.0, arrival(7, "r1", 10));
        s.on_arrival(
            8.0,
            with(arrival(8, "sub", 10), |i| {
                i.parent_program_id = Some("a".into());
                i.blocks_parent = true;
            }),
        );
        s.on_arrival(9.0, with(arrival(9, "p", 10), |i| i.priority = 5));
        let mut got = Vec::new();
        let mut next = 3;
        for t in 0..6 {
            let d = s.on_complete(10.0 + f64::from(t), next, usage(10, 1));
            let ids = dispatched(&d);
            assert_eq!(ids.len(), 1, "{order:?} {d:?}");
            next = ids[0];
            got.push(next);
        }
        assert_eq!(got, want, "{order:?}");
    }
}

#[test]
fn most_turns_first_resumes_the_program_furthest_along() {
    // "long" has completed two turns and "short" one when both come back behind "a": `mru`
    // resumes the latest arrival, `resume_most_turns_first` the one with more turns done (here
    // whatever the queue's length; the gate is the next test's).
    for (most_turns, want) in [(false, [6, 5]), (true, [5, 6])] {
        let c = ProgramSchedulingConfig {
            resume_most_turns_first: most_turns,
            resume_most_turns_first_min_queued_ratio: 0.0,
            max_active_programs_per_target: 1,
            ..cfg()
        };
        let mut s = sched(c, 1);
        run_and_pause(&mut s, (0.0, 1.0), 1, "long");
        run_and_pause(&mut s, (1.5, 2.0), 2, "long");
        run_and_pause(&mut s, (2.5, 3.0), 3, "short");
        assert_eq!(dispatched(&s.on_arrival(3.5, arrival(4, "a", 10))), [4]);
        assert!(dispatched(&s.on_arrival(4.0, arrival(5, "long", 10))).is_empty());
        assert!(dispatched(&s.on_arrival(5.0, arrival(6, "short", 10))).is_empty());
        let first = dispatched(&s.on_complete(6.0, 4, usage(10, 1)));
        assert_eq!(first, [want[0]], "most turns first: {most_turns}");
        let second = dispatched(&s.on_complete(7.0, want[0], usage(10, 1)));
        assert_eq!(second, [want[1]], "most turns first: {most_turns}");
        s.check_invariants().expect("ledger");
    }
}

#[test]
fn most_turns_first_waits_for_a_queue_that_asks_for_the_set_share_of_capacity() {
    // As above, with a gate of 1 token in 1,000: a request arriving to an empty queue keeps
    // `mru`'s key, one arriving behind any queued demand is ordered by turns. "new" (a new
    // Program, which sorts after work in progress) fills the queue first where asked.
    for (ratio, new_first, want) in [
        (0.001, false, [6, 5]),
        (0.001, true, [5, 6]),
        (1_000.0, true, [6, 5]),
    ] {
        let c = ProgramSchedulingConfig {
            resume_most_turns_first: true,
            resume_most_turns_first_min_queued_ratio: ratio,
            token_capacity_per_dp_rank: Some(1_000),
            max_active_programs_per_target: 1,
            ..cfg()
        };
        let case = format!("ratio {ratio}, new Program queued first: {new_first}");
        let mut s = sched(c, 1);
        run_and_pause(&mut s, (0.0, 1.0), 1, "long");
        run_and_pause(&mut s, (1.5, 2.0), 2, "long");
        run_and_pause(&mut s, (2.5, 3.0), 3, "short");
        assert_eq!(dispatched(&s.on_arrival(3.5, arrival(4, "a", 10))), [4]);
        if new_first {
            assert!(dispatched(&s.on_arrival(3.7, arrival(7, "new", 10))).is_empty());
        }
        assert!(dispatched(&s.on_arrival(4.0, arrival(5, "long", 10))).is_empty());
        assert!(dispatched(&s.on_arrival(5.0, arrival(6, "short", 10))).is_empty());
        s.check_invariants().expect("queued demand");
        let first = dispatched(&s.on_complete(6.0, 4, usage(10, 1)));
        assert_eq!(first, [want[0]], "{case}");
        let second = dispatched(&s.on_complete(7.0, want[0], usage(10, 1)));
        assert_eq!(second, [want[1]], "{case}");
        s.check_invariants().expect("queued demand");
    }
}

#[test]
fn forced_requests_resume_oldest_first() {
    let c = ProgramSchedulingConfig {
        max_active_programs_per_target: 1,
        force_resume_timeout_seconds: 5.0,
        token_capacity_per_dp_rank: Some(100),
        ..cfg()
    };
    let mut s = sched(c, 1);
    // b and c have run, so MRU orders them newest first until they are forced.
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "b", 60))), [1]);
    assert!(dispatched(&s.on_complete(0.5, 1, usage(60, 1))).is_empty());
    assert_eq!(dispatched(&s.on_arrival(0.6, arrival(2, "c", 60))), [2]);
    assert!(dispatched(&s.on_complete(0.8, 2, usage(60, 1))).is_empty());
    assert_eq!(dispatched(&s.on_arrival(1.0, arrival(3, "a", 60))), [3]);
    s.on_arrival(1.5, arrival(4, "b", 62));
    s.on_arrival(2.0, arrival(5, "c", 62));
    // Both forced (deadlines 6.5 and 7) but the rank holds "a" and fits one of them at a time.
    assert!(dispatched(&s.on_tick(8.0)).is_empty());
    assert_eq!(dispatched(&s.on_complete(9.0, 3, usage(60, 1))), [4]);
    assert_eq!(dispatched(&s.on_complete(10.0, 4, usage(62, 1))), [5]);
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
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 900), 100.0));
    s.on_complete(0.5, 1, usage(900, 10));
    s.on_arrival(1.0, arrival(2, "b", 500));
    s.on_arrival(1.0, arrival(3, "c", 500));
    // (2 queued + itself + 1 active × 1 round) / measured requests per second (≈ 2).
    let rate = s.ranks[0].throughput.requests_per_second().expect("rate");
    assert!((s.force_resume_after(0) - 4.0 / rate).abs() < 1e-9);
    assert!(s.force_resume_after(0) < 3.0);
    // The waiting requests carry their own deadlines, shorter than the configured 300 s.
    let d = crate::program::diagnostics::snapshot(&s, 1.0, &[], 0.25, 10);
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
    let d = crate::program::diagnostics::snapshot(&s, 5.0, &[], 0.25, 10);
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
    s.on_arrival(0.1, with_ttl(arrival(1, "a", 10), 0.2));
    s.on_complete(0.1, 1, usage(10, 1));
    let t = s.next_deadline().expect("ttl timer");
    s.on_tick(t);
    let p = s.programs.iter().flatten().next().expect("program");
    assert!(matches!(p.phase, Phase::Paused { .. }), "{:?}", p.phase);
}

#[test]
fn a_queued_request_keeps_its_own_kv_retention_ttl_when_a_later_one_of_its_program_arrives() {
    // Program b's first request asks to keep its KV 8 s, its second 1 s; both wait behind a.
    let mut s = held_by_acting(cfg());
    assert!(
        s.on_arrival(1.0, with_ttl(arrival(2, "b", 900), 8.0))
            .is_empty()
    );
    assert!(
        s.on_arrival(1.5, with_ttl(arrival(3, "b", 900), 1.0))
            .is_empty()
    );
    // a's 100 s TTL runs out; b runs both requests.
    let d = s.on_tick(101.0);
    assert_eq!(dispatched(&d).len(), 2, "{d:?}");
    s.on_complete(102.0, 3, usage(900, 10));
    // The first request ends last: the TTL armed is its own 8 s, not the later request's 1 s.
    s.on_complete(103.0, 2, usage(900, 10));
    match find(&s, "b").phase {
        Phase::Acting { until } => assert_eq!(until, 111.0),
        other => panic!("b acts after its last request: {other:?}"),
    }
    s.check_invariants().expect("ledger");
}

#[test]
fn a_queued_request_of_an_already_active_program_reserves_what_it_needs() {
    // Program b waits with a large request and then a small one; resumed newest first, the
    // small one activates b, and the large one joins it: b's reservation must cover it too, as
    // it would had the large one arrived while b was active.
    let mut s = held_by_acting(cfg());
    assert!(s.on_arrival(1.0, arrival(2, "b", 800)).is_empty());
    assert!(
        s.on_arrival(1.5, arrival(3, "b", 100)).is_empty(),
        "90 tokens free: waits"
    );
    s.on_tick(101.0);
    let b = find(&s, "b");
    assert_eq!(b.in_flight, 2, "both run");
    assert!(
        b.reserved >= 800,
        "reserved {} for an 800-token prompt",
        b.reserved
    );
    s.check_invariants().expect("ledger");
}

/// Issue 32, bug 3: on one full rank, Program "h" waits at the head; "p"'s first request waits
/// behind it with a short deadline, its second with none. When the deadline forces the first
/// in, "p" is active: its second request needs no new capacity and goes with it, past the
/// blocked head, instead of waiting for its own force-resume.
#[test]
fn a_request_of_a_program_that_became_active_does_not_wait_behind_a_blocked_head() {
    let c = ProgramSchedulingConfig {
        resume_order: ResumeOrder::Fcfs,
        // Strict queue order: "p" would otherwise pass "h", a new Program with nothing cached.
        queue_backfill_depth: 0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 600), 100.0));
    s.on_complete(0.5, 1, usage(600, 10));
    assert!(dispatched(&s.on_arrival(1.0, arrival(2, "h", 500))).is_empty());
    let r1 = with(arrival(3, "p", 20), |i| i.deadline_seconds = Some(3.0));
    assert!(dispatched(&s.on_arrival(2.0, r1)).is_empty(), "behind h");
    assert!(dispatched(&s.on_arrival(2.1, arrival(4, "p", 20))).is_empty());
    let mut d = dispatched(&s.on_tick(5.0));
    d.sort();
    assert_eq!(d, vec![3, 4]);
    assert_eq!(find(&s, "p").retained, 0);
    s.check_invariants().expect("ledger");
}

/// The spec: a request's `deadline_seconds` overrides the force-resume wait — a longer one than
/// `force_resume_timeout_seconds` is not forced at the configured wait but at its deadline (the
/// queue limit still bounds it: a deadline never extends `queue_timeout_seconds`).
#[test]
fn a_request_deadline_overrides_the_force_resume_wait() {
    let c = ProgramSchedulingConfig {
        queue_timeout_seconds: 600.0,
        force_resume_timeout_seconds: 5.0,
        max_active_programs_per_target: 1,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 10), 100.0));
    s.on_complete(0.5, 1, usage(10, 1));
    s.on_arrival(
        1.0,
        with(arrival(2, "b", 10), |i| i.deadline_seconds = Some(20.0)),
    );
    s.on_arrival(1.0, arrival(3, "c", 10));
    // c, without a deadline, is forced at the configured wait; b waits for its own deadline.
    assert_eq!(dispatched(&s.on_tick(6.5)), [3]);
    assert!(dispatched(&s.on_tick(15.0)).is_empty());
    assert_eq!(dispatched(&s.on_tick(21.0)), [2]);
    assert_eq!(s.counters.queue_timeouts, 0);
    s.check_invariants().expect("ledger");
}

/// The drain estimate behind the workload-derived force-resume deadline counts each active
/// Program's expected rounds, capped by `max_segment_rounds`: a Program yields after that many
/// while others wait, so longer past activations say nothing about a rank with a queue.
#[test]
fn the_protected_rounds_estimate_is_capped_by_max_segment_rounds() {
    let drain = |max_segment_rounds: u32| {
        let c = ProgramSchedulingConfig {
            max_segment_rounds,
            ..cfg()
        };
        let mut s = sched(c, 1);
        s.on_arrival(0.0, arrival(1, "a", 10));
        for i in 0..16 {
            s.ranks[0].throughput.push(f64::from(i), 100);
        }
        s.ranks[0].segment_rounds.push(10.0);
        s.drain_seconds(0).expect("throughput measured")
    };
    // One active Program: 1 (the request) + 10 rounds uncapped, + 2 capped, over the same rate.
    let (long, capped) = (drain(14), drain(2));
    assert!(
        (long / capped - 11.0 / 3.0).abs() < 1e-9,
        "{long} vs {capped}"
    );
}

/// On a 1,000-token rank that runs one Program at a time, "big" (600 tokens) queues at 1 s and
/// "small" (60 tokens) at `small_at`; returns which of the two runs first.
fn first_of_two_new(order: ResumeOrder, aging: f64, small_at: f64) -> Ticket {
    let c = ProgramSchedulingConfig {
        resume_order: order,
        max_active_programs_per_target: 1,
        new_program_demand_aging_seconds: aging,
        ..cfg()
    };
    let mut s = sched(c, 1);
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "a", 10))), [1]);
    assert!(dispatched(&s.on_arrival(1.0, arrival(2, "big", 600))).is_empty());
    assert!(dispatched(&s.on_arrival(small_at, arrival(3, "small", 60))).is_empty());
    let d = s.on_complete(small_at + 1.0, 1, usage(10, 1));
    let ids = dispatched(&d);
    assert_eq!(ids.len(), 1, "{d:?}");
    s.check_invariants().expect("ledger");
    ids[0]
}

#[test]
fn new_programs_queue_by_arrival_aged_by_the_kv_they_ask_for() {
    // Aged 100 s × the share of the rank: big at 1 + 60 = 61 s, small at 2 + 6 = 8 s.
    assert_eq!(first_of_two_new(ResumeOrder::Mru, 100.0, 2.0), 3);
    assert_eq!(first_of_two_new(ResumeOrder::LastUse, 100.0, 2.0), 3);
    // Small arriving at 60 s sorts at 66 s: big has waited long enough to go first.
    assert_eq!(first_of_two_new(ResumeOrder::Mru, 100.0, 60.0), 2);
    // 0 is the spec's FCFS among new Programs, and `fcfs` never ages.
    assert_eq!(first_of_two_new(ResumeOrder::Mru, 0.0, 2.0), 2);
    assert_eq!(first_of_two_new(ResumeOrder::Fcfs, 100.0, 2.0), 2);
}
