//! Status conditions as a pure function of what one reconcile observed, and the merge rule that
//! keeps `lastTransitionTime` when a condition's status did not change.
//!
//! `Ready` is True only when workers were discovered, the spec rendered, the rendered config is
//! applied by every ready router, the router Deployment is available and the routers observe
//! healthy backends; otherwise it is False with the reason of the first failing part.
//! `Calibrated` and `ProgramAffinity` are informational and never affect `Ready`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const READY: &str = "Ready";
pub const WORKERS_DISCOVERED: &str = "WorkersDiscovered";
pub const CONFIG_APPLIED: &str = "ConfigApplied";
pub const ROUTER_AVAILABLE: &str = "RouterAvailable";
pub const BACKENDS_OBSERVED: &str = "BackendsObserved";
pub const CALIBRATED: &str = "Calibrated";
pub const PROGRAM_AFFINITY: &str = "ProgramAffinity";
pub const CLIENT_KEYS: &str = "ClientKeys";

/// What one router pod's `/status` said (or that it could not be read).
#[derive(Debug, Clone, PartialEq)]
pub enum RouterReport {
    Status {
        pod: String,
        file_hash: Option<String>,
        /// The hash of every setting but `peers`' member list (routers before 2026-12-01 do
        /// not report it).
        settings_hash: Option<String>,
        targets: usize,
        healthy_targets: usize,
        last_reload_error: Option<String>,
        /// Why the router keeps its previous client keys (`clientApiKeysSecret` unreadable).
        client_keys_error: Option<String>,
    },
    Unreachable {
        pod: String,
        error: String,
    },
}

/// Everything a reconcile learned, in the order `Ready` checks it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// Ready worker pods and their ranks, or why discovery failed.
    pub workers: Result<(usize, usize), String>,
    /// Why the spec could not be rendered (the last good config stays in the ConfigMap).
    pub render_error: Option<String>,
    /// Hash of the config the ConfigMap holds now (`None` before the first good render).
    pub desired_hash: Option<String>,
    /// The settings hash of that file (see `RouterReport::Status::settings_hash`).
    pub desired_settings: Option<String>,
    /// Router Deployment: (desired replicas, available replicas).
    pub deployment: (i32, i32),
    /// One report per Ready router pod with an IP.
    pub routers: Vec<RouterReport>,
    /// Program scheduling on, and which fitted coefficients were given.
    pub calibration: Calibration,
    /// Whether each Program's requests reach one router replica.
    pub affinity: Affinity,
    /// Whether the routers read named client keys from `clientApiKeysSecret`.
    pub client_keys_secret: bool,
}

/// Program scheduling keeps its state (bindings, RequestPool, TTLs, the KV ledger) in each router
/// replica; whether a Program's requests can reach more than one of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Affinity {
    /// Program scheduling is off: request-level policies need no affinity.
    NotUsed,
    /// At most one router replica.
    SingleReplica,
    /// The replicas forward each Program's requests to one owner replica (`peerForwarding`).
    PeerForwarding(i32),
    /// The Service keeps each client on one replica (`sessionAffinity: ClientIP`).
    ClientIp,
    /// Program scheduling on, this many replicas, and nothing keeps a Program on one of them.
    Split(i32),
}

/// Where Program scheduling's two cost models come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Calibration {
    NotUsed,
    /// No fitted coefficient given: both models use the reference values.
    Reference,
    /// Some given; these spec fields use the reference values.
    Partial {
        missing: Vec<&'static str>,
    },
    /// Every fitted coefficient of both models given.
    Configured,
}

/// The [`Calibration`] of a spec from the fitted coefficients it leaves unset (see
/// `ProgramSchedulingParams::uncalibrated`; `None` = Program scheduling off).
pub fn calibration(missing: Option<Vec<&'static str>>) -> Calibration {
    match missing {
        None => Calibration::NotUsed,
        Some(m) if m.is_empty() => Calibration::Configured,
        Some(m) if m.len() == crate::crd::FITTED_COEFFICIENTS.len() => Calibration::Reference,
        Some(missing) => Calibration::Partial { missing },
    }
}

/// The [`Affinity`] of a spec: Program scheduling on or off, router replicas, forwarding between
/// them, and the router Service's session affinity.
pub fn affinity(
    program_scheduling: bool,
    replicas: i32,
    peer_forwarding: bool,
    session_affinity: &str,
) -> Affinity {
    if !program_scheduling {
        Affinity::NotUsed
    } else if replicas <= 1 {
        Affinity::SingleReplica
    } else if peer_forwarding {
        Affinity::PeerForwarding(replicas)
    } else if session_affinity == "ClientIP" {
        Affinity::ClientIp
    } else {
        Affinity::Split(replicas)
    }
}

fn cond(type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// The conditions `obs` implies, without times or generation.
pub fn evaluate(obs: &Observed) -> Vec<Condition> {
    let workers = match &obs.workers {
        Ok((0, _)) => cond(
            WORKERS_DISCOVERED,
            false,
            "NoWorkers",
            "no Ready worker pod with an IP matches workerSelector".into(),
        ),
        Ok((pods, ranks)) => cond(
            WORKERS_DISCOVERED,
            true,
            "Discovered",
            format!("{pods} worker pods, {ranks} DP-rank targets"),
        ),
        Err(e) => cond(WORKERS_DISCOVERED, false, "DiscoveryFailed", e.clone()),
    };

    let (desired, available) = obs.deployment;
    let router = if desired == 0 {
        cond(
            ROUTER_AVAILABLE,
            false,
            "ScaledToZero",
            "router.replicas is 0".into(),
        )
    } else if available >= 1 {
        cond(
            ROUTER_AVAILABLE,
            true,
            "Available",
            format!("{available}/{desired} router replicas available"),
        )
    } else {
        cond(
            ROUTER_AVAILABLE,
            false,
            "Unavailable",
            format!("0/{desired} router replicas available"),
        )
    };

    // A router runs the rendered config when it runs that file, or every setting of it with an
    // older member list of `peers` (which changes with every router pod and reaches each router
    // at the kubelet's pace; the replicas tolerate a stale list).
    let current = |file: &Option<String>, settings: &Option<String>| {
        (obs.desired_hash.is_some() && *file == obs.desired_hash)
            || (obs.desired_settings.is_some() && *settings == obs.desired_settings)
    };
    let statuses: Vec<_> = obs
        .routers
        .iter()
        .filter_map(|r| match r {
            RouterReport::Status {
                pod,
                file_hash,
                settings_hash,
                targets,
                healthy_targets,
                last_reload_error,
                ..
            } => Some((
                pod,
                current(file_hash, settings_hash),
                *targets,
                *healthy_targets,
                last_reload_error,
            )),
            RouterReport::Unreachable { .. } => None,
        })
        .collect();
    let unreachable: Vec<String> = obs
        .routers
        .iter()
        .filter_map(|r| match r {
            RouterReport::Unreachable { pod, error } => Some(format!("{pod}: {error}")),
            RouterReport::Status { .. } => None,
        })
        .collect();

    let applied = match &obs.desired_hash {
        None => cond(
            CONFIG_APPLIED,
            false,
            "NotRendered",
            "no router config has been rendered yet".into(),
        ),
        Some(_) if obs.routers.is_empty() => cond(
            CONFIG_APPLIED,
            false,
            "NoRouters",
            "no Ready router pod to apply the config".into(),
        ),
        Some(_) if !unreachable.is_empty() => cond(
            CONFIG_APPLIED,
            false,
            "StatusUnreachable",
            format!("router /status unreadable: {}", unreachable.join("; ")),
        ),
        Some(want) => {
            let behind: Vec<String> = statuses
                .iter()
                .filter(|s| !s.1)
                .map(|s| match s.4 {
                    Some(e) => format!("{} (reload refused: {e})", s.0),
                    None => s.0.to_string(),
                })
                .collect();
            if behind.is_empty() {
                cond(
                    CONFIG_APPLIED,
                    true,
                    "Applied",
                    format!("{} routers run config {want}", statuses.len()),
                )
            } else {
                cond(
                    CONFIG_APPLIED,
                    false,
                    "Pending",
                    format!(
                        "{} of {} routers not yet on config {want}: {}",
                        behind.len(),
                        statuses.len(),
                        behind.join(", ")
                    ),
                )
            }
        }
    };

    let blind: Vec<&String> = statuses.iter().filter(|s| s.3 == 0).map(|s| s.0).collect();
    let observed = if statuses.is_empty() {
        cond(
            BACKENDS_OBSERVED,
            false,
            "NoRouters",
            "no router status to read".into(),
        )
    } else if blind.is_empty() {
        let (h, t) = statuses.iter().fold((0, 0), |(h, t), s| (h + s.3, t + s.2));
        cond(
            BACKENDS_OBSERVED,
            true,
            "Observed",
            format!("routers see {h}/{t} targets healthy"),
        )
    } else {
        cond(
            BACKENDS_OBSERVED,
            false,
            "NoHealthyBackends",
            format!(
                "no healthy target seen by {}",
                blind
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    };

    let calibrated = match &obs.calibration {
        Calibration::NotUsed => cond(
            CALIBRATED,
            true,
            "NotUsed",
            "Program scheduling is off; no cost model is used".into(),
        ),
        Calibration::Configured => cond(
            CALIBRATED,
            true,
            "Configured",
            "prefill and decode cost models come from the spec".into(),
        ),
        Calibration::Partial { missing } => cond(
            CALIBRATED,
            false,
            "PartiallyCalibrated",
            format!(
                "not set, so at reference values: {}; copy every coefficient from one \
                 `program-router calibrate --format crd` run",
                missing
                    .iter()
                    .map(|f| format!("programScheduling.{f}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Calibration::Reference => cond(
            CALIBRATED,
            false,
            "ReferenceCoefficients",
            "using the reference prefill and decode coefficients; run `program-router calibrate` \
             against these workers and set programScheduling.prefillCostModel and \
             decodeThroughputModel"
                .into(),
        ),
    };

    let affinity = match obs.affinity {
        Affinity::NotUsed => cond(
            PROGRAM_AFFINITY,
            true,
            "NotUsed",
            "Program scheduling is off; request-level policies keep no per-Program state".into(),
        ),
        Affinity::SingleReplica => cond(
            PROGRAM_AFFINITY,
            true,
            "SingleReplica",
            "one router replica holds every Program's scheduling state".into(),
        ),
        Affinity::PeerForwarding(n) => cond(
            PROGRAM_AFFINITY,
            true,
            "PeerForwarding",
            format!(
                "each Program is scheduled by one of the {n} router replicas; the others forward \
                 its requests there (router.peerForwarding)"
            ),
        ),
        Affinity::ClientIp => cond(
            PROGRAM_AFFINITY,
            true,
            "ClientIPAffinity",
            "the router Service keeps each client on one replica (an agent that is its own \
             client keeps its Programs there)"
                .into(),
        ),
        Affinity::Split(n) => cond(
            PROGRAM_AFFINITY,
            false,
            "SplitAcrossReplicas",
            format!(
                "Program scheduling on {n} router replicas with router.peerForwarding false and \
                 router.sessionAffinity None: a Program whose requests reach several replicas is \
                 scheduled by partial views (bindings, queues, TTLs and KV ledgers are per \
                 replica); set router.peerForwarding: true, router.replicas: 1, \
                 router.sessionAffinity: ClientIP, or route each agent session to one replica at \
                 the ingress"
            ),
        ),
    };

    let refused: Vec<String> = obs
        .routers
        .iter()
        .filter_map(|r| match r {
            RouterReport::Status {
                pod,
                client_keys_error: Some(e),
                ..
            } => Some(format!("{pod}: {e}")),
            _ => None,
        })
        .collect();
    let client_keys = if !obs.client_keys_secret {
        cond(
            CLIENT_KEYS,
            true,
            "NotUsed",
            "no clientApiKeysSecret; keys, if any, come from environment variables".into(),
        )
    } else if refused.is_empty() {
        cond(
            CLIENT_KEYS,
            true,
            "Loaded",
            "the routers hold the keys of clientApiKeysSecret".into(),
        )
    } else {
        cond(
            CLIENT_KEYS,
            false,
            "KeysRefused",
            format!(
                "routers keep their previous client keys, the Secret's content was refused: {}",
                refused.join("; ")
            ),
        )
    };

    let render = obs
        .render_error
        .as_ref()
        .map(|e| cond(READY, false, "InvalidSpec", e.clone()));
    let ready = render.unwrap_or_else(|| {
        match [&workers, &applied, &router, &observed]
            .into_iter()
            .find(|c| c.status != "True")
        {
            Some(bad) => cond(
                READY,
                false,
                &bad.reason,
                format!("{}: {}", bad.type_, bad.message),
            ),
            None => cond(
                READY,
                true,
                "Ready",
                "routing over the discovered workers".into(),
            ),
        }
    });
    vec![
        ready,
        workers,
        applied,
        router,
        observed,
        calibrated,
        affinity,
        client_keys,
    ]
}

/// A condition whose status changed (or appeared): one Event each.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Merges `desired` over `previous`: a condition keeps its `lastTransitionTime` unless its status
/// changed; every condition carries `generation`.
pub fn merge(
    previous: &[Condition],
    desired: Vec<Condition>,
    generation: Option<i64>,
    now: Time,
) -> (Vec<Condition>, Vec<Transition>) {
    let mut transitions = Vec::new();
    let merged = desired
        .into_iter()
        .map(|mut c| {
            c.observed_generation = generation;
            match previous.iter().find(|p| p.type_ == c.type_) {
                Some(p) if p.status == c.status => {
                    c.last_transition_time = p.last_transition_time.clone()
                }
                _ => {
                    c.last_transition_time = now.clone();
                    transitions.push(Transition {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                    });
                }
            }
            c
        })
        .collect();
    (merged, transitions)
}

#[cfg(test)]
mod tests {
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

    fn good() -> Observed {
        Observed {
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
            let cs = evaluate(&Observed {
                affinity: a,
                ..good()
            });
            let c = get(&cs, PROGRAM_AFFINITY);
            assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", reason));
        }
    }

    #[test]
    fn ready_false_carries_the_first_failing_reason() {
        type Change = Box<dyn Fn(&mut Observed)>;
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
}
