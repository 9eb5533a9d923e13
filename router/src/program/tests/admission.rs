//! Admission: token capacity and the empty-rank rule, the Program-count guard, vLLM's waiting
//! gate, capacity from `cache_config_info`, the shared-prefix discount, batch-gain admission and
//! passing a head that does not fit.

use super::*;

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
    let hold = |t, p: &str| with_ttl(arrival(t, p, 600), 100.0);
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
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 600), 100.0));
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

/// One rank whose interval window is mature, so freshness follows its KV turnover.
fn mature(turnovers: f64) -> Scheduler {
    let c = ProgramSchedulingConfig {
        stats_window_size: 2,
        shared_prefix_freshness_kv_turnovers: turnovers,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.ranks[0].intervals.push(1.0);
    s.ranks[0].intervals.push(1.0);
    s
}

#[test]
fn shared_prefix_freshness_follows_kv_turnover_once_mature() {
    let mut s = mature(2.0);
    // 500 tokens/s through a 1,000-token rank: one turnover every 2 s, two in 4 s.
    s.ranks[0].throughput.push(0.0, 500);
    s.ranks[0].throughput.push(1.0, 500);
    assert_eq!(s.shared_prefix_freshness(0), 4.0);
}

#[test]
fn kv_turnover_counts_only_the_kv_a_completion_newly_wrote() {
    let mut s = mature(1.0);
    let cached = |prompt, completion, cached| {
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
        })
    };
    s.on_arrival(0.0, arrival(1, "a", 600));
    s.on_complete(1.0, 1, cached(600, 100, 500));
    s.on_arrival(1.0, arrival(2, "b", 600));
    s.on_complete(2.0, 2, cached(600, 100, 500));
    // 200 new tokens a second (100 uncached prompt + 100 output), not the 700 each request
    // carried: a 1,000-token rank turns over every 5 s.
    assert_eq!(s.ranks[0].throughput.tokens_per_second(), Some(200.0));
    assert_eq!(s.shared_prefix_freshness(0), 5.0);
}

fn batch_gain_setup(enable: bool) -> (Scheduler, Vec<Decision>) {
    let c = ProgramSchedulingConfig {
        stats_window_size: 2,
        enable_batch_gain_admission: enable,
        // "a"'s rounds are one-round activations: reserve growth on this rank regardless.
        growth_reserve_min_rounds: 0.0,
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

/// The spec's capacity accounting: while the backend's observation is fresh, admission counts
/// what the backend reports (plus what the ledger changed since) when that is more than the
/// ledger — KV the router does not know of, such as another replica's Programs on the same
/// rank; once the observation is stale, the ledger alone.
#[test]
fn a_fresh_backend_observation_counts_kv_the_ledger_does_not_know() {
    let c = ProgramSchedulingConfig {
        metrics_interval_seconds: 1.0,
        ..cfg()
    };
    let mut s = sched(c, 1);
    // Program "a" holds 200 tokens by the ledger; the backend reports 90 % of 1,000 in use.
    s.on_arrival(0.0, with_ttl(arrival(1, "a", 190), 100.0));
    let busy = Observation {
        kv_usage: 0.9,
        ..Default::default()
    };
    s.on_observation(0.5, 0, busy);
    s.on_complete(0.6, 1, usage(190, 10));
    assert!(
        dispatched(&s.on_arrival(1.0, arrival(2, "b", 300))).is_empty(),
        "900 observed + 300 does not fit 1,000"
    );
    // Three intervals later the observation is stale: the ledger (200) decides, and the next
    // arrival's admission takes b as well.
    let mut d = dispatched(&s.on_arrival(4.0, arrival(3, "c", 300)));
    d.sort_unstable();
    assert_eq!(d, vec![2, 3]);
    s.check_invariants().expect("ledger");
}

/// Two Programs with a 400-token shared prefix keyed 7 observed at t = 1 on a rank whose
/// observations live 100 s, and a third with 300 tokens of another prefix, keyed 8.
fn shared_rank() -> Scheduler {
    let c = ProgramSchedulingConfig {
        token_capacity_per_dp_rank: Some(4000),
        // Growth complete (pushed below); the few intervals these tests make keep the
        // interval window immature, so observations live the 100 s warm-up lifetime.
        stats_window_size: 4,
        ..cfg()
    };
    let mut s = sched(c, 1);
    for _ in 0..4 {
        s.ranks[0].growth.push(0.0);
    }
    for (t, p, lead, cached) in [(1, "a", 7, 400), (2, "c", 7, 400), (3, "x", 8, 300)] {
        s.on_arrival(0.0, led(with_ttl(arrival(t, p, 600), 500.0), lead));
        let u = usage(600, 10).map(|u| Usage {
            cached_tokens: cached,
            ..u
        });
        s.on_complete(1.0, t, u);
    }
    assert_eq!(s.shared_prefix_freshness(0), 100.0);
    assert_eq!(s.shared_floor(0, 1.0), 400);
    assert_eq!(s.ranks[0].shared_lead, Some(7));
    s
}

/// The Program's next turn on its rank, with `cached` of its 700-token prompt found cached.
fn next_turn(s: &mut Scheduler, now: f64, ticket: Ticket, program: &str, lead: u64, cached: u64) {
    s.on_arrival(
        now,
        led(with_ttl(arrival(ticket, program, 700), 500.0), lead),
    );
    s.on_complete(
        now + 0.5,
        ticket,
        Some(Usage {
            prompt_tokens: 700,
            completion_tokens: 10,
            cached_tokens: cached,
        }),
    );
}

#[test]
fn a_later_hit_on_the_shared_prefix_renews_the_discount_and_the_rank_floor() {
    let mut s = shared_rank();
    // At t = 90, a's next turn finds its whole prompt cached: the shared prefix is resident.
    next_turn(&mut s, 90.0, 4, "a", 7, 690);
    // Past the first observation's lifetime, a and the floor count from the renewal; c, which
    // ran nothing since, reserves its prefix privately again.
    assert_eq!(s.fresh_shared(find(&s, "a"), 150.0), 400);
    assert_eq!(s.shared_floor(0, 150.0), 400);
    assert_eq!(s.fresh_shared(find(&s, "c"), 150.0), 0);
    assert_eq!(
        s.shared_floor(0, 191.0),
        0,
        "the renewal ages like an observation"
    );
    assert_eq!(s.shared_prefix_freshness(0), 100.0);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_hit_renews_nothing_when_the_prefix_is_not_the_floors_or_not_cached() {
    let mut s = shared_rank();
    // x's prefix is keyed 8, not the floor's 7: the floor does not count it, so no renewal.
    next_turn(&mut s, 90.0, 4, "x", 8, 690);
    assert_eq!(s.fresh_shared(find(&s, "x"), 150.0), 0);
    // a's next turn finds less than its shared prefix cached: no evidence of residency.
    next_turn(&mut s, 90.0, 5, "a", 7, 300);
    assert_eq!(s.fresh_shared(find(&s, "a"), 150.0), 0);
    assert_eq!(s.shared_floor(0, 150.0), 0);
    // Once the floor has expired, a hit with any key starts a new floor under that key.
    next_turn(&mut s, 150.0, 6, "x", 8, 690);
    assert_eq!(s.shared_floor(0, 200.0), 300);
    assert_eq!(s.ranks[0].shared_lead, Some(8));
    // A Program without a key (no prompt bytes seen) never renews.
    let mut s = shared_rank();
    s.on_arrival(90.0, with_ttl(arrival(7, "a", 700), 500.0));
    s.on_complete(
        90.5,
        7,
        usage(700, 10).map(|u| Usage {
            cached_tokens: 690,
            ..u
        }),
    );
    assert_eq!(s.fresh_shared(find(&s, "a"), 150.0), 0);
    s.check_invariants().expect("ledger");
}

/// One rank, queue in arrival order: "c", "d" and "big" ran and paused at once (the window is
/// immature, so the automatic TTL is 0); "a" (600) runs, and "big", back 0.7 s after its turn
/// with 500 tokens, waits at the head of the queue: a warm head, its prefix likely cached.
fn blocked_head(c: ProgramSchedulingConfig) -> Scheduler {
    let c = ProgramSchedulingConfig {
        resume_order: ResumeOrder::Fcfs,
        ..c
    };
    let mut s = sched(c, 1);
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "c", 100))), [1]);
    assert_eq!(dispatched(&s.on_arrival(0.2, arrival(2, "d", 100))), [2]);
    assert_eq!(dispatched(&s.on_arrival(0.3, arrival(3, "big", 100))), [3]);
    s.on_complete(1.0, 1, usage(100, 5));
    s.on_complete(1.2, 2, usage(100, 5));
    s.on_complete(1.3, 3, usage(100, 5));
    assert_eq!(dispatched(&s.on_arrival(1.5, arrival(4, "a", 600))), [4]);
    assert!(dispatched(&s.on_arrival(2.0, arrival(5, "big", 500))).is_empty());
    s
}

#[test]
fn a_request_back_from_a_long_tool_call_passes_a_head_that_does_not_fit() {
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 16,
        ..cfg()
    };
    let mut s = blocked_head(c);
    // "d" is back 1.8 s after its turn, within `max_acting_ttl_seconds`: it keeps its place.
    assert!(dispatched(&s.on_arrival(3.0, arrival(6, "d", 200))).is_empty());
    // "c" is back after 29 s, longer than any hold: it runs in the 400 tokens "big" cannot use.
    assert_eq!(dispatched(&s.on_arrival(30.0, arrival(7, "c", 200))), [7]);
    assert_eq!(s.counters.backfill_admissions, 1);
    assert!(s.take_notes().contains(&Note::Backfill { rank: 0 }));
    // The head still goes first once it fits; "d" follows in order.
    assert_eq!(dispatched(&s.on_complete(31.0, 4, usage(600, 5))), [5, 6]);
    s.check_invariants().expect("ledger");
}

#[test]
fn a_head_with_no_prefix_of_its_own_cached_is_passed_by_any_request_that_fits() {
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 16,
        resume_order: ResumeOrder::Fcfs,
        ..cfg()
    };
    // A new Program at the head: "d", back after 1.8 s, runs in the room "new" cannot use.
    let mut s = sched(c.clone(), 1);
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "d", 100))), [1]);
    s.on_complete(1.2, 1, usage(100, 5));
    assert_eq!(dispatched(&s.on_arrival(1.5, arrival(2, "a", 600))), [2]);
    assert!(dispatched(&s.on_arrival(2.0, arrival(3, "new", 500))).is_empty());
    assert_eq!(dispatched(&s.on_arrival(3.0, arrival(4, "d", 200))), [4]);
    assert_eq!(s.counters.backfill_admissions, 1);
    assert_eq!(dispatched(&s.on_complete(4.0, 2, usage(600, 5))), [3]);
    s.check_invariants().expect("ledger");

    // A Program back from a tool call longer than the rank's prefix freshness (the 100 s
    // warm-up lifetime while the interval window is immature) has nothing left to lose either.
    let mut s = sched(c, 1);
    assert_eq!(dispatched(&s.on_arrival(0.1, arrival(2, "old", 100))), [2]);
    s.on_complete(1.0, 2, usage(100, 5));
    assert_eq!(dispatched(&s.on_arrival(150.0, arrival(3, "a", 600))), [3]);
    assert!(dispatched(&s.on_arrival(151.0, arrival(4, "old", 500))).is_empty());
    // "n" is new, with no long tool calls to its name: only the cold head lets it pass.
    assert_eq!(dispatched(&s.on_arrival(152.0, arrival(5, "n", 200))), [5]);
    assert_eq!(s.counters.backfill_admissions, 1);
    s.check_invariants().expect("ledger");
}

#[test]
fn strict_queue_order_at_depth_0_and_behind_a_forced_head() {
    assert_eq!(ProgramSchedulingConfig::default().queue_backfill_depth, 16);
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 0,
        ..cfg()
    };
    let mut s = blocked_head(c);
    assert!(dispatched(&s.on_arrival(30.0, arrival(7, "c", 200))).is_empty());
    assert_eq!(s.counters.backfill_admissions, 0);

    // A head past its force-resume deadline is not passed.
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 16,
        force_resume_timeout_seconds: 5.0,
        ..cfg()
    };
    let mut s = blocked_head(c);
    s.on_tick(7.5);
    assert!(dispatched(&s.on_arrival(30.0, arrival(7, "c", 200))).is_empty());
    assert_eq!(s.counters.backfill_admissions, 0);

    // Nor is a head looked past beyond the depth: "d" (short gap) fills the one place looked at.
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 1,
        ..cfg()
    };
    let mut s = blocked_head(c);
    assert!(dispatched(&s.on_arrival(3.0, arrival(6, "d", 200))).is_empty());
    assert!(dispatched(&s.on_arrival(30.0, arrival(7, "c", 200))).is_empty());
    assert_eq!(s.counters.backfill_admissions, 0);
}

#[test]
fn only_programs_whose_tool_calls_mostly_outlast_any_hold_pass_the_head() {
    let c = ProgramSchedulingConfig {
        queue_backfill_depth: 16,
        resume_order: ResumeOrder::Fcfs,
        ..cfg()
    };
    let mut s = sched(c, 1);
    // "e" runs three turns 0.5 s apart, "c" one; each pauses at once (immature window).
    for (t, ticket) in [(0.0, 1), (1.0, 2), (2.0, 3)] {
        assert_eq!(
            dispatched(&s.on_arrival(t, arrival(ticket, "e", 100))),
            [ticket]
        );
        s.on_complete(t + 0.5, ticket, usage(100, 5));
    }
    assert_eq!(dispatched(&s.on_arrival(0.2, arrival(4, "c", 100))), [4]);
    s.on_complete(0.7, 4, usage(100, 5));
    // "big" ran too, so it is a warm head when it comes back below.
    assert_eq!(dispatched(&s.on_arrival(0.3, arrival(9, "big", 100))), [9]);
    s.on_complete(0.8, 9, usage(100, 5));
    assert_eq!(dispatched(&s.on_arrival(3.0, arrival(5, "a", 600))), [5]);
    assert!(dispatched(&s.on_arrival(4.0, arrival(6, "big", 500))).is_empty());
    // "e" is back after 27.5 s, but two of its three tool calls were short: it keeps its place.
    assert!(dispatched(&s.on_arrival(30.0, arrival(7, "e", 200))).is_empty());
    // A lower-priority request is not looked at, whatever its gaps.
    let low = with(arrival(8, "c", 100), |i| i.priority = -1);
    assert!(dispatched(&s.on_arrival(31.0, low)).is_empty());
    assert_eq!(s.counters.backfill_admissions, 0);
    s.check_invariants().expect("ledger");
}

/// `growth_reserve_min_rounds`: "big" (500 tokens) is admitted, then "c" (250) arrives on a
/// 1,000-token rank whose mean growth between completions is 200 tokens. With the growth
/// reserve both need 1,150 and "c" waits; without it, 750, and "c" runs. Returns whether "c"
/// was admitted and the ledger after.
fn second_fits(rounds: Option<f64>, min_rounds: f64) -> (bool, u64) {
    let c = ProgramSchedulingConfig {
        stats_window_size: 1,
        enable_batch_gain_admission: false,
        growth_reserve_min_rounds: min_rounds,
        ..cfg()
    };
    let mut s = sched(c, 1);
    s.ranks[0].growth.push(200.0);
    if let Some(r) = rounds {
        s.ranks[0].segment_rounds.push(r);
    }
    assert_eq!(dispatched(&s.on_arrival(0.0, arrival(1, "big", 500))), [1]);
    let admitted = dispatched(&s.on_arrival(0.1, arrival(2, "c", 250))) == [2];
    s.check_invariants().expect("ledger");
    (admitted, s.ranks[0].used_tokens)
}

#[test]
fn the_growth_reserve_is_taken_only_where_activations_are_long() {
    assert_eq!(
        second_fits(Some(4.0), 2.5),
        (false, 700),
        "4 rounds per activation: the next round's growth is reserved"
    );
    assert_eq!(
        second_fits(Some(2.0), 2.5),
        (true, 750),
        "2 rounds per activation: no growth reserve, both run"
    );
    assert_eq!(
        second_fits(None, 2.5),
        (false, 700),
        "no activation measured yet: reserved"
    );
    assert_eq!(
        second_fits(Some(2.0), 0.0),
        (false, 700),
        "0 always reserves (the spec's behaviour)"
    );
}
