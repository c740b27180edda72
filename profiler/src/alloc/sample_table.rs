//! The sampler's records: every sampled block's requested size, stack, and when it was allocated
//! and freed, kept in per-thread pools; and the distinct stacks they were allocated from. All of it
//! lives in memory mapped by the sampler (never the heap: these are written from inside the
//! allocator).
//!
//! **No lock shared between threads on the sample path.** Each registered thread owns the pool of
//! its registry entry (threads without one share a pool behind a spin lock). A sampled allocation
//! takes a record from its own pool — owner-only lists, no locked instruction — and writes the
//! record's id into the sampled arena's address map ([`super::sample_heap::record_slot`]: one word
//! per 16 bytes of the sampled range). A free reads the id there and clears it *before* the block
//! is freed (an address jemalloc hands out again at once then maps to its new record), and after
//! the free stamps the record and hands it back: straight onto its own pool's free list, or onto
//! the owning pool's lock-free stack of remote frees, which the owner takes whole. Stacks are
//! interned in a table read without a lock (an entry is written once, then published); only a
//! stack never seen before takes the table's lock. Readers — the session's sampler and the profile
//! writers, never the allocation path — scan every pool (a record being rewritten is skipped: a
//! version number, odd while its owner writes it).
//!
//! **The sampled set at the exact peak.** Every sampled allocation is stamped before its block is
//! allocated, every free after its block is freed, so the stamps bracket the time jemalloc's
//! counters hold the block; when the process heap reaches a new peak the counters note the stamp
//! of that moment ([`note_peak`], lock-free). Stamps are the CPU's time-stamp counter when the
//! kernel keeps its own clock on it (then invariant and synchronised across cores), else the
//! numbers of one shared sequence. A record freed after the latest peak while live at it stays out
//! of reuse until the peak moves past its free, so the blocks live at the peak — `alloc ≤ peak <
//! free` — can be listed at any later time ([`peak_blocks`]): heaptrack's replay, on the sample,
//! without a log. A pool that runs out of records reuses such a kept one (counted in
//! [`PEAK_MISSED`]) before it drops a sample ([`DROPPED`]).

use super::counters;
use super::registry::ENTRIES;
use super::sample_heap;
use super::spin::SpinLock;
use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// The deepest stack kept (innermost frames first).
pub(crate) const MAX_FRAMES: usize = 64;
/// Distinct stacks kept.
const STACKS: usize = 1 << 18;
/// Frames kept over all stacks.
const FRAMES: usize = 1 << 22;
/// The stack index's slots (twice the stacks: short probes).
const INDEX_BITS: u32 = 19;

/// Stack 0: a sample whose stack did not fit (the stack tables are full).
pub(crate) const NO_STACK: u32 = 0;

/// One pool per registry entry, and the pool of threads without one.
const POOLS: usize = ENTRIES + 1;
const SHARED_POOL: usize = ENTRIES;
/// Records per chunk of a pool (a chunk is mapped when its pool first needs it).
const SLOT_BITS: u32 = 12;
const CHUNK: usize = 1 << SLOT_BITS;
/// Chunks per pool: up to 262,144 records per thread (at one sample per 512 KiB, 128 GiB of
/// small blocks live on one thread, or that many large ones).
const CHUNK_BITS: u32 = 6;
const CHUNKS: usize = 1 << CHUNK_BITS;
/// A record's id: pool, chunk, slot.
const POOL_SHIFT: u32 = SLOT_BITS + CHUNK_BITS;

/// A sampled block's record.
#[repr(C)]
struct Rec {
    /// Odd while the pool's owner rewrites the record (readers skip it then).
    version: AtomicU32,
    stack: AtomicU32,
    /// The next record's id + 1 in whichever list holds this one (0: none).
    next: AtomicU32,
    size: AtomicUsize,
    /// Stamped before the block was allocated; 0: never used.
    alloc_seq: AtomicU64,
    /// Stamped after the block was freed; `u64::MAX` while it lives.
    free_seq: AtomicU64,
}

/// What only a pool's owner writes.
#[repr(C, align(128))]
struct Owned {
    /// Records handed out of the chunks so far.
    used: AtomicU32,
    /// Free records (id + 1 of the list's head).
    free: AtomicU32,
    /// Freed records that were live at the latest peak (kept out of reuse until it moves).
    kept: AtomicU32,
    /// The peak when the kept list was last sorted out.
    kept_checked: AtomicU64,
    /// Records taken, and freed by the owner (live = taken − freed here − freed remotely).
    taken: AtomicU64,
    freed: AtomicU64,
    /// Samples this pool's threads took (recorded or not).
    samples: AtomicU64,
}

/// What other threads write: the records they freed.
#[repr(C, align(128))]
struct Remote {
    /// A stack of freed records (id + 1 of its head), taken whole by the owner.
    head: AtomicU32,
    freed: AtomicU64,
}

#[repr(C)]
struct Pool {
    /// The chunks (null until mapped); read by every thread that frees one of its records.
    chunks: [AtomicPtr<Rec>; CHUNKS],
    own: Owned,
    remote: Remote,
}

impl Pool {
    const fn new() -> Self {
        Pool {
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            own: Owned {
                used: AtomicU32::new(0),
                free: AtomicU32::new(0),
                kept: AtomicU32::new(0),
                kept_checked: AtomicU64::new(0),
                taken: AtomicU64::new(0),
                freed: AtomicU64::new(0),
                samples: AtomicU64::new(0),
            },
            remote: Remote {
                head: AtomicU32::new(0),
                freed: AtomicU64::new(0),
            },
        }
    }
}

static POOL: [Pool; POOLS] = [const { Pool::new() }; POOLS];
/// Guards the shared pool's owner side.
// The sampler's locks sit together: a process that forks writes their page once after each fork.
#[link_section = ".data.memsight_fork_locks"]
pub(crate) static SHARED_LOCK: SpinLock = SpinLock::new();

#[repr(C)]
struct StackRec {
    hash: u64,
    first: u32,
    len: u32,
}

/// The mapped stack tables.
struct Tables {
    stacks: *mut StackRec,
    frames: *mut u64,
    /// Stack ids + 1 (0: empty slot); written once each, under [`INTERN_LOCK`].
    index: *mut AtomicU32,
}

static TABLES: AtomicPtr<Tables> = AtomicPtr::new(std::ptr::null_mut());
/// Guards the insertion of new stacks (lookups take no lock).
// The sampler's locks sit together: a process that forks writes their page once after each fork.
#[link_section = ".data.memsight_fork_locks"]
pub(crate) static INTERN_LOCK: SpinLock = SpinLock::new();
/// Stacks stored (readable without the lock below this count).
static STACK_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Frames stored.
static FRAME_COUNT: AtomicUsize = AtomicUsize::new(0);
/// Stamps from the time-stamp counter (else from [`SEQ`]).
static USE_TSC: AtomicBool = AtomicBool::new(false);
/// The shared sequence of stamps when the time-stamp counter is not used.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// The stamp of the process heap's latest peak.
static PEAK_SEQ: AtomicU64 = AtomicU64::new(0);
/// Blocks live at the latest peak whose records a full pool reused (the peak's set misses them).
pub(crate) static PEAK_MISSED: AtomicU64 = AtomicU64::new(0);
/// Samples that found their pool full, or the tables missing (their blocks are freed as sampled,
/// unrecorded).
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Maps the stack tables (once) and picks the stamps. Not on an allocation path.
pub(crate) fn init() -> Result<(), String> {
    if !TABLES.load(Acquire).is_null() {
        return Ok(());
    }
    let stacks = STACKS * std::mem::size_of::<StackRec>();
    let frames = FRAMES * 8;
    let index = (1usize << INDEX_BITS) * 4;
    let total = stacks + frames + index + std::mem::size_of::<Tables>();
    let p = map(total);
    if p.is_null() {
        return Err("cannot map the sampler's tables".into());
    }
    let at = |off: usize| (p as usize + off) as *mut u8;
    let tables = at(stacks + frames + index).cast::<Tables>();
    // SAFETY: `tables` is inside the fresh mapping, aligned (every part's size is a multiple of 8).
    unsafe {
        tables.write(Tables {
            stacks: at(0).cast(),
            frames: at(stacks).cast(),
            index: at(stacks + frames).cast(),
        });
    }
    USE_TSC.store(kernel_clock_is_tsc(), Relaxed);
    // Stack 0: no frames.
    STACK_COUNT.store(1, Release);
    TABLES.store(tables, Release);
    Ok(())
}

/// An anonymous private mapping of `len` bytes (zero pages until touched); null when refused.
fn map(len: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Whether the kernel keeps its clock on the time-stamp counter (it checked that the counter is
/// invariant and synchronised across CPUs). Read with plain system calls: this runs in the
/// program's pre-initialiser.
fn kernel_clock_is_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let path = c"/sys/devices/system/clocksource/clocksource0/current_clocksource";
    let mut buf = [0u8; 16];
    // SAFETY: a NUL-terminated path; `buf` is writable for its length.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n >= 3 && buf.starts_with(b"tsc") && (n == 3 || buf[3] == b'\n')
    }
}

/// The time-stamp counter: `before` — read before any later instruction starts (an allocation's
/// stamp may be early, never late); else read after every earlier instruction completed (a free's
/// or a peak's may be late, never early).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc(before: bool) -> u64 {
    use std::arch::x86_64::{_mm_lfence, _rdtsc};
    // SAFETY: x86-64 has both instructions.
    unsafe {
        if before {
            let t = _rdtsc();
            _mm_lfence();
            t
        } else {
            _mm_lfence();
            _rdtsc()
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn tsc(_: bool) -> u64 {
    0
}

/// A stamp for an allocation (`before` it) or a free (after it): ordered against every stamp and
/// peak noted on either side of it.
#[inline]
fn stamp(before: bool) -> u64 {
    if USE_TSC.load(Relaxed) {
        tsc(before)
    } else {
        SEQ.fetch_add(1, Relaxed) + 1
    }
}

fn tables() -> Option<&'static Tables> {
    // SAFETY: set once by `init`, never unmapped.
    unsafe { TABLES.load(Acquire).as_ref() }
}

fn hash_frames(frames: &[usize]) -> u64 {
    frames.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &f| {
        (h ^ f as u64).wrapping_mul(0x0100_0000_01b3).rotate_left(5)
    })
}

/// The stamp of a sampled allocation: taken *before* its block is allocated (jemalloc's counters,
/// which the peak is read from, include the block from then on, and a peak noted from then on must
/// include it).
pub(crate) fn next_seq() -> u64 {
    stamp(true)
}

/// The process heap reached a new peak: the sampled set live now is the set at the peak. Called
/// from the counters' slow path: no lock.
#[inline]
pub(crate) fn note_peak() {
    let now = if USE_TSC.load(Relaxed) {
        tsc(false)
    } else {
        SEQ.load(Relaxed)
    };
    if now > PEAK_SEQ.load(Relaxed) {
        PEAK_SEQ.fetch_max(now, Relaxed);
    }
}

/// The record of id `id` (its chunk is mapped: the id was handed out).
fn rec(id: u32) -> Option<&'static Rec> {
    let pool = POOL.get((id >> POOL_SHIFT) as usize)?;
    let chunk = pool.chunks[((id >> SLOT_BITS) as usize) & (CHUNKS - 1)].load(Acquire);
    // SAFETY: a mapped chunk holds CHUNK records; the slot is masked below that.
    unsafe { chunk.add(id as usize & (CHUNK - 1)).as_ref() }
}

/// The pool this thread owns: its registry entry's, or the shared one.
fn own_pool() -> usize {
    counters::own_entry().unwrap_or(SHARED_POOL)
}

/// Records the sampled block `ptr` of `size` requested bytes allocated from `frames`, stamped
/// `seq` ([`next_seq`]); `false` when its pool is full (or the tables were never mapped).
pub(crate) fn insert(ptr: usize, size: usize, frames: &[usize], seq: u64) -> bool {
    let Some(t) = tables() else { return false };
    let Some(slot) = sample_heap::record_slot(ptr as *const u8) else {
        DROPPED.fetch_add(1, Relaxed);
        return false;
    };
    let p = own_pool();
    let _g = (p == SHARED_POOL).then(|| SHARED_LOCK.lock());
    let pool = &POOL[p];
    bump(&pool.own.samples);
    let Some((id, r)) = take(pool, p) else {
        DROPPED.fetch_add(1, Relaxed);
        return false;
    };
    let stack = intern(t, frames);
    let v = r.version.load(Relaxed);
    r.version.store(v.wrapping_add(1), Relaxed);
    fence(Release);
    r.stack.store(stack, Relaxed);
    r.size.store(size, Relaxed);
    r.alloc_seq.store(seq, Relaxed);
    r.free_seq.store(u64::MAX, Relaxed);
    r.version.store(v.wrapping_add(2), Release);
    bump(&pool.own.taken);
    slot.store(id + 1, Release);
    true
}

/// Adds one to an owner-only counter (no locked instruction).
#[inline(always)]
fn bump(c: &AtomicU64) {
    c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
}

/// Whether record `r`, freed, was live at the peak stamped `peak`.
fn kept_at(r: &Rec, peak: u64) -> bool {
    r.alloc_seq.load(Relaxed) <= peak && peak < r.free_seq.load(Relaxed)
}

/// Pops the head of the owner-only list `head` (id + 1).
fn pop(head: &AtomicU32) -> Option<(u32, &'static Rec)> {
    let h = head.load(Relaxed);
    let id = h.checked_sub(1)?;
    let r = rec(id)?;
    head.store(r.next.load(Relaxed), Relaxed);
    Some((id, r))
}

/// Pushes record `id` onto the owner-only list `head`.
fn push(head: &AtomicU32, id: u32, r: &Rec) {
    r.next.store(head.load(Relaxed), Relaxed);
    head.store(id + 1, Relaxed);
}

/// A record for a new sample from pool `p` (its owner calls): a free one, one freed remotely, one
/// the peak no longer needs, a fresh one, or — the pool full — a kept one.
fn take(pool: &Pool, p: usize) -> Option<(u32, &'static Rec)> {
    let own = &pool.own;
    let peak = PEAK_SEQ.load(Relaxed);
    loop {
        if let Some((id, r)) = pop(&own.free) {
            if kept_at(r, peak) {
                push(&own.kept, id, r);
                continue;
            }
            return Some((id, r));
        }
        // The free list is empty: the remote frees become it.
        let remote = pool.remote.head.swap(0, Acquire);
        if remote != 0 {
            own.free.store(remote, Relaxed);
            continue;
        }
        if own.kept_checked.load(Relaxed) != peak {
            own.kept_checked.store(peak, Relaxed);
            let mut list = own.kept.swap(0, Relaxed);
            let mut released = false;
            while let Some(r) = list.checked_sub(1).and_then(rec) {
                let id = list - 1;
                list = r.next.load(Relaxed);
                if kept_at(r, peak) {
                    push(&own.kept, id, r);
                } else {
                    push(&own.free, id, r);
                    released = true;
                }
            }
            if released {
                continue;
            }
        }
        if let Some(fresh) = fresh(pool, p) {
            return Some(fresh);
        }
        let kept = pop(&own.kept)?;
        PEAK_MISSED.fetch_add(1, Relaxed);
        return Some(kept);
    }
}

/// A record never used yet, mapping the pool's next chunk when needed.
fn fresh(pool: &Pool, p: usize) -> Option<(u32, &'static Rec)> {
    let used = pool.own.used.load(Relaxed) as usize;
    if used >= CHUNKS * CHUNK {
        return None;
    }
    let chunk = &pool.chunks[used >> SLOT_BITS];
    if chunk.load(Relaxed).is_null() {
        let m = map(CHUNK * std::mem::size_of::<Rec>());
        if m.is_null() {
            return None;
        }
        chunk.store(m.cast(), Release);
    }
    let id = ((p as u32) << POOL_SHIFT) | used as u32;
    let r = rec(id)?;
    pool.own.used.store(used as u32 + 1, Release);
    Some((id, r))
}

/// Moves the record of `old` to `new` (a reallocated sampled block of `size` requested bytes),
/// keeping the stack it was allocated from and its allocation stamp (the same block, moved);
/// `false` when `old` was not recorded. Called before `old` is freed.
pub(crate) fn moved(old: usize, new: usize, size: usize) -> bool {
    let Some(from) = sample_heap::record_slot(old as *const u8) else {
        return false;
    };
    let id = from.load(Acquire);
    let Some(r) = id.checked_sub(1).and_then(rec) else {
        return false;
    };
    let Some(to) = sample_heap::record_slot(new as *const u8) else {
        // Not recordable there (cannot happen for a block of the sampled arena): it is freed.
        if let Some(removed) = remove(old) {
            freed(removed);
        }
        return false;
    };
    from.store(0, Relaxed);
    r.size.store(size, Relaxed);
    to.store(id, Release);
    true
}

/// A record taken off a block about to be freed, for [`freed`].
pub(crate) struct Removed {
    id: u32,
}

/// Takes the record off `ptr` (a block about to be freed: an allocation that gets its address
/// next maps to its own record); `None` when it was not recorded. Hand it to [`freed`] once the
/// block is freed.
pub(crate) fn remove(ptr: usize) -> Option<Removed> {
    let slot = sample_heap::record_slot(ptr as *const u8)?;
    let id = slot.load(Acquire).checked_sub(1)?;
    slot.store(0, Relaxed);
    Some(Removed { id })
}

/// The block of `r` is freed (jemalloc's counters no longer hold it): its record is stamped and
/// goes back to its pool — the owner's own list when this thread owns it, the pool's remote stack
/// otherwise.
pub(crate) fn freed(r: Removed) {
    let Some(rec) = rec(r.id) else { return };
    rec.free_seq.store(stamp(false), Release);
    let p = (r.id >> POOL_SHIFT) as usize;
    let pool = &POOL[p];
    if p != SHARED_POOL && counters::own_entry() == Some(p) {
        push(&pool.own.free, r.id, rec);
        bump(&pool.own.freed);
        return;
    }
    let head = &pool.remote.head;
    let mut h = head.load(Relaxed);
    loop {
        rec.next.store(h, Relaxed);
        match head.compare_exchange_weak(h, r.id + 1, Release, Relaxed) {
            Ok(_) => break,
            Err(now) => h = now,
        }
    }
    pool.remote.freed.fetch_add(1, Relaxed);
}

/// The id of `frames`' stack, stored if new ([`NO_STACK`] when the tables are full). Looks up
/// without a lock; only a new stack takes [`INTERN_LOCK`].
fn intern(t: &Tables, frames: &[usize]) -> u32 {
    let hash = hash_frames(frames);
    if let Ok(id) = find(t, frames, hash) {
        return id;
    }
    let _g = INTERN_LOCK.lock();
    let i = match find(t, frames, hash) {
        Ok(id) => return id,
        Err(i) => i,
    };
    let id = STACK_COUNT.load(Relaxed);
    let first = FRAME_COUNT.load(Relaxed);
    if id >= STACKS || first + frames.len() > FRAMES {
        return NO_STACK;
    }
    // SAFETY: below the tables' sizes (checked above); entries past the published counts are
    // written under the lock only.
    unsafe {
        for (n, &f) in frames.iter().enumerate() {
            *t.frames.add(first + n) = f as u64;
        }
        t.stacks.add(id).write(StackRec {
            hash,
            first: first as u32,
            len: frames.len() as u32,
        });
    }
    FRAME_COUNT.store(first + frames.len(), Relaxed);
    STACK_COUNT.store(id + 1, Release);
    // SAFETY: the slot is masked into the index.
    unsafe { &*t.index.add(i) }.store(id as u32 + 1, Release);
    id as u32
}

/// The stored id of `frames` (hash `hash`), or the empty index slot where it would go.
fn find(t: &Tables, frames: &[usize], hash: u64) -> Result<u32, usize> {
    let mask = (1usize << INDEX_BITS) - 1;
    let mut i = hash as usize & mask;
    loop {
        // SAFETY: masked into the index.
        let slot = unsafe { &*t.index.add(i) }.load(Acquire);
        if slot == 0 {
            return Err(i);
        }
        let id = slot - 1;
        // SAFETY: a published slot names a stack written before it.
        let s = unsafe { &*t.stacks.add(id as usize) };
        if s.hash == hash && stack_frames(t, s) == frames_u64(frames) {
            return Ok(id);
        }
        i = (i + 1) & mask;
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
    if id as usize >= STACK_COUNT.load(Acquire) {
        return &[];
    }
    // SAFETY: below the published count.
    stack_frames(t, unsafe { &*t.stacks.add(id as usize) })
}

/// Live sampled blocks now.
pub(crate) fn live_count() -> usize {
    POOL.iter()
        .map(|p| {
            let taken = p.own.taken.load(Relaxed);
            let freed = p.own.freed.load(Relaxed) + p.remote.freed.load(Relaxed);
            taken.saturating_sub(freed) as usize
        })
        .sum()
}

/// Samples taken since the start (recorded or dropped).
pub(crate) fn samples() -> u64 {
    POOL.iter().map(|p| p.own.samples.load(Relaxed)).sum()
}

/// Calls `f(stack, size, alloc stamp, free stamp)` for every record in use or kept (a record its
/// owner is rewriting is skipped).
fn scan(mut f: impl FnMut(u32, usize, u64, u64)) {
    for pool in &POOL {
        let used = pool.own.used.load(Acquire) as usize;
        for i in 0..used {
            let Some(chunk) = pool.chunks.get(i >> SLOT_BITS) else {
                break;
            };
            // SAFETY: a chunk below `used` is mapped; the slot is inside it.
            let Some(r) = (unsafe { chunk.load(Acquire).add(i & (CHUNK - 1)).as_ref() }) else {
                continue;
            };
            let v = r.version.load(Acquire);
            if v % 2 == 1 {
                continue;
            }
            let (stack, size) = (r.stack.load(Relaxed), r.size.load(Relaxed));
            let (alloc, free) = (r.alloc_seq.load(Relaxed), r.free_seq.load(Acquire));
            fence(Acquire);
            if r.version.load(Relaxed) == v && alloc != 0 {
                f(stack, size, alloc, free);
            }
        }
    }
}

/// Copies every live sampled block's (stack, requested size) into `out` (cleared first).
pub(crate) fn live_blocks(out: &mut Vec<(u32, usize)>) {
    out.clear();
    out.reserve(live_count() + 64);
    scan(|stack, size, _, free| {
        if free == u64::MAX {
            out.push((stack, size));
        }
    });
}

/// Copies the (stack, requested size) of every sampled block live at the process heap's latest
/// peak into `out` (cleared first): allocated before it and freed after it, or not yet.
pub(crate) fn peak_blocks(out: &mut Vec<(u32, usize)>) {
    out.clear();
    out.reserve(live_count() + 64);
    let peak = PEAK_SEQ.load(Relaxed);
    scan(|stack, size, alloc, free| {
        if alloc <= peak && peak < free {
            out.push((stack, size));
        }
    });
}
