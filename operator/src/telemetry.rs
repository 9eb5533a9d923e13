//! The operator's own Prometheus metrics and its probe/metrics listener (`/healthz`, `/readyz`,
//! `/metrics`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;

/// Every series the operator exports.
pub struct Metrics {
    pub registry: Registry,
    /// Reconciles by result (`ok`, `error`).
    pub reconciles: IntCounterVec,
    /// Reconcile duration by result.
    pub duration: HistogramVec,
    /// Failed reconciles by reason.
    pub errors: IntCounterVec,
    /// API writes by kind and verb (`apply`, `status`, `event`): zero at steady state.
    pub writes: IntCounterVec,
    /// 1 while this replica holds the leader lease (or runs without election).
    pub leader: IntGauge,
    /// Set once the controller runs; `/readyz` answers 200 from then on.
    pub ready: AtomicBool,
}

impl Metrics {
    pub fn new() -> Result<Arc<Self>, prometheus::Error> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new("program_operator_reconciles_total", "Reconciles by result"),
            &["result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "program_operator_reconcile_duration_seconds",
                "Reconcile duration",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            &["result"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "program_operator_reconcile_errors_total",
                "Failed reconciles by reason",
            ),
            &["reason"],
        )?;
        let writes = IntCounterVec::new(
            Opts::new(
                "program_operator_api_writes_total",
                "Kubernetes API writes by kind and verb",
            ),
            &["kind", "verb"],
        )?;
        let leader = IntGauge::new(
            "program_operator_leader",
            "1 while this replica is the active controller",
        )?;
        // Every reason from the start, so rates and alerts see 0 rather than no series.
        for reason in [
            "api_status",
            "api_transport",
            "serialization",
            "no_namespace",
        ] {
            errors.with_label_values(&[reason]);
        }
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(writes.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        Ok(Arc::new(Metrics {
            registry,
            reconciles,
            duration,
            errors,
            writes,
            leader,
            ready: AtomicBool::new(false),
        }))
    }

    fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn route(m: &Metrics, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/healthz" => reply(StatusCode::OK, "text/plain", b"ok".to_vec()),
        "/readyz" if m.ready.load(Ordering::Relaxed) => {
            reply(StatusCode::OK, "text/plain", b"ok".to_vec())
        }
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            b"starting".to_vec(),
        ),
        "/metrics" => reply(StatusCode::OK, "text/plain; version=0.0.4", m.render()),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", b"not found".to_vec()),
    }
}

/// Serves probes and metrics on `listener` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "probe listener accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let m = metrics.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let m = m.clone();
                async move { Ok::<_, Infallible>(route(&m, &req)) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Binds the probe listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
