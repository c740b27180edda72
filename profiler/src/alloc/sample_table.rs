//! The sampler's records: the live sampled blocks (pointer → requested size and stack) and the
//! distinct stacks they were allocated from, in memory mapped once when sampling is first enabled
//! (never the heap: these are written from inside the allocator).
//!
//! Both tables sit behind one spin lock, held for a few dozen instructions (no allocation, no
//! system call inside). Only sampled calls and frees of sampled blocks take it — about one call per
//! sampling interval. Live blocks are an open-addressing table with linear probing and
//! backward-shift deletion (no tombstones); stacks are appended and never removed, so a reader may
//! use any stack below the published count without the lock.
//!
//! **The sampled set at the exact peak.** Every sampled allocation takes the next number of one
//! sequence before its block is allocated, every free one after its block is freed (so the number
//! brackets the time jemalloc's counters hold the block); when the process heap reaches a new peak,
//! the counters note the sequence number reached ([`note_peak`], lock-free). A block freed after the latest peak that was live at it is
//! kept in a bounded list of the recently freed ([`FREED`]), so the blocks live at the peak — live
//! now and allocated before it, or in that list — can be listed at any later time
//! ([`peak_blocks`]): heaptrack's replay, on the sample, without a log to replay. The list empties
//! itself when the peak moves past its entries.

use super::spin::SpinLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// The deepest stack kept (innermost frames first).
pub(crate) const MAX_FRAMES: usize = 64;
/// The live table's slots (at most three quarters used: about 96 GiB of small blocks at 512 KiB
/// per sample, whatever the large ones, which are one block each).
const LIVE_BITS: u32 = 18;
/// Distinct stacks kept.
const STACKS: usize = 1 << 18;
/// Frames kept over all stacks.
const FRAMES: usize = 1 << 22;
/// The stack index's slots (twice the stacks: short probes).
const INDEX_BITS: u32 = 19;

/// Stack 0: a sample whose stack did not fit (the stack tables are full).
pub(crate) const NO_STACK: u32 = 0;

#[repr(C)]
struct Live {
    /// The block's address; 0: empty slot.
    ptr: usize,
    size: usize,
    stack: u32,
    /// Its place in the sequence of insertions and removals.
    seq: u64,
}

/// A block freed after the latest peak that was live at it.
#[repr(C)]
struct Freed {
    size: usize,
    stack: u32,
    /// When it was allocated and freed, in the sequence.
    alloc_seq: u64,
    free_seq: u64,
}

/// The list of freed blocks live at the latest peak: its length.
const FREED: usize = 1 << 16;

#[repr(C)]
struct StackRec {
    hash: u64,
    first: u32,
    len: u32,
}

/// The mapped tables.
struct Tables {
    live: *mut Live,
    freed: *mut Freed,
    stacks: *mut StackRec,
    frames: *mut u64,
    /// Stack ids + 1 (0: empty slot).
    index: *mut u32,
}

static TABLES: AtomicPtr<Tables> = AtomicPtr::new(std::ptr::null_mut());
/// Guards both tables.
pub(crate) static LOCK: SpinLock = SpinLock::new();
/// Stacks stored (readable without the lock below this count).
static STACK_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Frames stored.
static FRAME_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Live sampled blocks in the table.
static LIVE_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The sequence of insertions and removals (under the lock).
static SEQ: AtomicU64 = AtomicU64::new(0);
/// The sequence number reached at the process heap's latest peak.
static PEAK_SEQ: AtomicU64 = AtomicU64::new(0);
/// Entries in the freed list (under the lock).
static FREED_LEN: AtomicUsize = AtomicUsize::new(0);
/// Blocks live at the latest peak that the full freed list could not keep (the peak's set misses
/// them).
pub(crate) static PEAK_MISSED: AtomicU64 = AtomicU64::new(0);
/// Samples that found the live table full (their blocks are freed as sampled, unrecorded).
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Maps the tables (once). Not on an allocation path.
pub(crate) fn init() -> Result<(), String> {
    if !TABLES.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let live = (1usize << LIVE_BITS) * std::mem::size_of::<Live>();
    let stacks = STACKS * std::mem::size_of::<StackRec>();
    let frames = FRAMES * 8;
    let index = (1usize << INDEX_BITS) * 4;
    let freed = FREED * std::mem::size_of::<Freed>();
    let total = live + stacks + frames + index + freed + std::mem::size_of::<Tables>();
    // SAFETY: an anonymous private mapping; pages are zero until touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err("cannot map the sampler's tables".into());
    }
    let at = |off: usize| (p as usize + off) as *mut u8;
    let tables = at(live + stacks + frames + index + freed).cast::<Tables>();
    // SAFETY: `tables` is inside the fresh mapping, aligned (every part's size is a multiple of 8).
    unsafe {
        tables.write(Tables {
            live: at(0).cast(),
            stacks: at(live).cast(),
            frames: at(live + stacks).cast(),
            index: at(live + stacks + frames).cast(),
            freed: at(live + stacks + frames + index).cast(),
        });
    }
    // Stack 0: no frames.
    STACK_COUNT.store(1, Ordering::Release);
    TABLES.store(tables, Ordering::Release);
    Ok(())
}

fn tables() -> Option<&'static Tables> {
    // SAFETY: set once by `init`, never unmapped.
    unsafe { TABLES.load(Ordering::Acquire).as_ref() }
}

#[inline]
fn slot_of(ptr: usize) -> usize {
    ((ptr >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (64 - LIVE_BITS)
}

fn hash_frames(frames: &[usize]) -> u64 {
    frames.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &f| {
        (h ^ f as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(5)
    })
}

/// The next number of the sequence: taken by a sampled allocation *before* its block is allocated
/// (jemalloc's counters, which the peak is read from, include the block from then on, and a peak
/// noted from then on must include it).
pub(crate) fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::Relaxed) + 1
}

/// Records the sampled block `ptr` of `size` requested bytes allocated from `frames` at `seq`
/// ([`next_seq`]); `false` when the table is full (or was never mapped).
pub(crate) fn insert(ptr: usize, size: usize, frames: &[usize], seq: u64) -> bool {
    let Some(t) = tables() else { return false };
    let _g = LOCK.lock();
    let mask = (1usize << LIVE_BITS) - 1;
    if LIVE_COUNT.load(Ordering::Relaxed) >= mask / 4 * 3 {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let stack = intern(t, frames);
    put(t, ptr, size, stack, seq);
    true
}

/// The process heap reached a new peak: the sampled set live now is the set at the peak. Called
/// from the counters' slow path: one load and one store, no lock.
#[inline]
pub(crate) fn note_peak() {
    PEAK_SEQ.store(SEQ.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Moves the record of `old` to `new` (a reallocated sampled block of `size` requested bytes),
/// keeping the stack it was allocated from; `false` when `old` was not recorded.
pub(crate) fn moved(old: usize, new: usize, size: usize) -> bool {
    let Some(t) = tables() else { return false };
    let _g = LOCK.lock();
    let Some((_, stack, seq)) = remove_record(t, old) else {
        return false;
    };
    // The same block, moved: it keeps its place in the sequence.
    put(t, new, size, stack, seq);
    true
}

/// A record removed from the live table, for [`freed`].
pub(crate) struct Removed {
    size: usize,
    stack: u32,
    alloc_seq: u64,
}

/// Removes the record of `ptr` (a block about to be freed); `None` when it was not recorded. Hand
/// it to [`freed`] once the block is freed.
pub(crate) fn remove(ptr: usize) -> Option<Removed> {
    let t = tables()?;
    let _g = LOCK.lock();
    let (size, stack, alloc_seq) = remove_record(t, ptr)?;
    Some(Removed {
        size,
        stack,
        alloc_seq,
    })
}

/// The block of `r` is freed (jemalloc's counters no longer hold it): it takes the next number of
/// the sequence, and joins the freed list when it was live at the latest peak.
pub(crate) fn freed(r: Removed) {
    let Some(t) = tables() else { return };
    let _g = LOCK.lock();
    let free_seq = SEQ.fetch_add(1, Ordering::Relaxed) + 1;
    let peak = PEAK_SEQ.load(Ordering::Relaxed);
    if r.alloc_seq <= peak {
        keep_freed(t, r.size, r.stack, r.alloc_seq, free_seq, peak);
    }
}

/// Appends a block live at the peak `peak` to the freed list (the lock is held), emptying the list
/// first when the peak has moved past all of it (entries are in freeing order).
fn keep_freed(t: &Tables, size: usize, stack: u32, alloc_seq: u64, free_seq: u64, peak: u64) {
    let mut len = FREED_LEN.load(Ordering::Relaxed);
    // SAFETY: below FREED; the lock is held.
    if len > 0 && unsafe { (*t.freed.add(len - 1)).free_seq } <= peak {
        len = 0;
    }
    if len == FREED {
        PEAK_MISSED.fetch_add(1, Ordering::Relaxed);
    } else {
        // SAFETY: as above.
        unsafe {
            t.freed.add(len).write(Freed {
                size,
                stack,
                alloc_seq,
                free_seq,
            })
        };
        len += 1;
    }
    FREED_LEN.store(len, Ordering::Relaxed);
}

/// Writes a record into a free slot (the lock is held; the table has room: at most three quarters
/// full before any insertion).
fn put(t: &Tables, ptr: usize, size: usize, stack: u32, seq: u64) {
    let mask = (1usize << LIVE_BITS) - 1;
    let mut i = slot_of(ptr);
    // SAFETY: every index is masked into the table; the lock is held.
    unsafe {
        while (*t.live.add(i)).ptr != 0 {
            i = (i + 1) & mask;
        }
        t.live.add(i).write(Live {
            ptr,
            size,
            stack,
            seq,
        });
    }
    LIVE_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// Removes the record of `ptr` (the lock is held): its (requested size, stack, sequence number).
fn remove_record(t: &Tables, ptr: usize) -> Option<(usize, u32, u64)> {
    let mask = (1usize << LIVE_BITS) - 1;
    let mut i = slot_of(ptr);
    // SAFETY: as in `put`.
    let record = unsafe {
        loop {
            let p = (*t.live.add(i)).ptr;
            if p == ptr {
                break;
            }
            if p == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
        let e = &*t.live.add(i);
        let record = (e.size, e.stack, e.seq);
        // Backward-shift deletion: move later entries of the run into the hole when their home
        // slot is not cyclically inside (hole, entry].
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let e = &*t.live.add(j);
            if e.ptr == 0 {
                break;
            }
            let k = slot_of(e.ptr);
            let stays = if i <= j {
                i < k && k <= j
            } else {
                i < k || k <= j
            };
            if !stays {
                t.live.add(i).write(Live {
                    ptr: e.ptr,
                    size: e.size,
                    stack: e.stack,
                    seq: e.seq,
                });
                i = j;
            }
        }
        (*t.live.add(i)).ptr = 0;
        record
    };
    LIVE_COUNT.fetch_sub(1, Ordering::Relaxed);
    Some(record)
}

/// The id of `frames`' stack, stored if new ([`NO_STACK`] when the tables are full).
fn intern(t: &Tables, frames: &[usize]) -> u32 {
    let hash = hash_frames(frames);
    let mask = (1usize << INDEX_BITS) - 1;
    let mut i = hash as usize & mask;
    // SAFETY: indices are masked or below the published counts; the lock is held.
    unsafe {
        loop {
            let slot = *t.index.add(i);
            if slot == 0 {
                break;
            }
            let id = slot - 1;
            let s = &*t.stacks.add(id as usize);
            if s.hash == hash && stack_frames(t, s) == frames_u64(frames) {
                return id;
            }
            i = (i + 1) & mask;
        }
        let id = STACK_COUNT.load(Ordering::Relaxed);
        let first = FRAME_COUNT.load(Ordering::Relaxed);
        if id >= STACKS || first + frames.len() > FRAMES {
            return NO_STACK;
        }
        for (n, &f) in frames.iter().enumerate() {
            *t.frames.add(first + n) = f as u64;
        }
        t.stacks.add(id).write(StackRec {
            hash,
            first: first as u32,
            len: frames.len() as u32,
        });
        FRAME_COUNT.store(first + frames.len(), Ordering::Relaxed);
        *t.index.add(i) = id as u32 + 1;
        STACK_COUNT.store(id + 1, Ordering::Release);
        id as u32
    }
}

/// `usize` frames as the stored `u64`s (the same on 64-bit targets).
fn frames_u64(frames: &[usize]) -> &[u64] {
    // SAFETY: usize and u64 have the same size and alignment on the 64-bit targets memsight builds
    // for (checked below).
    const _: () = assert!(std::mem::size_of::<usize>() == 8);
    unsafe { std::slice::from_raw_parts(frames.as_ptr().cast(), frames.len()) }
}

fn stack_frames<'a>(t: &'a Tables, s: &StackRec) -> &'a [u64] {
    // SAFETY: a stored stack's frames were written before its id was published.
    unsafe { std::slice::from_raw_parts(t.frames.add(s.first as usize), s.len as usize) }
}

/// The frames of stack `id` (innermost first); empty for [`NO_STACK`] or an unknown id.
pub(crate) fn frames_of(id: u32) -> &'static [u64] {
    let Some(t) = tables() else { return &[] };
    if id as usize >= STACK_COUNT.load(Ordering::Acquire) {
        return &[];
    }
    // SAFETY: below the published count.
    stack_frames(t, unsafe { &*t.stacks.add(id as usize) })
}

/// Live sampled blocks now.
pub(crate) fn live_count() -> usize {
    LIVE_COUNT.load(Ordering::Relaxed)
}

/// Copies every live sampled block's (stack, requested size) into `out` (cleared first). Allocates
/// only outside the lock: `out` is grown before it is taken, and the copy retried if blocks were
/// added meanwhile.
pub(crate) fn live_blocks(out: &mut Vec<(u32, usize)>) {
    out.clear();
    let Some(t) = tables() else { return };
    loop {
        let want = live_count() + 64;
        if out.capacity() < want {
            out.reserve(want - out.len());
        }
        let _g = LOCK.lock();
        if live_count() > out.capacity() {
            continue;
        }
        for i in 0..1usize << LIVE_BITS {
            // SAFETY: inside the table; the lock is held.
            let e = unsafe { &*t.live.add(i) };
            if e.ptr != 0 {
                out.push((e.stack, e.size));
            }
        }
        return;
    }
}

/// Copies the (stack, requested size) of every sampled block live at the process heap's latest
/// peak into `out` (cleared first): the live blocks allocated before it and the freed blocks that
/// were live at it. Allocates only outside the lock, as [`live_blocks`].
pub(crate) fn peak_blocks(out: &mut Vec<(u32, usize)>) {
    out.clear();
    let Some(t) = tables() else { return };
    loop {
        let want = live_count() + FREED_LEN.load(Ordering::Relaxed) + 64;
        if out.capacity() < want {
            out.reserve(want - out.len());
        }
        let _g = LOCK.lock();
        let freed = FREED_LEN.load(Ordering::Relaxed);
        if live_count() + freed > out.capacity() {
            continue;
        }
        let peak = PEAK_SEQ.load(Ordering::Relaxed);
        for i in 0..1usize << LIVE_BITS {
            // SAFETY: inside the table; the lock is held.
            let e = unsafe { &*t.live.add(i) };
            if e.ptr != 0 && e.seq <= peak {
                out.push((e.stack, e.size));
            }
        }
        for i in 0..freed {
            // SAFETY: below the list's length; the lock is held.
            let f = unsafe { &*t.freed.add(i) };
            if f.alloc_seq <= peak && peak < f.free_seq {
                out.push((f.stack, f.size));
            }
        }
        return;
    }
}
