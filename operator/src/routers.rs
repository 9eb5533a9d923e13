//! Reads each Ready router pod's `/status` (on its pod IP and the router port) and turns it into a
//! [`RouterReport`]: which config file it runs and how many of its targets are healthy. A read
//! is bounded in time (the client's timeout) and size ([`MAX_STATUS_BYTES`]): a pod that answers
//! slowly or endlessly is reported unreachable, never waited on or buffered whole.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;

use crate::conditions::RouterReport;

/// The largest `/status` document read (a router with 1,000 targets sends about 250 KB).
pub const MAX_STATUS_BYTES: usize = 1024 * 1024;

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

    pub(crate) async fn fetch(&self, url: &str) -> Result<serde_json::Value, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let work = async {
            let resp = self.http.get(uri).await.map_err(|e| e.to_string())?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_STATUS_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        format!("the status document is larger than {MAX_STATUS_BYTES} bytes")
                    } else {
                        e.to_string()
                    }
                })?
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

/// Whether `meta`'s controller (its ownerReference with `controller: true`) has uid `owner`.
pub fn controlled_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    owner: Option<&str>,
) -> bool {
    let Some(owner) = owner else {
        return false;
    };
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner)
}

/// The pods of `pods` that the Deployment with uid `deployment` runs: each controlled by a
/// ReplicaSet of `sets` that the Deployment controls. Labels alone never make a pod a router.
pub fn owned_pods(
    pods: Vec<Pod>,
    sets: &[k8s_openapi::api::apps::v1::ReplicaSet],
    deployment: &str,
) -> Vec<Pod> {
    let owned_sets: Vec<&str> = sets
        .iter()
        .filter(|s| controlled_by(&s.metadata, Some(deployment)))
        .filter_map(|s| s.metadata.uid.as_deref())
        .collect();
    pods.into_iter()
        .filter(|p| {
            owned_sets
                .iter()
                .any(|rs| controlled_by(&p.metadata, Some(rs)))
        })
        .collect()
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

    /// A server on loopback that answers every connection with `body` as `/status`, slowly
    /// when `stall` (headers, then nothing).
    async fn status_server(body: Vec<u8>, stall: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/status", l.local_addr().expect("addr"));
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = c.read(&mut buf).await;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len() + usize::from(stall)
                    );
                    let _ = c.write_all(head.as_bytes()).await;
                    let _ = c.write_all(&body).await;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn status_reads_are_bounded_in_size_and_time() {
        let client = StatusClient::new(Duration::from_millis(500));
        let ok = status_server(br#"{"targets": []}"#.to_vec(), false).await;
        assert!(client.fetch(&ok).await.is_ok());
        // 2 MiB of JSON: refused at the cap, not buffered whole.
        let mut big = b"[".to_vec();
        big.resize(2 * MAX_STATUS_BYTES, b' ');
        big.push(b']');
        let huge = status_server(big, false).await;
        let e = client.fetch(&huge).await.expect_err("too large");
        assert!(e.contains("larger than"), "{e}");
        // A body that never ends: given up at the timeout.
        let slow = status_server(b"{".to_vec(), true).await;
        let e = client.fetch(&slow).await.expect_err("too slow");
        assert!(e.contains("no answer within"), "{e}");
    }

    fn owner(uid: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "x".into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    #[test]
    fn only_pods_owned_through_the_deployment_are_routers() {
        use k8s_openapi::api::apps::v1::ReplicaSet;
        let rs = |uid: &str, deployment: &str| {
            let mut r = ReplicaSet::default();
            r.metadata.uid = Some(uid.into());
            r.metadata.owner_references = Some(vec![owner(deployment)]);
            r
        };
        let pod = |name: &str, owners: Vec<_>| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.owner_references = Some(owners);
            p
        };
        let not_controller = {
            let mut o = owner("rs-1");
            o.controller = Some(false);
            o
        };
        let pods = vec![
            pod("ours", vec![owner("rs-1")]),
            pod("older-rollout", vec![owner("rs-2")]),
            pod("labelled-by-hand", vec![]),
            pod("other-deployment", vec![owner("rs-3")]),
            pod("owned-not-controlled", vec![not_controller]),
        ];
        let sets = [
            rs("rs-1", "dep"),
            rs("rs-2", "dep"),
            rs("rs-3", "elsewhere"),
        ];
        let names: Vec<String> = owned_pods(pods, &sets, "dep")
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        assert_eq!(names, ["ours", "older-rollout"]);
        assert!(!controlled_by(&Pod::default().metadata, None));
    }
}
