//! Analytic memory model of training (or running) a GPT-style model: weights, gradients, optimizer
//! state, activations per layer with and without checkpointing, attention scores, logits, KV cache
//! and workspace; the peak; the largest micro-batch that fits a device.
//!
//! The arithmetic is written out in `docs/estimate.md`. It reproduces the seeds' numbers exactly
//! (B·H·S²·4 attention scores, params × dtype bytes) and is checked against the reference model's
//! measured peaks in its ablation table.

mod model;

pub use model::{preset, ModelShape, PRESETS};

use serde::Serialize;

/// Bytes per element of a tensor type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    Fp32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    Fp16,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
        }
    }

    /// Parses `fp32`, `bf16`, `fp16` (also `float32`, `bfloat16`, `float16`, `half`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "float" => Ok(Dtype::Fp32),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            "fp16" | "float16" | "half" => Ok(Dtype::Fp16),
            other => Err(format!("unknown dtype `{other}`: use fp32, bf16 or fp16")),
        }
    }
}

/// The optimizer, by the state it keeps per trainable parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Two fp32 moments per parameter.
    Adamw,
    /// One fp32 momentum buffer per parameter.
    Sgd,
    /// No training: forward only (inference or analysis).
    None,
}

/// How attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Scores (B·H·S²) materialised and kept for backward.
    Naive,
    /// Fused kernels: only B·H·S·D outputs are kept.
    Efficient,
}

/// What is estimated.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EstimateInput {
    /// The model's shape, when known (`None`: only `params` is known; no activations then).
    pub shape: Option<ModelShape>,
    /// Parameter count (from the shape unless given).
    pub params: u64,
    /// Sequence length.
    pub seq: u64,
    /// Micro-batch.
    pub batch: u64,
    /// Weight dtype.
    pub dtype: Dtype,
    /// Activation dtype: every kept activation in this dtype.
    pub activation_dtype: Dtype,
    /// bf16/fp16 autocast (mixed precision) instead of one activation dtype: matmul inputs and
    /// outputs in 2 bytes, the residual stream, LayerNorms and softmax in fp32.
    pub autocast: bool,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// LoRA rank: base weights frozen, adapters on the attention projections trained.
    pub lora_rank: Option<u64>,
    /// Activation checkpointing (per block).
    pub checkpointing: bool,
    /// Attention implementation.
    pub attention: Attention,
    /// Efficient attention computed in key blocks of this size by tensor ops instead of a fused
    /// kernel: each block's scores, probabilities and their gradients (4 × B·H·S·block, fp32)
    /// materialize in backward. `None`: a fused kernel (tiles stay on chip).
    pub attention_block: Option<u64>,
    /// Positions whose logits are computed (default: all `seq`).
    pub logits_to_keep: Option<u64>,
    /// Frozen block weights quantized to 8 or 4 bits.
    pub quant_bits: Option<u8>,
    /// Only the first N blocks are loaded.
    pub first_layers: Option<u64>,
    /// ZeRO stage (0–3) and data-parallel GPUs it shards over.
    pub zero_stage: u8,
    /// GPUs for ZeRO sharding.
    pub gpus: u64,
    /// Device memory to fit into, and the share kept free.
    pub device_memory: Option<u64>,
    /// Share of device memory kept free (0.15 = 15%).
    pub headroom: f64,
}

impl EstimateInput {
    /// Defaults for a shape: seq = its positions, batch 1, fp32, AdamW, naive attention.
    pub fn for_shape(shape: ModelShape) -> Self {
        EstimateInput {
            shape: Some(shape),
            params: shape.params(),
            seq: shape.positions,
            batch: 1,
            dtype: Dtype::Fp32,
            activation_dtype: Dtype::Fp32,
            optimizer: Optimizer::Adamw,
            lora_rank: None,
            checkpointing: false,
            autocast: false,
            attention: Attention::Naive,
            attention_block: None,
            logits_to_keep: None,
            quant_bits: None,
            first_layers: None,
            zero_stage: 0,
            gpus: 1,
            device_memory: None,
            headroom: 0.15,
        }
    }

    /// Defaults when only the parameter count is known.
    pub fn for_params(params: u64) -> Self {
        EstimateInput {
            shape: None,
            params,
            seq: 0,
            ..Self::for_shape(ModelShape {
                layers: 0,
                hidden: 0,
                heads: 1,
                vocab: 0,
                positions: 0,
            })
        }
    }
}

/// The estimate: every term in bytes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Parameters loaded.
    pub params: u64,
    /// Parameters trained (all, LoRA adapters only, or none).
    pub trainable_params: u64,
    /// Weights (this GPU's share under ZeRO-3).
    pub weights_bytes: u64,
    /// Gradients of the trainable parameters.
    pub gradients_bytes: u64,
    /// Optimizer state (moments, fp32 master weights under mixed precision).
    pub optimizer_bytes: u64,
    /// Activations one block keeps for backward.
    pub activations_per_layer_bytes: Option<u64>,
    /// What one block keeps with checkpointing (its input).
    pub activations_per_layer_checkpointed_bytes: Option<u64>,
    /// Attention scores (naive: B·H·S²; efficient: B·H·S·D) of one block, in the activation dtype.
    pub attention_scores_bytes_per_layer: Option<u64>,
    /// All activations kept at the start of backward (one block's worth in forward-only runs).
    pub activations_bytes: Option<u64>,
    /// Logits and their log-softmax for the loss (fp32).
    pub logits_bytes: Option<u64>,
    /// KV cache for generating `seq` tokens (not part of the training peak).
    pub kv_cache_bytes: Option<u64>,
    /// Transient memory inside one block (the largest temporary besides what is kept).
    pub workspace_bytes: Option<u64>,
    /// The peak: the sum of the terms in use at the start of backward (forward-only: weights,
    /// one block, logits, KV cache).
    pub peak_bytes: u64,
    /// Device memory fitted into.
    pub device_memory_bytes: Option<u64>,
    /// Share kept free.
    pub headroom: f64,
    /// Whether the peak fits the device with the headroom.
    pub fits: Option<bool>,
    /// The largest micro-batch that fits (0: not even one sample).
    pub max_micro_batch: Option<u64>,
}

/// Bytes that do not depend on the micro-batch, and those per sample.
struct Terms {
    fixed: u64,
    per_sample: u64,
}

/// Estimates memory for `input`.
pub fn estimate(input: &EstimateInput) -> Estimate {
    let e = input.activation_dtype.bytes();
    let gpus = input.gpus.max(1);
    let shard = |bytes: u64, from_stage: u8| {
        if input.zero_stage >= from_stage {
            bytes.div_ceil(gpus)
        } else {
            bytes
        }
    };
    let training = input.optimizer != Optimizer::None;

    // Weights: loaded params; frozen block weights may be quantized.
    let params = match (input.shape, input.first_layers) {
        (Some(s), Some(n)) => s.params_first_layers(n),
        _ => input.params,
    };
    let layers = match (input.shape, input.first_layers) {
        (Some(s), Some(n)) => n.min(s.layers),
        (Some(s), None) => s.layers,
        _ => 0,
    };
    let block_params = input.shape.map_or(0, |s| layers * s.block_params());
    let weights = match input.quant_bits {
        Some(bits) if input.shape.is_some() => {
            (params - block_params) * input.dtype.bytes() + (block_params * bits as u64).div_ceil(8)
        }
        Some(bits) => (params * bits as u64).div_ceil(8),
        None => params * input.dtype.bytes(),
    };
    // Trainable parameters: all, LoRA adapters (r·(d+3d) for qkv and 2·r·d for the projection,
    // per block), or none; quantized base weights are never trained.
    let lora = input
        .lora_rank
        .zip(input.shape)
        .map(|(r, s)| layers * 6 * r * s.hidden);
    let trainable = match (training, lora) {
        (false, _) => 0,
        (true, Some(l)) => l,
        (true, None) if input.quant_bits.is_some() => 0,
        (true, None) => params,
    };
    // Adapters train in fp32; full training keeps gradients in the weight dtype.
    let grad_bytes = if lora.is_some() {
        4
    } else {
        input.dtype.bytes()
    };
    let gradients = trainable * grad_bytes;
    let moments = match input.optimizer {
        Optimizer::Adamw => 8,
        Optimizer::Sgd => 4,
        Optimizer::None => 0,
    };
    let master = if training && lora.is_none() && input.dtype != Dtype::Fp32 {
        4
    } else {
        0
    };
    let optimizer = trainable * (moments + master);

    let mut est = Estimate {
        params,
        trainable_params: trainable,
        weights_bytes: shard(weights, 3),
        gradients_bytes: shard(gradients, 2),
        optimizer_bytes: shard(optimizer, 1),
        activations_per_layer_bytes: None,
        activations_per_layer_checkpointed_bytes: None,
        attention_scores_bytes_per_layer: None,
        activations_bytes: None,
        logits_bytes: None,
        kv_cache_bytes: None,
        workspace_bytes: None,
        peak_bytes: 0,
        device_memory_bytes: input.device_memory,
        headroom: input.headroom,
        fits: None,
        max_micro_batch: None,
    };
    let fixed = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes;

    let Some(shape) = input.shape.filter(|_| input.seq > 0) else {
        est.peak_bytes = fixed;
        fit(
            &mut est,
            input,
            Terms {
                fixed,
                per_sample: 0,
            },
        );
        return est;
    };
    let per_sample = activation_terms(&mut est, input, shape, layers, e, training, 1);
    activation_terms(&mut est, input, shape, layers, e, training, input.batch);
    est.peak_bytes = fixed.saturating_add(per_sample.saturating_mul(input.batch));
    fit(&mut est, input, Terms { fixed, per_sample });
    est
}

/// Fills the activation terms for `batch` and returns the batch-proportional bytes of the peak.
fn activation_terms(
    est: &mut Estimate,
    input: &EstimateInput,
    s: ModelShape,
    layers: u64,
    e: u64,
    training: bool,
    batch: u64,
) -> u64 {
    // In u128: B·H·S² passes u64 for absurd (but accepted) inputs; results saturate.
    let w = |v: u64| v as u128;
    let (b, t, h, e) = (w(batch), w(input.seq), w(s.hidden), w(e));
    let sbh = b * t * h * e;
    let u = b * t * h;
    let (per_layer, checkpointed, scores, workspace) = if input.autocast {
        // fp32: LN1 and LN2 inputs (the residual stream, kept by the norms); the norms' fp32
        // outputs are transient: the matmuls keep their 2-byte casts (2). 2 bytes also: q, k, v,
        // attention output (4), MLP hidden before and after GELU (8). Scores: the fp32 softmax
        // output and its 2-byte cast for the value matmul.
        let scores = match input.attention {
            Attention::Naive => b * w(s.heads) * t * t * (4 + 2),
            Attention::Efficient => b * w(s.heads) * t * w(s.head_dim()) * 2,
        };
        let workspace = match input.attention {
            Attention::Naive => (b * w(s.heads) * t * t * 4).max(4 * u * 2),
            Attention::Efficient => 4 * u * 2,
        };
        (2 * 4 * u + 14 * 2 * u + scores, 4 * u, scores, workspace)
    } else {
        // Scores: naive keeps the softmax output (B·H·S²); efficient kernels keep B·H·S·D.
        let scores = match input.attention {
            Attention::Naive => b * w(s.heads) * t * t * e,
            Attention::Efficient => b * w(s.heads) * t * w(s.head_dim()) * e,
        };
        // Kept per block: LN1 in/out, q, k, v, attention output, LN2 in/out (8·sbh), MLP hidden
        // before and after GELU (8·sbh), plus the scores.
        // The largest transient next to what is kept: a second score tensor (naive) or the MLP's.
        let workspace = match input.attention {
            Attention::Naive => scores.max(4 * sbh),
            Attention::Efficient => 4 * sbh,
        };
        (16 * sbh + scores, sbh, scores, workspace)
    };
    // A non-fused efficient attention's backward holds one key block's scores, probabilities and
    // their gradients at once.
    let workspace = match (input.attention, input.attention_block) {
        (Attention::Efficient, Some(blk)) if training => {
            workspace.max(4 * b * w(s.heads) * t * w(blk.min(input.seq)) * 4)
        }
        _ => workspace,
    };
    let kept = if !training {
        per_layer
    } else if input.checkpointing {
        w(layers) * checkpointed + per_layer
    } else {
        w(layers) * per_layer
    };
    // Logits and their log-softmax in fp32 (once in forward-only runs).
    let positions = w(input.logits_to_keep.unwrap_or(input.seq).min(input.seq));
    let logits = b * positions * w(s.vocab) * 4 * if training { 2 } else { 1 };
    let kv = 2 * w(layers) * b * t * h * w(input.dtype.bytes());
    let sat = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    let (per_layer, checkpointed, scores, kept, logits, workspace, kv) = (
        sat(per_layer),
        sat(checkpointed),
        sat(scores),
        sat(kept),
        sat(logits),
        sat(workspace),
        sat(kv),
    );
    est.activations_per_layer_bytes = Some(per_layer);
    est.activations_per_layer_checkpointed_bytes = Some(checkpointed);
    est.attention_scores_bytes_per_layer = Some(scores);
    est.activations_bytes = Some(kept);
    est.logits_bytes = Some(logits);
    est.workspace_bytes = Some(workspace);
    est.kv_cache_bytes = Some(kv);
    kept.saturating_add(logits)
        .saturating_add(workspace)
        .saturating_add(if training { 0 } else { kv })
}

fn fit(est: &mut Estimate, input: &EstimateInput, t: Terms) {
    let Some(device) = input.device_memory else {
        return;
    };
    let budget = (device as f64 * (1.0 - input.headroom.clamp(0.0, 1.0))) as u64;
    est.fits = Some(est.peak_bytes <= budget);
    est.max_micro_batch = Some(match budget.checked_sub(t.fixed) {
        None => 0,
        Some(_) if t.per_sample == 0 => input.batch,
        Some(room) => room / t.per_sample,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt(layers: u64, hidden: u64, heads: u64, seq: u64, batch: u64) -> EstimateInput {
        let mut i = EstimateInput::for_shape(ModelShape {
            layers,
            hidden,
            heads,
            vocab: 50257,
            positions: seq,
        });
        i.batch = batch;
        i
    }

    #[test]
    fn autocast_keeps_the_residual_stream_norms_and_softmax_in_fp32() {
        // B=1, S=4, d=8, H=2: one (B, S, d) tensor is 32 elements.
        let mut i = gpt(1, 8, 2, 4, 1);
        i.autocast = true;
        let e = estimate(&i);
        // 2 fp32 tensors (128 B each) + 14 two-byte ones (64 B each) + scores 2·4·4·(4 + 2).
        assert_eq!(e.activations_per_layer_bytes, Some(2 * 128 + 14 * 64 + 192));
        assert_eq!(e.activations_per_layer_checkpointed_bytes, Some(128));
        assert_eq!(e.attention_scores_bytes_per_layer, Some(192));
        // Between all-fp32 (16 · 128 + 128) and all-bf16 (16 · 64 + 64) activations.
        i.autocast = false;
        assert_eq!(
            estimate(&i).activations_per_layer_bytes,
            Some(16 * 128 + 128)
        );
    }

    #[test]
    fn chunked_efficient_attention_needs_its_block_workspace() {
        let mut i = gpt(2, 128, 4, 128, 16);
        i.attention = Attention::Efficient;
        let fused = estimate(&i).workspace_bytes;
        // MLP hidden: 4 · B·S·d · 4 bytes = 4 MiB.
        assert_eq!(fused, Some(4 * 16 * 128 * 128 * 4));
        i.attention_block = Some(64);
        // 4 tensors of B·H·S·64 fp32 = 8 MiB.
        assert_eq!(
            estimate(&i).workspace_bytes,
            Some(4 * 16 * 4 * 128 * 64 * 4)
        );
    }

    #[test]
    fn seed_000_attention_scores_naive_and_efficient() {
        let mut i = gpt(12, 768, 12, 2048, 4);
        assert_eq!(
            estimate(&i).attention_scores_bytes_per_layer,
            Some(805_306_368)
        );
        i.attention = Attention::Efficient;
        assert_eq!(
            estimate(&i).attention_scores_bytes_per_layer,
            Some(25_165_824)
        );
    }

    #[test]
    fn seed_002_32k_tokens_32_heads_is_128_gib_per_layer() {
        let i = gpt(32, 4096, 32, 32768, 1);
        assert_eq!(
            estimate(&i).attention_scores_bytes_per_layer,
            Some(128 << 30)
        );
    }

    #[test]
    fn seeds_003_004_weights_are_params_times_dtype() {
        let mut i = EstimateInput::for_params(33_000_000_000);
        i.dtype = Dtype::Fp16;
        assert_eq!(estimate(&i).weights_bytes, 66_000_000_000);
        let mut i = EstimateInput::for_params(1_300_000_000);
        i.dtype = Dtype::Bf16;
        assert_eq!(estimate(&i).weights_bytes, 2_600_000_000);
    }

    #[test]
    fn max_micro_batch_is_the_largest_that_fits() {
        let mut i = gpt(12, 768, 12, 1024, 8);
        i.device_memory = Some(16 << 30);
        let e = estimate(&i);
        let m = e.max_micro_batch.unwrap();
        assert!(m > 0);
        for (b, fits) in [(m, true), (m + 1, false)] {
            i.batch = b;
            let budget = (16u64 << 30) as f64 * 0.85;
            assert_eq!(
                (estimate(&i).peak_bytes as f64) <= budget,
                fits,
                "batch {b}"
            );
        }
    }

    #[test]
    fn every_saving_lowers_the_peak() {
        let base = gpt(12, 768, 12, 1024, 8);
        let p = estimate(&base).peak_bytes;
        let variants: [fn(&mut EstimateInput); 6] = [
            |i| i.checkpointing = true,
            |i| i.attention = Attention::Efficient,
            |i| i.activation_dtype = Dtype::Bf16,
            |i| i.logits_to_keep = Some(1),
            |i| i.lora_rank = Some(8),
            |i| i.first_layers = Some(1),
        ];
        for v in variants {
            let mut i = base.clone();
            v(&mut i);
            assert!(estimate(&i).peak_bytes < p, "{i:?}");
        }
    }
}
