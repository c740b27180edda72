//! A training recipe as flags, each one a term of the estimate: precision (pure bf16 or mixed with
//! fp32 master weights), quantised base weights (QLoRA's NF4 with or without double quantisation,
//! LLM.int8), LoRA/DoRA, the optimizer and how its state is kept, the loss (fp32 over the full
//! vocabulary, in the logits' dtype, or chunked), checkpointing, attention, sharding (ZeRO/FSDP with
//! offload), tensor and sequence parallelism, and the device's fixed costs.

use super::lora::Lora;
use serde::Serialize;

/// How weights, gradients and activations are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// Everything fp32.
    Fp32,
    /// Pure bf16/fp16: weights, gradients, optimizer state and activations in 2 bytes, no master
    /// copy (`model.to(bfloat16)`, LitGPT's `bf16-true`, torchtune's default).
    Bf16,
    /// Autocast over fp32 weights (HF Trainer `bf16=True`/`fp16=True` on an fp32 model): the fp32
    /// weights are the master copy, activations of matmuls in 2 bytes, 2-byte weight copies kept
    /// for backward.
    Amp,
    /// 2-byte weights and gradients with fp32 master weights in the optimizer (DeepSpeed's and
    /// Megatron's bf16): 2 + 2 + 4 (master) bytes per parameter before the moments.
    Mixed,
}

impl Precision {
    /// Parses `fp32`, `bf16` (also `fp16`, `pure-bf16`), `amp` (also `autocast`) or `mixed`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "fp32" | "float32" => Ok(Precision::Fp32),
            "bf16" | "fp16" | "pure-bf16" | "bf16-true" => Ok(Precision::Bf16),
            "amp" | "autocast" | "bf16-mixed" => Ok(Precision::Amp),
            "mixed" | "master" => Ok(Precision::Mixed),
            _ => Err(format!(
                "unknown precision `{s}`: use fp32, bf16 (pure), amp (autocast over fp32 weights) or mixed (2-byte weights, fp32 master)"
            )),
        }
    }

    /// Bytes of a stored weight.
    pub fn weight_bytes(self) -> u64 {
        match self {
            Precision::Fp32 | Precision::Amp => 4,
            Precision::Bf16 | Precision::Mixed => 2,
        }
    }

    /// Bytes of a matmul's activation.
    pub fn activation_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            _ => 2,
        }
    }

    /// Bytes of the residual stream.
    pub fn residual_bytes(self) -> u64 {
        self.weight_bytes()
    }
}

/// How the frozen base weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Quant {
    /// In the precision's weight dtype.
    None,
    /// bitsandbytes NF4 (QLoRA): the blocks' linear weights in 4 bits with one absmax per 64
    /// weights (fp32, or with double quantisation 8-bit with an fp32 constant per 256 blocks);
    /// embeddings, norms and the head in the compute dtype.
    Nf4 {
        /// Double quantisation of the absmax constants.
        double_quant: bool,
    },
    /// bitsandbytes LLM.int8: 1 byte per linear weight and an fp32 scale per output row.
    Int8,
}

impl Quant {
    /// Parses `none`, `nf4`, `nf4-dq` (double quantisation) or `int8`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Quant::None),
            "nf4" | "4bit" => Ok(Quant::Nf4 {
                double_quant: false,
            }),
            "nf4-dq" | "nf4-double" | "qlora" => Ok(Quant::Nf4 { double_quant: true }),
            "int8" | "8bit" => Ok(Quant::Int8),
            _ => Err(format!(
                "unknown quantisation `{s}`: use none, nf4, nf4-dq or int8"
            )),
        }
    }

    /// Bytes per quantised linear weight, its constants included.
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            Quant::None => 0.0,
            // 4 bits + an fp32 absmax per 64 weights.
            Quant::Nf4 {
                double_quant: false,
            } => 0.5 + 4.0 / 64.0,
            // 4 bits + an 8-bit absmax per 64 weights + an fp32 constant per 256 blocks.
            Quant::Nf4 { double_quant: true } => 0.5 + 1.0 / 64.0 + 4.0 / (64.0 * 256.0),
            Quant::Int8 => 1.0,
        }
    }
}

/// The optimizer, by the state it keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optim {
    /// AdamW: two moments in the parameter's dtype (fp32 under mixed precision).
    Adamw,
    /// AdamW with moments kept in bf16 whatever the weights.
    AdamwBf16,
    /// bitsandbytes 8-bit AdamW: 2 bytes per parameter in blocks of 256 with an fp32 absmax;
    /// tensors under 4096 elements keep fp32 moments.
    Adamw8bit,
    /// Adafactor (factored second moment, no first moment): rows + columns per matrix.
    Adafactor,
    /// SGD with momentum: one buffer.
    SgdMomentum,
    /// Plain SGD: no state.
    Sgd,
    /// Forward only.
    None,
}

impl Optim {
    /// Parses `adamw`, `adamw-bf16`, `adamw-8bit`, `adafactor`, `sgd-momentum`, `sgd`, `none`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "adamw" | "adam" | "adamw-fp32" | "adamw_torch" | "adamw_hf" => Ok(Optim::Adamw),
            "adamw-bf16" => Ok(Optim::AdamwBf16),
            "adamw-8bit" | "adamw_bnb_8bit" | "adam8bit" => Ok(Optim::Adamw8bit),
            "adafactor" => Ok(Optim::Adafactor),
            "sgd-momentum" | "momentum" => Ok(Optim::SgdMomentum),
            "sgd" => Ok(Optim::Sgd),
            "none" => Ok(Optim::None),
            _ => Err(format!(
                "unknown optimizer `{s}`: use adamw, adamw-bf16, adamw-8bit, adafactor, sgd-momentum, sgd or none"
            )),
        }
    }
}

/// How the loss over the vocabulary is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Loss {
    /// `transformers`' loss: the logits cast to fp32 and a full log-softmax over the vocabulary
    /// (12 bytes per logit at the loss's backward).
    Fp32,
    /// Cross-entropy in the logits' dtype (LitGPT, a loop that does not upcast).
    Native,
    /// Chunked or fused cross-entropy (Liger, Unsloth, torchtune's chunked output): only one
    /// chunk of this many positions has logits at a time.
    Chunked {
        /// Positions per chunk.
        positions: u64,
    },
}

impl Loss {
    /// Parses `fp32`, `native` or `chunked[:N]` (N positions per chunk, default 1024).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "fp32" || s == "full" => Ok(Loss::Fp32),
            None if s == "native" || s == "bf16" => Ok(Loss::Native),
            None if s == "chunked" || s == "fused" => Ok(Loss::Chunked { positions: 1024 }),
            Some(("chunked", n)) => n
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .map(|positions| Loss::Chunked { positions })
                .ok_or_else(|| format!("`{n}` is not a chunk size")),
            _ => Err(format!(
                "unknown loss `{s}`: use fp32, native or chunked[:positions]"
            )),
        }
    }
}

/// Activation checkpointing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Checkpointing {
    /// Everything kept.
    None,
    /// Every block keeps only its input; one block is recomputed at a time in backward.
    Full,
    /// The attention core is recomputed (Korthikanti et al.'s selective recomputation).
    Selective,
}

impl Checkpointing {
    /// Parses `none`, `full` or `selective`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" | "off" => Ok(Checkpointing::None),
            "full" | "on" => Ok(Checkpointing::Full),
            "selective" => Ok(Checkpointing::Selective),
            _ => Err(format!(
                "unknown checkpointing `{s}`: use none, full or selective"
            )),
        }
    }
}

/// How attention scores are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttnImpl {
    /// Scores materialised and kept (`attn_implementation="eager"`; T5 always).
    Eager,
    /// Fused kernels (SDPA, FlashAttention): the output and a log-sum-exp per row.
    Sdpa,
}

/// Data, tensor and sequence parallelism.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Parallel {
    /// Data-parallel ranks the ZeRO stage shards over.
    pub dp: u64,
    /// ZeRO stage (3 = FSDP full shard): 1 optimizer state, 2 + gradients, 3 + weights.
    pub zero: u8,
    /// Optimizer state (and master weights) offloaded to the CPU.
    pub offload_optimizer: bool,
    /// Weights offloaded to the CPU (ZeRO-3): only the gathered blocks are on the device.
    pub offload_params: bool,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Sequence parallelism with TP (norms, dropout and residuals split too).
    pub sp: bool,
}

/// The device's fixed costs, said as assumptions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DeviceCosts {
    /// CUDA context and loaded kernels per process (outside PyTorch's allocator).
    pub context: u64,
    /// cuBLAS/cuBLASLt workspaces.
    pub workspace: u64,
}

/// The measured default: a CUDA 12 context with lazy module loading under torch 2.x takes about
/// 500 MiB on an H100 before the first tensor (docs/estimate.md; 1343 MiB on a V100 with CUDA 11.2
/// and eager loading in the transformers docs).
pub const CUDA_CONTEXT: u64 = 500 << 20;

/// cuBLAS's default workspace under torch 2.x on Hopper (`CUBLAS_WORKSPACE_CONFIG` unset):
/// 32 MiB per handle/stream.
pub const CUBLAS_WORKSPACE: u64 = 32 << 20;

/// The recipe.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recipe {
    /// Sequence length (encoder-decoder: both sides).
    pub seq: u64,
    /// Micro-batch.
    pub batch: u64,
    /// Precision.
    pub precision: Precision,
    /// Base-weight quantisation.
    pub quant: Quant,
    /// peft's `prepare_model_for_kbit_training`: the weights left unquantised (embeddings, norms,
    /// the head) cast to fp32.
    pub kbit_fp32_rest: bool,
    /// The untied LM head is quantised like the blocks' linears. Lightning Fabric's
    /// `BitsandbytesPrecision` (LitGPT's `--quantize bnb.*`) replaces every `torch.nn.Linear` the
    /// model builds, the head included; transformers' bitsandbytes integration keeps the output
    /// layer unquantised (`get_keys_to_not_convert`), the default here.
    pub quant_head: bool,
    /// Bytes per weight a quantised linear's dequantisation allocates: bitsandbytes'
    /// `dequantize_4bit` returns the dtype the weight was quantised from, and `MatMul4Bit` casts
    /// it to the input's dtype when that differs (`.to(A.dtype)`). 2 when quantised from the
    /// compute dtype (the default); Fabric's plugin quantises from fp16 (`.to(torch.half)` before
    /// `quantize_4bit`), so under bf16 it is 2 + 2; quantised from fp32 under bf16, 4 + 2.
    pub dequant_bytes: u64,
    /// LoRA/DoRA adapters (base frozen).
    pub lora: Option<Lora>,
    /// Adapter dtype bytes (peft casts adapters to fp32 by default: 4).
    pub adapter_bytes: u64,
    /// LoRA dropout on the adapters' inputs.
    pub lora_dropout: bool,
    /// The training code computes a block's q, k and v with one linear layer whatever the
    /// config's layout (LitGPT's `attn`, wrapped by one `LoRAQKVLinear`), so the adapters on
    /// q, k and v share one LoRA dropout: one dropped copy and mask of the block's input, where
    /// peft's separate `q_proj`/`k_proj`/`v_proj` modules each make their own.
    pub fused_qkv: bool,
    /// Autograd keeps the input of a linear layer whose weight is frozen (torch 2.11 does not:
    /// measured; the LitGPT rows, on torch 2.1, are consistent with older releases keeping it).
    pub frozen_inputs_saved: bool,
    /// Optimizer.
    pub optimizer: Optim,
    /// Paged optimizer state (bitsandbytes `paged_*`): unified memory outside PyTorch's
    /// allocator, evicted under pressure.
    pub paged: bool,
    /// The optimizer steps each parameter during backward and frees its gradient
    /// (optimizer-in-backward).
    pub optimizer_in_backward: bool,
    /// Multi-tensor (`foreach`) optimizer step: a transient of every trainable state at once;
    /// else one tensor at a time.
    pub foreach: bool,
    /// Loss.
    pub loss: Loss,
    /// The loop keeps the model's output (and so the logits) alive through backward
    /// (`out = model(**batch); out.loss.backward()`); HF Trainer drops it first.
    pub keep_logits: bool,
    /// Checkpointing.
    pub checkpointing: Checkpointing,
    /// Attention implementation.
    pub attention: AttnImpl,
    /// Dropout in the blocks (masks kept).
    pub dropout: bool,
    /// Micro-steps per optimizer step.
    pub grad_accumulation: u64,
    /// Gradients stay allocated between steps (`zero_grad(set_to_none=False)`, the default before
    /// torch 2.0 and in HF Trainer loops of that time): they are alive in forward too.
    pub grads_persist: bool,
    /// Parallelism.
    pub parallel: Parallel,
    /// Device costs.
    pub device: DeviceCosts,
}

impl Recipe {
    /// Defaults: batch 1, pure bf16, AdamW (foreach), the fp32 loss, SDPA, no checkpointing, no
    /// dropout, one device.
    pub fn new(seq: u64) -> Self {
        Recipe {
            seq,
            batch: 1,
            precision: Precision::Bf16,
            quant: Quant::None,
            kbit_fp32_rest: false,
            quant_head: false,
            dequant_bytes: 2,
            lora: None,
            adapter_bytes: 4,
            lora_dropout: false,
            fused_qkv: false,
            frozen_inputs_saved: false,
            optimizer: Optim::Adamw,
            paged: false,
            optimizer_in_backward: false,
            foreach: true,
            loss: Loss::Fp32,
            keep_logits: false,
            checkpointing: Checkpointing::None,
            attention: AttnImpl::Sdpa,
            dropout: false,
            grad_accumulation: 1,
            grads_persist: false,
            parallel: Parallel {
                dp: 1,
                zero: 0,
                offload_optimizer: false,
                offload_params: false,
                tp: 1,
                sp: false,
            },
            device: DeviceCosts {
                context: CUDA_CONTEXT,
                workspace: CUBLAS_WORKSPACE,
            },
        }
    }
}
