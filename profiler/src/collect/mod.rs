//! Host sources sampled by the session: jemalloc, /proc (process and system), the memory cgroup.
//! Each source may be absent; it then says why instead of failing the whole sample.

pub mod cgroup;
pub mod jemalloc;
pub mod kept_file;
pub mod procfs;

pub use cgroup::{CgroupReader, Mounts};
pub use jemalloc::JemallocReader;
pub use kept_file::KeptFile;
pub use memsight_format::host::{
    CgroupMemory, HostSample, JemallocStats, ProcessMemory, ProcessTree, SourceStatus,
    SystemMemory, TreeProcess,
};
pub use procfs::{command_line, ProcessReader, SystemReader};

use std::path::Path;

/// All host readers of one process, opened once.
pub struct HostCollector {
    jemalloc: Result<JemallocReader, String>,
    process: Result<ProcessReader, String>,
    system: Result<SystemReader, String>,
    cgroup: Result<CgroupReader, String>,
    last_error: [Option<String>; 4],
}

impl HostCollector {
    /// Opens every source for the current process.
    pub fn for_self() -> Self {
        Self::open(
            Path::new("/proc/self"),
            Path::new("/proc"),
            Path::new("/"),
            true,
        )
    }

    /// Opens the sources of the process at `proc_dir` (`/proc/<pid>`), with `proc_root` and the
    /// filesystem `root` given so tests can use fixtures. jemalloc is read only when `own_process`.
    pub fn open(proc_dir: &Path, proc_root: &Path, root: &Path, own_process: bool) -> Self {
        let io = |what: String| move |e: std::io::Error| format!("{what}: {e}");
        HostCollector {
            jemalloc: if own_process {
                JemallocReader::open()
            } else {
                Err("jemalloc statistics are only readable inside the process".into())
            },
            process: ProcessReader::open(proc_dir)
                .map_err(io(proc_dir.join("status").display().to_string())),
            system: SystemReader::open(proc_root)
                .map_err(io(proc_root.join("meminfo").display().to_string())),
            cgroup: CgroupReader::discover(proc_dir, root),
            last_error: Default::default(),
        }
    }

    /// Reads every available source; read errors are kept for [`HostCollector::sources`].
    pub fn sample(&mut self) -> HostSample {
        fn keep<T, E: ToString>(slot: &mut Option<String>, r: Result<T, E>) -> Option<T> {
            match r {
                Ok(v) => {
                    *slot = None;
                    Some(v)
                }
                Err(e) => {
                    *slot = Some(e.to_string());
                    None
                }
            }
        }
        let [je, pr, sy, cg] = &mut self.last_error;
        HostSample {
            jemalloc: self.jemalloc.as_ref().ok().and_then(|r| keep(je, r.read())),
            process: self.process.as_ref().ok().and_then(|r| keep(pr, r.read())),
            system: self.system.as_ref().ok().and_then(|r| keep(sy, r.read())),
            cgroup: self.cgroup.as_ref().ok().and_then(|r| keep(cg, r.read())),
        }
    }

    /// What each source is and, where it is missing, why.
    pub fn sources(&self) -> Vec<SourceStatus> {
        fn status<T>(
            name: &str,
            r: &Result<T, String>,
            err: &Option<String>,
            ok: String,
        ) -> SourceStatus {
            let (available, detail) = match (r, err) {
                (Err(why), _) => (false, why.clone()),
                (Ok(_), Some(e)) => (false, format!("read failed: {e}")),
                (Ok(_), None) => (true, ok),
            };
            SourceStatus {
                name: name.into(),
                available,
                detail,
            }
        }
        let cg = match &self.cgroup {
            Ok(c) => format!("cgroup v{} at {}", c.version(), c.dir().display()),
            Err(_) => String::new(),
        };
        vec![
            status(
                "jemalloc",
                &self.jemalloc,
                &self.last_error[0],
                "jemalloc stats (epoch per sample)".into(),
            ),
            status(
                "process",
                &self.process,
                &self.last_error[1],
                "/proc statm every sample, status every 10th".into(),
            ),
            status(
                "system",
                &self.system,
                &self.last_error[2],
                "/proc/meminfo".into(),
            ),
            status("cgroup", &self.cgroup, &self.last_error[3], cg),
        ]
    }
}
