//! The ablation's training rows: the baseline, each switch alone and all together — their flags,
//! environment, the seeds' claims, which row each saving is measured against, what the PyTorch
//! peer applies of each — and the estimator's input for a row's configuration.

use super::Options;
use crate::config::{Attention, Config};
use clap::Parser;
use memsight_analysis::estimate::{self, EstimateInput};

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
    /// The row this one's saving is measured against ("": the baseline, the first row).
    pub against: &'static str,
    /// What the PyTorch peer applies of this row, in words.
    pub peer: &'static str,
    /// Environment of the peer's run: glibc's tunables where memsight-gpt's are jemalloc's.
    pub peer_env: &'static [(&'static str, &'static str)],
}

/// Host allocator setting of the eager-purge row: return freed pages at once (jemalloc,
/// memsight-gpt's allocator). Without `background_thread:true`, as the committed table was
/// measured (it hung programs linking memsight at start-up then; fixed since, see
/// `start_jemalloc` in memsight's `alloc::process_heap`).
const JEMALLOC_EAGER: (&str, &str) = ("MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0");

/// glibc's nearest equivalent for the peer (PyTorch runs on glibc's malloc, which ignores
/// MALLOC_CONF): trim the heap top on every free, and serve every block from 128 KiB up with its
/// own mapping (a fixed threshold: glibc's dynamic one grows to 32 MiB), returned at free.
const GLIBC_EAGER: (&str, &str) = (
    "GLIBC_TUNABLES",
    "glibc.malloc.trim_threshold=0:glibc.malloc.mmap_threshold=131072",
);

/// Same switch, same meaning in the peer.
const SAME: &str = "yes";

/// The vocabulary row's name (the logits row is measured against it).
const BPE_VOCAB: &str = "vocab 50 257 (BPE-sized head)";

/// The rows: baseline, each switch alone, all together.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "baseline (naive attention, fp32)",
        args: &[],
        env: &[],
        claim: "",
        against: "",
        peer: SAME,
        peer_env: &[],
    },
    Variant {
        name: "attention=efficient",
        args: &["--attention", "efficient"],
        env: &[],
        claim: "seed 000: scores 805 MB → 25 MB per layer (B=4, S=2048, H=12)",
        against: "",
        peer: "yes (its own autograd.Function, streaming over key blocks)",
        peer_env: &[],
    },
    Variant {
        name: "attention=sdpa",
        args: &["--attention", "sdpa"],
        env: &[],
        claim: "seeds 001, 002: no B·H·S² scores kept",
        against: "",
        peer: "yes (F.scaled_dot_product_attention)",
        peer_env: &[],
    },
    Variant {
        name: "checkpoint",
        args: &["--checkpoint"],
        env: &[],
        claim: "seeds 000, 001: 30–60% less activation memory",
        against: "",
        peer: "yes (torch.utils.checkpoint per block)",
        peer_env: &[],
    },
    Variant {
        name: "bf16 autocast",
        args: &["--bf16"],
        env: &[],
        claim: "seed 000: ~50% of activation memory",
        against: "",
        peer: "yes, with PyTorch's CPU autocast policy",
        peer_env: &[],
    },
    Variant {
        name: "micro-batch 4 (gradient accumulation)",
        args: &["--micro-batch", "4"],
        env: &[],
        claim: "seeds 001, 003: activations scale with the micro-batch",
        against: "",
        peer: SAME,
        peer_env: &[],
    },
    Variant {
        name: "eval segments ≤ 32",
        args: &["--eval-segment", "32"],
        env: &[],
        claim: "seed 002: evaluation activations bounded by the segment",
        against: "",
        peer: SAME,
        peer_env: &[],
    },
    Variant {
        name: "cleanup every 5 steps",
        args: &["--cleanup-every", "5"],
        env: &[],
        claim: "seed 000: cached memory returned",
        against: "",
        peer: "malloc_trim(0) + cuda empty_cache (glibc's purge)",
        peer_env: &[],
    },
    Variant {
        name: "jemalloc eager purge (MALLOC_CONF)",
        args: &[],
        env: &[JEMALLOC_EAGER],
        claim: "seeds 000, 003: lower RSS after frees",
        against: "",
        peer: "glibc tunables instead: trim_threshold=0, mmap_threshold=128 KiB",
        peer_env: &[GLIBC_EAGER],
    },
    Variant {
        name: "LoRA r=8",
        args: &["--lora-rank", "8"],
        env: &[],
        claim: "seed 003: optimizer state for the adapters only",
        against: "",
        peer: SAME,
        peer_env: &[],
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
        against: "",
        peer: "threads only (its batches are built in-process: no loader to limit)",
        peer_env: &[],
    },
    Variant {
        name: BPE_VOCAB,
        args: &["--vocab-size", "50257"],
        env: &[],
        claim: "",
        against: "",
        peer: SAME,
        peer_env: &[],
    },
    Variant {
        name: "vocab 50 257 + logits-to-keep 1",
        args: &["--vocab-size", "50257", "--logits-to-keep", "1"],
        env: &[],
        claim: "seed 003: logits for the kept positions only",
        against: BPE_VOCAB,
        peer: SAME,
        peer_env: &[],
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
        against: "",
        peer: "each as in its own row",
        peer_env: &[GLIBC_EAGER],
    },
];

/// The variant named `name`.
pub fn find(name: &str) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.name == name)
}

/// The configuration `train` runs for this variant: the ablation's base flags, then the variant's,
/// through the same parser.
pub fn variant_config(o: &Options, v: &Variant) -> Result<Config, String> {
    let preset = o.preset_name();
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
    // Our efficient attention is tensor ops over tiles, not a fused kernel.
    if cfg.attention == Attention::Efficient {
        e.attention_block = Some(cfg.attention_block as u64);
    }
    if cfg.lora_rank > 0 {
        e.lora_rank = Some(cfg.lora_rank as u64);
    }
    e.logits_to_keep = cfg.keep().map(|k| k as u64);
    e
}

/// The estimator's training peak for a variant.
pub fn estimate_bytes(o: &Options, v: &Variant) -> Result<u64, String> {
    Ok(estimate::estimate(&estimate_for(&variant_config(o, v)?)).peak_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_measured_against_another_names_an_existing_row() {
        for v in VARIANTS {
            assert!(
                v.against.is_empty() || find(v.against).is_some(),
                "{}",
                v.name
            );
            assert!(!v.peer.is_empty(), "{}: say what the peer applies", v.name);
        }
    }
}
