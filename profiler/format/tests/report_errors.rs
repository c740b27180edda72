//! Bad report files give one clear, exact message each — never a panic.

use memsight_format::Report;
use std::path::PathBuf;

fn err(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reports")
        .join(name);
    let e = Report::load(&p).unwrap_err().to_string();
    e.replace(&format!("{}/", p.parent().unwrap().display()), "")
}

#[test]
fn each_bad_input_has_its_message() {
    assert_eq!(
        err("truncated.json"),
        "truncated.json: truncated report: the JSON ends early at line 1, column 68 (was the writer killed?)"
    );
    assert_eq!(
        err("garbage.json"),
        "garbage.json: not a JSON report: expected value at line 1 column 1"
    );
    assert_eq!(
        err("future-version.json"),
        "future-version.json: report schema version 7 is not supported by this memsight (reads version 1); upgrade memsight"
    );
    assert_eq!(
        err("not-a-report.json"),
        "not-a-report.json: not a memsight report: no schema_version field"
    );
    assert_eq!(
        err("missing-fields.json"),
        "missing-fields.json: invalid report: missing field `job`"
    );
    assert!(
        err("does-not-exist.json").starts_with("does-not-exist.json: No such file or directory")
    );
}

fn example() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/report.example.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Within a schema version, a newer memsight may add fields anywhere: they are ignored.
#[test]
fn unknown_fields_from_a_newer_writer_are_accepted() {
    let mut v = example();
    v["written_by_the_future"] = serde_json::json!({"a": [1, 2]});
    v["peaks"]["new_peak_bytes"] = 7.into();
    v["timeline"][0]["heap"]["new_counter"] = true.into();
    let r = Report::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(r.peaks.heap_peak_bytes, v["peaks"]["heap_peak_bytes"]);
}

#[test]
fn a_type_error_names_the_field() {
    let mut v = example();
    v["peaks"]["heap_peak_bytes"] = "lots".into();
    let e = Report::from_slice(&serde_json::to_vec(&v).unwrap())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "report: invalid report: peaks.heap_peak_bytes: invalid type: string \"lots\", expected u64"
    );
    let mut v = example();
    v["timeline"][1]["step"] = (-1).into();
    let e = Report::from_slice(&serde_json::to_vec(&v).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid report: timeline[1].step: "), "{e}");
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(serde_json::to_vec(&example()).unwrap());
    assert!(Report::from_slice(&bytes).is_ok());
}
