//! `memsight-gpt ablate`: the baseline, each switch alone and all switches together, each trained
//! in its own process under `memsight run`; the inference switches (KV cache, quantization,
//! first-layer loading, head chunks, sampling) likewise; a table (markdown + JSON + SVG) of
//! per-phase peaks, the estimator's prediction, the seeds' claims beside the measured savings —
//! and, with `--peer`, the same training runs in PyTorch (peer/gpt.py) measured by the same
//! instrument, each over its own baseline.

mod extras;
mod inference;
mod measure;
mod table;
mod variants;

pub use extras::{overhead, score_check, Overhead, ScoreCheck};
pub use inference::{InferenceRow, INFERENCE};
pub use measure::{Measured, PhasePeak};
pub use variants::{estimate_for, variant_config, Variant, VARIANTS};

use crate::config::{Attention, Preset};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Options of one ablation.
pub struct Options {
    /// Preset of every run.
    pub preset: Preset,
    /// Steps per run.
    pub steps: u64,
    /// Device.
    pub device: String,
    /// Output directory.
    pub out: PathBuf,
    /// Python with torch 2.11.0 for the PyTorch peer (None: no peer).
    pub peer_python: Option<PathBuf>,
    /// `train` flags added to every run before the variant's (shape, batch, sequence length).
    pub base_args: Vec<String>,
    /// The `memsight` binary every run goes under (`memsight run`).
    pub memsight: PathBuf,
    /// The longest one run may take before it is killed (and tried once more).
    pub run_limit: std::time::Duration,
}

impl Options {
    /// The preset as its flag value.
    pub fn preset_name(&self) -> String {
        format!("{:?}", self.preset).to_lowercase()
    }
}

/// A measured training row.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Row {
    /// Variant name.
    pub name: String,
    /// The flags.
    pub args: Vec<String>,
    /// The estimator's peak for this configuration (weights, grads, optimizer, activations).
    pub estimate_bytes: u64,
    /// memsight-gpt under `memsight run`.
    #[serde(flatten)]
    pub ours: Measured,
    /// What the PyTorch peer applies of this row.
    #[serde(default)]
    pub peer_applies: String,
    /// The PyTorch peer under `memsight run` (`--peer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<Measured>,
}

/// The `memsight` binary beside this one (target/release/memsight next to memsight-gpt), when
/// there is one.
pub fn memsight_beside_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join("memsight");
    p.is_file().then_some(p)
}

fn run_row(o: &Options, v: &Variant, i: usize) -> Result<Row, String> {
    let job = measure::ours(o, v, &format!("run-{i}"))?;
    let ours = measure::run_measured(o, &job, &format!("run-{i}"), v.name)?;
    let peer = match &o.peer_python {
        Some(py) => {
            let job = measure::peer(o, py, v, &format!("peer-{i}"));
            match measure::run_measured(o, &job, &format!("peer-{i}"), &format!("peer {}", v.name))
            {
                Ok(m) => Some(m),
                Err(e) => {
                    eprintln!("{e}");
                    None
                }
            }
        }
        None => None,
    };
    Ok(Row {
        name: v.name.into(),
        args: v.args.iter().map(|a| a.to_string()).collect(),
        estimate_bytes: variants::estimate_bytes(o, v)?,
        ours,
        peer_applies: v.peer.into(),
        peer,
    })
}

/// Everything one ablation measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ablation {
    /// The training rows.
    pub rows: Vec<Row>,
    /// The inference rows.
    pub inference: Vec<InferenceRow>,
    /// Profiling on vs off.
    pub overhead: Overhead,
    /// Seed 000's claim, measured.
    pub seed_000: Vec<ScoreCheck>,
}

/// Runs every variant and writes ablation.{md,json,svg} into `o.out`.
pub fn run(o: &Options, command_line: &str) -> Result<Ablation, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    if !o.memsight.is_file() {
        return Err(format!(
            "{}: not found — every run goes under `memsight run`: build it (cargo build --release \
             -p memsight-tui) or pass --memsight PATH",
            o.memsight.display()
        ));
    }
    let mut a = Ablation::default();
    for (i, v) in VARIANTS.iter().enumerate() {
        eprintln!("ablation {}/{}: {}", i + 1, VARIANTS.len(), v.name);
        a.rows.push(run_row(o, v, i)?);
    }
    a.inference = inference::run(o)?;
    eprintln!("profiling on vs off: 5 interleaved rounds of baseline runs");
    a.overhead = overhead(o, 5)?;
    eprintln!("seed 000: naive vs efficient attention at B=4, S=2048, H=12, D=64");
    a.seed_000 = [Attention::Naive, Attention::Efficient]
        .into_iter()
        .map(score_check)
        .collect();
    let json = serde_json::to_string_pretty(&a).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| {
        let p = o.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("ablation.json", &json)?;
    write("ablation.md", &table::markdown(&a, o, command_line))?;
    write("ablation.svg", &table::svg(&a.rows))?;
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use memsight_analysis::estimate;

    fn options(preset: Preset, device: &str, base: &[&str]) -> Options {
        Options {
            preset,
            steps: 30,
            device: device.into(),
            out: PathBuf::new(),
            peer_python: None,
            base_args: base.iter().map(|s| s.to_string()).collect(),
            memsight: PathBuf::new(),
            run_limit: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn base_flags_reach_every_variant_and_the_variant_flags_win() {
        let o = options(
            Preset::Gpt2,
            "cuda",
            &["--block-size", "2048", "--batch-size", "8"],
        );
        for v in VARIANTS {
            let c = variant_config(&o, v).unwrap();
            assert_eq!(
                (c.shape.block_size, c.seq_len, c.batch_size),
                (2048, 2048, 8),
                "{}",
                v.name
            );
        }
        let micro = VARIANTS
            .iter()
            .find(|v| v.name.starts_with("micro-batch"))
            .unwrap();
        assert_eq!(variant_config(&o, micro).unwrap().accumulation(), 2);
    }

    #[test]
    fn every_variant_parses_to_the_estimate_in_the_committed_table() {
        let o = options(Preset::Tiny, "cpu", &[]);
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/ablation/ablation.json")).unwrap();
        let rows = table["rows"].as_array().unwrap();
        assert_eq!(rows.len(), VARIANTS.len());
        for (v, row) in VARIANTS.iter().zip(rows) {
            let cfg = variant_config(&o, v).unwrap();
            let est = estimate::estimate(&estimate_for(&cfg)).peak_bytes;
            assert_eq!(row["name"], v.name);
            assert_eq!(row["estimate_bytes"].as_u64(), Some(est), "{}", v.name);
        }
    }

    #[test]
    fn the_committed_markdown_says_per_row_what_the_peer_applies() {
        let md = include_str!("../../../docs/ablation/ablation.md");
        for v in VARIANTS {
            let row = format!("| {} | {} |", v.name, v.peer);
            assert!(md.contains(&row), "{row}");
        }
        for v in INFERENCE {
            assert!(
                md.contains(&format!("| {} | {} |", v.name, v.phase)),
                "{}",
                v.name
            );
        }
        assert!(md.contains("PyTorch exposes no exact count of CPU tensor bytes"));
    }

    #[test]
    fn the_committed_table_has_every_inference_row_and_both_programs_per_training_row() {
        let table: Ablation =
            serde_json::from_str(include_str!("../../../docs/ablation/ablation.json")).unwrap();
        let names: Vec<&str> = table.inference.iter().map(|r| r.name.as_str()).collect();
        let want: Vec<&str> = INFERENCE.iter().map(|v| v.name).collect();
        assert_eq!(names, want);
        for r in &table.rows {
            let peer = r
                .peer
                .as_ref()
                .unwrap_or_else(|| panic!("{}: no peer", r.name));
            for m in [&r.ours, peer] {
                assert!(m.heap_increment(&m.train).is_some(), "{}", r.name);
                assert!(m.rss_increment().is_some(), "{}", r.name);
            }
        }
    }
}
