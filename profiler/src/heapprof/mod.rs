//! Where the memory is: jemalloc's sampling heap profiler (it sees Rust and C/C++ allocations
//! alike), the profiles a job writes (at new peaks, at step boundaries, on request, at the end),
//! symbolized into the sites that hold the bytes, a pprof file, flamegraphs, and the growth
//! between two profiles.
//!
//! Profiling is enabled when the process starts with `MALLOC_CONF=prof:true` (`memsight run` does
//! this); sampling can then be switched on and off at run time ([`set_sampling`],
//! `memsight heap sampling on|off PID`).

pub mod control;
pub mod dump;
pub mod flame;
pub mod pprof;
pub mod profile;
mod recorder;
pub mod summary;
pub mod symbolize;

pub use control::{enabled, sample_bytes, sampling, set_sampling};
pub use profile::{growth, Profile, Site, SiteGrowth, SourceSite};
pub(crate) use recorder::{finish, on_sample, on_step, start};
pub use recorder::{DumpKind, DumpRecord};
pub use summary::{summarize, Growth, HeapProfile, ProfileView};

use std::path::{Path, PathBuf};

/// Writes a heap profile now, into the running session's profile directory; returns its path.
pub fn dump() -> Result<PathBuf, String> {
    recorder::request(crate::phases::current_step())
}

/// The directory a session with report `report` writes its heap profiles to:
/// `<dir>/<report stem>.heap/`.
pub fn dir_for_report(report: &Path) -> PathBuf {
    let stem = report
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "memsight".into());
    report.with_file_name(format!("{stem}.heap"))
}
