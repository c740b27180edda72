//! The ablation's inference rows: `generate` with each KV cache and weight quantization, and
//! `analyze` loading the whole checkpoint or its first layer only, computing attention maps for all
//! heads at once, a head at a time or for sampled rows. Each row is its own process under
//! `memsight run`, measured in the phase its switch acts on.

use super::measure::{self, Job};
use super::Options;
use memsight::Report;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Which command a row runs.
#[derive(Clone, Copy, PartialEq)]
pub enum Command {
    /// `memsight-gpt generate` (phase `generate`).
    Generate,
    /// `memsight-gpt analyze` (phases `load` and `maps`).
    Analyze,
}

/// What a row's saving is read from.
#[derive(Clone, Copy, PartialEq, Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// The phase's tensor peak (weights included: quantization shrinks them before the phase).
    TensorPeak,
    /// The phase's heap growth above its entry (what the phase itself needed, tensor storage
    /// included: CPU tensors are heap blocks).
    HeapRise,
}

/// One inference row.
pub struct InferenceVariant {
    /// Row name.
    pub name: &'static str,
    /// The command.
    pub command: Command,
    /// Its flags.
    pub args: &'static [&'static str],
    /// The phase measured.
    pub phase: &'static str,
    /// What the saving is read from.
    pub metric: Metric,
    /// The row the saving is measured against ("": none, a reference row).
    pub against: &'static str,
    /// What the seed documents claim.
    pub claim: &'static str,
}

const PREALLOC: &str = "generate: KV cache preallocated, fp32 weights";
const WHOLE: &str = "load: whole checkpoint (VarStore::load)";
const ALL_HEADS: &str = "maps: all heads at once";

/// The inference rows.
pub const INFERENCE: &[InferenceVariant] = &[
    InferenceVariant {
        name: PREALLOC,
        command: Command::Generate,
        args: &["--kv-cache", "prealloc"],
        phase: "generate",
        metric: Metric::HeapRise,
        against: "",
        claim: "",
    },
    InferenceVariant {
        name: "generate: KV cache grown per token",
        command: Command::Generate,
        args: &["--kv-cache", "grow"],
        phase: "generate",
        metric: Metric::HeapRise,
        against: PREALLOC,
        claim: "seed 001: growing the cache reallocates (two copies at once)",
    },
    InferenceVariant {
        name: "generate: no KV cache (recompute)",
        command: Command::Generate,
        args: &["--kv-cache", "none"],
        phase: "generate",
        metric: Metric::HeapRise,
        against: PREALLOC,
        claim: "seed 001: the cache trades memory for recomputation",
    },
    InferenceVariant {
        name: "generate: int8 weights",
        command: Command::Generate,
        args: &["--kv-cache", "prealloc", "--quant", "8"],
        phase: "generate",
        metric: Metric::TensorPeak,
        against: PREALLOC,
        claim: "",
    },
    InferenceVariant {
        name: "generate: int4 weights",
        command: Command::Generate,
        args: &["--kv-cache", "prealloc", "--quant", "4"],
        phase: "generate",
        metric: Metric::TensorPeak,
        against: PREALLOC,
        claim: "seed 002: 4-bit ~15 GB vs ~40 GB",
    },
    InferenceVariant {
        name: WHOLE,
        command: Command::Analyze,
        args: &["--whole", "--sample-rows", "1"],
        phase: "load",
        metric: Metric::HeapRise,
        against: "",
        claim: "",
    },
    InferenceVariant {
        name: "load: first layer only",
        command: Command::Analyze,
        args: &["--layers", "1", "--sample-rows", "1"],
        phase: "load",
        metric: Metric::HeapRise,
        against: WHOLE,
        claim: "seed 004: 96.7% less memory (embeddings + layer 0 + final norm)",
    },
    InferenceVariant {
        name: ALL_HEADS,
        command: Command::Analyze,
        args: &["--layers", "1", "--head-chunk", "64"],
        phase: "maps",
        metric: Metric::HeapRise,
        against: "",
        claim: "",
    },
    InferenceVariant {
        name: "maps: one head at a time",
        command: Command::Analyze,
        args: &["--layers", "1", "--head-chunk", "1"],
        phase: "maps",
        metric: Metric::HeapRise,
        against: ALL_HEADS,
        claim: "seed 002: map memory ÷ (heads per chunk)",
    },
    InferenceVariant {
        name: "maps: sampling mode, 8 rows",
        command: Command::Analyze,
        args: &["--layers", "1", "--sample-rows", "8"],
        phase: "maps",
        metric: Metric::HeapRise,
        against: ALL_HEADS,
        claim: "seed 002: scores of the sampled rows only",
    },
];

/// A measured inference row.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct InferenceRow {
    /// Row name.
    pub name: String,
    /// The command line after `memsight-gpt`.
    pub args: Vec<String>,
    /// The phase measured.
    pub phase: String,
    /// Highest live tensor bytes inside the phase.
    pub tensor_peak_bytes: Option<u64>,
    /// Largest heap growth above the phase's entry.
    pub heap_rise_bytes: Option<u64>,
    /// Peak live process heap over the run.
    pub heap_peak_bytes: u64,
    /// Peak RSS over the run.
    pub rss_peak_bytes: Option<u64>,
}

impl InferenceRow {
    /// The value the row's saving is read from.
    pub fn metric(&self, m: Metric) -> Option<u64> {
        match m {
            Metric::TensorPeak => self.tensor_peak_bytes,
            Metric::HeapRise => self.heap_rise_bytes,
        }
    }
}

/// The row named `name`.
pub fn find(name: &str) -> Option<&'static InferenceVariant> {
    INFERENCE.iter().find(|v| v.name == name)
}

/// Trains the checkpoint the rows load (the ablation's preset, a few steps), then runs every row.
pub fn run(o: &Options) -> Result<Vec<InferenceRow>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let ckpt = o.out.join("inference-model.safetensors");
    let report = o.out.join("inference-train.report.json");
    let out = std::process::Command::new(&exe)
        .args(["train", "--quiet", "--preset", &o.preset_name()])
        .args(["--steps", "5", "--eval-every", "0", "--report"])
        .arg(&report)
        .arg("--save")
        .arg(&ckpt)
        .env("MEMSIGHT_RING", "off")
        .env("MEMSIGHT_HEAP_SAMPLE", "off")
        .env_remove("MEMSIGHT_REPORT")
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_dir_all(o.out.join("inference-train.report.heap"));
    if !out.status.success() {
        return Err(format!(
            "the inference rows' checkpoint: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let maps = o.out.join("inference-maps");
    let text: String = crate::data::CORPUS.chars().take(4096).collect();
    let mut rows = Vec::new();
    for (i, v) in INFERENCE.iter().enumerate() {
        eprintln!("inference {}/{}: {}", i + 1, INFERENCE.len(), v.name);
        let mut args: Vec<String> = match v.command {
            Command::Generate => vec!["generate".into(), "--tokens".into(), "64".into()],
            Command::Analyze => vec![
                "analyze".into(),
                "--text".into(),
                text.clone(),
                "--out".into(),
                maps.display().to_string(),
            ],
        };
        args.push("--load".into());
        args.push(ckpt.display().to_string());
        args.extend(v.args.iter().map(|a| a.to_string()));
        let job = Job {
            program: exe.clone(),
            args: args.clone(),
            env: Vec::new(),
        };
        let mut row = measure_row(o, v, &job, &format!("inference-{i}"))?;
        // The table shows the command line with the long text elided and no machine paths.
        row.args = args
            .iter()
            .map(|a| {
                if a == &text {
                    "…".into()
                } else if a.starts_with('/') {
                    Path::new(a)
                        .file_name()
                        .map_or(a.clone(), |f| f.to_string_lossy().into_owned())
                } else {
                    a.clone()
                }
            })
            .collect();
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&maps);
    for ext in ["safetensors", "config.json"] {
        let _ = std::fs::remove_file(ckpt.with_extension(ext));
    }
    Ok(rows)
}

fn measure_row(
    o: &Options,
    v: &InferenceVariant,
    job: &Job,
    files: &str,
) -> Result<InferenceRow, String> {
    let report = o.out.join(format!("{files}.report.json"));
    let log = o.out.join(format!("{files}.log"));
    let ok = measure::run_bounded(measure::under_memsight(o, job, &report), &log, o.run_limit)?;
    let result = if ok {
        Report::load(&report)
            .map_err(|e| e.to_string())
            .map(|r| row_of(v, &r))
    } else {
        Err(format!("{}: {}", v.name, measure::log_tail(&log)))
    };
    measure::remove_files(o, files);
    result
}

fn row_of(v: &InferenceVariant, r: &Report) -> InferenceRow {
    let p = r.phases.iter().find(|p| p.path == v.phase);
    InferenceRow {
        name: v.name.into(),
        args: Vec::new(),
        phase: v.phase.into(),
        tensor_peak_bytes: p.and_then(|p| p.tensor_peak_bytes),
        heap_rise_bytes: p.map(|p| p.max_rise_bytes),
        heap_peak_bytes: r.peaks.heap_peak_bytes,
        rss_peak_bytes: r.peaks.rss_peak_bytes,
    }
}

/// The saving of `row` against the row it names, in percent of that row's metric.
pub fn saving(rows: &[InferenceRow], row: &InferenceRow) -> Option<f64> {
    let v = find(&row.name)?;
    let base = rows.iter().find(|r| r.name == v.against)?;
    let (b, m) = (base.metric(v.metric)?, row.metric(v.metric)?);
    (b > 0).then(|| (b as f64 - m as f64) / b as f64 * 100.0)
}
