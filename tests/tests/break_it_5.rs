//! Break-it pass 5 (a demanding PyTorch user's multi-process jobs, docs/reliability.md): `check`
//! gates every rank of a merged multi-node report (pids repeat across nodes), never on another
//! run's report; `merge` takes a node's job report with its own rank reports, says which ranks are
//! missing and names one process as the first to fail; an OOM-killed DataLoader worker is placed at
//! the training loop's step.

use memsight_e2e::{child_cgroup, run_memsight, run_memsight_env, scratch, torch_python};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// A rank's row as `memsight run` writes it in a job report (and alone in the rank's report).
fn row(rank: u32, pid: u32, heap: u64, rss: u64, end: Value, report: Option<&Path>) -> Value {
    let mut r = json!({
        "pid": pid, "ppid": 1, "role": "rank", "rank": rank,
        "command": ["python", "train.py"],
        "heap_peak_bytes": heap, "rss_peak_bytes": rss,
        "last_step": 5, "last_phase": "forward", "end": end,
    });
    if let Some(p) = report {
        r["report"] = json!(p.display().to_string());
    }
    r
}

fn exited(code: i32, unix_ms: u64) -> Value {
    json!({"kind": "exited", "code": code, "unix_ms": unix_ms,
           "description": format!("exited with code {code}")})
}

fn killed(unix_ms: u64) -> Value {
    json!({"kind": "killed", "unix_ms": unix_ms,
           "description": "ended without exiting: killed by a signal"})
}

/// A report of process `pid` (the documented example's timeline and phases) with this heap and
/// RSS peak, these rank rows and this post-mortem, written to `path`.
fn write_report(path: &Path, pid: u32, heap: u64, rss: u64, ranks: Vec<Value>, pm: &str) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/report.example.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(example).unwrap()).unwrap();
    v["job"]["pid"] = json!(pid);
    v["peaks"]["heap_peak_bytes"] = json!(heap);
    v["peaks"]["rss_peak_bytes"] = json!(rss);
    v["peaks"]["rss_peak_sample"]["bytes"] = json!(rss);
    if let [own] = ranks.as_slice() {
        v["job"]["end_unix_ms"] = own["end"]["unix_ms"].clone();
    }
    v["ranks"] = json!(ranks);
    v["post_mortem"]["description"] = json!(pm);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// A rank's own report (its one row names it).
fn rank_report(dir: &Path, rank: u32, pid: u32, heap: u64, end: Value) -> PathBuf {
    let p = dir.join(format!("r-{rank}.json"));
    let desc = end["description"].as_str().unwrap_or_default().to_string();
    write_report(
        &p,
        pid,
        heap,
        700 * MIB,
        vec![row(rank, pid, heap, 700 * MIB, end, Some(&p))],
        &desc,
    );
    p
}

/// A two-rank job that ended well in `dir`: rank 0 (pid 10, 230 MiB of heap) and rank 1 (pid 11,
/// 330 MiB), their reports and the job report `r-job.json`; returns the three paths.
fn two_rank_job(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let r0 = rank_report(dir, 0, 10, 230 * MIB, exited(0, 1000));
    let r1 = rank_report(dir, 1, 11, 330 * MIB, exited(0, 1000));
    let job = dir.join("r-job.json");
    write_report(
        &job,
        10,
        230 * MIB,
        700 * MIB,
        vec![
            row(0, 10, 230 * MIB, 700 * MIB, exited(0, 1000), Some(&r0)),
            row(1, 11, 330 * MIB, 700 * MIB, exited(0, 1000), Some(&r1)),
        ],
        "exited with code 0",
    );
    (r0, r1, job)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn check_of_a_merged_report_gates_a_rank_whose_pid_another_node_reused() {
    // Two nodes in containers: each node's first rank is pid 8.
    let dir = scratch("bi5-pid-reuse");
    let r0 = rank_report(&dir, 0, 8, 230 * MIB, exited(0, 1000));
    let r3 = rank_report(&dir, 3, 8, 530 * MIB, exited(0, 1000));
    let merged = dir.join("merged.json");
    let m = run_memsight(&["merge", "--report", s(&merged), s(&r0), s(&r3)], None);
    assert_eq!(m.code, 0, "{}", m.err);
    let c = run_memsight(&["check", s(&merged), "--max-host-peak", "450MiB"], None);
    assert_eq!(c.code, 1, "{}{}", c.out, c.err);
    assert!(
        c.out
            .contains("rank 3 (pid 8): host peak 530.00 MiB exceeds budget 450.00 MiB"),
        "{}",
        c.out
    );
}

#[test]
fn check_never_gates_a_rank_on_another_run_s_report() {
    let dir = scratch("bi5-stale-rank");
    // Rank 1's report beside the job's is a stale one of an earlier run (another pid, 10 MiB).
    let stale = rank_report(&dir, 1, 99, 10 * MIB, exited(0, 1000));
    let job = dir.join("r-job.json");
    write_report(
        &job,
        10,
        100 * MIB,
        700 * MIB,
        vec![
            row(
                0,
                10,
                100 * MIB,
                700 * MIB,
                exited(0, 1000),
                Some(&dir.join("r-0.json")),
            ),
            row(1, 11, 500 * MIB, 900 * MIB, exited(0, 1000), Some(&stale)),
        ],
        "exited with code 0",
    );
    let c = run_memsight(&["check", s(&job), "--max-host-peak", "200MiB"], None);
    assert_eq!(c.code, 1, "{}{}", c.out, c.err);
    assert!(
        c.out
            .contains("rank 1 (pid 11): host peak 500.00 MiB exceeds budget 200.00 MiB")
            && c.out.contains("its own report could not be read"),
        "{}",
        c.out
    );
    // Without its report, the row's RSS peak is gated too, and said to be all there is.
    std::fs::remove_file(&stale).unwrap();
    let c = run_memsight(&["check", s(&job), "--max-rss-peak", "800MiB"], None);
    assert_eq!(c.code, 1, "{}{}", c.out, c.err);
    assert!(
        c.out
            .contains("rank 1 (pid 11): rss peak 900.00 MiB exceeds budget 800.00 MiB"),
        "{}",
        c.out
    );
    // A budget the row cannot show is said not to be gated for that rank, on standard error.
    let c = run_memsight(&["check", s(&job), "--max-leak-per-step", "1GiB"], None);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    assert!(
        c.err.contains("rank 1 (pid 11)") && c.err.contains("could not be read"),
        "{}",
        c.err
    );
}

#[test]
fn merge_says_when_a_node_s_job_report_and_its_rank_reports_are_both_given() {
    // `memsight merge --report job.json shared/r-*.json`: the glob takes r-job.json too.
    let dir = scratch("bi5-merge-glob");
    let (r0, r1, job) = two_rank_job(&dir);
    let merged = dir.join("merged.json");
    let m = run_memsight(
        &["merge", "--report", s(&merged), s(&r0), s(&r1), s(&job)],
        None,
    );
    assert_eq!(m.code, 2, "{}", m.out);
    assert!(
        m.err.contains("rank 0 is in both")
            && m.err.contains(
                "the same process: give each node's job report or its rank reports, not both"
            ),
        "{}",
        m.err
    );
    // The same rank from two different runs is refused with no such hint.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let again = rank_report(&other, 1, 77, 330 * MIB, exited(0, 5000));
    let m = run_memsight(
        &["merge", "--report", s(&merged), s(&r0), s(&r1), s(&again)],
        None,
    );
    assert_eq!(m.code, 2, "{}", m.out);
    assert!(
        m.err.contains("rank 1 is in both") && !m.err.contains("the same process"),
        "{}",
        m.err
    );
}

#[test]
fn merge_says_which_ranks_are_missing() {
    let dir = scratch("bi5-merge-gap");
    let r0 = rank_report(&dir, 0, 10, 230 * MIB, exited(0, 1000));
    let r3 = rank_report(&dir, 3, 13, 230 * MIB, exited(0, 1000));
    let merged = dir.join("merged.json");
    let m = run_memsight(&["merge", "--report", s(&merged), s(&r0), s(&r3)], None);
    assert_eq!(m.code, 0, "{}", m.err);
    assert!(m.err.contains("ranks 1, 2 are missing"), "{}", m.err);
}

#[test]
fn merge_says_when_the_reports_come_from_different_memsight_versions() {
    let dir = scratch("bi5-merge-versions");
    let r0 = rank_report(&dir, 0, 10, 230 * MIB, exited(0, 1000));
    let r1 = rank_report(&dir, 1, 11, 330 * MIB, exited(0, 1000));
    let merged = dir.join("merged.json");
    let same = run_memsight(&["merge", "--report", s(&merged), s(&r0), s(&r1)], None);
    assert_eq!(same.code, 0, "{}", same.err);
    assert!(
        !same.err.contains("different memsight versions"),
        "{}",
        same.err
    );
    // Node 1 was upgraded first.
    let mut v: Value = serde_json::from_slice(&std::fs::read(&r1).unwrap()).unwrap();
    v["memsight_version"] = json!("9.9.9");
    std::fs::write(&r1, serde_json::to_vec(&v).unwrap()).unwrap();
    let mixed = run_memsight(&["merge", "--report", s(&merged), s(&r0), s(&r1)], None);
    assert_eq!(mixed.code, 0, "{}", mixed.err);
    assert!(
        mixed.err.contains("different memsight versions") && mixed.err.contains("9.9.9"),
        "{}",
        mixed.err
    );
}

#[test]
fn a_merged_post_mortem_names_one_process_as_the_first_to_fail() {
    // Node 0's job report: its rank 1 failed first there, as a consequence of node 1's rank 2,
    // killed a second earlier.
    let dir = scratch("bi5-merge-first");
    let n0 = dir.join("n0-job.json");
    write_report(
        &n0,
        10,
        230 * MIB,
        700 * MIB,
        vec![
            row(0, 10, 230 * MIB, 700 * MIB, exited(1, 3000), None),
            row(1, 11, 330 * MIB, 700 * MIB, exited(1, 2500), None),
        ],
        "rank 1 (pid 11) failed first: exited with code 1 at step 5 (its own heap peak \
         330.00 MiB); then the job: exited with code 1",
    );
    // What the sidecar says of the job's own end, beside the description that names rank 1.
    let mut v: Value = serde_json::from_slice(&std::fs::read(&n0).unwrap()).unwrap();
    v["post_mortem"]["job_end"] = json!("exited with code 1");
    std::fs::write(&n0, serde_json::to_vec(&v).unwrap()).unwrap();
    let r2 = rank_report(&dir, 2, 7, 430 * MIB, killed(1500));
    let merged = dir.join("merged.json");
    let m = run_memsight(&["merge", "--report", s(&merged), s(&n0), s(&r2)], None);
    assert_eq!(m.code, 0, "{}", m.err);
    let v: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    let desc = v["post_mortem"]["description"].as_str().unwrap();
    assert!(desc.starts_with("rank 2 (pid 7) failed first"), "{desc}");
    assert_eq!(desc.matches("failed first").count(), 1, "{desc}");
    assert!(desc.ends_with("exited with code 1"), "{desc}");
}

/// A DataLoader job whose main process trains (an optimizer step per batch) while its worker 1,
/// from its 40th item on, grows 32 MiB an item until the OOM killer ends it in `$JOB_CGROUP`.
const WORKER_OOM: &str = r#"
import os, torch
from torch.utils.data import DataLoader, Dataset, get_worker_info
with open(os.path.join(os.environ["JOB_CGROUP"], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
hoard = []
class Growing(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and info.id == 1 and i >= 40:
            block = bytearray(32 << 20)
            for j in range(0, len(block), 4096):
                block[j] = 1
            hoard.append(block)
        return torch.zeros(16)
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in DataLoader(Growing(), batch_size=1, num_workers=2):
    loss = model(batch).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"#;

#[test]
fn an_oom_killed_worker_is_placed_at_the_training_loop_s_step() {
    let Some(py) = torch_python() else {
        eprintln!("skipped: no Python with torch (scripts/setup.sh installs it)");
        return;
    };
    let cg = match child_cgroup("bi5-worker-step", 1536 * MIB) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let dir = scratch("bi5-worker-step");
    let script = dir.join("train.py");
    std::fs::write(&script, WORKER_OOM).unwrap();
    let r = dir.join("r.json");
    let run = run_memsight_env(
        &["run", "--report", s(&r), "--", s(&py), s(&script)],
        None,
        &[("JOB_CGROUP", s(&cg))],
    );
    let _ = std::fs::remove_dir(&cg);
    // The loop raises once it sees its worker gone (exit 1). On a busy machine the kernel may
    // also kill the loop itself before the worker's memory is reaped (a second OOM kill in the
    // cgroup, exit 137); the report must then say so, and still name the worker first.
    assert!(
        run.code == 1
            || (run.code == 137 && run.err.contains("then the job: killed by the OOM killer")),
        "{}",
        run.err
    );
    let line = run
        .err
        .lines()
        .find(|l| l.contains("failed first"))
        .unwrap_or_default()
        .to_string();
    assert!(line.starts_with("memsight · worker (pid "), "{}", run.err);
    // The worker was forked at step 0 and never steps; the training loop had made 20 steps or
    // more (the worker's items 40 and on are its batches 20 and on) when the worker was killed.
    let step: u64 = line
        .split(" at step ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(step >= 20, "{line}");
    assert!(line.contains("of the training loop"), "{line}");
    // Where the loop was when the worker died, not where its error sent it afterwards.
    assert!(!line.contains("phase shutdown"), "{line}");
    // A worker's remedies still come first for the worker.
    assert!(
        run.err
            .contains("first remedy: use fewer data-loader workers"),
        "{}",
        run.err
    );
}

#[test]
fn summary_of_a_job_report_puts_its_ranks_side_by_side_with_the_skew() {
    // The headline is rank 0's alone; rank 2 held twice its heap.
    let dir = scratch("bi5-summary-ranks");
    let job = dir.join("r-job.json");
    write_report(
        &job,
        10,
        200 * MIB,
        700 * MIB,
        vec![
            row(0, 10, 200 * MIB, 700 * MIB, exited(0, 1000), None),
            row(1, 11, 300 * MIB, 800 * MIB, exited(0, 1000), None),
            row(2, 12, 400 * MIB, 900 * MIB, killed(900), None),
        ],
        "exited with code 0",
    );
    let r = run_memsight(&["summary", s(&job), "--format", "markdown"], None);
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.out.contains("### Ranks"), "{}", r.out);
    assert!(
        r.out.contains("| rank 2 | 12 | 400.00 MiB | 900.00 MiB |"),
        "{}",
        r.out
    );
    assert!(
        r.out
            .contains("skew: rank 2's heap peak 400.00 MiB is 2.00× rank 0's 200.00 MiB"),
        "{}",
        r.out
    );
    // `merge` prints the same skew.
    let merged = dir.join("merged.json");
    let m = run_memsight(&["merge", "--report", s(&merged), s(&job)], None);
    assert_eq!(m.code, 0, "{}", m.err);
    assert!(
        m.out
            .contains("skew: rank 2's heap peak 400.00 MiB is 2.00×"),
        "{}",
        m.out
    );
}

#[test]
fn an_oom_killed_rank_without_workers_gets_no_worker_remedy() {
    let cg = match child_cgroup("bi5-rank-oom", 256 * MIB) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let dir = scratch("bi5-rank-oom");
    // Two ranks (as any launcher starts them), no DataLoader: rank 1 grows until the OOM killer
    // ends it in the job's memory cgroup.
    let grow = "import time\nhog = []\ntime.sleep(0.5)\nwhile True:\n    b = bytearray(16 << 20)\n    \
                for i in range(0, len(b), 4096): b[i] = 1\n    hog.append(b)\n    time.sleep(0.02)\n";
    let idle = "import time\ntime.sleep(3)\n";
    std::fs::write(dir.join("grow.py"), grow).unwrap();
    std::fs::write(dir.join("idle.py"), idle).unwrap();
    let script = format!(
        "echo $$ > {}/cgroup.procs; RANK=0 WORLD_SIZE=2 python3 {} & \
         RANK=1 WORLD_SIZE=2 python3 {} & wait",
        cg.display(),
        dir.join("idle.py").display(),
        dir.join("grow.py").display()
    );
    let r = dir.join("r-{rank}.json");
    let run = run_memsight(&["run", "--report", s(&r), "--", "sh", "-c", &script], None);
    let _ = std::fs::remove_dir(&cg);
    let first = run
        .err
        .lines()
        .find(|l| l.contains("failed first"))
        .unwrap_or_default();
    assert!(
        first.starts_with("memsight · rank 1 (pid ") && first.contains("killed by the OOM killer"),
        "{}",
        run.err
    );
    assert!(
        !run.err.contains("data-loader workers"),
        "a job without workers was told to use fewer: {}",
        run.err
    );
    let job: Value =
        serde_json::from_slice(&std::fs::read(dir.join("r-job.json")).unwrap()).unwrap();
    let pm = job["post_mortem"].to_string();
    assert!(!pm.contains("data-loader workers"), "{pm}");
}

#[test]
fn attach_says_what_a_pid_is_when_it_cannot_be_watched() {
    let dir = scratch("bi5-attach");
    let r = dir.join("r.json");
    // A zombie: a child that exited and that this test has not reaped yet.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id().to_string();
    assert!(memsight_e2e::wait_until(30, || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|t| t.trim_start().starts_with('Z'))
        })
    }));
    let z = run_memsight(&["attach", &pid, "--report", s(&r)], None);
    let _ = child.wait();
    assert_eq!(z.code, 2, "{}", z.err);
    assert!(
        z.err.contains(&format!("process {pid} has exited")) && z.err.contains("zombie"),
        "{}",
        z.err
    );
    // A kernel thread (kthreadd is pid 2 in every pid namespace that has one): nothing to watch.
    let kthreadd = std::fs::read_to_string("/proc/2/stat").unwrap_or_default();
    if kthreadd.contains("(kthreadd)") {
        let k = run_memsight(&["attach", "2", "--report", s(&r)], None);
        assert_eq!(k.code, 2, "{}", k.err);
        assert!(k.err.contains("process 2 is a kernel thread"), "{}", k.err);
    }
    // No such process: said without first claiming to watch it.
    let n = run_memsight(&["attach", "4000000000", "--report", s(&r)], None);
    assert_eq!(n.code, 2, "{}", n.err);
    assert!(
        n.err.contains("no process 4000000000") && !n.err.contains("watching process"),
        "{}",
        n.err
    );
    assert!(!r.exists());
}

#[test]
fn a_tree_budget_of_a_job_report_is_gated_on_the_job_s_tree_not_each_rank() {
    // A torchrun job: the job's tree (every rank and the launcher) is in its report; a rank's own
    // report has none.
    let dir = scratch("bi5-tree-pss");
    let (_, _, job) = two_rank_job(&dir);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&job).unwrap()).unwrap();
    v["process_tree"] = json!({
        "at": {"bytes": 1500 * MIB, "t_ms": 100, "step": 0},
        "tree": {"total_rss": 2400 * MIB, "total_pss": 1500 * MIB, "total_uss": 1300 * MIB,
                 "processes": [{"pid": 9, "ppid": 1, "name": "pt_elastic", "rss": 500 * MIB,
                                "anon": 280 * MIB, "file": 220 * MIB, "shmem": 0,
                                "pss": 300 * MIB, "uss": 280 * MIB}]}
    });
    std::fs::write(&job, serde_json::to_vec(&v).unwrap()).unwrap();
    let c = run_memsight(&["check", s(&job), "--max-tree-pss", "10GiB"], None);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    let c = run_memsight(&["check", s(&job), "--max-tree-pss", "1GiB"], None);
    assert_eq!(c.code, 1, "{}{}", c.out, c.err);
    assert!(
        c.out
            .contains("process tree PSS 1.46 GiB exceeds budget 1.00 GiB"),
        "{}",
        c.out
    );
    assert!(!c.out.contains("rank 1"), "{}", c.out);
}

#[test]
fn a_restarted_rank_keeps_each_process_s_report() {
    // As `torchrun --max-restarts` does: rank 1's first process ends and the launcher starts a
    // second one with the rank; each holds a known size.
    let dir = scratch("bi5-restart");
    let hold = |mib: u64| {
        format!(
            "import time\nb = bytearray({mib} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n\
             time.sleep(1.2)\n"
        )
    };
    for (name, mib) in [("r0.py", 16), ("first.py", 96), ("second.py", 48)] {
        std::fs::write(dir.join(name), hold(mib)).unwrap();
    }
    let py = |n: &str| dir.join(n).display().to_string();
    let script = format!(
        "RANK=0 WORLD_SIZE=2 python3 {} & \
         RANK=1 WORLD_SIZE=2 python3 {}; RANK=1 WORLD_SIZE=2 python3 {} & wait",
        py("r0.py"),
        py("first.py"),
        py("second.py")
    );
    let r = dir.join("r-{rank}.json");
    let run = run_memsight(&["run", "--report", s(&r), "--", "sh", "-c", &script], None);
    assert_eq!(run.code, 0, "{}", run.err);
    let job: Value =
        serde_json::from_slice(&std::fs::read(dir.join("r-job.json")).unwrap()).unwrap();
    let ones: Vec<&Value> = job["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["rank"] == 1)
        .collect();
    assert_eq!(ones.len(), 2, "{}", job["ranks"]);
    let paths: Vec<&str> = ones.iter().map(|r| r["report"].as_str().unwrap()).collect();
    assert_ne!(paths[0], paths[1], "{}", run.err);
    // Each process's own report, with its own heap: 96 MiB the first, 48 MiB the second.
    for (row, mib) in ones.iter().zip([96u64, 48]) {
        let own: Value =
            serde_json::from_slice(&std::fs::read(row["report"].as_str().unwrap()).unwrap())
                .unwrap();
        assert_eq!(own["job"]["pid"], row["pid"], "{own}");
        let heap = own["peaks"]["heap_peak_bytes"].as_u64().unwrap();
        assert!(
            heap >= mib * MIB && heap < (mib + 8) * MIB,
            "{mib} MiB held, {heap} B"
        );
    }
    assert!(dir.join("r-1.json").exists() && dir.join("r-1.restart1.json").exists());
    // The job's report merges (a node of a multi-node job restarted its ranks).
    let merged = dir.join("merged.json");
    let m = run_memsight(
        &["merge", "--report", s(&merged), s(&dir.join("r-job.json"))],
        None,
    );
    assert_eq!(m.code, 0, "{}", m.err);
    let v: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    assert_eq!(v["ranks"].as_array().unwrap().len(), 3, "{}", v["ranks"]);
}
