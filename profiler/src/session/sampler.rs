//! The session's sampler: the state a session shares with its sampling thread, one snapshot per
//! interval into the timeline and the flight recorder, and missed intervals counted.

use super::own_snapshot;
use crate::collect::HostCollector;
use crate::heapprof;
use crate::phases;
use crate::sys::lock;
use memsight_format::snapshot::Snapshot;
use memsight_format::timeline::Timeline;
use memsight_format::wire::ring::RingWriter;
use memsight_format::wire::Record;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a session shares with its sampling thread.
pub(super) struct Shared {
    pub(super) started: Instant,
    /// Where heap profiles go, or why there are none.
    pub(super) heap_profile: Result<String, String>,
    pub(super) started_unix_ms: u64,
    pub(super) ring: Option<&'static RingWriter>,
    pub(super) timeline: Mutex<Timeline>,
    pub(super) collector: Mutex<HostCollector>,
    pub(super) stop: Mutex<bool>,
    pub(super) wake: Condvar,
    /// Sampling intervals that passed without a sample (the sampler ran late).
    pub(super) missed: AtomicU64,
    /// A step began since the last sample ([`Shared::nudge`]).
    pub(super) nudged: AtomicBool,
}

/// The shortest time between a sample and one a step's start asks for, as a share of the interval
/// (at least 1 ms): a job that steps faster than half the interval gets at most twice the samples,
/// so what watching costs stays proportional to the interval the user chose. The demo job (46 ms
/// steps; `sidecar-bench --job mlp`): the sidecar took 0.79–0.85% of a core with no step samples,
/// 0.93–0.99% with one at every step (a 25 ms gap), 0.90–0.94% at half the interval.
const NUDGES_PER_INTERVAL: u32 = 2;

/// Writes a sample to the flight recorder. A sample whose device segment maps make it larger than
/// a ring slot (48 segments of an H100 training job: 10 KB against 4 KiB slots, docs/gpu.md) keeps
/// only its largest segments, halving until it fits, so the sample itself is never lost; the
/// job's own report keeps the full maps.
pub(super) fn append_snapshot(ring: &RingWriter, s: &Snapshot) {
    let mut rec = Record::Snapshot(Box::new(s.clone()));
    while !ring.try_append(&rec) {
        let Record::Snapshot(t) = &mut rec else {
            return;
        };
        let longest = t
            .devices
            .iter()
            .map(|d| d.segments.len())
            .max()
            .unwrap_or(0);
        if longest == 0 {
            ring.count_unwritten();
            return;
        }
        for d in &mut t.devices {
            d.segments.truncate(longest / 2);
        }
    }
}

impl Shared {
    /// Keeps a snapshot in the timeline and, when a sidecar watches, in the flight recorder.
    pub(super) fn record(&self, s: Snapshot) {
        if let Some(r) = &self.ring {
            append_snapshot(r, &s);
        }
        self.record_signals();
        let mut timeline = lock(&self.timeline);
        // The steps' live bytes leave memsight's own records out (see `phases::steps`).
        crate::phases::own_timeline_bytes(|| {
            timeline.push(s);
            timeline.storage_bytes()
        });
    }

    /// Writes the signals this process sent since the last sample to the flight recorder.
    pub(super) fn record_signals(&self) {
        if let Some(r) = &self.ring {
            for rec in super::signals::drain() {
                r.append(&rec);
            }
        }
    }

    /// Writes the phase statistics and the size histogram so far to the flight recorder (when a
    /// sidecar may be reading): viewers show them while the job runs.
    pub(super) fn record_phases(&self) {
        if let Some(r) = &self.ring {
            r.append(&Record::Phases {
                phases: phases::phase_stats(),
                histogram: memsight_format::report::histogram_buckets(
                    &crate::alloc::size_histogram(),
                ),
            });
        }
    }

    pub(super) fn sample(&self) -> Snapshot {
        let host = lock(&self.collector).sample();
        let mut s = own_snapshot(self.started.elapsed().as_millis() as u64, host);
        s.missed_intervals = self.missed.load(Ordering::Relaxed);
        s
    }

    /// Asks for a sample now, with the phase totals: a step began. The flight recorder then says
    /// the step the job is in even when it dies before the next interval (an abort 60 ms into step
    /// 3 read "at step 2"). Cheap for the caller: one flag, and a wake-up only when it was clear.
    /// Only a step's start asks: a step starts where a loop holds least, while its phases change
    /// around its peak: samples asked for there (the snapshot's own allocations, at that moment)
    /// made nanoGPT's sites at the peak differ from memray's in 2 of 6 runs; 0 of 8 without them,
    /// 0 of 6 with the steps' alone.
    pub(super) fn nudge(&self) {
        if !self.nudged.swap(true, Ordering::AcqRel) {
            // Under the sampler's lock, so the wake-up cannot fall between its look at the flag
            // and its wait.
            let _held = lock(&self.stop);
            self.wake.notify_all();
        }
    }

    pub(super) fn run(&self, interval: Duration) {
        let mut next = Instant::now() + interval;
        let mut last = Instant::now();
        // At least 1 ms: samples a millisecond apart keep timestamps of their own (the timeline
        // merges samples that share one).
        let min_gap = (interval / NUDGES_PER_INTERVAL).max(Duration::from_millis(1));
        let mut ticks: u64 = 0;
        let phase_every = (250 / interval.as_millis().max(1) as u64).max(1);
        loop {
            let mut stop = lock(&self.stop);
            let mut nudged = false;
            while !*stop {
                let now = Instant::now();
                if now >= next {
                    break;
                }
                let mut until = next;
                if self.nudged.load(Ordering::Acquire) {
                    let soonest = last + min_gap;
                    if now >= soonest {
                        nudged = true;
                        break;
                    }
                    until = until.min(soonest);
                }
                stop = self
                    .wake
                    .wait_timeout(stop, until - now)
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            if *stop {
                return;
            }
            drop(stop);
            // Cleared before the sample: a change during it asks again.
            self.nudged.store(false, Ordering::Release);
            let s = self.sample();
            last = Instant::now();
            if nudged {
                // Off the schedule: the regular samples keep their times, but one due sooner than
                // the gap is left out (this sample stands for it), so no two samples are closer.
                self.record(s);
                self.record_phases();
                if next.saturating_duration_since(last) < min_gap {
                    next += interval;
                }
                continue;
            }
            heapprof::on_sample(s.heap.live_bytes, s.step);
            self.record(s);
            ticks += 1;
            // Phase totals about 4 times a second, so a sidecar has them even if the job is killed.
            if ticks.is_multiple_of(phase_every) {
                self.record_phases();
            }
            // Fixed-rate schedule; after a stall, resume from now instead of bursting, and count
            // the intervals that got no sample.
            next += interval;
            let now = Instant::now();
            if next < now {
                let late = (now - next).as_nanos().div_ceil(interval.as_nanos().max(1));
                self.missed
                    .fetch_add(u64::try_from(late).unwrap_or(u64::MAX), Ordering::Relaxed);
                next = now + interval;
            }
        }
    }
}

#[cfg(test)]
mod ring_sample_tests {
    use super::*;
    use crate::devices::{DeviceSample, SegmentMap};
    use memsight_format::wire::ring::RingReader;

    /// A snapshot of one device with `n` segments, largest first, with uneven cells.
    fn with_segments(n: u64) -> (Snapshot, Vec<SegmentMap>) {
        let segments: Vec<SegmentMap> = (0..n)
            .map(|i| SegmentMap {
                bytes: (n - i) << 21,
                allocated_bytes: (n - 1 - i) << 20,
                cells: (0..32).map(|c| ((c * 37 + i * 11) % 256) as u8).collect(),
            })
            .collect();
        let s = Snapshot {
            devices: vec![DeviceSample {
                backend: "libtorch-cuda".into(),
                segments: segments.clone(),
                ..Default::default()
            }],
            ..Default::default()
        };
        (s, segments)
    }

    #[test]
    fn a_sample_with_an_h100_sized_segment_map_still_reaches_the_ring() {
        let dir = std::env::temp_dir().join(format!("memsight-seg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ring.bin");
        let _ = std::fs::remove_file(&path);
        let ring = RingWriter::create(&path, 1, 0, 100).unwrap();
        // 48 segments, largest first, with uneven cells: about 10 KB of JSON.
        let (s, segments) = with_segments(48);
        append_snapshot(&ring, &s);
        let got = RingReader::open(&path).unwrap().poll_final();
        let _ = std::fs::remove_dir_all(&dir);
        let Some(Record::Snapshot(back)) = got.first() else {
            panic!("the sample was lost: {got:?}");
        };
        // About 10 KB: spread over three 4 KiB slots, whole.
        assert_eq!(back.devices[0].segments, segments);
    }

    #[test]
    fn a_sample_too_large_for_the_ring_keeps_its_largest_segments_and_is_not_dropped() {
        let dir = std::env::temp_dir().join(format!("memsight-seg-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ring.bin");
        let _ = std::fs::remove_file(&path);
        let ring = RingWriter::create(&path, 1, 0, 100).unwrap();
        // 3,000 segments: about 600 KB of JSON, over a quarter of the 1 MiB ring.
        let (s, segments) = with_segments(3000);
        append_snapshot(&ring, &s);
        let mut reader = RingReader::open(&path).unwrap();
        let got = reader.poll_final();
        let _ = std::fs::remove_dir_all(&dir);
        let Some(Record::Snapshot(back)) = got.first() else {
            panic!("the sample was lost: {got:?}");
        };
        let kept = &back.devices[0].segments;
        assert!(!kept.is_empty() && kept.len() < 3000, "{}", kept.len());
        assert_eq!(
            kept[..],
            segments[..kept.len()],
            "the largest segments are kept"
        );
        assert_eq!(reader.dropped(), 0, "a trimmed sample is not a dropped one");
    }
}
