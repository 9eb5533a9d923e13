//! What the replicas tell each other: quota use (read every second and charged here), which
//! server stored a Responses API response, and each replica's diagnostics.

use std::time::{Duration, Instant};

use http::HeaderMap;
use http::header;
use rustc_hash::FxHashMap;

use super::{Member, PeerClient, Peers, get_json};

/// Every member's `/scheduling/diagnostics` but this replica's, read with the client's own
/// credentials (each replica applies its own diagnostics scope): `(name, url, document or
/// error)`, in member order. Members are asked at once, each for at most `timeout`.
pub async fn member_diagnostics(
    client: &PeerClient,
    peers: &Peers,
    headers: &HeaderMap,
    timeout: Duration,
) -> Vec<(String, String, Result<serde_json::Value, String>)> {
    let mut creds = HeaderMap::new();
    for name in [&header::AUTHORIZATION, &crate::auth::X_API_KEY] {
        if let Some(v) = headers.get(name) {
            creds.insert(name, v.clone());
        }
    }
    let asks = others(peers).map(|m| {
        let creds = creds.clone();
        async move {
            let got = get_json(client, peers, m, "/scheduling/diagnostics", creds, timeout).await;
            (m.name.clone(), m.url.clone(), got)
        }
    });
    futures_util::future::join_all(asks).await
}

/// Every member but this replica.
pub fn others(peers: &Peers) -> impl Iterator<Item = &Member> {
    peers
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != peers.me)
        .map(|(_, m)| m)
}

/// `GET /peers/usage`: what this replica charged to each tenant's quota, for the others to
/// charge too: `{"epoch": <id of this quota state>, "age_secs": <its age>, "tenants": {name:
/// [requests, tokens]}}`.
pub fn usage_document(fair: Option<&crate::fair::runtime::FairRuntime>) -> serde_json::Value {
    let (epoch, age, tenants) = match fair {
        Some(f) => (
            f.rate_epoch(),
            f.rate_age_secs(),
            f.rate_totals()
                .into_iter()
                .map(|(t, r, k)| (t, serde_json::json!([r, k])))
                .collect::<serde_json::Map<_, _>>(),
        ),
        None => (0, 0.0, serde_json::Map::new()),
    };
    serde_json::json!({ "epoch": epoch.to_string(), "age_secs": age, "tenants": tenants })
}

/// A bucket holds one minute's allowance: use older than this has been refilled anyway.
const QUOTA_MEMORY_SECS: f64 = 60.0;

/// What one member reported last: its quota state's epoch and per-tenant totals, and when.
pub struct Seen {
    epoch: String,
    totals: FxHashMap<String, (f64, f64)>,
    at: Instant,
}

/// How often the replicas exchange quota use.
pub const USAGE_INTERVAL: Duration = Duration::from_secs(1);

/// What to charge here for one read `doc` of a member's quota use, given what was `seen` of it
/// before (see `crate::run::loops::usage`), as (tenant, requests, tokens); and what is seen now.
pub fn read_usage(
    seen: Option<&Seen>,
    doc: &serde_json::Value,
    now: Instant,
) -> (Vec<(String, f64, f64)>, Seen) {
    let epoch = doc["epoch"].as_str().unwrap_or_default().to_string();
    // A member not read for over a minute counts as met anew: what it admitted while it could
    // not be read has been refilled by now.
    let before =
        seen.filter(|e| now.saturating_duration_since(e.at).as_secs_f64() <= QUOTA_MEMORY_SECS);
    let young = doc["age_secs"]
        .as_f64()
        .is_some_and(|a| a <= QUOTA_MEMORY_SECS);
    // Whether the totals count from zero: a member met anew whose quota state is recent, or one
    // that started over since the last read.
    let from_zero = match before {
        None => young,
        Some(e) => e.epoch != epoch,
    };
    let mut charges = Vec::new();
    let mut totals = FxHashMap::default();
    for (tenant, v) in doc["tenants"].as_object().into_iter().flatten() {
        // Totals are counts: anything else from a peer is skipped.
        let count = |x: &serde_json::Value| x.as_f64().filter(|x| x.is_finite() && *x >= 0.0);
        let (Some(r), Some(k)) = (count(&v[0]), count(&v[1])) else {
            continue;
        };
        totals.insert(tenant.clone(), (r, k));
        let last = before.and_then(|e| e.totals.get(tenant)).copied();
        let (r0, k0) = match last {
            _ if from_zero => (0.0, 0.0),
            // Met anew, its quota state older than a minute: only remembered.
            _ if before.is_none() => continue,
            // Totals only grow in requests; fewer means they started over.
            Some((r0, k0)) if r >= r0 => (r0, k0),
            _ => (0.0, 0.0),
        };
        if r != r0 || k != k0 {
            charges.push((tenant.clone(), r - r0, k - k0));
        }
    }
    (
        charges,
        Seen {
            epoch,
            totals,
            at: now,
        },
    )
}

/// The worker URL that stored Responses API response `id`, asked of every other member that is
/// not skipped (`GET /peers/response-home/{id}`, at once, each for at most half a second): the
/// first that knows. For a follow-up to a response another replica relayed.
pub async fn response_home(client: &PeerClient, peers: &Peers, id: &str) -> Option<String> {
    if !crate::net::plain_id(id) {
        return None;
    }
    let now = Instant::now();
    let path = format!("/peers/response-home/{id}");
    let asks = others(peers)
        .filter(|m| !m.down(now))
        .map(|m| {
            let (path, headers) = (path.clone(), HeaderMap::new());
            Box::pin(async move {
                let timeout = Duration::from_millis(500);
                let v = get_json(client, peers, m, &path, headers, timeout)
                    .await
                    .ok()?;
                v["url"].as_str().map(String::from)
            })
        })
        .collect::<Vec<_>>();
    if asks.is_empty() {
        return None;
    }
    // The first member that knows answers; the others are not waited for.
    let mut pending = asks;
    while !pending.is_empty() {
        let (found, _, rest) = futures_util::future::select_all(pending).await;
        if found.is_some() {
            return found;
        }
        pending = rest;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(epoch: &str, age: f64, tenants: serde_json::Value) -> serde_json::Value {
        json!({"epoch": epoch, "age_secs": age, "tenants": tenants})
    }

    fn sorted(mut v: Vec<(String, f64, f64)>) -> Vec<(String, f64, f64)> {
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[test]
    fn a_members_quota_use_is_charged_once_and_only_while_it_is_recent() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        // Met for the first time after running an hour: its past is only remembered.
        let (c, seen) = read_usage(None, &doc("e1", 3600.0, json!({"x": [50, 900]})), t0);
        assert!(c.is_empty(), "{c:?}");
        // Then what it admits since is charged, each tenant apart, token give-backs included.
        let (c, seen) = read_usage(
            Some(&seen),
            &doc("e1", 3601.0, json!({"x": [52, 850], "y": [1, 10]})),
            secs(1),
        );
        assert_eq!(
            sorted(c),
            vec![("x".into(), 2.0, -50.0), ("y".into(), 1.0, 10.0)]
        );
        // Nothing new, nothing charged.
        let (c, seen) = read_usage(
            Some(&seen),
            &doc("e1", 3602.0, json!({"x": [52, 850], "y": [1, 10]})),
            secs(2),
        );
        assert!(c.is_empty(), "{c:?}");
        // It restarted (a new quota state): everything it reports is since then.
        let (c, seen) = read_usage(Some(&seen), &doc("e2", 3.0, json!({"x": [4, 40]})), secs(3));
        assert_eq!(c, vec![("x".into(), 4.0, 40.0)]);
        // Its totals for a tenant started over within the same state (the tenant table was
        // full): counted from zero.
        let (c, seen) = read_usage(Some(&seen), &doc("e2", 4.0, json!({"x": [1, 5]})), secs(4));
        assert_eq!(c, vec![("x".into(), 1.0, 5.0)]);
        // Not read for over a minute: met anew, and its state is older than a minute now.
        let (c, _) = read_usage(
            Some(&seen),
            &doc("e2", 70.0, json!({"x": [90, 900]})),
            secs(70),
        );
        assert!(c.is_empty(), "{c:?}");
        // A member met for the first time with a young state: all of it is recent.
        let (c, _) = read_usage(None, &doc("e9", 10.0, json!({"x": [3, 30]})), t0);
        assert_eq!(c, vec![("x".into(), 3.0, 30.0)]);
        // Totals that are no counts are skipped.
        let (c, _) = read_usage(
            None,
            &doc(
                "e9",
                10.0,
                json!({"x": [-3, 30], "y": [1, -1], "z": [1e300, 1]}),
            ),
            t0,
        );
        assert_eq!(c, vec![("z".into(), 1e300, 1.0)], "finite and not negative");
    }
}
