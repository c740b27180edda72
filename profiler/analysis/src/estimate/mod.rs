//! Analytic memory model of training (or running) a GPT-style model: weights, gradients, optimizer
//! state, activations per layer with and without checkpointing, attention scores, logits, KV cache
//! and workspace; the peak *moment* of a training step (which tensors are alive together); the
//! largest micro-batch that fits a device.
//!
//! Any Hugging Face model (`--hf-config`) goes through [`hf`] (config.json → [`arch::Arch`]),
//! [`recipe`] (the training recipe's flags) and [`train`] (its terms, moments and the allocated,
//! reserved and nvidia-smi figures); [`lora`] counts adapters as peft builds them.
//!
//! The arithmetic is written out in `docs/estimate.md` with each term's source. It reproduces the
//! seeds' numbers exactly (B·H·S²·4 attention scores, params × dtype bytes) and is validated
//! against real PyTorch training steps by `scripts/estimate-validate.py` (the table in the docs).

pub mod arch;
pub mod hf;
pub mod lora;
mod model;
mod moments;
pub mod recipe;
pub mod train;

pub use model::{preset, ModelShape, PRESETS};
pub use moments::{Activations, Moment};

use moments::States;
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

/// How the optimizer's step is computed (PyTorch's `foreach=` / `fused=` switches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerImpl {
    /// `torch._foreach_*` over all parameters at once (PyTorch's default on CUDA).
    Foreach,
    /// One parameter at a time (PyTorch's default on CPU).
    PerTensor,
    /// One fused kernel (`fused=True`): no transient.
    Fused,
}

impl OptimizerImpl {
    /// Parses `foreach`, `per-tensor` (also `for-loop`, `single`) and `fused`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "foreach" => Ok(OptimizerImpl::Foreach),
            "per-tensor" | "for-loop" | "single" => Ok(OptimizerImpl::PerTensor),
            "fused" => Ok(OptimizerImpl::Fused),
            _ => Err(format!(
                "unknown optimizer implementation `{s}`: use foreach, per-tensor or fused"
            )),
        }
    }
}

/// The device kind: autocast's dtypes and dropout's masks differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// CPU: autocast keeps softmax in bf16; dropout masks are in the input's dtype.
    Cpu,
    /// CUDA: autocast runs softmax and norms in fp32; dropout masks are 1-byte bools.
    Cuda,
}

impl Device {
    /// Parses `cpu` or `cuda` (also `gpu`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            _ => Err(format!("unknown device `{s}`: use cpu or cuda")),
        }
    }
}

/// How attention is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Scores (B·H·S²) materialised and kept for backward.
    Naive,
    /// Fused kernels (SDPA): only the output and one log-sum-exp per row are kept.
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
    /// outputs in 2 bytes, the residual stream in fp32; softmax in fp32 on CUDA, bf16 on CPU.
    pub autocast: bool,
    /// The device kind (autocast dtypes, dropout masks, the optimizer's default path).
    pub device: Device,
    /// Optimizer.
    pub optimizer: Optimizer,
    /// The optimizer step's implementation (`None`: PyTorch's default for the device).
    pub optimizer_impl: Option<OptimizerImpl>,
    /// Dropout probability (0: no dropout, no masks).
    pub dropout: f64,
    /// Micro-steps per optimizer step (gradients exist through every micro-step after the first).
    pub grad_accumulation: u64,
    /// Whether the loop keeps the logits (`logits, loss = model(x, y)`, as nanoGPT): alive
    /// through backward and the optimizer step, until the next forward replaces them.
    pub keep_logits: bool,
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
    /// Defaults for a shape: seq = its positions, batch 1, fp32, AdamW (the device's default
    /// implementation), naive attention, no dropout, no accumulation, kept logits, CUDA.
    pub fn for_shape(shape: ModelShape) -> Self {
        EstimateInput {
            shape: Some(shape),
            params: shape.params(),
            seq: shape.positions,
            batch: 1,
            dtype: Dtype::Fp32,
            activation_dtype: Dtype::Fp32,
            device: Device::Cuda,
            optimizer: Optimizer::Adamw,
            optimizer_impl: None,
            dropout: 0.0,
            grad_accumulation: 1,
            keep_logits: true,
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

    /// The optimizer implementation, or PyTorch's default for the device (CUDA: foreach; CPU:
    /// per-tensor, since `_default_to_fused_or_foreach` picks foreach only for CUDA tensors).
    pub fn optimizer_impl_or_default(&self) -> OptimizerImpl {
        self.optimizer_impl.unwrap_or(match self.device {
            Device::Cuda => OptimizerImpl::Foreach,
            Device::Cpu => OptimizerImpl::PerTensor,
        })
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
    /// Buffers: naive attention's causal mask, one P×P fp32 per block (nanoGPT's layout).
    pub buffers_bytes: u64,
    /// Gradients of the trainable parameters.
    pub gradients_bytes: u64,
    /// Optimizer state (moments, fp32 master weights under mixed precision).
    pub optimizer_bytes: u64,
    /// The optimizer step's transient (AdamW foreach: √v of every parameter; per-tensor: two
    /// temporaries of the largest parameter; fused: none).
    pub optimizer_transient_bytes: u64,
    /// Autocast's 2-byte copies of the matmul weights, alive from forward into backward.
    pub autocast_weight_copies_bytes: u64,
    /// Activations one block keeps for backward.
    pub activations_per_layer_bytes: Option<u64>,
    /// What one block keeps with checkpointing (its input).
    pub activations_per_layer_checkpointed_bytes: Option<u64>,
    /// Attention's score-sized memory per block (naive: the probabilities, with dropout its mask
    /// and output; efficient: the output B·H·S·D, kept once as the projection's input).
    pub attention_scores_bytes_per_layer: Option<u64>,
    /// All activations kept at the start of backward (one block's worth in forward-only runs).
    pub activations_bytes: Option<u64>,
    /// Logit-sized tensors at the start of the loss's backward: the kept logits, the
    /// log-probabilities and the two gradients cross-entropy's backward makes.
    pub logits_bytes: Option<u64>,
    /// KV cache for generating `seq` tokens (not part of the training peak).
    pub kv_cache_bytes: Option<u64>,
    /// Transient memory inside one block (the largest temporary besides what is kept).
    pub workspace_bytes: Option<u64>,
    /// The moments of a training step and the bytes alive at each (empty for forward-only runs
    /// and when the shape is unknown).
    pub moments: Vec<Moment>,
    /// The moment that is the peak.
    pub peak_moment: Option<&'static str>,
    /// The peak: the largest moment (forward only: weights, one block, logits, KV cache).
    pub peak_bytes: u64,
    /// Device memory fitted into.
    pub device_memory_bytes: Option<u64>,
    /// Share kept free.
    pub headroom: f64,
    /// Whether the peak fits the device with the headroom.
    pub fits: Option<bool>,
    /// The largest micro-batch whose peak fits with [`MODEL_MARGIN`] to spare (0: not even one
    /// sample).
    pub max_micro_batch: Option<u64>,
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Estimates memory for `input`.
pub fn estimate(input: &EstimateInput) -> Estimate {
    let mut est = estimate_batch(input, input.batch);
    if let Some(device) = input.device_memory {
        let budget = (device as f64 * (1.0 - input.headroom.clamp(0.0, 1.0))) as u64;
        est.fits = Some(est.peak_bytes <= budget);
        est.max_micro_batch = Some(max_batch(input, budget));
    }
    est
}

/// The share the largest micro-batch keeps free on top of the user's headroom, for the model's own
/// error: the worst underestimate measured on held-out configurations (docs/estimate.md, seeded
/// grids) is 1.2%, so a suggested batch fits even where the model is low.
pub const MODEL_MARGIN: f64 = 0.015;

/// The largest micro-batch whose peak, plus [`MODEL_MARGIN`], is within `budget`: the peak grows
/// with the batch, so a doubling search and a bisection find it.
fn max_batch(input: &EstimateInput, budget: u64) -> u64 {
    let budget = (budget as f64 / (1.0 + MODEL_MARGIN)) as u64;
    let peak = |b: u64| estimate_batch(input, b).peak_bytes;
    if peak(1) > budget {
        return 0;
    }
    if peak(2) == peak(1) {
        // Nothing scales with the batch (only the parameter count is known).
        return input.batch;
    }
    let (mut lo, mut hi) = (1u64, 2u64);
    while hi < (1 << 40) && peak(hi) <= budget {
        lo = hi;
        hi *= 2;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if peak(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The estimate at micro-batch `batch` (no fit).
fn estimate_batch(input: &EstimateInput, batch: u64) -> Estimate {
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
    let moments_per_param = match input.optimizer {
        Optimizer::Adamw => 8,
        Optimizer::Sgd => 4,
        Optimizer::None => 0,
    };
    let master = if training && lora.is_none() && input.dtype != Dtype::Fp32 {
        4
    } else {
        0
    };
    let optimizer = trainable * (moments_per_param + master);
    // The largest trainable tensor (the per-tensor optimizer's transient): the tied embedding,
    // the position table or an MLP matrix; a LoRA adapter's A or B of the qkv projection.
    let largest = match (input.shape, input.lora_rank) {
        (Some(s), Some(r)) => r * 3 * s.hidden,
        (Some(s), None) => (s.vocab * s.hidden)
            .max(s.positions * s.hidden)
            .max(4 * s.hidden * s.hidden),
        (None, _) => 0,
    };
    let buffers = match (input.shape, input.attention) {
        (Some(s), Attention::Naive) => layers * s.positions * s.positions * 4,
        _ => 0,
    };
    let opt_transient = if training {
        shard(
            sat(moments::optimizer_transient(
                input,
                trainable,
                largest,
                grad_bytes.max(if master > 0 { 4 } else { 0 }),
            )),
            1,
        )
    } else {
        0
    };

    let mut est = Estimate {
        params,
        trainable_params: trainable,
        weights_bytes: shard(weights, 3),
        buffers_bytes: buffers,
        gradients_bytes: shard(gradients, 2),
        optimizer_bytes: shard(optimizer, 1),
        optimizer_transient_bytes: opt_transient,
        autocast_weight_copies_bytes: 0,
        activations_per_layer_bytes: None,
        activations_per_layer_checkpointed_bytes: None,
        attention_scores_bytes_per_layer: None,
        activations_bytes: None,
        logits_bytes: None,
        kv_cache_bytes: None,
        workspace_bytes: None,
        moments: Vec::new(),
        peak_moment: None,
        peak_bytes: 0,
        device_memory_bytes: input.device_memory,
        headroom: input.headroom,
        fits: None,
        max_micro_batch: None,
    };
    let fixed = est.weights_bytes + est.buffers_bytes + est.gradients_bytes + est.optimizer_bytes;
    let Some(shape) = input.shape.filter(|_| input.seq > 0) else {
        est.peak_bytes = fixed.saturating_add(opt_transient);
        return est;
    };
    let a = moments::activations(input, shape, batch);
    let w = |v: u64| v as u128;
    let positions = w(input.logits_to_keep.unwrap_or(input.seq).min(input.seq));
    let x = w(batch) * positions * w(shape.vocab);
    let kv = 2 * w(layers) * w(batch) * w(input.seq) * w(shape.hidden) * w(input.dtype.bytes());
    est.activations_per_layer_bytes = Some(sat(a.per_layer));
    est.activations_per_layer_checkpointed_bytes = Some(sat(a.checkpointed));
    est.attention_scores_bytes_per_layer = Some(sat(a.scores));
    est.kv_cache_bytes = Some(sat(kv));
    est.workspace_bytes = Some(sat(a
        .forward_transient
        .max(a.mlp_backward)
        .max(a.attention_backward.saturating_sub(a.mlp_share))));
    if !training {
        // Forward only: weights, one block's activations, the logits once, the KV cache.
        let logits = x * 4;
        est.activations_bytes = Some(sat(a.per_layer));
        est.logits_bytes = Some(sat(logits));
        est.peak_bytes = sat(w(fixed) + a.per_layer + a.forward_transient + logits + kv);
        return est;
    }
    let (autocast_head, autocast_block) = moments::autocast_copies(input, shape);
    let trainable_blocks = if lora.is_some() { 0 } else { 1 };
    let states = States {
        weights: w(est.weights_bytes) + w(buffers),
        gradients: w(est.gradients_bytes),
        optimizer: w(est.optimizer_bytes),
        head_gradients: w(trainable_blocks * shape.vocab * shape.hidden * grad_bytes),
        block_gradients: w(trainable_blocks * shape.block_params() * grad_bytes),
        mlp_gradients: w(trainable_blocks
            * (8 * shape.hidden * shape.hidden + 5 * shape.hidden)
            * grad_bytes),
        optimizer_transient: w(opt_transient),
        autocast_head,
        autocast_block,
    };
    est.autocast_weight_copies_bytes = sat(autocast_head + w(layers) * autocast_block);
    est.activations_bytes = Some(sat(if input.checkpointing {
        w(layers) * a.checkpointed
    } else {
        w(layers) * a.per_layer
    }));
    let loss_bytes = if input.autocast {
        4
    } else {
        w(input.activation_dtype.bytes())
    };
    let logit_bytes = if input.autocast {
        2
    } else {
        w(input.activation_dtype.bytes())
    };
    est.logits_bytes =
        Some(sat(x
            * (3 * loss_bytes
                + if input.keep_logits { logit_bytes } else { 0 })));
    est.moments = moments::training_moments(input, shape, layers, &states, batch);
    if let Some(top) = est.moments.iter().max_by_key(|m| m.bytes) {
        est.peak_bytes = top.bytes;
        est.peak_moment = Some(top.name);
    }
    est
}

#[cfg(test)]
mod tests;
