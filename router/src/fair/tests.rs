//! Fair queueing: class order, gates, VTC and round robin, limits, timeouts, and the VTC bound.

use super::*;

fn params(discipline: Discipline) -> FairParams {
    FairParams {
        discipline,
        classes: vec!["interactive".into(), "standard".into(), "batch".into()],
        input_weight: 1.0,
        output_weight: 2.0,
        tenant_weights: FxHashMap::default(),
        max_queue_per_tenant: 1000,
        queue_timeout: 60.0,
    }
}

fn open(_: usize) -> bool {
    true
}

#[test]
fn classes_are_strict_and_gates_hold_a_class_back() {
    let mut q = FairQueue::new(params(Discipline::Vtc));
    q.push(0.0, 1, "a", "batch", 10).expect("push");
    q.push(0.0, 2, "a", "standard", 10).expect("push");
    q.push(0.0, 3, "b", "interactive", 10).expect("push");
    let order: Vec<QueueTicket> =
        std::iter::from_fn(|| q.pop(1.0, open).map(|d| d.ticket)).collect();
    assert_eq!(order, [3, 2, 1]);
    // Batch only while the gate says the backend is idle.
    q.push(2.0, 4, "a", "batch", 10).expect("push");
    assert_eq!(q.pop(2.0, |c| c != 2), None);
    assert_eq!(q.pop(2.0, open).map(|d| d.ticket), Some(4));
    assert_eq!(
        q.push(0.0, 5, "a", "gold", 1),
        Err(Refused::UnknownClass("gold".into()))
    );
}

#[test]
fn a_power_user_does_not_starve_light_tenants() {
    for d in [Discipline::Vtc, Discipline::RoundRobin] {
        let mut q = FairQueue::new(params(d));
        for i in 0..200 {
            q.push(0.0, i, "power", "standard", 500).expect("push");
        }
        for (i, t) in ["l1", "l2", "l3", "l4", "l5"].iter().enumerate() {
            q.push(0.1, 1000 + i as u64, t, "standard", 500)
                .expect("push");
        }
        // Every light tenant is served within the first six dispatches.
        let first: Vec<String> = (0..6)
            .filter_map(|_| q.pop(1.0, open))
            .map(|d| d.tenant)
            .collect();
        for t in ["l1", "l2", "l3", "l4", "l5"] {
            assert!(first.iter().any(|x| x == t), "{d:?}: {t} not in {first:?}");
        }
    }
}

#[test]
fn vtc_is_token_fair_where_round_robin_is_request_fair() {
    let mut q = FairQueue::new(params(Discipline::Vtc));
    // `big` sends 10x larger prompts; both stay backlogged.
    for i in 0..100 {
        q.push(0.0, i, "big", "standard", 1000).expect("push");
        q.push(0.0, 1000 + i, "small", "standard", 100)
            .expect("push");
    }
    let served: Vec<String> = (0..55)
        .filter_map(|_| q.pop(1.0, open))
        .map(|d| d.tenant)
        .collect();
    let small = served.iter().filter(|t| *t == "small").count();
    assert!(
        small >= 45,
        "small gets ~10 requests per big one under VTC: {small}/55"
    );
}

#[test]
fn an_idle_tenant_earns_no_credit() {
    let mut q = FairQueue::new(params(Discipline::Vtc));
    for i in 0..50 {
        q.push(0.0, i, "busy", "standard", 100).expect("push");
    }
    for _ in 0..40 {
        q.pop(1.0, open);
    }
    q.push(2.0, 999, "late", "standard", 100).expect("push");
    assert_eq!(
        q.counter(1, "late"),
        q.counter(1, "busy"),
        "lifted to the busy tenant's counter"
    );
}

#[test]
fn weights_shift_the_share() {
    let mut p = params(Discipline::Vtc);
    p.tenant_weights.insert("gold".into(), 3.0);
    let mut q = FairQueue::new(p);
    for i in 0..100 {
        q.push(0.0, i, "gold", "standard", 100).expect("push");
        q.push(0.0, 1000 + i, "free", "standard", 100)
            .expect("push");
    }
    let served: Vec<String> = (0..40)
        .filter_map(|_| q.pop(1.0, open))
        .map(|d| d.tenant)
        .collect();
    let gold = served.iter().filter(|t| *t == "gold").count();
    assert!(
        (29..=31).contains(&gold),
        "weight 3 gets ~3/4 of the service: {gold}/40"
    );
}

#[test]
fn limits_timeouts_and_cancel_lose_nothing() {
    let mut p = params(Discipline::Vtc);
    p.max_queue_per_tenant = 2;
    p.queue_timeout = 5.0;
    let mut q = FairQueue::new(p);
    q.push(0.0, 1, "a", "standard", 1).expect("push");
    q.push(1.0, 2, "a", "standard", 1).expect("push");
    assert_eq!(
        q.push(1.0, 3, "a", "standard", 1),
        Err(Refused::TenantQueueFull("a".into()))
    );
    assert!(q.cancel(2));
    assert!(!q.cancel(2));
    assert_eq!(q.expire(4.9), Vec::<QueueTicket>::new());
    assert_eq!(q.expire(5.0), vec![1]);
    assert_eq!(q.queued(1), 0);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// VTC's bound: for tenants that stay backlogged, weighted service never differs by more
        /// than 2·max(w_in·L_in, w_out·M) (here the output of each dispatch is charged at once).
        #[test]
        fn vtc_bound_holds_for_backlogged_tenants(
            tenants in 2usize..6,
            sizes in proptest::collection::vec((1u64..2000, 1u64..500), 50..400),
        ) {
            let (l_in, m) = (2000.0, 500.0);
            let p = params(Discipline::Vtc);
            let bound = 2.0 * (p.input_weight * l_in).max(p.output_weight * m);
            let mut q = FairQueue::new(p);
            // Everyone has more queued than will be served: continuously backlogged.
            let mut ticket = 0;
            for (i, (input, _)) in sizes.iter().enumerate() {
                for t in 0..tenants {
                    ticket += 1;
                    q.push(0.0, ticket, &format!("t{t}"), "standard", *input + (i as u64 * 7 + t as u64 * 13) % 100).expect("push");
                }
            }
            for (_, output) in &sizes {
                let d = q.pop(1.0, open).expect("backlogged");
                q.complete(&d, *output);
                let counters: Vec<f64> = (0..tenants).filter_map(|t| q.counter(1, &format!("t{t}"))).collect();
                let spread = counters.iter().cloned().fold(f64::MIN, f64::max) - counters.iter().cloned().fold(f64::MAX, f64::min);
                prop_assert!(spread <= bound, "spread {} > bound {}", spread, bound);
            }
        }
    }
}

#[test]
fn idle_tenants_are_forgotten_without_changing_order() {
    let mut q = FairQueue::new(FairParams {
        discipline: Discipline::Vtc,
        classes: vec!["c".into()],
        input_weight: 1.0,
        output_weight: 2.0,
        tenant_weights: Default::default(),
        max_queue_per_tenant: 10,
        queue_timeout: 1e9,
    });
    // Many one-off tenants (say, hashed API keys) come and go.
    for i in 0..5000u64 {
        q.push(0.0, i, &format!("k{i}"), "c", 10).expect("push");
        let d = q.pop(0.0, |_| true).expect("pop");
        q.complete(&d, 5);
    }
    assert!(
        q.classes[0].tenants.len() <= MAX_IDLE_TENANTS + 1,
        "{}",
        q.classes[0].tenants.len()
    );
    // A backlogged tenant keeps its counter and place.
    q.push(1.0, 10_000, "busy", "c", 100).expect("push");
    q.push(1.0, 10_001, "busy", "c", 100).expect("push");
    q.push(1.0, 10_002, "new", "c", 100).expect("push");
    let first = q.pop(1.0, |_| true).expect("pop");
    let second = q.pop(1.0, |_| true).expect("pop");
    assert_ne!(
        first.tenant, second.tenant,
        "VTC alternates between the two"
    );
}
