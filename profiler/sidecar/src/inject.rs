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
}

impl Drop for Injected {
    fn drop(&mut self) {
        if let Some(d) = &self.python_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Where the preloaded library is: `MEMSIGHT_PRELOAD_LIB`, else beside this executable, else in
/// the build tree's `target/preload/release/` (where `make build` puts it).
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
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "{LIBRARY} not found beside {} nor in target/preload/release (build it with \
                 `make build`, or set MEMSIGHT_PRELOAD_LIB)",
                exe.display()
            )
        })
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
            return Injected { python_dir: None };
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
    cmd.env(
        "LD_PRELOAD",
        prepend(lib.into_os_string(), "LD_PRELOAD", ":"),
    )
    // Only a direct child of this sidecar (or of a launcher it passes the session to) starts
    // the session: programs a Rust job or a script starts do not take it (preload/src/job.rs).
    .env("MEMSIGHT_SESSION_PARENT", std::process::id().to_string());
    let python_dir = dir.join(format!("python-{tag}"));
    match write_python_package(&python_dir) {
        Ok(()) => {
            cmd.env(
                "PYTHONPATH",
                prepend(python_dir.clone().into_os_string(), "PYTHONPATH", ":"),
            );
            Injected {
                python_dir: Some(python_dir),
            }
        }
        Err(e) => {
            eprintln!(
                "memsight · `import memsight` will need the package installed: {}: {e}",
                python_dir.display()
            );
            let _ = std::fs::remove_dir_all(&python_dir);
            Injected { python_dir: None }
        }
    }
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

/// Writes the package to `dir/memsight/` (a new directory, readable by this user only).
fn write_python_package(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let pkg = dir.join("memsight");
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    std::fs::DirBuilder::new().mode(0o700).create(&pkg)?;
    for &(name, text) in PYTHON_PACKAGE {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(pkg.join(name))?
            .write_all(text.as_bytes())?;
    }
    Ok(())
}
