//! The chart's README documents exactly the keys of values.schema.json, each with the schema's
//! description and the default values.yaml gives it; every key of values.yaml has a schema entry
//! with a description. A failure prints the table as it should read.

use serde_json::Value;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/program-scheduling");

/// (key, description) of every documented key: objects with `properties` are documented through
/// their keys, everything else (lists, maps, free-form objects) as a whole.
fn keys(schema: &Value, prefix: &str, out: &mut Vec<(String, String)>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (k, v) in props {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        let description = v["description"].as_str().unwrap_or_default().to_string();
        assert!(
            !description.is_empty(),
            "values.schema.json: {key} has no description"
        );
        if v.get("properties").is_some() {
            keys(v, &key, out);
        } else {
            out.push((key, description));
        }
    }
}

/// The chart's values.schema.json and values.yaml.
fn schema_and_values() -> (Value, Value) {
    let schema = serde_json::from_str(
        &std::fs::read_to_string(format!("{CHART}/values.schema.json")).expect("schema"),
    )
    .expect("json");
    let values = serde_yaml::from_str(
        &std::fs::read_to_string(format!("{CHART}/values.yaml")).expect("values"),
    )
    .expect("yaml");
    (schema, values)
}

fn at<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(v, |v, k| v.get(k))
}

#[test]
fn the_chart_readme_documents_every_value_with_its_schema_description_and_default() {
    let (schema, values) = schema_and_values();
    let mut documented = Vec::new();
    keys(&schema, "", &mut documented);
    assert!(documented.len() > 40, "{} keys", documented.len());
    let mut want = vec![
        "| key | default | description |".to_string(),
        "|---|---|---|".to_string(),
    ];
    for (key, description) in &documented {
        let default = at(&values, key)
            .unwrap_or_else(|| panic!("values.yaml has no {key}"))
            .to_string();
        want.push(format!("| `{key}` | `{default}` | {description} |"));
    }
    let readme = std::fs::read_to_string(format!("{CHART}/README.md")).expect("chart README");
    let have: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| key | default |"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(
        have == want.iter().map(String::as_str).collect::<Vec<_>>(),
        "charts/program-scheduling/README.md's values table should read:\n{}",
        want.join("\n")
    );
}

/// Every key values.yaml sets is a schema key (the schema forbids others; this keeps the two
/// files from drifting where the schema is permissive).
#[test]
fn every_value_in_values_yaml_is_in_the_schema() {
    let (schema, values) = schema_and_values();
    fn walk(values: &Value, schema: &Value, path: &str) {
        let (Some(vals), Some(props)) = (
            values.as_object(),
            schema.get("properties").and_then(Value::as_object),
        ) else {
            return;
        };
        for (k, v) in vals {
            let p = format!("{path}{k}");
            let s = props
                .get(k)
                .unwrap_or_else(|| panic!("values.yaml sets {p}, which values.schema.json lacks"));
            walk(v, s, &format!("{p}."));
        }
    }
    walk(&values, &schema, "");
}
