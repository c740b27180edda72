//! memsight never harms the job, never clobbers a file and never loses a report (issue 17): a full
//! runtime filesystem costs the job one line on stderr, not a SIGBUS; a report target that is not a
//! regular file is refused before the job starts; planted files are never followed; a killed
//! sidecar still leaves the job's report at the requested path; a report that cannot be written
//! does not change the job's exit code or hide its post-mortem.

use memsight_e2e::{memsight_bin, run_memsight, scratch, Tmpfs};
use serde_json::Value;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const JOB: &str = env!("CARGO_BIN_EXE_stepping_job");

/// Runs `memsight ARGS…` with extra environment; (code, stdout, stderr).
fn memsight_env(args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let mut c = Command::new(memsight_bin());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("memsight runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `memsight run [EXTRA…] --report REPORT -- stepping_job JOB…` with extra environment.
fn run_job(
    report: &str,
    extra: &[&str],
    job: &[&str],
    env: &[(&str, &Path)],
) -> (i32, String, String) {
    let mut a = vec!["run"];
    a.extend(extra);
    a.extend(["--report", report, "--", JOB]);
    a.extend(job);
    memsight_env(&a, env)
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn a_full_runtime_filesystem_costs_the_job_one_line_not_its_life() {
    let fs = match Tmpfs::mount("trust-fullfs", 2 << 20) {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    // The runtime directory exists (as it would on a long-running machine); then /dev/shm fills up.
    let runtime = fs.dir.join("memsight");
    std::fs::create_dir(&runtime).unwrap();
    fs.fill();
    let dir = scratch("trust-fullfs-out");
    let report = dir.join("own.json");
    let out = Command::new(JOB)
        .args(["exit", "0", "3"])
        .env("XDG_RUNTIME_DIR", &fs.dir)
        .env("MEMSIGHT_REPORT", &report)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("memsight")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("no flight recorder"), "{err}");
    assert!(report.is_file(), "{err}");
    assert!(std::fs::read_dir(&runtime).unwrap().next().is_none());

    // The same under `memsight run`: the job's code, and the report at the requested path.
    let report = dir.join("run.json");
    let (code, _, err) = run_job(
        report.to_str().unwrap(),
        &[],
        &["exit", "4", "3"],
        &[("XDG_RUNTIME_DIR", &fs.dir)],
    );
    assert_eq!(code, 4, "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["exit_code"], 4, "{err}");
}

#[test]
fn report_targets_that_are_not_regular_files_are_refused_before_the_job_starts() {
    let dir = scratch("trust-targets");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let subdir = dir.join("adir");
    std::fs::create_dir(&subdir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut targets = vec![
        (link.clone(), "a symbolic link"),
        (subdir.clone(), "a directory"),
        (fifo.clone(), "a FIFO"),
    ];
    // A character device of our own (1:3 is what /dev/null is): never the real /dev/null.
    let null = dir.join("null");
    let c = std::ffi::CString::new(null.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mknod of a character device needs root.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
        targets.push((null.clone(), "a character device"));
    } else {
        println!("character device case skipped: mknod needs root");
    }
    for (target, what) in &targets {
        let marker = dir.join("job-ran");
        let (code, _, err) = run_job(
            target.to_str().unwrap(),
            &[],
            &["exit", "0", "1"],
            &[("JOB_PID_FILE", &marker)],
        );
        assert_eq!(code, 2, "{what}: {err}");
        assert!(
            err.contains(&format!("not a regular file but {what}")),
            "{what}: {err}"
        );
        assert!(!marker.exists(), "{what}: the job started anyway");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    if targets.len() == 4 {
        let t = std::fs::symlink_metadata(&null).unwrap().file_type();
        assert!(t.is_char_device());
    }
    // `summary -o` refuses the same way for its output.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/report.example.json");
    let r = run_memsight(&["summary", example, "-o", link.to_str().unwrap()], None);
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(
        r.err.contains("not a regular file but a symbolic link"),
        "{}",
        r.err
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}

#[test]
fn planted_temporary_files_are_never_followed() {
    let dir = scratch("trust-planted");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let report = dir.join("r.json");
    // Every name the old writers used beside a report.
    for name in ["r.json.tmp", ".r.json.tmp", "r.heap.tmp"] {
        std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
    }
    let (code, _, err) = run_job(report.to_str().unwrap(), &[], &["exit", "0", "2"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    let meta = std::fs::symlink_metadata(&report).unwrap();
    assert!(meta.is_file());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["cause"], "exited");
}

#[test]
fn report_dash_goes_to_standard_output() {
    let dir = scratch("trust-stdout");
    let (code, out, err) = run_job("-", &["--no-heap-profile"], &["exit", "0", "2"], &[]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert_eq!(v["post_mortem"]["cause"], "exited", "{out}");
    assert!(!Path::new("-").exists());
    assert!(leftovers(&dir).is_empty());
}

#[test]
fn an_unwritable_report_path_is_found_before_the_job_starts() {
    let dir = scratch("trust-unwritable");
    let marker = dir.join("job-ran");
    let (code, _, err) = run_job(
        "/nonexistent-memsight-dir/r.json",
        &[],
        &["exit", "0", "1"],
        &[("JOB_PID_FILE", &marker)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent-memsight-dir"), "{err}");
    assert!(!marker.exists(), "the job started anyway");
}

/// Starts `memsight run --report REPORT -- JOB exit CODE STEPS` and waits for the job's pid.
fn start_run(dir: &Path, report: &Path, code: &str, steps: &str) -> (std::process::Child, i32) {
    let pid_file = dir.join("job.pid");
    let sidecar = Command::new(memsight_bin())
        .args(["run", "--interval", "20ms", "--report"])
        .arg(report)
        .args(["--", JOB, "exit", code, steps])
        .env("JOB_PID_FILE", &pid_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut pid = None;
    while pid.is_none() && t.elapsed() < Duration::from_secs(20) {
        pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        std::thread::sleep(Duration::from_millis(10));
    }
    (sidecar, pid.expect("the job started"))
}

#[test]
fn a_report_lost_after_the_job_keeps_its_exit_code_and_post_mortem() {
    let dir = scratch("trust-lost-dir");
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let report = out.join("r.json");
    let (sidecar, _) = start_run(&dir, &report, "3", "20");
    // The report's directory disappears while the job runs.
    std::fs::remove_dir_all(&out).unwrap();
    let o = sidecar.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // The job's own `finish().expect(…)` fails too (exit 101): whatever the job's code, it is run's.
    let code = o.status.code().unwrap();
    assert!(code == 3 || code == 101, "{err}");
    assert!(
        err.contains(&format!("memsight · exited with code {code}")),
        "{err}"
    );
    assert!(err.contains("the report was not written"), "{err}");
}

#[test]
fn a_killed_sidecar_still_leaves_the_report_at_the_requested_path() {
    let dir = scratch("trust-sidecar-killed");
    let report = dir.join("r.json");
    let (mut sidecar, job) = start_run(&dir, &report, "0", "40");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: SIGKILL to the sidecar we started.
    unsafe { libc::kill(sidecar.id() as i32, libc::SIGKILL) };
    sidecar.wait().unwrap();
    // The orphaned job finishes on its own.
    let t = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{job}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") || t.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["job"]["pid"], job);
    assert!(!v["timeline"].as_array().unwrap().is_empty());
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
}

#[test]
fn the_next_run_does_not_delete_an_undelivered_report() {
    let dir = scratch("trust-undelivered");
    let runtime = dir.join("memsight");
    std::fs::create_dir(&runtime).unwrap();
    // A report a killed sidecar never delivered (its pid is long gone).
    let kept = runtime.join("job-report-999999999-1.json");
    std::fs::write(&kept, "{}").unwrap();
    let report = dir.join("r.json");
    let (code, _, err) = run_job(
        report.to_str().unwrap(),
        &[],
        &["exit", "0", "1"],
        &[("XDG_RUNTIME_DIR", &dir)],
    );
    assert_eq!(code, 0, "{err}");
    assert!(kept.exists());
}
