//! The host side of a snapshot: what the job's host sources (jemalloc, /proc, the memory cgroup,
//! the process tree) read, as plain data. The readers live in `memsight::collect`.

use serde::{Deserialize, Serialize};

/// Whether a source could be read, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// `jemalloc`, `process`, `system` or `cgroup`.
    pub name: String,
    /// True when the source delivered values.
    pub available: bool,
    /// Why it is unavailable (or where it reads from, when available).
    pub detail: String,
}

/// One reading of every host source.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostSample {
    /// jemalloc statistics.
    pub jemalloc: Option<JemallocStats>,
    /// The process's RSS and its split.
    pub process: Option<ProcessMemory>,
    /// The machine's total and available memory.
    pub system: Option<SystemMemory>,
    /// The memory cgroup.
    pub cgroup: Option<CgroupMemory>,
}

/// jemalloc's process-wide statistics in bytes, refreshed by an epoch advance at each read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JemallocStats {
    /// Bytes handed to the application (Rust and C/C++ alike).
    pub allocated: u64,
    /// Bytes in active pages: allocated plus the unused tails of those pages.
    pub active: u64,
    /// Bytes in physically resident pages that jemalloc maps (data and metadata).
    pub resident: u64,
    /// Bytes in mapped extents.
    pub mapped: u64,
    /// Bytes retained (unmapped-but-reserved virtual memory; not resident).
    pub retained: u64,
    /// Bytes of jemalloc's own metadata.
    pub metadata: u64,
}

impl JemallocStats {
    /// (active − allocated) / active: page-level fragmentation inside used pages.
    pub fn active_fragmentation(&self) -> f64 {
        ratio(self.active.saturating_sub(self.allocated), self.active)
    }

    /// (resident − allocated) / resident: share of resident heap memory not holding live data
    /// (fragmentation, dirty pages awaiting purge, metadata).
    pub fn resident_fragmentation(&self) -> f64 {
        ratio(self.resident.saturating_sub(self.allocated), self.resident)
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// A process's memory as the kernel reports it, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessMemory {
    /// Resident set size (VmRSS).
    pub rss: u64,
    /// High-water mark of the RSS (VmHWM).
    pub hwm: u64,
    /// Anonymous resident memory (RssAnon): heap, stacks, anonymous mmaps.
    pub anon: u64,
    /// File-backed resident memory (RssFile): code, mapped files.
    pub file: u64,
    /// Shared-memory resident memory (RssShmem).
    pub shmem: u64,
    /// Swapped-out anonymous memory (VmSwap).
    pub swap: u64,
    /// Number of threads.
    pub threads: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemMemory {
    /// MemTotal.
    pub total: u64,
    /// MemAvailable: what can be allocated without swapping.
    pub available: u64,
}

/// A memory cgroup's state, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupMemory {
    /// 1 or 2.
    pub version: u8,
    /// Effective limit (smallest over the cgroup and its ancestors); `None` when unlimited.
    pub limit: Option<u64>,
    /// Current usage (v2 `memory.current`, v1 `memory.usage_in_bytes`; includes page cache).
    pub usage: u64,
    /// Highest usage (v2 `memory.peak`, kernel ≥ 5.19; v1 `memory.max_usage_in_bytes`).
    pub peak: Option<u64>,
    /// OOM kills inside this cgroup so far (`oom_kill` in v2 `memory.events` / v1 `memory.oom_control`).
    pub oom_kills: Option<u64>,
}

impl CgroupMemory {
    /// Bytes left before the limit; `None` when unlimited.
    pub fn headroom(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.usage))
    }
}

/// One process of the tree. RSS counts every page the process maps once per process, so pages a
/// forked worker shares copy-on-write with its parent appear in both; PSS divides each shared page
/// among the processes that map it, and USS (private) counts only the pages no other process maps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeProcess {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Command name (`comm`).
    pub name: String,
    /// Resident set size in bytes (`VmRSS`).
    pub rss: u64,
    /// Anonymous part of the RSS (`RssAnon`): heap, stacks, anonymous mmaps.
    #[serde(default)]
    pub anon: u64,
    /// File-backed part of the RSS (`RssFile`): code, shared libraries, mapped files.
    #[serde(default)]
    pub file: u64,
    /// Shared-memory part of the RSS (`RssShmem`): shm segments, tmpfs mappings.
    #[serde(default)]
    pub shmem: u64,
    /// Proportional set size (`Pss` of `smaps_rollup`): each resident page divided by the number
    /// of processes mapping it. `None` when `smaps_rollup` was not readable (another user's
    /// process, or a kernel before 4.14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pss: Option<u64>,
    /// Unique set size: pages mapped by this process alone (`Private_Clean + Private_Dirty` of
    /// `smaps_rollup`). What the machine would get back if this process alone exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uss: Option<u64>,
    /// Its live heap bytes, counted in-process (a process that carries memsight), a forked
    /// worker's without what it inherited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap: Option<u64>,
    /// Its role in the job, once the sidecar knows it (`rank 1`, `worker of rank 0`…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

impl TreeProcess {
    /// What the process costs the machine: its PSS, or its RSS when PSS was not readable.
    pub fn footprint(&self) -> u64 {
        self.pss.unwrap_or(self.rss)
    }
}

/// A process and its descendants, root first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessTree {
    /// Sum of every process's RSS. Shared pages count once per process that maps them, so this
    /// over-counts a tree of forked workers; see [`ProcessTree::footprint`].
    pub total_rss: u64,
    /// Sum of every process's PSS: the tree's real memory footprint, each shared page counted once
    /// (its shares over the processes of the tree, plus the shares of processes outside it).
    /// `None` when some process's PSS was not readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_pss: Option<u64>,
    /// Sum of every process's USS: memory private to one process of the tree. `None` as for
    /// `total_pss`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_uss: Option<u64>,
    /// The root and its descendants, breadth first.
    pub processes: Vec<TreeProcess>,
}

impl ProcessTree {
    /// A tree of `processes` (root first) with its totals summed.
    pub fn new(processes: Vec<TreeProcess>) -> Self {
        let sum = |f: fn(&TreeProcess) -> Option<u64>| processes.iter().map(f).sum::<Option<u64>>();
        ProcessTree {
            total_rss: processes.iter().map(|p| p.rss).sum(),
            total_pss: sum(|p| p.pss),
            total_uss: sum(|p| p.uss),
            processes,
        }
    }

    /// The tree's headline total: its PSS (what the machine holds for it), or the RSS sum when
    /// PSS was not readable (e.g. a report written before PSS was recorded).
    pub fn footprint(&self) -> u64 {
        self.total_pss.unwrap_or(self.total_rss)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_written_before_pss_loads_and_totals_by_rss() {
        let old = r#"{"total_rss":300,"processes":[{"pid":1,"ppid":0,"name":"py","rss":300}]}"#;
        let t: ProcessTree = serde_json::from_str(old).unwrap();
        assert_eq!((t.total_pss, t.processes[0].pss), (None, None));
        assert_eq!(t.footprint(), 300);
    }

    #[test]
    fn a_tree_totals_by_pss_when_every_process_has_it() {
        let p = |pss: Option<u64>| TreeProcess {
            rss: 400,
            pss,
            uss: pss.map(|v| v / 2),
            ..Default::default()
        };
        let t = ProcessTree::new(vec![p(Some(250)), p(Some(150))]);
        assert_eq!(
            (t.total_rss, t.total_pss, t.total_uss),
            (800, Some(400), Some(200))
        );
        assert_eq!(t.footprint(), 400);
        let partial = ProcessTree::new(vec![p(Some(250)), p(None)]);
        assert_eq!((partial.total_pss, partial.footprint()), (None, 800));
    }
}
