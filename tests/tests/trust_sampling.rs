//! Missed sampling intervals are counted, not hidden: a job stopped for half a second under
//! `memsight run --interval 10ms` reports the intervals that got no sample.

use memsight_e2e::{memsight_bin, scratch};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_stalled_sampler_reports_its_missed_intervals() {
    let dir = scratch("trust-missed");
    let report = dir.join("r.json");
    let pid_file = dir.join("job.pid");
    let mut sidecar = Command::new(memsight_bin())
        .args(["run", "--interval", "10ms", "--report"])
        .arg(&report)
        .args(["--", env!("CARGO_BIN_EXE_stepping_job"), "exit", "0", "40"])
        .env("JOB_PID_FILE", &pid_file)
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut pid: Option<i32> = None;
    while pid.is_none() && t.elapsed() < Duration::from_secs(20) {
        pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = pid.expect("the job started");
    std::thread::sleep(Duration::from_millis(200));
    // Every thread of the job stops (as under heavy swapping or a starved CPU) for 500 ms: about
    // 50 intervals of 10 ms get no sample.
    // SAFETY: signals to the job we started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(sidecar.wait().unwrap().success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let missed = v["missed_intervals"].as_u64().unwrap_or(0);
    assert!(
        missed >= 10,
        "missed_intervals {missed}: {}",
        v["interval_ms"]
    );
    let last = v["timeline"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["missed_intervals"].as_u64(), Some(missed));
}
