//! Small system helpers shared by several modules: wall-clock Unix milliseconds, the page size,
//! and a mutex lock that survives a panicked holder (memsight's state stays readable after one).

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

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
