//! Where rings (and, later, sockets) live: the per-user runtime directory `$XDG_RUNTIME_DIR/memsight`,
//! or `/dev/shm/memsight-<uid>`, or `<tmp>/memsight-<uid>`; mode 0700, owned by this user. A session
//! not started by `memsight run` writes `ring-<pid>.bin` there, which `memsight attach PID` finds.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// Creates (if needed) and checks the runtime directory.
pub fn runtime_dir() -> Result<PathBuf, (PathBuf, std::io::Error)> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let candidates = [
        std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| PathBuf::from(d).join("memsight")),
        Some(PathBuf::from(format!("/dev/shm/memsight-{uid}"))),
        Some(std::env::temp_dir().join(format!("memsight-{uid}"))),
    ];
    let mut last = None;
    for dir in candidates.into_iter().flatten() {
        match ensure(&dir, uid) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some((dir, e)),
        }
    }
    Err(last.unwrap_or_else(|| (PathBuf::new(), std::io::Error::other("no candidate"))))
}

fn ensure(dir: &PathBuf, uid: u32) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        if !parent.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no parent directory",
            ));
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "exists but is not a directory owned by this user",
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The ring a session of process `pid` writes when no sidecar named one.
pub fn default_ring_path(pid: u32) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    Ok(runtime_dir()?.join(format!("ring-{pid}.bin")))
}

/// Removes rings in the runtime directory that nobody holds: `ring-<pid>.bin` of a job,
/// `ring-<sidecar pid>-<ms>.bin` of a sidecar. A SIGKILLed job cannot clean up after itself; the
/// next session does. A ring is stale only when no process holds its lock (writers and readers
/// do, see [`super::ring::is_unused`]) *and* the pid in its name is gone here: a pid alone would
/// condemn the live rings of jobs in another PID namespace sharing the directory, and the lock
/// alone a ring its writer has created but not yet locked. Reports (`job-report-*.json`, left by a sidecar killed before it delivered
/// one to standard output) are never removed: they may be the only copy.
pub fn remove_stale_rings() {
    let Ok(dir) = runtime_dir() else { return };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = name
            .strip_prefix("ring-")
            .and_then(|n| n.strip_suffix(".bin"));
        let Some(pid) = stem
            .and_then(|s| s.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && super::ring::is_unused(&e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The flight-recorder ring of running process `pid`: the one `memsight run` named in its
/// environment (`MEMSIGHT_RING`), else its default ring. An error says why there is none.
pub fn ring_of(pid: u32) -> Result<PathBuf, String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))
        .map_err(|e| format!("cannot read process {pid}'s environment: {e}"))?;
    let named = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"MEMSIGHT_RING="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()));
    let path = match named {
        Some(p) if p.as_os_str() == "off" => {
            return Err(format!("process {pid} runs with MEMSIGHT_RING=off"))
        }
        Some(p) => p,
        None => default_ring_path(pid).map_err(|(p, e)| format!("{}: {e}", p.display()))?,
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "process {pid} has no memsight flight recorder ({} does not exist): is a memsight session running in it?",
            path.display()
        ))
    }
}
