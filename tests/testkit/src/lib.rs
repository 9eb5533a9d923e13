//! Helpers shared by the loopback HTTP tests of every crate: a pooled client, replies with their
//! status, headers and body, and reading a metric out of a Prometheus exposition with a real
//! parser. Test support only; never a dependency of shipped code.
#![forbid(unsafe_code)]

pub mod secret_volume;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The program-router's `metrics on <url>` and `peers on <url>` lines, from what a reader of its
/// stdout buffered past `listening on <url>`: it prints all three in one write.
pub fn listener_lines(buffered: &[u8]) -> (Option<String>, Option<String>) {
    let rest = String::from_utf8_lossy(buffered);
    let line = |prefix: &str| {
        rest.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    (line("metrics on "), line("peers on "))
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

/// Sends a request with a JSON content type and the given extra headers.
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

/// Sum of `name` over the series whose labels match, parsed with a Prometheus text parser.
/// `name_sum` / `name_count` read a histogram's sum and count; a missing family reads 0 unless
/// `required`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)], required: bool) -> f64 {
    use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};
    let exp = parse_prometheus(text).unwrap_or_else(|e| panic!("exposition must parse: {e:?}"));
    let (family, part) = match (name.strip_suffix("_sum"), name.strip_suffix("_count")) {
        (Some(f), _) if exp.families.contains_key(f) => (f, "sum"),
        (_, Some(f)) if exp.families.contains_key(f) => (f, "count"),
        _ => (name, "value"),
    };
    let Some(fam) = exp.families.get(family) else {
        assert!(!required, "no family {family}");
        return 0.0;
    };
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
            (PrometheusValue::Summary(x), "sum") => x.sum.as_ref().map_or(0.0, |n| n.as_f64()),
            (PrometheusValue::Summary(x), _) => x.count.unwrap_or(0) as f64,
        };
        *total.get_or_insert(0.0) += v;
    }
    match total {
        Some(t) => t,
        None if required => panic!("no sample {name} {labels:?}"),
        None => 0.0,
    }
}

/// One sample as the reference parser read it: name, labels, value.
pub type ReferenceSample = (String, Vec<(String, String)>, f64);

/// The gauge, counter and untyped samples of `text` as `openmetrics-parser` reads a Prometheus
/// exposition, or `None` when it refuses the text: the reference the router's scanner is
/// checked against (`program_router::fuzz::metrics_against`).
pub fn reference_samples(text: &str) -> Option<Vec<ReferenceSample>> {
    use openmetrics_parser::{PrometheusValue, prometheus::parse_prometheus};
    let exp = parse_prometheus(text).ok()?;
    let mut out = Vec::new();
    for (name, fam) in &exp.families {
        for s in fam.iter_samples() {
            let value = match &s.value {
                PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                PrometheusValue::Counter(c) => c.value.as_f64(),
                _ => continue,
            };
            let labels = s
                .get_labelset()
                .ok()?
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            out.push((name.clone(), labels, value));
        }
    }
    Some(out)
}
