//! The registry of threads that count in their own thread-local block: an entry per live thread,
//! claimed on its first slow-path call and released when the thread exits (after its counts are
//! folded into the shared block), and the readers' sums over the entries.
//!
//! Readers and retiring threads hold a small lock while they touch another thread's block, so a
//! block is never read after its thread's storage is gone. The allocation path never takes it: a
//! thread takes it only in its exit destructor, and readers are the sampler and the stats calls.
//! The lock word holds the holder's process id, so a child forked while a parent's thread held it
//! (that thread does not exist in the child) takes it over instead of waiting forever.

use super::counters::{self, state, Counts, Local, SHARED};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicPtr, AtomicU32, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// Threads that can count in their own block at the same time; threads beyond share one block.
pub(crate) const ENTRIES: usize = 1024;

static ENTRY: [AtomicPtr<Local>; ENTRIES] = [const { AtomicPtr::new(null_mut()) }; ENTRIES];
/// One past the highest entry ever claimed: readers scan below it.
static USED: AtomicUsize = AtomicUsize::new(0);
/// 0 when free, else the process id of the holder.
static LOCK: AtomicU32 = AtomicU32::new(0);

/// Folds this thread's block into the shared one when the thread exits.
struct ExitHook;

impl Drop for ExitHook {
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    fn drop(&mut self) {
        counters::retire_this_thread();
    }
}

thread_local! {
    static EXIT_HOOK: ExitHook = const { ExitHook };
}

/// Claims an entry for `l`, this thread's block, and arms the exit hook; `false` (and the thread
/// counts in the shared block from now on) when no entry is free or the thread is already exiting.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn register(l: &Local) -> bool {
    l.state.store(state::REGISTERING, Relaxed);
    let me = l as *const Local as *mut Local;
    let claimed = (0..ENTRIES).find(|&i| {
        ENTRY[i]
            .compare_exchange(null_mut(), me, Release, Relaxed)
            .is_ok()
    });
    let Some(i) = claimed else {
        l.state.store(state::SHARED, Relaxed);
        return false;
    };
    USED.fetch_max(i + 1, Relaxed);
    // The first access registers the hook's destructor, which may allocate: those nested calls
    // count in the shared block, this thread being REGISTERING.
    if EXIT_HOOK.try_with(|_| ()).is_err() {
        ENTRY[i].store(null_mut(), Release);
        l.state.store(state::SHARED, Relaxed);
        return false;
    }
    l.entry.store(i as u64, Relaxed);
    l.state.store(state::REGISTERED, Relaxed);
    true
}

/// Runs `fold` and releases entry `i`, both under the lock (readers see the counts either in the
/// entry or in the shared block, never both or neither).
/// How many registry entries were ever used: at least the threads counting now (read without the
/// lock, for the allocator's slow path).
#[cfg(not(feature = "jemalloc"))]
pub(crate) fn entries_used() -> usize {
    USED.load(Relaxed)
}

#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn release(i: usize, fold: impl FnOnce()) {
    let _held = Held::take();
    fold();
    if let Some(e) = ENTRY.get(i) {
        e.store(null_mut(), Release);
    }
}

/// Calls `f` with the shared block and every registered thread's block, under the lock.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn for_each_block(mut f: impl FnMut(&Counts)) {
    let _held = Held::take();
    f(&SHARED);
    fold_registered((), |(), l| f(&l.counts));
}

/// Folds every registered thread's whole block into `init()` with `f`, under the lock (what `init`
/// reads of the shared totals and what `f` reads of the threads are then one moment's).
#[cfg(feature = "jemalloc")]
pub(crate) fn fold_threads<T>(init: impl FnOnce() -> T, f: impl FnMut(T, &Local) -> T) -> T {
    let _held = Held::take();
    fold_registered(init(), f)
}

/// Folds every registered thread's block into `acc` with `f`; the caller holds the lock.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn fold_registered<T>(mut acc: T, mut f: impl FnMut(T, &Local) -> T) -> T {
    for e in &ENTRY[..USED.load(Relaxed).min(ENTRIES)] {
        let p = e.load(Acquire);
        if !p.is_null() {
            // SAFETY: a registered entry points at a live thread's block; the thread removes it
            // under this lock before its storage goes away.
            acc = f(acc, unsafe { &*p });
        }
    }
    acc
}

/// The registry lock, held until dropped.
struct Held;

impl Held {
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    fn take() -> Held {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() } as u32;
        loop {
            match LOCK.compare_exchange_weak(0, me, Acquire, Relaxed) {
                Ok(_) => return Held,
                Err(0) => {}
                // Held by a thread of the process this one was forked from: it will never let go.
                Err(holder) if holder != me => {
                    if LOCK.compare_exchange(holder, me, Acquire, Relaxed).is_ok() {
                        return Held;
                    }
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
}

impl Drop for Held {
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    fn drop(&mut self) {
        LOCK.store(0, Release);
    }
}
