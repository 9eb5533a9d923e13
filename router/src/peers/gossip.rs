//! Spreading a newer member list between the replicas (`peers.revision`).
//!
//! Each replica reads its member list from its own copy of the config file, and a ConfigMap
//! volume reaches each pod at its own time (up to about a minute apart). Until every copy has
//! arrived, replicas that disagree about the members disagree about which replica owns a
//! Program, and a Program moved by the change is scheduled by two replicas at once. So every
//! request between replicas, and every answer to one, carries the sender's list revision
//! ([`REVISION`]); a replica that hears of a higher revision from a member reads that member's
//! list (`GET /peers/members`) and applies it at once. A replica that is not in this one's list
//! yet (a new pod, whose list is ahead) is read from too, at the URL it gives ([`SENDER_URL`])
//! when that is the address its (peer-authenticated) request came from. Every list carries an
//! HMAC-SHA256 of its content under the peer secret, which only the fleet's replicas hold, so
//! nobody else can hand this replica a list that sends Programs elsewhere. Owns the headers,
//! what was heard, the signature, the read, and the adoption; the file reload keeps a list
//! adopted this way until the file catches up ([`keep_newer_members`]).

use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use tokio::sync::Notify;

use crate::config::RouterConfig;
use crate::config::peers::{PeerMember, PeersConfig};
use crate::peers::Peers;

/// The member-list revision of the replica that sent a request to a peer, or answered one, and
/// the base URL of the sender as its own list gives it.
pub use crate::net::headers::{REVISION, SENDER_URL};

/// How long reading a member's list may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A replica that told of a newer member list: its revision, its name, and, when it is not in
/// this replica's list, the URL it gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Rumour {
    pub revision: u64,
    pub name: String,
    pub url: Option<String>,
}

/// The highest revision heard from another replica and not yet read, shared by the successive
/// applied member lists of one router.
#[derive(Debug, Default)]
pub struct Heard {
    best: Mutex<Option<Rumour>>,
    pub(crate) wake: Notify,
}

impl Heard {
    /// Notes `rumour`, if its revision is higher than anything pending.
    pub(super) fn offer(&self, rumour: Rumour) {
        let Ok(mut best) = self.best.lock() else {
            return;
        };
        if best.as_ref().is_none_or(|b| rumour.revision > b.revision) {
            *best = Some(rumour);
            self.wake.notify_one();
        }
    }

    pub fn take(&self) -> Option<Rumour> {
        self.best.lock().ok().and_then(|mut b| b.take())
    }
}

/// What a member list's signature covers: its revision and members, in this form.
fn signed_bytes(revision: u64, members: &[PeerMember]) -> Vec<u8> {
    let mut b = format!("program-router peers v1\n{revision}\n").into_bytes();
    // Serializing a list of plain structs cannot fail; an empty body would fail verification.
    b.extend(serde_json::to_vec(members).unwrap_or_default());
    b
}

fn mac(key: &str, revision: u64, members: &[PeerMember]) -> Option<Hmac<Sha256>> {
    let mut m = Hmac::<Sha256>::new_from_slice(key.as_bytes()).ok()?;
    m.update(&signed_bytes(revision, members));
    Some(m)
}

/// The HMAC-SHA256 of a member list under `key`, lowercase hex.
pub fn sign(key: &str, revision: u64, members: &[PeerMember]) -> Option<String> {
    let tag = mac(key, revision, members)?.finalize().into_bytes();
    Some(tag.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `signature` (hex) is the HMAC-SHA256 of the list under `key` (compared in constant
/// time).
pub fn verify(key: &str, revision: u64, members: &[PeerMember], signature: &str) -> bool {
    let Some(tag) = unhex(signature) else {
        return false;
    };
    mac(key, revision, members).is_some_and(|m| m.verify_slice(&tag).is_ok())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The IP address in the host of `url` (`None` for a name or an invalid URL).
pub(super) fn host_ip(url: &str) -> Option<std::net::IpAddr> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// The revision a request or answer from a peer carries.
pub(super) fn revision_in(h: &HeaderMap) -> Option<u64> {
    h.get(&REVISION)?.to_str().ok()?.parse().ok()
}

/// `GET /peers/members`: this replica's member list and its revision, signed with the peer
/// secret.
pub fn members_document(config: &RouterConfig, peers: Option<&Peers>) -> serde_json::Value {
    let p = config.peers.as_ref();
    let (revision, members) = (
        p.and_then(|p| p.revision),
        p.map(|p| p.members.as_slice()).unwrap_or_default(),
    );
    let key = peers.and_then(|p| p.key.as_deref());
    let signature = match (key, revision) {
        (Some(key), Some(r)) => sign(key.secret(), r, members),
        _ => None,
    };
    serde_json::json!({ "revision": revision, "members": members, "signature": signature })
}

/// A file reload: when the member list in force has a higher revision than the file's (it was
/// read from a member before this replica's copy of the file arrived), it stays, with its
/// revision; every other setting comes from the file. Returns whether it stayed.
pub fn keep_newer_members(file: &mut RouterConfig, in_force: &RouterConfig) -> bool {
    let (Some(new), Some(cur)) = (file.peers.as_mut(), in_force.peers.as_ref()) else {
        return false;
    };
    match (new.revision, cur.revision) {
        (Some(f), Some(a)) if a > f => {
            new.members = cur.members.clone();
            new.revision = cur.revision;
            true
        }
        _ => false,
    }
}

/// The configuration to apply for the member list in `doc` (another replica's
/// `/peers/members`): `Ok(None)` when its revision is not higher than the one in force in
/// `current`; this replica's own settings (`self_name`, `hand_over`, the backoff) stay. The list
/// must carry its signature under the peer secret of `peers`.
pub fn adoptable(
    current: &RouterConfig,
    peers: Option<&Peers>,
    doc: &serde_json::Value,
) -> Result<Option<RouterConfig>, String> {
    let revision = doc["revision"]
        .as_u64()
        .ok_or("revision: a non-negative integer is required")?;
    let members: Vec<PeerMember> =
        serde_json::from_value(doc["members"].clone()).map_err(|e| format!("members: {e}"))?;
    let Some(key) = peers.and_then(|p| p.key.clone()) else {
        return Err("this replica has no peer secret to check the list with".into());
    };
    let signature = doc["signature"].as_str().unwrap_or_default();
    if !verify(key.secret(), revision, &members, signature) {
        return Err("the list is not signed with this replica's peer secret".into());
    }
    let Some(cur) = current.peers.as_ref() else {
        return Ok(None);
    };
    if cur.revision.is_none_or(|r| revision <= r) {
        return Ok(None);
    }
    let mut config = current.clone();
    config.peers = Some(PeersConfig {
        members,
        revision: Some(revision),
        ..cur.clone()
    });
    config.validate().map_err(|e| e.to_string())?;
    Ok(Some(config))
}

/// What became of a member list read from a member.
#[derive(Debug, PartialEq)]
pub enum Adoption {
    /// Applied.
    Adopted,
    /// Not newer than the list in force (or this replica has no revision to compare).
    Stale,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(members: &[&str], revision: Option<u64>) -> RouterConfig {
        RouterConfig {
            peers: Some(PeersConfig {
                self_name: Some("a".into()),
                members: members
                    .iter()
                    .map(|n| PeerMember {
                        name: (*n).into(),
                        url: format!("http://{n}:8080"),
                    })
                    .collect(),
                revision,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(c: &RouterConfig) -> Vec<&str> {
        c.peers
            .as_ref()
            .map(|p| p.members.iter().map(|m| m.name.as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn an_older_file_keeps_the_newer_list_in_force_and_a_newer_one_replaces_it() {
        let in_force = with(&["a", "b", "c"], Some(7));
        let mut older = with(&["a", "b"], Some(6));
        older.policy.kind = crate::config::PolicyKind::Random;
        assert!(keep_newer_members(&mut older, &in_force));
        assert_eq!(names(&older), ["a", "b", "c"]);
        assert_eq!(older.peers.as_ref().and_then(|p| p.revision), Some(7));
        assert_eq!(
            older.policy.kind,
            crate::config::PolicyKind::Random,
            "the rest is the file's"
        );

        for mut file in [
            with(&["a", "d"], Some(8)),
            with(&["a", "d"], Some(7)),
            with(&["a", "d"], None),
        ] {
            assert!(!keep_newer_members(&mut file, &in_force));
            assert_eq!(names(&file), ["a", "d"]);
        }
        // A list in force without a revision never overrides a file.
        let mut file = with(&["a", "d"], Some(1));
        assert!(!keep_newer_members(&mut file, &with(&["a"], None)));
        assert_eq!(names(&file), ["a", "d"]);
    }

    fn rumour(revision: u64, name: &str) -> Rumour {
        Rumour {
            revision,
            name: name.into(),
            url: None,
        }
    }

    #[test]
    fn only_a_higher_revision_is_kept_as_pending() {
        let h = Heard::default();
        h.offer(rumour(5, "b"));
        h.offer(rumour(4, "c"));
        assert_eq!(h.take(), Some(rumour(5, "b")));
        assert_eq!(h.take(), None);
        h.offer(rumour(3, "c"));
        h.offer(rumour(9, "d"));
        assert_eq!(h.take(), Some(rumour(9, "d")));
    }

    #[test]
    fn a_signature_holds_for_its_list_and_key_only() {
        let members = with(&["a", "b"], None).peers.expect("peers").members;
        let sig = sign("key", 7, &members).expect("signed");
        assert_eq!(sig.len(), 64);
        assert!(verify("key", 7, &members, &sig));
        assert!(!verify("other", 7, &members, &sig), "another key");
        assert!(!verify("key", 8, &members, &sig), "another revision");
        let mut more = members.clone();
        more.push(PeerMember {
            name: "x".into(),
            url: "http://x:1".into(),
        });
        assert!(!verify("key", 7, &more, &sig), "another member");
        let mut moved = members.clone();
        moved[1].url = "http://evil:8080".into();
        assert!(!verify("key", 7, &moved, &sig), "another URL");
        for bad in ["", "zz", &sig[..62], "0"] {
            assert!(!verify("key", 7, &members, bad), "{bad:?}");
        }
    }

    #[test]
    fn a_url_names_an_ip_only_when_its_host_is_one() {
        assert_eq!(
            host_ip("http://10.0.0.7:8080"),
            Some("10.0.0.7".parse().expect("ip"))
        );
        assert_eq!(
            host_ip("http://[fd00::7]:8080"),
            Some("fd00::7".parse().expect("ip"))
        );
        assert_eq!(host_ip("http://router-0.svc:8080"), None);
        assert_eq!(host_ip("not a url"), None);
    }

    #[test]
    fn the_revision_header_is_read_only_when_it_is_a_number() {
        let mut h = HeaderMap::new();
        assert_eq!(revision_in(&h), None);
        h.insert(REVISION.clone(), http::HeaderValue::from_static("42"));
        assert_eq!(revision_in(&h), Some(42));
        h.insert(REVISION.clone(), http::HeaderValue::from_static("-1"));
        assert_eq!(revision_in(&h), None);
    }
}
