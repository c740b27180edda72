//! One process of a job's tree, read from outside through descriptors kept open (one `pread`
//! each): `stat` (name, state, thread count) and `statm` (RSS) at every sample, its threads'
//! `children` lists to follow the tree, and — only when the tree's PSS is read — `status` (the
//! RSS split) and `smaps_rollup` (PSS and USS, the costly page walk). Descriptors are kept for the
//! first [`KEEP_PROCESSES`] processes of a tree and [`KEEP_THREADS`] threads of each (at most
//! 192, well inside the usual limit of 1024 the sidecar shares with its rings and clients); the
//! files of the others are opened at each read.

use memsight::collect::procfs::parse_status;
use memsight::collect::KeptFile;
use memsight_format::host::TreeProcess;
use std::path::{Path, PathBuf};

/// Processes of a tree whose files are kept open.
pub(crate) const KEEP_PROCESSES: usize = 32;

/// Threads of a kept process whose `children` files are kept open.
const KEEP_THREADS: usize = 4;

/// A file read at every walk: kept open, or opened at each read.
enum Source {
    Kept(KeptFile),
    Path(PathBuf),
}

impl Source {
    /// `path`, kept open when `keep`; `None` when it cannot be opened (the process is gone).
    fn open(path: PathBuf, keep: bool) -> Option<Self> {
        if keep {
            KeptFile::open_own(&path).ok().map(Source::Kept)
        } else {
            std::fs::metadata(&path).ok().map(|_| Source::Path(path))
        }
    }

    fn read_with<T>(&self, f: impl FnOnce(&str) -> T) -> std::io::Result<T> {
        match self {
            Source::Kept(k) => k.read_with(f),
            Source::Path(p) => std::fs::read_to_string(p).map(|t| f(&t)),
        }
    }
}

/// A process followed from one sample to the next.
pub(crate) struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    /// RSS in bytes at the last sample (`statm`).
    pub rss: u64,
    dir: PathBuf,
    keep: bool,
    stat: Source,
    statm: Source,
    /// `task/<tid>/children` of each thread, listed again when the thread count changes or one
    /// of them can no longer be read.
    children: Vec<Source>,
    threads: u64,
}

/// The page size in bytes.
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE
        .get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096))
}

/// The fields of `stat` the tree needs: name, whether it still runs, thread count.
fn parse_stat(text: &str) -> Option<(String, bool, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?;
    let threads = rest.nth(16)?.parse().ok()?;
    Some((name, !matches!(state, "Z" | "X" | "x"), threads))
}

/// PSS and USS (`Private_Clean + Private_Dirty`) in bytes from the text of `smaps_rollup`.
pub(crate) fn parse_rollup(text: &str) -> Option<(u64, u64)> {
    let kb = |key: &str| {
        text.lines().find_map(|l| {
            let v = l.strip_prefix(key)?.strip_prefix(':')?;
            v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
        })
    };
    Some((
        kb("Pss")? * 1024,
        (kb("Private_Clean")? + kb("Private_Dirty")?) * 1024,
    ))
}

impl Proc {
    /// Opens process `pid` under `proc_root`, its files kept open when `keep`; `None` when it is
    /// gone.
    pub(crate) fn open(proc_root: &Path, pid: u32, ppid: u32, keep: bool) -> Option<Self> {
        let dir = proc_root.join(pid.to_string());
        let mut p = Proc {
            pid,
            ppid,
            name: String::new(),
            rss: 0,
            stat: Source::open(dir.join("stat"), keep)?,
            statm: Source::open(dir.join("statm"), keep)?,
            dir,
            keep,
            children: Vec::new(),
            threads: 0,
        };
        p.refresh().then_some(p)
    }

    /// Whether its files are kept open.
    pub(crate) fn kept(&self) -> bool {
        self.keep
    }

    /// Reads its name, state and RSS; false once it is gone (or a zombie).
    pub(crate) fn refresh(&mut self) -> bool {
        let Some((name, runs, threads)) = self.stat.read_with(parse_stat).ok().flatten() else {
            return false;
        };
        if !runs {
            return false;
        }
        if name != self.name {
            self.name = name;
        }
        if threads != self.threads {
            self.threads = threads;
            self.children.clear();
        }
        let page = page_size();
        let rss = self.statm.read_with(|t| {
            t.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        });
        match rss {
            Ok(Some(pages)) => {
                self.rss = pages * page;
                true
            }
            _ => false,
        }
    }

    /// The children of every thread, sorted.
    pub(crate) fn children(&mut self) -> Vec<u32> {
        if self.children.is_empty() {
            self.list_threads();
        }
        let mut out = Vec::new();
        let mut stale = false;
        for f in &self.children {
            let read = f.read_with(|t| {
                out.extend(t.split_whitespace().filter_map(|c| c.parse::<u32>().ok()))
            });
            stale |= read.is_err();
        }
        if stale {
            // A thread ended: its children moved to another; listed afresh at the next sample.
            self.children.clear();
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    fn list_threads(&mut self) {
        let Ok(tasks) = std::fs::read_dir(self.dir.join("task")) else {
            return;
        };
        self.children = tasks
            .flatten()
            .enumerate()
            .filter_map(|(i, t)| {
                Source::open(t.path().join("children"), self.keep && i < KEEP_THREADS)
            })
            .collect();
    }

    /// Its row of the tree, with the RSS split (`status`) and PSS and USS (`smaps_rollup`, which
    /// walks its page tables) read now; `None` when it is gone.
    pub(crate) fn row(&self) -> Option<TreeProcess> {
        let s = std::fs::read_to_string(self.dir.join("status")).ok()?;
        let m = parse_status(&s).ok()?;
        let (pss, uss) = std::fs::read_to_string(self.dir.join("smaps_rollup"))
            .ok()
            .and_then(|t| parse_rollup(&t))
            .unzip();
        Some(TreeProcess {
            pid: self.pid,
            ppid: self.ppid,
            name: self.name.clone(),
            rss: m.rss,
            anon: m.anon,
            file: m.file,
            shmem: m.shmem,
            pss,
            uss,
            heap: None,
            role: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_a_name_with_spaces_and_parentheses() {
        let t = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 7 0 123 4096 10";
        assert_eq!(parse_stat(t), Some(("a (b) c".into(), true, 7)));
        let z = "43 (x) Z 1 43 43 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0";
        assert_eq!(parse_stat(z), Some(("x".into(), false, 1)));
    }

    #[test]
    fn rollup_gives_pss_and_private_bytes() {
        let t = "00400000-7fff [rollup]\nRss:  300 kB\nPss:  120 kB\nPss_Anon:  100 kB\n\
                 Private_Clean:  8 kB\nPrivate_Dirty:  40 kB\n";
        assert_eq!(parse_rollup(t), Some((120 * 1024, 48 * 1024)));
        assert_eq!(parse_rollup("Rss: 1 kB\n"), None);
    }

    #[test]
    fn own_process_is_followed() {
        for keep in [true, false] {
            let mut p = Proc::open(Path::new("/proc"), std::process::id(), 0, keep).unwrap();
            assert!(p.rss > 0 && !p.name.is_empty());
            assert!(p.refresh());
            let row = p.row().unwrap();
            assert!(row.pss.unwrap() <= row.rss + (1 << 20), "{row:?}");
        }
    }
}
