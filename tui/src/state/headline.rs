//! The report's headline while the job runs, and the figures the Overview states. Live, the
//! report is built by the same builder the job and the sidecar use (peaks and where each was
//! first reached, device peaks, fragmentation, tips) from what the viewer has received; replayed,
//! it is the file's. The figures are the job's peaks — device, tensors, process heap, RSS, process
//! tree — each with the step and phase where it was first reached.

use super::ViewerState;
use memsight_format::device::{DevicePeak, DeviceSample};
use memsight_format::report::build::{build, reached, Parts};
use memsight_format::report::{Job, Report, OUTSIDE_MARKS};
use memsight_format::Snapshot;

/// Job time between two rebuilds of the live report (it clones the bounded timeline, at most
/// 3000 snapshots): its figures lag the samples by at most this much.
const REBUILD_EVERY_MS: u64 = 250;

/// One headline figure: a peak and where it was first reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// What it counts: `process heap`, `tensors`, `RSS`, `tree PSS`, `cuda:0 reserved`.
    pub what: String,
    /// The peak, in bytes.
    pub bytes: u64,
    /// The step where it was first reached.
    pub step: Option<u64>,
    /// The innermost phase where it was first reached.
    pub phase: Option<String>,
    /// Said in place of the step and phase when they do not apply.
    pub note: Option<&'static str>,
}

impl Figure {
    fn new(what: impl Into<String>, bytes: u64, step: Option<u64>, phase: Option<&str>) -> Self {
        Figure {
            what: what.into(),
            bytes,
            step,
            phase: phase.map(str::to_string),
            note: None,
        }
    }
}

/// The report's peaks as figures, what dominates an ML job first (as the summary orders them):
/// device memory, tensors, the process heap, RSS, the process tree's PSS. A device's step and phase
/// are those of the first sample of `timeline` within [`PEAK_REACHED_WITHIN`](memsight_format::report::build::PEAK_REACHED_WITHIN) of its peak.
pub fn figures(r: &Report, timeline: &[Snapshot]) -> Vec<Figure> {
    let p = &r.peaks;
    let mut out: Vec<Figure> = r
        .devices
        .iter()
        .flat_map(|d| device_figures(d, timeline))
        .collect();
    if let Some(t) = p.tensor_peak_bytes {
        out.push(Figure::new(
            "tensors",
            t,
            p.tensor_peak_step,
            p.tensor_peak_phase.as_deref(),
        ));
    }
    if r.heap_measured() {
        let mut f = Figure::new(
            "process heap",
            p.heap_peak_bytes,
            p.heap_peak_step,
            p.heap_peak_phase.as_deref(),
        );
        if r.heap_peaked_outside_marks() {
            f.note = Some(OUTSIDE_MARKS);
        }
        out.push(f);
    }
    if let Some(rss) = p.rss_peak_bytes {
        let at = p.rss_peak_sample.as_ref();
        out.push(Figure::new(
            "RSS",
            rss,
            at.map(|a| a.step),
            at.and_then(|a| a.phase.as_deref()),
        ));
    }
    if let Some(tp) = r
        .process_tree
        .as_ref()
        .filter(|t| t.tree.processes.len() > 1)
    {
        out.push(Figure::new(
            format!("tree PSS ({} proc.)", tp.tree.processes.len()),
            tp.at.bytes,
            Some(tp.at.step),
            tp.at.phase.as_deref(),
        ));
    }
    out
}

/// A device's footprint peak (reserved, else driver-used) and its allocated peak, each where the
/// timeline first came within [`PEAK_REACHED_WITHIN`](memsight_format::report::build::PEAK_REACHED_WITHIN) of it.
fn device_figures(d: &DevicePeak, timeline: &[Snapshot]) -> Vec<Figure> {
    let first = |peak: u64, of: &dyn Fn(&DeviceSample) -> Option<u64>| {
        let near = reached(peak);
        timeline.iter().find(|s| {
            s.devices.iter().any(|x| {
                x.index == d.index && x.backend == d.backend && of(x).is_some_and(|v| v >= near)
            })
        })
    };
    let mut out = Vec::new();
    let reserved = d.peak_reserved_bytes.map(|p| ("reserved", p));
    let used = d.peak_used_bytes.map(|p| ("used", p));
    if let Some((what, peak)) = reserved.or(used) {
        let at = first(peak, &|x| {
            if what == "reserved" {
                x.peak_reserved_bytes.max(x.reserved_bytes)
            } else {
                x.used_bytes
            }
        });
        out.push(Figure::new(
            format!("cuda:{} {what}", d.index),
            peak,
            at.map(|s| s.step),
            at.and_then(|s| s.phase.as_deref()),
        ));
    }
    if let Some(peak) = d.peak_allocated_bytes {
        let at = first(peak, &|x| x.peak_allocated_bytes.max(x.allocated_bytes));
        out.push(Figure::new(
            format!("cuda:{} allocated", d.index),
            peak,
            at.map(|s| s.step),
            at.and_then(|s| s.phase.as_deref()),
        ));
    }
    out
}

impl ViewerState {
    /// Rebuilds the live report when it is due: at most every [`REBUILD_EVERY_MS`] of the job's time, or when
    /// `now` (the job ended, a device ran out of memory, the first phases arrived).
    pub(super) fn refresh_report(&mut self, now: bool) {
        if !matches!(self.source, super::Source::Live { .. }) {
            return;
        }
        let Some(last) = self.recorded.last() else {
            return;
        };
        let t = last.t_ms;
        if !now && self.report.is_some() && t < self.built_at_ms + REBUILD_EVERY_MS {
            return;
        }
        self.built_at_ms = t;
        let heap = last.heap;
        let tensors = last.tensors;
        let mut r = build(Parts {
            job: Job {
                pid: self.pid,
                command: self.command.clone(),
                ..Job::default()
            },
            interval_ms: self.interval_ms.unwrap_or(0),
            timeline: &self.recorded,
            heap,
            phases: self.phases.clone(),
            steps: self.steps.clone(),
            histogram: self.histogram.clone(),
            sources: Vec::new(),
            tensors,
            device_ooms: self.device_ooms.clone(),
        });
        // The charts keep their own (longer) history.
        r.timeline = Vec::new();
        // Live steps are sampled, so the exact heap peak may exceed every step's sampled peak:
        // the first sample that showed it says where it was reached.
        if r.peaks.heap_peak_step.is_none() {
            if let Some(at) = &self.recorded.peaks().heap {
                r.peaks.heap_peak_step = Some(at.step);
                r.peaks.heap_peak_phase = r.peaks.heap_peak_phase.take().or(at.phase.clone());
            }
        }
        if self.heap_profile.is_some() {
            r.set_heap_profile(self.heap_profile.clone());
        }
        self.tips = r.tips.clone();
        self.report = Some(r);
    }
}
