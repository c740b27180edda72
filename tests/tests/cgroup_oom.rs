//! A job OOM-killed in a memory cgroup: `memsight run` reports `oom_killed` with the step and phase,
//! from the cgroup's OOM-kill count. Needs permission to create a child memory cgroup (cgroup v1,
//! as root here); elsewhere the test says why it skips.

use memsight_e2e::{memsight_bin, scratch};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// A fresh child of this process's v1 memory cgroup limited to `limit` bytes (swap included).
fn child_cgroup(limit: u64) -> Result<PathBuf, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    let rel = own
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            ctrl.split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .ok_or("no cgroup v1 memory controller for this process")?;
    let dir = PathBuf::from("/sys/fs/cgroup/memory")
        .join(rel.trim_start_matches('/'))
        .join(format!("memsight-oom-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let set = |f: &str, v: u64| std::fs::write(dir.join(f), v.to_string());
    set("memory.limit_in_bytes", limit).map_err(|e| format!("cannot set the limit: {e}"))?;
    if dir.join("memory.memsw.limit_in_bytes").exists() {
        set("memory.memsw.limit_in_bytes", limit).map_err(|e| format!("cannot limit swap: {e}"))?;
    }
    Ok(dir)
}

#[test]
fn an_oom_killed_job_gets_an_oom_post_mortem() {
    let cg = match child_cgroup(192 << 20) {
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
