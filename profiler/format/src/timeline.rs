//! The bounded timeline of snapshots, and the exact peaks seen by every sample.
//!
//! At most `capacity` snapshots are kept (default 3000: a week-long job's report stays well under
//! 2 MB), spread evenly over the whole run: the run is cut into buckets of equal width, one
//! snapshot kept per bucket — the one with the largest footprint, so spikes survive — and when
//! the buckets outnumber the capacity their width doubles and neighbours merge. The beginning of
//! a day-long run is kept at the same resolution as its end. The latest snapshot is always kept
//! as it came. Peaks are tracked on every pushed sample, before any merge, so they are exact
//! whatever was merged.

use crate::snapshot::Snapshot;
use serde::{Deserialize, Serialize};

/// Default number of snapshots kept.
pub const DEFAULT_CAPACITY: usize = 3000;

/// Where and when a series reached its maximum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeakAt {
    /// The maximum value, in bytes.
    pub bytes: u64,
    /// Milliseconds since session start.
    pub t_ms: u64,
    /// Step at that moment.
    pub step: u64,
    /// Phase at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

impl PeakAt {
    /// `bytes` at the moment of snapshot `s`.
    pub fn at(bytes: u64, s: &Snapshot) -> Self {
        PeakAt {
            bytes,
            t_ms: s.t_ms,
            step: s.step,
            phase: s.phase.clone(),
        }
    }
}

/// Running maxima over every sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledPeaks {
    /// The first sample to show the run's process-heap peak (the exact counter,
    /// `HeapStats::run_peak_bytes`): the peak was reached in the interval before it.
    pub heap: Option<PeakAt>,
    /// Highest RSS seen in a sample.
    pub rss: Option<PeakAt>,
    /// Highest kernel RSS high-water mark reported.
    pub hwm: Option<u64>,
    /// Highest jemalloc resident seen (the first sample to reach it), with that sample: where the
    /// run's fragmentation is measured ([`crate::report::Fragmentation::at_resident_peak`]).
    pub resident: Option<(PeakAt, Snapshot)>,
    /// The process tree with the largest footprint (PSS total) seen; `bytes` is that footprint.
    pub tree: Option<(PeakAt, crate::host::ProcessTree)>,
    /// Highest cgroup usage seen.
    pub cgroup_usage: Option<PeakAt>,
    /// Highest sampled live tensor bytes (the exact peak is in the tensor counters).
    pub tensors: Option<PeakAt>,
    /// Per device and backend.
    pub devices: Vec<crate::device::DevicePeak>,
}

/// Keeps in `slot` the sample with the highest jemalloc resident bytes, the first to reach it.
pub fn raise_resident(slot: &mut Option<(PeakAt, Snapshot)>, s: &Snapshot) {
    if let Some(j) = s.jemalloc {
        if slot.as_ref().is_none_or(|(p, _)| j.resident > p.bytes) {
            *slot = Some((PeakAt::at(j.resident, s), s.clone()));
        }
    }
}

/// Keeps in `slot` the first tree with the highest footprint; a sample whose PSS could not be read
/// (a process exiting as it was read) does not win on its larger RSS sum.
fn raise_tree(slot: &mut Option<(PeakAt, crate::host::ProcessTree)>, s: &Snapshot) {
    let key = |t: &crate::host::ProcessTree| (t.total_pss.is_some(), t.footprint());
    if let Some(t) = &s.tree {
        if slot.as_ref().is_none_or(|(_, old)| key(t) > key(old)) {
            *slot = Some((PeakAt::at(t.footprint(), s), t.clone()));
        }
    }
}

fn raise(slot: &mut Option<PeakAt>, v: u64, s: &Snapshot) {
    if slot.as_ref().is_none_or(|p| v > p.bytes) {
        *slot = Some(PeakAt::at(v, s));
    }
}

/// A bounded, peak-preserving series of snapshots.
#[derive(Clone, Debug)]
pub struct Timeline {
    samples: Vec<Snapshot>,
    capacity: usize,
    /// The width of a bucket in milliseconds (doubles as the run outgrows the capacity).
    bucket_ms: u64,
    merged: u64,
    peaks: SampledPeaks,
}

/// What a bucket keeps of its snapshots: the one with the largest footprint (heap, RSS, tensors
/// or device memory, whichever is largest), the first on a tie.
fn footprint(s: &Snapshot) -> u64 {
    let devices = s
        .devices
        .iter()
        .map(|d| d.reserved_bytes.or(d.used_bytes).unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    s.heap
        .live_bytes
        .max(s.process.map_or(0, |p| p.rss))
        .max(s.tensors.map_or(0, |t| t.live_bytes))
        .max(devices)
}

/// Keeps in `kept` the larger of two snapshots of one bucket (the earlier on a tie); `other`, left
/// with the smaller, is then dropped by the caller.
fn merge_into(kept: &mut Snapshot, other: &mut Snapshot) {
    if footprint(other) > footprint(kept) {
        std::mem::swap(kept, other);
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl Timeline {
    /// An empty timeline keeping at most `capacity` (≥ 8) snapshots.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(8);
        Timeline {
            // Grows as samples arrive: a short job does not pay for 3000 snapshots up front.
            samples: Vec::new(),
            capacity,
            bucket_ms: 1,
            merged: 0,
            peaks: SampledPeaks::default(),
        }
    }

    /// Appends a snapshot, compacting old history when full.
    pub fn push(&mut self, s: Snapshot) {
        if s.heap.allocations > 0 {
            let peak = s.heap.run_peak_bytes.max(s.heap.peak_bytes);
            raise(&mut self.peaks.heap, peak, &s);
        }
        if let Some(p) = s.process {
            raise(&mut self.peaks.rss, p.rss, &s);
            self.peaks.hwm = Some(self.peaks.hwm.unwrap_or(0).max(p.hwm));
        }
        if let Some(c) = s.cgroup {
            raise(&mut self.peaks.cgroup_usage, c.usage, &s);
        }
        if let Some(t) = s.tensors {
            raise(&mut self.peaks.tensors, t.live_bytes, &s);
        }
        crate::device::fold_peaks(&mut self.peaks.devices, &s.devices);
        raise_resident(&mut self.peaks.resident, &s);
        raise_tree(&mut self.peaks.tree, &s);
        self.samples.push(s);
        // The snapshot before the latest joins its predecessor when they share a bucket.
        let n = self.samples.len();
        if n >= 3 && self.same_bucket(&self.samples[n - 3], &self.samples[n - 2]) {
            let mut later = self.samples.remove(n - 2);
            merge_into(&mut self.samples[n - 3], &mut later);
            self.merged += 1;
        }
        while self.samples.len() > self.capacity {
            self.widen();
        }
    }

    fn same_bucket(&self, a: &Snapshot, b: &Snapshot) -> bool {
        a.t_ms / self.bucket_ms == b.t_ms / self.bucket_ms
    }

    /// Doubles the bucket width and merges the snapshots (all but the latest) that now share one,
    /// in place: the storage is not allocated again (a profiler's own timeline that grew or moved
    /// in the job's heap read as a leak of the job).
    fn widen(&mut self) {
        self.bucket_ms = self.bucket_ms.saturating_mul(2);
        let Some(latest) = self.samples.pop() else {
            return;
        };
        let bucket = self.bucket_ms;
        let before = self.samples.len();
        // `later` is dropped when it shares `kept`'s bucket, merged into it first.
        self.samples.dedup_by(|later, kept| {
            let same = kept.t_ms / bucket == later.t_ms / bucket;
            if same {
                merge_into(kept, later);
            }
            same
        });
        self.merged += (before - self.samples.len()) as u64;
        self.samples.push(latest);
    }

    /// The bytes the timeline's snapshot storage takes (its capacity, not its length): what a
    /// session's own records hold in the job's heap (the snapshots' phase names aside).
    pub fn storage_bytes(&self) -> usize {
        self.samples.capacity() * std::mem::size_of::<Snapshot>()
    }

    /// The width of a bucket now: the time between kept snapshots.
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// The snapshots kept, oldest first.
    pub fn samples(&self) -> &[Snapshot] {
        &self.samples
    }

    /// The most recent snapshot.
    pub fn last(&self) -> Option<&Snapshot> {
        self.samples.last()
    }

    /// How many snapshots were merged away to stay bounded.
    pub fn merged(&self) -> u64 {
        self.merged
    }

    /// Maxima over every snapshot ever pushed.
    pub fn peaks(&self) -> &SampledPeaks {
        &self.peaks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::ProcessMemory;

    fn snap(t: u64, live: u64) -> Snapshot {
        let mut s = Snapshot {
            t_ms: t,
            step: t / 10,
            ..Default::default()
        };
        s.heap.live_bytes = live;
        s.process = Some(ProcessMemory {
            rss: live * 2,
            hwm: live * 2,
            ..Default::default()
        });
        s
    }

    #[test]
    fn stays_bounded_and_keeps_spikes() {
        let mut tl = Timeline::with_capacity(100);
        for t in 0..10_000u64 {
            let live = if t == 1234 { 1 << 40 } else { t % 7 };
            tl.push(snap(t, live));
        }
        assert!(tl.samples().len() <= 100);
        assert!(
            tl.samples().iter().any(|s| s.heap.live_bytes == 1 << 40),
            "spike merged away"
        );
        assert_eq!(tl.peaks().rss.as_ref().unwrap().bytes, 2 << 40);
        assert_eq!(tl.peaks().rss.as_ref().unwrap().t_ms, 1234);
        assert_eq!(tl.samples().last().unwrap().t_ms, 9999);
        assert!(tl.samples().windows(2).all(|w| w[0].t_ms < w[1].t_ms));
        assert_eq!(tl.merged() as usize + tl.samples().len(), 10_000);
    }

    #[test]
    fn a_long_run_keeps_its_whole_history_evenly() {
        // 120 s sampled every millisecond (the break-it case: nothing of 0–40 s was left).
        let mut tl = Timeline::with_capacity(2376);
        for t in 0..120_000u64 {
            tl.push(snap(t, 1 + t % 13));
        }
        let kept = tl.samples();
        assert!(
            kept.len() <= 2376 && kept.len() > 2376 / 3,
            "{} kept",
            kept.len()
        );
        let in_range = |a: u64, b: u64| kept.iter().filter(|s| (a..b).contains(&s.t_ms)).count();
        // Each third of the run holds about a third of what is kept.
        for (a, b) in [(0, 40_000), (40_000, 80_000), (80_000, 120_000)] {
            let n = in_range(a, b);
            assert!(
                n * 4 >= kept.len(),
                "{n} of {} kept samples in {a}..{b} ms",
                kept.len()
            );
        }
        assert!(kept[0].t_ms < 120, "first kept at {} ms", kept[0].t_ms);
        assert_eq!(
            kept.last().unwrap().t_ms,
            119_999,
            "the latest is kept as it came"
        );
        let widest = kept
            .windows(2)
            .map(|w| w[1].t_ms - w[0].t_ms)
            .max()
            .unwrap();
        assert!(
            widest <= 2 * tl.bucket_ms(),
            "gap {widest} ms, buckets {}",
            tl.bucket_ms()
        );
    }

    #[test]
    fn a_week_at_ten_hertz_stays_bounded_with_its_spikes_and_exact_peaks() {
        let mut tl = Timeline::default();
        let week_ms = 7 * 24 * 3600 * 1000u64;
        let spike_at = 3 * 24 * 3600 * 1000u64;
        for t in (0..week_ms).step_by(100) {
            let live = if t == spike_at { 1 << 40 } else { 1000 + t % 7 };
            tl.push(snap(t, live));
        }
        assert!(tl.samples().len() <= DEFAULT_CAPACITY);
        assert!(tl.samples().iter().any(|s| s.heap.live_bytes == 1 << 40));
        assert_eq!(tl.peaks().rss.as_ref().unwrap().t_ms, spike_at);
        assert!(tl.samples()[0].t_ms < week_ms / 1000);
    }
}
