//! The documented example report stays in sync with the report type: it parses (unknown fields
//! are rejected), re-serializes to the same JSON, every key in it is documented in docs/report.md,
//! and the example budget file parses and passes on it.

use memsight::report::budget::Budgets;
use memsight::Report;
use std::path::PathBuf;

fn docs(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name)
}

fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

#[test]
fn example_report_matches_the_type_and_the_docs() {
    let text = std::fs::read(docs("report.example.json")).unwrap();
    let report =
        Report::from_slice(&text).unwrap_or_else(|e| panic!("docs/report.example.json: {e}"));
    let original: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        serde_json::to_value(&report).unwrap(),
        original,
        "example and type disagree: regenerate the example"
    );

    let md = std::fs::read_to_string(docs("report.md")).unwrap();
    let mut all = Vec::new();
    keys(&original, &mut all);
    all.sort();
    all.dedup();
    let undocumented: Vec<_> = all
        .iter()
        .filter(|k| !md.contains(&format!("`{k}`")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "fields missing from docs/report.md: {undocumented:?}"
    );

    let budgets = Budgets::load(&docs("budget.example.toml")).unwrap();
    assert_eq!(budgets.check(&report), Vec::<String>::new());
}
