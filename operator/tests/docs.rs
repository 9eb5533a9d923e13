//! docs/operator.md documents exactly the fields of the generated CRD's schema.

use std::collections::BTreeSet;

use kube::CustomResourceExt;
use program_operator::crd::ProgramScheduling;
use serde_json::Value;

/// Kubernetes types documented as a whole (their inner fields are Kubernetes' own).
const OPAQUE: &[&str] = &[
    "spec.workerSelector",
    "spec.router.resources",
    "spec.router.affinity",
    "spec.router.tolerations",
    "spec.router.topologySpreadConstraints",
    "spec.router.imagePullSecrets",
    "spec.apiKeySecretRef",
    "spec.clientApiKeysSecretRef",
    "status.conditions",
];
/// Parents documented through their fields.
const PARENTS: &[&str] = &[
    "spec",
    "status",
    "spec.dataParallel",
    "spec.router",
    "spec.programScheduling.prefillCostModel",
    "spec.programScheduling.decodeThroughputModel",
];

fn walk(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (k, v) in props {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        out.insert(path.clone());
        if !OPAQUE.contains(&path.as_str()) {
            walk(v, &path, out);
        }
    }
}

#[test]
fn every_crd_field_is_documented_and_nothing_else() {
    let crd = serde_json::to_value(ProgramScheduling::crd()).expect("crd");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut want = BTreeSet::new();
    walk(schema, "", &mut want);
    want.retain(|p| {
        (p.starts_with("spec") || p.starts_with("status")) && !PARENTS.contains(&p.as_str())
    });
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operator.md"))
        .expect("docs/operator.md");
    let reference = doc
        .split("## Resource reference")
        .nth(1)
        .expect("reference section");
    let documented: BTreeSet<String> = reference
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    let missing: Vec<_> = want.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&want).collect();
    assert!(
        missing.is_empty(),
        "missing from docs/operator.md: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented but not in the CRD: {unknown:?}"
    );
    assert!(want.len() > 40, "schema walk found only {}", want.len());
}

#[test]
fn the_documented_minimal_resource_is_valid() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operator.md"))
        .expect("docs/operator.md");
    let yaml = doc
        .split("## A minimal resource")
        .nth(1)
        .and_then(|s| s.split("```yaml").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("yaml block");
    let ps: ProgramScheduling = serde_yaml::from_str(yaml).expect("parses as ProgramScheduling");
    let ps_cfg = ps
        .spec
        .program_scheduling
        .as_ref()
        .expect("on")
        .to_router()
        .expect("valid");
    assert!(ps_cfg.global_queue);
    program_operator::render::render(&ps.spec, Vec::new(), &[]).expect("renders");
}

/// Every key path of a YAML value (`a.b.c`; list items share their list's path).
fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let p = format!("{prefix}.{k}");
                out.insert(p.clone());
                paths(v, &p, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| paths(i, prefix, out)),
        _ => {}
    }
}

#[test]
fn the_chart_examples_are_valid_and_lose_no_field() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/program-scheduling/examples"
    );
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).expect("examples") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        let raw: Value = serde_yaml::from_str(&text).expect("yaml");
        if raw["kind"] != "ProgramScheduling" {
            continue; // autoscaling objects; the e2e applies them
        }
        let ps: ProgramScheduling =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A misspelt field would be dropped silently by parsing; the round trip shows it.
        let (mut want, mut got) = (BTreeSet::new(), BTreeSet::new());
        paths(&raw["spec"], "spec", &mut want);
        paths(
            &serde_json::to_value(&ps.spec).expect("json"),
            "spec",
            &mut got,
        );
        let dropped: Vec<_> = want.difference(&got).collect();
        assert!(
            dropped.is_empty(),
            "{}: unknown fields {dropped:?}",
            path.display()
        );
        program_operator::render::render(&ps.spec, Vec::new(), &[])
            .unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        if let Some(p) = &ps.spec.program_scheduling {
            // An example that says it is calibrated gives both cost models.
            if text.contains("calibrate") {
                assert!(
                    p.prefill_cost_model.is_some() && p.decode_throughput_model.is_some(),
                    "{}: calibrated example without both cost models",
                    path.display()
                );
            }
        }
        seen += 1;
    }
    assert!(seen >= 2, "found {seen} examples");
}
