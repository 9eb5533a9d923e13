//! Tests of the router's configuration: validation names the field, hashes leave keys out.

#[test]
fn the_settings_hash_leaves_out_the_member_list_only() {
    let a =
        br#"{"port": 8080, "peers": {"members": [{"name": "a", "url": "http://10.0.0.1:8080"}]}}"#;
    let b = br#"{"port": 8080, "peers": {"members": []}}"#;
    let c = br#"{"port": 8081, "peers": {"members": []}}"#;
    assert_ne!(file_hash(a), file_hash(b));
    assert_eq!(settings_hash(a), settings_hash(b));
    assert_ne!(settings_hash(b), settings_hash(c));
    assert_eq!(settings_hash(b"not json"), file_hash(b"not json"));
}

use super::*;

#[test]
fn defaults_validate() {
    RouterConfig::default()
        .validate()
        .expect("defaults are valid");
}

#[test]
fn intra_node_dp_expands_urls_and_explicit_ranks_win() {
    let c = RouterConfig {
        workers: vec![
            WorkerConfig {
                url: "http://a:8000/".into(),
                dp_rank: None,
            },
            WorkerConfig {
                url: "http://b:8000".into(),
                dp_rank: Some(6),
            },
        ],
        intra_node_data_parallel_size: 2,
        ..Default::default()
    };
    let ids: Vec<_> = c.targets().iter().map(TargetSpec::id).collect();
    assert_eq!(
        ids,
        ["http://a:8000@0", "http://a:8000@1", "http://b:8000@6"]
    );
}

#[test]
fn bad_values_name_their_field() {
    let dup = RouterConfig {
        workers: vec![
            WorkerConfig {
                url: "http://a:1".into(),
                dp_rank: Some(0),
            },
            WorkerConfig {
                url: "http://a:1".into(),
                dp_rank: Some(0),
            },
        ],
        ..Default::default()
    };
    assert_eq!(dup.validate().expect_err("dup").field, "workers");
    let bad_url = RouterConfig {
        workers: vec![WorkerConfig {
            url: "ftp://x".into(),
            dp_rank: None,
        }],
        ..Default::default()
    };
    assert_eq!(bad_url.validate().expect_err("url").field, "workers[0].url");
    for key in ["", "line\nbreak"] {
        let c = RouterConfig {
            api_key: Some(key.into()),
            ..Default::default()
        };
        assert_eq!(c.validate().expect_err("key").field, "api_key", "{key:?}");
        let c = RouterConfig {
            client_api_keys: Some(vec!["ok".into(), key.into()]),
            ..Default::default()
        };
        assert_eq!(
            c.validate().expect_err("client key").field,
            "client_api_keys[1]",
            "{key:?}"
        );
    }
    let mut c = RouterConfig::default();
    c.retry.max_retries = 0;
    assert_eq!(c.validate().expect_err("retry").field, "retry.max_retries");
    for v in [-1.0, f64::NAN, f64::INFINITY] {
        let mut c = RouterConfig::default();
        c.limits.shutdown_delay_secs = v;
        assert_eq!(
            c.validate().expect_err("delay").field,
            "limits.shutdown_delay_secs"
        );
        let mut c = RouterConfig::default();
        c.limits.drain_timeout_secs = v;
        assert_eq!(
            c.validate().expect_err("drain").field,
            "limits.drain_timeout_secs"
        );
        let mut c = RouterConfig::default();
        c.limits.client_header_timeout_secs = Some(v);
        assert_eq!(
            c.validate().expect_err("header timeout").field,
            "limits.client_header_timeout_secs"
        );
    }
    // Upper bound on every duration, nested ones included; the error names the path.
    let mut c = RouterConfig::default();
    c.limits.request_timeout_secs = 1e20;
    assert_eq!(
        c.validate().expect_err("huge").field,
        "limits.request_timeout_secs"
    );
    let mut c = RouterConfig::default();
    c.limits.request_timeout_secs = MAX_SECONDS;
    c.validate().expect("a year is allowed");
    let mut c = RouterConfig {
        program_scheduling: Some(Default::default()),
        fairness: Some(Default::default()),
        ..Default::default()
    };
    if let Some(f) = c.fairness.as_mut() {
        f.classes[0].max_tpot_seconds = Some(1e12);
    }
    assert_eq!(
        c.validate().expect_err("nested").field,
        "fairness.classes[0].max_tpot_seconds"
    );
    let mut c = RouterConfig {
        program_scheduling: Some(Default::default()),
        ..Default::default()
    };
    if let Some(p) = c.program_scheduling.as_mut() {
        p.queue_timeout_seconds = 1e15;
        p.force_resume_timeout_seconds = 1.0;
    }
    assert_eq!(
        c.validate().expect_err("nested").field,
        "program_scheduling.queue_timeout_seconds"
    );
    for (v, want) in [
        (f64::NAN, 0.0),
        (-1.0, 0.0),
        (2.5, 2.5),
        (f64::INFINITY, MAX_SECONDS),
        (1e300, MAX_SECONDS),
    ] {
        assert_eq!(duration(v).as_secs_f64(), want, "{v}");
    }
    let mut c = RouterConfig::default();
    c.limits.client_header_timeout_secs = Some(0.0);
    assert!(
        c.validate().is_err(),
        "0 is not a timeout; null turns it off"
    );
    c.limits.client_header_timeout_secs = None;
    c.validate().expect("no limit");
    // Sizes that allocate in proportion are bounded (a typo must not exhaust memory).
    let c = RouterConfig {
        intra_node_data_parallel_size: MAX_DP_PER_URL + 1,
        ..Default::default()
    };
    assert_eq!(
        c.validate().expect_err("dp").field,
        "intra_node_data_parallel_size"
    );
    let mut c = RouterConfig::default();
    c.policy.virtual_nodes = u32::MAX;
    assert_eq!(
        c.validate().expect_err("ring").field,
        "policy.virtual_nodes"
    );
    let c = RouterConfig {
        program_scheduling: Some(crate::config::ProgramSchedulingConfig {
            stats_window_size: u32::MAX,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        c.validate().expect_err("window").field,
        "program_scheduling.stats_window_size"
    );
    let c = RouterConfig {
        program_scheduling: Some(crate::config::ProgramSchedulingConfig {
            hash_virtual_nodes: u32::MAX,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        c.validate().expect_err("ring").field,
        "program_scheduling.hash_virtual_nodes"
    );
    let c = RouterConfig {
        io_threads: Some(MAX_IO_THREADS + 1),
        ..Default::default()
    };
    assert_eq!(c.validate().expect_err("io").field, "io_threads");
    // A filter by span or field (EnvFilter's, not taken) names the field.
    let c = RouterConfig {
        log_level: "program_router[request{id=1}]=debug".into(),
        ..Default::default()
    };
    assert_eq!(c.validate().expect_err("span filter").field, "log_level");
    let c = RouterConfig {
        log_level: "warn,program_router=debug".into(),
        ..Default::default()
    };
    assert!(c.validate().is_ok());
    for n in [None, Some(0), Some(1), Some(MAX_IO_THREADS)] {
        let c = RouterConfig {
            io_threads: n,
            ..Default::default()
        };
        c.validate().expect("valid io_threads");
        assert!(
            c.resolved_io_threads() >= usize::from(n != Some(0)),
            "{n:?}"
        );
    }
    let c = RouterConfig {
        program_scheduling: Some(ProgramSchedulingConfig {
            low_watermark_ratio: 2.0,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        c.validate().expect_err("ps").field,
        "program_scheduling.high_watermark_ratio"
    );
}

#[test]
fn unknown_fields_are_rejected() {
    let e = serde_json::from_str::<RouterConfig>(r#"{"polcy":{}}"#).expect_err("unknown");
    assert!(e.to_string().contains("polcy"), "{e}");
}

#[test]
fn schema_names_every_top_level_field() {
    let s = RouterConfig::schema();
    let props = s["properties"].as_object().expect("properties");
    let value = serde_json::to_value(RouterConfig::default()).expect("json");
    for k in value.as_object().expect("object").keys() {
        assert!(props.contains_key(k), "schema lacks {k}");
    }
}

#[test]
fn hash_changes_with_content() {
    let a = RouterConfig::default();
    let mut b = a.clone();
    b.port = 1;
    assert_ne!(a.hash(), b.hash());
    assert_eq!(a.hash(), RouterConfig::default().hash());
}

#[test]
fn no_hash_derives_from_a_key() {
    let with = |key: &str| RouterConfig {
        api_key: Some(key.into()),
        client_api_keys: Some(vec![format!("{key}-client")]),
        ..Default::default()
    };
    assert_eq!(with("sk-one").hash(), with("sk-two").hash());
    let file = |key: &str| format!(r#"{{"port": 1, "api_key": "{key}"}}"#);
    assert_eq!(
        super::file_hash(file("sk-one").as_bytes()),
        super::file_hash(file("sk-two").as_bytes())
    );
    assert_eq!(
        super::settings_hash(file("sk-one").as_bytes()),
        super::settings_hash(file("sk-two").as_bytes())
    );
    // A file without keys hashes byte for byte, as the operator computes it.
    let plain = br#"{"port": 1}"#;
    assert_eq!(super::file_hash(plain), super::plain_hash(plain));
}

#[test]
fn peers_need_the_peer_listener_and_it_needs_a_secret() {
    let mut c = RouterConfig {
        peers: Some(super::peers::PeersConfig::default()),
        ..Default::default()
    };
    assert_eq!(c.validate().expect_err("no listener").field, "peer_port");
    c.peer_port = Some(0);
    assert_eq!(
        c.validate().expect_err("no secret").field,
        "peer_secret_file"
    );
    c.peer_secret_file = Some("/run/secret".into());
    c.validate().expect("valid");
}
