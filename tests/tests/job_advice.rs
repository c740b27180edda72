//! Issue 37: advice that fits the job that ran. A Python job's failed host allocation is judged as
//! a Python/PyTorch job's (never a Rust program's), a request larger than the machine is its own
//! verdict, an OOM kill of a job without data-loader workers does not advise fewer workers, and
//! `check` and `summary` speak the job's language. Needs the torch virtual environment and the
//! preloaded library (`make build` makes both); each test skips, saying why, without them.

use memsight_e2e::{child_cgroup, run_job, run_memsight, scratch, torch_python};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The torch venv's python, when it and the preloaded library are there.
fn ready() -> Option<PathBuf> {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return None;
    };
    memsight_e2e::preload_built().then_some(py)
}

/// Runs `python -c CODE` under `memsight run`: memsight's output and the report.
fn run_python(dir: &Path, py: &Path, code: &str, envs: &[(&str, &str)]) -> (String, Value) {
    let r = run_job(
        dir,
        &["--interval", "50ms"],
        &[py.as_os_str(), "-c".as_ref(), code.as_ref()],
        envs,
    );
    (r.out, serde_json::from_str(&r.report).unwrap())
}

/// Words of the Rust remedies, which a Python job must never be given.
const RUST_WORDS: [&str; 4] = ["BufReader", "try_reserve", "RAYON", "Vec::with_capacity"];

fn assert_no_rust_advice(finding: &Value, out: &str) {
    let text = finding.to_string();
    for w in RUST_WORDS {
        assert!(
            !text.contains(w),
            "Rust advice ({w}) for a Python job: {finding}"
        );
        assert!(
            !out.contains(w),
            "Rust advice ({w}) for a Python job:\n{out}"
        );
    }
}

#[test]
fn a_failed_terabyte_tensor_is_pytorchs_and_a_request_that_can_never_fit() {
    let Some(py) = ready() else { return };
    let dir = scratch("advice-tib");
    // As the issue saw it: a 1 TiB torch.empty on the CPU of a machine with far less memory, in a
    // job that reports PyTorch's devices (memsight.torch).
    let code = "import memsight.torch, torch\nmemsight.torch.install()\n\
                x = torch.ones(1000, 1000)\ntorch.empty(1 << 38, dtype=torch.float32)\n";
    let (out, v) = run_python(&dir, &py, code, &[]);
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "out_of_memory", "{pm}");
    let f = &pm["findings"][0];
    assert_eq!(f["kind"], "torch_cpu_oom", "{f}");
    assert_eq!(f["verdict"], "request_exceeds_memory", "{f}");
    let evidence = f["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("1.00 TiB") && evidence.contains("can never fit"),
        "{evidence}"
    );
    assert!(!evidence.contains("reached the machine"), "{evidence}");
    let remedies: Vec<&str> = f["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        remedies[0].contains("check how the size was computed"),
        "{remedies:?}"
    );
    assert!(
        remedies.iter().any(|r| r.contains("torch.")),
        "{remedies:?}"
    );
    assert!(
        !remedies.iter().any(|r| r.contains("data-loader")),
        "{remedies:?}"
    );
    assert_no_rust_advice(f, &out);
    assert!(out.contains("verdict request_exceeds_memory"), "{out}");

    // The same failure in a script that does not mention memsight: `memsight run` installs
    // memsight.torch when the job imports torch, so the report knows it is PyTorch's.
    let dir = scratch("advice-tib-plain");
    let code = "import torch\ntorch.empty(1 << 38, dtype=torch.float32)\n";
    let (out, v) = run_python(&dir, &py, code, &[]);
    let f = &v["post_mortem"]["findings"][0];
    assert_eq!(f["kind"], "torch_cpu_oom", "{f}");
    assert_eq!(f["verdict"], "request_exceeds_memory", "{f}");
    assert_no_rust_advice(f, &out);
}

#[test]
fn check_and_summary_speak_python_to_a_python_job() {
    let Some(py) = ready() else { return };
    let dir = scratch("advice-words");
    let (_, _) = run_python(&dir, &py, "x = bytearray(8 << 20)\n", &[]);
    let report = dir.join("r.json");
    let c = run_memsight(
        &[
            "check".as_ref(),
            "--max-leak-per-step".as_ref(),
            "1MiB".as_ref(),
            report.as_os_str(),
        ],
        None,
    );
    let said = format!("{}{}", c.out, c.err);
    assert!(said.contains("memsight.step(n)"), "{said}");
    assert!(!said.contains("memsight::step"), "{said}");
    let s = run_memsight(&["summary".as_ref(), report.as_os_str()], None);
    assert_eq!(s.code, 0, "{}", s.err);
    let heap = s
        .out
        .lines()
        .find(|l| l.starts_with("| process heap"))
        .unwrap_or_else(|| panic!("no heap row:\n{}", s.out));
    assert!(!heap.contains("Rust"), "{heap}");
    // The cgroup's usage is every process in the cgroup's, and says so.
    if let Some(cgroup) = s.out.lines().find(|l| l.starts_with("| cgroup usage")) {
        assert!(
            cgroup.contains("whole cgroup") && cgroup.contains("not only the job's"),
            "{cgroup}"
        );
    }
}

#[test]
fn an_oom_killed_python_job_without_workers_is_not_told_to_use_fewer_workers() {
    let Some(py) = ready() else { return };
    let cg = match child_cgroup("advice-kill", 256 << 20) {
        Ok(d) => d,
        Err(why) => {
            println!("SKIP: {why}");
            return;
        }
    };
    let dir = scratch("advice-kill");
    let code = "import os\n\
                open(os.path.join(os.environ['JOB_CGROUP'], 'cgroup.procs'), 'w').write(str(os.getpid()))\n\
                held = []\n\
                while True:\n    held.append(b'x' * (16 << 20))\n";
    let cgs = cg.to_string_lossy().into_owned();
    let (out, v) = run_python(&dir, &py, code, &[("JOB_CGROUP", cgs.as_str())]);
    let _ = std::fs::remove_dir(&cg);
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "oom_killed", "{pm}\n{out}");
    let f = &pm["findings"][0];
    assert_eq!(f["kind"], "linux_oom_killer", "{f}");
    let text = f["remedies"].to_string();
    assert!(!text.contains("data-loader"), "{f}");
    assert!(!out.contains("data-loader"), "{out}");
    assert_no_rust_advice(f, &out);
}
