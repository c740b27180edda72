//! Allocation sites of a Python job under `memsight run`, by Python line: the preloaded library
//! samples the job's allocations (over glibc's `malloc`) with their Python frames, and the report,
//! `memsight heap top` and `memsight heap flamegraph` name the lines — checked against what the job
//! holds by torch's and Python's own counts in the same run. Needs the torch venv and the preloaded
//! library (`make build`); skips, saying why, without them.

use memsight_e2e::{run_job, run_memsight, scratch, torch_python};
use serde_json::Value;
use std::path::Path;

const MIB: f64 = (1u64 << 20) as f64;

#[test]
fn tensors_and_bytearrays_are_named_by_their_python_lines() {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return;
    };
    if !memsight_e2e::preload_built() {
        return;
    }
    let dir = scratch("py-two-sites");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python_jobs/two_sites.py");
    let truth_file = dir.join("truth.json");
    let run = run_job(
        &dir,
        &[],
        &[py.as_os_str(), script.as_os_str(), truth_file.as_os_str()],
        &[],
    );
    assert_eq!(run.code, 0, "{}", run.out);
    let truth: Value =
        serde_json::from_str(&std::fs::read_to_string(&truth_file).unwrap()).unwrap();
    let report: Value = serde_json::from_str(&run.report).unwrap();
    let sites = report["heap_profile"]["at_peak"]["top_sites"]
        .as_array()
        .unwrap_or_else(|| panic!("no sites at the peak: {}", report["heap_profile"]))
        .clone();
    let expected = [
        (
            "hold_tensors",
            truth["tensor_line"].as_u64().unwrap(),
            truth["tensor_bytes"].as_f64().unwrap(),
        ),
        (
            "hold_bytes",
            truth["bytes_line"].as_u64().unwrap(),
            truth["bytearray_bytes"].as_f64().unwrap(),
        ),
    ];
    for (rank, (function, line, bytes)) in expected.iter().enumerate() {
        let site = &sites[rank];
        let at = format!("{}:{} {}", site["file"], site["line"], site["function"]);
        assert!(
            site["file"]
                .as_str()
                .unwrap_or("")
                .ends_with("two_sites.py")
                && site["line"].as_u64() == Some(*line)
                && site["function"].as_str().unwrap_or("").contains(function),
            "site {} is {at}, expected two_sites.py:{line} {function}; sites: {sites:#?}",
            rank + 1
        );
        let got = site["bytes"].as_f64().unwrap();
        let off = (got - bytes) / bytes;
        println!(
            "{at}: {:.1} MiB, truth {:.1} MiB ({:+.1}%)",
            got / MIB,
            bytes / MIB,
            off * 100.0
        );
        assert!(
            off.abs() <= 0.10,
            "{at}: {:+.1}% off the truth",
            off * 100.0
        );
    }

    // The flamegraph draws the Python frames, one box per line.
    let heap = dir.join(
        report["heap_profile"]["at_peak"]["heap_file"]
            .as_str()
            .unwrap(),
    );
    let svg = dir.join("peak.svg");
    let fg = run_memsight(
        &[
            "heap".as_ref(),
            "flamegraph".as_ref(),
            "-o".as_ref(),
            svg.as_os_str(),
            heap.as_os_str(),
        ],
        None,
    );
    assert_eq!(fg.code, 0, "{}{}", fg.out, fg.err);
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let tensor_box = format!("hold_tensors (two_sites.py:{})", expected[0].1);
    assert!(
        drawn.contains(&tensor_box),
        "no {tensor_box:?} in the flamegraph"
    );
    assert!(
        drawn.contains("&lt;module&gt; (two_sites.py:"),
        "no module frame in the flamegraph"
    );

    // `memsight heap top … | head`: a reader that goes away ends the command quietly (SIGPIPE, as
    // Unix tools do), never a panic.
    let mut top = std::process::Command::new(memsight_e2e::memsight_bin())
        .args(["heap", "top"])
        .arg(&heap)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(top.stdout.take()); // the reader is gone before the first line
    let done = top.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        done.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {err}",
        done.status
    );
}
