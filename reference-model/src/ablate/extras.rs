//! Two measurements beside the table: memsight's overhead (interleaved baseline runs with the
//! session on, off, and on with heap sampling) and seed 000's claim measured (one layer's attention
//! forward and backward at B=4, S=2048, H=12, naive vs efficient).

use super::Options;
use crate::config::Attention;
use crate::train::median;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::Command;

/// `memsight-gpt train` with the ablation's base flags (quiet, naive attention, no periodic
/// evaluation, no flight recorder), writing its report and summary to the given paths.
fn train_command(o: &Options, report: &Path, summary: &Path) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let preset = o.preset_name();
    let mut cmd = Command::new(exe);
    cmd.args([
        "train", "--quiet", "--preset", &preset, "--device", &o.device,
    ])
    .args(["--steps", &o.steps.to_string()])
    .args(["--attention", "naive", "--eval-every", "0"])
    .args(&o.base_args)
    .arg("--report")
    .arg(report)
    .arg("--summary-json")
    .arg(summary)
    .env("MEMSIGHT_RING", "off")
    .env_remove("MEMSIGHT_REPORT");
    Ok(cmd)
}

/// Runs a prepared `train` command and reads its summary.
fn run_train(mut cmd: Command, summary: &Path, what: &str) -> Result<Summary, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&std::fs::read(summary).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())
}

#[derive(Deserialize)]
struct Summary {
    step_ms_median: f64,
}

/// Profiling on vs off: median step times of interleaved baseline runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Overhead {
    /// Pairs run (on, off, on, off, …).
    pub pairs: usize,
    /// Median step time with memsight's session and hooks.
    pub on_ms: Vec<f64>,
    /// Median step time without them.
    pub off_ms: Vec<f64>,
    /// median(on) ÷ median(off).
    pub ratio: f64,
    /// Median step time with memsight on and jemalloc's heap profiler sampling (512 KiB), as
    /// `memsight run` starts jobs.
    #[serde(default)]
    pub heap_ms: Vec<f64>,
    /// median(heap) ÷ median(on): what heap sampling adds.
    #[serde(default)]
    pub heap_ratio: f64,
}

/// How an overhead run is switched.
#[derive(Clone, Copy, PartialEq)]
enum Profiling {
    Off,
    On,
    WithHeapSampling,
}

fn step_ms(o: &Options, mode: Profiling, i: usize) -> Result<f64, String> {
    let summary = o.out.join(format!("overhead-{i}.summary.json"));
    let report = o.out.join(format!("overhead-{i}.report.json"));
    let mut cmd = train_command(o, &report, &summary)?;
    match mode {
        Profiling::Off => {
            cmd.arg("--no-profile").env("MEMSIGHT_HEAP_SAMPLE", "off");
        }
        Profiling::On => {
            cmd.env("MEMSIGHT_HEAP_SAMPLE", "off");
        }
        Profiling::WithHeapSampling => {
            cmd.env("MEMSIGHT_HEAP_SAMPLE", "512KiB");
        }
    }
    let s = run_train(cmd, &summary, "overhead run")?;
    let _ = std::fs::remove_file(&summary);
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_dir_all(memsight::heapprof::dir_for_report(&report));
    Ok(s.step_ms_median)
}

/// Step times, one decimal, comma-separated.
pub fn ms_list(v: &[f64]) -> String {
    v.iter()
        .map(|v| format!("{v:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `rounds` interleaved rounds of baseline runs: memsight on, off, on with heap sampling.
pub fn overhead(o: &Options, rounds: usize) -> Result<Overhead, String> {
    let mut r = Overhead {
        pairs: rounds,
        ..Default::default()
    };
    for i in 0..rounds {
        r.on_ms.push(step_ms(o, Profiling::On, 3 * i)?);
        r.off_ms.push(step_ms(o, Profiling::Off, 3 * i + 1)?);
        r.heap_ms
            .push(step_ms(o, Profiling::WithHeapSampling, 3 * i + 2)?);
    }
    r.ratio = median(&r.on_ms) / median(&r.off_ms).max(1e-9);
    r.heap_ratio = median(&r.heap_ms) / median(&r.on_ms).max(1e-9);
    Ok(r)
}

/// Seed 000's claim, measured: one layer's attention forward and backward at B=4, S=2048, H=12,
/// D=64 in fp32, naive vs efficient (64-key blocks). Tensor peak above q, k, v and the output
/// gradient, from the libtorch CPU hook.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ScoreCheck {
    /// Attention mode.
    pub mode: String,
    /// The seed's figure for the scores of one layer.
    pub claimed_score_bytes: i64,
    /// Measured tensor peak above the inputs during forward + backward.
    pub measured_peak_bytes: u64,
    /// Wall time of forward + backward.
    pub ms: f64,
}

pub fn score_check(mode: Attention) -> ScoreCheck {
    use crate::attention;
    use memsight::devices::tensors;
    use tch::{Device, Kind, Tensor};
    let (b, h, s, d, blk) = (4, 12, 2048, 64, 64);
    let r = || Tensor::randn([b, h, s, d], (Kind::Float, Device::Cpu));
    let (q, k, v, g) = (
        r().set_requires_grad(true),
        r().set_requires_grad(true),
        r().set_requires_grad(true),
        r(),
    );
    let base = tensors::stats().unwrap_or_default().live_bytes;
    tensors::reset_peak();
    let t0 = std::time::Instant::now();
    match mode {
        Attention::Efficient => {
            let o = attention::efficient_forward(&q, &k, &v, blk);
            let grads = attention::efficient_backward(&q, &k, &v, &o, &g, blk);
            drop(grads);
        }
        _ => {
            let o = attention::attend(&q, &k, &v, mode, blk);
            (o * &g).sum(Kind::Float).backward();
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let peak = tensors::stats().unwrap_or_default().peak_bytes;
    ScoreCheck {
        mode: format!("{mode:?}").to_lowercase(),
        claimed_score_bytes: attention::score_bytes(mode, b, h, s, blk, 4),
        measured_peak_bytes: peak.saturating_sub(base),
        ms,
    }
}
