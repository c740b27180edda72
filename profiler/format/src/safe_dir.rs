//! The one way memsight reaches a directory it writes into: an open directory descriptor, reached
//! component by component from `/` (or the working directory) with `O_NOFOLLOW`, never by
//! re-reading a path. A symbolic link on the way is followed only when its owner is this user or
//! root — stricter than the kernel's `protected_symlinks`, which also trusts the owner of the
//! directory holding the link: a directory another user owns (`/tmp/theirs/out -> /etc`) is
//! theirs to point anywhere — so a link another user planted redirects nothing. A directory memsight makes for itself ([`Dir::own_subdir`]) is created
//! with `mkdirat` and must be a real directory owned by this user, or it is refused.
//!
//! Written by hand over `openat`/`mkdirat`/`fstatat`: the crates that walk paths relative to a
//! descriptor (cap-std, openat) confine a walk to a root but do not judge a link by its owner.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// How many symbolic links one walk may follow (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// An open directory that memsight writes into, and the path it was reached by (for messages).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; `name` empty stats `dirfd` itself.
pub(crate) fn stat_at(dirfd: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: `name` is NUL-terminated and `st` is ours to write.
    cvt(unsafe { libc::fstatat(dirfd, name.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn is_link(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}", path.display()),
    )
}

/// Opens `name` in `dirfd` as a directory without following a link at its last component.
fn open_dir_at(dirfd: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated; the descriptor returned is ours.
    let fd = cvt(unsafe { libc::openat(dirfd, name.as_ptr(), flags) })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn readlink_at(dirfd: RawFd, name: &CStr) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` has `buf.len()` writable bytes; `name` is NUL-terminated.
    let n = unsafe { libc::readlinkat(dirfd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&buf).to_owned()))
}

impl Dir {
    /// Opens the existing directory `path`, following a symbolic link on the way only when its
    /// owner is this user or root.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let start = if path.is_absolute() {
            Path::new("/")
        } else {
            Path::new(".")
        };
        let mut fd = open_dir_at(libc::AT_FDCWD, &cstr(start.as_os_str())?)?;
        // Components still to walk, last first (a followed link pushes its target's components).
        let mut todo: Vec<OsString> = Vec::new();
        push_components(&mut todo, path);
        let mut links = 0;
        // The directories walked so far, for `..` (never above where the walk started).
        let mut stack: Vec<OwnedFd> = Vec::new();
        while let Some(name) = todo.pop() {
            if name == ".." {
                if let Some(up) = stack.pop() {
                    fd = up;
                } else {
                    fd = open_dir_at(fd.as_raw_fd(), c"..")?;
                }
                continue;
            }
            let c = cstr(&name)?;
            let st = stat_at(fd.as_raw_fd(), &c).map_err(|e| annotate(e, path))?;
            if is_link(&st) {
                if st.st_uid != euid() && st.st_uid != 0 {
                    return Err(refused(
                        path,
                        &format!(
                            "the symbolic link {} belongs to another user (uid {}): not followed",
                            name.to_string_lossy(),
                            st.st_uid
                        ),
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(refused(path, "too many symbolic links"));
                }
                let target = readlink_at(fd.as_raw_fd(), &c)?;
                if target.is_absolute() {
                    stack.clear();
                    fd = open_dir_at(libc::AT_FDCWD, c"/")?;
                }
                push_components(&mut todo, &target);
                continue;
            }
            if !is_dir(&st) {
                return Err(refused(
                    path,
                    &format!("{} is not a directory", name.to_string_lossy()),
                ));
            }
            let next = open_dir_at(fd.as_raw_fd(), &c).map_err(|e| annotate(e, path))?;
            stack.push(std::mem::replace(&mut fd, next));
        }
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Opens the directory that holds `target` (a file's path).
    pub fn parent_of(target: &Path) -> io::Result<Dir> {
        match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => Dir::open(p),
            _ => Dir::open(Path::new(".")),
        }
    }

    /// Opens `path`, creating it and its missing parents (mode `mode`, each by `mkdirat`): the
    /// `create_dir_all` of memsight. The last component must end up a directory owned by this
    /// user; a link there, or another user's directory, is refused.
    pub fn create_own(path: &Path, mode: u32) -> io::Result<Dir> {
        let name = path.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} names no directory", path.display()),
            )
        })?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let holder = match Dir::open(parent) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound && parent != Path::new("/") => {
                Dir::create_own(parent, mode)?
            }
            Err(e) => return Err(e),
        };
        holder.own_subdir(name, mode)
    }

    /// Creates (with `mode`) or opens the directory `name` inside this one; refuses a link, a
    /// non-directory, or a directory another user owns.
    pub fn own_subdir(&self, name: &OsStr, mode: u32) -> io::Result<Dir> {
        let c = cstr(name)?;
        let path = self.path.join(name);
        // SAFETY: `c` is NUL-terminated; mkdirat never follows a link at the last component.
        let made = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), mode) };
        if made != 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(annotate(e, &path));
            }
        }
        let st = stat_at(self.fd.as_raw_fd(), &c).map_err(|e| annotate(e, &path))?;
        if is_link(&st) {
            return Err(refused(
                &path,
                "is a symbolic link where memsight makes its own directory: not followed",
            ));
        }
        if !is_dir(&st) {
            return Err(refused(&path, "exists and is not a directory"));
        }
        if st.st_uid != euid() {
            return Err(refused(
                &path,
                &format!(
                    "is a directory of another user (uid {}): memsight writes only into its own",
                    st.st_uid
                ),
            ));
        }
        let fd = open_dir_at(self.fd.as_raw_fd(), &c).map_err(|e| annotate(e, &path))?;
        // The same directory that was checked (not one swapped in since).
        let opened = stat_at(fd.as_raw_fd(), c"")?;
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino) {
            return Err(refused(&path, "was replaced while memsight opened it"));
        }
        Ok(Dir { fd, path })
    }

    /// The descriptor.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The path this directory was reached by (for messages and for readers in other processes).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path naming `name` in this very directory for an API that takes a path (jemalloc's
    /// `prof.dump`, `bind`): through `/proc/self/fd`, which resolves to the open directory and
    /// never re-walks [`Dir::path`].
    pub fn fd_path(&self, name: &OsStr) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).join(name)
    }

    /// Removes the file `name` in this directory (not following a link).
    pub fn remove_file(&self, name: &OsStr) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: `c` is NUL-terminated.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
    }

    /// The kind of what `name` is here, without following a link; `None` when nothing is.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<libc::stat>> {
        match stat_at(self.fd.as_raw_fd(), &cstr(name)?) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

fn annotate(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Pushes `path`'s components onto `todo` so that they pop first to last (`.` and the root
/// left out: the caller starts at the right directory).
fn push_components(todo: &mut Vec<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    todo.extend(parts.into_iter().rev());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("safe-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn own_links_and_dotdot_are_walked() {
        let d = scratch("walk");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        symlink(d.join("a"), d.join("link")).unwrap();
        let dir = Dir::open(&d.join("link/b/../b")).unwrap();
        let st = stat_at(dir.fd(), c"").unwrap();
        let want = std::fs::metadata(d.join("a/b")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(st.st_ino, want.ino());
    }

    #[test]
    fn create_own_makes_every_missing_directory_and_refuses_a_link_at_the_end() {
        let d = scratch("create");
        let made = Dir::create_own(&d.join("x/y/z"), 0o700).unwrap();
        assert!(made.path().ends_with("x/y/z"));
        assert!(d.join("x/y/z").is_dir());
        std::fs::create_dir(d.join("elsewhere")).unwrap();
        symlink(d.join("elsewhere"), d.join("planted")).unwrap();
        let e = Dir::create_own(&d.join("planted"), 0o700).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::write(d.join("file"), b"").unwrap();
        assert!(Dir::create_own(&d.join("file"), 0o700).is_err());
    }

    #[test]
    fn another_users_link_is_not_followed() {
        if euid() != 0 {
            println!("SKIP: needs root to give a link to another user");
            return;
        }
        let d = scratch("foreign");
        std::fs::create_dir(d.join("target")).unwrap();
        symlink(d.join("target"), d.join("planted")).unwrap();
        let c = cstr(d.join("planted").as_os_str()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
        let e = Dir::open(&d.join("planted")).unwrap_err();
        assert!(e.to_string().contains("belongs to another user"), "{e}");
        assert!(Dir::create_own(&d.join("planted/sub"), 0o700).is_err());
        assert!(!d.join("target/sub").exists());
        // Nor in a directory of theirs: its owner points its links anywhere.
        std::fs::create_dir(d.join("theirs")).unwrap();
        symlink(d.join("target"), d.join("theirs/out")).unwrap();
        for p in [d.join("theirs"), d.join("theirs/out")] {
            let c = cstr(p.as_os_str()).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
        }
        assert!(Dir::open(&d.join("theirs/out")).is_err());
    }

    #[test]
    fn fd_path_names_the_open_directory() {
        let d = scratch("fdpath");
        let dir = Dir::open(&d).unwrap();
        std::fs::write(dir.fd_path(OsStr::new("f")), b"x").unwrap();
        assert_eq!(std::fs::read(d.join("f")).unwrap(), b"x");
    }
}
