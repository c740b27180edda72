//! How a run ends for the user: its outcome, the report delivered to its path (or standard
//! output), the errors the sidecar can meet, and the shell's exit code of a job.

use memsight_format::report::Report;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// How the run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The job's exit code, 128 + signal when it was killed.
    pub exit_code: i32,
    /// The report.
    pub report: Report,
    /// Where the report goes (`-`: standard output): the job's path, `{rank}` replaced.
    pub report_path: std::path::PathBuf,
    /// Why the report did not reach its path, when it did not (the job's code still stands).
    pub report_error: Option<SidecarError>,
    /// Each rank whose report did not reach its path, and why (the job's report has its row).
    pub rank_errors: Vec<(u32, SidecarError)>,
}

/// Whether `report` means standard output (`--report -`).
pub fn to_stdout(report: &std::path::Path) -> bool {
    report.as_os_str() == "-"
}

/// Checks, before the job starts, that `report` can be written (see [`memsight_format::safe_file`]).
pub fn check_report_path(report: &std::path::Path) -> Result<(), SidecarError> {
    if to_stdout(report) {
        return Ok(());
    }
    memsight_format::safe_file::check_writable(report).map_err(|e| {
        SidecarError::Report(memsight_format::report::ReportError::Io {
            path: report.to_path_buf(),
            source: e,
        })
    })
}

/// Takes the lock of report `report` for this run (a file `report-<hash>.lock` in the runtime
/// directory `dir`, locked exclusively while the run lasts): two runs given the same `--report`
/// would each write it, and one job's report would be lost without a word. `None` for `-`.
pub(crate) fn lock_report(
    dir: &std::path::Path,
    report: &std::path::Path,
) -> Result<Option<ReportLock>, SidecarError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if to_stdout(report) {
        return Ok(None);
    }
    let absolute = std::path::absolute(report).unwrap_or_else(|_| report.to_path_buf());
    // FNV-1a of the absolute path: a stable name with no characters of the path in it.
    let hash = absolute
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    let path = dir.join(format!("report-{hash:016x}.lock"));
    // The holder removes the file as it ends: a lock taken on a file removed meanwhile is taken
    // again on the new one.
    for _ in 0..100 {
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| SidecarError::RuntimeDir(dir.to_path_buf(), e))?;
        // SAFETY: flock on a descriptor we own; released when it closes (also if we are killed).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(SidecarError::ReportBusy(absolute));
        }
        let same = match (lock.metadata(), std::fs::symlink_metadata(&path)) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if same {
            return Ok(Some(ReportLock { _file: lock, path }));
        }
    }
    Err(SidecarError::ReportBusy(absolute))
}

/// The lock of one run's report path; its file goes when the run ends (while still locked).
pub(crate) struct ReportLock {
    _file: std::fs::File,
    path: std::path::PathBuf,
}

impl Drop for ReportLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Gives `report` the sites at its process's peak from the heap profiles it wrote (`dumps`), unless
/// it has them: summarized beside `written_to`, the report's path (`None`: standard output).
pub(crate) fn add_heap_profile(
    report: &mut Report,
    dumps: &[memsight_format::heap_profile::DumpRecord],
    written_to: Option<&std::path::Path>,
) {
    if report.heap_profile.is_none() {
        let dir = written_to
            .and_then(std::path::Path::parent)
            .unwrap_or(std::path::Path::new(""));
        report.set_heap_profile(memsight_analysis::heapprof::summarize(dumps, dir));
    }
}

/// Writes the final report to its path, or to standard output for `-`.
pub(crate) fn deliver(report: &Report, to: &std::path::Path) -> Result<(), SidecarError> {
    if to_stdout(to) {
        use std::io::Write;
        let json = report.to_json().map_err(SidecarError::Report)?;
        let mut out = std::io::stdout().lock();
        return out
            .write_all(&json)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .map_err(|e| {
                SidecarError::Report(memsight_format::report::ReportError::Io {
                    path: to.to_path_buf(),
                    source: e,
                })
            });
    }
    report.save(to).map_err(SidecarError::Report)
}

/// Why the sidecar could not do its job.
#[derive(Debug)]
pub enum SidecarError {
    /// No command given.
    NoCommand,
    /// The command could not be started.
    Spawn(String, std::io::Error),
    /// The runtime directory could not be made.
    RuntimeDir(PathBuf, std::io::Error),
    /// The report could not be written.
    Report(memsight_format::report::ReportError),
    /// `attach` was given a pid with no process.
    NoProcess(u32),
    /// `attach` was given the pid of a process that exited and is not yet reaped.
    Zombie(u32),
    /// `attach` was given the pid of a kernel thread (no user memory to watch).
    KernelThread(u32),
    /// The metrics address could not be bound.
    Metrics(std::net::SocketAddr, std::io::Error),
    /// Another `memsight run` is writing the same report now.
    ReportBusy(PathBuf),
}

impl fmt::Display for SidecarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SidecarError::NoCommand => {
                f.write_str("no command given: memsight run [OPTIONS] -- CMD ARGS…")
            }
            SidecarError::Spawn(cmd, e) => write!(f, "cannot start `{cmd}`: {e}"),
            SidecarError::RuntimeDir(p, e) => {
                write!(f, "cannot use runtime directory {}: {e}", p.display())
            }
            SidecarError::Report(e) => write!(f, "cannot write the report: {e}"),
            SidecarError::NoProcess(pid) => write!(f, "no process {pid} (see `ps`)"),
            SidecarError::Zombie(pid) => write!(
                f,
                "process {pid} has exited: it is a zombie its parent has not reaped yet, with no \
                 memory left to watch"
            ),
            SidecarError::KernelThread(pid) => write!(
                f,
                "process {pid} is a kernel thread: it has no user memory to watch"
            ),
            SidecarError::Metrics(a, e) => write!(f, "cannot serve metrics at {a}: {e}"),
            SidecarError::ReportBusy(p) => write!(
                f,
                "another memsight run is writing {} now: give this run another --report",
                p.display()
            ),
        }
    }
}

impl std::error::Error for SidecarError {}

/// The exit code a shell would show: the code, or 128 + signal.
pub fn shell_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
