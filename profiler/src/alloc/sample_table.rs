//! The sampler's records: the live sampled blocks (pointer → requested size and stack) and the
//! distinct stacks they were allocated from, in memory mapped once when sampling is first enabled
//! (never the heap: these are written from inside the allocator).
//!
//! Both tables sit behind one spin lock, held for a few dozen instructions (no allocation, no
//! system call inside). Only sampled calls and frees of sampled blocks take it — about one call per
//! sampling interval. Live blocks are an open-addressing table with linear probing and
//! backward-shift deletion (no tombstones); stacks are appended and never removed, so a reader may
//! use any stack below the published count without the lock.

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
}

#[repr(C)]
struct StackRec {
    hash: u64,
    first: u32,
    len: u32,
}

/// The mapped tables.
struct Tables {
    live: *mut Live,
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
    let total = live + stacks + frames + index + std::mem::size_of::<Tables>();
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
    let tables = at(live + stacks + frames + index).cast::<Tables>();
    // SAFETY: `tables` is inside the fresh mapping, aligned (every part's size is a multiple of 8).
    unsafe {
        tables.write(Tables {
            live: at(0).cast(),
            stacks: at(live).cast(),
            frames: at(live + stacks).cast(),
            index: at(live + stacks + frames).cast(),
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

/// Records the sampled block `ptr` of `size` requested bytes allocated from `frames`; `false` when
/// the table is full (or was never mapped).
pub(crate) fn insert(ptr: usize, size: usize, frames: &[usize]) -> bool {
    let Some(t) = tables() else { return false };
    let _g = LOCK.lock();
    let mask = (1usize << LIVE_BITS) - 1;
    if LIVE_COUNT.load(Ordering::Relaxed) >= mask / 4 * 3 {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let stack = intern(t, frames);
    put(t, ptr, size, stack);
    true
}

/// Moves the record of `old` to `new` (a reallocated sampled block of `size` requested bytes),
/// keeping the stack it was allocated from; `false` when `old` was not recorded.
pub(crate) fn moved(old: usize, new: usize, size: usize) -> bool {
    let Some(stack) = remove_record(old).map(|(_, stack)| stack) else {
        return false;
    };
    let Some(t) = tables() else { return false };
    let _g = LOCK.lock();
    put(t, new, size, stack);
    true
}

/// Removes the record of `ptr`; its requested size, or `None` when it was not recorded.
pub(crate) fn remove(ptr: usize) -> Option<usize> {
    remove_record(ptr).map(|(size, _)| size)
}

/// Writes a record into a free slot (the lock is held; the table has room: at most three quarters
/// full before any insertion).
fn put(t: &Tables, ptr: usize, size: usize, stack: u32) {
    let mask = (1usize << LIVE_BITS) - 1;
    let mut i = slot_of(ptr);
    // SAFETY: every index is masked into the table; the lock is held.
    unsafe {
        while (*t.live.add(i)).ptr != 0 {
            i = (i + 1) & mask;
        }
        t.live.add(i).write(Live { ptr, size, stack });
    }
    LIVE_COUNT.fetch_add(1, Ordering::Relaxed);
}

/// Removes the record of `ptr`: its (requested size, stack).
fn remove_record(ptr: usize) -> Option<(usize, u32)> {
    let t = tables()?;
    let _g = LOCK.lock();
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
        let record = ((*t.live.add(i)).size, (*t.live.add(i)).stack);
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
