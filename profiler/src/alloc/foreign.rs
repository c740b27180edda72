//! Counting for allocations that do not pass through [`super::Allocator`]: a `malloc` family that
//! wraps another allocator (memsight's preloadable library over glibc's) reports each call here,
//! in the allocator's usable bytes, and the process heap is these counts. Only without the
//! `jemalloc` feature: with it, memsight serves `malloc` itself and reads jemalloc's counters.
//!
//! The same rules as the global allocator's hot path: no allocation, lock, block or panic.

use super::counters;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

static IN_USE: AtomicBool = AtomicBool::new(false);
/// A function the wrapping library runs after each allocation the fast path did not count (0:
/// none), as `fn()`.
static SLOW_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Says that the process's `malloc` family is counted here (called once, as the wrapping library
/// loads): the heap statistics' call counts are then the process's, Rust's share is not told
/// apart, and reports say why there is no jemalloc or heap profile.
pub fn install() {
    IN_USE.store(true, Relaxed);
}

/// Runs `hook` after every allocation that takes the counters' slow path (once per tens of KiB a
/// thread allocates): the wrapping library's cue to act on the process's age or size without a
/// thread of its own. The hook runs inside `malloc`, after the inner allocator returned; it must
/// not lock what a `malloc` caller may hold, and nested allocations call it again.
pub fn on_slow_alloc(hook: fn()) {
    SLOW_HOOK.store(hook as usize, Relaxed);
}

/// True once [`install`] was called.
pub fn installed() -> bool {
    IN_USE.load(Relaxed)
}

/// Why jemalloc's statistics and heap profiles are absent in a process counted here.
pub const WHY_NO_JEMALLOC: &str =
    "not in this job: memsight is preloaded and counts the allocator the program uses (glibc's malloc)";

/// Counts an allocation of `bytes` that has happened. Leaves `errno` as it was.
#[inline(always)]
pub fn count_alloc(bytes: usize) {
    if !counters::alloc_fast(bytes) {
        keeping_errno(|| {
            counters::on_alloc(bytes);
            run_slow_hook();
        });
    }
}

/// Runs the hook set by [`on_slow_alloc`], if any.
fn run_slow_hook() {
    let hook = SLOW_HOOK.load(Relaxed);
    if hook != 0 {
        // SAFETY: only [`on_slow_alloc`] stores here, the address of a `fn()`.
        let hook: fn() = unsafe { std::mem::transmute::<usize, fn()>(hook) };
        hook();
    }
}

/// Counts the free of an allocation of `bytes`, before or after it happens. Leaves `errno` as it
/// was.
#[inline(always)]
pub fn count_free(bytes: usize) {
    if !counters::dealloc_fast(bytes) {
        keeping_errno(|| counters::on_dealloc(bytes));
    }
}

/// Counts a reallocation that moved or resized a block from `old` to `new` bytes. Leaves `errno`
/// as it was.
#[inline(always)]
pub fn count_realloc(old: usize, new: usize) {
    if !counters::realloc_fast(old, new) {
        keeping_errno(|| {
            counters::realloc_slow(old, new);
            run_slow_hook();
        });
    }
}

/// Runs `f` (a slow path that may register the thread, which calls into libc) and puts `errno`
/// back: a caller's `malloc` or `free` must not change it on success. The fast paths touch no libc
/// and skip this.
#[inline(never)]
fn keeping_errno(f: impl FnOnce()) {
    // SAFETY: errno is this thread's; reading and writing it has no other effect.
    let errno = unsafe { *libc::__errno_location() };
    f();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Records an allocation of `bytes` that the wrapped allocator refused (in the flight recorder's
/// header, where a sidecar finds it after the process dies).
#[cold]
pub fn count_failure(bytes: usize) {
    super::failed(bytes);
}
