//! Python jobs under `memsight run`, unmodified or marked with `import memsight`, as a PyTorch user
//! runs them: memsight is preloaded into the interpreter (exact heap over glibc's malloc, session,
//! report), the `memsight` package imports with no installation, DataLoader workers are listed by
//! PSS, and `check` gates the result. Needs the torch virtual environment and the preloaded library
//! (`make build` makes both); each test skips, saying why, without them.

use memsight_e2e::{run_job, run_memsight, scratch, torch_python};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python_jobs")
        .join(name)
}

/// The torch venv's python, when it and the preloaded library are there.
fn ready() -> Option<PathBuf> {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return None;
    };
    memsight_e2e::preload_built().then_some(py)
}

/// Runs `python ARGS…` under `memsight run` with its report in `dir`: the exit code, the output
/// and the report.
fn run_python(dir: &Path, python: &Path, args: &[&OsStr]) -> (i32, String, Value) {
    let mut command = vec![python.as_os_str()];
    command.extend_from_slice(args);
    // Trees read with their PSS at 5% of a core, ten times the default: these jobs' workers live
    // a few seconds, and a torch tree's read takes tens of milliseconds.
    let budget = [("MEMSIGHT_TREE_BUDGET", "0.05")];
    let r = run_job(dir, &["--interval", "50ms"], &command, &budget);
    (r.code, r.out, serde_json::from_str(&r.report).unwrap())
}

fn names(v: &Value, key: &str, field: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in the report"))
        .iter()
        .map(|x| x[field].to_string().trim_matches('"').to_owned())
        .collect()
}

const SIX_STEPS: &str = "
import memsight, time
held = []
for n in range(6):
    memsight.step(n)
    with memsight.phase('forward'):
        if n == 2:
            held.append(bytearray(240 << 20))
        time.sleep(0.05)
assert memsight.active()
print('snapshot heap', memsight.snapshot()['heap']['live_bytes'])
";

#[test]
fn import_memsight_marks_steps_and_phases_and_check_gates_the_heap() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-steps");
    let (code, out, v) = run_python(&dir, &py, &["-c".as_ref(), SIX_STEPS.as_ref()]);
    assert_eq!(code, 0, "{out}");
    let steps = names(&v, "steps", "step");
    assert_eq!(steps, ["0", "1", "2", "3", "4", "5"], "{out}");
    let forward = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == "forward" || p["name"] == "forward")
        .unwrap_or_else(|| panic!("no forward phase: {}", v["phases"]));
    assert_eq!(forward["count"], 6, "{forward}");
    let peak = v["peaks"]["heap_peak_bytes"].as_u64().unwrap();
    assert!(
        (240 * MIB..250 * MIB).contains(&peak),
        "heap peak {} MiB",
        peak / MIB
    );
    assert_eq!(v["peaks"]["heap_peak_step"], 2, "{}", v["peaks"]);
    assert_eq!(v["peaks"]["heap_peak_phase"], "forward", "{}", v["peaks"]);
    let report = dir.join("r.json");
    let check = run_memsight(
        &[
            "check".as_ref(),
            report.as_os_str(),
            "--max-host-peak".as_ref(),
            "200MiB".as_ref(),
        ],
        None,
    );
    assert_eq!(check.code, 1, "{}{}", check.out, check.err);
    assert!(
        check.out.contains("exceeds budget 200.00 MiB") && check.out.contains("phase forward"),
        "{}",
        check.out
    );
}

#[test]
fn an_unmodified_dataloader_job_gets_its_exact_heap_and_its_workers_by_pss() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-dataloader");
    let measured = dir.join("measured.json");
    let (code, out, v) = run_python(
        &dir,
        &py,
        &[
            script("dataloader_known.py").as_os_str(),
            measured.as_os_str(),
        ],
    );
    assert_eq!(code, 0, "{out}");
    let m: Value = serde_json::from_str(&std::fs::read_to_string(&measured).unwrap()).unwrap();
    let truth = m["truth_peak_bytes"].as_u64().unwrap();
    let held = m["held_bytes"].as_u64().unwrap();
    let peak = v["peaks"]["heap_peak_bytes"].as_u64().unwrap();
    let off = (peak as f64 - truth as f64) / truth as f64;
    println!(
        "heap peak {:.2} MiB, glibc's in-use peak {:.2} MiB ({:+.2}%), held {} MiB",
        peak as f64 / MIB as f64,
        truth as f64 / MIB as f64,
        off * 100.0,
        held / MIB
    );
    assert!(peak >= held, "peak {peak} below the {held} bytes held");
    assert!(
        off.abs() <= 0.05,
        "{:+.2}% off glibc's own count",
        off * 100.0
    );

    let workers: Vec<u64> = m["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_u64().unwrap())
        .collect();
    assert_eq!(workers.len(), 2, "{m}");
    // Some sample's tree lists both workers, each with its PSS.
    let trees: Vec<&Value> = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.get("tree"))
        .collect();
    let with_workers = trees.iter().find(|t| {
        workers.iter().all(|w| {
            t["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"].as_u64() == Some(*w) && p["pss"].as_u64() > Some(0))
        })
    });
    assert!(
        with_workers.is_some(),
        "no sampled tree lists workers {workers:?} with PSS: {trees:?}"
    );
}

#[test]
fn a_lora_finetune_with_workers_and_eval_reads_as_a_pytorch_user_expects() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-lora");
    let (code, out, v) = run_python(
        &dir,
        &py,
        &[
            script("lora_finetune.py").as_os_str(),
            "--steps".as_ref(),
            "12".as_ref(),
            "--eval-every".as_ref(),
            "4".as_ref(),
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(names(&v, "steps", "step").len(), 12, "{}", v["steps"]);
    let phases = names(&v, "phases", "path");
    for want in [
        "load",
        "train",
        "train/forward",
        "train/backward",
        "train/optimizer",
        "eval",
    ] {
        assert!(phases.iter().any(|p| p == want), "{want} not in {phases:?}");
    }
    let eval = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == "eval")
        .unwrap();
    assert_eq!(eval["count"], 3, "eval every 4 of 12 steps: {eval}");
    // The trees the sidecar sampled (about once a second) list both workers while they run; the
    // report's own tree is the one at the PSS peak, which may come before they start.
    let most_workers = v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["tree"]["processes"].as_array())
        .map(|ps| ps.iter().filter(|p| p["name"] == "pt_data_worker").count())
        .max();
    assert_eq!(most_workers, Some(2), "{}", v["process_tree"]);
    // Where the heap peaked is a phase of the loop, and every tip's numbers are finite sizes.
    let phase = v["peaks"]["heap_peak_phase"].as_str().unwrap_or("");
    assert!(
        phase.starts_with("train") || phase == "eval",
        "{}",
        v["peaks"]
    );
    for t in v["tips"].as_array().unwrap() {
        let title = t["title"].as_str().unwrap();
        assert!(
            !title.contains("inf") && !title.contains("NaN") && !title.contains("0 B"),
            "{title}"
        );
    }
    let sources = v["sources"].to_string();
    assert!(sources.contains("torch-cuda"), "{sources}");
}

#[test]
fn the_python_package_tests_pass_under_the_preloaded_library() {
    let Some(py) = ready() else { return };
    let runner = Path::new(env!("CARGO_MANIFEST_DIR")).join("../integrations/python/tests/run.py");
    let out = std::process::Command::new(&py)
        .arg(&runner)
        .output()
        .expect("run the Python tests");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with("python: "))
        .unwrap_or("no summary line");
    println!("{last}");
    assert!(out.status.success(), "{text}");
}

#[test]
fn a_launcher_passes_the_session_on_and_a_linked_job_keeps_its_own() {
    let Some(py) = ready() else { return };
    let dir = scratch("py-launchers");
    let report = dir.join("r.json");
    let steps_of = |command: &[&OsStr]| -> Vec<String> {
        let mut args: Vec<&OsStr> = vec![
            "run".as_ref(),
            "--report".as_ref(),
            report.as_os_str(),
            "--".as_ref(),
        ];
        args.extend_from_slice(command);
        let r = run_memsight(&args, None);
        assert_eq!(r.code, 0, "{}", r.err);
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        names(&v, "steps", "step")
    };
    // A shell running the job: the Python process under it gets the session, not the shell.
    let script = format!(
        "{} -c 'import memsight; memsight.step(0); memsight.step(1)'; echo done",
        py.display()
    );
    assert_eq!(
        steps_of(&["sh".as_ref(), "-c".as_ref(), script.as_ref()]),
        ["0", "1"]
    );
    // A launcher that execs the job in its place.
    let marks = "import memsight; memsight.step(0); memsight.step(1); memsight.step(2)";
    assert_eq!(
        steps_of(&[
            "env".as_ref(),
            py.as_os_str(),
            "-c".as_ref(),
            marks.as_ref()
        ]),
        ["0", "1", "2"]
    );
    // A Rust job that links memsight defines malloc itself: the preloaded library stays out of
    // its way, directly and under a shell.
    let job = env!("CARGO_BIN_EXE_stepping_job");
    assert_eq!(
        steps_of(&[job.as_ref(), "exit".as_ref(), "0".as_ref(), "3".as_ref()]),
        ["0", "1", "2"]
    );
    let wrapped = format!("{job} exit 0 3; true");
    assert_eq!(
        steps_of(&["sh".as_ref(), "-c".as_ref(), wrapped.as_ref()]),
        ["0", "1", "2"]
    );
}
