//! Starting and stopping a router: listeners, background loops, config watch, drain.
//!
//! Owns the process lifecycle so that the binary and the tests start routers the same way.

pub mod loops;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::RouterConfig;
use crate::config::flags::Flags;
use crate::config::watch::{FileEvent, watch};
use crate::state::RouterState;

/// A bound, not yet serving router.
pub struct Bound {
    pub state: Arc<RouterState>,
    pub api: TcpListener,
    pub api_addr: SocketAddr,
    pub metrics: Option<(TcpListener, SocketAddr)>,
    /// The peer listener (router ↔ router), with `peer_port`.
    pub peer: Option<(TcpListener, SocketAddr)>,
    initial_file: Option<Vec<u8>>,
}

/// Binds one listener; the error names which one and its address (`port` 30000 in use, say).
async fn listen(what: &str, host: &str, port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind((host, port)).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("{what} listener on {host}:{port}: {e}"))
    })
}

/// Binds an optional listener: `None` without a port.
async fn listen_opt(
    what: &str,
    host: &str,
    port: Option<u16>,
) -> std::io::Result<Option<(TcpListener, SocketAddr)>> {
    let Some(port) = port else {
        return Ok(None);
    };
    let l = listen(what, host, port).await?;
    let a = l.local_addr()?;
    Ok(Some((l, a)))
}

/// Binds the listeners for `config`.
pub async fn bind(config: RouterConfig, flags: Flags) -> std::io::Result<Bound> {
    let initial_file = match &flags.config {
        Some(p) => Some(std::fs::read(p).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot read {}: {e}", p.display()))
        })?),
        None => None,
    };
    // Before any backend's connection pool exists: one idle stack per I/O thread.
    crate::workers::idle::size_for_shards(config.resolved_io_threads());
    let api = listen("API", &config.host, config.port).await?;
    let api_addr = api.local_addr()?;
    let metrics = listen_opt("metrics", &config.prometheus_host, config.prometheus_port).await?;
    let peer = listen_opt("peer", &config.peer_host, config.peer_port).await?;
    let state = RouterState::new(config, flags).map_err(std::io::Error::other)?;
    if let Some(bytes) = &initial_file {
        state.set_file_hash(bytes);
    }
    Ok(Bound {
        state,
        api,
        api_addr,
        metrics,
        peer,
        initial_file,
    })
}

impl Bound {
    /// Serves until `shutdown` resolves, then drains in-flight requests and stops everything.
    /// An internal failure ([`RouterState::fail`]) shuts down the same way and is returned, so
    /// that the process exits non-zero and is restarted.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), String> {
        let state = self.state;
        tokio::spawn(loops::health(state.clone()));
        if let Some(rt) = state.applied.load().program.clone() {
            tokio::spawn(rt.tick_loop(state.stop_rx()));
        }
        if let Some(rt) = state.applied.load().fair.clone() {
            tokio::spawn(rt.dispatch_loop(state.stop_rx()));
        }
        tokio::spawn(loops::observation(state.clone()));
        tokio::spawn(loops::key_dir(state.clone()));
        tokio::spawn(loops::usage(state.clone()));
        tokio::spawn(loops::members(state.clone()));
        if let Some(path) = state.flags.config.clone() {
            let st = state.clone();
            let mut stop = state.stop_rx();
            tokio::spawn(watch(
                path,
                self.initial_file,
                Duration::from_millis(500),
                Duration::from_millis(100),
                move |ev| match ev {
                    FileEvent::Changed(bytes) => {
                        let _ = st.reload(&bytes);
                    }
                    FileEvent::Unreadable(msg) => st.reload_unreadable(msg),
                },
                async move {
                    let _ = stop.changed().await;
                },
            ));
        }
        if let Some((listener, _)) = self.metrics {
            let mut stop = state.stop_rx();
            tokio::spawn(crate::server::serve_metrics(
                state.clone(),
                listener,
                async move {
                    let _ = stop.changed().await;
                },
            ));
        }
        let peer_plane = self
            .peer
            .map(|(listener, _)| tokio::spawn(crate::server::serve_peers(state.clone(), listener)));
        let io_threads = state.applied.load().config.resolved_io_threads();
        let st = state.clone();
        let shutdown = async move {
            tokio::select! {
                _ = shutdown => {}
                _ = st.failed() => {}
            }
        };
        crate::server::serve_api(state.clone(), self.api, shutdown, io_threads).await;
        // The peer listener stopped accepting with the API one and drains to the same deadline.
        if let Some(p) = peer_plane {
            let _ = p.await;
        }
        state.stop();
        match state.failure() {
            Some(what) => Err(what.to_string()),
            None => Ok(()),
        }
    }
}

/// Resolves on SIGTERM (what Kubernetes sends a pod it stops) or Ctrl-C: the one shutdown
/// signal of the router and the operator binaries.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutdown signal received");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ProgramSchedulingConfig, WorkerConfig};

    #[tokio::test]
    async fn a_panic_in_the_scheduler_fails_its_request_and_stops_the_router() {
        let sim = vllm_sim::server::spawn_with_flags(&["--instant"], Duration::from_secs(5))
            .await
            .expect("simulator");
        let config = RouterConfig {
            port: 0,
            prometheus_port: None,
            workers: vec![WorkerConfig {
                url: sim.base(),
                dp_rank: None,
            }],
            program_scheduling: Some(ProgramSchedulingConfig::default()),
            ..Default::default()
        };
        let bound = bind(config, Flags::default()).await.expect("bind");
        let (addr, state) = (bound.api_addr, bound.state.clone());
        let served = tokio::spawn(bound.serve(std::future::pending()));
        let rt = state
            .applied
            .load()
            .program
            .clone()
            .expect("Program scheduling");
        rt.poison();
        let body = serde_json::json!({"model": "sim-model", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}],
            "vllm_xargs": {"agentic_context": {"program_id": "p"}}})
        .to_string();
        let c = testkit::client();
        let resp = testkit::post(&c, &format!("http://{addr}/v1/chat/completions"), &body).await;
        assert_eq!(resp.status, 500, "{}", resp.text());
        assert_eq!(resp.json()["error"]["code"], "internal_error");
        assert!(!crate::server::status::ready(&state), "not ready any more");
        let ended = tokio::time::timeout(Duration::from_secs(20), served)
            .await
            .expect("the router stops by itself")
            .expect("task");
        let why = ended.expect_err("stopped on the failure");
        assert!(why.contains("half-updated"), "{why}");
    }
}
