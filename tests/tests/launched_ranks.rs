//! A job whose launcher starts one `memsight run` per rank (`srun memsight run …`, `mpirun`,
//! `torchrun --no-python memsight run …`): every run's environment names its rank, so each keeps
//! a job report of its own (`{rank}` → `job-<N>`, else `<stem>.job-<N>.json`, for ranks above 0;
//! rank 0's is the job's path) beside its rank's report. They all wrote and locked the one `r-job.json` before: on one machine every run but
//! the first was refused (its rank never started), across machines they replaced each other's.
//! A rank started through a wrapper that execs its program (`#!/usr/bin/env bash` … `exec
//! python`) is that program: one row per rank, the program's heap as the job's headline.

use memsight_e2e::{memsight_bin, preload_built, scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const MIB: u64 = 1 << 20;

fn read(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// A `#!/usr/bin/env bash` wrapper that execs Python on a program holding `$HOLD_MIB` MiB until
/// `$SLURM_NTASKS` ranks have started (each touches `started-<rank>` in `$JOB_DIR`), so the runs
/// overlap.
fn wrapper(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let program = dir.join("rank.py");
    std::fs::write(
        &program,
        r#"import os, time
d, n = os.environ["JOB_DIR"], int(os.environ["SLURM_NTASKS"])
held = bytearray(int(os.environ["HOLD_MIB"]) << 20)
open(os.path.join(d, "started-" + os.environ["SLURM_PROCID"]), "w").close()
deadline = time.time() + 120
while time.time() < deadline and sum(f.startswith("started-") for f in os.listdir(d)) < n:
    time.sleep(0.05)
"#,
    )
    .unwrap();
    let script = dir.join("launch.sh");
    std::fs::write(
        &script,
        format!(
            "#!/usr/bin/env bash\nexec python3 {} \"$@\"\n",
            program.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// Starts `memsight run --report REPORT -- LAUNCH` (the [`wrapper`]) as task `rank` of `tasks`, the way `srun`
/// starts each task.
fn task(dir: &Path, launch: &Path, report: &Path, rank: u32, tasks: u32, hold_mib: u64) -> Child {
    Command::new(memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(report)
        .arg("--")
        .arg(launch)
        .env("JOB_DIR", dir)
        .env("HOLD_MIB", hold_mib.to_string())
        .env("SLURM_PROCID", rank.to_string())
        .env("SLURM_LOCALID", rank.to_string())
        .env("SLURM_NTASKS", tasks.to_string())
        .env_remove("RANK")
        .env_remove("LOCAL_RANK")
        .env_remove("WORLD_SIZE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memsight runs")
}

/// Waits for a task; its standard error, after checking it exited 0.
fn succeeded(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// The heap the job's headline and its one rank row say, checked against what the rank held.
fn check_job_report(job: &Value, rank: u64, hold_mib: u64) {
    let ranks = job["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 1, "one row per rank: {}", job["ranks"]);
    assert_eq!(ranks[0]["rank"], rank);
    let command = job["job"]["command"].to_string();
    assert!(
        command.contains("rank.py"),
        "the headline is the program the wrapper exec'd: {command}"
    );
    let truth = hold_mib * MIB;
    for peak in [
        job["peaks"]["heap_peak_bytes"].as_u64().unwrap(),
        ranks[0]["heap_peak_bytes"].as_u64().unwrap(),
    ] {
        // The block held, and at most a few MiB of the interpreter's own.
        assert!(
            peak >= truth && peak <= truth + truth / 50 + 4 * MIB,
            "heap peak {peak} for {truth} held"
        );
    }
}

#[test]
fn runs_a_launcher_starts_one_per_rank_each_keep_their_reports() {
    if !preload_built() {
        return;
    }
    let dir = scratch("launched-ranks");
    let report = dir.join("r-{rank}.json");
    let launch = wrapper(&dir);
    let holds = [40, 60];
    let tasks: Vec<Child> = holds
        .iter()
        .zip(0..)
        .map(|(&mib, rank)| task(&dir, &launch, &report, rank, 2, mib))
        .collect();
    let said: Vec<String> = tasks.into_iter().map(succeeded).collect();
    for (rank, &mib) in holds.iter().enumerate() {
        let job_path = match rank {
            0 => dir.join("r-job.json"),
            n => dir.join(format!("r-job-{n}.json")),
        };
        assert!(
            said[rank].contains(&format!("report written to {}", job_path.display())),
            "{}",
            said[rank]
        );
        check_job_report(&read(&job_path), rank as u64, mib);
        let own = read(&dir.join(format!("r-{rank}.json")));
        assert_eq!(own["ranks"][0]["rank"], rank);
    }

    // The two job reports merge into the job, ranks side by side.
    let merged = dir.join("merged.json");
    let out = Command::new(memsight_bin())
        .arg("merge")
        .arg("--report")
        .arg(&merged)
        .arg(dir.join("r-job.json"))
        .arg(dir.join("r-job-1.json"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let ranks: Vec<u64> = read(&merged)["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1], "{text}");
    assert!(text.contains("1.4"), "skew of 60 MiB over 40 MiB: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_a_placeholder_a_launched_run_names_its_job_report_after_its_rank() {
    if !preload_built() {
        return;
    }
    let dir = scratch("launched-rank-plain");
    let report = dir.join("r.json");
    let said = succeeded(task(&dir, &wrapper(&dir), &report, 3, 1, 24));
    assert!(dir.join("r.job-3.json").exists(), "{said}");
    check_job_report(&read(&dir.join("r.job-3.json")), 3, 24);
    assert_eq!(read(&dir.join("r.rank3.json"))["ranks"][0]["rank"], 3);
    assert!(!report.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
