//! Spec + discovered targets → the router's configuration: a pure function, table-tested.
//!
//! The output is program-router's own `RouterConfig`, so every value is checked by the router's
//! validation before it can reach a ConfigMap. The API key never appears in it (the Deployment
//! passes it from its Secret as `PROGRAM_ROUTER_API_KEY`).

use program_router::config::peers::{PeerMember, PeersConfig};
use program_router::config::{PolicyKind, RouterConfig, WorkerConfig};

use crate::crd::ProgramSchedulingSpec;

/// Why a spec cannot become a router config (reported as `Ready=False`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(pub String);

fn policy(name: &str) -> Result<PolicyKind, RenderError> {
    serde_json::from_value(serde_json::Value::String(name.into()))
        .map_err(|_| RenderError(format!("router.policy: unknown policy {name:?}")))
}

/// Seconds a router keeps serving, not ready, after SIGTERM before it drains.
pub const SHUTDOWN_DELAY_SECS: f64 = 5.0;

/// The router config for `spec` over `workers`.
pub fn render(
    spec: &ProgramSchedulingSpec,
    workers: Vec<WorkerConfig>,
    routers: &[(String, String)],
) -> Result<RouterConfig, RenderError> {
    let port = |v: i32, f: &str| {
        u16::try_from(v).map_err(|_| RenderError(format!("{f}: not a TCP port ({v})")))
    };
    let mut cfg = RouterConfig {
        host: "0.0.0.0".into(),
        port: port(spec.router.port, "router.port")?,
        prometheus_host: "0.0.0.0".into(),
        prometheus_port: Some(port(spec.router.metrics_port, "router.metricsPort")?),
        workers,
        log_format: program_router::config::LogFormat::Json,
        ..Default::default()
    };
    cfg.policy.kind = policy(&spec.router.policy)?;
    cfg.health.interval_secs = 5.0;
    // On SIGTERM keep serving, not ready, while the endpoint removal reaches every node's proxy;
    // the pod's termination grace period covers this and the drain (see objects.rs).
    cfg.limits.shutdown_delay_secs = SHUTDOWN_DELAY_SECS;
    let r = &spec.router;
    let count = |v: i64, f: &str| {
        u32::try_from(v).map_err(|_| RenderError(format!("{f}: out of range ({v})")))
    };
    if let Some(n) = r.max_concurrent_requests {
        let n = count(n, "router.maxConcurrentRequests")?;
        if n == 0 {
            return Err(RenderError(
                "router.maxConcurrentRequests: must be at least 1".into(),
            ));
        }
        cfg.limits.max_concurrent_requests = Some(n);
    }
    if let Some(n) = r.queue_size {
        cfg.limits.queue_size = count(n, "router.queueSize")?;
    }
    if let Some(t) = r.queue_timeout_seconds {
        if !(t.is_finite() && t > 0.0) {
            return Err(RenderError(format!(
                "router.queueTimeoutSeconds: must be positive ({t})"
            )));
        }
        cfg.limits.queue_timeout_secs = t;
    }
    if let Some(ps) = &spec.program_scheduling {
        cfg.program_scheduling = Some(ps.to_router().map_err(RenderError)?);
    }
    if let Some(f) = &spec.fairness {
        cfg.fairness = Some(f.to_router().map_err(RenderError)?);
    }
    // Replicas that know each other forward Programs to their owner, share quota use and find
    // which server stored a Responses API response.
    if r.peer_forwarding && r.replicas > 1 {
        cfg.peers = Some(peers(routers, cfg.port));
    }
    cfg.validate().map_err(|e| RenderError(e.to_string()))?;
    Ok(cfg)
}

/// The router replicas that forward Programs to each other: `routers` are the Ready router
/// pods as (name, IP), listed by name so that the rendered file does not depend on list order.
fn peers(routers: &[(String, String)], port: u16) -> PeersConfig {
    let mut members: Vec<PeerMember> = routers
        .iter()
        .map(|(name, ip)| PeerMember {
            name: name.clone(),
            url: if ip.contains(':') {
                format!("http://[{ip}]:{port}")
            } else {
                format!("http://{ip}:{port}")
            },
        })
        .collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    PeersConfig {
        members,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ProgramSchedulingParams, RouterSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn spec(router: RouterSpec, ps: Option<ProgramSchedulingParams>) -> ProgramSchedulingSpec {
        ProgramSchedulingSpec {
            worker_selector: LabelSelector::default(),
            worker_port: 8000,
            data_parallel: None,
            router,
            program_scheduling: ps,
            api_key_secret_ref: None,
            client_api_keys_secret_ref: None,
            client_api_keys_secret: None,
            fairness: None,
        }
    }

    fn w(rank: u32) -> WorkerConfig {
        WorkerConfig {
            url: "http://10.0.0.1:8000".into(),
            dp_rank: Some(rank),
        }
    }

    #[test]
    fn renders_targets_listeners_policy_and_program_scheduling() {
        let ps = ProgramSchedulingParams {
            global_queue: Some(true),
            ..Default::default()
        };
        let c = render(
            &spec(
                RouterSpec {
                    policy: "consistent_hash".into(),
                    ..Default::default()
                },
                Some(ps),
            ),
            vec![w(0), w(1)],
            &[],
        )
        .expect("valid");
        assert_eq!(c.targets().len(), 2);
        assert_eq!(
            (c.host.as_str(), c.port, c.prometheus_port),
            ("0.0.0.0", 8080, Some(9090))
        );
        assert_eq!(c.policy.kind, PolicyKind::ConsistentHash);
        assert!(c.program_scheduling.expect("on").global_queue);
        assert!(
            c.api_key.is_none(),
            "secrets never enter the rendered config"
        );
    }

    #[test]
    fn semantic_errors_name_the_field() {
        let cases = [
            (
                spec(
                    RouterSpec {
                        policy: "fastest".into(),
                        ..Default::default()
                    },
                    None,
                ),
                "router.policy",
            ),
            (
                spec(
                    RouterSpec {
                        port: 70000,
                        ..Default::default()
                    },
                    None,
                ),
                "router.port",
            ),
            (
                spec(
                    Default::default(),
                    Some(ProgramSchedulingParams {
                        stats_window_size: Some(0),
                        ..Default::default()
                    }),
                ),
                "stats_window_size",
            ),
        ];
        let capped = |n: i64, q: i64, t: f64| {
            spec(
                RouterSpec {
                    max_concurrent_requests: Some(n),
                    queue_size: Some(q),
                    queue_timeout_seconds: Some(t),
                    ..Default::default()
                },
                None,
            )
        };
        let cases = cases.into_iter().chain([
            (capped(0, 10, 1.0), "router.maxConcurrentRequests"),
            (capped(-1, 10, 1.0), "router.maxConcurrentRequests"),
            (capped(8, -1, 1.0), "router.queueSize"),
            (capped(8, 1 << 40, 1.0), "router.queueSize"),
            (capped(8, 10, 0.0), "router.queueTimeoutSeconds"),
        ]);
        for (s, want) in cases {
            let e = render(&s, vec![w(0)], &[]).expect_err(want);
            assert!(e.0.contains(want), "{}", e.0);
        }
    }

    #[test]
    fn the_concurrency_cap_reaches_the_router_limits() {
        let none = render(&spec(Default::default(), None), vec![w(0)], &[]).expect("valid");
        assert_eq!(none.limits.max_concurrent_requests, None, "off by default");
        let s = spec(
            RouterSpec {
                max_concurrent_requests: Some(512),
                queue_size: Some(1000),
                queue_timeout_seconds: Some(30.0),
                ..Default::default()
            },
            None,
        );
        let c = render(&s, vec![w(0)], &[]).expect("valid");
        assert_eq!(c.limits.max_concurrent_requests, Some(512));
        assert_eq!(c.limits.queue_size, 1000);
        assert_eq!(c.limits.queue_timeout_secs, 30.0);
    }

    #[test]
    fn same_input_same_hash() {
        let s = spec(Default::default(), None);
        assert_eq!(
            render(&s, vec![w(0)], &[]).expect("ok").hash(),
            render(&s, vec![w(0)], &[]).expect("ok").hash()
        );
        assert_ne!(
            render(&s, vec![w(0)], &[]).expect("ok").hash(),
            render(&s, vec![w(1)], &[]).expect("ok").hash()
        );
    }

    #[test]
    fn several_replicas_list_the_ready_router_pods_as_peers() {
        let routers = [
            ("router-b".to_string(), "10.0.0.8".to_string()),
            ("router-a".to_string(), "fd00::7".to_string()),
        ];
        let with = |replicas: i32, forwarding: bool, ps: bool| {
            let r = RouterSpec {
                replicas,
                peer_forwarding: forwarding,
                ..Default::default()
            };
            render(
                &spec(r, ps.then(ProgramSchedulingParams::default)),
                vec![w(0)],
                &routers,
            )
            .expect("valid")
            .peers
        };
        let peers = with(2, true, true).expect("peers");
        let members: Vec<(&str, &str)> = peers
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.url.as_str()))
            .collect();
        assert_eq!(
            members,
            [
                ("router-a", "http://[fd00::7]:8080"),
                ("router-b", "http://10.0.0.8:8080")
            ],
            "sorted by name; IPv6 in brackets; the API port"
        );
        assert_eq!(peers.self_name, None, "each pod names itself (--peer-name)");
        assert_eq!(with(1, true, true), None, "one replica: nothing to forward");
        assert_eq!(with(2, false, true), None, "turned off");
        assert!(
            with(2, true, false).is_some(),
            "without Program scheduling the replicas still share quota use and response homes"
        );
    }
}
