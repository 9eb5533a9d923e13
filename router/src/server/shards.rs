//! I/O shards: single-threaded runtimes that share the API listener, and the balance of client
//! connections between them.
//!
//! Every shard accepts from the same listening socket (a dup'ed descriptor each); the kernel
//! wakes whichever shard is free, which can leave one of them with most of a burst of new
//! connections (of wrk's 64 on two shards, one got 50 or 52 in two of four trials). A shard
//! that accepts a connection while it already serves two or more connections than the least
//! loaded shard hands the new connection to that shard — once per connection, never per
//! request — so the shards' connection counts stay within one of each other and a request still
//! never changes threads.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, error::SendError, unbounded_channel};

use crate::state::RouterState;

/// Live client connections per shard, and the way to hand a connection to each shard.
struct Balance {
    live: Vec<AtomicUsize>,
    to: Vec<UnboundedSender<std::net::TcpStream>>,
}

/// One shard's end of the balance: its index and the connections handed to it.
pub(super) struct Handoff {
    me: usize,
    balance: Arc<Balance>,
    rx: UnboundedReceiver<std::net::TcpStream>,
}

/// Counts a connection against its shard until the connection ends.
pub(super) struct Live {
    balance: Arc<Balance>,
    shard: usize,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.balance.live[self.shard].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Handoff {
    /// Places a connection this shard accepted: `Some` to serve it here, `None` when another
    /// shard with at least two fewer connections took it.
    pub(super) fn place(&self, stream: TcpStream) -> Option<(TcpStream, Live)> {
        let b = &self.balance;
        let mine = b.live[self.me].load(Ordering::Relaxed);
        let least = b
            .live
            .iter()
            .enumerate()
            .map(|(i, l)| (i, l.load(Ordering::Relaxed)))
            .min_by_key(|(_, n)| *n);
        let stream = match least {
            Some((j, n)) if j != self.me && n + 2 <= mine => {
                let std = match stream.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot move a connection between I/O threads");
                        return None;
                    }
                };
                b.live[j].fetch_add(1, Ordering::Relaxed);
                match b.to[j].send(std) {
                    Ok(()) => return None,
                    // That shard is draining: serve the connection here after all.
                    Err(SendError(std)) => {
                        b.live[j].fetch_sub(1, Ordering::Relaxed);
                        match TcpStream::from_std(std) {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot serve a connection");
                                return None;
                            }
                        }
                    }
                }
            }
            _ => stream,
        };
        b.live[self.me].fetch_add(1, Ordering::Relaxed);
        Some((stream, self.live()))
    }

    /// The next connection another shard handed to this one (already counted here).
    pub(super) async fn next(&mut self) -> Option<(TcpStream, Live)> {
        loop {
            // The senders live as long as the balance this handoff holds, so `recv` never ends.
            let std = self.rx.recv().await?;
            match TcpStream::from_std(std) {
                Ok(s) => return Some((s, self.live())),
                Err(e) => {
                    self.balance.live[self.me].fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "cannot serve a handed-over connection");
                }
            }
        }
    }

    /// Stops taking connections from other shards (they serve their own from now on) and
    /// returns those handed over but not yet picked up — including one whose send was under way
    /// as the channel closed, which `recv` waits for and `try_recv` can miss.
    pub(super) async fn close(&mut self) -> Vec<(TcpStream, Live)> {
        self.rx.close();
        let mut left = Vec::new();
        while let Some(std) = self.rx.recv().await {
            match TcpStream::from_std(std) {
                Ok(s) => left.push((s, self.live())),
                Err(_) => {
                    self.balance.live[self.me].fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        left
    }

    fn live(&self) -> Live {
        Live {
            balance: self.balance.clone(),
            shard: self.me,
        }
    }
}

/// One handoff per shard, sharing one balance.
fn handoffs(n: usize) -> Vec<Handoff> {
    let (to, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| unbounded_channel()).unzip();
    let balance = Arc::new(Balance {
        live: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        to,
    });
    rxs.into_iter()
        .enumerate()
        .map(|(me, rx)| Handoff {
            me,
            balance: balance.clone(),
            rx,
        })
        .collect()
}

/// Serves `listener` on `n` I/O shards until `shutdown`, then stops them and waits until every
/// one has drained.
pub(super) async fn serve(
    state: Arc<RouterState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    n: usize,
) {
    let shared = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot share the listener between I/O threads");
            return;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Every shard's runtime runs until all have drained: connections of the shared peer client
    // are driven by the runtime that opened them, and a request still in flight on another
    // shard may be using one.
    let (finished_tx, finished_rx) = tokio::sync::watch::channel(false);
    let mut shards = Vec::new();
    for (i, handoff) in handoffs(n).into_iter().enumerate() {
        match spawn_shard(
            i,
            &state,
            &shared,
            handoff,
            stop_rx.clone(),
            finished_rx.clone(),
        ) {
            Ok(done) => shards.push(done),
            Err(e) => tracing::error!(shard = i, error = %e, "cannot start an I/O thread"),
        }
    }
    if shards.is_empty() {
        // Serve on this runtime rather than not at all.
        match TcpListener::from_std(shared) {
            Ok(l) => return super::accept_loop(state, l, None, shutdown, super::Plane::Api).await,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve the API listener");
                return;
            }
        }
    }
    shutdown.await;
    let _ = stop_tx.send(true);
    drop(shared);
    for done in shards {
        let _ = done.await;
    }
    let _ = finished_tx.send(true);
}

/// Starts I/O shard `i` on its own thread; the receiver resolves when it has drained. Its
/// runtime (and every connection task on it) then runs on until `finished`.
fn spawn_shard(
    i: usize,
    state: &Arc<RouterState>,
    shared: &std::net::TcpListener,
    handoff: Handoff,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut finished: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let listener = shared.try_clone()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let state = state.clone();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("router-io-{i}"))
        .spawn(move || {
            crate::workers::idle::enter_shard(i);
            rt.block_on(async move {
                // Both end with the runtime, after the drain.
                tokio::spawn(refresh_on_reload(state.clone()));
                tokio::spawn(crate::net::timer_floor::keep_a_timer_pending());
                match TcpListener::from_std(listener) {
                    Ok(l) => {
                        let stopped = async move {
                            let _ = stop.wait_for(|s| *s).await;
                        };
                        super::accept_loop(state, l, Some(handoff), stopped, super::Plane::Api)
                            .await;
                    }
                    Err(e) => {
                        tracing::error!(shard = i, error = %e, "cannot serve the API listener")
                    }
                }
                let _ = done_tx.send(());
                let _ = finished.wait_for(|f| *f).await;
            });
        })?;
    Ok(done_rx)
}

/// Points this thread's configuration handle at each configuration applied, so that an idle
/// shard does not keep a replaced one alive (`crate::applied::here`).
async fn refresh_on_reload(state: Arc<RouterState>) {
    let mut reloads = state.reloads();
    while reloads.changed().await.is_ok() {
        crate::applied::refresh_here(&state.applied);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(h: &Handoff) -> Vec<usize> {
        h.balance
            .live
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .collect()
    }

    #[tokio::test]
    async fn a_shard_two_ahead_hands_new_connections_to_the_least_loaded() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut clients = Vec::new();
        let mut accept = async || {
            clients.push(std::net::TcpStream::connect(addr).expect("connect"));
            listener.accept().await.expect("accept").0
        };
        let mut hs = handoffs(2);
        let mut one = hs.pop().expect("shard 1");
        let zero = hs.pop().expect("shard 0");
        // Shard 0 keeps its first two connections: one ahead is within balance.
        let a = zero.place(accept().await).expect("kept");
        let b = zero.place(accept().await).expect("kept");
        assert_eq!(counts(&zero), [2, 0]);
        // Two ahead: the third goes to shard 1, counted there at once.
        assert!(zero.place(accept().await).is_none(), "handed over");
        assert_eq!(counts(&zero), [2, 1]);
        let (_c, live_c) = one.next().await.expect("shard 1 receives it");
        assert_eq!(counts(&one), [2, 1]);
        // A connection that ends frees its place.
        drop(a);
        assert_eq!(counts(&zero), [1, 1]);
        let d = zero.place(accept().await).expect("kept");
        assert_eq!(counts(&zero), [2, 1]);
        drop(live_c);
        // A connection handed over but not picked up is served by the shard that closes.
        assert!(zero.place(accept().await).is_none(), "handed over");
        let left = one.close().await;
        assert_eq!(left.len(), 1, "the handed-over connection is returned");
        assert_eq!(counts(&zero), [2, 1]);
        drop(left);
        // A draining shard takes nothing more: the accepting shard serves it itself.
        let e = zero
            .place(accept().await)
            .expect("served here when shard 1 is closed");
        assert_eq!(counts(&zero), [3, 0]);
        drop((b, d, e));
        assert_eq!(counts(&zero), [0, 0]);
    }
}
