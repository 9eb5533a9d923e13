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
