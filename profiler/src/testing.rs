//! Memory assertions in tests: what a closure or a scope allocates and its peak, counted on the
//! calling thread only, so that tests running in parallel (cargo's default) do not see each
//! other's memory.
//!
//! ```
//! #[global_allocator]
//! static ALLOC: memsight::Allocator = memsight::Allocator::new();
//!
//! let (sum, m) = memsight::testing::measure(|| {
//!     let v: Vec<u64> = (0..1024).collect(); // 8 KiB
//!     v.iter().sum::<u64>()
//! });
//! assert_eq!(sum, 523_776);
//! memsight::assert_peak_at_most!(m, 8 << 10);
//! memsight::assert_no_leak!(m);
//! assert_eq!(m.allocations, 1);
//! ```
//!
//! How: each thread already counts its own allocations in a block of its thread-local storage
//! (`alloc::counters`). While a scope is open on a thread, every allocator call of that thread takes
//! the counters' slow path, which raises the thread's own peak (no lock, no allocation); other
//! threads keep their fast path and are not counted here. The figures are exact.
//!
//! # Limitations
//! - Only the calling thread is counted: work the closure hands to other threads (a thread pool,
//!   `std::thread::scope`) is not in its figures — measure inside those threads, or read the
//!   whole process's [`crate::stats`].
//! - Bytes are the sizes requested from the global allocator (as dhat-rs counts them); with the
//!   `jemalloc` feature, [`Measurement::heap_peak_bytes`] is the same thread's share of the process
//!   heap, C and C++ allocations included, at jemalloc's usable sizes.
//! - The test binary must install [`crate::Allocator`] as its `#[global_allocator]`; otherwise
//!   nothing is counted and the assertion macros say so.
//! - A measured thread's calls all take the slow path: a few times slower, only inside the scope.

use crate::alloc::counters;
use memsight_format::units::{fmt_bytes, fmt_signed_bytes};
use std::marker::PhantomData;
use std::sync::atomic::Ordering::Relaxed;

/// What a scope allocated on its thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measurement {
    /// Bytes allocated (reallocation growth included).
    pub allocated_bytes: u64,
    /// Bytes freed (reallocation shrinkage included), also of blocks allocated before the scope.
    pub freed_bytes: u64,
    /// Allocated − freed: what the scope left live (negative: it freed older blocks).
    pub net_bytes: i64,
    /// The most bytes live at once above what the thread held when the scope started.
    pub peak_bytes: u64,
    /// Allocation calls.
    pub allocations: u64,
    /// Deallocation calls.
    pub deallocations: u64,
    /// Reallocation calls.
    pub reallocations: u64,
    /// As `peak_bytes`, in the thread's share of the process heap (C and C++ allocations included,
    /// at jemalloc's usable sizes); `None` without the `jemalloc` feature.
    pub heap_peak_bytes: Option<u64>,
    /// As `net_bytes`, in the thread's share of the process heap; `None` without `jemalloc`.
    pub heap_net_bytes: Option<i64>,
    /// Whether anything could be counted: [`crate::Allocator`] is the global allocator and this
    /// thread has its own counters.
    pub counted: bool,
}

impl std::fmt::Display for Measurement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.counted {
            return f.write_str(NOT_COUNTED);
        }
        write!(
            f,
            "peak {} above the start, net {}, {} allocated in {} allocations, {} freed",
            fmt_bytes(self.peak_bytes),
            fmt_signed_bytes(self.net_bytes),
            fmt_bytes(self.allocated_bytes),
            self.allocations,
            fmt_bytes(self.freed_bytes)
        )?;
        if let (Some(p), Some(n)) = (self.heap_peak_bytes, self.heap_net_bytes) {
            write!(
                f,
                " (process heap: peak {}, net {})",
                fmt_bytes(p),
                fmt_signed_bytes(n)
            )?;
        }
        Ok(())
    }
}

/// What a measurement says when nothing could be counted.
pub const NOT_COUNTED: &str = "nothing was counted: install memsight::Allocator as the \
#[global_allocator] of this test binary (`static ALLOC: memsight::Allocator = \
memsight::Allocator::new();`)";

/// This thread's cumulative counts at one moment.
#[derive(Clone, Copy)]
struct Counts {
    allocated: u64,
    freed: u64,
    allocations: u64,
    deallocations: u64,
    reallocations: u64,
    heap: i64,
}

fn read(l: &counters::Local) -> Counts {
    let c = &l.counts;
    Counts {
        allocated: c.bytes_allocated.load(Relaxed),
        freed: c.bytes_freed.load(Relaxed),
        allocations: c.histogram.iter().map(|h| h.load(Relaxed)).sum(),
        deallocations: c.deallocs.load(Relaxed),
        reallocations: c.reallocs.load(Relaxed),
        heap: heap_live(l),
    }
}

#[cfg(feature = "jemalloc")]
fn heap_live(l: &counters::Local) -> i64 {
    crate::alloc::process_heap::thread_live(l)
}

#[cfg(not(feature = "jemalloc"))]
fn heap_live(_: &counters::Local) -> i64 {
    0
}

/// A measuring scope on the calling thread: counts from [`Scope::start`] to [`Scope::finish`].
/// Scopes nest (an inner scope's peak is within the outer's). Not `Send`: it measures its thread.
#[must_use = "a scope measures until `finish`"]
pub struct Scope {
    start: Option<Counts>,
    /// The enclosing scope's peaks, restored (raised) when this one finishes.
    outer_peaks: (i64, i64),
    _thread: PhantomData<*const ()>,
}

impl Scope {
    /// Starts measuring the calling thread.
    pub fn start() -> Scope {
        // Proves the allocator counts: one allocation must reach this thread's own block.
        let before = counters::with_own_block(|l| l.counts.bytes_allocated.load(Relaxed));
        drop(std::hint::black_box(Box::new(0u8)));
        let after = counters::with_own_block(|l| l.counts.bytes_allocated.load(Relaxed));
        let counted = matches!((before, after), (Some(b), Some(a)) if a > b);
        let started = counted
            .then(|| {
                counters::with_own_block(|l| {
                    let now = read(l);
                    let live = now.allocated.wrapping_sub(now.freed) as i64;
                    let outer = (
                        l.rust_peak.swap(live, Relaxed),
                        l.heap_peak.swap(now.heap, Relaxed),
                    );
                    l.probes.store(l.probes.load(Relaxed) + 1, Relaxed);
                    counters::probe(l);
                    (now, outer)
                })
            })
            .flatten();
        let (start, outer_peaks) = match started {
            Some((now, outer)) => (Some(now), outer),
            None => (None, (0, 0)),
        };
        Scope {
            start,
            outer_peaks,
            _thread: PhantomData,
        }
    }

    /// What the scope measured so far.
    pub fn now(&self) -> Measurement {
        let Some(start) = self.start else {
            return Measurement::default();
        };
        counters::with_own_block(|l| {
            let now = read(l);
            let live0 = start.allocated.wrapping_sub(start.freed) as i64;
            let rust_peak = l.rust_peak.load(Relaxed);
            let heap_peak = l.heap_peak.load(Relaxed).max(now.heap);
            let allocated = now.allocated.wrapping_sub(start.allocated);
            let freed = now.freed.wrapping_sub(start.freed);
            Measurement {
                allocated_bytes: allocated,
                freed_bytes: freed,
                net_bytes: allocated as i64 - freed as i64,
                peak_bytes: (rust_peak - live0).max(0) as u64,
                allocations: now.allocations - start.allocations,
                deallocations: now.deallocations - start.deallocations,
                reallocations: now.reallocations - start.reallocations,
                heap_peak_bytes: cfg!(feature = "jemalloc")
                    .then(|| (heap_peak - start.heap).max(0) as u64),
                heap_net_bytes: cfg!(feature = "jemalloc").then(|| now.heap - start.heap),
                counted: true,
            }
        })
        .unwrap_or_default()
    }

    /// Stops measuring and returns what the scope measured.
    pub fn finish(mut self) -> Measurement {
        let m = self.now();
        if self.start.take().is_some() {
            close(self.outer_peaks);
        }
        m
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.start.take().is_some() {
            close(self.outer_peaks);
        }
    }
}

/// Ends one scope on this thread: the enclosing scope's peaks are what they were, raised by this
/// one's; the thread's fast path comes back at its next call once no scope is open.
fn close(outer: (i64, i64)) {
    counters::with_own_block(|l| {
        let _ = l.rust_peak.fetch_max(outer.0, Relaxed);
        let _ = l.heap_peak.fetch_max(outer.1, Relaxed);
        l.probes
            .store(l.probes.load(Relaxed).saturating_sub(1), Relaxed);
    });
}

/// Runs `f` on the calling thread and returns its result with what it allocated.
///
/// ```
/// #[global_allocator]
/// static ALLOC: memsight::Allocator = memsight::Allocator::new();
///
/// let (_, m) = memsight::testing::measure(|| std::hint::black_box(vec![0u8; 1 << 20]).len());
/// assert_eq!(m.peak_bytes, 1 << 20);
/// assert_eq!(m.net_bytes, 0);
/// ```
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Measurement) {
    let scope = Scope::start();
    let r = f();
    (r, scope.finish())
}

/// Asserts that a [`Measurement`]'s peak is at most `limit` bytes.
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memsight::Allocator = memsight::Allocator::new();
/// let (_, m) = memsight::testing::measure(|| std::hint::black_box(vec![0u8; 4096]).len());
/// memsight::assert_peak_at_most!(m, 4096);
/// ```
#[macro_export]
macro_rules! assert_peak_at_most {
    ($m:expr, $limit:expr $(,)?) => {{
        let m: &$crate::testing::Measurement = &$m;
        let limit: u64 = $limit;
        assert!(m.counted, "{}", $crate::testing::NOT_COUNTED);
        assert!(
            m.peak_bytes <= limit,
            "memory peak {} bytes is above the limit {} bytes: {}",
            m.peak_bytes,
            limit,
            m
        );
    }};
}

/// Asserts that a [`Measurement`]'s peak lies within `[low, high]` bytes.
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memsight::Allocator = memsight::Allocator::new();
/// let (_, m) = memsight::testing::measure(|| std::hint::black_box(vec![0u8; 4096]).len());
/// memsight::assert_peak_between!(m, 4000, 5000);
/// ```
#[macro_export]
macro_rules! assert_peak_between {
    ($m:expr, $low:expr, $high:expr $(,)?) => {{
        let m: &$crate::testing::Measurement = &$m;
        let (low, high): (u64, u64) = ($low, $high);
        assert!(m.counted, "{}", $crate::testing::NOT_COUNTED);
        assert!(
            (low..=high).contains(&m.peak_bytes),
            "memory peak {} bytes is outside [{}, {}] bytes: {}",
            m.peak_bytes,
            low,
            high,
            m
        );
    }};
}

/// Asserts that a [`Measurement`] left nothing live (net bytes ≤ 0).
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memsight::Allocator = memsight::Allocator::new();
/// let (_, m) = memsight::testing::measure(|| std::hint::black_box(vec![0u8; 4096]).len());
/// memsight::assert_no_leak!(m);
/// ```
#[macro_export]
macro_rules! assert_no_leak {
    ($m:expr $(,)?) => {{
        let m: &$crate::testing::Measurement = &$m;
        assert!(m.counted, "{}", $crate::testing::NOT_COUNTED);
        assert!(m.net_bytes <= 0, "{} bytes stayed live: {}", m.net_bytes, m);
    }};
}

/// Asserts that a [`Measurement`] made at most `n` allocation calls.
///
/// ```
/// # #[global_allocator]
/// # static ALLOC: memsight::Allocator = memsight::Allocator::new();
/// let (_, m) = memsight::testing::measure(|| std::hint::black_box(vec![0u8; 4096]).len());
/// memsight::assert_allocations_at_most!(m, 1);
/// ```
#[macro_export]
macro_rules! assert_allocations_at_most {
    ($m:expr, $n:expr $(,)?) => {{
        let m: &$crate::testing::Measurement = &$m;
        let n: u64 = $n;
        assert!(m.counted, "{}", $crate::testing::NOT_COUNTED);
        assert!(
            m.allocations <= n,
            "{} allocation calls, more than {}: {}",
            m.allocations,
            n,
            m
        );
    }};
}
