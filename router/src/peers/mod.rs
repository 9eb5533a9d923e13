//! Router replicas that know each other (`peers`, extension): membership and ownership.
//!
//! Owns who owns a Program — rendezvous (highest random weight) hashing of the Program tree's
//! root id over the member names, which every replica with the same member list computes alike
//! and which moves only the departed member's Programs when the list changes — the skipping of
//! members that refused a connection, and the HTTP client and JSON reads between replicas.
//! [`forward`] hands Program requests to their owner; [`exchange`] carries what the replicas
//! tell each other (quota use, stored-response homes, diagnostics). A request from a peer
//! carries [`FORWARDED_BY`] and is always served where it lands, so a request crosses at most
//! one hop even while replicas disagree about the member list.

pub mod exchange;
pub mod forward;
pub mod gossip;
pub mod handover;
pub mod key;
pub mod metrics;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::config::peers::PeersConfig;

pub use exchange::{USAGE_INTERVAL, member_diagnostics, response_home, usage_document};
pub use forward::{ForwardError, Handoff, decline, forward};
pub use key::{PEER_KEY, PeerKey};

/// Marks a request forwarded by a peer (its value names the sender); such a request is served
/// by the replica it reaches. Names the member a request between replicas is meant for: a
/// replica with another name (a pod that now has a departed member's address) declines it.
pub use crate::net::headers::{ADDRESSED_TO, FORWARDED_BY};

/// On every answer to a request from a peer: the name of the replica that answered. The sender
/// takes an answer only from the member it addressed.
pub static ANSWERED_BY: HeaderName = HeaderName::from_static("x-program-router-peer-answered-by");

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
    /// The name as a header value ([`ADDRESSED_TO`]).
    header: HeaderValue,
}

impl Member {
    /// Marks `h` as a request to this member: from `peers`, addressed to it by name.
    fn address(&self, peers: &Peers, h: &mut HeaderMap) {
        let sender = peers.self_header.clone();
        h.insert(
            FORWARDED_BY.clone(),
            sender.unwrap_or(HeaderValue::from_static("unnamed")),
        );
        h.insert(ADDRESSED_TO.clone(), self.header.clone());
        if let Some(r) = &peers.revision_header {
            h.insert(gossip::REVISION.clone(), r.clone());
        }
        if let Some(u) = &peers.self_url {
            h.insert(gossip::SENDER_URL.clone(), u.clone());
        }
        if let Some(k) = &peers.key {
            k.present(h);
        }
    }

    /// The replica `name` at `url` (an `http://` base URL), skipped until `down_until`.
    fn new(name: &str, url: &str, down_until: Option<Instant>) -> Option<Member> {
        let uri: Uri = url.parse().ok()?;
        if uri.scheme_str() != Some("http") {
            return None;
        }
        Some(Member {
            name: name.to_string(),
            url: url.trim_end_matches('/').to_string(),
            authority: uri.authority()?.clone(),
            down_until: Mutex::new(down_until),
            header: HeaderValue::from_str(name).ok()?,
        })
    }

    /// A replica not in this replica's list, at `url` (to read its member list from).
    pub(crate) fn stranger(name: &str, url: &str) -> Option<Member> {
        Member::new(name, url, None)
    }

    /// Whether an answer with headers `h` came from this member itself.
    fn answered(&self, h: &HeaderMap) -> bool {
        h.get(&ANSWERED_BY) == Some(&self.header)
    }

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
    /// This replica's name as a header value ([`ANSWERED_BY`], and [`FORWARDED_BY`] on what it
    /// sends, `unnamed` without a name).
    self_header: Option<HeaderValue>,
    /// Members whose quota use could not be read the last time, and why.
    usage_errors: Mutex<std::collections::BTreeMap<String, String>>,
    /// When the member names last changed (or this replica started): Programs may have moved
    /// between replicas since ([`handover`]).
    changed_at: Instant,
    /// Whether this replica asks for moved Programs and gives its own away when it stops
    /// ([`PeersConfig::hand_over`]).
    pub hand_over: bool,
    /// Which member list this is ([`PeersConfig::revision`]), and as a header value.
    pub revision: Option<u64>,
    revision_header: Option<HeaderValue>,
    /// This replica's URL in the list, as a header value ([`gossip::SENDER_URL`]).
    self_url: Option<HeaderValue>,
    /// Higher revisions heard from members, for `crate::run::loops::members`; carried over
    /// from the previous list.
    pub(crate) heard: std::sync::Arc<gossip::Heard>,
    /// The peer secret presented on every request to a member (`None` only in unit tests).
    pub key: Option<std::sync::Arc<PeerKey>>,
}

impl Peers {
    /// The runtime view of a validated `cfg`, presenting `key` to the members; members of
    /// `prev` with the same name and URL keep their down state.
    pub fn new(
        cfg: &PeersConfig,
        prev: Option<&Peers>,
        key: Option<std::sync::Arc<PeerKey>>,
    ) -> Peers {
        let members: Vec<Member> = cfg
            .members
            .iter()
            .filter_map(|m| {
                let down = prev
                    .and_then(|p| {
                        p.members
                            .iter()
                            .find(|o| o.name == m.name && o.url == m.url)
                    })
                    .and_then(|o| o.down_until.lock().ok().and_then(|d| *d));
                Member::new(&m.name, &m.url, down)
            })
            .collect();
        let me = cfg
            .self_name
            .as_ref()
            .and_then(|n| members.iter().position(|m| &m.name == n));
        let self_url = me
            .and_then(|i| members.get(i))
            .and_then(|m| HeaderValue::from_str(&m.url).ok());
        let self_header = cfg
            .self_name
            .as_deref()
            .and_then(|n| HeaderValue::from_str(n).ok());
        fn names(ms: &[Member]) -> Vec<&str> {
            let mut v: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
            v.sort_unstable();
            v
        }
        let changed_at = prev
            .filter(|p| p.self_name == cfg.self_name && names(&p.members) == names(&members))
            .map_or_else(Instant::now, |p| p.changed_at);
        Peers {
            me,
            self_name: cfg.self_name.clone(),
            members,
            backoff: crate::config::duration(cfg.unreachable_backoff_secs),
            self_header,
            usage_errors: Mutex::default(),
            changed_at,
            hand_over: cfg.hand_over,
            revision: cfg.revision,
            revision_header: cfg.revision.map(HeaderValue::from),
            self_url,
            heard: prev.map(|p| p.heard.clone()).unwrap_or_default(),
            key,
        }
    }

    /// A request from, or an answer of, member `from` with headers `h`: when it tells of a
    /// higher member-list revision than this one, that replica's list is read
    /// (`crate::run::loops::members`): a member of this list at its URL here, another replica at
    /// the URL it gave when that is the address its request came from (`source`; its list must
    /// be signed with the peer secret). Nothing is read when this list has no revision.
    pub fn hear(&self, from: &str, h: &HeaderMap, source: Option<std::net::IpAddr>) {
        let (Some(mine), Some(theirs)) = (self.revision, gossip::revision_in(h)) else {
            return;
        };
        if theirs <= mine || self.self_name.as_deref() == Some(from) {
            return;
        }
        let known = self.members.iter().any(|m| m.name == from);
        let url = match h.get(&gossip::SENDER_URL).and_then(|v| v.to_str().ok()) {
            _ if known => None,
            // Only the address the request came from is read, so a request cannot make this
            // replica call anywhere else.
            Some(u) if source.is_some() && gossip::host_ip(u) == source => Some(u.to_string()),
            _ => return,
        };
        self.heard.offer(gossip::Rumour {
            revision: theirs,
            name: from.to_string(),
            url,
        });
    }

    /// This list's revision as a header value, for answers to peers.
    pub fn revision_header(&self) -> Option<HeaderValue> {
        self.revision_header.clone()
    }

    /// Whether Programs may have moved here from other replicas within the last `window`: the
    /// member names changed, or this replica started, that recently.
    pub fn recently_changed(&self, window: Duration) -> bool {
        self.changed_at.elapsed() < window
    }

    /// The position of the member that owns the tree `root` once this replica is gone (members
    /// found down passed over); `None` when no other member is left.
    pub fn successor(&self, root: &str, now: Instant) -> Option<usize> {
        let live = self.members.iter().enumerate();
        let live = live.filter(|(i, m)| Some(*i) != self.me && !m.down(now));
        crate::hash::rendezvous(root, live.map(|(i, m)| (i, m.name.as_str())))
    }

    /// Whether a request from a peer addressed with `h` is meant for this replica (one without
    /// an address is taken as meant for it).
    pub fn addressed_here(&self, h: &HeaderMap) -> bool {
        match h.get(&ADDRESSED_TO) {
            None => true,
            Some(to) => self.self_name.as_deref().map(str::as_bytes) == Some(to.as_bytes()),
        }
    }

    /// This replica's name for [`ANSWERED_BY`], when it has one.
    pub fn answer_header(&self) -> Option<HeaderValue> {
        self.self_header.clone()
    }

    /// Whether this replica is one of the members (otherwise it owns no Program).
    pub fn is_member(&self) -> bool {
        self.me.is_some()
    }

    /// The member that owns the Program tree `root`, when that is another replica; `None` when
    /// this replica owns it (or no member is reachable, so it serves the request itself).
    /// Members found down are passed over, and never this replica.
    pub fn owner(&self, root: &str, now: Instant) -> Option<&Member> {
        self.next_owner(root, now, &[])
    }

    /// [`Peers::owner`] with the members named in `passed` passed over as well (they declined
    /// or could not be reached for this request).
    pub fn next_owner(&self, root: &str, now: Instant, passed: &[&str]) -> Option<&Member> {
        let open = self.members.iter().enumerate().filter(|(i, m)| {
            Some(*i) == self.me || (!m.down(now) && !passed.contains(&m.name.as_str()))
        });
        let best = crate::hash::rendezvous(root, open.map(|(i, m)| ((i, m), m.name.as_str())))?;
        (Some(best.0) != self.me).then_some(best.1)
    }

    /// Marks `m` down for the backoff (a connection to it was refused).
    pub fn mark_down(&self, m: &Member) {
        if let Ok(mut d) = m.down_until.lock() {
            *d = Some(Instant::now() + self.backoff);
        }
    }

    /// Records the outcome of reading `member`'s quota use.
    pub(crate) fn usage_read(&self, member: &str, error: Option<String>) {
        if let Ok(mut e) = self.usage_errors.lock() {
            match error {
                Some(why) => e.insert(member.to_string(), why),
                None => e.remove(member),
            };
        }
    }

    /// Members whose quota use could not be read the last time, and why.
    pub fn usage_errors(&self) -> std::collections::BTreeMap<String, String> {
        self.usage_errors
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
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

/// `GET path` on `m` with `headers` (addressed to it), its JSON body within `timeout`; an answer
/// from anyone but `m` is an error.
pub(crate) async fn get_json(
    client: &PeerClient,
    peers: &Peers,
    m: &Member,
    path: &str,
    headers: HeaderMap,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    call_json(client, peers, m, path, headers, None, timeout).await
}

/// `POST path` on `m` with the JSON `body`, otherwise as [`get_json`].
pub(crate) async fn post_json(
    client: &PeerClient,
    peers: &Peers,
    m: &Member,
    path: &str,
    headers: HeaderMap,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    call_json(client, peers, m, path, headers, Some(bytes), timeout).await
}

async fn call_json(
    client: &PeerClient,
    peers: &Peers,
    m: &Member,
    path: &str,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let uri = Uri::builder()
        .scheme("http")
        .authority(m.authority.clone())
        .path_and_query(path)
        .build()
        .map_err(|e| e.to_string())?;
    let mut req = match body {
        Some(_) => Request::post(uri),
        None => Request::get(uri),
    };
    if let Some(h) = req.headers_mut() {
        *h = headers;
        if body.is_some() {
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        m.address(peers, h);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let work = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        if !m.answered(resp.headers()) {
            return Err(format!("{} did not answer as {}", m.url, m.name));
        }
        peers.hear(&m.name, resp.headers(), None);
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
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {timeout:?}")),
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
    fn a_member_passed_over_for_one_request_gives_way_to_the_one_every_replica_picks_next() {
        let with_b = peers(Some("r-a"), &["r-a", "r-b", "r-c"]);
        let without_b = peers(Some("r-a"), &["r-a", "r-c"]);
        let now = Instant::now();
        let mut checked = 0;
        for k in 0..500 {
            let key = format!("p{k}");
            if with_b.owner(&key, now).map(|m| m.name.as_str()) != Some("r-b") {
                continue;
            }
            checked += 1;
            let next = with_b.next_owner(&key, now, &["r-b"]).map(|m| &m.name);
            assert_eq!(next, without_b.owner(&key, now).map(|m| &m.name), "{key}");
            // Passed over for this request only: not marked down.
            assert_eq!(
                with_b.owner(&key, now).map(|m| m.name.as_str()),
                Some("r-b")
            );
        }
        assert!(checked > 100, "{checked}");
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
            Peers::new(&cfg("http://127.0.0.1:9001"), Some(&p), None).down_members(),
            vec!["r-b"]
        );
        assert!(
            Peers::new(&cfg("http://127.0.0.1:9101"), Some(&p), None)
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
