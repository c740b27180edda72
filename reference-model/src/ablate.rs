//! `memsight-gpt ablate`: the baseline, each switch alone and all switches together, each trained
//! in its own process under memsight; a table (markdown + JSON + SVG) of peak host live heap, peak
//! RSS, peak tensor bytes, device peaks, step time, final loss and the estimator's prediction
//! beside the measured tensor peak — and, with `--peer`, the same runs in PyTorch (peer/gpt.py).

use crate::config::{Attention, Config, Preset};
use crate::train::median;
use clap::Parser;
use memsight::units::fmt_bytes;
use memsight::Report;
use memsight_analysis::estimate::{self, EstimateInput};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One variant: a name and the `train` flags that make it.
pub struct Variant {
    /// Row name.
    pub name: &'static str,
    /// Flags added to the baseline.
    pub args: &'static [&'static str],
    /// Environment of the run (allocator settings).
    pub env: &'static [(&'static str, &'static str)],
    /// What the seed documents claim this switch saves ("" where they claim nothing).
    pub claim: &'static str,
}

/// Host allocator setting of switch 14: return freed pages at once, purge in the background.
const JEMALLOC_EAGER: (&str, &str) = (
    "MALLOC_CONF",
    "dirty_decay_ms:0,muzzy_decay_ms:0,background_thread:true",
);

/// The rows: baseline, each switch alone, all together.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "baseline (naive attention, fp32)",
        args: &[],
        env: &[],
        claim: "",
    },
    Variant {
        name: "attention=efficient",
        args: &["--attention", "efficient"],
        env: &[],
        claim: "seed 000: scores 805 MB → 25 MB per layer (B=4, S=2048, H=12)",
    },
    Variant {
        name: "attention=sdpa",
        args: &["--attention", "sdpa"],
        env: &[],
        claim: "seeds 001, 002: no B·H·S² scores kept",
    },
    Variant {
        name: "checkpoint",
        args: &["--checkpoint"],
        env: &[],
        claim: "seeds 000, 001: 30–60% less activation memory",
    },
    Variant {
        name: "bf16 autocast",
        args: &["--bf16"],
        env: &[],
        claim: "seed 000: ~50% of activation memory",
    },
    Variant {
        name: "micro-batch 4 (gradient accumulation)",
        args: &["--micro-batch", "4"],
        env: &[],
        claim: "seeds 001, 003: activations scale with the micro-batch",
    },
    Variant {
        name: "eval segments ≤ 32",
        args: &["--eval-segment", "32"],
        env: &[],
        claim: "seed 002: evaluation activations bounded by the segment",
    },
    Variant {
        name: "cleanup every 5 steps",
        args: &["--cleanup-every", "5"],
        env: &[],
        claim: "seed 000: cached memory returned",
    },
    Variant {
        name: "jemalloc eager purge (MALLOC_CONF)",
        args: &[],
        env: &[JEMALLOC_EAGER],
        claim: "seeds 000, 003: lower RSS after frees",
    },
    Variant {
        name: "LoRA r=8",
        args: &["--lora-rank", "8"],
        env: &[],
        claim: "seed 003: optimizer state for the adapters only",
    },
    Variant {
        name: "threads 1, workers 1",
        args: &[
            "--threads",
            "1",
            "--interop-threads",
            "1",
            "--workers",
            "1",
            "--prefetch",
            "1",
        ],
        env: &[],
        claim: "seed 003: less scratch per thread",
    },
    Variant {
        name: "all together",
        args: &[
            "--attention",
            "efficient",
            "--checkpoint",
            "--bf16",
            "--micro-batch",
            "4",
            "--eval-segment",
            "32",
            "--cleanup-every",
            "5",
            "--lora-rank",
            "8",
            "--threads",
            "1",
            "--interop-threads",
            "1",
            "--prefetch",
            "1",
        ],
        env: &[JEMALLOC_EAGER],
        claim: "",
    },
];

/// A measured row.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Row {
    /// Variant name.
    pub name: String,
    /// The flags.
    pub args: Vec<String>,
    /// Peak live heap (Rust allocations through memsight's allocator).
    pub heap_peak_bytes: u64,
    /// Peak RSS.
    pub rss_peak_bytes: Option<u64>,
    /// Peak live CPU tensor bytes (libtorch hook).
    pub tensor_peak_bytes: Option<u64>,
    /// Peak device reserved bytes (CUDA runs).
    pub device_peak_bytes: Option<u64>,
    /// Peak device allocated bytes: the caching allocator's exact peak of live tensor bytes
    /// (CUDA runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_allocated_peak_bytes: Option<u64>,
    /// Median step time.
    pub step_ms: f64,
    /// Final training loss.
    pub final_loss: f64,
    /// The estimator's peak for this configuration (weights, grads, optimizer, activations).
    pub estimate_bytes: u64,
    /// PyTorch's peak RSS for the same run (`--peer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_rss_peak_bytes: Option<u64>,
    /// PyTorch's median step time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_step_ms: Option<f64>,
    /// PyTorch's final loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_final_loss: Option<f64>,
}

impl Row {
    /// The measured tensor peak the estimate is compared with: the device allocator's peak on a
    /// GPU, the libtorch CPU hook's on the CPU.
    pub fn measured_peak_bytes(&self) -> Option<u64> {
        self.device_allocated_peak_bytes.or(self.tensor_peak_bytes)
    }
}

/// The estimator's input for a run configuration.
pub fn estimate_for(cfg: &Config) -> EstimateInput {
    let mut e = EstimateInput::for_shape(cfg.shape.to_estimate());
    e.seq = cfg.seq_len as u64;
    e.batch = cfg.micro_batch as u64;
    // Under accumulation the gradients of the earlier micro-batches are alive through the later
    // ones' forward and loss (without it the micro-batch row was estimated 8.5% low).
    e.grad_accumulation = cfg.accumulation().max(1) as u64;
    e.checkpointing = cfg.checkpoint;
    e.attention = match cfg.attention {
        Attention::Naive => estimate::Attention::Naive,
        _ => estimate::Attention::Efficient,
    };
    e.autocast = cfg.bf16;
    // What this model does on every device: its autocast keeps LayerNorm and softmax in fp32
    // (model.rs, attention.rs) — the estimator's CUDA autocast policy; PyTorch's CPU policy
    // (bf16 softmax) is not followed. It has no dropout, so the policy is all the device decides
    // besides the optimizer: tch's AdamW is libtorch's C++ one, one tensor at a time.
    e.device = estimate::Device::Cuda;
    e.optimizer_impl = Some(estimate::OptimizerImpl::PerTensor);
    // forward_backward drops the logits once the loss is computed (the loss keeps its own
    // log-probabilities): nothing logit-sized outlives the loss's backward.
    e.keep_logits = false;
    // Our efficient attention is tensor ops over key blocks, not a fused kernel.
    if cfg.attention == Attention::Efficient {
        e.attention_block = Some(cfg.attention_block as u64);
    }
    if cfg.lora_rank > 0 {
        e.lora_rank = Some(cfg.lora_rank as u64);
    }
    e.logits_to_keep = cfg.keep().map(|k| k as u64);
    e
}

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
}

/// The configuration `train` runs for this variant: the ablation's base flags, then the variant's,
/// through the same parser.
fn variant_config(o: &Options, v: &Variant) -> Result<Config, String> {
    let preset = format!("{:?}", o.preset).to_lowercase();
    let base = ["--preset", preset.as_str(), "--attention", "naive"];
    let flags = crate::cli::TrainFlags::try_parse_from(
        base.iter()
            .copied()
            .chain(o.base_args.iter().map(String::as_str))
            .chain(v.args.iter().copied()),
    )
    .map_err(|e| format!("{}: {e}", v.name))?;
    Ok(flags.args.config())
}

/// `memsight-gpt train` with the ablation's base flags (quiet, naive attention, no periodic
/// evaluation, no flight recorder), writing its report and summary to the given paths.
fn train_command(o: &Options, report: &Path, summary: &Path) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let preset = format!("{:?}", o.preset).to_lowercase();
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
    final_loss: f64,
    step_ms_median: f64,
}

#[derive(Deserialize)]
struct PeerSummary {
    rss_peak_bytes: u64,
    step_ms_median: f64,
    final_loss: f64,
}

fn run_one(o: &Options, v: &Variant, i: usize) -> Result<Row, String> {
    let report = o.out.join(format!("run-{i}.report.json"));
    let summary = o.out.join(format!("run-{i}.summary.json"));
    let cfg = variant_config(o, v)?;
    let mut cmd = train_command(o, &report, &summary)?;
    cmd.args(v.args).envs(v.env.iter().copied());
    let s = run_train(cmd, &summary, v.name)?;
    let r = Report::load(&report).map_err(|e| e.to_string())?;
    let mut row = Row {
        name: v.name.into(),
        args: v.args.iter().map(|a| a.to_string()).collect(),
        heap_peak_bytes: r.peaks.heap_peak_bytes,
        rss_peak_bytes: r.peaks.rss_peak_bytes,
        tensor_peak_bytes: r.peaks.tensor_peak_bytes,
        device_peak_bytes: r.devices.iter().filter_map(|d| d.footprint()).max(),
        device_allocated_peak_bytes: r
            .devices
            .iter()
            .filter_map(|d| d.peak_allocated_bytes)
            .max(),
        step_ms: s.step_ms_median,
        final_loss: s.final_loss,
        estimate_bytes: estimate::estimate(&estimate_for(&cfg)).peak_bytes,
        ..Default::default()
    };
    if let Some(py) = &o.peer_python {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/gpt.py");
        let peer_out = o.out.join(format!("run-{i}.peer.json"));
        let preset = format!("{:?}", o.preset).to_lowercase();
        let out = Command::new(py)
            .arg(&script)
            .args(["--preset", &preset, "--device", &o.device])
            .args(["--steps", &o.steps.to_string()])
            .args(["--attention", "naive", "--json"])
            .arg(&peer_out)
            .args(v.args)
            .output()
            .map_err(|e| format!("{}: {e}", py.display()))?;
        if out.status.success() {
            let p: PeerSummary =
                serde_json::from_slice(&std::fs::read(&peer_out).map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            row.peer_rss_peak_bytes = Some(p.rss_peak_bytes);
            row.peer_step_ms = Some(p.step_ms_median);
            row.peer_final_loss = Some(p.final_loss);
        } else {
            eprintln!(
                "peer {}: {}",
                v.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(row)
}

/// Removes run `i`'s report, summary and peer files (the table keeps their numbers).
fn remove_run_files(o: &Options, i: usize) {
    for ext in ["report.json", "summary.json", "peer.json"] {
        let _ = std::fs::remove_file(o.out.join(format!("run-{i}.{ext}")));
    }
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

fn ms_list(v: &[f64]) -> String {
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

fn score_check(mode: Attention) -> ScoreCheck {
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

/// memsight's tch loop vs PyTorch on the baseline: interleaved pairs of runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PeerPairs {
    /// memsight-gpt median step times.
    pub ours_ms: Vec<f64>,
    /// PyTorch median step times.
    pub peer_ms: Vec<f64>,
    /// memsight-gpt peak RSS per run.
    pub ours_rss: Vec<u64>,
    /// PyTorch peak RSS per run.
    pub peer_rss: Vec<u64>,
    /// median(ours) ÷ median(PyTorch), step time.
    pub time_ratio: f64,
    /// median(ours) ÷ median(PyTorch), peak RSS.
    pub rss_ratio: f64,
}

fn peer_pairs(o: &Options, pairs: usize) -> Result<PeerPairs, String> {
    let mut p = PeerPairs::default();
    let base = &VARIANTS[0];
    for i in 0..pairs {
        let r = run_one(o, base, 100 + i)?;
        p.ours_ms.push(r.step_ms);
        p.ours_rss.push(r.rss_peak_bytes.unwrap_or(0));
        p.peer_ms.push(r.peer_step_ms.unwrap_or(0.0));
        p.peer_rss.push(r.peer_rss_peak_bytes.unwrap_or(0));
        remove_run_files(o, 100 + i);
    }
    let med_u = |v: &[u64]| median(&v.iter().map(|&x| x as f64).collect::<Vec<_>>());
    p.time_ratio = median(&p.ours_ms) / median(&p.peer_ms).max(1e-9);
    p.rss_ratio = med_u(&p.ours_rss) / med_u(&p.peer_rss).max(1.0);
    Ok(p)
}

/// Runs every variant and writes ablation.{md,json,svg} into `o.out`.
pub fn run(o: &Options, command_line: &str) -> Result<Vec<Row>, String> {
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let mut rows = Vec::new();
    for (i, v) in VARIANTS.iter().enumerate() {
        eprintln!("ablation {}/{}: {}", i + 1, VARIANTS.len(), v.name);
        rows.push(run_one(o, v, i)?);
        remove_run_files(o, i);
    }
    eprintln!("profiling on vs off: 5 interleaved pairs of baseline runs");
    let over = overhead(o, 5)?;
    let peers = match o.peer_python {
        Some(_) => {
            eprintln!("memsight-gpt vs PyTorch: 5 interleaved pairs of baseline runs");
            Some(peer_pairs(o, 5)?)
        }
        None => None,
    };
    eprintln!("seed 000: naive vs efficient attention at B=4, S=2048, H=12, D=64");
    let scores: Vec<ScoreCheck> = [Attention::Naive, Attention::Efficient]
        .into_iter()
        .map(score_check)
        .collect();
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "rows": rows, "overhead": over, "peer_pairs": peers, "seed_000": scores
    }))
    .map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| {
        let p = o.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("ablation.json", &json)?;
    let mut md = markdown(&rows, o, command_line);
    let _ = write!(
        md,
        "\n## Profiling on vs off\n\nBaseline, {} interleaved rounds of runs; median step time with \
         memsight's session, libtorch hooks and sampler vs `--no-profile` (the global allocator stays \
         in both), and with jemalloc's heap profiler sampling every 512 KiB as `memsight run` \
         starts jobs:\n\n| on (ms) | off (ms) | on ÷ off | + heap sampling (ms) | heap ÷ on |\n\
         |---|---|---:|---|---:|\n| {} | {} | {:.3}× | {} | {:.3}× |\n",
        over.pairs,
        ms_list(&over.on_ms),
        ms_list(&over.off_ms),
        over.ratio,
        ms_list(&over.heap_ms),
        over.heap_ratio
    );
    if let Some(p) = &peers {
        let ms = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = write!(
            md,
            "\n## memsight-gpt vs PyTorch (baseline, 5 interleaved pairs)\n\n| | memsight-gpt (tch) | PyTorch | ratio of medians |\n|---|---|---|---:|\n\
             | step ms | {} | {} | {:.3}× |\n| peak RSS | {} | {} | {:.3}× |\n",
            ms(&p.ours_ms),
            ms(&p.peer_ms),
            p.time_ratio,
            p.ours_rss.iter().map(|&b| fmt_bytes(b)).collect::<Vec<_>>().join(", "),
            p.peer_rss.iter().map(|&b| fmt_bytes(b)).collect::<Vec<_>>().join(", "),
            p.rss_ratio
        );
    }
    md += "\n## Seed 000, measured\n\nOne layer's attention, forward and backward, B=4, S=2048, H=12, D=64, fp32 (tensor peak above q, k, v and the output gradient, from the libtorch hook):\n\n| attention | seed's scores per layer | measured peak | time |\n|---|---:|---:|---:|\n";
    for c in &scores {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} ms |",
            c.mode,
            fmt_bytes(c.claimed_score_bytes as u64),
            fmt_bytes(c.measured_peak_bytes),
            c.ms
        );
    }
    write("ablation.md", &md)?;
    write("ablation.svg", &svg(&rows))?;
    Ok(rows)
}

fn opt(v: Option<u64>) -> String {
    v.map(fmt_bytes).unwrap_or_else(|| "–".into())
}

fn ratio(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => format!("{:.2}×", a as f64 / b as f64),
        _ => "–".into(),
    }
}

/// The markdown table.
pub fn markdown(rows: &[Row], o: &Options, command_line: &str) -> String {
    let mut s = format!(
        "# Ablation: memsight-gpt, preset {:?}, {} steps, device {}\n\nMade with `{command_line}` \
         (each row is its own process under memsight). Tensor peak is the libtorch CPU hook's exact \
         peak; the estimate is `memsight estimate`'s training peak for the same shape and switches \
         (weights + grads + AdamW + activations); RSS includes libtorch's own code and caches.\n\n",
        o.preset, o.steps, o.device
    );
    let peer = rows.iter().any(|r| r.peer_rss_peak_bytes.is_some());
    let measured = if rows.iter().any(|r| r.device_allocated_peak_bytes.is_some()) {
        "device allocated peak"
    } else {
        "tensor peak"
    };
    let _ = write!(
        s,
        "| variant | {measured} | estimate | measured ÷ est | saving vs baseline | seed's claim | heap peak | peak RSS | device reserved peak | step ms | final loss |"
    );
    if peer {
        s += " PyTorch RSS | RSS ÷ PyTorch | PyTorch ms | ms ÷ PyTorch |";
    }
    s += "\n|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|";
    if peer {
        s += "---:|---:|---:|---:|";
    }
    s += "\n";
    let baseline = rows.first().and_then(Row::measured_peak_bytes);
    for r in rows {
        let saving = match (baseline, r.measured_peak_bytes()) {
            (Some(b), Some(m)) if b > 0 => {
                format!("{:+.0}%", (b as f64 - m as f64) / b as f64 * 100.0)
            }
            _ => "–".into(),
        };
        let claim = VARIANTS
            .iter()
            .find(|v| v.name == r.name)
            .map_or("", |v| v.claim);
        let _ = write!(
            s,
            "| {} | {} | {} | {} | {saving} | {claim} | {} | {} | {} | {:.1} | {:.4} |",
            r.name,
            opt(r.measured_peak_bytes()),
            fmt_bytes(r.estimate_bytes),
            ratio(r.measured_peak_bytes(), Some(r.estimate_bytes)),
            fmt_bytes(r.heap_peak_bytes),
            opt(r.rss_peak_bytes),
            opt(r.device_peak_bytes),
            r.step_ms,
            r.final_loss
        );
        if peer {
            let _ = write!(
                s,
                " {} | {} | {} | {} |",
                opt(r.peer_rss_peak_bytes),
                ratio(r.rss_peak_bytes, r.peer_rss_peak_bytes),
                r.peer_step_ms
                    .map(|v| format!("{v:.1}"))
                    .unwrap_or_else(|| "–".into()),
                r.peer_step_ms
                    .map(|p| format!("{:.2}×", r.step_ms / p.max(1e-9)))
                    .unwrap_or_else(|| "–".into())
            );
        }
        s += "\n";
    }
    s
}

/// Horizontal bars: tensor peak and peak RSS per variant.
pub fn svg(rows: &[Row]) -> String {
    let max = rows
        .iter()
        .flat_map(|r| {
            [
                r.measured_peak_bytes().unwrap_or(0),
                r.rss_peak_bytes.unwrap_or(0),
            ]
        })
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let (left, width, row_h) = (260.0, 520.0, 34.0);
    let h = 40.0 + row_h * rows.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"18\">peak tensor bytes (blue; device allocated on a GPU) and peak RSS (grey) per variant</text>\n"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 30.0 + row_h * i as f64;
        let t = r.measured_peak_bytes().unwrap_or(0) as f64 / max * width;
        let rss = r.rss_peak_bytes.unwrap_or(0) as f64 / max * width;
        let _ = write!(
            s,
            "<text x=\"10\" y=\"{:.0}\">{}</text>\n<rect x=\"{left}\" y=\"{y:.0}\" width=\"{rss:.1}\" height=\"13\" fill=\"#bbb\"/>\n\
             <rect x=\"{left}\" y=\"{:.0}\" width=\"{t:.1}\" height=\"13\" fill=\"#3b6fb6\"/>\n\
             <text x=\"{:.0}\" y=\"{:.0}\">{} / {}</text>\n",
            y + 18.0,
            r.name.replace('&', "&amp;").replace('<', "&lt;"),
            y + 14.0,
            left + rss.max(t) + 6.0,
            y + 18.0,
            opt(r.measured_peak_bytes()),
            opt(r.rss_peak_bytes)
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_flags_reach_every_variant_and_the_variant_flags_win() {
        let o = Options {
            preset: Preset::Gpt2,
            steps: 10,
            device: "cuda".into(),
            out: PathBuf::new(),
            peer_python: None,
            base_args: ["--block-size", "2048", "--batch-size", "8"]
                .map(String::from)
                .to_vec(),
        };
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
        let o = Options {
            preset: Preset::Tiny,
            steps: 30,
            device: "cpu".into(),
            out: PathBuf::new(),
            peer_python: None,
            base_args: Vec::new(),
        };
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/ablation/ablation.json")).unwrap();
        let rows = table["rows"].as_array().unwrap();
        assert_eq!(rows.len(), VARIANTS.len());
        for (v, row) in VARIANTS.iter().zip(rows) {
            let cfg = variant_config(&o, v).unwrap();
            let est = estimate::estimate(&estimate_for(&cfg)).peak_bytes;
            assert_eq!(row["name"], v.name);
            assert_eq!(row["estimate_bytes"].as_u64(), Some(est), "{}", v.name);
        }
    }
}
