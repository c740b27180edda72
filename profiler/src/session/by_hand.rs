//! A job started by hand — the preloaded library and `MEMSIGHT_REPORT` set in the environment,
//! no `memsight run` — is a tree of processes too (a shell script, `bash -c`, a shim, the tools
//! the job runs): which of them is its first, and which one's report the user's path keeps.
//!
//! Without a sidecar no process sees the others, so each decides from `/proc`: a process whose
//! parent was started with the same `LD_PRELOAD` and `MEMSIGHT_REPORT`, in the same process group
//! or in a session of its own (a launcher's worker: `torchrun`'s, `setsid`), is inside the job;
//! the job's first process is the one whose parent is not. (A shell with job control — a
//! terminal's, whose own environment may carry the variables — starts each command line in a group
//! of its own: each is a job, its group's leader first. A script's commands share the script's
//! group.) Each process of the job that ends with a session offers its report, and the path keeps
//! the job's main one, by the rule the sidecar uses for a job's tree: the process that ran training
//! steps, else the one with the largest heap. A report is another of the job's only if this user
//! wrote it and it names the job ([`names`]: this boot, the job's first process and its start):
//! never one planted there, nor an unrelated job's at the same path.

use super::{write_json, SessionError};
use memsight_format::report::{Report, ReportError};
use memsight_format::safe_dir::Dir;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// The variables whose values, equal in a parent, make it a process of the same job.
const JOB_KEYS: [&std::ffi::CStr; 2] = [c"LD_PRELOAD", c"MEMSIGHT_REPORT"];

/// Whether this process's parent is in its job: 0 not asked yet, 1 yes, 2 no.
static PARENT_IN_JOB: AtomicU8 = AtomicU8::new(0);
/// When the job's first process started, in clock ticks after boot (with [`PARENT_IN_JOB`]).
static JOB_STARTED_TICKS: AtomicU64 = AtomicU64::new(0);
/// The job's first process (with [`PARENT_IN_JOB`]).
static JOB_FIRST_PID: AtomicI32 = AtomicI32::new(0);
/// The top-most ancestor started with the same variables, whatever its group (a shell with job
/// control whose command lines are jobs of their own), and its start: the tree the job is in.
static TREE_FIRST_PID: AtomicI32 = AtomicI32::new(0);
static TREE_STARTED_TICKS: AtomicU64 = AtomicU64::new(0);

/// Whether this process's parent was started in the same job started by hand. Asked once per
/// program image, with the job's start, as the preloaded library loads: its ancestors are alive
/// then (one that has ended re-parents its children, and a tool outliving the job's first process
/// — `multiprocessing`'s resource tracker — would be a job of its own). Allocation-free.
pub(crate) fn parent_in_job() -> bool {
    if PARENT_IN_JOB.load(Ordering::Relaxed) == 0 {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut first = me;
        let mut outer = me;
        let mut in_this_job = true;
        let mut child = stat_fields(me);
        // The top-most ancestors in the job and in its tree (a bound against a cycle of recycled
        // pids).
        for _ in 0..4096 {
            let Some(c) = child else { break };
            let parent = Some(c.ppid)
                .filter(|&p| p > 1)
                .and_then(stat_fields)
                .filter(|_| in_job(c.ppid));
            in_this_job &= parent.as_ref().is_some_and(|p| linked(&c, p));
            if parent.is_some() {
                outer = c.ppid;
                if in_this_job {
                    first = c.ppid;
                }
            }
            child = parent;
        }
        // A process whose parent is not in the job may still be one of several the job started at
        // once in a group of their own (a pipeline a shell with job control ran): the job is then
        // its group's, started by the group's leader, if that carries the same variables.
        if let Some(f) = stat_fields(first) {
            let leader = Some(f.group)
                .filter(|&g| g > 1 && g != first)
                .and_then(stat_fields)
                .filter(|l| l.group == f.group && l.session == f.session && in_job(f.group));
            if leader.is_some() {
                if outer == first {
                    outer = f.group;
                }
                first = f.group;
            }
        }
        for (pid, pid_at, ticks_at) in [
            (first, &JOB_FIRST_PID, &JOB_STARTED_TICKS),
            (outer, &TREE_FIRST_PID, &TREE_STARTED_TICKS),
        ] {
            if let Some(f) = stat_fields(pid) {
                ticks_at.store(f.start, Ordering::Relaxed);
                pid_at.store(pid, Ordering::Relaxed);
            }
        }
        PARENT_IN_JOB.store(if first != me { 1 } else { 2 }, Ordering::Relaxed);
    }
    PARENT_IN_JOB.load(Ordering::Relaxed) == 1
}

/// Whether a process and its parent are in one job as far as their groups tell: the same process
/// group, or a session of the child's own (a launcher detaching its workers from the terminal's
/// signals — `torchrun`'s, `setsid` — keeps them in its job). A new group in the same session is
/// a shell's job control: a command line of its own.
fn linked(child: &Stat, parent: &Stat) -> bool {
    child.group == parent.group || child.session != parent.session
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

/// What `/proc/<pid>/stat` tells of a process.
struct Stat {
    ppid: libc::pid_t,
    group: libc::pid_t,
    session: libc::pid_t,
    /// Start, in clock ticks after boot.
    start: u64,
}

/// Process `pid`'s parent, groups and start time, from `/proc/<pid>/stat`. Allocation-free.
fn stat_fields(pid: libc::pid_t) -> Option<Stat> {
    let mut buf = [0u8; 1024];
    let text = read_proc(pid, b"/stat", &mut buf)?;
    // The command name in parentheses may hold anything; the fields after its last `)` do not.
    let after = text.iter().rposition(|&b| b == b')')? + 1;
    let mut fields = text[after..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    let mut pid_field = |skip| libc::pid_t::try_from(number(fields.nth(skip)?)?).ok();
    let ppid = pid_field(1)?;
    let group = pid_field(0)?;
    let session = pid_field(0)?;
    let start = number(fields.nth(15)?)?;
    Some(Stat {
        ppid,
        group,
        session,
        start,
    })
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

/// What names this job in its processes' reports, and the tree it is in: this boot, the first
/// process of each and when it started (a pid is not reused while it runs, nor started twice in a
/// clock tick).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Names {
    job: String,
    tree: String,
}

fn names() -> Option<Names> {
    parent_in_job();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let name = |pid: &AtomicI32, ticks: &AtomicU64| {
        let ticks = Some(ticks.load(Ordering::Relaxed)).filter(|&t| t > 0)?;
        Some(format!(
            "{}/{}@{ticks}",
            boot.trim(),
            pid.load(Ordering::Relaxed)
        ))
    };
    Some(Names {
        job: name(&JOB_FIRST_PID, &JOB_STARTED_TICKS)?,
        tree: name(&TREE_FIRST_PID, &TREE_STARTED_TICKS)?,
    })
}

/// The fields that open a by-hand report's JSON: the names of its job and tree (readers ignore
/// them).
fn tag(names: &Names) -> Vec<u8> {
    format!(
        "{{\n  \"by_hand_job\": {:?},\n  \"by_hand_tree\": {:?},\n",
        names.job, names.tree
    )
    .into_bytes()
}

/// The names a report's JSON opens with ([`tag`]), if it does.
fn tag_of(json: &[u8]) -> Option<Names> {
    let head = &json[..json.len().min(512)];
    // The tag is ASCII; what follows it may be cut inside a character.
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    let mut lines = text.lines();
    (lines.next()? == "{").then_some(())?;
    let mut field = |key: &str| {
        let rest = lines.next()?.strip_prefix(&format!("  \"{key}\": \""))?;
        Some(rest.strip_suffix("\",")?.to_owned())
    };
    let job = field("by_hand_job")?;
    let tree = field("by_hand_tree")?;
    Some(Names { job, tree })
}

/// `report`'s JSON, named as this job's ([`tag`]).
fn tagged_json(report: &Report, names: Option<&Names>) -> Result<Vec<u8>, ReportError> {
    let json = report.to_json()?;
    let (Some(names), Some(rest)) = (names, json.strip_prefix(b"{\n")) else {
        return Ok(json);
    };
    let mut tagged = tag(names);
    tagged.extend_from_slice(rest);
    Ok(tagged)
}

/// The report `name` in `dir` if this user wrote it by hand: a regular file this user owns (no
/// link followed) that opens with its names ([`tag`]).
fn tagged_report(dir: &Dir, name: &std::ffi::OsStr) -> Option<(Report, Names)> {
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
    let mut bytes = Vec::new();
    file.take(memsight_format::input::MAX_REPORT_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let names = tag_of(&bytes)?;
    Some((Report::from_slice(&bytes).ok()?, names))
}

/// A report another process wrote that the user's path keeps instead of this process's.
pub(super) struct Kept {
    /// That report.
    pub report: Report,
    /// It is a job's that this process's job started (a command line a shell with job control
    /// ran), not this job's main process's.
    pub nested: bool,
}

/// Whether the report named `theirs` is kept instead of `mine`, this process's (named `names`):
/// one of this job's processes' that is more its main process, or a job's that this job started
/// (a shell with job control keeps its last command line's). Never another job's or tree's.
fn keeps(theirs: (&Report, &Names), mine: &Report, names: &Names) -> Option<bool> {
    let (report, their_names) = theirs;
    let same_job = their_names.job == names.job;
    let nested = !same_job && their_names.tree == names.job;
    ((same_job || nested) && main_key(report) > main_key(mine)).then_some(nested)
}

/// Writes `report` at `path` in a job started by hand unless the report there is another of the
/// job's processes' and that process is more the job's main one: then that report is kept and
/// returned. Processes of the job ending at once take turns (a lock on the directory).
pub(super) fn offer_report(
    report: &Report,
    dir: &Arc<Dir>,
    path: &std::path::Path,
) -> Result<Option<Kept>, SessionError> {
    let _turn = Turn::take(dir);
    let names = names();
    let mut replaced = None;
    if let (Some(name), Some(names)) = (path.file_name(), &names) {
        if let Some((theirs, their_names)) = tagged_report(dir, name) {
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
    let json = tagged_json(report, names.as_ref()).map_err(SessionError::Report)?;
    write_json(&json, dir, path)?;
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
        let st = stat_fields(me).unwrap();
        assert_eq!(st.ppid, parent);
        // SAFETY: getpgid and getsid have no preconditions.
        assert_eq!(st.group, unsafe { libc::getpgid(0) });
        assert_eq!(st.session, unsafe { libc::getsid(0) });
        assert!(st.start > 0);
        assert_eq!(number(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(number(b"18446744073709551616"), None);
        assert_eq!(number(b"12a"), None);
    }

    #[test]
    fn a_report_is_kept_only_for_this_job_or_a_job_it_started() {
        let named = |job: &str, tree: &str| Names {
            job: job.into(),
            tree: tree.into(),
        };
        let mut big = Report::default();
        big.peaks.heap_peak_bytes = 64 << 20;
        let mut small = Report::default();
        small.peaks.heap_peak_bytes = 1 << 20;
        let json = tagged_json(&big, Some(&named("b/7@9", "b/1@2"))).unwrap();
        let theirs = tag_of(&json).unwrap();
        assert_eq!(theirs, named("b/7@9", "b/1@2"));
        // The rest is the report as written untagged.
        let mut value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let fields = value.as_object_mut().unwrap();
        assert!(fields.remove("by_hand_job").is_some() && fields.remove("by_hand_tree").is_some());
        let untagged: serde_json::Value = serde_json::from_slice(&big.to_json().unwrap()).unwrap();
        assert_eq!(value, untagged);
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
        // A report without the fields names no job.
        assert_eq!(tag_of(&big.to_json().unwrap()), None);
    }

    #[test]
    fn pids_are_written_in_decimal() {
        assert_eq!(itoa(0, &mut [0; 12]), b"0");
        assert_eq!(itoa(4_194_304, &mut [0; 12]), b"4194304");
        assert_eq!(itoa(i32::MAX, &mut [0; 12]), b"2147483647");
    }
}
