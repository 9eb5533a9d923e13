//! Harness: in-process vllm-sim backends and program-router instances on loopback ports.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use program_router::config::RouterConfig;
use program_router::config::cli::Flags;
use program_router::state::RouterState;
use tokio::sync::oneshot;

pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    pub done: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
    pub async fn stopped(&mut self) {
        self.stop();
        if let Some(d) = self.done.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), d).await;
        }
    }
}

pub async fn sim(args: &[&str]) -> Server {
    let mut v = vec!["vllm-sim", "--port", "0"];
    v.extend_from_slice(args);
    let cfg = vllm_sim::config::SimArgs::try_parse_from(v)
        .expect("args")
        .validate()
        .expect("valid");
    let (listener, addr) = vllm_sim::server::bind(&cfg).await.expect("bind");
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        let stop = async {
            let _ = rx.await;
        };
        let _ = vllm_sim::server::serve(cfg, listener, stop, Duration::from_secs(5)).await;
    });
    Server {
        addr,
        stop: Some(tx),
        done: Some(done),
    }
}

pub struct Router {
    pub server: Server,
    pub metrics_addr: SocketAddr,
    pub state: Arc<RouterState>,
}

impl Router {
    pub fn url(&self, path: &str) -> String {
        self.server.url(path)
    }
}

/// Starts a router on free ports with `config` (host/ports overridden) and `flags`.
pub async fn router_with(mut config: RouterConfig, flags: Flags) -> Router {
    config.host = "127.0.0.1".into();
    config.port = 0;
    config.prometheus_host = "127.0.0.1".into();
    config.prometheus_port = Some(0);
    config.health.interval_secs = 0.2;
    config.validate().expect("valid test config");
    let bound = program_router::run::bind(config, flags)
        .await
        .expect("bind");
    let addr = bound.api_addr;
    let metrics_addr = bound.metrics.as_ref().expect("metrics").1;
    let state = bound.state.clone();
    let (tx, rx) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        bound
            .serve(async {
                let _ = rx.await;
            })
            .await
    });
    let r = Router {
        server: Server {
            addr,
            stop: Some(tx),
            done: Some(done),
        },
        metrics_addr,
        state,
    };
    wait_ready(&r).await;
    r
}

pub async fn router(config: RouterConfig) -> Router {
    router_with(config, Flags::default()).await
}

async fn wait_ready(r: &Router) {
    let c = client();
    for _ in 0..100 {
        if r.state.applied.load().targets.targets.is_empty() {
            return;
        }
        if get(&c, &r.url("/readiness")).await.status == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("router did not become ready");
}

pub fn workers(urls: &[String], dp: u32) -> RouterConfig {
    RouterConfig {
        workers: urls
            .iter()
            .map(|u| program_router::config::WorkerConfig {
                url: u.clone(),
                dp_rank: None,
            })
            .collect(),
        intra_node_data_parallel_size: dp,
        ..Default::default()
    }
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub async fn send(
    c: &HttpClient,
    method: &str,
    url: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c
        .request(
            b.body(Full::new(Bytes::from(body.to_string())))
                .expect("req"),
        )
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn post(c: &HttpClient, url: &str, body: &str) -> Reply {
    send(c, "POST", url, body, &[]).await
}

pub async fn get(c: &HttpClient, url: &str) -> Reply {
    send(c, "GET", url, "", &[]).await
}

pub fn chat(content: &str, max_tokens: u32) -> String {
    serde_json::json!({"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
        .to_string()
}

/// Sum of a metric over the series matching `labels`, parsed with a Prometheus text parser.
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};
    let exp = parse_prometheus(text).unwrap_or_else(|e| panic!("exposition must parse: {e:?}"));
    let Some(fam) = exp.families.get(name) else {
        return 0.0;
    };
    let mut total = 0.0;
    for s in fam.iter_samples() {
        let set = s.get_labelset().expect("labels");
        if !labels
            .iter()
            .all(|(k, v)| set.get_label_value(k) == Some(*v))
        {
            continue;
        }
        total += match &s.value {
            PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
            PrometheusValue::Counter(c) => c.value.as_f64(),
            PrometheusValue::Histogram(h) => h.count.unwrap_or(0) as f64,
            _ => 0.0,
        };
    }
    total
}

pub async fn metric(c: &HttpClient, base: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_in(
        &get(c, &format!("{base}/metrics")).await.text(),
        name,
        labels,
    )
}

/// Polls `f` until it returns true (20 ms steps, `secs` at most).
pub async fn eventually<F, Fut>(secs: f64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
