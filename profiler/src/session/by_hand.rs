//! A job started by hand — the preloaded library and `MEMSIGHT_REPORT` set in the environment,
//! no `memsight run` — is a tree of processes too (a shell script, `bash -c`, a shim, the tools
//! the job runs): which of them is its first, and which one's report the user's path keeps.
//!
//! Without a sidecar no process sees the others, so each decides from `/proc`: a process whose
//! parent was started with the same `LD_PRELOAD` and `MEMSIGHT_REPORT`, in the same process group,
//! is inside the job; the job's first process is the one whose parent is not. (A shell with job
//! control — a terminal's, whose own environment may carry the variables — starts each command
//! line in a group of its own: each is a job. A script's commands share the script's group.) Each process of the job that ends with a
//! session offers its report, and the path keeps the job's main one, by the rule the sidecar uses
//! for a job's tree: the process that ran training steps, else the one with the largest heap.

use memsight_format::report::Report;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The variables whose values, equal in a parent, make it a process of the same job.
const JOB_KEYS: [&std::ffi::CStr; 2] = [c"LD_PRELOAD", c"MEMSIGHT_REPORT"];

/// Whether this process's parent is in its job: 0 not asked yet, 1 yes, 2 no.
static PARENT_IN_JOB: AtomicU8 = AtomicU8::new(0);
/// When the job's first process started, in clock ticks after boot (with [`PARENT_IN_JOB`]).
static JOB_STARTED_TICKS: AtomicU64 = AtomicU64::new(0);

/// Whether this process's parent was started in the same job started by hand. Asked once per
/// program image, with the job's start, as the preloaded library loads: its ancestors are alive
/// then (one that has ended re-parents its children, and a tool outliving the job's first process
/// — `multiprocessing`'s resource tracker — would be a job of its own). Allocation-free.
pub(crate) fn parent_in_job() -> bool {
    if PARENT_IN_JOB.load(Ordering::Relaxed) == 0 {
        // SAFETY: getpid and getppid have no preconditions.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        let in_job = same_job(parent);
        let mut first = me;
        let mut next = Some(parent).filter(|_| in_job);
        // The top-most ancestor in the job (a bound against a cycle of recycled pids).
        for _ in 0..4096 {
            let Some(p) = next else { break };
            first = p;
            next = stat_fields(p)
                .map(|(ppid, _)| ppid)
                .filter(|&pp| same_job(pp));
        }
        if let Some((_, ticks)) = stat_fields(first) {
            JOB_STARTED_TICKS.store(ticks, Ordering::Relaxed);
        }
        PARENT_IN_JOB.store(if in_job { 1 } else { 2 }, Ordering::Relaxed);
    }
    PARENT_IN_JOB.load(Ordering::Relaxed) == 1
}

/// Whether process `pid`, an ancestor of this one, is in this process's job: in its process group,
/// started with the same values of [`JOB_KEYS`].
fn same_job(pid: libc::pid_t) -> bool {
    // SAFETY: getpgid has no preconditions (an error is -1, never a group).
    let group = |p| unsafe { libc::getpgid(p) };
    pid > 1 && group(pid) == group(0) && in_job(pid)
}

/// Whether process `pid` was started with the same values of [`JOB_KEYS`] as this process (the
/// ones set here; no `LD_PRELOAD` here: no job). An environment that cannot be read is another
/// job's.
fn in_job(pid: libc::pid_t) -> bool {
    let mut wanted: [Entry; 2] = [Entry::EMPTY; 2];
    let mut n = 0;
    for key in JOB_KEYS {
        // SAFETY: a NUL-terminated name; getenv returns null or a NUL-terminated value.
        let value = unsafe { libc::getenv(key.as_ptr()) };
        if value.is_null() {
            continue;
        }
        // SAFETY: non-null, so a NUL-terminated string the environment holds.
        let value = unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes();
        wanted[n] = Entry::new(key.to_bytes(), value);
        n += 1;
    }
    // Only the preloaded library makes a job of a tree of processes: this process carries it.
    let preloaded = wanted[..n].iter().any(|e| e.key == JOB_KEYS[0].to_bytes());
    preloaded && environ_holds(pid, &mut wanted[..n])
}

/// One `KEY=VALUE` entry looked for in an environment block, matched byte by byte as it is read.
#[derive(Clone, Copy)]
struct Entry<'a> {
    key: &'a [u8],
    value: &'a [u8],
    /// Bytes of the current entry matched so far; `usize::MAX` once it differs.
    at: usize,
    found: bool,
}

impl<'a> Entry<'a> {
    const EMPTY: Entry<'static> = Entry {
        key: b"",
        value: b"",
        at: 0,
        found: false,
    };

    fn new(key: &'a [u8], value: &'a [u8]) -> Entry<'a> {
        Entry {
            key,
            value,
            at: 0,
            found: false,
        }
    }

    /// The byte expected at `i` of `KEY=VALUE`.
    fn expected(&self, i: usize) -> Option<u8> {
        let k = self.key.len();
        match i {
            _ if i < k => Some(self.key[i]),
            _ if i == k => Some(b'='),
            _ => self.value.get(i - k - 1).copied(),
        }
    }

    /// Takes the environment's next byte (a NUL ends an entry).
    fn feed(&mut self, b: u8) {
        if b == 0 {
            if self.at == self.key.len() + 1 + self.value.len() {
                self.found = true;
            }
            self.at = 0;
        } else if self.at != usize::MAX {
            self.at = match self.expected(self.at) {
                Some(e) if e == b => self.at + 1,
                _ => usize::MAX,
            };
        }
    }
}

/// Whether `/proc/<pid>/environ` (the environment `pid` was exec'd with) holds every entry.
fn environ_holds(pid: libc::pid_t, wanted: &mut [Entry]) -> bool {
    let Some(fd) = open_proc(pid, b"/environ") else {
        return false;
    };
    let mut buf = [0u8; 4096];
    let mut any = false;
    loop {
        // SAFETY: reads at most `buf.len()` bytes into `buf`.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got <= 0 {
            break;
        }
        any = true;
        for &b in &buf[..got as usize] {
            wanted.iter_mut().for_each(|e| e.feed(b));
        }
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    // The last entry ends at the end of the block even without its NUL.
    wanted.iter_mut().for_each(|e| e.feed(0));
    any && wanted.iter().all(|e| e.found)
}

/// `n`'s decimal digits, written into `buf`.
fn itoa(n: libc::pid_t, buf: &mut [u8; 12]) -> &[u8] {
    let mut n = n.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// When the job's first process started, in Unix milliseconds (to within a clock tick).
pub(crate) fn job_started_unix_ms() -> Option<u64> {
    parent_in_job();
    let start_ticks = Some(JOB_STARTED_TICKS.load(Ordering::Relaxed)).filter(|&t| t > 0)?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&h| h > 0)?;
    let booted_unix_ms =
        unix_ms_of(libc::CLOCK_REALTIME)?.checked_sub(unix_ms_of(libc::CLOCK_BOOTTIME)?)?;
    Some(booted_unix_ms + start_ticks.saturating_mul(1000) / hz)
}

/// A clock's time now, in milliseconds.
fn unix_ms_of(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes `ts` only.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000)
}

/// Process `pid`'s parent and start time (clock ticks after boot), from `/proc/<pid>/stat`.
/// Allocation-free.
fn stat_fields(pid: libc::pid_t) -> Option<(libc::pid_t, u64)> {
    let mut buf = [0u8; 1024];
    let text = read_proc(pid, b"/stat", &mut buf)?;
    // The command name in parentheses may hold anything; the fields after its last `)` do not.
    let after = text.iter().rposition(|&b| b == b')')? + 1;
    let mut fields = text[after..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let ppid = number(fields.nth(1)?)?;
    let start = number(fields.nth(17)?)?;
    Some((libc::pid_t::try_from(ppid).ok()?, start))
}

/// The decimal number `digits` spell, if they do and it fits.
fn number(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// Opens `/proc/<pid><file>` (read-only, no controlling terminal); the descriptor, or `None`.
fn open_proc(pid: libc::pid_t, file: &[u8]) -> Option<libc::c_int> {
    let mut path = [0u8; 40];
    let mut len = 0;
    for part in [&b"/proc/"[..], itoa(pid, &mut [0u8; 12]), file] {
        path.get_mut(len..len + part.len())?.copy_from_slice(part);
        len += part.len();
    }
    // A NUL after the name: `path` is zeroed past `len`.
    path.get(len).filter(|&&b| b == 0)?;
    // SAFETY: `path` is NUL-terminated.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    (fd >= 0).then_some(fd)
}

/// Reads `/proc/<pid><file>` into `buf` (what fits); the bytes read.
fn read_proc<'b>(pid: libc::pid_t, file: &[u8], buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let fd = open_proc(pid, file)?;
    // SAFETY: reads at most `buf.len()` bytes into `buf`.
    let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    buf.get(..usize::try_from(got).ok()?)
}

/// Whether `theirs`, the report already at the user's path, is kept instead of `mine`: written
/// by a process of this job (its session started after the job's first process did) that is
/// more the job's main process than this one.
pub(crate) fn keeps_instead(theirs: &Report, mine: &Report, job_started_unix_ms: u64) -> bool {
    // A clock tick of slack: the job's start is known to 10 ms, a session's to 1 ms.
    let same_job = theirs.job.start_unix_ms + 20 >= job_started_unix_ms;
    same_job && main_key(theirs) > main_key(mine)
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

    fn holds(block: &[u8], key: &[u8], value: &[u8]) -> bool {
        let mut e = [Entry::new(key, value)];
        block.iter().for_each(|&b| e[0].feed(b));
        e[0].feed(0);
        e[0].found
    }

    #[test]
    fn an_entry_is_found_only_whole() {
        let block = b"A=1\0LD_PRELOAD=/lib/x.so\0MEMSIGHT_REPORT=r.json\0";
        assert!(holds(block, b"LD_PRELOAD", b"/lib/x.so"));
        assert!(holds(block, b"MEMSIGHT_REPORT", b"r.json"));
        assert!(!holds(block, b"MEMSIGHT_REPORT", b"r.jso"));
        assert!(!holds(block, b"MEMSIGHT_REPORT", b"r.json2"));
        assert!(!holds(block, b"REPORT", b"r.json"));
        assert!(!holds(
            b"XMEMSIGHT_REPORT=r.json\0",
            b"MEMSIGHT_REPORT",
            b"r.json"
        ));
        assert!(holds(
            b"MEMSIGHT_REPORT=r.json",
            b"MEMSIGHT_REPORT",
            b"r.json"
        ));
        assert!(holds(b"K=\0", b"K", b""));
    }

    #[test]
    fn this_process_environment_is_read_back() {
        let mut e = [Entry::new(b"PATH", b"no such value")];
        // SAFETY: getpid has no preconditions.
        assert!(!environ_holds(unsafe { libc::getpid() }, &mut e));
        let path = std::env::var("PATH").unwrap();
        let mut e = [Entry::new(b"PATH", path.as_bytes())];
        // SAFETY: as above.
        assert!(environ_holds(unsafe { libc::getpid() }, &mut e));
    }

    #[test]
    fn this_process_parent_and_start_are_read() {
        // SAFETY: getpid and getppid have no preconditions.
        let (me, parent) = unsafe { (libc::getpid(), libc::getppid()) };
        let (ppid, start) = stat_fields(me).unwrap();
        assert_eq!(ppid, parent);
        assert!(start > 0);
        assert_eq!(number(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(number(b"18446744073709551616"), None);
        assert_eq!(number(b"12a"), None);
    }

    #[test]
    fn pids_are_written_in_decimal() {
        assert_eq!(itoa(0, &mut [0; 12]), b"0");
        assert_eq!(itoa(4_194_304, &mut [0; 12]), b"4194304");
        assert_eq!(itoa(i32::MAX, &mut [0; 12]), b"2147483647");
    }
}
