//! A job's process tree read from outside (data-loader workers, spawned helpers): each process's
//! RSS with its anon / file / shmem split (`status`), its PSS and USS (`smaps_rollup`), and the
//! tree's totals, followed through `task/*/children` without scanning every pid. Parsed with the
//! `procfs` crate: this runs in the sidecar, off the job's sampling budget (the in-job sampler
//! keeps its hand parser of `statm`/`status`/`meminfo`, 1.4–3.7× faster; docs/benchmarks.md).

use memsight_format::host::{ProcessTree, TreeProcess};
use procfs::process::Process;
use std::io;
use std::path::Path;

/// Most processes followed in one tree.
const MAX_PROCESSES: usize = 1024;

/// The children of every thread of `p`.
fn children(p: &Process) -> Vec<u32> {
    let mut out: Vec<u32> = p
        .tasks()
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.children().ok())
                .flatten()
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out.dedup();
    out
}

/// PSS and USS (`Private_Clean + Private_Dirty`) in bytes from `smaps_rollup`.
fn pss_uss(p: &Process) -> Option<(u64, u64)> {
    let rollup = p.smaps_rollup().ok()?;
    let m = &rollup.memory_map_rollup.0.first()?.extension.map;
    Some((
        *m.get("Pss")?,
        m.get("Private_Clean")? + m.get("Private_Dirty")?,
    ))
}

/// One process's memory; `None` once it is gone (or a zombie, which has no `VmRSS`).
fn read_process(proc_root: &Path, pid: u32, ppid: u32) -> Option<(TreeProcess, Process)> {
    let p = Process::new_with_root(proc_root.join(pid.to_string())).ok()?;
    let s = p.status().ok()?;
    let kib = |v: Option<u64>| v.unwrap_or(0) * 1024;
    let (pss, uss) = pss_uss(&p).unzip();
    let t = TreeProcess {
        pid,
        ppid,
        name: s.name.clone(),
        rss: s.vmrss? * 1024,
        anon: kib(s.rssanon),
        file: kib(s.rssfile),
        shmem: kib(s.rssshmem),
        pss,
        uss,
        heap: None,
        role: None,
    };
    Some((t, p))
}

/// Reads the tree under `root` (`proc_root` is normally `/proc`). Processes that exit while it is
/// read are left out; the root missing is an error.
pub fn read_tree(proc_root: &Path, root: u32) -> io::Result<ProcessTree> {
    let first = read_process(proc_root, root, 0).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("process {root} is gone"))
    })?;
    let mut handles = vec![first.1];
    let mut processes = vec![first.0];
    let mut i = 0;
    while i < processes.len() && processes.len() < MAX_PROCESSES {
        let parent = processes[i].pid;
        for c in children(&handles[i]) {
            if processes.len() >= MAX_PROCESSES || processes.iter().any(|p| p.pid == c) {
                continue;
            }
            if let Some((t, p)) = read_process(proc_root, c, parent) {
                processes.push(t);
                handles.push(p);
            }
        }
        i += 1;
    }
    Ok(ProcessTree::new(processes))
}

/// Reads a job's tree at most as often as its cost allows. The kernel walks every page table of a
/// process to sum its PSS (≈ 20 ms for a PyTorch process holding a few hundred MiB, under the
/// process's memory-map lock), so the next read waits [`COST_FACTOR`]× as long as the last one
/// took: the sidecar spends at most 1/`COST_FACTOR` of a core on it, and the job's page faults wait
/// on it no more often than that.
pub(crate) struct TreeSampler {
    root: u32,
    next: std::time::Instant,
}

/// The wait after a tree read, in multiples of what the read took.
pub(crate) const COST_FACTOR: u32 = 20;

impl TreeSampler {
    /// Samples the tree under `root`; the first read is due at once.
    pub(crate) fn new(root: u32) -> Self {
        TreeSampler {
            root,
            next: std::time::Instant::now(),
        }
    }

    /// The tree now when a read is due (and the root still exists), else `None`.
    pub(crate) fn sample(&mut self) -> Option<ProcessTree> {
        let start = std::time::Instant::now();
        if start < self.next {
            return None;
        }
        let tree = read_tree(Path::new("/proc"), self.root).ok();
        self.next = std::time::Instant::now() + start.elapsed() * COST_FACTOR;
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_shows_in_the_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t = read_tree(Path::new("/proc"), std::process::id()).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(t.processes[0].pid, std::process::id());
        let c = t.processes.iter().find(|p| p.pid == child.id()).unwrap();
        assert_eq!(c.name, "sleep");
        assert!(c.rss > 0 && t.total_rss >= t.processes[0].rss + c.rss);
        let (pss, uss) = (c.pss.unwrap(), c.uss.unwrap());
        assert!(uss <= pss && pss <= c.rss, "{c:?}");
        assert_eq!(t.footprint(), t.total_pss.unwrap());
        assert!(read_tree(Path::new("/proc"), u32::MAX - 1).is_err());
    }

    #[test]
    fn pss_and_private_bytes_agree_with_smaps_rollup_s_text() {
        let me = Process::myself().unwrap();
        let (pss, uss) = pss_uss(&me).unwrap();
        let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        let kb = |k: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
                .unwrap()
                * 1024
        };
        // Read a moment apart: this test's own allocations may move them by a few pages.
        let near = |a: u64, b: u64| a.abs_diff(b) <= 1 << 20;
        assert!(near(pss, kb("Pss")), "{pss} vs {}", kb("Pss"));
        assert!(near(uss, kb("Private_Clean") + kb("Private_Dirty")));
    }
}
