//! Allocation counters: per-thread exclusive slots plus a batched global live total for the peak.
//!
//! Design (measured in `../shared/notes/crates.md` §3, variants b2 + c):
//! - Every thread owns one cache-padded [`Slot`] out of a fixed static array. Only the owner writes
//!   it, with plain `Relaxed` load + store (no LOCK-prefixed instruction on the hot path); readers
//!   sum all slots. Cumulative counters (bytes allocated / freed, counts, histogram) are therefore
//!   exact: live bytes = Σ allocated − Σ freed.
//! - For the peak, a slot publishes its live bytes to the global `LIVE` atomic (a *flush*) whenever
//!   its cumulative allocated or freed bytes pass a mark set `FLUSH_BYTES` beyond their values at the
//!   last flush. The hot path is thus one compare per call, against a mark in the same cache line.
//!   Only a flush touches shared memory (`LIVE` and the peak trackers).
//! - Between flushes a slot holds an unpublished delta in (−`FLUSH_BYTES`, `FLUSH_BYTES`), so `LIVE`
//!   is within 64 KiB per allocating thread of the truth, and **the peak's error is below
//!   64 KiB × threads that allocate**, either way. An allocation of ≥ 64 KiB passes the mark by
//!   itself, so large buffers are seen at once; every read of the peak also raises it to the exact
//!   live bytes of that moment.
//! - Threads beyond `SLOTS − 1` share the overflow slot (index 0), updated with atomic
//!   read-modify-write and flushed on every call: slower, still exact. Slots are never released (a
//!   dead thread's counts remain part of the sums).
//!
//! Nothing here allocates, locks, blocks or panics; the thread-local is a `const` `Cell` without
//! `Drop`, which registers no destructor.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

/// Number of slots: index 0 is the shared overflow slot, the rest are exclusive per-thread slots.
pub(crate) const SLOTS: usize = 1024;
/// Number of power-of-two size buckets: bucket `i` counts sizes in `[2^(i-1), 2^i)`, bucket 0 is 0.
/// One per bit position, so computing a bucket needs no clamp.
pub const HISTOGRAM_BUCKETS: usize = usize::BITS as usize + 1;
/// A thread publishes its live bytes after allocating or freeing this many bytes since it last did.
pub const FLUSH_BYTES: i64 = 64 * 1024;

/// One thread's counters. Written only by its owner thread (or atomically for the overflow slot).
/// Allocation calls are the histogram's sum, so the hot path touches as few fields as possible.
#[repr(align(128))]
pub(crate) struct Slot {
    /// Cumulative bytes allocated (growth by realloc included). Written by allocations only.
    bytes_allocated: AtomicU64,
    /// `bytes_allocated` value at which the next flush happens.
    alloc_mark: AtomicU64,
    /// Cumulative bytes freed (shrinkage by realloc included). Written by frees only, so the two
    /// counters form independent dependency chains on the hot path.
    bytes_freed: AtomicU64,
    /// `bytes_freed` value at which the next flush happens.
    free_mark: AtomicU64,
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
            alloc_mark: AtomicU64::new(0),
            bytes_freed: AtomicU64::new(0),
            free_mark: AtomicU64::new(0),
            flushed: AtomicI64::new(0),
            deallocs: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
            histogram: [const { AtomicU64::new(0) }; HISTOGRAM_BUCKETS],
        }
    }
}

/// Every slot; index 0 is the overflow slot shared by threads that found no exclusive one.
static SLOT_ARRAY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// Next exclusive slot to hand out (starts after the overflow slot).
static NEXT_SLOT: AtomicU32 = AtomicU32::new(1);

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
    /// This thread's slot: null until its first call claims one; the overflow slot when none was left.
    static MY_SLOT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

#[inline(always)]
fn bucket_of(size: usize) -> usize {
    (usize::BITS - size.leading_zeros()) as usize
}

fn overflow_slot() -> &'static Slot {
    &SLOT_ARRAY[0]
}

/// The thread-local value of a thread on the overflow slot (null: no slot claimed yet). Both are
/// below every real slot's address, so the hot path tells them apart from an exclusive slot with
/// one compare against a constant.
const ON_OVERFLOW: usize = 1;

/// This thread's exclusive slot, or `None` (unclaimed yet, or sharing the overflow slot).
#[inline(always)]
fn exclusive_slot() -> Option<&'static Slot> {
    let p = MY_SLOT.try_with(|c| c.get()).unwrap_or(std::ptr::null());
    if (p as usize) <= ON_OVERFLOW {
        None
    } else {
        // SAFETY: any other value was set by `claim_slot` and points into the static slot array.
        Some(unsafe { &*p })
    }
}

/// The slow path's slot: claims one for this thread on its first call; the overflow slot when
/// none is left (or thread-local storage is gone).
#[cold]
#[inline(never)]
fn claim_slot() -> &'static Slot {
    let current = MY_SLOT
        .try_with(|c| c.get())
        .unwrap_or(ON_OVERFLOW as *const Slot);
    match current as usize {
        0 => {}
        ON_OVERFLOW => return overflow_slot(),
        // SAFETY: set below to a slot of the static array.
        _ => return unsafe { &*current },
    }
    let claimed = NEXT_SLOT.fetch_add(1, Relaxed) as usize;
    let (slot, mark) = match SLOT_ARRAY.get(claimed) {
        Some(s) => (s, s as *const Slot),
        None => {
            NEXT_SLOT.store(SLOTS as u32, Relaxed);
            (overflow_slot(), ON_OVERFLOW as *const Slot)
        }
    };
    let _ = MY_SLOT.try_with(|c| c.set(mark));
    slot
}

/// Adds `by` to an owner-only counter without a locked instruction; returns the new value.
#[inline(always)]
fn bump(c: &AtomicU64, by: u64) -> u64 {
    let v = c.load(Relaxed).wrapping_add(by);
    c.store(v, Relaxed);
    v
}

#[inline]
fn raise_peaks(live: i64) {
    for p in &PEAKS {
        if live > p.load(Relaxed) {
            p.fetch_max(live, Relaxed);
        }
    }
}

/// Publishes an exclusive slot's live bytes to `LIVE` and sets both marks `FLUSH_BYTES` ahead.
#[inline(never)]
fn flush(s: &Slot) {
    let allocated = s.bytes_allocated.load(Relaxed);
    let freed = s.bytes_freed.load(Relaxed);
    let live = allocated.wrapping_sub(freed) as i64;
    let d = live - s.flushed.load(Relaxed);
    s.flushed.store(live, Relaxed);
    s.alloc_mark
        .store(allocated.wrapping_add(FLUSH_BYTES as u64), Relaxed);
    s.free_mark
        .store(freed.wrapping_add(FLUSH_BYTES as u64), Relaxed);
    let global = LIVE.fetch_add(d, Relaxed) + d;
    if d > 0 {
        raise_peaks(global);
    }
}

/// Adds `size` to the allocated bytes and flushes when it passes the mark.
#[inline(always)]
fn add_allocated(s: &Slot, size: u64) {
    let a = bump(&s.bytes_allocated, size);
    if a >= s.alloc_mark.load(Relaxed) {
        flush(s);
    }
}

/// Adds `size` to the freed bytes and flushes when it passes the mark.
#[inline(always)]
fn add_freed(s: &Slot, size: u64) {
    let f = bump(&s.bytes_freed, size);
    if f >= s.free_mark.load(Relaxed) {
        flush(s);
    }
}

#[inline(always)]
fn alloc_exclusive(s: &Slot, size: usize) {
    bump(&s.histogram[bucket_of(size)], 1);
    add_allocated(s, size as u64);
}

#[inline(always)]
fn dealloc_exclusive(s: &Slot, size: usize) {
    bump(&s.deallocs, 1);
    add_freed(s, size as u64);
}

#[inline(always)]
fn realloc_exclusive(s: &Slot, old: usize, new: usize) {
    bump(&s.reallocs, 1);
    if new >= old {
        add_allocated(s, (new - old) as u64);
    } else {
        add_freed(s, (old - new) as u64);
    }
}

/// The slow path: a thread's first call, or a thread on the shared overflow slot (every update an
/// atomic read-modify-write, published at once). `delta` is the change in live bytes; `count` the
/// counter of the call (deallocs or reallocs; `None` for an allocation, which counts in the
/// histogram).
#[cold]
#[inline(never)]
fn record_slow(delta: i64, alloc_size: usize, count: Option<fn(&Slot) -> &AtomicU64>) {
    let s = claim_slot();
    let exclusive = !std::ptr::eq(s, overflow_slot());
    match count {
        None if exclusive => return alloc_exclusive(s, alloc_size),
        None => {
            s.histogram[bucket_of(alloc_size)].fetch_add(1, Relaxed);
        }
        Some(counter) if exclusive => {
            bump(counter(s), 1);
            return if delta >= 0 {
                add_allocated(s, delta as u64)
            } else {
                add_freed(s, delta.unsigned_abs())
            };
        }
        Some(counter) => {
            counter(s).fetch_add(1, Relaxed);
        }
    }
    if delta > 0 {
        s.bytes_allocated.fetch_add(delta as u64, Relaxed);
    } else {
        s.bytes_freed.fetch_add(delta.unsigned_abs(), Relaxed);
    }
    s.flushed.fetch_add(delta, Relaxed);
    let global = LIVE.fetch_add(delta, Relaxed) + delta;
    if delta > 0 {
        raise_peaks(global);
    }
}

/// Records an allocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_alloc(size: usize) {
    match exclusive_slot() {
        Some(s) => alloc_exclusive(s, size),
        None => record_slow(size as i64, size, None),
    }
}

/// Records a deallocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_dealloc(size: usize) {
    match exclusive_slot() {
        Some(s) => dealloc_exclusive(s, size),
        None => record_slow(-(size as i64), 0, Some(|s| &s.deallocs)),
    }
}

/// Records a successful reallocation from `old` to `new` bytes: one realloc, and the size change
/// as bytes allocated (growth) or freed (shrinkage).
#[inline(always)]
pub(crate) fn on_realloc(old: usize, new: usize) {
    match exclusive_slot() {
        Some(s) => realloc_exclusive(s, old, new),
        None => record_slow(new as i64 - old as i64, 0, Some(|s| &s.reallocs)),
    }
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
    SLOT_ARRAY[..n].iter()
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
