//! Spec + discovered targets → the router's configuration: a pure function, table-tested.
//!
//! The output is program-router's own `RouterConfig`, so every value is checked by the router's
//! validation before it can reach a ConfigMap. The API key never appears in it (the Deployment
//! passes it from its Secret as `PROGRAM_ROUTER_API_KEY`). The CRD → router-config mapping of
//! each feature's section is [`mapping`].

pub mod mapping;

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

/// Where a router pod reads the peer secret (the Secret `<name>-router-peer`, mounted).
pub const PEER_SECRET_DIR: &str = "/var/run/secrets/program-router/peer";
/// The key of the peer secret in its Secret, and its file name in [`PEER_SECRET_DIR`].
pub const PEER_SECRET_KEY: &str = "secret";

/// Whether `image` may run as a router under the operator's allow-list (image-reference
/// prefixes, e.g. `registry.example/program-router@`, `registry.example/program-router:1.`);
/// an empty list allows every image.
pub fn check_image(image: &str, allowed: &[String]) -> Result<(), RenderError> {
    if allowed.is_empty() || allowed.iter().any(|p| image.starts_with(p.as_str())) {
        return Ok(());
    }
    Err(RenderError(format!(
        "router.image: {image:?} is not allowed by the operator (--allowed-router-images: {})",
        allowed.join(", ")
    )))
}

/// Sets the routers' OpenTelemetry export from `t` (the resource's `router.tracing`, or the
/// operator's default for resources without one).
pub fn tracing(cfg: &mut RouterConfig, t: &crate::crd::TracingSpec) -> Result<(), RenderError> {
    if !t.enabled {
        return Ok(());
    }
    let Some(endpoint) = &t.otlp_traces_endpoint else {
        return Err(RenderError(
            "router.tracing.otlpTracesEndpoint: required when tracing is enabled".into(),
        ));
    };
    cfg.enable_trace = true;
    cfg.otlp_traces_endpoint = Some(endpoint.clone());
    if let Some(r) = t.sampling_ratio {
        cfg.otel_sampling_ratio = r;
    }
    cfg.validate()
        .map_err(|e| RenderError(format!("router.tracing: {e}")))
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
        log_level: spec.router.log_level.filter().into(),
        access_log: spec.router.access_log,
        ..Default::default()
    };
    cfg.policy.kind = policy(&spec.router.policy)?;
    cfg.health.interval_secs = 5.0;
    // On SIGTERM keep serving, not ready, while the endpoint removal reaches every node's proxy;
    // the pod's termination grace period covers this and the drain (see `crate::objects`).
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
    if let Some(t) = &spec.router.tracing {
        tracing(&mut cfg, t)?;
    }
    if let Some(ps) = &spec.program_scheduling {
        cfg.program_scheduling = Some(ps.to_router().map_err(RenderError)?);
    }
    if let Some(f) = &spec.fairness {
        cfg.fairness = Some(f.to_router().map_err(RenderError)?);
    }
    // Replicas that know each other forward Programs to their owner, share quota use and find
    // which server stored a Responses API response.
    // The peer listener exists whenever forwarding may be on, so that scaling from one
    // replica to two needs no restart (a reload cannot add a listener).
    if r.peer_forwarding {
        let peer_port = port(r.peer_port, "router.peerPort")?;
        if [cfg.port, cfg.prometheus_port.unwrap_or(0)].contains(&peer_port) {
            return Err(RenderError(format!(
                "router.peerPort: {peer_port} is already the API or metrics port"
            )));
        }
        cfg.peer_host = "0.0.0.0".into();
        cfg.peer_port = Some(peer_port);
        cfg.peer_secret_file = Some(format!("{PEER_SECRET_DIR}/{PEER_SECRET_KEY}"));
    }
    if r.peer_forwarding && r.replicas > 1 {
        cfg.peers = Some(PeersConfig {
            hand_over: r.peer_hand_over,
            ..peers(routers, cfg.peer_port.unwrap_or(cfg.port))
        });
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

/// Numbers the member list of `cfg` (`peers.revision`), so that the router replicas can tell a
/// newer list from an older one while the ConfigMap reaches their pods one at a time:
/// `previous` is the config file the ConfigMap holds now. The same members keep its revision (an
/// unchanged list writes nothing); another list gets a higher one — the time in milliseconds,
/// or one more than the previous revision when that is higher, so a re-created ConfigMap or
/// another operator replica still numbers upwards while clocks agree.
pub fn number_members(cfg: &mut RouterConfig, previous: Option<&str>, now_ms: u64) {
    let Some(peers) = cfg.peers.as_mut() else {
        return;
    };
    let prev: Option<serde_json::Value> = previous.and_then(|p| serde_json::from_str(p).ok());
    let prev = prev.as_ref().map(|v| &v["peers"]);
    let prev_revision = prev.and_then(|p| p["revision"].as_u64());
    let same =
        prev.is_some_and(|p| serde_json::to_value(&peers.members).is_ok_and(|m| p["members"] == m));
    peers.revision = match prev_revision {
        Some(r) if same => Some(r),
        Some(r) => Some(now_ms.max(r.saturating_add(1))),
        None => Some(now_ms),
    };
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
    fn the_log_level_reaches_the_config_and_restarts_no_pod() {
        let at = |level: crate::crd::LogLevel| {
            let router = RouterSpec {
                log_level: level,
                ..Default::default()
            };
            render(&spec(router, None), vec![w(0)], &[]).expect("valid")
        };
        let (info, debug) = (at(Default::default()), at(crate::crd::LogLevel::Debug));
        assert_eq!(
            (info.log_level.as_str(), debug.log_level.as_str()),
            ("info", "debug")
        );
        debug.validate().expect("the router accepts the filter");
        assert_eq!(
            crate::objects::restart_hash(&info),
            crate::objects::restart_hash(&debug),
            "the routers apply a new level on reload"
        );
    }

    #[test]
    fn only_allowed_router_images_render() {
        let allowed = vec!["registry.example/program-router:".to_string()];
        assert!(check_image("anything:latest", &[]).is_ok(), "no list: all");
        assert!(check_image("registry.example/program-router:1.2.0", &allowed).is_ok());
        let e = check_image("evil.example/miner:1", &allowed).expect_err("refused");
        assert!(e.0.starts_with("router.image:"), "{e}");
        assert!(e.0.contains("evil.example/miner:1"), "{e}");
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
                ("router-a", "http://[fd00::7]:8081"),
                ("router-b", "http://10.0.0.8:8081")
            ],
            "sorted by name; IPv6 in brackets; the peer port"
        );
        assert_eq!(peers.self_name, None, "each pod names itself (--peer-name)");
        assert_eq!(with(1, true, true), None, "one replica: nothing to forward");
        // The peer listener and its secret come with forwarding, one replica or more (scaling
        // needs no restart), and never without it.
        let listener = |replicas: i32, forwarding: bool| {
            let r = RouterSpec {
                replicas,
                peer_forwarding: forwarding,
                ..Default::default()
            };
            let c = render(&spec(r, None), vec![w(0)], &routers).expect("valid");
            (c.peer_port, c.peer_secret_file)
        };
        let secret = Some(format!("{PEER_SECRET_DIR}/{PEER_SECRET_KEY}"));
        assert_eq!(listener(1, true), (Some(8081), secret.clone()));
        assert_eq!(listener(3, true), (Some(8081), secret));
        assert_eq!(listener(3, false), (None, None));
        let clash = RouterSpec {
            peer_port: 8080,
            ..Default::default()
        };
        let e = render(&spec(clash, None), vec![w(0)], &routers).expect_err("clash");
        assert!(e.0.starts_with("router.peerPort"), "{e}");
        assert_eq!(with(2, false, true), None, "turned off");
        assert!(
            with(2, true, false).is_some(),
            "without Program scheduling the replicas still share quota use and response homes"
        );
        assert!(peers.hand_over, "Programs are handed over by default");
        let cold = RouterSpec {
            replicas: 2,
            peer_hand_over: false,
            ..Default::default()
        };
        let cold = render(&spec(cold, None), vec![w(0)], &routers).expect("valid");
        assert!(
            !cold.peers.expect("peers").hand_over,
            "router.peerHandOver: false"
        );
    }

    #[test]
    fn a_changed_member_list_gets_a_higher_revision_and_an_unchanged_one_keeps_it() {
        let s = spec(
            RouterSpec {
                replicas: 2,
                ..Default::default()
            },
            None,
        );
        let pods = |names: &[&str]| -> Vec<(String, String)> {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), format!("10.0.0.{i}")))
                .collect()
        };
        let numbered = |names: &[&str], previous: Option<&str>, now: u64| {
            let mut cfg = render(&s, vec![w(0)], &pods(names)).expect("valid");
            number_members(&mut cfg, previous, now);
            cfg
        };
        let revision = |c: &RouterConfig| c.peers.as_ref().and_then(|p| p.revision);
        let file = |c: &RouterConfig| serde_json::to_string_pretty(c).expect("json");

        let first = numbered(&["a", "b"], None, 1_000);
        assert_eq!(revision(&first), Some(1_000), "a first list: the time");
        let same = numbered(&["a", "b"], Some(&file(&first)), 5_000);
        assert_eq!(revision(&same), Some(1_000), "same members, same revision");
        assert_eq!(
            file(&same),
            file(&first),
            "so the ConfigMap does not change"
        );
        let joined = numbered(&["a", "b", "c"], Some(&file(&first)), 5_000);
        assert_eq!(revision(&joined), Some(5_000));
        // A clock behind the previous revision still numbers upwards.
        let left = numbered(&["a", "c"], Some(&file(&joined)), 4_000);
        assert_eq!(revision(&left), Some(5_001));
        // A ConfigMap written before revisions existed, or unreadable: the time.
        let mut old = first.clone();
        if let Some(p) = old.peers.as_mut() {
            p.revision = None;
        }
        assert_eq!(
            revision(&numbered(&["a", "b"], Some(&file(&old)), 7)),
            Some(7)
        );
        assert_eq!(
            revision(&numbered(&["a", "b"], Some("{not json"), 8)),
            Some(8)
        );
        // No peers, nothing to number.
        let one = RouterSpec {
            replicas: 1,
            ..Default::default()
        };
        let mut single = render(&spec(one, None), vec![w(0)], &pods(&["a"])).expect("valid");
        number_members(&mut single, Some(&file(&first)), 9);
        assert_eq!(single.peers, None);
    }
}
