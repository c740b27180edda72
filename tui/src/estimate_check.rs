//! `memsight estimate --check-batch`: confirms the largest micro-batch by running it. The
//! validation harness (`scripts/estimate-validate.py`, embedded in the binary) trains the same
//! nanoGPT-style configuration on this machine's CPU with torch at that micro-batch and one more,
//! each in a fresh process under `torch.profiler`, and reports the peak of live tensor bytes of a
//! steady-state step; it is compared with the estimate and with the budget.

use memsight_analysis::estimate::{
    estimate, Attention, Device, Dtype, EstimateInput, Optimizer, OptimizerImpl,
};
use memsight_format::units::fmt_bytes;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The harness, so that an installed binary needs only the torch venv, not the repository.
const HARNESS: &str = include_str!("../../scripts/estimate-validate.py");

/// One micro-batch, run.
#[derive(Debug, Serialize)]
pub struct Checked {
    /// The micro-batch.
    pub batch: u64,
    /// Whether it is the estimator's largest micro-batch (else: one more).
    pub suggested: bool,
    /// The estimator's peak for it on CPU (the device the harness runs on).
    pub estimated_bytes: u64,
    /// The measured peak of live tensor bytes.
    pub measured_bytes: u64,
    /// estimated ÷ measured − 1.
    pub error: f64,
    /// Whether the measured peak is within the budget.
    pub fits: bool,
}

/// The result of `--check-batch`.
#[derive(Debug, Serialize)]
pub struct Check {
    /// device · (1 − headroom).
    pub budget_bytes: u64,
    /// The python that ran the harness.
    pub python: PathBuf,
    /// The runs: the largest micro-batch, then one more (or only batch 1 when none fits).
    pub runs: Vec<Checked>,
    /// Whether the check passed: the suggested micro-batch really fits (or, when none was
    /// suggested, batch 1 really does not).
    pub ok: bool,
}

/// The harness's configuration (`scripts/estimate-validate.py`'s `cfg`) for `i` at `batch`, or
/// why the harness cannot run it.
pub fn harness_config(i: &EstimateInput, batch: u64) -> Result<serde_json::Value, String> {
    let Some(s) = i.shape else {
        return Err("--check-batch needs the model's shape (--preset or --layers/--hidden/--heads), not only --params".into());
    };
    let mut cannot = Vec::new();
    if i.dtype != Dtype::Fp32 {
        cannot.push("--dtype bf16/fp16 weights (use --autocast for mixed precision)");
    }
    if !i.autocast && i.activation_dtype != Dtype::Fp32 {
        cannot.push("--activation-dtype without --autocast");
    }
    if i.optimizer == Optimizer::None {
        cannot.push("--optimizer none");
    }
    if i.optimizer == Optimizer::Sgd && i.optimizer_impl_or_default() == OptimizerImpl::Fused {
        cannot.push("--optimizer sgd with --optimizer-impl fused");
    }
    if i.lora_rank.is_some() {
        cannot.push("--lora-rank");
    }
    if i.attention_block.is_some() {
        cannot.push("--attention-block");
    }
    if i.logits_to_keep.is_some() {
        cannot.push("--logits-to-keep");
    }
    if i.quant_bits.is_some() {
        cannot.push("--quant-bits");
    }
    if i.first_layers.is_some() {
        cannot.push("--first-layers");
    }
    if i.zero_stage > 0 || i.gpus > 1 {
        cannot.push("ZeRO / several GPUs");
    }
    if i.seq > s.positions {
        cannot.push("--seq longer than the position table");
    }
    if !cannot.is_empty() {
        return Err(format!(
            "--check-batch: the validation harness cannot run this configuration ({}); it trains a \
             nanoGPT-style model in fp32 (optionally autocast) with AdamW or SGD on one device",
            cannot.join(", ")
        ));
    }
    let mut c = serde_json::json!({
        "layers": s.layers,
        "hidden": s.hidden,
        "heads": s.heads,
        "vocab": s.vocab,
        "seq": i.seq,
        "batch": batch,
        "attention": if i.attention == Attention::Naive { "naive" } else { "sdpa" },
        "autocast": i.autocast,
        "checkpointing": i.checkpointing,
        "dropout": i.dropout,
        "optimizer": if i.optimizer == Optimizer::Sgd { "sgd" } else { "adamw" },
        "optimizer_impl": match i.optimizer_impl_or_default() {
            OptimizerImpl::Foreach => "foreach",
            OptimizerImpl::PerTensor => "per-tensor",
            OptimizerImpl::Fused => "fused",
        },
        "accum": i.grad_accumulation,
        "keep_logits": i.keep_logits,
    });
    if s.positions != i.seq {
        c["positions"] = s.positions.into();
    }
    Ok(c)
}

/// The torch venv's python: `explicit`, else the one `scripts/setup.sh` makes
/// (`$MEMSIGHT_CACHE`, else `$XDG_CACHE_HOME/memsight`, else `~/.cache/memsight`, then
/// `torch-2.11.0/bin/python`).
pub fn torch_python(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let py = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let cache = std::env::var_os("MEMSIGHT_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("memsight"))
                })
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/memsight"))
                })
                .ok_or("--check-batch: no $MEMSIGHT_CACHE or $HOME to find the torch venv in")?;
            cache.join("torch-2.11.0/bin/python")
        }
    };
    if py.exists() {
        Ok(py)
    } else {
        Err(format!(
            "--check-batch runs PyTorch, and {} is missing: create the torch venv with \
             scripts/setup.sh (or set $MEMSIGHT_CACHE, or pass --python PATH)",
            py.display()
        ))
    }
}

/// MemAvailable of this machine, when readable.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs the harness's measuring process on `configs` (one fresh process; each configuration under
/// its own profiler session): their peaks of live tensor bytes.
fn measure(python: &Path, configs: &[serde_json::Value]) -> Result<Vec<u64>, String> {
    let script = std::env::temp_dir().join(format!(
        "memsight-estimate-validate-{}.py",
        std::process::id()
    ));
    std::fs::write(&script, HARNESS)
        .map_err(|e| format!("cannot write the harness to {}: {e}", script.display()))?;
    let out = Command::new(python)
        .arg(&script)
        .arg("--measure")
        .arg(serde_json::Value::from(configs.to_vec()).to_string())
        .output();
    let _ = std::fs::remove_file(&script);
    let out = out.map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "the validation harness failed ({}):\n{}",
            out.status,
            tail.join("\n")
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last)
        .map_err(|e| format!("the validation harness printed no result ({e}): {last}"))?;
    v.as_array()
        .map(|a| a.iter().filter_map(|r| r["peak_bytes"].as_u64()).collect())
        .filter(|p: &Vec<u64>| p.len() == configs.len())
        .ok_or_else(|| format!("the validation harness printed no peaks: {last}"))
}

/// What `--check-batch` needs before anything runs: the configurations and the python (errors:
/// exit 2).
pub struct Plan {
    input: EstimateInput,
    budget: u64,
    batches: Vec<(u64, bool)>,
    configs: Vec<serde_json::Value>,
    python: PathBuf,
}

/// Prepares the check of `largest` (the estimator's largest micro-batch for `i`, 0 when none fits).
pub fn plan(
    i: &EstimateInput,
    device: u64,
    largest: u64,
    python: Option<&Path>,
) -> Result<Plan, String> {
    let budget = (device as f64 * (1.0 - i.headroom.clamp(0.0, 1.0))) as u64;
    let batches = if largest == 0 {
        vec![(1, false)]
    } else {
        vec![(largest, true), (largest + 1, false)]
    };
    let configs = batches
        .iter()
        .map(|&(b, _)| harness_config(i, b))
        .collect::<Result<Vec<_>, _>>()?;
    // The harness runs on this machine: its CPU memory must hold the larger run.
    let mut cpu = i.clone();
    cpu.device = Device::Cpu;
    cpu.optimizer_impl = Some(i.optimizer_impl_or_default());
    cpu.device_memory = None;
    cpu.batch = batches.last().map_or(1, |b| b.0);
    let need = estimate(&cpu).peak_bytes;
    if let Some(avail) = mem_available() {
        if need as f64 > avail as f64 * 0.8 {
            return Err(format!(
                "--check-batch: running micro-batch {} on this machine's CPU needs about {} of \
                 memory, and {} is available",
                cpu.batch,
                fmt_bytes(need),
                fmt_bytes(avail)
            ));
        }
    }
    let python = torch_python(python)?;
    Ok(Plan {
        input: cpu,
        budget,
        batches,
        configs,
        python,
    })
}

/// Runs the planned check.
pub fn run(p: Plan) -> Result<Check, String> {
    let measured = measure(&p.python, &p.configs)?;
    let runs: Vec<Checked> = p
        .batches
        .iter()
        .zip(measured)
        .map(|(&(batch, suggested), m)| {
            let mut c = p.input.clone();
            c.batch = batch;
            let e = estimate(&c).peak_bytes;
            Checked {
                batch,
                suggested,
                estimated_bytes: e,
                measured_bytes: m,
                error: if m == 0 {
                    0.0
                } else {
                    e as f64 / m as f64 - 1.0
                },
                fits: m <= p.budget,
            }
        })
        .collect();
    let ok = match runs.first() {
        Some(r) if r.suggested => r.fits,
        Some(r) => !r.fits,
        None => false,
    };
    Ok(Check {
        budget_bytes: p.budget,
        python: p.python,
        runs,
        ok,
    })
}

/// The check as text.
pub fn print(c: &Check, device: u64, headroom: f64, device_kind: Device) {
    println!(
        "\n  check (--check-batch): measured on this machine's CPU with {} (peak of live tensor \
         bytes of a steady-state step; budget {} = {} less {:.0}% headroom){}:",
        c.python.display(),
        fmt_bytes(c.budget_bytes),
        fmt_bytes(device),
        headroom * 100.0,
        if device_kind == Device::Cuda {
            "; estimates below are the CPU ones (autocast's dtypes and dropout's masks differ)"
        } else {
            ""
        }
    );
    for r in &c.runs {
        println!(
            "    micro-batch {:<6} estimated {:>11}  measured {:>11}  ({:+.1}%)  {}{}",
            r.batch,
            fmt_bytes(r.estimated_bytes),
            fmt_bytes(r.measured_bytes),
            r.error * 100.0,
            if r.fits {
                "fits the budget"
            } else {
                "does NOT fit the budget"
            },
            if r.suggested {
                "  ← the largest micro-batch"
            } else {
                ""
            }
        );
    }
    let verdict = match (c.runs.first(), c.runs.get(1)) {
        (Some(s), Some(n)) if s.suggested && s.fits && !n.fits => {
            format!("confirmed: {} fits and {} does not", s.batch, n.batch)
        }
        (Some(s), Some(n)) if s.suggested && s.fits => format!(
            "{} fits; so does {} (the estimate is conservative here)",
            s.batch, n.batch
        ),
        (Some(s), _) if s.suggested => format!(
            "FAILED: the suggested micro-batch {} does not fit: the estimate is too low",
            s.batch
        ),
        (Some(s), _) if !s.fits => "confirmed: not even micro-batch 1 fits".into(),
        (Some(_), _) => {
            "micro-batch 1 fits although the estimate says it does not (conservative)".into()
        }
        (None, _) => "nothing was run".into(),
    };
    println!("    {verdict}");
}
