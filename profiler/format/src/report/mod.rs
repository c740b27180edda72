//! The JSON report: one type written by sessions (and later the sidecar) and read by `check`,
//! `summary` and the viewer. `schema_version` changes only on incompatible changes; new optional
//! fields are additive. The documented example is `docs/report.example.json` (kept in sync by a
//! test); field meanings are in `docs/report.md`.

pub mod build;
mod error;
pub mod job_context;
pub mod job_heap;
pub mod job_rss;
pub mod leak;
mod postmortem;
pub mod tips;
mod training;
mod unique_keys;

pub use error::ReportError;
pub use job_heap::{job_heap_peak, HeapSeries, HostPeak};
pub use training::{TrainingWindow, SHUTDOWN_PHASE};

/// How `check` and `summary` say where a peak was when [`Report::heap_peaked_outside_marks`].
pub const OUTSIDE_MARKS: &str = "outside every step and phase";
pub use postmortem::{PostMortem, PostMortemFinding};

use crate::host::SourceStatus;
use crate::phase::{PhaseStats, StepStats};
use crate::snapshot::Snapshot;
use crate::timeline::PeakAt;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The report schema this build writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// A job started by hand and the tree of jobs it is in (a shell with job control runs each command
/// line as a job of its own), each named `<boot id>/<first pid>@<its start in clock ticks>`: a pid
/// is not reused while its process runs, nor started twice in one tick.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByHand {
    /// The job: its first process, the one whose parent is not in it.
    pub job: String,
    /// The tree: the top-most ancestor started with the same variables, whatever its job.
    pub tree: String,
}

/// A finished (or dead) job's memory report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Report schema version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// Version of memsight that wrote the report.
    pub memsight_version: String,
    /// The process that was profiled.
    pub job: Job,
    /// Sampling interval in milliseconds.
    pub interval_ms: u64,
    /// Sampling intervals with no sample: the sampler ran late (a starved or stopped process).
    /// The timeline's gaps are that many intervals long in all.
    #[serde(default)]
    pub missed_intervals: u64,
    /// Peak values and where they happened.
    pub peaks: Peaks,
    /// Host heap fragmentation at the moment of peak jemalloc resident memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmentation: Option<Fragmentation>,
    /// The job's process tree (data-loader workers and other children, each with PSS, USS and
    /// RSS) when its PSS total was highest; present when the job was sampled from outside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_tree: Option<TreePeak>,
    /// Per-step growth of live heap bytes (leak signal), when enough steps were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak: Option<leak::LeakEstimate>,
    /// Per-phase statistics.
    pub phases: Vec<PhaseStats>,
    /// Per-step statistics (bounded: old steps merge, keeping the higher peak).
    pub steps: Vec<StepStats>,
    /// Allocation counts per power-of-two size class (empty buckets omitted).
    pub histogram: Vec<HistogramBucket>,
    /// Bounded timeline of snapshots, oldest first.
    pub timeline: Vec<Snapshot>,
    /// Snapshots merged away to keep the timeline bounded.
    pub timeline_merged: u64,
    /// Which sources were read, and why any was not.
    pub sources: Vec<SourceStatus>,
    /// Accelerator peaks, per device and backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::device::DevicePeak>,
    /// Device out-of-memory events caught by an OOM observer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_ooms: Vec<crate::device::DeviceOom>,
    /// Written by a process of a job started by hand (the preloaded library and `MEMSIGHT_REPORT`
    /// set, no `memsight run`): which job and tree of jobs it is of. The user's path keeps another
    /// process's report for this job only when it names this job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_hand: Option<ByHand>,
    /// Python's small-object arenas (pymalloc), which the heap figures leave out: their exact
    /// peak and size (a Python job under `memsight run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_arenas: Option<crate::heap::PythonArenas>,
    /// Device memory at each device's peak by Python line (PyTorch's allocator history:
    /// `memsight run --device-history`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_lines: Vec<crate::device::DeviceLines>,
    /// Advice derived from the numbers above.
    pub tips: Vec<tips::Tip>,
    /// How the job ended, written by the sidecar (`memsight run`): cause, last sample, diagnosis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_mortem: Option<PostMortem>,
    /// Where the heap is: the sites holding the bytes at the peak and what grew (jemalloc's
    /// sampling profiler; absent when profiling was off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_profile: Option<crate::heap_profile::HeapProfile>,
    /// Every process of the job that carried memsight, with its role, peaks and end (written by
    /// `memsight run` for a job of more than one measured process).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<crate::process::JobProcess>,
    /// The ranks side by side (a distributed job): one row per rank, lowest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<crate::process::JobProcess>,
    /// When training ended and its peaks (a Python job under `memsight run`, or a program that
    /// called `memsight::end_training`); what follows is the `shutdown` phase. Budgets gate this
    /// window by default ([`Report::within_training`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingWindow>,
}

/// The profiled process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Process id.
    pub pid: u32,
    /// Command line.
    pub command: Vec<String>,
    /// Session start, Unix milliseconds.
    pub start_unix_ms: u64,
    /// Session end, Unix milliseconds.
    pub end_unix_ms: u64,
    /// How the job ended.
    pub exit: JobExit,
}

/// How the job ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobExit {
    /// `finished` (session finished in-process), `exited` (with a code) or `signaled`.
    pub kind: String,
    /// Exit code, for `exited`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Signal number, for `signaled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// One line for people.
    pub description: String,
}

/// Peaks and where they happened.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Peak live process heap bytes over the run (`HeapStats::run_peak_bytes`: every allocation
    /// through memsight's jemalloc, Rust's and C/C++ code's; never reset by `memsight::reset_peak`).
    pub heap_peak_bytes: u64,
    /// The step whose window held the highest heap peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_peak_step: Option<u64>,
    /// The innermost phase whose window held the highest heap peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_peak_phase: Option<String>,
    /// Live heap bytes when the session finished.
    pub final_live_bytes: u64,
    /// Highest RSS: the kernel's high-water mark when known, else the highest sampled RSS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_peak_bytes: Option<u64>,
    /// The sample with the highest RSS (its time, step and phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_peak_sample: Option<PeakAt>,
    /// Highest jemalloc resident bytes sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jemalloc_resident_peak: Option<PeakAt>,
    /// Highest cgroup usage sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_usage_peak: Option<PeakAt>,
    /// The effective cgroup memory limit (none when unlimited or unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_limit_bytes: Option<u64>,
    /// Peak live tensor bytes (libtorch CPU allocator hook; exact, not sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_bytes: Option<u64>,
    /// The step whose window held the tensor peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_step: Option<u64>,
    /// The innermost phase whose window held the tensor peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_phase: Option<String>,
    /// The job's heap peak, in the report of a job of several measured processes (`memsight
    /// run`): the highest total of their live heaps at one moment (each process's latest sample
    /// then; a forked worker's less the heap it inherited), placed at this report's process's
    /// step and phase then. [`Report::host_peak`] takes it where it is above `heap_peak_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_heap_peak: Option<PeakAt>,
}

/// The run's heap fragmentation — its one definition, used by the report, the summary, the viewer
/// and the Prometheus gauge: (resident − allocated) / resident of jemalloc at the first sample
/// with the run's highest jemalloc resident bytes. Measured at that peak, not at the latest
/// sample, so the value does not swing with a sample taken while dirty pages await purging.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fragmentation {
    /// (resident − allocated) / resident: resident heap memory holding no live data.
    pub resident_ratio: f64,
    /// (active − allocated) / active: waste inside pages in use.
    pub active_ratio: f64,
    /// jemalloc allocated bytes at that sample.
    pub allocated_bytes: u64,
    /// jemalloc active bytes at that sample.
    pub active_bytes: u64,
    /// jemalloc resident bytes at that sample.
    pub resident_bytes: u64,
    /// When it was sampled.
    pub at: PeakAt,
}

impl Fragmentation {
    /// The fragmentation of the sample `resident` (a run's resident peak, as kept by
    /// [`crate::timeline::raise_resident`]); `None` without jemalloc statistics.
    pub fn at_resident_peak(resident: Option<&(PeakAt, Snapshot)>) -> Option<Self> {
        let (at, s) = resident?;
        let j = s.jemalloc?;
        Some(Fragmentation {
            resident_ratio: j.resident_fragmentation(),
            active_ratio: j.active_fragmentation(),
            allocated_bytes: j.allocated,
            active_bytes: j.active,
            resident_bytes: j.resident,
            at: at.clone(),
        })
    }
}

/// The process tree (the job and its workers) when its footprint was highest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TreePeak {
    /// When; `bytes` is the tree's footprint (PSS total, or RSS total without PSS).
    pub at: PeakAt,
    /// Every process with its PSS, USS and RSS at that sample.
    pub tree: crate::host::ProcessTree,
}

/// Allocation count of one size class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramBucket {
    /// Smallest size in the class, in bytes.
    pub min_bytes: u64,
    /// Largest size in the class, in bytes (inclusive).
    pub max_bytes: u64,
    /// Allocation calls whose requested size is in the class.
    pub count: u64,
}

impl Report {
    /// Whether the process heap was measured, i.e. memsight ran inside the process (linked, or
    /// preloaded by `memsight run`). A process sampled only from outside (`attach`,
    /// `run --no-preload`) has RSS and its process tree but no heap, and its heap figures are 0.
    pub fn heap_measured(&self) -> bool {
        self.peaks.heap_peak_bytes > 0
    }

    /// What to say in place of the heap's figures when it was not measured.
    /// A job under `memsight run` can get here too: a program started without memsight's library
    /// in `LD_PRELOAD`, or with another allocator before it there (a recipe's
    /// `LD_PRELOAD=libtcmalloc.so.4:$LD_PRELOAD`), so the advice names the library's place.
    pub const HEAP_NOT_MEASURED: &'static str = "not measured: the process was sampled from \
        outside (`attach`, `run --no-preload`, or a program whose `LD_PRELOAD` lacks memsight's \
        library or puts another allocator before it); `memsight run` preloads the library, first, \
        for its heap";

    /// Whether the heap peaked outside every step and phase of a job that marked some (set-up,
    /// say): `heap_peak_step` and `heap_peak_phase` are then absent for that reason.
    pub fn heap_peaked_outside_marks(&self) -> bool {
        self.peaks.heap_peak_step.is_none()
            && self.peaks.heap_peak_phase.is_none()
            && !(self.steps.is_empty() && self.phases.is_empty())
    }

    /// The timeline's sample taken at `at` (the one nearest in time, when merging dropped it).
    pub fn sample_at(&self, at: &PeakAt) -> Option<&Snapshot> {
        self.timeline
            .iter()
            .min_by_key(|s| s.t_ms.abs_diff(at.t_ms))
    }

    /// Adds process trees read from outside (the sidecar's, of the job and its workers) to the
    /// samples that have none, matched by time, and the largest as the report's process tree;
    /// the tips are derived again, with the workers in view.
    pub fn add_trees(&mut self, sampled: &crate::timeline::Timeline) {
        let trees: std::collections::HashMap<u64, &crate::host::ProcessTree> = sampled
            .samples()
            .iter()
            .filter_map(|s| s.tree.as_ref().map(|t| (s.t_ms, t)))
            .collect();
        for s in self.timeline.iter_mut().filter(|s| s.tree.is_none()) {
            s.tree = trees.get(&s.t_ms).map(|t| (*t).clone());
        }
        if self.process_tree.is_none() {
            self.process_tree = sampled
                .peaks()
                .tree
                .clone()
                .map(|(at, tree)| TreePeak { at, tree });
        }
        self.tips = tips::derive(self);
    }

    /// Sets the heap-profile section and derives the tips again (they name its top sites).
    pub fn set_heap_profile(&mut self, heap_profile: Option<crate::heap_profile::HeapProfile>) {
        self.heap_profile = heap_profile;
        self.tips = tips::derive(self);
    }

    /// Reads and validates a report file: a regular file of at most
    /// [`crate::input::MAX_REPORT_BYTES`] (a FIFO or device is refused without blocking).
    pub fn load(path: &Path) -> Result<Report, ReportError> {
        let bytes = crate::input::read(path, crate::input::MAX_REPORT_BYTES).map_err(|e| {
            ReportError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        })?;
        Self::from_slice(&bytes).map_err(|e| e.with_path(path))
    }

    /// Parses and validates a report from JSON bytes (a leading UTF-8 byte-order mark is skipped).
    /// Fields this version does not know are ignored, as docs/report.md promises within a schema
    /// version; a field of the wrong type is named by its path (`peaks.heap_peak_bytes`), and so
    /// is a key given twice in one object (a parser would keep one of them silently).
    pub fn from_slice(bytes: &[u8]) -> Result<Report, ReportError> {
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(ReportError::from_json)?;
        let version = value.get("schema_version").ok_or(ReportError::NotAReport {
            path: None,
            why: "no schema_version field".into(),
        })?;
        let version = version.as_u64().ok_or(ReportError::NotAReport {
            path: None,
            why: format!("schema_version is {version}, not a number"),
        })?;
        if version != u64::from(SCHEMA_VERSION) {
            return Err(ReportError::UnsupportedVersion {
                path: None,
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        if let Some(at) = unique_keys::first_duplicate(bytes).map_err(ReportError::from_json)? {
            return Err(ReportError::Invalid {
                path: None,
                why: format!(
                    "{at}: the key is given twice in its object (memsight writes each key once: \
                     was the report edited or joined by hand?)"
                ),
            });
        }
        serde_path_to_error::deserialize(value).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner();
            ReportError::Invalid {
                path: None,
                why: if at == "." {
                    inner.to_string()
                } else {
                    format!("{at}: {inner}")
                },
            }
        })
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> Result<Vec<u8>, ReportError> {
        serde_json::to_vec_pretty(self).map_err(|e| ReportError::Invalid {
            path: None,
            why: e.to_string(),
        })
    }

    /// Writes the report as pretty JSON through [`crate::safe_file`]: complete or not at all, and
    /// only over a regular file.
    pub fn save(&self, path: &Path) -> Result<(), ReportError> {
        crate::safe_file::write(path, &self.to_json()?).map_err(|e| ReportError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    }
}

/// Turns the allocator's bucket counts into report buckets, omitting empty ones.
pub fn histogram_buckets(counts: &[u64]) -> Vec<HistogramBucket> {
    counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, &c)| {
            let (min, max) = match i {
                0 => (0, 0),
                i if i + 1 == counts.len() => (1u64 << (i - 1), u64::MAX),
                i => (1u64 << (i - 1), (1u64 << i) - 1),
            };
            HistogramBucket {
                min_bytes: min,
                max_bytes: max,
                count: c,
            }
        })
        .collect()
}
