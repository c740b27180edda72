//! Why the viewer is not connected, in words, and whether trying again can help: a stale socket
//! whose job is gone, a job that ended, or a sidecar that speaks a newer wire major version end the
//! retries with their reason instead of "reconnecting…" forever.

use memsight_format::wire::WireError;
use std::path::Path;

/// The connection is down: why, and whether the viewer keeps trying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Down {
    /// What the user is told.
    pub why: String,
    /// False when no retry can succeed.
    pub retry: bool,
}

/// The job pid in a sidecar socket's name (`sidecar-<pid>.<pid namespace>.sock`).
pub fn job_pid_of(socket: &Path) -> Option<u32> {
    memsight_format::wire::pid_of_file_name(socket.file_name()?.to_str()?, "sidecar-", ".sock")
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    let r = unsafe { libc::kill(pid as i32, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Why connecting to `socket` failed with `e`.
pub fn connect_failed(socket: &Path, e: &std::io::Error) -> Down {
    let job = job_pid_of(socket);
    let job_gone = job.is_some_and(|p| !alive(p));
    let shown = socket.display();
    match (e.raw_os_error(), job) {
        (Some(libc::ECONNREFUSED), Some(pid)) if job_gone => Down {
            why: format!(
                "job {pid} has ended and its sidecar is gone ({shown} is a stale socket): nothing to watch; its report holds the run"
            ),
            retry: false,
        },
        (Some(libc::ECONNREFUSED), Some(pid)) => Down {
            why: format!(
                "no sidecar listens at {shown} (a stale socket: was the sidecar killed?); job {pid} runs on — `memsight attach {pid}` watches it again"
            ),
            retry: true,
        },
        (Some(libc::ECONNREFUSED), None) => Down {
            why: format!("no sidecar listens at {shown} (a stale socket)"),
            retry: true,
        },
        (Some(libc::ENOENT), Some(pid)) if job_gone => Down {
            why: format!("job {pid} has ended and its sidecar removed {shown}"),
            retry: false,
        },
        _ => Down {
            why: format!("{shown}: {e}"),
            retry: true,
        },
    }
}

/// Why reading the stream failed with `e`: a newer wire major version is final ("upgrade
/// memsight"); anything else may pass when the sidecar comes back.
pub fn stream_failed(e: &WireError) -> Down {
    Down {
        why: e.to_string(),
        retry: !matches!(e, WireError::Version { .. }),
    }
}
