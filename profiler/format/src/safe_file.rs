//! The one way memsight writes a file: a new file created `O_CREAT|O_EXCL|O_NOFOLLOW` under an
//! unpredictable name in the target's directory, filled, then renamed over the target — and only
//! over a regular file (or where nothing is). A symlink, device, FIFO, socket or directory at the
//! target is refused, so a planted file can neither redirect the write nor be replaced by it, and a
//! reader never sees a half-written file. The directory is reached through [`Dir`] (no link
//! another user planted is followed on the way) and every step is relative to its descriptor.

use crate::safe_dir::Dir;
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Permissions of a finished file (reports are read by CI and people; their directory guards them).
const FINAL_MODE: u32 = 0o644;

/// Why `name` in `dir` cannot be replaced, or `None` when it is a regular file or absent. Says
/// what is there instead, in words.
fn refuse(dir: &Dir, name: &OsStr) -> Option<io::Error> {
    let st = match dir.stat(name) {
        Ok(Some(st)) => st,
        Ok(None) => return None,
        Err(e) => return Some(e),
    };
    let what = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => return None,
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        _ => "not a regular file",
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

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// A file being written for `target`: renamed over it by [`Pending::commit`], removed if dropped.
/// Everything happens relative to the open target directory ([`Dir`]), never by path again.
#[derive(Debug)]
pub struct Pending {
    file: File,
    dir: std::sync::Arc<Dir>,
    tmp: OsString,
    name: OsString,
    target: PathBuf,
    done: bool,
}

impl Pending {
    /// Opens the target's directory ([`Dir::parent_of`]: no planted link followed), refuses a
    /// non-regular `target`, then creates the temporary file beside it (mode 0600 while it is
    /// written).
    pub fn new(target: &Path) -> io::Result<Pending> {
        let dir = Dir::parent_of(target).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot write {}: {e}", target.display()))
        })?;
        let name = target.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no file", target.display()),
            )
        })?;
        Pending::in_dir(std::sync::Arc::new(dir), name)
    }

    /// As [`Pending::new`], for the file `name` in the open directory `dir`.
    pub fn in_dir(dir: std::sync::Arc<Dir>, name: &OsStr) -> io::Result<Pending> {
        if let Some(e) = refuse(&dir, name) {
            return Err(e);
        }
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".{}.tmp", random_suffix()?));
        let c = cstr(&tmp)?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `c` is NUL-terminated; the descriptor returned is ours.
        let fd = unsafe { libc::openat(dir.fd(), c.as_ptr(), flags, 0o600 as libc::c_uint) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot create a file in {}: {e}", dir.path().display()),
            ));
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        let target = dir.path().join(name);
        Ok(Pending {
            file,
            dir,
            tmp,
            name: name.to_os_string(),
            target,
            done: false,
        })
    }

    /// The open temporary file.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// A path of the temporary file for writers that take a path (like jemalloc's `prof.dump`):
    /// through the open directory ([`Dir::fd_path`]), so no link planted on the way is followed.
    pub fn tmp_path(&self) -> PathBuf {
        self.dir.fd_path(&self.tmp)
    }

    /// The path of the file once committed (for messages).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Moves the file to its target — over a regular file only, never over anything that appeared
    /// there since [`Pending::new`] — and returns it, still open for writing.
    pub fn commit(mut self) -> io::Result<File> {
        self.file
            .set_permissions(std::fs::Permissions::from_mode(FINAL_MODE))?;
        let exists = self.dir.stat(&self.name)?.is_some();
        if let Some(e) = refuse(&self.dir, &self.name) {
            return Err(e);
        }
        let (from, to) = (cstr(&self.tmp)?, cstr(&self.name)?);
        let flags = if exists { 0 } else { libc::RENAME_NOREPLACE };
        // SAFETY: two NUL-terminated names relative to the open directory.
        let r = unsafe {
            libc::renameat2(
                self.dir.fd(),
                from.as_ptr(),
                self.dir.fd(),
                to.as_ptr(),
                flags,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // A filesystem without RENAME_NOREPLACE: a plain rename.
                Some(libc::EINVAL) | Some(libc::ENOSYS) if flags != 0 => {
                    // SAFETY: as above.
                    let r = unsafe {
                        libc::renameat(self.dir.fd(), from.as_ptr(), self.dir.fd(), to.as_ptr())
                    };
                    if r != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Some(libc::EEXIST) => return Err(refuse(&self.dir, &self.name).unwrap_or(e)),
                _ => return Err(e),
            }
        }
        self.done = true;
        self.file.try_clone()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.dir.remove_file(&self.tmp);
        }
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
