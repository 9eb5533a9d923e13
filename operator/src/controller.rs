//! The reconcile loop: kube-rs `Controller` over `ProgramScheduling`, its owned objects and the
//! Pods of its namespace.
//!
//! One reconcile = [`crate::fetch`] (every read: worker and router pods, the owned ConfigMap and
//! Deployment, each router pod's `/status`) → [`crate::plan`] (pure: discover, render, the owned
//! objects, conditions, status, events, requeue) → [`crate::apply`] (server-side apply of what
//! differs, status, Events). A spec that cannot be rendered leaves the last good ConfigMap in
//! place and reports `Ready=False, InvalidSpec`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};

use crate::crd::ProgramScheduling;
use crate::objects::FIELD_MANAGER;
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
    pub(crate) peer_secrets: Mutex<std::collections::HashSet<String>>,
    /// Router image prefixes a resource may name (`--allowed-router-images`); empty: any.
    pub allowed_images: Vec<String>,
    /// The router image of a resource that names none (`--router-image`).
    pub router_image: String,
    /// Tracing of resources without `router.tracing` (`--router-otlp-traces-endpoint`).
    pub router_tracing: Option<crate::crd::TracingSpec>,
}

/// The router image of this operator's version: what `--router-image` defaults to.
pub const DEFAULT_ROUTER_IMAGE: &str = concat!(
    "ghcr.io/program-scheduling/program-router:",
    env!("CARGO_PKG_VERSION")
);

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
            router_image: DEFAULT_ROUTER_IMAGE.into(),
            router_tracing: None,
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

/// One reconcile: read everything ([`crate::fetch`]), decide ([`crate::plan`], pure), write
/// what differs ([`crate::apply`]).
async fn reconcile_inner(ps: &ProgramScheduling, ctx: &Context) -> Result<Action, Error> {
    if ps.metadata.deletion_timestamp.is_some() {
        // Owned objects go with the resource through their ownerReferences.
        return Ok(Action::await_change());
    }
    let ns = ps.namespace().ok_or(Error::NoNamespace)?;
    let observed = crate::fetch::fetch(ctx, ps, &ns).await?;
    let plan = crate::plan::plan(ps, &observed)?;
    if let Some(e) = &plan.render_error {
        tracing::warn!(resource = %key(ps), error = %e, "keeping the last good router config");
    }
    crate::apply::apply(ctx, ps, &ns, &observed, &plan).await?;
    Ok(Action::requeue(plan.requeue))
}
