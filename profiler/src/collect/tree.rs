//! A process and its descendants (data-loader workers, spawned helpers): each one's RSS with its
//! anon / file / shmem split (`status`), its PSS and USS (`smaps_rollup`), and the tree's totals,
//! read from /proc (`task/*/children`) without scanning every pid.

use super::kept_file::field_u64;
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

/// PSS and USS (`Private_Clean + Private_Dirty`) in bytes from the text of `smaps_rollup`.
pub fn parse_smaps_rollup(text: &str) -> Option<(u64, u64)> {
    let kb = |k: &str| field_u64(text, k).map(|v| v * 1024);
    Some((kb("Pss")?, kb("Private_Clean")? + kb("Private_Dirty")?))
}

/// One process's memory; `None` once it is gone (or a zombie, which has no `VmRSS`).
fn read_process(proc_root: &Path, pid: u32, ppid: u32) -> Option<TreeProcess> {
    let dir = proc_root.join(pid.to_string());
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let m = super::procfs::parse_status(&status).ok()?;
    let rollup = std::fs::read_to_string(dir.join("smaps_rollup")).ok();
    let (pss, uss) = rollup.as_deref().and_then(parse_smaps_rollup).unzip();
    let name = std::fs::read_to_string(dir.join("comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default();
    Some(TreeProcess {
        pid,
        ppid,
        name,
        rss: m.rss,
        anon: m.anon,
        file: m.file,
        shmem: m.shmem,
        pss,
        uss,
    })
}

/// Reads the tree under `root` (`proc_root` is normally `/proc`). Processes that exit while it is
/// read are left out; the root missing is an error.
pub fn read_tree(proc_root: &Path, root: u32) -> io::Result<ProcessTree> {
    let first = read_process(proc_root, root, 0).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("process {root} is gone"))
    })?;
    let mut processes = vec![first];
    let mut i = 0;
    while i < processes.len() && processes.len() < MAX_PROCESSES {
        let parent = processes[i].pid;
        for c in children(proc_root, parent) {
            if processes.len() >= MAX_PROCESSES || processes.iter().any(|p| p.pid == c) {
                continue;
            }
            processes.extend(read_process(proc_root, c, parent));
        }
        i += 1;
    }
    Ok(ProcessTree::new(processes))
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
    fn smaps_rollup_gives_pss_and_private_bytes() {
        let text = "00400000-7ffe ---p 00000000 00:00 0 [rollup]\nRss:  1668 kB\nPss:  273 kB\n\
                    Pss_Anon:  116 kB\nShared_Clean:  1512 kB\nPrivate_Clean:  40 kB\n\
                    Private_Dirty:  116 kB\n";
        assert_eq!(parse_smaps_rollup(text), Some((273 << 10, 156 << 10)));
        assert_eq!(parse_smaps_rollup("Rss: 4 kB\n"), None);
    }
}
