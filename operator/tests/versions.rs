//! One version for the crates, the images and the chart: the workspace version is the chart's
//! `version` and `appVersion` (which tags the operator image), every crate takes the workspace's
//! version, and the changelog names it.

use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn crates_chart_and_images_share_one_version() {
    let version = env!("CARGO_PKG_VERSION");
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&read("charts/program-scheduling/Chart.yaml")).expect("Chart.yaml");
    assert_eq!(chart["version"].as_str(), Some(version), "chart version");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(version),
        "chart appVersion"
    );
    for krate in [
        "router",
        "operator",
        "tests/vllm-sim",
        "tests/workload",
        "tests/testkit",
    ] {
        let toml = read(&format!("{krate}/Cargo.toml"));
        assert!(
            toml.lines().any(|l| l.trim() == "version.workspace = true"),
            "{krate} takes the workspace version"
        );
    }
    assert!(
        read("CHANGELOG.md").contains(&format!("## {version}")),
        "CHANGELOG.md has a section for {version}"
    );
    assert!(read("LICENSE").contains("Apache License"), "LICENSE");
}
