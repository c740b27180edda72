//! `SIGTERM` and `SIGHUP` while `memsight run` follows its job: what `timeout`, Slurm's time limit,
//! `docker stop` and a closed terminal send. The sidecar must outlive the job to write its report,
//! so it does not die of them: a handler notes the signal, and the follow loop decides. Sent to the
//! whole process group (the usual case), the job has it too and ends; sent to the sidecar alone,
//! the job is passed the signal — unless the job catches it itself: then it cannot be told whether
//! the job already has it (a second one could cut a graceful shutdown short), and the sidecar says
//! so instead.
//!
//! Ctrl-C (`SIGINT` to the terminal's process group) reaches the job through its group and is
//! never passed on. Each of these signals is noted with the time it first arrived
//! ([`stopped`]): processes of the job that end after it were stopped, not failed — a rank that
//! a scheduler's SIGTERM or a Ctrl-C ends is no cause of the job's end.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Signals received and not yet handled, one bit per signal number.
static RECEIVED: AtomicU32 = AtomicU32::new(0);

/// The first stop signal received, and when (Unix ms); 0 while none was.
static FIRST_SIGNAL: AtomicU32 = AtomicU32::new(0);
static FIRST_UNIX_MS: AtomicU64 = AtomicU64::new(0);

/// The signals this module notes; the first [`PASSED_ON`] of them are passed on to the job.
const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];
/// How many of [`SIGNALS`] are passed on to a job that did not get them (not Ctrl-C's).
const PASSED_ON: usize = 2;

/// How long a job that does not catch the signal has to end of it (it had it from its group).
const GRACE: Duration = Duration::from_millis(300);

extern "C" fn note(sig: libc::c_int) {
    // Async-signal-safe: atomics and clock_gettime.
    RECEIVED.fetch_or(1 << sig, Ordering::SeqCst);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let ms = (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000;
    if FIRST_UNIX_MS
        .compare_exchange(0, ms.max(1), Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        FIRST_SIGNAL.store(sig as u32, Ordering::SeqCst);
    }
}

/// The first stop signal `memsight run` received while it followed its job, and when (Unix ms).
pub(crate) fn stopped() -> Option<(libc::c_int, u64)> {
    let at = FIRST_UNIX_MS.load(Ordering::SeqCst);
    (at != 0).then(|| (FIRST_SIGNAL.load(Ordering::SeqCst) as libc::c_int, at))
}

/// Follows the stop signals for one job; restores their default action when dropped.
pub(crate) struct StopSignals {
    /// The job, once it runs (a signal before that waits for it).
    job: Option<u32>,
    /// A signal received, and when: passed on once the grace has run out.
    waiting: Option<(libc::c_int, Instant)>,
}

impl StopSignals {
    /// Installs the handler (before the job is started).
    pub(crate) fn install() -> StopSignals {
        for s in SIGNALS {
            // SAFETY: a handler that only does atomics and clock_gettime.
            unsafe { libc::signal(s, note as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
        StopSignals {
            job: None,
            waiting: None,
        }
    }

    /// The job is `pid`.
    pub(crate) fn follow(&mut self, pid: u32) {
        self.job = Some(pid);
    }

    /// Called from the follow loop: passes a received signal on when due.
    pub(crate) fn poll(&mut self) {
        let got = RECEIVED.swap(0, Ordering::SeqCst);
        if let Some(&s) = SIGNALS[..PASSED_ON].iter().find(|&&s| got & (1 << s) != 0) {
            if self.waiting.is_none() {
                self.waiting = Some((s, Instant::now()));
            }
        }
        let (Some((sig, at)), Some(job)) = (self.waiting, self.job) else {
            return;
        };
        if at.elapsed() < GRACE {
            return;
        }
        self.waiting = None;
        let name = if sig == libc::SIGTERM {
            "SIGTERM"
        } else {
            "SIGHUP"
        };
        if catches(job, sig) {
            eprintln!(
                "memsight · {name} received; job {} catches {name} itself, so it is not passed on \
                 (signal the job or its process group); the report is written when it ends",
                job
            );
        } else {
            eprintln!(
                "memsight · {name} received: passed on to job {}; the report follows",
                job
            );
            // SAFETY: signalling the job this sidecar started.
            unsafe { libc::kill(job as i32, sig) };
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for s in SIGNALS {
            // SAFETY: restoring the default disposition.
            unsafe { libc::signal(s, libc::SIG_DFL) };
        }
    }
}

/// Whether process `pid` has a handler for `sig` (`SigCgt` in `/proc/PID/status`); true when it
/// cannot be read (the safe answer: nothing is sent).
fn catches(pid: u32, sig: libc::c_int) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_none_or(|mask| mask & (1 << (sig - 1)) != 0)
}
