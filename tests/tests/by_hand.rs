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
