//! The run's configuration: model presets and every memory switch, parsed from the command line
//! and saved beside each checkpoint (the effective config, so a checkpoint says how it was made).

use serde::{Deserialize, Serialize};

/// How attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Materializes the B·H·S² score matrix (the textbook formula).
    Naive,
    /// Ours: exact attention in tiles of query rows, tiles above the diagonal skipped, with its own
    /// backward: B·H·block·S scores at a time.
    Efficient,
    /// libtorch's fused scaled_dot_product_attention kernel.
    Sdpa,
}

/// Model shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// Transformer blocks.
    pub n_layer: i64,
    /// Attention heads per block.
    pub n_head: i64,
    /// Embedding width.
    pub n_embd: i64,
    /// Longest sequence (position embeddings).
    pub block_size: i64,
    /// Vocabulary: 256 (byte-level tokenizer); larger sizes (GPT-2's BPE has 50 257) only widen
    /// the embedding and the LM head (tokens stay bytes), which is where `logits_to_keep` matters.
    pub vocab_size: i64,
}

impl ModelShape {
    /// The estimator's view of this shape.
    pub fn to_estimate(&self) -> memsight_analysis::estimate::ModelShape {
        memsight_analysis::estimate::ModelShape {
            layers: self.n_layer as u64,
            hidden: self.n_embd as u64,
            heads: self.n_head as u64,
            vocab: self.vocab_size as u64,
            positions: self.block_size as u64,
        }
    }
}

/// A named shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// 4 layers, 4 heads, 128 wide, 128 tokens: trains visibly in about a minute on 2 CPU cores.
    Tiny,
    /// 6 layers, 6 heads, 384 wide, 256 tokens (nanoGPT's shakespeare-char shape).
    Small,
    /// GPT-2 124M's shape (12 × 12 × 768, 1024 tokens) with the byte vocabulary: for GPUs.
    Gpt2,
}

impl Preset {
    /// The preset's shape.
    pub fn shape(self) -> ModelShape {
        let (n_layer, n_head, n_embd, block_size) = match self {
            Preset::Tiny => (4, 4, 128, 128),
            Preset::Small => (6, 6, 384, 256),
            Preset::Gpt2 => (12, 12, 768, 1024),
        };
        ModelShape {
            n_layer,
            n_head,
            n_embd,
            block_size,
            vocab_size: 256,
        }
    }
}

/// Everything that decides what a run does and how much memory it takes. It is also the
/// `train` command line: each field is its flag (`--batch-size`…) with the default shown; the
/// shape comes from `--preset` (and `--block-size`, `--vocab-size`, see [`crate::cli`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct Config {
    /// Model shape preset.
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: Preset,
    /// Model shape (the preset's, with --block-size and --vocab-size applied).
    #[arg(skip = Preset::Tiny.shape())]
    pub shape: ModelShape,
    /// Sequences per optimizer step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: i64,
    /// Sequences per forward/backward: gradient accumulation when below --batch-size (0: the
    /// batch size).
    #[arg(long, default_value_t = 0)]
    pub micro_batch: i64,
    /// Training sequence length, ≤ the block size (0: the block size).
    #[arg(long, default_value_t = 0)]
    pub seq_len: i64,
    /// Optimizer steps.
    #[arg(long, default_value_t = 150)]
    pub steps: u64,
    /// AdamW learning rate (the peak, after any warm-up).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Learning-rate schedule after the warm-up: constant, or cosine decay to --min-lr at the
    /// last step.
    #[serde(default)]
    #[arg(long, value_enum, default_value = "constant")]
    pub lr_schedule: crate::optim::Schedule,
    /// Learning rate the cosine decay ends at.
    #[serde(default = "default_min_lr")]
    #[arg(long, default_value_t = 1e-4)]
    pub min_lr: f64,
    /// Steps of linear learning-rate warm-up (0: none).
    #[serde(default)]
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub warmup_steps: u64,
    /// Clip the gradients' global L2 norm to this before each step (0: no clipping; nanoGPT: 1).
    #[serde(default)]
    #[arg(long, value_name = "NORM", default_value_t = 0.0)]
    pub grad_clip: f64,
    /// AdamW's decoupled weight decay, on the matmul weights only (not biases, LayerNorm or
    /// embeddings).
    #[serde(default = "default_weight_decay")]
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// Start from this checkpoint's weights (written by `train --save`, same shape): a
    /// pretrained base for --lora-rank, or with --resume a run to continue.
    #[serde(default)]
    #[arg(long, value_name = "PATH.safetensors")]
    pub init_from: Option<std::path::PathBuf>,
    /// With --init-from: continue that run — steps, batches and learning-rate schedule go on
    /// from where it stopped, up to --steps in all (AdamW's moments start afresh: libtorch's
    /// optimizer state is not saved).
    #[serde(default)]
    #[arg(long, requires = "init_from")]
    pub resume: bool,
    /// Attention: naive (B·H·S² scores), efficient (tiles of query rows), sdpa (fused).
    #[arg(long, value_enum, default_value = "sdpa")]
    pub attention: Attention,
    /// Query rows per tile of the efficient attention.
    #[arg(long, default_value_t = 64)]
    pub attention_block: i64,
    /// Activation checkpointing: recompute each block in backward instead of keeping its
    /// activations.
    #[arg(long)]
    pub checkpoint: bool,
    /// bf16 autocast for matmuls; LayerNorm, softmax and loss stay fp32.
    #[arg(long)]
    pub bf16: bool,
    /// Evaluate in segments of at most N tokens (chunked evaluation; 0: the sequence length).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub eval_segment: i64,
    /// Evaluate every N steps (0: only at the end).
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub eval_every: u64,
    /// Validation batches per evaluation.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub eval_batches: u64,
    /// Cleanup (CUDA empty-cache, jemalloc purge) every N train steps (0: never).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cleanup_every: u64,
    /// Cleanup every M eval batches (0: never).
    #[arg(long, value_name = "M", default_value_t = 0)]
    pub cleanup_eval_every: u64,
    /// LoRA rank: freeze the base, train adapters on attention and MLP (0: full fine-tuning).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub lora_rank: i64,
    /// libtorch intra-op threads (0: libtorch's default).
    #[arg(long, default_value_t = 0)]
    pub threads: i32,
    /// libtorch inter-op threads (0: libtorch's default).
    #[arg(long, default_value_t = 0)]
    pub interop_threads: i32,
    /// Data-loader worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Batches each worker prepares ahead.
    #[arg(long, default_value_t = 2)]
    pub prefetch: usize,
    /// Seed for weights and data order.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Compute logits (and the loss) for the last N positions only (0: all): the LM head and
    /// the loss see B·N·V logits instead of B·S·V.
    #[serde(default)]
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub logits_to_keep: i64,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

fn default_min_lr() -> f64 {
    1e-4
}

fn default_weight_decay() -> f64 {
    0.1
}

/// The flags of [`Config`] alone, for its defaults.
#[derive(clap::Parser)]
#[command(no_binary_name = true)]
struct Defaults {
    #[command(flatten)]
    config: Config,
}

impl Config {
    /// The defaults of a preset (what `train --preset P` runs).
    pub fn preset(p: Preset) -> Config {
        use clap::Parser;
        let mut c = Defaults::parse_from(std::iter::empty::<&str>()).config;
        c.preset = p;
        c.resolve(None, None);
        c
    }

    /// Applies the preset's shape with `block_size`/`vocab_size` overrides, then fills the
    /// sequence length (0: the block size) and the micro-batch (0: the batch size).
    pub fn resolve(&mut self, block_size: Option<i64>, vocab_size: Option<i64>) {
        self.shape = self.preset.shape();
        if let Some(n) = block_size {
            self.shape.block_size = n;
        }
        if let Some(v) = vocab_size {
            self.shape.vocab_size = v;
        }
        if self.seq_len == 0 {
            self.seq_len = self.shape.block_size;
        }
        if self.micro_batch == 0 {
            self.micro_batch = self.batch_size;
        }
    }

    /// Rejects inconsistent settings with a message naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        if self.seq_len < 2 || self.seq_len > self.shape.block_size {
            return Err(format!(
                "--seq-len {} must be between 2 and the block size {}",
                self.seq_len, self.shape.block_size
            ));
        }
        if self.micro_batch < 1 || self.batch_size < 1 || self.batch_size % self.micro_batch != 0 {
            return Err(format!(
                "--micro-batch {} must divide --batch-size {}",
                self.micro_batch, self.batch_size
            ));
        }
        if self.shape.n_embd % self.shape.n_head != 0 {
            return Err("n_embd must be a multiple of n_head".into());
        }
        if self.attention_block < 1 {
            return Err("--attention-block must be at least 1".into());
        }
        if self.shape.vocab_size < 256 {
            return Err(format!(
                "--vocab-size {} must be at least 256 (the byte tokenizer's symbols)",
                self.shape.vocab_size
            ));
        }
        if self.logits_to_keep < 0 || self.logits_to_keep > self.seq_len {
            return Err(format!(
                "--logits-to-keep {} must be between 0 (all) and --seq-len {}",
                self.logits_to_keep, self.seq_len
            ));
        }
        if self.workers < 1 {
            return Err("--workers must be at least 1".into());
        }
        if !(self.lr > 0.0 && self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return Err(format!(
                "--min-lr {} must be between 0 and --lr {} (which must be positive)",
                self.min_lr, self.lr
            ));
        }
        if self.grad_clip < 0.0 || self.weight_decay < 0.0 {
            return Err("--grad-clip and --weight-decay must not be negative".into());
        }
        Ok(())
    }

    /// Writes the config beside a checkpoint (`m.safetensors` → `m.config.json`); returns its path.
    pub fn save_beside(&self, checkpoint: &std::path::Path) -> Result<std::path::PathBuf, String> {
        let p = checkpoint.with_extension("config.json");
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p)
    }

    /// Reads the config saved beside a checkpoint.
    pub fn load_beside(checkpoint: &std::path::Path) -> Result<Config, String> {
        let p = checkpoint.with_extension("config.json");
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// The learning-rate schedule of this run.
    pub fn lr_schedule(&self) -> crate::optim::LrSchedule {
        crate::optim::LrSchedule {
            lr: self.lr,
            min_lr: self.min_lr,
            warmup: self.warmup_steps,
            steps: self.steps,
            schedule: self.lr_schedule,
        }
    }

    /// Micro-batches per optimizer step.
    pub fn accumulation(&self) -> i64 {
        self.batch_size / self.micro_batch
    }

    /// The evaluation segment length.
    pub fn eval_segment_len(&self) -> i64 {
        if self.eval_segment <= 0 {
            self.seq_len
        } else {
            self.eval_segment.min(self.seq_len)
        }
    }

    /// Positions whose logits training computes (`None`: all).
    pub fn keep(&self) -> Option<i64> {
        (self.logits_to_keep > 0).then_some(self.logits_to_keep)
    }

    /// The tch device (a CUDA device must be visible).
    pub fn tch_device(&self) -> Result<tch::Device, String> {
        let d = match self.device.as_str() {
            "cpu" => return Ok(tch::Device::Cpu),
            "cuda" => 0,
            d => d
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| format!("--device {d}: expected cpu, cuda or cuda:N"))?,
        };
        let n = memsight_integrations::torch::cuda_device_count();
        if d >= n {
            return Err(format!(
                "--device {}: libtorch sees {n} CUDA device(s) here",
                self.device
            ));
        }
        Ok(tch::Device::Cuda(d))
    }
}
