//! Tensor-byte counters: what a tensor backend (libtorch's CPU allocator hook) reports, kept apart
//! from the heap counters so "tensor bytes" is a series of its own beside "other heap".
//!
//! [`tensor_alloc`] and [`tensor_free`] are called from inside the backend's allocator: they only
//! touch atomics (no allocation, no lock, no panic). Peak windows for phases and steps mirror the
//! heap counters' windows (see `phases.rs`).

pub use memsight_format::device::TensorStats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

static ENABLED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static STEP_PEAK: AtomicU64 = AtomicU64::new(0);
/// The phase peak windows of tensor bytes, under the same indices as the heap's
/// (`counters::PHASE_WINDOWS`): one per thread with open phases.
pub(crate) static PHASE_WINDOWS: crate::sys::PeakWindows = crate::sys::PeakWindows::new();

/// Marks the tensor series as present (a backend is installed); snapshots then carry it.
pub fn enable() {
    ENABLED.store(true, Relaxed);
}

/// True once a tensor backend is installed.
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Records a tensor storage allocation of `bytes`. Allocation-free and lock-free.
#[inline]
pub fn tensor_alloc(bytes: u64) {
    let live = LIVE.fetch_add(bytes, Relaxed).wrapping_add(bytes);
    raise(&PEAK, live);
    PHASE_WINDOWS.raise(live as i64);
    raise(&STEP_PEAK, live);
    ALLOCS.fetch_add(1, Relaxed);
}

/// `fetch_max` is a compare-exchange loop that always writes; most allocations are below the
/// peak, so a plain load first keeps them to one read of the shared line.
#[inline]
fn raise(peak: &AtomicU64, live: u64) {
    if live > peak.load(Relaxed) {
        peak.fetch_max(live, Relaxed);
    }
}

/// Records the free of a tensor storage block of `bytes`. Allocation-free and lock-free.
#[inline]
pub fn tensor_free(bytes: u64) {
    // Saturating: a block allocated before the counters were reset cannot drive them negative.
    let _ = LIVE.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(bytes)));
    FREES.fetch_add(1, Relaxed);
}

/// The counters now, or `None` when no tensor backend is installed.
pub fn stats() -> Option<TensorStats> {
    enabled().then(|| TensorStats {
        live_bytes: LIVE.load(Relaxed),
        peak_bytes: PEAK.load(Relaxed),
        allocs: ALLOCS.load(Relaxed),
        frees: FREES.load(Relaxed),
    })
}

/// Restarts the peak at the current live bytes.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
}

/// Starts the step window at the current live bytes and returns the old window's peak.
pub(crate) fn swap_step_window() -> u64 {
    STEP_PEAK.swap(LIVE.load(Relaxed), Relaxed)
}

/// The current step window's peak.
pub(crate) fn step_window_peak() -> u64 {
    STEP_PEAK.load(Relaxed).max(LIVE.load(Relaxed))
}

/// Live tensor bytes now.
pub(crate) fn live() -> u64 {
    LIVE.load(Relaxed)
}
