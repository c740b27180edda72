//! Break-it pass 6 (docs/reliability.md): unmodified PyTorch training loops, written the way third
//! parties write them, under `memsight run` — the automatic steps and phases checked against the
//! truth each loop records (`python_jobs/auto_loops.py`: its optimizer steps, its iterations, and
//! the iteration and phase in which it allocates a known 200 MiB block). Needs the torch virtual
//! environment and the preloaded library (`make build`); each test skips, saying why, without.

use memsight_e2e::{preload_built, run_job, run_python_job, scratch, torch_python};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// `auto_loops.py LOOP` under `memsight run` with `BLOCK_AT=block_at`: the report and the truth.
fn run_loop(name: &str, block_at: &str) -> Option<(Value, Value, String)> {
    let r = run_python_job(
        &format!("break6-{name}"),
        "auto_loops.py",
        &[name],
        &[("PYTHONWARNINGS", "ignore"), ("BLOCK_AT", block_at)],
    )?;
    assert_eq!(r.code, 0, "{}", r.out);
    Some((r.report, r.truth, r.out))
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python_jobs/auto_loops.py")
}

fn steps(r: &Value) -> Vec<u64> {
    r["steps"]
        .as_array()
        .map(|v| v.iter().filter_map(|s| s["step"].as_u64()).collect())
        .unwrap_or_default()
}

fn phase_count(r: &Value, phase: &str) -> Option<u64> {
    r["phases"]
        .as_array()?
        .iter()
        .find(|p| p["path"] == phase)?["count"]
        .as_u64()
}

/// The step and phase the report gives its heap peak.
fn peak_at(r: &Value) -> (Option<u64>, Option<&str>) {
    (
        r["peaks"]["heap_peak_step"].as_u64(),
        r["peaks"]["heap_peak_phase"].as_str(),
    )
}

/// The iteration and phase in which the job allocated its block.
fn block_at(truth: &Value) -> (Option<u64>, Option<&str>) {
    (
        truth["block"]["iteration"].as_u64(),
        truth["block"]["phase"].as_str(),
    )
}

#[test]
fn a_batch_s_loading_is_in_the_step_that_trains_on_it() {
    // 6 optimizer steps of 4 micro-batches; the block is allocated while the DataLoader loads the
    // first batch of step 4. Before: `step 3, phase data` (a step started at its first forward,
    // so each batch's loading was credited to the step before).
    let Some((r, truth, out)) = run_loop("accumulate", "4:data") else {
        return;
    };
    assert_eq!(truth["optimizer_steps"], 6);
    assert_eq!(steps(&r), (0..6).collect::<Vec<_>>(), "{out}");
    assert_eq!(peak_at(&r), block_at(&truth), "{}", r["peaks"]);
    assert_eq!(phase_count(&r, "data"), Some(24), "{}", r["phases"]);
    // The sites at the peak: the block's line, with its size.
    let line = std::fs::read_to_string(script())
        .expect("the job")
        .lines()
        .position(|l| l.contains("# THE BLOCK"))
        .expect("the block's line") as u64
        + 1;
    let top = &r["heap_profile"]["at_peak"]["top_sites"][0];
    assert_eq!(top["function"], "block", "{top}");
    assert_eq!(top["line"].as_u64(), Some(line), "{top}");
    let (bytes, want) = (top["bytes"].as_f64().unwrap(), 200.0 * 1048576.0);
    assert!((bytes - want).abs() / want < 0.03, "{top}");
}

#[test]
fn the_first_batch_after_a_validation_is_data_of_its_own_step_not_eval() {
    // 9 steps, validation (eval mode, no grad) after steps 2, 5 and 8; the block is allocated
    // while the batch of step 6, the first after a validation, loads. Before: `step 5, phase
    // eval` (the validation's eval phase stayed open until the next training forward), and 7
    // data phases for 9 batches.
    let Some((r, truth, out)) = run_loop("validate", "6:data") else {
        return;
    };
    assert_eq!(truth["optimizer_steps"], 9);
    assert_eq!(steps(&r), (0..9).collect::<Vec<_>>(), "{out}");
    assert_eq!(peak_at(&r), block_at(&truth), "{}", r["peaks"]);
    assert_eq!(phase_count(&r, "data"), Some(9), "{}", r["phases"]);
    assert_eq!(phase_count(&r, "eval"), Some(3), "{}", r["phases"]);
}

#[test]
fn a_gan_stepping_two_optimizers_per_batch_gets_one_step_per_batch() {
    // 6 iterations, each: the discriminator's forward, backward and step, then the generator's.
    // Before: 12 steps (the generator's forward after the discriminator's step started a step),
    // the block of iteration 3's first backward at `step 6`.
    let Some((r, truth, out)) = run_loop("gan", "3:backward") else {
        return;
    };
    assert_eq!(truth["iterations"], 6);
    assert_eq!(steps(&r), (0..6).collect::<Vec<_>>(), "{out}");
    assert_eq!(peak_at(&r), block_at(&truth), "{}", r["peaks"]);
    assert_eq!(phase_count(&r, "optimizer"), Some(12), "{}", r["phases"]);
}

#[test]
fn several_updates_per_fetched_batch_are_each_a_step() {
    // 4 batches, 3 optimizer steps on each (the guard of the rule above: steps are still the
    // optimizer's when a batch is updated on more than once).
    let Some((r, truth, out)) = run_loop("updates_per_batch", "7:forward") else {
        return;
    };
    assert_eq!(truth["optimizer_steps"], 12);
    assert_eq!(steps(&r), (0..12).collect::<Vec<_>>(), "{out}");
    assert_eq!(peak_at(&r), block_at(&truth), "{}", r["peaks"]);
}

#[test]
fn a_loop_that_makes_its_dataloader_each_epoch_keeps_its_steps_at_the_fetches() {
    // 3 epochs of 4 steps, each over a DataLoader made for it; the block is allocated while the
    // second batch of epoch 1 (step 5) loads. Before: the first forward of epoch 1 (its batch from
    // a loader not seen training yet) started no step, so the optimizer's next step found itself
    // stepping twice in one step and handed the steps to the forwards: `step 4, phase data`.
    let Some((r, truth, out)) = run_loop("epochs", "5:data") else {
        return;
    };
    assert_eq!(truth["optimizer_steps"], 12);
    assert_eq!(steps(&r), (0..12).collect::<Vec<_>>(), "{out}");
    assert_eq!(peak_at(&r), block_at(&truth), "{}", r["peaks"]);
}

/// A loop whose steps are alike — each begins while the last one's 8 MiB block is held, frees it
/// and makes the next — in a job that imported torch (a memory map of hundreds of KiB, which a
/// heap profile carries). Step 2's start writes the growth view's first step profile.
const ALIKE_STEPS: &str = "import torch, memsight
held = bytearray(8 << 20)
for i in range(8):
    memsight.step(i)
    del held
    held = bytearray(8 << 20)
    held[::4096] = b'x' * len(held[::4096])
";

#[test]
fn writing_a_step_profile_does_not_raise_the_step_peak_it_measures() {
    let Some(py) = torch_python() else {
        println!("SKIP: no torch venv (the set-up script creates it; make build runs it)");
        return;
    };
    if !preload_built() {
        return;
    }
    let dir = scratch("break6-step-profile");
    let r = run_job(
        &dir,
        &[],
        &[py.as_os_str(), "-c".as_ref(), ALIKE_STEPS.as_ref()],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.out);
    let report: Value = serde_json::from_str(&r.report).expect("a JSON report");
    let peak_of = |n: u64| {
        report["steps"]
            .as_array()
            .and_then(|v| v.iter().find(|s| s["step"] == n))
            .and_then(|s| s["peak_bytes"].as_u64())
            .unwrap_or_else(|| panic!("no step {n}: {}", report["steps"]))
    };
    let profiles = std::fs::read_dir(dir.join("r.heap"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(
        profiles.iter().any(|p| p == "step-2.heap"),
        "no step profile was written at step 2: {profiles:?}"
    );
    // The steps after it hold what step 2 does; its own start's profile adds at most its buffers.
    let others = (3..7).map(peak_of).min().expect("steps 3-6");
    let extra = peak_of(2).saturating_sub(others);
    assert!(
        extra <= 64 << 10,
        "step 2 peaked {extra} B above the steps like it: writing its profile held that much of \
         the job's heap"
    );
}
