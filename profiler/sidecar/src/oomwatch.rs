//! Follows the memory cgroup a job is in — it may move itself, or be started in another one — and
//! counts the OOM kills there, so a SIGKILL can be told apart from an OOM kill after the job is gone.
//!
//! Followed cheaply, as it is asked at every poll of the sidecar (20 times a second, or at each
//! interval below 50 ms): `/proc/<pid>/cgroup` is re-read through a kept descriptor (one `pread`,
//! at most every [`MIN_LOOK`]) and compared with its last text; the mount table is read and the
//! cgroup resolved (its files opened, its ancestors' limits read) only at the first look and when
//! that text changed.

use memsight::collect::{CgroupReader, KeptFile, Mounts};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// OOM kills in the job's memory cgroup(s) since watching began.
pub(crate) struct OomWatch {
    proc_dir: PathBuf,
    current: Option<(CgroupReader, u64)>,
    earlier: u64,
    seen: bool,
    /// `/proc/<pid>/cgroup`, kept open, and its text when the cgroup was last resolved.
    membership: Option<KeptFile>,
    last_text: Option<String>,
    /// When `membership` was last read.
    looked: Option<Instant>,
}

/// Least time between two reads of `/proc/<pid>/cgroup` (≈ 30 µs on a cgroup v1 host, which
/// lists every hierarchy): a sidecar polling every millisecond reads it at most 50 times a second.
const MIN_LOOK: Duration = Duration::from_millis(20);

impl OomWatch {
    /// Starts watching process `pid`.
    pub fn new(pid: u32) -> Self {
        let mut w = OomWatch {
            proc_dir: PathBuf::from(format!("/proc/{pid}")),
            current: None,
            earlier: 0,
            seen: false,
            membership: None,
            last_text: None,
            looked: None,
        };
        w.refresh();
        w
    }

    fn count(r: &CgroupReader) -> Option<u64> {
        r.read().ok()?.oom_kills
    }

    /// Looks up the job's cgroup again (call while it runs); a move folds the kills counted so far.
    /// Costs one `pread` while the job stays in its cgroup.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        if self.looked.is_some_and(|t| now < t + MIN_LOOK) {
            return;
        }
        self.looked = Some(now);
        if self.membership.is_none() {
            self.membership = KeptFile::open_own(&self.proc_dir.join("cgroup")).ok();
        }
        let last = self.last_text.as_deref();
        let Some(Some(text)) = self.membership.as_ref().and_then(|f| {
            f.read_with(|t| (last != Some(t)).then(|| t.to_owned()))
                .ok()
        }) else {
            // Unchanged, or the job is gone.
            return;
        };
        // A move (or the first look): the mount table is read with it.
        let Ok(mounts) = Mounts::read(&self.proc_dir) else {
            return;
        };
        let found = CgroupReader::discover_in(&text, &mounts, Path::new("/"));
        self.last_text = Some(text);
        let Ok(found) = found else {
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
