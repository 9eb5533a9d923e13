//! Probes of one backend: its health endpoint and its vLLM `/metrics` (per-rank load).
//!
//! Owns how a probe's result lands in [`Backend`]; the loops that run the probes, and the
//! publishing of observations to the features that read them, are in `crate::run::loops`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full, Limited};

use super::{Backend, Scrape, TargetSet};
use crate::config::HealthConfig;
use crate::net::client::UpstreamClient;
use crate::observe::scrape::parse_vllm_metrics;

/// Largest `/metrics` body read from a backend.
const METRICS_BODY_LIMIT: usize = 16 * 1024 * 1024;
/// Largest health answer read.
const HEALTH_BODY_LIMIT: usize = 64 * 1024;

/// GETs `url` with the workers' key, reading at most `limit` bytes within `timeout`.
pub async fn get(
    client: &UpstreamClient,
    api_key: Option<&str>,
    url: String,
    timeout: Duration,
    limit: usize,
) -> Result<(u16, Bytes), String> {
    let mut b = Request::get(&url);
    if let Some(k) = api_key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = b.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let fut = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
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

/// Checks `backend`'s health once and records it (and the health gauge of its targets).
pub async fn check(
    client: &UpstreamClient,
    api_key: Option<&str>,
    h: &HealthConfig,
    targets: &TargetSet,
    backend: &Arc<Backend>,
) {
    let url = format!("{}{}", backend.url, h.endpoint);
    let timeout = crate::config::duration(h.timeout_secs);
    let result = get(client, api_key, url, timeout, HEALTH_BODY_LIMIT).await;
    let ok = matches!(result, Ok((200..=299, _)));
    if let Some(now_healthy) = backend.record_check(ok, h.success_threshold, h.failure_threshold) {
        for t in targets.of_backend(backend) {
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

/// Reads `backend`'s `/metrics` once; stores and returns the observation (`None`: the poll
/// failed, logged at debug).
pub async fn observe(
    client: &UpstreamClient,
    api_key: Option<&str>,
    backend: &Arc<Backend>,
    timeout: Duration,
) -> Option<Scrape> {
    let url = format!("{}/metrics", backend.url);
    match get(client, api_key, url, timeout, METRICS_BODY_LIMIT).await {
        Ok((200, body)) => {
            let text = String::from_utf8_lossy(&body);
            let obs = Scrape {
                at: Instant::now(),
                engines: parse_vllm_metrics(&text),
            };
            backend.set_observation(obs.clone());
            Some(obs)
        }
        Ok((status, _)) => {
            tracing::debug!(backend = %backend.url, status, "metrics poll failed");
            None
        }
        Err(e) => {
            tracing::debug!(backend = %backend.url, error = %e, "metrics poll failed");
            None
        }
    }
}
