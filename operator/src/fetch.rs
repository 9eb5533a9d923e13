//! Every read of one reconcile, in one step: the pods `workerSelector` selects, this resource's
//! router pods (through the ownership chain), the owned ConfigMap, Deployment and NetworkPolicy,
//! and each router pod's `/status`. Writes nothing.

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::ListParams;
use kube::core::Selector;

use crate::controller::{Context, Error};
use crate::crd::ProgramScheduling;
use crate::objects;
use crate::plan::Observed;
use crate::routers::controlled_by;

/// Reads what [`crate::plan::plan`] needs for `ps` (in namespace `ns`).
pub async fn fetch(ctx: &Context, ps: &ProgramScheduling, ns: &str) -> Result<Observed, Error> {
    let client = &ctx.client;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let uid = ps.metadata.uid.as_deref();
    let name = objects::router_name(ps);
    let worker_pods = match Selector::try_from(ps.spec.worker_selector.clone()) {
        Err(e) => Err(format!("workerSelector: {e}")),
        Ok(sel) => Ok(pods
            .list(&ListParams::default().labels_from(&sel))
            .await?
            .items),
    };
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(&name)
        .await?
        .filter(|d| controlled_by(&d.metadata, uid));
    // A pod counts as a router only through the chain to the Deployment this resource owns
    // (labels narrow the lists but never make a pod a router: anyone may label a pod).
    let router_pods = match deployment.as_ref().and_then(|d| d.metadata.uid.clone()) {
        None => Vec::new(),
        Some(deployment_uid) => {
            let selector = ListParams::default().labels(&objects::router_pod_selector(ps));
            let sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
                .list(&selector)
                .await?
                .items;
            let listed = pods.list(&selector).await?.items;
            crate::routers::owned_pods(listed, &sets, &deployment_uid)
        }
    };
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(&name)
        .await?;
    let network_policy = match ps.spec.router.network_policy.enabled {
        // Applied anyway: whether one exists matters only for deleting it.
        true => false,
        false => Api::<NetworkPolicy>::namespaced(client.clone(), ns)
            .get_opt(&name)
            .await?
            .is_some_and(|np| controlled_by(&np.metadata, uid)),
    };
    let port = ps.spec.router.port;
    let reports = futures::future::join_all(router_pods.iter().map(|p| ctx.status.report(p, port)))
        .await
        .into_iter()
        .flatten()
        .collect();
    Ok(Observed {
        worker_pods,
        router_pods,
        reports,
        config_map,
        deployment,
        network_policy,
        allowed_images: ctx.allowed_images.clone(),
        router_image: ctx.router_image.clone(),
        router_tracing: ctx.router_tracing.clone(),
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    })
}
