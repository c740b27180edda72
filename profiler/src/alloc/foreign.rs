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
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn install() {
    IN_USE.store(true, Relaxed);
}

/// Runs `hook` after every allocation that takes the counters' slow path (once per tens of KiB a
/// thread allocates): the wrapping library's cue to act on the process's age or size without a
/// thread of its own. The hook runs inside `malloc`, after the inner allocator returned; it must
/// not lock what a `malloc` caller may hold, and nested allocations call it again.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn on_slow_alloc(hook: fn()) {
    SLOW_HOOK.store(hook as usize, Relaxed);
}

/// True once [`install`] was called.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
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

/// Runs the hook set by [`on_slow_alloc`], if any (and re-arms the heap sampler's streams when
/// sampling was switched on or off since).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn run_slow_hook() {
    #[cfg(feature = "sampling")]
    super::sampling::rearm_if_stale();
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
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
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

/// Heap sampling for the wrapping library: the `malloc` family checks [`sample_fits`] before each
/// allocation (one add and compare on the thread's own counters); a call that reaches the thread's
/// next sample point goes to [`alloc_sampled`], which serves it from the sampler's own mappings
/// (`free` tells them with [`is_sampled`]: one compare) and records its stack — as the linked
/// library samples C's allocations, over whatever allocator the program uses.
#[cfg(feature = "sampling")]
pub mod sampled {
    use super::super::{counters, sample_heap, sampling};

    use std::ffi::c_void;

    /// Adds `size` bytes to this thread's sample stream when they stay below its next sample
    /// point: `true`, the call goes to the program's allocator; `false`, to [`alloc_sampled`].
    #[inline(always)]
    pub fn sample_fits(size: usize) -> bool {
        counters::with_local_or(true, |l| l.sample.c_stream_takes(size))
    }

    /// Whether `p` is a sampled block (one compare).
    #[inline(always)]
    pub fn is_sampled(p: *const c_void) -> bool {
        sample_heap::contains(p.cast())
    }

    /// A sampled block of `size` bytes aligned to `align` (zeroed when `zero`), counted, with its
    /// stack recorded; null when this call is not due a sample after all (the sampler is busy on
    /// this thread, or off) or the sampled range is full: the caller then allocates as usual.
    ///
    /// # Safety
    /// `align` is a power of two.
    #[cold]
    #[inline(never)]
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    pub unsafe fn alloc_sampled(size: usize, align: usize, zero: bool) -> *mut c_void {
        if !sampling::c_due(size) {
            return std::ptr::null_mut();
        }
        serve_sampled(size, align, zero)
    }

    /// A sampled block for a call already found due ([`realloc_due`]): as [`alloc_sampled`]
    /// without asking again (the stream was re-armed past the call: a second ask says no).
    ///
    /// # Safety
    /// `align` is a power of two.
    #[cold]
    pub unsafe fn serve_sampled(size: usize, align: usize, zero: bool) -> *mut c_void {
        let p = sampling::alloc(size, align, zero);
        if !p.is_null() {
            super::count_alloc(sampling::usable(p));
        }
        p.cast()
    }

    /// Frees a sampled block, counted.
    ///
    /// # Safety
    /// `p` is a live sampled block, freed once.
    #[cold]
    #[inline(never)]
    pub unsafe fn free_sampled(p: *mut c_void) {
        super::count_free(sampling::usable(p.cast()));
        sampling::free(p.cast());
    }

    /// The usable size of a sampled block.
    ///
    /// # Safety
    /// `p` is a live sampled block.
    pub unsafe fn usable(p: *mut c_void) -> usize {
        sampling::usable(p.cast())
    }

    /// Moves a live sampled block to a new sampled block of `size` bytes, its recorded stack kept
    /// (a reallocation due a sample keeps the block sampled), counted; null when the range is
    /// full (the caller moves it out).
    ///
    /// # Safety
    /// `p` is a live sampled block; `size` is not 0.
    #[cold]
    pub unsafe fn realloc_sampled(p: *mut c_void, size: usize) -> *mut c_void {
        let old = sampling::usable(p.cast());
        let q = sampling::realloc(p.cast(), old, size, 16);
        if !q.is_null() {
            super::count_realloc(old, sampling::usable(q));
        }
        q.cast()
    }

    /// After an allocation of `size` bytes the program's allocator refused: the bytes leave the
    /// sample stream again.
    #[cold]
    pub fn alloc_failed(size: usize) {
        sampling::c_failed(size);
    }

    /// An object is about to be unloaded (`dlclose`): stack walks use libgcc's unwinder until the
    /// session's sampler refreshes the walker.
    pub fn objects_unloading() {
        sampling::objects_unloading();
    }

    /// Records the calling thread as the main thread, for the stack walker (the wrapping library
    /// calls it as it loads).
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    pub fn note_main_thread() {
        super::super::unwind::note_main_thread();
    }

    /// Whether a reallocation to `size` bytes is due a sample (its bytes join the stream).
    #[cold]
    pub fn realloc_due(size: usize) -> bool {
        sampling::c_due(size)
    }
}
