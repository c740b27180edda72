//! Small system helpers shared by several modules: wall-clock Unix milliseconds, the page size,
//! a mutex lock that survives a panicked holder (memsight's state stays readable after one), the
//! per-thread phase peak windows, and the spawning of memsight's own threads in the job with the
//! job's signals blocked in them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

pub(crate) use memsight_format::clock::unix_ms;

/// The memory page size in bytes.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Says once per process and variable, on stderr, that the environment variable `name` holds a
/// value memsight cannot use (`value`) and what it does instead (`instead`): a bad setting costs a
/// warning, never the job.
pub(crate) fn warn_env_once(name: &str, value: &std::ffi::OsStr, instead: &str) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = lock(&SAID);
    if said.iter().any(|s| s == name) {
        return;
    }
    said.push(name.to_string());
    eprintln!("memsight: {name}={value:?} cannot be used; {instead}");
}

/// Spawns one of memsight's own threads of the job (the sampler, the preloaded library's starter)
/// with every signal blocked in it but the faults a thread raises itself (`SIGSEGV`, `SIGBUS`,
/// `SIGFPE`, `SIGILL`, `SIGTRAP`, `SIGSYS`), so that a signal sent to the process is delivered to
/// one of the program's threads, never consumed by memsight's. A program that takes its signals
/// synchronously — blocks them and reads them with `signalfd`, `sigwait` or `sigtimedwait`
/// (`script`, `tini`, many process supervisors) — otherwise lost every one the kernel handed to a
/// memsight thread, where it met the default action: a `SIGCHLD` it waited for was discarded and
/// the program waited for good. The mask is set on the calling thread for the spawn alone (a new
/// thread inherits it) and put back at once: no instant exists in which the new thread takes a
/// signal. Async-signal-safe apart from the spawn itself; allocates only what the spawn does.
pub fn spawn_without_signals<F, T>(
    builder: std::thread::Builder,
    f: F,
) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset only write the set given.
    let mut blocked: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe { libc::sigfillset(&mut blocked) };
    for fault in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
    ] {
        // SAFETY: as above.
        unsafe { libc::sigdelset(&mut blocked, fault) };
    }
    // SAFETY: both sets are valid; the C library leaves out the signals it keeps for itself
    // (thread cancellation, credential changes), which memsight's threads must still take.
    let masked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut before) } == 0;
    let spawned = builder.spawn(f);
    if masked {
        // SAFETY: `before` is the mask pthread_sigmask returned.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    }
    spawned
}

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Peak windows that open and close at run time, one per thread with open phases: each holds the
/// highest value seen since it last started. [`PeakWindows::raise`] runs on the allocator's slow
/// path and in tensor hooks: it only touches atomics (no allocation, lock, block or panic). The
/// last window is the overflow, shared by every thread that found none free, and never released.
pub(crate) struct PeakWindows {
    values: [AtomicI64; WINDOWS],
    /// Bit `i` set: window `i` is in use (the overflow's bit always is).
    used: AtomicU64,
}

/// How many windows (the last is the overflow).
const WINDOWS: usize = 64;
/// The shared window of threads that found none free.
pub(crate) const OVERFLOW_WINDOW: usize = WINDOWS - 1;

impl PeakWindows {
    pub(crate) const fn new() -> Self {
        PeakWindows {
            values: [const { AtomicI64::new(0) }; WINDOWS],
            used: AtomicU64::new(1 << OVERFLOW_WINDOW),
        }
    }

    /// Takes a free window (the overflow when none is); [`PeakWindows::start`] it before use.
    pub(crate) fn claim(&self) -> usize {
        let mut used = self.used.load(Relaxed);
        loop {
            let free = (!used).trailing_zeros() as usize;
            if free >= OVERFLOW_WINDOW {
                return OVERFLOW_WINDOW;
            }
            match self
                .used
                .compare_exchange_weak(used, used | 1 << free, Relaxed, Relaxed)
            {
                Ok(_) => return free,
                Err(now) => used = now,
            }
        }
    }

    /// Marks window `i` in use (a window another set claimed under the same index).
    pub(crate) fn claim_at(&self, i: usize) {
        self.used.fetch_or(1 << (i % WINDOWS), Relaxed);
    }

    /// Gives window `i` back (the overflow stays).
    pub(crate) fn release(&self, i: usize) {
        if i < OVERFLOW_WINDOW {
            self.used.fetch_and(!(1 << i), Relaxed);
        }
    }

    /// Starts window `i` over at `value`; returns its highest value so far (at least `value`).
    pub(crate) fn start(&self, i: usize, value: i64) -> i64 {
        self.values[i % WINDOWS].swap(value, Relaxed).max(value)
    }

    /// The highest value window `i` saw since it started.
    pub(crate) fn read(&self, i: usize) -> i64 {
        self.values[i % WINDOWS].load(Relaxed)
    }

    /// Starts every window in use over at `value` (a forked child's windows).
    pub(crate) fn restart_used(&self, value: i64) {
        let mut used = self.used.load(Relaxed);
        while used != 0 {
            self.values[used.trailing_zeros() as usize].store(value, Relaxed);
            used &= used - 1;
        }
    }

    /// Raises every window in use to `value`.
    #[inline]
    pub(crate) fn raise(&self, value: i64) {
        let mut used = self.used.load(Relaxed);
        while used != 0 {
            let w = &self.values[used.trailing_zeros() as usize];
            if value > w.load(Relaxed) {
                w.fetch_max(value, Relaxed);
            }
            used &= used - 1;
        }
    }
}
