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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use rustc_hash::FxHashMap;

use super::exchange::others;
use super::{PeerClient, Peers, post_json};
use crate::program::scheduler::HandedOver;

/// How long a request waits for the other members' answers before it is scheduled as a new
/// Program (they are in the same cluster: a member that has not answered by then is busy or
/// gone).
pub const CLAIM_TIMEOUT: Duration = Duration::from_millis(250);

/// How long a shutting-down replica waits for each member to take its Programs.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// The claims in progress, by (model, Program id). Concurrent first requests of one moved
/// Program take turns: the first asks the other members and adopts what it gets, the others
/// then find the Program known. Without this, a request whose ask came back empty (the holder
/// had already given the Program to the first ask) could bind the Program afresh before the
/// first adopted it, and the adoption of a Program already bound is refused: it would lose the
/// rank that holds its KV.
#[derive(Default)]
pub struct Claims(Mutex<FxHashMap<(String, String), Arc<Turns>>>);

/// Held by the request whose turn it is to claim one Program.
type Turns = tokio::sync::Mutex<()>;

/// This request's turn to claim a Program; the next waiting request's turn comes when it drops.
pub struct ClaimTurn<'a> {
    claims: &'a Claims,
    key: (String, String),
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Claims {
    /// Waits for the claims of Program `program_id` of `model` in progress, then gives this
    /// request its turn.
    pub async fn turn(&self, model: &str, program_id: &str) -> ClaimTurn<'_> {
        let key = (model.to_string(), program_id.to_string());
        let lock = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(map.entry(key.clone()).or_default())
        };
        // Declared before the wait: a request that gives up waiting drops the wait (and its
        // handle on the lock) first, then this, which removes the entry if nobody else holds it.
        let mut turn = ClaimTurn {
            claims: self,
            key,
            turn: None,
        };
        let wait = lock.lock_owned();
        turn.turn = Some(wait.await);
        turn
    }

    /// Programs with a claim in progress or waiting (for tests and diagnostics).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for ClaimTurn<'_> {
    fn drop(&mut self) {
        drop(self.turn.take());
        let mut map = self.claims.0.lock().unwrap_or_else(|e| e.into_inner());
        // Only the map's own handle left: nobody holds or waits for a turn, the entry goes.
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.key);
        }
    }
}

/// Asks every other member (not skipped as down) for Program `program_id` of `model`; a member
/// that held it idle gives it up. Reported twice (two replicas served it while their member
/// lists disagreed), it comes back as the replica that saw it last has it.
pub async fn claim(
    client: &PeerClient,
    peers: &Peers,
    model: &str,
    program_id: &str,
) -> Option<HandedOver> {
    let now = Instant::now();
    let body = serde_json::json!({ "model": model, "program_id": program_id });
    let asks = others(peers).filter(|m| !m.down(now)).map(|m| {
        let headers = HeaderMap::new();
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
pub async fn push(client: &PeerClient, peers: &Peers, programs: Vec<HandedOver>) -> usize {
    let mut by_member: FxHashMap<usize, Vec<HandedOver>> = FxHashMap::default();
    for h in programs {
        if let Some(i) = peers.successor(&h.root, Instant::now()) {
            by_member.entry(i).or_default().push(h);
        }
    }
    let sends = by_member.into_iter().map(|(i, list)| {
        let m = &peers.members[i];
        let headers = HeaderMap::new();
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

#[cfg(test)]
mod tests {
    use super::Claims;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn claims_of_one_program_take_turns_and_leave_nothing_behind() {
        let claims = Arc::new(Claims::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (claims, inside, most) = (claims.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    // Half of them claim one Program, the other half four others.
                    let p = if i % 2 == 0 {
                        "p".to_string()
                    } else {
                        format!("q{i}")
                    };
                    let _turn = claims.turn("m", &p).await;
                    if p == "p" {
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "one claim of p at a time");
        assert!(claims.is_empty(), "every entry removed with its last turn");
        // A waiter that gives up (its client left) does not leave its entry either.
        let first = claims.turn("m", "p").await;
        let waiting =
            tokio::time::timeout(std::time::Duration::from_millis(10), claims.turn("m", "p")).await;
        assert!(waiting.is_err(), "waits while the first claims");
        drop(first);
        assert!(claims.is_empty());
        // Nor one whose turn had come but who left before taking it.
        let first = claims.turn("m", "p").await;
        let waiter = {
            let claims = claims.clone();
            tokio::spawn(async move {
                let _turn = claims.turn("m", "p").await;
            })
        };
        tokio::task::yield_now().await; // the waiter now waits
        drop(first);
        waiter.abort();
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
        assert!(claims.is_empty());
    }
}
