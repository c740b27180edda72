//! /proc readers: a process's RSS split (statm, status) and the system's available memory.
//! Works on `/proc/self` or `/proc/<pid>` (the sidecar's uninstrumented mode).

use super::kept_file::{field_u64, KeptFile};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;

/// A process's memory as the kernel reports it, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Reads `<proc>/status` through a kept-open descriptor.
#[derive(Debug)]
pub struct ProcessReader {
    status: KeptFile,
}

impl ProcessReader {
    /// Opens `<proc_dir>/status` (e.g. `/proc/self`, `/proc/1234`).
    pub fn open(proc_dir: &Path) -> io::Result<Self> {
        Ok(ProcessReader {
            status: KeptFile::open(&proc_dir.join("status"))?,
        })
    }

    /// Reads the current values.
    pub fn read(&self) -> io::Result<ProcessMemory> {
        self.status.read_with(parse_status)?
    }
}

/// Parses the text of `/proc/<pid>/status` (values in kB).
pub fn parse_status(text: &str) -> io::Result<ProcessMemory> {
    let kb = |k: &str| field_u64(text, k).map(|v| v * 1024);
    let rss = kb("VmRSS").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "no VmRSS line (kernel thread or zombie?)",
        )
    })?;
    Ok(ProcessMemory {
        rss,
        hwm: kb("VmHWM").unwrap_or(rss),
        anon: kb("RssAnon").unwrap_or(0),
        file: kb("RssFile").unwrap_or(0),
        shmem: kb("RssShmem").unwrap_or(0),
        swap: kb("VmSwap").unwrap_or(0),
        threads: field_u64(text, "Threads").unwrap_or(0),
    })
}

/// The machine's memory (from /proc/meminfo), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemMemory {
    /// MemTotal.
    pub total: u64,
    /// MemAvailable: what can be allocated without swapping.
    pub available: u64,
}

/// Reads `/proc/meminfo` through a kept-open descriptor.
#[derive(Debug)]
pub struct SystemReader {
    meminfo: KeptFile,
}

impl SystemReader {
    /// Opens `<proc_root>/meminfo` (normally `/proc`).
    pub fn open(proc_root: &Path) -> io::Result<Self> {
        Ok(SystemReader {
            meminfo: KeptFile::open(&proc_root.join("meminfo"))?,
        })
    }

    /// Reads the current values.
    pub fn read(&self) -> io::Result<SystemMemory> {
        self.meminfo.read_with(|t| {
            let total = field_u64(t, "MemTotal").map(|v| v * 1024);
            let available = field_u64(t, "MemAvailable")
                .or_else(|| field_u64(t, "MemFree"))
                .map(|v| v * 1024);
            match (total, available) {
                (Some(total), Some(available)) => Ok(SystemMemory { total, available }),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "meminfo lacks MemTotal/MemAvailable",
                )),
            }
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_parsed_in_bytes() {
        let t = "Name:\tx\nVmHWM:\t  2000 kB\nVmRSS:\t  1500 kB\nRssAnon:\t  1000 kB\nRssFile:\t 400 kB\nRssShmem:\t 100 kB\nVmSwap:\t 8 kB\nThreads:\t3\n";
        let m = parse_status(t).unwrap();
        assert_eq!(m.rss, 1500 * 1024);
        assert_eq!(m.hwm, 2000 * 1024);
        assert_eq!(m.anon + m.file + m.shmem, m.rss);
        assert_eq!(m.swap, 8 * 1024);
        assert_eq!(m.threads, 3);
    }

    #[test]
    fn own_process_is_readable() {
        let r = ProcessReader::open(Path::new("/proc/self")).unwrap();
        let m = r.read().unwrap();
        assert!(m.rss > 0 && m.hwm >= m.rss && m.threads >= 1);
        let s = SystemReader::open(Path::new("/proc"))
            .unwrap()
            .read()
            .unwrap();
        assert!(s.total > 0 && s.available <= s.total);
    }
}
