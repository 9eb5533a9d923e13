//! `crds/` and the chart's copy are generated: this fails when either no longer matches the
//! types (run crdgen).

/// Fails unless `path` (from the repository root) holds the CRD the types generate.
fn assert_is_generated(path: &str, fix: &str) {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{path}: {e}"));
    let generated = program_operator::crd_yaml().expect("crd renders");
    assert!(committed == generated, "{path} is stale: {fix}");
}

#[test]
fn crds_directory_is_current() {
    assert_is_generated(
        "crds/programscheduling.yaml",
        "run `cargo run -p program-operator --bin crdgen > crds/programscheduling.yaml`",
    );
}

/// Helm installs the chart's own copy: a stale one makes the API server prune new fields.
#[test]
fn the_charts_crd_is_the_generated_one() {
    assert_is_generated(
        "charts/program-scheduling/crds/programscheduling.yaml",
        "copy crds/programscheduling.yaml there",
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

/// Every field `kubectl explain` shows, `path` and below, that has no description.
fn undescribed(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (name, field) in props {
        let at = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        if !field.get("description").is_some_and(|d| d.is_string()) {
            out.push(at.clone());
        }
        // Kubernetes' own types (label selectors, resources, conditions) are described by
        // Kubernetes; this resource's fields are ours.
        for inner in [field.get("items"), field.get("additionalProperties")]
            .into_iter()
            .flatten()
        {
            undescribed(inner, &format!("{at}[]"), out);
        }
        undescribed(field, &at, out);
    }
}

#[test]
fn kubectl_explain_describes_every_field_and_the_resource() {
    let y = program_operator::crd_yaml().expect("crd");
    let v: serde_json::Value = serde_yaml::from_str(&y).expect("yaml");
    let schema = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut missing = Vec::new();
    undescribed(schema, "", &mut missing);
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
    let top = schema["description"]
        .as_str()
        .expect("a top-level description");
    assert!(
        !top.contains("Auto-generated") && top.contains("vLLM"),
        "the resource says what it does: {top}"
    );
}

/// Every `default` the schema declares under `path`, as (path from the spec, value).
fn schema_defaults(
    schema: &serde_json::Value,
    path: &[String],
    out: &mut Vec<(Vec<String>, serde_json::Value)>,
) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (name, field) in props {
        let mut at = path.to_vec();
        at.push(name.clone());
        if let Some(d) = field.get("default") {
            out.push((at.clone(), d.clone()));
        }
        schema_defaults(field, &at, out);
    }
}

/// A spec with `at` set to `value` (its parent objects created empty).
fn spec_with(at: &[String], value: Option<&serde_json::Value>) -> serde_json::Value {
    let mut spec = serde_json::json!({ "workerSelector": {} });
    let mut cur = &mut spec;
    for key in &at[..at.len() - 1] {
        if cur.get(key).is_none() {
            cur[key] = serde_json::json!({});
        }
        cur = &mut cur[key];
    }
    if let Some(v) = value {
        cur[&at[at.len() - 1]] = v.clone();
    }
    spec
}

/// What the API server fills in (a schema default) is what the operator does with the field
/// left out: the same router config and the same owned objects.
#[test]
fn every_schema_default_is_the_default_the_operator_applies() {
    use program_operator::crd::{ProgramScheduling, ProgramSchedulingSpec};
    let y = program_operator::crd_yaml().expect("crd");
    let v: serde_json::Value = serde_yaml::from_str(&y).expect("yaml");
    let spec = &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut defaults = Vec::new();
    schema_defaults(spec, &[], &mut defaults);
    let names: Vec<String> = defaults.iter().map(|(p, _)| p.join(".")).collect();
    for expected in [
        "router.policy",
        "router.logLevel",
        "fairness.tenantSource",
        "fairness.discipline",
        "programScheduling.programSchedulingEnableKey",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} has a schema default: {names:?}"
        );
    }
    let worker = program_router::config::WorkerConfig {
        url: "http://10.0.0.1:8000".into(),
        dp_rank: Some(0),
    };
    let outcome = |spec: serde_json::Value| {
        let spec: ProgramSchedulingSpec =
            serde_json::from_value(spec.clone()).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mut ps = ProgramScheduling::new("agents", spec.clone());
        ps.metadata.namespace = Some("ml".into());
        ps.metadata.uid = Some("uid-1".into());
        // A default beside a required field left out renders the same error either way.
        let cfg =
            program_operator::render::render(&spec, vec![worker.clone()], &[]).map_err(|e| e.0)?;
        let objects = [
            program_operator::objects::deployment(&ps, &cfg, "program-router:1.0.0"),
            program_operator::objects::service(&ps),
        ];
        Ok::<_, String>((cfg, objects))
    };
    for (at, value) in &defaults {
        assert_eq!(
            outcome(spec_with(at, Some(value))),
            outcome(spec_with(at, None)),
            "{}: the schema's default {value} is not what the operator does without it",
            at.join(".")
        );
    }
}
