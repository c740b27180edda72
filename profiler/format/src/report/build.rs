//! Assembling a [`Report`] from its parts: one builder for the in-process session and for the
//! sidecar (which rebuilds steps from the flight recorder's snapshots when the job died).

use super::{
    leak, tips, Fragmentation, HistogramBucket, Job, Peaks, Report, TreePeak, SCHEMA_VERSION,
};
use crate::device::{DeviceOom, TensorStats};
use crate::heap::HeapStats;
use crate::host::SourceStatus;
use crate::phase::{PhaseStats, StepStats};
use crate::snapshot::Snapshot;
use crate::timeline::Timeline;
use crate::units::max_opt;

/// Everything a report is made of.
pub struct Parts<'a> {
    /// The profiled process and how it ended.
    pub job: Job,
    /// Sampling interval.
    pub interval_ms: u64,
    /// The bounded timeline (its peaks were computed before any merge).
    pub timeline: &'a Timeline,
    /// Heap counters at the end.
    pub heap: HeapStats,
    /// Phase statistics.
    pub phases: Vec<PhaseStats>,
    /// Step statistics.
    pub steps: Vec<StepStats>,
    /// Size histogram.
    pub histogram: Vec<HistogramBucket>,
    /// Source statuses.
    pub sources: Vec<SourceStatus>,
    /// Tensor counters at the end (their peak is exact), when a tensor backend was installed.
    pub tensors: Option<TensorStats>,
    /// Device OOM events.
    pub device_ooms: Vec<DeviceOom>,
}

/// Builds the report, its peaks' attribution, fragmentation, leak slope and tips.
pub fn build(p: Parts) -> Report {
    let tl = p.timeline;
    let heap = p.heap;
    let sp = tl.peaks();
    // The run's peak: the program may have reset the peak it reads back (`reset_peak`).
    let heap_peak_bytes = heap.run_peak_bytes.max(heap.peak_bytes);
    let (heap_peak_step, heap_peak_phase) = where_peaked(
        &p.steps,
        &p.phases,
        heap_peak_bytes,
        |s| Some(s.peak_bytes),
        |ph| Some(ph.peak_bytes),
    );
    let tensor_peak_bytes = max_opt(
        p.tensors.map(|t| t.peak_bytes),
        sp.tensors.as_ref().map(|b| b.bytes),
    );
    let (tensor_peak_step, tensor_peak_phase) = match tensor_peak_bytes {
        Some(peak) => where_peaked(
            &p.steps,
            &p.phases,
            peak,
            |s| s.tensor_peak_bytes,
            |ph| ph.tensor_peak_bytes,
        ),
        None => (None, None),
    };
    let rss_peak_bytes = max_opt(sp.hwm, sp.rss.as_ref().map(|r| r.bytes));
    let fragmentation = Fragmentation::at_resident_peak(sp.resident.as_ref());
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        memsight_version: env!("CARGO_PKG_VERSION").into(),
        job: p.job,
        interval_ms: p.interval_ms,
        missed_intervals: tl.last().map_or(0, |s| s.missed_intervals),
        peaks: Peaks {
            heap_peak_bytes,
            heap_peak_step,
            heap_peak_phase,
            final_live_bytes: heap.live_bytes,
            rss_peak_bytes,
            rss_peak_sample: sp.rss.clone(),
            jemalloc_resident_peak: sp.resident.as_ref().map(|(p, _)| p.clone()),
            cgroup_usage_peak: sp.cgroup_usage.clone(),
            cgroup_limit_bytes: tl.last().and_then(|s| s.cgroup).and_then(|c| c.limit),
            tensor_peak_bytes,
            tensor_peak_step,
            tensor_peak_phase,
            job_heap_peak: None,
        },
        fragmentation,
        process_tree: sp.tree.clone().map(|(at, tree)| TreePeak { at, tree }),
        leak: leak::estimate(&p.steps),
        phases: p.phases,
        steps: p.steps,
        histogram: p.histogram,
        timeline: tl.samples().to_vec(),
        timeline_merged: tl.merged(),
        sources: p.sources,
        devices: sp.devices.clone(),
        device_ooms: p.device_ooms,
        device_lines: Vec::new(),
        python_arenas: None,
        by_hand: None,
        tips: Vec::new(),
        post_mortem: None,
        heap_profile: None,
        processes: Vec::new(),
        ranks: Vec::new(),
        training: None,
    };
    report.tips = tips::derive(&report);
    report
}

/// How close to a peak a step's or phase's own peak must come to be where the peak was reached: a
/// job that allocates its largest buffer at step 2 and then a few KiB more each step peaks, to the
/// byte, at its last step, but a user asks where the memory came from.
pub const PEAK_REACHED_WITHIN: f64 = 0.005;

/// The least value that counts as having reached `peak` (within [`PEAK_REACHED_WITHIN`] of it):
/// the one rule by which the headline, the phase table, the post-mortem and the viewer say where a
/// peak was first reached.
pub fn reached(peak: u64) -> u64 {
    peak - (peak as f64 * PEAK_REACHED_WITHIN) as u64
}

/// The first step and the innermost phase whose peak windows (read by `step_peak` and
/// `phase_peak`) came within [`PEAK_REACHED_WITHIN`] of `peak`: where it was first reached.
pub(crate) fn where_peaked(
    steps: &[StepStats],
    phases: &[PhaseStats],
    peak: u64,
    step_peak: impl Fn(&StepStats) -> Option<u64>,
    phase_peak: impl Fn(&PhaseStats) -> Option<u64>,
) -> (Option<u64>, Option<String>) {
    let peak = reached(peak);
    let step = steps
        .iter()
        .find(|s| step_peak(s).is_some_and(|v| v >= peak))
        .map(|s| s.step);
    // The phase: the innermost one that came within reach during that step (a phase's
    // `peak_step` follows the same first-reached rule), else the one that came within reach
    // first. Several phases of a flat heap all come within reach; the step decides among them.
    let reached: Vec<&PhaseStats> = phases
        .iter()
        .filter(|ph| phase_peak(ph).is_some_and(|v| v >= peak))
        .collect();
    let depth = |ph: &PhaseStats| ph.path.matches('/').count();
    let phase = reached
        .iter()
        .filter(|ph| step.is_none_or(|s| ph.peak_step == s))
        .max_by_key(|ph| (depth(ph), phase_peak(ph)))
        .or_else(|| {
            reached
                .iter()
                .min_by_key(|ph| (ph.peak_step, std::cmp::Reverse(depth(ph))))
        })
        .map(|ph| ph.path.clone());
    (step, phase)
}

/// Step statistics recovered from samples (the sidecar's view when the job could not write its
/// own): each step's highest sampled live heap and its live heap at the last sample of the step.
pub fn steps_from_snapshots(samples: &[Snapshot]) -> Vec<StepStats> {
    let mut steps: Vec<StepStats> = Vec::new();
    for s in samples {
        add_step_sample(&mut steps, s);
    }
    steps
}

/// Folds one sample into step statistics recovered from samples; true when it started a new step.
pub fn add_step_sample(steps: &mut Vec<StepStats>, s: &Snapshot) -> bool {
    match steps.last_mut() {
        Some(last) if last.step == s.step => {
            last.peak_bytes = last.peak_bytes.max(s.heap.live_bytes);
            last.live_end_bytes = s.heap.live_bytes;
            if let Some(t) = s.tensors {
                last.tensor_peak_bytes =
                    Some(last.tensor_peak_bytes.unwrap_or(0).max(t.live_bytes));
            }
            false
        }
        _ => {
            steps.push(StepStats {
                step: s.step,
                peak_bytes: s.heap.live_bytes,
                live_end_bytes: s.heap.live_bytes,
                tensor_peak_bytes: s.tensors.map(|t| t.live_bytes),
            });
            true
        }
    }
}
