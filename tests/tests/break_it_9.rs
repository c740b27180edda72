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
