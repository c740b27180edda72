//! A job started by hand — `LD_PRELOAD` of the library and `MEMSIGHT_REPORT`, as the Python
//! package's README shows, no `memsight run` — through a shell, with the tools it runs: the report
//! at the user's path describes the job's main process, not whichever process ended last.

use memsight_e2e::{memsight_bin, preload_built, scratch, torch_python};
use memsight_format::report::Report;
use std::path::{Path, PathBuf};
use std::process::Command;

fn preload_lib() -> PathBuf {
    memsight_bin()
        .parent()
        .and_then(Path::parent)
        .map(|t| t.join("preload/release/libmemsight_preload.so"))
        .expect("target dir")
}

/// A Python program that holds `argv[1]` MiB (every page written) for `argv[2]` seconds, then
/// runs the rest of its arguments as a tool and waits for it.
const HOLD: &str = "import subprocess, sys, time
b = bytearray(int(sys.argv[1]) << 20)
b[::4096] = b'x' * len(b[::4096])
time.sleep(float(sys.argv[2]))
if sys.argv[3:]:
    subprocess.run(sys.argv[3:], check=True)
";

/// Runs `sh_line` with `sh -c`, by hand: the library preloaded and the report asked for.
fn by_hand(report: &Path, sh_line: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(sh_line)
        .env("LD_PRELOAD", preload_lib())
        .env("MEMSIGHT_REPORT", report)
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the job failed: {err}");
    err
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

#[test]
fn a_job_started_by_hand_keeps_the_report_of_its_main_process() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let py = py.display().to_string();
    let dir = scratch("by-hand");
    let report = dir.join("r.json");

    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    let hold = format!("{py} {}", hold.display());

    // A shell that runs the training program, then a tool that lives past its session's start:
    // the shell ends last and the tool after the program, and neither is the job.
    let err = by_hand(&report, &format!("{hold} 64 0.3; {hold} 2 0.4; true"));
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        r.job.command.iter().any(|a| a == "64"),
        "the report describes {:?}, not the job's 64 MiB program; stderr: {err}",
        r.job.command
    );
    assert!(
        (64.0..70.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB, the program held 64 MiB",
        mib(r.peaks.heap_peak_bytes)
    );
    assert!(
        err.contains("keeps the report of the job's main process"),
        "the shell says nothing of whose report is kept: {err}"
    );
    assert_eq!(
        err.matches("session start").count(),
        1,
        "not one process of the job alone printed its session: {err}"
    );

    // The next job at the same path replaces the last one's report, though that held more.
    by_hand(&report, &format!("{hold} 8 0.3"));
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (8.0..14.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB: the earlier job's report was kept over this job's 8 MiB",
        mib(r.peaks.heap_peak_bytes)
    );

    // A shell with job control (a terminal's, whose own environment carries the variables) starts
    // each command line as a job of its own: the last one's report is kept, not the largest.
    by_hand(
        &report,
        &format!("set -m; {hold} 64 0.3; {hold} 8 0.3; true"),
    );
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (8.0..14.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB: a terminal's earlier command line kept its report over the last one",
        mib(r.peaks.heap_peak_bytes)
    );

    // The job's first process is its main one: the tool it runs leaves its report alone.
    by_hand(&report, &format!("exec {hold} 32 0.2 {hold} 1 0.4"));
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (32.0..38.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB: a tool the 32 MiB program ran replaced its report ({:?})",
        mib(r.peaks.heap_peak_bytes),
        r.job.command
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A main program holding 8 MiB whose worker, started by `multiprocessing` with `spawn` (a new
/// program, as DataLoader workers with `multiprocessing_context="spawn"` are), holds 64 MiB.
const SPAWNS_A_WORKER: &str = "import multiprocessing as mp, time
def work():
    b = bytearray(64 << 20)
    b[::4096] = b'x' * len(b[::4096])
    time.sleep(0.4)
if __name__ == '__main__':
    b = bytearray(8 << 20)
    b[::4096] = b'x' * len(b[::4096])
    p = mp.get_context('spawn').Process(target=work)
    p.start()
    p.join()
    time.sleep(0.2)
";

#[test]
fn a_spawned_worker_holding_more_than_its_parent_is_not_the_job() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-spawn");
    let report = dir.join("r.json");
    let script = dir.join("spawns.py");
    std::fs::write(&script, SPAWNS_A_WORKER).expect("script written");
    by_hand(
        &report,
        &format!("exec {} {}", py.display(), script.display()),
    );
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (8.0..14.0).contains(&mib(r.peaks.heap_peak_bytes)) && r.job.command.len() == 2,
        "the report describes {:?} ({:.1} MiB), not the 8 MiB main program",
        r.job.command,
        mib(r.peaks.heap_peak_bytes)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `sh_line` by hand like [`by_hand`], without waiting for it.
fn by_hand_spawn(report: &Path, sh_line: &str) -> std::process::Child {
    Command::new("bash")
        .arg("-c")
        .arg(sh_line)
        .env("LD_PRELOAD", preload_lib())
        .env("MEMSIGHT_REPORT", report)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash runs")
}

/// Waits for `child` (generously: a job stuck at its exit is killed) and returns its stderr.
fn finish(mut child: std::process::Child) -> String {
    use std::io::Read;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the job never ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut err = String::new();
    let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
    err
}

#[test]
fn a_report_at_the_path_that_is_not_this_jobs_is_never_kept() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-not-ours");
    let report = dir.join("r.json");
    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    let hold = format!("{} {}", py.display(), hold.display());

    // A report left there that claims more heap than any process of the job, and a session that
    // started after this job's: planted, not this job's.
    by_hand(&report, &format!("{hold} 8 0.1"));
    let mut planted = Report::load(&report).expect("a report");
    planted.job.command = vec!["planted".into()];
    planted.job.start_unix_ms += 86_400_000;
    planted.job.end_unix_ms += 86_400_000;
    planted.peaks.heap_peak_bytes = 1 << 40;
    std::fs::write(&report, planted.to_json().expect("json")).expect("planted");
    let err = by_hand(&report, &format!("{hold} 16 0.1; true"));
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (16.0..22.0).contains(&mib(r.peaks.heap_peak_bytes)) && !err.contains("planted"),
        "the path kept {:?} ({:.1} MiB), not the job's 16 MiB program: {err}",
        r.job.command,
        mib(r.peaks.heap_peak_bytes)
    );

    // Another user's report (here: this job's own, handed to `nobody`) is never kept either.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        by_hand(
            &report,
            &format!("{hold} 64 0.1; chown 65534 \"$MEMSIGHT_REPORT\"; true"),
        );
        let r = Report::load(&report).expect("a report at the user's path");
        assert!(
            mib(r.peaks.heap_peak_bytes) < 8.0,
            "the shell kept a report {}'s user no longer owns ({:.1} MiB)",
            r.job.pid,
            mib(r.peaks.heap_peak_bytes)
        );
    }

    // An unrelated job at the same path, started while this one runs and done before it ends:
    // this job never takes that job's process for its own main one.
    let fifo = dir.join("go");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo")
        .success());
    let first = by_hand_spawn(
        &report,
        &format!("{hold} 8 0; read _ < {}; true", fifo.display()),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !Report::load(&report).is_ok_and(|r| r.job.command.iter().any(|a| a == "8")) {
        assert!(std::time::Instant::now() < deadline, "no 8 MiB report");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let err_other = by_hand(&report, &format!("{hold} 64 0.1; true"));
    std::fs::write(&fifo, "\n").expect("the first job goes on");
    let err = finish(first);
    assert!(
        !err.contains("keeps the report"),
        "a job took another job's process for its own: {err}\n(the other job: {err_other})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lock_held_on_the_report_directory_does_not_keep_a_job_from_ending() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-locked");
    let report = dir.join("r.json");
    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    // Anyone who can open the directory (`/tmp`) can lock it, for as long as they like.
    let d = std::fs::File::open(&dir).expect("the directory opens");
    // SAFETY: a descriptor `d` keeps open.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&d), libc::LOCK_EX) },
        0
    );
    let child = by_hand_spawn(
        &report,
        &format!("{} {} 8 0.1; true", py.display(), hold.display()),
    );
    let err = finish(child);
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (8.0..14.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB, the program held 8 MiB: {err}",
        mib(r.peaks.heap_peak_bytes)
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launcher holding 8 MiB that starts its worker in a session of its own, as `torchrun` does
/// (`start_new_session`), and waits for it.
const LAUNCHES_IN_A_NEW_SESSION: &str = "import subprocess, sys
b = bytearray(8 << 20)
b[::4096] = b'x' * len(b[::4096])
subprocess.Popen(sys.argv[1:], start_new_session=True).wait()
";

#[test]
fn a_worker_a_launcher_starts_in_a_session_of_its_own_is_in_its_job() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-session");
    let report = dir.join("r.json");
    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    let launcher = dir.join("launch.py");
    std::fs::write(&launcher, LAUNCHES_IN_A_NEW_SESSION).expect("script written");
    let err = by_hand(
        &report,
        &format!(
            "{py} {} {py} {} 64 0.3; true",
            launcher.display(),
            hold.display(),
            py = py.display()
        ),
    );
    let r = Report::load(&report).expect("a report at the user's path");
    assert!(
        (64.0..70.0).contains(&mib(r.peaks.heap_peak_bytes)),
        "heap peak {:.1} MiB ({:?}), the worker held 64 MiB: {err}",
        mib(r.peaks.heap_peak_bytes),
        r.job.command
    );
    assert_eq!(
        err.matches("session start").count(),
        1,
        "the worker spoke as a job of its own: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_report_path_that_cannot_be_written_is_said_once_per_job() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-link");
    let report = dir.join("r.json");
    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    // A link where the report goes (one planted in `/tmp`) is never followed.
    let victim = dir.join("victim");
    std::fs::write(&victim, "kept").expect("written");
    std::os::unix::fs::symlink(&victim, &report).expect("link made");
    let err = by_hand(
        &report,
        &format!("{} {} 8 0.1; true", py.display(), hold.display()),
    );
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "kept");
    assert_eq!(
        err.matches("cannot write a report there").count(),
        1,
        "not the job's first process alone said so: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_heap_profiles_left_are_the_kept_reports() {
    if !preload_built() {
        return;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv python (make build sets it up)");
        return;
    };
    let dir = scratch("by-hand-profiles");
    let report = dir.join("r.json");
    let hold = dir.join("hold.py");
    std::fs::write(&hold, HOLD).expect("script written");
    let hold = format!("{} {}", py.display(), hold.display());
    // Run after run, each process of the job profiles its heap; what the report does not name
    // (the shell's, the last run's) is not left to pile up.
    for mib in [16, 8] {
        by_hand(&report, &format!("{hold} {mib} 0.2; {hold} 2 0.2; true"));
    }
    let r = Report::load(&report).expect("a report at the user's path");
    let named: Vec<PathBuf> = r
        .heap_profile
        .iter()
        .flat_map(|h| h.dumps.iter().map(|d| PathBuf::from(&d.path)))
        .collect();
    assert!(!named.is_empty(), "the report names no heap profile");
    let left = files_under(&dir.join("r.heap"));
    let stray: Vec<_> = left.iter().filter(|f| !named.contains(f)).collect();
    assert!(
        stray.is_empty(),
        "heap profiles no report names were left: {stray:?} (the report names {named:?})"
    );
    assert!(
        named.iter().all(|f| f.exists()),
        "the report's profiles are gone: {named:?}"
    );

    // The job's first process is its main one and profiles into the heap directory itself, where
    // the last run's main process did: a tool ending first leaves its profiles alone.
    for _ in 0..2 {
        by_hand(&report, &format!("exec {hold} 32 0.2 {hold} 2 0.4"));
    }
    let r = Report::load(&report).expect("a report at the user's path");
    assert!((32.0..38.0).contains(&mib(r.peaks.heap_peak_bytes)));
    let named: Vec<PathBuf> = r
        .heap_profile
        .iter()
        .flat_map(|h| h.dumps.iter().map(|d| PathBuf::from(&d.path)))
        .collect();
    assert!(
        !named.is_empty() && named.iter().all(|f| f.exists()),
        "the report's profiles are gone: {named:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
