//! A job is a tree of processes, each measured: an unmodified CPU DDP job under `torchrun` gets
//! one report per rank (`--report` takes `{rank}`) whose heap peak is within 2% of glibc's own
//! count in that rank, and a job report with the ranks side by side — whatever starts `torchrun`
//! (a `#!/usr/bin/env bash` wrapper, `bash -c`, a pyenv-like shim, `prlimit`, `setpriv`, `flock`),
//! and Lightning's ranks, whose first is the script the user ran; a SIGKILLed rank is named first;
//! an OOM-killed DataLoader worker gets a verdict naming it.

use memsight_e2e::{child_cgroup, memsight_bin, preload_built, scratch, torch_python};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn job(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tree_jobs")
        .join(name)
}

/// Runs `cmd`, which must exit 0 (its standard error says why not).
fn succeeds(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
}

fn read(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// The torch venv's `bin` directory, or why the test skips.
fn venv_bin() -> Option<PathBuf> {
    if !preload_built() {
        return None;
    }
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (make build sets it up)");
        return None;
    };
    py.parent().map(Path::to_path_buf)
}

/// Runs `launcher… torchrun --nproc_per_node=2 ddp_train.py` under `memsight run --report
/// dir/r-{rank}.json`; its exit code and standard error.
fn run_ddp(dir: &Path, launcher: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let bin = venv_bin().expect("checked by the caller");
    let torchrun = bin.join("torchrun");
    let mut cmd = Command::new(memsight_bin());
    cmd.arg("run")
        .arg("--report")
        .arg(dir.join("r-{rank}.json"))
        .arg("--")
        .args(launcher)
        .arg(&torchrun)
        .args(["--standalone", "--nproc_per_node=2"])
        .arg(job("ddp_train.py"))
        .env("DDP_OUT", dir)
        .env("DDP_STEPS", "6")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lowest heap-peak-to-glibc ratio of a torchrun rank: glibc's in-use bytes count each
/// block's 8-byte header, memsight the usable bytes; a rank that imported torch holds ~650k small
/// blocks, ~5 MiB of headers, and measures 0.979-0.985 (2026-11-27).
const TORCHRUN_LOW: f64 = 0.975;

/// Checks the per-rank reports against each rank's own glibc count (the ratio at least `low`),
/// and the job report's ranks; the launcher whose row must be there, when the ranks have one.
fn assert_ranks_exact(dir: &Path, how: &str, low: f64, launcher: Option<&str>) {
    let job = read(&dir.join("r-job.json"));
    let ranks = job["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{how}: {}", job["ranks"]);
    for r in 0..2u64 {
        let own = read(&dir.join(format!("r-{r}.json")));
        let truth = read(&dir.join(format!("rank{r}.json")));
        let peak = own["peaks"]["heap_peak_bytes"].as_u64().unwrap() as f64;
        let glibc = truth["glibc_in_use"].as_u64().unwrap() as f64;
        let ratio = peak / glibc;
        println!("{how}: rank {r} heap peak {peak} vs glibc {glibc}: {ratio:.4}");
        // The truth counts glibc's block headers, memsight does not (see TORCHRUN_LOW).
        assert!((low..=1.02).contains(&ratio), "{how}: rank {r}: {ratio}");
        assert_eq!(own["job"]["pid"], truth["pid"], "{how}");
        // Each rank's own sites at its peak (only the headline rank's reached any report).
        assert!(
            own["heap_profile"]["at_peak"]["top_sites"]
                .as_array()
                .is_some_and(|s| !s.is_empty()),
            "{how}: rank {r}'s report has no sites at its peak: {}",
            own["heap_profile"]
        );
        let row = &ranks[r as usize];
        assert_eq!(row["role"], "rank", "{how}: {row}");
        assert_eq!(row["rank"], r, "{how}: {row}");
        assert_eq!(row["pid"], truth["pid"], "{how}: {row}");
        assert!(row["report"]
            .as_str()
            .unwrap()
            .ends_with(&format!("r-{r}.json")));
    }
    // The launcher's own heap is its own row, not the job's headline.
    let rows = job["processes"].as_array().unwrap();
    if let Some(launcher) = launcher {
        assert!(
            rows.iter()
                .any(|p| p["role"] == "launcher" && p["command"].to_string().contains(launcher)),
            "{how}: {rows:?}"
        );
    }
    assert_eq!(job["job"]["pid"], ranks[0]["pid"], "{how}");
}

#[test]
fn torchrun_ranks_each_get_a_report_within_2_percent_of_glibc() {
    if venv_bin().is_none() {
        return;
    }
    let dir = scratch("ddp-ranks");
    let (code, err) = run_ddp(&dir, &[], &[]);
    assert_eq!(code, 0, "{err}");
    assert_ranks_exact(&dir, "torchrun", TORCHRUN_LOW, Some("torchrun"));
    assert!(err.contains("rank 1 report written to"), "{err}");
}

#[test]
fn lightnings_ranks_each_get_a_report_the_script_the_user_ran_being_rank_0() {
    let Some(bin) = venv_bin() else {
        return;
    };
    let dir = scratch("lightning-ranks");
    let out = Command::new(memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(dir.join("r-{rank}.json"))
        .arg("--")
        .arg(bin.join("python"))
        .arg(job("lightning_ddp.py"))
        .env("LT_OUT", &dir)
        .env_remove("RANK")
        .env_remove("LOCAL_RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // Rank 0 named its rank only once Lightning set LOCAL_RANK in its environment, after its
    // session had started: it is a rank all the same, and the job's first process. It is also
    // the script that imported Lightning and launched the other rank: more small blocks, so more
    // of glibc's 8-byte headers in the truth (0.9737-0.9825 measured, 2026-11-28).
    assert_ranks_exact(&dir, "lightning", 0.965, None);
}

#[test]
fn a_sigkilled_rank_is_named_first() {
    if venv_bin().is_none() {
        return;
    }
    let dir = scratch("ddp-kill");
    let (code, err) = run_ddp(&dir, &[], &[("DDP_KILL_RANK", "1")]);
    assert_ne!(code, 0, "{err}");
    let job = read(&dir.join("r-job.json"));
    let pm = &job["post_mortem"];
    let d = pm["description"].as_str().unwrap();
    assert!(d.starts_with("rank 1 (pid "), "{d}");
    assert!(d.contains("failed first"), "{d}");
    // What it says of the job's own end, for `merge` to keep when another node failed first.
    let end = pm["job_end"].as_str().unwrap_or_default();
    assert!(
        !end.is_empty() && !end.contains("failed first") && d.contains(end),
        "job_end {end:?} of {d}"
    );
    assert_eq!(pm["cause"], "killed", "{pm}");
    let killed = read(&dir.join("r-1.json"));
    assert_eq!(
        killed["post_mortem"]["cause"], "signaled",
        "{}",
        killed["post_mortem"]
    );
}

/// A script in `dir` named `name`, executable.
fn script(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn the_same_figures_through_every_launcher() {
    let Some(bin) = venv_bin() else { return };
    let venv = bin.display().to_string();
    let base = scratch("ddp-launchers");
    // A wrapper script, and a pyenv-like shim: a bash script that runs helpers, then execs the
    // real program of the same name.
    let wrapper = script(
        &base,
        "train.sh",
        "#!/usr/bin/env bash\nset -e\necho \"starting $(basename \"$1\") at $(date)\" >&2\n\"$@\"\n",
    );
    let shims = base.join("shims");
    std::fs::create_dir(&shims).unwrap();
    script(
        &shims,
        "torchrun",
        &format!(
            "#!/usr/bin/env bash\nset -e\nprogram=\"$(basename \"$0\")\"\nexec \"{venv}/$program\" \"$@\"\n"
        ),
    );
    let lock = base.join("lock").display().to_string();
    let wrapper = wrapper.display().to_string();
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("env-bash wrapper", vec![wrapper]),
        (
            "prlimit",
            vec!["prlimit".into(), "--nofile=4096".into(), "--".into()],
        ),
        ("setpriv", vec!["setpriv".into(), "--no-new-privs".into()]),
        ("flock", vec!["flock".into(), lock]),
    ];
    for (how, launcher) in &cases {
        let dir = base.join(how.replace(' ', "-"));
        std::fs::create_dir(&dir).unwrap();
        let launcher: Vec<&str> = launcher.iter().map(String::as_str).collect();
        let (code, err) = run_ddp(&dir, &launcher, &[]);
        assert_eq!(code, 0, "{how}: {err}");
        assert_ranks_exact(&dir, how, TORCHRUN_LOW, Some("torchrun"));
    }
    // `bash -c` (bash's own `setenv` once kept the hand-off from its children) and the shim.
    for how in ["bash -c", "shim"] {
        let dir = base.join(how.replace(' ', "-"));
        std::fs::create_dir(&dir).unwrap();
        let torchrun = if how == "shim" {
            shims.join("torchrun")
        } else {
            bin.join("torchrun")
        };
        let line = format!(
            "{} --standalone --nproc_per_node=2 {}; true",
            torchrun.display(),
            job("ddp_train.py").display()
        );
        let out = Command::new(memsight_bin())
            .arg("run")
            .arg("--report")
            .arg(dir.join("r-{rank}.json"))
            .args(["--", "bash", "-c", &line])
            .env("DDP_OUT", &dir)
            .env("DDP_STEPS", "6")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{how}: {err}");
        assert_ranks_exact(&dir, how, TORCHRUN_LOW, Some("torchrun"));
    }
}

/// The kernel's resident figure for the process it OOM-killed, from its log (`None`: unreadable).
fn kernel_figure(pid: u64) -> Option<u64> {
    let out = Command::new("dmesg").output().ok()?;
    let log = String::from_utf8_lossy(&out.stdout);
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(&format!("Killed process {pid} ")))?;
    let kb = |key: &str| -> Option<u64> {
        let at = line.find(key)? + key.len();
        line[at..].split("kB").next()?.trim().parse().ok()
    };
    Some((kb("anon-rss:")? + kb("file-rss:")? + kb("shmem-rss:").unwrap_or(0)) * 1024)
}

#[test]
fn an_oom_killed_dataloader_worker_gets_a_verdict_naming_it() {
    oom_killed_worker_is_named("fork");
}

#[test]
fn an_oom_killed_spawned_dataloader_worker_is_a_worker_too() {
    // `multiprocessing_context="spawn"`: the worker is a new program, not a fork (break-it pass 5:
    // it was a `helper`, and before the loop's first step the job's `main process`).
    oom_killed_worker_is_named("spawn");
}

/// A 2-worker DataLoader job whose worker 1 is OOM-killed in a memory cgroup, its workers started
/// with `context`: the post-mortem names that worker, with the kernel's figure.
fn oom_killed_worker_is_named(context: &str) {
    let Some(bin) = venv_bin() else { return };
    let cg = match child_cgroup(&format!("worker-oom-{context}"), 900 << 20) {
        Ok(d) => d,
        Err(why) => {
            println!("SKIP: {why}");
            return;
        }
    };
    let dir = scratch(&format!("worker-oom-{context}"));
    let report = dir.join("r.json");
    let out = Command::new(memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg(bin.join("python"))
        .arg(job("dataloader_oom.py"))
        .env("JOB_CGROUP", &cg)
        .env("JOB_MP_CONTEXT", context)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    let err = String::from_utf8_lossy(&out.stderr);
    // The loop raises once it sees its worker gone (exit 1). On a busy machine the kernel may
    // also kill the loop before the worker's memory is reaped (a second OOM kill, exit 137);
    // the report must say so, and still name the worker first.
    let code = out.status.code();
    assert!(
        code == Some(1)
            || (code == Some(137) && err.contains("then the job: killed by the OOM killer")),
        "{err}"
    );
    let v = read(&report);
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "oom_killed", "{pm}");
    let worker = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["end"]["kind"] == "oom_killed")
        .unwrap_or_else(|| panic!("{}", v["processes"]))
        .clone();
    assert_eq!(worker["role"], "worker", "{worker}");
    let pid = worker["pid"].as_u64().unwrap();
    let d = pm["description"].as_str().unwrap();
    assert!(
        d.starts_with(&format!("worker (pid {pid}) failed first")),
        "{d}"
    );
    assert_eq!(pm["findings"][0]["kind"], "linux_oom_killer", "{pm}");
    assert!(
        pm["findings"][0]["evidence"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {pid}")),
        "{pm}"
    );
    // PyTorch's own error names the same worker (when the loop lived to raise it).
    if code == Some(1) {
        assert!(err.contains(&pid.to_string()), "{err}");
    }
    match kernel_figure(pid) {
        Some(kernel) => {
            // The size memsight gives: the kernel's own where its log is readable, else the
            // worker's last own sample.
            let said = worker["end"]["description"].as_str().unwrap().to_string() + d;
            let sizes = sizes_in(&said);
            println!("kernel {kernel} B; memsight said {sizes:?}");
            assert!(
                sizes
                    .iter()
                    .any(|&s| (s as f64 / kernel as f64 - 1.0).abs() <= 0.10),
                "{said}"
            );
        }
        None => println!("the kernel log is not readable here: its figure is not compared"),
    }
}

/// Every `N.NN MiB|GiB` in `text`, in bytes.
fn sizes_in(text: &str) -> Vec<u64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(2)
        .filter_map(|w| {
            let n: f64 = w[0].trim_start_matches('(').parse().ok()?;
            let unit = match w[1].trim_end_matches([',', ')', ';']) {
                "MiB" => 1u64 << 20,
                "GiB" => 1 << 30,
                _ => return None,
            };
            Some((n * unit as f64) as u64)
        })
        .collect()
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn two_nodes_reports_merge_into_one_job_report() {
    let Some(bin) = venv_bin() else { return };
    let base = scratch("ddp-nodes");
    let port = free_port().to_string();
    // Two `memsight run`s, one per "node", each with a torchrun agent of one rank: a two-node job
    // on one machine (static rendezvous on this host).
    let nodes: Vec<std::process::Child> = (0..2)
        .map(|n| {
            let dir = base.join(format!("node{n}"));
            std::fs::create_dir(&dir).unwrap();
            Command::new(memsight_bin())
                .arg("run")
                .arg("--report")
                .arg(dir.join("r-{rank}.json"))
                .arg("--")
                .arg(bin.join("torchrun"))
                .args([
                    "--nnodes=2",
                    &format!("--node_rank={n}"),
                    "--nproc_per_node=1",
                    "--master_addr=127.0.0.1",
                    &format!("--master_port={port}"),
                ])
                .arg(job("ddp_train.py"))
                .env("DDP_OUT", &base)
                .env("DDP_STEPS", "6")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for n in nodes {
        let out = n.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let merged = base.join("job.json");
    succeeds(
        Command::new(memsight_bin())
            .arg("merge")
            .arg("--report")
            .arg(&merged)
            .arg(base.join("node1/r-job.json"))
            .arg(base.join("node0/r-0.json")),
    );
    let v = read(&merged);
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    for (r, row) in ranks.iter().enumerate() {
        assert_eq!(row["rank"], r as u64, "{row}");
        let truth = read(&base.join(format!("rank{r}.json")));
        assert_eq!(row["pid"], truth["pid"], "{row}");
        let ratio =
            row["heap_peak_bytes"].as_f64().unwrap() / truth["glibc_in_use"].as_f64().unwrap();
        println!("merged rank {r}: heap peak / glibc {ratio:.4}");
        assert!((0.98..=1.02).contains(&ratio), "rank {r}: {ratio}");
    }
    // The merged report's base is rank 0's own.
    assert_eq!(v["job"]["pid"], ranks[0]["pid"]);
    // Merging a rank twice is refused.
    let twice = Command::new(memsight_bin())
        .arg("merge")
        .arg("--report")
        .arg(base.join("twice.json"))
        .arg(base.join("node0/r-0.json"))
        .arg(base.join("node0/r-job.json"))
        .output()
        .unwrap();
    assert_eq!(twice.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&twice.stderr).contains("rank 0 is in both"));
}

#[test]
fn a_child_started_without_memsight_is_said_to_be_unmeasured() {
    let Some(bin) = venv_bin() else { return };
    let dir = scratch("unmeasured");
    let report = dir.join("r.json");
    // The job starts a child with LD_PRELOAD cleared: it has no heap of its own to report. It lives
    // 4 s, so that the process tree (read with its PSS every 40× its read time under a budget of
    // 5% of a core, ten times the default) sees it twice over 500 ms apart even on a busy machine.
    let script = "import os, subprocess, sys\n\
                  env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}\n\
                  subprocess.run([sys.executable, '-c', \
                  'import time; x = bytearray(64 << 20); time.sleep(4)'], env=env, check=True)\n";
    succeeds(
        Command::new(memsight_bin())
            .args(["run", "--interval", "50ms", "--report"])
            .arg(&report)
            .env("MEMSIGHT_TREE_BUDGET", "0.05")
            .arg("--")
            .arg(bin.join("python"))
            .args(["-c", script]),
    );
    let v = read(&report);
    let rows = v["processes"].as_array().unwrap();
    let child = rows
        .iter()
        .find(|p| p["end"]["kind"] == "unmeasured")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert!(
        child["rss_peak_bytes"].as_u64().unwrap() >= 64 << 20,
        "{child}"
    );
    let said = v["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "unmeasured processes")
        .unwrap_or_else(|| panic!("{}", v["sources"]));
    assert!(said["detail"]
        .as_str()
        .unwrap()
        .contains(&child["pid"].to_string()));
}

/// Reliability case 42: a job that execs another program carrying memsight is measured after the
/// exec too: the report's peak is the exec'd program's.
#[test]
fn a_job_that_execs_another_program_is_measured_after_the_exec() {
    let Some(bin) = venv_bin() else { return };
    let dir = scratch("exec");
    let report = dir.join("r.json");
    let py = bin.join("python");
    let script = format!(
        "import os, time\na = bytearray(8 << 20)\ntime.sleep(0.3)\nos.execv({py:?}, [{py:?}, '-c', \
         'import sys, time; x = bytearray(64 << 20); time.sleep(0.5); sys.exit(12)'])\n",
        py = py.display().to_string()
    );
    let out = Command::new(memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg(&py)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(12),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read(&report);
    let peak = v["peaks"]["heap_peak_bytes"].as_u64().unwrap();
    assert!((64 << 20..70 << 20).contains(&peak), "{peak}");
    let ends: Vec<&Value> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["end"]["kind"])
        .collect();
    assert!(ends.contains(&&Value::from("exec")), "{ends:?}");
}

/// Programs that allocate their data late (past the 100 ms a session waits for) and exit at once:
/// the session starts on its starter thread while the program already exits. Every one exited
/// with its code, and the job exited 0: none may be said "killed by a signal" (12 of 20 were, and
/// the post-mortem of a clean job named one as "failed first").
#[test]
fn a_program_exiting_as_its_session_starts_is_said_to_exit_with_its_code() {
    if !preload_built() {
        return;
    }
    let dir = scratch("late-exit");
    let Some(exe) = memsight_e2e::c_program(
        &dir,
        "late",
        "#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n\
         char *volatile sink;\n\
         int main(void) {\n\
           struct timespec t = {0, 150 * 1000 * 1000};\n\
           nanosleep(&t, 0);\n\
           sink = malloc(3 << 20);\n\
           memset(sink, 1, 3 << 20);\n\
           exit(sink[100] == 1 ? 3 : 4);\n\
         }\n",
        &["-O1"],
    ) else {
        return;
    };
    let report = dir.join("r.json");
    let sh = format!(
        "for i in $(seq 20); do {} & done; wait; exit 0",
        exe.display()
    );
    let out = Command::new(memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(&report)
        .args(["--", "sh", "-c", &sh])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("failed first"), "{err}");
    let v = read(&report);
    let ends: Vec<&Value> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["command"][0].as_str() == exe.to_str())
        .map(|p| &p["end"])
        .collect();
    assert_eq!(ends.len(), 20, "{}", v["processes"]);
    for end in ends {
        assert_eq!(end["kind"], "exited", "{end}");
        assert_eq!(end["code"], 3, "{end}");
    }
}

/// A `multiprocessing.Pool` left by its `with` block terminates its workers (SIGTERM): the job
/// exits 0, yet its post-mortem said `worker (pid N) failed first: ended without exiting: killed by
/// a signal` and took the job for killed. A process killed by a signal (not the OOM killer) in a
/// job that then exits 0 is no failure: the job's end is the post-mortem's. Each worker's row keeps
/// its own heap and its end.
///
/// And when the job fails afterwards (exit 3, half a second after its pool ended), its own failure
/// leads the post-mortem, not the workers its pool stopped: each worker's end says the job's main
/// process sent it SIGTERM (the preloaded library notes `kill`, wire 1.9's `signal_sent`).
#[test]
fn a_pool_terminating_its_workers_at_its_end_is_no_failure() {
    for then_exit in ["0", "3"] {
        pool_end(then_exit);
    }
}

fn pool_end(then_exit: &str) {
    let Some(r) = memsight_e2e::run_python_job(
        "job-tree-pool-end",
        "pool_end.py",
        &[],
        &[("THEN_EXIT", then_exit)],
    ) else {
        return;
    };
    assert_eq!(r.code.to_string(), then_exit, "{}", r.out);
    let workers = r.truth["workers"].as_array().cloned().unwrap_or_default();
    assert_eq!(workers.len(), 2, "{}\n{}", r.truth, r.out);
    assert!(
        workers
            .iter()
            .any(|w| w["exit"].as_i64().is_some_and(|c| c < 0)),
        "the pool killed none of its workers, so the case did not happen: {}",
        r.truth
    );
    let pm = &r.report["post_mortem"];
    let said = pm["description"].as_str().unwrap_or_default();
    assert!(
        !said.contains("failed first") && said.contains(&format!("exited with code {then_exit}")),
        "{pm}\n{}",
        r.out
    );
    let main = r.report["job"]["pid"].as_u64().unwrap_or(0);
    assert_ne!(pm["cause"], "killed", "{pm}");
    // The pool's resource tracker ends with the job: it was not left running.
    assert!(
        !r.out.contains("still ran") && !r.report["sources"].to_string().contains("left running"),
        "{}",
        r.out
    );
    let rows = r.report["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for w in &workers {
        let row = rows
            .iter()
            .find(|p| p["pid"] == w["pid"])
            .unwrap_or_else(|| panic!("no row for worker {w}: {rows:?}"));
        let held = w["mib"].as_f64().unwrap_or(0.0);
        let heap = row["heap_peak_bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64;
        assert!(
            heap >= held && heap < held * 1.15,
            "worker {w}: heap peak {heap:.1} MiB for a {held} MiB block: {row}"
        );
        if w["exit"].as_i64() == Some(-libc::SIGTERM as i64) {
            assert_eq!(row["end"]["kind"], "killed", "{row}");
            let end = row["end"]["description"].as_str().unwrap_or_default();
            assert!(
                end.contains(&format!("(pid {main}) of the job sent it SIGTERM")),
                "{row}"
            );
        }
    }
}
