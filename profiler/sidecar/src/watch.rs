//! What the sidecar gathers from the job's flight recorder while it runs: the timeline, the
//! job's greeting, phases, device OOMs, heap profiles, drops and allocation failures.

use crate::outputs::Outputs;
use memsight_format::snapshot::Snapshot;
use memsight_format::timeline::Timeline;
use memsight_format::wire::ring::RingReader;
use memsight_format::wire::Record;
use std::path::PathBuf;

/// What the sidecar gathered while the job ran.
pub(crate) struct Watch {
    pub timeline: Timeline,
    /// Keeps what it takes without telling viewers (outside samples of a job whose ring may still
    /// open and replace them); [`Watch::speak`] tells them.
    pub quiet: bool,
    /// Tells viewers nothing (a process of the job that is not the one they follow).
    pub silent: bool,
    /// Heap and role by pid of the job's measured processes, put into the process trees added.
    pub notes: std::collections::HashMap<u32, (Option<u64>, String)>,
    /// The job's session told it finished (its ring then goes quiet by design).
    pub finished: bool,
    pub hello: Option<Record>,
    pub finished_report: Option<PathBuf>,
    pub ring_start_unix_ms: Option<u64>,
    pub dropped: u64,
    /// Ring drops already told to viewers.
    dropped_told: u64,
    pub alloc_failures: (u64, u64),
    /// Where the process was when an allocation first failed (wire 1.10): its step and phase.
    pub failed_at: Option<(u64, Option<String>)>,
    /// The address-space limit its first failed allocation met (`RLIMIT_AS`), if it had one.
    pub failed_space: Option<memsight_format::wire::ring::FailedAddressSpace>,
    pub ring_error: Option<String>,
    /// Sources the sidecar read itself (a job sampled from outside).
    pub sources: Vec<memsight::collect::SourceStatus>,
    /// The job's latest phase statistics.
    pub phases: Vec<memsight_format::phase::PhaseStats>,
    /// The job's latest size histogram (wire 1.4), for a report rebuilt after the job died.
    pub histogram: Vec<memsight_format::report::HistogramBucket>,
    /// Device OOMs the job's observer recorded.
    pub device_ooms: Vec<memsight_format::device::DeviceOom>,
    /// The latest device-by-line record of each device's peak (wire 1.7).
    pub device_lines: Vec<memsight_format::device::DeviceLines>,
    /// Heap profiles the job announced, one per file still on disk.
    pub heap_dumps: Vec<memsight_format::heap_profile::DumpRecord>,
    /// The signals this process sent to others (wire 1.9): the latest to each pid, with when.
    pub signals_sent: std::collections::HashMap<u32, (i32, u64)>,
    /// The job's process tree, when the sidecar adds it (read from outside: PSS, workers) to the
    /// snapshots of the job's own.
    trees: Option<crate::tree::TreeSampler>,
}

impl Watch {
    pub(crate) fn new() -> Self {
        Watch {
            timeline: Timeline::with_capacity(memsight_format::timeline::DEFAULT_CAPACITY),
            hello: None,
            finished_report: None,
            ring_start_unix_ms: None,
            dropped: 0,
            dropped_told: 0,
            quiet: false,
            silent: false,
            notes: std::collections::HashMap::new(),
            finished: false,
            alloc_failures: (0, 0),
            failed_at: None,
            failed_space: None,
            ring_error: None,
            sources: Vec::new(),
            phases: Vec::new(),
            histogram: Vec::new(),
            device_ooms: Vec::new(),
            device_lines: Vec::new(),
            heap_dumps: Vec::new(),
            signals_sent: std::collections::HashMap::new(),
            trees: None,
        }
    }

    /// Adds the process tree under `pid` to the snapshots the job records from now on that have
    /// none (a job's own sampler does not read its workers), as often as its cost allows.
    pub(crate) fn add_trees_of(&mut self, pid: u32) {
        self.trees = Some(crate::tree::TreeSampler::new(pid));
    }

    /// Drops the samples taken so far (taken from outside before the job's ring opened).
    pub(crate) fn forget_samples(&mut self) {
        self.timeline = Timeline::with_capacity(memsight_format::timeline::DEFAULT_CAPACITY);
    }

    /// The latest snapshot (compaction only merges older ones).
    pub fn last(&self) -> Option<&Snapshot> {
        self.timeline.last()
    }

    /// Reads the records written since the last poll; records lost from the ring meanwhile are
    /// told to viewers as a `dropped` notice (their count of missed records includes them).
    /// Whether there were any.
    pub(crate) fn poll(&mut self, r: &mut RingReader, out: &Outputs) -> bool {
        let records = r.poll();
        let any = !records.is_empty();
        self.take(records, out);
        self.tell_drops(r, out);
        any
    }

    fn tell_drops(&mut self, r: &RingReader, out: &Outputs) {
        if self.silent {
            return;
        }
        out.alloc_failures(r.alloc_failures().0);
        let lost = r.dropped().saturating_sub(self.dropped_told);
        if lost > 0 {
            out.emit(&Record::Dropped { count: lost });
            self.dropped_told = r.dropped();
        }
    }

    /// Reads what the writer left once watching stops: every remaining record (`writer_gone`:
    /// one it died writing counts as dropped), the drop count and the failed allocations.
    pub(crate) fn drain(&mut self, r: &mut RingReader, writer_gone: bool, out: &Outputs) {
        let records = if writer_gone {
            r.poll_final()
        } else {
            r.poll()
        };
        self.take(records, out);
        self.tell_drops(r, out);
        self.dropped = r.dropped();
        self.alloc_failures = r.alloc_failures();
        self.failed_space = r.failed_address_space();
    }

    /// Tells viewers everything kept so far (a process they follow from now on): its greeting and
    /// its samples.
    pub(crate) fn replay(&self, out: &Outputs) {
        if let Some(h) = &self.hello {
            out.emit(h);
        }
        for s in self.timeline.samples() {
            out.emit(&Record::Snapshot(Box::new(s.clone())));
        }
    }

    /// Ends [`Watch::quiet`]: tells viewers the samples kept meanwhile.
    pub(crate) fn speak(&mut self, out: &Outputs) {
        if !std::mem::replace(&mut self.quiet, false) {
            return;
        }
        for s in self.timeline.samples() {
            out.emit(&Record::Snapshot(Box::new(s.clone())));
        }
    }

    pub(crate) fn take(&mut self, records: Vec<Record>, out: &Outputs) {
        for mut r in records {
            if let (Record::Snapshot(s), Some(trees)) = (&mut r, self.trees.as_mut()) {
                if s.tree.is_none() {
                    s.tree = trees.sample();
                    if let Some(t) = s.tree.as_mut() {
                        for p in &mut t.processes {
                            if let Some((heap, role)) = self.notes.get(&p.pid) {
                                p.heap = *heap;
                                p.role = Some(role.clone());
                            }
                        }
                    }
                }
            }
            if !self.quiet && !self.silent {
                out.emit(&r);
            }
            match r {
                Record::Snapshot(s) => self.timeline.push(*s),
                Record::Finished { report_path } => {
                    self.finished = true;
                    self.finished_report = report_path.map(PathBuf::from);
                }
                h @ Record::Hello { .. } => self.hello = Some(h),
                Record::Phases { phases, histogram } => {
                    self.phases = phases;
                    if !histogram.is_empty() {
                        self.histogram = histogram;
                    }
                }
                Record::DeviceOom(o) => self.device_ooms.push(*o),
                Record::DeviceLines(l) => {
                    self.device_lines.retain(|o| o.device != l.device);
                    self.device_lines.push(*l);
                }
                Record::HeapProfile(d) => {
                    // One record per file still on disk (rotated step profiles are deleted), so a
                    // long job's list stays short.
                    self.heap_dumps
                        .retain(|o| o.path != d.path && std::path::Path::new(&o.path).exists());
                    self.heap_dumps.push(d);
                }
                Record::FailedAt { step, phase } => {
                    self.failed_at.get_or_insert((step, phase));
                }
                Record::SignalSent {
                    pid,
                    signal,
                    unix_ms,
                } => {
                    self.signals_sent.insert(pid, (signal, unix_ms));
                }
                _ => {}
            }
        }
    }
}
