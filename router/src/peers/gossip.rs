//! Spreading a newer member list between the replicas (`peers.revision`).
//!
//! Each replica reads its member list from its own copy of the config file, and a ConfigMap
//! volume reaches each pod at its own time (up to about a minute apart). Until every copy has
//! arrived, replicas that disagree about the members disagree about which replica owns a
//! Program, and a Program moved by the change is scheduled by two replicas at once. So every
//! request between replicas, and every answer to one, carries the sender's list revision
//! ([`REVISION`]); a replica that hears of a higher revision from a member reads that member's
//! list (`GET /peers/members`) and applies it at once. Owns the header, what was heard, the
//! read, and the adoption; the file reload keeps a list adopted this way until the file catches
//! up ([`keep_newer_members`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderName;
use tokio::sync::Notify;

use crate::config::RouterConfig;
use crate::config::peers::{PeerMember, PeersConfig};
use crate::state::RouterState;

/// The member-list revision of the replica that sent a request to a peer, or answered one.
pub static REVISION: HeaderName = HeaderName::from_static("x-program-router-peer-revision");

/// How long reading a member's list may take.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The highest revision heard from a member and not yet read, shared by the successive applied
/// member lists of one router.
#[derive(Debug, Default)]
pub struct Heard {
    best: Mutex<Option<(u64, String)>>,
    wake: Notify,
}

impl Heard {
    /// Notes that `member` has list `revision`, if that is higher than anything pending.
    pub(super) fn offer(&self, revision: u64, member: &str) {
        let Ok(mut best) = self.best.lock() else {
            return;
        };
        if best.as_ref().is_none_or(|(r, _)| revision > *r) {
            *best = Some((revision, member.to_string()));
            self.wake.notify_one();
        }
    }

    fn take(&self) -> Option<(u64, String)> {
        self.best.lock().ok().and_then(|mut b| b.take())
    }
}

/// The revision a request or answer from a peer carries.
pub(super) fn revision_in(h: &HeaderMap) -> Option<u64> {
    h.get(&REVISION)?.to_str().ok()?.parse().ok()
}

/// `GET /peers/members`: this replica's member list and its revision.
pub fn members_document(applied: &crate::state::Applied) -> serde_json::Value {
    let p = applied.config.peers.as_ref();
    serde_json::json!({
        "revision": p.and_then(|p| p.revision),
        "members": p.map(|p| p.members.as_slice()).unwrap_or_default(),
    })
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

/// What became of a member list read from a member.
#[derive(Debug, PartialEq)]
pub enum Adoption {
    /// Applied.
    Adopted,
    /// Not newer than the list in force (or this replica has no revision to compare).
    Stale,
}

/// Applies the member list in `doc` (a member's `/peers/members`) when its revision is higher
/// than the one in force; this replica's own settings (`self_name`, `hand_over`, the backoff)
/// stay.
pub fn adopt(state: &RouterState, from: &str, doc: &serde_json::Value) -> Result<Adoption, String> {
    let revision = doc["revision"]
        .as_u64()
        .ok_or("revision: a non-negative integer is required")?;
    let members: Vec<PeerMember> =
        serde_json::from_value(doc["members"].clone()).map_err(|e| format!("members: {e}"))?;
    let _one_writer = state.config_writer();
    let applied = state.applied.load_full();
    let Some(cur) = applied.config.peers.as_ref() else {
        return Ok(Adoption::Stale);
    };
    if cur.revision.is_none_or(|r| revision <= r) {
        return Ok(Adoption::Stale);
    }
    let mut config = applied.config.clone();
    config.peers = Some(PeersConfig {
        members,
        revision: Some(revision),
        ..cur.clone()
    });
    config.validate().map_err(|e| e.to_string())?;
    state.apply(config).map_err(|e| e.to_string())?;
    state.set_peer_list_source(Some(from.to_string()));
    Ok(Adoption::Adopted)
}

/// While the router runs: reads the member list of a member that told of a higher revision than
/// the one in force, and applies it. Stops with the router.
pub async fn member_list_loop(state: Arc<RouterState>) {
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
        let Some((revision, from)) = heard.take() else {
            continue;
        };
        if peers.revision.is_none_or(|r| revision <= r) {
            continue;
        }
        let Some(member) = peers.members.iter().find(|m| m.name == from) else {
            continue;
        };
        let outcome = match super::get_json(
            &state.peer_client,
            peers,
            member,
            "/peers/members",
            super::exchange::platform(applied.authorization.clone()),
            READ_TIMEOUT,
        )
        .await
        .and_then(|doc| adopt(&state, &from, &doc))
        {
            Ok(Adoption::Adopted) => {
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
            Ok(Adoption::Stale) => "stale",
            Err(e) => {
                tracing::warn!(from = %from, revision, error = %e, "could not take another replica's member list");
                "error"
            }
        };
        state
            .metrics
            .peer_member_lists
            .with_label_values(&[outcome])
            .inc();
    }
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

    #[test]
    fn only_a_higher_revision_is_kept_as_pending() {
        let h = Heard::default();
        h.offer(5, "b");
        h.offer(4, "c");
        assert_eq!(h.take(), Some((5, "b".to_string())));
        assert_eq!(h.take(), None);
        h.offer(3, "c");
        h.offer(9, "d");
        assert_eq!(h.take(), Some((9, "d".to_string())));
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
