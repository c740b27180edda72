//! The global allocator: a counting wrapper around jemalloc (or any other `GlobalAlloc`).
//!
//! Counting lives in [`counters`] (thread-local blocks) and `registry` (the threads' blocks for
//! readers); this module forwards to the inner allocator. A call the counters' fast path accepts is
//! counted before it is forwarded (an allocation the inner allocator then refuses is taken back);
//! any other call is forwarded first and counted after, out of line. The path never allocates,
//! locks, blocks or panics, and is reentrancy-safe: each counter update completes before the inner
//! call starts or after it returns, so an inner allocator that itself allocates through the global
//! allocator nests cleanly.
//!
//! Without jemalloc (the preloaded library, where every process of a job carries this code),
//! the functions a process runs as it loads, first allocates, forks and exits go to the section
//! `.text.hot.memsight`, which that library's link keeps together (profiler/preload/build.rs): a
//! short helper then touches few pages of code. The jemalloc build keeps the usual layout.

pub(crate) mod counters;
#[cfg(not(feature = "jemalloc"))]
pub mod foreign;
#[cfg(feature = "jemalloc")]
mod interpose;
#[cfg(feature = "jemalloc")]
pub(crate) mod process_heap;
mod registry;
#[cfg(feature = "jemalloc")]
mod sample_heap;
// Without jemalloc (the preloaded library), sampled blocks get mappings of their own.
#[cfg(all(feature = "sampling", not(feature = "jemalloc")))]
#[path = "sample_pages.rs"]
mod sample_heap;
#[cfg(feature = "sampling")]
mod sample_table;
#[cfg(feature = "sampling")]
// Without jemalloc only C's stream is sampled (the preloaded library): Rust's stream and the
// executable's pre-initialiser are the linked library's.
#[cfg_attr(not(feature = "jemalloc"), allow(dead_code))]
pub mod sampling;
#[cfg(feature = "sampling")]
mod spin;
#[cfg(feature = "sampling")]
mod unwind;

use std::alloc::{GlobalAlloc, Layout};

pub use counters::{Totals, FLUSH_BYTES};
pub use memsight_format::heap::{HeapStats, HISTOGRAM_BUCKETS};

/// The allocator a training binary installs with `#[global_allocator]`.
///
/// `Allocator::new()` wraps jemalloc and counts Rust's share of the heap. With the `jemalloc`
/// feature memsight also defines the process's C allocation functions (`malloc`, `free`, … in
/// `interpose`), so C and C++ code — libtorch included — is served by the same jemalloc, and the
/// process heap is read from jemalloc's own per-thread counters (`process_heap`).
/// `Allocator::wrap(inner)` adds the same tracking over any other [`GlobalAlloc`]; an inner
/// allocator that calls `malloc` (such as `System`) is then in the process heap once and in
/// Rust's share, one with a heap of its own only in Rust's share.
///
/// ```
/// // In a binary: #[global_allocator] static ALLOC: memsight::Allocator = memsight::Allocator::new();
/// static ALLOC: memsight::Allocator<std::alloc::System> = memsight::Allocator::wrap(std::alloc::System);
/// ```
pub struct Allocator<A = DefaultInner> {
    inner: A,
}

/// The inner allocator of [`Allocator::new`]: jemalloc when the `jemalloc` feature is on.
#[cfg(feature = "jemalloc")]
pub type DefaultInner = tikv_jemallocator::Jemalloc;
/// The inner allocator of [`Allocator::new`]: the system allocator without the `jemalloc` feature.
#[cfg(not(feature = "jemalloc"))]
pub type DefaultInner = std::alloc::System;

impl Allocator<DefaultInner> {
    /// A tracking allocator over jemalloc (over the system allocator without the `jemalloc` feature).
    pub const fn new() -> Self {
        // Every inner allocator `DefaultInner` stands for is a unit struct.
        Allocator {
            inner: DefaultInner {},
        }
    }
}

impl Default for Allocator<DefaultInner> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A> Allocator<A> {
    /// A tracking allocator over `inner`.
    pub const fn wrap(inner: A) -> Self {
        Allocator { inner }
    }
}

// SAFETY: every call is forwarded unchanged to `inner`; the counters only observe sizes.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Allocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counters::alloc_fast(layout.size()) {
            let p = self.inner.alloc(layout);
            if p.is_null() {
                counted_but_failed(layout.size());
            }
            p
        } else {
            self.alloc_slow(layout)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if counters::alloc_fast(layout.size()) {
            let p = self.inner.alloc_zeroed(layout);
            if p.is_null() {
                counted_but_failed(layout.size());
            }
            p
        } else {
            self.alloc_zeroed_slow(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !sampled(ptr) && counters::dealloc_fast(layout.size()) {
            self.inner.dealloc(ptr, layout)
        } else {
            self.dealloc_slow(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if sampled(ptr) || !counters::realloc_fast(layout.size(), new_size) {
            return self.realloc_slow(ptr, layout, new_size);
        }
        let p = self.inner.realloc(ptr, layout, new_size);
        if p.is_null() {
            counters::realloc_failed_after_count(layout.size(), new_size);
            failed(new_size);
        }
        p
    }
}

/// Whether `p` is a heap-sampled block (served by the sampled arena): one compare.
#[inline(always)]
fn sampled(p: *const u8) -> bool {
    #[cfg(feature = "jemalloc")]
    return sample_heap::contains(p);
    #[cfg(not(feature = "jemalloc"))]
    {
        let _ = p;
        false
    }
}

/// A sampled block of `layout` when this thread's Rust stream is due a sample at `size` more
/// bytes; null otherwise (or when the sampled arena is full).
#[inline(always)]
unsafe fn sampled_block(layout: Layout, size: usize, zero: bool) -> *mut u8 {
    #[cfg(feature = "jemalloc")]
    if sampling::rust_due(size) {
        return sampling::alloc(layout.size(), layout.align(), zero);
    }
    let _ = (layout, size, zero);
    std::ptr::null_mut()
}

impl<A: GlobalAlloc> Allocator<A> {
    /// An allocation the counters' fast path did not count: allocate, then count what succeeded.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_slow(&self, layout: Layout) -> *mut u8 {
        let mut p = sampled_block(layout, layout.size(), false);
        if p.is_null() {
            p = self.inner.alloc(layout);
        }
        count_after(p, layout.size());
        p
    }

    /// As [`Self::alloc_slow`], zeroed.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_zeroed_slow(&self, layout: Layout) -> *mut u8 {
        let mut p = sampled_block(layout, layout.size(), true);
        if p.is_null() {
            p = self.inner.alloc_zeroed(layout);
        }
        count_after(p, layout.size());
        p
    }

    /// A deallocation that the counters' fast path left to finish (or of a sampled block); kept
    /// out of line so that `dealloc` saves no register and ends in a tail call.
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_slow(&self, ptr: *mut u8, layout: Layout) {
        self.free_block(ptr, layout);
        counters::on_dealloc(layout.size());
    }

    /// Frees a block to whoever served it: the sampled arena or the inner allocator.
    #[inline(always)]
    unsafe fn free_block(&self, ptr: *mut u8, layout: Layout) {
        #[cfg(feature = "jemalloc")]
        if sampled(ptr) {
            return sampling::free(ptr);
        }
        self.inner.dealloc(ptr, layout)
    }

    /// A reallocation of a sampled block, or one the counters' fast path did not count (its size
    /// change reaches the thread's mark, where a sample may be due): a sampled block stays sampled
    /// (moved within the sampled arena, its stack kept); growth due a sample moves the block into
    /// the sampled arena; anything else is the inner allocator's.
    #[cold]
    #[inline(never)]
    unsafe fn realloc_slow(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        // SAFETY: `realloc`'s contract: `new_size`, rounded to `layout.align()`, does not overflow.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let mut q: *mut u8 = std::ptr::null_mut();
        #[cfg(feature = "jemalloc")]
        if sampled(ptr) {
            // The block stays sampled; its growth still spends the stream up to here, so the
            // next sample point lies past it (not on the thread's next allocation).
            let _ = sampling::rust_due(new_size.saturating_sub(old));
            q = sampling::realloc(ptr, old, new_size, layout.align());
        }
        if q.is_null() {
            let fresh = if !sampled(ptr) && new_size > old {
                sampled_block(new_layout, new_size - old, false)
            } else {
                std::ptr::null_mut()
            };
            if fresh.is_null() && !sampled(ptr) {
                q = self.inner.realloc(ptr, layout, new_size);
            } else {
                q = if fresh.is_null() {
                    self.inner.alloc(new_layout)
                } else {
                    fresh
                };
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, q, old.min(new_size));
                    self.free_block(ptr, layout);
                }
            }
        }
        if q.is_null() {
            rust_stream_failed();
            failed(new_size);
        } else {
            counters::realloc_slow(old, new_size);
        }
        q
    }
}

/// Counts an allocation that has happened (or records its failure).
#[inline(always)]
fn count_after(p: *mut u8, size: usize) {
    if p.is_null() {
        rust_stream_failed();
        failed(size);
    } else {
        counters::on_alloc(size);
    }
}

/// A slow-path allocation failed: the heap sampler's Rust stream, which counted it in advance
/// when it decided, re-arms from the bytes really allocated.
#[inline(always)]
fn rust_stream_failed() {
    #[cfg(feature = "jemalloc")]
    sampling::rust_failed();
}

/// An allocation counted in advance that the inner allocator refused: taken back, then recorded.
#[cold]
#[inline(never)]
fn counted_but_failed(size: usize) {
    counters::alloc_failed_after_count(size);
    failed(size);
}

/// A failed allocation: the process is usually about to abort, so it goes straight to the flight
/// recorder's header (no allocation, no lock), where a sidecar finds it after the death.
#[cold]
#[inline(never)]
fn failed(size: usize) {
    memsight_format::wire::ring::note_alloc_failure(size);
}

/// Current heap statistics: the process heap (with the `jemalloc` feature every allocation of the
/// process, Rust's and C/C++ code's, at its usable size; without it Rust's through [`Allocator`])
/// and Rust's share. The call counts and cumulative bytes are Rust's. Rust's share is zero when no [`Allocator`] is
/// installed.
pub fn stats() -> HeapStats {
    let t = counters::totals();
    let live = counters::heap_live();
    HeapStats {
        live_bytes: live,
        rust_live_bytes: rust_share(&t),
        peak_bytes: counters::peak(counters::Tracker::Global, live),
        run_peak_bytes: counters::peak(counters::Tracker::Run, live),
        allocations: t.allocations,
        deallocations: t.deallocations,
        reallocations: t.reallocations,
        bytes_allocated: t.bytes_allocated,
        bytes_freed: t.bytes_freed,
    }
}

/// The run's peak of the process heap ([`HeapStats::run_peak_bytes`]) alone: what [`stats`] reads
/// for it, without the sums the other figures take.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn run_peak() -> u64 {
    counters::peak(counters::Tracker::Run, counters::heap_live())
}

/// Rust's share of the process heap: what passed through [`Allocator`] (nothing is told apart in a
/// process whose `malloc` family is counted by [`foreign`]).
fn rust_share(t: &Totals) -> u64 {
    #[cfg(not(feature = "jemalloc"))]
    if foreign::installed() {
        return 0;
    }
    t.live()
}

/// Live bytes of the process heap now (exact): what a process about to fork leaves its child.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn heap_live() -> u64 {
    counters::heap_live()
}

/// In a forked child: every peak, the run's too, starts again from what the child has held since
/// the fork — `inherited`, the live bytes at the fork ([`heap_live`] in the parent just before),
/// or the live bytes now when more (its parent's peaks are its parent's).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub fn restart_peaks_after_fork(inherited: u64) {
    let since_fork = counters::heap_live().max(inherited);
    for t in [
        counters::Tracker::Global,
        counters::Tracker::Step,
        counters::Tracker::Run,
    ] {
        counters::swap_peak(t, since_fork);
    }
    counters::PHASE_WINDOWS.restart_used(since_fork as i64);
}

/// Starts the run's peak and the peak [`stats`] reads back over at the current live bytes (a
/// session finished: the next one's report has a peak of its own).
pub(crate) fn restart_run_peak() {
    let live = counters::heap_live();
    counters::swap_peak(counters::Tracker::Run, live);
    counters::swap_peak(counters::Tracker::Global, live);
}

/// Resets the peak that [`stats`] reads back to the current live bytes. The run's peak
/// ([`HeapStats::run_peak_bytes`], the one reports and budgets use) is not; both start over when a
/// session finishes (the next session reports a peak of its own).
pub fn reset_peak() {
    counters::swap_peak(counters::Tracker::Global, counters::heap_live());
}

/// Allocation counts per power-of-two size bucket: index `i` counts sizes in `[2^(i-1), 2^i)`
/// (index 0: zero-sized), the last bucket also everything larger.
pub fn size_histogram() -> [u64; HISTOGRAM_BUCKETS] {
    counters::histogram()
}
