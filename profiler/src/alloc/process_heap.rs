//! The process heap: every byte jemalloc serves in the process — Rust's allocations through the
//! allocator, C and C++ code's through the `malloc` family that `super::interpose` defines — read
//! from jemalloc's own per-thread counters instead of counted a second time.
//!
//! jemalloc bumps two counters in each thread's storage on every allocation and free, fast paths
//! included, by the usable size (`thread.allocatedp` / `thread.deallocatedp`; its event machinery
//! needs them anyway). A thread's block ([`JeView`], inside its `counters::Local`) holds pointers
//! to its two counters, taken when the thread registers; readers sum them over the registered
//! threads (plus the shared totals of threads that retired or found no registry entry), so the
//! live bytes are exact: Σ allocated − Σ freed.
//!
//! The peak works as the Rust counters' does (see `counters`): a thread publishes its live delta
//! to [`PROCESS_LIVE`] once it moved by `FLUSH_BYTES / 2`, which raises the peak trackers, and
//! sets marks where the delta would reach ±`FLUSH_BYTES`. A C call checks its thread's counter
//! against the mark *after* jemalloc returns — two loads and a compare, no call — and the Rust
//! path settles this view in its own slow path, which runs at least every `FLUSH_BYTES` of Rust
//! allocations (requested bytes: jemalloc's usable sizes are larger, by up to 25% for sizes from
//! 128 bytes, more for tiny or over-aligned ones). So the published total is within `FLUSH_BYTES`
//! per allocating thread of the truth for C code's calls, and within `FLUSH_BYTES` times the
//! usable/requested ratio for a thread's Rust calls (about 80 KiB for allocations of 128 bytes
//! and more); every read raises the peaks to the exact live bytes of that moment.
//!
//! Nothing here allocates, locks (beyond the registry's reader lock, which the allocation path
//! never takes), blocks or panics.

use super::counters::{self, state, Local, Marks};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, Ordering::Relaxed};

/// What a thread's counter pointers point at before it registers: a counter that never moves, so
/// that its marks (0) send its first call to the slow path.
static NO_COUNTER: AtomicU64 = AtomicU64::new(0);

/// One thread's view of jemalloc's counters of it, and its marks.
pub(crate) struct JeView {
    /// jemalloc's count of bytes this thread allocated (usable sizes, cumulative).
    allocated: AtomicPtr<u64>,
    /// jemalloc's count of bytes this thread freed.
    freed: AtomicPtr<u64>,
    /// A C allocation checks `*allocated` against this (0: always the slow path).
    alloc_mark: AtomicU64,
    /// A C free checks `*freed` against this (0: always the slow path).
    free_mark: AtomicU64,
    /// The part of this thread's live bytes already added to [`PROCESS_LIVE`].
    flushed: AtomicI64,
    /// For a thread counting in the shared totals: what of `*allocated` and `*freed` they hold.
    folded: [AtomicU64; 2],
    /// This thread's step near the session's peak.
    peak_reach: AtomicI64,
}

impl JeView {
    pub(crate) const fn new() -> Self {
        let none = NO_COUNTER.as_ptr();
        JeView {
            allocated: AtomicPtr::new(none),
            freed: AtomicPtr::new(none),
            alloc_mark: AtomicU64::new(0),
            free_mark: AtomicU64::new(0),
            flushed: AtomicI64::new(0),
            folded: [const { AtomicU64::new(0) }; 2],
            peak_reach: AtomicI64::new(counters::PEAK_GRAIN),
        }
    }

    /// jemalloc's (allocated, freed) for this view's thread; safe to call from another thread
    /// while the registry holds that thread's entry.
    fn read(&self) -> (u64, u64) {
        // SAFETY: each pointer is `NO_COUNTER` or a counter in a live thread's jemalloc storage
        // (8-byte aligned); jemalloc's owner-thread stores are single aligned writes.
        unsafe {
            (
                AtomicU64::from_ptr(self.allocated.load(Relaxed)).load(Relaxed),
                AtomicU64::from_ptr(self.freed.load(Relaxed)).load(Relaxed),
            )
        }
    }
}

/// Published live bytes of the process heap (Σ published deltas).
static PROCESS_LIVE: AtomicI64 = AtomicI64::new(0);
/// What retired threads, and threads without a registry entry, allocated and freed.
static RETIRED: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

/// Takes the pointers to this thread's jemalloc counters (its first slow call does, before it
/// registers). The first `mallctl` of the process initialises jemalloc's tables, which must not
/// happen inside jemalloc's own initialisation ([`start_jemalloc`] does it first).
pub(crate) fn attach(v: &JeView) {
    if let (Some(a), Some(f)) = (
        counter(c"thread.allocatedp"),
        counter(c"thread.deallocatedp"),
    ) {
        v.allocated.store(a, Relaxed);
        v.freed.store(f, Relaxed);
    }
}

/// True while [`start_jemalloc`] initialises jemalloc: calls nested in that initialisation leave
/// their thread unregistered (jemalloc's own counters hold what they allocate; the thread's next
/// slow call registers it and adopts them).
static STARTING: AtomicBool = AtomicBool::new(false);

/// Initialises jemalloc and its `mallctl` tables at a moment when no jemalloc lock is held: the
/// pre-initialiser calls it once `MALLOC_CONF` is handed over. With `background_thread:true`,
/// jemalloc's initialisation creates its background thread holding its background-thread lock;
/// `pthread_create` allocates the new thread's TLS through our `calloc` on the calling thread, and
/// that call's registration (its first `mallctl` initialises the tables, which read the
/// background threads' statistics under that same lock) deadlocked every program at start-up.
/// (`.preinit_array` runs in executables only: memsight built with jemalloc into a shared library
/// still meets this under `background_thread:true`.)
pub(crate) fn start_jemalloc() {
    STARTING.store(true, Relaxed);
    let _ = counter(c"thread.allocatedp");
    STARTING.store(false, Relaxed);
}

/// Set by the executable's pre-initialiser (`super::interpose`): this program is one that memsight
/// starts with — started again, it runs memsight's pre-initialiser before anything else.
static PREINIT_RAN: AtomicBool = AtomicBool::new(false);

/// Set in the environment of the job's executable started again by a session to symbolize its heap
/// profiles outside the job (`crate::heapprof`'s report section): its pre-initialiser then serves
/// that request (`super::interpose`) and exits.
#[cfg(feature = "symbolize")]
pub(crate) const SYMBOLIZING_CHILD_ENV: &str = "MEMSIGHT_SYMBOLIZE_CHILD";

/// The symbolizing child's request, JSON on its standard input: the profiles and the report's
/// directory (its answer, on its standard output: the report's heap-profile section).
#[cfg(feature = "symbolize")]
pub(crate) type SymbolizeRequest = (
    Vec<memsight_format::heap_profile::DumpRecord>,
    std::path::PathBuf,
);

/// Notes that the executable's pre-initialiser runs (called from it).
pub(crate) fn note_preinit() {
    PREINIT_RAN.store(true, Relaxed);
}

/// Whether this program's executable runs memsight's pre-initialiser (memsight is linked into it,
/// not into a shared library it loaded).
#[cfg(feature = "symbolize")]
pub(crate) fn preinit_ran() -> bool {
    PREINIT_RAN.load(Relaxed)
}

/// The address of one of jemalloc's per-thread counters, by `mallctl` name.
fn counter(name: &std::ffi::CStr) -> Option<*mut u64> {
    let mut p: *mut u64 = std::ptr::null_mut();
    let mut len = std::mem::size_of::<*mut u64>();
    // SAFETY: the name is NUL-terminated; `p` and `len` describe a pointer-sized output.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut p).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0 && !p.is_null()).then_some(p)
}

/// Before a C allocation of `size` bytes: whether it keeps this thread's allocated bytes below
/// its mark and its C heap-sample stream below the next sample point, so the call can go straight
/// to jemalloc (its bytes then join the stream); otherwise the caller takes the slow path (which
/// may sample) and calls [`after_alloc`]. (jemalloc counts the usable size, at most a size class
/// above `size`; what that leaves past the mark, the thread's next call sees.)
#[inline(always)]
pub(crate) fn alloc_fits(size: usize) -> bool {
    counters::with_local_or(false, |l| {
        let v = &l.je;
        // SAFETY: see `JeView::read`; this is the owner thread.
        let after = unsafe { *v.allocated.load(Relaxed) }.saturating_add(size as u64);
        after < v.alloc_mark.load(Relaxed) && stream_takes(l, size)
    })
}

/// Adds `size` bytes to this thread's C heap-sample stream when they stay below the next sample
/// point; `false` (nothing added) when the call must take the sampler's slow path.
#[inline(always)]
pub(crate) fn c_stream_fits(size: usize) -> bool {
    counters::with_local_or(false, |l| stream_takes(l, size))
}

#[inline(always)]
fn stream_takes(l: &Local, size: usize) -> bool {
    l.sample.c_stream_takes(size)
}

/// After a C allocation that [`alloc_fits`] refused: registers, settles or folds.
#[inline(always)]
pub(crate) fn after_alloc() {
    counters::with_local(slow);
}

/// After a C free: settles when this thread's freed bytes passed its mark.
#[inline(always)]
pub(crate) fn after_free() {
    counters::with_local(|l| {
        let v = &l.je;
        // SAFETY: as in `after_alloc`.
        if unsafe { *v.freed.load(Relaxed) } >= v.free_mark.load(Relaxed) {
            slow(l);
        }
    });
}

/// After a C call that may both allocate and free (`realloc`).
#[inline(always)]
pub(crate) fn after_realloc() {
    counters::with_local(|l| {
        let (a, f) = l.je.read();
        if a >= l.je.alloc_mark.load(Relaxed) || f >= l.je.free_mark.load(Relaxed) {
            slow(l);
        }
    });
}

/// The slow path of a C call: registers the thread on its first call, settles a registered
/// thread, folds a shared one's progress into the shared totals.
#[cold]
#[inline(never)]
fn slow(l: &Local) {
    // `free` keeps errno and `posix_memalign` does not set it: registration may touch it.
    // SAFETY: the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    slow_path(l);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn slow_path(l: &Local) {
    match l.state.load(Relaxed) {
        state::NEW if STARTING.load(Relaxed) => {}
        state::NEW => {
            if counters::register_this(l) {
                settle(l);
            } else {
                fold_shared(l);
            }
        }
        state::REGISTERED => {
            settle(l);
            if l.probes.load(Relaxed) != 0 {
                counters::probe(l);
            }
        }
        // Calls made while registering: jemalloc's counters hold them, the registration adopts
        // them.
        state::REGISTERING => {}
        _ => fold_shared(l),
    }
}

/// Publishes this thread's live delta when it reached half of `FLUSH_BYTES` and places the marks
/// where it would reach ±`FLUSH_BYTES` (a registered thread; the Rust path's slow path calls it
/// too).
pub(crate) fn settle(l: &Local) {
    let v = &l.je;
    let (a, f) = v.read();
    let marks = Marks {
        flushed: &v.flushed,
        alloc: &v.alloc_mark,
        free: &v.free_mark,
        peak_reach: &v.peak_reach,
    };
    counters::settle_marks(a, f, marks, peak_gap, publish);
}

/// This thread's live bytes in jemalloc's counters of it (allocated − freed, usable sizes).
pub(crate) fn thread_live(l: &Local) -> i64 {
    let (a, f) = l.je.read();
    a.wrapping_sub(f) as i64
}

/// Sends this thread's next C call to the slow path (a measured thread).
pub(crate) fn close_marks(l: &Local) {
    l.je.alloc_mark.store(0, Relaxed);
    l.je.free_mark.store(0, Relaxed);
}

/// Adds what a thread counting in the shared totals allocated and freed since its last call.
pub(crate) fn fold_shared(l: &Local) {
    let (a, f) = l.je.read();
    let mut new = [0u64; 2];
    for (i, now) in [a, f].into_iter().enumerate() {
        // jemalloc's counters only grow: the difference is what this thread did since.
        new[i] = now.wrapping_sub(l.je.folded[i].swap(now, Relaxed));
        RETIRED[i].fetch_add(new[i], Relaxed);
    }
    publish(new[0].wrapping_sub(new[1]) as i64);
}

/// Moves a retiring thread's counts into the shared totals (under the registry lock, so readers
/// see them in one place or the other) and publishes what it had not.
pub(crate) fn retire(l: &Local) {
    let v = &l.je;
    let (a, f) = v.read();
    for ((now, folded), shared) in [a, f].into_iter().zip(&v.folded).zip(&RETIRED) {
        folded.store(now, Relaxed);
        shared.fetch_add(now, Relaxed);
    }
    v.alloc_mark.store(0, Relaxed);
    v.free_mark.store(0, Relaxed);
    let live = a.wrapping_sub(f) as i64;
    publish(live.wrapping_sub(v.flushed.swap(live, Relaxed)));
}

/// How far the process heap is below the session's peak, as far as published.
pub(crate) fn peak_gap() -> i64 {
    counters::peak_gap(PROCESS_LIVE.load(Relaxed))
}

fn publish(d: i64) {
    let total = PROCESS_LIVE.fetch_add(d, Relaxed).wrapping_add(d);
    if d > 0 {
        counters::raise_peaks(total);
    }
}

/// Cumulative (allocated, freed) bytes of the process heap, summed over every thread.
pub(crate) fn totals() -> (u64, u64) {
    super::registry::fold_threads(
        || (RETIRED[0].load(Relaxed), RETIRED[1].load(Relaxed)),
        |(a, f), l| {
            let (ta, tf) = l.je.read();
            (a.wrapping_add(ta), f.wrapping_add(tf))
        },
    )
}
