//! What kind of job hit the OOM — an inference server (vLLM, TGI, llama.cpp, ComfyUI, ONNX
//! Runtime), other inference, training or a Rust binary — inferred from the message and its log,
//! and the ranking of remedies for it: a server's own settings first, training changes only for
//! training, Rust remedies for Rust.

use super::remedy::{self, Remedy};
use super::verdict::{Verdict, VerdictKind};
use memsight_format::job_context::{JobContext, Language};
use regex::Regex;
use serde::Serialize;
use std::sync::LazyLock;

/// The kind of job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// vLLM (engine, workers, OpenAI server).
    Vllm,
    /// Hugging Face text-generation-inference.
    Tgi,
    /// llama.cpp, ollama and other ggml runtimes.
    LlamaCpp,
    /// ComfyUI.
    ComfyUi,
    /// ONNX Runtime.
    OnnxRuntime,
    /// Other inference or generation (no training step in the log).
    Inference,
    /// A training or fine-tuning job.
    Training,
    /// A Rust program.
    Rust,
}

/// Signs of each workload, strongest first within the regex; named groups say which workload.
/// Words end where an ASCII word does (`\b` is ASCII), so text in another script may follow one
/// (`training代码`), and a count may be plural (`after few epochs`). Training also shows as a
/// training script (`train_zh.py`, `train_is.sh`), DeepSpeed's classes (`DeepSpeedZeRoOffload`)
/// and the verb with what it trains (`to train classifier`, `train a model`, `train the
/// \`stepstoreproduce\` model`) or after a wish to (`I try to train in SD-WebUI`), a trainer's module
/// (`trainer/trainer.py`) and the word in Chinese, Japanese or Korean (`训练`, `微调`, `学習`,
/// `학습`); a traceback through `torch/optim/` is an optimizer's step. Inference also shows as an
/// inference script (`inference_propainter.py`, `infer.py`). A word in a `user@host` token's host
/// part (a shell prompt) is no sign.
static SIGNS: LazyLock<Option<Regex>> = LazyLock::new(|| {
    regex::RegexBuilder::new(concat!(
        r"(?P<vllm>(?i:vllm)|EngineCore|gpu[_-]memory[_-]utilization|max[_-]num[_-]seqs|LLMEngine|",
        r"\b(?:INFO|WARNING|ERROR|DEBUG) [0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} \[?[\w.]+\.py:[0-9]+\])",
        r"|(?P<tgi>text[_-]generation[_-](?:server|launcher|router|inference|client)|max[_-]batch[_-]prefill[_-]tokens)",
        r"|(?P<llama>llama\.cpp|ggml_|GGML_|llama_model|llm_load|(?i:ollama)|n_gpu_layers|n-gpu-layers)",
        r"|(?P<comfy>(?i:comfy)|KSampler|This error means you ran out of memory on your GPU)",
        r"|(?P<ort>(?i:onnxruntime))",
        r"|(?P<train>\.backward\(|backward\(\)|\bTrainer\b|train\.py|\btrain[_-][\w-]*\.(?:py|sh)\b|training_step|optimizer\.step|torch[/\\]optim[/\\]|train_step|[Tt]rainer\.(?:train|fit)\(|\bfinetune|fine-tun|\bDeepSpeed[A-Z]\w*|(?i:\bdeepspeed\b|\bepochs?\b|\btraining\b|\btrain(?:ing)? (?:an? |the |my |our |your |this )?(?:`?\w+`? )?(?:model|classifier|network|detector)s?\b|\btrainer\.py\b|训练|微调|訓練|学習|학습|\b(?:try|tried|trying|want|wanted|attempt|attempted|attempting) to train\b))",
        r"|(?P<rust>panicked at|RUST_BACKTRACE|\.rs:[0-9]+|memory allocation of [0-9]+ bytes failed)",
        r"|(?P<infer>\.generate\(|\bgenerate\(|pipeline\(|(?i:\binference\b)|inference_mode|no_grad|diffusers|TRT-LLM|tensorrt_llm|sglang|\binfer(?:ence)?(?:[_-][\w-]*)?\.(?:py|sh)\b)",
    ))
    .unicode(false)
    .build()
    .ok()
});

/// The workload a log shows, by precedence: a named server, then training, then a Rust program,
/// then other inference. One pass over the text.
pub fn infer(text: &str) -> Option<Workload> {
    let re = SIGNS.as_ref()?;
    let order = [
        ("vllm", Workload::Vllm),
        ("tgi", Workload::Tgi),
        ("llama", Workload::LlamaCpp),
        ("comfy", Workload::ComfyUi),
        ("ort", Workload::OnnxRuntime),
        ("train", Workload::Training),
        ("rust", Workload::Rust),
        ("infer", Workload::Inference),
    ];
    let mut seen = [false; 8];
    for c in re.captures_iter(text) {
        if in_host_name(text, c.get(0).map_or(0, |m| m.start())) {
            continue;
        }
        for (i, (name, _)) in order.iter().enumerate() {
            if c.name(name).is_some() {
                seen[i] = true;
            }
        }
        if seen[0] {
            break;
        }
    }
    order
        .iter()
        .zip(seen)
        .find(|(_, s)| *s)
        .map(|((_, w), _)| *w)
}

/// Whether offset `at` of `text` lies in the host part of a `user@host` token (a shell prompt's
/// `[root@l-ai-training-server1.int.prod …]`): a machine's name is no sign of the job.
fn in_host_name(text: &str, at: usize) -> bool {
    // A host name is short: look back at most this far for the token's start.
    const HOST_TOKEN: usize = 256;
    let to = super::scan::floor(text, at);
    let before = &text[super::scan::floor(text, to.saturating_sub(HOST_TOKEN))..to];
    // The token starts after the last blank or opening bracket (a blank may be several bytes:
    // U+2000).
    let token = before
        .char_indices()
        .rev()
        .find(|&(_, c)| c.is_whitespace() || c == '[' || c == '(')
        .map_or(before, |(i, c)| &before[i + c.len_utf8()..]);
    token.contains('@') && !token.contains('/')
}

/// The workload a finding is judged for: a Rust allocation failure is a Rust program's whatever
/// the log says, vLLM's KV-cache errors are vLLM's; a PyTorch message is never a Rust program's
/// (a Rust tokenizer's panic elsewhere in the log does not make it one); otherwise the known or
/// inferred one.
pub(crate) fn of(kind: super::Kind, known: Option<Workload>) -> Option<Workload> {
    use super::Kind;
    match kind {
        Kind::RustAllocFailure => Some(Workload::Rust),
        Kind::VllmKvCache => Some(Workload::Vllm),
        Kind::TorchCpuOom
        | Kind::TorchCudaOomNew
        | Kind::TorchCudaOomOld
        | Kind::TorchMpsOom
        | Kind::TorchCudaOomAsync
            if known == Some(Workload::Rust) =>
        {
            None
        }
        _ => known,
    }
}

/// The workload a report's job shows: a server or other inference its command names, a Rust
/// program (without PyTorch), training when it marked steps.
pub(crate) fn of_job(job: &JobContext) -> Option<Workload> {
    let named = infer(&job.command.join(" "));
    match named {
        Some(Workload::Training | Workload::Rust) | None => {}
        Some(w) => return Some(w),
    }
    if job.language == Some(Language::Rust) && !job.torch {
        return Some(Workload::Rust);
    }
    named.or(job.training.then_some(Workload::Training))
}

/// Whether the remedy `id` fits the job: data-loader advice only for a job that has (or may have)
/// workers, Rust advice only for a Rust program, PyTorch advice only for a job that uses PyTorch.
fn fits(id: &str, job: &JobContext) -> bool {
    // A job known from its report ran under memsight: "run it under memsight" is no advice.
    if id == "profile" {
        return false;
    }
    if id == "data_loader" {
        return job.workers != Some(0);
    }
    if id.starts_with("rust_") {
        return job.language.is_none_or(|l| l == Language::Rust);
    }
    if id.starts_with("torch_") {
        return job.torch;
    }
    true
}

/// The remedies that fit the job the report describes, in their order (all of them when no
/// report is known).
pub(crate) fn fit_job(job: Option<&JobContext>, remedies: Vec<Remedy>) -> Vec<Remedy> {
    match job {
        Some(job) => remedies.into_iter().filter(|r| fits(r.id, job)).collect(),
        None => remedies,
    }
}

fn setting(id: &'static str, action: &str, why: &str) -> Remedy {
    remedy::framework(id, action, why)
}

/// The server's or runtime's own settings, best first for `verdict`.
fn settings(w: Workload, verdict: VerdictKind) -> Vec<Remedy> {
    match w {
        Workload::Vllm => vllm(verdict),
        Workload::Tgi => tgi(),
        Workload::LlamaCpp => llama_cpp(),
        Workload::ComfyUi => comfy_ui(),
        Workload::OnnxRuntime => onnx_runtime(),
        Workload::Inference => inference(),
        Workload::Rust => rust(),
        Workload::Training => Vec::new(),
    }
}

/// vLLM: memory utilization, sequences, context, eager mode, quantization.
fn vllm(verdict: VerdictKind) -> Vec<Remedy> {
    let others = verdict == VerdictKind::Contention;
    let util = setting(
        "vllm_gpu_memory_utilization",
        if others {
            "lower --gpu-memory-utilization (gpu_memory_utilization) to the share of the GPU the other processes leave free"
        } else {
            "lower --gpu-memory-utilization (e.g. 0.90 → 0.80) so the KV-cache reservation leaves headroom for activations, the sampler and CUDA graphs"
        },
        "vLLM reserves that fraction of the whole GPU for weights and KV cache at start-up; whatever else runs must fit in the rest",
    );
    let seqs = setting(
        "vllm_max_num_seqs",
        "lower --max-num-seqs and --max-num-batched-tokens",
        "activations, logits and sampler tensors grow with the sequences and tokens batched per step",
    );
    let len = setting(
        "vllm_max_model_len",
        "lower --max-model-len to the context you need",
        "the profiling run and each sequence's KV cache are sized for the longest context",
    );
    let mut v = if verdict == VerdictKind::RequestExceedsDevice {
        vec![seqs, len, util]
    } else {
        vec![util, seqs, len]
    };
    v.push(setting(
        "vllm_enforce_eager",
        "add --enforce-eager (or fewer cudagraph capture sizes)",
        "CUDA graphs keep private memory pools outside the KV-cache budget",
    ));
    v.push(setting(
            "serving_quantization",
            "serve a quantized checkpoint (AWQ, GPTQ, FP8) or --kv-cache-dtype fp8, or shard with --tensor-parallel-size",
            "weights and KV cache shrink to 1/2–1/4, or split across GPUs",
        ));
    v
}

/// Text Generation Inference: prefill and total tokens, memory fraction, quantization.
fn tgi() -> Vec<Remedy> {
    vec![
        setting(
            "tgi_max_batch_prefill_tokens",
            "lower --max-batch-prefill-tokens (and --max-batch-total-tokens)",
            "prefill activations scale with the tokens batched in one forward pass",
        ),
        setting(
            "tgi_max_total_tokens",
            "lower --max-total-tokens and --max-input-length",
            "the KV cache is sized for the longest request",
        ),
        setting(
            "tgi_cuda_memory_fraction",
            "lower --cuda-memory-fraction when other processes share the GPU",
            "TGI sizes its cache from the fraction of the GPU it may use",
        ),
        setting(
            "serving_quantization",
            "serve quantized weights (--quantize awq/gptq/eetq/fp8) or shard with --num-shard",
            "weights shrink to 1/2–1/4, or split across GPUs",
        ),
    ]
}

/// llama.cpp and ollama: offloaded layers, context, batch, quantization.
fn llama_cpp() -> Vec<Remedy> {
    vec![
        setting(
            "llama_n_gpu_layers",
            "offload fewer layers to the GPU: lower --n-gpu-layers (-ngl; num_gpu in ollama)",
            "each offloaded layer's weights live in GPU memory; the rest run from host memory",
        ),
        setting(
            "llama_ctx_size",
            "lower the context size (-c / --ctx-size; num_ctx in ollama) or quantize the KV cache (--cache-type-k q8_0 --cache-type-v q8_0)",
            "the KV cache grows with the context length",
        ),
        setting(
            "llama_batch_size",
            "lower --batch-size / --ubatch-size",
            "compute buffers scale with the batch processed at once",
        ),
        setting(
            "serving_quantization",
            "use a smaller quantization of the model (e.g. Q4_K_M instead of Q8_0)",
            "weights shrink with fewer bits per weight",
        ),
    ]
}

/// ComfyUI: low-VRAM modes, tiled VAE, quantized weights.
fn comfy_ui() -> Vec<Remedy> {
    vec![
        setting(
            "comfy_lowvram",
            "start ComfyUI with --lowvram (or --novram, --reserve-vram N)",
            "ComfyUI then keeps models in host memory and loads parts on demand",
        ),
        setting(
            "comfy_tiled_vae",
            "use the tiled VAE decode/encode nodes and a smaller resolution or batch",
            "VAE decoding of a full image is often the largest single allocation",
        ),
        setting(
            "serving_quantization",
            "load fp8 or GGUF-quantized weights",
            "weights shrink to 1/2–1/4 of fp16",
        ),
    ]
}

/// ONNX Runtime: its CUDA arena and batch size.
fn onnx_runtime() -> Vec<Remedy> {
    vec![
        setting(
            "ort_arena",
            "cap the CUDA arena (gpu_mem_limit) and set arena_extend_strategy to kSameAsRequested",
            "ONNX Runtime's arena grows in powers of two and keeps what it grew",
        ),
        setting(
            "inference_batch",
            "run smaller batches or inputs",
            "activation memory scales with the batch and input size",
        ),
    ]
}

/// Plain PyTorch inference: batch, inference mode, quantized weights.
fn inference() -> Vec<Remedy> {
    vec![
        setting(
            "inference_batch",
            "run smaller batches, shorter inputs or fewer new tokens (max_new_tokens)",
            "activations and the KV cache scale with batch × sequence length",
        ),
        setting(
            "inference_mode",
            "run under torch.inference_mode() (no autograd graph) and free outputs you do not keep",
            "without it every intermediate is kept for a backward pass that never comes",
        ),
        setting(
            "serving_quantization",
            "load 8-bit or 4-bit weights, or offload layers (device_map=\"auto\")",
            "weights shrink to 1/2–1/4 of bf16, or move to host memory",
        ),
    ]
}

/// A Rust program: streaming, validated sizes, fewer threads.
fn rust() -> Vec<Remedy> {
    vec![
        setting(
            "rust_stream",
            "process the input in chunks or as a stream (BufReader, iterators) instead of collecting it all (read_to_end, collect::<Vec<_>>)",
            "the whole input (or intermediate) lives in memory at once",
        ),
        setting(
            "rust_try_reserve",
            "validate sizes read from input before Vec::with_capacity, and use try_reserve to report a failed allocation instead of aborting",
            "a length from a file or the network can ask for any size",
        ),
        setting(
            "rust_threads",
            "run fewer worker threads (RAYON_NUM_THREADS) or give each a smaller buffer",
            "each thread holds its own buffers",
        ),
    ]
}

/// Remedies that only make sense for training (they change backward, gradients or data loading).
const TRAINING_ONLY: [&str; 5] = [
    "checkpointing",
    "micro_batch",
    "bf16_activations",
    "first_layers",
    "data_loader",
];

/// Ranks `remedies` for the workload: training (or unknown) keeps the verdict's order; any other
/// workload gets its own settings first, then the verdict's non-training remedies.
pub(crate) fn rank(
    w: Option<Workload>,
    (verdict, remedies): (Verdict, Vec<Remedy>),
) -> (Verdict, Vec<Remedy>) {
    let Some(w) = w.filter(|&w| w != Workload::Training) else {
        return (verdict, remedies);
    };
    if verdict.verdict == VerdictKind::NonFatal {
        return (verdict, remedies);
    }
    // A size no machine has is a bug to fix before any setting.
    let (first, rest): (Vec<Remedy>, Vec<Remedy>) =
        remedies.into_iter().partition(|r| r.id == "fix_size");
    let mut out = first;
    for r in settings(w, verdict.verdict) {
        if !out.iter().any(|o| o.id == r.id) {
            out.push(r);
        }
    }
    for r in rest {
        if !TRAINING_ONLY.contains(&r.id) && !out.iter().any(|o| o.id == r.id) {
            out.push(r);
        }
    }
    (verdict, out)
}

#[cfg(test)]
mod tests {
    use super::{infer, Workload};

    #[test]
    fn a_host_name_is_no_sign_and_wide_blanks_are_read_whole() {
        assert_eq!(
            infer(
                "[root@l-ai-training-server1.int.prod ProPainter]# python inference_propainter.py"
            ),
            Some(Workload::Inference)
        );
        // A blank of several bytes before the sign (U+2000) ends the token before it.
        assert_eq!(infer("x\u{2000}training"), Some(Workload::Training));
        assert_eq!(infer("a@b\u{2000}training"), Some(Workload::Training));
    }

    #[test]
    fn signs_of_each_workload() {
        let cases = [
            (
                "(EngineCore pid=229) ERROR 04-19 12:21:04 [core.py:1134] x",
                Workload::Vllm,
            ),
            (
                "ERROR 04-01 23:46:56 [engine.py:160] torch.OutOfMemoryError",
                Workload::Vllm,
            ),
            ("text_generation_launcher: Method Warmup", Workload::Tgi),
            (
                "ggml_backend_cuda_buffer_type_alloc_buffer: allocating",
                Workload::LlamaCpp,
            ),
            ("    loss.backward()\n", Workload::Training),
            ("thread 'main' panicked at src/main.rs:3:5", Workload::Rust),
            ("outputs = model.generate(**inputs)", Workload::Inference),
        ];
        for (text, w) in cases {
            assert_eq!(infer(text), Some(w), "{text}");
        }
        assert_eq!(infer("step 1 loss 2.3"), None);
    }
}
