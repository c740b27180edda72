//! The training peak as a *moment*: which tensors are alive together at each point of a training
//! step where memory can peak (forward end, the loss head's backward, each end of the blocks'
//! backward, the embedding's backward, the optimizer step), for one micro-batch size. The peak is
//! the largest moment, not a sum of maxima. Every term and its source is in `docs/estimate.md`.

use super::{Attention, Device, Dtype, EstimateInput, OptimizerImpl};
use super::{ModelShape, Optimizer};
use serde::Serialize;

/// One point of the step and the bytes alive at it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Moment {
    /// Where in the step (`loss backward start`, `optimizer step`, …).
    pub name: &'static str,
    /// Bytes of live tensors then.
    pub bytes: u64,
}

/// Bytes of one block's (and the head's) activations for a micro-batch, by mechanism.
#[derive(Clone, Copy, Debug, Default)]
pub struct Activations {
    /// What one block keeps for backward.
    pub per_layer: u128,
    /// What one checkpointed block keeps (its input).
    pub checkpointed: u128,
    /// The attention-score share of `per_layer` (naive: probabilities, dropout mask and output;
    /// fused: the log-sum-exp rows).
    pub scores: u128,
    /// Kept outside the blocks: the embedding dropout's mask, the final norm's input and output.
    pub outside: u128,
    /// The largest transient of a block's forward beyond what it keeps.
    pub forward_transient: u128,
    /// The largest transient of a block's backward beyond what is kept (new gradients minus the
    /// activations already released at that point).
    pub backward_transient: u128,
}

/// Element sizes of the activations of one run.
struct Bytes {
    /// Residual stream (the LayerNorms' inputs).
    residual: u128,
    /// Tensors saved by the matmuls (autocast: their 2-byte casts).
    low: u128,
    /// Softmax probabilities kept for backward (naive attention).
    probs: u128,
    /// Attention probabilities after dropout, as the value matmul keeps them.
    probs_dropped: u128,
    /// A dropout mask on a matmul output (CPU: the input dtype; CUDA: 1-byte bool).
    mask: u128,
    /// The embedding dropout's mask (on the residual stream).
    mask_residual: u128,
}

fn bytes(i: &EstimateInput) -> Bytes {
    let e = i.activation_dtype.bytes() as u128;
    let w = i.dtype.bytes() as u128;
    let (residual, low) = if i.autocast { (w, 2) } else { (e, e) };
    // Softmax: CUDA autocast runs it in fp32 and casts its output for the value matmul; CPU
    // autocast keeps it in bf16 (PyTorch's autocast op lists differ per device).
    let cuda = i.device == Device::Cuda;
    let probs = if i.autocast && cuda { 4 } else { low };
    let mask_of = |dtype: u128| if cuda { 1 } else { dtype };
    let probs_dropped = if i.autocast && cuda { 2 } else { low };
    Bytes {
        residual,
        low,
        probs,
        probs_dropped,
        mask: mask_of(low),
        mask_residual: mask_of(residual),
    }
}

/// Activations of `s` for micro-batch `b` (the caller checked that a shape and a seq exist).
pub fn activations(i: &EstimateInput, s: ModelShape, b: u64) -> Activations {
    let w = |v: u64| v as u128;
    let by = bytes(i);
    let (b, t, d, h) = (w(b), w(i.seq), w(s.hidden), w(s.heads));
    let n = b * t * d;
    let scores_el = b * h * t * t;
    let dropout = i.dropout > 0.0;
    // LayerNorm statistics: mean and 1/std in fp32 per row, two norms.
    let stats = 2 * 2 * b * t * 4;
    // LN1 and LN2 inputs (residual), their outputs as the next matmul keeps them, MLP hidden
    // before and after GELU, the attention output feeding the projection.
    let common = 2 * n * by.residual + 2 * n * by.low + 8 * n * by.low + n * by.low + stats;
    let dropout_masks = if dropout { 2 * n * by.mask } else { 0 };
    let (attention, scores) = match i.attention {
        Attention::Naive => {
            // q and k·ᵀ and v copied contiguous for the batched matmuls; the probabilities; with
            // dropout its mask and output; the causal mask's bool (masked_fill keeps it).
            let mut sc = scores_el * by.probs;
            if i.autocast && i.device == Device::Cuda {
                sc += scores_el * by.probs_dropped;
            }
            if dropout {
                sc += scores_el * by.mask;
                if !(i.autocast && i.device == Device::Cuda) {
                    sc += scores_el * by.probs_dropped;
                }
            }
            (3 * n * by.low + t * t, sc)
        }
        Attention::Efficient => {
            // q, k, v (views of the projection's output) and one log-sum-exp per row; the
            // output is already laid out as the projection's input (counted in `common`).
            (3 * n * by.low, b * h * t * 4)
        }
    };
    let per_layer = common + dropout_masks + attention + scores;
    let checkpointed = n * by.residual;
    let emb_mask = if dropout { n * by.mask_residual } else { 0 };
    let outside = emb_mask + n * by.residual + n * by.low + 2 * b * t * 4;
    // Forward: a second score tensor while the next one is computed (naive), or the MLP's
    // output before the residual add.
    let forward_transient = match i.attention {
        Attention::Naive => (scores_el * by.low).max(n * by.low),
        Attention::Efficient => n * by.residual,
    };
    // Backward of the MLP: the incoming residual gradient, the gradients of the hidden before
    // and after GELU, less the GELU output already released.
    let mlp = n * by.residual + 8 * n * by.low - 4 * n * by.low;
    // Backward of naive attention: the gradient of the probabilities and of the scores (and of
    // the dropout output) at once, while this block's MLP activations are released.
    let attn = match i.attention {
        Attention::Naive => {
            let grads = scores_el * by.probs * if dropout { 3 } else { 2 };
            (grads + 4 * n * by.low).saturating_sub(2 * n * by.residual + 9 * n * by.low)
        }
        Attention::Efficient => 4 * n * by.low,
    };
    Activations {
        per_layer,
        checkpointed,
        scores,
        outside,
        forward_transient,
        backward_transient: mlp.max(attn),
    }
}

/// Model states and loop-dependent bytes that do not scale with the micro-batch.
pub struct States {
    /// Weights and buffers.
    pub weights: u128,
    /// Gradients of the trainable parameters.
    pub gradients: u128,
    /// Optimizer state.
    pub optimizer: u128,
    /// Gradients of the LM head (tied embedding), the first to exist in backward.
    pub head_gradients: u128,
    /// Gradients of one block.
    pub block_gradients: u128,
    /// The optimizer step's transient.
    pub optimizer_transient: u128,
    /// Autocast's 2-byte copies of the matmul weights (head share, one block's share).
    pub autocast_head: u128,
    /// One block's share of the autocast copies.
    pub autocast_block: u128,
}

/// The optimizer step's transient: AdamW's foreach path computes √v for every parameter at once
/// (`torch._foreach_sqrt`), the per-tensor path √v and √v / bias-correction for one parameter at
/// a time, the fused kernel nothing.
pub fn optimizer_transient(
    i: &EstimateInput,
    trainable: u64,
    largest: u64,
    state_bytes: u64,
) -> u128 {
    if i.optimizer != Optimizer::Adamw {
        return 0;
    }
    match i.optimizer_impl_or_default() {
        OptimizerImpl::Foreach => trainable as u128 * state_bytes as u128,
        OptimizerImpl::PerTensor => 2 * largest as u128 * state_bytes as u128,
        OptimizerImpl::Fused => 0,
    }
}

/// The moments of a training step at micro-batch `b`.
pub fn training_moments(
    i: &EstimateInput,
    s: ModelShape,
    layers: u64,
    st: &States,
    b: u64,
) -> Vec<Moment> {
    let a = activations(i, s, b);
    let w = |v: u64| v as u128;
    let (bb, t, d, v) = (w(b), w(i.seq), w(s.hidden), w(s.vocab));
    let l = w(layers);
    let n = bb * t * d;
    // Token ids and targets (int64).
    let data = 2 * bb * t * 8;
    let base = st.weights + st.optimizer + data;
    // Under gradient accumulation every micro-step after the first runs with all gradients.
    let acc = if i.grad_accumulation > 1 {
        st.gradients
    } else {
        0
    };
    let autocast = st.autocast_head + l * st.autocast_block;
    let by = bytes(i);
    // Logits: B·K·V in the matmul dtype; the loss in fp32 under autocast, else the activation
    // dtype: log-probabilities, the NLL gradient and the log-softmax gradient.
    let positions = w(i.logits_to_keep.unwrap_or(i.seq).min(i.seq));
    let x = bb * positions * v;
    let logit_b = by.low;
    let loss_b = if i.autocast {
        4
    } else {
        i.activation_dtype.bytes() as u128
    };
    let kept_logits = if i.keep_logits { x * logit_b } else { 0 };
    let g = i.dtype.bytes() as u128;
    let kept = if i.checkpointing {
        l * a.checkpointed
    } else {
        l * a.per_layer
    };
    let outside = a.outside;
    // The recomputed block under checkpointing.
    let recomputed = if i.checkpointing { a.per_layer } else { 0 };
    let blocks_autocast = if i.checkpointing {
        st.autocast_block
    } else {
        l * st.autocast_block
    };
    let head_autocast = st.autocast_head + blocks_autocast;
    let mut m = Vec::with_capacity(8);
    let mut push = |name: &'static str, bytes: u128| {
        m.push(Moment {
            name,
            bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
        })
    };
    // Inside the loss's log-softmax: the previous step's logits (kept by the loop until the
    // new ones replace them), the new logits, their fp32 cast under autocast, the output.
    let cast = if i.autocast { x * 4 } else { 0 };
    push(
        "forward end (loss)",
        base + acc + head_autocast + kept + outside + 2 * kept_logits + cast + x * loss_b,
    );
    // Last block's forward (checkpointed: the block's activations exist until it returns).
    push(
        "forward, last block",
        base + acc + autocast + kept + recomputed + a.forward_transient + kept_logits,
    );
    let logits_kept = if i.keep_logits { x * logit_b } else { 0 };
    push(
        "loss backward start",
        base + acc + head_autocast + kept + outside + logits_kept + 3 * x * loss_b,
    );
    // LM head's backward: the logits' gradient, the new (tied) weight gradient (autocast: in
    // 2 bytes, then its fp32 cast), the hidden state's gradient.
    let head_grad_new = v * d * (g + if i.autocast { 2 } else { 0 });
    push(
        "LM head backward",
        base + acc
            + head_autocast
            + kept
            + outside
            + logits_kept
            + x * logit_b
            + head_grad_new
            + n * by.low,
    );
    let grads_top = if i.grad_accumulation > 1 {
        st.gradients
    } else {
        st.head_gradients
    };
    push(
        "backward, last block",
        base + grads_top + blocks_autocast + kept + recomputed + a.backward_transient + logits_kept,
    );
    let grads_bottom = if i.grad_accumulation > 1 {
        st.gradients
    } else {
        st.head_gradients + l.saturating_sub(1) * st.block_gradients
    };
    let first = if i.checkpointing {
        a.checkpointed + a.per_layer
    } else {
        a.per_layer
    };
    push(
        "backward, first block",
        base + grads_bottom
            + st.autocast_block
            + first
            + a.backward_transient
            + logits_kept
            + st.block_gradients,
    );
    // The embedding's backward builds a dense V·d gradient, then adds it to the tied one.
    push(
        "embedding backward",
        base + st.gradients + v * d * g + logits_kept,
    );
    push(
        "optimizer step",
        base + st.gradients + st.optimizer_transient + logits_kept,
    );
    m
}

/// The LM head's and one block's autocast copies (matmul weights and biases in 2 bytes).
pub fn autocast_copies(i: &EstimateInput, s: ModelShape) -> (u128, u128) {
    if !i.autocast || i.dtype == Dtype::Bf16 || i.dtype == Dtype::Fp16 {
        return (0, 0);
    }
    let d = s.hidden as u128;
    (s.vocab as u128 * d * 2, (12 * d * d + 9 * d) * 2)
}
