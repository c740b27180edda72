//! The job's heap: one figure for a job of several measured processes (a main process and its
//! pool or data-loader workers, ranks and their launcher) — the highest total of their live heaps
//! at one moment — and the host peak `check --max-host-peak` gates and the summary leads with
//! ([`Report::host_peak`]): that figure where it is above the process heap's own peak.

use super::Report;
use crate::timeline::PeakAt;

/// One measured process's heap over time, as the job's total adds it up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapSeries {
    /// Its samples, oldest first: (Unix ms, live heap bytes it holds of its own — a forked
    /// worker's less what it inherited).
    pub samples: Vec<(u64, u64)>,
    /// When it ended (Unix ms): it holds nothing from then on. `None` while it runs.
    pub end_unix_ms: Option<u64>,
}

/// The highest total of the processes' heaps at one moment, up to `until_unix_ms` when given:
/// `(Unix ms, bytes)` of the first moment it was reached. Each process holds, at any moment, what
/// its latest sample said (nothing before its first, nothing after its end). `None` without
/// samples.
pub fn job_heap_peak(series: &[HeapSeries], until_unix_ms: Option<u64>) -> Option<(u64, u64)> {
    // (time, process, what it holds from then); an end is a sample of nothing.
    let mut events: Vec<(u64, usize, u64)> = series
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let samples = s.samples.iter().map(move |&(t, b)| (t, i, b));
            samples.chain(s.end_unix_ms.map(|t| (t, i, 0)))
        })
        .filter(|&(t, _, _)| until_unix_ms.is_none_or(|u| t <= u))
        .collect();
    // Stable: a process's events at one instant keep their order (its last sample, then its end).
    events.sort_by_key(|&(t, _, _)| t);
    let mut held = vec![0u64; series.len()];
    let mut total: u64 = 0;
    let mut best: Option<(u64, u64)> = None;
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        // Every change at one instant before the total is read.
        while i < events.len() && events[i].0 == t {
            let (_, p, b) = events[i];
            total = total - held[p] + b;
            held[p] = b;
            i += 1;
        }
        if best.is_none_or(|(_, b)| total > b) {
            best = Some((t, total));
        }
    }
    best
}

/// The host peak a report's budgets and headline take, with where it was reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPeak {
    /// The bytes.
    pub bytes: u64,
    /// The step it was reached at (the job's figure: the main process's step then).
    pub step: Option<u64>,
    /// The phase it was reached in.
    pub phase: Option<String>,
    /// It is the job's heap (the total of several processes), not one process's.
    pub of_job: bool,
}

impl Report {
    /// The host peak — the one figure `memsight check --max-host-peak` gates and the summary's
    /// headline leads with: the job's heap peak (`peaks.job_heap_peak`, the highest total of its
    /// measured processes' live heaps at one moment) where it is above the process heap's peak,
    /// else the process heap's peak (`peaks.heap_peak_bytes`, exact), so a report of one process
    /// keeps its figure.
    pub fn host_peak(&self) -> HostPeak {
        let p = &self.peaks;
        match &p.job_heap_peak {
            Some(job) if job.bytes > p.heap_peak_bytes => HostPeak {
                bytes: job.bytes,
                // Step 0 of a job that marks no steps is no place.
                step: Some(job.step).filter(|&s| s > 0 || !self.steps.is_empty()),
                phase: job.phase.clone(),
                of_job: true,
            },
            _ => HostPeak {
                bytes: p.heap_peak_bytes,
                step: p.heap_peak_step,
                phase: p.heap_peak_phase.clone(),
                of_job: false,
            },
        }
    }

    /// The job's heap peak placed at the moment `unix_ms` (its step and phase: this report's
    /// process's latest sample then).
    pub fn job_heap_peak_at(&self, unix_ms: u64, bytes: u64) -> PeakAt {
        let t_ms = unix_ms.saturating_sub(self.job.start_unix_ms);
        let then = self
            .timeline
            .iter()
            .take_while(|s| s.t_ms <= t_ms)
            .last()
            .or(self.timeline.first());
        PeakAt {
            bytes,
            t_ms,
            step: then.map_or(0, |s| s.step),
            phase: then.and_then(|s| s.phase.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{job_heap_peak, HeapSeries};
    use crate::report::Report;
    use crate::timeline::PeakAt;

    #[test]
    fn the_host_peak_is_the_job_s_only_above_the_process_s_own() {
        let mut r = Report::default();
        r.peaks.heap_peak_bytes = 100;
        r.peaks.heap_peak_step = Some(3);
        // One process: its own figure, where it was.
        let own = r.host_peak();
        assert_eq!((own.bytes, own.step, own.of_job), (100, Some(3), false));
        // The job's total, sampled, below the exact own peak: still the own.
        r.peaks.job_heap_peak = Some(PeakAt {
            bytes: 90,
            t_ms: 5,
            step: 2,
            phase: None,
        });
        assert_eq!(r.host_peak().bytes, 100);
        r.peaks.job_heap_peak = Some(PeakAt {
            bytes: 300,
            t_ms: 5,
            step: 0,
            phase: None,
        });
        let job = r.host_peak();
        assert_eq!((job.bytes, job.step, job.of_job), (300, None, true));
    }

    fn series(samples: &[(u64, u64)], end: Option<u64>) -> HeapSeries {
        HeapSeries {
            samples: samples.to_vec(),
            end_unix_ms: end,
        }
    }

    #[test]
    fn the_job_s_heap_is_the_total_held_at_one_moment() {
        // A parent holding 3, two workers holding 48 and 96 at once, then ending.
        let parent = series(&[(0, 3), (100, 3), (200, 3), (300, 3)], None);
        let a = series(&[(50, 10), (150, 48)], Some(250));
        let b = series(&[(60, 20), (160, 96)], Some(260));
        assert_eq!(job_heap_peak(&[parent, a, b], None), Some((160, 147)));
    }

    #[test]
    fn processes_that_never_overlap_are_not_added_up() {
        let a = series(&[(0, 100)], Some(50));
        let b = series(&[(100, 80)], Some(150));
        assert_eq!(job_heap_peak(&[a, b], None), Some((0, 100)));
        // Up to a moment: what was held until then.
        let a = series(&[(0, 10), (200, 500)], None);
        assert_eq!(job_heap_peak(&[a], Some(100)), Some((0, 10)));
    }

    #[test]
    fn one_process_s_figure_is_its_highest_sample() {
        let a = series(&[(0, 5), (10, 9), (20, 7)], Some(30));
        assert_eq!(job_heap_peak(&[a], None), Some((10, 9)));
        assert_eq!(job_heap_peak(&[], None), None);
    }
}
