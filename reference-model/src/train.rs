//! The training loop (nanoGPT's train.py shape): data loader, AdamW, gradient accumulation,
//! periodic evaluation and cleanup, a progress line with loss, step time and live/peak memory, and
//! a safetensors checkpoint with the effective config beside it. Every part runs inside memsight
//! phases (`train/forward`, `train/backward`, `train/optimizer`, `eval`).

use crate::config::Config;
use crate::data::{self, Loader};
use crate::model::Gpt;
use crate::optim;
use crate::step;
use memsight::units::fmt_bytes;
use memsight_integrations::torch;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;
use tch::nn::{self, OptimizerConfig};

/// What a run measured (printed as JSON by `--summary-json`, read by the ablation).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunSummary {
    /// Final training loss (mean of the last step's micro-batches).
    pub final_loss: f64,
    /// Last validation loss.
    pub val_loss: Option<f64>,
    /// The first step's loss (of this run: after --resume, the first step it ran).
    pub first_loss: f64,
    /// The last step's learning rate.
    pub lr: f64,
    /// The last step's gradient norm before clipping (with --grad-clip).
    pub grad_norm: Option<f64>,
    /// Median step time in milliseconds (after the first step).
    pub step_ms_median: f64,
    /// Trainable parameters.
    pub trainable_params: i64,
    /// All parameters.
    pub params: i64,
    /// RSS changes from the cleanups between train steps: (before, after) bytes.
    pub cleanups: Vec<(u64, u64)>,
    /// RSS changes from the cleanups between eval batches (`--cleanup-eval-every`).
    pub eval_cleanups: Vec<(u64, u64)>,
    /// The cleanup forced after the last step when either cleanup switch is on, so the run's
    /// final state shows its effect whatever the step count.
    pub final_cleanup: Option<(u64, u64)>,
    /// Live process heap when training starts (model, optimizer and data ready, before step 0),
    /// from the memsight session's snapshot: the baseline the ablation's increments are over.
    pub baseline_heap_bytes: Option<u64>,
    /// RSS at the same moment.
    pub baseline_rss_bytes: Option<u64>,
}

/// Where to save a checkpoint (safetensors) and its config (`.config.json` beside it).
pub struct Save {
    /// The `.safetensors` path.
    pub path: PathBuf,
}

/// The median (upper middle for an even count); 0 for no values.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn rss() -> u64 {
    memsight::snapshot().process.map(|p| p.rss).unwrap_or(0)
}

/// Releases cached memory: CUDA's caching allocator and jemalloc's dirty pages. Returns RSS
/// before and after.
pub fn cleanup() -> (u64, u64) {
    let before = rss();
    let _ = torch::empty_cache();
    let _ = memsight::collect::jemalloc::purge();
    (before, rss())
}

/// Trains per `cfg`; `progress` prints the progress line.
pub fn train(cfg: &Config, save: Option<&Save>, progress: bool) -> Result<RunSummary, String> {
    cfg.validate()?;
    let device = cfg.tch_device()?;
    if cfg.threads > 0 {
        tch::set_num_threads(cfg.threads);
    }
    if cfg.interop_threads > 0 {
        tch::set_num_interop_threads(cfg.interop_threads);
    }
    tch::manual_seed(cfg.seed as i64);
    let (train_tokens, val_tokens) = data::load(None)?;
    let first_step = resume_step(cfg)?;
    let mut vs = nn::VarStore::new(device);
    let lora_vs = nn::VarStore::new(device);
    let lora_root = lora_vs.root();
    let model = Gpt::new(
        &vs.root(),
        (cfg.lora_rank > 0).then_some(&lora_root),
        cfg.lora_rank,
        cfg.shape,
        None,
    );
    if let Some(p) = &cfg.init_from {
        init_from(&mut vs, p, cfg)?;
    }
    let params: i64 = vs
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum::<i64>()
        + lora_vs
            .trainable_variables()
            .iter()
            .map(|t| t.numel() as i64)
            .sum::<i64>();
    let opt_vs = if cfg.lora_rank > 0 {
        vs.freeze();
        &lora_vs
    } else {
        &vs
    };
    let trainable: i64 = opt_vs
        .trainable_variables()
        .iter()
        .map(|t| t.numel() as i64)
        .sum();
    // AdamW without decay: the decoupled decay is applied to the matmul weights only
    // (optim::decayed), nanoGPT's two parameter groups with the embeddings kept out.
    let mut opt = nn::adamw(0.9, 0.95, 0.0)
        .build(opt_vs, cfg.lr)
        .map_err(|e| format!("optimizer: {e}"))?;
    let decayed = optim::decayed(opt_vs);
    let trainables = opt_vs.trainable_variables();
    let schedule = cfg.lr_schedule();
    // Whole batches, split into micro-batches: accumulation sees exactly the big batch's data.
    let mut loader = Loader::starting_at(
        first_step,
        train_tokens,
        cfg.seed,
        cfg.batch_size,
        cfg.seq_len,
        cfg.workers,
        cfg.prefetch,
    );
    let accum = cfg.accumulation();
    let tty = std::io::stderr().is_terminal();
    let mut times = Vec::new();
    let mut summary = RunSummary {
        trainable_params: trainable,
        params,
        ..Default::default()
    };
    let at_start = memsight::snapshot();
    summary.baseline_heap_bytes = Some(at_start.heap.live_bytes);
    summary.baseline_rss_bytes = at_start.process.map(|p| p.rss);
    for it in first_step..cfg.steps {
        memsight::step(it);
        let t0 = Instant::now();
        let mut loss_sum = 0.0;
        {
            let _train = memsight::phase("train");
            let b = loader.next_batch().ok_or("the data loader stopped")?;
            let (x, y) = b.tensors(device);
            for i in 0..accum {
                let rows = |t: &tch::Tensor| t.narrow(0, i * cfg.micro_batch, cfg.micro_batch);
                loss_sum += step::forward_backward(
                    &model,
                    cfg,
                    &rows(&x),
                    &rows(&y),
                    cfg.keep(),
                    1.0 / accum as f64,
                )
                .map_err(|e| e.to_string())?;
            }
            let _o = memsight::phase("optimizer");
            let lr = schedule.at(it);
            opt.set_lr(lr);
            if cfg.grad_clip > 0.0 {
                summary.grad_norm = Some(optim::clip_grad_norm(&trainables, cfg.grad_clip));
            }
            optim::apply_weight_decay(&decayed, lr, cfg.weight_decay);
            summary.lr = lr;
            opt.step();
            opt.zero_grad();
        }
        if let tch::Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
        let dt = t0.elapsed().as_secs_f64() * 1000.0;
        if it > first_step {
            times.push(dt);
        }
        summary.final_loss = loss_sum / accum as f64;
        if it == first_step {
            summary.first_loss = summary.final_loss;
        }
        if cfg.cleanup_every > 0 && (it + 1) % cfg.cleanup_every == 0 {
            let (a, b) = cleanup();
            summary.cleanups.push((a, b));
            if progress {
                eprintln!(
                    "\ncleanup after step {}: RSS {} → {}",
                    it + 1,
                    fmt_bytes(a),
                    fmt_bytes(b)
                );
            }
        }
        let last = it + 1 == cfg.steps;
        if (cfg.eval_every > 0 && (it + 1) % cfg.eval_every == 0) || last {
            let v = evaluate(&model, cfg, &val_tokens, device, &mut summary.eval_cleanups)?;
            summary.val_loss = Some(v);
            if progress {
                eprintln!(
                    "{}step {:>5} | val loss {v:.4}",
                    if tty { "\n" } else { "" },
                    it + 1
                );
            }
        }
        if progress && (tty || (it + 1) % 10 == 0 || last) {
            let s = memsight::stats();
            let t = memsight::devices::tensors::stats().unwrap_or_default();
            let line = format!(
                "step {:>5}/{} | loss {:.4} | {:>7.1} ms | heap {} (peak {}) | tensors {} (peak {})",
                it + 1,
                cfg.steps,
                summary.final_loss,
                dt,
                fmt_bytes(s.live_bytes),
                fmt_bytes(s.peak_bytes),
                fmt_bytes(t.live_bytes),
                fmt_bytes(t.peak_bytes)
            );
            if tty {
                eprint!("\r{line}\x1b[K");
            } else {
                eprintln!("{line}");
            }
        }
    }
    if progress && tty {
        eprintln!();
    }
    summary.step_ms_median = median(&times);
    if cfg.cleanup_every > 0 || cfg.cleanup_eval_every > 0 {
        let (a, b) = cleanup();
        summary.final_cleanup = Some((a, b));
        if progress {
            eprintln!(
                "cleanup at the end: RSS {} → {}",
                fmt_bytes(a),
                fmt_bytes(b)
            );
        }
    }
    if let Some(s) = save {
        vs.save(&s.path)
            .map_err(|e| format!("{}: {e}", s.path.display()))?;
        let cfg_path = cfg.save_beside(&s.path)?;
        if progress {
            eprintln!(
                "checkpoint: {} (config {})",
                s.path.display(),
                cfg_path.display()
            );
        }
    }
    Ok(summary)
}

/// The step a run starts at: 0, or with --resume the steps the checkpoint's run had done.
fn resume_step(cfg: &Config) -> Result<u64, String> {
    let (true, Some(p)) = (cfg.resume, &cfg.init_from) else {
        return Ok(0);
    };
    let done = Config::load_beside(p)?.steps;
    if done >= cfg.steps {
        return Err(format!(
            "--resume: {} has already run {done} steps; --steps {} must be more",
            p.display(),
            cfg.steps
        ));
    }
    Ok(done)
}

/// Loads a checkpoint's weights into the model's store, after checking its shape is this run's.
fn init_from(vs: &mut nn::VarStore, p: &std::path::Path, cfg: &Config) -> Result<(), String> {
    let saved = Config::load_beside(p)?;
    if saved.shape != cfg.shape {
        return Err(format!(
            "--init-from {}: its shape {:?} is not this run's {:?}",
            p.display(),
            saved.shape,
            cfg.shape
        ));
    }
    vs.load(p)
        .map_err(|e| format!("--init-from {}: {e}", p.display()))
}

fn evaluate(
    model: &Gpt,
    cfg: &Config,
    val: &[u8],
    device: tch::Device,
    cleanups: &mut Vec<(u64, u64)>,
) -> Result<f64, String> {
    let _e = memsight::phase("eval");
    let mut total = 0.0;
    for i in 0..cfg.eval_batches.max(1) {
        let b = data::make_batch(val, cfg.seed ^ 0x5EED, i, cfg.micro_batch, cfg.seq_len);
        let (x, y) = b.tensors(device);
        total += step::evaluate(model, cfg, &x, &y, cfg.eval_segment_len())
            .map_err(|e| e.to_string())?;
        if cfg.cleanup_eval_every > 0 && (i + 1) % cfg.cleanup_eval_every == 0 {
            cleanups.push(cleanup());
        }
    }
    Ok(total / cfg.eval_batches.max(1) as f64)
}
