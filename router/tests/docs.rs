//! docs/configuration.md documents exactly the fields of the real configuration schema.

use std::collections::BTreeSet;

use program_router::config::RouterConfig;
use serde_json::Value;

/// Dotted paths of every property in the schema (`workers[].url` for array items).
fn paths(schema: &Value, root: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let resolve = |v: &Value| -> Value {
        if let Some(r) = v.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().unwrap_or_default();
            return root["$defs"][name].clone();
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(items) = v.get(key).and_then(Value::as_array) {
                for i in items {
                    if i.get("$ref").is_some() || i.get("properties").is_some() {
                        return i.clone();
                    }
                }
            }
        }
        v.clone()
    };
    let schema = resolve(schema);
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.insert(path.clone());
            let v = resolve(v);
            if let Some(items) = v.get("items") {
                paths(items, root, &format!("{path}[]"), out);
            } else {
                paths(&v, root, &path, out);
            }
        }
    }
}

#[test]
fn every_schema_field_is_documented_and_nothing_else() {
    let schema = RouterConfig::schema();
    let mut want = BTreeSet::new();
    paths(&schema, &schema, "", &mut want);
    // Object-valued parents are documented through their fields.
    let parents: Vec<String> = [
        "policy",
        "limits",
        "health",
        "retry",
        "circuit_breaker",
        "observation",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(
        [
            "program_scheduling.prefill_cost_model",
            "program_scheduling.decode_throughput_model",
        ]
        .map(String::from),
    )
    .collect();
    want.retain(|p| !parents.contains(p));
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs");
    let documented: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    let missing: Vec<_> = want.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&want).collect();
    assert!(
        missing.is_empty(),
        "fields missing from docs/configuration.md: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented fields that the schema lacks: {unknown:?}"
    );
    assert!(
        want.len() > 60,
        "schema walk found only {} fields",
        want.len()
    );
}

#[test]
fn the_documented_example_is_valid() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs");
    let json = doc
        .split("```json")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("example block");
    let cfg = program_router::config::cli::parse_config(json.as_bytes()).expect("example parses");
    cfg.validate().expect("example validates");
    assert_eq!(cfg.targets().len(), 4);
}
