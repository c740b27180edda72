//! Break-it pass 9 (docs/reliability.md): odd launchers, third-party scripts and hostile files, as
//! a new user — each figure checked against what the job itself holds or does. Needs the preloaded
//! library (`make build`) and a C compiler; each test skips, saying why, without.

use memsight_e2e::{c_program, preload_built, run_job, scratch};
use serde_json::Value;

/// A supervisor that takes its signals synchronously, as `script`, `tini` and process managers do:
/// it blocks `SIGCHLD`, reads it from a `signalfd` and only then reaps its child. It holds 32 MiB
/// (so memsight's session starts) and waits, up to 30 s, until memsight's threads run in it, as
/// such a program started under `memsight run` finds them; then it forks a child that exits 3 and
/// waits for the signal up to 30 s more (exit 99 when it never comes).
const SIGNALFD_SUPERVISOR: &str = r#"
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

static int threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Threads:", 8)) n = atoi(line + 8);
    if (f) fclose(f);
    return n;
}

int main(void) {
    size_t size = 32u << 20;
    char *held = malloc(size);
    memset(held, 1, size);
    for (int i = 0; i < 600 && threads() < 2; i++) usleep(50000);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int fd = signalfd(-1, &chld, 0);
    pid_t child = fork();
    if (child == 0) _exit(3);
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 30000) != 1) {
        fprintf(stderr, "SIGCHLD never came\n");
        return 99;
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child exited with %d\n", WEXITSTATUS(status));
    free(held);
    return WEXITSTATUS(status);
}
"#;

/// `memsight run -- script -qc CMD /dev/null` hung for good: `script` waits for its child's
/// `SIGCHLD` on a `signalfd` with the signal blocked in its own thread, and the kernel handed the
/// signal to a memsight thread (the starter or the sampler), where it was discarded, so the child
/// stayed a zombie and `script` waited forever. memsight's threads now block the job's signals.
#[test]
fn a_program_that_reads_its_signals_from_a_signalfd_gets_them() {
    if !preload_built() {
        return;
    }
    let dir = scratch("break9-signalfd");
    let Some(exe) = c_program(&dir, "supervisor", SIGNALFD_SUPERVISOR, &["-O1"]) else {
        return;
    };
    let run = run_job(&dir, &[], &[exe.as_os_str()], &[]);
    assert!(
        !run.out.contains("SIGCHLD never came"),
        "the job's SIGCHLD was taken by memsight:\n{}",
        run.out
    );
    assert_eq!(run.code, 3, "{}", run.out);
    assert!(run.out.contains("child exited with 3"), "{}", run.out);
    let report: Value = serde_json::from_str(&run.report).expect("a report");
    assert_eq!(report["job"]["exit"]["code"], 3, "{}", run.out);
    let heap = report["peaks"]["heap_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        heap >= 32 << 20,
        "heap peak {heap} B for 32 MiB held\n{}",
        run.out
    );
}

/// A rank of a launched job (`RANK` in its environment, as a launcher starting one `memsight run`
/// per rank gives it): holds 8 MiB, creates the file MINE, waits (up to 30 s) until the file OTHER
/// exists, and exits 0 — two of them started together with each other's files run at one time.
const RANK_JOB: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t size = 8u << 20;
    char *held = malloc(size);
    memset(held, 1, size);
    usleep(500000);
    FILE *f = fopen(argv[1], "w");
    if (f) fclose(f);
    for (int i = 0; i < 600 && access(argv[2], F_OK) != 0; i++) usleep(50000);
    free(held);
    return 0;
}
"#;

/// `memsight run --report DIR/r-{rank}.json -- rank_job MINE OTHER` with `RANK=rank`, started (not
/// waited for).
fn start_rank(dir: &std::path::Path, exe: &std::path::Path, rank: u32) -> std::process::Child {
    let out = dir.join(format!("node{rank}"));
    std::fs::create_dir_all(&out).expect("a node's directory");
    std::process::Command::new(memsight_e2e::memsight_bin())
        .arg("run")
        .arg("--report")
        .arg(out.join("r-{rank}.json"))
        .arg("--")
        .arg(exe)
        .arg(dir.join(format!("up{rank}")))
        .arg(dir.join(format!("up{}", 1 - rank)))
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("memsight runs")
}

/// `memsight merge` of two rank reports of runs that never met — one job's rank 0 and another's
/// rank 1, a minute apart — merged them as one job without a word, its skew comparing unrelated
/// runs. Now it says so; the ranks of one job, run together, are merged as before.
#[test]
fn merging_reports_of_runs_apart_in_time_says_so() {
    if !preload_built() {
        return;
    }
    let dir = scratch("break9-merge-apart");
    let Some(exe) = c_program(&dir, "rank_job", RANK_JOB, &["-O1"]) else {
        return;
    };
    let rank_reports =
        |dir: &std::path::Path| (dir.join("node0/r-0.json"), dir.join("node1/r-1.json"));
    // One job: both ranks at once, each waiting for the other to be up.
    let together = dir.join("together");
    std::fs::create_dir_all(&together).expect("a directory");
    let mut both = [
        start_rank(&together, &exe, 0),
        start_rank(&together, &exe, 1),
    ];
    for run in &mut both {
        assert!(run.wait().expect("memsight ends").success());
    }
    let (r0, r1) = rank_reports(&together);
    let merged = dir.join("merged.json");
    let m = memsight_e2e::run_memsight(
        &[
            "merge".as_ref(),
            "--report".as_ref(),
            merged.as_os_str(),
            r0.as_os_str(),
            r1.as_os_str(),
        ],
        None,
    );
    assert_eq!(m.code, 0, "{}", m.err);
    assert!(!m.err.contains("before"), "{}", m.err);
    // Two runs, one after the other: rank 0 alone (its "other" is itself), then rank 1 alone.
    let apart = dir.join("apart");
    std::fs::create_dir_all(&apart).expect("a directory");
    std::fs::write(apart.join("up1"), "").expect("a marker");
    assert!(start_rank(&apart, &exe, 0).wait().expect("ends").success());
    std::fs::remove_file(apart.join("up1")).expect("the marker goes");
    std::fs::write(apart.join("up0"), "").expect("a marker");
    assert!(start_rank(&apart, &exe, 1).wait().expect("ends").success());
    let (a0, a1) = rank_reports(&apart);
    let m = memsight_e2e::run_memsight(
        &[
            "merge".as_ref(),
            "--report".as_ref(),
            merged.as_os_str(),
            a0.as_os_str(),
            a1.as_os_str(),
        ],
        None,
    );
    assert_eq!(m.code, 0, "{}", m.err);
    assert!(
        m.err.contains("s run ended") && m.err.contains("of different jobs or runs"),
        "{}",
        m.err
    );
}

/// A report with a key given twice — a second `peaks` pasted in, claiming 5 bytes — was read with
/// the last one silently: `check --max-host-peak 1MiB` said every budget holds. Now every verb
/// that reads it refuses it (exit 2), naming the key.
#[test]
fn a_report_with_a_key_given_twice_is_refused_naming_the_key() {
    let dir = scratch("break9-duplicate-key");
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.example.json");
    let text = std::fs::read_to_string(&example).expect("the example report");
    let original = dir.join("original.json");
    std::fs::write(&original, &text).expect("a copy");
    let end = text.rfind('}').expect("a JSON object");
    let twice = format!(
        "{}, \"peaks\": {{\"heap_peak_bytes\": 5, \"final_live_bytes\": 0, \"rss_peak_bytes\": 7}}\n}}\n",
        &text[..end].trim_end()
    );
    let edited = dir.join("edited.json");
    std::fs::write(&edited, twice).expect("the edited report");
    let check = |report: &std::path::Path| {
        memsight_e2e::run_memsight(
            &[
                "check".as_ref(),
                report.as_os_str(),
                "--max-host-peak".as_ref(),
                "1MiB".as_ref(),
            ],
            None,
        )
    };
    let plain = check(&original);
    assert_eq!(
        plain.code, 1,
        "the example's heap is over 1 MiB: {}",
        plain.out
    );
    let c = check(&edited);
    assert_eq!(c.code, 2, "{}{}", c.out, c.err);
    assert!(c.err.contains("peaks: the key is given twice"), "{}", c.err);
    let summary = memsight_e2e::run_memsight(
        &[
            "summary".as_ref(),
            edited.as_os_str(),
            "--format".as_ref(),
            "markdown".as_ref(),
        ],
        None,
    );
    assert_eq!(summary.code, 2, "{}", summary.out);
}

/// `memsight run -- runuser -u nobody -- PROG` (also `su`, `setpriv`): the preloaded library sits
/// in root's private runtime directory, which `nobody` cannot read, so PROG runs unmeasured and
/// the report's own process is the launcher (0.6 MiB of heap, 5.6 MiB RSS). The report's process
/// rows had PROG at 65 MiB RSS, yet `check --max-rss-peak 10MiB` said every budget holds. The RSS
/// peak a budget gates is now the job's: another process's of the job where it is higher, named.
#[test]
fn a_program_run_as_another_user_is_gated_on_its_rss() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP: only root can run a program as nobody with runuser");
        return;
    }
    if std::process::Command::new("runuser")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("SKIP: runuser is not installed (util-linux)");
        return;
    }
    let dir = scratch("break9-runuser");
    // Holds 64 MiB, every page touched, for 5 s (the sidecar reads the job's processes from
    // outside several times meanwhile), then exits 5.
    // Every page written through a volatile pointer: the compiler may not drop the block.
    let source = "#include <stdlib.h>\n#include <unistd.h>\n\
        int main(void) { size_t n = 64u << 20; volatile char *p = malloc(n);\n\
        for (size_t i = 0; i < n; i += 4096) p[i] = 1;\n\
        sleep(5); return p[n - 4096] == 1 ? 5 : 6; }\n";
    let Some(prog) = c_program(&dir, "hold_as_nobody", source, &["-O1"]) else {
        return;
    };
    // nobody must reach the program: the scratch directory and the program are world-readable.
    for p in [dir.as_path(), prog.as_path()] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let prog = prog.to_string_lossy().into_owned();
    let r = run_job(
        &dir,
        &[],
        &["runuser", "-u", "nobody", "--", prog.as_str()],
        &[],
    );
    assert_eq!(r.code, 5, "{}", r.out);
    let report: Value = serde_json::from_str(&r.report).expect("a JSON report");
    let row = report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| {
            p["command"][0]
                .as_str()
                .is_some_and(|c| c.ends_with("hold_as_nobody"))
        })
        .unwrap_or_else(|| panic!("no row of the program: {}", report["processes"]));
    let rss = row["rss_peak_bytes"].as_u64().expect("its RSS peak");
    assert!(rss >= 64 << 20, "{row}");
    let check = memsight_e2e::run_memsight(
        &[
            "check".as_ref(),
            dir.join("r.json").as_os_str(),
            "--max-rss-peak".as_ref(),
            "10MiB".as_ref(),
        ],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
    let pid = row["pid"].as_u64().expect("its pid");
    assert!(
        check.out.contains("rss peak")
            && check.out.contains(&format!("(pid {pid}: "))
            && check.out.contains("exceeds budget 10.00 MiB"),
        "{}",
        check.out
    );
    let _ = std::fs::remove_dir_all(&dir);
}
