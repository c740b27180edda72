//! A process and its descendants (data-loader workers, spawned helpers): each one's RSS and the
//! tree's total, read from /proc (`task/*/children`, `statm`, `comm`) without scanning every pid.

use memsight_format::host::{ProcessTree, TreeProcess};
use std::io;
use std::path::Path;

/// Most processes followed in one tree.
const MAX_PROCESSES: usize = 1024;

fn children(proc_root: &Path, pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(proc_root.join(pid.to_string()).join("task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn rss(proc_root: &Path, pid: u32, page: u64) -> Option<u64> {
    let statm = std::fs::read_to_string(proc_root.join(pid.to_string()).join("statm")).ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(resident * page)
}

/// Reads the tree under `root` (`proc_root` is normally `/proc`). Processes that exit while it is
/// read are left out; the root missing is an error.
pub fn read_tree(proc_root: &Path, root: u32) -> io::Result<ProcessTree> {
    let page = crate::sys::page_size();
    let root_rss = rss(proc_root, root, page).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("process {root} is gone"))
    })?;
    let name = |pid: u32| {
        std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default()
    };
    let mut tree = ProcessTree {
        total_rss: root_rss,
        processes: vec![TreeProcess {
            pid: root,
            ppid: 0,
            name: name(root),
            rss: root_rss,
        }],
    };
    let mut i = 0;
    while i < tree.processes.len() && tree.processes.len() < MAX_PROCESSES {
        let parent = tree.processes[i].pid;
        for c in children(proc_root, parent) {
            if tree.processes.len() >= MAX_PROCESSES || tree.processes.iter().any(|p| p.pid == c) {
                continue;
            }
            if let Some(r) = rss(proc_root, c, page) {
                tree.total_rss += r;
                tree.processes.push(TreeProcess {
                    pid: c,
                    ppid: parent,
                    name: name(c),
                    rss: r,
                });
            }
        }
        i += 1;
    }
    Ok(tree)
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
        assert!(read_tree(Path::new("/proc"), u32::MAX - 1).is_err());
    }
}
