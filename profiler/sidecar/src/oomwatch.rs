//! Follows the memory cgroup a job is in — it may move itself, or be started in another one — and
//! counts the OOM kills there, so a SIGKILL can be told apart from an OOM kill after the job is gone.

use memsight::collect::CgroupReader;
use std::path::{Path, PathBuf};

/// OOM kills in the job's memory cgroup(s) since watching began.
pub(crate) struct OomWatch {
    proc_dir: PathBuf,
    current: Option<(CgroupReader, u64)>,
    earlier: u64,
    seen: bool,
}

impl OomWatch {
    /// Starts watching process `pid`.
    pub fn new(pid: u32) -> Self {
        let mut w = OomWatch {
            proc_dir: PathBuf::from(format!("/proc/{pid}")),
            current: None,
            earlier: 0,
            seen: false,
        };
        w.refresh();
        w
    }

    fn count(r: &CgroupReader) -> Option<u64> {
        r.read().ok()?.oom_kills
    }

    /// Looks up the job's cgroup again (call while it runs); a move folds the kills counted so far.
    pub fn refresh(&mut self) {
        let Ok(found) = CgroupReader::discover(&self.proc_dir, Path::new("/")) else {
            return;
        };
        if self
            .current
            .as_ref()
            .is_some_and(|(r, _)| r.dir() == found.dir())
        {
            return;
        }
        if let Some((old, base)) = self.current.take() {
            self.earlier += Self::count(&old).unwrap_or(base).saturating_sub(base);
        }
        if let Some(base) = Self::count(&found) {
            self.seen = true;
            self.current = Some((found, base));
        }
    }

    /// Kills counted since watching began (`None` when no cgroup reports them).
    pub fn kills(&self) -> Option<u64> {
        if !self.seen {
            return None;
        }
        let now = self.current.as_ref().map_or(0, |(r, base)| {
            Self::count(r).unwrap_or(*base).saturating_sub(*base)
        });
        Some(self.earlier + now)
    }
}
