//! Background loops: health checks of every backend (one per base URL) and polling of each
//! backend's vLLM `/metrics` for per-rank load.
//!
//! Owns the timing of those loops and how results land in [`Backend`]; reads the applied config
//! on every round, so a reload takes effect without restarting them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full, Limited};

use super::{Backend, Observation};
use crate::observe::scrape::parse_vllm_metrics;
use crate::state::RouterState;

const METRICS_BODY_LIMIT: usize = 16 * 1024 * 1024;

async fn get(
    state: &RouterState,
    url: String,
    timeout: Duration,
    limit: usize,
) -> Result<(u16, Bytes), String> {
    let api_key = state.applied.load().config.api_key.clone();
    let mut b = Request::get(&url);
    if let Some(k) = api_key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = b.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let fut = async {
        let resp = state.client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), limit)
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok((status, body.to_bytes()))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| format!("timed out after {timeout:?}"))?
}

async fn check_one(state: Arc<RouterState>, backend: Arc<Backend>) {
    let applied = state.applied.load_full();
    let h = &applied.config.health;
    let url = format!("{}{}", backend.url, h.endpoint);
    let result = get(
        &state,
        url,
        crate::config::duration(h.timeout_secs),
        64 * 1024,
    )
    .await;
    let ok = matches!(result, Ok((200..=299, _)));
    if let Some(now_healthy) = backend.record_check(ok, h.success_threshold, h.failure_threshold) {
        for t in applied.targets.of_backend(&backend) {
            t.metrics.health.set(i64::from(now_healthy));
        }
        if now_healthy {
            tracing::info!(backend = %backend.url, "backend healthy");
        } else {
            let why = match &result {
                Ok((s, _)) => format!("HTTP {s}"),
                Err(e) => e.clone(),
            };
            tracing::warn!(backend = %backend.url, reason = %why, "backend unhealthy");
        }
    }
}

/// Checks every backend now and then every `health.interval_secs` (or when woken after a reload).
pub async fn health_loop(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        let applied = state.applied.load_full();
        let checks: Vec<_> = applied
            .targets
            .backends
            .iter()
            .map(|b| tokio::spawn(check_one(state.clone(), b.clone())))
            .collect();
        for c in checks {
            let _ = c.await;
        }
        let interval = crate::config::duration(applied.config.health.interval_secs);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = state.health_wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

async fn observe_one(state: Arc<RouterState>, backend: Arc<Backend>, timeout: Duration) {
    let url = format!("{}/metrics", backend.url);
    match get(&state, url, timeout, METRICS_BODY_LIMIT).await {
        Ok((200, body)) => {
            let text = String::from_utf8_lossy(&body);
            let engines = parse_vllm_metrics(&text);
            let applied = state.applied.load_full();
            if let Some(rt) = &applied.program {
                for t in applied.targets.targets.iter() {
                    if !Arc::ptr_eq(&t.backend, &backend) {
                        continue;
                    }
                    if let Some(e) = engines.get(&t.spec.dp_rank.unwrap_or(0)) {
                        rt.observe(
                            &t.id,
                            crate::program::scheduler::Observation {
                                waiting: e.waiting,
                                running: e.running,
                                kv_usage: e.kv_usage,
                                token_capacity: e.token_capacity,
                            },
                        );
                    }
                }
            }
            backend.set_observation(Observation {
                at: Instant::now(),
                engines,
            });
        }
        Ok((status, _)) => tracing::debug!(backend = %backend.url, status, "metrics poll failed"),
        Err(e) => tracing::debug!(backend = %backend.url, error = %e, "metrics poll failed"),
    }
}

/// Polls every backend's `/metrics` each `observation.interval_secs`, when something uses it.
pub async fn observation_loop(state: Arc<RouterState>) {
    let mut stop = state.stop_rx();
    loop {
        let applied = state.applied.load_full();
        // Program scheduling's metrics_interval_seconds sets the poll rate when it is on.
        let secs = match &applied.config.program_scheduling {
            Some(ps) => ps.metrics_interval_seconds,
            None => applied.config.observation.interval_secs,
        };
        let interval = crate::config::duration(secs);
        if applied.needs_observation() {
            let polls: Vec<_> = applied
                .targets
                .backends
                .iter()
                .map(|b| tokio::spawn(observe_one(state.clone(), b.clone(), interval)))
                .collect();
            for p in polls {
                let _ = p.await;
            }
            if let Some(f) = &applied.fair {
                f.observed();
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = state.observe_wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}
