//! Whole-process accounting: C `malloc` is counted with Rust's allocations, the report's heap peak
//! is the process heap's, at the step where it was reached, and survives `reset_peak()`; a budget
//! below it fails `memsight check`.

use memsight_e2e::{run_memsight, scratch};
use std::collections::HashMap;
use std::process::Command;

/// Runs whole_heap_job (its report to `report`) with `env`, within a minute (a hang, not a speed:
/// ~100x what it takes); the `key=value` figures it prints.
fn run_job(report: &std::path::Path, env: &[(&str, &str)]) -> HashMap<String, i64> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_whole_heap_job"))
        .arg(report)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the job hung at start-up with {env:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

/// The job's live heap while it held its 100 MiB of Rust and 200 MiB of C: 300 MiB over its
/// baseline, within 1%.
fn assert_held_300_mib(v: &HashMap<String, i64>) {
    let mib300 = 300i64 << 20;
    let held = v["live_holding"] - v["baseline_live"];
    assert!(
        (held - mib300).abs() < mib300 / 100,
        "live while holding: {held} ({v:?})"
    );
}

#[test]
fn rust_and_c_heap_peak_together_and_gate_the_budget() {
    let dir = scratch("whole-heap");
    let report = dir.join("report.json");
    let v = run_job(&report, &[]);
    assert_held_300_mib(&v);
    let mib300 = 300i64 << 20;
    assert!(
        (v["final_live"] - v["baseline_live"]).abs() < 1 << 20,
        "not back to baseline: {v:?}"
    );

    let r = memsight::Report::load(&report).unwrap();
    let peak = r.peaks.heap_peak_bytes as i64 - v["baseline_live"];
    assert!((peak - mib300).abs() < mib300 / 100, "report peak {peak}");
    assert_eq!(r.peaks.heap_peak_step, Some(3));
    assert_eq!(r.peaks.heap_peak_phase.as_deref(), Some("hold"));

    let check = |budget: &str| {
        run_memsight(
            &[
                "check".as_ref(),
                report.as_os_str(),
                "--max-host-peak".as_ref(),
                budget.as_ref(),
            ],
            None,
        )
    };
    let fail = check("280MiB");
    assert_eq!(fail.code, 1, "{}", fail.out);
    assert!(fail.out.contains("exceeds budget"), "{}", fail.out);
    assert_eq!(check("320MiB").code, 0);
}

#[test]
fn a_job_starts_and_counts_its_heap_with_jemallocs_background_thread() {
    // MALLOC_CONF=background_thread:true made jemalloc create its background thread holding a
    // lock that memsight's first counter registration (nested in that thread's creation) took
    // again: every program linking memsight hung at start-up.
    let dir = scratch("whole-heap-bg-thread");
    let report = dir.join("report.json");
    let v = run_job(&report, &[("MALLOC_CONF", "background_thread:true")]);
    assert_held_300_mib(&v);
    // The configuration reached jemalloc: its background thread ran (else this tests nothing).
    assert!(
        v["background_threads"] >= 1,
        "no jemalloc background thread: {v:?}"
    );
}
