//! The preloaded library that this command carries (build.rs bundles it), written out for
//! `memsight run` where no library file is found: an installed command (`cargo install`, the wheel)
//! has nothing else to preload.
//!
//! Where `memsight run` finds the library, first match wins (memsight_sidecar::inject::library_path):
//! 1. `MEMSIGHT_PRELOAD_LIB` (must name a file);
//! 2. `libmemsight_preload.so` beside the `memsight` executable (a package manager's layout);
//! 3. `../preload/release/` of the executable's directory: the build tree of `make build`;
//! 4. this bundled copy, written once per build of the library (named by version and content hash)
//!    to `$XDG_CACHE_HOME/memsight/lib/<id>/` (default `~/.cache`), or where that cannot be
//!    written or is mounted `noexec`, to memsight's runtime directory; a copy found there is used
//!    only when it is byte for byte the bundled one.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/bundled_preload.rs"));

/// Makes the bundled library (if this build has one) what `memsight run` falls back to.
pub fn register() {
    if BUNDLED.is_some() {
        memsight_sidecar::inject::set_bundled_library(write_bundled);
    }
}

/// The bundled library as a file: one already written, or written now.
fn write_bundled() -> Result<PathBuf, String> {
    let Some((bytes, id)) = BUNDLED else {
        return Err("this memsight carries no preloaded library".to_string());
    };
    let mut why = Vec::new();
    for dir in candidate_dirs(id) {
        match write_into(&dir, bytes) {
            Ok(path) => return Ok(path),
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!(
        "{} not found and the bundled copy could not be written ({}); set MEMSIGHT_PRELOAD_LIB",
        memsight_sidecar::inject::LIBRARY,
        why.join("; ")
    ))
}

/// Where the bundled copy may go, in order: the user's cache, then memsight's runtime directory.
fn candidate_dirs(id: &str) -> Vec<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let cache = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")));
    let mut dirs: Vec<PathBuf> = cache
        .map(|c| c.join("memsight").join("lib").join(id))
        .into_iter()
        .collect();
    if let Ok(runtime) = memsight_format::wire::runtime_dir() {
        dirs.push(runtime.join(format!("lib-{id}")));
    }
    dirs
}

/// `dir/libmemsight_preload.so` holding `bytes`: reused when it already does, else written
/// beside it and renamed into place (concurrent runs each see a whole file).
fn write_into(dir: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if mounted_noexec(dir)? {
        return Err(std::io::Error::other(
            "mounted noexec: a library there cannot be loaded",
        ));
    }
    let path = dir.join(memsight_sidecar::inject::LIBRARY);
    let same = std::fs::symlink_metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() == bytes.len() as u64)
        && std::fs::read(&path).is_ok_and(|held| held == bytes);
    if same {
        return Ok(path);
    }
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        memsight_sidecar::inject::LIBRARY,
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o755))
        })
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// Whether the file system of `dir` refuses to map files executable (Docker's /dev/shm).
fn mounted_noexec(dir: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a NUL in the path"))?;
    // SAFETY: a NUL-terminated path and a zeroed statvfs that the call fills in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_NOEXEC != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_once_and_rewrites_a_different_file() {
        let dir =
            std::env::temp_dir().join(format!("memsight-preload-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = write_into(&dir, b"first").expect("written");
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        let again = write_into(&dir, b"first").expect("reused");
        assert_eq!(again, path);
        std::fs::write(&path, b"tampered").expect("overwrite");
        write_into(&dir, b"first").expect("rewritten");
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
