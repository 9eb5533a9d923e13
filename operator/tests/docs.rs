//! docs/operator.md documents exactly the fields of the generated CRD's schema.

use std::collections::BTreeSet;

use kube::CustomResourceExt;
use program_operator::crd::ProgramScheduling;
use serde_json::Value;

/// Kubernetes types documented as a whole (their inner fields are Kubernetes' own).
const OPAQUE: &[&str] = &[
    "spec.workerSelector",
    "spec.router.resources",
    "spec.apiKeySecretRef",
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
    program_operator::render::render(&ps.spec, Vec::new()).expect("renders");
}
