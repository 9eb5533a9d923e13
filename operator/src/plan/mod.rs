//! The heart of a reconcile, as a pure function: what was read ([`Observed`]) → what to write
//! ([`Plan`]): the owned objects, the status, one Event per condition transition, and when to
//! look again. No I/O and no clock (the time comes in `Observed`); table-tested below.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use program_router::config::RouterConfig;
use serde_json::Value;

use crate::conditions::{self, Facts, RouterReport, Transition};
use crate::crd::{ProgramScheduling, ProgramSchedulingStatus};
use crate::discover::discover;
use crate::objects::{self, ConfigFile};
use crate::render::render;

/// Everything one reconcile read, before it writes anything.
#[derive(Debug, Clone)]
pub struct Observed {
    /// Pods matching `workerSelector`, or why the selector is not usable.
    pub worker_pods: Result<Vec<Pod>, String>,
    /// This resource's router pods (through the ownership chain, never labels alone).
    pub router_pods: Vec<Pod>,
    /// What each Ready router pod's `/status` said.
    pub reports: Vec<RouterReport>,
    /// The router ConfigMap as it is now (the last good config when the spec is bad).
    pub config_map: Option<ConfigMap>,
    /// The router Deployment this resource owns.
    pub deployment: Option<Deployment>,
    /// An owned NetworkPolicy exists (to delete when `router.networkPolicy.enabled` is off).
    pub network_policy: bool,
    /// Router image prefixes a resource may name (`--allowed-router-images`); empty: any.
    pub allowed_images: Vec<String>,
    /// The router image of a resource that names none (`--router-image`).
    pub router_image: String,
    /// The operator's tracing default for resources without `router.tracing`.
    pub router_tracing: Option<crate::crd::TracingSpec>,
    /// Now, in milliseconds since the Unix epoch (numbers the member list).
    pub now_ms: u64,
    /// Now (condition transition times).
    pub now: Time,
}

/// One owned object to server-side apply, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Desired {
    ServiceAccount(Value),
    Service(Value),
    PodDisruptionBudget(Value),
    /// The rendered config, applied over the ConfigMap read in `Observed`.
    ConfigMap(Value),
    Deployment(Value),
    NetworkPolicy(Value),
}

/// What one reconcile writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Applied in this order (the ConfigMap before the Deployment that mounts it).
    pub objects: Vec<Desired>,
    /// Create the routers' peer Secret unless it exists (before the Deployment mounts it).
    pub peer_secret: bool,
    /// Delete the owned NetworkPolicy.
    pub delete_network_policy: bool,
    /// The new status, when it differs from the resource's.
    pub status: Option<ProgramSchedulingStatus>,
    /// One Event each.
    pub events: Vec<Transition>,
    pub requeue: Duration,
    /// Why the spec could not become a router config (the last good one stays).
    pub render_error: Option<String>,
}

/// The plan for `ps` given `obs`; fails only when the rendered config cannot be serialized.
pub fn plan(ps: &ProgramScheduling, obs: &Observed) -> Result<Plan, serde_json::Error> {
    let workers = workers(ps, obs);
    let peers: Vec<(String, String)> = obs
        .router_pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, crate::routers::ready_ip(p)?)))
        .collect();
    let rendered = match &workers {
        Ok((_, targets)) => config(ps, obs, targets, &peers),
        Err(e) => Err(format!("workers: {e}")),
    };
    let render_error = match (&rendered, &workers) {
        (Err(e), Ok(_)) => Some(e.clone()),
        _ => None,
    };

    let mut objects = vec![
        Desired::ServiceAccount(objects::service_account(ps)),
        Desired::Service(objects::service(ps)),
        Desired::PodDisruptionBudget(objects::pod_disruption_budget(ps)),
    ];
    let mut peer_secret = false;
    let mut delete_network_policy = false;
    let file = match &rendered {
        Ok(cfg) => Some(ConfigFile::new(cfg)?),
        Err(_) => None,
    };
    let (desired_hash, desired_settings) = match (&rendered, &file) {
        (Ok(cfg), Some(file)) => {
            objects.push(Desired::ConfigMap(objects::config_map(ps, file)));
            peer_secret = cfg.peer_port.is_some();
            let image = router_image(ps, obs);
            objects.push(Desired::Deployment(objects::deployment(ps, cfg, &image)));
            if ps.spec.router.network_policy.enabled {
                objects.push(Desired::NetworkPolicy(objects::network_policy(ps, cfg)));
            } else {
                delete_network_policy = obs.network_policy;
            }
            (Some(file.hash.clone()), Some(file.settings.clone()))
        }
        _ => {
            let annotation = |k: &str| {
                obs.config_map
                    .as_ref()
                    .and_then(|c| c.annotations().get(k).cloned())
            };
            (
                annotation(objects::CONFIG_HASH),
                annotation(objects::SETTINGS_HASH),
            )
        }
    };

    let deployment_status = obs.deployment.as_ref().and_then(|d| d.status.as_ref());
    let available = deployment_status
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    let ready_routers = deployment_status
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let facts = Facts {
        workers: workers
            .as_ref()
            .map(|(n, t)| (*n, t.len()))
            .map_err(Clone::clone),
        render_error: render_error.clone(),
        desired_hash: desired_hash.clone(),
        desired_settings,
        deployment: (ps.spec.router.replicas, available),
        routers: obs.reports.clone(),
        calibration: conditions::calibration(
            ps.spec
                .program_scheduling
                .as_ref()
                .map(|p| p.uncalibrated()),
        ),
        affinity: conditions::affinity(
            ps.spec.program_scheduling.is_some(),
            ps.spec.router.replicas,
            ps.spec.router.peer_forwarding,
            &ps.spec.router.session_affinity,
        ),
        client_keys_secret: ps.spec.client_api_keys_secret.is_some(),
    };
    let previous = ps.status.clone().unwrap_or_default();
    let (conds, events) = conditions::merge(
        &previous.conditions,
        conditions::evaluate(&facts),
        ps.metadata.generation,
        obs.now.clone(),
    );
    let status = ProgramSchedulingStatus {
        observed_generation: ps.metadata.generation,
        conditions: conds,
        ranks: workers
            .as_ref()
            .ok()
            .map(|(_, t)| i32::try_from(t.len()).unwrap_or(i32::MAX)),
        ready_routers: Some(ready_routers),
        replicas: Some(deployment_status.and_then(|s| s.replicas).unwrap_or(0)),
        selector: Some(objects::router_pod_selector(ps)),
        config_hash: desired_hash,
    };
    let requeue = requeue(&status, render_error.is_some());
    Ok(Plan {
        objects,
        peer_secret,
        delete_network_policy,
        status: (ps.status.as_ref() != Some(&status)).then_some(status),
        events,
        requeue,
        render_error,
    })
}

/// The selected worker pods (never this resource's own router pods) → (Ready pods, targets).
fn workers(
    ps: &ProgramScheduling,
    obs: &Observed,
) -> Result<(usize, Vec<program_router::config::WorkerConfig>), String> {
    let pods = obs.worker_pods.as_ref().map_err(Clone::clone)?;
    let routers = serde_json::from_value(objects::selector_labels(ps))
        .ok()
        .and_then(|labels| {
            Selector::try_from(LabelSelector {
                match_labels: labels,
                match_expressions: None,
            })
            .ok()
        });
    let pods: Vec<Pod> = pods
        .iter()
        .filter(|p| !routers.as_ref().is_some_and(|r| r.matches(p.labels())))
        .cloned()
        .collect();
    let targets = discover(&ps.spec, &pods).map_err(|e| e.to_string())?;
    let ready = pods
        .iter()
        .filter(|p| crate::routers::ready_ip(p).is_some())
        .count();
    Ok((ready, targets))
}

/// The image the routers of `ps` run: the one it names, else the operator's.
fn router_image(ps: &ProgramScheduling, obs: &Observed) -> String {
    ps.spec
        .router
        .image
        .clone()
        .unwrap_or_else(|| obs.router_image.clone())
}

/// The router config for `targets` and the router pods `peers`, its member list numbered
/// against the one the ConfigMap holds now (so routers can tell which of two lists is newer).
fn config(
    ps: &ProgramScheduling,
    obs: &Observed,
    targets: &[program_router::config::WorkerConfig],
    peers: &[(String, String)],
) -> Result<RouterConfig, String> {
    crate::render::check_image(&router_image(ps, obs), &obs.allowed_images)
        .and_then(|()| render(&ps.spec, targets.to_vec(), peers))
        .and_then(
            |mut cfg| match (&ps.spec.router.tracing, &obs.router_tracing) {
                (None, Some(default)) => crate::render::tracing(&mut cfg, default).map(|()| cfg),
                _ => Ok(cfg),
            },
        )
        .map(|mut cfg| {
            let previous = obs
                .config_map
                .as_ref()
                .and_then(|c| c.data.as_ref()?.get(objects::CONFIG_KEY));
            crate::render::number_members(&mut cfg, previous.map(String::as_str), obs.now_ms);
            cfg
        })
        .map_err(|e| e.to_string())
}

/// A spec error waits for an edit (which triggers a reconcile by itself); a config on its way
/// to the routers is polled closely, since router `/status` changes raise no Kubernetes event.
fn requeue(status: &ProgramSchedulingStatus, render_error: bool) -> Duration {
    let holds = |t: &str| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == t && c.status == "True")
    };
    Duration::from_secs(if render_error {
        60
    } else if holds(conditions::READY) {
        30
    } else if !holds(conditions::CONFIG_APPLIED) {
        1
    } else {
        5
    })
}

#[cfg(test)]
mod tests;
