//! Tips v1: rules that say what to do and why, each with the measured numbers as evidence.

use super::Report;
use crate::units::fmt_bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A piece of advice with its evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tip {
    /// Stable identifier: `fragmentation`, `peak-in-backward`, `leak-suspect`, `rss-beyond-heap`,
    /// `near-cgroup-limit`, `device-cache-overhead`, `device-shared`.
    pub id: String,
    /// `info` or `warning`.
    pub severity: String,
    /// One line: what was seen.
    pub title: String,
    /// What to do, and why it helps.
    pub advice: String,
    /// The numbers behind it (bytes, ratios, steps).
    pub evidence: BTreeMap<String, serde_json::Value>,
}

fn tip(
    id: &str,
    severity: &str,
    title: String,
    advice: String,
    evidence: &[(&str, serde_json::Value)],
) -> Tip {
    Tip {
        id: id.into(),
        severity: severity.into(),
        title,
        advice,
        evidence: evidence
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    }
}

const MIB: u64 = 1 << 20;

/// " The top site at the heap peak is …" when the report has a heap profile.
fn top_site_sentence(r: &Report) -> String {
    r.heap_profile
        .as_ref()
        .and_then(|h| h.top_site())
        .map(|s| {
            format!(
                " The site holding the most at the profiled peak is {} ({}, {:.0}% of sampled bytes).",
                s.at.label(),
                fmt_bytes(s.bytes),
                s.share * 100.0
            )
        })
        .unwrap_or_default()
}

/// " The site that grew most …" when the report has a heap profile's growth view.
fn growth_site_sentence(r: &Report) -> String {
    r.heap_profile
        .as_ref()
        .and_then(|h| h.growth.as_ref())
        .and_then(|g| g.sites.first().map(|s| (g, s)))
        .map(|(g, s)| {
            format!(
                " The site that grew most from step {} to {} is {} (+{}).",
                g.from_step,
                g.to_step,
                s.at.label(),
                fmt_bytes(s.grew_bytes.max(0) as u64)
            )
        })
        .unwrap_or_default()
}

/// Derives the tips for a report (its `tips` field is ignored), from its training window where
/// it has one: an interpreter's teardown is no reason to change the training job.
pub fn derive(r: &Report) -> Vec<Tip> {
    let window;
    let r = if r.training.is_some() {
        window = r.within_training();
        &window
    } else {
        r
    };
    let mut tips = Vec::new();
    fragmentation_tip(r, &mut tips);
    backward_peak_tip(r, &mut tips);
    leak_tip(r, &mut tips);
    rss_tip(r, &mut tips);
    cgroup_tip(r, &mut tips);
    device_tips(r, &mut tips);
    tips
}

/// Heap fragmentation at the resident peak.
fn fragmentation_tip(r: &Report, tips: &mut Vec<Tip>) {
    if let Some(f) = &r.fragmentation {
        let waste = f.resident_bytes.saturating_sub(f.allocated_bytes);
        if f.resident_ratio >= 0.25 && waste >= 64 * MIB {
            tips.push(tip(
                "fragmentation",
                "warning",
                format!(
                    "Heap fragmentation: {:.0}% of jemalloc's resident memory ({} of {}) held no live data at its peak",
                    f.resident_ratio * 100.0,
                    fmt_bytes(waste),
                    fmt_bytes(f.resident_bytes)
                ),
                "Freed pages are kept dirty before jemalloc returns them. Return them sooner with \
                 MALLOC_CONF=background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0, and avoid \
                 interleaving long-lived small allocations with large temporary buffers (allocate \
                 long-lived state first)."
                    .into(),
                &[
                    ("resident_ratio", f.resident_ratio.into()),
                    ("active_ratio", f.active_ratio.into()),
                    ("resident_bytes", f.resident_bytes.into()),
                    ("allocated_bytes", f.allocated_bytes.into()),
                    ("t_ms", f.at.t_ms.into()),
                ],
            ));
        }
    }
}

/// A heap peak inside a backward phase.
fn backward_peak_tip(r: &Report, tips: &mut Vec<Tip>) {
    let p = &r.peaks;
    if let Some(phase) = &p.heap_peak_phase {
        if phase.to_ascii_lowercase().contains("backward") {
            let rise = r
                .phases
                .iter()
                .find(|s| &s.path == phase)
                .map(|s| s.max_rise_bytes)
                .unwrap_or(0);
            tips.push(tip(
                "peak-in-backward",
                "info",
                format!("The heap peak ({}) is reached in phase {phase}", fmt_bytes(p.heap_peak_bytes)),
                format!(
                    "The backward pass holds every layer's saved activations at once (this phase rose {} \
                     above its start). Activation checkpointing keeps only block inputs and recomputes \
                     the rest during backward, trading ~30% more compute for most of that memory; a \
                     smaller micro-batch with gradient accumulation shrinks it proportionally.{}",
                    fmt_bytes(rise),
                    top_site_sentence(r)
                ),
                &[("peak_bytes", p.heap_peak_bytes.into()), ("phase_rise_bytes", rise.into())],
            ));
        }
    }
}

/// Live heap that grows step after step.
fn leak_tip(r: &Report, tips: &mut Vec<Tip>) {
    if let Some(l) = &r.leak {
        let threshold = (64 * 1024) as f64;
        if l.slope_bytes_per_step >= threshold && l.confidence >= 0.8 {
            let grown = l.slope_bytes_per_step * l.steps_used as f64;
            // Top-level phases only: a nested phase's net is often memory its sibling frees (forward's
            // activations, freed in backward), while top-level nets add up to the step's growth.
            let worst = r
                .phases
                .iter()
                .filter(|s| s.net_bytes > 0 && !s.path.contains('/'))
                .max_by_key(|s| s.net_bytes);
            tips.push(tip(
                "leak-suspect",
                "warning",
                format!(
                    "Live heap grows {} per step (confidence {:.0}%): a leak suspect",
                    fmt_bytes(l.slope_bytes_per_step as u64),
                    l.confidence * 100.0
                ),
                format!(
                    "After warm-up, end-of-step live memory rises steadily (~{} over the fitted steps). \
                     Look for tensors or buffers kept across steps: losses accumulated with their graph, \
                     caches without eviction, lists of per-step outputs.{}{}",
                    fmt_bytes(grown as u64),
                    worst
                        .map(|w| format!(" Phase {} kept the most memory ({} net).", w.path, fmt_bytes(w.net_bytes as u64)))
                        .unwrap_or_default(),
                    growth_site_sentence(r)
                ),
                &[
                    ("slope_bytes_per_step", l.slope_bytes_per_step.into()),
                    ("confidence", l.confidence.into()),
                    ("steps_used", l.steps_used.into()),
                ],
            ));
        }
    }
}

/// An RSS far above the process heap, blamed on the largest part of the gap at the RSS peak:
/// file-backed pages, shared memory, or anonymous memory beyond the heap.
fn rss_tip(r: &Report, tips: &mut Vec<Tip>) {
    let p = &r.peaks;
    let Some(rss) = p.rss_peak_bytes.filter(|_| r.heap_measured()) else {
        return;
    };
    // The process heap counts every allocation through jemalloc, CPU tensor storage included;
    // with a build that counts Rust's allocations only, the tensor peak is the larger figure.
    let heap = p
        .heap_peak_bytes
        .max(p.tensor_peak_bytes.unwrap_or(0))
        .max(1);
    if rss as f64 <= 1.5 * heap as f64 || rss - heap.min(rss) < 256 * MIB {
        return;
    }
    let sample = p.rss_peak_sample.as_ref().and_then(|a| r.sample_at(a));
    let split = sample.and_then(|s| s.process);
    // Anonymous memory beyond the heap live at that sample.
    let heap_then = sample.map_or(heap, |s| s.heap.live_bytes);
    let resident = p.jemalloc_resident_peak.as_ref().map(|r| r.bytes);
    let cause = match split {
        Some(m) => rss_gap_cause(
            m.anon.saturating_sub(heap_then),
            m.file,
            m.shmem,
            resident,
            heap,
        ),
        None => "without the RSS split (anon / file / shmem) the gap's cause is unknown".into(),
    };
    tips.push(tip(
        "rss-beyond-heap",
        "info",
        format!(
            "Peak RSS {} is {:.1}× the process heap's peak {}",
            fmt_bytes(rss),
            rss as f64 / heap as f64,
            fmt_bytes(heap)
        ),
        format!("{cause}."),
        &[
            ("rss_peak_bytes", rss.into()),
            ("heap_peak_bytes", p.heap_peak_bytes.into()),
            ("anon_bytes", split.map(|m| m.anon).into()),
            ("file_bytes", split.map(|m| m.file).into()),
            ("shmem_bytes", split.map(|m| m.shmem).into()),
            ("jemalloc_resident_peak_bytes", resident.into()),
        ],
    ));
}

/// Which part of an RSS gap is largest, in words: anonymous memory beyond the heap, file-backed
/// pages or shared memory.
fn rss_gap_cause(
    anon_beyond_heap: u64,
    file: u64,
    shmem: u64,
    resident: Option<u64>,
    heap: u64,
) -> String {
    if file >= anon_beyond_heap && file >= shmem {
        format!(
            "The largest part, {}, is file-backed pages: the code and data of shared libraries \
             (libtorch's alone are hundreds of MiB) and memory-mapped files or datasets. The kernel \
             can drop them under pressure and shares them between processes, so they rarely cause \
             an OOM kill; they are not the heap",
            fmt_bytes(file)
        )
    } else if shmem >= anon_beyond_heap {
        format!(
            "The largest part, {}, is shared memory (/dev/shm): tensors DataLoader workers hand \
             to the trainer, or CUDA IPC buffers; it counts once per process mapping it",
            fmt_bytes(shmem)
        )
    } else if resident.is_some_and(|res| res as f64 > 1.3 * heap as f64) {
        format!(
            "The largest part, {} of anonymous memory beyond the heap, matches jemalloc's \
             resident memory well above the live heap: fragmentation and dirty pages (see the \
             fragmentation tip)",
            fmt_bytes(anon_beyond_heap)
        )
    } else if resident.is_none() {
        // No jemalloc: the process's own allocator (glibc's malloc, with memsight preloaded).
        format!(
            "The largest part, {} of anonymous memory beyond the heap, is memory no live \
             allocation holds: free memory glibc's malloc keeps in its arenas after frees \
             (fragmentation across threads' arenas; `MALLOC_ARENA_MAX=2`, \
             `MALLOC_TRIM_THRESHOLD_` or a periodic `malloc_trim(0)` give it back), Python's own \
             object arenas (mapped directly, not through malloc), thread stacks, pinned host \
             buffers, or libraries mapping memory themselves",
            fmt_bytes(anon_beyond_heap)
        )
    } else {
        format!(
            "The largest part, {} of anonymous memory beyond the heap, is memory that no \
             allocation call of the process holds: thread stacks, pinned (page-locked) host \
             buffers, or libraries mapping memory themselves",
            fmt_bytes(anon_beyond_heap)
        )
    }
}

/// A memory cgroup near its limit.
fn cgroup_tip(r: &Report, tips: &mut Vec<Tip>) {
    let p = &r.peaks;
    if let (Some(limit), Some(usage)) = (p.cgroup_limit_bytes, &p.cgroup_usage_peak) {
        if usage.bytes as f64 >= 0.9 * limit as f64 {
            tips.push(tip(
                "near-cgroup-limit",
                "warning",
                format!(
                    "Memory cgroup usage reached {:.0}% of its limit ({} of {})",
                    usage.bytes as f64 / limit as f64 * 100.0,
                    fmt_bytes(usage.bytes),
                    fmt_bytes(limit)
                ),
                format!(
                    "The kernel OOM killer fires at the limit. Cgroup usage counts every process \
                     in the cgroup and its page cache, which is reclaimed first; if RSS is also \
                     close, reduce {}, or raise the limit.",
                    if super::job_context::JobContext::of(r).workers == Some(0) {
                        "the batch size or the host memory the job keeps"
                    } else {
                        "the batch size, data-loader workers or prefetch depth"
                    }
                ),
                &[
                    ("usage_peak_bytes", usage.bytes.into()),
                    ("limit_bytes", limit.into()),
                    ("step", usage.step.into()),
                ],
            ));
        }
    }
}

const GIB: u64 = 1 << 30;

/// Tips from the devices' peaks: a caching allocator that reserved far more than its tensors ever
/// needed at once, and a device shared with other processes.
fn device_tips(r: &Report, tips: &mut Vec<Tip>) {
    for d in &r.devices {
        let who = format!("GPU {} ({})", d.index, d.backend);
        if let (Some(res), Some(alloc)) = (d.peak_reserved_bytes, d.peak_allocated_bytes) {
            let over = res.saturating_sub(alloc);
            if over >= GIB && over as f64 >= 0.2 * res as f64 {
                tips.push(tip(
                    "device-cache-overhead",
                    "warning",
                    format!(
                        "{who} reserved {} at its peak, {} more than its tensors ever held at once ({})",
                        fmt_bytes(res),
                        fmt_bytes(over),
                        fmt_bytes(alloc)
                    ),
                    "The caching allocator keeps freed blocks for reuse and splits them; tensors \
                     whose sizes change from step to step (varying batch or sequence length) leave \
                     blocks too small to reuse, so it reserves more. \
                     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True grows segments in place \
                     instead of adding new ones; max_split_size_mb:N stops large blocks from being \
                     split; bucketing batch shapes makes blocks reusable. empty_cache() returns the \
                     cache to the driver but does not prevent it."
                        .into(),
                    &[
                        ("device", d.index.into()),
                        ("peak_reserved_bytes", res.into()),
                        ("peak_allocated_bytes", alloc.into()),
                        ("alloc_retries", d.alloc_retries.map(Into::into).unwrap_or(serde_json::Value::Null)),
                    ],
                ));
            }
        }
        let floor = d.total_bytes.map_or(GIB, |t| GIB.max(t / 20));
        if d.peak_others_bytes >= floor {
            // The job's own share: NVML's per-process figure, else its allocator's reservation
            // on the same device (NVML's `used` counts every process).
            let own = d.peak_job_used_bytes.or_else(|| {
                r.devices
                    .iter()
                    .filter(|o| o.index == d.index)
                    .filter_map(|o| o.peak_reserved_bytes)
                    .max()
            });
            tips.push(tip(
                "device-shared",
                "warning",
                format!(
                    "{who} is shared: other processes held up to {} while this job ran",
                    fmt_bytes(d.peak_others_bytes)
                ),
                format!(
                    "Memory free when this job started can be taken by the others at any time, so \
                     an OOM here may be contention rather than this job's own size (this job held \
                     {} at its peak{}). Give each job its own GPU (CUDA_VISIBLE_DEVICES), or place \
                     jobs with `memsight plan` from their measured device peaks and cap each one \
                     (torch.cuda.set_per_process_memory_fraction).",
                    own.map(fmt_bytes)
                        .unwrap_or_else(|| "an unknown amount".into()),
                    d.total_bytes
                        .map(|t| format!(" of {}", fmt_bytes(t)))
                        .unwrap_or_default()
                ),
                &[
                    ("device", d.index.into()),
                    ("peak_others_bytes", d.peak_others_bytes.into()),
                    (
                        "job_peak_bytes",
                        own.map(Into::into).unwrap_or(serde_json::Value::Null),
                    ),
                    (
                        "total_bytes",
                        d.total_bytes
                            .map(Into::into)
                            .unwrap_or(serde_json::Value::Null),
                    ),
                ],
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DevicePeak;

    fn report_with(device: DevicePeak) -> Report {
        let mut r: Report =
            serde_json::from_str(include_str!("../../../../docs/report.example.json")).unwrap();
        r.devices = vec![device];
        r
    }

    fn ids(r: &Report) -> Vec<String> {
        derive(r).into_iter().map(|t| t.id).collect()
    }

    /// The RSS tip of a job whose RSS peak (500 MiB) splits into `anon`, `file` and `shmem`, with a
    /// process heap peak of 150 MiB.
    fn rss_tip_of(anon: u64, file: u64, shmem: u64) -> Tip {
        let mut r: Report =
            serde_json::from_str(include_str!("../../../../docs/report.example.json")).unwrap();
        r.peaks.heap_peak_bytes = 150 * MIB;
        r.peaks.tensor_peak_bytes = Some(80 * MIB);
        r.peaks.rss_peak_bytes = Some(500 * MIB);
        let at = r.peaks.rss_peak_sample.clone().unwrap();
        let mut s = r.sample_at(&at).unwrap().clone();
        s.t_ms = at.t_ms;
        s.heap.live_bytes = 150 * MIB;
        s.process = Some(crate::host::ProcessMemory {
            rss: 500 * MIB,
            anon,
            file,
            shmem,
            ..Default::default()
        });
        r.timeline = vec![s];
        r.peaks.jemalloc_resident_peak = None;
        derive(&r)
            .into_iter()
            .find(|t| t.id == "rss-beyond-heap")
            .unwrap()
    }

    #[test]
    fn the_rss_tip_blames_the_largest_part_of_the_gap() {
        let file = rss_tip_of(280 * MIB, 200 * MIB, 20 * MIB);
        assert!(
            file.title
                .contains("3.3× the process heap's peak 150.00 MiB"),
            "{}",
            file.title
        );
        assert!(
            file.advice.contains("200.00 MiB, is file-backed pages"),
            "{}",
            file.advice
        );
        let anon = rss_tip_of(420 * MIB, 60 * MIB, 20 * MIB);
        assert!(
            anon.advice
                .contains("270.00 MiB of anonymous memory beyond the heap"),
            "{}",
            anon.advice
        );
        let shm = rss_tip_of(160 * MIB, 40 * MIB, 300 * MIB);
        assert!(
            shm.advice.contains("shared memory (/dev/shm)"),
            "{}",
            shm.advice
        );
    }

    #[test]
    fn a_device_that_reserved_far_beyond_its_tensors_gets_the_cache_overhead_tip() {
        let gpu = |reserved: u64, allocated: u64| DevicePeak {
            index: 0,
            backend: "libtorch-cuda".into(),
            total_bytes: Some(80 * GIB),
            peak_reserved_bytes: Some(reserved),
            peak_allocated_bytes: Some(allocated),
            ..Default::default()
        };
        let r = report_with(gpu(30 * GIB, 20 * GIB));
        let tip = derive(&r)
            .into_iter()
            .find(|t| t.id == "device-cache-overhead")
            .expect("10 GiB over 20 GiB of tensors");
        assert!(tip.title.contains("10.00 GiB more"), "{}", tip.title);
        assert!(tip.advice.contains("expandable_segments:True"));
        // 1.5 GiB over 28.5 GiB is within the allocator's normal rounding and caching.
        assert!(!ids(&report_with(gpu(30 * GIB, 28 * GIB + GIB / 2)))
            .contains(&"device-cache-overhead".to_string()));
    }

    #[test]
    fn other_processes_on_the_device_give_the_shared_tip() {
        let gpu = |others: u64| DevicePeak {
            index: 1,
            backend: "nvml".into(),
            total_bytes: Some(80 * GIB),
            peak_used_bytes: Some(50 * GIB),
            peak_others_bytes: others,
            ..Default::default()
        };
        let r = report_with(gpu(12 * GIB));
        let tip = derive(&r)
            .into_iter()
            .find(|t| t.id == "device-shared")
            .unwrap();
        assert!(
            tip.title.contains("GPU 1") && tip.title.contains("12.00 GiB"),
            "{}",
            tip.title
        );
        assert!(tip.advice.contains("memsight plan"));
        // Under 5% of an 80 GiB device: a monitoring process, not contention.
        assert!(!ids(&report_with(gpu(3 * GIB))).contains(&"device-shared".to_string()));
    }
}
