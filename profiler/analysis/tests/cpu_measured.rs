//! The estimator against training steps of tiny real-architecture models (`transformers` and
//! `peft` from the configs in `tests/fixtures/cpu-measured`, CPU, torch 2.11): the peak of live
//! tensor bytes of the third step, counted by `scripts/hf-cpu-peaks.py`, against the allocated
//! figure. Prints the table docs/estimate.md shows.

use memsight_analysis::estimate::hf;
use memsight_analysis::estimate::lora::{Lora, Targets};
use memsight_analysis::estimate::recipe::{AttnImpl, Checkpointing, Precision, Recipe};
use memsight_analysis::estimate::train;
use serde_json::Value;
use std::path::Path;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cpu-measured")
}

/// The recipe `scripts/hf-cpu-peaks.py` runs: the model in the row's dtype, AdamW one tensor
/// at a time (PyTorch's CPU default), transformers' fp32 loss, the output kept through the step,
/// no dropout.
fn recipe(row: &Value) -> Recipe {
    let mut r = Recipe::new(row["seq"].as_u64().unwrap());
    r.batch = row["batch"].as_u64().unwrap();
    r.precision = Precision::parse(row["precision"].as_str().unwrap()).unwrap();
    r.foreach = false;
    // The script keeps the model's output until the step is done.
    r.keep_logits = true;
    r.attention = match row["attn"].as_str() {
        Some("eager") => AttnImpl::Eager,
        _ => AttnImpl::Sdpa,
    };
    if row["checkpointing"].as_bool() == Some(true) {
        r.checkpointing = Checkpointing::Full;
    }
    if let Some(rank) = row["lora_rank"].as_u64() {
        r.lora = Some(Lora {
            rank,
            targets: if row["lora_targets"].as_str() == Some("all-linear") {
                Targets::AllLinear
            } else {
                Targets::QueryValue
            },
            dora: false,
        });
        r.adapter_bytes = if r.precision == Precision::Bf16 { 2 } else { 4 };
    }
    r
}

#[test]
fn tiny_real_architectures_on_cpu() {
    let text = std::fs::read_to_string(dir().join("measured.json")).unwrap();
    let fx: Value = serde_json::from_str(&text).unwrap();
    let rows = fx["rows"].as_array().unwrap();
    println!(
        "{:<28}{:>14}{:>14}{:>9}  peak moment",
        "row", "measured MiB", "estimate MiB", "error"
    );
    let mut within = 0;
    for row in rows {
        let cfg = dir().join(format!("{}.json", row["config"].as_str().unwrap()));
        let arch = hf::parse(&std::fs::read_to_string(cfg).unwrap()).unwrap();
        let e = train::estimate(&arch, &recipe(row));
        let measured = row["measured_bytes"].as_f64().unwrap();
        let est = e.figures.allocated as f64;
        let err = (est - measured) / measured * 100.0;
        if err.abs() <= 10.0 {
            within += 1;
        }
        println!(
            "{:<28}{:>14.2}{:>14.2}{:>+8.1}%  {}",
            row["id"].as_str().unwrap(),
            measured / 1048576.0,
            est / 1048576.0,
            err,
            e.peak_moment
        );
        if std::env::var_os("MEMSIGHT_MOMENTS").is_some() {
            for m in &e.moments {
                println!("    {:<40}{:>10.2} MiB", m.name, m.bytes as f64 / 1048576.0);
            }
            for t in &e.terms {
                println!(
                    "    = {:<40}{:>10.2} MiB",
                    t.name,
                    t.bytes as f64 / 1048576.0
                );
            }
        }
    }
    println!("within ±10%: {within} of {}", rows.len());
    assert!(!rows.is_empty());
    assert_eq!(
        within,
        rows.len(),
        "every row within ±10% (docs/estimate.md)"
    );
}
