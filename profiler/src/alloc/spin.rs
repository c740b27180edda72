//! The sampler's spin lock: held for a few hundred instructions at most (no allocation, no
//! system call while held), so a waiter spins briefly, then yields. Every lock of the sampler is
//! one of these, and each is taken before a `fork` and released after it on both sides
//! ([`SpinLock::hold_across_fork`]), so a child never inherits one held by a thread it lacks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// A spin lock without data (it guards statics of the module that owns it).
pub(crate) struct SpinLock(AtomicBool);

/// Holds a [`SpinLock`] until dropped.
pub(crate) struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    pub(crate) const fn new() -> Self {
        SpinLock(AtomicBool::new(false))
    }

    /// Takes the lock.
    pub(crate) fn lock(&self) -> SpinGuard<'_> {
        self.acquire();
        SpinGuard(self)
    }

    fn acquire(&self) {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // SAFETY: no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    fn release(&self) {
        self.0.store(false, Ordering::Release);
    }

    /// Registers `locks` (once per process) to be taken before every `fork` and released after it, in the parent and
    /// in the child. Allocates (the C library keeps the handlers): not on an allocation path.
    /// Handlers registered after the allocator's own run before its prepare step, so these locks,
    /// which their holders may hold while calling into the allocator, are taken first.
    pub(crate) fn hold_across_fork(locks: &'static [&'static SpinLock]) {
        if FORK_LOCKS.set(locks).is_ok() {
            // SAFETY: the handlers only take and release spin locks.
            unsafe { libc::pthread_atfork(Some(prepare), Some(after), Some(after)) };
        }
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// The locks the fork handlers take (set once).
static FORK_LOCKS: OnceLock<&'static [&'static SpinLock]> = OnceLock::new();

fn fork_locks() -> &'static [&'static SpinLock] {
    FORK_LOCKS.get().copied().unwrap_or(&[])
}

extern "C" fn prepare() {
    for l in fork_locks() {
        l.acquire();
    }
}

extern "C" fn after() {
    for l in fork_locks() {
        l.release();
    }
}
