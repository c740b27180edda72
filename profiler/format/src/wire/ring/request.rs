//! Requests to a running job through its ring's header (`memsight heap dump|sampling PID`): the
//! request words are read and written with `pread`/`pwrite` under a lock on those header bytes,
//! never through a mapping, so a ring truncated under the command is an error, not a fault.

use super::reader::{read_at, u64_at};
use super::*;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A request to a running job through its ring's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapRequest {
    /// Dump a heap profile now.
    Dump,
    /// Switch allocation sampling on or off.
    Sampling(bool),
}

/// Writes `req` into the header of the ring at `path`; the job acts on it at its next sample.
/// Returns the dump-request count after this request.
pub fn request_heap(path: &Path, req: HeapRequest) -> Result<u64, WireError> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let short = || WireError::NotARing(format!("{} is too short", path.display()));
    if read_at::<8>(&file, 0).ok_or_else(short)? != MAGIC {
        return Err(WireError::NotARing(format!(
            "{} has no ring magic",
            path.display()
        )));
    }
    // Copies, never a mapping: a ring truncated under this command reads or writes short instead
    // of faulting. The read-modify-write of the request words is serialised between requesters
    // by a lock on those header bytes (an open-file-description lock: it does not meet the
    // flock that the job and readers hold on the whole file). The job reads them through its
    // shared mapping, which sees these writes.
    let _lock = HeaderLock::take(&file)?;
    let count = u64_at(&file, OFF_HEAP_DUMP_REQUESTS).ok_or_else(short)?;
    let write = |off: usize, v: u64| {
        file.write_all_at(&v.to_le_bytes(), off as u64)
            .map_err(WireError::from)
    };
    Ok(match req {
        HeapRequest::Dump => {
            write(OFF_HEAP_DUMP_REQUESTS, count + 1)?;
            count + 1
        }
        HeapRequest::Sampling(on) => {
            write(OFF_HEAP_SAMPLING_REQUEST, if on { 1 } else { 2 })?;
            count
        }
    })
}

/// An exclusive open-file-description lock on the heap-request words of a ring's header, released
/// on drop.
struct HeaderLock<'a>(&'a File);

impl<'a> HeaderLock<'a> {
    fn lock(file: &File, kind: libc::c_int, cmd: libc::c_int) -> std::io::Result<()> {
        // SAFETY: an all-zero flock is a valid value to fill in.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = OFF_HEAP_DUMP_REQUESTS as libc::off_t;
        fl.l_len = 16;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor and a pointer to a live flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn take(file: &'a File) -> Result<Self, WireError> {
        Self::lock(file, libc::F_WRLCK, libc::F_OFD_SETLKW)?;
        Ok(HeaderLock(file))
    }
}

impl Drop for HeaderLock<'_> {
    fn drop(&mut self) {
        let _ = Self::lock(self.0, libc::F_UNLCK, libc::F_OFD_SETLK);
    }
}
