//! The training window: the run up to the moment training ended (a Python job's interpreter
//! starting its exit, or `memsight::end_training()`), its peaks, and the report as budgets see it
//! by default ([`Report::within_training`]). What follows is the `shutdown` phase: an
//! interpreter's teardown touches file pages and frees everything, and must neither be credited to
//! the last training step nor fail a budget meant for training.

use super::{build, Report};
use crate::timeline::Timeline;
use serde::{Deserialize, Serialize};

/// The phase that follows the training window.
pub const SHUTDOWN_PHASE: &str = "shutdown";

/// When training ended and what it held until then (exact counters read at that instant).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingWindow {
    /// When training ended, Unix milliseconds.
    pub end_unix_ms: u64,
    /// What ended it: `interpreter exit` (a Python job's exit starting) or `end_training` (the
    /// program said so).
    pub ended_by: String,
    /// The last step marked before the end (none when the job marked no step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<u64>,
    /// The run's heap peak up to the end: exact, the same counter as `peaks.heap_peak_bytes`.
    pub heap_peak_bytes: u64,
    /// The kernel's RSS high-water mark at the end (`VmHWM`), when readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_peak_bytes: Option<u64>,
    /// The tensor peak up to the end (with a tensor backend installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_bytes: Option<u64>,
    /// The job's heap peak up to the end (`peaks.job_heap_peak`'s figure over the window), in the
    /// report of a job of several measured processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_heap_peak: Option<crate::timeline::PeakAt>,
}

impl Report {
    /// The report as the training window saw it: the peaks are the window's, each placed (step,
    /// phase, sample) within the window; the `shutdown` phase and the samples after the end are
    /// left out. A report without a training window is returned as it is (the whole run).
    pub fn within_training(&self) -> Report {
        let Some(w) = &self.training else {
            return self.clone();
        };
        let mut r = self.clone();
        let cut_ms = w.end_unix_ms.saturating_sub(self.job.start_unix_ms);
        r.timeline.retain(|s| s.t_ms <= cut_ms);
        r.phases.retain(|p| {
            p.path != SHUTDOWN_PHASE && !p.path.starts_with(&format!("{SHUTDOWN_PHASE}/"))
        });
        // The window's sampled peaks, kept as the timeline keeps them for the whole run.
        let mut window = Timeline::default();
        for s in &r.timeline {
            window.push(s.clone());
        }
        let sampled = window.peaks();
        if r.process_tree.is_some() {
            r.process_tree = sampled
                .tree
                .clone()
                .map(|(at, tree)| super::TreePeak { at, tree });
        }
        let heap_peak = w.heap_peak_bytes.min(self.peaks.heap_peak_bytes);
        let (heap_step, heap_phase) = build::where_peaked(
            &r.steps,
            &r.phases,
            heap_peak,
            |s| Some(s.peak_bytes),
            |ph| Some(ph.peak_bytes),
        );
        let tensor_at = w.tensor_peak_bytes.map(|t| {
            let (step, phase) = build::where_peaked(
                &r.steps,
                &r.phases,
                t,
                |s| s.tensor_peak_bytes,
                |ph| ph.tensor_peak_bytes,
            );
            (t, step, phase)
        });
        let p = &mut r.peaks;
        p.heap_peak_bytes = heap_peak;
        (p.heap_peak_step, p.heap_peak_phase) = (heap_step, heap_phase);
        let sampled_rss = sampled.rss.clone();
        p.rss_peak_bytes =
            crate::units::max_opt(w.rss_peak_bytes, sampled_rss.as_ref().map(|a| a.bytes))
                .or(p.rss_peak_bytes);
        p.rss_peak_sample = sampled_rss.or(p.rss_peak_sample.take());
        if p.job_heap_peak.is_some() {
            p.job_heap_peak = w.job_heap_peak.clone();
        }
        if let Some((t, step, phase)) = tensor_at {
            p.tensor_peak_bytes = Some(t);
            (p.tensor_peak_step, p.tensor_peak_phase) = (step, phase);
        }
        r
    }

    /// What the shutdown after training added to the whole run's peaks, as one line for people
    /// (`None` without a training window, or when shutdown raised no peak).
    pub fn shutdown_note(&self) -> Option<String> {
        use crate::units::fmt_bytes;
        let w = self.training.as_ref()?;
        let mut parts = Vec::new();
        if let (Some(all), Some(win)) = (self.peaks.rss_peak_bytes, w.rss_peak_bytes) {
            if all > win {
                parts.push(format!(
                    "RSS peak {} (training {})",
                    fmt_bytes(all),
                    fmt_bytes(win)
                ));
            }
        }
        if self.peaks.heap_peak_bytes > w.heap_peak_bytes {
            parts.push(format!(
                "heap peak {} (training {})",
                fmt_bytes(self.peaks.heap_peak_bytes),
                fmt_bytes(w.heap_peak_bytes)
            ));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "the shutdown after training raised the {}; budgets gate the training window \
                 (`memsight check --whole-run` gates the whole run)",
                parts.join(" and ")
            )
        })
    }
}
