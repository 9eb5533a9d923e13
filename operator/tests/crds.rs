//! `crds/` is generated: this fails when it no longer matches the types (run crdgen).

#[test]
fn crds_directory_is_current() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/programscheduling.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("crds/programscheduling.yaml exists");
    let generated = program_operator::crd_yaml().expect("crd renders");
    assert!(
        committed == generated,
        "crds/programscheduling.yaml is stale: run `cargo run -p program-operator --bin crdgen > crds/programscheduling.yaml`"
    );
}

#[test]
fn the_crd_has_the_promised_shape() {
    let y = program_operator::crd_yaml().expect("crd");
    let v: serde_json::Value = serde_yaml::from_str(&y).expect("yaml");
    assert_eq!(v["spec"]["group"], "scheduling.program-router.dev");
    assert_eq!(v["spec"]["names"]["shortNames"][0], "psched");
    assert_eq!(v["spec"]["scope"], "Namespaced");
    let version = &v["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert!(version["subresources"]["status"].is_object());
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["Ready", "Ranks", "Routers", "Age"]);
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["required"], serde_json::json!(["workerSelector"]));
    let ps = &spec["properties"]["programScheduling"];
    let rules: Vec<&str> = ps["x-kubernetes-validations"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["rule"].as_str())
        .collect();
    assert_eq!(rules.len(), 3, "{rules:?}");
    let conditions =
        &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
}
