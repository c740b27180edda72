//! The memory of training (or running) any [`Arch`] with a [`Recipe`]: model states per device
//! (weights, quantisation constants, adapters, gradients, optimizer state, under ZeRO/FSDP and
//! tensor parallelism), activations per block from the block's shape, the loss over the
//! vocabulary, the moments of a step where memory peaks, and three figures — the allocated peak,
//! what PyTorch's caching allocator reserves, and what `nvidia-smi` shows.

use super::arch::{Arch, Head, Norm, Stack};
use super::moments::Moment;
use super::recipe::{AttnImpl, Checkpointing, Loss, Optim, Precision, Quant, Recipe};
use serde::Serialize;

/// One term of the estimate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Term {
    /// What it is.
    pub name: &'static str,
    /// Bytes per device.
    pub bytes: u64,
}

/// The three figures a user compares with.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// Peak of live tensor bytes (`torch.cuda.max_memory_allocated`).
    pub allocated: u64,
    /// What the caching allocator holds at that peak (`torch.cuda.max_memory_reserved`).
    pub reserved: u64,
    /// What `nvidia-smi` shows for the process: the reserve, the CUDA context and workspaces,
    /// and paged optimizer state resident on the device.
    pub nvidia_smi: u64,
}

/// The estimate of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ArchEstimate {
    /// Parameters of the model.
    pub params: u64,
    /// Parameters trained.
    pub trainable_params: u64,
    /// Every term, per device.
    pub terms: Vec<Term>,
    /// Activations one block keeps for backward (the largest stack's block).
    pub activations_per_layer: u64,
    /// The moments of a step and the bytes alive at each.
    pub moments: Vec<Moment>,
    /// The largest moment.
    pub peak_moment: &'static str,
    /// The three figures.
    pub figures: Figures,
    /// What the figures assume.
    pub assumptions: Vec<String>,
}

/// The caching allocator's reserve beyond the allocated peak, as a share of the bytes that churn
/// within a step (the peak less the model states allocated once): blocks freed and reused at other
/// sizes leave segments partly empty (fitted on the tuned half of the published rows,
/// docs/estimate.md).
pub const RESERVE_FRACTION: f64 = 0.20;

fn f(v: u64) -> u128 {
    v as u128
}

fn sat(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Element sizes of one run.
struct Sizes {
    /// Matmul activations.
    a: u128,
    /// Residual stream.
    r: u128,
    /// Under autocast (fp32 stream, 2-byte matmuls).
    amp: bool,
}

/// The element sizes of a recipe. peft's `prepare_model_for_kbit_training` leaves the embeddings
/// and norms in fp32, so the residual stream is fp32: the embedding's output is, a norm returns its
/// fp32 weight times its input, and bitsandbytes' linears cast their output back to their input's
/// dtype.
fn sizes_of(r: &Recipe) -> Sizes {
    let mut s = sizes(r.precision);
    if r.kbit_fp32_rest && r.quant != Quant::None {
        s.r = s.r.max(4);
    }
    s
}

fn sizes(p: Precision) -> Sizes {
    Sizes {
        a: f(p.activation_bytes()),
        r: f(p.residual_bytes()),
        amp: p == Precision::Amp,
    }
}

/// Which linear layers keep their input for backward: all when the weights train; under LoRA
/// only the wrapped ones (a frozen weight's gradient is not computed, so autograd does not save
/// its input; measured with torch 2.11), and with LoRA dropout not even those (each adapter keeps
/// its own dropped copy). Quantised linears keep theirs whatever trains (bitsandbytes'
/// `MatMul4Bit` saves its input), and so do frozen ones where `frozen_inputs_saved` says the
/// torch release does.
struct Saves {
    full: bool,
    all_linears: bool,
    roles: Vec<&'static str>,
    dropout: bool,
}

impl Saves {
    fn new(arch: &Arch, r: &Recipe) -> Self {
        Saves {
            full: r.lora.is_none(),
            all_linears: r.lora.is_none() || r.quant != Quant::None || r.frozen_inputs_saved,
            roles: r
                .lora
                .as_ref()
                .map_or(Vec::new(), |l| l.wrapped_roles(arch)),
            dropout: r.lora_dropout,
        }
    }

    /// Whether a linear of one of these roles keeps its input tensor itself.
    fn input(&self, roles: &[&str]) -> bool {
        self.all_linears || (!self.dropout && roles.iter().any(|x| self.roles.contains(x)))
    }
}

/// Bytes one norm keeps per token: its input (RMSNorm as `transformers` and LitGPT write it:
/// the fp32 upcast), the normalised tensor when the norm's weight trains, and its output when a
/// consumer keeps it.
fn norm_bytes(norm: Norm, s: &Sizes, d: u128, trains: bool, output_kept: bool) -> u128 {
    let out = if output_kept { s.a * d } else { 0 };
    match norm {
        Norm::LayerNorm => s.r * d + out,
        Norm::RmsNorm => {
            let normalised = if s.r == 4 { 4 } else { s.a };
            4 * d + if trains { normalised * d } else { 0 } + out
        }
    }
}

/// Per-token bytes one block of `st` keeps for backward, and the attention core's share (what
/// selective recomputation drops), for sequences of `seq` (the scores' width) split over `tp`.
fn block_bytes(arch: &Arch, st: &Stack, r: &Recipe, seq: u64) -> (u128, u128) {
    let s = sizes_of(r);
    let sv = Saves::new(arch, r);
    let d = f(arch.hidden);
    let at = st.attention;
    let (q, kv) = (f(at.heads * at.head_dim), f(at.kv_heads * at.head_dim));
    let tp = f(r.parallel.tp.max(1));
    let split = |v: u128| v.div_ceil(tp);
    let replicated = |v: u128| if r.parallel.sp { split(v) } else { v };
    let attentions = if st.cross_attention { 2 } else { 1 };
    // Attention: q, k, v as the kernel keeps them, its output, the output projection's input.
    let core_sdpa = s.a * (q + 2 * kv) + s.a * q + 4 * f(at.heads);
    let scores_el = f(at.heads) * f(seq);
    // Eager scores: the softmax's output (fp32 where the family computes it in fp32, or under
    // autocast) and its cast for the value matmul, the dropout mask and dropped copy.
    let fp32_softmax = s.amp
        || !matches!(
            arch.family.as_str(),
            "bert" | "roberta" | "gpt2" | "gpt_neox" | "t5"
        );
    let score_bytes = if fp32_softmax {
        // Without dropout the value matmul keeps the cast (fp32: the softmax output itself);
        // with it the mask and the dropped copy.
        4 + match (r.dropout, s.a < 4) {
            (true, _) => 1 + s.a,
            (false, true) => s.a,
            (false, false) => 0,
        }
    } else {
        s.a + if r.dropout { 1 + s.a } else { 0 }
    };
    let core = if eager(arch, r) {
        s.a * (q + 2 * kv) + scores_el * score_bytes
    } else {
        core_sdpa
    };
    let o_input = if sv.input(&["o"]) { s.a * q } else { 0 };
    let attention = attentions * (split(core) + split(o_input));
    let core_share = attentions * split(core);
    // MLP: gated keeps gate, up and act(gate) (the activation's and the product's inputs) and
    // the product (the down projection's); plain the hidden before the activation and after
    // (the down projection's). Mixture of experts: per routed expert, plus the gathered input
    // and output and the router's fp32 probabilities.
    let m = st.mlp;
    let i = f(m.intermediate);
    let down = u128::from(sv.input(&["down"]));
    // `gelu_new`/`gelu_fast` are written as Python arithmetic: besides its input the tanh's
    // output, half the input and (1 + tanh) are kept, three more intermediate-sized tensors.
    let composite = match arch.activation.as_str() {
        "gelu_new" | "gelu_fast" | "gated-gelu" => 3,
        _ => 0,
    };
    let hidden = s.a * i * (composite + if m.gated { 3 + down } else { 1 + down });
    let mlp = if m.experts > 0 {
        let k = f(m.experts_per_token.max(1));
        k * (split(hidden) + 2 * s.a * d) + 2 * 4 * f(m.experts)
    } else {
        split(hidden)
    };
    // Norms: before attention (its output feeds q, k, v) and before the MLP; Phi's one norm
    // feeds both; T5's decoder has a third before cross-attention.
    let attn_in = sv.input(&["q", "k", "v", "qkv"]);
    let mlp_in = sv.input(&["gate", "up", "gate_up"]);
    let norm = |kept: bool| replicated(norm_bytes(arch.norm, &s, d, sv.full, kept));
    let norms = match st.norms_per_block {
        1 => norm(attn_in || mlp_in),
        n => f(n - 1) * norm(attn_in) + norm(mlp_in),
    };
    let masks = if r.dropout { replicated(2 * d) } else { 0 };
    (norms + attention + mlp + masks, core_share)
}

/// Whether attention materialises its scores: asked for, or the family has no fused path (T5's
/// relative position bias).
fn eager(arch: &Arch, r: &Recipe) -> bool {
    r.attention == AttnImpl::Eager || arch.family == "t5"
}

/// Model-state bytes per device and the parameter counts behind them.
struct States {
    weights: u128,
    gradients: u128,
    optimizer: u128,
    paged: u128,
    transient: u128,
    largest_grad: u128,
    /// Gathered full blocks under ZeRO-3 (two, with prefetch) and one block's full gradients,
    /// alive in the forward and the backward, not at the optimizer step.
    gather: u128,
    trainable: u64,
    head_grad: u128,
    /// 2-byte weight copies autocast keeps for backward (all blocks', or one block's with
    /// checkpointing) and the largest dequantised weight (QLoRA).
    amp_copies: u128,
    dequant: u128,
}

/// DeepSpeed's default `sub_group_size` (elements): ZeRO-3 steps the optimizer one sub-group of
/// parameters at a time (`deepspeed/runtime/zero/config.py`).
const DEEPSPEED_SUB_GROUP: u128 = 1_000_000_000;

fn states(arch: &Arch, r: &Recipe) -> States {
    let p = r.precision;
    let par = r.parallel;
    let dp = f(par.dp.max(1));
    let tp = f(par.tp.max(1));
    let params = f(arch.params());
    let linear = f(arch.linear_params());
    let wb = f(p.weight_bytes());
    let training = r.optimizer != Optim::None;
    // Weights: linear weights and embeddings split by TP; norms replicated (small, ignored).
    // The head quantised with the blocks (Fabric's plugin): its V·d weight among the quantised.
    let head = quantised_head(arch, r);
    let base = match r.quant {
        Quant::None => params * wb,
        q => {
            let linear = linear + head;
            let quantised = (linear as f64 * q.bytes_per_weight()) as u128;
            // The rest in the compute dtype, or fp32 after peft's
            // `prepare_model_for_kbit_training`.
            quantised + (params - linear) * if r.kbit_fp32_rest { 4 } else { 2 }
        }
    } / tp;
    let lora_params = r.lora.as_ref().map_or(0, |l| l.params(arch));
    let adapters = f(lora_params) * f(r.adapter_bytes) / tp;
    let trainable = match (&r.lora, training) {
        (_, false) => 0,
        (Some(_), true) => lora_params,
        (None, true) => arch.params(),
    };
    let t = f(trainable) / tp;
    // Mixed precision (DeepSpeed's bf16/fp16 and its ZeRO optimizers) steps an fp32 master copy
    // of whatever trains, adapters included, so the moments are fp32 whatever the adapters' dtype.
    let (grad_b, state_b) = if r.lora.is_some() {
        (
            f(r.adapter_bytes),
            if p == Precision::Mixed {
                4
            } else {
                f(r.adapter_bytes)
            },
        )
    } else {
        (
            wb,
            if p == Precision::Mixed || p == Precision::Amp {
                4
            } else {
                wb
            },
        )
    };
    // Tensors outside the blocks' linears (norm weights and biases — under 4096 elements — and
    // the embeddings, which HF Trainer registers for 32-bit state) keep fp32 moments under
    // 8-bit Adam; adapters are matrices and go 8-bit.
    let vectors = if r.lora.is_some() {
        0
    } else {
        f(arch.params() - arch.linear_params()).min(t)
    };
    let moments = match r.optimizer {
        Optim::Adamw => 2 * state_b * t,
        Optim::AdamwBf16 => 4 * t,
        Optim::Adamw8bit => (t - vectors) * 2 + (t - vectors) * 8 / 256 + vectors * 8,
        Optim::Adafactor => adafactor(arch, r) / tp,
        Optim::SgdMomentum => state_b * t,
        Optim::Sgd | Optim::None => 0,
    };
    // The fp32 master copy (`single_partition_of_fp32_groups` in DeepSpeed's ZeRO-1/2,
    // `fp32_partitioned_groups_flat` in ZeRO-3) of every trainable tensor kept in fewer bytes:
    // the weights, or 2-byte adapters.
    let trained_b = if r.lora.is_some() {
        f(r.adapter_bytes)
    } else {
        wb
    };
    let master = if training && p == Precision::Mixed && trained_b < 4 {
        4 * t
    } else {
        0
    };
    let zero = par.zero;
    let shard = |v: u128, stage: u8| if zero >= stage { v.div_ceil(dp) } else { v };
    // At the step the master weights are updated from an fp32 copy of the gradients
    // (`flat_grad_partition.to(fp32)` in ZeRO-1/2's `step`, `_prepare_fp32_grad_for_sub_group`
    // in ZeRO-3, one sub-group of at most `sub_group_size` elements, DeepSpeed's default 1e9, at a
    // time), alive while the optimizer steps.
    let fp32_grads = if master > 0 {
        let part = shard(t, 1);
        4 * if zero >= 3 {
            part.min(DEEPSPEED_SUB_GROUP)
        } else {
            part
        }
    } else {
        0
    };
    let mut optimizer = shard(moments + master, 1);
    let mut paged = 0;
    if par.offload_optimizer {
        optimizer = 0;
    } else if r.paged {
        paged = optimizer;
        optimizer = 0;
    }
    let largest = largest_tensor(arch, r) / tp;
    let largest_grad = largest * grad_b;
    let gradients = if r.optimizer_in_backward {
        largest_grad
    } else {
        shard(t * grad_b, 2)
    };
    let transient = fp32_grads
        + match (r.optimizer, r.foreach) {
            (Optim::Adamw | Optim::AdamwBf16, true) => shard(t * state_b, 1),
            (Optim::Adamw | Optim::AdamwBf16, false) => 2 * largest * state_b,
            (Optim::Adafactor, _) => 3 * largest * 4,
            _ => 0,
        };
    let block_params: u128 = arch
        .stacks()
        .map(|s| f(s.block_params(arch.hidden, arch.norm)))
        .max()
        .unwrap_or(0)
        / tp;
    let weights_on_device = if par.offload_params && zero >= 3 {
        0
    } else {
        shard(base, 3)
    };
    let gather = if zero >= 3 && dp > 1 {
        2 * block_params * wb + if training { block_params * grad_b } else { 0 }
    } else {
        0
    };
    let head_grad = if r.lora.is_none() && training {
        match arch.head {
            Head::Lm { tied: false, .. } => f(arch.vocab * arch.hidden) * grad_b / tp,
            _ => 0,
        }
    } else {
        0
    };
    let amp_layers = if r.checkpointing == Checkpointing::Full {
        1
    } else {
        f(arch.layers())
    };
    let amp_copies = if p == Precision::Amp {
        (amp_layers * block_params + f(arch.vocab * arch.hidden) / tp) * 2
    } else {
        0
    };
    let dequant = match r.quant {
        Quant::None => 0,
        _ => largest_linear(arch).max(head) * f(r.dequant_bytes) / tp,
    };
    States {
        weights: weights_on_device + shard(adapters, 3),
        gradients,
        optimizer,
        paged,
        transient,
        largest_grad,
        gather,
        trainable,
        head_grad,
        amp_copies,
        dequant,
    }
}

/// Adafactor's state: rows + columns per matrix, the full second moment of vectors, fp32.
fn adafactor(arch: &Arch, r: &Recipe) -> u128 {
    if let Some(l) = &r.lora {
        return l
            .wrapped(arch)
            .iter()
            .map(|w| f(w.count * w.experts) * f(l.rank * 2 + w.fan_in + w.fan_out) * 4)
            .sum();
    }
    let blocks = arch.linears();
    let matrices = blocks
        .iter()
        .map(|l| (f(l.layers * l.count), f(l.fan_in), f(l.fan_out)))
        .chain(
            arch.outer_matrices()
                .into_iter()
                .map(|(r, c)| (1, f(r), f(c))),
        );
    let (mut factored, mut elements) = (0u128, 0u128);
    for (n, r, c) in matrices {
        factored += n * (r + c) * 4;
        elements += n * r * c;
    }
    // Vectors (norms, biases) keep a full fp32 second moment.
    factored + f(arch.params()).saturating_sub(elements) * 4
}

/// The largest trainable tensor's elements (the per-tensor optimizer step's and
/// optimizer-in-backward's unit).
fn largest_tensor(arch: &Arch, r: &Recipe) -> u128 {
    match &r.lora {
        Some(l) => l
            .wrapped(arch)
            .iter()
            .map(|w| f(l.rank * w.experts * w.fan_in.max(w.fan_out)))
            .max()
            .unwrap_or(0),
        None => f(arch.vocab * arch.hidden).max(largest_linear(arch)),
    }
}

/// The untied LM head's weight elements when the recipe quantises it with the blocks, else 0.
fn quantised_head(arch: &Arch, r: &Recipe) -> u128 {
    match (r.quant, arch.head) {
        (Quant::None, _) => 0,
        (_, Head::Lm { tied: false, .. }) if r.quant_head => f(arch.vocab * arch.hidden),
        _ => 0,
    }
}

fn largest_linear(arch: &Arch) -> u128 {
    arch.linears()
        .iter()
        .map(|l| f(l.fan_in * l.fan_out))
        .max()
        .unwrap_or(0)
}

/// Estimates `arch` trained (or run) with `r`.
pub fn estimate(arch: &Arch, r: &Recipe) -> ArchEstimate {
    let st = states(arch, r);
    let s = sizes_of(r);
    let training = r.optimizer != Optim::None;
    let tokens = f(r.batch) * f(r.seq);
    let d = f(arch.hidden);
    let tp = f(r.parallel.tp.max(1));
    let mut kept = 0u128;
    let mut per_layer_max = 0u128;
    let mut inputs = 0u128;
    for stack in arch.stacks() {
        let (block, core) = block_bytes(arch, stack, r, r.seq);
        let block = match r.checkpointing {
            Checkpointing::Selective => block - core,
            _ => block,
        } * tokens;
        per_layer_max = per_layer_max.max(block);
        let input = s.r * d * tokens / if r.parallel.sp { tp } else { 1 };
        inputs += f(stack.layers) * input;
        kept += f(stack.layers)
            * match r.checkpointing {
                Checkpointing::Full => input,
                _ => block,
            };
    }
    // LoRA dropout: each wrapped module's input is dropped out (a copy and a mask per module;
    // one for a block's q, k and v where the code fuses them). The modules sit inside the
    // blocks, so under full checkpointing their copies are made again with the block in
    // backward, one block at a time, like the rest of the block's activations.
    if let (Some(l), true) = (&r.lora, r.lora_dropout) {
        let mut in_qkv = false;
        let per_token: u128 = l
            .wrapped(arch)
            .iter()
            .map(|w| {
                let qkv = r.fused_qkv && matches!(w.role, "q" | "k" | "v");
                let shared = qkv && in_qkv;
                in_qkv = qkv;
                if shared {
                    0
                } else {
                    f(w.count) * f(w.fan_in) * (s.a + 1)
                }
            })
            .sum();
        let dropped = per_token * tokens / tp;
        match r.checkpointing {
            Checkpointing::Full => per_layer_max += dropped / f(arch.layers().max(1)),
            _ => kept += dropped,
        }
    }
    // The embedding's output (and BERT's embedding norm) and the final norm.
    let ends =
        tokens * (s.r * d + norm_bytes(arch.norm, &s, d, r.lora.is_none(), true)) + tokens * 16;
    let recompute = if r.checkpointing == Checkpointing::Full {
        per_layer_max
    } else {
        0
    };
    // Logits and the loss: causal-LM and masked-LM heads score every position over the
    // vocabulary (vocabulary-parallel under TP); classifiers a few labels.
    let vocab_head = matches!(arch.head, Head::Lm { .. } | Head::MaskedLm);
    let positions = match (r.loss, vocab_head) {
        (_, false) => 0,
        (Loss::Chunked { positions }, true) => f(positions.min(r.seq)) * f(r.batch),
        _ => tokens,
    };
    let x = positions * f(arch.vocab) / tp;
    let (loss_fwd, loss_bwd) = match r.loss {
        // logits, their fp32 copy, the log-probabilities; at backward the log-probabilities,
        // the NLL's gradient and the log-softmax's gradient (fp32), then the cast back.
        Loss::Fp32 | Loss::Chunked { .. } => (x * (s.a + if s.a < 4 { 4 } else { 0 } + 4), x * 12),
        Loss::Native => (x * 2 * s.a, x * 3 * s.a),
    };
    // Logits the loop keeps through backward and the step (the model's output object).
    let kept_logits = if r.keep_logits && vocab_head {
        tokens * f(arch.vocab) / tp * s.a
    } else {
        0
    };
    let data = tokens * 16 + kept_logits;
    // Model states and the batch, with what ZeRO-3/FSDP holds gathered while the forward and
    // the backward run. The optimizer step has no gathered unit: DeepSpeed's ZeRO-3 `step`
    // calls `_partition_all_parameters()` before it updates the first sub-group
    // (`deepspeed/runtime/zero/stage3.py`), and FSDP reshards every unit, the root included,
    // once its gradients are reduce-scattered (`torch/distributed/fsdp/_runtime_utils.py`,
    // `_post_backward_hook` → `_post_backward_reshard`; FSDP2's post-backward likewise).
    let base = st.weights + st.optimizer + data + st.gather + st.dequant;
    let acc = if (r.grad_accumulation > 1 || r.grads_persist) && training {
        st.gradients
    } else {
        0
    };
    let mut moments = Vec::new();
    let mut push = |name: &'static str, v: u128| {
        moments.push(Moment {
            name,
            bytes: sat(v),
        })
    };
    let amp_kept = st.amp_copies;
    let fwd = base + acc + amp_kept + kept + ends;
    if !training {
        // Forward only: one block's activations at a time.
        push("forward", base + amp_kept + per_layer_max + ends + loss_fwd);
    } else {
        push(
            "forward end (loss)",
            fwd + loss_fwd - kept_logits.min(loss_fwd),
        );
        push("loss backward", fwd + loss_bwd);
        // A block's backward: its gradients (incoming, the hidden's), the recomputed block.
        let transient = tokens * (s.r * d + 2 * s.a * d) + per_layer_max / 4;
        let top_grads = if acc > 0 { 0 } else { st.head_grad };
        push(
            "backward, last block",
            fwd + top_grads + recompute + transient + st.largest_grad.min(st.gradients),
        );
        let all_grads = if acc > 0 { 0 } else { st.gradients };
        let first = base
            + acc
            + all_grads
            + per_layer_max.max(recompute)
            + inputs.min(kept) / f(arch.layers().max(1))
            + transient
            + if r.precision == Precision::Amp {
                st.amp_copies / f(arch.layers().max(1))
            } else {
                0
            };
        push("backward, first block", first);
        push(
            "optimizer step",
            base - st.dequant - st.gather + st.gradients + st.transient,
        );
    }
    let (peak_moment, allocated) = moments
        .iter()
        .max_by_key(|m| m.bytes)
        .map(|m| (m.name, m.bytes))
        .unwrap_or(("none", 0));
    let persistent = sat(st.weights + st.optimizer + st.gradients);
    let churn = allocated.saturating_sub(persistent);
    let reserved = allocated + (churn as f64 * RESERVE_FRACTION) as u64;
    let nvidia_smi = reserved + r.device.context + r.device.workspace + sat(st.paged);
    let terms = vec![
        Term {
            name: "weights (with quantisation constants and adapters)",
            bytes: sat(st.weights),
        },
        Term {
            name: "gradients",
            bytes: sat(st.gradients),
        },
        Term {
            name: "optimizer state (with master weights)",
            bytes: sat(st.optimizer),
        },
        Term {
            name: "paged optimizer state (unified memory)",
            bytes: sat(st.paged),
        },
        Term {
            name: "optimizer step transient",
            bytes: sat(st.transient),
        },
        Term {
            name: "ZeRO-3/FSDP gathered blocks",
            bytes: sat(st.gather),
        },
        Term {
            name: "autocast 2-byte weight copies",
            bytes: sat(st.amp_copies),
        },
        Term {
            name: "dequantised weight (largest linear)",
            bytes: sat(st.dequant),
        },
        Term {
            name: "activations kept",
            bytes: sat(kept + ends),
        },
        Term {
            name: "loss at its backward (logits)",
            bytes: sat(loss_bwd),
        },
    ];
    ArchEstimate {
        params: arch.params(),
        trainable_params: st.trainable,
        terms,
        activations_per_layer: sat(per_layer_max),
        moments,
        peak_moment,
        figures: Figures {
            allocated,
            reserved,
            nvidia_smi,
        },
        assumptions: assumptions(r),
    }
}

fn assumptions(r: &Recipe) -> Vec<String> {
    let mib = |b: u64| b >> 20;
    let mut a = vec![
        format!(
            "CUDA context {} MiB and cuBLAS workspace {} MiB per process (--cuda-context to change)",
            mib(r.device.context),
            mib(r.device.workspace)
        ),
        format!(
            "caching allocator reserve: {:.0}% of the bytes that churn within a step",
            RESERVE_FRACTION * 100.0
        ),
        "RMSNorm computed in fp32 as transformers and LitGPT write it; SDPA/flash attention keeps q, k, v, its output and one log-sum-exp per row".into(),
    ];
    if r.lora.is_some() {
        a.push(format!(
            "adapters kept in {} bytes (peft casts them to fp32 by default)",
            r.adapter_bytes
        ));
    }
    if r.paged {
        a.push("paged optimizer state lives in unified memory: not in the allocator's figures, resident (in nvidia-smi) until evicted".into());
    }
    if r.parallel.dp > 1 {
        a.push("NCCL's own buffers are not counted".into());
    }
    a
}

/// Whether a configuration fits a device, and the largest micro-batch that does.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fit {
    /// Device memory.
    pub device: u64,
    /// Share kept free.
    pub headroom: f64,
    /// The share added to the `nvidia-smi` figure for the estimate's own error.
    pub margin: f64,
    /// Whether the configured micro-batch fits.
    pub fits: bool,
    /// The largest micro-batch whose `nvidia-smi` figure, plus the margin, is within
    /// `device·(1 − headroom)` (0: not even one).
    pub max_micro_batch: u64,
    /// What that micro-batch leaves free of the device, in bytes, by the estimate.
    pub free_at_max: u64,
}

/// The share [`fit`] adds for the estimate's own error: the worst underestimate of the
/// `nvidia-smi`/allocated figure on the tuned half of the published rows (docs/estimate.md).
pub const FIT_MARGIN: f64 = 0.12;

/// Fits `r` to a device of `device` bytes keeping `headroom` free.
pub fn fit(arch: &Arch, r: &Recipe, device: u64, headroom: f64) -> Fit {
    let budget = device as f64 * (1.0 - headroom.clamp(0.0, 1.0)) / (1.0 + FIT_MARGIN);
    let smi = |b: u64| {
        let mut rb = r.clone();
        rb.batch = b;
        estimate(arch, &rb).figures.nvidia_smi
    };
    let ok = |b: u64| (smi(b) as f64) <= budget;
    let max = if !ok(1) {
        0
    } else {
        let (mut lo, mut hi) = (1u64, 2u64);
        while hi < (1 << 30) && ok(hi) {
            lo = hi;
            hi *= 2;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if ok(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    Fit {
        device,
        headroom,
        margin: FIT_MARGIN,
        fits: ok(r.batch),
        max_micro_batch: max,
        free_at_max: if max > 0 {
            device.saturating_sub(smi(max))
        } else {
            0
        },
    }
}
