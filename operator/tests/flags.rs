//! The operator binary refuses a bad command line with the flag's name, before it touches the
//! cluster.

#[test]
fn a_router_image_without_a_version_is_refused() {
    for image in ["ghcr.io/program-scheduling/program-router:latest", " "] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_program-operator"))
            .args(["--router-image", image, "--listen", "127.0.0.1:0"])
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .expect("run program-operator");
        assert!(!out.status.success(), "{image:?} refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--router-image"), "{err}");
    }
}

#[test]
fn a_log_filter_the_router_would_not_take_is_refused() {
    for (flag, env) in [
        (Some("program_operator[reconcile]=debug"), None),
        (None, Some("info,kube=loud")),
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_program-operator"));
        cmd.args(["--listen", "127.0.0.1:0"])
            .env("KUBECONFIG", "/nonexistent")
            .env_remove("RUST_LOG");
        if let Some(f) = flag {
            cmd.args(["--log-level", f]);
        }
        if let Some(e) = env {
            cmd.env("RUST_LOG", e);
        }
        let out = cmd.output().expect("run program-operator");
        assert!(!out.status.success(), "{flag:?} {env:?} refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--log-level") && err.contains("target=level"),
            "{err}"
        );
    }
}

/// The operator logs in the routers' JSON shape (one subscriber for both): `timestamp`,
/// `level`, `target` and `fields.message` on each stderr line.
#[test]
fn the_operator_logs_the_routers_json_shape() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_program-operator"))
        .args(["--listen", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run program-operator");
    assert!(!out.status.success(), "no cluster to run against");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!lines.is_empty(), "no JSON log line: {err}");
    for l in &lines {
        for key in ["timestamp", "level", "target"] {
            assert!(l[key].is_string(), "{key} in {l}");
        }
        assert!(l["fields"]["message"].is_string(), "{l}");
    }
}
