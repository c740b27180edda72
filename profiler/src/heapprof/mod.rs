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
    // Every byte of the report's name is kept (a name that is not UTF-8 too).
    let mut name = report
        .file_stem()
        .map_or_else(|| "memsight".into(), std::ffi::OsStr::to_os_string);
    name.push(".heap");
    report.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::dir_for_report;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    #[test]
    fn the_profiles_sit_beside_the_report_under_its_exact_name() {
        assert_eq!(
            dir_for_report(Path::new("/tmp/run/r.json")),
            Path::new("/tmp/run/r.heap")
        );
        let odd = Path::new(OsStr::from_bytes(b"/tmp/r\xff.json"));
        assert_eq!(
            dir_for_report(odd).as_os_str().as_bytes(),
            b"/tmp/r\xff.heap"
        );
        assert_eq!(dir_for_report(Path::new("/")), Path::new("/memsight.heap"));
    }
}
