//! Where sampled allocations live in a process whose allocator is not memsight's jemalloc (the
//! preloaded library over glibc's `malloc`): each sampled block in a mapping of its own, placed
//! inside one address range reserved for sampled blocks, so that `free` recognises a sampled
//! pointer with one compare ([`contains`]), as in the jemalloc build (`sample_heap.rs`), whose
//! interface this module has. Every other block stays the program's allocator's.
//!
//! A block's mapping starts with its header: the record id the sampler keeps for it
//! ([`record_slot`]), where the block starts in the mapping, and its size. A sample is taken once
//! per 512 KiB allocated on average, so a mapping per sampled block costs two system calls per
//! 512 KiB and at most a page of memory per sampled block (≤ 0.8% of the live heap at the default
//! rate); the block's usable size, the figure the heap counts, is its size rounded to 16 bytes,
//! as small as glibc's would be. Mappings are placed at a cursor that moves through the range and
//! wraps; a place still taken (`MAP_FIXED_NOREPLACE` refuses it) is skipped.
//!
//! Nothing here allocates, locks or panics: `mmap` and `munmap` only.

use super::counters;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

/// Where the range starts: the jemalloc build's range (far below the kernel's mappings and the
/// program's heap). A constant, so that [`contains`] loads nothing.
const BASE: usize = 64 << 40;
/// The range's length.
const RANGE: usize = 1 << 40;
const PAGE: usize = 4096;
/// A block's header, right before it: record id (`u32`), the block's offset in its mapping
/// (`u32`), its size (`u64`).
const HEADER: usize = 16;
/// Places tried for one block before the sample is given up (the caller allocates as usual).
const TRIES: usize = 16;

/// Set once the range was found free.
static READY: AtomicBool = AtomicBool::new(false);
/// Where the next mapping goes, from [`BASE`].
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// Whether `p` is a sampled block: inside the range. One subtraction and one compare.
#[inline(always)]
pub(crate) fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(BASE) < RANGE
}

/// Whether sampled blocks can be placed.
pub(crate) fn ready() -> bool {
    READY.load(Relaxed)
}

/// Checks that the range is free (once; not on an allocation path). `Err` says why it is not.
pub(crate) fn create() -> Result<(), String> {
    if ready() {
        return Ok(());
    }
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; the probe is unmapped at once.
    let p = unsafe { map_at(BASE, PAGE) };
    if p != BASE {
        return Err(format!(
            "the address range for sampled blocks ({BASE:#x}) is in use by another mapping"
        ));
    }
    // SAFETY: the page just mapped.
    unsafe { libc::munmap(p as *mut libc::c_void, PAGE) };
    READY.store(true, Relaxed);
    Ok(())
}

/// Maps `len` bytes at `at` without replacing anything: `at` on success, 0 otherwise.
unsafe fn map_at(at: usize, len: usize) -> usize {
    let p = libc::mmap(
        at as *mut libc::c_void,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return 0;
    }
    if p as usize != at {
        // An old kernel took the address as a hint and mapped elsewhere.
        libc::munmap(p, len);
        return 0;
    }
    at
}

/// A place for a mapping of `len` bytes aligned to `align` (a power of two, at least a page),
/// from the cursor (wrapping at the range's end).
fn place(len: usize, align: usize) -> Option<usize> {
    let mut cur = CURSOR.load(Relaxed);
    loop {
        let start = cur.checked_next_multiple_of(align)?;
        let (start, end) = match start.checked_add(len) {
            Some(end) if end <= RANGE => (start, end),
            _ if len <= RANGE => (0, len),
            _ => return None,
        };
        match CURSOR.compare_exchange_weak(cur, end, Relaxed, Relaxed) {
            Ok(_) => return Some(BASE + start),
            Err(now) => cur = now,
        }
    }
}

/// Allocates a sampled block of `size` bytes aligned to `align` (a new mapping is zeroed, so
/// `zero` is always kept); null when the range has no place for it.
///
/// # Safety
/// `align` is a power of two.
#[inline]
pub(crate) unsafe fn alloc(size: usize, align: usize, _zero: bool) -> *mut u8 {
    if !ready() {
        return std::ptr::null_mut();
    }
    let offset = align.max(HEADER);
    let Some(len) = offset
        .checked_add(size.max(1))
        .and_then(|n| n.checked_next_multiple_of(PAGE))
    else {
        return std::ptr::null_mut();
    };
    let Ok(offset32) = u32::try_from(offset) else {
        return std::ptr::null_mut();
    };
    for _ in 0..TRIES {
        let Some(at) = place(len, offset.max(PAGE)) else {
            return std::ptr::null_mut();
        };
        if map_at(at, len) == 0 {
            continue;
        }
        let p = at + offset;
        ((p - 12) as *mut u32).write(offset32);
        ((p - 8) as *mut u64).write(size as u64);
        return p as *mut u8;
    }
    std::ptr::null_mut()
}

/// The offset in its mapping and the size of the sampled block at `p`.
///
/// # Safety
/// `p` is a live block from [`alloc`].
unsafe fn header(p: *mut u8) -> (usize, usize) {
    let p = p as usize;
    (
        ((p - 12) as *const u32).read() as usize,
        ((p - 8) as *const u64).read() as usize,
    )
}

/// Frees a sampled block: unmaps it.
///
/// # Safety
/// `p` came from [`alloc`] and is freed once.
#[inline]
pub(crate) unsafe fn free(p: *mut u8) {
    let (offset, size) = header(p);
    let len = (offset + size.max(1)).next_multiple_of(PAGE);
    libc::munmap((p as usize - offset) as *mut libc::c_void, len);
}

/// Nothing kept per thread.
pub(crate) fn retire_thread(_: &counters::Local) {}

/// The record id word of the sampled block at `p` (in its header).
#[inline]
pub(crate) fn record_slot(p: *const u8) -> Option<&'static AtomicU32> {
    if !contains(p) {
        return None;
    }
    // SAFETY: a sampled block's header lies right before it, `u32`-aligned, in its mapping.
    Some(unsafe { &*((p as usize - HEADER) as *const AtomicU32) })
}

/// The usable size of a sampled block: its size rounded up to 16 bytes.
///
/// # Safety
/// `p` is a live block from [`alloc`].
pub(crate) unsafe fn usable(p: *mut u8) -> usize {
    header(p).1.max(1).next_multiple_of(16)
}
