//! A file kept open and re-read from offset 0 (pread), for /proc and cgroup counters: ~2 µs a read
//! instead of open + read + close, and no allocation per read.

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

/// Largest file we read; /proc/self/status and /proc/meminfo are ~1.5 KiB.
const BUF: usize = 8192;

/// An open file that is re-read in full on every [`KeptFile::read_with`].
///
/// The descriptor lives in the job's own descriptor table, where the job may close it (a daemon
/// that closes every descriptor, `close_range`) and reuse its number for a file of its own. So
/// every read first checks that the number still names the file it opened (device and inode);
/// when it does not, the number is left to the job — never read, never closed — and the file is
/// opened again by its path.
#[derive(Debug)]
pub struct KeptFile {
    fd: AtomicI32,
    /// Device and inode of the file opened; `None` for a descriptor no other code may close
    /// ([`KeptFile::open_own`]), read without the check.
    id: Option<(u64, u64)>,
    path: PathBuf,
}

fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`; a closed descriptor is an error, not undefined behaviour.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

impl KeptFile {
    /// Opens `path` for repeated reads.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = File::open(path)?.into_raw_fd();
        let Some(id) = identity(fd) else {
            let e = io::Error::last_os_error();
            // SAFETY: closing the descriptor just opened, owned by nothing else.
            unsafe { libc::close(fd) };
            return Err(e);
        };
        Ok(KeptFile {
            fd: AtomicI32::new(fd),
            id: Some(id),
            path: path.to_path_buf(),
        })
    }

    /// Opens `path` for repeated reads in a process whose code never closes descriptors it did
    /// not open (the sidecar, not a job): each read skips the check that the number is still
    /// this file (one `fstat` less).
    pub fn open_own(path: &Path) -> io::Result<Self> {
        Ok(KeptFile {
            fd: AtomicI32::new(File::open(path)?.into_raw_fd()),
            id: None,
            path: path.to_path_buf(),
        })
    }

    /// The descriptor, checked to still name this file; reopened by path when the job took the
    /// number back.
    fn checked_fd(&self) -> io::Result<RawFd> {
        let fd = self.fd.load(Ordering::Relaxed);
        let Some(id) = self.id else {
            return Ok(fd);
        };
        if fd >= 0 && identity(fd) == Some(id) {
            return Ok(fd);
        }
        // The job closed or reused it: open again (the old number is the job's now).
        let new = File::open(&self.path)?.into_raw_fd();
        self.fd.store(new, Ordering::Relaxed);
        Ok(new)
    }

    /// Reads the whole file (up to 8 KiB) and hands its text to `f`.
    pub fn read_with<T>(&self, f: impl FnOnce(&str) -> T) -> io::Result<T> {
        let fd = self.checked_fd()?;
        // SAFETY: `fd` is open and ours (checked above); ManuallyDrop keeps this borrow from
        // closing it.
        let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        let mut buf = [0u8; BUF];
        let mut len = 0;
        while len < BUF {
            let n = file.read_at(&mut buf[len..], len as u64)?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let text = std::str::from_utf8(&buf[..len])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(f(text))
    }

    /// Reads the file as one unsigned integer (cgroup counters); `None` for `max`.
    pub fn read_u64_or_max(&self) -> io::Result<Option<u64>> {
        self.read_with(parse_u64_or_max)?.map_err(|msg| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {msg}", self.path.display()),
            )
        })
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        let fd = *self.fd.get_mut();
        // Closed only while it is still this file: a number the job took back is the job's.
        if fd >= 0 && (self.id.is_none() || identity(fd) == self.id) {
            // SAFETY: closing a descriptor this value opened and still owns.
            unsafe { libc::close(fd) };
        }
    }
}

/// Parses a cgroup value: a decimal integer, or `max` (no limit).
pub fn parse_u64_or_max(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("expected an integer or 'max', found {t:?}"))
}

/// Finds `key` in `Key:   value unit` / `key value` lines and returns its first number.
pub fn field_u64(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?;
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        if !rest.starts_with([' ', '\t']) {
            return None;
        }
        rest.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_match_whole_keys_only() {
        let t = "VmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t 512 kB\n";
        assert_eq!(field_u64(t, "VmRSS"), Some(1024));
        assert_eq!(field_u64(t, "VmHWM"), Some(2048));
        assert_eq!(field_u64(t, "Rss"), None);
        assert_eq!(field_u64("oom_kill 3\noom 4\n", "oom"), Some(4));
        assert_eq!(field_u64("oom_kill 3\noom 4\n", "oom_kill"), Some(3));
    }

    #[test]
    fn a_descriptor_the_job_closed_and_reused_is_reopened_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("kept-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ours, theirs) = (dir.join("ours"), dir.join("theirs"));
        std::fs::write(&ours, "ours\n").unwrap();
        std::fs::write(&theirs, "theirs\n").unwrap();
        let kept = KeptFile::open(&ours).unwrap();
        let fd = kept.fd.load(Ordering::Relaxed);
        // The job closes every descriptor and opens a file of its own, which gets the number.
        // (dup2 puts the job's file at that very number, as a reuse would.)
        let opened = File::open(&theirs).unwrap().into_raw_fd();
        // SAFETY: replacing a number, as a daemon's close-and-open would; then closing the spare.
        let job_file = unsafe { libc::dup2(opened, fd) };
        // SAFETY: as above.
        unsafe { libc::close(opened) };
        assert_eq!(job_file, fd, "the number was reused");
        assert_eq!(kept.read_with(str::to_owned).unwrap(), "ours\n");
        drop(kept);
        // The job's descriptor is still open and still its file.
        // SAFETY: the job's descriptor, read then closed by its owner (this test).
        let f = unsafe { File::from_raw_fd(job_file) };
        let mut b = [0u8; 7];
        f.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"theirs\n");
    }

    #[test]
    fn cgroup_values() {
        assert_eq!(parse_u64_or_max("max\n"), Ok(None));
        assert_eq!(parse_u64_or_max("123\n"), Ok(Some(123)));
        assert!(parse_u64_or_max("12x").is_err());
    }
}
