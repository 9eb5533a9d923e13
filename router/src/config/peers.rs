//! `peers`: the router replicas that share Program scheduling (extension).
//!
//! Each replica's Program scheduler sees only the requests that reach it. With `peers`, every
//! replica agrees, by rendezvous hashing of a Program's root id over the member names, on one
//! owner per Program tree, and a replica forwards a Program request it does not own to that
//! owner, so each Program is scheduled by one view (its binding, queue, TTL and KV ledger)
//! whichever replica the load balancer picked. The operator renders `members` from its Ready
//! router pods; each pod names itself with `--peer-name` (its pod name).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// More members than this is a typo, not a router fleet (each member is scored per request).
pub const MAX_MEMBERS: usize = 256;

/// Router replicas that forward Program requests to one owner replica each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PeersConfig {
    /// This replica's name in `members` (`--peer-name`, `PROGRAM_ROUTER_PEER_NAME`). A replica
    /// that is not a member owns no Program and forwards every Program request to a member.
    pub self_name: Option<String>,
    /// Every replica, this one included, by a name all replicas agree on and the base URL of
    /// its API listener.
    pub members: Vec<PeerMember>,
    /// A member that refused a connection is skipped this long (its Programs go to the next
    /// owner in every replica's order); the request that found it down is served by the next
    /// owner too.
    pub unreachable_backoff_secs: f64,
    /// Hand Programs over when their owner changes: in the paused retention after the member
    /// list changed (or this replica started), ask the other members for a Program this
    /// replica does not know before binding it afresh, and give every Program held to its next
    /// owner when shutting down, so that it keeps the rank that holds its KV. Off: a moved
    /// Program is bound afresh by its new owner.
    pub hand_over: bool,
    /// Which member list this is: a later list has a higher revision (the operator sets one
    /// whenever the list changes). Replicas tell each other their revision on every request
    /// between them, and one that hears of a higher revision reads that member's list at once
    /// instead of waiting for its own copy of this file (a ConfigMap volume reaches each pod up
    /// to a minute apart); a file with a lower revision than the list in force does not replace
    /// its members. Absent: lists are not shared.
    pub revision: Option<u64>,
}

/// One router replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerMember {
    /// The replica's name (the operator uses the pod name).
    pub name: String,
    /// Base URL of its API listener, e.g. `http://10.0.0.7:8080`.
    pub url: String,
}

impl Default for PeersConfig {
    fn default() -> Self {
        PeersConfig {
            self_name: None,
            members: Vec::new(),
            unreachable_backoff_secs: 5.0,
            hand_over: true,
            revision: None,
        }
    }
}

impl PeersConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.members.len() > MAX_MEMBERS {
            return Err(ConfigError::new(
                "peers.members",
                format!("at most {MAX_MEMBERS} members (got {})", self.members.len()),
            ));
        }
        // Names travel in headers between the replicas.
        let name_ok = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic());
        if self.self_name.as_deref().is_some_and(|n| !name_ok(n)) {
            return Err(ConfigError::new(
                "peers.self_name",
                "must be non-empty printable ASCII without spaces (or null)",
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, m) in self.members.iter().enumerate() {
            if !name_ok(&m.name) {
                return Err(ConfigError::new(
                    format!("peers.members[{i}].name"),
                    "must be non-empty printable ASCII without spaces",
                ));
            }
            if !names.insert(m.name.as_str()) {
                return Err(ConfigError::new(
                    format!("peers.members[{i}].name"),
                    format!("{:?} is listed twice", m.name),
                ));
            }
            let uri: http::Uri = m.url.parse().map_err(|e| {
                ConfigError::new(format!("peers.members[{i}].url"), format!("not a URL: {e}"))
            })?;
            if uri.scheme_str() != Some("http")
                || uri.authority().is_none()
                || !matches!(uri.path(), "" | "/")
                || uri.query().is_some()
            {
                return Err(ConfigError::new(
                    format!("peers.members[{i}].url"),
                    format!(
                        "must be an http:// base URL with a host and no path (got {:?})",
                        m.url
                    ),
                ));
            }
        }
        if !self.unreachable_backoff_secs.is_finite() || self.unreachable_backoff_secs < 0.0 {
            return Err(ConfigError::new(
                "peers.unreachable_backoff_secs",
                "must be >= 0",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, url: &str) -> PeerMember {
        PeerMember {
            name: name.into(),
            url: url.into(),
        }
    }

    #[test]
    fn names_the_field_of_every_mistake() {
        let ok = PeersConfig {
            self_name: Some("a".into()),
            members: vec![
                member("a", "http://10.0.0.1:8080"),
                member("b", "http://[::1]:8080/"),
            ],
            ..Default::default()
        };
        ok.validate().expect("valid");
        let cases: Vec<(PeersConfig, &str)> = vec![
            (
                PeersConfig {
                    members: vec![member("a", "http://x:1"), member("a", "http://y:1")],
                    ..Default::default()
                },
                "peers.members[1].name",
            ),
            (
                PeersConfig {
                    members: vec![member(" ", "http://x:1")],
                    ..Default::default()
                },
                "peers.members[0].name",
            ),
            (
                PeersConfig {
                    members: vec![member("r\u{e9}", "http://x:1")],
                    ..Default::default()
                },
                "peers.members[0].name",
            ),
            (
                PeersConfig {
                    members: vec![member("a", "https://x:1")],
                    ..Default::default()
                },
                "peers.members[0].url",
            ),
            (
                PeersConfig {
                    members: vec![member("a", "http://x:1/v1")],
                    ..Default::default()
                },
                "peers.members[0].url",
            ),
            (
                PeersConfig {
                    members: vec![member("a", "not a url")],
                    ..Default::default()
                },
                "peers.members[0].url",
            ),
            (
                PeersConfig {
                    self_name: Some(String::new()),
                    ..Default::default()
                },
                "peers.self_name",
            ),
            (
                PeersConfig {
                    unreachable_backoff_secs: -1.0,
                    ..Default::default()
                },
                "peers.unreachable_backoff_secs",
            ),
            (
                PeersConfig {
                    members: (0..=MAX_MEMBERS)
                        .map(|i| member(&format!("r{i}"), "http://x:1"))
                        .collect(),
                    ..Default::default()
                },
                "peers.members",
            ),
        ];
        for (c, field) in cases {
            assert_eq!(c.validate().expect_err(field).field, field);
        }
    }
}
