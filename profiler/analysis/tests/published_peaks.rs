//! The estimator against published measured peaks (`tests/fixtures/published/peaks.json`): prints
//! every row with its error, split into the tuned half and the held-out half (fixed by a seeded
//! hash of each row's id before anything was tuned), checks the tuned half, and checks that no
//! suggested micro-batch is one the sources saw run out of memory.

mod published_rows;

use memsight_analysis::estimate::train;
use published_rows::{held_out, recipe};
use serde_json::Value;
use std::path::Path;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/published")
}

fn fixture() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("peaks.json")).unwrap()).unwrap()
}

struct Row {
    id: String,
    held_out: bool,
    figure: String,
    measured: f64,
    estimated: f64,
}

fn rows() -> Vec<Row> {
    let fx = fixture();
    let seed = fx["split_seed"].as_str().unwrap();
    fx["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let a = &row["args"];
            let e = train::estimate(
                &published_rows::arch(&dir(), a["config"].as_str().unwrap()),
                &recipe(a),
            );
            let figure = row["figure"].as_str().unwrap().to_string();
            let measured = match (row["measured_gb"].as_f64(), row["measured_mib"].as_f64()) {
                (Some(gb), _) => gb * 1e9,
                (_, Some(mib)) => mib * 1048576.0,
                _ => panic!("{row}: no measured figure"),
            };
            let estimated = match figure.as_str() {
                "allocated" => e.figures.allocated,
                "reserved" => e.figures.reserved,
                "nvidia-smi" => e.figures.nvidia_smi,
                other => panic!("figure {other}"),
            } as f64;
            let id = row["id"].as_str().unwrap().to_string();
            Row {
                held_out: held_out(seed, &id),
                id,
                figure,
                measured,
                estimated,
            }
        })
        .collect()
}

/// Prints one half and returns (within ±10%, rows).
fn report(rows: &[Row], held: bool) -> (usize, usize) {
    let half: Vec<&Row> = rows.iter().filter(|r| r.held_out == held).collect();
    println!(
        "\n{} half:\n{:<42}{:<11}{:>10}{:>10}{:>8}",
        if held { "HELD-OUT" } else { "TUNED" },
        "row",
        "figure",
        "measured",
        "estimate",
        "error"
    );
    let mut within = 0;
    for r in &half {
        let err = (r.estimated - r.measured) / r.measured * 100.0;
        if err.abs() <= 10.0 {
            within += 1;
        }
        println!(
            "{:<42}{:<11}{:>8.2}GB{:>8.2}GB{:>+7.1}%",
            r.id,
            r.figure,
            r.measured / 1e9,
            r.estimated / 1e9,
            err
        );
    }
    println!("within ±10%: {within} of {}", half.len());
    (within, half.len())
}

#[test]
fn published_peaks_tuned_and_held_out() {
    let rows = rows();
    let (tw, tn) = report(&rows, false);
    let (hw, hn) = report(&rows, true);
    println!(
        "\ntuned {tw}/{tn} ({:.0}%), held-out {hw}/{hn} ({:.0}%) within ±10%",
        100.0 * tw as f64 / tn as f64,
        100.0 * hw as f64 / hn as f64
    );
    assert!(
        tn >= 10 && hn >= 10,
        "both halves need rows: {tn} tuned, {hn} held out"
    );
    // The recorded level (docs/estimate.md): 11 of 14 tuned rows within ±10% (79%; the QLoRA
    // rows of the two smallest models are 11–12% low). A change that loses a row fails here.
    assert!(
        tw * 4 >= tn * 3,
        "the tuned half must stay ≥ 75% within ±10%: {tw} of {tn}"
    );
}

#[test]
fn suggested_micro_batches_never_one_that_ran_out_of_memory() {
    let fx = fixture();
    for c in fx["fit_checks"].as_array().unwrap() {
        let a = &c["args"];
        let device = c["device_gib"].as_u64().unwrap() << 30;
        let f = train::fit(
            &published_rows::arch(&dir(), a["config"].as_str().unwrap()),
            &recipe(a),
            device,
            0.0,
        );
        println!(
            "{:<36} device {} GiB: largest suggested micro-batch {} (free at it by the estimate {:.2} GB), ran: {}, OOM: {}",
            c["id"].as_str().unwrap(),
            device >> 30,
            f.max_micro_batch,
            f.free_at_max as f64 / 1e9,
            c["fits_batch"],
            c["oom_batch"]
        );
        if let Some(oom) = c["oom_batch"].as_u64() {
            assert!(
                f.max_micro_batch < oom,
                "{}: suggests {} but {oom} ran out of memory",
                c["id"],
                f.max_micro_batch
            );
        }
    }
}

#[test]
fn longest_contexts_that_fit_a_card() {
    // A context that ran must not be estimated above the card (the estimate would refuse it);
    // how far below it lands says how far the estimate would over-promise.
    let fx = fixture();
    println!(
        "{:<42}{:>8}{:>10}{:>14}{:>8}",
        "row", "card", "context", "nvidia-smi", "share"
    );
    for c in fx["context_checks"].as_array().unwrap() {
        let a = &c["args"];
        let e = train::estimate(
            &published_rows::arch(&dir(), a["config"].as_str().unwrap()),
            &recipe(a),
        );
        let card = c["device_gib"].as_u64().unwrap() << 30;
        let share = e.figures.nvidia_smi as f64 / card as f64;
        println!(
            "{:<42}{:>5} GiB{:>10}{:>11.2} GiB{:>7.0}%",
            c["id"].as_str().unwrap(),
            card >> 30,
            c["max_context"].as_u64().unwrap(),
            e.figures.nvidia_smi as f64 / (1u64 << 30) as f64,
            share * 100.0
        );
        assert!(
            share <= 1.0,
            "{}: a context that ran is estimated above the card",
            c["id"]
        );
    }
}
