//! The one wire format: records (JSON-encoded [`Record`]s) carried by the shared-memory flight
//! recorder ring ([`ring`]) — and, later, by the socket stream and recordings. Documented in
//! `docs/wire.md`. Every container starts with a header holding [`MAJOR`].[`MINOR`]; minor
//! versions only add record types and optional fields, and a reader rejects a newer major version
//! with a clear message.

mod location;
pub mod ring;
pub mod stream;

pub use location::{
    default_ring_path, pid_file_name, pid_of_file_name, remove_stale_files, ring_of, runtime_dir,
};

use crate::snapshot::Snapshot;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Incompatible format changes bump this; readers reject other majors.
pub const MAJOR: u16 = 1;
/// Additive changes (new record types, new optional fields) bump this.
pub const MINOR: u16 = 10;

/// One thing the job tells its watchers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// The job introduces itself (first record of a session).
    Hello {
        /// Process id.
        pid: u32,
        /// Command line.
        command: Vec<String>,
        /// Session start, Unix milliseconds.
        start_unix_ms: u64,
        /// Sampling interval in milliseconds.
        interval_ms: u64,
        /// memsight version of the job.
        memsight_version: String,
        /// Its place in the job: parent, rank, fork (added in 1.6).
        #[serde(default)]
        process: crate::process::ProcessInfo,
    },

    /// A sample.
    Snapshot(Box<Snapshot>),
    /// The session finished in-process and wrote its report (if a path was set).
    Finished {
        /// Where the job wrote its report.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        report_path: Option<String>,
    },
    /// The sidecar greets a socket client (first line of the stream).
    SidecarHello {
        /// Wire format major version.
        major: u16,
        /// Wire format minor version.
        minor: u16,
        /// The watched job's pid.
        job_pid: u32,
        /// The job's command line.
        command: Vec<String>,
    },
    /// Everything the sidecar has so far (second line of the stream): the bounded timeline.
    State {
        /// Snapshots, oldest first.
        timeline: Vec<Snapshot>,
    },
    /// This client fell behind and `count` records were not sent to it.
    Dropped {
        /// Records skipped since the last notice.
        count: u64,
    },
    /// The job ended (last line of the stream).
    Ended {
        /// The post-mortem's one-line description.
        description: String,
        /// The whole post-mortem (added in 1.0's stream; optional for older sidecars).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        post_mortem: Option<Box<crate::report::PostMortem>>,
    },
    /// The job's phase statistics so far (written about 4 times a second and at the end).
    Phases {
        /// Per phase: count, time, peak, net bytes.
        phases: Vec<crate::phase::PhaseStats>,
        /// Allocation calls per size class so far, as the report's `histogram` (added in 1.4:
        /// viewers show it while the job runs).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        histogram: Vec<crate::report::HistogramBucket>,
    },
    /// A device ran out of memory (libtorch's OOM observer; added in 1.1).
    DeviceOom(Box<crate::device::DeviceOom>),
    /// The job wrote a jemalloc heap profile (added in 1.2).
    HeapProfile(crate::heap_profile::DumpRecord),
    /// A device's allocated memory at its peak so far by Python line (PyTorch's allocator
    /// history; added in 1.7): the latest per device replaces the earlier.
    DeviceLines(Box<crate::device::DeviceLines>),
    /// This process sent signal `signal` to process `pid` (`kill`; added in 1.9): the sidecar
    /// tells a process the job stopped itself (a pool terminating its workers) from one that
    /// failed.
    SignalSent {
        /// The process the signal was sent to.
        pid: u32,
        /// The signal's number.
        signal: i32,
        /// When it was sent, in Unix milliseconds.
        unix_ms: u64,
    },
    /// Where the process was when an allocation first failed: its step and phase then (added in
    /// 1.10; written by the allocator's failure path, encoded beforehand by
    /// [`ring::note_place`]).
    FailedAt {
        /// The training step.
        step: u64,
        /// The phase (a nested path), when one was open.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<String>,
    },
    /// A record type from a newer minor version: skipped by this reader.
    #[serde(other)]
    Unknown,
}

/// Why a ring or stream could not be read.
#[derive(Debug)]
pub enum WireError {
    /// The file could not be opened or mapped.
    Io(std::io::Error),
    /// Not a memsight ring (wrong magic, or shorter than its header says).
    NotARing(String),
    /// A socket stream that does not carry memsight records.
    NotAStream(String),
    /// Written by an incompatible (newer or older major) format.
    Version {
        /// Major version found.
        found: u16,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Io(e) => write!(f, "{e}"),
            WireError::NotARing(why) => write!(f, "not a memsight flight-recorder ring: {why}"),
            WireError::NotAStream(why) => write!(f, "not a memsight sidecar stream: {why}"),
            WireError::Version { found } if *found > MAJOR => write!(
                f,
                "written by wire format {found}.x, newer than this memsight reads ({MAJOR}.x): \
                 upgrade memsight"
            ),
            WireError::Version { found } => write!(
                f,
                "written by wire format {found}.x, older than this memsight reads ({MAJOR}.x)"
            ),
        }
    }
}

impl std::error::Error for WireError {}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Io(e)
    }
}
