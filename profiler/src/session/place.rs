//! This process's place in a job under `memsight run`, where every process that carries memsight
//! is measured: the ring it writes (one per process, named from the job's prefix in
//! `MEMSIGHT_JOB`), whether it writes the report the user asked for, and what it says of itself
//! in its greeting (parent, rank, fork).

use memsight_format::process::{ProcessInfo, RankEnv};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The prefix of the job's per-process rings (`memsight run` sets it; every process inherits it).
pub(crate) const JOB_VAR: &str = "MEMSIGHT_JOB";
/// The pid of the `memsight run` that started the job: its direct child writes the user's report
/// itself (there even if the sidecar is killed); the other processes leave theirs to the sidecar.
const SIDECAR_VAR: &std::ffi::CStr = c"MEMSIGHT_SIDECAR_PID";

static FORKED: AtomicBool = AtomicBool::new(false);
static INHERITED: AtomicU64 = AtomicU64::new(0);
/// The process whose session runs (0: none): only it says its exit code.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Called in a forked child that carries memsight (the preloaded library's fork handler), before
/// it starts a session of its own: it is a fork of a measured process holding `inherited` live
/// heap bytes from its parent. Async-signal-safe.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn forked(inherited: u64) {
    FORKED.store(true, Ordering::Relaxed);
    INHERITED.store(inherited, Ordering::Relaxed);
    OWNER.store(0, Ordering::Relaxed);
}

/// An exit this process said before its session owned a ring: `pid << 32 | EXIT_NOTED | code`
/// (0: none). A process whose session starts on the starter thread as the program exits (it
/// allocated its data late and exits at once) calls `exit` before the ring is its own; the session
/// says the code as it takes the ring ([`own`]).
static EXIT_PENDING: AtomicU64 = AtomicU64::new(0);
/// The flag marking [`EXIT_PENDING`] as said.
const EXIT_NOTED: u64 = 1 << 8;

/// Says that this process is exiting with `code` (the preloaded library's `exit` and `_exit`), in
/// its ring's header, so the sidecar tells an exit from a kill; said again by a session that
/// starts after it. Only the process whose session runs says it (not a `vfork` child sharing its
/// memory: the pending exit is its pid's). Async-signal-safe.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn exiting(code: i32) {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    // Sequentially consistent with `own`: of an exit and a session start racing on two threads,
    // at least one sees the other's store, so the code is said.
    EXIT_PENDING.store(
        (u64::from(me) << 32) | EXIT_NOTED | u64::from(code as u8),
        Ordering::SeqCst,
    );
    if OWNER.load(Ordering::SeqCst) == me {
        memsight_format::wire::ring::note_exit(code);
    }
}

/// Marks this process as the one whose session runs (its ring's exit word installed), and says an
/// exit it already began.
pub(crate) fn own() {
    let me = std::process::id();
    OWNER.store(me, Ordering::SeqCst);
    let pending = EXIT_PENDING.load(Ordering::SeqCst);
    if pending >> 32 == u64::from(me) && pending & EXIT_NOTED != 0 {
        memsight_format::wire::ring::note_exit(i32::from(pending as u8));
    }
}

/// What this process says of itself.
pub(crate) fn info() -> ProcessInfo {
    ProcessInfo {
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        rank: RankEnv::from_env(),
        forked: FORKED.load(Ordering::Relaxed),
        inherited_bytes: INHERITED.load(Ordering::Relaxed),
    }
}

/// The job's ring prefix, when this process runs in a job under `memsight run`.
pub(crate) fn job_prefix() -> Option<PathBuf> {
    std::env::var_os(JOB_VAR)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// This process's ring in the job: `<prefix>-p<pid>-<nanoseconds>.bin` (a process that exec'd
/// another program keeps its pid and gets a new ring).
pub(crate) fn ring_in_job(prefix: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-p{}-{nanos}.bin", std::process::id()));
    PathBuf::from(name)
}

/// Whether this process writes the user's report itself (and is the job's first process): the
/// direct child of the `memsight run` that started the job; outside one, the first process of a
/// job started by hand (also after a launcher exec'd into it), not a fork of it
/// (`super::by_hand`: the others offer theirs).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn writes_user_report() -> bool {
    // The C library's `getenv`: the preloaded library asks as every process of the job loads,
    // and each page of code it runs there is a page fault in every short helper.
    // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated value.
    let value = unsafe { libc::getenv(SIDECAR_VAR.as_ptr()) };
    // SAFETY: non-null, so a NUL-terminated string the environment holds.
    let sidecar = (!value.is_null())
        .then(|| unsafe { std::ffi::CStr::from_ptr(value) })
        .and_then(|v| pid_of(v.to_bytes()));
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    match sidecar {
        Some(s) => s == parent && !forked_here(),
        // Started by hand: the job's first process is the one whose parent is not in it.
        None => !forked_here() && !super::by_hand::parent_in_job(),
    }
}

/// The process id written in `text` (blanks around it allowed), without the standard library's
/// string parsing: this runs as every process of a job loads (see [`writes_user_report`]).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn pid_of(text: &[u8]) -> Option<i32> {
    let digits = text.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    number(digits).and_then(|n| i32::try_from(n).ok())
}

/// The decimal number `digits` spell, if they do and it fits (none: 0), without the standard
/// library's string parsing (for [`pid_of`], and `/proc` read without allocating).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn number(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// Whether this process is a fork of a measured process that did not exec.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn forked_here() -> bool {
    FORKED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::pid_of;

    #[test]
    fn a_pid_is_read_from_its_digits_alone() {
        assert_eq!(pid_of(b"4242"), Some(4242));
        assert_eq!(pid_of(b" 17\n"), Some(17));
        assert_eq!(pid_of(b"2147483647"), Some(i32::MAX));
        for bad in [
            &b""[..],
            b"  ",
            b"12a",
            b"-3",
            b"2147483648",
            b"99999999999",
            b"1 2",
        ] {
            assert_eq!(pid_of(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
