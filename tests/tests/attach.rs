//! `memsight attach` on processes it did not start: a Python process that grows and forks two
//! children gets the RSS timeline of its tree and of each child; a memsight job is followed through
//! its flight recorder; a missing pid is a clear error.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use serde_json::Value;
use std::process::{Command, Stdio};

/// Grows to 48 MiB, then forks two children that hold 40 MiB each; every stage waits until the
/// attached sidecar has sent samples of it (read from its live socket: `frames.SidecarSamples`),
/// so a busy machine only makes it slower. Without a socket it falls back to fixed pauses.
const GROWER: &str = r#"
import os, sys, time
sys.path.insert(0, os.environ["TREE_JOBS"])
from frames import SidecarSamples
watch = SidecarSamples(deadline_s=180.0)
if not watch.wait(2):
    time.sleep(0.4)
keep = []
for i in range(6):
    keep.append(bytearray(8 << 20))
    time.sleep(0.05)
if not watch.wait(3):
    time.sleep(0.3)
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        mine = bytearray(40 << 20)
        os.write(ready_w, b"k")
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
os.read(ready_r, 1)
os.read(ready_r, 1)
if not watch.wait(3, tree=True):
    time.sleep(1.0)
os.write(go_w, b"gg")
for p in kids:
    os.waitpid(p, 0)
if not watch.wait(1):
    time.sleep(0.2)
"#;

fn attach(pid: u32, report: &std::path::Path) -> std::process::Child {
    Command::new(memsight_bin())
        .args(["attach", &pid.to_string(), "--interval", "50ms", "--report"])
        .arg(report)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_python_process_and_its_children_get_a_tree_timeline() {
    let tree_jobs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tree_jobs");
    let Ok(mut py) = Command::new("python3")
        .args(["-c", GROWER])
        .env("TREE_JOBS", tree_jobs)
        .spawn()
    else {
        println!("SKIP: python3 is not installed");
        return;
    };
    let dir = scratch("attach-python");
    let report = dir.join("r.json");
    let sidecar = attach(py.id(), &report);
    py.wait().unwrap();
    let out = sidecar.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("the process ended"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["cause"], "ended");
    let cmd = v["job"]["command"].to_string();
    assert!(cmd.contains("python") && cmd.contains("os.fork"), "{cmd}");
    let tl = v["timeline"].as_array().unwrap();
    assert!(tl.len() >= 10, "{} samples", tl.len());
    // The parent grew to ≥ 48 MiB on its own.
    let parent_max = tl
        .iter()
        .filter_map(|s| s["process"]["rss"].as_u64())
        .max()
        .unwrap();
    assert!(parent_max >= 48 << 20, "parent RSS peaked at {parent_max}");
    // Some sample saw both children, each with its 40 MiB, and the tree total above all three.
    let both = tl.iter().find(|s| {
        let ps = s["tree"]["processes"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        ps.iter()
            .skip(1)
            .filter(|p| p["rss"].as_u64().unwrap_or(0) >= 38 << 20)
            .count()
            == 2
    });
    let s = both.expect("no sample saw two children with 40 MiB each");
    let ps = s["tree"]["processes"].as_array().unwrap();
    let sum: u64 = ps.iter().map(|p| p["rss"].as_u64().unwrap()).sum();
    assert_eq!(s["tree"]["total_rss"].as_u64().unwrap(), sum);
    assert!(ps.iter().skip(1).all(|p| p["ppid"] == ps[0]["pid"]));
    let sources = v["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .any(|s| s["name"] == "process" && s["available"] == true),
        "{sources:?}"
    );
}

#[test]
fn a_memsight_job_is_followed_through_its_flight_recorder() {
    let dir = scratch("attach-ring");
    let report = dir.join("r.json");
    let mut job = Command::new(env!("CARGO_BIN_EXE_stepping_job"))
        .args(["exit", "0", "25"])
        .env("MEMSIGHT_INTERVAL_MS", "20")
        .env("MEMSIGHT_REPORT", dir.join("job.json"))
        .env("JOB_WAIT_FILE", dir.join("go"))
        .spawn()
        .unwrap();
    // Attached once the job's session has its flight recorder; the job waits at step 3 until the
    // sidecar is attached (its live socket is there).
    let ring = memsight_format::wire::default_ring_path(job.id()).unwrap();
    memsight_e2e::wait_until(120, || ring.exists());
    let socket = memsight_sidecar::server::socket_path(job.id()).unwrap();
    let sidecar = attach(job.id(), &report);
    memsight_e2e::wait_until(120, || socket.exists());
    std::fs::write(dir.join("go"), "").unwrap();
    job.wait().unwrap();
    let out = sidecar.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    // The job finished and wrote its own report, which the sidecar adopted (phases are only there).
    assert!(!v["phases"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(v["post_mortem"]["cause"], "ended");
    assert!(v["post_mortem"]["last_sample"]["step"].as_u64().unwrap() >= 20);
}

#[test]
fn a_missing_process_is_a_clear_error() {
    let r = run_memsight(&["attach", "4000000"], None);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("no process 4000000"), "{}", r.err);
}
