//! The verdict for a PyTorch CUDA/HIP allocator message (both wordings): which of request size,
//! allocator cap, other processes, fragmentation or the job's own allocations explains it, from
//! every number the message states (docs/diagnose.md, "Verdicts", has the rules and thresholds).

use super::facts::Facts;
use super::remedy::{self, Remedy};
use super::verdict::{
    b, capacity_remedies, v, Context, Verdict, VerdictKind, IMPLAUSIBLE, LARGEST_DEVICE,
};

/// Device memory a CUDA context takes outside PyTorch's allocator (kernels, cuBLAS workspaces).
const CUDA_CONTEXT: u128 = 512 << 20;
/// Granularity of device allocations (PyTorch rounds large blocks to 2 MiB; so do driver pages).
const GRANULE: u128 = 2 << 20;
/// Other processes count only when they hold at least this share (1/20 = 5%) of the device.
const NOISE_SHARE: u128 = 20;

/// Half a unit of the last digit PyTorch prints for `v` bytes (two decimals of the unit).
fn print_rounding(v: u128) -> u128 {
    match v {
        0..=1024 => 0,
        1025..=0xFFFFF => 1024 / 200,
        0x100000..=0x3FFF_FFFF => (1 << 20) / 200,
        _ => (1 << 30) / 200,
    }
}

/// Where the figure for other processes' memory comes from.
#[derive(Clone, Copy, PartialEq)]
enum Others {
    /// `Process P has …` clauses, or total − free − this process's memory.
    Stated,
    /// total − free − PyTorch's reservation − a CUDA context: an estimate.
    Estimated,
}

/// The numbers of a PyTorch CUDA message, old or new wording.
struct GpuNumbers {
    requested: Option<u128>,
    total: Option<u128>,
    free: Option<u128>,
    allocated: Option<u128>,
    unallocated: Option<u128>,
    /// This process's own device memory, when the message states a plausible figure.
    this: Option<u128>,
    device: Option<i128>,
    others: Option<(u128, Others)>,
}

impl GpuNumbers {
    fn new(f: &Facts, log_total: Option<u128>) -> Self {
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
        let total = f.bytes("total_bytes").or(log_total);
        let free = f.bytes("free_bytes");
        let reserved = allocated.zip(unallocated).map(|(a, u)| a + u);
        // "this process has X" is wrong when it is below what PyTorch alone allocated (0 bytes
        // inside some containers) or above the device (a bogus 2^64).
        let this = f
            .bytes("this_process_bytes")
            .filter(|&t| total.is_none_or(|tot| t <= tot) && allocated.is_none_or(|a| t >= a));
        // A process's figure above the whole device is the driver's bogus value (2^64 under
        // WSL), not memory held: it counts for nothing.
        let real = |b: u128| total.is_none_or(|tot| b <= tot);
        let procs = f.processes();
        let listed: u128 = procs.iter().map(|p| p.bytes).filter(|&b| real(b)).sum();
        // A container zeroes the driver's per-process figures: an own-process figure below what
        // PyTorch allocated beside a list of nothing but `0 bytes` says nothing of the others,
        // so they are estimated as if no list were printed.
        let zeroed = this.is_none()
            && f.bytes("this_process_bytes") == Some(0)
            && !procs.is_empty()
            && procs.iter().all(|p| p.bytes == 0);
        let others = match (this, total, free) {
            _ if f.bytes("this_process_bytes").is_some() && !procs.is_empty() && !zeroed => {
                Some((listed, Others::Stated))
            }
            // No list: everything in use that is not this process belongs to others.
            (Some(t), Some(tot), Some(fr)) => {
                Some((tot.saturating_sub(fr).saturating_sub(t), Others::Stated))
            }
            _ if !procs.is_empty() && !zeroed => {
                // Without the own-process clause the list includes this job: it is the process
                // whose usage is closest above what PyTorch reserved (or allocated).
                let mine = reserved.or(allocated);
                let own = mine.and_then(|r| {
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
                    .filter(|&b| real(b))
                    .sum();
                Some((sum, Others::Stated))
            }
            // No list: whatever is in use beyond PyTorch's reservation and a CUDA context.
            (None, Some(t), Some(fr)) => reserved.map(|r| {
                (
                    t.saturating_sub(fr).saturating_sub(r + CUDA_CONTEXT),
                    Others::Estimated,
                )
            }),
            _ => None,
        };
        GpuNumbers {
            requested: f.bytes("requested_bytes"),
            total,
            free,
            allocated,
            unallocated,
            this,
            device: match f.get("device_index") {
                Some(super::Fact::Int(d)) => Some(*d),
                _ => None,
            },
            others,
        }
    }
}

/// A verdict and its remedies, best first.
type Decision = (Verdict, Vec<Remedy>);

/// What a request needed against what was free.
struct Need {
    /// The request.
    r: u128,
    /// Free device memory (0 when unstated).
    free: u128,
    /// How much more the request needed than was free (0 when within rounding).
    shortfall: u128,
    /// `; the request equals the free memory within rounding…`, or empty.
    near_note: String,
}

/// Judges a PyTorch CUDA/HIP message (the device size may come from the log, `ctx.device_total`).
pub(crate) fn judge(f: &Facts, ctx: &Context) -> Decision {
    let n = GpuNumbers::new(f, ctx.device_total);
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
    if let Some(t) = n.total.filter(|&t| r > t) {
        return exceeds_device(r, t);
    }
    // A device of unstated size cannot be larger than the largest accelerator made.
    if n.total.is_none() && r > LARGEST_DEVICE {
        return exceeds_any_device(r);
    }
    // A request within rounding and allocation granularity of the free memory does not fit.
    let slack = GRANULE + print_rounding(free) + print_rounding(r);
    let fits = n.free.is_some_and(|f| r + slack <= f);
    let near = n.free.is_some() && !fits && r <= free;
    let shortfall = if near { 0 } else { r.saturating_sub(free) };
    // Other processes' memory counts when it would have covered the shortfall and is not noise.
    let others = n.others.filter(|&(o, _)| {
        o > 0 && o >= shortfall && n.total.is_none_or(|t| o.saturating_mul(NOISE_SHARE) >= t)
    });
    if fits {
        return refused_though_free(&n, others, r, free, shortfall);
    }
    let near_note = if near {
        format!(
            "; the {} request equals the {} free within rounding and the {} allocation granularity",
            b(r),
            b(free),
            b(GRANULE)
        )
    } else {
        String::new()
    };
    let need = Need {
        r,
        free,
        shortfall,
        near_note,
    };
    if let Some(d) = fragmentation_or_contention(&n, others, &need, ctx) {
        return d;
    }
    // The job holds nothing and the message does not say what was free: not its own allocations.
    if n.free.is_none()
        && n.allocated.is_none_or(|a| a == 0)
        && n.unallocated.is_none_or(|u| u == 0)
    {
        return (
            v(
                VerdictKind::Undetermined,
                format!("PyTorch held no device memory, yet the {} request was refused; the message does not say what was free, so another process and a cap on this one are both possible", b(r)),
            ),
            vec![
                remedy::profile_host(),
                remedy::concurrency_plan(0, n.device),
                remedy::memory_fraction(),
            ],
        );
    }
    if n.unallocated.is_none() {
        if let Some(d) = without_reserved(&n, r, free, shortfall, ctx) {
            return d;
        }
    }
    capacity(&n, &need, ctx)
}

/// A request larger than the whole device.
fn exceeds_device(r: u128, t: u128) -> Decision {
    let implausible = r >= IMPLAUSIBLE;
    let mut rs = vec![remedy::shrink_request(r, Some(t), implausible)];
    if !implausible {
        rs.push(remedy::efficient_attention());
        rs.push(remedy::micro_batch(Some(r - t)));
    }
    (
        v(
            VerdictKind::RequestExceedsDevice,
            format!(
                "the {} request is larger than the whole device ({}): a wrong size or shape, or an operation that must be split",
                b(r),
                b(t)
            ),
        ),
        rs,
    )
}

/// A request larger than any single accelerator, on a device whose size the text does not state.
fn exceeds_any_device(r: u128) -> Decision {
    let implausible = r >= IMPLAUSIBLE;
    (
        v(
            VerdictKind::RequestExceedsDevice,
            format!(
                "the {} request is larger than any single accelerator ({}): a wrong size or shape, or an operation that must be split",
                b(r),
                b(LARGEST_DEVICE)
            ),
        ),
        vec![
            remedy::shrink_request(r, None, implausible),
            remedy::efficient_attention(),
            remedy::micro_batch(None),
        ],
    )
}

/// A request the stated free memory would have held, refused anyway.
fn refused_though_free(
    n: &GpuNumbers,
    others: Option<(u128, Others)>,
    r: u128,
    free: u128,
    shortfall: u128,
) -> Decision {
    // Free memory is read after the failure: other processes allocating meanwhile explain it.
    if let Some((o, Others::Stated)) = others {
        return contention(n, o, false, r, free, shortfall, "; they allocate concurrently, so the memory free when the message was written was gone when the request ran");
    }
    (
        v(
            VerdictKind::AllocatorLimit,
            format!(
                "the device reported {} free, enough for the {} request, yet it was refused",
                b(free),
                b(r)
            ),
        ),
        vec![remedy::memory_fraction(), remedy::micro_batch(None)],
    )
}

/// Fragmentation (cached but unallocated memory that would hold the request) or other processes'
/// memory; both can hold: the verdict is the larger lever, the other is named too.
fn fragmentation_or_contention(
    n: &GpuNumbers,
    others: Option<(u128, Others)>,
    need: &Need,
    ctx: &Context,
) -> Option<Decision> {
    let Need {
        r,
        free,
        shortfall,
        ref near_note,
    } = *need;
    let fragmented = n.unallocated.filter(|&u| u >= r);
    match (fragmented, others) {
        // An estimate (no process list) never outweighs the fragmentation the message states.
        (Some(u), Some((o, Others::Stated))) if o > u => {
            let mut d = contention(n, o, false, r, free, shortfall, near_note);
            d.0.evidence += &format!(
                "; also {} is reserved by PyTorch but unallocated (fragmentation)",
                b(u)
            );
            d.1.insert(1, remedy::expandable_segments(u, ctx.alloc_conf.as_deref()));
            Some(d)
        }
        (Some(u), also) => {
            let mut rs = vec![remedy::expandable_segments(u, ctx.alloc_conf.as_deref())];
            if let Some((o, _)) = also {
                rs.push(remedy::concurrency_plan(o, n.device));
            }
            rs.push(remedy::micro_batch(Some(shortfall)));
            rs.push(remedy::checkpointing(Some(shortfall)));
            let also = also.map_or(String::new(), |(o, how)| {
                let whose = match how {
                    Others::Estimated => "memory outside PyTorch's allocator",
                    Others::Stated => "other processes",
                };
                format!("; {whose} also hold {}", b(o))
            });
            Some((
                v(
                    VerdictKind::Fragmentation,
                    format!(
                        "{} is reserved by PyTorch but unallocated — more than the {} request — yet \
                         no cached block fits it, and only {} is free on the device{also}{near_note}",
                        b(u),
                        b(r),
                        b(free)
                    ),
                ),
                rs,
            ))
        }
        (None, Some((o, how))) => Some(contention(
            n,
            o,
            how == Others::Estimated,
            r,
            free,
            shortfall,
            near_note,
        )),
        (None, None) => None,
    }
}

/// The job's own allocations fill the device.
fn capacity(n: &GpuNumbers, need: &Need, ctx: &Context) -> Decision {
    let own = match (n.allocated, n.unallocated) {
        (Some(a), Some(u)) => format!("PyTorch holds {} allocated and {} cached", b(a), b(u)),
        (Some(a), None) => format!("PyTorch holds {} allocated", b(a)),
        _ => "the job's own allocations fill the device".into(),
    };
    let of_total = n.total.map_or(String::new(), |t| format!(" of {}", b(t)));
    let mut rs = capacity_remedies(Some(need.shortfall));
    if let Some(u) = n.unallocated.filter(|&u| u > 0) {
        rs.push(remedy::expandable_segments(u, ctx.alloc_conf.as_deref()));
    }
    (
        v(
            VerdictKind::Capacity,
            format!(
                "{own}{of_total}; the {} request is {} more than the {} free{}",
                b(need.r),
                b(need.shortfall),
                b(need.free),
                need.near_note
            ),
        ),
        rs,
    )
}

/// The verdict when the message is cut before its reserved figure: memory the device has in use
/// beyond PyTorch's allocations may be this process's cache or another process's, and only the
/// numbers that are stated decide.
fn without_reserved(
    n: &GpuNumbers,
    r: u128,
    free: u128,
    shortfall: u128,
    ctx: &Context,
) -> Option<Decision> {
    let a = n.allocated?;
    if let Some(t) = n.this {
        // This process holds more than PyTorch allocated: its cache (or non-PyTorch buffers).
        let beyond = t.saturating_sub(a).saturating_sub(CUDA_CONTEXT);
        if beyond < r {
            return None;
        }
        let rs = vec![
            remedy::expandable_segments(beyond, ctx.alloc_conf.as_deref()),
            remedy::micro_batch(Some(shortfall)),
            remedy::checkpointing(Some(shortfall)),
        ];
        return Some((
            v(
                VerdictKind::Fragmentation,
                format!(
                    "this process holds {} but PyTorch allocated only {}: about {} is cached but \
                     unallocated (or held outside PyTorch), more than the {} request, and only {} \
                     is free (the message stops before its reserved figure)",
                    b(t),
                    b(a),
                    b(beyond),
                    b(r),
                    b(free)
                ),
            ),
            rs,
        ));
    }
    let gap = n.total?.saturating_sub(free).saturating_sub(a);
    if gap < r + CUDA_CONTEXT {
        return None;
    }
    Some((
        v(
            VerdictKind::Undetermined,
            format!(
                "{} of the device is in use beyond PyTorch's {} allocated — more than the {} \
                 request — but the message stops before saying whether this job's cache or \
                 another process holds it",
                b(gap),
                b(a),
                b(r)
            ),
        ),
        vec![
            remedy::expandable_segments(gap, ctx.alloc_conf.as_deref()),
            remedy::concurrency_plan(gap, n.device),
            remedy::profile_host(),
        ],
    ))
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
) -> Decision {
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
