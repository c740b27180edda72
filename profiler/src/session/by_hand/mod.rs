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

mod offer;
mod proc;

use memsight_format::report::ByHand;
pub(crate) use offer::{offer_report, Kept};
use proc::{environ_holds, stat_fields, Entry, Stat};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};

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

/// What names this job in its processes' reports, and the tree it is in ([`ByHand`]).
fn names() -> Option<ByHand> {
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
    Some(ByHand {
        job: name(&JOB_FIRST_PID, &JOB_STARTED_TICKS)?,
        tree: name(&TREE_FIRST_PID, &TREE_STARTED_TICKS)?,
    })
}
