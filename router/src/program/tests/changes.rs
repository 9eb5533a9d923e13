//! State kept across changes: re-targeting, tuning reloads, and Programs handed between
//! router replicas.

use super::*;

#[test]
fn retarget_keeps_surviving_ranks_state_under_their_new_index() {
    // r0 and r1; "a" acts on r1 with a 100 s TTL, "b" waits behind it there.
    let mut s = sched(cfg(), 2);
    let a = |t| with_ttl(arrival(t, "a", 900), 100.0);
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
    let long = |t, p: &str| with_ttl(arrival(t, p, 600), 100.0);
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
        finished: false,
        called_tool: false,
    };
    let done = HandedOver {
        program_id: "done".into(),
        finished: true,
        ..h.clone()
    };
    assert_eq!(s.adopt(0.0, &[h, done]), 2);
    let key = ("m".to_string(), "p".to_string());
    assert!(s.knows(&key));
    // A running Program counts as load on its rank; one whose last request finished does not.
    assert_eq!((s.ranks[1].members.len(), s.ranks[1].finished), (2, 1));
    s.check_invariants().expect("ledger");
    s.on_tick(cfg().paused_retention_ttl_seconds + 1.0);
    assert!(!s.knows(&key));
    s.check_invariants().expect("ledger");
}

#[test]
fn the_finished_mark_travels_between_replicas_and_is_optional_on_the_wire() {
    let wire = r#"{"model":"m","program_id":"p","root":"p","target":"r0","context_tokens":1,"idle_seconds":0}"#;
    let older: HandedOver = serde_json::from_str(wire).expect("a replica of an earlier version");
    assert!(!older.finished);
    assert!(
        !serde_json::to_string(&older)
            .expect("json")
            .contains("finished")
    );
    let done = HandedOver {
        finished: true,
        ..older
    };
    let back: HandedOver =
        serde_json::from_str(&serde_json::to_string(&done).expect("json")).expect("parses");
    assert!(back.finished);
}
