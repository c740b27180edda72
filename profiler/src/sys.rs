//! Small system helpers shared by several modules: wall-clock Unix milliseconds, the page size,
//! a mutex lock that survives a panicked holder (memsight's state stays readable after one), and
//! the per-thread phase peak windows.

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
