//! Test harness: an in-process simulator on a loopback port and a small HTTP client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;
use vllm_sim::config::SimArgs;

pub struct Sim {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<()>,
}

impl Sim {
    pub async fn start(args: &[&str]) -> Sim {
        let mut v = vec!["vllm-sim", "--port", "0"];
        v.extend_from_slice(args);
        let cfg = SimArgs::try_parse_from(v)
            .expect("args")
            .validate()
            .expect("valid");
        let (listener, addr) = vllm_sim::server::bind(&cfg).await.expect("bind");
        let (tx, rx) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            vllm_sim::server::serve(cfg, listener, stop, Duration::from_secs(10))
                .await
                .expect("serve");
        });
        Sim {
            addr,
            stop: Some(tx),
            done,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Signals shutdown (in-flight requests are drained).
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
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
    let mut b = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = c.request(req).await.expect("response");
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

/// Reads `/metrics`, parses it with a Prometheus text parser and returns the sum of `name` over
/// the series whose labels match. `name_sum` / `name_count` read a histogram's sum and count.
pub async fn metric(c: &HttpClient, sim: &Sim, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = get(c, &sim.url("/metrics")).await.text();
    metric_in(&text, name, labels)
}

pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};
    let exp = parse_prometheus(text).unwrap_or_else(|e| panic!("exposition must parse: {e:?}"));
    let (family, part) = match (name.strip_suffix("_sum"), name.strip_suffix("_count")) {
        (Some(f), _) if exp.families.contains_key(f) => (f, "sum"),
        (_, Some(f)) if exp.families.contains_key(f) => (f, "count"),
        _ => (name, "value"),
    };
    let fam = exp
        .families
        .get(family)
        .unwrap_or_else(|| panic!("no family {family}"));
    let mut total = None;
    for s in fam.iter_samples() {
        let set = s.get_labelset().expect("labelset");
        if !labels
            .iter()
            .all(|(k, v)| set.get_label_value(k) == Some(*v))
        {
            continue;
        }
        let v = match (&s.value, part) {
            (PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n), _) => n.as_f64(),
            (PrometheusValue::Counter(c), _) => c.value.as_f64(),
            (PrometheusValue::Histogram(h), "sum") => h.sum.as_ref().map_or(0.0, |n| n.as_f64()),
            (PrometheusValue::Histogram(h), _) => h.count.unwrap_or(0) as f64,
            _ => continue,
        };
        *total.get_or_insert(0.0) += v;
    }
    total.unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
}

pub fn chat_body(content: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
    .to_string()
}

/// A prompt of about `words` tokens.
pub fn words(seed: u32, words: usize) -> String {
    (0..words).map(|i| format!(" t{seed}x{i}")).collect()
}
