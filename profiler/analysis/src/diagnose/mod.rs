//! OOM diagnosis: find every out-of-memory message in a log, extract the facts it states, and turn
//! them into a verdict with ranked remedies. Kinds and fact names follow `shared/oom-corpus`.
//!
//! [`find_ooms`] only parses (it never panics, whatever the input); [`diagnose`] adds the verdict.

mod accel;
mod cuda;
mod dataloader;
mod device;
pub mod device_oom;
mod facts;
mod families;
mod gpu;
mod host;
mod jobs;
mod libraries;
mod normalize;
pub mod postmortem;
mod remedy;
mod render;
mod scan;
mod size;
mod torch;
mod verdict;
mod vocab;
mod workload;

pub use device::total_from_log;
pub use facts::{Fact, Facts, GpuProcess};
pub use remedy::Remedy;
pub use render::render;
pub use verdict::{Context, Verdict, VerdictKind};
pub use workload::{infer as infer_workload, Workload};

use memsight_format::job_context::{JobContext, Language};

/// The kind of a failed host allocation memsight counted in a job (a post-mortem's finding): a
/// Rust program's, PyTorch's CPU allocator's in a job that uses PyTorch, else a plain host
/// allocation failure (a Python or C/C++ program).
pub fn host_failure_kind(job: &JobContext) -> Kind {
    match job.language {
        Some(Language::Rust) => Kind::RustAllocFailure,
        _ if job.torch => Kind::TorchCpuOom,
        _ => Kind::HostAllocFailure,
    }
}

use serde::{Deserialize, Serialize};

/// The family of an OOM message (the corpus's `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// PyTorch ≥ 2.1 CUDA/HIP caching-allocator message.
    TorchCudaOomNew,
    /// PyTorch ≤ 2.0 CUDA message (`Tried to allocate X (GPU N; …)`).
    TorchCudaOomOld,
    /// PyTorch `DefaultCPUAllocator` failure.
    TorchCpuOom,
    /// PyTorch Apple MPS backend.
    TorchMpsOom,
    /// Rust's `memory allocation of N bytes failed`.
    RustAllocFailure,
    /// A failed host allocation memsight counted in a job that is neither a Rust program nor
    /// known to use PyTorch (a Python or C/C++ program it was preloaded into): post-mortems only.
    HostAllocFailure,
    /// The Linux kernel's OOM killer (global or memory cgroup).
    LinuxOomKiller,
    /// A CUDA driver/runtime error (`CUDA error: out of memory`, `CUDA_ERROR_OUT_OF_MEMORY`).
    CudaDriverOom,
    /// candle / cudarc `DriverError(CUDA_ERROR_OUT_OF_MEMORY, …)`.
    CandleOrCudarcOom,
    /// JAX / XLA `RESOURCE_EXHAUSTED`.
    JaxXlaOom,
    /// TensorFlow `OOM when allocating tensor` and BFC allocator warnings.
    TensorflowOom,
    /// NCCL, Triton, ONNX Runtime and other runtimes.
    NcclOrOther,
    /// A process killed for memory as its scheduler, orchestrator or parent reports it (Slurm,
    /// Kubernetes, PyTorch's DataLoader, Ray, YARN, exit code 137 with its memory cause).
    OomKillReport,
    /// A GPU library's allocation-failure status (`CUBLAS_STATUS_ALLOC_FAILED`, …).
    LibraryAllocFailed,
    /// PyTorch's `cudaMallocAsync` backend (`Allocation on device N would exceed allowed memory`).
    TorchCudaOomAsync,
    /// vLLM's KV cache does not fit (`No available memory for the cache blocks`, `max seq len`).
    VllmKvCache,
    /// Any other text that reports running out of memory (the vocabulary reader's finding).
    GenericOom,
}

impl Kind {
    /// The corpus name, e.g. `torch_cuda_oom_new`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TorchCudaOomNew => "torch_cuda_oom_new",
            Kind::TorchCudaOomOld => "torch_cuda_oom_old",
            Kind::TorchCpuOom => "torch_cpu_oom",
            Kind::TorchMpsOom => "torch_mps_oom",
            Kind::RustAllocFailure => "rust_alloc_failure",
            Kind::HostAllocFailure => "host_alloc_failure",
            Kind::LinuxOomKiller => "linux_oom_killer",
            Kind::CudaDriverOom => "cuda_driver_oom",
            Kind::CandleOrCudarcOom => "candle_or_cudarc_oom",
            Kind::JaxXlaOom => "jax_xla_oom",
            Kind::TensorflowOom => "tensorflow_oom",
            Kind::NcclOrOther => "nccl_or_other",
            Kind::OomKillReport => "oom_kill_report",
            Kind::LibraryAllocFailed => "library_alloc_failed",
            Kind::TorchCudaOomAsync => "torch_cuda_oom_async",
            Kind::VllmKvCache => "vllm_kv_cache",
            Kind::GenericOom => "generic_oom",
        }
    }

    /// Whether a finding of this kind stands on its evidence alone: its message may state no fact
    /// (`No available memory for the cache blocks`, a bare `CUBLAS_STATUS_ALLOC_FAILED`,
    /// TensorFlow 0.x's `OOM when allocating tensor with shape` with nothing after it, Rust's abort
    /// quoted with its size elided, the kernel's `invoked oom-killer` header pasted without the
    /// rest of its report).
    pub(crate) fn evidence_suffices(self) -> bool {
        matches!(
            self,
            Kind::OomKillReport
                | Kind::TensorflowOom
                | Kind::TorchCpuOom
                | Kind::JaxXlaOom
                | Kind::LibraryAllocFailed
                | Kind::TorchCudaOomAsync
                | Kind::VllmKvCache
                | Kind::GenericOom
                | Kind::RustAllocFailure
                | Kind::LinuxOomKiller
        )
    }
}

/// One OOM message found in a text, with the facts it states.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// What kind of message it is.
    pub kind: Kind,
    /// The facts the text states, in the corpus's field names and units (bytes).
    pub facts: Facts,
    /// 1-based line of the text where the message starts.
    pub line: usize,
}

/// A finding with its verdict and ranked remedies.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    /// The kind of message.
    pub kind: Kind,
    /// The facts it states.
    pub facts: Facts,
    /// 1-based line where it starts.
    pub line: usize,
    /// The verdict, with the numbers behind it (`verdict` and `evidence` in JSON).
    #[serde(flatten)]
    pub verdict: Verdict,
    /// What to do, best first.
    pub remedies: Vec<Remedy>,
    /// The kind of job the remedies are ranked for, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<Workload>,
}

/// Every OOM message in `text`, in order. Linear in the text's length.
pub fn find_ooms(text: &str) -> Vec<Finding> {
    scan::scan(text).into_iter().map(|f| f.finding).collect()
}

/// Every OOM message in `text`, each judged. What `ctx` leaves unset — the workload and the
/// device's size — is inferred from the whole text.
pub fn diagnose(text: &str, ctx: &Context) -> Vec<Diagnosis> {
    let found = scan::scan(text);
    if found.is_empty() {
        return Vec::new();
    }
    let ctx = Context {
        workload: ctx.workload.or_else(|| workload::infer(text)),
        device_total: ctx.device_total.or_else(|| device::total_from_log(text)),
        ..ctx.clone()
    };
    found
        .into_iter()
        .map(|f| judge_found(f.finding, &ctx, f.notes))
        .collect()
}

/// Judges one finding (also used for live OOM events, which arrive as findings).
pub fn judge(f: Finding, ctx: &Context) -> Diagnosis {
    judge_found(f, ctx, scan::Notes::default())
}

fn judge_found(f: Finding, ctx: &Context, notes: scan::Notes) -> Diagnosis {
    let (verdict, remedies) = verdict::judge(f.kind, &f.facts, ctx, notes);
    let workload = workload::of(f.kind, ctx.workload());
    Diagnosis {
        kind: f.kind,
        facts: f.facts,
        line: f.line,
        verdict,
        remedies,
        workload,
    }
}
