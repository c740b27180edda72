//! The `train` flags, shared by the binary and the ablation (which parses each variant's flags
//! with the same parser, so a variant's configuration is exactly what `train` runs).

use crate::config::{Attention, Config, Preset};
use clap::{Args, Parser};
use std::path::PathBuf;

/// The flags of `memsight-gpt train` (the ablation parses its variants' flags with them too).
#[derive(Args)]
pub struct TrainArgs {
    /// Model shape.
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: Preset,
    /// Optimizer steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per optimizer step.
    #[arg(long)]
    pub batch_size: Option<i64>,
    /// Sequences per forward/backward: gradient accumulation when below --batch-size.
    #[arg(long)]
    pub micro_batch: Option<i64>,
    /// Training sequence length (≤ the block size).
    #[arg(long)]
    pub seq_len: Option<i64>,
    /// Longest sequence the model takes (its position table), instead of the preset's; the
    /// sequence length follows it unless --seq-len is given.
    #[arg(long)]
    pub block_size: Option<i64>,
    /// Vocabulary size instead of the byte tokenizer's 256 (e.g. 50257, GPT-2's BPE): widens the
    /// embedding and the LM head only.
    #[arg(long)]
    pub vocab_size: Option<i64>,
    /// Compute logits (and the loss) for the last N positions only.
    #[arg(long, value_name = "N")]
    pub logits_to_keep: Option<i64>,
    /// Attention: naive (B·H·S² scores), efficient (streaming over key blocks), sdpa (fused).
    #[arg(long, value_enum)]
    pub attention: Option<Attention>,
    /// Key-block size of the efficient attention.
    #[arg(long)]
    pub attention_block: Option<i64>,
    /// Activation checkpointing: recompute each block in backward.
    #[arg(long)]
    pub checkpoint: bool,
    /// bf16 autocast (LayerNorm, softmax and loss stay fp32).
    #[arg(long)]
    bf16: bool,
    /// Evaluate in segments of at most N tokens.
    #[arg(long, value_name = "N")]
    pub eval_segment: Option<i64>,
    /// Evaluate every N steps (0: only at the end).
    #[arg(long, value_name = "N")]
    pub eval_every: Option<u64>,
    /// Cleanup (CUDA empty-cache, jemalloc purge) every N train steps.
    #[arg(long, value_name = "N")]
    pub cleanup_every: Option<u64>,
    /// Cleanup every M eval batches.
    #[arg(long, value_name = "M")]
    pub cleanup_eval_every: Option<u64>,
    /// LoRA rank: freeze the base, train adapters on attention and MLP.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<i64>,
    /// libtorch intra-op threads.
    #[arg(long)]
    pub threads: Option<i32>,
    /// libtorch inter-op threads.
    #[arg(long)]
    pub interop_threads: Option<i32>,
    /// Data-loader worker threads.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Batches each worker prepares ahead.
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long)]
    pub device: Option<String>,
    /// Seed for weights and data order.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where to write the memsight report.
    #[arg(long, default_value = "memsight-gpt-report.json")]
    pub report: PathBuf,
    /// Save a safetensors checkpoint (and PATH.config.json) at the end.
    #[arg(long, value_name = "PATH.safetensors")]
    pub save: Option<PathBuf>,
    /// Write the run's summary (losses, step time, parameters) as JSON.
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// No progress line and no memsight blocks.
    #[arg(long)]
    pub quiet: bool,
    /// Run without the memsight session and libtorch hooks (for the on/off overhead comparison;
    /// the global allocator stays). Writes no report.
    #[arg(long)]
    pub no_profile: bool,
}

impl TrainArgs {
    /// The run configuration these flags describe.
    pub fn config(&self) -> Config {
        let a = self;
        let mut c = Config::preset(a.preset);
        if let Some(n) = a.block_size {
            c.shape.block_size = n;
            c.seq_len = n;
        }
        if let Some(v) = a.vocab_size {
            c.shape.vocab_size = v;
        }
        macro_rules! set {
        ($($f:ident),*) => { $(if let Some(v) = a.$f.clone() { c.$f = v; })* };
    }
        set!(
            steps,
            batch_size,
            micro_batch,
            seq_len,
            attention,
            attention_block,
            eval_segment,
            eval_every,
            cleanup_every,
            cleanup_eval_every,
            lora_rank,
            threads,
            interop_threads,
            workers,
            prefetch,
            device,
            seed,
            logits_to_keep
        );
        if a.micro_batch.is_none() {
            c.micro_batch = c.batch_size;
        }
        c.checkpoint = a.checkpoint;
        c.bf16 = a.bf16;
        c
    }
}

/// `train` flags on their own, for parsing a flag list.
#[derive(Parser)]
#[command(no_binary_name = true, args_override_self = true)]
pub struct TrainFlags {
    /// The flags.
    #[command(flatten)]
    pub args: TrainArgs,
}
