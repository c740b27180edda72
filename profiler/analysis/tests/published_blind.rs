//! The estimator against blind sets of published measured peaks, each committed before the
//! estimator ever ran on it and split by FNV-1a 64 of its seed + id (odd = held out): task est2's
//! (`tests/fixtures/published-blind/`, LitGPT's config-hub table) and task est3's
//! (`tests/fixtures/published-est3/`, fms-acceleration's A100 benchmark table) and task est4's
//! (`tests/fixtures/published-est4/`, the Qwen (v1) README's memory profile) and task est5's
//! (`tests/fixtures/published-est5/`, Answer.AI's QLoRA+FSDP benchmark note). Prints both halves
//! of each with their errors, each row against the figure its source measured (docs/estimate.md, "A blind set of published peaks") and checks the
//! recorded level of each half.

mod published_rows;

use memsight_analysis::estimate::train;
use published_rows::{arch, held_out, recipe};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// One row: its id, half, measured and estimated bytes.
struct Row {
    id: String,
    held_out: bool,
    measured: f64,
    estimated: f64,
}

impl Row {
    fn error(&self) -> f64 {
        (self.estimated - self.measured) / self.measured * 100.0
    }
}

/// The rows of the blind set in fixture directory `name`, whose split seed must be `seed`.
fn rows(name: &str, seed: &str) -> Vec<Row> {
    let dir = dir(name);
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("peaks.json")).unwrap()).unwrap();
    assert_eq!(
        fx["split_seed"].as_str(),
        Some(seed),
        "the blind set's split is fixed"
    );
    fx["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let a = &row["args"];
            let id = row["id"].as_str().unwrap().to_string();
            let half = held_out(seed, &id);
            assert_eq!(
                row["held_out"].as_bool(),
                Some(half),
                "{id}: the recorded half is the hash's"
            );
            let e = train::estimate(&arch(&dir, a["config"].as_str().unwrap()), &recipe(a));
            // Each row is compared with the figure its source measured.
            let estimated = match row["figure"].as_str() {
                Some("allocated") => e.figures.allocated,
                Some("reserved") => e.figures.reserved,
                Some("nvidia-smi") => e.figures.nvidia_smi,
                other => panic!("{id}: unknown figure {other:?}"),
            };
            if std::env::var_os("MEMSIGHT_MOMENTS").is_some() {
                println!("{id}:");
                for m in &e.moments {
                    println!("    {:<40}{:>10.3} GB", m.name, m.bytes as f64 / 1e9);
                }
                for t in &e.terms {
                    println!("    = {:<40}{:>10.3} GB", t.name, t.bytes as f64 / 1e9);
                }
            }
            Row {
                id,
                held_out: half,
                measured: row["measured_gb"].as_f64().unwrap() * 1e9,
                estimated: estimated as f64,
            }
        })
        .collect()
}

/// Prints one half and returns how many of its rows are within ±10%, and its rows.
fn report(rows: &[Row], held: bool) -> (usize, usize) {
    let half: Vec<&Row> = rows.iter().filter(|r| r.held_out == held).collect();
    println!(
        "\n{} half:\n{:<36}{:>10}{:>10}{:>8}",
        if held { "HELD-OUT" } else { "TUNING" },
        "row",
        "measured",
        "estimate",
        "error"
    );
    for r in &half {
        println!(
            "{:<36}{:>8.2}GB{:>8.2}GB{:>+7.1}%",
            r.id,
            r.measured / 1e9,
            r.estimated / 1e9,
            r.error()
        );
    }
    let within = half.iter().filter(|r| r.error().abs() <= 10.0).count();
    println!("within ±10%: {within} of {}", half.len());
    (within, half.len())
}

#[test]
fn blind_published_peaks_both_halves() {
    let rows = rows("published-blind", "memsight-blind-est2/");
    let (tw, tn) = report(&rows, false);
    let (hw, hn) = report(&rows, true);
    println!("\ntuning {tw}/{tn}, held-out {hw}/{hn} within ±10%");
    assert!(tn >= 8 && hn >= 8, "both halves need rows: {tn}, {hn}");
    // The recorded level (docs/estimate.md): the blind run had 4 of 11 and 4 of 10 within ±10%;
    // after the quantised head, its dequantisation's dtype and the fused qkv, 6 of 11 and 6 of
    // 10 (every LoRA row; the QLoRA rows stay 11–20% low). A change that loses a row fails here.
    assert!(tw >= 6, "tuning half: {tw} of {tn} within ±10%, recorded 6");
    assert!(
        hw >= 6,
        "held-out half: {hw} of {hn} within ±10%, recorded 6"
    );
}

#[test]
fn blind_est3_fms_acceleration_both_halves() {
    let rows = rows("published-est3", "memsight-blind-est3/");
    let (tw, tn) = report(&rows, false);
    let (hw, hn) = report(&rows, true);
    println!("\nest3: tuning {tw}/{tn}, held-out {hw}/{hn} within ±10%");
    assert!(tn >= 8 && hn >= 8, "both halves need rows: {tn}, {hn}");
    // The recorded level (docs/estimate.md, "A second blind set"): the blind run had 11 of 11
    // tuning rows and 10 of 13 held-out rows within ±10%, and nothing was changed (the tuning
    // half had no miss). A change that loses a row fails here.
    assert!(
        tw >= 11,
        "tuning half: {tw} of {tn} within ±10%, recorded 11"
    );
    assert!(
        hw >= 10,
        "held-out half: {hw} of {hn} within ±10%, recorded 10"
    );
}

/// The source's failed runs on an 80 GB A100 (each a micro-batch per device that ran out of
/// memory): the largest micro-batch suggested must be below it. Added after the blind run (not
/// blind). Nine of the ten hold; the FSDP one (Llama-2-70B QLoRA on two GPUs, suggested 4) does
/// not: the two-GPU rows lack a term that grows with the batch (docs/estimate.md, the est3 blind
/// set). The test keeps that level: a fix raises it, a regression fails it.
#[test]
fn est3_suggested_micro_batches_are_below_the_ones_that_ran_out_of_memory() {
    let (held, n) = fit_checks("published-est3");
    assert!(n >= 8, "{n} fit checks");
    assert!(
        held + 1 >= n,
        "{held} of {n} hold, recorded {} (all but the two-GPU Llama-2-70B QLoRA row)",
        n - 1
    );
}

/// Task est4's out-of-memory runs (added after its blind run, not blind): the Qwen README's 7B
/// full fine-tune on two GPUs at 2048+ tokens and Qwen-72B LoRA under ZeRO-2 on four GPUs did not
/// fit an 80 GB A100 at micro-batch 1, so the suggestion must be 0. The two ZeRO-2 checks hold;
/// the three ZeRO-3 full fine-tunes do not (suggested 7, 3 and 1): their estimate is the flat
/// optimizer step, where the source grows about 15 MB per token per GPU from 256 to 1024 tokens
/// (docs/estimate.md, the est4 blind set). The test keeps that level: a fix raises it, a
/// regression fails it.
#[test]
fn est4_suggested_micro_batches_are_below_the_ones_that_ran_out_of_memory() {
    let (held, n) = fit_checks("published-est4");
    assert!(n >= 5, "{n} fit checks");
    assert!(
        held >= 2,
        "{held} of {n} hold, recorded 2 (the ZeRO-2 72B LoRA checks)"
    );
}

/// Prints the fit checks of fixture directory `name` and returns how many hold and how many
/// there are: each is a micro-batch per device that ran out of memory, and the largest
/// suggested micro-batch must be below it.
fn fit_checks(name: &str) -> (usize, usize) {
    let dir = dir(name);
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("peaks.json")).unwrap()).unwrap();
    let checks = fx["fit_checks"].as_array().unwrap();
    assert!(checks.len() >= 4, "{} fit checks", checks.len());
    let mut held = 0;
    for c in checks {
        let a = &c["args"];
        let device = c["device_gib"].as_u64().unwrap() << 30;
        let f = train::fit(
            &arch(&dir, a["config"].as_str().unwrap()),
            &recipe(a),
            device,
            0.0,
        );
        let oom = c["oom_batch"].as_u64().unwrap();
        let holds = f.max_micro_batch < oom;
        held += usize::from(holds);
        println!(
            "{:<34} {} GiB: largest suggested micro-batch {} (free at it by the estimate {:.2} GB), ran: {}, ran out of memory: {oom}{}",
            c["id"].as_str().unwrap(),
            device >> 30,
            f.max_micro_batch,
            f.free_at_max as f64 / 1e9,
            c["fits_batch"],
            if holds { "" } else { "  << suggests one that ran out of memory" },
        );
    }
    println!(
        "{held} of {} suggestions below the micro-batch that ran out of memory",
        checks.len()
    );
    (held, checks.len())
}

/// Task est4's blind set: the Qwen (v1) README's memory and speed profile (LoRA on one GPU, full
/// fine-tunes under DeepSpeed ZeRO-3 on one and two GPUs, LoRA under ZeRO-2 on four and ZeRO-3 on
/// four, 256 to 8192 tokens), compared with nvidia-smi (docs/estimate.md, "A third blind set").
#[test]
fn blind_est4_qwen_readme_both_halves() {
    let rows = rows("published-est4", "memsight-blind-est4/");
    let (tw, tn) = report(&rows, false);
    let (hw, hn) = report(&rows, true);
    println!("\nest4: tuning {tw}/{tn}, held-out {hw}/{hn} within ±10%");
    assert!(tn >= 16 && hn >= 16, "both halves need rows: {tn}, {hn}");
    // The recorded level (docs/estimate.md, "A third blind set"): the blind run had 6 of 19
    // tuning rows and 9 of 20 held-out rows within ±10%, nearly every miss low; after mixed
    // precision's fp32 masters and gradient copy (DeepSpeed's ZeRO optimizers), 8 of 19 and 10 of
    // 20. A change that loses a row fails here.
    assert!(tw >= 8, "tuning half: {tw} of {tn} within ±10%, recorded 8");
    assert!(
        hw >= 10,
        "held-out half: {hw} of {hn} within ±10%, recorded 10"
    );
}

/// Task est5's blind set: Answer.AI's "Benchmarking QLoRA+FSDP" note (fsdp_qlora's train.py on
/// two 24 GB GPUs: LoRA and QLoRA of Llama-2-7B, Yi-34B and Llama-2-70B under FSDP full shard,
/// NO_SHARD and CPU offload, 512 and 2048 tokens, micro-batches 1 to 12), compared with the
/// reserved peak the note reports (and the allocated peak where it gives one too)
/// (docs/estimate.md, "A fourth blind set").
#[test]
fn blind_est5_fsdp_qlora_both_halves() {
    let rows = rows("published-est5", "memsight-blind-est5/");
    let (tw, tn) = report(&rows, false);
    let (hw, hn) = report(&rows, true);
    println!("\nest5: tuning {tw}/{tn}, held-out {hw}/{hn} within ±10%");
    assert!(tn >= 7 && hn >= 7, "both halves need rows: {tn}, {hn}");
    // The recorded level (docs/estimate.md, "A fourth blind set"): the blind run had 7 of 10
    // tuning rows and 4 of 7 held-out rows within ±10%, the misses mostly low reserved figures;
    // the end (no gathered blocks at the optimizer step) is the same. A change that loses a row
    // fails here.
    assert!(tw >= 7, "tuning half: {tw} of {tn} within ±10%, recorded 7");
    assert!(
        hw >= 4,
        "held-out half: {hw} of {hn} within ±10%, recorded 4"
    );
}
