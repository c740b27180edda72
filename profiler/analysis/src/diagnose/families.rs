//! Verdicts and remedies for the families issue 39 added: kills reported by schedulers and
//! orchestrators, GPU libraries' allocation-failure statuses, PyTorch's `cudaMallocAsync` backend,
//! vLLM's KV cache, the vocabulary reader's generic findings, and failures whose only cause is
//! memory held elsewhere (a CUDA context being created, vLLM waking from sleep, a time-sliced GPU).

use super::dataloader;
use super::facts::Facts;
use super::remedy::{self, Remedy};
use super::scan::Notes;
use super::verdict::{b, capacity_remedies, v, Verdict, VerdictKind, IMPLAUSIBLE};
use super::Kind;

/// How much beyond a request the free memory must hold before the async backend could have served
/// it: `cudaMallocAsync` grows its pool in chunks of up to 32 MiB.
const POOL_GRANULE: u128 = 32 << 20;
/// A CUDA context's own device memory, never PyTorch's.
const CONTEXT: u128 = 512 << 20;

/// The verdict for a finding of the issue-39 families, or `None` for other kinds.
pub(crate) fn judge(kind: Kind, f: &Facts, notes: Notes) -> Option<(Verdict, Vec<Remedy>)> {
    Some(match kind {
        Kind::OomKillReport => killed(f),
        Kind::LibraryAllocFailed => library(f),
        Kind::TorchCudaOomAsync => cuda_async(f),
        Kind::VllmKvCache => kv_cache(f),
        Kind::GenericOom => generic(f, notes),
        _ => return None,
    })
}

/// A device failure with no sizes that happened where only memory held by others can explain it.
pub(crate) fn held_elsewhere(
    kind: Kind,
    f: &Facts,
    notes: Notes,
) -> Option<(Verdict, Vec<Remedy>)> {
    let sized = f.bytes("requested_bytes").is_some() || f.bytes("free_bytes").is_some();
    if !notes.held_elsewhere || sized || kind == Kind::OomKillReport {
        return None;
    }
    Some((
        v(
            VerdictKind::Contention,
            "the device ran out while the process was creating its CUDA context or re-mapping memory it had released (vLLM waking from sleep): it held no device memory of its own at that moment, so memory held by other processes is the only cause".into(),
        ),
        vec![
            remedy::concurrency_plan(0, f.bytes("device_index").and_then(|d| i128::try_from(d).ok())),
            remedy::framework(
                "free_other_processes",
                "free the GPU first: stop the processes nvidia-smi lists on it (a colocated trainer must release its memory before vLLM wakes), or pin this job to an idle GPU with CUDA_VISIBLE_DEVICES",
                "the failing process had allocated nothing yet",
            ),
        ],
    ))
}

/// A PyTorch CUDA message on a GPU time-sliced between pods: memory beyond this process's
/// reservation and a context is other pods', not a guess, so it is contention when it covers the
/// shortfall (and is at least 5% of the device).
pub(crate) fn time_sliced(kind: Kind, f: &Facts, notes: Notes) -> Option<(Verdict, Vec<Remedy>)> {
    if !notes.time_sliced || !matches!(kind, Kind::TorchCudaOomNew | Kind::TorchCudaOomOld) {
        return None;
    }
    let (r, t, free) = (
        f.bytes("requested_bytes")?,
        f.bytes("total_bytes")?,
        f.bytes("free_bytes")?,
    );
    let own = f
        .bytes("this_process_bytes")
        .or_else(|| f.bytes("reserved_total_bytes"))
        .or_else(|| {
            Some(f.bytes("allocated_by_torch_bytes")? + f.bytes("reserved_unallocated_bytes")?)
        })?;
    let others = t.saturating_sub(free + own + CONTEXT);
    let shortfall = r.saturating_sub(free);
    if others < t / 20 || others < shortfall {
        return None;
    }
    Some((
        v(
            VerdictKind::Contention,
            format!("the GPU is time-sliced between pods: {} of its {} is held outside this process ({} reserved here, {} free), more than the {} missing", b(others), b(t), b(own), b(free), b(shortfall)),
        ),
        vec![
            gpu_sharing(),
            remedy::concurrency_plan(others, f.bytes("device_index").and_then(|d| i128::try_from(d).ok())),
        ],
    ))
}

/// A request above a per-allocation cap the runtime states: no amount of free memory helps.
pub(crate) fn size_cap(f: &Facts, notes: Notes) -> Option<(Verdict, Vec<Remedy>)> {
    if !notes.size_cap {
        return None;
    }
    let r = f.bytes("requested_bytes")?;
    Some((
        v(
            VerdictKind::AllocatorLimit,
            format!("the runtime caps a single allocation below the {} requested: the device's free memory does not matter", b(r)),
        ),
        vec![
            remedy::shrink_request(r, None, false),
            remedy::framework(
                "allocation_cap",
                "split the tensor below the cap, or lift the cap where the runtime allows it (Intel GPUs: UR_L0_USE_RELAXED_ALLOCATION_LIMITS=1 / IPEX_XPU_ALLOC_LIMIT)",
                "the runtime refuses any single allocation above its maximum size",
            ),
        ],
    ))
}

/// The driver could not allocate pinned (page-locked) host memory: the host ran out.
pub(crate) fn pinned_host(f: &Facts, notes: Notes) -> Option<(Verdict, Vec<Remedy>)> {
    if !notes.host {
        return None;
    }
    let what = f
        .bytes("requested_bytes")
        .map_or("pinned host memory".into(), |r| {
            format!("{} of pinned host memory", b(r))
        });
    Some((
        v(
            VerdictKind::HostOom,
            format!("the driver could not allocate {what}: page-locked memory comes from the host's RAM (or its container's limit), not the device"),
        ),
        vec![
            remedy::data_loader(),
            remedy::memory_limit(None, None),
            remedy::profile_host(),
        ],
    ))
}

/// Remedies to put first on a time-sliced (shared) GPU.
pub(crate) fn gpu_sharing() -> Remedy {
    remedy::framework(
        "gpu_sharing",
        "time-sliced GPUs share one device's memory between pods with no per-pod limit: give the pod a whole GPU or a MIG slice, or cap each process (torch.cuda.set_per_process_memory_fraction, vLLM --gpu-memory-utilization) so their sum fits",
        "the log shows the GPU is time-sliced between several pods",
    )
}

fn killed(f: &Facts) -> (Verdict, Vec<Remedy>) {
    if f.str("reporter") == Some("dataloader") {
        return dataloader::judge(f);
    }
    let limit = f.bytes("memory_limit_bytes");
    let used = f.bytes("memory_used_bytes");
    let (evidence, first) = match f.str("reporter") {
        Some("slurm") => (
            match f.bytes("oom_kill_events") {
                Some(n) => format!(
                    "Slurm's cgroup for step {} recorded {n} OOM kill(s): the job's processes exceeded the memory the job requested (the node itself may have had memory free)",
                    f.str("step_id").unwrap_or("?"),
                ),
                None => format!(
                    "Slurm killed the job for exceeding the memory it requested{}; the node itself may have had memory free",
                    match (used, limit) {
                        (Some(u), Some(l)) => format!(" ({} used, {} requested)", b(u), b(l)),
                        _ => String::new(),
                    }
                ),
            },
            remedy::framework(
                "slurm_mem",
                "request more memory for the job (#SBATCH --mem=… or --mem-per-cpu=…) or run fewer tasks per node; `sacct -j JOB -o MaxRSS,ReqMem` shows what it used",
                "Slurm's cgroup limit is the job's memory request, not the node's memory",
            ),
        ),
        Some("kubernetes") if f.str("reason") == Some("Evicted") => (
            format!(
                "the kubelet evicted the pod because the node ran low on memory{}: pods that use more than they request are evicted first",
                match (used, f.bytes("memory_request_bytes")) {
                    (Some(u), Some(r)) => format!(" (the container used {}, above its request of {})", b(u), b(r)),
                    _ => String::new(),
                }
            ),
            remedy::framework(
                "k8s_memory_limit",
                "set the container's resources.requests.memory to what it really uses (and limits.memory to the same value), so the scheduler reserves that memory on the node",
                "a pod using more than its request is the first evicted when the node runs short",
            ),
        ),
        Some("kubernetes") => {
            let lim = limit.map_or(String::new(), |l| format!(" of {}", b(l)));
            let exit = f
                .bytes("exit_code")
                .map_or(String::new(), |c| format!(", exit code {c}"));
            (
                format!("the container exceeded its memory limit{lim} and the kernel killed it (OOMKilled{exit}); the node may have had memory free"),
                remedy::framework(
                    "k8s_memory_limit",
                    "raise the container's resources.limits.memory, and set resources.requests.memory to the same value so the scheduler places the pod where that memory exists",
                    &match (f.bytes("memory_request_bytes"), limit) {
                        (Some(r), Some(l)) if r < l => format!("the request ({}) is below the limit ({}): the node may be overcommitted", b(r), b(l)),
                        (_, Some(l)) => format!("the pod's limit is {}", b(l)),
                        _ => "Kubernetes kills a container at its memory limit".into(),
                    },
                ),
            )
        }
        Some("ray") => (
            match (f.bytes("node_memory_used_bytes"), f.bytes("node_memory_total_bytes")) {
                (Some(u), Some(t)) => format!("Ray's memory monitor killed the task: the node used {} of {}, above its threshold", b(u), b(t)),
                _ => "Ray's memory monitor killed a task because the node ran low on memory".into(),
            },
            remedy::framework(
                "ray_memory",
                "give each task more memory (memory=… or more num_cpus per task so fewer run at once), or add nodes; raise RAY_memory_usage_threshold only with real headroom",
                "Ray kills the most recently scheduled task when the node passes its memory threshold",
            ),
        ),
        Some(launcher @ ("torchrun" | "deepspeed")) => (
            format!(
                "{} reports that a rank{} ended by signal 9 (SIGKILL): on Linux that is almost always the kernel's or the container's OOM killer, because host memory ran out (loading or offloading weights, data-loader workers, pinned buffers); confirm with `dmesg -T | grep -i -E 'out of memory|killed process'`",
                if launcher == "torchrun" { "torchrun's elastic agent" } else { "DeepSpeed's launcher" },
                f.bytes("pid").map_or(String::new(), |p| format!(" (pid {p})")),
            ),
            remedy::memory_limit(limit, used),
        ),
        Some("yarn") => (
            format!(
                "YARN killed the container: {} of {} {} memory used",
                used.map_or("?".into(), b),
                limit.map_or("?".into(), b),
                f.str("memory_kind").unwrap_or("")
            ),
            remedy::framework(
                "yarn_memory",
                "raise the container's memory (spark.executor.memory plus spark.executor.memoryOverhead), or process smaller partitions",
                "YARN kills a container that passes its memory allocation",
            ),
        ),
        _ => (
            "the process was killed for memory (exit code 137 is SIGKILL, here stated with its memory cause): the kernel's or the container's OOM killer; the message does not say which limit".into(),
            remedy::memory_limit(limit, used),
        ),
    };
    let rs = vec![first, remedy::data_loader(), remedy::profile_host()];
    (v(VerdictKind::HostOom, evidence), rs)
}

fn library(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let call = f
        .str("failed_call")
        .map_or(String::new(), |c| format!(" in {c}"));
    let lib = f.str("library").unwrap_or("a GPU library");
    let mut rs = vec![remedy::framework(
        "library_workspace",
        "leave device memory for the library's handles and workspaces: lower the batch or sequence length; in TensorFlow enable memory growth so the framework does not take the whole device; in PyTorch set torch.backends.cudnn.benchmark=False (cuDNN autotuning allocates large workspaces)",
        "cuBLAS and cuDNN allocate their workspaces outside the framework's cache, after it has filled the device",
    )];
    rs.extend(capacity_remedies(None).into_iter().take(3));
    (
        v(
            VerdictKind::Capacity,
            format!(
                "{lib} could not allocate device memory ({}{call}): the device was full when the library needed its handle or workspace; the message states no sizes, so how much was missing is unknown",
                f.str("status").unwrap_or("ALLOC_FAILED")
            ),
        ),
        rs,
    )
}

fn cuda_async(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let (Some(r), Some(a), Some(l), Some(free)) = (
        f.bytes("requested_bytes"),
        f.bytes("allocated_bytes"),
        f.bytes("device_limit_bytes"),
        f.bytes("free_bytes"),
    ) else {
        return (
            v(
                VerdictKind::Undetermined,
                "PyTorch's cudaMallocAsync backend refused an allocation; the message as given states no sizes (request, allocated, device limit, free)".into(),
            ),
            vec![remedy::profile_host(), remedy::concurrency_plan(0, None)],
        );
    };
    if r > l {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("the {} request is larger than the device's {}", b(r), b(l)),
            ),
            vec![
                remedy::shrink_request(r, Some(l), r >= IMPLAUSIBLE),
                remedy::efficient_attention(),
                remedy::micro_batch(None),
            ],
        );
    }
    if r + POOL_GRANULE <= free {
        return (
            v(
                VerdictKind::AllocatorLimit,
                format!("CUDA reported {} free, enough for the {} request: a cap on this process or the async pool's release threshold refused it", b(free), b(r)),
            ),
            vec![remedy::memory_fraction(), remedy::profile_host()],
        );
    }
    // The async backend trims its pool before it raises: memory beyond PyTorch's allocations and
    // a context is held by other processes (or by this one outside PyTorch).
    let others = l.saturating_sub(a + free + CONTEXT);
    let shortfall = r.saturating_sub(free);
    if others >= l / 20 && others >= shortfall {
        return (
            v(
                VerdictKind::Contention,
                format!("{} of the {} device is held outside this process's PyTorch allocations ({} allocated, {} free), more than the {} missing: another process (or this one outside PyTorch) holds it", b(others), b(l), b(a), b(free), b(shortfall)),
            ),
            vec![
                remedy::concurrency_plan(others, f.bytes("device_index").and_then(|d| i128::try_from(d).ok())),
                remedy::checkpointing(Some(shortfall)),
            ],
        );
    }
    (
        v(
            VerdictKind::Capacity,
            format!(
                "PyTorch's own allocations ({}) fill the {} device; {} more were needed",
                b(a),
                b(l),
                b(shortfall)
            ),
        ),
        capacity_remedies(Some(shortfall)),
    )
}

fn kv_cache(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let evidence = match (
        f.bytes("kv_cache_needed_bytes"),
        f.bytes("kv_cache_available_bytes"),
        f.bytes("kv_cache_tokens"),
        f.bytes("max_model_len"),
    ) {
        (Some(n), Some(a), _, len) => format!(
            "one sequence of max_model_len{} tokens needs {} of KV cache but only {} is left after the weights and activations",
            len.map_or(String::new(), |l| format!(" ({l})")),
            b(n),
            b(a)
        ),
        (_, _, Some(t), Some(len)) => format!("the KV cache holds {t} tokens, fewer than one sequence of max_model_len ({len})"),
        _ => "no device memory was left for the KV cache after the weights and activations (within gpu_memory_utilization)".into(),
    };
    let len = match f
        .bytes("estimated_max_model_len")
        .or(f.bytes("kv_cache_tokens"))
    {
        Some(n) => format!(" (at most {n} tokens fit now)"),
        None => String::new(),
    };
    (
        v(VerdictKind::Capacity, evidence),
        vec![
            remedy::framework(
                "vllm_gpu_memory_utilization",
                "raise --gpu-memory-utilization (e.g. 0.90 → 0.95) when nothing else needs this GPU, or free the memory other processes hold on it",
                "the KV cache gets what the utilization fraction leaves after weights and activations",
            ),
            remedy::framework(
                "vllm_max_model_len",
                &format!("lower --max-model-len to the context you need{len}"),
                "one sequence of max_model_len tokens must fit in the KV cache",
            ),
            remedy::framework(
                "serving_quantization",
                "use --kv-cache-dtype fp8, a quantized checkpoint (AWQ, GPTQ, FP8), or shard with --tensor-parallel-size",
                "smaller weights leave more for the KV cache, and fp8 halves each token's cache",
            ),
        ],
    )
}

/// Words of a device (GPU) failure in a generic finding's lines.
fn generic(f: &Facts, notes: Notes) -> (Verdict, Vec<Remedy>) {
    let mut unknown = Vec::new();
    if f.get("requested_bytes").is_none() {
        unknown.push("how much was requested");
    }
    // Host words win: the device words of a later line (a KV cache) do not move it.
    let device = notes.device && !notes.host_words;
    if device && f.get("device_index").is_none() {
        unknown.push("which device");
    }
    unknown.push("what limit was reached");
    let untold = format!("the text does not say {}", unknown.join(", nor "));
    let r = f.bytes("requested_bytes");
    if notes.negative_size {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                "the request's size is negative: an overflowed size computation, not a size any memory could serve".into(),
            ),
            vec![remedy::framework(
                "size_computation",
                "find where the size is computed (a multiplication that overflowed, a length read wrongly) and fix it",
                "no setting or larger machine helps a request of a negative size",
            )],
        );
    }
    // What the message states decides where it can: a request above all the memory there is,
    // one refused with more than it free, an allocator's limit that is not memory's.
    let stated = |n: Option<i128>| n.and_then(|n| u128::try_from(n).ok());
    if let Some((r, t)) = r.zip(stated(notes.total_bytes)).filter(|&(r, t)| r > t) {
        let (kind, of) = if device {
            (VerdictKind::RequestExceedsDevice, "the device")
        } else {
            (VerdictKind::RequestExceedsMemory, "the machine")
        };
        return (
            v(
                kind,
                format!("a single {} allocation was requested, more than the {} the message says {of} has in all: it can never fit, whatever else is freed", b(r), b(t)),
            ),
            vec![remedy::check_size(r, t), remedy::shrink_request(r, Some(t), false)],
        );
    }
    const SLACK: u128 = 2 << 20;
    if let Some((r, free)) = r
        .zip(stated(notes.free_bytes))
        .filter(|&(r, free)| device && r + SLACK <= free)
    {
        return (
            v(
                VerdictKind::Fragmentation,
                format!("a {} allocation was refused while the message says {} was free: the free memory is not in one piece large enough", b(r), b(free)),
            ),
            vec![remedy::shrink_request(r, None, false), remedy::profile_host()],
        );
    }
    if notes.allocator_limit {
        return (
            v(
                VerdictKind::AllocatorLimit,
                format!("the allocator passed a limit of its own that does not count memory (a number of buffers or objects): memory was not what ran out; {untold}"),
            ),
            vec![
                remedy::framework(
                    "allocation_cap",
                    "hold fewer live buffers at once (smaller batches or prompts, fewer concurrent requests), or raise the runtime's own limit where it allows it",
                    "the runtime refuses a new allocation once it holds as many as its limit allows, whatever memory is free",
                ),
                remedy::profile_host(),
            ],
        );
    }
    if device {
        let what = r.map_or("an allocation".into(), |r| format!("a {} allocation", b(r)));
        // A runtime that names its own settings to lower says its own use filled the device.
        let own = notes.own_settings;
        return (
            v(
                if r.is_some() || own {
                    VerdictKind::Capacity
                } else {
                    VerdictKind::Undetermined
                },
                if own {
                    format!("the device could not serve {what} and the runtime asks to lower its own settings: its own use filled the device; {untold}")
                } else {
                    format!("the device could not serve {what}; {untold}")
                },
            ),
            vec![remedy::profile_host(), remedy::concurrency_plan(0, None)],
        );
    }
    if let Some(r) = r.filter(|&r| r >= IMPLAUSIBLE) {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!(
                    "a single host allocation of {r} bytes was requested; no machine has that much"
                ),
            ),
            vec![remedy::shrink_request(r, None, true)],
        );
    }
    let what = r.map_or("an allocation".into(), |r| format!("a {} allocation", b(r)));
    (
        v(
            VerdictKind::HostOom,
            format!("{what} failed in host memory: the machine's (or its container's) memory was the limit; {untold}"),
        ),
        vec![
            remedy::framework(
                "host_memory",
                "process the data in chunks (memory-mapped arrays, streaming), use a smaller dtype, or give the job more RAM (a larger machine or container limit)",
                "the allocation needed more host memory than the machine or its container had free",
            ),
            remedy::data_loader(),
            remedy::profile_host(),
        ],
    )
}
