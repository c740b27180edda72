//! The job's processes still running when its first process ended: `memsight run` stops watching
//! there (as `time` does), so a launcher that starts its trainer in the background and exits
//! (`bash -c 'python train.py &'`) would leave a report of the launcher alone, silently. They are
//! found by the job's own variable in their environment (every process the job started inherits
//! it), said on standard error and in the report.

use std::path::Path;
use std::time::{Duration, Instant};

/// A process of the job still running at its end.
pub(crate) struct LeftRunning {
    pub(crate) pid: u32,
    pub(crate) command: String,
}

/// How long a process of the job may take to end after the first process did before it counts as
/// left running: helpers that end with their parent (`multiprocessing`'s resource tracker and fork
/// server read the end of a pipe) are still there for a moment.
const GRACE: Duration = Duration::from_secs(2);

/// The processes of the job (see [`find`]) still running [`GRACE`] after its first process ended
/// (returns at once when there are none).
pub(crate) fn after_grace(prefix: &Path) -> Vec<LeftRunning> {
    let mut left = find(prefix);
    let deadline = Instant::now() + GRACE;
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left.retain(|p| !zombie(p.pid));
    }
    left
}

/// The processes, other than this one, whose environment carries `MEMSIGHT_JOB=prefix` and
/// that are not zombies. A process another user runs, or one gone meanwhile, is passed over.
fn find(prefix: &Path) -> Vec<LeftRunning> {
    use std::os::unix::ffi::OsStrExt;
    let mut wanted = b"MEMSIGHT_JOB=".to_vec();
    wanted.extend_from_slice(prefix.as_os_str().as_bytes());
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<LeftRunning> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == wanted.as_slice()))
        })
        .filter(|&pid| !zombie(pid))
        .map(|pid| LeftRunning {
            pid,
            command: command_of(pid),
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// Whether `pid` has ended and waits to be reaped (or is gone).
fn zombie(pid: u32) -> bool {
    !crate::job::still_runs(pid)
}

/// `pid`'s command line, its arguments joined by spaces (its name when it has none).
fn command_of(pid: u32) -> String {
    let words = memsight::collect::procfs::command_line(pid);
    if words.is_empty() {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default()
    } else {
        words
            .iter()
            .map(|w| w.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What the report and standard error say of `left` (none: nothing).
pub(crate) fn describe(left: &[LeftRunning]) -> Option<String> {
    const SHOWN: usize = 5;
    if left.is_empty() {
        return None;
    }
    let mut names: Vec<String> = left
        .iter()
        .take(SHOWN)
        .map(|p| format!("pid {} `{}`", p.pid, shortened(&p.command)))
        .collect();
    if left.len() > SHOWN {
        names.push(format!("and {} more", left.len() - SHOWN));
    }
    let (count, verb) = match left.len() {
        1 => ("1 process".to_string(), "it"),
        n => (format!("{n} processes"), "they"),
    };
    Some(format!(
        "the job's first process ended while {count} of the job still ran ({}): memsight stops \
         watching when the first process ends, so what {verb} held from then on is not in this \
         report; run memsight on a command that waits for {}",
        names.join(", "),
        if left.len() == 1 { "it" } else { "them" }
    ))
}

/// `command`, cut to its first 80 characters.
fn shortened(command: &str) -> String {
    const MOST: usize = 80;
    match command.char_indices().nth(MOST) {
        Some((at, _)) => format!("{}…", &command[..at]),
        None => command.to_string(),
    }
}
