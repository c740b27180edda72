//! `memsight estimate`: the analytic memory breakdown of training (or running) a GPT-style model,
//! its peak, and the largest micro-batch that fits a device.

use crate::estimate_check;
use memsight_analysis::estimate::{
    estimate, preset, Attention, Device, Dtype, EstimateInput, ModelShape, Optimizer,
    OptimizerImpl, PRESETS,
};
use memsight_format::units::{fmt_bytes, parse_size};
use std::process::ExitCode;

/// Model, run and device; `--preset` or `--layers/--hidden/--heads/--vocab` (or only `--params`).
#[derive(clap::Args)]
pub struct Args {
    /// A named shape: gpt2, gpt2-medium, gpt2-large, gpt2-xl.
    #[arg(long)]
    preset: Option<String>,
    /// Transformer blocks.
    #[arg(long)]
    layers: Option<u64>,
    /// Hidden size (d_model).
    #[arg(long)]
    hidden: Option<u64>,
    /// Attention heads.
    #[arg(long)]
    heads: Option<u64>,
    /// Vocabulary size (default 50257).
    #[arg(long)]
    vocab: Option<u64>,
    /// Parameter count (`124M`, `1.3B`, `33e9`); from the shape when omitted.
    #[arg(long, value_parser = parse_count)]
    params: Option<u64>,
    /// Sequence length (default: the preset's context, 1024).
    #[arg(long)]
    pub(crate) seq: Option<u64>,
    /// Positions of the learned position table (default: the preset's, else --seq).
    #[arg(long)]
    positions: Option<u64>,
    /// Micro-batch.
    #[arg(long, default_value_t = 1)]
    pub(crate) batch: u64,
    /// Weight dtype: fp32, bf16, fp16.
    #[arg(long, default_value = "fp32", value_parser = Dtype::parse)]
    dtype: Dtype,
    /// Activation dtype (autocast); default: the weight dtype.
    #[arg(long, value_parser = Dtype::parse)]
    activation_dtype: Option<Dtype>,
    /// bf16/fp16 autocast (mixed precision): matmul activations in 2 bytes, the residual stream,
    /// LayerNorms and softmax in fp32 (overrides --activation-dtype for activations).
    #[arg(long)]
    autocast: bool,
    /// adamw, sgd, or none (forward only); with --hf-config also adamw-bf16, adamw-8bit,
    /// adafactor, sgd-momentum (plain sgd keeps no state there).
    #[arg(long, default_value = "adamw")]
    pub(crate) optimizer: String,
    /// The optimizer step's implementation: foreach, per-tensor or fused (default: PyTorch's for
    /// the device: foreach on cuda, per-tensor on cpu).
    #[arg(long, value_parser = OptimizerImpl::parse)]
    pub(crate) optimizer_impl: Option<OptimizerImpl>,
    /// cuda or cpu: autocast's dtypes and dropout's masks differ.
    #[arg(long, default_value = "cuda", value_parser = Device::parse)]
    device: Device,
    /// Dropout probability (embeddings, attention probabilities, both residual branches).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub(crate) dropout: f64,
    /// Micro-steps per optimizer step (gradients stay alive through the later micro-steps).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(crate) grad_accumulation: u64,
    /// The loop keeps the logits (`logits, loss = model(x, y)`): the default.
    #[arg(long, conflicts_with = "drop_logits")]
    keep_logits: bool,
    /// The loop drops the logits (only the loss is kept): 4 bytes less per logit at the peak.
    #[arg(long)]
    drop_logits: bool,
    /// LoRA rank (adapters on the attention projections; base weights frozen).
    #[arg(long)]
    pub(crate) lora_rank: Option<u64>,
    /// Activation checkpointing per block.
    #[arg(long)]
    pub(crate) checkpointing: bool,
    /// naive or efficient.
    /// (default naive; with --hf-config efficient, i.e. SDPA/flash, and naive means eager).
    #[arg(long, value_parser = parse_attention)]
    pub(crate) attention: Option<Attention>,
    /// Efficient attention computed in key blocks of N by tensor ops (not a fused kernel): adds
    /// the block's backward workspace.
    #[arg(long, value_name = "N")]
    attention_block: Option<u64>,
    /// Compute logits only for the last N positions.
    #[arg(long, value_name = "N")]
    logits_to_keep: Option<u64>,
    /// Frozen block weights in 8 or 4 bits.
    #[arg(long, value_parser = parse_bits)]
    quant_bits: Option<u8>,
    /// Load only the first N blocks (analysis jobs).
    #[arg(long, value_name = "N")]
    first_layers: Option<u64>,
    /// ZeRO stage 0–3 (shards optimizer state, then gradients, then weights over --gpus).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub(crate) zero_stage: u8,
    /// Data-parallel GPUs for ZeRO.
    #[arg(long, default_value_t = 1)]
    pub(crate) gpus: u64,
    /// Device memory to fit (e.g. 80GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) device_memory: Option<u64>,
    /// Share of device memory kept free (0.15 = 15%).
    #[arg(long, default_value_t = 0.15)]
    pub(crate) headroom: f64,
    /// Confirm the largest micro-batch by running it: trains this configuration with PyTorch on
    /// this machine's CPU (the validation harness, scripts/estimate-validate.py, in the torch venv
    /// of scripts/setup.sh) at that micro-batch and one more, and prints the measured and estimated
    /// peaks and whether each fits the budget (needs --device-memory; exit 1 when the suggested
    /// micro-batch does not fit).
    #[arg(long)]
    check_batch: bool,
    /// The torch venv's python for --check-batch (default: $MEMSIGHT_CACHE/torch-2.11.0/bin/python,
    /// else ~/.cache/memsight/torch-2.11.0/bin/python).
    #[arg(long, value_name = "PATH", requires = "check_batch")]
    python: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace(['_', ','], "");
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1e3),
        Some('M' | 'm') => (&t[..t.len() - 1], 1e6),
        Some('B' | 'b' | 'G' | 'g') => (&t[..t.len() - 1], 1e9),
        Some('T' | 't') => (&t[..t.len() - 1], 1e12),
        _ => (t.as_str(), 1.0),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * mul < 1e15 => Ok((v * mul).round() as u64),
        _ => Err(format!(
            "`{s}` is not a parameter count (e.g. 124M, 1.3B, 33e9)"
        )),
    }
}

fn parse_optimizer(s: &str) -> Result<Optimizer, String> {
    match s {
        "adamw" | "adam" => Ok(Optimizer::Adamw),
        "sgd" => Ok(Optimizer::Sgd),
        "none" => Ok(Optimizer::None),
        _ => Err(format!("unknown optimizer `{s}`: use adamw, sgd or none")),
    }
}

fn parse_attention(s: &str) -> Result<Attention, String> {
    match s {
        "naive" => Ok(Attention::Naive),
        "efficient" | "flash" | "sdpa" => Ok(Attention::Efficient),
        _ => Err(format!("unknown attention `{s}`: use naive or efficient")),
    }
}

fn parse_bits(s: &str) -> Result<u8, String> {
    match s {
        "8" => Ok(8),
        "4" => Ok(4),
        _ => Err(format!("--quant-bits takes 8 or 4, not `{s}`")),
    }
}

pub(crate) fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight estimate: {msg}");
    ExitCode::from(2)
}

/// Largest accepted value of each shape dimension, so products stay meaningful.
const LIMIT: u64 = 100_000_000;

fn input(a: &Args) -> Result<EstimateInput, String> {
    let base = match &a.preset {
        Some(p) => Some(preset(p).ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            format!("unknown preset `{p}`: use {}", names.join(", "))
        })?),
        None => None,
    };
    let given = [a.layers, a.hidden, a.heads];
    let shape = match (base, given) {
        // A preset keeps its position table whatever sequence length is trained.
        (Some(s), _) => Some(ModelShape {
            layers: a.layers.unwrap_or(s.layers),
            hidden: a.hidden.unwrap_or(s.hidden),
            heads: a.heads.unwrap_or(s.heads),
            vocab: a.vocab.unwrap_or(s.vocab),
            positions: a.positions.unwrap_or(s.positions),
        }),
        (None, [Some(layers), Some(hidden), Some(heads)]) => Some(ModelShape {
            layers,
            hidden,
            heads,
            vocab: a.vocab.unwrap_or(50257),
            positions: a.positions.or(a.seq).unwrap_or(1024),
        }),
        (None, [None, None, None]) => None,
        (None, _) => return Err("give all of --layers, --hidden and --heads (or --preset)".into()),
    };
    let mut i = match (shape, a.params) {
        (Some(s), p) => {
            for (name, v) in [
                ("layers", s.layers),
                ("hidden", s.hidden),
                ("heads", s.heads),
                ("vocab", s.vocab),
                (
                    if a.positions.is_some() {
                        "positions"
                    } else {
                        "seq"
                    },
                    s.positions,
                ),
            ] {
                if v == 0 || v > LIMIT {
                    return Err(format!("--{name} must be between 1 and {LIMIT}"));
                }
            }
            if s.hidden % s.heads != 0 {
                return Err(format!(
                    "--hidden {} is not a multiple of --heads {}",
                    s.hidden, s.heads
                ));
            }
            let mut i = EstimateInput::for_shape(s);
            if let Some(p) = p {
                i.params = p;
            }
            i
        }
        (None, Some(p)) => EstimateInput::for_params(p),
        (None, None) => {
            return Err(
                "describe the model: --preset NAME, --layers/--hidden/--heads, or --params N"
                    .into(),
            )
        }
    };
    if a.batch == 0 || a.batch > LIMIT {
        return Err(format!("--batch must be between 1 and {LIMIT}"));
    }
    if a.gpus == 0 {
        return Err("--gpus must be at least 1".into());
    }
    if !(0.0..1.0).contains(&a.headroom) {
        return Err(format!(
            "--headroom {} must be at least 0 and below 1",
            a.headroom
        ));
    }
    if !(0.0..1.0).contains(&a.dropout) {
        return Err(format!(
            "--dropout {} must be at least 0 and below 1",
            a.dropout
        ));
    }
    if a.grad_accumulation == 0 {
        return Err("--grad-accumulation must be at least 1".into());
    }
    if a.first_layers == Some(0) {
        return Err("--first-layers must be at least 1".into());
    }
    if let Some(seq) = a.seq {
        if seq == 0 || seq > LIMIT {
            return Err(format!("--seq must be between 1 and {LIMIT}"));
        }
        if i.shape.is_some() {
            i.seq = seq;
        }
    }
    i.batch = a.batch;
    i.device = a.device;
    i.optimizer_impl = a.optimizer_impl;
    i.dropout = a.dropout;
    i.grad_accumulation = a.grad_accumulation;
    i.keep_logits = !a.drop_logits;
    i.dtype = a.dtype;
    i.activation_dtype = a.activation_dtype.unwrap_or(a.dtype);
    i.autocast = a.autocast;
    i.optimizer = parse_optimizer(&a.optimizer)?;
    i.lora_rank = a.lora_rank;
    i.checkpointing = a.checkpointing;
    i.attention = a.attention.unwrap_or(Attention::Naive);
    i.attention_block = a.attention_block;
    i.logits_to_keep = a.logits_to_keep;
    i.quant_bits = a.quant_bits;
    i.first_layers = a.first_layers;
    i.zero_stage = a.zero_stage;
    i.gpus = a.gpus;
    i.device_memory = a.device_memory;
    i.headroom = a.headroom;
    Ok(i)
}

/// The lowercase name an option is given with (`bf16`, `adamw`, `efficient`).
pub(crate) fn name(v: impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Binary and decimal, as people quote both (`61.47 GiB = 66.00 GB`).
pub(crate) fn both(b: u64) -> String {
    format!("{:>11}  {:>9.2} GB", fmt_bytes(b), b as f64 / 1e9)
}

/// Refuses a figure the estimator's saturating arithmetic pinned at its ceiling: it is no
/// number of bytes, only "more than 16 EiB", and printing it as one would be silently wrong.
pub(crate) fn representable(peak: u64) -> Result<(), String> {
    if peak == u64::MAX {
        Err(
            "the peak is more than 16 EiB, beyond what this estimator sizes: check the sizes \
             (layers, hidden, heads, vocabulary, sequence, batch)"
                .into(),
        )
    } else {
        Ok(())
    }
}

/// Refuses a device of no memory (`--device-memory 0`): nothing fits it, and the question is a
/// typo.
pub(crate) fn device_memory(a: &Args) -> Result<(), String> {
    match a.device_memory {
        Some(0) => Err("--device-memory must be more than 0 bytes".into()),
        _ => Ok(()),
    }
}

/// Runs the estimate.
pub fn run(a: Args) -> ExitCode {
    if let Err(err) = device_memory(&a) {
        return fail(err);
    }
    let i = match input(&a) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let e = estimate(&i);
    if let Err(err) = representable(e.peak_bytes) {
        return fail(err);
    }
    // --check-batch: everything that can make it fail to start is checked before it runs.
    let check = if a.check_batch {
        let (Some(device), Some(largest)) = (e.device_memory_bytes, e.max_micro_batch) else {
            return fail("--check-batch needs --device-memory SIZE (the batch it checks is the largest that fits it)");
        };
        let plan = match estimate_check::plan(&i, device, largest, a.python.as_deref()) {
            Ok(p) => p,
            Err(err) => return fail(err),
        };
        if !a.json {
            eprintln!(
                "memsight estimate: running the largest micro-batch and one more with PyTorch on \
                 this CPU (--check-batch)…"
            );
        }
        match estimate_check::run(plan) {
            Ok(c) => Some((c, device)),
            Err(err) => return fail(err),
        }
    } else {
        None
    };
    let code = |c: &Option<(estimate_check::Check, u64)>| match c {
        Some((c, _)) if !c.ok => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    };
    if a.json {
        let mut v = serde_json::json!({ "input": i, "estimate": e });
        if let Some((c, _)) = &check {
            v["check_batch"] = serde_json::to_value(c).unwrap_or_default();
        }
        return match serde_json::to_string_pretty(&v) {
            Ok(s) => {
                println!("{s}");
                code(&check)
            }
            Err(err) => fail(err),
        };
    }
    let model = match (i.shape, &a.preset) {
        (Some(s), p) => format!(
            "{}{} layers, hidden {}, {} heads, vocab {}",
            p.as_ref().map_or(String::new(), |p| format!("{p}: ")),
            i.first_layers.map_or(s.layers, |n| n.min(s.layers)),
            s.hidden,
            s.heads,
            s.vocab
        ),
        (None, _) => "parameters only (give the shape for activations)".into(),
    };
    println!(
        "memsight estimate: {model}; seq {}, micro-batch {}",
        i.seq, i.batch
    );
    println!(
        "  {} weights, {} activations, optimizer {} ({}), {} attention{}{}",
        name(i.dtype),
        if i.autocast {
            "autocast (mixed)".to_string()
        } else {
            name(i.activation_dtype)
        },
        name(i.optimizer),
        name(i.optimizer_impl_or_default()),
        name(i.attention),
        if i.checkpointing {
            ", checkpointing"
        } else {
            ""
        },
        if i.zero_stage > 0 {
            format!(", ZeRO-{} over {} GPUs", i.zero_stage, i.gpus)
        } else {
            String::new()
        }
    );
    println!(
        "  {} loop: dropout {}, {} micro-step(s) per optimizer step, logits {}\n",
        name(i.device),
        i.dropout,
        i.grad_accumulation,
        if i.keep_logits {
            "kept by the loop"
        } else {
            "dropped"
        }
    );
    println!(
        "  {:<32}{}  ({} params, {} trainable)",
        "weights",
        both(e.weights_bytes),
        e.params,
        e.trainable_params
    );
    println!("  {:<32}{}", "gradients", both(e.gradients_bytes));
    println!("  {:<32}{}", "optimizer state", both(e.optimizer_bytes));
    let nonzero = |name: &str, v: u64| {
        if v > 0 {
            println!("  {name:<32}{}", both(v));
        }
    };
    nonzero("optimizer step transient", e.optimizer_transient_bytes);
    nonzero("autocast weight copies", e.autocast_weight_copies_bytes);
    nonzero("buffers (causal masks)", e.buffers_bytes);
    let opt = |name: &str, v: Option<u64>, extra: &str| {
        if let Some(v) = v {
            println!("  {name:<32}{}{extra}", both(v));
        }
    };
    opt("activations (kept)", e.activations_bytes, "");
    opt("  per layer", e.activations_per_layer_bytes, "");
    opt(
        "  per layer, checkpointed",
        e.activations_per_layer_checkpointed_bytes,
        "",
    );
    opt(
        "  attention scores per layer",
        e.attention_scores_bytes_per_layer,
        "",
    );
    opt("logits", e.logits_bytes, "");
    opt("workspace", e.workspace_bytes, "");
    opt(
        "KV cache (generation)",
        e.kv_cache_bytes,
        if i.optimizer == Optimizer::None {
            ""
        } else {
            "  (not in the training peak)"
        },
    );
    if !e.moments.is_empty() {
        println!("\n  moments of a training step (live bytes):");
        for m in &e.moments {
            let mark = if Some(m.name) == e.peak_moment {
                "  ← peak"
            } else {
                ""
            };
            println!("    {:<30}{}{mark}", m.name, both(m.bytes));
        }
    }
    println!(
        "  {:<32}{}{}",
        "PEAK",
        both(e.peak_bytes),
        e.peak_moment.map_or(String::new(), |m| format!("  ({m})"))
    );
    match (e.device_memory_bytes, e.max_micro_batch) {
        (Some(d), Some(m)) => println!(
            "\n  device {} with {:.0}% headroom: {} · largest micro-batch that fits: {m} \
             (keeping {:.1}% more for the estimate's own error)",
            fmt_bytes(d),
            e.headroom * 100.0,
            if e.fits == Some(true) { "fits" } else { "does NOT fit" },
            memsight_analysis::estimate::MODEL_MARGIN * 100.0,
        ),
        _ => println!("\n  no device memory given: pass --device-memory SIZE for the fit and the largest micro-batch"),
    }
    if let Some((c, device)) = &check {
        estimate_check::print(c, *device, i.headroom, i.device);
    }
    code(&check)
}
