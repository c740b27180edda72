//! The third break-it pass: third-party launchers and odd environments as a new user meets them.
//! A program a launcher starts with a cleared environment (`env -i`) is measured from its first
//! instant; ranks that a launcher gives only their local rank (Lightning's `ddp`) are ranks; the
//! heap profiles of a `--report 'r-{rank}.json'` job go beside the job's report.

use memsight_e2e::{memsight_bin, run_memsight, scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A C program `hold MIB MS CODE`: allocates and touches MIB MiB, holds it MS ms, exits CODE.
fn hold_program(dir: &Path) -> Option<PathBuf> {
    memsight_e2e::c_program(
        dir,
        "hold",
        "#include <stdlib.h>\n#include <string.h>\n#include <unistd.h>\n\
         volatile char sink;\n\
         int main(int c, char **v) {\n\
           size_t mib = atol(v[1]); int ms = atoi(v[2]); int code = atoi(v[3]);\n\
           char *p = malloc(mib << 20); memset(p, 1, mib << 20); sink = p[mib];\n\
           usleep(ms * 1000); sink = p[ms]; free(p); return code;\n\
         }\n",
        &["-O1"],
    )
}

fn setup(name: &str) -> Option<(PathBuf, PathBuf)> {
    if !memsight_e2e::preload_built() {
        return None;
    }
    let dir = scratch(name);
    let exe = hold_program(&dir)?;
    Some((dir, exe))
}

fn report(path: &Path, err: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report at {}: {e}; memsight said: {err}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// `env -i PATH=… prog` starts the program without `LD_PRELOAD`: it carries no memsight, and it
/// ran for less than the second after which a job that left its flight recorder is sampled from
/// outside. Its memory must still be seen (from outside, from the instant of the exec), and a
/// budget it breaks must fail.
#[test]
fn a_short_program_started_with_a_cleared_environment_is_measured_from_its_first_instant() {
    let Some((dir, exe)) = setup("bi3-env-i") else {
        return;
    };
    let r = dir.join("r.json");
    let exe = exe.to_str().unwrap();
    let run = run_memsight(
        &[
            "run",
            "--interval",
            "20ms",
            "--report",
            r.to_str().unwrap(),
            "--",
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            exe,
            "64",
            "600",
            "5",
        ],
        None,
    );
    assert_eq!(run.code, 5, "{}", run.err);
    let v = report(&r, &run.err);
    let rss = v["peaks"]["rss_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        rss >= 64 << 20,
        "RSS peak {:.1} MiB for a program holding 64 MiB: {}",
        rss as f64 / 1048576.0,
        run.err
    );
    let check = run_memsight(
        &["check", r.to_str().unwrap(), "--max-rss-peak", "10MiB"],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
}

/// The same program with the library (a plain exec through `env`) is measured by its own ring:
/// the outside samples taken while its session was not yet open are not mixed into it.
#[test]
fn a_program_exec_d_with_the_library_keeps_its_own_figures() {
    let Some((dir, exe)) = setup("bi3-env") else {
        return;
    };
    let r = dir.join("r.json");
    let run = run_memsight(
        &[
            "run",
            "--interval",
            "20ms",
            "--report",
            r.to_str().unwrap(),
            "--",
            "env",
            exe.to_str().unwrap(),
            "64",
            "600",
            "5",
        ],
        None,
    );
    assert_eq!(run.code, 5, "{}", run.err);
    let v = report(&r, &run.err);
    let heap = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(heap >= 64 << 20, "heap peak {heap}: {}", run.err);
    let main: Vec<&Value> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "main")
        .collect();
    assert_eq!(main.len(), 1, "{}", v["processes"]);
    assert!(main[0]["heap_peak_bytes"].as_u64().unwrap_or(0) >= 64 << 20);
}

/// Lightning's `ddp` starts rank 1 with `LOCAL_RANK=1 NODE_RANK=0 WORLD_SIZE=2` and no `RANK`.
/// Such processes are ranks: each gets its rank report, and the job's ranks list holds them.
#[test]
fn ranks_given_only_their_local_rank_are_ranks() {
    let Some((dir, exe)) = setup("bi3-local-rank") else {
        return;
    };
    let r = dir.join("r.json");
    let exe = exe.to_str().unwrap();
    let script = format!(
        "LOCAL_RANK=0 NODE_RANK=0 WORLD_SIZE=2 {exe} 16 1500 0 & \
         LOCAL_RANK=1 NODE_RANK=0 WORLD_SIZE=2 {exe} 48 1500 0 & wait"
    );
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    let v = report(&r, &run.err);
    let ranks: Vec<(u64, u64)> = v["ranks"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|k| {
            (
                k["rank"].as_u64().unwrap_or(99),
                k["heap_peak_bytes"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        ranks.iter().map(|k| k.0).collect::<Vec<_>>(),
        vec![0, 1],
        "{}",
        v["processes"]
    );
    assert!(ranks[0].1 >= 16 << 20 && ranks[0].1 < 32 << 20, "{ranks:?}");
    assert!(ranks[1].1 >= 48 << 20, "{ranks:?}");
    for k in 0..2 {
        assert!(dir.join(format!("r.rank{k}.json")).exists(), "{}", run.err);
    }
}

/// `--report 'out/r-{rank}.json'`: every file memsight writes has the placeholder replaced; the
/// job's heap profiles go to `r-job.heap/`, not a directory named `r-{rank}.heap`.
#[test]
fn a_rank_template_names_no_file_with_the_placeholder() {
    let Some((dir, exe)) = setup("bi3-rank-heap") else {
        return;
    };
    let template = dir.join("r-{rank}.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            template.to_str().unwrap(),
            "--",
            "env",
            "RANK=0",
            "WORLD_SIZE=1",
            exe.to_str().unwrap(),
            "32",
            "400",
            "0",
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    assert!(dir.join("r-job.json").exists(), "{}", run.err);
    assert!(dir.join("r-0.json").exists(), "{}", run.err);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("{rank}")),
        "files named with the placeholder: {names:?}"
    );
    assert!(dir.join("r-job.heap").is_dir(), "{names:?}");
    let _ = memsight_bin();
}

/// A process of the job that outlives its first one (Python's multiprocessing resource tracker
/// exits only once its pipe closes; a daemon) was "killed by a signal" and the job's post-mortem
/// said it "failed first" of a job that exited 0. It is still running when the report is written.
#[test]
fn a_process_that_outlives_the_job_is_still_running_not_killed() {
    let Some((dir, exe)) = setup("bi3-outlives") else {
        return;
    };
    let r = dir.join("r.json");
    // The first process waits until the child's ring exists (its session started), then exits.
    let script = format!(
        "{} 16 6000 0 & child=$!; \
         while ! ls \"$MEMSIGHT_JOB\"-p$child-*.bin >/dev/null 2>&1; do sleep 0.05; done; \
         echo $child > {}/child; exit 0",
        exe.display(),
        dir.display()
    );
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    let child: u64 = std::fs::read_to_string(dir.join("child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let v = report(&r, &run.err);
    let row = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(child))
        .unwrap_or_else(|| panic!("no row for {child}: {}", v["processes"]))
        .clone();
    assert_eq!(row["end"]["kind"], "running", "{row}");
    let pm = v["post_mortem"]["description"].as_str().unwrap_or("");
    assert!(!pm.contains("failed first"), "{pm}");
    assert!(!run.err.contains("failed first"), "{}", run.err);
    // SAFETY: ending the child this test started.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
}

/// A training script that runs a tool holding more memory than the script itself (here a
/// helper; DataLoader workers started with `spawn` are the same): the process that ran training
/// steps is the job's main process, the tool a helper.
#[test]
fn the_process_that_runs_training_steps_is_the_main_one() {
    let Some((dir, exe)) = setup("bi3-trainer-main") else {
        return;
    };
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        format!(
            "import memsight, subprocess, time\n\
             keep = bytearray(24 << 20)\n\
             for i in range(0, len(keep), 4096): keep[i] = 1\n\
             for n in range(1, 4):\n    memsight.step(n)\n    time.sleep(0.05)\n\
             subprocess.run([{:?}, '64', '1000', '0'], check=True)\n",
            exe.display().to_string()
        ),
    )
    .unwrap();
    let r = dir.join("r.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "python3",
            script.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    let v = report(&r, &run.err);
    let procs = v["processes"].as_array().unwrap();
    // A program's process, not an image that exec'd it (`python3` may be a pyenv shim).
    let role_of = |needle: &str| {
        procs
            .iter()
            .filter(|p| p["end"]["kind"] != "exec")
            .find(|p| {
                p["command"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|a| a.as_str().is_some_and(|a| a.ends_with(needle)))
                })
            })
            .map(|p| p["role"].clone())
    };
    assert_eq!(role_of("train.py"), Some(Value::from("main")), "{procs:?}");
    assert_eq!(role_of("hold"), Some(Value::from("helper")), "{procs:?}");
    let heap = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!((24 << 20..64 << 20).contains(&heap), "headline heap {heap}");
}

/// A link planted where a rank's report goes (`--report '/tmp/r-{rank}.json'`, a shared `/tmp`)
/// cannot be refused before the job starts, since ranks are known only once they run. It is said
/// as the rank appears, the link is not followed, and at the end the message names the rank whose
/// report was lost; it never says the job's report (which was written) was not.
#[test]
fn a_link_planted_where_a_rank_report_goes_is_said_as_the_rank_appears() {
    let Some((dir, exe)) = setup("bi3-rank-link") else {
        return;
    };
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("r-0.json")).unwrap();
    let template = dir.join("r-{rank}.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            template.to_str().unwrap(),
            "--",
            "env",
            "RANK=0",
            "WORLD_SIZE=1",
            exe.to_str().unwrap(),
            "16",
            "3000",
            "0",
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(dir.join("r-job.json").exists(), "{}", run.err);
    assert!(
        run.err.contains("rank 0's report cannot be written"),
        "not said while the job ran: {}",
        run.err
    );
    assert!(
        run.err.contains("rank 0's report was not written"),
        "{}",
        run.err
    );
    assert!(
        !run.err.contains("memsight: the report was not written"),
        "{}",
        run.err
    );
}

/// A launcher that forks its program and only waits (`/usr/bin/time`, a `--no-python` wrapper of
/// `torchrun`) carries the library but allocates too little to start a session. Its row said it
/// "carries no memsight" — as if started without `LD_PRELOAD` — which is not why.
#[test]
fn a_launcher_that_only_waits_is_not_said_to_carry_no_memsight() {
    let Some((dir, exe)) = setup("bi3-waiter") else {
        return;
    };
    let src = dir.join("waiter.c");
    std::fs::write(
        &src,
        "#include <sys/wait.h>\n#include <unistd.h>\n\
         int main(int c, char **v) { (void)c; pid_t p = fork(); \
         if (p == 0) { execv(v[1], v + 1); _exit(127); } \
         int s = 0; waitpid(p, &s, 0); return WIFEXITED(s) ? WEXITSTATUS(s) : 1; }\n",
    )
    .unwrap();
    let waiter = dir.join("waiter");
    assert!(Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&waiter)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    // Below the job's first process (which always starts its session), as under torchrun.
    let script = format!("{} {} 32 1500 4; exit $?", waiter.display(), exe.display());
    let r = dir.join("r.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
    );
    assert_eq!(run.code, 4, "{}", run.err);
    let v = report(&r, &run.err);
    let text = v.to_string();
    assert!(!text.contains("carries no memsight"), "{}", v["processes"]);
    assert!(!text.contains("carried no memsight"), "{}", v["sources"]);
    let waiter_row = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["end"]["kind"] == "unmeasured")
        .unwrap_or_else(|| panic!("no unmeasured row: {}", v["processes"]))
        .clone();
    let said = waiter_row["end"]["description"].as_str().unwrap_or("");
    assert!(said.starts_with("no memsight session"), "{said}");
    let heap = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(heap >= 32 << 20, "heap {heap}");
}

/// `diagnose --report R` with no log and an empty standard input (a CI step) reads both; when
/// neither has an OOM it said only "no out-of-memory message found in standard input", not that
/// the report was read too.
#[test]
fn diagnose_of_a_report_without_ooms_names_the_report_it_read() {
    let Some((dir, exe)) = setup("bi3-diagnose") else {
        return;
    };
    let r = dir.join("r.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
            "8",
            "200",
            "0",
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    let d = run_memsight(&["diagnose", "--report", r.to_str().unwrap()], None);
    assert_eq!(d.code, 1, "{}{}", d.out, d.err);
    assert!(
        d.out.contains("standard input") && d.out.contains(r.to_str().unwrap()),
        "{}",
        d.out
    );
}

/// `memsight attach PID` to a process of a job under `memsight run` (a rank, the training script)
/// found no ring (it looked for `ring-<pid>.bin` only, not the job's `<prefix>-p<pid>-….bin`) and
/// sampled it from outside: heap 0, step 0, while the process had a session and 64 MiB of heap.
#[test]
fn attach_to_a_process_of_a_run_job_follows_its_own_ring() {
    let Some((dir, exe)) = setup("bi3-attach") else {
        return;
    };
    let pid_file = dir.join("child");
    let script = format!(
        "{} 64 4000 0 & c=$!; \
         while ! ls \"$MEMSIGHT_JOB\"-p$c-*.bin >/dev/null 2>&1; do sleep 0.05; done; \
         echo $c > {}; wait $c",
        exe.display(),
        pid_file.display()
    );
    let r = dir.join("r.json");
    let mut job = Command::new(memsight_bin())
        .args([
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        memsight_e2e::wait_until(60, || std::fs::read_to_string(&pid_file)
            .is_ok_and(|s| s.ends_with('\n'))),
        "the job's child never started its session"
    );
    let child = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let a = dir.join("a.json");
    let att = run_memsight(&["attach", &child, "--report", a.to_str().unwrap()], None);
    assert_eq!(att.code, 0, "{}", att.err);
    let _ = job.wait();
    let v = report(&a, &att.err);
    let heap = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(heap >= 64 << 20, "attach read heap {heap}: {}", att.err);
}

/// A pseudo-terminal pair: (controller, terminal), not inherited by other tests' children.
fn pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut c, mut t) = (0, 0);
    let ws = libc::winsize {
        ws_row: 30,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors; the name and termios are optional.
    let rc = unsafe { libc::openpty(&mut c, &mut t, std::ptr::null_mut(), std::ptr::null(), &ws) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    for fd in [c, t] {
        // SAFETY: setting a flag on a descriptor we own.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: fresh descriptors we own.
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(c),
            std::os::fd::OwnedFd::from_raw_fd(t),
        )
    }
}

/// `memsight top PID` with the pid a user sees in `ps` or `nvidia-smi` — a rank, a worker, the
/// training script under a wrapper — said "no sidecar" (the socket is named by the job's first
/// process). It follows the job of the nearest ancestor that has a sidecar.
#[test]
fn top_with_the_pid_of_a_process_inside_a_job_opens_the_job() {
    use std::os::fd::AsRawFd;
    let Some((dir, exe)) = setup("bi3-top-child") else {
        return;
    };
    let pid_file = dir.join("child");
    let script = format!(
        "{} 16 20000 0 & c=$!; echo $c > {}; wait $c",
        exe.display(),
        pid_file.display()
    );
    let r = dir.join("r.json");
    let mut job = Command::new(memsight_bin())
        .args([
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(memsight_e2e::wait_until(60, || std::fs::read_to_string(
        &pid_file
    )
    .is_ok_and(|s| s.ends_with('\n'))));
    let child = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    let (controller, terminal) = pty();
    let mut top = Command::new(memsight_bin())
        .args(["top", &child])
        .stdin(std::process::Stdio::from(terminal.try_clone().unwrap()))
        .stdout(std::process::Stdio::from(terminal.try_clone().unwrap()))
        .stderr(std::process::Stdio::piped())
        .env("TERM", "xterm")
        .spawn()
        .unwrap();
    let raw = || {
        // SAFETY: tcgetattr fills a termios we own.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::tcgetattr(terminal.as_raw_fd(), &mut t) } == 0;
        ok && t.c_lflag & libc::ICANON == 0
    };
    let up = memsight_e2e::wait_until(60, || raw() || top.try_wait().ok().flatten().is_some());
    let status = if raw() {
        // SAFETY: signalling the viewer this test started.
        unsafe { libc::kill(top.id() as i32, libc::SIGTERM) };
        top.wait().unwrap()
    } else {
        top.wait().unwrap()
    };
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut top.stderr.take().unwrap(), &mut err);
    // SAFETY: ending the job's program this test started.
    unsafe { libc::kill(child.parse::<i32>().unwrap(), libc::SIGKILL) };
    let _ = job.wait();
    drop(controller);
    assert!(up, "the viewer neither came up nor ended");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "the viewer did not come up: {err}"
    );
}

/// `check JOB.json` of a multi-rank job gated the headline alone, which is the lowest rank's: a
/// rank 1 holding three times the budget passed (`every budget holds`). Every rank is gated, on
/// its own report, and on its row's heap peak where that report cannot be read.
#[test]
fn check_of_a_job_report_gates_every_rank() {
    let Some((dir, exe)) = setup("bi3-check-ranks") else {
        return;
    };
    let exe = exe.to_str().unwrap();
    let script =
        format!("RANK=0 WORLD_SIZE=2 {exe} 16 1500 0 & RANK=1 WORLD_SIZE=2 {exe} 96 1500 0 & wait");
    let r = dir.join("r.json");
    let run = run_memsight(
        &[
            "run",
            "--report",
            r.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
    );
    assert_eq!(run.code, 0, "{}", run.err);
    let check = |report: &Path| {
        run_memsight(
            &[
                "check",
                report.to_str().unwrap(),
                "--max-host-peak",
                "32MiB",
            ],
            None,
        )
    };
    let job = check(&r);
    assert_eq!(job.code, 1, "{}{}", job.out, job.err);
    assert!(job.out.contains("rank 1 (pid"), "{}", job.out);
    assert_eq!(check(&dir.join("r.rank0.json")).code, 0);
    // The job's report alone, its ranks' reports out of reach: the rows' heap peaks are gated.
    let alone = scratch("bi3-check-ranks-alone");
    let moved = alone.join("job.json");
    let text = std::fs::read_to_string(&r).unwrap();
    let relocated = text.replace(dir.to_str().unwrap(), "/nonexistent-memsight-dir");
    std::fs::write(&moved, relocated).unwrap();
    let job = check(&moved);
    assert_eq!(job.code, 1, "{}{}", job.out, job.err);
    assert!(
        job.out.contains("rank 1 (pid") && job.out.contains("could not be read"),
        "{}",
        job.out
    );
}

/// Prometheus's per-process heap (`memsight_process_heap_bytes{pid,role}`) was set only when the
/// process tree was read, which its CPU budget spaces seconds apart in a large job: a rank that
/// grew 300 MiB showed its old heap for the rest of the run. It follows each flight recorder.
#[test]
fn per_process_heap_metrics_follow_the_rings_not_the_tree_reads() {
    let Some((dir, _)) = setup("bi3-metrics") else {
        return;
    };
    // Maps and touches 1 GiB outside the heap (each read of its PSS walks those pages: with the
    // least tree budget, reads come tens of seconds apart), waits for GO, then allocates 96 MiB
    // without touching it (the heap grows, RSS does not).
    let src = dir.join("grow.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n#include <string.h>\n#include <unistd.h>\n#include <sys/mman.h>\n\
         volatile char *keep;\n\
         int main(int c, char **v) { (void)c; \
         char *m = mmap(0, 1UL << 30, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); \
         if (m != MAP_FAILED) memset(m, 1, 1UL << 30); \
         while (access(v[1], F_OK) != 0) usleep(20000); \
         keep = malloc(96 << 20); sleep(20); return 0; }\n",
    )
    .unwrap();
    let grow = dir.join("grow");
    assert!(Command::new("cc")
        .arg("-o")
        .arg(&grow)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let go = dir.join("GO");
    let r = dir.join("r.json");
    let mut job = Command::new(memsight_bin())
        .args(["run", "--metrics", &format!("127.0.0.1:{port}"), "--report"])
        .arg(&r)
        .arg("--")
        .arg(&grow)
        .arg(&go)
        .env("MEMSIGHT_TREE_BUDGET", "0.0001")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let scrape = || -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .ok()?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let heap = |text: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with("memsight_process_heap_bytes{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.trim().parse().ok())
    };
    // The process is in the gauges (its ring is followed and the tree was read once).
    assert!(
        memsight_e2e::wait_until(60, || scrape().as_deref().and_then(heap).is_some()),
        "no per-process heap gauge"
    );
    std::fs::write(&go, "").unwrap();
    // A poll of the rings is 50 ms: 5 s is generous (a tree read here comes ~10 s apart).
    let grown = memsight_e2e::wait_until(5, || {
        scrape()
            .as_deref()
            .and_then(heap)
            .is_some_and(|h| h >= 96 << 20)
    });
    let last = scrape();
    // The program holds 1 GiB: end it with its sidecar.
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", job.id()))
        .unwrap_or_default();
    for c in children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
    {
        // SAFETY: signalling the program this test's sidecar started.
        unsafe { libc::kill(c, libc::SIGKILL) };
    }
    let _ = job.wait();
    assert!(grown, "the gauge kept the heap of before: {last:?}");
}
