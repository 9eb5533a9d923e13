//! docs/architecture.md matches the tree: every path it names exists, every module of its layer
//! table is a top-level module of the router, and every top-level module is in the table.

use std::collections::BTreeSet;
use std::path::Path;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the router crate sits in the repository")
}

fn doc() -> String {
    std::fs::read_to_string(repo().join("docs/architecture.md")).expect("docs/architecture.md")
}

/// Every `` `router/...` `` or `` `operator/...` `` path the document names (a `::item` suffix,
/// as in `server/mod.rs::handle`, is the item in that file).
fn named_paths(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("router/") || s.starts_with("operator/"))
        .map(|s| s.split("::").next().unwrap_or(s).to_string())
        .collect()
}

/// The router's top-level modules in the tree.
fn tree_modules() -> BTreeSet<String> {
    std::fs::read_dir(repo().join("router/src"))
        .expect("router/src")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let m = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            (m != "lib" && m != "main").then_some(m)
        })
        .collect()
}

/// `(module, path)` of each row `| <layer> | `module` | `path` | ... |`.
fn layer_rows(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 4 && cells[1].parse::<u32>().is_ok()).then(|| {
                (
                    cells[2].trim_matches('`').into(),
                    cells[3].trim_matches('`').into(),
                )
            })
        })
        .collect()
}

#[test]
fn every_path_named_exists() {
    let doc = doc();
    let paths = named_paths(&doc);
    assert!(paths.len() > 30, "the document names the tree: {paths:?}");
    let missing: Vec<&String> = paths.iter().filter(|p| !repo().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn the_layer_table_names_every_router_module_once_at_its_path() {
    let rows = layer_rows(&doc());
    let named: BTreeSet<String> = rows.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(named.len(), rows.len(), "a module named twice: {rows:?}");
    assert_eq!(
        named,
        tree_modules(),
        "the layer table and router/src differ"
    );
    for (m, path) in &rows {
        let file = path.trim_end_matches('/');
        assert!(
            file == format!("router/src/{m}") || file == format!("router/src/{m}.rs"),
            "{m} is listed at {path}"
        );
    }
}

#[test]
fn the_module_graph_follows_the_layer_table() {
    // The same check CI runs (scripts/module-graph.py), so that `cargo test` alone catches a
    // dependency that points up.
    let out = std::process::Command::new("python3")
        .arg(repo().join("scripts/module-graph.py"))
        .output()
        .expect("python3 runs scripts/module-graph.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
