//! Programs that do not link memsight, measured through the preloaded library under `memsight run`
//! whatever their build: a non-PIE executable that takes `malloc`'s address (Ubuntu's
//! `/usr/bin/python3.12` is one) gets its session and its exact heap. Needs a C compiler and the
//! preloaded library; skips, saying why, without them.

use memsight_e2e::{preload_built, run_memsight, scratch};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

#[test]
fn a_non_pie_program_that_takes_mallocs_address_gets_its_session_and_exact_heap() {
    if !preload_built() {
        return;
    }
    let dir = scratch("non-pie");
    let program = dir.join("takes_malloc_address");
    let source =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload_programs/takes_malloc_address.c");
    let built = Command::new("cc")
        .args(["-O1", "-no-pie", "-fno-pie", "-o"])
        .arg(&program)
        .arg(&source)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        println!("SKIP: no C compiler that builds a non-PIE executable (cc -no-pie)");
        return;
    }
    let report = dir.join("r.json");
    let r = run_memsight(
        &[
            "run".as_ref(),
            "--report".as_ref(),
            report.as_os_str(),
            "--".as_ref(),
            program.as_os_str(),
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    // Without a session the report has only what the sidecar reads from outside: no heap.
    let heap = report["peaks"]["heap_peak_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("the job started no session: {}", report["sources"]));
    assert!(
        (64 * MIB..66 * MIB).contains(&heap),
        "heap peak {heap} B for a program holding 64 MiB"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
