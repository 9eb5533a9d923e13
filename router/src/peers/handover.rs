//! Handing Programs between router replicas when their owner changes (`peers`, extension).
//!
//! Owns the two moves that keep a Program on the rank that holds its KV while the member list
//! changes. A replica about to schedule a Program it does not know — in the window after its
//! member list changed or it started — asks the other members for it (`POST /peers/hand-over`);
//! whoever held it idle gives it up and names its rank. Each Program of a tree is asked for when
//! its own first request arrives, so a lookup is one hash probe on the holder.
//! A replica that shuts down gives every Program it held to the member that owns it next
//! (`POST /peers/adopt`) before it stops accepting. Without either, the new owner binds the
//! Program afresh — on another rank, most likely — and its next turn re-prefills its context.

use std::time::{Duration, Instant};

use http::HeaderValue;
use rustc_hash::FxHashMap;

use super::exchange::{others, platform};
use super::{PeerClient, Peers, post_json};
use crate::program::scheduler::HandedOver;

/// How long a request waits for the other members' answers before it is scheduled as a new
/// Program (they are in the same cluster: a member that has not answered by then is busy or
/// gone).
pub const CLAIM_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a shutting-down replica waits for each member to take its Programs.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Asks every other member (not skipped as down) for Program `program_id` of `model`; a member
/// that held it idle gives it up. Reported twice (two replicas served it while their member
/// lists disagreed), it comes back as the replica that saw it last has it.
pub async fn claim(
    client: &PeerClient,
    peers: &Peers,
    model: &str,
    program_id: &str,
    authorization: Option<HeaderValue>,
) -> Option<HandedOver> {
    let now = Instant::now();
    let body = serde_json::json!({ "model": model, "program_id": program_id });
    let asks = others(peers).filter(|m| !m.down(now)).map(|m| {
        let headers = platform(authorization.clone());
        let body = &body;
        async move {
            let got = post_json(
                client,
                peers,
                m,
                "/peers/hand-over",
                headers,
                body,
                CLAIM_TIMEOUT,
            )
            .await;
            (m.name.as_str(), got)
        }
    });
    let mut best: Option<HandedOver> = None;
    for (member, got) in futures_util::future::join_all(asks).await {
        let program = got.and_then(|v| {
            serde_json::from_value::<Option<HandedOver>>(v["program"].clone())
                .map_err(|e| format!("unexpected answer: {e}"))
        });
        match program {
            Ok(Some(h))
                if best
                    .as_ref()
                    .is_none_or(|b| h.idle_seconds < b.idle_seconds) =>
            {
                best = Some(h)
            }
            Ok(_) => {}
            Err(why) => {
                tracing::debug!(member, error = %why, "could not ask a peer for a Program")
            }
        }
    }
    best
}

/// Gives `programs` (every Program this replica held) to the members that own their trees once
/// this replica is gone; returns how many they took.
pub async fn push(
    client: &PeerClient,
    peers: &Peers,
    programs: Vec<HandedOver>,
    authorization: Option<HeaderValue>,
) -> usize {
    let mut by_member: FxHashMap<usize, Vec<HandedOver>> = FxHashMap::default();
    for h in programs {
        if let Some(i) = peers.successor(&h.root, Instant::now()) {
            by_member.entry(i).or_default().push(h);
        }
    }
    let sends = by_member.into_iter().map(|(i, list)| {
        let m = &peers.members[i];
        let headers = platform(authorization.clone());
        async move {
            let body = serde_json::json!({ "programs": list });
            let got = post_json(
                client,
                peers,
                m,
                "/peers/adopt",
                headers,
                &body,
                PUSH_TIMEOUT,
            )
            .await;
            match got {
                Ok(v) => v["adopted"].as_u64().unwrap_or(0) as usize,
                Err(why) => {
                    tracing::warn!(member = %m.name, error = %why,
                        "could not hand Programs to the replica that owns them next");
                    0
                }
            }
        }
    });
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .sum()
}
