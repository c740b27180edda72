//! The one way memsight writes a file: a new file created `O_CREAT|O_EXCL|O_NOFOLLOW` under an
//! unpredictable name in the target's directory, filled, then renamed over the target — and only
//! over a regular file (or where nothing is). A symlink, device, FIFO, socket or directory at the
//! target is refused, so a planted file can neither redirect the write nor be replaced by it, and a
//! reader never sees a half-written file.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Permissions of a finished file (reports are read by CI and people; their directory guards them).
const FINAL_MODE: u32 = 0o644;

/// Why `path` cannot be replaced, or `None` when it is a regular file or absent. Says what is
/// there instead, in words.
fn refuse(path: &Path) -> Option<io::Error> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => return Some(e),
    };
    let t = meta.file_type();
    let what = if t.is_file() {
        return None;
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Some(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file but {what} (memsight replaces only regular files)"),
    ))
}

/// 16 random hex digits from the kernel.
fn random_suffix() -> io::Result<String> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn parent_of(target: &Path) -> &Path {
    match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A file being written for `target`: renamed over it by [`Pending::commit`], removed if dropped.
#[derive(Debug)]
pub struct Pending {
    file: File,
    tmp: PathBuf,
    target: PathBuf,
    done: bool,
}

impl Pending {
    /// Refuses a non-regular `target`, then creates the temporary file beside it (mode 0600 while
    /// it is written).
    pub fn new(target: &Path) -> io::Result<Pending> {
        if let Some(e) = refuse(target) {
            return Err(e);
        }
        let name = target.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no file", target.display()),
            )
        })?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", random_suffix()?));
        let tmp = parent_of(target).join(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| {
                let dir = parent_of(target).display();
                io::Error::new(e.kind(), format!("cannot create a file in {dir}: {e}"))
            })?;
        Ok(Pending {
            file,
            tmp,
            target: target.to_path_buf(),
            done: false,
        })
    }

    /// The open temporary file.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Where the temporary file is (for writers that take a path, like jemalloc's `prof.dump`).
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the file to its target — over a regular file only, never over anything that appeared
    /// there since [`Pending::new`] — and returns it, still open for writing.
    pub fn commit(mut self) -> io::Result<File> {
        self.file
            .set_permissions(std::fs::Permissions::from_mode(FINAL_MODE))?;
        let exists = match std::fs::symlink_metadata(&self.target) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if let Some(e) = refuse(&self.target) {
            return Err(e);
        }
        if exists {
            std::fs::rename(&self.tmp, &self.target)?;
        } else {
            rename_noreplace(&self.tmp, &self.target)?;
        }
        self.done = true;
        self.file.try_clone()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `rename` that fails if `to` appeared meanwhile (`renameat2(RENAME_NOREPLACE)`); plain `rename`
/// where the filesystem lacks it.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
    };
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths relative to the current directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOSYS) => std::fs::rename(from, to),
        Some(libc::EEXIST) => Err(refuse(to).unwrap_or(e)),
        _ => Err(e),
    }
}

/// Writes `bytes` to `target` through a [`Pending`] file: all of it or nothing.
pub fn write(target: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut p = Pending::new(target)?;
    p.file().write_all(bytes)?;
    p.file().sync_data()?;
    p.commit().map(drop)
}

/// Checks, before any work, that `target` can be written: it is a regular file or absent, and a
/// file can be created in its directory. Leaves nothing behind.
pub fn check_writable(target: &Path) -> io::Result<()> {
    Pending::new(target).map(drop)
}
