//! The writes of one reconcile, from its [`Plan`]: server-side apply of each owned object that
//! differs from what is stored (a dry run compares content), the peer Secret created once, the
//! NetworkPolicy deleted when turned off, the status, and one Event per condition transition.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::controller::{Context, Error};
use crate::crd::ProgramScheduling;
use crate::objects::{self, FIELD_MANAGER, Owned};
use crate::plan::{Desired, Observed, Plan};

/// Carries out `plan` for `ps` in `ns` (`obs`: what the plan was made from).
pub async fn apply(
    ctx: &Context,
    ps: &ProgramScheduling,
    ns: &str,
    obs: &Observed,
    plan: &Plan,
) -> Result<(), Error> {
    for d in &plan.objects {
        match d {
            Desired::ServiceAccount(v) => apply_one::<ServiceAccount>(ctx, ns, v.clone()).await?,
            Desired::Service(v) => apply_one::<Service>(ctx, ns, v.clone()).await?,
            Desired::PodDisruptionBudget(v) => {
                apply_one::<PodDisruptionBudget>(ctx, ns, v.clone()).await?
            }
            Desired::ConfigMap(v) => {
                apply_over::<ConfigMap>(ctx, ns, v.clone(), obs.config_map.as_ref()).await?;
                // The Deployment that mounts the peer Secret comes next.
                if plan.peer_secret {
                    ensure_peer_secret(ctx, ps, ns).await?;
                }
                false
            }
            Desired::Deployment(v) => apply_one::<Deployment>(ctx, ns, v.clone()).await?,
            Desired::NetworkPolicy(v) => apply_one::<NetworkPolicy>(ctx, ns, v.clone()).await?,
        };
    }
    if plan.delete_network_policy {
        let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        api.delete(&objects::router_name(ps), &Default::default())
            .await?;
        ctx.metrics
            .writes
            .with_label_values(&["NetworkPolicy", "delete"])
            .inc();
    }
    if let Some(status) = &plan.status {
        let api: Api<ProgramScheduling> = Api::namespaced(ctx.client.clone(), ns);
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
    for t in &plan.events {
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
    Ok(())
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
async fn apply_one<K>(ctx: &Context, ns: &str, desired: serde_json::Value) -> Result<bool, Error>
where
    K: Owned + Resource<Scope = NamespaceResourceScope> + serde::Serialize + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    let name = desired["metadata"]["name"].as_str().unwrap_or_default();
    let live = api.get_opt(name).await?;
    apply_over(ctx, ns, desired, live.as_ref()).await
}

/// [`apply_one`] when the live object (`None`: absent) was just read.
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
