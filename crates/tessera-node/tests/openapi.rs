//! The OpenAPI document is the API: it lists exactly the routes the API
//! serves with the roles they need, every schema it refers to is in it, and
//! the CLI and the dashboard call no path it does not list (read from their
//! sources).

use std::collections::BTreeSet;
use tessera_node::api_access::ROUTES;
use tessera_node::openapi::{document, OPERATIONS};

#[test]
fn the_document_lists_exactly_the_api_s_routes_with_their_roles() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = OPERATIONS
        .iter()
        .filter(|o| !o.public)
        .map(|o| (o.method.to_string(), o.path.to_string()))
        .collect();
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed);
    for (method, path, role) in ROUTES {
        let operation = &doc["paths"][path][method.to_ascii_lowercase()];
        assert_eq!(
            operation["x-tessera-role"],
            role.as_str(),
            "{method} {path}: {operation}"
        );
        assert!(
            operation["responses"]["default"].is_object(),
            "{method} {path} documents its errors"
        );
    }
    for public in ["/v1/openapi.json", "/ui/"] {
        assert_eq!(
            doc["paths"][public]["get"]["security"],
            serde_json::json!([])
        );
    }
}

/// Every `$ref` in `value`.
fn refs(value: &serde_json::Value, into: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if k == "$ref" {
                    into.push(v.as_str().unwrap().to_string());
                } else {
                    refs(v, into);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, into)),
        _ => {}
    }
}

#[test]
fn every_schema_the_document_refers_to_is_in_it_with_its_description() {
    let doc = document();
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 50, "{all:?}");
    for r in &all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("a component reference: {r}"));
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "{r} is defined"
        );
    }
    // The types' doc comments are the schemas' descriptions.
    let volume = &doc["components"]["schemas"]["VolumeView"];
    assert_eq!(
        volume["description"],
        "One volume as `volume list` shows it."
    );
    assert_eq!(
        volume["properties"]["size_bytes"]["description"],
        "Size in bytes."
    );
    // Unknown fields are refused where the API refuses them.
    assert_eq!(
        doc["components"]["schemas"]["CreateVolume"]["additionalProperties"],
        false
    );
}

/// Whether `path` (with `{..}` for a segment made at run time) is one the
/// document lists.
fn listed(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    OPERATIONS.iter().any(|o| {
        let pattern: Vec<&str> = o.path.split('/').collect();
        pattern.len() == segments.len()
            && pattern.iter().zip(&segments).all(|(p, s)| {
                p == s || (p.starts_with('{') && (s.starts_with('{') || !s.is_empty()))
            })
    })
}

/// The API paths a source file names: string literals starting with
/// `/v1/`, their query cut off, `{...}` placeholders kept as segments, and
/// a literal ending in `/` taken as followed by one more segment (the
/// dashboard adds a name to it).
fn paths_in(source: &str, quote: char) -> Vec<String> {
    let mut found = Vec::new();
    for (i, _) in source.match_indices(&format!("{quote}/v1/")) {
        let rest = &source[i + 1..];
        let Some(end) = rest.find(quote) else {
            continue;
        };
        let mut path = rest[..end].split('?').next().unwrap().to_string();
        if path.ends_with('/') {
            path.push_str("{name}");
        }
        // format!("/v1/volumes/{}{query}"): the query part is not a segment.
        path = path.replace("{}{query}", "{}");
        found.push(path);
    }
    found
}

#[test]
fn the_cli_and_the_dashboard_call_only_listed_paths() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let cli = root.join("tessera").join("src");
    for entry in std::fs::read_dir(&cli).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        for p in paths_in(&source, '"') {
            assert!(
                listed(&p),
                "{} calls {p}, not in the document",
                path.display()
            );
            checked += 1;
        }
    }
    let app = root
        .join("tessera-node")
        .join("src")
        .join("dashboard")
        .join("app.js");
    let source = std::fs::read_to_string(&app).unwrap();
    let dashboard = paths_in(&source, '\'');
    assert!(dashboard.len() >= 5, "{dashboard:?}");
    for p in dashboard {
        assert!(listed(&p), "the dashboard calls {p}, not in the document");
        checked += 1;
    }
    assert!(checked > 40, "only {checked} paths found");
    assert!(!listed("/v1/nothing"));
}
