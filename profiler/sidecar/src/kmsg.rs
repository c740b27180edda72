//! The kernel's own account of the OOM kills that happen while a job runs: `/dev/kmsg` read from
//! the moment watching began, each "Killed process" line read by the diagnosis engine (the same
//! reader `memsight diagnose` uses on a pasted `dmesg`). Where the log is not readable (an
//! unprivileged user under `dmesg_restrict`), nothing is known from it and the sidecar's own
//! samples stand in.

use memsight_analysis::diagnose::{find_ooms, Facts, Kind};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// What the kernel said of a process it killed.
#[derive(Clone, Debug, Default)]
pub(crate) struct KernelKill {
    /// The process's resident memory at the kill: anon + file + shmem RSS, in bytes.
    pub rss_bytes: Option<u64>,
}

/// Follows the kernel log from now on.
pub(crate) struct KernelLog {
    file: Option<std::fs::File>,
    /// Kills by pid.
    pub kills: HashMap<u32, KernelKill>,
}

impl KernelLog {
    /// Opens the log at its end (what came before watching began is not this job's).
    pub(crate) fn open() -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .filter(|f| {
                use std::os::fd::AsRawFd;
                // SAFETY: lseek on a descriptor we own; SEEK_END on /dev/kmsg moves past the
                // records already in the buffer.
                unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) >= 0 }
            });
        KernelLog {
            file,
            kills: HashMap::new(),
        }
    }

    /// Reads the records written since the last call and keeps the kills among them.
    pub(crate) fn poll(&mut self) {
        let Some(f) = self.file.as_mut() else {
            return;
        };
        // One record per read; a record is at most about 1 KiB (the kernel's limit is 8 KiB).
        let mut buf = vec![0u8; 8192];
        let mut kills = Vec::new();
        for _ in 0..10_000 {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                // EPIPE: records were overwritten before we read them; the next read goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            };
            let text = String::from_utf8_lossy(&buf[..n]);
            // `prio,seq,time,flags;message`
            let message = text.split_once(';').map_or(&*text, |(_, m)| m).trim_end();
            if message.contains("Killed process") {
                kills.push(message.to_string());
            }
        }
        for k in kills {
            self.take(&k);
        }
    }

    fn take(&mut self, message: &str) {
        for f in find_ooms(message) {
            if f.kind != Kind::LinuxOomKiller {
                continue;
            }
            let Some(pid) = f.facts.bytes("pid").and_then(|p| u32::try_from(p).ok()) else {
                continue;
            };
            self.kills.insert(pid, kill_of(&f.facts));
        }
    }
}

fn kill_of(facts: &Facts) -> KernelKill {
    let b = |name: &str| facts.bytes(name).and_then(|v| u64::try_from(v).ok());
    let anon = b("anon_rss_bytes");
    let parts = [anon, b("file_rss_bytes"), b("shmem_rss_bytes")];
    let rss = anon.map(|_| parts.iter().flatten().sum());
    KernelKill { rss_bytes: rss }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_kill_line_gives_its_pid_and_resident_size() {
        let mut log = KernelLog {
            file: None,
            kills: HashMap::new(),
        };
        log.take(
            "Memory cgroup out of memory: Killed process 4242 (pt_data_worker) \
             total-vm:2097152kB, anon-rss:1062356kB, file-rss:10240kB, shmem-rss:0kB, UID:0 \
             pgtables:2300kB oom_score_adj:0",
        );
        let k = &log.kills[&4242];
        assert_eq!(k.rss_bytes, Some((1_062_356 + 10_240) * 1024));
    }
}
