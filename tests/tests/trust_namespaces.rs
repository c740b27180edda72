//! Containers sharing a runtime directory (`/dev/shm`): a job in another PID namespace keeps its
//! ring while a `memsight run` here cleans up stale files, although its pid means nothing here.
//! Needs root for `unshare --pid`; says why it skips otherwise.

use memsight_e2e::scratch;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const JOB: &str = env!("CARGO_BIN_EXE_stepping_job");

fn alive_here(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn a_live_ring_in_another_pid_namespace_survives_clean_up() {
    let dir = scratch("trust-pidns");
    let pid_file = dir.join("job.pid");
    // Burn through some pids inside the namespace so the job's pid there is one nobody has here
    // (the shell stays pid 1 there; --kill-child ends the namespace with unshare).
    let script =
        format!("i=0; while [ $i -lt 300 ]; do /bin/true; i=$((i+1)); done; {JOB} exit 0 200");
    let spawned = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "sh", "-c", &script])
        .env("XDG_RUNTIME_DIR", &dir)
        .env("JOB_PID_FILE", &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut ns) = spawned else {
        println!("skipped: cannot run unshare");
        return;
    };
    let t = Instant::now();
    let mut ns_pid: Option<i32> = None;
    while ns_pid.is_none() && t.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(_)) = ns.try_wait() {
            break;
        }
        ns_pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some(ns_pid) = ns_pid else {
        let _ = ns.kill();
        let out = ns.wait_with_output().map(|o| o.stderr).unwrap_or_default();
        println!(
            "skipped: no job in a new PID namespace (needs root): {}",
            String::from_utf8_lossy(&out).trim()
        );
        return;
    };
    // The job's default ring: `ring-<pid>.<its pid namespace>.bin`.
    let find_ring = || {
        std::fs::read_dir(dir.join("memsight"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with(&format!("ring-{ns_pid}.")) && n.ends_with(".bin")
                })
            })
    };
    let t = Instant::now();
    let mut found = find_ring();
    while found.is_none() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
        found = find_ring();
    }
    let ring = found.unwrap_or_else(|| panic!("the job wrote no ring in {}", dir.display()));
    if alive_here(ns_pid) {
        let _ = ns.kill();
        let _ = ns.wait();
        println!("skipped: pid {ns_pid} also exists in this namespace");
        return;
    }
    // A run here, in the same runtime directory, cleans up stale rings first.
    let r = Command::new(memsight_e2e::memsight_bin())
        .args(["run", "--report"])
        .arg(dir.join("r.json"))
        .args(["--", "true"])
        .env("XDG_RUNTIME_DIR", &dir)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let kept = ring.exists();
    let _ = ns.kill();
    let _ = ns.wait();
    assert!(
        kept,
        "the live ring of a job in another PID namespace was deleted"
    );
    // Once that job is gone, the same ring is stale and goes.
    let t = Instant::now();
    while ring.exists() && t.elapsed() < Duration::from_secs(10) {
        let r = Command::new(memsight_e2e::memsight_bin())
            .args(["run", "--report"])
            .arg(dir.join("r.json"))
            .args(["--", "true"])
            .env("XDG_RUNTIME_DIR", &dir)
            .output()
            .unwrap();
        assert!(r.status.success());
    }
    assert!(!ring.exists(), "a stale ring was kept");
}
