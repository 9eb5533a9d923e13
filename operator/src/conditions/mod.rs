//! Status conditions as a pure function of what one reconcile observed, and the merge rule that
//! keeps `lastTransitionTime` when a condition's status did not change.
//!
//! `Ready` is True only when workers were discovered, the spec rendered, the rendered config is
//! applied by every ready router, the router Deployment is available and the routers observe
//! healthy backends; otherwise it is False with the reason of the first failing part.
//! `Calibrated` and `ProgramAffinity` are informational and never affect `Ready`.

mod each;

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
        /// The hash of every setting but `peers`' member list (older routers do not report
        /// it).
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
pub struct Facts {
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

/// The conditions `obs` implies, without times or generation (one function each, [`each`]).
pub fn evaluate(obs: &Facts) -> Vec<Condition> {
    let workers = each::workers_discovered(obs);
    let applied = each::config_applied(obs);
    let router = each::router_available(obs);
    let observed = each::backends_observed(obs);
    let ready = each::ready(obs, [&workers, &applied, &router, &observed]);
    vec![
        ready,
        workers,
        applied,
        router,
        observed,
        each::calibrated(obs),
        each::program_affinity(obs),
        each::client_keys(obs),
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
mod tests;
