//! `memsight run` with real jobs: a SIGKILLed job still gets its report (last sample ≤ 100 ms
//! before the kill), a job that runs out of address space gets an out-of-memory post-mortem with
//! its step and phase, a clean exit keeps the job's own report and exit code, killing the sidecar
//! leaves the job running, and a missing command is a clear error.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const JOB: &str = env!("CARGO_BIN_EXE_stepping_job");

fn run_job(report: &Path, job_args: &[&str]) -> (i32, String, Value) {
    let mut a = vec![
        "run",
        "--interval",
        "20ms",
        "--report",
        report.to_str().unwrap(),
        "--",
        JOB,
    ];
    a.extend(job_args);
    let r = run_memsight(&a, None);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap_or_default())
        .unwrap_or(Value::Null);
    (r.code, r.err, v)
}

#[test]
fn a_sigkilled_job_still_gets_its_report() {
    let dir = scratch("sidecar-kill");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["kill"]);
    assert_eq!(code, 137, "{err}");
    assert_eq!(v["job"]["exit"]["signal"], 9, "{err}");
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "signaled");
    assert!(
        pm["description"].as_str().unwrap().contains("SIGKILL"),
        "{pm}"
    );
    let age = pm["last_sample_age_ms"].as_u64().unwrap();
    assert!(age <= 100, "last sample {age} ms before the kill");
    assert!(pm["last_sample"]["step"].as_u64().unwrap() >= 8, "{pm}");
    assert!(v["timeline"].as_array().unwrap().len() >= 5);
    // Phase totals reached the flight recorder before the kill.
    let phases = v["phases"].as_array().unwrap();
    assert!(
        phases.iter().any(|p| p["path"] == "train/forward"),
        "{phases:?}"
    );
    // The peak is the 4 MiB-a-step growth the job made: at least 9 steps' worth.
    assert!(
        pm["heap_peak"]["bytes"].as_u64().unwrap() >= 36 << 20,
        "{pm}"
    );
    assert!(err.contains("report written to"), "{err}");
}

#[test]
fn a_job_that_dies_between_samples_is_placed_at_the_step_it_was_in() {
    // Samples 10 s apart; the job aborts 8 s into step 3, before its phases: the step's start must
    // reach the flight recorder itself (break-it pass 4: "at step 2 in phase spike" for an abort
    // at step 3 outside any phase).
    let dir = scratch("sidecar-abort");
    let report = dir.join("r.json");
    let r = run_memsight(
        &[
            "run",
            "--interval",
            "10s",
            "--report",
            report.to_str().unwrap(),
            "--",
            JOB,
            "abort",
        ],
        None,
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
        .unwrap_or(Value::Null);
    assert_eq!(v["job"]["exit"]["signal"], 6, "{}", r.err);
    let pm = &v["post_mortem"];
    assert_eq!(pm["last_sample"]["step"], 3, "{pm}");
    assert!(pm["last_sample"]["phase"].is_null(), "{pm}");
    let description = pm["description"].as_str().unwrap_or_default();
    assert!(
        description.contains("SIGABRT") && description.contains("at step 3"),
        "{description}"
    );
    // The phase totals came with that sample: steps 0 to 2 each ran `train`.
    let phases = v["phases"].as_array().unwrap();
    let train = phases.iter().find(|p| p["path"] == "train");
    assert_eq!(
        train.map(|p| &p["count"]),
        Some(&Value::from(3)),
        "{phases:?}"
    );
}

#[test]
fn running_out_of_address_space_is_an_out_of_memory_post_mortem() {
    let dir = scratch("sidecar-oom");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["oom"]);
    assert_eq!(code, 128 + 6, "{err}");
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "out_of_memory", "{pm}");
    let d = pm["description"].as_str().unwrap();
    assert!(
        d.contains("allocation failed at step") && d.contains("phase train"),
        "{d}"
    );
    assert_eq!(pm["findings"][0]["kind"], "rust_alloc_failure");
    // 16 MiB kept per step: the leak slope turns the verdict into `leak`.
    assert_eq!(pm["findings"][0]["verdict"], "leak", "{pm}");
    assert!(err.contains("ran out of memory"), "{err}");
    // The CI summary carries the post-mortem and its ranked remedies.
    let md = run_memsight(
        &["summary", report.to_str().unwrap(), "--format", "markdown"],
        None,
    );
    assert!(
        md.out.contains("### Post-mortem: out_of_memory")
            && md.out.contains("1. find what keeps growing"),
        "{}",
        md.out
    );
    assert!(!md.out.contains("run the job under memsight"), "{}", md.out);
}

#[test]
fn a_clean_exit_keeps_the_jobs_own_report_and_exit_code() {
    let dir = scratch("sidecar-exit");
    let report = dir.join("r.json");
    let (code, err, v) = run_job(&report, &["exit", "3"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(v["job"]["exit"]["code"], 3);
    assert_eq!(v["post_mortem"]["cause"], "exited");
    // Phases and the histogram only exist in the job's own report.
    assert!(!v["phases"].as_array().unwrap().is_empty(), "{v}");
    assert!(!v["histogram"].as_array().unwrap().is_empty());
    let check = run_memsight(
        &["check", report.to_str().unwrap(), "--max-host-peak", "1GiB"],
        None,
    );
    assert_eq!(check.code, 0, "{}", check.err);
}

#[test]
fn killing_the_sidecar_leaves_the_job_running() {
    let dir = scratch("sidecar-killed");
    let pid_file = dir.join("job.pid");
    let mut sidecar = Command::new(memsight_bin())
        .args(["run", "--report"])
        .arg(dir.join("r.json"))
        .args(["--", JOB, "exit", "0", "60"])
        .env("JOB_PID_FILE", &pid_file)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !pid_file.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let job: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    sidecar.kill().unwrap();
    sidecar.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(job, 0) } == 0;
    let state = std::fs::read_to_string(format!("/proc/{job}/stat")).unwrap_or_default();
    assert!(
        alive && !state.contains(") Z "),
        "the job died with its sidecar: {state}"
    );
    // SAFETY: ending the orphaned job.
    unsafe { libc::kill(job, libc::SIGKILL) };
}

#[test]
fn a_command_that_cannot_start_is_a_clear_error() {
    let r = run_memsight(&["run", "--", "/nonexistent/train"], None);
    assert_eq!(r.code, 127);
    assert!(
        r.err.contains("cannot start `/nonexistent/train`"),
        "{}",
        r.err
    );
    let r = run_memsight(&["run", "--interval", "0ms", "--", "true"], None);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("not an interval"), "{}", r.err);
}

/// A launcher that starts the program in the background and exits (`bash -c 'prog &'`): memsight
/// stops watching when the job's first process ends, and its report described the launcher alone
/// (0.3 MiB of heap, `exited with code 0`) without a word of the program still running. Now
/// standard error and the report's sources name it; the job's exit code is still the launcher's.
#[test]
fn a_program_left_running_by_its_launcher_is_named() {
    let dir = scratch("sidecar-left-running");
    let report = dir.join("r.json");
    let r = run_memsight(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            "bash",
            "-c",
            "sleep 30 >/dev/null 2>&1 & echo \"background pid $!\"",
        ],
        None,
    );
    assert_eq!(r.code, 0, "{}", r.err);
    let pid = r
        .out
        .lines()
        .chain(r.err.lines())
        .find_map(|l| l.strip_prefix("background pid "))
        .and_then(|p| p.trim().parse::<i32>().ok())
        .unwrap_or_else(|| panic!("no pid printed: {}{}", r.out, r.err));
    // SAFETY: kill has no memory effects; the pid is the background sleep's.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        r.err.contains(&format!(
            "1 process of the job still ran (pid {pid} `sleep 30`)"
        )),
        "{}",
        r.err
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("a report")).expect("JSON");
    let sources = v["sources"].as_array().cloned().unwrap_or_default();
    assert!(
        sources.iter().any(|s| s["name"] == "processes left running"
            && s["detail"]
                .as_str()
                .is_some_and(|d| d.contains(&format!("pid {pid}")))),
        "{sources:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
