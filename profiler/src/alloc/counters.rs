//! Allocation counters: per-thread exclusive slots plus a batched global live total for the peak.
//!
//! Design (measured in `../shared/notes/crates.md` §3, variants b2 + c):
//! - Every thread owns one cache-padded [`Slot`] out of a fixed static array. Only the owner writes
//!   it, with plain `Relaxed` load + store (no LOCK-prefixed instruction on the hot path); readers
//!   sum all slots. Cumulative counters (bytes allocated / freed, counts, histogram) are therefore
//!   exact: live bytes = Σ allocated − Σ freed.
//! - For the peak each slot keeps a `pending` delta that is flushed into the global `LIVE` atomic
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

const UNASSIGNED: u32 = u32::MAX;
const OVERFLOW: u32 = u32::MAX - 1;

/// One thread's counters. Written only by its owner thread (or atomically for the overflow slot).
#[repr(align(128))]
pub(crate) struct Slot {
    allocs: AtomicU64,
    deallocs: AtomicU64,
    reallocs: AtomicU64,
    bytes_allocated: AtomicU64,
    bytes_freed: AtomicU64,
    pending: AtomicI64,
    histogram: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Slot {
    const fn new() -> Self {
        Slot {
            allocs: AtomicU64::new(0),
            deallocs: AtomicU64::new(0),
            reallocs: AtomicU64::new(0),
            bytes_allocated: AtomicU64::new(0),
            bytes_freed: AtomicU64::new(0),
            pending: AtomicI64::new(0),
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
    static MY_SLOT: Cell<u32> = const { Cell::new(UNASSIGNED) };
}

#[inline]
fn bucket_of(size: usize) -> usize {
    let b = (usize::BITS - size.leading_zeros()) as usize;
    if b >= HISTOGRAM_BUCKETS {
        HISTOGRAM_BUCKETS - 1
    } else {
        b
    }
}

/// Returns this thread's slot index, claiming one on first use; `OVERFLOW` when none is left or
/// the thread-local is no longer reachable (thread teardown).
#[inline]
fn my_slot() -> u32 {
    MY_SLOT
        .try_with(|s| {
            let v = s.get();
            if v != UNASSIGNED {
                return v;
            }
            let claimed = NEXT_SLOT.fetch_add(1, Relaxed);
            let v = if (claimed as usize) < SLOTS {
                claimed
            } else {
                NEXT_SLOT.store(SLOTS as u32, Relaxed);
                OVERFLOW
            };
            s.set(v);
            v
        })
        .unwrap_or(OVERFLOW)
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

#[inline(always)]
fn with_slot(f_exclusive: impl FnOnce(&Slot), f_shared: impl FnOnce(&Slot)) {
    let idx = my_slot();
    if idx == OVERFLOW {
        f_shared(&OVERFLOW_SLOT)
    } else {
        // idx < SLOTS by construction of `my_slot`; `get` keeps this panic-free regardless.
        match SLOT_ARRAY.get(idx as usize) {
            Some(slot) => f_exclusive(slot),
            None => f_shared(&OVERFLOW_SLOT),
        }
    }
}

#[inline(always)]
fn add_pending_exclusive(slot: &Slot, delta: i64) {
    let p = slot.pending.load(Relaxed) + delta;
    if !(-FLUSH_BYTES..FLUSH_BYTES).contains(&p) {
        slot.pending.store(0, Relaxed);
        let live = LIVE.fetch_add(p, Relaxed) + p;
        if p > 0 {
            raise_peaks(live);
        }
    } else {
        slot.pending.store(p, Relaxed);
    }
}

#[inline(always)]
fn add_pending_shared(delta: i64) {
    let live = LIVE.fetch_add(delta, Relaxed) + delta;
    if delta > 0 {
        raise_peaks(live);
    }
}

/// Records an allocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_alloc(size: usize) {
    with_slot(
        |s| {
            bump(&s.allocs, 1);
            bump(&s.bytes_allocated, size as u64);
            bump(&s.histogram[bucket_of(size)], 1);
            add_pending_exclusive(s, size as i64);
        },
        |s| {
            s.allocs.fetch_add(1, Relaxed);
            s.bytes_allocated.fetch_add(size as u64, Relaxed);
            s.histogram[bucket_of(size)].fetch_add(1, Relaxed);
            add_pending_shared(size as i64);
        },
    )
}

/// Records a deallocation of `size` bytes.
#[inline(always)]
pub(crate) fn on_dealloc(size: usize) {
    with_slot(
        |s| {
            bump(&s.deallocs, 1);
            bump(&s.bytes_freed, size as u64);
            add_pending_exclusive(s, -(size as i64));
        },
        |s| {
            s.deallocs.fetch_add(1, Relaxed);
            s.bytes_freed.fetch_add(size as u64, Relaxed);
            add_pending_shared(-(size as i64));
        },
    )
}

/// Records a successful reallocation from `old` to `new` bytes: one realloc, the size change as
/// bytes allocated or freed, and the new size in the histogram.
#[inline(always)]
pub(crate) fn on_realloc(old: usize, new: usize) {
    let delta = new as i64 - old as i64;
    with_slot(
        |s| {
            bump(&s.reallocs, 1);
            if delta >= 0 {
                bump(&s.bytes_allocated, delta as u64);
            } else {
                bump(&s.bytes_freed, delta.unsigned_abs());
            }
            bump(&s.histogram[bucket_of(new)], 1);
            add_pending_exclusive(s, delta);
        },
        |s| {
            s.reallocs.fetch_add(1, Relaxed);
            if delta >= 0 {
                s.bytes_allocated.fetch_add(delta as u64, Relaxed);
            } else {
                s.bytes_freed.fetch_add(delta.unsigned_abs(), Relaxed);
            }
            s.histogram[bucket_of(new)].fetch_add(1, Relaxed);
            add_pending_shared(delta);
        },
    )
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
        t.allocations += s.allocs.load(Relaxed);
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
