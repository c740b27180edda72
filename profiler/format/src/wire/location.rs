//! Where rings (and, later, sockets) live: the per-user runtime directory `$XDG_RUNTIME_DIR/memsight`,
//! or `/dev/shm/memsight-<uid>`, or `<tmp>/memsight-<uid>`, or `$HOME/.cache/memsight/runtime`; mode
//! 0700, owned by this user. A session not started by `memsight run` writes `ring-<pid>.<pid
//! namespace>.bin` there, which `memsight attach PID` finds.

use crate::safe_dir::Dir;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// Creates (if needed) and checks the runtime directory: the first candidate that is, or can be
/// made, a directory of this user's (0700) — reached without following another user's link. A
/// name another user took first (`/dev/shm/memsight-0` made by `nobody`) is passed over with one
/// warning, down to `$HOME/.cache/memsight/runtime`, which nobody else can take.
pub fn runtime_dir() -> Result<PathBuf, (PathBuf, std::io::Error)> {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    // (directory, whether its missing parents are made too: only under the user's own home).
    let candidates = [
        var("XDG_RUNTIME_DIR").map(|d| (d.join("memsight"), false)),
        Some((PathBuf::from(format!("/dev/shm/memsight-{uid}")), false)),
        Some((std::env::temp_dir().join(format!("memsight-{uid}")), false)),
        var("HOME").map(|d| (d.join(".cache/memsight/runtime"), true)),
    ];
    let mut last = None;
    let mut passed_over = Vec::new();
    for (dir, make_parents) in candidates.into_iter().flatten() {
        match ensure(&dir, make_parents) {
            Ok(()) => {
                if !passed_over.is_empty() {
                    static WARNED: Once = Once::new();
                    WARNED.call_once(|| {
                        eprintln!(
                            "memsight: runtime directory {} (passed over: {})",
                            dir.display(),
                            passed_over.join("; ")
                        )
                    });
                }
                return Ok(dir);
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    passed_over.push(e.to_string());
                }
                last = Some((dir, e));
            }
        }
    }
    Err(last.unwrap_or_else(|| (PathBuf::new(), std::io::Error::other("no candidate"))))
}

/// Makes or opens `dir` as this user's own 0700 directory; its parent must exist unless
/// `make_parents`.
fn ensure(dir: &Path, make_parents: bool) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "names no directory",
        ));
    };
    let holder = if make_parents {
        Dir::create_own(parent, 0o700)?
    } else {
        Dir::open(parent)?
    };
    let own = holder.own_subdir(name, 0o700)?;
    // On the open directory itself: never a path that could be swapped meanwhile.
    // SAFETY: fchmod on a descriptor we hold.
    if unsafe { libc::fchmod(own.fd(), 0o700) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The name of a file of process `pid` in the runtime directory: `<prefix><pid>.<pid
/// namespace><suffix>`. Processes in other PID namespaces that share the directory (containers
/// sharing `/dev/shm`) can have the same pid; the namespace keeps their files apart.
pub fn pid_file_name(prefix: &str, pid: u32, suffix: &str) -> String {
    match pid_namespace() {
        Some(ns) => format!("{prefix}{pid}.{ns}{suffix}"),
        None => format!("{prefix}{pid}{suffix}"),
    }
}

/// The pid in a name made by [`pid_file_name`] (or by an older memsight, without a namespace),
/// when the namespace it names is this process's.
pub fn pid_of_file_name(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    let stem = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    let (pid, ns) = match stem.split_once('.') {
        Some((p, ns)) => (p, Some(ns)),
        None => (stem, None),
    };
    match (ns, pid_namespace()) {
        (Some(ns), Some(own)) if ns.parse::<u64>().ok() != Some(own) => None,
        _ => pid.parse().ok(),
    }
}

/// This process's PID namespace (the inode of `/proc/self/ns/pid`).
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

/// The ring a session of process `pid` writes when no sidecar named one.
pub fn default_ring_path(pid: u32) -> Result<PathBuf, (PathBuf, std::io::Error)> {
    Ok(runtime_dir()?.join(pid_file_name("ring-", pid, ".bin")))
}

/// Whether process `pid` is gone from this PID namespace.
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The pid at the start of a runtime file's name after `prefix` (`ring-<pid>…`, `python-<pid>-…`).
fn leading_pid(name: &str, prefix: &str) -> Option<i32> {
    name.strip_prefix(prefix)?
        .split(['-', '.'])
        .next()?
        .parse()
        .ok()
}

/// Removes what dead sessions and sidecars left in the runtime directory. A SIGKILLed process
/// cannot clean up after itself; the next session does:
/// - rings nobody holds: `ring-<pid>….bin` of a job, `ring-<sidecar pid>-<ms>.bin` of a sidecar. A
///   ring is stale only when no process holds its lock (writers and readers do, see
///   [`super::ring::is_unused`]) *and* the pid in its name is gone here: a pid alone would condemn
///   the live rings of jobs in another PID namespace sharing the directory, and the lock alone a
///   ring its writer has created but not yet locked;
/// - the Python package copies of sidecars (`python-<sidecar pid>-<ms>/`), by the same rule, with
///   the lock of their `.held` file (the sidecar's, inherited by its job);
/// - sidecar sockets nobody listens on whose job is gone.
///
/// Report locks (`report-<hash>.lock`) are removed by the run that holds them as it ends, and here
/// when nobody holds them (a killed run's).
///
/// Reports (`job-report-*.json`, left by a sidecar killed before it delivered one to standard
/// output; `ring-*.json`, a job process's own, left by a sidecar killed before it read them) are
/// never removed: they may be the only copy.
pub fn remove_stale_files() {
    let Ok(dir) = runtime_dir() else { return };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = e.path();
        if name.ends_with(".bin") {
            if leading_pid(name, "ring-").is_some_and(gone) && super::ring::is_unused(&path) {
                let _ = std::fs::remove_file(&path);
            }
        } else if let Some(pid) = leading_pid(name, "python-") {
            let held = path.join(".held");
            let unheld = !held.exists() || super::ring::is_unused(&held);
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && gone(pid) && unheld {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if name.starts_with("report-") && name.ends_with(".lock") {
            // Left by a run that was killed; a run that takes it meanwhile checks that the file it
            // locked is still the one of that name, and takes the new one otherwise.
            if super::ring::is_unused(&path) {
                let _ = std::fs::remove_file(&path);
            }
        } else if name.starts_with("sidecar-") && name.ends_with(".sock") {
            let job_gone =
                pid_of_file_name(name, "sidecar-", ".sock").is_none_or(|p| gone(p as i32));
            let refused = std::os::unix::net::UnixStream::connect(&path)
                .is_err_and(|e| e.raw_os_error() == Some(libc::ECONNREFUSED));
            if job_gone && refused {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// The ring process `pid` writes in a job under `memsight run` (`<prefix>-p<pid>-<ns>.bin`, the
/// newest: a process that exec'd has written one before).
fn newest_job_ring(prefix: &Path, pid: u32) -> Option<PathBuf> {
    let dir = prefix.parent()?;
    let want = format!("{}-p{pid}-", prefix.file_name()?.to_string_lossy());
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&want) && n.ends_with(".bin"))
        .max_by_key(|n| {
            n[want.len()..n.len() - 4]
                .parse::<u128>()
                .unwrap_or_default()
        })
        .map(|n| dir.join(n))
}

/// The flight-recorder ring of running process `pid`: the one `memsight run` named in its
/// environment (`MEMSIGHT_RING`, or its own under the job's `MEMSIGHT_JOB` prefix), else its
/// default ring. An error says why there is none.
pub fn ring_of(pid: u32) -> Result<PathBuf, String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))
        .map_err(|e| format!("cannot read process {pid}'s environment: {e}"))?;
    let named = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"MEMSIGHT_RING="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()));
    let job = environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"MEMSIGHT_JOB="))
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned()));
    let path = match (named, job) {
        (Some(p), _) if p.as_os_str() == "off" => {
            return Err(format!("process {pid} runs with MEMSIGHT_RING=off"))
        }
        (Some(p), _) => p,
        (None, Some(prefix)) => newest_job_ring(&prefix, pid).unwrap_or(prefix),
        (None, None) => default_ring_path(pid).map_err(|(p, e)| format!("{}: {e}", p.display()))?,
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
