//! The process's memory cgroup, v2 or v1 (hybrid hosts included): limit, usage, peak, OOM kills.
//!
//! Discovery reads `/proc/<pid>/cgroup` and `/proc/<pid>/mountinfo` and resolves the cgroup path
//! against the mount's root, so it works inside containers. Every path is taken under a `root`
//! prefix (normally `/`) so fixture directories can stand in for a real system in tests.
//! The effective limit is the smallest limit of the cgroup and its ancestors.

use super::kept_file::{field_u64, parse_u64_or_max, KeptFile};
use memsight_format::host::CgroupMemory;
use std::io;
use std::path::{Path, PathBuf};

/// v1 reports "no limit" as a page-aligned i64::MAX; anything this large means unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

/// Reads one memory cgroup through kept-open descriptors.
#[derive(Debug)]
pub struct CgroupReader {
    version: u8,
    dir: PathBuf,
    usage: KeptFile,
    limit: KeptFile,
    peak: Option<KeptFile>,
    /// The cgroup's high-water mark when this reader opened: v1's `memory.max_usage_in_bytes`
    /// and v2's `memory.peak` keep the cgroup's whole life (a container running jobs one after
    /// another), so only a peak above it is this job's.
    peak_at_open: Option<u64>,
    events: Option<KeptFile>,
    ancestor_limit: Option<u64>,
}

struct Mount {
    root: String,
    point: String,
    fstype: String,
    super_opts: String,
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(Mount {
                root: unescape(f.get(3)?),
                point: unescape(f.get(4)?),
                fstype: f.get(sep + 1)?.to_string(),
                super_opts: f.get(sep + 3).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

/// A process's mount table (`/proc/<pid>/mountinfo`), parsed: where the cgroup file systems are.
#[derive(Default)]
pub struct Mounts {
    list: Vec<Mount>,
}

impl Mounts {
    /// Reads `<proc_dir>/mountinfo`. The error is a human-readable reason.
    pub fn read(proc_dir: &Path) -> Result<Self, String> {
        let path = proc_dir.join("mountinfo");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(Mounts {
            list: parse_mountinfo(&text),
        })
    }
}

/// Joins an absolute path under `root`.
fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The cgroup's directory: the mount point plus the cgroup path relative to the mount's root.
fn resolve(root: &Path, mount: &Mount, cgroup_path: &str) -> PathBuf {
    let rel = if mount.root == "/" {
        cgroup_path
    } else {
        cgroup_path.strip_prefix(mount.root.as_str()).unwrap_or("/")
    };
    let base = under(root, &mount.point);
    let dir = base.join(rel.trim_start_matches('/'));
    if dir.is_dir() {
        dir
    } else {
        base
    }
}

/// Smallest limit among the ancestors of `dir` up to (and including) `top`.
fn ancestors_limit(dir: &Path, top: &Path, file: &str, v1: bool) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut cur = dir.parent();
    while let Some(d) = cur {
        if !d.starts_with(top) {
            break;
        }
        if let Ok(t) = std::fs::read_to_string(d.join(file)) {
            if let Ok(Some(v)) = parse_u64_or_max(&t) {
                if !(v1 && v >= V1_UNLIMITED) {
                    best = Some(best.map_or(v, |b| b.min(v)));
                }
            }
        }
        cur = d.parent();
    }
    best
}

impl CgroupReader {
    /// Finds the memory cgroup of the process whose `/proc/<pid>` is `proc_dir`, with every
    /// absolute path taken under `root`. The error is a human-readable reason.
    pub fn discover(proc_dir: &Path, root: &Path) -> Result<Self, String> {
        let cgroup = std::fs::read_to_string(proc_dir.join("cgroup"))
            .map_err(|e| format!("cannot read {}: {e}", proc_dir.join("cgroup").display()))?;
        Self::discover_in(&cgroup, &Mounts::read(proc_dir)?, root)
    }

    /// Finds the memory cgroup named by `cgroup` (the text of `/proc/<pid>/cgroup`) among
    /// `mounts` (read once: a watcher re-reads only the small `cgroup` file, and resolves it again
    /// only when it changed), with every absolute path taken under `root`.
    pub fn discover_in(cgroup: &str, mounts: &Mounts, root: &Path) -> Result<Self, String> {
        let mounts = &mounts.list;
        let mut v1_path = None;
        let mut v2_path = None;
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && ctrl.is_empty() {
                v2_path = Some(path.to_string());
            } else if ctrl.split(',').any(|c| c == "memory") {
                v1_path = Some(path.to_string());
            }
        }
        if let Some(p) = &v2_path {
            if let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2") {
                let dir = resolve(root, m, p);
                if dir.join("memory.current").exists() {
                    return Self::open(2, dir, &under(root, &m.point));
                }
            }
        }
        if let Some(p) = &v1_path {
            let m = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
                .ok_or("cgroup v1 memory controller listed but not mounted")?;
            let dir = resolve(root, m, p);
            return Self::open(1, dir, &under(root, &m.point));
        }
        Err(match v2_path {
            Some(_) => {
                "cgroup v2 without the memory controller, and no v1 memory controller".into()
            }
            None => "no memory cgroup".into(),
        })
    }

    fn open(version: u8, dir: PathBuf, top: &Path) -> Result<Self, String> {
        let open = |name: &str| {
            KeptFile::open(&dir.join(name))
                .map_err(|e| format!("cannot open {}: {e}", dir.join(name).display()))
        };
        let optional = |name: &str| KeptFile::open(&dir.join(name)).ok();
        let (usage, limit, peak, events, limit_name) = if version == 2 {
            (
                open("memory.current")?,
                open("memory.max")?,
                optional("memory.peak"),
                optional("memory.events"),
                "memory.max",
            )
        } else {
            (
                open("memory.usage_in_bytes")?,
                open("memory.limit_in_bytes")?,
                optional("memory.max_usage_in_bytes"),
                optional("memory.oom_control"),
                "memory.limit_in_bytes",
            )
        };
        let ancestor_limit = ancestors_limit(&dir, top, limit_name, version == 1);
        let peak_at_open = peak
            .as_ref()
            .and_then(|f| f.read_u64_or_max().ok().flatten());
        Ok(CgroupReader {
            version,
            dir,
            usage,
            limit,
            peak,
            peak_at_open,
            events,
            ancestor_limit,
        })
    }

    /// The cgroup version, 1 or 2.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the current values.
    pub fn read(&self) -> io::Result<CgroupMemory> {
        let own_limit = self
            .limit
            .read_u64_or_max()?
            .filter(|&l| !(self.version == 1 && l >= V1_UNLIMITED));
        let limit = match (own_limit, self.ancestor_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let usage = self.usage.read_u64_or_max()?.unwrap_or(0);
        // The cgroup's peak only once it rose while this reader watched: the high-water mark
        // it had before is an earlier job's (a 638 MiB peak was said under a 450 MiB limit).
        let peak = match &self.peak {
            Some(f) => f
                .read_u64_or_max()?
                .filter(|&p| self.peak_at_open.is_none_or(|before| p > before)),
            None => None,
        };
        let oom_kills = match &self.events {
            Some(f) => f.read_with(|t| field_u64(t, "oom_kill"))?,
            None => None,
        };
        Ok(CgroupMemory {
            version: self.version,
            limit,
            usage,
            peak,
            oom_kills,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::CgroupReader;

    /// A v1 cgroup that ran an earlier job keeps that job's high-water mark: it is not this job's
    /// peak (it was said as "usage reached 638 MiB" under a 450 MiB limit); a peak that rises
    /// while the reader watches is.
    #[test]
    fn a_cgroup_s_peak_from_before_the_reader_opened_is_not_the_job_s() {
        let dir = std::env::temp_dir().join(format!("memsight-cgroup-peak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let set = |name: &str, v: u64| std::fs::write(dir.join(name), format!("{v}\n")).unwrap();
        set("memory.usage_in_bytes", 10 << 20);
        set("memory.limit_in_bytes", 450 << 20);
        set("memory.max_usage_in_bytes", 638 << 20);
        let reader = CgroupReader::open(1, dir.clone(), &dir).unwrap();
        let m = reader.read().unwrap();
        assert_eq!(m.peak, None, "{m:?}");
        assert_eq!(m.usage, 10 << 20);
        set("memory.max_usage_in_bytes", 700 << 20);
        assert_eq!(reader.read().unwrap().peak, Some(700 << 20));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
