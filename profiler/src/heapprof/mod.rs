//! Where the memory is, written from inside the job: memsight's heap sampler
//! (`crate::alloc::sampling`: Rust and C/C++ allocations alike) and the profiles a job writes (at
//! new peaks, at step boundaries, on request, at the end). Reading them — symbolized sites, pprof,
//! flamegraphs, growth — is `memsight_analysis::heapprof`.
//!
//! A session starts the sampler (one sample per 512 KiB allocated unless `MEMSIGHT_HEAP_SAMPLE`
//! says otherwise); sampling can be switched on and off at run time ([`set_sampling`],
//! `memsight heap sampling on|off PID`).

mod apart;
pub mod control;
mod recorder;

pub(crate) use apart::section as report_section;
pub use control::{enabled, sample_bytes, sampling, set_sampling};
pub use memsight_format::heap_profile::{DumpKind, DumpRecord, HeapProfile};
pub(crate) use recorder::{finish, on_sample, on_step, start};

use std::path::{Path, PathBuf};

/// Writes a heap profile now, into the running session's profile directory; returns its path.
pub fn dump() -> Result<PathBuf, String> {
    recorder::request()
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
