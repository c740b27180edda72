//! A job OOM-killed in a memory cgroup: `memsight run` reports `oom_killed` with the step and phase,
//! from the cgroup's OOM-kill count. Needs permission to create a child memory cgroup (cgroup v1,
//! as root here); elsewhere the test says why it skips.

use memsight_e2e::{child_cgroup, memsight_bin, scratch};
use serde_json::Value;
use std::process::Command;

#[test]
fn an_oom_killed_job_gets_an_oom_post_mortem() {
    let cg = match child_cgroup("oom", 192 << 20) {
        Ok(d) => d,
        Err(why) => {
            println!("SKIP: {why}");
            return;
        }
    };
    let dir = scratch("cgroup-oom");
    let report = dir.join("r.json");
    let out = Command::new(memsight_bin())
        .args(["run", "--interval", "20ms", "--report"])
        .arg(&report)
        .args(["--", env!("CARGO_BIN_EXE_stepping_job"), "grow"])
        .env("JOB_CGROUP", &cg)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "oom_killed", "{pm}");
    assert!(pm["cgroup_oom_kills"].as_u64().unwrap() >= 1);
    let d = pm["description"].as_str().unwrap();
    assert!(
        d.contains("OOM killer") && d.contains("at step") && d.contains("phase train"),
        "{d}"
    );
    assert_eq!(pm["findings"][0]["kind"], "linux_oom_killer");
    // The job's own samples show the limit it ran into.
    let limit = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find_map(|s| s["cgroup"]["limit"].as_u64());
    assert_eq!(limit, Some(192 << 20), "{}", v["timeline"]);
    assert!(err.contains("OOM killer"), "{err}");
}
