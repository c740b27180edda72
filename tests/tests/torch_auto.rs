//! Unmodified PyTorch jobs under `memsight run` (issue 37): steps from the optimizer and the phases
//! forward, backward, optimizer, data and eval from PyTorch's own hooks, with no line of the job
//! changed — nanoGPT's `train.py` as its README runs it on a CPU, and a Hugging Face `Trainer` —
//! and the training window: the interpreter's shutdown is its own phase, which budgets do not gate
//! by default. Needs the torch virtual environment and the preloaded library (`make build`); each
//! test skips, saying why, without them.

use memsight_e2e::{memsight_bin, nanogpt_in, run_job, scratch, torch_python};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

fn ready() -> Option<PathBuf> {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return None;
    };
    memsight_e2e::preload_built().then_some(py)
}

/// Whether `module` imports in the venv (skips, saying so, when not).
fn has(py: &Path, module: &str) -> bool {
    let ok = Command::new(py)
        .args(["-c", &format!("import {module}")])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIP: {module} is not installed in {}", py.display());
    }
    ok
}

/// `memsight run [extra…] --report r.json -- ARGS…` in `dir`: exit code, output, report.
fn run_in(dir: &Path, extra: &[&str], args: &[&str]) -> (i32, String, Value) {
    let r = run_job(dir, extra, args, &[("PYTHONWARNINGS", "ignore")]);
    (
        r.code,
        r.out,
        serde_json::from_str(&r.report).expect("a JSON report"),
    )
}

fn steps(r: &Value) -> Vec<u64> {
    r["steps"]
        .as_array()
        .map(|v| v.iter().filter_map(|s| s["step"].as_u64()).collect())
        .unwrap_or_default()
}

fn phase_counts(r: &Value) -> BTreeMap<String, u64> {
    r["phases"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|p| {
                    (
                        p["path"].as_str().unwrap_or("").to_string(),
                        p["count"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// nanoGPT's README's CPU command, smaller: 7 iterations (0..=6) of 2 micro-steps, evaluation at
/// iterations 0, 3 and 6.
const NANOGPT_ARGS: &[&str] = &[
    "train.py",
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=2",
    "--log_interval=1",
    "--block_size=32",
    "--batch_size=4",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--max_iters=6",
    "--lr_decay_iters=6",
    "--dropout=0.0",
    "--eval_interval=3",
    "--gradient_accumulation_steps=2",
];

fn lines_starting(out: &str, prefix: &str) -> u64 {
    out.lines().filter(|l| l.starts_with(prefix)).count() as u64
}

#[test]
fn unmodified_nanogpt_gets_its_iterations_as_steps_and_pytorch_phases() {
    let Some(py) = ready() else { return };
    let dir = scratch("auto-nanogpt");
    nanogpt_in(&dir, &py, 20000);
    let mut args = vec![py.to_str().unwrap()];
    args.extend_from_slice(NANOGPT_ARGS);
    let (code, out, r) = run_in(&dir, &[], &args);
    assert_eq!(code, 0, "{out}");
    let iterations = lines_starting(&out, "iter ");
    let evaluations = lines_starting(&out, "step ");
    assert_eq!((iterations, evaluations), (7, 3), "{out}");
    assert_eq!(steps(&r), (0..iterations).collect::<Vec<_>>(), "{out}");
    let phases = phase_counts(&r);
    let want: BTreeMap<String, u64> = [
        ("forward", iterations * 2),
        ("backward", iterations * 2),
        ("optimizer", iterations),
        ("eval", evaluations),
        ("shutdown", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(phases, want, "{out}");
    assert_eq!(r["training"]["last_step"], iterations - 1);
    assert_eq!(r["training"]["ended_by"], "interpreter exit");
    assert_ne!(r["peaks"]["heap_peak_phase"], "shutdown");

    // The flag turns it off: no steps, and no phase but the shutdown.
    let (code, out, r) = run_in(&dir, &["--no-auto-steps"], &args);
    assert_eq!(code, 0, "{out}");
    assert!(steps(&r).is_empty(), "{:?}", steps(&r));
    assert_eq!(
        phase_counts(&r).into_keys().collect::<Vec<_>>(),
        ["shutdown"]
    );
}

const HF_TRAINER: &str = "
import os, torch, transformers
torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                 n_head=2, bos_token_id=0, eos_token_id=0)
data = [{'input_ids': ids, 'labels': ids} for ids in torch.randint(0, 64, (32, 16))]
args = transformers.TrainingArguments(
    output_dir='out', max_steps=6, per_device_train_batch_size=2, gradient_accumulation_steps=2,
    per_device_eval_batch_size=4, eval_strategy='steps', eval_steps=3, save_strategy='no',
    report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy='no', dataloader_num_workers=0)
trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                               train_dataset=data, eval_dataset=data[:8])
trainer.train()
print('global_step', trainer.state.global_step)
";

#[test]
fn an_unmodified_hugging_face_trainer_gets_its_global_steps_and_phases() {
    let Some(py) = ready() else { return };
    if !has(&py, "transformers") {
        return;
    }
    let dir = scratch("auto-hf");
    let (code, out, r) = run_in(&dir, &[], &[py.to_str().unwrap(), "-c", HF_TRAINER]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("global_step 6"), "{out}");
    assert_eq!(steps(&r), (0..6).collect::<Vec<_>>(), "{out}");
    let phases = phase_counts(&r);
    assert_eq!(phases.get("forward"), Some(&12), "{phases:?}");
    assert_eq!(phases.get("backward"), Some(&12), "{phases:?}");
    assert_eq!(phases.get("optimizer"), Some(&6), "{phases:?}");
    assert_eq!(phases.get("eval"), Some(&2), "{phases:?}"); // after steps 3 and 6
    assert!(phases.get("data").is_some_and(|&n| n >= 12), "{phases:?}");
}

#[test]
fn a_jobs_own_steps_and_phases_take_over() {
    let Some(py) = ready() else { return };
    let dir = scratch("auto-explicit");
    let code = "
import memsight, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for n in range(3):
    memsight.step(10 * n)
    with memsight.phase('train'):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
";
    let (status, out, r) = run_in(&dir, &[], &[py.to_str().unwrap(), "-c", code]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(steps(&r), [0, 10, 20], "{out}");
    assert_eq!(
        phase_counts(&r).into_keys().collect::<Vec<_>>(),
        ["shutdown", "train"]
    );
}

/// A job that imports `memsight.torch` before torch (the README's `import memsight,
/// memsight.torch`): torch is first imported from inside `memsight.torch`, and what `run` does on
/// `import torch` waits for that import to finish. It was a warning, "PyTorch's device memory is not
/// recorded (AttributeError: cannot access submodule 'torch' of module 'memsight' …)", and a job
/// that did not call `install()` itself had no device memory.
#[test]
fn importing_memsight_torch_first_installs_it_without_a_warning() {
    let Some(py) = ready() else { return };
    for (name, install) in [("readme", "memsight.torch.install()"), ("bare", "")] {
        let dir = scratch(&format!("auto-torch-first-{name}"));
        let code = format!(
            "
import memsight, memsight.torch
import torch
{install}
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for n in range(3):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"
        );
        let r = memsight_e2e::run_job(&dir, &[], &[py.to_str().unwrap(), "-c", &code], &[]);
        assert_eq!(r.code, 0, "{name}: {}", r.out);
        assert!(!r.out.contains("Warning"), "{name}: {}", r.out);
        let v: Value = serde_json::from_str(&r.report).expect("a JSON report");
        let sources: Vec<&str> = v["sources"]
            .as_array()
            .map(|a| a.iter().filter_map(|s| s["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(sources.contains(&"torch-cuda"), "{name}: {sources:?}");
        assert_eq!(steps(&v), [0, 1, 2], "{name}: automatic steps: {}", r.out);
    }
}

/// A job whose training holds about 40 MiB and whose own `atexit` handler, run at shutdown,
/// allocates and touches 300 MiB.
const SHUTDOWN_SPIKE: &str = "
import atexit, time, memsight
held = []
def at_exit():
    big = bytearray(300 << 20)
    for i in range(0, len(big), 4096):
        big[i] = 1
    time.sleep(0.3)
atexit.register(at_exit)
for n in range(4):
    memsight.step(n)
    held.append(bytearray(10 << 20))
    time.sleep(0.05)
";

#[test]
fn the_shutdown_is_its_own_phase_and_budgets_gate_the_training_window() {
    let Some(py) = ready() else { return };
    let dir = scratch("auto-shutdown");
    let (code, out, r) = run_in(&dir, &[], &[py.to_str().unwrap(), "-c", SHUTDOWN_SPIKE]);
    assert_eq!(code, 0, "{out}");
    let whole = r["peaks"]["heap_peak_bytes"].as_u64().unwrap();
    let training = r["training"]["heap_peak_bytes"].as_u64().unwrap();
    assert!(whole > 300 * MIB, "whole run {whole}");
    assert!(
        (40 * MIB..100 * MIB).contains(&training),
        "training window {training}"
    );
    assert_eq!(r["peaks"]["heap_peak_phase"], "shutdown");
    assert_eq!(r["training"]["last_step"], 3);
    // The last step is not credited with the shutdown.
    let last = r["steps"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["step"], 3);
    assert!(last["peak_bytes"].as_u64().unwrap() < 100 * MIB, "{last}");

    let report = dir.join("r.json");
    let check = |extra: &[&str]| {
        let mut args = vec![
            "check",
            report.to_str().unwrap(),
            "--max-host-peak",
            "200MiB",
        ];
        args.extend_from_slice(extra);
        memsight_e2e::run_memsight(&args, None)
    };
    let window = check(&[]);
    assert_eq!(window.code, 0, "{}{}", window.out, window.err);
    assert!(window.out.contains("training window"), "{}", window.out);
    let all = check(&["--whole-run"]);
    assert_eq!(all.code, 1, "{}{}", all.out, all.err);
    assert!(all.out.contains("shutdown"), "{}", all.out);

    // RSS too: the shutdown's 300 MiB is the run's RSS peak, credited to the shutdown phase;
    // `--max-rss-peak` gates the training window unless `--whole-run`.
    assert_eq!(r["peaks"]["rss_peak_sample"]["phase"], "shutdown");
    let rss_window = r["training"]["rss_peak_bytes"].as_u64().unwrap();
    let rss_whole = r["peaks"]["rss_peak_bytes"].as_u64().unwrap();
    assert!(
        rss_whole > rss_window + 250 * MIB,
        "{rss_whole} vs {rss_window}"
    );
    let between = format!("{}B", (rss_window + rss_whole) / 2);
    let rss = |extra: &[&str]| {
        let mut args = vec![
            "check",
            report.to_str().unwrap(),
            "--max-rss-peak",
            &between,
        ];
        args.extend_from_slice(extra);
        memsight_e2e::run_memsight(&args, None)
    };
    assert_eq!(rss(&[]).code, 0, "{}", rss(&[]).out);
    assert_eq!(
        rss(&["--whole-run"]).code,
        1,
        "{}",
        rss(&["--whole-run"]).out
    );

    let summary = memsight_e2e::run_memsight(&["summary", report.to_str().unwrap()], None);
    assert!(
        summary
            .out
            .contains("the shutdown after training raised the"),
        "{}",
        summary.out
    );
}

#[test]
fn the_environments_own_sitecustomize_still_runs() {
    let Some(py) = ready() else { return };
    let dir = scratch("auto-sitecustomize");
    let theirs = dir.join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(
        theirs.join("sitecustomize.py"),
        "import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n",
    )
    .unwrap();
    let report = dir.join("r.json");
    let out = Command::new(memsight_bin())
        .current_dir(&dir)
        .args(["run", "--report"])
        .arg(&report)
        .arg("--")
        .arg(&py)
        .args([
            "-c",
            "import os; print('theirs:', os.environ.get('THEIR_SITECUSTOMIZE'))",
        ])
        .env("PYTHONPATH", &theirs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("theirs: ran"), "{text}");
}

/// Lightning runs the forward and backward inside `optimizer.step(closure)`.
const LIGHTNING: &str = "
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    def training_step(self, b, i):
        x, y = b
        return torch.nn.functional.mse_loss(self.net(x), y)
    def validation_step(self, b, i):
        x, y = b
        self.log('v', torch.nn.functional.mse_loss(self.net(x), y))
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), 1e-3)
ds = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
t = L.Trainer(max_steps=5, accumulate_grad_batches=2, limit_val_batches=2, val_check_interval=4,
              logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, accelerator='cpu', num_sanity_val_steps=0)
t.fit(M(), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4))
print('global_step', t.global_step)
";

#[test]
fn an_unmodified_lightning_fit_with_a_closure_gets_one_optimizer_phase_per_step() {
    let Some(py) = ready() else { return };
    if !has(&py, "lightning") {
        return;
    }
    let dir = scratch("auto-lightning");
    let (code, out, r) = run_in(&dir, &[], &[py.to_str().unwrap(), "-c", LIGHTNING]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("global_step 5"), "{out}");
    assert_eq!(steps(&r), (0..5).collect::<Vec<_>>(), "{out}");
    let phases = phase_counts(&r);
    assert_eq!(phases.get("forward"), Some(&10), "{phases:?}");
    assert_eq!(phases.get("backward"), Some(&10), "{phases:?}");
    assert_eq!(phases.get("optimizer"), Some(&5), "{phases:?}");
    assert_eq!(phases.get("eval"), Some(&2), "{phases:?}");
}

/// 200 MiB arrive at step 1 and stay; each later step holds a few KiB more for a moment, so the
/// heap's highest byte count comes at the last step, within 0.5% of what step 1 reached.
const PEAK_AT_STEP_ONE: &str = "
import memsight, time
held = []
for n in range(12):
    memsight.step(n)
    with memsight.phase('load'):
        if n == 1:
            held.append(bytearray(200 << 20))
    with memsight.phase('work'):
        transient = [bytearray(1024) for _ in range(40 * n)]
        time.sleep(0.12)
        del transient
";

#[test]
fn the_headline_the_phase_table_and_the_post_mortem_name_the_same_peak_step() {
    let Some(py) = ready() else { return };
    let dir = scratch("auto-one-peak");
    let (code, out, r) = run_in(
        &dir,
        &["--interval", "20ms"],
        &[py.to_str().unwrap(), "-c", PEAK_AT_STEP_ONE],
    );
    assert_eq!(code, 0, "{out}");
    let headline = (
        r["peaks"]["heap_peak_step"].clone(),
        r["peaks"]["heap_peak_phase"].clone(),
    );
    assert_eq!(headline.0, 1, "{:?}", r["peaks"]);
    let phase = headline.1.as_str().expect("a phase");
    let row = r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == phase)
        .unwrap_or_else(|| panic!("no row for {phase}"));
    assert_eq!(row["peak_step"], 1, "{row}");
    for p in r["phases"].as_array().unwrap() {
        if p["path"] == "work" {
            assert_eq!(p["peak_step"], 1, "{p}");
        }
    }
    assert_eq!(
        r["post_mortem"]["heap_peak"]["step"], 1,
        "{}",
        r["post_mortem"]
    );
}
