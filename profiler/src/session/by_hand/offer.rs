//! Which report the user's path keeps in a job started by hand: each process of the job that ends
//! with a session offers its own, under a turn at the report's directory; the main process's is
//! kept (the sidecar's rule), and only a report this user wrote that names this job counts.

use super::{names, ByHand};
use crate::session::{write_report, SessionError};
use memsight_format::report::Report;
use memsight_format::safe_dir::Dir;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// The report `name` in `dir` if this user wrote it by hand: a regular file this user owns (no
/// link followed) that names its job ([`ByHand`]).
fn by_hand_report(dir: &Dir, name: &std::ffi::OsStr) -> Option<(Report, ByHand)> {
    let name = std::ffi::CString::new(name.as_bytes()).ok()?;
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: `name` is NUL-terminated; the descriptor returned is owned below.
    let fd = unsafe { libc::openat(dir.fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = file.metadata().ok()?;
    // SAFETY: geteuid has no preconditions.
    if !meta.file_type().is_file() || meta.uid() != unsafe { libc::geteuid() } {
        return None;
    }
    let max = memsight_format::input::MAX_REPORT_BYTES;
    let bytes = memsight_format::input::read_limited(file, max, meta.len()).ok()?;
    let report = Report::from_slice(&bytes).ok()?;
    let names = report.by_hand.clone()?;
    Some((report, names))
}

/// A report another process wrote that the user's path keeps instead of this process's.
pub(crate) struct Kept {
    /// That report.
    pub report: Report,
    /// It is a job's that this process's job started (a command line a shell with job control
    /// ran), not this job's main process's.
    pub nested: bool,
}

/// Whether the report named `theirs` is kept instead of `mine`, this process's (named `names`):
/// one of this job's processes' that is more its main process, or a job's that this job started
/// (a shell with job control keeps its last command line's). Never another job's or tree's.
fn keeps(theirs: (&Report, &ByHand), mine: &Report, names: &ByHand) -> Option<bool> {
    let (report, their_names) = theirs;
    let same_job = their_names.job == names.job;
    let nested = !same_job && their_names.tree == names.job;
    ((same_job || nested) && main_key(report) > main_key(mine)).then_some(nested)
}

/// Writes `report` at `path` in a job started by hand unless the report there is another of the
/// job's processes' and that process is more the job's main one: then that report is kept and
/// returned. Processes of the job ending at once take turns (a lock on the directory).
pub(crate) fn offer_report(
    report: &Report,
    dir: &Arc<Dir>,
    path: &std::path::Path,
) -> Result<Option<Kept>, SessionError> {
    let _turn = Turn::take(dir);
    let names = names();
    let mut replaced = None;
    if let (Some(name), Some(names)) = (path.file_name(), &names) {
        if let Some((theirs, their_names)) = by_hand_report(dir, name) {
            if let Some(nested) = keeps((&theirs, &their_names), report, names) {
                remove_profiles(report, &theirs, path, true);
                return Ok(Some(Kept {
                    report: theirs,
                    nested,
                }));
            }
            replaced = Some(theirs);
        }
    }
    let mut named = report.clone();
    named.by_hand = names;
    write_report(&named, dir, path)?;
    // This user's report of this job, or of an earlier one, that this one replaced.
    if let Some(theirs) = replaced {
        remove_profiles(&theirs, report, path, false);
    }
    Ok(None)
}

/// Removes the heap profiles `gone` names in the user's report's heap directory (`path`'s, no
/// link followed; nothing elsewhere) that `kept` does not: a report the path no longer keeps
/// leaves none behind. Another process's (not `own`) only in a directory of its own whose process
/// has ended: the heap directory's own files are the running first process's, and a pid reused
/// is another process's.
fn remove_profiles(gone: &Report, kept: &Report, path: &std::path::Path, own: bool) {
    let Some(profile) = &gone.heap_profile else {
        return;
    };
    let keeps = |p: &str| {
        kept.heap_profile
            .as_ref()
            .is_some_and(|k| k.dumps.iter().any(|d| d.path == p))
    };
    let heap_dir = crate::heapprof::dir_for_report(path);
    let heap_dir = std::path::absolute(&heap_dir).unwrap_or(heap_dir);
    let own_dir = |d: &std::path::Path| {
        d.parent() == Some(heap_dir.as_path())
            && d.file_name()
                .and_then(|n| n.to_str()?.strip_prefix('p'))
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
    };
    for dump in profile.dumps.iter().filter(|d| !keeps(&d.path)) {
        let dump = std::path::Path::new(&dump.path);
        let (Some(parent), Some(name)) = (dump.parent(), dump.file_name()) else {
            continue;
        };
        let in_own_dir = own_dir(parent);
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let ended = || unsafe { libc::kill(gone.job.pid as libc::pid_t, 0) } != 0;
        let removable = if own {
            parent == heap_dir || in_own_dir
        } else {
            in_own_dir && ended()
        };
        if !removable {
            continue;
        }
        if let Ok(d) = Dir::open(parent) {
            let _ = d.remove_file(name);
        }
        if let (true, Ok(top), Some(sub)) =
            (own_dir(parent), Dir::open(&heap_dir), parent.file_name())
        {
            if let Ok(sub) = std::ffi::CString::new(sub.as_bytes()) {
                // SAFETY: `sub` is NUL-terminated; only an empty directory is removed.
                unsafe { libc::unlinkat(top.fd(), sub.as_ptr(), libc::AT_REMOVEDIR) };
            }
        }
    }
}

/// How long a process waits for its turn at the report before it writes unguarded: the job's
/// processes hold it for as long as writing a report takes; anyone else who can open the
/// directory (another user's, in `/tmp`) could hold it for ever.
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// An exclusive `flock` on a directory, held until dropped (none once [`TURN_WAIT`] passed).
struct Turn(Option<std::os::fd::RawFd>);

impl Turn {
    fn take(dir: &Dir) -> Turn {
        let deadline = std::time::Instant::now() + TURN_WAIT;
        loop {
            // SAFETY: a descriptor the `Dir` keeps open for longer than the `Turn` lives.
            if unsafe { libc::flock(dir.fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Turn(Some(dir.fd()));
            }
            let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
            if !busy || std::time::Instant::now() >= deadline {
                // A lock that cannot be taken leaves the turn unguarded, never the report
                // unwritten nor the process stuck.
                return Turn(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(fd) = self.0 {
            // SAFETY: as in `take`.
            unsafe { libc::flock(fd, libc::LOCK_UN) };
        }
    }
}

/// The job's main process is one that is not a worker (forks write no report of their own; a
/// worker Python's `multiprocessing` spawned does) and ran training steps (a step past 0), else
/// the one with the largest heap: the sidecar's rule for a job's tree (`memsight-sidecar`'s
/// `job.rs`).
fn main_key(r: &Report) -> (bool, bool, u64) {
    (
        !memsight_format::process::is_spawned_worker(&r.job.command),
        r.steps.iter().any(|s| s.step > 0),
        r.peaks.heap_peak_bytes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_kept_only_for_this_job_or_a_job_it_started() {
        let named = |job: &str, tree: &str| ByHand {
            job: job.into(),
            tree: tree.into(),
        };
        let mut big = Report {
            schema_version: memsight_format::report::SCHEMA_VERSION,
            ..Report::default()
        };
        big.peaks.heap_peak_bytes = 64 << 20;
        big.by_hand = Some(named("b/7@9", "b/1@2"));
        let mut small = Report::default();
        small.peaks.heap_peak_bytes = 1 << 20;
        // The names are read back from the report's JSON.
        let theirs = Report::from_slice(&big.to_json().unwrap())
            .unwrap()
            .by_hand
            .unwrap();
        assert_eq!(theirs, named("b/7@9", "b/1@2"));
        // The same job: the main process's; a job this one started: its own; anyone else's: never.
        assert_eq!(
            keeps((&big, &theirs), &small, &named("b/7@9", "b/1@2")),
            Some(false)
        );
        assert_eq!(
            keeps((&small, &theirs), &big, &named("b/7@9", "b/1@2")),
            None
        );
        assert_eq!(
            keeps((&big, &theirs), &small, &named("b/1@2", "b/1@2")),
            Some(true)
        );
        assert_eq!(
            keeps((&big, &theirs), &small, &named("b/8@9", "b/1@2")),
            None
        );
        assert_eq!(
            keeps((&big, &theirs), &small, &named("c/7@9", "c/1@2")),
            None
        );
    }
}
