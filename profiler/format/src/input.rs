//! The one way memsight reads a file a user named — a report, a budget file, a heap profile, a log:
//! opened without blocking (a FIFO nobody writes to cannot hang the reader), refused unless it is a
//! regular file (a FIFO, a device such as `/dev/zero`, a directory), and read only up to a stated
//! maximum, so a wrong path gets one clear error instead of a hang or gigabytes of memory.

use crate::units::fmt_bytes;
use std::fs::Metadata;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// The largest report memsight reads (256 MiB; a day-long run's report is a few MiB).
pub const MAX_REPORT_BYTES: u64 = 256 << 20;
/// The largest budget file memsight reads (1 MiB).
pub const MAX_BUDGET_BYTES: u64 = 1 << 20;
/// The largest heap profile memsight reads (256 MiB; jemalloc's and memsight's are a few MiB).
pub const MAX_HEAP_PROFILE_BYTES: u64 = 256 << 20;
/// The largest log `memsight diagnose` reads, from a file or standard input (1 GiB).
pub const MAX_LOG_BYTES: u64 = 1 << 30;

/// What a file is, in words, when it is not a regular file.
fn not_regular(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

fn too_big(size: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{} or more, over the {} memsight reads from such a file",
            fmt_bytes(size),
            fmt_bytes(max)
        ),
    )
}

/// Reads the regular file at `path` (following symbolic links), at most `max` bytes. A FIFO,
/// device, socket or directory is refused without blocking; a larger file is refused whole.
/// Errors name what was found (`not a regular file but a FIFO …`), not the path: the caller adds it.
pub fn read(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if let Some(what) = not_regular(&meta) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file but {what} (memsight reads only regular files)"),
        ));
    }
    if meta.len() > max {
        return Err(too_big(meta.len(), max));
    }
    read_limited(file, max, meta.len())
}

/// Reads `r` to its end, at most `max` bytes (standard input, say); `hint` is the expected size.
pub fn read_limited(r: impl Read, max: u64, hint: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(hint.min(max) as usize);
    r.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(too_big(out.len() as u64, max));
    }
    Ok(out)
}

/// Like [`read`], as text; bytes that are not UTF-8 are an error.
pub fn read_to_string(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read(path, max)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("memsight-input-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_a_regular_file_and_refuses_the_rest() {
        let d = scratch("kinds");
        let f = d.join("r.json");
        std::fs::write(&f, b"{}").unwrap();
        assert_eq!(read(&f, 10).unwrap(), b"{}");
        let e = read(&d, 10).unwrap_err().to_string();
        assert!(e.contains("but a directory"), "{e}");
        let e = read(Path::new("/dev/zero"), 10).unwrap_err().to_string();
        assert!(e.contains("but a character device"), "{e}");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("but a FIFO"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_over_the_limit_is_refused_whole() {
        let d = scratch("size");
        let f = d.join("big");
        std::fs::write(&f, vec![b'x'; 2048]).unwrap();
        let e = read(&f, 1024).unwrap_err().to_string();
        assert!(e.contains("over the 1.00 KiB"), "{e}");
        let e = read_limited(&[0u8; 2048][..], 1024, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("over the 1.00 KiB"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
