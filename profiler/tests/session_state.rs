//! A session's state is its own and misuse is found early, never fatally (issue 38): a second
//! session in the process starts from no steps and no peak of the first; steps go through the
//! session too; a job that panics is reported `panicked`; a report path that cannot be written
//! fails `start()` and creates nothing; a bad environment value is a warning and a default.

use serde_json::Value;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

/// In-process sessions one at a time (one may run per process).
static ONE_SESSION: Mutex<()> = Mutex::new(());
/// Set in a child process of this test binary: which child case to run, and its directory.
const CHILD: &str = "MEMSIGHT_SESSION_STATE_CHILD";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn quiet_session(report: &Path) -> memsight::Session {
    memsight::Session::builder()
        .report_path(report)
        .quiet()
        .start()
        .unwrap()
}

#[test]
fn a_second_session_starts_from_no_steps_and_no_peak_of_the_first() {
    let _one = ONE_SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("second");
    let first = quiet_session(&dir.join("first.json"));
    for n in 0..150 {
        first.step(n);
    }
    let spike = black_box(vec![1u8; 64 << 20]);
    drop(spike);
    let r1 = first.finish().unwrap();
    assert!(r1.steps.len() >= 150, "{}", r1.steps.len());

    let second = quiet_session(&dir.join("second.json"));
    for n in 0..3 {
        second.step(n);
    }
    let r2 = second.finish().unwrap();
    let steps: Vec<u64> = r2.steps.iter().map(|s| s.step).collect();
    assert_eq!(steps, [0, 1, 2], "the second session's steps");
    assert!(
        r2.peaks.heap_peak_bytes < 32 << 20,
        "the second session's peak {} MiB is the first one's 64 MiB spike",
        r2.peaks.heap_peak_bytes >> 20
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_path_that_cannot_be_written_fails_start_and_creates_nothing() {
    let _one = ONE_SESSION.lock().unwrap_or_else(|p| p.into_inner());
    let dir = scratch("badpath");
    let missing = dir.join("no/such/dir");
    let err = memsight::Session::builder()
        .report_path(missing.join("report.json"))
        .quiet()
        .start()
        .err()
        .expect("start() accepted a report path in a missing directory");
    assert!(
        matches!(err, memsight::SessionError::ReportPath { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no/such/dir"), "{err}");
    assert!(!dir.join("no").exists(), "start() created directories");
    // A directory where the report should go.
    std::fs::create_dir(dir.join("taken.json")).unwrap();
    let err = memsight::Session::builder()
        .report_path(dir.join("taken.json"))
        .quiet()
        .start()
        .err()
        .expect("start() accepted a directory as the report path");
    assert!(err.to_string().contains("directory"), "{err}");
    // Nothing was left running: a good session starts.
    quiet_session(&dir.join("ok.json")).finish().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs this test binary's test `name` as a child with `CHILD` set to `case` and extra `env`;
/// returns its exit success and stderr.
fn child(name: &str, case: &str, env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .env("MEMSIGHT_RING", "off")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn a_job_that_panics_is_reported_panicked() {
    if let Ok(dir) = std::env::var(CHILD) {
        let session = quiet_session(&Path::new(&dir).join("r.json"));
        for n in 0..8 {
            session.step(n);
        }
        panic!("boom at step 7");
    }
    let dir = scratch("panicked");
    let (ok, err) = child(
        "a_job_that_panics_is_reported_panicked",
        dir.to_str().unwrap(),
        &[],
    );
    assert!(!ok, "the child did not panic: {err}");
    assert!(
        err.contains("boom at step 7"),
        "the previous hook still prints: {err}"
    );
    let v = read_json(&dir.join("r.json"));
    assert_eq!(v["job"]["exit"]["kind"], "panicked", "{}", v["job"]["exit"]);
    let why = v["job"]["exit"]["description"].as_str().unwrap_or("");
    assert!(why.contains("boom at step 7"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_environment_values_are_warnings_and_defaults() {
    if let Ok(dir) = std::env::var(CHILD) {
        let session = memsight::Session::builder()
            .report_path(Path::new(&dir).join("r.json"))
            .start()
            .expect("a bad environment value ended the job");
        let v = black_box(vec![1u8; 8 << 20]);
        drop(v);
        session.finish().unwrap();
        return;
    }
    let dir = scratch("badenv");
    let (ok, err) = child(
        "bad_environment_values_are_warnings_and_defaults",
        dir.to_str().unwrap(),
        &[
            ("MEMSIGHT_INTERVAL_MS", "abc"),
            ("MEMSIGHT_HEAP_SAMPLE", "lots"),
            ("MEMSIGHT_HEAP_PEAK_EVERY_MS", "soon"),
            ("MEMSIGHT_QUIET", "please"),
        ],
    );
    assert!(ok, "{err}");
    for var in [
        "MEMSIGHT_INTERVAL_MS",
        "MEMSIGHT_HEAP_SAMPLE",
        "MEMSIGHT_HEAP_PEAK_EVERY_MS",
        "MEMSIGHT_QUIET",
    ] {
        assert_eq!(err.matches(var).count(), 1, "{var} said once: {err}");
    }
    let v = read_json(&dir.join("r.json"));
    let heap = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "heap profile")
        .cloned()
        .unwrap_or_default();
    assert_eq!(heap["available"], true, "sampling was turned off: {heap}");
    assert!(
        heap["detail"].as_str().unwrap_or("").contains("512"),
        "{heap}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_path_from_the_environment_that_cannot_be_written_is_a_warning() {
    if std::env::var(CHILD).is_ok() {
        let session = memsight::Session::builder()
            .quiet()
            .start()
            .expect("a bad MEMSIGHT_REPORT ended the job");
        assert_eq!(session.report_path(), None);
        session.finish().unwrap();
        return;
    }
    let dir = scratch("badenvreport");
    let target = dir.join("missing/r.json");
    let (ok, err) = child(
        "a_report_path_from_the_environment_that_cannot_be_written_is_a_warning",
        "1",
        &[("MEMSIGHT_REPORT", target.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert!(err.contains("MEMSIGHT_REPORT"), "{err}");
    assert!(!dir.join("missing").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
