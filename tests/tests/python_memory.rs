//! What `memsight run` adds to a Python job's report from the `memsight` package (issue 36):
//! Python's small-object arenas (pymalloc), which the heap count leaves out, checked against a job
//! holding a known number of small objects; and `--device-history`, which reaches the job's
//! `memsight.torch` (on a machine without a GPU, the report says why there are no device lines).
//! Needs the torch virtual environment and the preloaded library (`make build`); each test skips,
//! saying why, without them.

use memsight_e2e::{memsight_bin, run_job, scratch, torch_python};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn ready() -> Option<PathBuf> {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return None;
    };
    memsight_e2e::preload_built().then_some(py)
}

/// `object()` is 16 bytes: one block of pymalloc's smallest class each, 16 MB in all.
const OBJECTS: u64 = 1_000_000;

#[test]
fn small_objects_are_counted_in_python_arenas_beside_the_heap() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-arenas");
    let code = format!(
        "held = [None] * {OBJECTS}\nfor i in range(len(held)):\n    held[i] = object()\n\
         print('held', len(held))\n"
    );
    let r = run_job(&dir, &[], &[py.to_str().unwrap(), "-c", &code], &[]);
    assert_eq!(r.code, 0, "{}", r.out);
    let report: Value = serde_json::from_str(&r.report).unwrap();
    let a = &report["python_arenas"];
    let blocks = a["allocated_blocks_bytes"]
        .as_u64()
        .expect("python_arenas in the report");
    let peak = a["peak_bytes"].as_u64().unwrap();
    // The objects, plus the interpreter's own small objects (a few MiB at start-up).
    assert!(
        (16 * OBJECTS..16 * OBJECTS + (8 << 20)).contains(&blocks),
        "{a}"
    );
    assert!(peak >= blocks, "{a}");
    assert_eq!(
        peak,
        a["peak_arenas"].as_u64().unwrap() * a["arena_size_bytes"].as_u64().unwrap()
    );
    // The summary states them beside the heap, whose count does not hold them.
    let report_path = dir.join("report.json");
    std::fs::write(&report_path, &r.report).unwrap();
    let out = Command::new(memsight_bin())
        .arg("summary")
        .arg(&report_path)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("| Python small objects |"), "{md}");
    assert!(md.contains("not in the process heap above"), "{md}");
}

#[test]
fn device_history_reaches_the_job_and_says_why_a_cpu_torch_has_no_lines() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-device-history");
    let job = [
        py.to_str().unwrap(),
        "-c",
        "import torch; print(torch.__version__)",
    ];
    let history = |report: &Value| -> Option<Value> {
        report["sources"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "torch-cuda history")
            .cloned()
    };
    let r = run_job(&dir, &["--device-history"], &job, &[]);
    assert_eq!(r.code, 0, "{}", r.out);
    let report: Value = serde_json::from_str(&r.report).unwrap();
    let cuda_absent = report["sources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["name"] == "torch-cuda" && s["available"] == false);
    if cuda_absent {
        let h = history(&report).expect("the history's source status");
        assert_eq!(h["available"], false, "{h}");
        assert!(
            h["detail"]
                .as_str()
                .unwrap()
                .contains("torch.cuda.is_available() is False"),
            "{h}"
        );
    }
    // Without the flag the history is not asked for.
    let r = run_job(&dir, &[], &job, &[]);
    assert_eq!(r.code, 0, "{}", r.out);
    let report: Value = serde_json::from_str(&r.report).unwrap();
    assert!(history(&report).is_none(), "{}", report["sources"]);
}
