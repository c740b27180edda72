//! Allocation counters: per-thread exclusive slots plus a batched global live total for the peak.
//!
//! Design (measured in `../shared/notes/crates.md` §3, variants b2 + c):
//! - Every thread owns one cache-padded [`Slot`] out of a fixed static array. Only the owner writes
//!   it, with plain `Relaxed` load + store (no LOCK-prefixed instruction on the hot path); readers
//!   sum all slots. Cumulative counters (bytes allocated / freed, counts, histogram) are therefore
//!   exact: live bytes = Σ allocated − Σ freed.
//! - For the peak each slot keeps its unflushed delta (`live − flushed`), added to the global `LIVE` atomic
//!   when it leaves `±FLUSH_BYTES`; only a flush touches the shared peak trackers. The peak can thus
//!   lag the true peak by at most `FLUSH_BYTES` per thread holding an unflushed positive delta:
//!   **peak error ≤ 64 KiB × threads that allocate** (an underestimate, never an overestimate).
//!   An allocation of ≥ 64 KiB flushes at once, so large buffers are seen exactly.
//! - Threads beyond `SLOTS` share an overflow slot updated with atomic read-modify-write: slower,
//!   still exact. Slots are never released (a dead thread's counts remain part of the sums).
//!
//! Nothing here allocates, locks, blocks or panics; the thread-local is a `const` `Cell` without
//! `Drop`, which registers no destructor.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Number of exclusive per-thread slots.
pub(crate) const SLOTS: usize = 1024;
/// Number of power-of-two size buckets: bucket `i` counts sizes in `[2^(i-1), 2^i)`, bucket 0 is 0.
pub const HISTOGRAM_BUCKETS: usize = 48;
/// A thread's pending live-byte delta is flushed to the global total beyond this magnitude.
pub const FLUSH_BYTES: i64 = 64 * 1024;

/// One thread's counters. Written only by its owner thread (or atomically for the overflow slot).
/// Allocation calls are the histogram's sum, so the hot path touches as few fields as possible.
#[repr(align(128))]
pub(crate) struct Slot {
    /// Cumulative bytes allocated (growth by realloc included). Written by allocations only.
    bytes_allocated: AtomicU64,
    /// Cumulative bytes freed (shrinkage by realloc included). Written by frees only, so the two
    /// counters form independent dependency chains on the hot path.
    bytes_freed: AtomicU64,
    /// The part of this thread's live bytes (allocated − freed) already added to `LIVE`.
    flushed: AtomicI64,
    deallocs: AtomicU64,
    reallocs: AtomicU64,
    histogram: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Slot {
    const fn new() -> Self {
        Slot {
            bytes_allocated: AtomicU64::new(0),
            bytes_freed: AtomicU64::new(0),
            flushed: AtomicI64::new(0),
            deallocs: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
            histogram: [const { AtomicU64::new(0) }; HISTOGRAM_BUCKETS],
        }
    }
}

static SLOT_ARRAY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static OVERFLOW_SLOT: Slot = Slot::new();
static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);

/// Flushed live bytes (Σ flushed deltas). Exact live bytes come from the slot sums.
static LIVE: AtomicI64 = AtomicI64::new(0);

/// Which peak tracker: the resettable process peak, the current phase window, the current step window.
#[derive(Clone, Copy)]
pub(crate) enum Tracker {
    Global = 0,
    Phase = 1,
    Step = 2,
}
static PEAKS: [AtomicI64; 3] = [const { AtomicI64::new(0) }; 3];

thread_local! {
    /// This thread's slot; null until the first allocation claims one.
    static MY_SLOT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

#[inline(always)]
fn bucket_of(size: usize) -> usize {
    let b = (usize::BITS - size.leading_zeros()) as usize;
    if b >= HISTOGRAM_BUCKETS {
        HISTOGRAM_BUCKETS - 1
    } else {
        b
    }
}

/// Claims a slot for this thread (first allocation only); the overflow slot when none is left.
#[cold]
#[inline(never)]
fn claim_slot() -> *const Slot {
    let claimed = NEXT_SLOT.fetch_add(1, Relaxed) as usize;
    let slot: &'static Slot = match SLOT_ARRAY.get(claimed) {
        Some(s) => s,
        None => {
            NEXT_SLOT.store(SLOTS as u32, Relaxed);
            &OVERFLOW_SLOT
        }
    };
    let p: *const Slot = slot;
    let _ = MY_SLOT.try_with(|c| c.set(p));
    p
}

/// This thread's slot: exclusive (plain load/store updates) unless it is the overflow slot.
#[inline(always)]
fn my_slot() -> &'static Slot {
    let p = MY_SLOT
        .try_with(|c| c.get())
        .unwrap_or(&OVERFLOW_SLOT as *const Slot);
    let p = if p.is_null() { claim_slot() } else { p };
    // SAFETY: `p` points into the static slot array or at the static overflow slot.
    unsafe { &*p }
}

#[inline(always)]
fn is_shared(s: &Slot) -> bool {
    std::ptr::eq(s, &OVERFLOW_SLOT)
}

/// Adds `by` to an owner-only counter without a locked instruction.
#[inline(always)]
fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}

#[inline]
fn raise_peaks(live: i64) {
    for p in &PEAKS {
        if live > p.load(Relaxed) {
            p.fetch_max(live, Relaxed);
        }
    }
}

/// Publishes an exclusive slot's unflushed delta once it leaves ±FLUSH_BYTES.
#[inline(always)]
fn maybe_flush(s: &Slot) {
    let live = s
        .bytes_allocated
        .load(Relaxed)
        .wrapping_sub(s.bytes_freed.load(Relaxed)) as i64;
    let d = live - s.flushed.load(Relaxed);
    if !(-FLUSH_BYTES..FLUSH_BYTES).contains(&d) {
        flush(s, live, d);
    }
}

#[inline(never)]
fn flush(s: &Slot, live: i64, d: i64) {
    s.flushed.store(live, Relaxed);
    let global = LIVE.fetch_add(d, Relaxed) + d;
    if d > 0 {
        raise_peaks(global);
    }
}

/// The overflow slot is shared: every update is an atomic read-modify-write, flushed at once.
#[cold]
#[inline(never)]
fn shared_update(size_delta: i64, alloc_size: Option<usize>, dealloc: bool, realloc: bool) {
    let s = &OVERFLOW_SLOT;
    if let Some(n) = alloc_size {
        s.histogram[bucket_of(n)].fetch_add(1, Relaxed);
    }
    if size_delta > 0 {
        s.bytes_allocated.fetch_add(size_delta as u64, Relaxed);
    } else {
        s.bytes_freed.fetch_add(size_delta.unsigned_abs(), Relaxed);
    }
    if dealloc {
        s.deallocs.fetch_add(1, Relaxed);
    }
    if realloc {
        s.reallocs.fetch_add(1, Relaxed);
    }
    s.flushed.fetch_add(size_delta, Relaxed);
    let global = LIVE.fetch_add(size_delta, Relaxed) + size_delta;
    if size_delta > 0 {
        raise_peaks(global);
    }
}

/// Records an allocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_alloc(size: usize) {
    let s = my_slot();
    if is_shared(s) {
        return shared_update(size as i64, Some(size), false, false);
    }
    bump(&s.bytes_allocated, size as u64);
    bump(&s.histogram[bucket_of(size)], 1);
    maybe_flush(s);
}

/// Records a deallocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_dealloc(size: usize) {
    let s = my_slot();
    if is_shared(s) {
        return shared_update(-(size as i64), None, true, false);
    }
    bump(&s.bytes_freed, size as u64);
    bump(&s.deallocs, 1);
    maybe_flush(s);
}

/// Records a successful reallocation from `old` to `new` bytes: one realloc, and the size change
/// as bytes allocated (growth) or freed (shrinkage).
#[inline(always)]
pub(crate) fn on_realloc(old: usize, new: usize) {
    let s = my_slot();
    if is_shared(s) {
        return shared_update(new as i64 - old as i64, None, false, true);
    }
    bump(&s.reallocs, 1);
    if new >= old {
        bump(&s.bytes_allocated, (new - old) as u64);
    } else {
        bump(&s.bytes_freed, (old - new) as u64);
    }
    maybe_flush(s);
}

/// Totals summed over every slot at one moment.
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

fn claimed_slots() -> impl Iterator<Item = &'static Slot> {
    let n = (NEXT_SLOT.load(Relaxed) as usize).min(SLOTS);
    SLOT_ARRAY[..n]
        .iter()
        .chain(std::iter::once(&OVERFLOW_SLOT))
}

/// Sums the counters of every thread.
pub(crate) fn totals() -> Totals {
    let mut t = Totals::default();
    for s in claimed_slots() {
        t.allocations += s.histogram.iter().map(|h| h.load(Relaxed)).sum::<u64>();
        t.deallocations += s.deallocs.load(Relaxed);
        t.reallocations += s.reallocs.load(Relaxed);
        t.bytes_allocated += s.bytes_allocated.load(Relaxed);
        t.bytes_freed += s.bytes_freed.load(Relaxed);
    }
    t
}

/// Allocation counts per power-of-two size bucket, summed over threads.
pub(crate) fn histogram() -> [u64; HISTOGRAM_BUCKETS] {
    let mut h = [0u64; HISTOGRAM_BUCKETS];
    for s in claimed_slots() {
        for (dst, src) in h.iter_mut().zip(s.histogram.iter()) {
            *dst += src.load(Relaxed);
        }
    }
    h
}

/// Reads a peak tracker, first raising every tracker to the exact current live bytes (an exact
/// observation belongs to all open windows, so the windows never lag the global peak).
pub(crate) fn peak(tracker: Tracker, live_now: u64) -> u64 {
    raise_peaks(live_now as i64);
    PEAKS[tracker as usize].load(Relaxed).max(0) as u64
}

/// Sets a peak tracker to `value` and returns what it held (raised to `value` if lower).
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
