//! One function per condition: what a reconcile's observations say about one part of the
//! ProgramScheduling, with the reason a user acts on.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;

/// `WorkersDiscovered`: Ready worker pods and their DP-rank targets.
pub fn workers_discovered(obs: &Facts) -> Condition {
    match &obs.workers {
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
    }
}

/// `RouterAvailable`: the router Deployment's available replicas.
pub fn router_available(obs: &Facts) -> Condition {
    let (desired, available) = obs.deployment;
    if desired == 0 {
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
    }
}

/// The router pods' reports, split: (pod, runs the rendered config, targets, healthy targets,
/// refused reload) for each that answered, and `pod: error` for each that did not.
type Statuses<'a> = Vec<(&'a String, bool, usize, usize, &'a Option<String>)>;

fn reports(obs: &Facts) -> (Statuses<'_>, Vec<String>) {
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
    (statuses, unreachable)
}

/// `ConfigApplied`: every router pod runs the rendered config.
pub fn config_applied(obs: &Facts) -> Condition {
    let (statuses, unreachable) = reports(obs);
    match &obs.desired_hash {
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
    }
}

/// `BackendsObserved`: every router sees a healthy target.
pub fn backends_observed(obs: &Facts) -> Condition {
    let (statuses, _) = reports(obs);
    let blind: Vec<&String> = statuses.iter().filter(|s| s.3 == 0).map(|s| s.0).collect();
    if statuses.is_empty() {
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
    }
}

/// `Calibrated`: where Program scheduling's cost models come from.
pub fn calibrated(obs: &Facts) -> Condition {
    match &obs.calibration {
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
    }
}

/// `ProgramAffinity`: whether each Program's requests reach one scheduler.
pub fn program_affinity(obs: &Facts) -> Condition {
    match obs.affinity {
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
    }
}

/// `ClientKeys`: whether the routers hold the keys of `clientApiKeysSecret`.
pub fn client_keys(obs: &Facts) -> Condition {
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
    if !obs.client_keys_secret {
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
    }
}

/// `Ready`: the spec renders and the first four parts (`parts`) hold; else the first failing one's reason.
pub fn ready(obs: &Facts, parts: [&Condition; 4]) -> Condition {
    let render = obs
        .render_error
        .as_ref()
        .map(|e| cond(READY, false, "InvalidSpec", e.clone()));
    render.unwrap_or_else(|| match parts.into_iter().find(|c| c.status != "True") {
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
    })
}
