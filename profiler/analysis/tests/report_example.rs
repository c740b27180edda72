//! The documented example report stays in sync with the report type: it parses, re-serializes to
//! the same JSON (so it holds no field the type does not know), every key in it is documented in docs/report.md,
//! and the example budget file parses and passes on it.

use memsight_analysis::budget::Budgets;
use memsight_format::Report;
use std::path::PathBuf;

fn docs(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
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

#[test]
fn every_heap_profile_field_is_documented() {
    use memsight_format::heap_profile::{
        DumpKind, DumpRecord, Growth, HeapProfile, ProfileView, Site, SiteGrowth, SourceSite,
    };
    let at = SourceSite {
        function: "app::f".into(),
        file: Some("src/main.rs".into()),
        line: Some(1),
    };
    let hp = HeapProfile {
        sample_bytes: 1,
        at_peak: Some(ProfileView {
            kind: DumpKind::Peak,
            t_ms: 1,
            step: 1,
            heap_bytes: 1,
            profiled_bytes: 1,
            top_sites: vec![Site {
                at: at.clone(),
                bytes: 1,
                share: 1.0,
            }],
            heap_file: "x".into(),
            pprof_file: Some("x".into()),
            flamegraph_file: Some("x".into()),
        }),
        growth: Some(Growth {
            from_step: 1,
            to_step: 2,
            sites: vec![SiteGrowth {
                at,
                from_bytes: 1,
                to_bytes: 2,
                grew_bytes: 1,
            }],
            flamegraph_file: Some("x".into()),
        }),
        dumps: vec![DumpRecord {
            kind: DumpKind::Step,
            path: "x".into(),
            t_ms: 1,
            step: 1,
            heap_bytes: 1,
        }],
        notes: vec!["x".into()],
    };
    let mut all = Vec::new();
    keys(&serde_json::to_value(&hp).unwrap(), &mut all);
    let md = std::fs::read_to_string(docs("report.md")).unwrap();
    let undocumented: Vec<_> = all
        .iter()
        .filter(|k| !md.contains(&format!("`{k}`")))
        .collect();
    assert!(undocumented.is_empty(), "{undocumented:?}");
}

#[test]
fn a_heap_peak_outside_every_step_says_so() {
    // A heap that peaks outside every step (while the model is set up, say).
    let text = std::fs::read(docs("report.example.json")).unwrap();
    let mut report = Report::from_slice(&text).unwrap();
    report.peaks.heap_peak_step = None;
    report.peaks.heap_peak_phase = None;
    let over = Budgets::parse("version = 1\nmax_host_peak = \"1MiB\"\n").unwrap();
    let lines = over.check(&report);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].ends_with("(peaked outside every step and phase)"),
        "{lines:?}"
    );
    let md = memsight_analysis::summary::markdown(&report);
    assert!(
        md.contains("| process heap | 163.67 MiB | outside every step and phase |"),
        "{md}"
    );

    report.peaks.heap_peak_step = Some(7);
    report.peaks.heap_peak_phase = Some("train/forward".into());
    assert!(over.check(&report)[0].ends_with("(peaked at step 7, phase train/forward)"));
    assert!(memsight_analysis::summary::markdown(&report)
        .contains("| 163.67 MiB | step 7, phase `train/forward` |"));
}
