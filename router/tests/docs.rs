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
    let cfg = program_router::config::flags::parse_config(json.as_bytes()).expect("example parses");
    cfg.validate().expect("example validates");
    assert_eq!(cfg.targets().len(), 4);
}

/// Table rows of docs/configuration.md: (field path, default cell, flag cell or "").
fn table_rows() -> Vec<(String, String, String)> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs");
    let mut rows = Vec::new();
    let mut flag_column = false;
    for line in doc.lines() {
        if line.starts_with("| field |") {
            flag_column = line.contains("| flag |");
            continue;
        }
        if !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let field = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_string();
        let default = cells.get(1).copied().unwrap_or_default().to_string();
        let flag = if flag_column {
            cells.get(2).copied().unwrap_or_default().to_string()
        } else {
            String::new()
        };
        rows.push((field, default, flag));
    }
    rows
}

/// The value at a dotted path (`a.b`) of `v`; `None` when a step is missing.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

#[test]
fn documented_defaults_are_the_real_defaults() {
    // Sections that are off by default (`null`) are compared against their own defaults.
    let mut defaults = serde_json::to_value(RouterConfig::default()).expect("defaults");
    defaults["program_scheduling"] =
        serde_json::to_value(program_router::config::ProgramSchedulingConfig::default())
            .expect("program defaults");
    defaults["fairness"] = serde_json::to_value(program_router::config::FairnessConfig::default())
        .expect("fairness defaults");
    defaults["fairness"]["default_rate_limit"] =
        serde_json::to_value(program_router::config::fairness::RateLimitConfig::default())
            .expect("quota defaults");
    defaults["peers"] = serde_json::to_value(program_router::config::peers::PeersConfig::default())
        .expect("peers defaults");
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (field, cell, _) in table_rows() {
        // Only cells that open with a literal state a default; "required", "none", prose and
        // per-item fields (`workers[].url`) are not compared.
        let Some(literal) = cell.strip_prefix('`').and_then(|s| s.split('`').next()) else {
            continue;
        };
        if field.contains("[]")
            || [
                "program_scheduling",
                "fairness",
                "fairness.default_rate_limit",
                "peers",
            ]
            .contains(&&*field)
        {
            continue;
        }
        let Some(real) = at(&defaults, &field) else {
            wrong.push(format!("{field}: no such default"));
            continue;
        };
        let stated: Value =
            serde_json::from_str(literal).unwrap_or_else(|_| Value::String(literal.to_string()));
        let same = match (&stated, real) {
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            _ => &stated == real,
        };
        if same {
            checked += 1;
        } else {
            wrong.push(format!("{field}: documented {stated}, real {real}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md defaults: {wrong:#?}"
    );
    assert!(checked > 50, "only {checked} defaults compared");
}

#[test]
fn every_flag_is_in_the_table_and_has_help() {
    let cmd = program_router::cli::command();
    let real: BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .filter(|l| !["--help", "--version", "--config"].contains(&l.as_str()))
        .collect();
    let mut documented = BTreeSet::new();
    for (_, _, flag) in table_rows() {
        for part in flag.split('`') {
            if let Some(name) = part
                .split_whitespace()
                .next()
                .filter(|n| n.starts_with("--"))
            {
                documented.insert(name.to_string());
            }
        }
    }
    let missing: Vec<_> = real.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&real).collect();
    assert!(
        missing.is_empty(),
        "flags missing from the table: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "documented flags the CLI lacks: {unknown:?}"
    );
    let silent: Vec<_> = cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some_and(|l| l != "help" && l != "version"))
        .filter(|a| a.get_help().is_none_or(|h| h.to_string().trim().is_empty()))
        .map(|a| a.get_id().to_string())
        .collect();
    assert!(silent.is_empty(), "flags without --help text: {silent:?}");
    // A help text that names its config field names one whose row lists this very flag, and
    // shows the real default.
    let rows = table_rows();
    let mut tagged = 0;
    for a in cmd.get_arguments() {
        let (Some(long), Some(help)) = (a.get_long(), a.get_help().map(|h| h.to_string())) else {
            continue;
        };
        let Some(path) = help
            .split_once("[config: ")
            .and_then(|(_, t)| t.split([';', ']']).next())
        else {
            continue;
        };
        let row = rows.iter().find(|(f, _, _)| f == path);
        assert!(
            row.is_some_and(|(_, _, flag)| flag.contains(&format!("`--{long}"))),
            "--{long} says it sets {path}, but that row of docs/configuration.md does not list it"
        );
        tagged += 1;
    }
    assert!(tagged >= 35, "only {tagged} flags name their config field");
    let help = |long: &str| {
        cmd.get_arguments()
            .find(|a| a.get_long() == Some(long))
            .and_then(|a| a.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default()
    };
    assert!(
        help("request-timeout-secs")
            .contains("[config: limits.request_timeout_secs; default: 1800]"),
        "{}",
        help("request-timeout-secs")
    );
    assert!(
        help("policy").contains("default: cache_aware]"),
        "{}",
        help("policy")
    );
    assert!(
        help("api-key").ends_with("[config: api_key]"),
        "{}",
        help("api-key")
    );
}
