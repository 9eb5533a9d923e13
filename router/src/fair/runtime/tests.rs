//! Tests of the fair queue's runtime: gates from observations, timeouts, quotas, reloads.

use super::*;
use crate::config::RouterConfig;
use crate::config::fairness::PriorityClass;
use crate::observe::scrape::EngineSample;
use crate::workers::{Scrape, TargetSet};
use prometheus::Registry;

fn class(name: &str, max_waiting: u32, idle: bool, tpot: Option<f64>) -> PriorityClass {
    PriorityClass {
        name: name.into(),
        max_waiting_requests: max_waiting,
        only_when_idle: idle,
        max_tpot_seconds: tpot,
    }
}

/// Two single-rank backends; returns the runtime and the targets to observe.
fn setup() -> (Arc<FairRuntime>, TargetSet) {
    let cfg = RouterConfig {
        workers: ["http://127.0.0.1:1", "http://127.0.0.1:2"]
            .iter()
            .map(|u| crate::config::WorkerConfig {
                url: (*u).into(),
                dp_rank: None,
            })
            .collect(),
        ..Default::default()
    };
    let metrics = crate::observe::metrics::Metrics::new().expect("metrics");
    let targets = TargetSet::build(&cfg, None, &metrics);
    let fair = FairnessConfig {
        classes: vec![
            class("interactive", 3, false, Some(0.15)),
            class("standard", 3, false, None),
            class("batch", 3, true, None),
        ],
        ..Default::default()
    };
    let rt = FairRuntime::new(
        fair,
        targets.targets.clone(),
        FairMetrics::new(&Registry::new()).expect("fair metrics"),
        Arc::new(Notify::new()),
    );
    (rt, targets)
}

/// A new observation of backend `i`: `waiting` requests, and ten tokens decoded at `tpot`
/// seconds each since the previous one (the latency histogram grows accordingly).
fn observe(t: &TargetSet, i: usize, waiting: f64, tpot: f64) {
    let prev = t.backends[i]
        .observed(0)
        .map(|(s, _)| s)
        .unwrap_or_default();
    let sample = EngineSample {
        waiting,
        itl_sum: prev.itl_sum + 10.0 * tpot,
        itl_count: prev.itl_count + 10.0,
        ..Default::default()
    };
    t.backends[i].set_observation(Scrape {
        at: Instant::now(),
        engines: [(0, sample)].into_iter().collect(),
    });
}

#[test]
fn class_gates_follow_waiting_tpot_idleness_and_staleness() {
    let (rt, t) = setup();
    // No observation at all: stale counts as saturated.
    assert_eq!(rt.allowances(&rt.lock()), vec![0, 0, 0]);
    // Both idle and fast: 3 + 3 for everyone, batch included.
    observe(&t, 0, 0.0, 0.05);
    observe(&t, 1, 0.0, 0.05);
    assert_eq!(rt.allowances(&rt.lock()), vec![6, 6, 6]);
    // One backend has 2 waiting: batch stops, the others lose 2.
    observe(&t, 1, 2.0, 0.05);
    assert_eq!(rt.allowances(&rt.lock()), vec![4, 4, 0]);
    // That backend is also slow: interactive gets nothing from it.
    observe(&t, 1, 2.0, 0.3);
    assert_eq!(rt.allowances(&rt.lock()), vec![3, 4, 0]);
    // Sends since the observation use the room up; completions give it back.
    rt.lock().sent_since_observation = 3;
    assert_eq!(rt.allowances(&rt.lock()), vec![0, 1, 0]);
    rt.lock().completed_since_observation = 2;
    assert_eq!(rt.allowances(&rt.lock()), vec![2, 3, 0]);
    rt.observed();
    assert_eq!(rt.allowances(&rt.lock()), vec![3, 4, 0]);
}

#[test]
fn tenant_and_class_come_from_the_configured_sources() {
    let (rt, _) = setup();
    let mut h = http::HeaderMap::new();
    assert_eq!(
        rt.tenant(&h, Some("u1"), None),
        "default",
        "header source ignores `user`"
    );
    h.insert("x-tenant-id", http::HeaderValue::from_static(" acme "));
    assert_eq!(rt.tenant(&h, None, Some("key-name")), "acme");
    assert_eq!(rt.class(&h, "acme"), "standard");
    h.insert("x-priority-class", http::HeaderValue::from_static("batch"));
    assert_eq!(rt.class(&h, "acme"), "batch");
    for (tenant, class, ok) in [
        ("acme", "interactive", true),
        ("anyone", "interactive", true),
    ] {
        assert_eq!(
            rt.check_class(tenant, class).is_ok(),
            ok,
            "{tenant} {class}"
        );
    }
    let mut capped = (**rt.cfg()).clone();
    capped.max_class = Some("standard".into());
    capped
        .tenant_max_classes
        .insert("acme".into(), "interactive".into());
    capped
        .tenant_max_classes
        .insert("evals".into(), "batch".into());
    capped.tenant_classes.insert("evals".into(), "batch".into());
    capped.validate().expect("valid");
    assert!(rt.reconfigure(&capped), "a ceiling keeps the queue");
    for (tenant, class, ok) in [
        ("acme", "interactive", true),
        ("anyone", "interactive", false),
        ("anyone", "standard", true),
        ("anyone", "batch", true),
        ("evals", "standard", false),
        ("evals", "batch", true),
        ("anyone", "gold", true),
    ] {
        assert_eq!(
            rt.check_class(tenant, class).is_ok(),
            ok,
            "{tenant} {class}"
        );
    }
    assert_eq!(
        rt.check_class("anyone", "interactive"),
        Err(FairError::ClassNotAllowed {
            class: "interactive".into(),
            max: "standard".into()
        })
    );

    let mut cfg = (**rt.cfg()).clone();
    cfg.tenant_source = TenantSource::ApiKey;
    cfg.tenant_classes
        .insert("key-x".into(), "interactive".into());
    let (_, t) = setup();
    let rt = FairRuntime::new(
        cfg,
        t.targets.clone(),
        FairMetrics::new(&Registry::new()).expect("m"),
        Arc::new(Notify::new()),
    );
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer sk-secret"),
    );
    let tenant = rt.tenant(&h, None, None);
    assert!(
        tenant.starts_with("key-") && !tenant.contains("secret"),
        "{tenant}"
    );
    assert_eq!(tenant, rt.tenant(&h, None, None), "stable");
    let unkeyed = format!("key-{:016x}", crate::hash::fnv1a(b"sk-secret"));
    assert_ne!(tenant, unkeyed, "not a plain hash of the key");
    assert_eq!(
        rt.tenant(&h, None, Some("search-team")),
        "search-team",
        "a checked key's name is the tenant"
    );
    assert_eq!(rt.class(&http::HeaderMap::new(), "key-x"), "interactive");
}

#[test]
fn a_tuning_reconfigure_keeps_the_queue_and_a_new_class_list_does_not() {
    let (rt, t) = setup();
    observe(&t, 0, 0.0, 0.05);
    observe(&t, 1, 0.0, 0.05);
    assert_eq!(rt.allowances(&rt.lock()), vec![6, 6, 6]);
    rt.lock()
        .queue
        .push(rt.now(), 1, "acme", "standard", 100)
        .expect("queued");
    let mut wider = (**rt.cfg()).clone();
    wider.classes[1].max_waiting_requests = 5;
    wider.tenant_weights.insert("acme".into(), 2.0);
    assert!(rt.reconfigure(&wider));
    assert_eq!(rt.allowances(&rt.lock()), vec![6, 10, 6]);
    assert_eq!(rt.weight("acme"), 2.0);
    assert_eq!(rt.lock().queue.queued(1), 1, "the queued request stayed");
    let mut renamed = wider.clone();
    renamed.classes[2].name = "bulk".into();
    assert!(!rt.reconfigure(&renamed));
    let mut other = wider;
    other.discipline = FairDiscipline::RoundRobin;
    assert!(!rt.reconfigure(&other));
    assert_eq!(
        rt.cfg().classes[2].name,
        "batch",
        "refused changes are not taken"
    );
}
