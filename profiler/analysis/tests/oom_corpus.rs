//! Every case of the OOM corpus parses to exactly its expected kind and facts. The corpus is a copy
//! of `shared/oom-corpus` (fixtures/oom-corpus/cases.jsonl) plus `traps.jsonl`, cases written to the
//! corpus README's rules for traps it names, and `wild.jsonl`, real messages collected for issue 22
//! (each with its source) that may also name the expected `verdict`, `workload` and first remedy
//! (`first_remedy`); `MEMSIGHT_OOM_CORPUS=path.jsonl` checks another file of the same format too.

use memsight_analysis::diagnose::{diagnose, find_ooms, Context};
use serde_json::Value;
use std::path::PathBuf;

fn corpus_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom-corpus");
    // The shared corpus, and memsight's own cases for the traps its README describes.
    let mut files = vec![
        dir.join("cases.jsonl"),
        dir.join("traps.jsonl"),
        dir.join("wild.jsonl"),
    ];
    if let Some(extra) = std::env::var_os("MEMSIGHT_OOM_CORPUS") {
        files.push(PathBuf::from(extra));
    }
    files
}

#[test]
fn every_corpus_case_parses_to_its_expected_facts() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in corpus_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).unwrap();
            let id = case["id"].as_str().unwrap();
            let found = find_ooms(case["text"].as_str().unwrap());
            checked += 1;
            if found.len() != 1 {
                failures.push(format!(
                    "{id}: {} findings, expected 1: {found:?}",
                    found.len()
                ));
                continue;
            }
            let kind = serde_json::to_value(found[0].kind).unwrap();
            // Through text so 2^64-sized facts compare the way the expected JSON parses.
            let facts: Value =
                serde_json::from_str(&serde_json::to_string(&found[0].facts).unwrap()).unwrap();
            if kind != case["kind"] {
                failures.push(format!("{id}: kind {kind}, expected {}", case["kind"]));
            }
            if facts != case["expected"] {
                failures.push(format!(
                    "{id}:\n  got      {facts}\n  expected {}",
                    case["expected"]
                ));
            }
        }
    }
    assert!(checked >= 57 + 40, "only {checked} cases read");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn several_messages_in_one_log_are_found_in_order() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom-corpus/cases.jsonl"),
    )
    .unwrap();
    let cases: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // A log of every case's text, each behind a timestamped prefix, separated by noise lines.
    let mut log = String::new();
    for (i, c) in cases.iter().enumerate() {
        log.push_str(&format!(
            "2026-11-21 10:00:{i:02} step {i} loss 2.31\n[rank0]: "
        ));
        log.push_str(c["text"].as_str().unwrap());
        log.push_str("\nTraceback (most recent call last):\n  File \"train.py\", line 1\n\n");
    }
    let found = find_ooms(&log);
    let kinds: Vec<Value> = found
        .iter()
        .map(|f| serde_json::to_value(f.kind).unwrap())
        .collect();
    let expected: Vec<Value> = cases.iter().map(|c| c["kind"].clone()).collect();
    assert_eq!(kinds, expected);
}

/// Every case that names a verdict, workload or first remedy gets them from `diagnose`, which
/// sees only the case's text.
#[test]
fn cases_with_a_verdict_get_it_and_remedies_for_their_workload() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in corpus_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).unwrap();
            if case.get("verdict").is_none() && case.get("first_remedy").is_none() {
                continue;
            }
            checked += 1;
            let id = case["id"].as_str().unwrap();
            let found = diagnose(case["text"].as_str().unwrap(), &Context::default());
            let Some(d) = found.first() else {
                failures.push(format!("{id}: nothing found"));
                continue;
            };
            let d = serde_json::to_value(d).unwrap();
            for (field, got) in [
                ("verdict", &d["verdict"]),
                ("workload", &d["workload"]),
                ("first_remedy", &d["remedies"][0]["id"]),
            ] {
                if let Some(want) = case.get(field) {
                    if got != want {
                        failures.push(format!(
                            "{id}: {field} {got}, expected {want} ({})",
                            d["evidence"]
                        ));
                    }
                }
            }
        }
    }
    assert!(checked >= 30, "only {checked} cases with verdicts read");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A TensorFlow OOM states its size through its shape and dtype: the verdict says it.
#[test]
fn a_tensorflow_shape_states_the_request_size() {
    // github.com/miemie2013/Keras-YOLOv4/issues/39: 8 × 64 × 256 × 256 floats = 128 MiB.
    let text = "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[8,64,256,256] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc";
    let d = &diagnose(text, &Context::default())[0];
    let v = serde_json::to_value(d).unwrap();
    assert_eq!(v["verdict"], "capacity");
    assert!(
        v["evidence"]
            .as_str()
            .unwrap()
            .contains("128.00 MiB tensor"),
        "{}",
        v["evidence"]
    );
}

/// Every corpus message hard-wrapped at a terminal's width keeps each fact it still yields equal
/// to the expected one: a number or word broken by the wrap is rejoined or its fact left out,
/// never a wrong fact.
#[test]
fn terminal_wrapped_messages_never_give_a_wrong_fact() {
    let mut wrong = Vec::new();
    for file in corpus_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Value = serde_json::from_str(line).unwrap();
            let id = case["id"].as_str().unwrap();
            for width in [80, 100, 120, 160] {
                let wrapped: String = case["text"]
                    .as_str()
                    .unwrap()
                    .split('\n')
                    .map(|l| {
                        let chars: Vec<char> = l.chars().collect();
                        chars
                            .chunks(width)
                            .map(|c| c.iter().collect::<String>())
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                for f in find_ooms(&wrapped) {
                    let facts: Value =
                        serde_json::from_str(&serde_json::to_string(&f.facts).unwrap()).unwrap();
                    for (name, v) in facts.as_object().unwrap() {
                        if case["expected"].get(name).is_some_and(|want| want != v) {
                            wrong.push(format!(
                                "{id} at {width}: {name} {v}, expected {}",
                                case["expected"][name]
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong facts:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
