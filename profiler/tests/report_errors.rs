//! Bad report files give one clear, exact message each — never a panic.

use memsight::Report;
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
