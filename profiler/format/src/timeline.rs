//! The bounded timeline of snapshots, and the exact peaks seen by every sample.
//!
//! At most `capacity` snapshots are kept (default 3000: a 24-hour job's report stays well under
//! 2 MB). When full, the older three quarters are halved by merging neighbours, keeping the one
//! with the higher live heap, so spikes survive while resolution of old history drops. Peaks are
//! tracked on every pushed sample, before any merge, so they are exact whatever was merged.

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
    merged: u64,
    peaks: SampledPeaks,
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
        if self.samples.len() >= self.capacity {
            self.compact();
        }
        self.samples.push(s);
    }

    fn compact(&mut self) {
        let old = self.samples.len() * 3 / 4;
        let mut kept: Vec<Snapshot> = Vec::with_capacity(self.capacity);
        for pair in self.samples[..old].chunks(2) {
            let best = pair
                .iter()
                .max_by_key(|s| s.heap.live_bytes)
                .cloned()
                .unwrap_or_default();
            kept.push(best);
        }
        self.merged += (old - old.div_ceil(2)) as u64;
        kept.extend(self.samples.drain(old..));
        self.samples = kept;
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
}
