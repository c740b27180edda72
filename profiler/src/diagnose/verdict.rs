//! The verdict engine: from a finding's facts (and, when known, the job's leak slope) to one
//! verdict with the numbers behind it, and remedies ranked for that verdict.

use super::facts::Facts;
use super::remedy::{self, Remedy};
use super::Kind;
use crate::report::leak::LeakEstimate;
use crate::units::fmt_bytes;
use serde::Serialize;

/// What caused the OOM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
    /// The device had enough free memory; a cap on the process refused the request.
    AllocatorLimit,
    /// The message states too little to tell.
    Undetermined,
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
}

impl Context {
    /// A context from this process's environment (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`).
    pub fn from_env() -> Self {
        Context {
            alloc_conf: std::env::var("PYTORCH_CUDA_ALLOC_CONF")
                .or_else(|_| std::env::var("PYTORCH_ALLOC_CONF"))
                .ok(),
            leak: None,
        }
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
/// Device memory a CUDA context takes outside PyTorch's allocator (kernels, cuBLAS workspaces).
const CUDA_CONTEXT: u128 = 512 << 20;
/// Requests at least this large (256 TiB) are not real tensors but broken size computations.
const IMPLAUSIBLE: u128 = 1 << 48;

fn b(v: u128) -> String {
    fmt_bytes(u64::try_from(v).unwrap_or(u64::MAX))
}

fn v(verdict: VerdictKind, evidence: String) -> Verdict {
    Verdict { verdict, evidence }
}

/// Judges one finding.
pub(crate) fn judge(kind: Kind, f: &Facts, ctx: &Context) -> (Verdict, Vec<Remedy>) {
    let (verdict, remedies) = match kind {
        Kind::TorchCudaOomNew | Kind::TorchCudaOomOld => gpu(&GpuNumbers::from(f), ctx),
        Kind::TorchCpuOom | Kind::RustAllocFailure => host_request(f),
        Kind::LinuxOomKiller => killed(f),
        Kind::TorchMpsOom => mps(f),
        _ => other(kind, f),
    };
    match ctx.leaking() {
        Some(slope)
            if matches!(
                verdict.verdict,
                VerdictKind::Capacity | VerdictKind::HostOom | VerdictKind::Undetermined
            ) =>
        {
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

/// The numbers of a PyTorch CUDA message, old or new wording.
struct GpuNumbers {
    requested: Option<u128>,
    total: Option<u128>,
    free: Option<u128>,
    allocated: Option<u128>,
    unallocated: Option<u128>,
    device: Option<i128>,
    /// Other processes' memory and whether it was estimated (no process list).
    others: Option<(u128, bool)>,
}

impl From<&Facts> for GpuNumbers {
    fn from(f: &Facts) -> Self {
        let allocated = f
            .bytes("allocated_by_torch_bytes")
            .or_else(|| f.bytes("already_allocated_bytes"));
        let unallocated = f.bytes("reserved_unallocated_bytes").or_else(|| {
            // ≤ 2.0: reserved total − allocated; ≤ 1.3: "cached" is already the unallocated part.
            f.bytes("reserved_total_bytes")
                .zip(allocated)
                .map(|(r, a)| r.saturating_sub(a))
                .or_else(|| f.bytes("cached_bytes"))
        });
        let total = f.bytes("total_bytes");
        let free = f.bytes("free_bytes");
        let reserved = allocated.zip(unallocated).map(|(a, u)| a + u);
        let procs = f.processes();
        let others = if f.bytes("this_process_bytes").is_some() {
            (!procs.is_empty()).then(|| (procs.iter().map(|p| p.bytes).sum(), false))
        } else if !procs.is_empty() {
            // Without the own-process clause the list includes this job: it is the process whose
            // usage is closest above what PyTorch reserved (reserved + CUDA context).
            let own = reserved.and_then(|r| {
                procs
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.bytes >= r)
                    .min_by_key(|(_, p)| p.bytes - r)
                    .map(|(i, _)| i)
            });
            let sum = procs
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != own)
                .map(|(_, p)| p.bytes)
                .sum();
            Some((sum, false))
        } else {
            // No list: whatever is in use beyond PyTorch's reservation and a CUDA context.
            match (total, free, reserved) {
                (Some(t), Some(fr), Some(r)) => {
                    Some((t.saturating_sub(fr).saturating_sub(r + CUDA_CONTEXT), true))
                }
                _ => None,
            }
        };
        GpuNumbers {
            requested: f.bytes("requested_bytes"),
            total,
            free,
            allocated,
            unallocated,
            device: match f.get("device_index") {
                Some(super::Fact::Int(d)) => Some(*d),
                _ => None,
            },
            others,
        }
    }
}

fn capacity_remedies(shortfall: Option<u128>) -> Vec<Remedy> {
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

fn gpu(n: &GpuNumbers, ctx: &Context) -> (Verdict, Vec<Remedy>) {
    let Some(r) = n.requested else {
        return (
            v(
                VerdictKind::Undetermined,
                "the message states no request size".into(),
            ),
            vec![remedy::profile_host()],
        );
    };
    let free = n.free.unwrap_or(0);
    let shortfall = r.saturating_sub(free);
    if let Some(t) = n.total.filter(|&t| r > t) {
        let implausible = r >= IMPLAUSIBLE;
        let mut rs = vec![remedy::shrink_request(r, Some(t), implausible)];
        if !implausible {
            rs.push(remedy::efficient_attention());
            rs.push(remedy::micro_batch(Some(r - t)));
        }
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!(
                    "the {} request is larger than the whole device ({})",
                    b(r),
                    b(t)
                ),
            ),
            rs,
        );
    }
    // Other processes' memory counts when it would have covered the shortfall and is not noise.
    let others = n
        .others
        .filter(|&(o, _)| o >= shortfall && n.total.is_none_or(|t| o.saturating_mul(20) >= t));
    let fragmented = n.unallocated.filter(|&u| u >= r);
    if n.free.is_some_and(|f| r <= f) {
        // Free memory is read after the failure: listed processes allocating meanwhile explain it.
        if let Some((o, false)) = others.filter(|&(o, _)| o > 0) {
            return contention(n, o, false, r, free, shortfall, "; they allocate concurrently, so the memory free when the message was written was gone when the request ran");
        }
        return (
            v(
                VerdictKind::AllocatorLimit,
                format!(
                    "the device reported {} free, enough for the {} request, yet it was refused",
                    b(free),
                    b(r)
                ),
            ),
            vec![remedy::memory_fraction(), remedy::micro_batch(None)],
        );
    }
    // Both can hold: the verdict is the larger lever, the other is named too.
    match (fragmented, others) {
        // An estimate (no process list) never outweighs the fragmentation the message states.
        (Some(u), Some((o, false))) if o > u => {
            let est = false;
            let mut d = contention(n, o, est, r, free, shortfall, "");
            d.0.evidence += &format!(
                "; also {} is reserved by PyTorch but unallocated (fragmentation)",
                b(u)
            );
            d.1.insert(1, remedy::expandable_segments(u, ctx.alloc_conf.as_deref()));
            return d;
        }
        (Some(u), also) => {
            let mut rs = vec![remedy::expandable_segments(u, ctx.alloc_conf.as_deref())];
            if let Some((o, _)) = also {
                rs.push(remedy::concurrency_plan(o, n.device));
            }
            rs.push(remedy::micro_batch(Some(shortfall)));
            rs.push(remedy::checkpointing(Some(shortfall)));
            let also = also.map_or(String::new(), |(o, est)| {
                let whose = if est {
                    "memory outside PyTorch's allocator"
                } else {
                    "other processes"
                };
                format!("; {whose} also hold {}", b(o))
            });
            return (
                v(
                    VerdictKind::Fragmentation,
                    format!(
                        "{} is reserved by PyTorch but unallocated — more than the {} request — yet \
                         no cached block fits it, and only {} is free on the device{also}",
                        b(u),
                        b(r),
                        b(free)
                    ),
                ),
                rs,
            );
        }
        (None, Some((o, est))) => return contention(n, o, est, r, free, shortfall, ""),
        (None, None) => {}
    }
    let own = match (n.allocated, n.unallocated) {
        (Some(a), Some(u)) => format!("PyTorch holds {} allocated and {} cached", b(a), b(u)),
        (Some(a), None) => format!("PyTorch holds {} allocated", b(a)),
        _ => "the job's own allocations fill the device".into(),
    };
    let of_total = n.total.map_or(String::new(), |t| format!(" of {}", b(t)));
    let mut rs = capacity_remedies(Some(shortfall));
    if let Some(u) = n.unallocated.filter(|&u| u > 0) {
        rs.push(remedy::expandable_segments(u, ctx.alloc_conf.as_deref()));
    }
    (
        v(
            VerdictKind::Capacity,
            format!(
                "{own}{of_total}; the {} request is {} more than the {} free",
                b(r),
                b(shortfall),
                b(free)
            ),
        ),
        rs,
    )
}

/// The contention verdict: `others` bytes held outside this job (`estimated`: no process list).
fn contention(
    n: &GpuNumbers,
    others: u128,
    estimated: bool,
    r: u128,
    free: u128,
    shortfall: u128,
    extra: &str,
) -> (Verdict, Vec<Remedy>) {
    let whose = if estimated {
        "memory outside PyTorch's allocator (other processes or non-PyTorch allocations)"
    } else {
        "other processes"
    };
    let mut rs = vec![remedy::concurrency_plan(others, n.device)];
    rs.extend(capacity_remedies(Some(shortfall)));
    (
        v(
            VerdictKind::Contention,
            format!(
                "{whose} hold {} of the device; without them the {} request would fit (only {} free){extra}",
                b(others),
                b(r),
                b(free)
            ),
        ),
        rs,
    )
}

fn host_request(f: &Facts) -> (Verdict, Vec<Remedy>) {
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
    (
        v(
            VerdictKind::HostOom,
            format!("a {} host allocation failed: the process reached the machine's or its limit's memory", b(r)),
        ),
        vec![
            remedy::data_loader(),
            remedy::profile_host(),
            remedy::memory_limit(None, None),
            remedy::first_layers(),
        ],
    )
}

fn killed(f: &Facts) -> (Verdict, Vec<Remedy>) {
    let memcg = f.str("scope") == Some("memcg")
        || f.str("constraint") == Some("CONSTRAINT_MEMCG")
        || f.bytes("memory_limit_bytes").is_some();
    let who = f
        .str("process_name")
        .or_else(|| f.str("selected_process_name"))
        .unwrap_or("a process");
    let rss = f.bytes("anon_rss_bytes").map_or(String::new(), |a| {
        format!(" holding {} anonymous memory", b(a))
    });
    let limit = f.bytes("memory_limit_bytes");
    let evidence = if memcg {
        let l = limit.map_or(String::new(), |l| format!(" (limit {})", b(l)));
        format!("the memory cgroup{l} hit its limit and the kernel killed {who}{rss}")
    } else {
        format!("the machine ran out of memory and the kernel killed {who}{rss}")
    };
    (
        v(VerdictKind::HostOom, evidence),
        vec![
            remedy::data_loader(),
            remedy::memory_limit(limit, f.bytes("memory_usage_bytes")),
            remedy::profile_host(),
        ],
    )
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

fn other(kind: Kind, f: &Facts) -> (Verdict, Vec<Remedy>) {
    let r = f.bytes("requested_bytes");
    if let Some(r) = r.filter(|&r| r >= IMPLAUSIBLE) {
        return (
            v(
                VerdictKind::RequestExceedsDevice,
                format!("a single request of {r} bytes is not a real buffer"),
            ),
            vec![remedy::shrink_request(r, None, true)],
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
    let size = r.map_or("an allocation".to_string(), |r| {
        format!("a {} allocation", b(r))
    });
    let (verdict, evidence) = match kind {
        Kind::JaxXlaOom => match (f.bytes("total_fragmentation_bytes"), r) {
            (Some(fr), Some(r)) if fr >= r => (
                VerdictKind::Fragmentation,
                format!(
                    "XLA reports {} fragmented, more than the {} request",
                    b(fr),
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
