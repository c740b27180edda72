//! What `memsight run` puts into a job that does not link memsight (a Python or C++ program): the
//! preloaded library through `LD_PRELOAD` (exact process heap over the program's own allocator,
//! session, flight recorder, report) and the `memsight` Python package on `PYTHONPATH`, so
//! `import memsight` works with no installation. A job that links memsight ignores both: the
//! library stays passive when the program defines `malloc` itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's file name.
pub const LIBRARY: &str = "libmemsight_preload.so";

/// The Python package's files (name, text), as built into the sidecar (build.rs).
const PYTHON_PACKAGE: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/python_package.rs"));

/// What was put in place for one job; removes the Python package's copy when dropped.
pub(crate) struct Injected {
    python_dir: Option<PathBuf>,
    /// The copy's `.held` file, locked (shared) by the sidecar and, inherited, by the job: a
    /// later session's clean-up removes the copy only once neither lives.
    _held: Option<std::fs::File>,
}

impl Drop for Injected {
    fn drop(&mut self) {
        if let Some(d) = &self.python_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Writes out a copy of the library that the program carries (the `memsight` command built by
/// `cargo install` or for the wheel, tui/src/preload.rs) and returns its path.
pub type BundledLibrary = fn() -> Result<PathBuf, String>;

static BUNDLED: std::sync::OnceLock<BundledLibrary> = std::sync::OnceLock::new();

/// Registers the program's own copy of the library, used where no library file is found.
pub fn set_bundled_library(write: BundledLibrary) {
    let _ = BUNDLED.set(write);
}

/// Where the preloaded library is: `MEMSIGHT_PRELOAD_LIB`, else beside this executable, else in
/// the build tree's `target/preload/release/` (where `make build` puts it), else the copy the
/// program carries ([`set_bundled_library`]), written out.
pub fn library_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MEMSIGHT_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "MEMSIGHT_PRELOAD_LIB={} is not a file",
                p.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("no path of this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(LIBRARY),
        dir.join("..").join("preload").join("release").join(LIBRARY),
    ];
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()));
    }
    if let Some(write) = BUNDLED.get() {
        return write();
    }
    Err(format!(
        "{LIBRARY} not found beside {} nor in target/preload/release (build it with \
         `make build`, or set MEMSIGHT_PRELOAD_LIB)",
        exe.display()
    ))
}

/// The variable through which the CUDA driver loads an injection library at `cuInit`.
const CUDA_INJECTION: &str = "CUDA_INJECTION64_PATH";

/// Sets up `cmd` to carry the preloaded library and the Python package (written under `dir`), and
/// with `cupti`, to have the CUDA driver call the library's injection entry point (device memory
/// of every driver allocation through CUPTI). When the library is missing, says so on stderr: the
/// job then runs as it is and is sampled from outside.
pub(crate) fn prepare(cmd: &mut Command, dir: &Path, tag: &str, cupti: bool) -> Injected {
    let lib = match library_path() {
        Ok(lib) => lib,
        Err(why) => {
            eprintln!("memsight · not preloading into the job: {why}; it is sampled from outside");
            if cupti {
                eprintln!("memsight · --cupti needs the preloaded library: no device counts");
            }
            return Injected {
                python_dir: None,
                _held: None,
            };
        }
    };
    if cupti {
        match std::env::var_os(CUDA_INJECTION).filter(|v| !v.is_empty()) {
            Some(theirs) => eprintln!(
                "memsight · --cupti: {CUDA_INJECTION} is already set ({}; a profiler such as \
                 Nsight's); left as it is, no CUPTI device counts",
                theirs.to_string_lossy()
            ),
            None => {
                cmd.env(CUDA_INJECTION, &lib);
            }
        }
    }
    let python_dir = dir.join(format!("python-{tag}"));
    let held = match make_injection_dir(&python_dir) {
        Ok(held) => Some(held),
        Err(e) => {
            eprintln!(
                "memsight · `import memsight` will need the package installed: {}: {e}",
                python_dir.display()
            );
            None
        }
    };
    let preloaded = held
        .as_ref()
        .and_then(|_| glibc_only_path(&python_dir, &lib))
        .unwrap_or_else(|| lib.clone());
    cmd.env(
        "LD_PRELOAD",
        prepend(preloaded.into_os_string(), "LD_PRELOAD", ":"),
    );
    let Some(held) = held else {
        let _ = std::fs::remove_dir_all(&python_dir);
        return Injected {
            python_dir: None,
            _held: None,
        };
    };
    match write_python_package(&python_dir) {
        Ok(()) => {
            cmd.env(
                "PYTHONPATH",
                prepend(python_dir.clone().into_os_string(), "PYTHONPATH", ":"),
            );
        }
        Err(e) => eprintln!(
            "memsight · `import memsight` will need the package installed: {}: {e}",
            python_dir.display()
        ),
    }
    Injected {
        python_dir: Some(python_dir),
        _held: Some(held),
    }
}

/// The kernel's name for this machine's platform (`AT_PLATFORM`: `x86_64`, `aarch64`), which
/// glibc's loader puts for `$PLATFORM` in `LD_PRELOAD`.
fn platform() -> Option<String> {
    // SAFETY: getauxval returns 0 or a pointer to a NUL-terminated string the kernel placed.
    let p = unsafe { libc::getauxval(libc::AT_PLATFORM) } as *const libc::c_char;
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, lives as long as the process.
    let s = unsafe { std::ffi::CStr::from_ptr(p) }.to_str().ok()?;
    (!s.is_empty() && !s.contains('/')).then(|| s.to_string())
}

/// A path to `lib` that only glibc's loader resolves: `DIR/$PLATFORM/libmemsight_preload.so`,
/// through a link made at `DIR/<platform>/`. The library is built for glibc; musl's loader, which
/// does not expand `$PLATFORM`, then finds no file and (as it does for any preload it cannot find)
/// starts the program without it, instead of failing on the library's glibc dependencies (exit
/// 127). `None` where the link cannot be made: the plain path is used.
fn glibc_only_path(dir: &Path, lib: &Path) -> Option<PathBuf> {
    let platform = platform()?;
    let at = dir.join(&platform);
    std::fs::create_dir(&at).ok()?;
    std::os::unix::fs::symlink(lib, at.join(LIBRARY)).ok()?;
    Some(dir.join("$PLATFORM").join(LIBRARY))
}

/// `first` followed by the current value of `var`, if any.
fn prepend(first: OsString, var: &str, sep: &str) -> OsString {
    let mut v = first;
    if let Some(rest) = std::env::var_os(var).filter(|r| !r.is_empty()) {
        v.push(sep);
        v.push(rest);
    }
    v
}

/// Makes the job's injection directory (new, readable by this user only) and its `.held` file,
/// returned locked and inheritable (the job holds it too).
fn make_injection_dir(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(".held"))?;
    // SAFETY: flock and fcntl on a descriptor we own; the lock is only evidence for clean-up.
    unsafe {
        libc::flock(held.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB);
        libc::fcntl(held.as_raw_fd(), libc::F_SETFD, 0);
    }
    Ok(held)
}

/// The `sitecustomize` put first on the job's `PYTHONPATH`: every Python process of the job runs
/// memsight's start-up (automatic PyTorch steps and phases, the end of training at exit), which
/// runs the `sitecustomize` this one hides.
const SITECUSTOMIZE: &str = "# Written by `memsight run` (see memsight/_startup.py).\n\
    import memsight._startup\n\
    memsight._startup.start()\n";

/// Writes the package to `dir/memsight/` and its start-up to `dir/sitecustomize.py` (new files,
/// readable by this user only).
fn write_python_package(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let pkg = dir.join("memsight");
    std::fs::DirBuilder::new().mode(0o700).create(&pkg)?;
    for &(name, text) in PYTHON_PACKAGE {
        write_new(&pkg.join(name), text)?;
    }
    write_new(&dir.join("sitecustomize.py"), SITECUSTOMIZE)
}

/// Writes `text` to `path`, a file that must not exist yet (no link is followed).
fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?
        .write_all(text.as_bytes())
}
