//! Reads each Ready router pod's `/status` (on its pod IP and the router port) and turns it into a
//! [`RouterReport`]: which config file it runs and how many of its targets are healthy.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;

use crate::conditions::RouterReport;

/// A small HTTP/1 client for router status reads.
#[derive(Clone)]
pub struct StatusClient {
    http: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl StatusClient {
    pub fn new(timeout: Duration) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(timeout));
        conn.set_nodelay(true);
        StatusClient {
            http: Client::builder(TokioExecutor::new())
                // Below the router's idle limit for client connections (60 s), so a poll never
                // reuses a connection the router is closing (the 30 s steady-state poll still
                // reuses its connection).
                .pool_idle_timeout(Duration::from_secs(45))
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .build(conn),
            timeout,
        }
    }

    /// The report of one pod, `None` when it does not count (not Ready, no IP, terminating).
    pub async fn report(&self, pod: &Pod, port: i32) -> Option<RouterReport> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = ready_ip(pod)?;
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        let url = format!("http://{host}:{port}/status");
        Some(match self.fetch(&url).await {
            Ok(v) => parse(name, &v),
            Err(error) => RouterReport::Unreachable { pod: name, error },
        })
    }

    async fn fetch(&self, url: &str) -> Result<serde_json::Value, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let work = async {
            let resp = self.http.get(uri).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!("HTTP {status}"));
            }
            serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }
}

/// A pod's IP when it is Ready and not terminating.
pub fn ready_ip(p: &Pod) -> Option<String> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let s = p.status.as_ref()?;
    let ready = s
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    s.pod_ip.clone().filter(|ip| ready && !ip.is_empty())
}

fn parse(pod: String, v: &serde_json::Value) -> RouterReport {
    let targets = v["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    RouterReport::Status {
        pod,
        file_hash: v["config"]["file_hash"].as_str().map(String::from),
        settings_hash: v["config"]["settings_hash"].as_str().map(String::from),
        targets: targets.len(),
        healthy_targets: targets
            .iter()
            .filter(|t| t["healthy"].as_bool() == Some(true))
            .count(),
        last_reload_error: v["last_reload_error"]["message"].as_str().map(String::from),
        client_keys_error: v["client_api_keys_dir"]["error"].as_str().map(String::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_the_router_status_document() {
        let v = json!({
            "config": {"hash": "x", "file_hash": "abc", "settings_hash": "def"},
            "last_reload_error": {"at_unix": 1, "message": "workers[0].url: bad"},
            "client_api_keys_dir": {"keys": 2, "error": "empty"},
            "targets": [{"healthy": true}, {"healthy": false}, {"healthy": true}],
        });
        assert_eq!(
            parse("r".into(), &v),
            RouterReport::Status {
                pod: "r".into(),
                file_hash: Some("abc".into()),
                settings_hash: Some("def".into()),
                targets: 3,
                healthy_targets: 2,
                last_reload_error: Some("workers[0].url: bad".into()),
                client_keys_error: Some("empty".into()),
            }
        );
        let empty = parse("r".into(), &json!({}));
        assert!(matches!(
            empty,
            RouterReport::Status {
                targets: 0,
                file_hash: None,
                ..
            }
        ));
    }

    #[test]
    fn only_ready_pods_with_an_ip_count() {
        let pod = |ready: &str, ip: Option<&str>| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "r"},
                "status": {
                    "podIP": ip,
                    "conditions": [{"type": "Ready", "status": ready}],
                },
            }))
            .expect("pod")
        };
        assert_eq!(
            ready_ip(&pod("True", Some("10.0.0.1"))).as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(ready_ip(&pod("False", Some("10.0.0.1"))), None);
        assert_eq!(ready_ip(&pod("True", None)), None);
    }
}
