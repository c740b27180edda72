//! The verdict engine: from a finding's facts (and, when known, the job's leak slope) to one
//! verdict with the numbers behind it, and remedies ranked for that verdict.

use super::facts::{Fact, Facts};
use super::remedy::{self, Remedy};
use super::scan::Notes;
use super::workload::{self, Workload};
use super::{dataloader, families, gpu, Kind};
use memsight_format::job_context::JobContext;
use memsight_format::report::leak::LeakEstimate;
use memsight_format::units::fmt_bytes;
use memsight_format::wire::ring::FailedAddressSpace;
use serde::{Deserialize, Serialize};

/// What caused the OOM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Reserved-but-unallocated memory would have covered the request; free memory would not.
    Fragmentation,
    /// Other processes hold the memory the job needed.
    Contention,
    /// The job's own allocations fill the device.
    Capacity,
    /// The kernel or a cgroup killed the process, or host allocation failed.
    HostOom,
    /// Live memory grows per step (from a report's timeline).
    Leak,
    /// One request is larger than the whole device: no setting will help.
    RequestExceedsDevice,
    /// One host request is larger than all the memory the job could have (the machine's memory
    /// and swap, or its memory cgroup's limit): it can never fit there, whatever else is freed.
    RequestExceedsMemory,
    /// The device had enough free memory; a cap on the process refused the request.
    AllocatorLimit,
    /// The message states too little to tell.
    Undetermined,
    /// The runtime says this is not a failure: it retried or took another path.
    NonFatal,
}

/// A verdict and the numbers that support it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// The verdict.
    pub verdict: VerdictKind,
    /// One sentence with the supporting numbers.
    pub evidence: String,
}

/// What is known besides the message.
#[derive(Clone, Debug, Default)]
pub struct Context {
    /// The PyTorch allocator configuration in effect (`PYTORCH_CUDA_ALLOC_CONF`).
    pub alloc_conf: Option<String>,
    /// The job's per-step live-memory slope, from its report.
    pub leak: Option<LeakEstimate>,
    /// What the job is (inference server, training, Rust binary); inferred from the log when unset.
    pub workload: Option<Workload>,
    /// The device's memory when the log states it outside the message (a GPU model, a runtime's
    /// device listing); inferred from the log when unset.
    pub device_total: Option<u128>,
    /// What the report tells of the job (language, PyTorch, workers, memory): remedies that do
    /// not fit it are left out, and a host request larger than its memory is judged so.
    pub job: Option<JobContext>,
}

impl Context {
    /// A context from this process's environment (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`).
    pub fn from_env() -> Self {
        Context {
            alloc_conf: std::env::var("PYTORCH_CUDA_ALLOC_CONF")
                .or_else(|_| std::env::var("PYTORCH_ALLOC_CONF"))
                .ok(),
            ..Context::default()
        }
    }

    /// The workload: the one given, else the one the job's report shows.
    pub(crate) fn workload(&self) -> Option<Workload> {
        self.workload
            .or_else(|| self.job.as_ref().and_then(workload::of_job))
    }

    /// The leak slope when it is a confident, positive trend.
    fn leaking(&self) -> Option<f64> {
        self.leak
            .as_ref()
            .filter(|l| l.slope_bytes_per_step > 0.0 && l.confidence >= LEAK_CONFIDENCE)
            .map(|l| l.slope_bytes_per_step)
    }
}

/// Agreement of pairwise slopes above which growth counts as a leak.
const LEAK_CONFIDENCE: f64 = 0.8;
/// Requests at least this large (256 TiB) are not real tensors but broken size computations.
pub(crate) const IMPLAUSIBLE: u128 = 1 << 48;
/// No common single accelerator holds more than this (192 GiB: MI300X, B200): a larger request
/// fits on no device a job is likely to have.
pub(crate) const LARGEST_DEVICE: u128 = 192 << 30;

/// Bytes for people (values past u64 print as the largest u64).
pub(crate) fn b(v: u128) -> String {
    fmt_bytes(u64::try_from(v).unwrap_or(u64::MAX))
}

/// A verdict with its evidence.
pub(crate) fn v(verdict: VerdictKind, evidence: String) -> Verdict {
    Verdict { verdict, evidence }
}

/// Judges one finding, with what the text says about it beyond its facts.
pub(crate) fn judge(kind: Kind, f: &Facts, ctx: &Context, notes: Notes) -> (Verdict, Vec<Remedy>) {
    let (verdict, remedies) = judge_kind(kind, f, ctx, notes);
    (verdict, workload::fit_job(ctx.job.as_ref(), remedies))
}

fn judge_kind(kind: Kind, f: &Facts, ctx: &Context, notes: Notes) -> (Verdict, Vec<Remedy>) {
    let workload = workload::of(kind, ctx.workload());
    if notes.non_fatal {
        return workload::rank(workload, self::non_fatal(kind, f));
    }
    if notes.exabyte {
        return workload::rank(
            workload,
            (
                v(
                    VerdictKind::RequestExceedsDevice,
                    "the request was more than 1 EB, too large to print: not a real tensor".into(),
                ),
                vec![remedy::shrink_request(1 << 60, None, true)],
            ),
        );
    }
    let family = families::pinned_host(f, notes)
        .or_else(|| families::held_elsewhere(kind, f, notes))
        .or_else(|| families::size_cap(f, notes))
        .or_else(|| families::time_sliced(kind, f, notes))
        .or_else(|| families::judge(kind, f, notes));
    let (verdict, mut remedies) = match family {
        Some(judged) => judged,
        None => match kind {
            Kind::TorchCudaOomNew | Kind::TorchCudaOomOld => gpu::judge(f, ctx),
            Kind::TorchCpuOom | Kind::RustAllocFailure | Kind::HostAllocFailure => {
                host_request(kind, f, ctx.job.as_ref())
            }
            Kind::LinuxOomKiller => killed(f, ctx.job.as_ref()),
            Kind::TorchMpsOom => mps(f),
            _ => other(kind, f, ctx),
        },
    };
    if notes.time_sliced
        && verdict.verdict != VerdictKind::HostOom
        && remedies.first().is_none_or(|r| r.id != "gpu_sharing")
    {
        remedies.insert(0, families::gpu_sharing());
    }
    // vLLM's KV-cache errors carry their own engine settings (raise the utilization, shorten the
    // context): the vLLM ranking for CUDA out-of-memory errors would lower it.
    let (verdict, remedies) = if kind == Kind::VllmKvCache {
        (verdict, remedies)
    } else {
        workload::rank(workload, (verdict, remedies))
    };
    // A job that grows runs into whatever holds it: the machine, the device, or an address-space
    // limit (the limit stays named in the evidence); the growth is what to fix first.
    let grew_into = matches!(
        verdict.verdict,
        VerdictKind::Capacity | VerdictKind::HostOom | VerdictKind::Undetermined
    ) || (verdict.verdict == VerdictKind::AllocatorLimit
        && address_space(f).is_some());
    match ctx.leaking() {
        Some(slope) if grew_into => {
            let lead = remedy::find_leak(slope);
            let mut rs = vec![lead];
            rs.extend(remedies);
            (
                v(
                    VerdictKind::Leak,
                    format!(
                        "live memory grew by {} per step (confidence {:.2}) until it ran out; {}",
                        fmt_bytes(slope as u64),
                        ctx.leak.as_ref().map_or(0.0, |l| l.confidence),
                        verdict.evidence
                    ),
                ),
                rs,
            )
        }
        _ => (verdict, remedies),
    }
}

fn host_request(kind: Kind, f: &Facts, job: Option<&JobContext>) -> (Verdict, Vec<Remedy>) {
    let torch = (kind == Kind::TorchCpuOom && job.is_some()) || job.is_some_and(|j| j.torch);
    let Some(r) = f.bytes("requested_bytes") else {
        return (
            v(VerdictKind::HostOom, "a host allocation failed".into()),
            vec![remedy::profile_host(), remedy::data_loader()],
        );
    };
    if r >= IMPLAUSIBLE {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("a single host allocation of {r} bytes ({}) was requested; no machine has that much", b(r)),
            ),
            vec![remedy::shrink_request(r, None, true)],
        );
    }
    // More than the job could ever have: no amount of freeing serves it.
    if let Some(cap) = job
        .and_then(JobContext::capacity_bytes)
        .map(u128::from)
        .filter(|&c| r > c)
    {
        let of = match job.and_then(|j| j.limit_bytes).map(u128::from) {
            Some(l) if l == cap => format!("the memory cgroup's limit ({})", b(l)),
            _ => format!("this machine's memory ({})", b(cap)),
        };
        let mut rs = vec![remedy::check_size(r, cap)];
        rs.push(if torch {
            remedy::torch_chunk()
        } else {
            remedy::shrink_request(r, Some(cap), false)
        });
        return (
            v(
                VerdictKind::RequestExceedsMemory,
                format!("a single {} host allocation failed: it is larger than {of}, a request that can never fit, whatever else is freed", b(r)),
            ),
            rs,
        );
    }
    // The process's address-space limit, not the machine's memory, refused it (a post-mortem
    // reads the limit and the virtual size the process had then).
    if let Some(space) =
        address_space(f).filter(|s| s.refuses(u64::try_from(r).unwrap_or(u64::MAX)))
    {
        let mapped = space.virtual_bytes.map_or(String::new(), |v| {
            format!(" with {} already mapped", b(u128::from(v)))
        });
        let mut rs = vec![
            remedy::address_space_limit(u128::from(space.limit_bytes)),
            remedy::virtual_size(),
        ];
        if torch {
            rs.push(remedy::torch_host_memory());
        }
        return (
            v(
                VerdictKind::AllocatorLimit,
                format!(
                    "a {} host allocation failed under the process's address-space limit (RLIMIT_AS, `ulimit -v`) of {}{mapped}: the limit refused it, not the machine's memory",
                    b(r),
                    b(u128::from(space.limit_bytes))
                ),
            ),
            rs,
        );
    }
    let mut rs = Vec::new();
    if torch {
        rs.push(remedy::torch_host_memory());
    }
    rs.extend([
        remedy::data_loader(),
        remedy::profile_host(),
        remedy::memory_limit(None, None),
        remedy::first_layers(),
    ]);
    (
        v(
            VerdictKind::HostOom,
            format!("a {} host allocation failed: the process reached the machine's or its limit's memory", b(r)),
        ),
        rs,
    )
}

/// The address-space limit a failed host allocation met, from its facts
/// (`address_space_limit_bytes`, `virtual_bytes`: a post-mortem's).
fn address_space(f: &Facts) -> Option<FailedAddressSpace> {
    let limit = u64::try_from(f.bytes("address_space_limit_bytes")?).ok()?;
    Some(FailedAddressSpace {
        limit_bytes: limit,
        virtual_bytes: f.bytes("virtual_bytes").and_then(|v| u64::try_from(v).ok()),
    })
}

/// The training remedies for a job whose own allocations fill the device.
pub(crate) fn capacity_remedies(shortfall: Option<u128>) -> Vec<Remedy> {
    vec![
        remedy::checkpointing(shortfall),
        remedy::micro_batch(shortfall),
        remedy::bf16_activations(),
        remedy::efficient_attention(),
        remedy::logits_to_keep(),
        remedy::quantized_weights(),
        remedy::first_layers(),
    ]
}

/// Where the kernel's kill happened: a memory cgroup, the whole machine, or not said.
fn kill_scope(f: &Facts) -> Option<bool> {
    let memcg = f.str("scope") == Some("memcg")
        || f.str("constraint") == Some("CONSTRAINT_MEMCG")
        || f.get("oom_memcg").is_some() && f.get("global_oom").is_none()
        || f.bytes("memory_limit_bytes").is_some();
    let global = f.str("scope") == Some("global")
        || f.str("constraint") == Some("CONSTRAINT_NONE")
        || f.get("global_oom").is_some();
    match (memcg, global) {
        (true, _) => Some(true),
        (false, true) => Some(false),
        _ => None,
    }
}

fn killed(f: &Facts, job: Option<&JobContext>) -> (Verdict, Vec<Remedy>) {
    let who = f
        .str("process_name")
        .or_else(|| f.str("selected_process_name"))
        .unwrap_or("a process");
    let rss = f.bytes("anon_rss_bytes").map_or(String::new(), |a| {
        format!(" holding {} anonymous memory", b(a))
    });
    // The kernel may select one process and kill its child: one event, named once.
    let selected = match (f.bytes("selected_pid"), f.bytes("pid")) {
        (Some(s), Some(p)) if s != p => format!(
            " (it selected {} {s} and killed its child {p})",
            f.str("selected_process_name").unwrap_or("process")
        ),
        _ => String::new(),
    };
    let limit = f.bytes("memory_limit_bytes");
    // A post-mortem names the killed process's role (`worker`, `rank 1`).
    let who = match f.str("role") {
        Some(role) => format!("{who}, the job's {role}"),
        None => who.to_string(),
    };
    let evidence = match kill_scope(f) {
        Some(true) => {
            let l = limit.map_or(String::new(), |l| format!(" (limit {})", b(l)));
            format!("the memory cgroup{l} hit its limit and the kernel killed {who}{rss}{selected}; the machine itself may have had memory free")
        }
        Some(false) => format!(
            "the machine ran out of memory and the kernel killed {who}{rss}{selected}"
        ),
        None => format!(
            "the kernel's OOM killer killed {who}{rss}{selected}; the line does not say whether the machine or a memory cgroup (container limit) ran out"
        ),
    };
    let usage = f.bytes("memory_usage_bytes");
    if dataloader::is_worker(f) {
        return (
            v(VerdictKind::HostOom, evidence),
            dataloader::worker_remedies(limit, usage),
        );
    }
    let mut rs = vec![remedy::data_loader(), remedy::memory_limit(limit, usage)];
    if job.is_some_and(|j| j.torch) {
        rs.push(remedy::torch_host_memory());
    }
    rs.push(remedy::profile_host());
    (v(VerdictKind::HostOom, evidence), rs)
}

/// A warning the runtime recovered from.
fn non_fatal(kind: Kind, f: &Facts) -> (Verdict, Vec<Remedy>) {
    let what = match (f.bytes("requested_bytes"), f.bytes("required_bytes")) {
        (Some(r), _) => format!("the {} allocation failed", b(r)),
        (None, Some(r)) => format!(
            "a kernel configuration needing {r} bytes of {} was rejected",
            f.str("resource").unwrap_or("a resource")
        ),
        _ => "an allocation failed".to_string(),
    };
    let how = match kind {
        Kind::TensorflowOom => {
            "TensorFlow says this is not a failure: it retries or takes a slower path"
        }
        Kind::GenericOom => "the program caught it and goes on with a smaller batch",
        _ => "the autotuner skips this configuration and uses another",
    };
    (
        v(VerdictKind::NonFatal, format!("{what}, but {how}; the job goes on")),
        vec![remedy::framework(
            "none_needed",
            "nothing to fix for this line; act only if the job later fails or runs slower than expected",
            "non-fatal: the runtime recovered from it",
        )],
    )
}

/// Bytes of one element of a TensorFlow dtype.
fn dtype_bytes(dtype: &str) -> Option<u128> {
    Some(match dtype {
        "bool" | "int8" | "uint8" | "qint8" | "quint8" => 1,
        "half" | "bfloat16" | "int16" | "uint16" | "float16" => 2,
        "float" | "int32" | "uint32" | "float32" | "qint32" => 4,
        "double" | "int64" | "uint64" | "float64" | "complex64" => 8,
        "complex128" => 16,
        _ => return None,
    })
}

/// The size a TensorFlow `OOM when allocating tensor with shape[…] and type …` states.
fn tensor_bytes(f: &Facts) -> Option<u128> {
    let Some(Fact::Ints(dims)) = f.get("shape") else {
        return None;
    };
    let mut n = dtype_bytes(f.str("dtype")?)?;
    for &d in dims {
        n = n.checked_mul(u128::try_from(d).ok()?)?;
    }
    Some(n)
}

fn mps(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let r = f.bytes("requested_bytes").unwrap_or(0);
    let max = f.bytes("max_allowed_bytes");
    let used = f.bytes("mps_allocated_bytes").unwrap_or(0)
        + f.bytes("other_allocations_bytes").unwrap_or(0);
    let watermark = remedy::framework(
        "mps_watermark",
        "raise PYTORCH_MPS_HIGH_WATERMARK_RATIO with care (0.0 removes the cap and may freeze the machine)",
        "the MPS allocator caps the process below unified memory",
    );
    if let Some(m) = max.filter(|&m| r > m) {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("the {} request exceeds the {} MPS cap", b(r), b(m)),
            ),
            vec![
                remedy::shrink_request(r, Some(m), r >= IMPLAUSIBLE),
                watermark,
            ],
        );
    }
    let mut rs = capacity_remedies(None);
    rs.insert(0, watermark);
    (
        v(
            VerdictKind::Capacity,
            format!(
                "{} in use (MPS and other allocations) plus the {} request passes the {} cap",
                b(used),
                b(r),
                max.map_or("unknown".into(), b)
            ),
        ),
        rs,
    )
}

fn other(kind: Kind, f: &Facts, ctx: &Context) -> (Verdict, Vec<Remedy>) {
    let shaped = tensor_bytes(f);
    let r = f.bytes("requested_bytes").or(shaped);
    if let Some(r) = r.filter(|&r| r >= IMPLAUSIBLE) {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("a single request of {r} bytes is not a real buffer"),
            ),
            vec![remedy::shrink_request(r, None, true)],
        );
    }
    // A request larger than the device the message or the log names (XLA's `Allocation (size=R)
    // would exceed memory (size=T)`), or than any device at all.
    let known = f.bytes("total_bytes").or(ctx.device_total);
    let device = known.unwrap_or(LARGEST_DEVICE);
    if let Some(r) = r.filter(|&r| r > device) {
        let of = match known {
            Some(t) => format!("the whole device ({})", b(t)),
            None => format!("any single accelerator ({})", b(LARGEST_DEVICE)),
        };
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("the {} request is larger than {of}: a wrong size or shape, or an operation that must be split", b(r)),
            ),
            vec![
                remedy::shrink_request(r, known, false),
                remedy::efficient_attention(),
                remedy::micro_batch(None),
            ],
        );
    }
    if let (Some(need), Some(limit)) = (f.bytes("required_bytes"), f.bytes("hardware_limit_bytes"))
    {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!(
                    "the kernel needs {need} bytes of {} but the hardware has {limit}",
                    f.str("resource").unwrap_or("the resource")
                ),
            ),
            vec![remedy::framework(
                "kernel_config",
                "reduce the kernel's block sizes or num_stages (or pick a config for this GPU)",
                "per-block resources scale with block size × pipeline stages",
            )],
        );
    }
    let size = match (r, shaped) {
        (Some(r), Some(_)) => format!(
            "a {} tensor (its shape × {} bytes)",
            b(r),
            f.str("dtype").map_or(0, |d| dtype_bytes(d).unwrap_or(0))
        ),
        (Some(r), None) => format!("a {} allocation", b(r)),
        _ => "an allocation".to_string(),
    };
    // TensorFlow's CPU allocator (`…/device:CPU:0 by allocator cpu`) failed in host memory.
    if kind == Kind::TensorflowOom
        && (f
            .str("allocator")
            .is_some_and(|a| a.eq_ignore_ascii_case("cpu"))
            || f.str("device").is_some_and(|d| d.contains("device:CPU")))
    {
        return (
            v(
                VerdictKind::HostOom,
                format!("TensorFlow's CPU allocator could not get {size}: host memory (the machine's or its container's) was the limit"),
            ),
            vec![remedy::profile_host(), remedy::data_loader()],
        );
    }
    let (verdict, evidence) = match kind {
        Kind::JaxXlaOom if r.is_none() && f.bytes("used_bytes").is_some() => (
            VerdictKind::Capacity,
            format!(
                "the compiled program needs {} of {} {} memory: it does not fit the device",
                b(f.bytes("used_bytes").unwrap_or(0)),
                f.bytes("total_bytes").map_or("the".into(), b),
                f.str("memory_space").unwrap_or("device")
            ),
        ),
        // XLA states only what the device has, with usage past it (TPU's `Hbm usage …, exceeding
        // available bytes: 95.74G`): the program does not fit.
        Kind::JaxXlaOom if r.is_none() && f.bytes("total_bytes").is_some() => (
            VerdictKind::Capacity,
            format!(
                "the compiled program needs more than the {} the device has: it does not fit",
                b(f.bytes("total_bytes").unwrap_or(0))
            ),
        ),
        Kind::JaxXlaOom if r.is_none() => (
            VerdictKind::Undetermined,
            "XLA says the device ran out but states no sizes".to_string(),
        ),
        Kind::JaxXlaOom => match (f.bytes("total_fragmentation_bytes"), r) {
            (Some(fr), Some(r)) if fr >= r => (
                VerdictKind::Fragmentation,
                format!(
                    "XLA reports {} fragmented, more than the {} request",
                    b(fr),
                    b(r)
                ),
            ),
            // More was free than the request, yet it could not be placed: the free memory is not
            // in one piece (PyTorch/XLA's `There are 6.78G free, 0B reserved, and 3.33G
            // reservable` for a 6.48G reservation).
            (_, Some(r)) if f.bytes("free_bytes").is_some_and(|free| free >= r) => (
                VerdictKind::Fragmentation,
                format!(
                    "XLA had {} free, more than the {} request, but not in one piece it could place it in",
                    b(f.bytes("free_bytes").unwrap_or(0)),
                    b(r)
                ),
            ),
            _ => (
                VerdictKind::Capacity,
                format!("XLA could not place {size} on the device"),
            ),
        },
        Kind::NcclOrOther if f.str("subsystem") == Some("nccl") => (
            VerdictKind::Capacity,
            format!("NCCL could not get {size} of device memory for its buffers"),
        ),
        _ if r.is_some() => (
            VerdictKind::Capacity,
            format!("the device could not serve {size}"),
        ),
        _ => (
            VerdictKind::Undetermined,
            "the message says the device ran out but states no sizes".to_string(),
        ),
    };
    let mut rs = match kind {
        Kind::JaxXlaOom => vec![remedy::framework(
            "xla_preallocation",
            "set XLA_PYTHON_CLIENT_PREALLOCATE=false or lower XLA_PYTHON_CLIENT_MEM_FRACTION when several processes share the GPU; use jax.checkpoint (remat) on large blocks",
            "JAX preallocates 75% of the device by default",
        )],
        Kind::TensorflowOom => vec![remedy::framework(
            "tf_memory_growth",
            "enable tf.config.experimental.set_memory_growth and reduce the batch",
            "TensorFlow's BFC allocator grabs most of the device up front",
        )],
        Kind::NcclOrOther if f.str("subsystem") == Some("nccl") => vec![remedy::framework(
            "nccl_buffers",
            "leave device memory for NCCL (its buffers are allocated after the model) or lower NCCL_BUFFSIZE",
            "communicators need their buffers on every GPU",
        )],
        _ => vec![remedy::profile_host()],
    };
    if verdict != VerdictKind::Undetermined || kind != Kind::NcclOrOther {
        rs.extend(capacity_remedies(None).into_iter().take(3));
    }
    (v(verdict, evidence), rs)
}
