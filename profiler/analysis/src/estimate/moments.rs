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
    /// Attention's score-sized memory per layer (naive: probabilities, dropout mask and output;
    /// fused: the output, B·H·S·D, which the projection keeps as its input).
    pub scores: u128,
    /// The embedding dropout's mask (kept until the embedding's backward).
    pub embedding: u128,
    /// The final norm's input, output and statistics.
    pub head: u128,
    /// The largest transient of a block's forward beyond what it keeps.
    pub forward_transient: u128,
    /// A block's MLP activations, released before its attention's backward starts.
    pub mlp_share: u128,
    /// New tensors at the MLP's backward (incoming gradient, the hidden's two gradients) less
    /// the GELU output already released.
    pub mlp_backward: u128,
    /// New tensors at the attention's backward (incoming gradient, the probabilities' and
    /// scores' gradients; fused: the output's and q, k, v's) less the attention's own released
    /// tensors.
    pub attention_backward: u128,
    /// SDPA's math fallback (CPU with dropout): what one block holds when the fallback
    /// returns, besides the block's input — the first norm's statistics and output (autocast:
    /// its fp32 output and 2-byte cast), the projection's q, k, v, the fallback's fp32 tensors
    /// and the attention weights' cast back to the input dtype. 0 for other attention.
    pub math_attention: u128,
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
    // On CPU, SDPA with dropout runs PyTorch's math fallback, which materializes the scores as
    // naive attention does (the fused CPU kernel has no dropout).
    let naive = i.attention == Attention::Naive || (dropout && i.device == Device::Cpu);
    // That fallback computes in fp32 from 2-byte inputs (`query.to(kFloat)` in PyTorch's
    // `_scaled_dot_product_attention_math`): q, k, v, probabilities, mask and output in 4 bytes.
    let math_fp32 = naive && i.attention == Attention::Efficient && i.autocast;
    // `ab`: element sizes inside the attention (the scores and q, k, v copies).
    let ab = if math_fp32 {
        Bytes {
            low: 4,
            probs: 4,
            probs_dropped: 4,
            mask: 4,
            ..bytes(i)
        }
    } else {
        bytes(i)
    };
    // LayerNorm statistics: mean and 1/std in fp32 per row, two norms.
    let stats = 2 * 2 * b * t * 4;
    // LN1 and LN2 inputs (residual), their outputs as the next matmul keeps them, MLP hidden
    // before and after GELU, the attention output feeding the projection.
    let common = 2 * n * by.residual + 2 * n * by.low + 8 * n * by.low + n * by.low + stats;
    let dropout_masks = if dropout { 2 * n * by.mask } else { 0 };
    // `attention`: what the attention keeps besides `common`; `scores`: the score-sized share
    // reported per layer (fused kernels: their output, B·H·S·D, kept once in `common`).
    let (attention, scores) = match naive {
        true => {
            // q and k·ᵀ and v copied contiguous for the batched matmuls; the probabilities; with
            // dropout its mask and output; the causal mask's bool (masked_fill keeps it).
            let mut sc = scores_el * ab.probs;
            if i.autocast && i.device == Device::Cuda {
                sc += scores_el * ab.probs_dropped;
            }
            if dropout {
                sc += scores_el * ab.mask;
                if !(i.autocast && i.device == Device::Cuda) {
                    sc += scores_el * ab.probs_dropped;
                }
            }
            (3 * n * ab.low + t * t + sc, sc)
        }
        // q, k, v (views of the projection's output) and one fp32 log-sum-exp per row; the
        // output is already laid out as the projection's input.
        false => (3 * n * by.low + b * h * t * 4, n * by.low),
    };
    let per_layer = common + dropout_masks + attention;
    let checkpointed = n * by.residual;
    let embedding = if dropout { n * by.mask_residual } else { 0 };
    let head = n * by.residual + n * by.low + 2 * b * t * 4;
    // Forward: a second score tensor while the next one is computed (naive), or the MLP's
    // output before the residual add.
    let forward_transient = if naive {
        (scores_el * by.low).max(n * by.low)
    } else {
        n * by.residual
    };
    let mlp_share = n * by.residual + 9 * n * by.low + if dropout { n * by.mask } else { 0 };
    let mlp_backward = n * by.residual + 8 * n * by.low - 4 * n * by.low;
    // Naive: the value's gradient replaces the released value copy and attention output, and
    // the probabilities' and the scores' gradients exist at once (with dropout the dropped
    // probabilities and the mask are released first: one more score tensor in all). Fused: the
    // output's gradient and those of q, k and v.
    let attention_backward = if naive {
        let grads = scores_el * ab.probs * if dropout { 1 } else { 2 };
        (n * by.residual + grads).saturating_sub(n * by.low)
    } else {
        // Attention in key blocks by tensor ops (not a fused kernel): one block's scores,
        // probabilities and their gradients (4 × B·H·S·block, fp32) at once.
        let chunk = i
            .attention_block
            .map_or(0, |k| 4 * b * h * t * w(k.min(i.seq)) * 4);
        n * by.residual + 4 * n * by.low + chunk
    };
    // SDPA's math fallback at its return (`_scaled_dot_product_attention_math`, measured: see
    // docs/estimate.md). Its fp32 tensors are all alive until it returns: five B·H·S·D ones
    // (scaled q, scaled kᵀ, two contiguous copies for the batched matmuls, the output before
    // its cast), with 2-byte inputs also the fp32 casts of q, k, v, the output's cast back and
    // the attention weights' (the second result, discarded by `scaled_dot_product_attention`);
    // the probabilities, dropout noise and dropped probabilities (fp32); the causal mask as
    // fp32. Around it: the first norm's statistics and output (autocast: fp32, and the 2-byte
    // cast the projection keeps) and the projection's output, held as q, k, v.
    let math_attention = if naive && i.attention == Attention::Efficient {
        let casts = if by.low < 4 {
            3 * n * 4 + n * by.low + scores_el * by.low
        } else {
            0
        };
        let norm_out = n * by.residual + if by.residual != by.low { n * by.low } else { 0 };
        stats / 2 + norm_out + 3 * n * by.low + 5 * n * 4 + casts + 3 * scores_el * 4 + t * t * 4
    } else {
        0
    };
    Activations {
        per_layer,
        checkpointed,
        scores,
        embedding,
        head,
        forward_transient,
        mlp_share,
        mlp_backward,
        attention_backward,
        math_attention,
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
    /// Gradients of one block's MLP (the first of the block's to exist in backward).
    pub mlp_gradients: u128,
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
    let by = bytes(i);
    let g = i.dtype.bytes() as u128;
    // Token ids and targets (int64).
    let data = 2 * bb * t * 8;
    let base = st.weights + st.optimizer + data + a.embedding;
    // Under gradient accumulation every micro-step after the first runs with all gradients, and
    // each new gradient is a transient added in place.
    let accumulating = i.grad_accumulation > 1;
    let acc = if accumulating { st.gradients } else { 0 };
    // Logits: B·K·V in the matmul dtype; the loss in fp32 under autocast, else the activation
    // dtype: log-probabilities, the NLL gradient and the log-softmax gradient.
    let positions = w(i.logits_to_keep.unwrap_or(i.seq).min(i.seq));
    let x = bb * positions * v;
    let loss_b = if i.autocast {
        4
    } else {
        i.activation_dtype.bytes() as u128
    };
    let logits_kept = if i.keep_logits { x * by.low } else { 0 };
    // Blocks' activations at the end of forward; checkpointed: their inputs.
    let kept = if i.checkpointing {
        l * a.checkpointed
    } else {
        l * a.per_layer
    };
    // Autocast copies: checkpointed blocks drop theirs when forward leaves autocast.
    let blocks_autocast = if i.checkpointing {
        st.autocast_block
    } else {
        l * st.autocast_block
    };
    let head_autocast = st.autocast_head + blocks_autocast;
    let mut m = Vec::with_capacity(12);
    let mut push = |name: &'static str, bytes: u128| {
        m.push(Moment {
            name,
            bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
        })
    };
    // Inside the loss's log-softmax: the previous step's logits (kept by the loop until the
    // new ones replace them), the new logits, their fp32 cast under autocast, the output.
    let cast = if i.autocast { x * 4 } else { 0 };
    let at_head = base + acc + head_autocast + kept + a.head;
    push(
        "forward end (loss)",
        at_head + 2 * logits_kept + cast + x * loss_b,
    );
    // Last block's forward (checkpointed: the block's activations exist until it returns).
    let last_block = if i.checkpointing { a.per_layer } else { 0 };
    push(
        "forward, last block",
        base + acc + head_autocast + kept + last_block + a.forward_transient + logits_kept,
    );
    push(
        "loss backward start",
        at_head + logits_kept + 3 * x * loss_b,
    );
    // LM head's backward: the logits' gradient, the new (tied) weight gradient (autocast: in
    // 2 bytes, then its fp32 cast), the hidden state's gradient.
    let head_grad_new = v * d * (g + if i.autocast { 2 } else { 0 });
    push(
        "LM head backward",
        at_head + logits_kept + x * by.low + head_grad_new + n * by.low,
    );
    // A block's backward, at its MLP and at its attention, given the gradients that exist
    // before it and the activations alive (its own included).
    let new_mlp = if accumulating {
        4 * d * d * g
    } else {
        st.mlp_gradients
    };
    let new_block = if accumulating {
        4 * d * d * g
    } else {
        st.block_gradients
    };
    let block = |grads: u128, alive: u128, autocast: u128| {
        let common = base + grads + alive + autocast + logits_kept;
        (
            common + new_mlp + a.mlp_backward,
            (common + new_block + a.attention_backward).saturating_sub(a.mlp_share),
        )
    };
    let top_grads = if accumulating {
        st.gradients
    } else {
        st.head_gradients
    };
    let top_alive = if i.checkpointing {
        l.saturating_sub(1) * a.checkpointed + a.per_layer
    } else {
        l * a.per_layer
    };
    let (mlp, attn) = block(top_grads, top_alive, blocks_autocast);
    push("backward, last block's MLP", mlp);
    push("backward, last block's attention", attn);
    let bottom_grads = if accumulating {
        st.gradients
    } else {
        st.head_gradients + l.saturating_sub(1) * st.block_gradients
    };
    let (mlp, attn) = block(bottom_grads, a.per_layer, st.autocast_block);
    push("backward, first block's MLP", mlp);
    push("backward, first block's attention", attn);
    // SDPA's math fallback at its return. Checkpointed: in a block's backward the recomputed
    // forward reaches it with the gradients so far, the checkpointed inputs not yet released,
    // the incoming gradient and (autocast) its 2-byte cast for the residual branch alive (the
    // forward keeps nothing of the fallback's, so the recomputation is the larger). Else: the
    // last block's forward, all other blocks' activations alive.
    if a.math_attention > 0 {
        if i.checkpointing {
            let incoming = n * by.residual + if by.residual != by.low { n * by.low } else { 0 };
            let recomputed = |grads: u128, inputs: u128, autocast: u128| {
                base + grads + autocast + logits_kept + inputs + incoming + a.math_attention
            };
            push(
                "backward, last block's recomputed attention",
                recomputed(top_grads, l * a.checkpointed, blocks_autocast),
            );
            push(
                "backward, first block's recomputed attention",
                recomputed(bottom_grads, a.checkpointed, st.autocast_block),
            );
        } else {
            push(
                "forward, last block's attention",
                base + acc
                    + head_autocast
                    + l.saturating_sub(1) * a.per_layer
                    + n * by.residual
                    + a.math_attention
                    + logits_kept,
            );
        }
    }
    // The embedding's backward builds a dense V·d gradient, and autograd's input buffer adds
    // the LM head's gradient of the tied weight to it. Without autocast that gradient is a
    // transposed view and the sum is made out of place (head's, embedding's and the sum at
    // once); under autocast it comes from the cast back to fp32 and is summed in place
    // (measured). Under accumulation the sum is then added to the existing gradient.
    let tied = 1 + u128::from(!i.autocast) + u128::from(accumulating);
    push(
        "embedding backward",
        base + st.gradients + tied * v * d * g + logits_kept,
    );
    push(
        "optimizer step",
        base - a.embedding + st.gradients + st.optimizer_transient + logits_kept,
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
