//! Process trees and jobs without a session, under `memsight run` as a user would run them: a
//! job that does not link memsight is sampled from outside (RSS timeline, peaks, `check` budgets),
//! and its process tree is counted by PSS — each worker's shared copy-on-write pages divided among
//! the processes that map them, its USS being what it alone holds — so the tree's PSS total matches
//! the distinct physical pages the tree maps (read from `/proc/<pid>/pagemap` by the job itself).

use memsight_e2e::{run_memsight, run_memsight_env, scratch};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn job(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tree_jobs")
        .join(name)
}

/// What a tree job measured itself while holding still, and the sidecar's samples of that window.
struct Held {
    /// Distinct physical bytes of the tree at the window's start and end (`None`: page frames
    /// hidden by the kernel).
    machine: Option<(u64, u64)>,
    /// The trees sampled inside the window (200 ms margins).
    trees: Vec<Value>,
}

/// The share of a core the sidecar may spend reading the held trees' PSS: 5%, ten times its
/// default, so that a job holding still for the test is read every second or so (at the default
/// a torch tree's 50 ms read comes every 20 s; the schedule itself is unit-tested).
const TREE_BUDGET: (&str, &str) = ("MEMSIGHT_TREE_BUDGET", "0.05");

/// Runs `command` under `memsight run --interval 50ms`, its report in `dir`, the tree read under
/// [`TREE_BUDGET`]; the report.
fn run_sampled(dir: &Path, command: &[&OsStr]) -> Value {
    run_sampled_env(dir, &[], command, &[TREE_BUDGET])
}

/// As [`run_sampled`], with more options for `run` and the tree read at the default budget.
fn run_sampled_with(dir: &Path, options: &[&str], command: &[&OsStr]) -> Value {
    run_sampled_env(dir, options, command, &[])
}

/// As [`run_sampled_with`], with more environment variables.
fn run_sampled_env(
    dir: &Path,
    options: &[&str],
    command: &[&OsStr],
    envs: &[(&str, &str)],
) -> Value {
    let report = dir.join("r.json");
    let mut args: Vec<&OsStr> = vec![
        "run".as_ref(),
        "--interval".as_ref(),
        "50ms".as_ref(),
        "--report".as_ref(),
        report.as_os_str(),
    ];
    args.extend(options.iter().map(OsStr::new));
    args.push("--".as_ref());
    args.extend_from_slice(command);
    let r = run_memsight_env(&args, None, envs);
    assert_eq!(r.code, 0, "{}", r.err);
    serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
}

/// Runs `python script out.json` under `memsight run`: the report and what was held.
fn run_tree_job(python: &OsStr, script: &str, dir: &Path) -> (Value, Held) {
    let measured = dir.join("measured.json");
    let v = run_sampled(
        dir,
        &[python, job(script).as_os_str(), measured.as_os_str()],
    );
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&measured).unwrap()).unwrap();
    let machine = m["tree_bytes"].as_u64().zip(m["tree_bytes_end"].as_u64());
    let start = v["job"]["start_unix_ms"].as_u64().unwrap();
    let from = m["from_unix_ms"].as_u64().unwrap() + 200;
    let to = m["to_unix_ms"].as_u64().unwrap() - 200;
    let trees: Vec<Value> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| (from..=to).contains(&(start + s["t_ms"].as_u64().unwrap())))
        .filter_map(|s| s.get("tree").cloned())
        .collect();
    // Under TREE_BUDGET the sidecar reads a held tree every 40× its read time: ≈ 1 s here.
    assert!(
        trees.len() >= 2,
        "{} samples in the held window",
        trees.len()
    );
    (v, Held { machine, trees })
}

/// A tree's (PSS total, USS total, RSS total) and its processes.
fn totals(t: &Value) -> (u64, u64, u64, Vec<Value>) {
    let n = |k: &str| t[k].as_u64().unwrap_or_else(|| panic!("no {k} in {t}"));
    let ps = t["processes"].as_array().cloned().unwrap_or_default();
    (n("total_pss"), n("total_uss"), n("total_rss"), ps)
}

/// Every tree sampled while the job held still is within 5% of the distinct physical pages the
/// job measured at the window's start and end.
fn assert_within_5_percent(held: &Held) {
    let Some((first, last)) = held.machine else {
        println!("SKIP the 5% check: /proc/<pid>/pagemap hides page frames (needs CAP_SYS_ADMIN)");
        return;
    };
    let (lo, hi) = (first.min(last) as f64 * 0.95, first.max(last) as f64 * 1.05);
    for t in &held.trees {
        let pss = totals(t).0;
        assert!(
            (lo..=hi).contains(&(pss as f64)),
            "tree PSS total {} MiB vs {}..{} MiB of distinct physical pages: more than 5% apart",
            pss / MIB,
            first / MIB,
            last / MIB
        );
    }
}

/// How many processes (other than this test's) map a file whose path ends with `name`, or may
/// (their maps are not readable to this user).
fn processes_mapping(name: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| e.file_name().to_string_lossy() != std::process::id().to_string())
        .filter(|e| match std::fs::read_to_string(e.path().join("maps")) {
            Ok(m) => m.lines().any(|l| l.trim_end().ends_with(name)),
            // Another user's process, unreadable: it may map it (skipping is the safe answer).
            Err(e) => e.kind() == std::io::ErrorKind::PermissionDenied,
        })
        .count()
}

fn print_totals(what: &str, t: &Value, held: &Held) {
    let (pss, uss, rss, _) = totals(t);
    println!(
        "{what}: PSS {} MiB, USS {} MiB, RSS {} MiB, distinct physical pages {:?} MiB",
        pss / MIB,
        uss / MIB,
        rss / MIB,
        held.machine.map(|m| (m.0 / MIB, m.1 / MIB))
    );
}

#[test]
fn a_forked_tree_is_counted_by_pss_and_each_worker_by_its_private_pages() {
    let dir = scratch("tree-fork");
    let (v, held) = run_tree_job("python3".as_ref(), "fork_tree.py", &dir);
    let t = &held.trees[held.trees.len() / 2];
    print_totals("fork tree", t, &held);
    let (pss, _, rss, ps) = totals(t);
    assert_eq!(ps.len(), 3, "{ps:?}");
    // RSS counts the parent's 200 MiB three times; PSS once.
    assert!(rss >= 600 * MIB, "RSS total {}", rss / MIB);
    assert!(
        (250 * MIB..300 * MIB).contains(&pss),
        "PSS total {}",
        pss / MIB
    );
    let uss = |p: &Value| p["uss"].as_u64().unwrap();
    for (i, child) in ps[1..].iter().enumerate() {
        assert!(child["rss"].as_u64().unwrap() >= 200 * MIB, "{child}");
        let own = if i == 1 { 50 * MIB } else { 0 };
        assert!(
            (own..own + 20 * MIB).contains(&uss(child)),
            "child {i} USS {} MiB: its private part is {} MiB",
            uss(child) / MIB,
            own / MIB
        );
    }
    assert_within_5_percent(&held);
    assert_eq!(
        v["process_tree"]["tree"]["processes"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    let md = run_memsight(&["summary".as_ref(), dir.join("r.json").as_os_str()], None);
    for want in [
        "### Process tree at its PSS peak",
        "| PSS | USS (private) | RSS |",
        "**total (3 processes)**",
    ] {
        assert!(md.out.contains(want), "{want:?} not in\n{}", md.out);
    }
}

#[test]
fn a_two_worker_dataloader_shows_pss_totals_that_sum_to_the_machine_figure() {
    let Some(python) = memsight_e2e::torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return;
    };
    let dir = scratch("tree-dataloader");
    let before = processes_mapping("libtorch_cpu.so");
    let (v, held) = run_tree_job(python.as_os_str(), "dataloader.py", &dir);
    let others = before.max(processes_mapping("libtorch_cpu.so"));
    let t = &held.trees[held.trees.len() / 2];
    print_totals("DataLoader tree", t, &held);
    let (pss, _, rss, ps) = totals(t);
    assert_eq!(ps.len(), 3, "the job and its two workers: {ps:?}");
    // Each worker maps the 200 MiB dataset but holds little of its own.
    for w in &ps[1..] {
        let (w_uss, w_rss) = (w["uss"].as_u64().unwrap(), w["rss"].as_u64().unwrap());
        assert!(w_rss >= 200 * MIB && w_uss < w_rss / 2, "{w}");
    }
    assert!(rss > pss + 300 * MIB, "RSS {} PSS {}", rss / MIB, pss / MIB);
    // PSS divides a shared page among every process that maps it, inside the tree or not: other
    // torch processes on the machine take their shares of libtorch's ~130 MiB of text, and the
    // tree's PSS is then rightly below its distinct pages.
    if others > 0 {
        println!(
            "SKIP the 5% check: {others} other process(es) map libtorch, whose pages PSS shares \
             with them"
        );
    } else {
        assert_within_5_percent(&held);
    }
    assert!(v["process_tree"]["tree"]["total_pss"].as_u64() >= Some(pss));
}

/// Holds 300 MB until the sidecar has sent ten samples of it and two of its process tree (read
/// from its live socket), or for 1.5 s where there is none.
fn holds_300_mb() -> String {
    format!(
        "import sys, time\nsys.path.insert(0, {:?})\nfrom frames import SidecarSamples\n\
         keep = b'\\x01' * 300_000_000\n\
         w = SidecarSamples()\n\
         if not (w.wait(10) and w.wait(2, tree=True)):\n    time.sleep(1.5)\n",
        job("").display().to_string()
    )
}

#[test]
fn a_job_without_memsight_is_sampled_from_outside_and_gated_by_check() {
    let dir = scratch("run-outside");
    let report = dir.join("r.json");
    let v = run_sampled_with(
        &dir,
        &["--no-preload"],
        &["python3".as_ref(), "-c".as_ref(), holds_300_mb().as_ref()],
    );
    let tl = v["timeline"].as_array().unwrap();
    assert!(tl.len() >= 10, "{} samples", tl.len());
    let rss_max = tl.iter().filter_map(|s| s["process"]["rss"].as_u64()).max();
    assert!(rss_max >= Some(300_000_000), "{rss_max:?}");
    assert!(v["peaks"]["rss_peak_bytes"].as_u64() >= Some(300_000_000));
    assert!(v["process_tree"]["tree"]["total_pss"].as_u64() >= Some(290_000_000));
    let check = run_memsight(
        &[
            "check".as_ref(),
            report.as_os_str(),
            "--max-rss-peak".as_ref(),
            "200MiB".as_ref(),
        ],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
    assert!(
        format!("{}{}", check.out, check.err).contains("rss peak"),
        "{}{}",
        check.out,
        check.err
    );
    let check = run_memsight(
        &[
            "check".as_ref(),
            report.as_os_str(),
            "--max-tree-pss".as_ref(),
            "200MiB".as_ref(),
        ],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
    assert!(
        check.out.contains("process tree PSS") && check.out.contains("exceeds budget 200.00 MiB"),
        "{}{}",
        check.out,
        check.err
    );
    // Its heap was not measured: a heap budget cannot pass, and nothing reads "0 B" or ratios to it.
    let check = run_memsight(
        &[
            "check".as_ref(),
            report.as_os_str(),
            "--max-host-peak".as_ref(),
            "1GiB".as_ref(),
        ],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
    assert!(check.out.contains("not measured"), "{}", check.out);
    let md = run_memsight(
        &[
            "summary".as_ref(),
            report.as_os_str(),
            "--format".as_ref(),
            "markdown".as_ref(),
        ],
        None,
    );
    assert!(
        md.out.contains("not measured") && !md.out.contains("process heap's peak"),
        "{}",
        md.out
    );
}
