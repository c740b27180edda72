//! The second break-it pass (issue 34), as a user would meet each case: a directory link another
//! user planted where the heap profiles go redirects nothing; records larger than a ring slot (a
//! 6 KB phase name, an 8-GPU snapshot) survive a SIGKILL; runtime directories another user took
//! first do not stop the job; two sidecars in separate PID namespaces sharing `/dev/shm` keep their
//! own sockets; `--report -` keeps the job's output out of the JSON.

use memsight_e2e::{memsight_bin, scratch, wait_until};
use serde_json::Value;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

const JOB: &str = env!("CARGO_BIN_EXE_stepping_job");
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Gives `path` (not following a link) to `nobody`.
fn give_to_nobody(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), NOBODY, NOBODY) }, 0);
}

/// Runs `cmd` with no standard input: (exit code, stdout, stderr).
fn outcome(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("the command runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn memsight(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let r = memsight_e2e::run_memsight_env(args, None, envs);
    (r.code, r.out, r.err)
}

/// `memsight run --report DIR/r.json -- EXE`: (exit code, stdout, stderr) and the report's path.
fn run_program(dir: &Path, exe: &Path) -> ((i32, String, String), std::path::PathBuf) {
    let report = dir.join("r.json");
    let ran = memsight(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
        ],
        &[],
    );
    (ran, report)
}

#[test]
fn a_planted_link_where_heap_profiles_go_redirects_nothing() {
    if !is_root() {
        println!("SKIP: needs root to plant a link as another user");
        return;
    }
    let dir = scratch("trust2-heapdir");
    let victim = dir.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("peak.heap"), "keep me").unwrap();
    // `nobody` plants X.heap -> victim where root's report X.json will put its profiles.
    std::os::unix::fs::symlink(&victim, dir.join("X.heap")).unwrap();
    give_to_nobody(&dir.join("X.heap"));
    let report = dir.join("X.json");
    let (code, _, err) = memsight(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            JOB,
            "exit",
            "0",
            "4",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(victim.join("peak.heap")).unwrap(),
        "keep me"
    );
    let written: Vec<_> = std::fs::read_dir(&victim).unwrap().flatten().collect();
    assert_eq!(
        written.len(),
        1,
        "profiles written through the link: {written:?}"
    );
    assert!(
        err.contains("not followed"),
        "no word about the link: {err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["cause"], "exited");
}

#[test]
fn records_larger_than_a_slot_survive_a_sigkill() {
    let dir = scratch("trust2-bigrecords");
    let report = dir.join("r.json");
    let long_phase = format!("forward-{}", "x".repeat(6000));
    let (code, _, err) = memsight(
        &[
            "run",
            "--interval",
            "50ms",
            "--report",
            report.to_str().unwrap(),
            "--",
            JOB,
            "kill",
        ],
        &[("JOB_PHASE_NAME", &long_phase)],
    );
    assert_ne!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let samples = v["timeline"].as_array().unwrap();
    // Before the fix: 1 sample, at step 0 (every snapshot with the long phase was dropped).
    assert!(samples.len() >= 2, "{} samples kept", samples.len());
    let last_step = samples.iter().filter_map(|s| s["step"].as_u64()).max();
    assert!(last_step >= Some(1), "last step {last_step:?}");
    let phases = v["phases"].as_array().unwrap();
    assert!(
        phases
            .iter()
            .any(|p| p["path"].as_str() == Some(format!("train/{long_phase}").as_str())),
        "the long phase is not in the phase table"
    );
    assert_eq!(
        v["post_mortem"]["records_dropped"], 0,
        "{}",
        v["post_mortem"]
    );
}

/// Runs `script` with `sh` in a new mount namespace (its own `/dev/shm`), or says why not.
fn in_own_mount_namespace(script: &str, envs: &[(&str, &str)]) -> Option<(i32, String, String)> {
    let ok = Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIP: cannot make a mount namespace here (unshare -m)");
        return None;
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-euc", script])
        .envs(envs.iter().copied())
        .env("MEMSIGHT", memsight_bin())
        .env("JOB", JOB)
        .env_remove("XDG_RUNTIME_DIR");
    Some(outcome(&mut cmd))
}

#[test]
fn runtime_directories_another_user_took_first_do_not_stop_the_job() {
    if !is_root() {
        println!("SKIP: needs root to act as another user");
        return;
    }
    let dir = scratch("trust2-runtime");
    let (tmp, home) = (dir.join("tmp"), dir.join("home"));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let report = dir.join("r.json");
    // `nobody` takes /dev/shm/memsight-0 and $TMPDIR/memsight-0 before root's run.
    let script = format!(
        "mount -t tmpfs none /dev/shm; \
         setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups mkdir /dev/shm/memsight-0 \
           || {{ mkdir /dev/shm/memsight-0; chown {NOBODY} /dev/shm/memsight-0; }}; \
         mkdir \"$TMPDIR/memsight-0\"; chown {NOBODY} \"$TMPDIR/memsight-0\"; \
         \"$MEMSIGHT\" run --report {} -- \"$JOB\" exit 0 3",
        report.display()
    );
    let Some((code, _, err)) = in_own_mount_namespace(
        &script,
        &[
            ("TMPDIR", tmp.to_str().unwrap()),
            ("HOME", home.to_str().unwrap()),
        ],
    ) else {
        return;
    };
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("passed over"),
        "no word about the taken directories: {err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["cause"], "exited");
    assert!(v["timeline"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(home.join(".cache/memsight/runtime").is_dir());
}

#[test]
fn sidecars_in_separate_pid_namespaces_keep_their_own_sockets() {
    let ok = Command::new("unshare")
        .args(["-p", "-f", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIP: cannot make a PID namespace here (unshare -pf --mount-proc)");
        return;
    }
    let dir = scratch("trust2-pidns");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).unwrap();
    let start = |name: &str| {
        Command::new("unshare")
            .args(["-p", "-f", "--mount-proc"])
            .arg(memsight_bin())
            .args(["run", "--report"])
            .arg(dir.join(name))
            .args([
                "--",
                "sh",
                "-c",
                "while [ ! -e \"$GO\" ]; do sleep 0.05; done",
            ])
            .env("XDG_RUNTIME_DIR", &runtime)
            .env("GO", dir.join("go"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start("a.json"), start("b.json"));
    // Both jobs are pid 2 in their namespaces: each sidecar must keep a socket of its own.
    let sockets = || {
        std::fs::read_dir(runtime.join("memsight"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".sock"))
                    .count()
            })
            .unwrap_or(0)
    };
    wait_until(120, || sockets() >= 2);
    let seen = sockets();
    std::fs::write(dir.join("go"), "").unwrap();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert_eq!(seen, 2, "sockets of two sidecars");
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(sockets(), 0, "each sidecar removes its own socket");
}

#[test]
fn report_to_standard_output_keeps_the_jobs_output_out_of_the_json() {
    let (code, out, err) = memsight(
        &[
            "run",
            "--report",
            "-",
            "--",
            "sh",
            "-c",
            "echo hello-from-the-job; echo and-its-stderr >&2",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["post_mortem"]["cause"], "exited");
    assert!(err.contains("hello-from-the-job"), "{err}");
    assert!(err.contains("and-its-stderr"), "{err}");
}

#[test]
fn a_dynamically_linked_musl_program_runs_under_memsight_run() {
    if !memsight_e2e::preload_built() {
        println!("SKIP: the preloaded library is not built (make build)");
        return;
    }
    let Some(cc) = ["musl-gcc"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        println!("SKIP: no musl-gcc (Debian: apt-get install musl-tools)");
        return;
    };
    let dir = scratch("trust2-musl");
    let src = dir.join("m.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\nint main(void){char*p=malloc(1<<20);\
         p[0]=1;printf(\"musl ran %d\\n\",p[0]);free(p);return 3;}\n",
    )
    .unwrap();
    let exe = dir.join("m");
    let built = Command::new(cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success());
    let ((code, out, err), report) = run_program(&dir, &exe);
    assert_eq!(code, 3, "the program's own exit code: {out}{err}");
    assert!(out.contains("musl ran 1"), "{out}{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["exit_code"], 3);
}

/// Builds a C program from `body` (the inside of `main`) with the system's compiler, or says why not.
fn c_program(dir: &Path, body: &str) -> Option<std::path::PathBuf> {
    let source = format!(
        "#include <stdint.h>\n#include <time.h>\n#include <unistd.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <malloc.h>\n\
         int main(void) {{ {body} }}\n"
    );
    memsight_e2e::c_program(dir, "p", &source, &["-O0"])
}

fn run_c(name: &str, body: &str) -> Option<(i32, Value)> {
    if !memsight_e2e::preload_built() {
        println!("SKIP: the preloaded library is not built (make build)");
        return None;
    }
    let dir = scratch(name);
    let exe = c_program(&dir, body)?;
    let ((code, _, err), report) = run_program(&dir, &exe);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap())
        .unwrap_or_else(|e| panic!("{e}: {err}"));
    Some((code, v))
}

#[test]
fn an_allocation_failure_the_program_survives_is_not_how_it_ended() {
    let Some((code, v)) = run_c(
        "trust2-survived",
        "void *p = malloc(SIZE_MAX); void *q = memalign((size_t)1 << 40, 64); \
         printf(\"%p %p\\n\", p, q); return 0;",
    ) else {
        return;
    };
    assert_eq!(code, 0);
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "exited", "{pm}");
    let d = pm["description"].as_str().unwrap();
    assert!(
        d.contains("2 allocations failed") && d.contains("went on"),
        "{d}"
    );
}

#[test]
fn an_aligned_request_is_judged_by_what_it_needs_not_its_size() {
    let Some((code, v)) = run_c(
        "trust2-aligned",
        "void *q = memalign((size_t)1 << 40, 64); if (!q) abort(); return 0;",
    ) else {
        return;
    };
    assert_ne!(code, 0);
    let pm = &v["post_mortem"];
    assert_eq!(pm["cause"], "out_of_memory", "{pm}");
    let d = pm["description"].as_str().unwrap();
    assert!(d.contains("1.00 TiB") && d.contains("never fit"), "{d}");
}

#[test]
fn blocks_freed_that_were_never_seen_allocated_do_not_hide_a_later_peak() {
    // 50 MiB allocated behind the interposed malloc (glibc's own entry point), freed through it,
    // then 50 MiB allocated and held: the heap peak is the 50 MiB held.
    let Some((code, v)) = run_c(
        "trust2-unseen",
        "extern void *__libc_malloc(size_t); char *b[200]; \
         for (int i = 0; i < 200; i++) { b[i] = __libc_malloc(256 << 10); b[i][0] = 1; } \
         for (int i = 0; i < 200; i++) free(b[i]); \
         char *p = malloc(50 << 20); for (size_t i = 0; i < (50u << 20); i += 4096) p[i] = 1; \
         struct timespec t = {0, 300000000}; nanosleep(&t, 0); \
         printf(\"%d\\n\", p[4096]); return 0;",
    ) else {
        return;
    };
    assert_eq!(code, 0);
    let peak = v["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        ((49 << 20)..(60 << 20)).contains(&peak),
        "heap peak {} MiB for 50 MiB held: {}",
        peak >> 20,
        v["peaks"]
    );
}

/// Starts `memsight run` in a process group of its own on a job that steps for about 6 s, waits
/// until the job runs, then sends SIGTERM to `whom` (the group, or memsight alone): the report.
fn terminated(name: &str, group: bool) -> (Option<i32>, Value) {
    use std::os::unix::process::CommandExt;
    let dir = scratch(name);
    let report = dir.join("r.json");
    let pid_file = dir.join("job.pid");
    let run = Command::new(memsight_bin())
        .args(["run", "--report"])
        .arg(&report)
        .args(["--", JOB, "exit", "0", "200"])
        .env("JOB_PID_FILE", &pid_file)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(120, || pid_file.exists());
    let target = if group {
        -(run.id() as i32)
    } else {
        run.id() as i32
    };
    // SAFETY: signalling the process (group) this test started.
    unsafe { libc::kill(target, libc::SIGTERM) };
    let out = run.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), serde_json::from_str(&text).unwrap())
}

#[test]
fn sigterm_to_the_process_group_keeps_the_report() {
    let (code, v) = terminated("trust2-sigterm-group", true);
    assert_eq!(code, Some(143), "the job's end, as a shell would say it");
    assert_eq!(
        v["post_mortem"]["cause"], "signaled",
        "{}",
        v["post_mortem"]
    );
    assert!(v["post_mortem"]["description"]
        .as_str()
        .is_some_and(|d| d.contains("SIGTERM")));
}

#[test]
fn sigterm_to_memsight_alone_is_passed_on_and_keeps_the_report() {
    let (code, v) = terminated("trust2-sigterm-alone", false);
    assert_eq!(code, Some(143));
    assert_eq!(
        v["post_mortem"]["cause"], "signaled",
        "{}",
        v["post_mortem"]
    );
}

#[test]
fn two_runs_given_the_same_report_do_not_lose_one_silently() {
    let dir = scratch("trust2-same-report");
    let report = dir.join("r.json");
    let pid_file = dir.join("job.pid");
    let go = dir.join("go");
    let first = Command::new(memsight_bin())
        .args(["run", "--report"])
        .arg(&report)
        .args(["--", JOB, "exit", "0", "6"])
        .env("JOB_PID_FILE", &pid_file)
        .env("JOB_WAIT_FILE", &go)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(120, || pid_file.exists());
    let (code, _, err) = memsight(
        &[
            "run",
            "--report",
            report.to_str().unwrap(),
            "--",
            JOB,
            "exit",
            "0",
            "2",
        ],
        &[],
    );
    std::fs::write(&go, "").unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("another memsight run is writing"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["post_mortem"]["cause"], "exited");
}

#[test]
fn a_bad_interval_or_a_non_utf8_argument_costs_a_warning_not_the_job() {
    use std::os::unix::ffi::OsStringExt;
    let dir = scratch("trust2-badenv");
    let report = dir.join("r.json");
    let out = Command::new(JOB)
        .args(["exit", "0", "2"])
        .arg(std::ffi::OsString::from_vec(b"caf\xe9".to_vec()))
        .env("MEMSIGHT_INTERVAL_MS", "abc")
        .env("MEMSIGHT_REPORT", &report)
        .env("MEMSIGHT_RING", "off")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("MEMSIGHT_INTERVAL_MS"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let cmd = v["job"]["command"].to_string();
    assert!(cmd.contains("caf\u{fffd}"), "{cmd}");
}

#[test]
fn a_job_that_execs_a_program_without_memsight_is_sampled_from_outside_after() {
    // 8 MiB in the first image, then exec python holding 64 MiB: the RSS peak is the python's.
    let Some((code, v)) = run_c(
        "trust2-exec",
        "char *p = malloc(8 << 20); for (int i = 0; i < (8 << 20); i += 4096) p[i] = 1; \
         struct timespec t = {0, 300000000}; nanosleep(&t, 0); \
         execlp(\"python3\", \"python3\", \"-c\", \
                \"import time; b = bytearray(64 << 20); time.sleep(1.0)\", (char *)0); \
         return 99;",
    ) else {
        return;
    };
    assert_eq!(code, 0);
    let rss = v["peaks"]["rss_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        rss >= 64 << 20,
        "RSS peak {} MiB: the exec'd program was not sampled",
        rss >> 20
    );
    let age = v["post_mortem"]["last_sample_age_ms"]
        .as_u64()
        .unwrap_or(u64::MAX);
    assert!(age < 1000, "last sample {age} ms before the end");
}

/// Reliability case 33: the ring's owner truncates it under the running job. The job must not die
/// of SIGBUS: it runs on and exits with its own code, and the report is written.
#[test]
fn a_ring_cut_short_under_the_job_does_not_kill_it() {
    let dir = scratch("ring-truncated");
    let pid_file = dir.join("pid");
    let report = dir.join("r.json");
    let run = Command::new(memsight_bin())
        .args(["run", "--interval", "10ms", "--report"])
        .arg(&report)
        .args(["--", env!("CARGO_BIN_EXE_stepping_job"), "exit", "7", "60"])
        .env("JOB_PID_FILE", &pid_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ring = None;
    assert!(
        wait_until(60, || {
            let pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|p| p.trim().parse::<u32>().ok());
            ring = pid.and_then(|p| memsight::wire::ring_of(p).ok());
            ring.is_some()
        }),
        "the job's ring never appeared"
    );
    let ring = ring.unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ring)
        .unwrap()
        .set_len(0)
        .unwrap();
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(!err.contains("SIGBUS"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(v["job"]["exit"]["code"], 7, "{}", v["job"]);
}
