//! Table tests of the conditions a reconcile's observations imply.

use super::*;

fn healthy(pod: &str, hash: &str) -> RouterReport {
    RouterReport::Status {
        pod: pod.into(),
        file_hash: Some(hash.into()),
        settings_hash: Some(format!("s-{hash}")),
        targets: 4,
        healthy_targets: 4,
        last_reload_error: None,
        client_keys_error: None,
    }
}

fn good() -> Facts {
    Facts {
        workers: Ok((2, 4)),
        render_error: None,
        desired_hash: Some("h1".into()),
        desired_settings: Some("s-h1".into()),
        deployment: (2, 2),
        routers: vec![healthy("r-a", "h1"), healthy("r-b", "h1")],
        calibration: Calibration::Reference,
        affinity: Affinity::Split(2),
        client_keys_secret: false,
    }
}

#[test]
fn refused_client_keys_are_said_and_do_not_affect_ready() {
    let mut o = good();
    assert_eq!(get(&evaluate(&o), CLIENT_KEYS).reason, "NotUsed");
    o.client_keys_secret = true;
    assert_eq!(get(&evaluate(&o), CLIENT_KEYS).reason, "Loaded");
    o.routers[1] = RouterReport::Status {
        pod: "r-b".into(),
        file_hash: Some("h1".into()),
        settings_hash: None,
        targets: 4,
        healthy_targets: 4,
        last_reload_error: None,
        client_keys_error: Some("the key directory /k holds no key".into()),
    };
    let cs = evaluate(&o);
    let c = get(&cs, CLIENT_KEYS);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "KeysRefused")
    );
    assert!(
        c.message.contains("r-b: the key directory /k holds no key"),
        "{}",
        c.message
    );
    assert_eq!(
        get(&cs, READY).status,
        "True",
        "the previous keys still serve"
    );
}

#[test]
fn a_router_with_every_setting_but_an_older_member_list_runs_the_config() {
    // The member list of `peers` changes with every router pod and reaches the routers at
    // the kubelet's pace: it does not hold ConfigApplied (and so Ready) back.
    let mut o = good();
    o.desired_hash = Some("h2".into());
    o.routers[1] = RouterReport::Status {
        pod: "r-b".into(),
        file_hash: Some("h1".into()),
        settings_hash: Some("s-h1".into()),
        targets: 4,
        healthy_targets: 4,
        last_reload_error: None,
        client_keys_error: None,
    };
    assert_eq!(get(&evaluate(&o), CONFIG_APPLIED).status, "True");
    // A setting that differs does.
    o.desired_settings = Some("s-h2".into());
    let cs = evaluate(&o);
    let c = get(&cs, CONFIG_APPLIED);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Pending"));
    // A router that reports no settings hash (older) is compared by its file.
    o.routers[1] = healthy("r-b", "h2");
    if let RouterReport::Status { settings_hash, .. } = &mut o.routers[1] {
        *settings_hash = None;
    }
    assert_eq!(get(&evaluate(&o), CONFIG_APPLIED).status, "False");
    o.routers[0] = healthy("r-a", "h2");
    assert_eq!(get(&evaluate(&o), CONFIG_APPLIED).status, "True");
}

fn get<'a>(cs: &'a [Condition], t: &str) -> &'a Condition {
    cs.iter().find(|c| c.type_ == t).expect("present")
}

#[test]
fn all_parts_true_is_ready_and_calibration_does_not_matter() {
    let cs = evaluate(&good());
    assert_eq!(get(&cs, READY).status, "True");
    let c = get(&cs, CALIBRATED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ReferenceCoefficients")
    );
}

#[test]
fn calibrated_needs_every_fitted_coefficient() {
    use crate::crd::ProgramSchedulingParams;
    let state = |spec: Option<serde_json::Value>| {
        let params =
            spec.map(|v| serde_json::from_value::<ProgramSchedulingParams>(v).expect("params"));
        let mut o = good();
        o.calibration = calibration(params.map(|p| p.uncalibrated()));
        let cs = evaluate(&o);
        let c = get(&cs, CALIBRATED);
        (c.status.clone(), c.reason.clone(), c.message.clone())
    };
    let prefill = serde_json::json!({
        "interceptSeconds": 0.05, "linearSecondsPer1kTokens": 0.03,
        "quadraticSecondsPer1kTokensSquared": 0.002
    });
    let decode = serde_json::json!({
        "fixedStepSeconds": 0.01, "batchStepSecondsPerRequest": 0.0004,
        "contextStepSecondsPerToken": 1.4e-7
    });
    assert_eq!(state(None).1, "NotUsed");
    let (status, why, _) = state(Some(
        serde_json::json!({"prefillCostModel": prefill, "decodeThroughputModel": decode}),
    ));
    assert_eq!((status.as_str(), why.as_str()), ("True", "Configured"));
    let (status, why, msg) = state(Some(serde_json::json!({"prefillCostModel": prefill})));
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", "PartiallyCalibrated")
    );
    assert!(
        msg.contains("programScheduling.decodeThroughputModel.fixedStepSeconds")
            && !msg.contains("prefillCostModel"),
        "{msg}"
    );
    // An empty model object gives no coefficient.
    let (_, why, _) = state(Some(serde_json::json!({"prefillCostModel": {}})));
    assert_eq!(why, "ReferenceCoefficients");
    let (_, why, msg) = state(Some(serde_json::json!({
        "prefillCostModel": {"interceptSeconds": 0.05},
        "decodeThroughputModel": decode
    })));
    assert_eq!(why, "PartiallyCalibrated");
    assert!(
        msg.contains("prefillCostModel.linearSecondsPer1kTokens")
            && msg.contains("prefillCostModel.quadraticSecondsPer1kTokensSquared")
            && !msg.contains("interceptSeconds"),
        "{msg}"
    );
    let (status, why, msg) = state(Some(serde_json::json!({})));
    assert_eq!(
        (status.as_str(), why.as_str()),
        ("False", "ReferenceCoefficients")
    );
    assert!(msg.contains("decodeThroughputModel"), "{msg}");
}

#[test]
fn split_program_state_is_reported_and_does_not_affect_ready() {
    let cs = evaluate(&good());
    assert_eq!(get(&cs, READY).status, "True");
    let c = get(&cs, PROGRAM_AFFINITY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "SplitAcrossReplicas")
    );
    assert!(c.message.contains("2 router replicas"), "{}", c.message);
    assert_eq!(affinity(false, 3, true, "None"), Affinity::NotUsed);
    assert_eq!(affinity(true, 1, false, "None"), Affinity::SingleReplica);
    assert_eq!(affinity(true, 0, true, "None"), Affinity::SingleReplica);
    assert_eq!(
        affinity(true, 3, true, "ClientIP"),
        Affinity::PeerForwarding(3)
    );
    assert_eq!(affinity(true, 3, false, "ClientIP"), Affinity::ClientIp);
    assert_eq!(affinity(true, 3, false, "None"), Affinity::Split(3));
    for (a, reason) in [
        (Affinity::PeerForwarding(2), "PeerForwarding"),
        (Affinity::NotUsed, "NotUsed"),
        (Affinity::SingleReplica, "SingleReplica"),
        (Affinity::ClientIp, "ClientIPAffinity"),
    ] {
        let cs = evaluate(&Facts {
            affinity: a,
            ..good()
        });
        let c = get(&cs, PROGRAM_AFFINITY);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason));
    }
}

#[test]
fn ready_false_carries_the_first_failing_reason() {
    type Change = Box<dyn Fn(&mut Facts)>;
    let table: Vec<(Change, &str, &str)> = vec![
        (
            Box::new(|o| o.workers = Ok((0, 0))),
            WORKERS_DISCOVERED,
            "NoWorkers",
        ),
        (
            Box::new(|o| o.workers = Err("pods a and b both claim global DP rank 0".into())),
            WORKERS_DISCOVERED,
            "DiscoveryFailed",
        ),
        (
            Box::new(|o| o.routers[1] = healthy("r-b", "h0")),
            CONFIG_APPLIED,
            "Pending",
        ),
        (
            Box::new(|o| {
                o.routers[0] = RouterReport::Unreachable {
                    pod: "r-a".into(),
                    error: "connection refused".into(),
                }
            }),
            CONFIG_APPLIED,
            "StatusUnreachable",
        ),
        (Box::new(|o| o.routers.clear()), CONFIG_APPLIED, "NoRouters"),
        (
            Box::new(|o| o.desired_hash = None),
            CONFIG_APPLIED,
            "NotRendered",
        ),
        (
            Box::new(|o| o.deployment = (2, 0)),
            ROUTER_AVAILABLE,
            "Unavailable",
        ),
        (
            Box::new(|o| o.deployment = (0, 0)),
            ROUTER_AVAILABLE,
            "ScaledToZero",
        ),
        (
            Box::new(|o| {
                o.routers[0] = RouterReport::Status {
                    pod: "r-a".into(),
                    file_hash: Some("h1".into()),
                    settings_hash: None,
                    targets: 4,
                    healthy_targets: 0,
                    last_reload_error: None,
                    client_keys_error: None,
                }
            }),
            BACKENDS_OBSERVED,
            "NoHealthyBackends",
        ),
        (
            Box::new(|o| o.render_error = Some("router.port: not a TCP port".into())),
            READY,
            "InvalidSpec",
        ),
    ];
    for (change, part, reason) in table {
        let mut o = good();
        change(&mut o);
        let cs = evaluate(&o);
        let c = get(&cs, part);
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", reason));
        let r = get(&cs, READY);
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", reason));
        assert!(!r.message.is_empty());
    }
}

#[test]
fn refused_reload_is_named_in_the_pending_message() {
    let mut o = good();
    o.routers[0] = RouterReport::Status {
        pod: "r-a".into(),
        file_hash: Some("h0".into()),
        settings_hash: None,
        targets: 4,
        healthy_targets: 4,
        last_reload_error: Some("workers[0].url: bad".into()),
        client_keys_error: None,
    };
    let cs = evaluate(&o);
    assert!(
        get(&cs, CONFIG_APPLIED)
            .message
            .contains("r-a (reload refused: workers[0].url: bad)")
    );
}

#[test]
fn merge_keeps_transition_time_when_status_holds_and_reports_changes() {
    let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).expect("t"));
    let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).expect("t"));
    let (first, tr) = merge(&[], evaluate(&good()), Some(1), t0.clone());
    assert_eq!(tr.len(), first.len(), "every condition appears once");
    assert!(first.iter().all(|c| c.observed_generation == Some(1)));

    // Same statuses, new message: no transition, time kept.
    let mut o = good();
    o.workers = Ok((3, 6));
    let (second, tr) = merge(&first, evaluate(&o), Some(2), t1.clone());
    assert!(tr.is_empty());
    assert!(second.iter().all(|c| c.last_transition_time == t0));
    assert_eq!(
        get(&second, WORKERS_DISCOVERED).message,
        "3 worker pods, 6 DP-rank targets"
    );

    // Workers lost: two transitions (the part and Ready), only they get the new time.
    o.workers = Ok((0, 0));
    let (third, tr) = merge(&second, evaluate(&o), Some(2), t1.clone());
    let types: Vec<&str> = tr.iter().map(|t| t.type_.as_str()).collect();
    assert_eq!(types, vec![READY, WORKERS_DISCOVERED]);
    assert_eq!(get(&third, READY).last_transition_time, t1);
    assert_eq!(get(&third, CONFIG_APPLIED).last_transition_time, t0);
}
