//! Program forwarding between router replicas (`peers`, extension).
//!
//! Owns who owns a Program — rendezvous (highest random weight) hashing of the Program tree's
//! root id over the member names, which every replica with the same member list computes alike
//! and which moves only the departed member's Programs when the list changes — the skipping of
//! members that refused a connection, and the forwarding itself: the client's request, body and
//! headers unchanged, to the owner's API listener, with the answer (streamed or not) relayed
//! back. A forwarded request carries [`FORWARDED_BY`] and is always served where it lands, so a
//! request crosses at most one hop even while replicas disagree about the member list.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use rustc_hash::FxHashMap;

use crate::config::peers::PeersConfig;
use crate::error::ApiError;
use crate::server::{Body, BoxError};

/// Marks a request forwarded by a peer (its value names the sender); such a request is served
/// by the replica it reaches.
pub static FORWARDED_BY: HeaderName = HeaderName::from_static("x-program-router-peer");

/// On a 503 from a replica that declined a forwarded request before doing anything with it (it
/// is shutting down): the sender serves the request itself.
pub static DECLINED: HeaderName = HeaderName::from_static("x-program-router-peer-declined");

/// The answer of a replica that declines a forwarded request because it is shutting down.
pub fn decline_draining() -> Response<Body> {
    let mut r = ApiError::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "this router replica is shutting down; the sending replica serves the request",
    )
    .into_response();
    r.headers_mut()
        .insert(DECLINED.clone(), HeaderValue::from_static("draining"));
    r
}

/// The client that carries requests between replicas.
pub type PeerClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the peer client: replicas run in one cluster, so a member that does not accept within
/// a second is treated as down; idle connections are dropped well before a replica's own idle
/// limit for clients (60 s), so a request is never written into a connection being closed.
pub fn client() -> PeerClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(1)));
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.enforce_http(true);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(http)
}

/// One member of the applied peer list.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub url: String,
    authority: http::uri::Authority,
    /// Skipped until then after a refused connection.
    down_until: Mutex<Option<Instant>>,
}

impl Member {
    fn down(&self, now: Instant) -> bool {
        self.down_until
            .lock()
            .map(|d| d.is_some_and(|t| now < t))
            .unwrap_or(false)
    }
}

/// The applied `peers` section.
#[derive(Debug)]
pub struct Peers {
    /// This replica's position in `members`, when it is one.
    me: Option<usize>,
    pub self_name: Option<String>,
    pub members: Vec<Member>,
    backoff: Duration,
    /// `FORWARDED_BY`'s value on requests this replica forwards.
    sender: HeaderValue,
}

impl Peers {
    /// The runtime view of a validated `cfg`; members of `prev` with the same name and URL keep
    /// their down state.
    pub fn new(cfg: &PeersConfig, prev: Option<&Peers>) -> Peers {
        let members: Vec<Member> = cfg
            .members
            .iter()
            .filter_map(|m| {
                let uri: Uri = m.url.parse().ok()?;
                let down = prev
                    .and_then(|p| {
                        p.members
                            .iter()
                            .find(|o| o.name == m.name && o.url == m.url)
                    })
                    .and_then(|o| o.down_until.lock().ok().and_then(|d| *d));
                Some(Member {
                    name: m.name.clone(),
                    url: m.url.trim_end_matches('/').to_string(),
                    authority: uri.authority()?.clone(),
                    down_until: Mutex::new(down),
                })
            })
            .collect();
        let me = cfg
            .self_name
            .as_ref()
            .and_then(|n| members.iter().position(|m| &m.name == n));
        let sender = cfg
            .self_name
            .as_deref()
            .and_then(|n| HeaderValue::from_str(n).ok())
            .unwrap_or(HeaderValue::from_static("unnamed"));
        Peers {
            me,
            self_name: cfg.self_name.clone(),
            members,
            backoff: crate::config::duration(cfg.unreachable_backoff_secs),
            sender,
        }
    }

    /// Whether this replica is one of the members (otherwise it owns no Program).
    pub fn is_member(&self) -> bool {
        self.me.is_some()
    }

    /// The member that owns the Program tree `root`, when that is another replica; `None` when
    /// this replica owns it (or no member is reachable, so it serves the request itself).
    /// Members found down are passed over, and never this replica.
    pub fn owner(&self, root: &str, now: Instant) -> Option<&Member> {
        let best = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| Some(*i) == self.me || !m.down(now))
            .max_by_key(|(_, m)| score(&m.name, root))?;
        (Some(best.0) != self.me).then_some(best.1)
    }

    /// Marks `m` down for the backoff (a connection to it was refused).
    pub fn mark_down(&self, m: &Member) {
        if let Ok(mut d) = m.down_until.lock() {
            *d = Some(Instant::now() + self.backoff);
        }
    }

    /// Names of the members skipped now.
    pub fn down_members(&self) -> Vec<&str> {
        let now = Instant::now();
        self.members
            .iter()
            .filter(|m| m.down(now))
            .map(|m| m.name.as_str())
            .collect()
    }
}

/// The rendezvous weight of `member` for `key`: the largest owns the key.
fn score<'a>(member: &'a str, key: &str) -> (u64, &'a str) {
    let mut bytes = Vec::with_capacity(member.len() + key.len() + 1);
    bytes.extend_from_slice(member.as_bytes());
    bytes.push(0xff); // never in UTF-8 text: ("ab","c") and ("a","bc") differ
    bytes.extend_from_slice(key.as_bytes());
    // The name breaks (astronomically unlikely) ties, so every replica picks the same member.
    (crate::hash::stable_hash(&bytes), member)
}

/// Why a forward did not produce an answer.
pub enum ForwardError {
    /// The owner could not be reached before anything was sent, or declined the request before
    /// doing anything with it: serve the request here.
    Unreachable(String),
    /// It failed after the request may have reached the owner (never sent again): the answer.
    Failed(ApiError),
}

/// One request to hand to its owner.
pub struct Handoff<'a> {
    pub method: Method,
    pub path_and_query: &'a http::uri::PathAndQuery,
    pub headers: &'a HeaderMap,
    /// The client's body exactly as received.
    pub body: Bytes,
    pub request_id: &'a HeaderValue,
    /// Deadline for the owner's response headers.
    pub timeout: Duration,
}

/// Sends `h` to `member` and returns its answer, body streamed through.
pub async fn forward(
    client: &PeerClient,
    peers: &Peers,
    member: &Member,
    h: Handoff<'_>,
) -> Result<Response<Body>, ForwardError> {
    let uri = Uri::builder()
        .scheme("http")
        .authority(member.authority.clone())
        .path_and_query(h.path_and_query.clone())
        .build()
        .map_err(|e| ForwardError::Failed(ApiError::upstream(format!("peer URL: {e}"))))?;
    let mut req = Request::builder().method(h.method).uri(uri);
    if let Some(out) = req.headers_mut() {
        crate::proxy::copy_end_to_end(h.headers, out);
        out.insert(FORWARDED_BY.clone(), peers.sender.clone());
        out.insert("x-request-id", h.request_id.clone());
        if !h.body.is_empty() {
            out.insert(header::CONTENT_LENGTH, HeaderValue::from(h.body.len()));
        }
    }
    let req = req
        .body(Full::new(h.body))
        .map_err(|e| ForwardError::Failed(ApiError::upstream(format!("peer request: {e}"))))?;
    let resp = match tokio::time::timeout(h.timeout, client.request(req)).await {
        Err(_) => {
            return Err(ForwardError::Failed(ApiError::new(
                http::StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "router replica {} sent no response headers within {:?}",
                    member.name, h.timeout
                ),
            )));
        }
        Ok(Err(e)) if e.is_connect() => {
            peers.mark_down(member);
            return Err(ForwardError::Unreachable(format!(
                "router replica {} ({}): {e}",
                member.name, member.url
            )));
        }
        Ok(Err(e)) => {
            return Err(ForwardError::Failed(ApiError::upstream(format!(
                "router replica {} failed: {e}",
                member.name
            ))));
        }
        Ok(Ok(r))
            if r.status() == http::StatusCode::SERVICE_UNAVAILABLE
                && r.headers().contains_key(&DECLINED) =>
        {
            // Declined before the owner did anything with it (it is shutting down): safe to
            // serve here, and its Programs go to the next owner until it is gone.
            peers.mark_down(member);
            return Err(ForwardError::Unreachable(format!(
                "router replica {} is shutting down",
                member.name
            )));
        }
        Ok(Ok(r)) => r,
    };
    let (mut parts, body) = resp.into_parts();
    let mut headers = HeaderMap::with_capacity(parts.headers.len());
    crate::proxy::copy_end_to_end(&parts.headers, &mut headers);
    parts.headers = headers;
    let body = body.map_err(|e| Box::new(e) as BoxError).boxed_unsync();
    Ok(Response::from_parts(parts, body))
}

/// Every member's `/scheduling/diagnostics` but this replica's, read with the client's own
/// credentials (each replica applies its own diagnostics scope): `(name, url, document or
/// error)`, in member order. Members are asked at once, each for at most `timeout`.
pub async fn member_diagnostics(
    client: &PeerClient,
    peers: &Peers,
    headers: &HeaderMap,
    timeout: Duration,
) -> Vec<(String, String, Result<serde_json::Value, String>)> {
    let asks = peers
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != peers.me)
        .map(|(_, m)| async move {
            let got = async {
                let uri = Uri::builder()
                    .scheme("http")
                    .authority(m.authority.clone())
                    .path_and_query("/scheduling/diagnostics")
                    .build()
                    .map_err(|e| e.to_string())?;
                let mut req = Request::get(uri);
                if let Some(out) = req.headers_mut() {
                    for name in [header::AUTHORIZATION, crate::auth::X_API_KEY] {
                        if let Some(v) = headers.get(&name) {
                            out.insert(name, v.clone());
                        }
                    }
                    out.insert(FORWARDED_BY.clone(), peers.sender.clone());
                }
                let req = req
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| e.to_string())?;
                let resp = client.request(req).await.map_err(|e| e.to_string())?;
                let status = resp.status();
                let body = resp
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?
                    .to_bytes();
                if !status.is_success() {
                    return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
                }
                serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
            };
            let got = match tokio::time::timeout(timeout, got).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            (m.name.clone(), m.url.clone(), got)
        });
    futures_util::future::join_all(asks).await
}

/// `GET /peers/usage`: what this replica charged to each tenant's quota, for the others to
/// charge too: `{"epoch": <id of this quota state>, "age_secs": <its age>, "tenants": {name:
/// [requests, tokens]}}`.
pub fn usage_document(applied: &crate::state::Applied) -> serde_json::Value {
    let (epoch, age, tenants) = match &applied.fair {
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

/// What one member reported last: its quota state's epoch and per-tenant totals.
#[derive(Default)]
struct Seen {
    epoch: String,
    totals: FxHashMap<String, (f64, f64)>,
}

/// How often the replicas exchange quota use.
pub const USAGE_INTERVAL: Duration = Duration::from_secs(1);

/// Every [`USAGE_INTERVAL`], while this replica has peers and tenants have quotas: reads each
/// other member's `/peers/usage` and charges this replica's quotas with what the member admitted
/// since the last read. On the first read of a member, its totals count when its quota state is
/// younger than a minute (all of it is recent) and are only remembered otherwise (older use has
/// been refilled; the last minute's is not known apart); after it restarted, all of them count.
/// Stops with the router.
pub async fn usage_loop(state: std::sync::Arc<crate::state::RouterState>) {
    let mut stop = state.stop_rx();
    let mut seen: FxHashMap<String, Seen> = FxHashMap::default();
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
        let reads = peers
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != peers.me)
            .map(|(_, m)| {
                let (client, auth) = (&state.peer_client, applied.authorization.clone());
                async move {
                    let doc = read_usage(client, peers, m, auth).await;
                    (m.name.clone(), doc)
                }
            });
        for (name, doc) in futures_util::future::join_all(reads).await {
            let Ok(doc) = doc else { continue };
            let epoch = doc["epoch"].as_str().unwrap_or_default().to_string();
            let first = !seen.contains_key(&name);
            let young = doc["age_secs"]
                .as_f64()
                .is_some_and(|a| a <= QUOTA_MEMORY_SECS);
            let entry = seen.entry(name).or_default();
            let restarted = !first && entry.epoch != epoch;
            // Whether this read's totals count from zero.
            let from_zero = restarted || (first && young);
            let mut totals = FxHashMap::default();
            for (tenant, v) in doc["tenants"].as_object().into_iter().flatten() {
                let (Some(r), Some(k)) = (v[0].as_f64(), v[1].as_f64()) else {
                    continue;
                };
                if !first || from_zero {
                    let (r0, k0) = match entry.totals.get(tenant) {
                        // Totals only grow in requests; fewer means they started over.
                        Some(&(r0, k0)) if !from_zero && r >= r0 => (r0, k0),
                        _ => (0.0, 0.0),
                    };
                    if r - r0 != 0.0 || k - k0 != 0.0 {
                        fair.rate_absorb(tenant, r - r0, k - k0);
                    }
                }
                totals.insert(tenant.clone(), (r, k));
            }
            *entry = Seen { epoch, totals };
        }
        seen.retain(|name, _| peers.members.iter().any(|m| &m.name == name));
    }
}

async fn read_usage(
    client: &PeerClient,
    peers: &Peers,
    m: &Member,
    authorization: Option<HeaderValue>,
) -> Result<serde_json::Value, String> {
    let uri = Uri::builder()
        .scheme("http")
        .authority(m.authority.clone())
        .path_and_query("/peers/usage")
        .build()
        .map_err(|e| e.to_string())?;
    let mut req = Request::get(uri);
    if let Some(h) = req.headers_mut() {
        if let Some(a) = authorization {
            h.insert(header::AUTHORIZATION, a);
        }
        h.insert(FORWARDED_BY.clone(), peers.sender.clone());
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let work = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    };
    tokio::time::timeout(USAGE_INTERVAL, work)
        .await
        .map_err(|_| "no answer in time".to_string())?
}

/// The worker URL that stored Responses API response `id`, asked of every other member that is
/// not skipped (`GET /peers/response-home/{id}`, at once, each for at most half a second): the
/// first that knows. For a follow-up to a response another replica relayed.
pub async fn response_home(
    client: &PeerClient,
    peers: &Peers,
    id: &str,
    authorization: Option<HeaderValue>,
) -> Option<String> {
    if !crate::proxy::stored::plain_id(id) {
        return None;
    }
    let now = Instant::now();
    let asks = peers
        .members
        .iter()
        .enumerate()
        .filter(|(i, m)| Some(*i) != peers.me && !m.down(now))
        .map(|(_, m)| {
            let authorization = authorization.clone();
            Box::pin(async move {
                let uri = Uri::builder()
                    .scheme("http")
                    .authority(m.authority.clone())
                    .path_and_query(format!("/peers/response-home/{id}"))
                    .build()
                    .ok()?;
                let mut req = Request::get(uri);
                if let Some(h) = req.headers_mut() {
                    if let Some(a) = authorization {
                        h.insert(header::AUTHORIZATION, a);
                    }
                    h.insert(FORWARDED_BY.clone(), peers.sender.clone());
                }
                let req = req.body(Full::new(Bytes::new())).ok()?;
                let work = async {
                    let resp = client.request(req).await.ok()?;
                    if !resp.status().is_success() {
                        return None;
                    }
                    let body = resp.into_body().collect().await.ok()?.to_bytes();
                    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                    v["url"].as_str().map(String::from)
                };
                tokio::time::timeout(Duration::from_millis(500), work)
                    .await
                    .ok()
                    .flatten()
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

/// A response body that keeps `T` (a place among the requests in progress) until the body ends
/// or is dropped.
pub struct Holding<T> {
    inner: Body,
    _held: T,
}

impl<T> Holding<T> {
    pub fn new(inner: Body, held: T) -> Self {
        Holding { inner, _held: held }
    }
}

impl<T: Unpin> HttpBody for Holding<T> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::peers::PeerMember;

    fn peers(me: Option<&str>, names: &[&str]) -> Peers {
        Peers::new(
            &PeersConfig {
                self_name: me.map(String::from),
                members: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| PeerMember {
                        name: (*n).into(),
                        url: format!("http://127.0.0.1:{}", 9000 + i),
                    })
                    .collect(),
                ..Default::default()
            },
            None,
        )
    }

    /// The owner as a name, `me` included.
    fn owner_name<'a>(p: &'a Peers, me: &'a str, key: &str) -> &'a str {
        p.owner(key, Instant::now()).map_or(me, |m| m.name.as_str())
    }

    #[test]
    fn every_replica_agrees_and_keys_spread() {
        let names = ["r-a", "r-b", "r-c"];
        let views: Vec<Peers> = names.iter().map(|n| peers(Some(n), &names)).collect();
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for k in 0..3000 {
            let key = format!("program-{k}");
            let owners: Vec<&str> = views
                .iter()
                .zip(names)
                .map(|(v, me)| owner_name(v, me, &key))
                .collect();
            assert!(owners.iter().all(|o| *o == owners[0]), "{key}: {owners:?}");
            *counts.entry(owners[0]).or_default() += 1;
        }
        for n in names {
            let c = counts[n];
            assert!((850..=1150).contains(&c), "{n} owns {c} of 3000");
        }
    }

    #[test]
    fn a_departed_member_moves_only_its_own_programs() {
        let before = peers(Some("r-a"), &["r-a", "r-b", "r-c"]);
        let after = peers(Some("r-a"), &["r-a", "r-c"]);
        for k in 0..2000 {
            let key = format!("p{k}");
            let was = owner_name(&before, "r-a", &key);
            let now = owner_name(&after, "r-a", &key);
            if was != "r-b" {
                assert_eq!(was, now, "{key} moved though its owner stayed");
            }
        }
    }

    #[test]
    fn a_down_member_is_skipped_and_a_non_member_never_owns() {
        let p = peers(Some("r-a"), &["r-a", "r-b"]);
        let theirs = (0..100)
            .map(|k| format!("p{k}"))
            .find(|k| p.owner(k, Instant::now()).is_some())
            .expect("r-b owns some");
        let b = p.owner(&theirs, Instant::now()).expect("r-b");
        p.mark_down(b);
        assert!(p.owner(&theirs, Instant::now()).is_none(), "served here");
        assert_eq!(p.down_members(), vec!["r-b"]);
        // A reload with the same member keeps the down state; a new URL does not.
        let cfg = |url: &str| PeersConfig {
            self_name: Some("r-a".into()),
            members: vec![
                PeerMember {
                    name: "r-a".into(),
                    url: "http://127.0.0.1:9000".into(),
                },
                PeerMember {
                    name: "r-b".into(),
                    url: url.into(),
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            Peers::new(&cfg("http://127.0.0.1:9001"), Some(&p)).down_members(),
            vec!["r-b"]
        );
        assert!(
            Peers::new(&cfg("http://127.0.0.1:9101"), Some(&p))
                .down_members()
                .is_empty()
        );

        let outsider = peers(Some("r-new"), &["r-a", "r-b"]);
        assert!(!outsider.is_member());
        for k in 0..50 {
            assert!(outsider.owner(&format!("p{k}"), Instant::now()).is_some());
        }
        let alone = peers(None, &[]);
        assert!(alone.owner("p", Instant::now()).is_none());
    }
}
