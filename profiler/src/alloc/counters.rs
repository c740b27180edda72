//! Allocation counters: every thread counts in a block of its own thread-local storage; the live
//! bytes are published to one global total in batches, for the peak.
//!
//! Design (measured with `alloc-ab`, docs/benchmarks.md):
//! - Each thread owns a [`Local`] block in its thread-local storage, reached with `%fs`-relative
//!   instructions (no pointer to chase). Only the owner writes it, with plain `Relaxed` load + store
//!   (no locked instruction); readers sum the blocks of live threads through [`super::registry`],
//!   plus one [`Counts`] block shared by threads that retired or found no registry entry. Counts
//!   are therefore exact: live bytes = Σ allocated − Σ freed.
//! - The allocator counts a small call *before* forwarding it (and takes an allocation back in the
//!   rare case the inner allocator refuses it), so a deallocation ends in a tail call to the inner
//!   allocator and an allocation does no work after it returns — measured, that ordering is most of
//!   the difference between 1.0× and 1.3× of bare jemalloc.
//! - The fast path commits only while the thread's cumulative allocated (freed) bytes stay below a
//!   mark; the call that would pass it takes the slow path, which counts it after the inner call
//!   and *settles*: when the thread's unpublished live delta has reached `FLUSH_BYTES / 2` it is
//!   added to the global `LIVE` total (which raises the peaks), and both marks are placed so the
//!   unpublished delta cannot leave (−`FLUSH_BYTES`, `FLUSH_BYTES`) before the next settle. So
//!   `LIVE` is within 64 KiB per allocating thread of the truth, and **the peak's error is below
//!   64 KiB × threads that allocate**, either way; every read of the peak also raises it to the
//!   exact live bytes of that moment. Churn that frees what it allocates rarely touches `LIVE`.
//! - Near the session's peak (published live within `FLUSH_BYTES` of it) a thread's step, in
//!   both directions, is its *reach*: `PEAK_GRAIN` (4 KiB) when it arrives from far below or has
//!   just passed the peak, and a thread whose live bytes pass the peak publishes at once. So two
//!   moments that hold nearly the same heap (a forward's end and its backward's start) are told
//!   apart to a few KiB, which stamps the sampled set at the right one — frees included, so
//!   another thread's unpublished frees do not make an earlier moment look higher. Each settle
//!   near the peak that does not pass it doubles the reach, up to `FLUSH_BYTES`: a loop that
//!   comes back to the same high-water mark (churn, a steady training step) soon costs what it
//!   did, and far below the peak nothing changes.
//! - A thread's marks are zero until it is registered and after it retired, so those calls take
//!   the slow path without a separate check; there they count in the shared block with atomic
//!   read-modify-writes and publish at once: slower, still exact.
//!
//! Nothing here allocates, locks, blocks or panics; the thread-local block is a `const`
//! initialised value without `Drop`, which registers no destructor (the registry arms one
//! separately, outside the hot path).

use super::registry;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

pub use memsight_format::heap::HISTOGRAM_BUCKETS;
/// A thread publishes its live bytes once they moved this far from what it last published.
pub const FLUSH_BYTES: i64 = 64 * 1024;
/// Near the session's peak a thread whose live bytes move publishes them every this many bytes
/// (and at once when they pass the peak): two moments of a job that hold nearly the same heap (a
/// forward's end and its backward's start) are told apart to this, not to `FLUSH_BYTES` per
/// thread.
pub const PEAK_GRAIN: i64 = 4 * 1024;

/// Cumulative counters of one thread (or of the shared block). Allocation calls are the
/// histogram's sum, so the hot path touches as few fields as possible. In the declared order
/// (`repr(C)`), like [`Local`].
#[repr(C)]
pub(crate) struct Counts {
    /// Cumulative bytes allocated (growth by realloc included).
    pub(crate) bytes_allocated: AtomicU64,
    /// Cumulative bytes freed (shrinkage by realloc included).
    pub(crate) bytes_freed: AtomicU64,
    pub(crate) deallocs: AtomicU64,
    pub(crate) reallocs: AtomicU64,
    pub(crate) histogram: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Counts {
    pub(crate) const fn new() -> Self {
        Counts {
            bytes_allocated: AtomicU64::new(0),
            bytes_freed: AtomicU64::new(0),
            deallocs: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
            histogram: [const { AtomicU64::new(0) }; HISTOGRAM_BUCKETS],
        }
    }

    /// Adds these counts to `t`.
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    pub(crate) fn add_to(&self, t: &mut Totals) {
        t.allocations += self.histogram.iter().map(|h| h.load(Relaxed)).sum::<u64>();
        t.deallocations += self.deallocs.load(Relaxed);
        t.reallocations += self.reallocs.load(Relaxed);
        t.bytes_allocated += self.bytes_allocated.load(Relaxed);
        t.bytes_freed += self.bytes_freed.load(Relaxed);
    }

    /// Adds this block's histogram to `h`.
    pub(crate) fn add_histogram_to(&self, h: &mut [u64; HISTOGRAM_BUCKETS]) {
        for (dst, src) in h.iter_mut().zip(self.histogram.iter()) {
            *dst += src.load(Relaxed);
        }
    }

    /// Adds these counts to `into` atomically (folding a retiring thread into the shared block).
    fn fold_into(&self, into: &Counts) {
        let pairs = [
            (&self.bytes_allocated, &into.bytes_allocated),
            (&self.bytes_freed, &into.bytes_freed),
            (&self.deallocs, &into.deallocs),
            (&self.reallocs, &into.reallocs),
        ];
        for (from, to) in pairs
            .into_iter()
            .chain(self.histogram.iter().zip(&into.histogram))
        {
            to.fetch_add(from.load(Relaxed), Relaxed);
        }
    }
}

/// Where a thread counts.
pub(crate) mod state {
    /// Not registered yet: its first slow call registers it.
    pub const NEW: u8 = 0;
    /// Registering: calls nested inside the registration count in the shared block.
    pub const REGISTERING: u8 = 1;
    /// Counting in its own block.
    pub const REGISTERED: u8 = 2;
    /// Counting in the shared block: retired at thread exit, or no registry entry was free.
    pub const SHARED: u8 = 3;
}

/// One thread's block: its counts, the marks of the fast path and what it has published. The
/// fields are in the declared order (`repr(C)`), the fast path's first, so that a field added
/// for the slow path does not move the fast path's counters within the thread's storage (left to
/// the compiler, one did).
#[repr(C)]
pub(crate) struct Local {
    pub(crate) counts: Counts,
    /// The fast path counts an allocation only while `bytes_allocated` stays below this (0: never).
    alloc_mark: AtomicU64,
    /// The fast path counts a deallocation only while `bytes_freed` stays below this (0: never).
    free_mark: AtomicU64,
    /// The part of this thread's live bytes (allocated − freed) already added to `LIVE`.
    flushed: AtomicI64,
    /// One of [`state`]; written by the owner only.
    pub(crate) state: AtomicU8,
    /// The registry entry's index while registered.
    pub(crate) entry: AtomicU64,
    /// jemalloc's counters of this thread: its share of the process heap.
    #[cfg(feature = "jemalloc")]
    pub(crate) je: super::process_heap::JeView,
    /// This thread's heap-sample points.
    #[cfg(feature = "sampling")]
    pub(crate) sample: super::sampling::Points,
    /// Measuring scopes open on this thread (`crate::testing`): while any is, every call takes the
    /// slow path, which keeps this thread's peaks exactly.
    pub(crate) probes: AtomicU32,
    /// The highest of this thread's Rust live bytes (allocated − freed) while measured.
    pub(crate) rust_peak: AtomicI64,
    /// The highest of this thread's process-heap live bytes (jemalloc's counters of it) while
    /// measured.
    pub(crate) heap_peak: AtomicI64,
    /// This thread's step near the session's peak (off the fast path's lines).
    peak_reach: AtomicI64,
}

impl Local {
    const fn new() -> Self {
        Local {
            counts: Counts::new(),
            alloc_mark: AtomicU64::new(0),
            free_mark: AtomicU64::new(0),
            flushed: AtomicI64::new(0),
            state: AtomicU8::new(state::NEW),
            entry: AtomicU64::new(0),
            #[cfg(feature = "jemalloc")]
            je: super::process_heap::JeView::new(),
            #[cfg(feature = "sampling")]
            sample: super::sampling::Points::new(),
            probes: AtomicU32::new(0),
            rust_peak: AtomicI64::new(0),
            heap_peak: AtomicI64::new(0),
            peak_reach: AtomicI64::new(PEAK_GRAIN),
        }
    }

    /// Sends every later call of this thread to the slow path (registration failed, retiring, or
    /// measured by a scope).
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    fn close_fast_path(&self) {
        self.alloc_mark.store(0, Relaxed);
        self.free_mark.store(0, Relaxed);
    }

    /// Live bytes counted here and not yet added to `LIVE`; marks them published.
    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    fn take_unpublished(&self) -> i64 {
        let live = self.live();
        live - self.flushed.swap(live, Relaxed)
    }

    #[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
    pub(crate) fn live(&self) -> i64 {
        let a = self.counts.bytes_allocated.load(Relaxed);
        a.wrapping_sub(self.counts.bytes_freed.load(Relaxed)) as i64
    }
}

thread_local! {
    /// This thread's block.
    static LOCAL: Local = const { Local::new() };
}

/// Keeps the process's C allocation functions (`super::interpose`) in every binary that counts:
/// this object refers to them, so the linker takes theirs too.
#[cfg(feature = "jemalloc")]
#[used]
static LINK_INTERPOSE: super::interpose::Linked = super::interpose::LINKED;

/// Counts of retired threads and of threads without an entry, updated atomically.
pub(crate) static SHARED: Counts = Counts::new();

/// Published live bytes (Σ published deltas) when these counters are the process heap (no
/// `jemalloc` feature). Exact live bytes come from the sums.
#[cfg(not(feature = "jemalloc"))]
static LIVE: AtomicI64 = AtomicI64::new(0);

/// Which peak tracker: the resettable process peak, the current step window, and the session's
/// peak (reset only when a session finishes: the report's). Phases have windows of their own, one
/// per thread with open phases ([`PHASE_WINDOWS`]).
#[derive(Clone, Copy)]
pub(crate) enum Tracker {
    Global = 0,
    Step = 1,
    Run = 2,
}
static PEAKS: [AtomicI64; 3] = [const { AtomicI64::new(0) }; 3];

/// The phase peak windows of the process heap, one per thread with open phases.
pub(crate) static PHASE_WINDOWS: crate::sys::PeakWindows = crate::sys::PeakWindows::new();

#[inline(always)]
fn bucket_of(size: usize) -> usize {
    (usize::BITS - size.leading_zeros()) as usize
}

/// Adds `by` to an owner-only counter without a locked instruction; returns the new value.
#[inline(always)]
fn bump(c: &AtomicU64, by: u64) -> u64 {
    let v = c.load(Relaxed).wrapping_add(by);
    c.store(v, Relaxed);
    v
}

/// Runs `f` on this thread's block (not at all once its storage is gone).
#[cfg(feature = "sampling")]
#[inline(always)]
pub(crate) fn with_local(f: impl FnOnce(&Local)) {
    let _ = LOCAL.try_with(f);
}

/// `f` of this thread's block, or `otherwise` once its storage is gone.
#[cfg(feature = "sampling")]
#[inline(always)]
pub(crate) fn with_local_or<R>(otherwise: R, f: impl FnOnce(&Local) -> R) -> R {
    LOCAL.try_with(f).unwrap_or(otherwise)
}

/// This thread's registry entry while it counts in its own block (the heap sampler's records go
/// to that entry's pool).
#[cfg(feature = "sampling")]
#[inline]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn own_entry() -> Option<usize> {
    with_local_or(None, |l| {
        (l.state.load(Relaxed) == state::REGISTERED).then(|| l.entry.load(Relaxed) as usize)
    })
}

/// Registers this thread's block (its first slow call does): takes its jemalloc counters, then a
/// registry entry; `false` when it counts in the shared blocks instead.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn register_this(l: &Local) -> bool {
    #[cfg(feature = "jemalloc")]
    super::process_heap::attach(&l.je);
    registry::register(l)
}

/// Raises every peak tracker to `live` (published process-heap bytes).
#[inline]
pub(crate) fn raise_peaks(live: i64) {
    // A new peak of the session: the sampled set live now is the set at the peak.
    #[cfg(feature = "sampling")]
    if live > PEAKS[Tracker::Run as usize].load(Relaxed) {
        super::sample_table::note_peak();
    }
    for p in &PEAKS {
        if live > p.load(Relaxed) {
            p.fetch_max(live, Relaxed);
        }
    }
    PHASE_WINDOWS.raise(live);
}

/// Adds `d` to the published live bytes and raises the peaks when it grew — when these counters
/// are the process heap. With the `jemalloc` feature the process heap publishes its own deltas
/// (`process_heap`), and Rust's share publishes nothing.
#[inline]
pub(crate) fn publish(d: i64) {
    #[cfg(not(feature = "jemalloc"))]
    {
        let global = LIVE.fetch_add(d, Relaxed) + d;
        if d > 0 {
            raise_peaks(global);
        } else if global < -FLUSH_BYTES {
            absorb_unseen_frees(global);
        }
    }
    #[cfg(feature = "jemalloc")]
    let _ = d;
}

/// Bytes freed through the counted `free` that were never counted as allocated (allocated before
/// the wrapping library loaded, or through `__libc_malloc`), as far as they pushed the published
/// live total below what the threads' unpublished deltas explain. Added back to every live figure.
#[cfg(not(feature = "jemalloc"))]
static UNSEEN_FREED: AtomicU64 = AtomicU64::new(0);

/// The published live total is `global`, below zero: beyond what unpublished deltas can explain
/// (each thread holds less than `FLUSH_BYTES`), the frees were of blocks never counted. Sets the
/// total back to zero and keeps the difference, so a later allocation's peak is not hidden by them.
#[cfg(not(feature = "jemalloc"))]
#[cold]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn absorb_unseen_frees(global: i64) {
    let slack = FLUSH_BYTES.saturating_mul(super::registry::entries_used() as i64 + 1);
    if global >= -slack {
        return;
    }
    let mut now = global;
    while now < -slack {
        match LIVE.compare_exchange_weak(now, 0, Relaxed, Relaxed) {
            Ok(_) => {
                UNSEEN_FREED.fetch_add(now.unsigned_abs(), Relaxed);
                return;
            }
            Err(seen) => now = seen,
        }
    }
}

/// Bytes freed that were never seen allocated (see `UNSEEN_FREED`); zero with the `jemalloc`
/// feature, where jemalloc's own counters are read.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn unseen_freed() -> u64 {
    #[cfg(not(feature = "jemalloc"))]
    return UNSEEN_FREED.load(Relaxed);
    #[cfg(feature = "jemalloc")]
    0
}

/// Counts an allocation of `size` bytes before it happens, when that keeps this thread below its
/// mark; `false` when nothing was counted and the caller must allocate first and then call
/// [`on_alloc`]. A counted allocation that then fails is taken back with
/// [`alloc_failed_after_count`].
#[inline(always)]
pub(crate) fn alloc_fast(size: usize) -> bool {
    LOCAL
        .try_with(|l| {
            let a = l
                .counts
                .bytes_allocated
                .load(Relaxed)
                .wrapping_add(size as u64);
            if a >= l.alloc_mark.load(Relaxed) {
                return false;
            }
            l.counts.bytes_allocated.store(a, Relaxed);
            bump(&l.counts.histogram[bucket_of(size)], 1);
            true
        })
        .unwrap_or(false)
}

/// Counts a deallocation of `size` bytes before it happens, when that keeps this thread below its
/// mark; `false` when nothing was counted and the caller must call [`on_dealloc`].
#[inline(always)]
pub(crate) fn dealloc_fast(size: usize) -> bool {
    LOCAL
        .try_with(|l| {
            let f = l.counts.bytes_freed.load(Relaxed).wrapping_add(size as u64);
            if f >= l.free_mark.load(Relaxed) {
                return false;
            }
            l.counts.bytes_freed.store(f, Relaxed);
            bump(&l.counts.deallocs, 1);
            true
        })
        .unwrap_or(false)
}

/// Takes back an allocation that [`alloc_fast`] counted and the inner allocator then refused.
#[cold]
#[inline(never)]
pub(crate) fn alloc_failed_after_count(size: usize) {
    let _ = LOCAL.try_with(|l| {
        bump(&l.counts.bytes_allocated, (size as u64).wrapping_neg());
        bump(&l.counts.histogram[bucket_of(size)], u64::MAX);
    });
}

/// Folds this thread's block into the shared one and releases its registry entry; its later calls
/// (other thread-local destructors) count in the shared block. Called by the registry's exit hook.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn retire_this_thread() {
    let _ = LOCAL.try_with(|l| {
        if l.state.load(Relaxed) != state::REGISTERED {
            return;
        }
        l.state.store(state::SHARED, Relaxed);
        l.close_fast_path();
        #[cfg(feature = "sampling")]
        super::sample_heap::retire_thread(l);
        registry::release(l.entry.load(Relaxed) as usize, || {
            l.counts.fold_into(&SHARED);
            publish(l.take_unpublished());
            #[cfg(feature = "jemalloc")]
            super::process_heap::retire(l);
        });
    });
}

/// Which call a slow-path record is for.
#[derive(Clone, Copy)]
enum Call {
    Alloc(usize),
    Dealloc,
    Realloc,
}

/// Records an allocation of `size` bytes that has happened and that the fast path did not count.
#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn on_alloc(size: usize) {
    record(size as i64, Call::Alloc(size));
}

/// Records a deallocation of `size` bytes that the fast path did not count.
#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn on_dealloc(size: usize) {
    record(-(size as i64), Call::Dealloc);
}

/// Counts a reallocation from `old` to `new` bytes when that keeps this thread below its mark;
/// `false` when nothing was counted and the caller must call [`realloc_slow`].
#[inline(always)]
pub(crate) fn realloc_fast(old: usize, new: usize) -> bool {
    LOCAL
        .try_with(|l| {
            let (bytes, mark, by) = if new >= old {
                (&l.counts.bytes_allocated, &l.alloc_mark, new - old)
            } else {
                (&l.counts.bytes_freed, &l.free_mark, old - new)
            };
            let v = bytes.load(Relaxed).wrapping_add(by as u64);
            if v >= mark.load(Relaxed) {
                return false;
            }
            bytes.store(v, Relaxed);
            bump(&l.counts.reallocs, 1);
            true
        })
        .unwrap_or(false)
}

/// Takes back a reallocation that [`realloc_fast`] counted and the inner allocator then refused.
#[cold]
#[inline(never)]
pub(crate) fn realloc_failed_after_count(old: usize, new: usize) {
    let _ = LOCAL.try_with(|l| {
        let (bytes, by) = if new >= old {
            (&l.counts.bytes_allocated, new - old)
        } else {
            (&l.counts.bytes_freed, old - new)
        };
        bump(bytes, (by as u64).wrapping_neg());
        bump(&l.counts.reallocs, u64::MAX);
    });
}

/// Records a reallocation from `old` to `new` bytes that the fast path did not count.
#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn realloc_slow(old: usize, new: usize) {
    record(new as i64 - old as i64, Call::Realloc);
}

/// The slow path: counts the call in this thread's block and settles (registering the thread on
/// its first call), or counts it in the shared block and publishes at once.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn record(delta: i64, call: Call) {
    let done = LOCAL
        .try_with(|l| {
            let own = match l.state.load(Relaxed) {
                state::REGISTERED => true,
                state::NEW => register_this(l),
                _ => false,
            };
            if own {
                count(&l.counts, delta, call, |c, by| {
                    bump(c, by);
                });
                settle(l);
            } else {
                #[cfg(feature = "jemalloc")]
                if l.state.load(Relaxed) == state::SHARED {
                    super::process_heap::fold_shared(l);
                }
            }
            own
        })
        .unwrap_or(false);
    if !done {
        count(&SHARED, delta, call, |c, by| {
            c.fetch_add(by, Relaxed);
        });
        publish(delta);
    }
}

/// Adds one call to `counts` with `add` (plain for a thread's own block, atomic for the shared one).
#[inline(always)]
fn count(counts: &Counts, delta: i64, call: Call, add: impl Fn(&AtomicU64, u64)) {
    match call {
        Call::Alloc(size) => add(&counts.histogram[bucket_of(size)], 1),
        Call::Dealloc => add(&counts.deallocs, 1),
        Call::Realloc => add(&counts.reallocs, 1),
    }
    if delta >= 0 {
        add(&counts.bytes_allocated, delta as u64);
    } else {
        add(&counts.bytes_freed, delta.unsigned_abs());
    }
}

/// Settles this thread's Rust counters (and, with the `jemalloc` feature, its view of the process
/// heap), and lowers the allocation mark to the next heap-sample point, so that the allocation
/// that reaches it takes the slow path, where it is sampled.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
fn settle(l: &Local) {
    let allocated = l.counts.bytes_allocated.load(Relaxed);
    settle_marks(
        allocated,
        l.counts.bytes_freed.load(Relaxed),
        Marks {
            flushed: &l.flushed,
            alloc: &l.alloc_mark,
            free: &l.free_mark,
            peak_reach: &l.peak_reach,
        },
        rust_peak_gap,
        publish,
    );
    #[cfg(feature = "jemalloc")]
    {
        let point = l.sample.rust_point(allocated);
        if point < l.alloc_mark.load(Relaxed) {
            l.alloc_mark.store(point, Relaxed);
        }
        super::process_heap::settle(l);
    }
    if l.probes.load(Relaxed) != 0 {
        probe(l);
    }
}

/// A measured thread after a settle: raises its peaks to its live bytes now and sends its next
/// call to the slow path again (both its Rust marks and its process-heap marks), so that every
/// call of the thread passes here while it is measured.
#[cold]
#[inline(never)]
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn probe(l: &Local) {
    let live = l.live();
    if live > l.rust_peak.load(Relaxed) {
        l.rust_peak.store(live, Relaxed);
    }
    #[cfg(feature = "jemalloc")]
    {
        let heap = super::process_heap::thread_live(l);
        if heap > l.heap_peak.load(Relaxed) {
            l.heap_peak.store(heap, Relaxed);
        }
        super::process_heap::close_marks(l);
    }
    l.close_fast_path();
}

/// This thread's counters, for a measuring scope (`crate::testing`): `None` when the thread counts
/// in the shared block (no registry entry) or its storage is gone. Registers the thread first.
pub(crate) fn with_own_block<R>(f: impl FnOnce(&Local) -> R) -> Option<R> {
    LOCAL
        .try_with(|l| {
            if l.state.load(Relaxed) == state::NEW && register_this(l) {
                settle(l);
            }
            (l.state.load(Relaxed) == state::REGISTERED).then(|| f(l))
        })
        .ok()
        .flatten()
}

/// A thread's publishing state for one pair of cumulative counters.
pub(crate) struct Marks<'a> {
    /// The part of the live bytes already published.
    pub(crate) flushed: &'a AtomicI64,
    /// The allocated count past which the thread settles again.
    pub(crate) alloc: &'a AtomicU64,
    /// The freed count past which the thread settles again.
    pub(crate) free: &'a AtomicU64,
    /// The thread's step near the session's peak.
    pub(crate) peak_reach: &'a AtomicI64,
}

/// The session's peak minus the published live bytes `live`: how far the process heap is below
/// its peak, as far as published.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn peak_gap(live: i64) -> i64 {
    PEAKS[Tracker::Run as usize]
        .load(Relaxed)
        .saturating_sub(live)
}

/// [`peak_gap`] of the Rust counters: of `LIVE` when they are the process heap. With the
/// `jemalloc` feature the process heap's: the Rust counters publish nothing then, but their slow
/// path is where a Rust allocation settles the process heap, so near its peak they must settle
/// as often.
fn rust_peak_gap() -> i64 {
    #[cfg(not(feature = "jemalloc"))]
    return peak_gap(LIVE.load(Relaxed));
    #[cfg(feature = "jemalloc")]
    super::process_heap::peak_gap()
}

/// Publishes the unpublished live delta of cumulative `allocated` and `freed` when it reached half
/// of the thread's step or took the heap past the session's peak (`gap()` below it, as
/// published), and places the marks where the delta would reach ± the step by allocations or
/// frees alone — the one rule of both the Rust counters and the process heap. The step is
/// `FLUSH_BYTES`, and near the peak the thread's reach (see the module's design notes).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn settle_marks(
    allocated: u64,
    freed: u64,
    m: Marks,
    gap: impl FnOnce() -> i64,
    publish: impl FnOnce(i64),
) {
    let live = allocated.wrapping_sub(freed) as i64;
    let mut d = live.wrapping_sub(m.flushed.load(Relaxed));
    let mut gap = gap();
    let reach = m.peak_reach.load(Relaxed).max(PEAK_GRAIN);
    let step = if gap < FLUSH_BYTES {
        reach
    } else {
        FLUSH_BYTES
    };
    let passed = d > 0 && d > gap;
    if passed || d.abs() >= step / 2 {
        m.flushed.store(live, Relaxed);
        publish(d);
        // A delta that passed the peak raised it to the published total.
        gap = gap.saturating_sub(d).max(0);
        d = 0;
    }
    // Near the peak: fine once the heap passed it, coarser each time it came back without.
    let near = gap < FLUSH_BYTES;
    let next = if near && !passed {
        (reach * 2).min(FLUSH_BYTES)
    } else {
        PEAK_GRAIN
    };
    m.peak_reach.store(next, Relaxed);
    let step = if near { next } else { FLUSH_BYTES };
    m.alloc
        .store(allocated.wrapping_add((step - d) as u64), Relaxed);
    m.free.store(freed.wrapping_add((step + d) as u64), Relaxed);
}

/// Totals summed over every thread at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Allocation calls (alloc + alloc_zeroed).
    pub allocations: u64,
    /// Deallocation calls.
    pub deallocations: u64,
    /// Reallocation calls.
    pub reallocations: u64,
    /// Cumulative bytes handed out (reallocation growth included).
    pub bytes_allocated: u64,
    /// Cumulative bytes returned (reallocation shrinkage included).
    pub bytes_freed: u64,
}

impl Totals {
    /// Bytes currently live: allocated − freed.
    pub fn live(&self) -> u64 {
        self.bytes_allocated.saturating_sub(self.bytes_freed)
    }
}

/// Sums the counters of every thread.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn totals() -> Totals {
    let mut t = Totals::default();
    registry::for_each_block(|c| c.add_to(&mut t));
    t
}

/// Live bytes of the process heap now (exact): jemalloc's counters of every thread with the
/// `jemalloc` feature, these counters (Rust's allocations) without it.
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn heap_live() -> u64 {
    #[cfg(feature = "jemalloc")]
    let (allocated, freed) = super::process_heap::totals();
    #[cfg(not(feature = "jemalloc"))]
    let Totals {
        bytes_allocated: allocated,
        bytes_freed: freed,
        ..
    } = totals();
    allocated
        .saturating_add(unseen_freed())
        .saturating_sub(freed)
}

/// Allocation counts per power-of-two size bucket, summed over threads.
pub(crate) fn histogram() -> [u64; HISTOGRAM_BUCKETS] {
    let mut h = [0u64; HISTOGRAM_BUCKETS];
    registry::for_each_block(|c| c.add_histogram_to(&mut h));
    h
}

/// Reads a peak tracker, first raising every tracker to the exact current live bytes (an exact
/// observation belongs to all open windows, so the windows never lag the global peak).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn peak(tracker: Tracker, live_now: u64) -> u64 {
    raise_peaks(live_now as i64);
    PEAKS[tracker as usize].load(Relaxed).max(0) as u64
}

/// Sets a peak tracker to `value` and returns what it held (raised to `value` if lower).
#[cfg_attr(not(feature = "jemalloc"), link_section = ".text.hot.memsight")]
pub(crate) fn swap_peak(tracker: Tracker, value: u64) -> u64 {
    PEAKS[tracker as usize]
        .swap(value as i64, Relaxed)
        .max(value as i64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(2), 2);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 3);
        assert_eq!(bucket_of(1024), 11);
        assert_eq!(bucket_of(usize::MAX), HISTOGRAM_BUCKETS - 1);
    }
}
