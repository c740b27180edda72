//! A job's process tree read from outside (data-loader workers, spawned helpers): each process's
//! RSS with its anon / file / shmem split (`status`), its PSS and USS (`smaps_rollup`), and the
//! tree's totals, followed through `task/*/children` without scanning every pid.
//!
//! Cheap reads at every sample, costly ones when they are worth their cost: the tree is followed
//! and each process's RSS read (`stat`, `statm`, the `children` lists: one `pread` each through
//! descriptors kept open, [`proc`]); the rows with PSS are read only when [`schedule`] says so —
//! under a CPU budget, sooner when the tree changed or its RSS rose. While the budget allows no
//! read, the tree is not followed either.

mod proc;
mod schedule;

use memsight_format::host::ProcessTree;
use proc::Proc;
use schedule::PssSchedule;
use std::collections::HashMap;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most processes followed in one tree.
const MAX_PROCESSES: usize = 1024;

/// Least time between two walks of the tree (a job sampled every millisecond is followed at most
/// this often).
const MIN_WALK: Duration = Duration::from_millis(20);

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into `t`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// The processes of the tree under `root`, followed from one walk to the next.
struct Walker {
    proc_root: PathBuf,
    root: u32,
    /// The tree at the last walk, breadth first, root first.
    procs: Vec<Proc>,
}

impl Walker {
    fn new(proc_root: &Path, root: u32) -> Self {
        Walker {
            proc_root: proc_root.to_path_buf(),
            root,
            procs: Vec::new(),
        }
    }

    /// Follows the tree again (processes seen before are re-read through their kept
    /// descriptors, new ones opened); false when the root is gone.
    fn walk(&mut self) -> bool {
        let mut known: HashMap<u32, Proc> = self.procs.drain(..).map(|p| (p.pid, p)).collect();
        // Opens `pid` as a child of `ppid` (re-read when known), its files kept open while fewer
        // than KEEP_PROCESSES processes of the tree (`procs` and `known`) hold theirs.
        let reopen = |known: &mut HashMap<u32, Proc>, procs: &[Proc], pid, ppid| {
            if let Some(mut p) = known.remove(&pid) {
                if p.refresh() {
                    p.ppid = ppid;
                    return Some(p);
                }
            }
            let kept = procs
                .iter()
                .chain(known.values())
                .filter(|p| p.kept())
                .count();
            Proc::open(&self.proc_root, pid, ppid, kept < proc::KEEP_PROCESSES)
        };
        let Some(root) = reopen(&mut known, &[], self.root, 0) else {
            return false;
        };
        let mut procs = vec![root];
        let mut i = 0;
        while i < procs.len() && procs.len() < MAX_PROCESSES {
            let parent = procs[i].pid;
            for c in procs[i].children() {
                if procs.len() >= MAX_PROCESSES || procs.iter().any(|p| p.pid == c) {
                    continue;
                }
                if let Some(p) = reopen(&mut known, &procs, c, parent) {
                    procs.push(p);
                }
            }
            i += 1;
        }
        self.procs = procs;
        true
    }

    /// Each process's RSS at the last walk, by pid.
    fn rss(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self.procs.iter().map(|p| (p.pid, p.rss)).collect();
        v.sort_unstable();
        v
    }

    /// The tree with every row read now (PSS included); `None` when the root went meanwhile.
    fn read(&self) -> Option<ProcessTree> {
        let rows: Vec<_> = self.procs.iter().filter_map(Proc::row).collect();
        (rows.first().map(|r| r.pid) == Some(self.root)).then(|| ProcessTree::new(rows))
    }
}

/// Reads the tree under `root` (`proc_root` is normally `/proc`). Processes that exit while it is
/// read are left out; the root missing is an error.
#[cfg(test)]
pub fn read_tree(proc_root: &Path, root: u32) -> std::io::Result<ProcessTree> {
    let gone = || {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("process {root} is gone"),
        )
    };
    let mut w = Walker::new(proc_root, root);
    if !w.walk() {
        return Err(gone());
    }
    w.read().ok_or_else(gone)
}

/// Reads a job's tree at every sample cheaply, and with its PSS as often as [`schedule`] allows:
/// [`TreeSampler::sample`] gives a tree only when its PSS was read (every tree a snapshot carries
/// was read whole at that moment).
pub(crate) struct TreeSampler {
    walker: Walker,
    schedule: PssSchedule,
    walked: Option<Instant>,
}

impl TreeSampler {
    /// Samples the tree under `root`; the first read is due at once.
    pub(crate) fn new(root: u32) -> Self {
        let now = Instant::now();
        TreeSampler {
            walker: Walker::new(Path::new("/proc"), root),
            schedule: PssSchedule::new(now, schedule::budget_from_env()),
            walked: None,
        }
    }

    /// The tree now when a read is due (and the root still exists), else `None`.
    pub(crate) fn sample(&mut self) -> Option<ProcessTree> {
        let now = Instant::now();
        if self.walked.is_some_and(|w| now < w + MIN_WALK) {
            return None;
        }
        // Without the credit for a read, the tree need not be followed either (what changed
        // meanwhile is seen against the last read, once the credit allows one).
        if !self.schedule.affordable(now) {
            return None;
        }
        self.walked = Some(now);
        if !self.walker.walk() {
            return None;
        }
        let rss = self.walker.rss();
        if !self.schedule.due(now, &rss) {
            return None;
        }
        let cpu = thread_cpu();
        let tree = self.walker.read();
        let cost = thread_cpu().saturating_sub(cpu);
        let pss = tree.as_ref().map_or(0, |t| t.footprint());
        self.schedule.done(Instant::now(), cost, rss, pss);
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_shows_in_the_tree() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        // Until the child has become `sleep` and its PSS reads (during its exec it is neither),
        // with a generous deadline for a busy machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let t = loop {
            let t = read_tree(Path::new("/proc"), std::process::id()).unwrap();
            let ready = t
                .processes
                .iter()
                .any(|p| p.pid == child.id() && p.name == "sleep" && p.pss.is_some());
            if ready || std::time::Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
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
        let t = read_tree(Path::new("/proc"), std::process::id()).unwrap();
        let me = &t.processes[0];
        let (pss, uss) = (me.pss.unwrap(), me.uss.unwrap());
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

    #[test]
    fn a_tree_larger_than_its_kept_descriptors_is_read_whole() {
        let n = proc::KEEP_PROCESSES + 8;
        let mut kids: Vec<_> = (0..n)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut w = Walker::new(Path::new("/proc"), std::process::id());
        // Twice: the second walk re-reads through the descriptors kept and the paths alike.
        for _ in 0..2 {
            assert!(w.walk());
            for k in &kids {
                assert!(w.procs.iter().any(|p| p.pid == k.id() && p.rss > 0));
            }
        }
        assert!(w.procs.iter().filter(|p| p.kept()).count() <= proc::KEEP_PROCESSES);
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    #[test]
    fn the_sampler_follows_a_child_that_appears_and_one_that_leaves() {
        let mut s = TreeSampler::new(std::process::id());
        assert!(s.sample().is_some(), "the first read is due at once");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        // A new process is a reason to read again, as soon as the budget allows: waited for
        // (with a generous deadline), never timed.
        let deadline = Instant::now() + Duration::from_secs(120);
        let with_child = loop {
            std::thread::sleep(MIN_WALK);
            if let Some(t) = s.sample() {
                if t.processes.iter().any(|p| p.pid == child.id()) {
                    break t;
                }
            }
            assert!(Instant::now() < deadline, "the child never showed");
        };
        // The child's own PSS (the tree's total is None whenever another test's short-lived child
        // left between the listing and its read: this test binary runs tests side by side).
        let child_row = with_child.processes.iter().find(|p| p.pid == child.id());
        assert!(child_row.is_some_and(|p| p.pss.is_some()), "{child_row:?}");
        let _ = child.kill();
        let _ = child.wait();
        let without = loop {
            std::thread::sleep(MIN_WALK);
            if let Some(t) = s.sample() {
                break t;
            }
            assert!(Instant::now() < deadline, "no read after the child left");
        };
        assert!(without.processes.iter().all(|p| p.pid != child.id()));
    }
}
