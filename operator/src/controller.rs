//! The reconcile loop: kube-rs `Controller` over `ProgramScheduling`, its owned objects and the
//! Pods of its namespace.
//!
//! One reconcile = list the selected worker pods → [`discover`] → [`render`] → server-side apply
//! of the owned objects (skipped per object when its applied-hash matches the live one) → read the
//! router Deployment and every Ready router pod's `/status` → [`conditions::evaluate`] → status
//! apply (skipped when nothing changed) → one Event per condition transition. A spec that cannot
//! be rendered leaves the last good ConfigMap in place and reports `Ready=False, InvalidSpec`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;

use crate::conditions::{self, Observed};
use crate::crd::{ProgramScheduling, ProgramSchedulingStatus};
use crate::discover::discover;
use crate::objects::{self, ConfigFile, FIELD_MANAGER, Owned};
use crate::render::render;
use crate::routers::StatusClient;
use crate::telemetry::Metrics;

/// Why a reconcile failed; the controller retries with per-object exponential backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
    #[error("resource has no namespace")]
    NoNamespace,
}

impl Error {
    /// Bounded label for the errors metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api_status",
            Error::Kube(_) => "api_transport",
            Error::Json(_) => "serialization",
            Error::NoNamespace => "no_namespace",
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub status: StatusClient,
    failures: Mutex<HashMap<String, u32>>,
    /// Resources (by uid) whose peer Secret this process created or found.
    peer_secrets: Mutex<std::collections::HashSet<String>>,
    /// Router image prefixes a resource may name (`--allowed-router-images`); empty: any.
    pub allowed_images: Vec<String>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, instance: String) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(instance),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            status: StatusClient::new(Duration::from_secs(2)),
            failures: Mutex::new(HashMap::new()),
            peer_secrets: Mutex::new(std::collections::HashSet::new()),
            allowed_images: Vec::new(),
        }
    }
}

/// Watch scope: some namespaces (one controller each) or all.
#[derive(Debug, Clone)]
pub enum Scope {
    Namespace(String),
    All,
}

fn api<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        Scope::All => Api::all(client.clone()),
    }
}

/// Runs one controller per scope until `shutdown` resolves.
pub async fn run_all(
    ctx: Arc<Context>,
    scopes: Vec<Scope>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use futures::FutureExt;
    let shutdown = shutdown.boxed().shared();
    ctx.metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    futures::future::join_all(
        scopes
            .into_iter()
            .map(|scope| run(ctx.clone(), scope, shutdown.clone())),
    )
    .await;
}

/// Runs the controller for one scope until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    scope: Scope,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let wc = watcher::Config::default().any_semantic();
    let controller = Controller::new(api::<ProgramScheduling>(&client, &scope), wc.clone());
    let store = controller.store();
    // Any pod event in a namespace may change that namespace's resources (a worker's readiness,
    // a router pod's IP, a label edit that moves a pod out of a selector): enqueue them all; a
    // reconcile that finds nothing to change writes nothing.
    let mapper = move |pod: Pod| {
        let ns = pod.namespace();
        store
            .state()
            .into_iter()
            .filter(|ps| ps.namespace() == ns)
            .map(|ps| ObjectRef::from_obj(&*ps))
            .collect::<Vec<_>>()
    };
    controller
        .owns(api::<ConfigMap>(&client, &scope), wc.clone())
        .owns(api::<Deployment>(&client, &scope), wc.clone())
        .owns(api::<Service>(&client, &scope), wc.clone())
        .watches(api::<Pod>(&client, &scope), wc, mapper)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}

/// Milliseconds since the Unix epoch (the member list's revision, see
/// [`crate::render::number_members`]).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn key(ps: &ProgramScheduling) -> String {
    format!("{}/{}", ps.namespace().unwrap_or_default(), ps.name_any())
}

/// Retries after 1 s, doubling per consecutive failure of the same resource, capped at 5 min.
pub fn error_policy(ps: Arc<ProgramScheduling>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.errors.with_label_values(&[err.reason()]).inc();
    let mut f = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
    let n = f.entry(key(&ps)).or_insert(0);
    *n = (*n + 1).min(20);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(9)).min(Duration::from_secs(300));
    tracing::warn!(resource = %key(&ps), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

pub async fn reconcile(ps: Arc<ProgramScheduling>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let result = reconcile_inner(&ps, &ctx).await;
    let label = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    ctx.metrics
        .duration
        .with_label_values(&[label])
        .observe(start.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key(&ps));
    }
    result
}

async fn reconcile_inner(ps: &ProgramScheduling, ctx: &Context) -> Result<Action, Error> {
    if ps.metadata.deletion_timestamp.is_some() {
        // Owned objects go with the resource through their ownerReferences.
        return Ok(Action::await_change());
    }
    let ns = ps.namespace().ok_or(Error::NoNamespace)?;
    let client = &ctx.client;

    // Workers: selected pods, never this resource's own router pods.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let workers = match Selector::try_from(ps.spec.worker_selector.clone()) {
        Err(e) => Err(format!("workerSelector: {e}")),
        Ok(sel) => {
            let router_sel = Selector::try_from(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: serde_json::from_value(objects::selector_labels(ps))?,
                    match_expressions: None,
                },
            )
            .ok();
            let pods: Vec<Pod> = pods_api
                .list(&ListParams::default().labels_from(&sel))
                .await?
                .items
                .into_iter()
                .filter(|p| !router_sel.as_ref().is_some_and(|r| r.matches(p.labels())))
                .collect();
            discover(&ps.spec, &pods)
                .map(|targets| {
                    let counted = pods
                        .iter()
                        .filter(|p| crate::routers::ready_ip(p).is_some())
                        .count();
                    (counted, targets)
                })
                .map_err(|e| e.to_string())
        }
    };

    // This resource's router pods: Ready ones with an IP are the replicas that forward Programs
    // to each other (`peers`), and each is asked for its `/status` below. A pod counts only
    // through the ownership chain to the Deployment this resource owns (labels narrow the lists
    // but never make a pod a router: anyone may label a pod).
    let router_pods = {
        let selector = ListParams::default().labels(&objects::router_pod_selector(ps));
        let owned_deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt(&objects::router_name(ps))
            .await?
            .filter(|d| crate::routers::controlled_by(&d.metadata, ps.metadata.uid.as_deref()));
        match owned_deployment.and_then(|d| d.metadata.uid) {
            None => Vec::new(),
            Some(uid) => {
                let sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns)
                    .list(&selector)
                    .await?
                    .items;
                let pods = pods_api.list(&selector).await?.items;
                crate::routers::owned_pods(pods, &sets, &uid)
            }
        }
    };
    let peers: Vec<(String, String)> = router_pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, crate::routers::ready_ip(p)?)))
        .collect();

    // Render; on failure the last good config stays. The member list is numbered against the
    // one the ConfigMap holds now, so that the routers can tell which of two lists is newer.
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = objects::router_name(ps);
    let current = cm_api.get_opt(&name).await?;
    let rendered = match &workers {
        Ok((_, targets)) => crate::render::check_image(&ps.spec.router.image, &ctx.allowed_images)
            .and_then(|()| render(&ps.spec, targets.clone(), &peers))
            .map(|mut cfg| {
                let previous = current
                    .as_ref()
                    .and_then(|c| c.data.as_ref()?.get(objects::CONFIG_KEY));
                crate::render::number_members(&mut cfg, previous.map(String::as_str), now_ms());
                cfg
            })
            .map_err(|e| e.to_string()),
        Err(e) => Err(format!("workers: {e}")),
    };
    let render_error = match (&rendered, &workers) {
        (Err(e), Ok(_)) => Some(e.clone()),
        _ => None,
    };

    apply::<ServiceAccount>(ctx, &ns, objects::service_account(ps)).await?;
    apply::<Service>(ctx, &ns, objects::service(ps)).await?;
    apply::<PodDisruptionBudget>(ctx, &ns, objects::pod_disruption_budget(ps)).await?;
    let (desired_hash, desired_settings) = match &rendered {
        Ok(cfg) => {
            let file = ConfigFile::new(cfg)?;
            apply_over::<ConfigMap>(ctx, &ns, objects::config_map(ps, &file), current.as_ref())
                .await?;
            if cfg.peer_port.is_some() {
                ensure_peer_secret(ctx, ps, &ns).await?;
            }
            apply::<Deployment>(ctx, &ns, objects::deployment(ps, cfg)).await?;
            let np_api: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
            if ps.spec.router.network_policy.enabled {
                apply::<NetworkPolicy>(ctx, &ns, objects::network_policy(ps, cfg)).await?;
            } else if let Some(np) = np_api.get_opt(&name).await?
                && crate::routers::controlled_by(&np.metadata, ps.metadata.uid.as_deref())
            {
                np_api.delete(&name, &Default::default()).await?;
                ctx.metrics
                    .writes
                    .with_label_values(&["NetworkPolicy", "delete"])
                    .inc();
            }
            (Some(file.hash), Some(file.settings))
        }
        Err(e) => {
            tracing::warn!(resource = %key(ps), error = %e, "keeping the last good router config");
            let annotation = |k: &str| {
                current
                    .as_ref()
                    .and_then(|c| c.annotations().get(k).cloned())
            };
            (
                annotation(objects::CONFIG_HASH),
                annotation(objects::SETTINGS_HASH),
            )
        }
    };

    let deploy_api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deploy_api.get_opt(&name).await?;
    let available = deployment
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    let ready_routers = deployment
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);

    let port = ps.spec.router.port;
    let reports: Vec<_> =
        futures::future::join_all(router_pods.iter().map(|p| ctx.status.report(p, port)))
            .await
            .into_iter()
            .flatten()
            .collect();

    let observed = Observed {
        workers: workers
            .as_ref()
            .map(|(n, t)| (*n, t.len()))
            .map_err(Clone::clone),
        render_error,
        desired_hash: desired_hash.clone(),
        desired_settings,
        deployment: (ps.spec.router.replicas, available),
        routers: reports,
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
    let (conds, transitions) = conditions::merge(
        &previous.conditions,
        conditions::evaluate(&observed),
        ps.metadata.generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let status = ProgramSchedulingStatus {
        observed_generation: ps.metadata.generation,
        conditions: conds,
        ranks: workers
            .as_ref()
            .ok()
            .map(|(_, t)| i32::try_from(t.len()).unwrap_or(i32::MAX)),
        ready_routers: Some(ready_routers),
        config_hash: desired_hash,
    };
    if ps.status.as_ref() != Some(&status) {
        let api: Api<ProgramScheduling> = Api::namespaced(client.clone(), &ns);
        let body = json!({
            "apiVersion": ProgramScheduling::api_version(&()),
            "kind": ProgramScheduling::kind(&()),
            "status": status,
        });
        api.patch_status(
            &ps.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        ctx.metrics
            .writes
            .with_label_values(&["ProgramScheduling", "status"])
            .inc();
    }
    let reference = ps.object_ref(&());
    for t in &transitions {
        let ev = Event {
            type_: if t.status == "True" {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: t.reason.clone(),
            note: Some(format!("{}={}: {}", t.type_, t.status, t.message)),
            action: "Reconcile".into(),
            secondary: None,
        };
        match ctx.recorder.publish(&ev, &reference).await {
            Ok(()) => ctx
                .metrics
                .writes
                .with_label_values(&["Event", "create"])
                .inc(),
            Err(e) => tracing::warn!(error = %e, "event not recorded"),
        }
    }

    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.status == "True");
    let applied = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::CONFIG_APPLIED && c.status == "True");
    // A spec error waits for an edit (which triggers a reconcile by itself); a config on its way to
    // the routers is polled closely, since router /status changes raise no Kubernetes event.
    Ok(Action::requeue(if observed.render_error.is_some() {
        Duration::from_secs(60)
    } else if ready {
        Duration::from_secs(30)
    } else if !applied {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(5)
    }))
}

/// Creates the routers' peer Secret unless it exists. Never reads or rewrites one (the operator
/// holds only `create` on Secrets, so it can read none); once per resource and process, so
/// there is no write at steady state.
async fn ensure_peer_secret(ctx: &Context, ps: &ProgramScheduling, ns: &str) -> Result<(), Error> {
    let uid = ps.metadata.uid.clone().unwrap_or_default();
    if ctx
        .peer_secrets
        .lock()
        .map(|s| s.contains(&uid))
        .unwrap_or(false)
    {
        return Ok(());
    }
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = serde_json::from_value(objects::peer_secret(ps, &objects::new_peer_secret()))?;
    match api.create(&kube::api::PostParams::default(), &secret).await {
        Ok(_) => {
            ctx.metrics
                .writes
                .with_label_values(&["Secret", "create"])
                .inc();
            tracing::info!(namespace = ns, name = %objects::peer_secret_name(ps), "created the routers' peer secret");
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    if let Ok(mut s) = ctx.peer_secrets.lock() {
        s.insert(uid);
    }
    Ok(())
}

/// Server-side applies `desired` unless the live object already carries its applied-hash.
async fn apply<K>(ctx: &Context, ns: &str, desired: serde_json::Value) -> Result<bool, Error>
where
    K: Owned + Resource<Scope = NamespaceResourceScope> + serde::Serialize + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let name = desired["metadata"]["name"].as_str().unwrap_or_default();
    let live = api.get_opt(name).await?;
    apply_over(ctx, ns, desired, live.as_ref()).await
}

/// [`apply`] when the live object (`None`: absent) was just read.
async fn apply_over<K>(
    ctx: &Context,
    ns: &str,
    desired: serde_json::Value,
    live: Option<&K>,
) -> Result<bool, Error>
where
    K: Owned + Resource<Scope = NamespaceResourceScope> + serde::Serialize + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let name = desired["metadata"]["name"].as_str().unwrap_or_default();
    let want = desired["metadata"]["annotations"][objects::APPLIED_HASH].as_str();
    if let Some(live) = live
        && objects::applied_hash(live) == want
    {
        // Applied as desired once; a hand edit (`kubectl set image`, `kubectl edit`) keeps the
        // annotation, so ask the API server what an apply would store now (a dry run writes
        // nothing) and write only when that differs from what is stored.
        let would: K = api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force().dry_run(),
                &Patch::Apply(&desired),
            )
            .await?;
        if objects::same_content(live, &would) {
            return Ok(false);
        }
        tracing::info!(
            kind = K::KIND,
            namespace = ns,
            name,
            "changed by someone else; putting it back"
        );
    }
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&desired),
    )
    .await?;
    ctx.metrics
        .writes
        .with_label_values(&[K::KIND, "apply"])
        .inc();
    tracing::info!(kind = K::KIND, namespace = ns, name, "applied");
    Ok(true)
}
