//! Issue 35: PyTorch DataLoader workers that died, read as memory failures of a worker.
//! `fixtures/dataloader-workers` holds real messages from public threads (README there), split by
//! a seeded hash of their id before the reader was written: the tuning half is checked exactly,
//! the held-out half is measured and printed, and must meet the corpus's thresholds. Also: the
//! exact wordings of PyTorch's source, joined lines of one death, and deaths that are not memory.

use memsight_analysis::diagnose::{diagnose, Context};
use serde_json::Value;
use std::path::PathBuf;

fn cases(half: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dataloader-workers")
        .join(format!("{half}.jsonl"));
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The diagnoses of `text` as JSON.
fn judged(text: &str) -> Vec<Value> {
    diagnose(text, &Context::default())
        .iter()
        .map(|d| serde_json::to_value(d).unwrap())
        .collect()
}

/// (found, every fact, verdict) of one case, as `tests/oom_corpus_2.rs` counts them, and a line
/// saying what came out.
fn outcome(case: &Value) -> (bool, bool, bool, String) {
    let found = judged(case["text"].as_str().unwrap());
    let of_kind = found.iter().any(|d| d["kind"] == case["kind"]);
    let facts = found.len() == 1
        && found[0]["kind"] == case["kind"]
        && found[0]["facts"] == case["expected"];
    let verdict = found.first().is_some_and(|d| {
        d["verdict"] == case["verdict"]
            && case
                .get("first_remedy")
                .is_none_or(|r| *r == d["remedies"][0]["id"])
    });
    let got: Vec<String> = found
        .iter()
        .map(|d| format!("{} {} {}", d["kind"], d["facts"], d["verdict"]))
        .collect();
    let detail = format!(
        "{}: got {got:?}, expected {} {}",
        case["id"], case["expected"], case["verdict"]
    );
    (of_kind, facts, verdict, detail)
}

fn figures(half: &str) -> (usize, usize, usize, usize, Vec<String>) {
    let outcomes: Vec<_> = cases(half).iter().map(outcome).collect();
    let n = outcomes.len();
    let count =
        |f: fn(&(bool, bool, bool, String)) -> bool| outcomes.iter().filter(|o| f(o)).count();
    let (found, facts, verdicts) = (count(|o| o.0), count(|o| o.1), count(|o| o.2));
    println!(
        "{half}: {n} cases; found {found}/{n}, every fact {facts}/{n}, verdicts {verdicts}/{n}"
    );
    let misses: Vec<String> = outcomes
        .into_iter()
        .filter(|o| !(o.0 && o.1 && o.2))
        .map(|o| o.3)
        .collect();
    for m in &misses {
        println!("miss {m}");
    }
    (n, found, facts, verdicts, misses)
}

#[test]
fn the_tuning_half_gets_every_fact_and_verdict() {
    let (n, _, _, _, misses) = figures("tune");
    assert!(n >= 6, "only {n} tuning cases");
    assert!(misses.is_empty(), "{}", misses.join("\n"));
}

/// Measured once before any change made after it (figures in docs/diagnose.md); kept to the
/// corpus's thresholds for found and verdicts, and every fact for 90%.
#[test]
fn the_held_out_half_is_measured() {
    let (n, found, facts, verdicts, misses) = figures("heldout");
    let share = |k: usize| k as f64 / n as f64;
    assert!(n >= 6, "only {n} held-out cases");
    assert!(share(found) >= 0.97, "{}", misses.join("\n"));
    assert!(share(facts) >= 0.90, "{}", misses.join("\n"));
    assert!(share(verdicts) >= 0.90, "{}", misses.join("\n"));
}

/// FNV-1a, 64-bit: the split's seeded hash.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[test]
fn the_split_is_the_seeded_hash_of_the_id() {
    for (half, odd) in [("tune", false), ("heldout", true)] {
        for c in cases(half) {
            let id = c["id"].as_str().unwrap();
            let h = fnv1a(&format!("issue35-dataloader:{id}"));
            assert_eq!(h % 2 == 1, odd, "{id} is in {half}");
        }
    }
}

/// PyTorch 2.11's own output on this machine (`tests/tests/tree_jobs/dataloader_oom.py` in a
/// 900 MiB memory cgroup): the SIGCHLD handler's `killed by signal: Killed.`, then the main
/// loop's `exited unexpectedly` for the same worker, one failure with the worker's remedies.
#[test]
fn a_killed_worker_and_its_exited_line_are_one_failure() {
    let text = "  File \"/venv/lib/python3.11/site-packages/torch/utils/data/_utils/signal_handling.py\", line 73, in handler\n    _error_if_any_worker_fails()\nRuntimeError: DataLoader worker (pid 17887) is killed by signal: Killed. \n\nThe above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n  File \"/work/main/tests/tests/tree_jobs/dataloader_oom.py\", line 32, in <module>\n    for step, batch in enumerate(DataLoader(Growing(), batch_size=1, num_workers=2)):\n  File \"/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py\", line 1323, in _try_get_data\n    raise RuntimeError(\nRuntimeError: DataLoader worker (pid(s) 17887) exited unexpectedly\n";
    let found = judged(text);
    assert_eq!(found.len(), 1, "{found:#?}");
    let d = &found[0];
    assert_eq!(d["kind"], "oom_kill_report");
    assert_eq!(d["verdict"], "host_oom");
    assert_eq!(d["facts"]["pid"], 17887);
    assert_eq!(d["facts"]["signal"], "Killed");
    assert!(
        d["evidence"].as_str().unwrap().contains("dmesg"),
        "{}",
        d["evidence"]
    );
    let ids: Vec<&str> = d["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "data_loader",
            "worker_copy_on_read",
            "persistent_workers",
            "memory_limit",
            "profile"
        ]
    );
    // Several dead workers: every pid, with the one the signal line names.
    let found = judged("RuntimeError: DataLoader worker (pid 18510) is killed by signal: Killed. \n\nThe above exception was the direct cause of the following exception:\n\nRuntimeError: DataLoader worker (pid(s) 18509, 18510) exited unexpectedly");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["facts"]["pid"], 18510);
    assert_eq!(found[0]["facts"]["pids"], serde_json::json!([18509, 18510]));
}

/// The exact strings of PyTorch's source (`torch/csrc/DataLoader.cpp`, `dataloader.py`), each on
/// its own: SIGKILL and a bare `exited unexpectedly` are host OOMs, SIGBUS with its note and the
/// worker's bus-error line are /dev/shm; the C++ check's `exited unexpectedly with exit code 1`
/// is a worker's own exit and no memory failure.
#[test]
fn pytorch_source_wordings() {
    for (text, verdict, first) in [
        ("DataLoader worker (pid 18509) is killed by signal: Killed. ", "host_oom", "data_loader"),
        ("DataLoader worker (pid 18509) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.", "host_oom", "shared_memory"),
        ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n", "host_oom", "shared_memory"),
        ("RuntimeError: DataLoader worker (pid(s) 18509, 18510) exited unexpectedly", "host_oom", "data_loader"),
        // macOS's strsignal(SIGKILL)
        ("RuntimeError: DataLoader worker (pid 501) is killed by signal: Killed: 9. ", "host_oom", "data_loader"),
    ] {
        let found = judged(text);
        assert_eq!(found.len(), 1, "{text}\n{found:#?}");
        assert_eq!(found[0]["verdict"], verdict, "{text}");
        assert_eq!(found[0]["remedies"][0]["id"], first, "{text}");
    }
    let none = judged("RuntimeError: DataLoader worker (pid 18509) exited unexpectedly with exit code 1. Details are lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace.");
    assert!(none.is_empty(), "{none:#?}");
}

/// A worker whose death the text puts down to another signal is no memory failure, even with the
/// `exited unexpectedly` line that follows it (github.com/mosaicml/diffusion/issues/33 and
/// github.com/MhLiao/DB/issues/94, with the line PyTorch prints after them).
#[test]
fn a_worker_dead_of_another_signal_is_no_memory_failure() {
    for cause in [
        "RuntimeError: DataLoader worker (pid 3007309) is killed by signal: Aborted. ",
        "RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault",
        "ERROR: Unexpected segmentation fault encountered in worker.",
    ] {
        let text = format!("{cause}\n\nThe above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nRuntimeError: DataLoader worker (pid(s) 3007309) exited unexpectedly");
        let found = judged(&text);
        assert!(found.is_empty(), "{text}\n{found:#?}");
    }
}

/// The kernel's kill of a process PyTorch named `pt_data_worker` gets the worker's remedies.
#[test]
fn the_kernel_killing_a_worker_gets_worker_remedies() {
    let found = judged("[ 4821.123456] Memory cgroup out of memory: Killed process 17887 (pt_data_worker) total-vm:3216540kB, anon-rss:1163264kB, file-rss:23464kB, shmem-rss:32kB, UID:0 pgtables:2740kB oom_score_adj:0");
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["kind"], "linux_oom_killer");
    assert_eq!(found[0]["remedies"][1]["id"], "worker_copy_on_read");
}
