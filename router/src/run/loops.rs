//! The router's background loops, each driven by the shared state until the router stops:
//! key directory polling, health checks, metric scrapes (whose observations are published to
//! the features that read them), usage exchange and member lists between peers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use rustc_hash::FxHashMap;
use std::time::Instant;

use tokio::sync::{Notify, watch};

use crate::applied::Applied;
use crate::auth;
use crate::peers::{USAGE_INTERVAL, exchange, gossip};
use crate::state::RouterState;
use crate::workers::{Backend, health};

/// Re-reads the key directory of the applied configuration every second and applies a changed
/// set once it reads the same twice. Runs until the router stops.
pub async fn key_dir(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(auth::POLL) => {}
            _ = stop.changed() => return,
        }
        let Some(dir) = state.applied.load().config.client_api_keys_dir.clone() else {
            continue;
        };
        let dir = PathBuf::from(dir);
        let current = state.client_dir.load_full();
        let read = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || {
                let first = auth::read_dir(&dir)?;
                if current.is_some_and(|c| *c.keys == *first) {
                    return Ok(Some(first)); // unchanged: nothing to confirm
                }
                std::thread::sleep(Duration::from_millis(100));
                let second = auth::read_dir(&dir)?;
                Ok::<_, String>((first == second).then_some(second))
            }
        })
        .await
        .unwrap_or_else(|e| Err(format!("the key directory reader failed: {e}")));
        state.update_client_dir(&dir, read);
    }
}

/// Runs `probe` on every backend of `applied` at once and waits for all of them.
async fn each_backend<F, Fut>(applied: &Applied, probe: F)
where
    F: Fn(Arc<Backend>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tasks: Vec<_> = applied
        .targets
        .backends
        .iter()
        .map(|b| tokio::spawn(probe(b.clone())))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Waits `interval`, or until `wake` is notified; `false` when the router stops meanwhile.
async fn pause(interval: Duration, wake: &Notify, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(interval) => true,
        _ = wake.notified() => true,
        _ = stop.changed() => false,
    }
}

/// Checks every backend now and then every `health.interval_secs` (or when woken after a
/// reload), and publishes which targets can be reached.
pub async fn health(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        let applied = state.applied.load_full();
        each_backend(&applied, |b| {
            let (state, applied) = (state.clone(), applied.clone());
            async move {
                let key = applied.config.api_key.as_deref();
                let h = &applied.config.health;
                health::check(&state.client, key, h, &applied.targets, &b).await;
            }
        })
        .await;
        state.applied.load().publish_availability();
        let interval = crate::config::duration(applied.config.health.interval_secs);
        if !pause(interval, &state.health_wake, &mut stop).await {
            return;
        }
    }
}

/// Polls every backend's `/metrics` each `observation.interval_secs` (Program scheduling's
/// `metrics_interval_seconds` when it is on), when something uses it, and publishes each
/// observation to the features of the configuration applied when it arrives.
pub async fn observation(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        let applied = state.applied.load_full();
        let secs = match &applied.config.program_scheduling {
            Some(ps) => ps.metrics_interval_seconds,
            None => applied.config.observation.interval_secs,
        };
        let interval = crate::config::duration(secs);
        if applied.needs_observation() {
            each_backend(&applied, |b| {
                let (state, applied) = (state.clone(), applied.clone());
                async move {
                    let key = applied.config.api_key.as_deref();
                    if let Some(obs) = health::observe(&state.client, key, &b, interval).await {
                        state.applied.load().publish(&b, &obs);
                    }
                }
            })
            .await;
            state.applied.load().observed();
        }
        if !pause(interval, &state.observe_wake, &mut stop).await {
            return;
        }
    }
}

/// Every [`USAGE_INTERVAL`], while this replica has peers and tenants have quotas: reads each
/// other member's `/peers/usage` and charges this replica's quotas with what the member admitted
/// since the last read. On the first read of a member (or the first after more than a minute
/// without one), its totals count when its quota state is younger than a minute (all of it is
/// recent) and are only remembered otherwise (older use has been refilled; the last minute's is
/// not known apart); after it restarted, all of them count. Stops with the router.
pub async fn usage(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    let mut seen: FxHashMap<String, exchange::Seen> = FxHashMap::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(USAGE_INTERVAL) => {}
            _ = stop.changed() => return,
        }
        let applied = state.applied.load_full();
        let (Some(peers), Some(fair)) = (&applied.peers, &applied.fair) else {
            seen.clear();
            continue;
        };
        if !fair.has_rate_limits() {
            seen.clear();
            continue;
        }
        let client = &state.peer_client;
        let reads = exchange::others(peers).map(|m| {
            let headers = HeaderMap::new();
            async move {
                let doc = crate::peers::get_json(
                    client,
                    peers,
                    m,
                    "/peers/usage",
                    headers,
                    USAGE_INTERVAL,
                )
                .await;
                (m.name.clone(), doc)
            }
        });
        for (name, doc) in futures_util::future::join_all(reads).await {
            let outcome = if doc.is_ok() { "ok" } else { "error" };
            state
                .peer_metrics
                .usage_reads
                .with_label_values(&[outcome])
                .inc();
            peers.usage_read(&name, doc.as_ref().err().cloned());
            let Ok(doc) = doc else { continue };
            let (charges, now_seen) = exchange::read_usage(seen.get(&name), &doc, Instant::now());
            for (tenant, requests, tokens) in charges {
                fair.rate_absorb(&tenant, requests, tokens);
            }
            seen.insert(name, now_seen);
        }
        seen.retain(|name, _| peers.members.iter().any(|m| &m.name == name));
    }
}

/// While the router runs: reads the member list of a member that told of a higher revision than
/// the one in force, and applies it. Stops with the router.
pub async fn members(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        let applied = state.applied.load_full();
        let heard = applied.peers.as_ref().map(|p| p.heard.clone());
        tokio::select! {
            _ = async {
                match &heard {
                    Some(h) => h.wake.notified().await,
                    None => std::future::pending().await,
                }
            } => {}
            // A peers section added by a reload has its own record of what was heard.
            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            _ = stop.changed() => return,
        }
        let (Some(heard), Some(peers)) = (heard, &applied.peers) else {
            continue;
        };
        let Some(gossip::Rumour {
            revision,
            name: from,
            url,
        }) = heard.take()
        else {
            continue;
        };
        if peers.revision.is_none_or(|r| revision <= r) {
            continue;
        }
        // A member at its URL in the list; a replica not in the list yet at the address its
        // authenticated request came from. Either way its list must be signed with the peer
        // secret.
        let stranger;
        let member = match (peers.members.iter().find(|m| m.name == from), &url) {
            (Some(m), _) => m,
            (None, Some(url)) => match crate::peers::Member::stranger(&from, url) {
                Some(m) => {
                    stranger = m;
                    &stranger
                }
                None => continue,
            },
            _ => continue,
        };
        let outcome = match crate::peers::get_json(
            &state.peer_client,
            peers,
            member,
            "/peers/members",
            HeaderMap::new(),
            gossip::READ_TIMEOUT,
        )
        .await
        .and_then(|doc| state.adopt_members(&from, &doc))
        {
            Ok(gossip::Adoption::Adopted) => {
                let now = state.applied.load();
                let names: Vec<&str> = now
                    .peers
                    .as_ref()
                    .map(|p| p.members.iter().map(|m| m.name.as_str()).collect())
                    .unwrap_or_default();
                tracing::info!(
                    event = "peer_members_adopted",
                    from = %from,
                    revision,
                    members = %names.join(","),
                    "took the newer member list of another replica"
                );
                "adopted"
            }
            Ok(gossip::Adoption::Stale) => "stale",
            Err(e) => {
                tracing::warn!(from = %from, revision, error = %e, "could not take another replica's member list");
                "error"
            }
        };
        state
            .peer_metrics
            .member_lists
            .with_label_values(&[outcome])
            .inc();
    }
}
