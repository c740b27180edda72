//! The sampler's spin lock: held for a few hundred instructions at most (no allocation, no
//! system call while held), so a waiter spins briefly, then yields. Every lock of the sampler is
//! one of these, and each is taken before a `fork` and released after it in the parent
//! ([`SpinLock::hold_across_fork`]); a child never inherits one held by a thread it lacks, and
//! writes nothing at the fork: it finds the locks marked as held for the fork by the process it
//! was forked from, and takes each over when it first needs it. (A handler that released them in
//! the child wrote two pages there, two copy-on-write faults in every child a shell forks to exec
//! a command.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The lock word: free.
const FREE: u32 = 0;
/// The lock word: held by a thread of this process.
const HELD: u32 = 1;
/// The lock word from here on: held across a `fork` by process `word - FORK_HELD`.
const FORK_HELD: u32 = 2;

/// A spin lock without data (it guards statics of the module that owns it).
pub(crate) struct SpinLock(AtomicU32);

/// Holds a [`SpinLock`] until dropped.
pub(crate) struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    pub(crate) const fn new() -> Self {
        SpinLock(AtomicU32::new(FREE))
    }

    /// Takes the lock.
    pub(crate) fn lock(&self) -> SpinGuard<'_> {
        self.acquire();
        SpinGuard(self)
    }

    fn acquire(&self) {
        let mut spins = 0u32;
        let mut me = 0u32;
        loop {
            match self
                .0
                .compare_exchange_weak(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(word) if word >= FORK_HELD => {
                    if me == 0 {
                        // SAFETY: getpid has no preconditions.
                        me = unsafe { libc::getpid() } as u32;
                    }
                    // Held for a fork by the process this one was forked from: no thread here
                    // will release it. (In the forking process, its own threads wait.)
                    if word - FORK_HELD != me
                        && self
                            .0
                            .compare_exchange(word, HELD, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return;
                    }
                }
                Err(_) => {}
            }
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
        self.0.store(FREE, Ordering::Release);
    }

    /// Registers `locks` (once per process) to be taken before every `fork` and released after it
    /// in the parent. Allocates (the C library keeps the handlers): not on an allocation path.
    /// Handlers registered after the allocator's own run before its prepare step, so these locks,
    /// which their holders may hold while calling into the allocator, are taken first.
    pub(crate) fn hold_across_fork(locks: &'static [&'static SpinLock]) {
        if FORK_LOCKS.set(locks).is_ok() {
            // SAFETY: the handlers only take and release spin locks.
            unsafe { libc::pthread_atfork(Some(prepare), Some(after_in_parent), None) };
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
    // SAFETY: getpid has no preconditions.
    let held_for_fork = FORK_HELD.saturating_add(unsafe { libc::getpid() } as u32);
    for l in fork_locks() {
        l.acquire();
        l.0.store(held_for_fork, Ordering::Relaxed);
    }
}

extern "C" fn after_in_parent() {
    for l in fork_locks() {
        l.release();
    }
}
